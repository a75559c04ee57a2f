r"""Initial states of the variational integrator and the quantities at a node: velocity,
energy, momentum maps (trep's ``initialize_from_state`` / ``initialize_from_configs``).

Checks at the API boundary (where values are concrete): the configuration satisfies the
constraints, the velocity is tangent to them, and the mass matrix ``∂²L/∂qdot²`` is regular
on the constraint tangent space.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..linalg import solve_small
from ..numerics import as_float, full_precision, is_concrete
from .system import (
    MechanicalSystem,
    VIState,
    _assemble,
    _check_last,
    _check_split,
    _dyn,
    _kin,
    _legendre,
    _new_momentum,
    _split_inputs,
)

__all__ = ["vi_state", "vi_state_from_configs", "generalized_velocity", "energy", "momentum_map"]


def _tangent_mass_check(system, q, qdot, t):
    """(h(q), Dh qdot, min and max |eigenvalue| of the mass matrix on the constraint tangent space)."""
    d = jnp.asarray(system.dynamic, jnp.int32)
    M = jax.jacfwd(_legendre, argnums=2)(system, q, qdot, t)[d][:, d]
    M = 0.5 * (M + M.T)
    h = system.constraints(q)
    Dh = jax.jacfwd(system.constraints)(q)
    if system.n_constraints:
        # orthonormal basis of the null space of Dh restricted to the dynamic variables
        _, s, vt = jnp.linalg.svd(Dh[:, d], full_matrices=True)
        Z = vt[system.n_constraints :].T
        M = Z.T @ M @ Z
        rank_ok = jnp.min(s) > 0
    else:
        rank_ok = jnp.asarray(True)
    ev = jnp.linalg.eigvalsh(M) if M.shape[0] else jnp.ones((1,), M.dtype)
    return h, Dh @ qdot, ev, rank_ok


def _validate_state(system, q, qdot, t, where: str):
    """Concrete checks at the API boundary: finite, h(q)=0, Dh qdot = 0, mass matrix definite."""
    if not (is_concrete(q) and is_concrete(qdot) and is_concrete(t)):
        return
    qn, vn = np.asarray(q), np.asarray(qdot)
    if not np.all(np.isfinite(qn)):
        raise ValueError(f"{where}: q contains NaN or inf: {qn}")
    if not np.all(np.isfinite(vn)):
        raise ValueError(f"{where}: the velocity contains NaN or inf: {vn}")
    n = system.n_config
    qf = jnp.reshape(q, (-1, n))
    vf = jnp.reshape(jnp.broadcast_to(qdot, q.shape), (-1, n))
    tf = jnp.reshape(jnp.broadcast_to(t, q.shape[:-1]), (-1,))
    h, dh, ev, rank_ok = _check_batch(system, qf, vf, tf)
    h, dh, ev, rank_ok = map(np.asarray, (h, dh, ev, rank_ok))
    eps = np.finfo(qn.dtype).eps
    tol = np.sqrt(eps) * np.maximum(1.0, np.abs(qn).reshape(-1, n).max(-1))
    if h.size and np.any(np.abs(h).max(-1) > tol):
        i = int(np.argmax(np.abs(h).max(-1)))
        raise ValueError(
            f"{where}: inconsistent initial configuration: the constraints h(q) = 0 do not hold "
            f"(|h(q)| = {np.abs(h[i]).max():.3g} > {tol[i]:.1e} at member {i}, h = {h[i].tolist()}); "
            "project q onto the constraint manifold first"
        )
    vscale = np.maximum(1.0, np.abs(vn).reshape(-1, n).max(-1))
    if dh.size and np.any(np.abs(dh).max(-1) > np.sqrt(eps) * vscale):
        i = int(np.argmax(np.abs(dh).max(-1)))
        raise ValueError(
            f"{where}: inconsistent initial velocity: Dh(q) qdot = {dh[i].tolist()} != 0 (the velocity "
            "must be tangent to the constraints)"
        )
    if not np.all(rank_ok):
        raise ValueError(
            f"{where}: the constraint Jacobian Dh(q) is rank deficient on the dynamic variables (redundant constraints)"
        )
    emax = np.abs(ev).max(-1)
    emin = np.abs(ev).min(-1)
    bad = emin <= 1e3 * eps * np.maximum(emax, np.finfo(qn.dtype).tiny)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(
            f"{where}: singular mass matrix: ∂²L/∂qdot² of the dynamic variables (restricted to the "
            f"constraint tangent space) has eigenvalues {ev[i].tolist()}; the Lagrangian must be regular "
            "(every dynamic coordinate needs kinetic energy not removed by a constraint)"
        )


def _solve_velocity(system, q, p, qdot_guess, t):
    """Velocity ``v`` with ``∂L/∂qdot(q, v)_d + Dh_d^T mu = p``, ``Dh v = 0`` (kinematic entries fixed).

    Newton from ``qdot_guess`` (3 iterations): exact for Lagrangians quadratic in the velocities.
    """
    d = jnp.asarray(system.dynamic, jnp.int32)
    nd, nc = system.n_dynamic, system.n_constraints
    Dh = jax.jacfwd(system.constraints)(q) if nc else jnp.zeros((0, system.n_config), q.dtype)

    def F(x):
        v = _assemble(system, x[:nd], _kin(system, qdot_guess))
        mom = _dyn(system, _legendre(system, q, v, t)) + Dh[:, d].T @ x[nd:] - p
        return jnp.concatenate([mom, Dh @ v])

    x = jnp.concatenate([_dyn(system, qdot_guess), jnp.zeros((nc,), q.dtype)])
    for _ in range(3):
        x = x - solve_small(jax.jacfwd(F)(x), F(x))
    return _assemble(system, x[:nd], _kin(system, qdot_guess))


def _flat_call(fn, batch, system, *arrays):
    """Call ``fn(system, *flat_arrays)`` on arrays flattened to one leading batch axis; unflatten the outputs."""
    B = int(np.prod(batch)) if batch else 1
    flat = [jnp.reshape(a, (B, *a.shape[len(batch) :])) for a in arrays]
    out = fn(system, *flat)
    return jax.tree_util.tree_map(lambda o: jnp.reshape(o, (*batch, *o.shape[1:])), out)


# jitted, vmapped helpers (compiled once per system structure and shape)
@jax.jit
def _momentum_batch(system, q, qdot, t):
    return jax.vmap(lambda a, b, c: _dyn(system, _legendre(system, a, b, c)))(q, qdot, t)


@jax.jit
def _velocity_batch(system, q, p, qdot_guess, t):
    return jax.vmap(lambda a, b, c, d: _solve_velocity(system, a, b, c, d))(q, p, qdot_guess, t)


@functools.partial(jax.jit, static_argnums=0)
def _d2_batch(forcing_split, system, q0, q1, t0, dt, u):
    def fn(a, b, c, s, uu):
        return _new_momentum(system, a, b, uu, c, c + s, forcing_split)

    return jax.vmap(fn)(q0, q1, t0, dt, u)


@jax.jit
def _check_batch(system, q, qdot, t):
    return jax.vmap(lambda a, b, c: _tangent_mass_check(system, a, b, c))(q, qdot, t)


@jax.jit
def _energy_batch(system, q, p, qdot, t):
    def E(q, p, qd, t):
        v = _solve_velocity(system, q, p, qd, t)
        return v @ _legendre(system, q, v, t) - system.lagrangian(q, v, t)

    return jax.vmap(E)(q, p, qdot, t)


@functools.partial(jax.jit, static_argnums=0)
def _momentum_map_batch(generator, system, q, p):
    return jax.vmap(lambda a, b: _dyn(system, generator(a)) @ b)(q, p)


@full_precision
def vi_state(system: MechanicalSystem, q, qdot=None, *, p=None, t=0.0, check: bool = True) -> VIState:
    r"""Initial :class:`VIState` from ``(q, qdot)`` or ``(q, p)`` (trep's ``initialize_from_state``).

    Args:
        system: the :class:`MechanicalSystem`.
        q: configuration ``(…, n)``; must satisfy ``h(q) = 0``.
        qdot: generalized velocity ``(…, n)``, tangent to the constraints (``Dh(q) qdot = 0``);
            then ``p = ∂L/∂qdot`` of the dynamic variables. Default zeros (when ``p`` is None).
        p: alternatively the momentum of the dynamic variables ``(…, n_dynamic)``; then
            the velocity is recovered by the constrained Legendre transform. Give one of the two.
        t: initial time, s.
        check: validate where values are concrete (outside ``jit``).

    Raises:
        ValueError: wrong shapes, NaN/inf, ``h(q) != 0`` (inconsistent initial configuration,
            tolerance ``sqrt(eps) max(1, |q|)``), a velocity not tangent to the constraints, or a
            singular mass matrix ``∂²L/∂qdot²`` on the constraint tangent space.
    """
    q = as_float(q, "q")
    _check_last(q, system.n_config, "q")
    dtype = q.dtype
    batch = q.shape[:-1]
    t = jnp.broadcast_to(as_float(t, "t", dtype), batch)
    if qdot is not None and p is not None:
        raise ValueError("vi_state: give the velocity qdot or the momentum p, not both")
    if p is None:
        qdot = jnp.zeros_like(q) if qdot is None else as_float(qdot, "qdot", dtype)
        _check_last(qdot, system.n_config, "qdot")
        qdot = jnp.broadcast_to(qdot, q.shape)
        p = _flat_call(_momentum_batch, batch, system, q, qdot, t)
    else:
        p = as_float(p, "p", dtype)
        _check_last(p, system.n_dynamic, "p")
        p = jnp.broadcast_to(p, (*batch, system.n_dynamic))
        if check and is_concrete(p) and not np.all(np.isfinite(np.asarray(p))):
            raise ValueError(f"vi_state: p contains NaN or inf: {np.asarray(p)}")
        qdot = _flat_call(_velocity_batch, batch, system, q, p, jnp.zeros_like(q), t)
    if check:
        _validate_state(system, q, qdot, t, "vi_state")
    lam = jnp.zeros((*batch, system.n_constraints), dtype)
    return VIState(time=t, q=q, p=p, lam=lam, qdot=qdot)


@full_precision
def vi_state_from_configs(
    system: MechanicalSystem, q0, q1, dt, *, t0=0.0, u=None, forcing_split: str = "left", check: bool = True
) -> VIState:
    r"""Initial :class:`VIState` at ``t1 = t0 + dt`` from two configurations (trep's ``initialize_from_configs``).

    ``p_1 = D_2 L_d(q_0, q_1, t_0, t_1) + f_d^+`` (``f_d^+ = 0`` for trep's ``"left"`` split, else
    ``dt f / 2`` with the input ``u`` of the step ``q0 -> q1``), ``qdot = (q_1 - q_0)/dt``, ``lam = 0``.
    ``q0``, ``q1`` ``(…, n)``; ``dt`` > 0 s; ``forcing_split`` as in :func:`vi_step`.

    Raises:
        ValueError: shapes, ``dt <= 0``, or either configuration violating ``h(q) = 0``.
    """
    q0 = as_float(q0, "q0")
    q1 = as_float(q1, "q1", q0.dtype)
    _check_last(q0, system.n_config, "q0")
    _check_last(q1, system.n_config, "q1")
    q0, q1 = jnp.broadcast_arrays(q0, q1)
    dt = as_float(dt, "dt", q0.dtype)
    if is_concrete(dt) and np.any(np.asarray(dt) <= 0):
        raise ValueError(f"vi_state_from_configs: dt must be > 0 s; got {np.asarray(dt)}")
    t0 = jnp.broadcast_to(as_float(t0, "t0", q0.dtype), q0.shape[:-1])
    dt = jnp.broadcast_to(dt, q0.shape[:-1])
    qdot = (q1 - q0) / dt[..., None]
    if check:
        _validate_state(system, q0, jnp.zeros_like(q0), t0, "vi_state_from_configs (q0)")
        _validate_state(system, q1, jnp.zeros_like(q1), t0 + dt, "vi_state_from_configs (q1)")
    inputs = (u, jnp.zeros(system.n_kinematic, q0.dtype)) if system.kinematic else u
    u, _ = _split_inputs(system, inputs, q0.dtype, "vi_state_from_configs")
    _check_split(forcing_split)
    u = jnp.broadcast_to(u, (*q0.shape[:-1], system.n_inputs))
    p = _flat_call(functools.partial(_d2_batch, forcing_split), q0.shape[:-1], system, q0, q1, t0, dt, u)
    lam = jnp.zeros((*q0.shape[:-1], system.n_constraints), q0.dtype)
    return VIState(time=t0 + dt, q=q1, p=p, lam=lam, qdot=qdot)


# --------------------------------------------------------------------------- derived quantities


@full_precision
def generalized_velocity(system: MechanicalSystem, state: VIState) -> jax.Array:
    r"""Velocity ``qdot_k`` (…, n) at the node ``t_k`` from the momentum ``p_k``.

    Constrained Legendre transform: ``∂L/∂qdot(q, qdot)_dyn + Dh_dyn^T mu = p``,
    ``Dh(q) qdot = 0``, kinematic entries taken from ``state.qdot``. Exact (to round-off) for
    Lagrangians quadratic in ``qdot``. Second-order accurate as an estimate of the true velocity.
    """
    return _flat_call(_velocity_batch, state.time.shape, system, state.q, state.p, state.qdot, state.time)


@full_precision
def energy(system: MechanicalSystem, state: VIState) -> jax.Array:
    r"""Energy ``E = qdot · ∂L/∂qdot - L`` (…,), J, at the node, with ``qdot`` from
    :func:`generalized_velocity`."""
    return _flat_call(_energy_batch, state.time.shape, system, state.q, state.p, state.qdot, state.time)


@full_precision
def momentum_map(system: MechanicalSystem, state: VIState, generator: Callable) -> jax.Array:
    r"""Discrete momentum map ``J = p_k · xi_Q(q_k)`` for a symmetry with generator ``xi_Q``.

    ``generator(q) -> (n,)`` is the infinitesimal generator of a one-parameter symmetry of
    ``L_d``, ``f_d`` and ``h`` (e.g. ``q -> (-y, x, 0)`` for a rotation about z); returns (…,).
    ``generator(q) -> (k, n)`` gives ``k`` components at once, (…, k) (e.g. the three
    components of the spatial angular momentum). Discrete Noether: ``J`` is conserved
    exactly (to solver tolerance) by :func:`vi_step` when forcing respects the symmetry.
    Pass a function defined once (it is a static argument of a jitted helper).
    """
    return _flat_call(functools.partial(_momentum_map_batch, generator), state.time.shape, system, state.q, state.p)
