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
from jaxlie.utils import get_epsilon

from . import so3
from .body import RigidBody, RigidBodyState, check_step_inputs
from .info import Status, StepInfo, make_info

__all__ = ["gyroscopic_term", "gyroscopic_jacobian", "midpoint_step", "step_matrix", "step_solve"]


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


def _mv(A, x):
    return tuple(r[0] * x[0] + r[1] * x[1] + r[2] * x[2] for r in A)


def _mm(A, B):
    return tuple(tuple(r[0] * B[0][j] + r[1] * B[1][j] + r[2] * B[2][j] for j in range(3)) for r in A)


def _cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def _inv3(A):
    """Inverse of a 3x3 (tuple form) by cofactors of ``A/s``, ``s`` the mean |diagonal|.

    The scaling keeps ``det`` in range in float32 for any units (e.g. ``I/dt ~ 1e-17`` for a
    milligram body); a singular ``A`` gives inf/NaN, caught by the step's finiteness check.
    """
    s = (jnp.abs(A[0][0]) + jnp.abs(A[1][1]) + jnp.abs(A[2][2])) / 3
    r = 1 / s
    (a, b, c), (d, e, f), (g, h, i) = ((x * r for x in row) for row in A)
    c00, c01, c02 = e * i - f * h, c * h - b * i, b * f - c * e
    c10, c11, c12 = f * g - d * i, a * i - c * g, c * d - a * f
    c20, c21, c22 = d * h - e * g, b * g - a * h, a * e - b * d
    k = r / (a * c00 + b * c10 + c * c20)
    return ((c00 * k, c01 * k, c02 * k), (c10 * k, c11 * k, c12 * k), (c20 * k, c21 * k, c22 * k))


@jax.custom_jvp
def _materialize(*xs):
    """Identity on arrays of one shape, computed as ONE multi-output XLA loop.

    Why: XLA:CPU fuses elementwise chains into every consumer, so a step whose outputs share
    intermediates (the Schur complement, the rotation factors, the finiteness flag) is
    recomputed once per output component (~7x the work, measured). A variadic ``reduce``
    over a padded axis of length 2 (``x + (-0.0)``, exact for every value incl. ``-0.0``,
    inf, NaN) is emitted as a single loop with one output per array, sharing every
    intermediate. ``optimization_barrier`` does not help: XLA:CPU expands it before fusion.
    Tangents pass straight through (custom JVP), so ``grad`` and ``vmap`` are unaffected.
    """
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in xs))
    xs = [jnp.broadcast_to(x, shape) for x in xs]
    nz = [jnp.full((), -0.0, x.dtype) for x in xs]
    ops = [jnp.stack([x, jnp.broadcast_to(z, shape)], -1) for x, z in zip(xs, nz)]
    return tuple(
        jax.lax.reduce(ops, nz, lambda a, b: tuple(u + v for u, v in zip(a, b)), (len(shape),))
    )


@_materialize.defjvp
def _materialize_jvp(primals, tangents):
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in primals))
    return _materialize(*primals), tuple(jnp.broadcast_to(t, shape) for t in tangents)


def _model_parts(body: RigidBody):
    """``(mass, inertia 3x3, resistance 6x6, gravity 3)`` in tuple form, each a contiguous array.

    Materialised once (XLA hoists it out of a rollout's scan), so the step reads contiguous
    per-component arrays instead of strided ``(N, 6, 6)`` slices; this lets XLA vectorise.
    """
    J = _block(body.inertia, range(3), range(3))
    R = _block(body.resistance, range(6), range(6))
    g = _comps(body.gravity, 3)
    flat = _materialize(jnp.asarray(body.mass), *sum(J, ()), *sum(R, ()), *g)
    m, Jf, Rf, gf = flat[0], flat[1:10], flat[10:46], flat[46:49]
    return m, tuple(Jf[3 * i : 3 * i + 3] for i in range(3)), tuple(Rf[6 * i : 6 * i + 6] for i in range(6)), gf


