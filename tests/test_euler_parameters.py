"""The Euler-parameter generalized-alpha step (seed 002) against independent truths.

Truths: the exact torque-free (Jacobi elliptic) solution, a tight SciPy integration of the
heavy top (Newton-Euler about the pivot, unit-quaternion kinematics) and of the planar
double compound pendulum (Lagrange equations in two angles), conservation laws, the
midpoint step of seed 000 at converging step sizes, and central finite differences.

Compiles are expensive: every rollout here runs in chunks of a fixed number of steps with
one jitted function per model structure (module-scoped), and longer runs chain chunks.
Long checks (10^4 steps) are marked slow: ``pytest -m slow tests/test_euler_parameters.py``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kinematics import quaternion_rate
from scipy import integrate

from rigidjax import RigidBody, RigidBodyState, midpoint_step, rollout, so3
from rigidjax import reference as ref
from rigidjax.euler_parameters import (
    EPModel,
    OUTPUT_VARIABLES,
    SphericalJoint,
    energy,
    ep_step,
    euler_parameter_rates,
    generalized_alpha,
    initial_state,
    newmark,
    output,
)
from rigidjax.inertia import cuboid, cylinder
from rigidjax.info import Status

N_CHUNK = 25  # steps per compiled rollout (free bodies)
N_TOP = 250  # steps per compiled rollout (heavy top, double pendulum)
G = 9.81


def _last(tree):
    return jax.tree_util.tree_map(lambda a: a[-1], tree)


def _stack(chunks):
    """Concatenate the states of chained chunks (dropping each chunk's repeated first state)."""
    first = jax.tree_util.tree_map(lambda a: a[:1], chunks[0])
    rest = [jax.tree_util.tree_map(lambda a: a[1:], c) for c in chunks]
    return jax.tree_util.tree_map(lambda *a: jnp.concatenate(a, 0), first, *rest)


class Runner:
    """One jitted rollout of ``n`` steps per model structure; ``run`` chains ``chunks`` of them."""

    def __init__(self, n, step=ep_step):
        self.f = jax.jit(lambda m, s, dt: rollout(step, m, s, dt, n))

    def run(self, model, s0, dt, chunks):
        s, trajs, iters = s0, [], []
        for _ in range(chunks):
            tr = self.f(model, s, dt)
            assert bool(tr.converged), f"a step failed: status {np.unique(np.asarray(tr.info.status))}"
            trajs.append(tr.states)
            iters.append(np.asarray(tr.info.iterations))
            s = _last(tr.states)
        return _stack(trajs), np.concatenate(iters)


@pytest.fixture(scope="module")
def free_runner():
    return Runner(N_CHUNK)


@pytest.fixture(scope="module")
def joint_runner():
    return Runner(N_TOP)


def _order(e_coarse, e_fine):
    return np.log2(e_coarse / e_fine)


# ----------------------------------------------------------------------------- seed example


def test_seed_mini_example_rotation_z_is_pi_over_2_second_order(free_runner):
    # seed 002: cuboid 0.4 x 0.2 x 0.1 m, density 1000, spin pi/2 rad/s about z for 1 s
    part = cuboid([0.4, 0.2, 0.1], density=1000.0)
    ep0 = [1.0, 0.0, 0.0, 0.0]
    model = EPModel(part.to_rigid_body(), reference=[0.5, 0.2, 0.1] + ep0)
    omega = [0.0, 0.0, 0.5 * np.pi]
    theta_t = np.asarray(euler_parameter_rates(jnp.array(ep0), jnp.array(omega), frame="world"))
    s0 = initial_state(model, velocities=np.concatenate([np.zeros(3), theta_t]))
    errors = []
    for k in (1, 2, 4):
        states, _ = free_runner.run(model, s0, 1.0 / (N_CHUNK * k), k)
        s1 = _last(states)
        assert float(s1.time) == pytest.approx(1.0, abs=1e-12)
        phi = np.asarray(output(model, s1, "Rotation"))[0]
        errors.append(abs(phi[2] - np.pi / 2))
        # rotation about z only, and the centre of mass stays at the reference point
        np.testing.assert_allclose(phi[:2], 0, atol=1e-13)
        np.testing.assert_allclose(np.asarray(output(model, s1, "Position"))[0], [0.5, 0.2, 0.1], atol=1e-13)
    # "pi/2 to the accuracy of the time integration": 1e-3 rad already at 25 steps
    assert errors[0] < 1e-3
    # second order: each halving of dt divides the error by ~4 (measured 1.3e-4, 3.3e-5,
    # 8.3e-6 rad: order 2.00)
    for a, b in zip(errors, errors[1:]):
        assert 1.8 < _order(a, b) < 2.2, errors


# ----------------------------------------------------------------------------- torque-free


J_ASYM = np.array([1.0, 2.0, 3.0])
W0_ASYM = np.array([0.3, 1.0, -0.5])


def test_torque_free_against_elliptic_solution_order_2(free_runner):
    model = EPModel(RigidBody(1.0, J_ASYM))
    s0 = initial_state(model, angular_velocity=W0_ASYM)
    T = 2.0
    # compare on the coarsest grid (its times are in every finer one)
    t_cmp = np.linspace(0.0, T, 2 * N_CHUNK + 1)
    w_exact = ref.torque_free_omega(J_ASYM, W0_ASYM, t_cmp)
    q_exact = ref.torque_free_orientation(J_ASYM, W0_ASYM, [1.0, 0.0, 0.0, 0.0], t_cmp)
    ew, eq = [], []
    for k in (2, 4, 8):
        states, iters = free_runner.run(model, s0, T / (N_CHUNK * k), k)
        sel = slice(None, None, k // 2)
        np.testing.assert_allclose(np.asarray(states.time)[sel], t_cmp, atol=1e-12)
        w = np.asarray(output(model, states, "AngularVelocityLocal"))[sel, 0]
        th = np.asarray(output(model, states, "CoordinatesTotal"))[:, 0, 3:]
        ew.append(np.max(np.abs(w - w_exact)))
        eq.append(np.max(np.asarray(so3.angle_between(jnp.asarray(th[sel]), jnp.asarray(q_exact)))))
        # index 3: |theta| = 1 to round-off at every step (a few ulps of the sum of squares)
        assert np.max(np.abs(np.linalg.norm(th, axis=-1) - 1)) < 10 * np.finfo(float).eps
        # Newton converges in 2-3 iterations at these steps (|omega| dt <= 0.05)
        assert iters.max() <= 4
    # errors in omega: 4.6e-4 / 1.1e-4 / 2.9e-5 rad/s at dt = 40 / 20 / 10 ms (measured): order 2.00
    assert ew[0] < 1e-3 and eq[0] < 1e-3
    for e in (ew, eq):
        for a, b in zip(e, e[1:]):
            assert 1.8 < _order(a, b) < 2.2, e


@pytest.mark.slow
def test_velocity_level_euler_constraint(free_runner):
    # index 2: theta^T theta_t = 0 holds to round-off, |theta| drifts only at O(h^2)
    model = EPModel(RigidBody(1.0, J_ASYM), euler_constraint="velocity")
    s0 = initial_state(model, angular_velocity=W0_ASYM)
    runner = Runner(N_CHUNK)  # another model structure: its own compile
    states, _ = runner.run(model, s0, 2.0 / (4 * N_CHUNK), 4)
    x = np.asarray(output(model, states, "CoordinatesTotal"))[:, 0, 3:]
    v = np.asarray(states.velocities)[:, 0, 3:]
    assert np.max(np.abs(np.sum(x * v, -1))) < 1e-13
    drift = np.max(np.abs(np.linalg.norm(x, axis=-1) - 1))
    assert drift < 1e-4  # O(h^2) with h |omega| ~ 0.02: measured 4.2e-6
    w = np.asarray(output(model, states, "AngularVelocityLocal"))[:, 0]
    w_exact = ref.torque_free_omega(J_ASYM, W0_ASYM, np.asarray(states.time))
    assert np.max(np.abs(w - w_exact)) < 1e-3  # measured 1.2e-4, as index 3 at this dt


def test_agrees_with_midpoint_step_as_dt_shrinks(free_runner):
    # a full inertia tensor, a resistance coupling translation and rotation, an off-axis
    # spin: both steppers are second order here, so their difference shrinks ~4x per
    # halving of dt. (No gravity: midpoint_step's position update x + dt v' is first order
    # under a constant force; the free fall is checked against the parabola below.)
    rng = np.random.default_rng(3)
    Rres = 0.05 * np.eye(6) + 0.01 * rng.normal(size=(6, 6))
    Rres = Rres @ Rres.T  # positive semi-definite: dissipative
    body = RigidBody(2.0, np.array([[1.0, 0.1, 0.0], [0.1, 2.0, 0.2], [0.0, 0.2, 2.5]]), resistance=Rres)
    model = EPModel(body)
    s0 = initial_state(model, velocity=[1.0, 0.0, 2.0], angular_velocity=W0_ASYM)
    mid = Runner(N_CHUNK, functools.partial(midpoint_step, attitude="midpoint"))
    m0 = RigidBodyState(velocity=jnp.array([1.0, 0.0, 2.0]), angular_velocity=jnp.array(W0_ASYM))
    diffs = []
    for k in (2, 4):
        dt = 1.0 / (N_CHUNK * k)
        ep, _ = free_runner.run(model, s0, dt, k)
        mp, _ = mid.run(body, m0, dt, k)
        ep1, mp1 = _last(ep), _last(mp)
        # (positions excluded: midpoint_step's x + dt v' is first order whenever v changes)
        d = max(
            np.max(np.abs(np.asarray(output(model, ep1, "Velocity"))[0] - np.asarray(mp1.velocity))),
            np.max(
                np.abs(np.asarray(output(model, ep1, "AngularVelocityLocal"))[0] - np.asarray(mp1.angular_velocity))
            ),
            float(so3.angle_between(jnp.asarray(output(model, ep1, "CoordinatesTotal"))[0, 3:], mp1.orientation)),
        )
        diffs.append(d)
    assert diffs[1] < 1e-4  # measured ~2e-6 at dt = 0.01 s
    assert _order(diffs[0], diffs[1]) > 1.7, diffs  # the two converge to the same solution


def test_free_fall_is_the_parabola(free_runner):
    # constant acceleration: the Newmark/alpha position update is exact
    body = RigidBody(2.0, J_ASYM, gravity=[0.0, 0.0, -G])
    model = EPModel(body, reference=[0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    s0 = initial_state(model, velocity=[1.0, 0.0, 2.0], angular_velocity=W0_ASYM)
    states, _ = free_runner.run(model, s0, 0.02, 1)
    t = np.asarray(states.time)[:, None]
    exact = np.array([0.0, 0.0, 1.0]) + np.array([1.0, 0.0, 2.0]) * t + 0.5 * np.array([0.0, 0.0, -G]) * t**2
    np.testing.assert_allclose(np.asarray(output(model, states, "Position"))[:, 0], exact, atol=1e-13)
    np.testing.assert_allclose(
        np.asarray(output(model, states, "Acceleration"))[:, 0], [[0.0, 0.0, -G]] * len(t), atol=1e-12
    )


# ----------------------------------------------------------------------------- heavy top

M_TOP, L_TOP, A_TOP, C_TOP = 1.0, 0.1, 0.004, 0.006  # kg, m (pivot to centre of mass), kg m^2


def heavy_top(spin, tilt=0.3):
    """Symmetric top, centre of mass at L_TOP along body z from the pivot at the origin, tilted about x."""
    q0 = np.array([np.cos(tilt / 2), np.sin(tilt / 2), 0.0, 0.0])
    R = np.asarray(so3.to_matrix(jnp.asarray(q0)))
    body = RigidBody(M_TOP, np.array([A_TOP, A_TOP, C_TOP]), gravity=[0.0, 0.0, -G])
    model = EPModel(
        body, reference=np.concatenate([R @ [0.0, 0.0, L_TOP], q0]), constraints=[SphericalJoint(0, [0.0, 0.0, -L_TOP])]
    )
    return model, initial_state(model, angular_velocity=[0.0, 0.0, spin])


def top_invariants(model, states):
    """Energy, vertical angular momentum about the pivot and body-z spin, from the outputs."""
    p = np.asarray(output(model, states, "Position"))[:, 0]
    v = np.asarray(output(model, states, "Velocity"))[:, 0]
    R = np.asarray(output(model, states, "RotationMatrix"))[:, 0].reshape(-1, 3, 3)
    w = np.asarray(output(model, states, "AngularVelocityLocal"))[:, 0]
    I = np.diag([A_TOP, A_TOP, C_TOP])
    E = 0.5 * M_TOP * np.sum(v * v, -1) + 0.5 * np.einsum("ni,ij,nj->n", w, I, w) + M_TOP * G * p[:, 2]
    Lz = np.einsum("nij,nj->ni", R, w @ I)[:, 2] + M_TOP * np.cross(p, v)[:, 2]
    return E, Lz, w[:, 2]


def _rel(x):
    return np.max(np.abs(x - x[0])) / abs(x[0])


@pytest.mark.parametrize("spin, bound", [(10.0, 2e-4), (100.0, 3e-5)])
def test_heavy_top_invariants_short(joint_runner, spin, bound):
    # 1000 steps of 1 ms (|omega| dt = 0.01 and 0.1 rad). Energy, L_z and the spin are
    # conserved by the exact motion; the scheme keeps them to its O(h^2) accuracy (measured
    # max 1.0e-4 / 1.2e-5 relative for spin 10 / 100 rad/s; the same over 10^4 steps).
    model, s0 = heavy_top(spin)
    states, iters = joint_runner.run(model, s0, 1e-3, 4)
    E, Lz, w3 = top_invariants(model, states)
    for q in (E, Lz, w3):
        assert _rel(q) < bound
    # the joint holds to round-off (position level) and on the velocity level (stabilised)
    c = jax.vmap(lambda x: model.constraints[0](x))(model.reference + states.coordinates)
    assert np.max(np.abs(np.asarray(c))) < 1e-14
    assert iters.max() <= 4


def test_heavy_top_against_scipy_order_2(joint_runner):
    spin = 10.0
    model, s0 = heavy_top(spin)
    b = np.array([0.0, 0.0, L_TOP])  # pivot -> centre of mass, body frame
    Ip = np.diag([A_TOP, A_TOP, C_TOP]) + M_TOP * (b @ b * np.eye(3) - np.outer(b, b))
    Ip_inv = np.linalg.inv(Ip)

    def rhs(t, y):
        q, w = y[:4], y[4:]
        R = np.asarray(so3.to_matrix(jnp.asarray(q / np.linalg.norm(q))))
        tau = np.cross(b, R.T @ np.array([0.0, 0.0, -M_TOP * G]))
        w_t = Ip_inv @ (tau - np.cross(w, Ip @ w))
        return np.concatenate([quaternion_rate(q, w), w_t])

    T = 0.5
    y0 = np.concatenate([np.asarray(model.reference)[0, 3:], [0.0, 0.0, spin]])
    sol = integrate.solve_ivp(rhs, (0, T), y0, method="DOP853", rtol=1e-12, atol=1e-14)
    q_ref, w_ref = sol.y[:4, -1], sol.y[4:, -1]
    errs = []
    for k in (1, 2):
        states, _ = joint_runner.run(model, s0, T / (N_TOP * k), k)
        s1 = _last(states)
        th = np.asarray(output(model, s1, "CoordinatesTotal"))[0, 3:]
        w = np.asarray(output(model, s1, "AngularVelocityLocal"))[0]
        errs.append(
            max(float(so3.angle_between(jnp.asarray(th), jnp.asarray(q_ref))), np.max(np.abs(w - w_ref)) / spin)
        )
    assert errs[1] < 3e-4  # measured 1.2e-4 at dt = 1 ms
    assert 1.7 < _order(errs[0], errs[1]) < 2.3, errs


@pytest.mark.slow
@pytest.mark.parametrize(
    "spin, dt, scheme, bound",
    [
        # bounds from the measured O(h^2) energy errors over 10^4 steps, with margin x3-5
        (10.0, 1e-3, generalized_alpha(0.9), 5e-4),
        (100.0, 1e-3, generalized_alpha(0.9), 1e-4),
        (100.0, 1e-3, newmark(), 2e-6),
        # |omega| dt = 1 rad per step: accuracy is gone but nothing blows up (measured 3.4e-4)
        (100.0, 1e-2, newmark(), 2e-3),
    ],
)
def test_heavy_top_10k_steps_bounded(spin, dt, scheme, bound):
    runner = Runner(2500, functools.partial(ep_step, scheme=scheme, max_rotation=np.inf))
    model, s0 = heavy_top(spin)
    states, _ = runner.run(model, s0, dt, 4)
    E, Lz, w3 = top_invariants(model, states)
    assert _rel(E) < bound
    # energy is never gained beyond the bound (the concern with implicit schemes at large |omega| dt)
    assert np.max(E - E[0]) / abs(E[0]) < bound
    assert _rel(Lz) < 20 * bound and _rel(w3) < 20 * bound


# ----------------------------------------------------------------------------- double pendulum

L1, L2, M1, M2 = 0.5, 0.4, 1.0, 0.6


def double_pendulum(psi1, psi2):
    """Two rods joined by spherical joints, the first hung from the origin; planar start in x-z."""
    parts = [cylinder(L1, 0.01, mass=M1, axis=2), cylinder(L2, 0.01, mass=M2, axis=2)]
    bodies = RigidBody(np.array([M1, M2]), np.stack([np.asarray(p.inertia) for p in parts]), gravity=[0.0, 0.0, -G])
    # psi: angle from the downward vertical towards +x, i.e. a rotation by -psi about y
    qs = [np.asarray(so3.exp(jnp.array([0.0, -p, 0.0]))) for p in (psi1, psi2)]
    down = lambda p: np.array([np.sin(p), 0.0, -np.cos(p)])
    p1 = 0.5 * L1 * down(psi1)
    p2 = L1 * down(psi1) + 0.5 * L2 * down(psi2)
    reference = np.stack([np.concatenate([p1, qs[0]]), np.concatenate([p2, qs[1]])])
    joints = [SphericalJoint(0, [0.0, 0.0, L1 / 2]), SphericalJoint(1, [0.0, 0.0, L2 / 2], 0, [0.0, 0.0, -L1 / 2])]
    model = EPModel(bodies, reference=reference, constraints=joints)
    return model, initial_state(model), float(parts[0].inertia[1, 1]), float(parts[1].inertia[1, 1])


def planar_double_pendulum(psi1, psi2, I1, I2, t):
    """Lagrange equations of the planar double compound pendulum, tight DOP853."""
    a = M1 * L1**2 / 4 + I1 + M2 * L1**2
    b = M2 * L1 * L2 / 2
    c = M2 * L2**2 / 4 + I2

    def rhs(_, y):
        p1, p2, w1, w2 = y
        d = p1 - p2
        Mm = np.array([[a, b * np.cos(d)], [b * np.cos(d), c]])
        f = np.array(
            [
                -b * np.sin(d) * w2**2 - (M1 / 2 + M2) * G * L1 * np.sin(p1),
                b * np.sin(d) * w1**2 - M2 * G * L2 / 2 * np.sin(p2),
            ]
        )
        return np.concatenate([[w1, w2], np.linalg.solve(Mm, f)])

    sol = integrate.solve_ivp(rhs, (0, t), [psi1, psi2, 0.0, 0.0], method="DOP853", rtol=1e-12, atol=1e-14)
    return sol.y[:2, -1]


def test_double_compound_pendulum_against_planar_lagrange(joint_runner):
    psi0 = (0.8, -0.4)
    model, s0, I1, I2 = double_pendulum(*psi0)
    T = 1.0
    psi_ref = planar_double_pendulum(*psi0, I1, I2, T)
    errs = []
    for k in (1, 2):
        states, iters = joint_runner.run(model, s0, T / (N_TOP * k), k)
        s1 = _last(states)
        R = np.asarray(output(model, s1, "RotationMatrix")).reshape(2, 3, 3)
        down = -R[:, :, 2]  # body -z axis in the world: joint -> centre of mass direction
        psi = np.arctan2(down[:, 0], -down[:, 2])
        errs.append(np.max(np.abs(psi - psi_ref)))
        # stays planar (y components of positions and rotation axes at round-off)
        assert np.max(np.abs(np.asarray(output(model, states, "Position"))[..., 1])) < 1e-12
        E = np.asarray(energy(model, states))
        assert np.max(np.abs(E - E[0])) / np.max(np.abs(E)) < 1e-3  # O(h^2), measured 2.7e-4 / 6.8e-5
        assert iters.max() <= 5
    assert errs[1] < 5e-4  # measured 1.0e-4 rad at dt = 2 ms (4.1e-4 at 4 ms: order 1.99)
    assert 1.7 < _order(errs[0], errs[1]) < 2.3, errs


# ----------------------------------------------------------------------------- gradients


def _grad_setup():
    n, dt = 10, 0.05
    wrench = jnp.tile(jnp.array([0.5, -0.2, 0.3, 0.05, 0.0, -0.1]), (n, 1))
    c_w = jnp.array([0.7, -0.3, 0.5])
    c_x = jnp.array([0.2, 0.4, -0.6])

    def loss(params):
        mass, J, w0 = params[0], params[1:4], params[4:7]
        model = EPModel(RigidBody(mass, J))
        s0 = initial_state(model, angular_velocity=w0)
        tr = rollout(ep_step, model, s0, dt, n, loads=wrench)
        sN = _last(tr.states)
        w = output(model, sN, "AngularVelocityLocal")[0]
        x = output(model, sN, "Position")[0]
        return jnp.dot(c_w, w) + jnp.dot(c_x, x)

    params = jnp.array([1.5, 1.0, 2.0, 2.5, 0.3, 1.0, -0.5])
    return loss, params


def test_gradient_of_rollout_matches_central_differences():
    loss, params = _grad_setup()
    vg = jax.jit(jax.value_and_grad(loss))  # one compile for the gradient and the differences
    g = np.asarray(vg(params)[1])
    h = 1e-6
    f = lambda p: float(vg(p)[0])
    fd = np.array([(f(params.at[i].add(h)) - f(params.at[i].add(-h))) / (2 * h) for i in range(len(params))])
    # central differences: truncation ~h^2 = 1e-12, round-off ~eps/h = 1e-10 relative to O(1)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    assert np.all(np.abs(g) > 1e-4)  # every parameter matters in this loss


@pytest.mark.slow
def test_step_derivative_is_that_of_the_converged_solution():
    # a looser and a tighter Newton (different iteration counts) give the same derivative
    # once converged: the derivative comes from the implicit function theorem at the root
    model = EPModel(RigidBody(1.0, J_ASYM))
    s0 = initial_state(model, angular_velocity=W0_ASYM)

    def jac(**kw):
        def f(v):
            s = s0.__class__(s0.time, s0.coordinates, v, s0.accelerations, s0.algorithmic_accelerations, s0.multipliers)
            new, info = ep_step(model, s, None, 0.1, **kw)
            return new.coordinates, info.iterations

        J, it = jax.jit(jax.jacfwd(f, has_aux=True))(s0.velocities)
        return np.asarray(J), int(it)

    J_loose, it_loose = jac(rtol=1e-4, atol=1e-4)
    J_tight, it_tight = jac(rtol=1e-14, atol=1e-14, max_iterations=30)
    assert it_tight > it_loose
    # the loose solve stops after an update below 1e-4 and leaves an error ~(1e-4)^2 or less
    # (the final update is a simplified-Newton one: at least quadratic): 1e-9 is generous
    np.testing.assert_allclose(J_loose, J_tight, rtol=1e-9, atol=1e-11)


# ----------------------------------------------------------------------------- failures and bad input


def test_non_convergence_is_reported_per_member_under_vmap():
    model = EPModel(RigidBody(1.0, J_ASYM))
    spinning = initial_state(model, angular_velocity=W0_ASYM)
    at_rest = initial_state(model)
    ens = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), at_rest, spinning)
    step = jax.jit(
        jax.vmap(functools.partial(ep_step, max_iterations=1, rtol=1e-14, atol=1e-14), in_axes=(None, 0, None, None))
    )
    new, info = step(model, ens, None, 0.1)
    # at rest the predictor is the solution (converged in 1 iteration); spinning needs more
    assert np.asarray(info.status).tolist() == [Status.SUCCESS, Status.MAX_ITERATIONS]
    # the failed member is returned unchanged, not half-advanced
    for a, b in zip(jax.tree_util.tree_leaves(_index(new, 1)), jax.tree_util.tree_leaves(spinning)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(new.time[0]) == pytest.approx(0.1)


def _index(tree, i):
    return jax.tree_util.tree_map(lambda a: a[i], tree)


def test_bad_input_errors():
    body = RigidBody(1.0, J_ASYM)
    # the seed's default reference coordinates (zeros) are not a unit quaternion
    with pytest.raises(ValueError, match="unit quaternion"):
        EPModel(body, reference=np.zeros(7))
    with pytest.raises(ValueError, match="reference must have shape"):
        EPModel(body, reference=np.zeros(6))
    with pytest.raises(ValueError, match="euler_constraint"):
        EPModel(body, euler_constraint="index3")
    model = EPModel(body)
    # theta^T theta_t != 0: the velocities would change |theta|
    with pytest.raises(ValueError, match="inconsistent initial velocities"):
        initial_state(model, velocities=[0, 0, 0, 0.1, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="either velocities"):
        initial_state(model, velocities=np.zeros(7), angular_velocity=W0_ASYM)
    with pytest.raises(ValueError, match="coordinates must have shape"):
        initial_state(model, coordinates=np.zeros(6))
    # without the Euler-parameter constraint nothing fixes |theta|: G^T I G is singular
    with pytest.raises(ValueError, match="singular mass matrix"):
        initial_state(EPModel(body, euler_constraint="none"), angular_velocity=W0_ASYM)
    # a joint the initial coordinates violate
    with pytest.raises(ValueError, match="violate the constraints"):
        initial_state(EPModel(body, constraints=[SphericalJoint(0, [0.0, 0.0, -0.1])]))
    with pytest.raises(ValueError, match="body_b"):
        SphericalJoint(0, [0, 0, 1.0], body_b=0)
    with pytest.raises(ValueError, match="rho_inf"):
        generalized_alpha(1.5)
    with pytest.raises(ValueError, match="unknown output variable"):
        output(model, initial_state(model), "Rotations")


# ----------------------------------------------------------------------------- outputs


def test_output_variables_on_a_trajectory(free_runner):
    model = EPModel(RigidBody(1.0, J_ASYM), reference=[1.0, 2.0, 3.0, 1.0, 0.0, 0.0, 0.0])
    s0 = initial_state(model, velocity=[0.1, 0.0, 0.0], angular_velocity=W0_ASYM)
    states, _ = free_runner.run(model, s0, 0.01, 1)
    n = N_CHUNK + 1
    all_outputs = jax.jit(lambda m, s: {k: output(m, s, k) for k in OUTPUT_VARIABLES})
    out = {k: np.asarray(v) for k, v in all_outputs(model, states).items()}
    sizes = {"RotationMatrix": 9, "Coordinates": 7, "CoordinatesTotal": 7, "Coordinates_t": 7, "Coordinates_tt": 7}
    for k, v in out.items():
        assert v.shape == (n, 1, sizes.get(k, 3)), k
    th = out["CoordinatesTotal"][:, 0, 3:]
    R = np.asarray(so3.to_matrix(jnp.asarray(th)))
    np.testing.assert_allclose(out["RotationMatrix"][:, 0], R.reshape(n, 9), atol=1e-15)  # row-major
    np.testing.assert_allclose(
        out["AngularVelocity"][:, 0], np.einsum("nij,nj->ni", R, out["AngularVelocityLocal"][:, 0]), atol=1e-14
    )
    np.testing.assert_allclose(out["Position"][:, 0], out["Displacement"][:, 0] + [1.0, 2.0, 3.0], atol=1e-15)
    np.testing.assert_allclose(out["Velocity"][:, 0], [[0.1, 0.0, 0.0]] * n, atol=1e-15)  # free flight
    # Tait-Bryan xyz: R = R_x(phi0) R_y(phi1) R_z(phi2)
    back = np.asarray(so3.to_matrix(so3.from_tait_bryan_xyz(jnp.asarray(out["Rotation"][:, 0]))))
    np.testing.assert_allclose(back, R, atol=1e-13)
    # angular acceleration: the body-frame Euler equations, rotated to the world
    w = out["AngularVelocityLocal"][:, 0]
    w_t = (
        np.stack(
            [
                (J_ASYM[1] - J_ASYM[2]) * w[:, 1] * w[:, 2],
                (J_ASYM[2] - J_ASYM[0]) * w[:, 2] * w[:, 0],
                (J_ASYM[0] - J_ASYM[1]) * w[:, 0] * w[:, 1],
            ],
            -1,
        )
        / J_ASYM
    )
    np.testing.assert_allclose(out["AngularAcceleration"][:, 0], np.einsum("nij,nj->ni", R, w_t), atol=1e-12)


def test_rotation_output_finite_at_gimbal_lock():
    # a quarter turn about y: phi1 = pi/2, the Tait-Bryan singularity
    q = np.asarray(so3.exp(jnp.array([0.0, np.pi / 2, 0.0])))
    model = EPModel(RigidBody(1.0, J_ASYM), reference=np.concatenate([np.zeros(3), q]))
    s = initial_state(model)
    phi = np.asarray(output(model, s, "Rotation"))[0]
    assert np.all(np.isfinite(phi))
    assert phi[1] == pytest.approx(np.pi / 2, abs=1e-7)


@pytest.mark.slow
def test_simulate_scenario_tennis_racket():
    from rigidjax.scenarios import racquet_flip

    t, cols, summary = racquet_flip("ep", 0.01, 2.0)
    assert t.shape == (201,)
    assert set(cols) == {"t", "x", "y", "z", "qw", "qx", "qy", "qz", "wx", "wy", "wz"}
    assert all(c.shape == (201,) for c in cols.values())
    # |omega| dt = 0.02 rad: kinetic energy and |L| kept to 4.8e-7 / 2.4e-7 (measured); |theta| exact
    assert summary["energy_drift"] < 1e-5
    assert summary["angular_momentum_drift"] < 1e-5
    assert summary["max_constraint_violation"] < 1e-14
    with pytest.raises(ValueError, match="dt"):
        racquet_flip("ep", 0.0, 1.0)


@pytest.mark.slow
def test_euler_constraint_supplied_by_the_model():
    # euler_constraint="none" with the same constraint given as a model function: same motion
    def unit_norm(x):
        return jnp.sum(x[:, 3:] ** 2, -1) - 1

    a = EPModel(RigidBody(1.0, J_ASYM))
    b = EPModel(RigidBody(1.0, J_ASYM), constraints=[unit_norm], euler_constraint="none")
    ra, rb = Runner(N_CHUNK), Runner(N_CHUNK)
    sa, _ = ra.run(a, initial_state(a, angular_velocity=W0_ASYM), 0.04, 1)
    sb, _ = rb.run(b, initial_state(b, angular_velocity=W0_ASYM), 0.04, 1)
    # identical equations in a different order: equal to round-off
    np.testing.assert_allclose(np.asarray(sb.coordinates), np.asarray(sa.coordinates), atol=1e-13)
    np.testing.assert_allclose(np.asarray(sb.multipliers), np.asarray(sa.multipliers), rtol=1e-10, atol=1e-12)


def test_generalized_forces_frames_and_power():
    import rigidjax.euler_parameters as ep

    rng = np.random.default_rng(7)
    body = RigidBody(1.5, np.array([[1.0, 0.1, 0.0], [0.1, 2.0, 0.2], [0.0, 0.2, 2.5]]), resistance=np.zeros((6, 6)))
    th = rng.normal(size=4)
    th /= np.linalg.norm(th)
    model = EPModel(body, reference=np.concatenate([np.zeros(3), th]))
    x = model.reference
    w_body = rng.normal(size=3)
    v = jnp.concatenate([jnp.array([[0.3, -0.2, 0.1]]), euler_parameter_rates(x[:, 3:], w_body[None])], -1)
    f, tau_w = rng.normal(size=3), rng.normal(size=3)
    R = np.asarray(so3.to_matrix(jnp.asarray(th)))
    # a torque given in the world frame acts like the same torque rotated into the body
    Qw = ep.generalized_forces(model, x, v, np.concatenate([f, tau_w]), "world")
    Qb = ep.generalized_forces(model, x, v, np.concatenate([f, R.T @ tau_w]), "body")
    np.testing.assert_allclose(np.asarray(Qw), np.asarray(Qb), atol=1e-13)
    # power: theta_t . Q_rot = omega . tau (the gyroscopic term does no work)
    power = float(np.asarray(v)[0, 3:] @ np.asarray(Qb)[0, 3:])
    assert power == pytest.approx(w_body @ (R.T @ tau_w), rel=1e-12)
    # kinetic energy from the mass matrix equals m|v|^2/2 + omega.I omega/2
    M = np.asarray(ep.mass_matrix(model, x))
    T = 0.5 * np.asarray(v).ravel() @ M @ np.asarray(v).ravel()
    J = np.asarray(body.inertia)
    assert T == pytest.approx(0.5 * 1.5 * 0.14 + 0.5 * w_body @ J @ w_body, rel=1e-12)


def test_float32_racket_default_tolerances_succeed():
    """The README racket case in float32 with the default settings: every step converges.

    In float32 the position rows of the GGL system are evaluated to ~eps |x| only, so the
    position-correction multiplier's Newton increment stalls at ~eps / (beta_p h^2) (measured
    1e-3 at h = 0.01) and used to exhaust ``max_iterations`` after ~40 steps.
    """
    f32 = np.float32
    model = EPModel(RigidBody(f32(1.0), np.array([1.0, 2.0, 3.0], f32)))
    s0 = initial_state(model, angular_velocity=jnp.array([0.01, 2.0, 0.0], f32))
    traj = jax.jit(lambda m, s: rollout(ep_step, m, s, 0.01, 1000))(model, s0)
    assert traj.states.coordinates.dtype == jnp.float32  # the library follows the input dtype
    np.testing.assert_array_equal(np.asarray(traj.info.status), Status.SUCCESS)
    t = np.asarray(traj.states.time, np.float64)
    w = np.asarray(output(model, traj.states, "AngularVelocityLocal"), np.float64)[:, 0]
    exact = ref.torque_free_omega(np.diag([1.0, 2.0, 3.0]), np.array([0.01, 2.0, 0.0]), t)
    # the float64 run of this case has a discretisation error of 1.2e-4 rad/s (second order,
    # h = 0.01, one flip); float32 round-off (eps |omega| ~ 2.4e-7 per step, amplified by the
    # unstable intermediate-axis motion) measured another 0.9e-4 (max 2.0e-4 in total). 5e-4
    # (2.5e-4 of |omega| = 2 rad/s) holds both with margin and would fail on any real error
    # (a wrong flip time gives O(1) errors).
    assert np.max(np.abs(w - exact)) < 5e-4
