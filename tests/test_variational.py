"""Midpoint variational integrator (trep's MidpointVI, seed 001) against independent truths.

Truths: the exact pendulum period (complete elliptic integral), tight SciPy (DOP853) solutions
of the Euler-Lagrange ODEs, the exact torque-free rigid body (Jacobi elliptic functions),
conservation laws (discrete Noether), central finite differences for derivatives.
Slow checks (10^5 steps): ``python -m pytest tests/test_variational.py -m slow``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

from rigidjax import (
    RigidBody,
    RigidBodyState,
    StepFailure,
    check,
    reference,
    rollout,
    systems,
)
from rigidjax.info import Status
from rigidjax.variational import (
    MechanicalSystem,
    VIState,
    discrete_map,
    energy,
    generalized_velocity,
    linearize,
    momentum_map,
    vi_state,
    vi_state_from_configs,
    vi_step,
)

G = 9.81


@functools.partial(jax.jit, static_argnames=("n",))
def run(system, state, dt, n, loads=None):
    """One jitted rollout shared by the tests (recompiles only per system type / shape)."""
    return rollout(vi_step, system, state, dt, n, loads)


def pendulum_ode(g_over_l, theta0, omega0, t):
    """Tight DOP853 solution of theta'' = -(g/l) sin(theta): (theta, theta_dot) at t."""
    sol = solve_ivp(
        lambda s, y: [y[1], -g_over_l * np.sin(y[0])],
        (0.0, float(t[-1])),
        [theta0, omega0],
        method="DOP853",
        t_eval=t,
        rtol=1e-12,
        atol=1e-13,
    )
    return sol.y


# ---------------------------------------------------------------- pendulum


def _zero_crossing_times(t, theta):
    """Times where theta crosses 0 downwards, by linear interpolation (theta ~ linear there)."""
    i = np.nonzero((theta[:-1] > 0) & (theta[1:] <= 0))[0]
    return t[i] + (t[i + 1] - t[i]) * theta[i] / (theta[i] - theta[i + 1])


@pytest.fixture(scope="module")
def pendulum_ensemble():
    """One batched rollout (one compile) serving the period and energy tests: 10^4 steps of 2 ms."""
    system = systems.pendulum(1.0, 1.0, G)
    amps = jnp.array([0.1, 2.5, 1.0])  # rad: nearly linear, strongly nonlinear (K grows 25 %), energy run
    q0 = amps[:, None]
    state = vi_state(system, q0, jnp.zeros_like(q0))  # a batched state: three members
    return system, np.asarray(amps), run(system, state, 2e-3, 10_000)


def test_pendulum_period_small_and_large_amplitude(pendulum_ensemble):
    system, amps, tr = pendulum_ensemble
    assert bool(jnp.all(tr.info.status == Status.SUCCESS))
    t = np.asarray(tr.states.time[:, 0])
    for j, a in enumerate(amps[:2]):
        crossings = _zero_crossing_times(t, np.asarray(tr.states.q[:, j, 0]))
        assert len(crossings) >= 5  # >= 4 full periods at both amplitudes
        period = np.mean(np.diff(crossings))
        exact = reference.pendulum_period(a, np.sqrt(G))
        # midpoint VI: period error ~ (omega dt)^2 / 24 ~ 4e-7 (x ~10 at 2.5 rad); 2e-5 leaves room
        assert abs(period / exact - 1) < 2e-5, (a, period, exact)


def _energy_envelope(system, states):
    E = np.asarray(energy(system, states))
    err = np.abs(E - E[0]) / abs(E[0])
    k = err.shape[0] // 10
    return err[:k].max(), err[-k:].max(), err.max()


def test_pendulum_energy_bounded_no_drift_1e4_steps(pendulum_ensemble):
    system, _, tr = pendulum_ensemble
    states = jax.tree_util.tree_map(lambda a: a[:, 2], tr.states)  # the 1 rad member
    first, last, worst = _energy_envelope(system, states)
    # symplectic: error O((omega dt)^2) ~ 1e-5 relative at dt = 2 ms, oscillating, not growing
    assert worst < 1e-4
    # no drift: the error envelope over the last tenth matches the first tenth (10 % slack)
    assert last < 1.1 * first + 1e-12


@pytest.mark.slow
def test_pendulum_energy_bounded_no_drift_1e5_steps():
    system = systems.pendulum(1.0, 1.0, G)
    state = vi_state(system, jnp.array([1.0]), jnp.array([0.0]))
    tr = run(system, state, 0.01, 100_000)
    first, last, worst = _energy_envelope(system, tr.states)
    # O((omega dt)^2) ~ 1e-3 relative at dt = 10 ms over 10^5 steps (~5000 periods), no growth
    assert worst < 2e-3
    assert last < 1.1 * first + 1e-12


def test_pendulum_order_two():
    system = systems.pendulum(1.0, 1.0, G)
    state = vi_state(system, jnp.array([1.2]), jnp.array([0.3]))
    T = 2.0
    exact = pendulum_ode(G, 1.2, 0.3, np.array([0.0, T]))[0, -1]
    errs = []
    for dt in (0.02, 0.01, 0.005):
        # the same n = 400 steps for each dt (one compile); compare at the common time T
        tr = run(system, state, dt, 400)
        errs.append(abs(float(tr.states.q[int(round(T / dt)), 0]) - exact))
    orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    # second order: observed order 2 +- 0.15 (asymptotic regime at omega dt <= 0.06)
    assert np.all(np.abs(orders - 2) < 0.15), (errs, orders)


def test_forcing_split_order_with_damping():
    """Damped pendulum: the symmetric split is second order, trep's left split first order."""
    system = systems.pendulum(1.0, 1.0, G, damping=0.5)
    state = vi_state(system, jnp.array([1.0]), jnp.array([0.0]))
    T = 2.0
    sol = solve_ivp(
        lambda s, y: [y[1], -G * np.sin(y[0]) - 0.5 * y[1]], (0, T), [1.0, 0.0], method="DOP853", rtol=1e-12, atol=1e-13
    )
    exact = sol.y[0, -1]
    for split, order in (("symmetric", 2.0), ("left", 1.0)):
        step = jax.jit(functools.partial(rollout, functools.partial(vi_step, forcing_split=split)), static_argnums=(3,))
        errs = [
            abs(float(step(system, state, dt, 400).states.q[int(round(T / dt)), 0]) - exact)
            for dt in (0.02, 0.01, 0.005)
        ]
        orders = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
        # observed order within 0.2 of the nominal one (asymptotic regime)
        assert np.all(np.abs(orders - order) < 0.2), (split, errs, orders)


