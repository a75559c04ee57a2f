r"""Derivatives of the discrete map of one variational step (trep's ``dq2dq1``, ``dq2dq1dq1``,
...) and the state-space view ``X(k+1) = F(X(k), U(k))``, ``X = (q, p)``, ``U = (u, rho)``,
used by :mod:`rigidjax.lqr`.

All derivatives are exact: those of the implicit solution of the DEL equation (implicit
function theorem, :func:`rigidjax.newton.solve`), differentiated again for second order.
"""

from __future__ import annotations

import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from ..numerics import full_precision
from .step import discrete_map
from .system import MechanicalSystem, VIState, _check_split, _split_inputs

__all__ = [
    "MapDerivatives",
    "linearize",
    "split_state",
    "join_state",
    "state_space_step",
    "trajectory_jacobians",
]


class MapDerivatives(eqx.Module):
    r"""Derivatives of the discrete map at one step (trep's ``dq2dq1``, ``dp2du1``, ``dl1dk2dq1``, ...).

    ``first[out][inp]`` has shape ``out.shape + inp.shape``; ``second[out][a][b]`` has shape
    ``out.shape + a.shape + b.shape``. Keys: outputs ``"q2"`` (n,), ``"p2"`` (n_dynamic,),
    ``"lam1"`` (n_constraints,); inputs ``"q1"`` (n,), ``"p1"`` (n_dynamic,), ``"u1"``
    (n_inputs,), ``"rho"`` (n_kinematic,). ``second`` is None unless requested.
    """

    first: dict
    second: dict | None


_OUTS = ("q2", "p2", "lam1")
_INS = ("q1", "p1", "u1", "rho")


@full_precision
def linearize(
    system: MechanicalSystem,
    state: VIState,
    inputs: Any,
    dt,
    *,
    second_order: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    max_iterations: int = 20,
    forcing_split: str = "left",
) -> MapDerivatives:
    r"""First (and optionally second) derivatives of ``(q1, p1, u1, rho) -> (q2, p2, lambda1)``.

    Exact derivatives by forward-mode differentiation of the implicit solution of the DEL
    equation (implicit function theorem, via ``jax.lax.custom_root``); second derivatives by
    differentiating that again. ``state`` single member; ``inputs`` as for :func:`vi_step`.
    """
    dtype = state.q.dtype
    u, rho = _split_inputs(system, inputs, dtype, "linearize")
    _check_split(forcing_split)
    dt = jnp.asarray(dt, dtype)
    return _linearize(system, state, u, rho, dt, second_order, rtol, atol, max_iterations, forcing_split)


@functools.partial(jax.jit, static_argnums=(5, 6, 7, 8, 9))
def _linearize(system, state, u, rho, dt, second_order, rtol, atol, max_iterations, forcing_split):
    guess = state.q + dt * state.qdot

    def F(q1, p1, u1, r):
        return discrete_map(
            system,
            q1,
            p1,
            u1,
            r if system.kinematic else None,
            t1=state.time,
            dt=dt,
            guess=guess,
            rtol=rtol,
            atol=atol,
            max_iterations=max_iterations,
            forcing_split=forcing_split,
        )

    args = (state.q, state.p, u, rho)
    J = jax.jacfwd(F, argnums=(0, 1, 2, 3))(*args)
    first = {o: {i: J[a][b] for b, i in enumerate(_INS)} for a, o in enumerate(_OUTS)}
    second = None
    if second_order:
        H = jax.jacfwd(jax.jacfwd(F, argnums=(0, 1, 2, 3)), argnums=(0, 1, 2, 3))(*args)
        second = {
            o: {i: {j: H[a][b][c] for c, j in enumerate(_INS)} for b, i in enumerate(_INS)} for a, o in enumerate(_OUTS)
        }
    return MapDerivatives(first=first, second=second)


# --------------------------------------------------------------------------- state-space view


def split_state(system: MechanicalSystem, X) -> tuple[jax.Array, jax.Array]:
    """``X = (q, p)`` (…, n + n_dynamic) -> ``(q, p)``."""
    return X[..., : system.n_config], X[..., system.n_config :]


def join_state(system: MechanicalSystem, state: VIState) -> jax.Array:
    """State-space vector ``X = (q, p)`` (…, n + n_dynamic) of a :class:`VIState`."""
    return jnp.concatenate([state.q, state.p], -1)


def _split_U(system, U):
    nu = system.n_inputs
    return U[..., :nu], U[..., nu:]


@full_precision
def state_space_step(
    system: MechanicalSystem,
    X,
    U,
    t,
    dt,
    *,
    guess=None,
    rtol=None,
    atol=None,
    max_iterations: int = 20,
    forcing_split: str = "left",
):
    r"""``X(k+1) = F(X(k), U(k))`` with ``X = (q, p)`` (n + n_dynamic,), ``U = (u, rho)`` (n_inputs + n_kinematic,).

    Single member, differentiable (implicit function theorem). ``guess``: optional ``q2``
    starting point for Newton (e.g. the reference trajectory's next configuration).
    The kinematic entries of the next ``q`` are ``rho``, so ``B`` carries them directly.
    """
    q, p = split_state(system, X)
    u, rho = _split_U(system, U)
    q2, p2, _ = discrete_map(
        system,
        q,
        p,
        u,
        rho if system.kinematic else None,
        t1=t,
        dt=dt,
        guess=guess,
        rtol=rtol,
        atol=atol,
        max_iterations=max_iterations,
        forcing_split=forcing_split,
    )
    return jnp.concatenate([q2, p2])


@full_precision
def trajectory_jacobians(system: MechanicalSystem, X, U, t, dt, **kwargs) -> tuple[jax.Array, jax.Array]:
    r"""Jacobians ``A_k = ∂X(k+1)/∂X(k)``, ``B_k = ∂X(k+1)/∂U(k)`` along a trajectory.

    Args:
        X: states ``(N + 1, nx)`` with ``nx = n + n_dynamic``; ``X[k+1]`` warm-starts step ``k``.
        U: inputs ``(N, nU)`` with ``nU = n_inputs + n_kinematic``.
        t: times ``(N,)`` s (start of each step); dt: scalar or ``(N,)`` s.

    Returns ``A`` ``(N, nx, nx)``, ``B`` ``(N, nx, nU)``.
    """
    X = jnp.asarray(X)
    U = jnp.asarray(U, X.dtype)
    N = U.shape[0]
    if X.shape[0] != N + 1:
        raise ValueError(f"trajectory_jacobians: X must have N+1 = {N + 1} rows for U with N = {N}; got {X.shape}")
    t = jnp.broadcast_to(jnp.asarray(t, X.dtype), (N,))
    dt = jnp.broadcast_to(jnp.asarray(dt, X.dtype), (N,))
    return _trajectory_jacobians(system, X, U, t, dt, tuple(sorted(kwargs.items())))


@functools.partial(jax.jit, static_argnums=5)
def _trajectory_jacobians(system, X, U, t, dt, options):
    kwargs = dict(options)

    def jac(x, u, x_next, tk, hk):
        def f(a, b):
            return state_space_step(system, a, b, tk, hk, guess=x_next[: system.n_config], **kwargs)

        return jax.jacfwd(f, argnums=(0, 1))(x, u)

    return jax.vmap(jac)(X[:-1], U, X[1:], t, dt)