def _solve_blocks(mass, J, Rt, omega, rhs, dt):
    """Solve ``(M/dt + R - K/2) dV = rhs`` by block elimination; tuple form in and out."""
    Iw = _mv(J, omega)
    # K = hat(I w) - hat(w) I
    hIw = ((0, -Iw[2], Iw[1]), (Iw[2], 0, -Iw[0]), (-Iw[1], Iw[0], 0))
    w0, w1, w2 = omega
    hwJ = (  # hat(omega) @ I, written without the zero products
        tuple(w1 * J[2][j] - w2 * J[1][j] for j in range(3)),
        tuple(w2 * J[0][j] - w0 * J[2][j] for j in range(3)),
        tuple(w0 * J[1][j] - w1 * J[0][j] for j in range(3)),
    )
    inv_dt = 1 / dt
    m_dt = mass * inv_dt
    eye = ((1, 0, 0), (0, 1, 0), (0, 0, 1))
    # translation block and coupling: independent of omega (XLA hoists them out of a scan)
    A11 = tuple(tuple(m_dt * eye[i][j] + Rt[i][j] for j in range(3)) for i in range(3))
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
            J[i][j] * inv_dt + Rt[3 + i][3 + j] - 0.5 * (hIw[i][j] - hwJ[i][j]) - A21P[i][j]
            for j in range(3)
        )
        for i in range(3)
    )
    r2 = tuple(b2[i] - A21y[i] for i in range(3))
    x2 = _mv(_inv3(S), r2)
    Px2 = _mv(P, x2)
    x1 = tuple(y1[i] - Px2[i] for i in range(3))
    return _materialize(*x1, *x2)


def _twist_rhs(parts, velocity, omega, wrench, dtype):
    """``F - [0; omega x I omega] - R V`` in tuple form (6 arrays)."""
    mass, J, R, g = parts
    gyro = _cross(omega, _mv(J, omega))
    F = [mass * g[0], mass * g[1], mass * g[2], 0, 0, 0]
    if wrench is not None:
        wr = _comps(jnp.asarray(wrench, dtype), 6)
        F = [F[i] + wr[i] for i in range(6)]
    V = tuple(velocity) + tuple(omega)
    RV = [sum(R[i][j] * V[j] for j in range(6)) for i in range(6)]
    return tuple(F[i] - (gyro[i - 3] if i >= 3 else 0) - RV[i] for i in range(6))


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
    shape = jnp.broadcast_shapes(*(jnp.shape(c) for c in dV))
    return jnp.stack([jnp.broadcast_to(c, shape) for c in dV], -1)


def _quat_exp_mul(q, phi, eps):
    """``normalize(q ⊗ exp(phi))`` in tuple form; ``exp`` as in jaxlie (Taylor near 0)."""
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
    w, x, y, z = _materialize(w, x, y, z)
    inv = 1 / jnp.sqrt(w * w + x * x + y * y + z * z)
    return (w * inv, x * inv, y * inv, z * inv)


def _stack(cs):
    shape = jnp.broadcast_shapes(*(jnp.shape(c) for c in cs))
    return jnp.stack([jnp.broadcast_to(c, shape) for c in cs], -1)


def _norm3(c):
    # safe_norm: zero gradient (not NaN) at zero
    sq = c[0] * c[0] + c[1] * c[1] + c[2] * c[2]
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1)), 0)


def _core_fast(body, x, q, v, omega, wrench, dt, attitude):
    """The step on per-component arrays (primal values): closed-form solve, materialised."""
    dtype = omega[0].dtype
    parts = _model_parts(body)
    rhs = _twist_rhs(parts, v, omega, wrench, dtype)
    dV = _solve_blocks(parts[0], parts[1], parts[2], omega, rhs, dt)
    v1 = tuple(v[i] + dV[i] for i in range(3))
    w1 = tuple(omega[i] + dV[3 + i] for i in range(3))
    x1 = tuple(x[i] + dt * v1[i] for i in range(3))
    w_att = w1 if attitude == "new" else tuple(0.5 * (omega[i] + w1[i]) for i in range(3))
    q1 = _quat_exp_mul(q, tuple(dt * c for c in w_att), get_epsilon(jnp.dtype(dtype)))
    comps = x1 + q1 + v1 + w1
    finite = functools.reduce(jnp.logical_and, [jnp.isfinite(c) for c in comps])
    *comps, n1, finite = _materialize(*comps, _norm3(w1), finite.astype(dtype))
    return tuple(comps[:3]), tuple(comps[3:7]), tuple(comps[7:10]), tuple(comps[10:]), n1, finite > 0


def _inv3_arrays(A):
    """Inverse of (…, 3, 3) by scaled cofactors (rows' cross products), array form."""
    s = jnp.abs(jnp.trace(A, axis1=-2, axis2=-1))[..., None, None] / 3
    A = A / s
    a0, a1, a2 = A[..., 0, :], A[..., 1, :], A[..., 2, :]
    c0, c1, c2 = jnp.cross(a1, a2), jnp.cross(a2, a0), jnp.cross(a0, a1)
    det = jnp.sum(a0 * c0, -1)
    return jnp.stack([c0, c1, c2], -1) / (det[..., None, None] * s)