def test_two_configuration_start_matches_state_start():
    system = systems.pendulum(1.0, 1.0, G)
    dt = 2.5e-3
    exact = pendulum_ode(G, 0.8, 0.0, np.array([0.0, dt, 401 * dt]))
    s2 = vi_state_from_configs(system, jnp.array([exact[0, 0]]), jnp.array([exact[0, 1]]), dt)
    assert float(s2.time) == pytest.approx(dt)
    tr = run(system, s2, dt, 400)  # n = 400 shares the compile of the order test
    # started from two exact configurations: O(dt^2) accurate at t = 1 s
    assert abs(float(tr.states.q[-1, 0]) - exact[0, 2]) < 1e-5


# ---------------------------------------------------------------- constraints and momentum maps


def test_spherical_pendulum_momentum_map_and_constraint():
    system = systems.spherical_pendulum(1.0, 1.0, G)
    th = 0.7
    q0 = jnp.array([np.sin(th), 0.0, -np.cos(th)])
    v0 = jnp.array([0.0, 1.5, 0.0])  # tangent to the sphere
    state = vi_state(system, q0, v0)
    tr = run(system, state, 0.01, 2000)
    assert bool(jnp.all(tr.info.status == Status.SUCCESS))
    Jz = np.asarray(momentum_map(system, tr.states, lambda q: jnp.array([-q[1], q[0], 0.0])))
    # discrete Noether: conserved to Newton tolerance / round-off (values ~1)
    assert np.abs(Jz - Jz[0]).max() < 1e-11
    assert Jz[0] == pytest.approx(float(q0[0] * v0[1]), rel=1e-12)  # = m (x v_y - y v_x) at t = 0
    h = np.abs(np.linalg.norm(np.asarray(tr.states.q), axis=1) - 1.0)
    assert h.max() < 1e-13  # constraint held to round-off at every step


