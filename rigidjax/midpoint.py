r"""Linearly implicit midpoint step of the Newton-Euler equations (seed 000).

Source: ``../shared/seeds/000_767e6f3038d23db2.txt`` (node ``RigidInertialMidpointNode``,
algorithm MIME-NODE-112); references Peraire & Widnall (2009), Solà (2017).

The twist ``V = (v, omega)`` (``v`` world, ``omega`` body) advances by one Rosenbrock step
with the exact Jacobian of the gyroscopic term and the resistance implicit:

.. math::

    V' = V + \Big(\frac{M}{\Delta t} + R - \tfrac12 K\Big)^{-1}
         \Big(F - \begin{bmatrix}0\\ \omega \times I\omega\end{bmatrix} - R V\Big),
    \qquad K = \frac{\partial(-\omega\times I\omega)}{\partial \omega}
             = \widehat{I\omega} - \hat\omega I ,

``M = blockdiag(m I3, I)``. Then ``x' = x + dt v'`` and
``q' = normalize(q ⊗ exp(dt omega'))`` (the seed's update, first order in attitude) or,
with ``attitude="midpoint"``, ``q' = normalize(q ⊗ exp(dt (omega + omega')/2))`` (second
order). Torque-free, kinetic energy and ``|L|`` are kept to second order in ``dt``.

The step matrix is not symmetric for unequal moments: it is solved as a general system.
The seed warns that nothing resolves the gyroscopic term once ``|omega| dt`` exceeds about
0.5; here every step reports ``|omega| dt`` in ``info.rotation`` and flags
``Status.ROTATION_LIMIT`` above ``max_rotation``; checked modes raise on it.

Implementation (speed, not maths): the 6x6 system is solved in closed form by block
elimination (translation block ``m/dt + R_vv``, then the rotation block's Schur complement
``S = I/dt + R_ww - K/2 - R_wv (m/dt + R_vv)^-1 R_vw``), each 3x3 inverse by scaled cofactors,
and every quantity is carried as separate per-component arrays of the batch shape
(structure of arrays), so XLA fuses a step into a few elementwise loops that vectorise over
the ensemble. On CPU this is ~30x faster than a batched LAPACK ``solve`` on ``(N, 6, 6)``
(``benchmarks/README.md``); results agree with ``jnp.linalg.solve(step_matrix(...))`` to
round-off (``tests/test_midpoint_layout.py``). Needs ``m/dt + R_vv`` invertible, true for any
dissipative resistance (symmetric part of ``R`` positive semi-definite).
"""

from __future__ import annotations

import functools
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxlie.utils import get_epsilon

from . import so3
from ._util import materialize as _materialize
from ._util import (
    static_zero,
    sum_nonzero,
    unwrap_partial,
    zadd,
    zero_pattern,
    zmul,
    zneg,
)
from .body import RigidBody, RigidBodyState, check_step_inputs
from .info import Status, StepInfo, make_info

__all__ = [
    "angular_velocity_step", "gyroscopic_term", "gyroscopic_jacobian", "midpoint_step", "step_matrix", "step_solve",
]


def _apply(A, x):
    return jnp.einsum("...ij,...j->...i", A, x)


def gyroscopic_term(inertia: jax.Array, omega: jax.Array) -> jax.Array:
    """``omega × (I omega)`` (…, 3), N m; ``inertia`` (…, 3, 3) body frame, ``omega`` (…, 3) body, rad/s."""
    return jnp.cross(omega, _apply(inertia, omega))


def gyroscopic_jacobian(inertia: jax.Array, omega: jax.Array) -> jax.Array:
    r"""``K = ∂(-omega × I omega)/∂omega = hat(I omega) - hat(omega) I``, (…, 3, 3).

    Closed form for any symmetric inertia tensor (not only diagonal), body frame.
    ``inertia`` (…, 3, 3) kg m^2 or principal moments (…, 3); ``omega`` (…, 3) rad/s.
    """
    inertia = jnp.asarray(inertia)
    if inertia.shape[-2:] != (3, 3):
        inertia = inertia[..., :, None] * jnp.eye(3, dtype=inertia.dtype)
    return so3.hat(_apply(inertia, omega)) - so3.hat(omega) @ inertia


def step_matrix(body: RigidBody, omega: jax.Array, dt) -> jax.Array:
    """The step's matrix ``M/dt + R - K/2`` (…, 6, 6) (``K`` padded to 6x6 in the rotation block)."""
    K = gyroscopic_jacobian(body.inertia, omega)
    Kfull = jnp.zeros((*K.shape[:-2], 6, 6), K.dtype).at[..., 3:, 3:].set(K)
    return body.mass_matrix / dt + body.resistance - 0.5 * Kfull


# ---------------------------------------------------------------------------------------
# Closed-form small algebra on per-component arrays ("structure of arrays"): a 3-vector is a
# tuple of 3 arrays of the batch shape, a 3x3 matrix a tuple of 3 such row tuples. Every
# operation is elementwise, so XLA fuses and vectorises it over the batch; no LAPACK call.


def _comps(a, n):
    a = jnp.asarray(a)
    return tuple(a[..., i] for i in range(n))


def _block(A, rows, cols):
    A = jnp.asarray(A)
    return tuple(tuple(A[..., i, j] for j in cols) for i in rows)


