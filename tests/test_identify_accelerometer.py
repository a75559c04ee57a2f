"""The accelerometer observation (identify.observations.SpecificForce) against independent truths.

The truths come from SciPy's DOP853 at rtol 1e-12 (independent of rigidjax's steppers); the
exact specific force at a sample time is evaluated from the ODE's right-hand side at the
integrated state, ``f = C^T F / m + alpha x r + omega x (omega x r)`` (gravity cancels:
``a - g = F / m``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.spatial.transform import Rotation

import rigidjax as rj
from rigidjax import identify
from rigidjax.identify import observations as obs
from rigidjax.identify import transforms as tr

jax.config.update("jax_enable_x64", True)

G = np.array([0.0, 0.0, -9.81])  # m/s^2, world, z up
INERTIA = np.array([1.0, 2.0, 2.8])  # kg m^2: well away from symmetry
W0 = np.array([0.3, 3.0, 0.4])  # rad/s: near the unstable intermediate axis (a tumble)
Q0 = Rotation.from_rotvec([0.3, -0.2, 0.5]).as_quat(scalar_first=True)


def _right_pure(w):
    """The matrix of ``q -> q (x) (0, w)`` (quaternion product with a pure quaternion, scalar
    first): ``d q / dt = 0.5 _right_pure(omega_body) q``."""
    x, y, z = w
    return np.array([[0.0, -x, -y, -z], [x, 0.0, z, -y], [y, -z, 0.0, x], [z, y, -x, 0.0]])


def truth(mass, inertia, force, torque, w0, q0, t, r):
    """DOP853 (rtol 1e-12) of a rigid body under a constant world force ``force`` (N), body
    torque ``torque`` (N m) and gravity ``G``; returns the body rates (N, 3) and the exact
    specific force (N, 3, body axes) at the point ``r`` (m, body) at the times ``t``."""
    I = np.diag(inertia)
    Iinv = np.linalg.inv(I)

    def alpha(w):
        return Iinv @ (torque - np.cross(w, I @ w))

    def rhs(s, y):
        w, q = y[:3], y[3:7]
        dq = 0.5 * _right_pure(w) @ q
        return np.concatenate([alpha(w), dq, force / mass + G])

    y0 = np.concatenate([w0, q0, np.zeros(3)])
    sol = solve_ivp(rhs, (t[0], t[-1]), y0, method="DOP853", rtol=1e-12, atol=1e-14, t_eval=t)
    assert sol.success
    w = sol.y[:3].T
    q = sol.y[3:7].T / np.linalg.norm(sol.y[3:7].T, axis=1, keepdims=True)
    C = Rotation.from_quat(q, scalar_first=True)
    # a - g = force / m (gravity cancels), into the body axes, plus the lever-arm terms
    al = np.array([alpha(wi) for wi in w])
    f = C.inv().apply(force / mass) + np.cross(al, r) + np.cross(w, np.cross(w, r))
    return w, f


def _predict(stepper, model, state0, inputs, dt, n, k, sensor, signals=obs.rigid_body_signals):
    """The observation's prediction at the n sample times from a rollout of k steps per sample."""
    u = jnp.repeat(jnp.asarray(inputs)[None], (n - 1) * k, 0)
    traj = rj.rollout(stepper, model, state0, dt / k, (n - 1) * k, u)
    sig = signals(model, traj.states)
    return np.asarray(sensor.predict(sig[sensor.signal][::k], {}))