def test_rod_tension_from_multiplier():
    """lambda / dt is the rod tension m g cos(theta) + m l theta_dot^2 (second order in dt)."""
    m, l, th0 = 2.0, 1.5, 1.0
    system = systems.point_on_circle(m, l, G)
    q0 = jnp.array([l * np.sin(th0), -l * np.cos(th0)])
    errs = []
    for dt in (0.01, 0.005):
        tr = run(system, vi_state(system, q0, jnp.zeros(2)), dt, 200)  # same n: one compile
        assert bool(jnp.all(tr.info.status == Status.SUCCESS))
        r = np.linalg.norm(np.asarray(tr.states.q), axis=1)
        assert np.abs(r - l).max() < 1e-12  # h(q) = 0 to round-off at every step
        t = np.asarray(tr.states.time)
        theta, omega = pendulum_ode(G / l, th0, 0.0, t)
        tension = m * G * np.cos(theta) + m * l * omega**2
        # the impulse of step k -> k+1 is stored with state k+1 and acts at q_k (time t_k)
        # (the first step from a (q, qdot) start carries half an impulse: p0 is the continuous
        # momentum, without the half step before t0 that D2 L_d would include)
        lam = np.asarray(tr.states.lam[2:, 0]) / dt
        window = t[1:-1] <= 1.0  # the common window of both runs
        errs.append(np.abs(lam - tension[1:-1])[window].max() / (m * G))
    assert errs[0] < 1e-3  # relative to m g
    assert 3.5 < errs[0] / errs[1] < 4.5  # second order


def test_free_rigid_body_vs_exact_elliptic_solution():
    inertia = np.array([1.0, 2.0, 3.0])
    body = RigidBody(1.0, inertia)
    system = systems.rigid_body(body)
    w0 = np.array([0.3, 0.2, 1.0])  # rotation mainly about the major axis (stable branch)
    q_world = np.array([np.cos(0.2), np.sin(0.2), 0.0, 0.0])
    st = systems.rigid_body_vi_state(
        system, RigidBodyState(orientation=q_world, angular_velocity=w0, velocity=[0.1, 0, 0])
    )
    errs = []
    for dt in (0.02, 0.01):
        tr = run(system, st, dt, 300)  # same n: one compile; compare on the common window t <= 3 s
        assert bool(jnp.all(tr.info.status == Status.SUCCESS))
        rb = systems.rigid_body_state(system, tr.states)
        t = np.asarray(tr.states.time)
        w_exact = reference.torque_free_omega(inertia, w0, t)
        errs.append(np.abs(np.asarray(rb.angular_velocity) - w_exact)[t <= 3.0].max())
        # unit-norm constraint to round-off
        assert np.abs(np.linalg.norm(np.asarray(tr.states.q[:, 3:]), axis=1) - 1).max() < 1e-13
        # spatial angular momentum: discrete momentum map, exact to solver tolerance
        J = np.asarray(momentum_map(system, tr.states, _spatial_rotation_generators))
        L0 = _rot(q_world) @ (inertia * w0)  # the exact world angular momentum
        assert np.abs(J - L0).max() < 1e-11
        # free flight of the centre of mass: exact for the midpoint rule
        assert np.abs(np.asarray(tr.states.q[:, 0]) - 0.1 * t).max() < 1e-12
    assert errs[1] < 2e-3  # rad/s at |omega| ~ 1
    assert 3.5 < errs[0] / errs[1] < 4.5  # second order


def _spatial_rotation_generators(q):
    """(3, 7): d/ds of (x, exp(s e_k) ⊗ e) at s = 0 (rotations of the body about the world axes)."""
    xi = jnp.eye(4)[1:]
    return jnp.concatenate([jnp.zeros((3, 3)), 0.5 * _qmul(xi, q[3:])], -1)


def _top_generators(e):
    """(2, 4): rotation about the world vertical (left action) and the body symmetry axis (right action)."""
    ez = jnp.array([0.0, 0.0, 0.0, 1.0])
    return jnp.stack([0.5 * _qmul(ez, e), 0.5 * _qmul(e, ez)])