# Entries may be structural zeros (``0.0``, :func:`rigidjax._util.static_zero`: a model held
# fixed with diagonal inertia, no resistance, no gravity); the terms they multiply are not traced.


def _mv(A, x):
    return tuple(sum_nonzero(zip(r, x)) for r in A)


def _mm(A, B):
    return tuple(tuple(sum_nonzero((r[k], B[k][j]) for k in range(3)) for j in range(3)) for r in A)


def _cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def _inv3(A):
    """Inverse of a 3x3 (tuple form) by cofactors of ``A/s``, ``s`` the mean |diagonal|.

    The scaling keeps ``det`` in range in float32 for any units (e.g. ``I/dt ~ 1e-17`` for a
    milligram body); a singular ``A`` gives inf/NaN, caught by the step's finiteness check.
    """
    if all(static_zero(A[i][j]) for i in range(3) for j in range(3) if i != j):
        return tuple(tuple(1 / A[i][i] if i == j else 0.0 for j in range(3)) for i in range(3))
    s = (jnp.abs(A[0][0]) + jnp.abs(A[1][1]) + jnp.abs(A[2][2])) / 3
    r = 1 / s
    zero = jnp.zeros_like(s)
    (a, b, c), (d, e, f), (g, h, i) = ((zero if static_zero(x) else x * r for x in row) for row in A)
    c00, c01, c02 = e * i - f * h, c * h - b * i, b * f - c * e
    c10, c11, c12 = f * g - d * i, a * i - c * g, c * d - a * f
    c20, c21, c22 = d * h - e * g, b * g - a * h, a * e - b * d
    k = r / (a * c00 + b * c10 + c * c20)
    return ((c00 * k, c01 * k, c02 * k), (c10 * k, c11 * k, c12 * k), (c20 * k, c21 * k, c22 * k))


def _zero_pattern(body: RigidBody):
    """The entries of inertia, resistance and gravity known to be 0 (a concrete body), for
    :func:`_model_parts`; ``None`` for a traced body."""
    return zero_pattern((body.inertia, 2), (body.resistance, 2), (body.gravity, 1))


def _model_parts(body: RigidBody, zeros=None):
    """``(mass, inertia 3x3, resistance 6x6, gravity 3)`` in tuple form, each a contiguous array.

    Materialised once (XLA hoists it out of a rollout's scan), so the step reads contiguous
    per-component arrays instead of strided ``(N, 6, 6)`` slices; this lets XLA vectorise.
    ``zeros`` (from :func:`_zero_pattern`): entries flagged there are the structural zero
    ``0.0`` instead.
    """
    J = sum(_block(body.inertia, range(3), range(3)), ())
    R = sum(_block(body.resistance, range(6), range(6)), ())
    g = _comps(body.gravity, 3)
    flat = [jnp.asarray(body.mass), *J, *R, *g]
    if zeros is not None:
        flags = (False, *zeros[0], *zeros[1], *zeros[2])
        flat = [0.0 if z else a for a, z in zip(flat, flags)]
    live = [k for k, a in enumerate(flat) if not static_zero(a)]
    for k, a in zip(live, _materialize(*(flat[k] for k in live))):
        flat[k] = a
    m, Jf, Rf, gf = flat[0], flat[1:10], flat[10:46], tuple(flat[46:49])
    return m, tuple(tuple(Jf[3 * i : 3 * i + 3]) for i in range(3)), tuple(tuple(Rf[6 * i : 6 * i + 6]) for i in range(6)), gf


def _solve_blocks(mass, J, Rt, omega, rhs, dt, base=None):
    """Solve ``(M/dt + R - K/2) dV = rhs`` by block elimination; tuple form in and out.
    With ``base`` (6 components) returns ``base + dV`` instead, in the same loop (the new
    twist: a separate sum has several consumers and would be a kernel of its own)."""
    Iw = _mv(J, omega)
    # K = hat(I w) - hat(w) I
    hIw = ((0.0, -Iw[2], Iw[1]), (Iw[2], 0.0, -Iw[0]), (-Iw[1], Iw[0], 0.0))
    w0, w1, w2 = omega
    hwJ = (  # hat(omega) @ I, written without the zero products
        tuple(zadd(zmul(w1, J[2][j]), zneg(zmul(w2, J[1][j]))) for j in range(3)),
        tuple(zadd(zmul(w2, J[0][j]), zneg(zmul(w0, J[2][j]))) for j in range(3)),
        tuple(zadd(zmul(w0, J[1][j]), zneg(zmul(w1, J[0][j]))) for j in range(3)),
    )
    inv_dt = 1 / dt
    m_dt = mass * inv_dt
    # translation block and coupling: independent of omega (XLA hoists them out of a scan)
    A11 = tuple(tuple(zadd(m_dt if i == j else 0.0, Rt[i][j]) for j in range(3)) for i in range(3))
    A12 = tuple(Rt[i][3:] for i in range(3))
    A21 = tuple(Rt[3 + i][:3] for i in range(3))
    inv11 = _inv3(A11)
    P = _mm(inv11, A12)
    A21P = _mm(A21, P)
    b1, b2 = rhs[:3], rhs[3:]
    y1 = _mv(inv11, b1)
    A21y = _mv(A21, y1)
    S = tuple(
        tuple(
            zadd(zmul(J[i][j], inv_dt), Rt[3 + i][3 + j], zneg(zmul(0.5, zadd(hIw[i][j], zneg(hwJ[i][j])))), zneg(A21P[i][j]))
            for j in range(3)
        )
        for i in range(3)
    )
    r2 = tuple(zadd(b2[i], zneg(A21y[i])) for i in range(3))
    x2 = _mv(_inv3(S), r2)
    Px2 = _mv(P, x2)
    x1 = tuple(zadd(y1[i], zneg(Px2[i])) for i in range(3))
    out = [*x1, *x2]
    if base is not None:
        out = [zadd(b, o) for b, o in zip(base, out)]
    live = [k for k, a in enumerate(out) if not static_zero(a)]
    for k, a in zip(live, _materialize(*(out[k] for k in live))):
        out[k] = a
    return tuple(out)


