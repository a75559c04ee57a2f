"""Time-varying LQR on the variational integrator's linearisation (rigidjax.lqr).

Truths: SciPy's discrete algebraic Riccati solution (long-horizon limit), and the nonlinear
closed loop: deviations from the reference decay under feedback where the open loop diverges.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.linalg import solve_discrete_are

from rigidjax import rollout, systems
from rigidjax.info import Status
from rigidjax.lqr import closed_loop_rollout, lqr_gains
from rigidjax.variational import join_state, trajectory_jacobians, vi_state, vi_step

G = 9.81


def test_riccati_recursion_converges_to_dare():
    rng = np.random.default_rng(0)
    A = np.eye(3) + 0.05 * rng.standard_normal((3, 3))
    B = rng.standard_normal((3, 2))
    Q, R = np.diag([1.0, 2.0, 3.0]), np.diag([0.5, 1.0])
    N = 2000
    K, P = lqr_gains(np.broadcast_to(A, (N, 3, 3)), np.broadcast_to(B, (N, 3, 2)), Q, R)
    P_inf = solve_discrete_are(A, B, Q, R)
    K_inf = np.linalg.solve(R + B.T @ P_inf @ B, B.T @ P_inf @ A)
    # far from the horizon the recursion has converged to the stationary solution (to round-off)
    np.testing.assert_allclose(P[0], P_inf, rtol=1e-9)
    np.testing.assert_allclose(K[0], K_inf, rtol=1e-9, atol=1e-12)


@functools.partial(jax.jit, static_argnames=("n",))
def _run(system, state, loads, dt, n):
    return rollout(vi_step, system, state, dt, n, loads)


def _deviation(system, states, X_ref):
    return np.linalg.norm(np.asarray(join_state(system, states)) - np.asarray(X_ref), axis=1)


def test_tvlqr_tracks_swinging_cart_pole_trajectory():
    """Time-varying gains along a large-amplitude swing of a pendulum on a cart (cart force input)."""
    system = systems.cart_pendulum(1.0, (0.5,), (1.0,), G)
    dt, N = 0.01, 300
    t = dt * jnp.arange(N)
    U_ref = (2.0 * jnp.sin(3.0 * t))[:, None]  # N, a nominal force on the cart
    ref = _run(system, vi_state(system, jnp.array([0.0, np.pi - 0.2]), jnp.zeros(2)), U_ref, dt, N)
    X_ref = join_state(system, ref.states)
    A, B = trajectory_jacobians(system, X_ref, U_ref, t, dt)
    K, _ = lqr_gains(A, B, 10.0 * jnp.eye(4), 0.01 * jnp.eye(1), 100.0 * jnp.eye(4))
    start = vi_state(system, jnp.array([0.05, np.pi - 0.15]), jnp.zeros(2))
    closed, _, info = jax.jit(lambda s: closed_loop_rollout(system, s, X_ref, U_ref, K, dt))(start)
    assert bool(jnp.all(info.status == Status.SUCCESS))
    open_ = _run(system, start, U_ref, dt, N)  # same compile as the reference
    d_closed = _deviation(system, closed, X_ref)
    d_open = _deviation(system, open_.states, X_ref)
    # open loop: the deviation grows (the swing starts near the unstable upright position)
    assert d_open.max() > 5 * d_open[0]
    # closed loop: decays to a fraction of the initial deviation
    assert d_closed[-1] < 0.25 * d_closed[0]


@pytest.mark.slow
def test_lqr_balances_inverted_double_pendulum_on_cart():
    system = systems.cart_pendulum(1.0, (0.5, 0.5), (0.6, 0.6), G)
    dt, N = 0.01, 400
    q_up = jnp.array([0.0, np.pi, np.pi])
    X_ref = jnp.tile(join_state(system, vi_state(system, q_up, jnp.zeros(3))), (N + 1, 1))
    U_ref = jnp.zeros((N, 1))
    A, B = trajectory_jacobians(system, X_ref, U_ref, dt * jnp.arange(N), dt)
    K, _ = lqr_gains(A, B, 10.0 * jnp.eye(6), 0.01 * jnp.eye(1), 100.0 * jnp.eye(6))
    start = vi_state(system, q_up + jnp.array([0.0, 0.05, -0.03]), jnp.zeros(3))
    closed, U, info = closed_loop_rollout(system, start, X_ref, U_ref, K, dt)
    assert bool(jnp.all(info.status == Status.SUCCESS))
    open_ = rollout(vi_step, system, start, dt, N, loads=U_ref)
    d_closed = _deviation(system, closed, X_ref)
    d_open = _deviation(system, open_.states, X_ref)
    assert d_open[-1] > 20 * d_open[0]  # falls over
    assert d_closed[-1] < 0.7 * d_closed[0]  # balanced, deviation shrinking (0.58 measured at N = 400)
    assert np.isfinite(np.asarray(U)).all()


def test_lqr_gains_shape_errors():
    with pytest.raises(ValueError, match="A must have shape"):
        lqr_gains(np.eye(2), np.ones((1, 2, 1)), np.eye(2), np.eye(1))
    with pytest.raises(ValueError, match="B must have shape"):
        lqr_gains(np.ones((3, 2, 2)), np.ones((2, 2, 1)), np.eye(2), np.eye(1))