def _qmul(p, q):
    from rigidjax import so3

    return so3.multiply(p, q)


def _rot(q):
    from rigidjax import so3

    return np.asarray(so3.to_matrix(jnp.asarray(q)))


@pytest.mark.slow
def test_heavy_top_momentum_maps():
    """Lagrange top: the vertical and the body-symmetry-axis angular momenta are discrete momentum maps."""
    body = RigidBody(1.0, [0.5, 0.5, 0.2], gravity=[0.0, 0.0, -G])
    system = systems.rigid_body(body, pivot_to_com=[0.0, 0.0, 0.3])
    tilt = np.array([np.cos(0.25), np.sin(0.25), 0.0, 0.0])  # 0.5 rad from vertical
    st = systems.rigid_body_vi_state(system, RigidBodyState(orientation=tilt, angular_velocity=[0.0, 0.0, 20.0]))
    tr = run(system, st, 0.002, 1000)
    assert bool(jnp.all(tr.info.status == Status.SUCCESS))
    J_vert, J_axis = np.asarray(momentum_map(system, tr.states, _top_generators)).T
    # both exact to solver tolerance (values ~4 kg m^2/s)
    assert np.abs(J_vert - J_vert[0]).max() < 1e-10
    assert np.abs(J_axis - J_axis[0]).max() < 1e-10
    assert J_axis[0] == pytest.approx(0.2 * 20.0, rel=1e-12)
    E = np.asarray(energy(system, tr.states))
    assert np.abs(E - E[0]).max() / abs(E[0]) < 1e-3


def test_kinematic_cart_drives_pendulum():
    """Prescribed cart motion x(t) = A sin(W t): theta'' = -(g/l) sin(theta) - x''(t) cos(theta) / l."""
    l, A, W = 1.0, 0.1, 3.0
    system = systems.cart_pendulum(1.0, (0.5,), (l,), G, kinematic_cart=True)
    dt, n = 0.005, 600
    t = dt * np.arange(n + 1)
    x = A * np.sin(W * t)
    st = vi_state(system, jnp.array([0.0, 0.2]), jnp.array([A * W, 0.0]))
    tr = run(system, st, dt, n, (None, jnp.asarray(x[1:, None])))
    assert bool(jnp.all(tr.info.status == Status.SUCCESS))
    sol = solve_ivp(
        lambda s, y: [y[1], -G / l * np.sin(y[0]) + A * W**2 * np.sin(W * s) * np.cos(y[0]) / l],
        (0, t[-1]),
        [0.2, 0.0],
        t_eval=t,
        method="DOP853",
        rtol=1e-12,
        atol=1e-13,
    )
    assert np.asarray(tr.states.q[:, 0]) == pytest.approx(x, abs=1e-15)
    # O(dt^2) with (omega dt) ~ 0.016: 2e-4 rad over 3 s
    assert np.abs(np.asarray(tr.states.q[:, 1]) - sol.y[0]).max() < 2e-4


# ---------------------------------------------------------------- derivatives


def test_gradients_through_150_steps_match_finite_differences():
    def loss(length, theta0, damping):
        s = systems.point_on_circle(1.0, length, G)
        # a damped pendulum in Cartesian coordinates: the constraint is differentiated too
        s2 = MechanicalSystem(s.lagrangian, 2, lambda q, v, u, t: -damping * v, s.constraints)
        q0 = length * jnp.stack([jnp.sin(theta0), -jnp.cos(theta0)])
        st = vi_state(s2, q0, jnp.zeros(2), check=False)
        tr = rollout(vi_step, s2, st, 0.01, 150)
        return jnp.sum(tr.states.q[:, 0] ** 2) + jnp.sum(tr.states.lam**2)

    args = (1.2, 0.6, 0.3)
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)  # reverse mode: no while-loop error
    f = jax.jit(loss)
    h = 1e-6
    for i in range(3):
        up = list(args)
        dn = list(args)
        up[i] += h
        dn[i] -= h
        fd = (f(*up) - f(*dn)) / (2 * h)
        # central FD error ~h^2 f''' + solver noise 1e-13/h ~ 1e-7 relative
        assert float(g[i]) == pytest.approx(float(fd), rel=1e-6, abs=1e-8), (i, g[i], fd)