def _twist_rhs(parts, velocity, omega, wrench, dtype):
    """``F - [0; omega x I omega] - R V`` in tuple form (6 arrays)."""
    mass, J, R, g = parts
    gyro = _cross(omega, _mv(J, omega))
    F = [zmul(mass, g[0]), zmul(mass, g[1]), zmul(mass, g[2]), 0.0, 0.0, 0.0]
    if wrench is not None:
        wr = _comps(jnp.asarray(wrench, dtype), 6)
        F = [zadd(F[i], wr[i]) for i in range(6)]
    V = tuple(velocity) + tuple(omega)
    RV = [sum_nonzero(zip(R[i], V)) for i in range(6)]
    return tuple(zadd(F[i], zneg(gyro[i - 3] if i >= 3 else 0.0), zneg(RV[i])) for i in range(6))


def step_solve(body: RigidBody, omega: jax.Array, rhs: jax.Array, dt) -> jax.Array:
    """Twist increment ``dV = (M/dt + R - K(omega)/2)^-1 rhs`` (…, 6) in closed form.

    The linear solve of :func:`midpoint_step`, equal to
    ``jnp.linalg.solve(step_matrix(body, omega, dt), rhs)`` up to round-off but without a
    LAPACK call (block elimination with cofactor 3x3 inverses, elementwise over the batch).
    ``omega`` (…, 3) body rad/s; ``rhs`` (…, 6) wrench (world force N, body torque N m);
    ``dt`` s, scalar or batch shape.
    """
    rhs = jnp.asarray(rhs)
    dt = jnp.asarray(dt, rhs.dtype)
    mass, J, R, _ = _model_parts(body)
    dV = _solve_blocks(mass, J, R, _comps(omega, 3), _comps(rhs, 6), dt)
    dV = tuple(jnp.zeros_like(rhs[..., 0]) if static_zero(c) else c for c in dV)
    shape = jnp.broadcast_shapes(*(jnp.shape(c) for c in dV))
    return jnp.stack([jnp.broadcast_to(c, shape) for c in dV], -1)


def angular_velocity_step(inertia, omega, dt, *, damping=None, torque=None) -> jax.Array:
    r"""The new body angular velocity of :func:`midpoint_step` when rotation does not couple to translation.

    .. math:: \omega' = \omega + \Big(\frac{I}{\Delta t} + D - \tfrac12 K(\omega)\Big)^{-1}
              \big(\tau - \omega\times I\omega - D\,\omega\big), \qquad K = \widehat{I\omega} - \hat\omega I ,

    the rotation block of the seed-000 step for a resistance without translation-rotation
    coupling (``R = blockdiag(R_vv, D)``): the translation block then drops out of the solve
    exactly, so ``omega'`` needs neither mass, position nor attitude. The same block
    elimination as :func:`midpoint_step` (closed-form scaled-cofactor inverse, no LAPACK),
    with the translation entries as structural zeros, so the numbers equal the full step's
    ``angular_velocity`` to round-off (``tests/test_midpoint.py``). The inertia fits
    (:mod:`rigidjax.identify`) integrate Euler's equations with it: their residual is in
    ``omega`` only, and dropping the attitude and translation made their Jacobian rollout
    compile in 2-3 s instead of 5-6 s and run a call of 64 racquet windows (128 samples,
    6 tangents) in 8-10 ms instead of 20 ms, against :func:`rigidjax.rollout` of the full
    step (2-core VM). Plain JAX: differentiable in every argument, jit/vmap-able.

    Args:
        inertia: principal moments ``(…, 3)`` along the body axes, or a symmetric tensor
            ``(…, 3, 3)``, body frame, kg m^2 (positive definite).
        omega: body angular velocity ``(…, 3)``, rad/s.
        dt: step, s (> 0; not checked: traced values are the caller's to validate),
            scalar or of the batch shape.
        damping: angular resistance ``D`` (torque ``-D omega``), N m s: ``None`` (zero),
            diagonal ``(…, 3)`` or a matrix ``(…, 3, 3)`` (the rotation block of
            :attr:`rigidjax.RigidBody.resistance`).
        torque: applied torque ``(…, 3)``, body frame, N m, held over the step; ``None`` for zero.

    Returns:
        ``omega'`` ``(…, 3)``, rad/s, in the dtype the inputs promote to.
    """
    omega = jnp.asarray(omega)
    dtype = jnp.result_type(omega, inertia, float)
    inertia = jnp.asarray(inertia, dtype)
    omega = omega.astype(dtype)
    if inertia.shape[-2:] == (3, 3):
        J = _block(inertia, range(3), range(3))
    else:
        J = tuple(tuple(inertia[..., i] if i == j else 0.0 for j in range(3)) for i in range(3))
    if damping is None:
        D = ((0.0,) * 3,) * 3
    else:
        damping = jnp.asarray(damping, dtype)
        if damping.shape[-2:] == (3, 3):
            D = _block(damping, range(3), range(3))
        else:
            D = tuple(tuple(damping[..., i] if i == j else 0.0 for j in range(3)) for i in range(3))
    zero3 = (0.0, 0.0, 0.0)
    Rt = tuple(zero3 + zero3 for _ in range(3)) + tuple(zero3 + D[i] for i in range(3))
    w = _comps(omega, 3)
    gyro = _cross(w, _mv(J, w))
    tau = zero3 if torque is None else _comps(jnp.asarray(torque, dtype), 3)
    Dw = _mv(D, w)
    rhs = zero3 + tuple(zadd(tau[i], zneg(gyro[i]), zneg(Dw[i])) for i in range(3))
    out = _solve_blocks(1.0, J, Rt, w, rhs, jnp.asarray(dt, dtype), base=zero3 + w)
    return jnp.stack(jnp.broadcast_arrays(*out[3:]), -1)


