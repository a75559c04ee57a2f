"""Midpoint rigid-body step (seed 000) against independent truths.

Truths: ``jax.jacfwd`` for the closed-form K; the exact Jacobi-elliptic torque-free solution
(``rigidjax.reference``, itself checked against DOP853 in test_reference.py); closed-form
discrete decay and parabola; conservation laws; central finite differences for gradients.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax import reference, so3

I_RACKET = np.array([1.0, 2.0, 3.0])
W_RACKET = np.array([0.01, 2.0, 0.0])


def _random_inertia(rng):
    # physical by construction: positive second moments L -> principal moments, random axes
    L = rng.uniform(0.2, 2.0, 3)
    moments = np.array([L[1] + L[2], L[0] + L[2], L[0] + L[1]])
    Q = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    return Q @ np.diag(moments) @ Q.T


def test_gyroscopic_jacobian_equals_jacfwd():
    rng = np.random.default_rng(0)
    for _ in range(20):
        J = jnp.asarray(_random_inertia(rng))
        w = jnp.asarray(rng.normal(size=3) * 3)
        K = rj.gyroscopic_jacobian(J, w)
        K_ad = jax.jacfwd(lambda om: -rj.gyroscopic_term(J, om))(w)
        # both are a few float64 products of O(10) numbers: agreement to 1e-12 relative
        np.testing.assert_allclose(K, K_ad, rtol=1e-12, atol=1e-12 * float(jnp.abs(K_ad).max()))
    # principal moments given as (3,) give the same K as the diagonal tensor
    w = jnp.array([0.3, -1.0, 2.0])
    np.testing.assert_allclose(
        rj.gyroscopic_jacobian(jnp.array(I_RACKET), w), rj.gyroscopic_jacobian(jnp.diag(jnp.array(I_RACKET)), w)
    )


def _run(dt, t_end, attitude="new", inertia=I_RACKET, omega0=W_RACKET):
    body = rj.RigidBody(1.0, inertia)
    n = int(round(t_end / dt))
    tr = rj.rollout(
        partial(rj.midpoint_step, attitude=attitude), body, rj.RigidBodyState(angular_velocity=omega0), dt, n
    )
    return body, tr, np.arange(n + 1) * dt


@pytest.fixture(scope="module")
def torque_free_runs():
    # an asymmetric body, generic initial rate (away from the separatrix), 2 s
    inertia = np.array([1.0, 2.0, 2.5])
    omega0 = np.array([1.0, 0.5, 1.5])
    out = {}
    for att in ("new", "midpoint"):
        for dt in (0.02, 0.01, 0.005):
            out[att, dt] = _run(dt, 2.0, att, inertia, omega0)
    t = out["new", 0.02][2]
    w_exact = reference.torque_free_omega(inertia, omega0, t)
    q_exact = reference.torque_free_orientation(inertia, omega0, [1, 0, 0, 0], t)
    return out, t, w_exact, q_exact


def _orders(errs):
    return [np.log2(errs[i] / errs[i + 1]) for i in range(len(errs) - 1)]


def test_torque_free_omega_order_2(torque_free_runs):
    out, t, w_exact, _ = torque_free_runs
    errs = []
    for dt in (0.02, 0.01, 0.005):
        w = np.asarray(out["new", dt][1].states.angular_velocity)[:: int(round(0.02 / dt))]
        errs.append(np.abs(w - w_exact).max())
    # second order: halving dt divides the error by 4 (log2 ratio 2 within 0.15)
    assert all(abs(p - 2) < 0.15 for p in _orders(errs)), errs


@pytest.mark.parametrize("attitude,order", [("new", 1), ("midpoint", 2)])
def test_torque_free_attitude_order(torque_free_runs, attitude, order):
    out, t, _, q_exact = torque_free_runs
    errs = []
    for dt in (0.02, 0.01, 0.005):
        q = np.asarray(out[attitude, dt][1].states.orientation)[:: int(round(0.02 / dt))]
        errs.append(float(jnp.max(so3.angle_between(jnp.asarray(q), jnp.asarray(q_exact)))))
    assert all(abs(p - order) < 0.2 for p in _orders(errs)), errs


def test_energy_and_momentum_drift_second_order(torque_free_runs):
    out, *_ = torque_free_runs
    de, dl = [], []
    for dt in (0.02, 0.01, 0.005):
        body, tr, _ = out["midpoint", dt]
        E = np.asarray(rj.kinetic_energy(body, tr.states))
        L = np.linalg.norm(np.asarray(rj.angular_momentum(body, tr.states)), axis=-1)
        de.append(np.abs(E / E[0] - 1).max())
        dl.append(np.abs(L / L[0] - 1).max())
    assert all(abs(p - 2) < 0.2 for p in _orders(de)), de
    assert all(abs(p - 2) < 0.2 for p in _orders(dl)), dl
    # the world angular momentum vector itself is conserved to the same order
    assert de[-1] < 1e-4


def test_tennis_racket_flip_time():
    # near-intermediate-axis spin: omega_y reverses sign every half period of the elliptic
    # solution; compare the first reversal with the exact one.
    dt = 1e-3
    body, tr, t = _run(dt, 8.0, "midpoint")
    wy = np.asarray(tr.states.angular_velocity[:, 1])
    t_fine = np.linspace(0, 8.0, 800001)
    wy_exact = reference.torque_free_omega(I_RACKET, W_RACKET, t_fine)[:, 1]
    first_flip = t[np.argmax(wy < 0)]
    first_flip_exact = t_fine[np.argmax(wy_exact < 0)]
    period = reference.flip_period(I_RACKET, W_RACKET)
    assert 0 < first_flip_exact < period
    # near the separatrix the phase error is amplified; 2nd-order method at dt=1e-3: 0.5 % of the flip time
    assert abs(first_flip - first_flip_exact) < 5e-3 * first_flip_exact, (first_flip, first_flip_exact)
    # the body really flips: omega_y goes from +2 to about -2
    assert wy.min() < -1.9


def test_resistance_only_discrete_decay():
    # sphere (no gyroscopic coupling) with diagonal resistance: V' = V / (1 + r dt / m) exactly
    m, c, rv, rw, dt, n = 2.0, 0.5, 0.3, 0.2, 0.01, 300
    R = np.diag([rv] * 3 + [rw] * 3)
    body = rj.RigidBody(m, [c, c, c], resistance=R)
    s0 = rj.RigidBodyState(velocity=[1.0, -2.0, 0.5], angular_velocity=[3.0, 1.0, -2.0])
    tr = rj.rollout(rj.midpoint_step, body, s0, dt, n)
    k = np.arange(n + 1)[:, None]
    v_discrete = np.array([1.0, -2.0, 0.5]) * (1 + rv * dt / m) ** (-k)
    w_discrete = np.array([3.0, 1.0, -2.0]) * (1 + rw * dt / c) ** (-k)
    np.testing.assert_allclose(tr.states.velocity, v_discrete, rtol=1e-12)  # exact up to round-off
    np.testing.assert_allclose(tr.states.angular_velocity, w_discrete, rtol=1e-12)
    # and it tends to the continuous decay exp(-r t / m) at first order in dt
    t_end = n * dt
    assert abs(tr.states.velocity[-1, 0] - np.exp(-rv * t_end / m)) < rv / m * dt * t_end * rv / m


def test_constant_force_parabola():
    m, dt, n = 3.0, 0.01, 200
    F = np.array([1.0, -0.5, 2.0])
    g = np.array([0.0, 0.0, -9.81])
    body = rj.RigidBody(m, [1.0, 1.0, 1.0], gravity=g)
    v0, x0 = np.array([0.5, 1.0, 4.0]), np.array([0.0, 1.0, 2.0])
    wrench = jnp.broadcast_to(jnp.concatenate([jnp.asarray(F), jnp.zeros(3)]), (n, 6))
    tr = rj.rollout(rj.midpoint_step, body, rj.RigidBodyState(position=x0, velocity=v0), dt, n, loads=wrench)
    t = np.arange(n + 1)[:, None] * dt
    a = F / m + g
    np.testing.assert_allclose(tr.states.velocity, v0 + a * t, atol=1e-12)  # velocity exact
    # position from the new velocity: the exact parabola plus a t dt / 2 (first order)
    np.testing.assert_allclose(tr.states.position, x0 + v0 * t + 0.5 * a * t**2 + 0.5 * a * t * dt, atol=1e-11)


def test_principal_axis_spin_is_fixed_point():
    dt, n, w = 0.01, 500, 3.0
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    tr = rj.rollout(rj.midpoint_step, body, rj.RigidBodyState(angular_velocity=[0.0, 0.0, w]), dt, n)
    np.testing.assert_allclose(tr.states.angular_velocity, np.tile([0, 0, w], (n + 1, 1)), atol=1e-14)
    expected = so3.exp(jnp.array([0.0, 0.0, w * n * dt]))
    assert float(so3.angle_between(tr.states.orientation[-1], expected)) < 1e-10


def test_small_dt_gives_quaternion_kinematics():
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    q0 = so3.exp(jnp.array([0.3, -0.2, 0.5]))
    w = jnp.array([0.4, 1.5, -0.8])
    s0 = rj.RigidBodyState(orientation=q0, angular_velocity=w)
    qdot = 0.5 * so3.multiply(q0, jnp.concatenate([jnp.zeros(1), w]))
    errs = []
    for dt in (1e-3, 1e-4, 1e-5):
        s1, _ = rj.midpoint_step(body, s0, None, dt)
        errs.append(float(jnp.abs((s1.orientation - q0) / dt - qdot).max()))
    # the finite difference tends to q ⊗ (0, w)/2 at first order in dt
    assert errs[0] / errs[1] > 8 and errs[1] / errs[2] > 8 and errs[2] < 1e-4, errs


def test_rotation_limit_reported_and_checked():
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    s0 = rj.RigidBodyState(angular_velocity=[0.0, 20.0, 0.1])
    tr = rj.rollout(rj.midpoint_step, body, s0, 0.05, 10)  # |omega| dt = 1 rad
    assert np.all(np.asarray(tr.info.rotation) > 0.9)
    assert np.all(np.asarray(tr.info.status) == rj.Status.ROTATION_LIMIT)
    assert np.all(tr.info.converged)  # the state is advanced, only flagged
    with pytest.raises(rj.StepFailure, match="ROTATION_LIMIT"):
        rj.rollout(rj.midpoint_step, body, s0, 0.05, 10, checked=True)
    rj.rollout(rj.midpoint_step, body, s0, 0.001, 10, checked=True)  # fine at a small step


def test_nonfinite_step_reported_state_not_advanced():
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    s0 = rj.RigidBodyState(angular_velocity=[0.0, 1.0, 0.0])
    bad = jnp.full((5, 6), jnp.nan)
    tr = rj.rollout(rj.midpoint_step, body, s0, 0.01, 5, loads=bad)
    assert np.all(np.asarray(tr.info.status) == rj.Status.NONFINITE)
    np.testing.assert_array_equal(tr.states.angular_velocity[-1], s0.angular_velocity)
    with pytest.raises(rj.StepFailure, match="NONFINITE"):
        rj.check(tr.info)


def test_float32_follows_dtype():
    body = rj.RigidBody(jnp.float32(1.0), jnp.asarray(I_RACKET, jnp.float32))
    s0 = rj.RigidBodyState(angular_velocity=jnp.asarray(W_RACKET, jnp.float32))
    tr = rj.rollout(rj.midpoint_step, body, s0, 0.01, 100)
    assert tr.states.angular_velocity.dtype == jnp.float32
    assert tr.states.orientation.dtype == jnp.float32
    w_exact = reference.torque_free_omega(I_RACKET, W_RACKET, np.arange(101) * 0.01)
    # float32: the discretisation error (~1e-4 at dt=0.01 over 1 s) dominates round-off (~1e-6)
    assert np.abs(np.asarray(tr.states.angular_velocity) - w_exact).max() < 1e-3


def test_fixed_body_and_traced_body_give_the_same_rollout():
    # A body held fixed in a rollout is a constant of the compiled program: the step drops the
    # terms its zero entries multiply (diagonal inertia, resistance without coupling, no
    # x-gravity: rigidjax.numerics.static_zeros). A traced body (a fit) keeps every term. The two
    # programs differ only in operations on exact zeros, so they agree to round-off (1e-13
    # relative over 200 steps: ~1e-16 per operation, amplified by the motion's sensitivity).
    R = np.diag([0.3, 0.2, 0.1, 0.02, 0.03, 0.01])
    R[1, 5] = R[5, 1] = 0.01  # one coupling pair: partly zero blocks
    body = rj.RigidBody(2.0, [1.0, 2.0, 3.0], resistance=R, gravity=[0.0, 0.0, -9.81])
    s0 = rj.RigidBodyState(velocity=[1.0, 0.0, 2.0], angular_velocity=[0.01, 2.0, 0.5])
    wrench = jnp.asarray(np.random.default_rng(3).normal(size=(200, 6)))
    fixed = jax.jit(lambda s: rj.rollout(rj.midpoint_step, body, s, 1e-2, 200, loads=wrench))(s0)
    traced = jax.jit(lambda b, s: rj.rollout(rj.midpoint_step, b, s, 1e-2, 200, loads=wrench))(body, s0)
    for a, b in zip(jax.tree_util.tree_leaves(fixed.states), jax.tree_util.tree_leaves(traced.states)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-13)


def test_angular_velocity_step_is_the_full_steps_rotation_block():
    """The rotational update alone (what the inertia fits integrate) equals the full step's
    new angular velocity when the resistance does not couple rotation and translation, for a
    full tensor, a damping matrix and an applied torque; and its forward derivative agrees with
    central differences (step 1e-6: truncation ~1e-12, round-off ~1e-10)."""
    from rigidjax.midpoint import angular_velocity_step

    I = jnp.array([[2.0, 0.1, -0.2], [0.1, 1.5, 0.05], [-0.2, 0.05, 3.0]])
    D = jnp.array([[0.1, 0.02, 0.0], [0.01, 0.2, 0.0], [0.0, 0.0, 0.05]])
    w, tau = jnp.array([1.0, 5.0, -2.0]), jnp.array([0.3, -0.1, 0.2])
    R = jnp.zeros((6, 6)).at[:3, :3].set(0.3 * jnp.eye(3)).at[3:, 3:].set(D)
    state = rj.RigidBodyState(angular_velocity=w, velocity=[1.0, 2.0, 3.0])
    full, _ = rj.midpoint_step(rj.RigidBody(2.0, I, resistance=R), state, jnp.concatenate([jnp.zeros(3), tau]), 0.01)
    np.testing.assert_allclose(
        angular_velocity_step(I, w, 0.01, damping=D, torque=tau), full.angular_velocity, rtol=1e-14, atol=1e-14
    )
    f = jax.jit(lambda m: angular_velocity_step(m, w, 0.05, damping=jnp.full(3, 0.1)))
    m0 = jnp.array([1.0, 2.0, 3.0])
    J = jax.jacfwd(f)(m0)
    fd = np.stack([(f(m0 + 1e-6 * e) - f(m0 - 1e-6 * e)) / 2e-6 for e in np.eye(3)], -1)
    np.testing.assert_allclose(J, fd, rtol=1e-7, atol=1e-9)
