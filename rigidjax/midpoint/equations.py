"""The midpoint step's equations: the gyroscopic term and its Jacobian ``K``, the step matrix
``M/dt + R - K/2`` and its closed-form solve by block elimination (per-component arrays).

Shapes: vectors ``(..., 3)``/``(..., 6)``, matrices ``(..., 3, 3)``/``(..., 6, 6)``; SI units;
``omega`` in the BODY frame. Follows the input dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..body import RigidBody
from ..numerics import (
    full_precision,
    block,
    comps,
    cross,
    inv3,
    materialize,
    mm,
    mv,
    static_zero,
    sum_nonzero,
    zadd,
    zero_pattern,
    zmul,
    zneg,
)
from .. import so3

__all__ = ["angular_velocity_step", "gyroscopic_term", "gyroscopic_jacobian", "step_matrix", "step_solve"]


def _apply(A, x):
    return jnp.einsum("...ij,...j->...i", A, x)


@full_precision
def gyroscopic_term(inertia: jax.Array, omega: jax.Array) -> jax.Array:
    """``omega × (I omega)`` (…, 3), N m; ``inertia`` (…, 3, 3) body frame, ``omega`` (…, 3) body, rad/s."""
    return jnp.cross(omega, _apply(inertia, omega))


@full_precision
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
    J = sum(block(body.inertia, range(3), range(3)), ())
    R = sum(block(body.resistance, range(6), range(6)), ())
    g = comps(body.gravity, 3)
    flat = [jnp.asarray(body.mass), *J, *R, *g]
    if zeros is not None:
        flags = (False, *zeros[0], *zeros[1], *zeros[2])
        flat = [0.0 if z else a for a, z in zip(flat, flags)]
    live = [k for k, a in enumerate(flat) if not static_zero(a)]
    for k, a in zip(live, materialize(*(flat[k] for k in live))):
        flat[k] = a
    m, Jf, Rf, gf = flat[0], flat[1:10], flat[10:46], tuple(flat[46:49])
    return (
        m,
        tuple(tuple(Jf[3 * i : 3 * i + 3]) for i in range(3)),
        tuple(tuple(Rf[6 * i : 6 * i + 6]) for i in range(6)),
        gf,
    )


def _solve_blocks(mass, J, Rt, omega, rhs, dt, base=None):
    """Solve ``(M/dt + R - K/2) dV = rhs`` by block elimination; tuple form in and out.
    With ``base`` (6 components) returns ``base + dV`` instead, in the same loop (the new
    twist: a separate sum has several consumers and would be a kernel of its own)."""
    Iw = mv(J, omega)
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
    inv11 = inv3(A11)
    P = mm(inv11, A12)
    A21P = mm(A21, P)
    b1, b2 = rhs[:3], rhs[3:]
    y1 = mv(inv11, b1)
    A21y = mv(A21, y1)
    S = tuple(
        tuple(
            zadd(
                zmul(J[i][j], inv_dt),
                Rt[3 + i][3 + j],
                zneg(zmul(0.5, zadd(hIw[i][j], zneg(hwJ[i][j])))),
                zneg(A21P[i][j]),
            )
            for j in range(3)
        )
        for i in range(3)
    )
    r2 = tuple(zadd(b2[i], zneg(A21y[i])) for i in range(3))
    x2 = mv(inv3(S), r2)
    Px2 = mv(P, x2)
    x1 = tuple(zadd(y1[i], zneg(Px2[i])) for i in range(3))
    out = [*x1, *x2]
    if base is not None:
        out = [zadd(b, o) for b, o in zip(base, out)]
    live = [k for k, a in enumerate(out) if not static_zero(a)]
    for k, a in zip(live, materialize(*(out[k] for k in live))):
        out[k] = a
    return tuple(out)


def _twist_rhs(parts, velocity, omega, wrench, dtype):
    """``F - [0; omega x I omega] - R V`` in tuple form (6 arrays)."""
    mass, J, R, g = parts
    gyro = cross(omega, mv(J, omega))
    F = [zmul(mass, g[0]), zmul(mass, g[1]), zmul(mass, g[2]), 0.0, 0.0, 0.0]
    if wrench is not None:
        wr = comps(jnp.asarray(wrench, dtype), 6)
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
    dV = _solve_blocks(mass, J, R, comps(omega, 3), comps(rhs, 6), dt)
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
    ``omega`` only, so their Jacobian rollout need not carry attitude and translation, and
    compiles and runs fewer operations than :func:`rigidjax.rollout` of the full step. Plain
    JAX: differentiable in every argument, jit/vmap-able.

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
        J = block(inertia, range(3), range(3))
    else:
        J = tuple(tuple(inertia[..., i] if i == j else 0.0 for j in range(3)) for i in range(3))
    if damping is None:
        D = ((0.0,) * 3,) * 3
    else:
        damping = jnp.asarray(damping, dtype)
        if damping.shape[-2:] == (3, 3):
            D = block(damping, range(3), range(3))
        else:
            D = tuple(tuple(damping[..., i] if i == j else 0.0 for j in range(3)) for i in range(3))
    zero3 = (0.0, 0.0, 0.0)
    Rt = tuple(zero3 + zero3 for _ in range(3)) + tuple(zero3 + D[i] for i in range(3))
    w = comps(omega, 3)
    gyro = cross(w, mv(J, w))
    tau = zero3 if torque is None else comps(jnp.asarray(torque, dtype), 3)
    Dw = mv(D, w)
    rhs = zero3 + tuple(zadd(tau[i], zneg(gyro[i]), zneg(Dw[i])) for i in range(3))
    out = _solve_blocks(1.0, J, Rt, w, rhs, jnp.asarray(dt, dtype), base=zero3 + w)
    return jnp.stack(jnp.broadcast_arrays(*out[3:]), -1)