def _quat_exp_mul(q, phi, eps):
    """``q ⊗ exp(phi)`` and its norm (5 arrays) in tuple form; ``exp`` as in jaxlie (Taylor near 0)."""
    t2 = phi[0] * phi[0] + phi[1] * phi[1] + phi[2] * phi[2]
    t4 = t2 * t2
    taylor = t2 < eps
    th = jnp.sqrt(jnp.where(taylor, jnp.ones_like(t2), t2))
    re = jnp.where(taylor, 1.0 - t2 / 8.0 + t4 / 384.0, jnp.cos(0.5 * th))
    im = jnp.where(taylor, 0.5 - t2 / 48.0 + t4 / 3840.0, jnp.sin(0.5 * th) / th)
    w1, x1, y1, z1 = re, im * phi[0], im * phi[1], im * phi[2]
    w0, x0, y0, z0 = q
    w = w0 * w1 - x0 * x1 - y0 * y1 - z0 * z1
    x = w0 * x1 + x0 * w1 + y0 * z1 - z0 * y1
    y = w0 * y1 - x0 * z1 + y0 * w1 + z0 * x1
    z = w0 * z1 + x0 * y1 - y0 * x1 + z0 * w1
    # materialised with its norm; :func:`_finalize` divides. A fused ``x / sqrt(.)`` would
    # become XLA's rsqrt, which has no vector form in float64 (the loop turned scalar, ~2x)
    return _materialize(w, x, y, z, jnp.sqrt(w * w + x * x + y * y + z * z))


def _stack(cs):
    shape = jnp.broadcast_shapes(*(jnp.shape(c) for c in cs))
    return jnp.stack([jnp.broadcast_to(c, shape) for c in cs], -1)


def _norm3(c):
    # safe_norm: zero gradient (not NaN) at zero
    sq = c[0] * c[0] + c[1] * c[1] + c[2] * c[2]
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1)), 0)


def _finalize(t, x, q, v, omega, x1, q1, v1, w1, dt, active):
    """Per member: the new state if it is finite and ``active``, else the input state.

    ``q1`` is the unnormalised quaternion and its norm (5 arrays): it is normalised here, and
    its finiteness tested before the division, so each division has one consumer (XLA keeps
    a multi-consumer division out of the fused loop). Returns ``(t, x, q, v, omega,
    rotation, ok)`` with ``rotation = max(|omega|, |omega'|) dt`` (``|omega| dt`` where the
    step is rejected) and ``ok`` the acceptance flag.
    """
    *q1, qn = q1
    checked = x1 + tuple(q1) + (qn,) + v1 + w1
    finite = functools.reduce(jnp.logical_and, [jnp.isfinite(c) for c in checked]) & (qn > 0)
    ok = finite if active is None else finite & active
    new = x1 + tuple(c / qn for c in q1) + v1 + w1
    old = x + q + v + omega
    comps = tuple(jnp.where(ok, a, b) for a, b in zip(new, old))
    n0 = _norm3(omega)
    rotation = jnp.where(ok, jnp.maximum(n0, _norm3(w1)), n0) * dt
    t1 = jnp.where(ok, t + dt, t)
    return t1, comps[:3], comps[3:7], comps[7:10], comps[10:], rotation, ok


def _core_fast(body, t, x, q, v, omega, wrench, dt, active, attitude, zeros=None):
    """The step on per-component arrays (primal values): closed-form solve, materialised.
    ``zeros``: :func:`_zero_pattern` of ``body`` (its terms known to vanish), or ``None``."""
    dtype = omega[0].dtype
    parts = _model_parts(body, zeros)
    rhs = _twist_rhs(parts, v, omega, wrench, dtype)
    V1 = _solve_blocks(parts[0], parts[1], parts[2], omega, rhs, dt, base=(*v, *omega))
    v1, w1 = V1[:3], V1[3:]
    x1 = tuple(x[i] + dt * v1[i] for i in range(3))
    w_att = w1 if attitude == "new" else tuple(0.5 * (omega[i] + w1[i]) for i in range(3))
    q1 = _quat_exp_mul(q, tuple(dt * c for c in w_att), get_epsilon(jnp.dtype(dtype)))
    t1, x1, q1, v1, w1, rotation, ok = _finalize(t, x, q, v, omega, x1, q1, v1, w1, dt, active)
    # one loop for the acceptance test, the selection and every output component
    *out, ok = _materialize(t1, *x1, *q1, *v1, *w1, rotation, ok.astype(dtype))
    return out[0], tuple(out[1:4]), tuple(out[4:8]), tuple(out[8:11]), tuple(out[11:14]), out[14], ok > 0


