r"""The variational step of a free rigid body in structure-of-arrays form: the rollouts' fast
path for :class:`rigidjax.variational.MidpointVI` on a free :func:`rigidjax.systems.rigid_body`
(:func:`rigidjax.variational.free_body.is_free_body`).

The state is carried as per-coordinate arrays over the ensemble (:class:`VICarry`); the DEL
residual, the momentum and the 8x8 Newton matrix of ``x = (q2, lambda1)`` are written in closed
form on them (:func:`_free_body_del`) and the matrix is eliminated entry by entry
(:func:`rigidjax.linalg.solve_components`), instead of ``jax.jacfwd`` of ``jax.grad`` of the
discrete Lagrangian on ``(..., 7)`` arrays. The solve is the generic step's iterate for iterate
(same residual, Newton and simplified-Newton updates, convergence test and status codes,
round-off apart), through the same :func:`rigidjax.newton.solve`. As there, the inertia enters
through its symmetric part (symmetric gradients) and the model follows the state's dtype.

Two properties keep the iterates (round-off apart) and shorten the program: a body held fixed in
the rollout (a constant of the compiled program, not traced) has its zero entries (off-diagonal
inertia, resistance, translation-rotation coupling) as structural zeros, so their terms are never
traced and the Newton matrix keeps exact zeros that the elimination skips; and the elimination
takes the three translation unknowns first, pivoting within their block (``(m/h) I`` plus
damping; ``leading=3``), then the rest through its Schur complement. A traced body (a fit of its
parameters) gets the dense elimination. The singularity test reads that elimination's pivots: a
translation block made singular by an unphysical (negative) damping of order ``m/h`` reports
``SINGULAR``.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import newton, so3
from ..info import Status, make_info, rotation_status, step_status
from ..linalg import lu_solve_components, singular, solve_components, solve_small
from ..numerics import materialize, norm3, materialize_chunks, mv, partial_jvp, static_zero, static_zeros, sum_nonzero
from ..stepper import PackedStep
from .free_body import is_free_body
from .system import VIState, _check_input_batch, _check_vi_state, _default_tol, _split_inputs

__all__ = ["VICarry", "free_body_packed_step"]


class VICarry(eqx.Module):
    """:class:`rigidjax.variational.VIState` of a free rigid body split into per-coordinate
    arrays (structure of arrays): ``q``, ``p``, ``qdot`` tuples of 7 arrays of the batch shape
    (m and Euler parameters; kg m/s and kg m^2/s; m/s and 1/s), ``time`` (s) and
    ``lam`` (the constraint impulse) one array each. The form in which the rollouts carry a
    :class:`~rigidjax.variational.MidpointVI` rollout of a free rigid body."""

    time: jax.Array
    q: tuple
    p: tuple
    lam: jax.Array
    qdot: tuple


def _pack_vi(state: VIState) -> VICarry:
    _check_vi_state(state)

    def split(a):
        return tuple(a[..., i] for i in range(a.shape[-1]))

    return VICarry(time=state.time, q=split(state.q), p=split(state.p), lam=state.lam[..., 0], qdot=split(state.qdot))


def _unpack_vi(carry: VICarry, like) -> VIState:
    def stack(c):
        return jnp.stack(c, -1)

    return VIState(
        time=carry.time, q=stack(carry.q), p=stack(carry.p), lam=carry.lam[..., None], qdot=stack(carry.qdot)
    )


def _free_body_del(body, resistance, q1, p1, u, h, c_minus, c_plus):
    r"""Closed-form pieces of the free body's constrained DEL equation (midpoint rule).

    With ``q_m = (q1 + q2)/2``, ``qd = (q2 - q1)/h``, ``omega = G_b(e_m) ed`` and
    ``G_b(e) ed = -G_b(ed) e`` (``omega`` is bilinear in ``e``, ``e_dot``):
    ``D_{1,2} L_d = h/2 L_q -/+ L_qdot`` with ``L_qdot = (m xd, G_b(e_m)^T I omega)``,
    ``L_q = (m g, -G_b(ed)^T I omega)``; the force impulse ``h f`` with
    ``f = (F - (R V)_v, G_b(e_m)^T (tau - (R V)_omega))``, ``V = (xd, omega)``, split
    ``c_minus h f`` into the residual and ``c_plus h f`` into the new momentum.

    Returns ``residual(em, ed, xd, e2, lam) -> 8 components`` (the dynamic rows of
    ``p1 + D1 L_d + f^- - Dh(q1)^T lam`` and ``h(q2)``) and
    ``momentum(em, ed, xd) -> 7 components`` (``p2 = D2 L_d + f^+``).
    """

    dtype = q1[0].dtype  # the state's precision, as vi_step (the model may be float64)
    m = jnp.asarray(body.mass, dtype)
    # the symmetric part, as autodiff of 1/2 omega.I omega uses: symmetric inertia gradients
    Is = (0.5 * (body.inertia + jnp.swapaxes(body.inertia, -1, -2))).astype(dtype)
    # entries known to vanish (a model held fixed) are structural zeros: terms not traced
    J, R = static_zeros(Is, 0), static_zeros(jnp.asarray(resistance, dtype), 0)
    g = tuple(body.gravity[i].astype(dtype) for i in range(3))
    e1 = q1[3:]

    def parts(em, ed, xd):
        w = so3.g_body_apply(em, ed)
        Iw = mv(J, w)
        tw = (*xd, *w)
        force = tuple(u[i] - sum_nonzero((R[i][j], tw[j]) for j in range(6)) for i in range(6))
        Lv = (*(m * v for v in xd), *so3.g_transpose_apply(em, Iw, 1))
        Lq = (*(m * gi for gi in g), *(-t for t in so3.g_transpose_apply(ed, Iw, 1)))
        f = (*force[:3], *so3.g_transpose_apply(em, force[3:], 1))
        return Lv, Lq, f

    def residual(em, ed, xd, e2, lam):
        Lv, Lq, f = parts(em, ed, xd)
        r = [p1[i] + 0.5 * h * Lq[i] - Lv[i] + c_minus * h * f[i] for i in range(7)]
        for j in range(4):
            r[3 + j] = r[3 + j] - e1[j] * lam
        return (*r, 0.5 * (e2[0] * e2[0] + e2[1] * e2[1] + e2[2] * e2[2] + e2[3] * e2[3] - 1))

    def momentum(em, ed, xd):
        Lv, Lq, f = parts(em, ed, xd)
        return tuple(0.5 * h * Lq[i] + Lv[i] + c_plus * h * f[i] for i in range(7))

    return residual, momentum


def _quat_angle(a, b):
    """Angle (rad) of ``conj(a) ⊗ b`` for 4-component tuples, as :func:`rigidjax.so3.angle_between`."""
    w = a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]
    x = a[0] * b[1] - a[1] * b[0] - (a[2] * b[3] - a[3] * b[2])
    y = a[0] * b[2] - a[2] * b[0] - (a[3] * b[1] - a[1] * b[3])
    z = a[0] * b[3] - a[3] * b[0] - (a[1] * b[2] - a[2] * b[1])
    return 2 * jnp.arctan2(norm3((x, y, z)), jnp.abs(w))


def _max_abs(xs):
    return functools.reduce(jnp.maximum, [jnp.abs(x) for x in xs])


def _all_finite(xs):
    return functools.reduce(jnp.logical_and, [jnp.isfinite(x) for x in xs])


def _packed_vi_step(
    system, carry: VICarry, inputs, dt, active, *, rtol, atol, max_iterations, forcing_split, max_rotation
):
    """:class:`rigidjax.variational.MidpointVI` on a :class:`VICarry` of a free rigid body;
    members where ``active`` is False keep their input state (0 iterations, residual 0).
    Returns ``(carry, info)``."""
    dtype = carry.q[0].dtype
    rtol, atol = _default_tol(dtype, rtol, atol)
    h = jnp.asarray(dt, dtype)
    # as the generic path: mass, inertia, gravity from the Lagrangian, resistance from the forcing
    body = system.lagrangian.body
    u = jnp.zeros((6,), dtype) if inputs is None else jnp.asarray(inputs, dtype)
    u = tuple(u[..., i] for i in range(6))
    # a non-finite wrench fails the step (NONFINITE below); it is replaced by 0 so that no NaN
    # enters the linearisation, whose coefficients reach the shared parameters' gradients
    u_ok = _all_finite(u)
    u = tuple(jnp.where(u_ok, c, 0) for c in u)
    c_minus, c_plus = (1.0, 0.0) if forcing_split == "left" else (0.5, 0.5)
    q1, p1, lam1, qd1 = carry.q, carry.p, carry.lam, carry.qdot
    residual, momentum = _free_body_del(body, system.forcing.body.resistance, q1, p1, u, h, c_minus, c_plus)

    def midpoint(z):
        em = tuple(0.5 * (q1[3 + j] + z[3 + j]) for j in range(4))
        ed = tuple((z[3 + j] - q1[3 + j]) / h for j in range(4))
        xd = tuple((z[i] - q1[i]) / h for i in range(3))
        return em, ed, xd

    def full(z):
        em, ed, xd = midpoint(z)
        return residual(em, ed, xd, z[3:7], z[7])

    def newton_matrix(z):
        """``F(z)`` and ``dF/dz`` entry by entry: forward derivatives along each unknown through
        only the quantities it moves (so JAX traces no zero tangents)."""
        em, ed, xd = midpoint(z)
        args = [list(em), list(ed), list(xd), list(z[3:7]), z[7]]
        F = residual(*args)

        def column(slots, tangents):
            return partial_jvp(residual, args, slots, tangents, dtype)

        inv_h = 1 / h
        cols = [column([(2, i)], [inv_h]) for i in range(3)]
        cols += [column([(0, j), (1, j), (3, j)], [0.5, inv_h, 1.0]) for j in range(4)]
        zero = jnp.zeros_like(F[0])
        cols.append((0.0,) * 3 + tuple(-q1[3 + j] + zero for j in range(4)) + (0.0,))
        # one set of loops for the whole matrix (XLA would otherwise recompute it in every consumer)
        # column by column: one column's entries share its tangents; structural zeros stay
        ent = [cols[c][r] for c in range(8) for r in range(8)]
        live = [k for k, e in enumerate(ent) if not static_zero(e)]
        flat = materialize_chunks(*F, *(ent[k] for k in live), size=8)
        for k, v in zip(live, flat[8:]):
            ent[k] = v
        return flat[:8], [[ent[8 * c + r] for c in range(8)] for r in range(8)]

    def update(f, z):
        # the generic step's iteration (variational.step._shamanskii_update) member by member:
        # a Newton update, then a simplified-Newton one with the same factors; converged when
        # the latter's |dx_i| <= atol + rtol |x_i| for all i
        r, A = newton_matrix(z)
        # translation first, pivoting within its block ((m/h) I + c R_vv: well conditioned)
        d, piv, lu = solve_components(A, [-x for x in r], materialize_b=True, factors=True, leading=3)
        # one loop for the back substitution (else every consumer recomputes it: XLA:CPU fuses
        # producers into each consumer)
        d = materialize(*d)
        z1 = tuple(zi + di for zi, di in zip(z, d))
        r1 = materialize(*full(z1))  # one loop: the solve below and the residual read it
        d = materialize(*lu_solve_components(lu, [-x for x in r1]))
        z1 = tuple(zi + di for zi, di in zip(z1, d))
        converged = functools.reduce(
            jnp.logical_and, [jnp.abs(di) <= atol + rtol * jnp.abs(zi) for di, zi in zip(d, z1)]
        )
        sing = singular(jnp.stack(piv, -1))
        nonfinite = ~_all_finite(z1)
        res = jnp.where(sing | nonfinite, _max_abs(r), _max_abs(r1))
        return newton.Update(z1, converged, sing, nonfinite, res)

    def tangent_solve(g, y):
        # block diagonal over the members: one column per unknown for all at once
        # (one vmapped evaluation, as jax.jacfwd, compiles faster in reverse mode than eight)
        eye = jnp.eye(8, dtype=y[0].dtype).reshape((8, 8) + (1,) * jnp.ndim(y[0]))
        rows = jax.vmap(g)(tuple(jnp.broadcast_to(eye[k], (8, *jnp.shape(y[0]))) for k in range(8)))
        A = jnp.stack([jnp.moveaxis(r, 0, -1) for r in rows], -2)  # (..., 8, 8)
        # failed members (non-finite matrix, e.g. a NaN load) get a zero tangent, not NaN
        ok = jnp.all(jnp.isfinite(A), (-2, -1))
        A = jnp.where(ok[..., None, None], A, jnp.eye(8, dtype=A.dtype))
        x = solve_small(A, jnp.where(ok[..., None], jnp.stack(y, -1), 0))
        return tuple(x[..., k] for k in range(8))

    act = jnp.asarray(active) if active is not None else jnp.bool_(True)
    batch = jnp.shape(q1[0])
    z0 = materialize(*(q1[i] + h * qd1[i] for i in range(7))) + (lam1,)
    z, solve = newton.solve(
        full, z0, update, tangent_solve, max_iterations=max_iterations, stopped=~jnp.broadcast_to(act, batch)
    )

    q2 = z[:7]
    em, ed, xd = midpoint(z)
    # the new state in one loop (each select below would otherwise recompute all of it)
    flat = materialize(*momentum(em, ed, xd), *((q2[i] - q1[i]) / h for i in range(7)))
    p2, qd2 = flat[:7], flat[7:]
    new = VICarry(time=carry.time + h, q=q2, p=p2, lam=z[7], qdot=qd2)
    finite = _all_finite((*q2, *p2, z[7])) & u_ok
    status = step_status(solve.status, finite=finite, valid=(h > 0) & jnp.isfinite(h))  # valid: a traced dt
    status = jnp.where(act, status, Status.SUCCESS)
    ok = (status == Status.SUCCESS) & act
    ok = materialize(ok.astype(dtype))[0] > 0.5  # once, not inside each of the 22 selects
    res = jnp.where(act, solve.residual, 0)
    # the rotation of variational.step._input_rotation: a probe step along the input velocity
    speed = _max_abs(qd1)
    s = jnp.where(speed * h > 1e-2, 1e-2 / jnp.where(speed > 0, speed, 1), h)
    e1 = q1[3:]
    rot = _quat_angle(e1, tuple(e1[j] + s * qd1[3 + j] for j in range(4))) * (h / s)
    rot = jnp.where(ok, jnp.maximum(rot, _quat_angle(e1, q2[3:])), rot)
    status = rotation_status(status, jnp.where(ok, rot, 0), max_rotation)
    leaves, treedef = jax.tree_util.tree_flatten(new)
    sel = [jnp.where(ok, a, b) for a, b in zip(leaves, jax.tree_util.tree_leaves(carry))]
    out = jax.tree_util.tree_unflatten(treedef, materialize_chunks(*sel, size=8))  # 3 loops, not 22
    return out, make_info(status, solve.iterations, res, jax.lax.stop_gradient(rot))


def _check(system, state, inputs, dt):
    u, _ = _split_inputs(system, inputs, state.q.dtype)
    _check_input_batch(u, state.q.shape[:-1], "u")


def free_body_packed_step(
    system, *, rtol, atol, max_iterations: int, forcing_split: str, max_rotation: float
) -> PackedStep | None:
    """The :class:`rigidjax.stepper.PackedStep` of :class:`rigidjax.variational.MidpointVI` with these
    (checked) options on ``system`` if :func:`~rigidjax.variational.free_body.is_free_body`
    holds for it, else ``None``: pack/unpack between :class:`rigidjax.variational.VIState` and
    :class:`VICarry`, the step :func:`_packed_vi_step`, and the public step's shape checks."""
    if not is_free_body(system):
        return None
    step = functools.partial(
        _packed_vi_step,
        rtol=rtol,
        atol=atol,
        max_iterations=max_iterations,
        forcing_split=forcing_split,
        max_rotation=max_rotation,
    )
    return PackedStep(pack=_pack_vi, unpack=_unpack_vi, step=step, check=_check)
