"""The one Newton loop of the implicit steppers, its status rule, and its derivatives.

Every implicit step (the Euler-parameter step and the variational DEL step, each in array
and in per-component form) solves ``f(z) = 0`` by :func:`solve`: a ``lax.while_loop`` that
repeats the caller's update until it converges, and gives each ensemble member one
:class:`rigidjax.Status`:

- ``SINGULAR``: the update's iteration matrix had a (relatively) vanishing pivot;
- ``NONFINITE``: the update produced inf or NaN;
- ``SUCCESS``: the caller's convergence test passed;
- ``MAX_ITERATIONS``: none of these within ``max_iterations`` updates.

A member stops at the first of these and keeps its last finite iterate (a failed update is
discarded), so the solution is finite wherever the solve linearises it. The derivative of
the solution is the implicit one (:func:`custom_root`): ``dz = -f_z^-1 df``, to second order
in every mode. The loop runs on stopped inputs, so no derivative ever enters it.

The update itself (Newton plus a simplified-Newton step with the same factors, in the
steppers) and the convergence test belong to the caller, as its tolerances do.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from .info import Status
from .linalg import solve_small
from .numerics import derivative_only, materialize, where_tree

__all__ = ["Update", "NewtonInfo", "solve", "custom_root", "dense_tangent_solve"]


class Update(NamedTuple):
    """What the caller's ``update(f, z)`` returns for one iteration (flags per member).

    Attributes:
        z: the new iterate (same pytree as ``z``).
        converged: ``bool``: the caller's test on the update passed.
        singular: ``bool``: the iteration matrix was singular.
        nonfinite: ``bool``: ``z`` holds inf or NaN.
        residual: ``max |f|`` at the iterate the update started from (same float dtype).
    """

    z: object
    converged: jax.Array
    singular: jax.Array
    nonfinite: jax.Array
    residual: jax.Array


class NewtonInfo(NamedTuple):
    """Per member: ``iterations`` (int32), ``status`` (int32 :class:`rigidjax.Status` code) and
    ``residual`` (the last ``max |f|`` evaluated). Carries no derivative."""

    iterations: jax.Array
    status: jax.Array
    residual: jax.Array


def _loop(update: Callable, z0, max_iterations: int, stopped, dtype):
    """The iteration (no derivatives): returns ``z`` and the info as float arrays."""
    stopped = jnp.asarray(stopped, bool)
    batch = jnp.shape(stopped)

    def running(c):
        it, _, done, status, _ = c
        return (it < max_iterations) & ~done & (status == Status.SUCCESS)

    def body(c):
        it, z, done, status, res = c
        run = running(c)
        u = update(z)
        new = jnp.where(u.singular, Status.SINGULAR, jnp.where(u.nonfinite, Status.NONFINITE, Status.SUCCESS))
        ok = run & (new == Status.SUCCESS)
        conv = jnp.where(run, u.converged & (new == Status.SUCCESS), done)
        status = jnp.where(run, new, status)
        res = jnp.where(run, jnp.asarray(u.residual, dtype), res)
        # the flags in one loop, read by every select below: else XLA:CPU fuses the whole
        # flag computation (finiteness of the iterate, pivots) into each component's select
        ok, conv, status, res = materialize(ok.astype(dtype), conv.astype(dtype), status.astype(dtype), res)
        ok, conv, status = ok > 0.5, conv > 0.5, status.astype(jnp.int32)
        return it + run.astype(jnp.int32), where_tree(ok, u.z, z), conv, status, res

    init = (
        jnp.zeros(batch, jnp.int32),
        z0,
        stopped,
        jnp.full(batch, Status.SUCCESS, jnp.int32),
        jnp.full(batch, jnp.inf, dtype),
    )
    it, z, done, status, res = jax.lax.while_loop(lambda c: jnp.any(running(c)), body, init)
    status = jnp.where(done, Status.SUCCESS, jnp.where(status == Status.SUCCESS, Status.MAX_ITERATIONS, status))
    # as floats: custom_root's JVP rule mishandles integer aux (float0 tangents)
    return z, (it.astype(dtype), status.astype(dtype), res)


def solve(f: Callable, z0, update: Callable, tangent_solve: Callable, *, max_iterations: int, stopped=False):
    """Solve ``f(z) = 0`` from ``z0`` by the caller's ``update``; differentiable (implicitly).

    Args:
        f: the residual, ``f(z)`` a pytree like ``z`` (closed-over values are its parameters).
        z0: the first iterate: an array, or a tuple of per-component arrays of the batch shape
            (possibly with trailing axes, e.g. one per body).
        update: ``update(f, z) -> Update``; ``f`` is the residual as the solve sees it.
        tangent_solve: ``tangent_solve(g, y)`` solves ``g(x) = y`` for the linear map ``g``
            (the Jacobian-vector product of ``f`` at the solution), as in
            :func:`jax.lax.custom_root`.
        max_iterations: the cap on updates per member (``>= 1``).
        stopped: ``bool`` of the batch shape (``()`` for one member): members that do not
            iterate at all (they report ``SUCCESS`` after 0 iterations; the caller masks them).
            Its shape sets the members' shape of every flag.

    Returns:
        ``(z, NewtonInfo)``: the last accepted iterate and, per member, the iterations, status
        and residual (see the module docstring for the status rule).
    """
    dtype = jax.tree_util.tree_leaves(z0)[0].dtype

    def loop(f, z):
        return _loop(lambda zz: update(f, zz), z, max_iterations, stopped, dtype)

    z, aux = custom_root(f, z0, loop, tangent_solve)
    it, status, res = jax.lax.stop_gradient(aux)
    return z, NewtonInfo(it.astype(jnp.int32), status.astype(jnp.int32), res)


def custom_root(f, z0, solve, tangent_solve):
    """:func:`jax.lax.custom_root` (``has_aux=True``) whose solution is differentiable to
    second order in every mode, reverse over reverse included.

    ``custom_root`` gives derivatives of the converged solution by the implicit function
    theorem, but an outer reverse pass over an inner one (``jacrev(jacrev)`` of a rollout)
    meets the solve itself: inside ``lax.scan``, linearisation inlines the primal, and the
    Newton ``while_loop`` cannot be transposed. So the solution leaves the solve as
    ``z* - derivative_only(tangent_solve(f'(z*), f(z*)))`` with ``z*`` the Newton iterate,
    computed from stopped inputs: the value is exactly ``z*`` (the correction term compiles
    away), and its derivative is the implicit one, ``-f_z^-1 f_theta``, written in ordinary
    operations. That first derivative is all a Hessian needs from the solution (the second
    comes from differentiating the linear solve of the inner pass). ``solve(f, z0) -> (z,
    aux)`` and ``tangent_solve(g, y)`` are those of :func:`jax.lax.custom_root`.
    """

    def solve_then_mark(f, z0):
        # the iteration sees every closed-over value stopped: where the solve is inlined, an
        # outer derivative would otherwise differentiate the whole while_loop (only to drop
        # it) rather than skip it
        loop, closed = jax.closure_convert(lambda z: solve(f, z), z0)
        z, aux = loop(jax.lax.stop_gradient(z0), *(jax.lax.stop_gradient(c) for c in closed))
        z = jax.lax.stop_gradient(z)
        r, lin = jax.linearize(f, z)  # traced once, whatever tangent_solve evaluates
        correction = tangent_solve(lin, r)
        return jax.tree_util.tree_map(lambda a, c: a - derivative_only(c), z, correction), aux

    return jax.lax.custom_root(f, z0, solve_then_mark, tangent_solve, has_aux=True)


def dense_tangent_solve(g, y, *, method: str = "elimination"):
    """``tangent_solve`` for an array unknown ``y (n,)``: the Jacobian materialised by
    ``jax.jacfwd`` and solved by :func:`rigidjax.linalg.solve_small` (``method``: its linear
    solver, default ``"elimination"``: no LAPACK call).

    A member whose Jacobian is not finite (a failed solve, e.g. a NaN load) gets a zero
    tangent, not NaN: under ``vmap`` its NaN would otherwise reach every shared parameter's
    gradient (``0 * NaN``).
    """
    J = jax.jacfwd(g)(y)
    ok = jnp.all(jnp.isfinite(J))
    return solve_small(jnp.where(ok, J, jnp.eye(J.shape[-1], dtype=J.dtype)), jnp.where(ok, y, 0), method=method)