# Derivatives: a hand-written JVP in array form ((…, 3) vectors, (…, 3, 3) matrices, einsum
# products), linear in the tangents, with every primal factor (the block inverses, the
# rotation factors) computed once and shared by all tangents. Differentiating the
# per-component primal graph instead makes XLA:CPU duplicate the shared cotangent chains
# (reverse mode was ~50x the forward cost); differentiating an array-form copy of the step
# (the previous design) pushed full 6x6 matrix tangents through broadcast-multiply-sum
# products, ~6x slower than needed under the fits' ``vmap(jacfwd(rollout))``.


def _amv(A, x):
    return jnp.einsum("...ij,...j->...i", A, x)


def _amm(A, B):
    return jnp.einsum("...ij,...jk->...ik", A, B)


def _ahat(w):
    z = jnp.zeros_like(w[..., 0])
    return jnp.stack(
        [jnp.stack([z, -w[..., 2], w[..., 1]], -1), jnp.stack([w[..., 2], z, -w[..., 0]], -1),
         jnp.stack([-w[..., 1], w[..., 0], z], -1)], -2,
    )


def _inv3_arrays(A):
    """Inverse of (…, 3, 3) by scaled cofactors (rows' cross products), array form."""
    s = jnp.abs(A[..., 0, 0] + A[..., 1, 1] + A[..., 2, 2])[..., None, None] / 3
    A = A / s
    a0, a1, a2 = A[..., 0, :], A[..., 1, :], A[..., 2, :]
    c0, c1, c2 = jnp.cross(a1, a2), jnp.cross(a2, a0), jnp.cross(a0, a1)
    det = jnp.sum(a0 * c0, -1)
    return jnp.stack([c0, c1, c2], -1) / (det[..., None, None] * s)


def _step_solver(body, w, dt):
    """``b -> (M/dt + R - K(w)/2)^-1 b`` for (…, 6) right-hand sides, by the block elimination
    of :func:`_solve_blocks` in array form; the factors are built once, for the primal and
    every tangent (no LAPACK call: a batched LAPACK custom call inside a vmapped scan can
    deadlock XLA:CPU's 2-thread pool, see benchmarks/README.md)."""
    R, J = body.resistance, body.inertia
    m_dt = (jnp.asarray(body.mass) / dt)[..., None, None] * jnp.eye(3, dtype=w.dtype)
    A21 = R[..., 3:, :3]
    inv11 = _inv3_arrays(m_dt + R[..., :3, :3])
    P = _amm(inv11, R[..., :3, 3:])
    K = _ahat(_amv(J, w)) - _amm(_ahat(w), J)
    inv_s = _inv3_arrays(J / dt[..., None, None] + R[..., 3:, 3:] - 0.5 * K - _amm(A21, P))

    def solve(b):
        y1 = _amv(inv11, b[..., :3])
        x2 = _amv(inv_s, b[..., 3:] - _amv(A21, y1))
        return jnp.concatenate([y1 - _amv(P, x2), x2], -1)

    return solve


def _aquat_mul(w0, u, re, e):
    """``(w0, u) ⊗ (re, e)`` (…, 4) for scalar parts (…,) and vector parts (…, 3)."""
    w = w0 * re - jnp.sum(u * e, -1)
    xyz = w0[..., None] * e + re[..., None] * u + jnp.cross(u, e)
    return jnp.concatenate([w[..., None], xyz], -1)


def _exp_factors(phi, eps):
    """``exp(phi) = (re, im phi)`` as in :func:`_quat_exp_mul`, with ``d re/d t2`` and
    ``d im/d t2`` in ``t2 = |phi|^2`` (Taylor series below ``eps``, as the primal)."""
    t2 = jnp.sum(phi * phi, -1)
    taylor = t2 < eps
    safe = jnp.where(taylor, jnp.ones_like(t2), t2)
    th = jnp.sqrt(safe)
    re = jnp.where(taylor, 1.0 - t2 / 8.0 + t2 * t2 / 384.0, jnp.cos(0.5 * th))
    im = jnp.where(taylor, 0.5 - t2 / 48.0 + t2 * t2 / 3840.0, jnp.sin(0.5 * th) / th)
    dre = jnp.where(taylor, -1.0 / 8.0 + t2 / 192.0, -0.25 * im)
    dim = jnp.where(taylor, -1.0 / 48.0 + t2 / 1920.0, (0.5 * re - im) / (2 * safe))
    return re, im, dre, dim