def test_prediction_converges_at_second_order():
    """The prediction against the DOP853 truth of a tumbling body under a constant world force
    and body torque, with gravity, at a sensor 10 cm off the centre of mass: samples every
    20 ms over 1 s, from rollouts of 1, 2, 4 steps per sample (dt = 20, 10, 5 ms; each rollout
    runs 208 steps, past 1 s, so that one compiled program serves every dt). Samples 1 to 49
    are compared (the first is one-sided, and left out of the residual). Second order
    with attitude="midpoint": the error must fall by 4 per halving (asserted within [3.3, 4.7]:
    room for the O(dt^3) terms, which at |omega| dt <= 0.06 move it by well under 10 %); first
    order with the default attitude="new" (the orientation is first order: ratio in [1.7, 2.4])."""
    mass, force, torque = 1.5, np.array([3.0, -1.0, 2.0]), np.array([0.4, -0.3, 0.2])
    r = np.array([0.06, -0.04, 0.07])
    dt, n, steps = 0.02, 51, 208
    t = np.arange(n) * dt
    _, f_true = truth(mass, INERTIA, force, torque, W0, Q0, t, r)
    model = rj.RigidBody(mass, INERTIA, gravity=G)
    state0 = rj.RigidBodyState(orientation=jnp.asarray(Q0), angular_velocity=jnp.asarray(W0))
    u = jnp.tile(jnp.asarray(np.concatenate([force, torque])), (steps, 1))
    sensor = obs.SpecificForce(position=tuple(r), bias=False)
    errors = {}
    for attitude in ("midpoint", "new"):

        @jax.jit
        def run(h, attitude=attitude):
            traj = rj.rollout(rj.Midpoint(attitude=attitude), model, state0, h, steps, u)
            return obs.rigid_body_signals(model, traj.states)["accelerometer"]

        errors[attitude] = np.array(
            [
                np.max(np.abs(np.asarray(sensor.predict(run(jnp.asarray(dt / k))[::k][:n], {})) - f_true)[1:-1])
                for k in (1, 2, 4)
            ]
        )
    e, e1 = errors["midpoint"], errors["new"]
    print("midpoint: errors (m/s^2)", e, "ratios", e[:-1] / e[1:])
    print("new: errors (m/s^2)", e1, "ratios", e1[:-1] / e1[1:])
    assert np.all((e[:-1] / e[1:] > 3.3) & (e[:-1] / e[1:] < 4.7)), e
    assert e[-1] < 1e-4, e  # |f| ~ 3 m/s^2; measured 1.6e-6 at dt = 5 ms
    assert np.all((e1[:-1] / e1[1:] > 1.7) & (e1[:-1] / e1[1:] < 2.4)), e1


def test_resting_body_reads_plus_g_up():
    """Sign convention: a body held at rest (support force -m g) with its y axis pointing up
    reads +9.81 m/s^2 along body y, wherever the sensor sits; in free fall it reads 0."""
    mass = 2.0
    q_up = Rotation.from_rotvec([np.pi / 2, 0, 0]).as_quat(scalar_first=True)  # body y -> world z
    assert np.allclose(Rotation.from_quat(q_up, scalar_first=True).apply([0, 1, 0]), [0, 0, 1])
    model = rj.RigidBody(mass, INERTIA, gravity=G)
    state0 = rj.RigidBodyState(orientation=jnp.asarray(q_up))
    sensor = obs.SpecificForce(position=(0.1, 0.2, -0.3), bias=False)
    support = np.concatenate([-mass * G, np.zeros(3)])
    f = _predict(rj.Midpoint(), model, state0, support, 0.01, 6, 1, sensor)
    np.testing.assert_allclose(f, np.tile([0.0, 9.81, 0.0], (6, 1)), atol=1e-12)
    falling = _predict(rj.Midpoint(), model, state0, np.zeros(6), 0.01, 6, 1, sensor)
    np.testing.assert_allclose(falling, 0.0, atol=1e-12)


def _ep_model(d=0.3):
    from rigidjax import euler_parameters as ep

    body = rj.RigidBody(2.0, jnp.array([0.05, 0.04, 0.03]), gravity=jnp.asarray(G))
    ref = jnp.array([0.0, 0, -d, 1, 0, 0, 0])
    return ep.EPModel(body, reference=ref, constraints=[ep.SphericalJoint(0, jnp.array([0, 0, d]))])