def _cart_bob(q, v, t):
    """A bob (q1, q2) hanging from a prescribed cart position q0, in Cartesian coordinates."""
    return 0.5 * (v[1] ** 2 + v[2] ** 2) - G * q[2]


def _rod_to_cart(q):
    return jnp.atleast_1d(((q[1] - q[0]) ** 2 + q[2] ** 2 - 1.0) / 2.0)


def test_linearization_first_and_second_derivatives():
    """One system with a kinematic variable (rho) AND a constraint (lambda) covers every block."""
    dt = 0.01
    system = MechanicalSystem(_cart_bob, 3, constraints=_rod_to_cart, kinematic=(0,))
    c, s_ = np.cos(0.4), np.sin(0.4)
    st = vi_state(system, jnp.array([0.0, s_, -c]), jnp.array([0.2, 0.2 + 0.8 * c, 0.8 * s_]))
    rho = jnp.array([0.0021])
    inputs = (None, rho)
    d = linearize(system, st, inputs, dt, second_order=True)
    n, nd = system.n_config, system.n_dynamic
    sizes = {"q1": n, "p1": nd, "rho": rho.shape[0]}
    names = [k for k in ("q1", "p1", "rho") if sizes[k]]
    z0 = jnp.concatenate([st.q, st.p, rho])

    def Fz(z):
        """The discrete map as one vector function of z = (q1, p1, rho)."""
        q1, p1, r = z[:n], z[n : n + nd], z[n + nd :]
        out = discrete_map(
            system, q1, p1, None, r if system.kinematic else None, t1=st.time, dt=dt, guess=st.q + dt * st.qdot
        )
        return jnp.concatenate(out)

    def central(f, z, h):
        E = h * jnp.eye(z.shape[0])
        return jnp.moveaxis((jax.vmap(f)(z + E) - jax.vmap(f)(z - E)) / (2 * h), 0, -1)

    fd1_fn = jax.jit(lambda z: central(Fz, z, 1e-4))
    fd1 = fd1_fn(z0)
    # second derivatives: central differences of the finite-difference Jacobian (one compile)
    E = 1e-4 * np.eye(z0.shape[0])
    fd2 = np.stack([(fd1_fn(z0 + e) - fd1_fn(z0 - e)) / 2e-4 for e in E], -1)

    def assemble_first():
        rows = [jnp.concatenate([d.first[o][i].reshape(-1, sizes[i]) for i in names], 1) for o in ("q2", "p2", "lam1")]
        return jnp.concatenate(rows, 0)

    def assemble_second():
        rows = []
        for o in ("q2", "p2", "lam1"):
            blocks = [
                jnp.concatenate([d.second[o][a][b].reshape(-1, sizes[a], sizes[b]) for b in names], 2) for a in names
            ]
            rows.append(jnp.concatenate(blocks, 1))
        return jnp.concatenate(rows, 0)

    # central differences of the map, h = 1e-4: truncation ~1e-8, solver noise ~1e-14/h = 1e-10
    np.testing.assert_allclose(assemble_first(), fd1, rtol=1e-6, atol=1e-7)
    # nested central differences: truncation ~1e-8, noise ~1e-14/h^2 = 1e-6
    np.testing.assert_allclose(assemble_second(), fd2, rtol=1e-4, atol=1e-5)
    assert d.first["q2"]["u1"].shape == (n, 0)
    np.testing.assert_allclose(d.first["q2"]["rho"][0], [1.0])  # q2_cart = rho exactly
    np.testing.assert_allclose(d.second["q2"]["rho"]["rho"][0], [[0.0]])


# ---------------------------------------------------------------- bad input and failure reporting


def test_singular_mass_matrix_rejected():
    # q[1] has no kinetic energy: the DEL equation is not a regular second-order system
    system = MechanicalSystem(lambda q, v, t: 0.5 * v[0] ** 2 - 0.5 * q[1] ** 2 - q[0] * q[1], 2)
    with pytest.raises(ValueError, match="singular mass matrix"):
        vi_state(system, jnp.zeros(2), jnp.zeros(2))