def _core_linearized(primals, tangents, attitude, ok):
    r"""The step in array form and its tangent (the JVP of :func:`_core_fast`), derived by hand.

    With ``A dV = rhs``, ``A = M/dt + R - K(omega)/2``, ``rhs = F - [0; omega x I omega] - R V``:

    .. math:: A\,\dot{dV} = \dot{rhs} - \dot A\, dV, \qquad
              \dot A\, dV = \Big(\tfrac{\dot M}{dt} - \tfrac{M \dot{dt}}{dt^2}\Big) dV + \dot R\, dV
                          - \tfrac12 \dot K\, dV_\omega ,

    ``K u = (I omega) x u - omega x (I u)`` being bilinear in ``(I, omega)``; ``rhs`` and ``A``
    share ``dot R``, so ``dot rhs - dot A dV`` carries ``-dot R V'``. The attitude's
    ``exp(phi)`` is differentiated through ``d cos(th/2) / d th^2 = -sin(th/2) / (4 th)`` and
    ``d (sin(th/2)/th) / d th^2 = (cos(th/2)/2 - sin(th/2)/th) / (2 th^2)``. The acceptance
    selection and the rotation measure are differentiated by ``jax.jvp`` of :func:`_finalize`.
    Checked against central finite differences (tests/test_midpoint_layout.py,
    tests/test_adjoint.py). ``ok``: the primal step's acceptance flag. Returns ``(out,
    tangent_out)`` in :func:`_finalize`'s structure (``out`` equals :func:`_core_fast`'s where
    ``ok``, to round-off).
    """
    body, t, x, q, v, omega, wrench, dt, _ = primals
    tbody, t_t, x_t, q_t, v_t, w_t, wrench_t, dt_t, _ = tangents
    dtype = omega[0].dtype
    eps = get_epsilon(jnp.dtype(dtype))
    dt, dt_t = jnp.asarray(dt), jnp.asarray(dt_t)
    dt3 = dt[..., None]
    m, J, R, g = jnp.asarray(body.mass)[..., None], body.inertia, body.resistance, body.gravity
    m_t, J_t, R_t, g_t = jnp.asarray(tbody.mass)[..., None], tbody.inertia, tbody.resistance, tbody.gravity
    X, Q, Vl, W = _stack(x), _stack(q), _stack(v), _stack(omega)
    X_t, Q_t, W_t = _stack(x_t), _stack(q_t), _stack(w_t)
    Jw = _amv(J, W)
    F = jnp.concatenate(jnp.broadcast_arrays(m * g, -jnp.cross(W, Jw)), -1)
    if wrench is not None:
        F = F + jnp.asarray(wrench, dtype)
    V = jnp.concatenate([Vl, W], -1)
    solve = _step_solver(body, W, dt)

    def advance(dV):
        V1 = V + dV
        wa = V1[..., 3:] if attitude == "new" else 0.5 * (W + V1[..., 3:])
        phi = dt3 * wa
        re, im, dre, dim = _exp_factors(phi, eps)
        q1 = _aquat_mul(Q[..., 0], Q[..., 1:], re, im[..., None] * phi)
        return V1, X + dt3 * V1[..., :3], phi, (re, im, dre, dim), q1, jnp.sqrt(jnp.sum(q1 * q1, -1))

    # ``ok``: the acceptance flag of the primal step. A rejected member keeps its old state:
    # its increment is replaced by 0 before the tangent is formed, so no 0 * NaN (e.g. from a
    # NaN wrench) reaches the other members' gradients
    dV = jnp.where(ok[..., None], solve(F - _amv(R, V)), 0)
    V1, x1, phi, (re, im, dre, dim), q1, n = advance(dV)
    # tangent: A d(dV) = d(rhs) - dA dV, with dA = dM/dt - M ddt/dt^2 + dR - dK/2
    Jw_t = _amv(J_t, W) + _amv(J, W_t)
    F_t = jnp.concatenate(
        jnp.broadcast_arrays(m_t * g + m * g_t, -(jnp.cross(W_t, Jw) + jnp.cross(W, Jw_t))), -1
    )
    if wrench is not None:
        F_t = F_t + wrench_t
    V_t = jnp.concatenate([_stack(v_t), W_t], -1)
    dVv, dVw = dV[..., :3], dV[..., 3:]
    rate = (dt_t / dt)[..., None]  # d(1/dt) = -rate / dt
    h = 1 / dt3
    JdVw = _amv(J, dVw)
    J_tdVw = _amv(J_t, dVw)
    K_tdVw = jnp.cross(Jw_t, dVw) - jnp.cross(W_t, JdVw) - jnp.cross(W, J_tdVw)
    A_tdV = jnp.concatenate(
        jnp.broadcast_arrays((m_t - m * rate) * h * dVv, (J_tdVw - rate * JdVw) * h - 0.5 * K_tdVw), -1
    )
    V1_t = V_t + solve(F_t - A_tdV - _amv(R_t, V1) - _amv(R, V_t))
    v1_t, w1_t = V1_t[..., :3], V1_t[..., 3:]
    x1_t = X_t + dt_t[..., None] * V1[..., :3] + dt3 * v1_t
    wa = V1[..., 3:] if attitude == "new" else 0.5 * (W + V1[..., 3:])
    wa_t = w1_t if attitude == "new" else 0.5 * (W_t + w1_t)
    phi_t = dt_t[..., None] * wa + dt3 * wa_t
    t2_t = 2 * jnp.sum(phi * phi_t, -1)
    E_t = (dim * t2_t)[..., None] * phi + im[..., None] * phi_t
    q1_t = _aquat_mul(Q_t[..., 0], Q_t[..., 1:], re, im[..., None] * phi) + _aquat_mul(
        Q[..., 0], Q[..., 1:], dre * t2_t, E_t
    )
    n_t = jnp.sum(q1 * q1_t, -1) / n

    def finalize(t, x, q, v, omega, x1, q1, v1, w1, dt):
        return _finalize(t, x, q, v, omega, x1, q1, v1, w1, dt, ok)

    p = (t, x, q, v, omega, _comps(x1, 3), (*_comps(q1, 4), n), _comps(V1[..., :3], 3), _comps(V1[..., 3:], 3), dt)
    tt = (t_t, x_t, q_t, v_t, w_t, _comps(x1_t, 3), (*_comps(q1_t, 4), n_t), _comps(v1_t, 3), _comps(w1_t, 3), dt_t)
    return jax.jvp(finalize, p, tt)


