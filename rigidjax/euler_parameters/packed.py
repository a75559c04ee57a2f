r"""The Euler-parameter step in structure-of-arrays form: the rollouts' fast path for free bodies.

A model of free bodies (no constraints but the Euler-parameter one) is stepped as
:class:`~rigidjax.euler_parameters.GeneralizedAlphaEP` steps it, iterate for iterate (same
residual, scaling, Newton matrix, convergence tests, status codes; round-off apart), with every
coordinate its own array over the bodies and the ensemble (:class:`EPCarry`) and the Newton
matrix assembled and eliminated entry by entry (:func:`rigidjax.linalg.solve_components`),
which XLA:CPU runs as a few vectorised loops.

A model held fixed in the rollout (a constant of the compiled program) has its zero entries
(off-diagonal inertia, resistance, translation-rotation coupling, gravity) as structural
zeros: their terms are never traced and the Newton matrix keeps exact zeros that the
elimination skips (no coupling: a 3 x 3 and a 6 x 6 elimination instead of one 9 x 9). A
traced model (a fit) gets the dense path. The elimination takes the translation unknowns
first, pivoting within their block (``m I`` plus damping; ``leading=3``), then the rest
through its Schur complement, so the singularity test reads that elimination's pivots: a
translation block made singular by an unphysical (negative) damping reports ``SINGULAR``.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import newton, so3
from ..info import Status, make_info, rotation_status, step_status
from ..linalg import lu_solve_components, solve_components, solve_small
from ..linalg import singular as linalg_singular
from ..numerics import (
    norm3,
    cross,
    materialize,
    materialize_chunks,
    mv,
    partial_jvp,
    static_zero,
    static_zeros,
    sum_nonzero,
    where_tree,
)
from .equations import _check_state_shape, _default_tol, _wrench_array
from .model import EPModel, EPState

__all__ = ["EPCarry"]


class EPCarry(eqx.Module):
    """:class:`EPState` split into per-coordinate arrays (structure of arrays).

    The form in which :func:`rigidjax.rollout` carries an Euler-parameter rollout of free
    bodies: ``coordinates``, ``velocities``, ``accelerations`` and
    ``algorithmic_accelerations`` are tuples of 7 arrays of shape ``(..., nb)``,
    ``multipliers`` one array ``(..., nb)``; for one body (``nb = 1``) the body axis is
    dropped, so an ensemble's components are flat ``(N,)`` arrays (XLA:CPU vectorises the
    innermost axis; a trailing axis of length 1 would leave every loop scalar). Internal; made
    by :meth:`GeneralizedAlphaEP.packed <rigidjax.euler_parameters.GeneralizedAlphaEP.packed>`'s
    ``pack``.
    """

    time: jax.Array
    coordinates: tuple
    velocities: tuple
    accelerations: tuple
    algorithmic_accelerations: tuple
    multipliers: jax.Array


def _split7(a):
    a = jnp.asarray(a)
    if a.shape[-2] == 1:
        return tuple(a[..., 0, i] for i in range(7))
    return tuple(a[..., i] for i in range(7))


def _pack_ep(state: EPState) -> EPCarry:
    lam = jnp.asarray(state.multipliers)
    return EPCarry(
        time=jnp.asarray(state.time),
        coordinates=_split7(state.coordinates),
        velocities=_split7(state.velocities),
        accelerations=_split7(state.accelerations),
        algorithmic_accelerations=_split7(state.algorithmic_accelerations),
        multipliers=lam[..., 0] if state.coordinates.shape[-2] == 1 else lam,
    )


def _unpack_ep(carry: EPCarry, like: EPState) -> EPState:
    one = like.coordinates.shape[-2] == 1

    def stack(c):
        a = jnp.stack(c, -1)
        return a[..., None, :] if one else a

    return EPState(
        time=carry.time,
        coordinates=stack(carry.coordinates),
        velocities=stack(carry.velocities),
        accelerations=stack(carry.accelerations),
        algorithmic_accelerations=stack(carry.algorithmic_accelerations),
        multipliers=carry.multipliers[..., None] if one else carry.multipliers,
    )


def _packed_ep_step(
    model: EPModel,
    carry: EPCarry,
    inputs,
    dt,
    active,
    *,
    scheme,
    torque_frame,
    rtol,
    atol,
    max_iterations,
    max_rotation,
    stabilized,
):
    """The public step (:class:`~rigidjax.euler_parameters.GeneralizedAlphaEP` with these options)
    on an :class:`EPCarry` of free bodies; ``inputs`` the applied wrench ``(..., nb, 6)`` (force
    WORLD, N; torque N m in ``torque_frame``) or ``None``; members where ``active`` is False
    keep their input state (0 iterations). Returns ``(carry, info)``."""
    dtype = carry.coordinates[0].dtype
    rtol = _default_tol(dtype) if rtol is None else float(rtol)
    atol = _default_tol(dtype) if atol is None else float(atol)
    eps = float(np.finfo(dtype).eps)
    h = jnp.asarray(dt, dtype)
    am, af, beta, gamma = scheme.alpha_m, scheme.alpha_f, scheme.beta, scheme.gamma
    beta_p = beta * (1 - af) / (1 - am)
    gamma_p = gamma * (1 - af) / (1 - am)
    position = model.euler_constraint == "position"
    with_mu = stabilized and position
    nb = model.n_bodies
    n_unknowns = 9 if with_mu else 8

    one = nb == 1  # components carry no body axis (EPCarry)
    b_ = (lambda a: a[0]) if one else (lambda a: a)  # a model array's per-body entries
    bmax = (lambda a: a) if one else (lambda a: jnp.max(a, -1))  # max over the bodies

    body = model.body
    m = b_(body.mass)
    # entries known to vanish (a model held fixed: diagonal inertia, no resistance or no
    # coupling, no gravity) are structural zeros: their terms are never traced, and the Newton
    # matrix keeps the zeros they leave for the elimination to skip
    entries = lambda a: jax.tree_util.tree_map(lambda e: e if static_zero(e) else b_(e), static_zeros(a))  # noqa: E731
    J, Rm, g = entries(body.inertia), entries(body.resistance), entries(body.gravity)
    ref = tuple(b_(model.reference[:, i]) for i in range(7))
    W = _wrench_array(model, inputs, dtype)
    Wc = tuple(b_(W[..., i]) if one else W[..., i] for i in range(6))

    q0, v0, qtt0, a0 = carry.coordinates, carry.velocities, carry.accelerations, carry.algorithmic_accelerations
    lam0 = carry.multipliers
    c_a = (1 - af) / (1 - am)
    c_q, c_v = h * h * beta * c_a, h * gamma * c_a
    base = tuple((af * qtt0[k] - am * a0[k]) / (1 - am) for k in range(7))
    q_pred = tuple(q0[k] + h * v0[k] + h * h * ((0.5 - beta) * a0[k] + beta * base[k]) for k in range(7))
    v_pred = tuple(v0[k] + h * ((1 - gamma) * a0[k] + gamma * base[k]) for k in range(7))
    # one loop, not one small kernel per component (launches dominate these)
    flat = materialize(*base, *q_pred, *v_pred)
    base, q_pred, v_pred = flat[:7], flat[7:14], flat[14:]
    k_mu = 2 * beta_p * h * h  # theta = (1 + k_mu mu) theta_hat: the GGL correction C_p^T mu
    s_pos, s_vel = 1 / (beta_p * h * h), 1 / (gamma_p * h)

    def configuration(z):
        """Euler parameters, their rates and the translational velocity at the iterate ``z``."""
        qtt, mu = z[:7], (z[8] if with_mu else None)
        th_hat = tuple(ref[3 + j] + q_pred[3 + j] + c_q * qtt[3 + j] for j in range(4))
        th = th_hat if mu is None else tuple((1 + k_mu * mu) * t for t in th_hat)
        tht = tuple(v_pred[3 + j] + c_v * qtt[3 + j] for j in range(4))
        vp = tuple(v_pred[i] + c_v * qtt[i] for i in range(3))
        return th_hat, th, tht, vp

    def residual(th, tht, thtt, vp, qttp, lam):
        """The rows of the public step's residual for one body (dynamics, then the scaled constraints)."""
        w = so3.g_body_apply(th, tht)
        w_t = so3.g_body_apply(th, thtt)
        tw = (*vp, *w)
        Rt = tuple(sum_nonzero((Rm[i][j], tw[j]) for j in range(6)) for i in range(6))
        lin = tuple(m * (qttp[i] - g[i]) - Wc[i] + Rt[i] for i in range(3))
        Iw, Iw_t = mv(J, w), mv(J, w_t)
        gyro = cross(w, Iw)
        if torque_frame == "body":
            rot = so3.g_transpose_apply(th, tuple(Iw_t[i] + Rt[3 + i] - Wc[3 + i] + gyro[i] for i in range(3)), 1)
        else:
            rot = so3.g_transpose_apply(th, tuple(Iw_t[i] + Rt[3 + i] + gyro[i] for i in range(3)), 1)
            rot = tuple(r - t for r, t in zip(rot, so3.g_transpose_apply(th, Wc[3:], -1)))
        rot = tuple(rot[j] - 2 * th[j] * lam for j in range(4))
        c_p = (th[0] * th[0] + th[1] * th[1] + th[2] * th[2] + th[3] * th[3] - 1) * s_pos
        c_v_row = 2 * (th[0] * tht[0] + th[1] * tht[1] + th[2] * tht[2] + th[3] * tht[3]) * s_vel
        if stabilized:
            cons = (c_p, c_v_row) if position else (c_v_row,)
        else:
            cons = (c_p,) if position else (c_v_row,)
        return (*lin, *rot, *cons)

    def full(z):
        _, th, tht, vp = configuration(z)
        return residual(th, tht, z[3:7], vp, z[:3], z[7])

    def newton_matrix(z):
        """``F(z)`` and ``dF/dz`` entry by entry: forward derivatives along each unknown,
        through only the quantities it moves (so JAX traces no zero tangents)."""
        th_hat, th, tht, vp = configuration(z)
        args = [list(th), list(tht), list(z[3:7]), list(vp), list(z[:3]), z[7]]
        F = residual(th, tht, z[3:7], vp, z[:3], z[7])
        s = 1 if not with_mu else (1 + k_mu * z[8])

        def column(slots, tangents):
            return partial_jvp(residual, args, slots, tangents, dtype)

        cols = [column([(3, i), (4, i)], [c_v, 1.0]) for i in range(3)]
        cols += [column([(0, j), (1, j), (2, j)], [s * c_q, c_v, 1.0]) for j in range(4)]
        lam_col = (0.0,) * 3 + tuple(-2 * t for t in th) + (0.0,) * (len(F) - 7)
        cols.append(lam_col)
        if with_mu:
            cols.append(column([(0, j) for j in range(4)], [k_mu * t for t in th_hat]))
        # one loop for the whole matrix (XLA would otherwise recompute it inside every consumer)
        # column by column: one column's entries share its tangents; structural zeros stay
        n = n_unknowns
        ent = [cols[c][r] for c in range(n) for r in range(n)]
        live = [k for k, e in enumerate(ent) if not static_zero(e)]
        flat = materialize_chunks(*F, *(ent[k] for k in live), size=n)
        F = flat[:n]
        for k, v in zip(live, flat[n:]):
            ent[k] = v
        A = [[ent[c * n + r] for c in range(n)] for r in range(n)]
        return F, A

    def amax(xs):
        """Max of ``|x|`` over the listed components and the bodies (per system)."""
        return bmax(functools.reduce(jnp.maximum, [jnp.abs(x) for x in xs]))

    act = jnp.asarray(active) if active is not None else jnp.bool_(True)

    def update(f, z):
        """A Newton update and a simplified-Newton update with the same factors (the public
        step's update, per component)."""
        r, A = newton_matrix(z)
        # translation first, pivoting within its block (m I + c_v R_vv: well conditioned)
        d, piv, lu = solve_components(A, list(r), materialize_b=True, factors=True, leading=3)
        d = materialize(*d)  # one loop for the back substitution (else one per consumer)
        z1 = tuple(zi - di for zi, di in zip(z, d))
        r = materialize(*full(z1))
        d = materialize(*lu_solve_components(lu, list(r)))
        z1 = tuple(zi - di for zi, di in zip(z1, d))
        pivots = jnp.stack(piv, -1)  # (..., [nb,] n): the system's pivots, as the public step's one LU
        sing = linalg_singular(pivots if one else pivots.reshape(*pivots.shape[:-2], -1))
        nonfinite = bmax(~jnp.all(jnp.isfinite(jnp.stack(z1, -1)), -1))
        small_a = amax(d[:7]) <= atol + rtol * amax(z1[:7])
        small_l = amax(d[7:8]) <= atol + rtol * amax(z1[7:8])
        if with_mu:
            # mu's increment: the public step's test (the accelerations' scale, or a position
            # correction below the positions' resolution)
            d_mu = amax(d[8:9])
            th_hat, th, _, _ = configuration(z1)
            xs = [ref[i] + q_pred[i] + c_q * z1[i] for i in range(3)] + list(th)
            x_scale = jnp.maximum(1.0, amax(xs))
            small_l &= (d_mu <= atol + rtol * amax(z1[:7])) | (beta_p * h * h * d_mu <= 8 * eps * x_scale)
        return newton.Update(z1, small_a & small_l, sing, nonfinite, amax(r))

    def tangent_solve(g, y):
        # the Jacobian is block diagonal over the bodies: one column per unknown for all at once
        ones = jnp.ones_like(y[0])
        unit = [tuple(ones if k == c else jnp.zeros_like(ones) for k in range(n_unknowns)) for c in range(n_unknowns)]
        cols = [g(u) for u in unit]
        # array form here: differentiation only, and its transpose compiles faster than the
        # per-component form's
        A = jnp.stack([jnp.stack(col, -1) for col in cols], -1)  # (..., [nb,] n, n)
        x = solve_small(A, jnp.stack(y, -1))
        return tuple(x[..., k] for k in range(n_unknowns))

    z0 = (*qtt0, lam0) + ((jnp.zeros_like(lam0),) if with_mu else ())
    batch = jnp.shape(z0[0]) if one else jnp.shape(z0[0])[:-1]  # the systems (members)
    z, (iterations, status, res) = newton.solve(
        full, z0, update, tangent_solve, max_iterations=max_iterations, stopped=~jnp.broadcast_to(act, batch)
    )

    qtt1 = z[:7]
    a1 = tuple(c_a * qtt1[k] + base[k] for k in range(7))
    q1 = [q_pred[k] + c_q * qtt1[k] for k in range(7)]
    if with_mu:
        for j in range(4):
            q1[3 + j] = q1[3 + j] + k_mu * z[8] * (ref[3 + j] + q1[3 + j])
    v1 = tuple(v_pred[k] + c_v * qtt1[k] for k in range(7))

    def omega_max(q, v):
        w = so3.g_body_apply(tuple(ref[3 + j] + q[3 + j] for j in range(4)), v[3:])
        return bmax(norm3(w))

    new = EPCarry(carry.time + h, tuple(q1), v1, tuple(qtt1), a1, z[7])
    dt_ok = (h > 0) & jnp.isfinite(h)  # a traced dt out of range: nothing advances
    if one:
        # elementwise over the members: the finiteness test, the selection of every component
        # and the rotation in ONE loop (else one small kernel each)
        finite = functools.reduce(jnp.logical_and, [jnp.isfinite(c) for c in (*z, *q1, *v1)])
        finite = materialize(finite.astype(dtype))[0] > 0.5
        ok = (status == Status.SUCCESS) & finite & act & dt_ok
        leaves, treedef = jax.tree_util.tree_flatten(new)
        sel = [jnp.where(ok, a, b) for a, b in zip(leaves, jax.tree_util.tree_leaves(carry))]
        new = jax.tree_util.tree_unflatten(treedef, materialize_chunks(*sel, size=8))
        rotation = jnp.maximum(omega_max(q0, v0), omega_max(new.coordinates, new.velocities)) * h
    else:
        every = jnp.stack([*z, *q1, *v1], -1)
        finite = ~bmax(~jnp.all(jnp.isfinite(every), -1))
    status = step_status(status, finite=finite, valid=dt_ok)
    ok = (status == Status.SUCCESS) & act
    if not one:
        new = where_tree(ok, new, carry)
        rotation = jnp.maximum(omega_max(q0, v0), omega_max(new.coordinates, new.velocities)) * h
    status = rotation_status(status, jnp.where(act, rotation, 0), max_rotation)
    return new, make_info(status, iterations, res, rotation)


def _check_packed(model, state, inputs, dt):
    """The public step's shape checks (``ValueError``), on the public state."""
    _check_state_shape(model, state)
    _wrench_array(model, inputs, state.coordinates.dtype)