def test_inconsistent_initial_configuration_rejected():
    system = systems.point_on_circle(1.0, 1.0, G)
    with pytest.raises(ValueError, match="inconsistent initial configuration"):
        vi_state(system, jnp.array([0.5, -0.5]), jnp.zeros(2))
    with pytest.raises(ValueError, match="tangent"):
        vi_state(system, jnp.array([0.0, -1.0]), jnp.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="q1"):
        vi_state_from_configs(system, jnp.array([0.0, -1.0]), jnp.array([0.1, -1.0]), 0.01)


def test_wrong_sizes_rejected():
    with pytest.raises(ValueError, match="scalar"):
        MechanicalSystem(lambda q, v, t: 0.5 * v**2, 2)
    with pytest.raises(ValueError, match="forcing"):
        MechanicalSystem(lambda q, v, t: 0.5 * v @ v, 2, forcing=lambda q, v, u, t: jnp.zeros(3))
    cart = systems.cart_pendulum(1.0, (0.5,), (1.0,), G)
    st = vi_state(cart, jnp.array([0.0, np.pi]), jnp.zeros(2))
    with pytest.raises(ValueError, match="u must have shape"):
        vi_step(cart, st, jnp.zeros(2), 0.01)
    with pytest.raises(ValueError, match="q must have shape"):
        vi_state(cart, jnp.zeros(3))
    kin = systems.cart_pendulum(1.0, (0.5,), (1.0,), G, kinematic_cart=True)
    sk = vi_state(kin, jnp.array([0.0, 0.1]))
    with pytest.raises(ValueError, match=r"\(u, rho\)"):
        vi_step(kin, sk, None, 0.01)
    with pytest.raises(ValueError, match="rho must have shape"):
        vi_step(kin, sk, (None, jnp.zeros(2)), 0.01)
    with pytest.raises(ValueError, match="no force inputs"):
        vi_step(systems.pendulum(), vi_state(systems.pendulum(), jnp.array([0.1])), jnp.ones(1), 0.01)
    with pytest.raises(ValueError, match="dt must be > 0"):
        rollout(vi_step, cart, st, -0.01, 3)


def test_failures_reported_and_state_unchanged():
    # singular DEL Jacobian (q[1] appears nowhere): SINGULAR, input state returned
    system = MechanicalSystem(lambda q, v, t: 0.5 * v[0] ** 2 - 0.5 * q[0] ** 2, 2)
    st = VIState(time=jnp.zeros(()), q=jnp.array([0.1, 0.0]), p=jnp.zeros(2), lam=jnp.zeros(0), qdot=jnp.zeros(2))
    new, info = jax.jit(vi_step)(system, st, None, 0.01)
    assert int(info.status) == Status.SINGULAR
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: bool(jnp.all(a == b)), new, st))
    # iteration cap too small for a large step: MAX_ITERATIONS per member, failed member frozen
    pend = systems.pendulum(1.0, 1.0, G)
    sb = vi_state(pend, jnp.array([[0.0], [2.0]]), jnp.array([[0.0], [0.0]]))
    step1 = functools.partial(vi_step, max_iterations=1)
    tr = rollout(step1, pend, sb, 0.1, 3)
    status = np.asarray(tr.info.status)
    assert np.all(status[:, 1] == Status.MAX_ITERATIONS)  # nonlinear member: 1 Newton step is not enough
    assert np.asarray(tr.states.q[-1, 1, 0]) == 2.0  # frozen at its input state
    with pytest.raises(StepFailure, match="MAX_ITERATIONS"):
        check(tr.info)  # what rollout(..., checked=True) runs


def test_float32_follows_input_dtype():
    system = systems.pendulum(np.float32(1.0), np.float32(1.0), np.float32(G))
    st = vi_state(system, jnp.array([1.0], jnp.float32), jnp.array([0.0], jnp.float32))
    tr = run(system, st, jnp.float32(0.01), 500)
    assert tr.states.q.dtype == jnp.float32 and tr.states.p.dtype == jnp.float32
    assert bool(jnp.all(tr.info.status == Status.SUCCESS))
    exact = pendulum_ode(G, 1.0, 0.0, np.array([0.0, 5.0]))
    assert abs(float(tr.states.q[-1, 0]) - exact[0, -1]) < 5e-3  # O(dt^2) + float32 round-off