@functools.partial(jax.custom_jvp, nondiff_argnums=(9, 10))
def _core(body, t, x, q, v, omega, wrench, dt, active, attitude, zeros):
    # zeros: the body's zero pattern, found outside (where the body may be concrete; inside
    # custom_jvp it is always traced)
    return _core_fast(body, t, x, q, v, omega, wrench, dt, active, attitude, zeros)


@_core.defjvp
def _core_jvp(attitude, zeros, primals, tangents):
    # the primal from the structure-of-arrays step (its few fused loops are cheaper than the
    # array form's many small kernels when there are few tangents), the tangent in array form
    out = _core_fast(*primals, attitude, zeros)
    tangents = (*tangents[:8], np.zeros(jnp.shape(primals[8]), jax.dtypes.float0))
    return out, _core_linearized(primals, tangents, attitude, out[-1])[1]


class MidpointCarry(eqx.Module):
    """:class:`RigidBodyState` split into per-component arrays (structure of arrays).

    The form in which :func:`rigidjax.rollout` carries a midpoint rollout: every component is a
    contiguous array of the batch shape, so a step is a few vectorised loops over the
    ensemble with no gather/scatter of ``(N, 3)`` rows (measured ~2x faster on CPU). Internal:
    build it with :func:`pack_state`, read it with :func:`unpack_state`.
    """

    time: jax.Array
    position: tuple
    orientation: tuple
    velocity: tuple
    angular_velocity: tuple


def pack_state(state: RigidBodyState) -> MidpointCarry:
    """Split a :class:`RigidBodyState` into a :class:`MidpointCarry` (no copy of meaning)."""
    return MidpointCarry(
        time=jnp.asarray(state.time),
        position=_comps(state.position, 3),
        orientation=_comps(state.orientation, 4),
        velocity=_comps(state.velocity, 3),
        angular_velocity=_comps(state.angular_velocity, 3),
    )


def unpack_state(carry: MidpointCarry, like: RigidBodyState) -> RigidBodyState:
    """Stack a :class:`MidpointCarry` (any leading axes) back into ``like``'s pytree type."""
    return eqx.tree_at(
        lambda s: (s.time, s.position, s.orientation, s.velocity, s.angular_velocity),
        like,
        (carry.time, _stack(carry.position), _stack(carry.orientation), _stack(carry.velocity),
         _stack(carry.angular_velocity)),
    )


def _leading_minors_positive(J):
    """``True`` where the symmetric ``J (…, 3, 3)`` is positive definite (Sylvester: leading
    minors, closed form; no LAPACK inside a step)."""
    m1 = J[..., 0, 0]
    m2 = J[..., 0, 0] * J[..., 1, 1] - J[..., 0, 1] * J[..., 1, 0]
    m3 = (
        J[..., 0, 0] * (J[..., 1, 1] * J[..., 2, 2] - J[..., 1, 2] * J[..., 2, 1])
        - J[..., 0, 1] * (J[..., 1, 0] * J[..., 2, 2] - J[..., 1, 2] * J[..., 2, 0])
        + J[..., 0, 2] * (J[..., 1, 0] * J[..., 2, 1] - J[..., 1, 1] * J[..., 2, 0])
    )
    return (m1 > 0) & (m2 > 0) & (m3 > 0)


def _valid_inputs(body, dt, batch):
    """Per member: ``dt > 0``, ``mass > 0`` and a physical inertia: positive definite and
    obeying the triangle inequality ``I_i + I_j >= I_k``.

    The triangle inequality without an eigen-decomposition: the second-moment matrix
    ``tr(J)/2 I - J`` (eigenvalues ``(I_i + I_j - I_k)/2``) is positive semidefinite; shifted by
    ``rtol tr(J)/2`` it is positive definite, so a thin-plate equality within round-off stays
    valid. ``rtol = max(1e-6, 64 eps)``, looser than :func:`rigidjax.body.check_inertia`'s
    1e-9: a traced inertia may have been rounded to float32 (relative error ~1e-7) before a
    float64 body received it.

    The run-time counterpart of the boundary checks, for values traced under ``jit`` (e.g. an
    inertia being fitted); depends on the model and ``dt`` only, so XLA hoists it out of a scan.
    """
    J = body.inertia
    half = 0.5 * (J[..., 0, 0] + J[..., 1, 1] + J[..., 2, 2])
    rtol = max(1e-6, 64 * float(jnp.finfo(J.dtype).eps))
    second = ((1 + rtol) * half)[..., None, None] * jnp.eye(3, dtype=J.dtype) - J
    ok = (dt > 0) & (body.mass > 0) & _leading_minors_positive(J) & _leading_minors_positive(second)
    return jnp.broadcast_to(ok, jnp.broadcast_shapes(jnp.shape(ok), batch))