def test_ep_signals_kinematics():
    """The Euler-parameter signal map on hand-built states (no stepping): Euler parameters,
    their rates and second derivatives of a known attitude, angular velocity and angular
    acceleration, and a known centre-of-mass acceleration, give back omega, alpha (body) and
    C^T (a - g); at rest with body z up the reading is +9.81 m/s^2 along z."""
    from rigidjax import euler_parameters as ep

    model = _ep_model()
    q = Rotation.from_rotvec([0.4, -0.7, 0.2]).as_quat(scalar_first=True)
    w, al, a = np.array([0.5, -1.2, 2.0]), np.array([3.0, 0.4, -1.1]), np.array([0.3, 2.0, -4.0])
    q_t = 0.5 * _right_pure(w) @ q
    q_tt = 0.5 * (_right_pure(w) @ q_t + _right_pure(al) @ q)
    ref = np.asarray(model.reference[0])
    moving = ep.EPState(
        jnp.zeros(()),
        jnp.asarray(np.concatenate([[0.0, 0, 0], q]) - ref)[None],
        jnp.asarray(np.concatenate([[0.0, 0, 0], q_t]))[None],
        jnp.asarray(np.concatenate([a, q_tt]))[None],
        jnp.zeros((1, 7)),
        jnp.zeros(2),
    )
    rest = ep.EPState(
        jnp.zeros(()), jnp.zeros((1, 7)), jnp.zeros((1, 7)), jnp.zeros((1, 7)), jnp.zeros((1, 7)), jnp.zeros(2)
    )
    states = jax.tree_util.tree_map(lambda *x: jnp.stack(x), moving, rest)
    sig = obs.ep_signals(0)(model, states)
    C = Rotation.from_quat(q, scalar_first=True)
    np.testing.assert_allclose(sig["angular_velocity"][0], w, atol=1e-12)
    np.testing.assert_allclose(sig["angular_acceleration"][0], al, atol=1e-12)
    np.testing.assert_allclose(sig["specific_force"][0], C.inv().apply(a - G), atol=1e-12)
    np.testing.assert_allclose(sig["accelerometer"][1], [0, 0, 9.81, 0, 0, 0, 0, 0, 0], atol=1e-12)


@pytest.mark.slow
def test_ep_hanging_pendulum_reads_plus_g_up():
    """Through the generalized-alpha stepper: a pendulum hanging at rest from a spherical joint
    (its centre of mass 0.3 m below the pivot on body -z) reads +9.81 m/s^2 along body z (up)
    at the pivot and at the centre of mass. (Slow: the stepper compiles for about 40 s here.)"""
    from rigidjax import euler_parameters as ep

    model = _ep_model()
    state0 = ep.initial_state(model, jnp.zeros(7))
    sensor = obs.SpecificForce(position=(0.0, 0.0, 0.3), bias=False, drop_ends=False)
    f = _predict(rj.GeneralizedAlphaEP(), model, state0, np.zeros((1, 6)), 0.01, 5, 1, sensor, obs.ep_signals(0))
    np.testing.assert_allclose(f, np.tile([0.0, 0.0, 9.81], (5, 1)), atol=1e-8)