def test_generalized_velocity_is_legendre_inverse():
    system = systems.double_pendulum()
    q, v = jnp.array([0.3, -0.4]), jnp.array([1.0, -2.0])
    st = vi_state(system, q, v)
    np.testing.assert_allclose(generalized_velocity(system, st), v, rtol=1e-12)
    st_p = vi_state(system, q, p=st.p)  # the (q, p) start recovers the same velocity
    np.testing.assert_allclose(st_p.qdot, v, rtol=1e-12)


# ---------------------------------------------------------------- CLI scenario


def test_simulate_scenario_tennis_racket_flip():
    from rigidjax.scenarios import racquet_flip

    t, cols, summary = racquet_flip("vi", 0.01, 3.0)
    assert set(cols) == {"t", "x", "y", "z", "qw", "qx", "qy", "qz", "wx", "wy", "wz"}
    assert t.shape == (301,) and all(v.shape == (301,) for v in cols.values())
    w = np.stack([cols["wx"], cols["wy"], cols["wz"]], -1)
    exact = reference.torque_free_omega([1.0, 2.0, 3.0], [0.01, 2.0, 0.0], t)
    assert np.abs(w - exact).max() < 1e-3  # O((|omega| dt)^2) over 3 s (4.5e-3 over 20 s)
    # |L| is the discrete momentum map (exact); the energy of this quadratic Lagrangian is
    # also kept to round-off; the unit norm to round-off
    assert summary["angular_momentum_drift"] < 1e-10
    assert summary["energy_drift"] < 1e-10
    assert summary["max_constraint_violation"] < 1e-13
    assert 1 <= summary["mean_newton_iterations"] <= 5 and summary["failed_steps"] == 0
    with pytest.raises(ValueError, match="dt must be > 0"):
        racquet_flip("vi", 0.0, 1.0)


def test_step_rotation_reports_the_input_motion_and_flags_the_limit():
    """``info.rotation`` is ``|omega| dt`` of the INPUT state on failure; ROTATION_LIMIT above 0.5 rad.

    The truth is the input's body rate: ``|omega| dt`` in closed form. The probe-step estimate
    is linear in the rotation to ~(0.01 rad)^2 / 3 relative, hence rtol 1e-4. One batched
    call (per-member dt) keeps this to a single compile.
    """
    rb = systems.rigid_body(RigidBody(1.0, [1.0, 2.0, 3.0]))
    w = np.array([[0.01, 2.0, 0.0], [0.01, 200.0, 0.0], [0.01, 2.0, 0.0], [0.01, 2.0, 0.0]])
    dt = np.array([1.0, 0.01, 0.01, 0.4])  # |omega| dt = 2, 2, 0.02, 0.8 rad
    s = systems.rigid_body_vi_state(rb, RigidBodyState(angular_velocity=w))
    import equinox as eqx  # filter_jit: one compile of the batched step (eager dispatch is 3x slower)

    new, info = eqx.filter_jit(vi_step)(rb, s, None, dt)
    status, rotation = np.asarray(info.status), np.asarray(info.rotation)
    moved = np.any(np.asarray(new.q) != np.asarray(s.q), axis=-1)
    # 2 rad per step: the DEL solve fails (MAX_ITERATIONS or SINGULAR), the input is returned
    # and the rotation is the input's |omega| dt, not that of a failed iterate
    assert set(status[:2]) <= {Status.MAX_ITERATIONS, Status.SINGULAR}
    assert not moved[:2].any()
    np.testing.assert_allclose(rotation[:2], 2.0, rtol=1e-4)
    # 0.02 rad per step: converged, no flag; the step's rotation is |omega| dt to O(dt^2)
    assert status[2] == Status.SUCCESS and moved[2]
    np.testing.assert_allclose(rotation[2], 0.02, rtol=1e-3)
    # 0.8 rad per step converges but is above the default max_rotation = 0.5: advanced, flagged
    assert status[3] == Status.ROTATION_LIMIT and moved[3]
    assert rotation[3] >= 0.8
    with pytest.raises(ValueError, match="max_rotation"):
        vi_step(rb, s, None, dt, max_rotation=0.0)