def _packed_step(body, carry: MidpointCarry, wrench, dt, active, attitude, max_rotation):
    """The midpoint step on a :class:`MidpointCarry`; members where ``active`` is False (or the
    result is not finite) keep their input state. Returns ``(carry, info)``."""
    dtype = carry.angular_velocity[0].dtype
    dt = jnp.asarray(dt, dtype)
    valid = _valid_inputs(body, dt, jnp.shape(carry.time))
    run = valid if active is None else active & valid
    t1, x1, q1, v1, w1, rotation, ok = _core(
        body, carry.time, carry.position, carry.orientation, carry.velocity, carry.angular_velocity,
        wrench, dt, run, attitude, _zero_pattern(body),
    )
    finite = ok | ~run
    status = jnp.where(
        finite, jnp.where(rotation > max_rotation, Status.ROTATION_LIMIT, Status.SUCCESS), Status.NONFINITE
    )
    status = jnp.where(valid, status, Status.INVALID_INPUT)
    info = make_info(status, jnp.ones_like(status), jnp.zeros_like(rotation), rotation)
    return MidpointCarry(t1, x1, q1, v1, w1), info


class PackedStep(eqx.Module):
    """A stepper in structure-of-arrays form, for :func:`rigidjax.rollout`'s fast path.

    ``step(model, carry, inputs, dt, active) -> (carry, info)`` must equal the public step on
    ``unpack(carry)`` for members where ``active`` is True and return inactive members
    unchanged. Internal protocol; a public stepper exposes one through
    :func:`packed_form`.
    """

    pack: object = eqx.field(static=True)
    unpack: object = eqx.field(static=True)
    step: object = eqx.field(static=True)
    check: object = eqx.field(static=True)
    attitude: str = eqx.field(static=True)


def packed_form(step) -> PackedStep | None:
    """The :class:`PackedStep` of ``step`` if it is :func:`midpoint_step` (optionally bound
    with keyword options through ``functools.partial``), else ``None``."""
    step, kwargs = unwrap_partial(step)
    if step is not midpoint_step or not set(kwargs) <= {"attitude", "max_rotation"}:
        return None
    attitude = kwargs.get("attitude", "new")
    max_rotation = kwargs.get("max_rotation", 0.5)
    if attitude not in ("new", "midpoint"):
        raise ValueError(f"attitude must be 'new' or 'midpoint'; got {attitude!r}")
    return PackedStep(
        pack=pack_state,
        unpack=unpack_state,
        step=functools.partial(_packed_step, attitude=attitude, max_rotation=max_rotation),
        check=functools.partial(check_step_inputs, where="midpoint_step"),
        attitude=attitude,
    )


def midpoint_step(
    body: RigidBody,
    state: RigidBodyState,
    wrench: jax.Array | None,
    dt,
    *,
    attitude: Literal["new", "midpoint"] = "new",
    max_rotation: float = 0.5,
) -> tuple[RigidBodyState, StepInfo]:
    r"""One linearly implicit midpoint step (seed 000). Pure, jit-able, vmap-able, differentiable.

    Args:
        body: :class:`RigidBody` (mass kg, body inertia kg m^2, resistance, gravity).
        state: :class:`RigidBodyState` at time ``t``.
        wrench: applied wrench ``(6,)`` = (force in WORLD, N; torque in BODY about the centre
            of mass, N m), held over the step; ``None`` for zero. Gravity comes from ``body``.
        dt: step, s, scalar > 0 (checked where concrete; inside ``jit`` a traced ``dt`` is
            not inspected: :func:`rigidjax.rollout` checks it before tracing).
        attitude: ``"new"`` turns the orientation by ``exp(dt omega')`` as in the seed (first
            order in attitude); ``"midpoint"`` by ``exp(dt (omega + omega')/2)`` (second order).
        max_rotation: rad; a step with ``|omega| dt`` above it is flagged
            ``Status.ROTATION_LIMIT`` (state still advanced). ``inf`` disables the flag.

    Raises:
        ValueError: ``wrench`` not of shape ``(…, 6)``; ``dt <= 0`` or NaN (concrete);
            body and state batch shapes that do not match.
        TypeError: body and state of different float dtypes (e.g. float64 body, float32 state).

    Returns:
        ``(new_state, info)``. ``info.rotation`` is ``max(|omega|, |omega'|) * dt``;
        ``info.iterations`` is 1. If the new state is not finite the input state is returned
        unchanged with ``Status.NONFINITE``; where values traced under ``jit`` are out of range
        (``dt <= 0``, ``mass <= 0``, inertia not positive definite or violating the triangle
        inequality) it is returned unchanged with
        ``Status.INVALID_INPUT``.
    """
    if attitude not in ("new", "midpoint"):
        raise ValueError(f"attitude must be 'new' or 'midpoint'; got {attitude!r}")
    check_step_inputs(body, state, wrench, dt, "midpoint_step")
    carry, info = _packed_step(body, pack_state(state), wrench, dt, None, attitude, max_rotation)
    return unpack_state(carry, state), info