def test_fit_mass_bias_and_sensor_position():
    """Identification: a tumbling body under a known constant world force (and gravity) and a
    known constant body torque (which sweeps the rates, so that the lever arm's centripetal
    term is not a constant that a bias could absorb); accelerometer (0.02 m/s^2 noise) and
    gyroscope (5 mrad/s) data at 100 Hz for 1.5 s from the DOP853 truth. Fitted: the mass, the
    accelerometer's bias and position, the gyroscope's bias and the initial angular velocity
    (the initial orientation is known: a constant world force leaves a turn about its own
    direction unobservable). Each value within 2 standard errors (3 for the vectors, checked
    together), status converged."""
    rng = np.random.default_rng(3)
    mass, force, torque = 1.5, np.array([3.0, -1.0, 2.0]), np.array([3.0, -2.0, 4.0])
    w0 = np.array([2.0, -1.5, 1.0])  # rad/s: the torque sweeps it by 3-5 rad/s per axis in 1.5 s
    r, bias = np.array([0.06, -0.04, 0.07]), np.array([0.05, -0.03, 0.02])
    dt, n, s_acc, s_gyro = 0.01, 150, 0.02, 0.005
    t = np.arange(n) * dt
    w, f = truth(mass, INERTIA, force, torque, w0, Q0, t, r)
    data = {
        "f": f + bias + s_acc * rng.standard_normal((n, 3)),
        "omega": w + s_gyro * rng.standard_normal((n, 3)),
    }
    state0 = rj.RigidBodyState(orientation=jnp.asarray(Q0), angular_velocity=jnp.asarray(w0 + 0.05))
    inputs = np.tile(np.concatenate([force, torque]), (n - 1, 1))
    problem = identify.Problem(
        model=rj.RigidBody(1.0, INERTIA, gravity=G),
        stepper=rj.Midpoint(attitude="midpoint"),
        parameters={"mass": identify.Parameter(lambda m: m.mass, tr.Positive())},
        observations=[
            obs.SpecificForce(fit_position=True, sigma=s_acc),
            obs.AngularVelocity(bias=True, sigma=s_gyro),
        ],
        segments=[identify.MeasuredSegment(t=t, data=data, state0=state0, inputs=inputs)],
        initial=identify.FreeBodyInitial(("angular_velocity",)),
        substeps=2,
    )
    fit = identify.fit(problem, starts=2)
    print(fit)
    assert fit.status == identify.FitStatus.CONVERGED, fit.message
    p, e = fit.sensor[0], fit.sensor_se[0]
    print("mass", fit.values["mass"], "+-", fit.se["mass"], "bias", p["bias"], "+-", e["bias"])
    print("position", p["position"], "+-", e["position"])
    for value, true, se, k in (
        (fit.values["mass"], mass, fit.se["mass"], 2),
        (p["bias"], bias, e["bias"], 3),
        (p["position"], r, e["position"], 3),
    ):
        value, true, se = (np.atleast_1d(np.asarray(a, float)) for a in (value, true, se))
        assert np.all(np.isfinite(se)) and np.all(se > 0), se
        assert np.all(np.abs(value - true) <= k * se), (value, true, se, (value - true) / se)


def test_bad_input_names_the_observation():
    """Wrong data width, a signal of the wrong width, a bad position or sigma, too few samples."""
    n = 10
    t = np.arange(n) * 0.01
    state0 = rj.RigidBodyState()

    def problem(data, sensor):
        return identify.Problem(
            model=rj.RigidBody(1.0, INERTIA),
            stepper=rj.Midpoint(),
            parameters={"mass": identify.Parameter(lambda m: m.mass, tr.Positive())},
            observations=[sensor],
            segments=[identify.MeasuredSegment(t=t[: len(data)], data={"f": data}, state0=state0)],
        )

    with pytest.raises(ValueError, match=r"SpecificForce reads data\['f'\].*\(N, 3\).*\(10, 2\)"):
        problem(np.zeros((n, 2)), obs.SpecificForce())
    with pytest.raises(ValueError, match=r"SpecificForce reads signal 'velocity' as \(N, 9\)"):
        identify.fit(problem(np.zeros((n, 3)), obs.SpecificForce(signal="velocity")), starts=1)
    with pytest.raises(ValueError, match="SpecificForce: position must be 3 finite numbers"):
        obs.SpecificForce(position=(0.1, 0.2))
    with pytest.raises(ValueError, match="SpecificForce: sigma must be"):
        obs.SpecificForce(sigma=0.0)
    with pytest.raises(ValueError, match="SpecificForce: a segment of 4 samples"):
        problem(np.zeros((4, 3)), obs.SpecificForce())
