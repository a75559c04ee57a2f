r"""Discrete adjoint of midpoint rollouts: reverse-mode gradients in a few fused loops per step.

Used by :func:`rigidjax.rollout` with ``adjoint="discrete"`` for :func:`rigidjax.midpoint_step`.
It is the exact gradient of the discrete trajectory (not of an ODE adjoint): the reverse
sweep runs the transpose of each step's Jacobian, written out by hand in the
structure-of-arrays form of :mod:`rigidjax.midpoint`, from the stored states only (no other
residuals). Autodiff through the scan transposes ~100 small XLA kernels per step, which on
CPU costs more than the arithmetic; this sweep is a handful of multi-output loops.

The step (seed 000; ``V = (v, omega)``, ``K = hat(J omega) - hat(omega) J``):

.. math::

    A\,\Delta V = F - (0, \omega\times J\omega) - R V,\quad A = M/\Delta t + R - K/2,\quad
    V' = V + \Delta V,\quad x' = x + \Delta t\, v',\quad
    q' = \frac{q\otimes e}{|q\otimes e|},\ e = \exp(\Delta t\,\omega_a)

with ``omega_a = omega'`` (``attitude="new"``) or ``(omega + omega')/2``. Given the cotangent
``(x̄', q̄', v̄', ω̄')`` of the new state, the sweep forms ``r̄`` (normalisation), ``q̄, ē``
(Hamilton product), ``φ̄`` (exponential map, with its Taylor branch near 0), then
``λ = A^{-T} V̄'`` by the transposed block elimination, and from ``λ``: ``R̄ = -λ V'^T``,
``J̄``, ``m̄``, ``ḡ = m λ_v``, the wrench cotangent ``λ``, ``Δt̄`` and ``V̄ = V̄' - R^T λ`` plus
the gyroscopic and ``K`` terms (see the comments). Rejected or frozen steps pass the
cotangent through unchanged. Checked against central finite differences and against
autodiff through the same rollout in ``tests/test_adjoint.py``.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from .. import so3

from ..info import FAILURES
from ..numerics import cross, full_precision, inv3, materialize, materialize_chunks, mm, mv

from .core import MidpointCarry
from .equations import _model_parts

__all__ = ["step_vjp", "model_constants", "unflatten_params", "carry_to_array", "carry_from_array", "ACC_SIZES"]


def _dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def _mtv(A, x):
    """``A^T x`` in tuple form."""
    return tuple(A[0][j] * x[0] + A[1][j] * x[1] + A[2][j] * x[2] for j in range(3))


def model_constants(body, dt):
    """Per-body quantities of the step that do not depend on the state (hoisted out of the sweep)."""
    m, J, R, g = _model_parts(body)
    m_dt = m / dt
    A11 = tuple(tuple((m_dt if i == j else 0) + R[i][j] for j in range(3)) for i in range(3))
    A12 = tuple(R[i][3:] for i in range(3))
    A21 = tuple(R[3 + i][:3] for i in range(3))
    inv11 = inv3(A11)
    P = mm(inv11, A12)
    return m, J, R, g, inv11, P, A21, mm(A21, P)


def step_vjp(consts, c0: MidpointCarry, c1: MidpointCarry, ok, dt, lam1, ct1: MidpointCarry, rot_bar, acc, attitude):
    """Transpose of one midpoint step at ``c0 -> c1``.

    Args:
        consts: :func:`model_constants` of the body at this ``dt``.
        c0, c1: the carry before and after the step (``c1`` as stored by the rollout).
        ok: bool, batch shape: the step was accepted (else the state was passed through).
        dt: the step, s.
        lam1, ct1: cotangents of ``c1`` from the later steps (``(14, …)`` array, see
            :func:`carry_to_array`) and from the loss (a carry); added here. ``rot_bar``:
            cotangent of ``info.rotation``.
        acc: running sums the step adds to, :data:`ACC_SIZES` arrays ``(k, …)``:
            ``m̄ (1)``, ``J̄ (9)``, ``R̄ (36)``, ``ḡ (3)``, ``dt̄ (1)``.

    Returns:
        ``(ct0 (14, …), acc, wrench_bar (6 arrays), dt_bar)``, every component of the batch
        shape (not yet summed over members sharing a body); ``dt_bar`` this step's part.
    """
    # lam1 and the sums are stacked arrays so the sweep's loop carries a few buffers, not 64
    # (XLA copies each carried buffer a multi-output loop rewrites); the sums in groups, so
    # XLA drops the loop work of a group the caller does not use (e.g. R̄ when only the
    # inertia is differentiated)
    ct1 = jax.tree_util.tree_map(lambda a, b: a + b, carry_from_array(lam1), ct1)
    m, J, R, g, inv11, P, A21, A21P = consts
    dtype = c0.angular_velocity[0].dtype
    q, v, w = c0.orientation, c0.velocity, c0.angular_velocity
    v1, w1 = c1.velocity, c1.angular_velocity
    xb1, qb1, vb1, wb1 = ct1.position, ct1.orientation, ct1.velocity, ct1.angular_velocity
    dV = tuple(a - b for a, b in zip(v1 + w1, v + w))
    inv_dt = 1 / dt

    # --- stage 1: the step's nonlinear intermediates (Schur inverse, exp, product, norm) ---
    Jw = mv(J, w)
    hIw = ((0, -Jw[2], Jw[1]), (Jw[2], 0, -Jw[0]), (-Jw[1], Jw[0], 0))
    hwJ = (
        tuple(w[1] * J[2][j] - w[2] * J[1][j] for j in range(3)),
        tuple(w[2] * J[0][j] - w[0] * J[2][j] for j in range(3)),
        tuple(w[0] * J[1][j] - w[1] * J[0][j] for j in range(3)),
    )
    S = tuple(
        tuple(J[i][j] * inv_dt + R[3 + i][3 + j] - 0.5 * (hIw[i][j] - hwJ[i][j]) - A21P[i][j] for j in range(3))
        for i in range(3)
    )
    Sinv = inv3(S)
    w_att = w1 if attitude == "new" else tuple(0.5 * (a + b) for a, b in zip(w, w1))
    phi = tuple(dt * c for c in w_att)
    t2 = _dot(phi, phi)
    C, Sf, dC, dS = so3.exp_coefficients(t2)  # dC, dS: derivatives in t2
    e0, ev = C, tuple(Sf * p for p in phi)
    q0, qv = q[0], q[1:]
    r0 = q0 * e0 - _dot(qv, ev)
    rv = tuple(q0 * ev[i] + e0 * qv[i] + c for i, c in enumerate(cross(qv, ev)))
    # norms are materialised before anything divides by them: a fused x / sqrt(.) becomes
    # XLA's rsqrt, which has no float64 vector form and would leave the loop scalar. Two
    # loops (the block inverse; the exponential map and |q ⊗ e|): one loop with all 20
    # outputs compiles to scalar code
    *Sinv, n0, nw1 = materialize(*sum(Sinv, ()), jnp.sqrt(_dot(w, w)), jnp.sqrt(_dot(w1, w1)))
    C, Sf, dC, dS, n = materialize(C, Sf, dC, dS, jnp.sqrt(r0 * r0 + _dot(rv, rv)))
    Sinv = tuple(tuple(Sinv[3 * i : 3 * i + 3]) for i in range(3))

    # --- stage 2: the transpose, output by output ---
    e0, ev = C, tuple(Sf * p for p in phi)
    q0, qv = q[0], q[1:]
    q1 = c1.orientation  # = r / n as stored by the forward step (where accepted)
    # q' = r / |r|
    proj = _dot(q1, qb1)
    rb = materialize(*((qb1[i] - q1[i] * proj) / n for i in range(4)))
    rb0, rbv = rb[0], rb[1:]
    # r = q ⊗ e: q̄ = R(e)^T r̄, ē = L(q)^T r̄
    qbar_v = tuple(-rb0 * ev[i] + e0 * rbv[i] + c for i, c in enumerate(cross(ev, rbv)))
    qbar = (rb0 * e0 + _dot(rbv, ev),) + qbar_v
    eb0 = rb0 * q0 + _dot(qv, rbv)
    ebv = tuple(-rb0 * qv[i] + q0 * rbv[i] + c for i, c in enumerate(cross(rbv, qv)))
    # e = (C(t2), S(t2) phi), t2 = |phi|^2
    k = 2 * dC * eb0 + 2 * dS * _dot(phi, ebv)
    phib = tuple(k * phi[i] + Sf * ebv[i] for i in range(3))
    wab = tuple(dt * c for c in phib)
    dt_bar = _dot(phib, w_att)
    wb = [0, 0, 0]
    wb1 = list(wb1)
    for i in range(3):
        if attitude == "new":
            wb1[i] = wb1[i] + wab[i]
        else:
            wb1[i] = wb1[i] + 0.5 * wab[i]
            wb[i] = wb[i] + 0.5 * wab[i]
    # info.rotation = max(|omega|, |omega'|) dt
    use1 = nw1 >= n0
    s0 = rot_bar * dt / jnp.where(n0 > 0, n0, 1)
    s1 = rot_bar * dt / jnp.where(nw1 > 0, nw1, 1)
    for i in range(3):
        wb1[i] = wb1[i] + jnp.where(use1, s1 * w1[i], 0)
        wb[i] = wb[i] + jnp.where(use1, 0, s0 * w[i])
    dt_bar = dt_bar + rot_bar * jnp.maximum(n0, nw1)
    # x' = x + dt v'
    vb1 = tuple(vb1[i] + dt * xb1[i] for i in range(3))
    dt_bar = dt_bar + _dot(xb1, v1) + ct1.time
    # dV = A^-1 rhs: lambda = A^-T (v̄', ω̄') by the transposed block elimination
    # materialised: every later quantity reads these (XLA would otherwise recompute them per use)
    out = materialize(*vb1, *wb1, *wb, *qbar, dt_bar)
    y_v, y_w, wb, qbar, dt_bar = tuple(out[:3]), tuple(out[3:6]), list(out[6:9]), tuple(out[9:13]), out[13]
    wb1 = y_w
    lam_w = _mtv(Sinv, tuple(y_w[i] - c for i, c in enumerate(_mtv(P, y_v))))
    lam_v = _mtv(inv11, tuple(y_v[i] - c for i, c in enumerate(_mtv(A21, lam_w))))
    lam = materialize(*lam_v, *lam_w)
    lam_v, lam_w = lam[:3], lam[3:]
    V1 = v1 + w1
    R_bar = tuple(tuple(-lam[i] * V1[j] for j in range(6)) for i in range(6))
    dVv, dVw = dV[:3], dV[3:]
    JdVw = mv(J, dVw)
    m_bar = -_dot(lam_v, dVv) * inv_dt + _dot(g, lam_v)
    dt_bar = dt_bar + (m * _dot(lam_v, dVv) + _dot(lam_w, JdVw)) * inv_dt * inv_dt
    g_bar = tuple(m * c for c in lam_v)
    # K and the gyroscopic term: a = z x lam_w (K, z = dV_w/2), b = w x lam_w (w x J w)
    z = tuple(0.5 * c for c in dVw)
    a = cross(z, lam_w)
    b = cross(w, lam_w)
    ab = tuple(a[i] + b[i] for i in range(3))
    wxl = cross(w, lam_w)
    J_bar = tuple(tuple(ab[i] * w[j] + wxl[i] * z[j] - lam_w[i] * dVw[j] * inv_dt for j in range(3)) for i in range(3))
    JzW = mv(J, tuple(z[i] + w[i] for i in range(3)))
    gw = cross(lam_w, JzW)
    JTab = _mtv(J, ab)
    RTl = tuple(sum(R[i][j] * lam[i] for i in range(6)) for j in range(6))
    vb = tuple(vb1[j] - RTl[j] for j in range(3))
    wb = tuple(wb[j] + wb1[j] - RTl[3 + j] + JTab[j] + gw[j] for j in range(3))
    # rejected / frozen steps: the state was passed through (rotation = |omega| dt)
    pas_w = tuple(ct1.angular_velocity[i] + s0 * w[i] for i in range(3))

    def pick(new, old):
        return tuple(jnp.where(ok, a_, b_) for a_, b_ in zip(new, old))

    zero = jnp.zeros_like(ok, dtype)
    ct0 = (ct1.time,) + pick(xb1, ct1.position) + pick(qbar, ct1.orientation) + pick(vb, ct1.velocity) + pick(wb, pas_w)
    params = ((m_bar,), sum(J_bar, ()), sum(R_bar, ()), g_bar)
    dt_bar = jnp.where(ok, dt_bar, rot_bar * n0)
    new_acc = tuple(
        tuple(a_[i] + jnp.where(ok, p_[i], zero) for i in range(len(p_))) for a_, p_ in zip(acc[:4], params)
    ) + ((acc[4][0] + dt_bar,),)
    wrench_bar = tuple(jnp.where(ok, c, zero) for c in lam)
    # loops of <= 8 outputs, each within one group: wide loops (here up to 70 outputs
    # reading ~60 arrays) compile to scalar code
    ct0 = materialize(*ct0[:7]) + materialize(*ct0[7:])
    new_acc = tuple(materialize_chunks(*g_, size=8) for g_ in new_acc)
    out = materialize(*wrench_bar, dt_bar)
    return jnp.stack(ct0), tuple(jnp.stack(g_) for g_ in new_acc), out[:6], out[6]


#: Sizes of the accumulator groups of :func:`step_vjp`: ``m̄, J̄, R̄, ḡ, dt̄``.
ACC_SIZES = (1, 9, 36, 3, 1)


def carry_to_array(c: MidpointCarry) -> jax.Array:
    """``(14, …)``: time, position, orientation, velocity, angular_velocity components."""
    return jnp.stack(jnp.broadcast_arrays(*jax.tree_util.tree_leaves(c)))


def carry_from_array(a) -> MidpointCarry:
    """Inverse of :func:`carry_to_array`: a ``(14, …)`` array (any dtype) back to a :class:`MidpointCarry`."""
    return MidpointCarry(a[0], tuple(a[1:4]), tuple(a[4:8]), tuple(a[8:11]), tuple(a[11:14]))


def unflatten_params(acc):
    """``(m̄, J̄ (…, 3, 3), R̄ (…, 6, 6), ḡ (…, 3))`` arrays from the accumulator groups of :func:`step_vjp`."""
    m, J, R, g = acc[:4]
    return (
        m[0],
        jnp.moveaxis(J.reshape((3, 3) + J.shape[1:]), (0, 1), (-2, -1)),
        jnp.moveaxis(R.reshape((6, 6) + R.shape[1:]), (0, 1), (-2, -1)),
        jnp.moveaxis(g, 0, -1),
    )


def _unbroadcast(x, shape):
    """Sum ``x`` down to ``shape`` (the transpose of broadcasting)."""
    x = jnp.asarray(x)
    lead = x.ndim - len(shape)
    x = jnp.sum(x, axis=tuple(range(lead))) if lead > 0 else x
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def discrete_adjoint_scan(body, model, carry0, dt_arr, xs_load, n, *, attitude):
    """``lax.scan(body, carry0, (dt, loads), length=n)`` of the packed midpoint step, with its
    reverse-mode derivative by the reverse sweep of :func:`step_vjp` (:class:`rigidjax.stepper.PackedStep`'s
    ``discrete_adjoint``). ``body`` is the rollout's scan body on ``(carry, fail code, clock
    compensation)``; returns the stacked ``(states, info)``."""

    per_step_dt = dt_arr.ndim == 1

    def forward(model, carry0, dt_arr, xs_load):
        b = lambda c, x: body(c, x, model=model, dt_arr=dt_arr)  # noqa: E731
        _, (states, info) = jax.lax.scan(b, carry0, (dt_arr if per_step_dt else None, xs_load), length=n)
        return states, info

    @jax.custom_vjp
    def run(model, carry0, dt_arr, xs_load):
        return forward(model, carry0, dt_arr, xs_load)

    @full_precision  # traced when a caller differentiates an already traced program
    def run_fwd(model, carry0, dt_arr, xs_load):
        out = forward(model, carry0, dt_arr, xs_load)
        return out, (model, carry0, dt_arr, xs_load, out)

    @full_precision  # traced when a caller differentiates an already traced program
    def run_bwd(res, ct):
        model, (state0, _, _), dt_arr, xs_load, (states, info) = res
        ct_states, ct_info = ct
        dtype = state0.angular_velocity[0].dtype
        ok = ~jnp.isin(info.status, jnp.asarray([int(c) for c in FAILURES], jnp.int32))
        batch = jnp.shape(state0.time)
        consts = None if per_step_dt else model_constants(model, jnp.asarray(dt_arr, dtype))

        def back(carry, xs):
            lam, acc = carry
            k, c1, ok_k, ct1, rot_bar, dt_k, load_k = xs
            # the state before step k read in place (a shifted copy of the trajectory would be
            # another n_steps x 14 x batch buffer, page-faulted afresh on every call)
            c0 = jax.tree_util.tree_map(
                lambda a0, a: jnp.where(
                    k == 0, a0, jax.lax.dynamic_index_in_dim(a, jnp.maximum(k - 1, 0), keepdims=False)
                ),
                state0,
                states,
            )
            dt_k = jnp.asarray(dt_arr if dt_k is None else dt_k, dtype)
            cs = consts if consts is not None else model_constants(model, dt_k)
            lam, acc, wrench_bar, dt_bar = step_vjp(cs, c0, c1, ok_k, dt_k, lam, ct1, rot_bar, acc, attitude)
            return (lam, acc), (wrench_bar, dt_bar)

        lam0 = jnp.zeros((14, *batch), dtype)
        acc0 = tuple(jnp.zeros((k, *batch), dtype) for k in ACC_SIZES)
        xs = (jnp.arange(n), states, ok, ct_states, ct_info.rotation, dt_arr if per_step_dt else None, xs_load)
        (lam, acc), (wrench_bar, dt_bar) = jax.lax.scan(back, (lam0, acc0), xs, length=n, reverse=True)
        m_bar, J_bar, R_bar, g_bar = unflatten_params(acc)
        model_bar = eqx.tree_at(
            lambda b: (b.mass, b.inertia, b.resistance, b.gravity),
            model,
            (
                _unbroadcast(m_bar, jnp.shape(model.mass)),
                _unbroadcast(J_bar, jnp.shape(model.inertia)),
                _unbroadcast(R_bar, jnp.shape(model.resistance)),
                _unbroadcast(g_bar, jnp.shape(model.gravity)),
            ),
        )
        if per_step_dt:
            dt_bar_out = jnp.sum(dt_bar.reshape(n, -1), -1).astype(dt_arr.dtype)
        else:
            dt_bar_out = jnp.sum(acc[4]).astype(dt_arr.dtype)
        load_bar = None
        if xs_load is not None:
            wb = jnp.stack(wrench_bar, -1)  # (n, *batch, 6); each step's load broadcast to (*batch, 6)
            load_bar = jax.vmap(lambda w: _unbroadcast(w, jnp.shape(xs_load)[1:]))(wb).astype(xs_load.dtype)
        lam = carry_from_array(lam)
        carry0_bar = (jax.tree_util.tree_map(lambda a, s0: _unbroadcast(a, jnp.shape(s0)), lam, state0), None, None)
        return model_bar, carry0_bar, dt_bar_out, load_bar

    run.defvjp(run_fwd, run_bwd)
    return run(model, carry0, dt_arr, xs_load)