def _solve_arrays(body, w, rhs, dt):
    """The block elimination of :func:`_solve_blocks` on stacked arrays (no LAPACK call: a
    batched LAPACK custom call inside a vmapped scan can deadlock XLA:CPU's 2-thread pool,
    see benchmarks/README.md)."""
    R = body.resistance
    m_dt = (jnp.asarray(body.mass) / dt)[..., None, None] * jnp.eye(3, dtype=w.dtype)
    A11, A12, A21 = m_dt + R[..., :3, :3], R[..., :3, 3:], R[..., 3:, :3]
    A22 = body.inertia / dt[..., None, None] + R[..., 3:, 3:] - 0.5 * gyroscopic_jacobian(body.inertia, w)
    inv11 = _inv3_arrays(A11)
    P = inv11 @ A12
    y1 = _apply(inv11, rhs[..., :3])
    x2 = _apply(_inv3_arrays(A22 - A21 @ P), rhs[..., 3:] - _apply(A21, y1))
    return jnp.concatenate([y1 - _apply(P, x2), x2], -1)


def _core_reference(body, x, q, v, omega, wrench, dt, attitude):
    """The same step on stacked arrays (used for derivatives only).

    Mathematically identical to :func:`_core_fast`. Its JVP is what ``jax.grad``/``jvp``
    differentiate: differentiating the per-component graph makes XLA:CPU duplicate the
    shared cotangent chains the same way it duplicated the primal ones (reverse mode was
    ~50x the forward cost), while this form transposes into a few batched array ops.
    """
    dtype = omega[0].dtype
    x, q, v, w = _stack(x), _stack(q), _stack(v), _stack(omega)
    gyro = gyroscopic_term(body.inertia, w)
    F = jnp.concatenate([jnp.asarray(body.mass)[..., None] * body.gravity, -gyro], -1)
    if wrench is not None:
        F = F + jnp.asarray(wrench, dtype)
    V = jnp.concatenate([v, w], -1)
    rhs = F - _apply(body.resistance, V)
    V1 = V + _solve_arrays(body, w, rhs, jnp.asarray(dt))
    v1, w1 = V1[..., :3], V1[..., 3:]
    w_att = w1 if attitude == "new" else 0.5 * (w + w1)
    q1 = so3.normalize(so3.multiply(q, so3.exp(jnp.asarray(dt)[..., None] * w_att)))
    x1 = x + jnp.asarray(dt)[..., None] * v1
    finite = jnp.all(jnp.isfinite(V1), -1) & jnp.all(jnp.isfinite(q1), -1) & jnp.all(jnp.isfinite(x1), -1)
    return _comps(x1, 3), _comps(q1, 4), _comps(v1, 3), _comps(w1, 3), so3.safe_norm(w1), finite


@functools.partial(jax.custom_jvp, nondiff_argnums=(7,))
def _core(body, x, q, v, omega, wrench, dt, attitude):
    return _core_fast(body, x, q, v, omega, wrench, dt, attitude)


@_core.defjvp
def _core_jvp(attitude, primals, tangents):
    out = _core_fast(*primals, attitude)
    _, t_out = jax.jvp(lambda *a: _core_reference(*a, attitude), primals, tangents)
    return out, t_out


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
        unchanged with ``Status.NONFINITE``.
    """
    if attitude not in ("new", "midpoint"):
        raise ValueError(f"attitude must be 'new' or 'midpoint'; got {attitude!r}")
    check_step_inputs(body, state, wrench, dt, "midpoint_step")
    dtype = state.angular_velocity.dtype
    dt = jnp.asarray(dt, dtype)
    v = _comps(state.velocity, 3)
    omega = _comps(state.angular_velocity, 3)
    x0, q0 = _comps(state.position, 3), _comps(state.orientation, 4)
    x1, q1, v1, w1, n1, finite = _core(body, x0, q0, v, omega, wrench, dt, attitude)
    n0 = _norm3(omega)
    # a failed step returns its input state unchanged (selected per component, then stacked)

    def sel(new, old):
        return _stack(tuple(jnp.where(finite, a, b) for a, b in zip(new, old)))

    new = eqx.tree_at(
        lambda s: (s.time, s.position, s.orientation, s.velocity, s.angular_velocity),
        state,
        (
            jnp.where(finite, state.time + dt, state.time),
            sel(x1, x0),
            sel(q1, q0),
            sel(v1, v),
            sel(w1, omega),
        ),
    )
    rotation = jnp.where(finite, jnp.maximum(n0, n1) * dt, n0 * dt)
    status = jnp.where(
        finite, jnp.where(rotation > max_rotation, Status.ROTATION_LIMIT, Status.SUCCESS), Status.NONFINITE
    )
    info = make_info(status, jnp.ones_like(status), jnp.zeros_like(rotation), rotation)
    return new, info
