r"""Finite-horizon, time-varying discrete LQR on the variational integrator's state-space view.

The discrete map of :func:`rigidjax.variational.vi_step` is ``X(k+1) = F(X(k), U(k))`` with
``X = (q, p)`` and ``U = (u, rho)`` (:func:`rigidjax.variational.state_space_step`). Along a
reference trajectory ``(X_ref, U_ref)`` its Jacobians ``A_k, B_k``
(:func:`rigidjax.variational.trajectory_jacobians`, exact by the implicit function theorem)
give the linear time-varying deviation dynamics ``dX(k+1) = A_k dX(k) + B_k dU(k)``.
:func:`lqr_gains` solves the discrete Riccati recursion backwards (``lax.scan``)

.. math::

    K_k = (R + B_k^T P_{k+1} B_k)^{-1} B_k^T P_{k+1} A_k, \qquad
    P_k = Q + A_k^T P_{k+1} (A_k - B_k K_k), \qquad P_N = Q_f,

and :func:`closed_loop_rollout` runs the full nonlinear VI under ``U_k = U_ref,k - K_k (X_k - X_ref,k)``.
The same construction as trep's ``trep.discopt.DSystem.calc_feedback_controller`` (whose state
also carries the kinematic velocities; the midpoint DEL map does not depend on them, so
``X = (q, p)`` here). Reference: B. D. O. Anderson, J. B. Moore, *Optimal Control: Linear
Quadratic Methods* (1990), ch. 2.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from .numerics import full_precision, where_tree
from .info import FAILURES, StepInfo
from .variational import MechanicalSystem, VIState, join_state, vi_step

__all__ = ["lqr_gains", "closed_loop_rollout"]


@full_precision
def lqr_gains(A, B, Q, R, Qf=None) -> tuple[jax.Array, jax.Array]:
    r"""Time-varying LQR gains by the backward discrete Riccati recursion.

    Args:
        A: ``(N, nx, nx)`` state Jacobians; B: ``(N, nx, nu)`` input Jacobians.
        Q: ``(nx, nx)`` or ``(N, nx, nx)`` state cost (symmetric, >= 0).
        R: ``(nu, nu)`` or ``(N, nu, nu)`` input cost (symmetric, > 0).
        Qf: ``(nx, nx)`` terminal cost; default ``Q`` (of the last step).

    Returns:
        ``K`` ``(N, nu, nx)`` with the feedback ``dU_k = -K_k dX_k``, and the cost-to-go
        matrices ``P`` ``(N + 1, nx, nx)``.

    Raises:
        ValueError: inconsistent shapes.
    """
    A = jnp.asarray(A)
    B = jnp.asarray(B, A.dtype)
    if A.ndim != 3 or A.shape[1] != A.shape[2]:
        raise ValueError(f"lqr_gains: A must have shape (N, nx, nx); got {A.shape}")
    N, nx, _ = A.shape
    if B.ndim != 3 or B.shape[:2] != (N, nx):
        raise ValueError(f"lqr_gains: B must have shape (N={N}, nx={nx}, nu); got {B.shape}")
    nu = B.shape[2]
    Q = jnp.broadcast_to(jnp.asarray(Q, A.dtype), (N, nx, nx))
    R = jnp.broadcast_to(jnp.asarray(R, A.dtype), (N, nu, nu))
    Qf = Q[-1] if Qf is None else jnp.asarray(Qf, A.dtype)
    if Qf.shape != (nx, nx):
        raise ValueError(f"lqr_gains: Qf must have shape ({nx}, {nx}); got {Qf.shape}")

    return _riccati(A, B, Q, R, Qf)


@jax.jit
def _riccati(A, B, Q, R, Qf):
    def back(P, xs):
        Ak, Bk, Qk, Rk = xs
        PB = P @ Bk
        K = jnp.linalg.solve(Rk + Bk.T @ PB, PB.T @ Ak)
        Pn = Qk + Ak.T @ P @ (Ak - Bk @ K)
        return 0.5 * (Pn + Pn.T), (K, Pn)

    _, (K, P) = jax.lax.scan(back, Qf, (A, B, Q, R), reverse=True)
    return K, jnp.concatenate([P, Qf[None]], 0)


@full_precision
def closed_loop_rollout(
    system: MechanicalSystem,
    state0: VIState,
    X_ref,
    U_ref,
    K,
    dt,
    *,
    step=vi_step,
) -> tuple[VIState, jax.Array, StepInfo]:
    r"""Simulate the nonlinear VI under the tracking law ``U_k = U_ref,k - K_k (X_k - X_ref,k)``.

    Args:
        system: the :class:`~rigidjax.variational.MechanicalSystem`.
        state0: initial :class:`~rigidjax.variational.VIState` (single member; ``jax.vmap`` for more).
        X_ref: ``(N + 1, nx)`` or ``(N, nx)`` reference states ``(q, p)``.
        U_ref: ``(N, nU)`` reference inputs ``(u, rho)``.
        K: ``(N, nU, nx)`` gains from :func:`lqr_gains`.
        dt: step, s (scalar or ``(N,)``).
        step: the stepper (``functools.partial(vi_step, ...)`` to set tolerances).

    Returns:
        ``(states, U, info)``: states with a leading axis ``N + 1``, the applied inputs
        ``(N, nU)`` and per-step :class:`rigidjax.StepInfo`. A failed step freezes the state
        (as in :func:`rigidjax.rollout`).
    """
    U_ref = jnp.asarray(U_ref, state0.q.dtype)
    N = U_ref.shape[0]
    X_ref = jnp.asarray(X_ref, state0.q.dtype)[:N]
    dt = jnp.broadcast_to(jnp.asarray(dt, state0.q.dtype), (N,))
    nu = system.n_inputs
    failure_codes = jnp.asarray([int(c) for c in FAILURES], jnp.int32)

    def body(carry, xs):
        st, failed = carry
        xr, ur, Kk, h = xs
        U = ur - Kk @ (join_state(system, st) - xr)
        inputs = (U[:nu], U[nu:]) if system.kinematic else U[:nu]
        new, info = step(system, st, inputs, h)
        new = where_tree(failed, st, new)
        failed = failed | jnp.isin(info.status, failure_codes)
        return (new, failed), (new, U, info)

    (_, _), (states, U, info) = jax.lax.scan(body, (state0, jnp.asarray(False)), (X_ref, U_ref, K, dt))
    states = jax.tree_util.tree_map(lambda a0, a: jnp.concatenate([a0[None], a], 0), state0, states)
    return states, U, info
