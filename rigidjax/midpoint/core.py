"""The midpoint step on per-component arrays (structure of arrays): the primal kernel, its
hand-written JVP, the packed carry and the per-member acceptance and status rules.

Internal to :mod:`rigidjax.midpoint`; :class:`rigidjax.Midpoint` is the public stepper.
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import so3
from ..body import RigidBodyState
from ..info import make_info, rotation_status, step_status
from ..numerics import comps, full_precision, inv3_array, materialize, norm3, stack
from .equations import _model_parts, _solve_blocks, _twist_rhs, _zero_pattern

__all__ = ["MidpointCarry", "pack_state", "unpack_state"]


def _quat_exp_mul(q, phi):
    """``q ⊗ exp(phi)`` and its norm (5 arrays) in tuple form; ``exp`` by :func:`rigidjax.so3.exp_coefficients`."""
    re, im, _, _ = so3.exp_coefficients(phi[0] * phi[0] + phi[1] * phi[1] + phi[2] * phi[2])
    w1, x1, y1, z1 = re, im * phi[0], im * phi[1], im * phi[2]
    w0, x0, y0, z0 = q
    w = w0 * w1 - x0 * x1 - y0 * y1 - z0 * z1
    x = w0 * x1 + x0 * w1 + y0 * z1 - z0 * y1
    y = w0 * y1 - x0 * z1 + y0 * w1 + z0 * x1
    z = w0 * z1 + x0 * y1 - y0 * x1 + z0 * w1
    # materialised with its norm; :func:`_finalize` divides. A fused ``x / sqrt(.)`` would
    # become XLA's rsqrt, which has no vector form in float64 (LLVM leaves the whole loop scalar)
    return materialize(w, x, y, z, jnp.sqrt(w * w + x * x + y * y + z * z))


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
    n0 = norm3(omega)
    rotation = jnp.where(ok, jnp.maximum(n0, norm3(w1)), n0) * dt
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
    q1 = _quat_exp_mul(q, tuple(dt * c for c in w_att))
    t1, x1, q1, v1, w1, rotation, ok = _finalize(t, x, q, v, omega, x1, q1, v1, w1, dt, active)
    # one loop for the acceptance test, the selection and every output component
    *out, ok = materialize(t1, *x1, *q1, *v1, *w1, rotation, ok.astype(dtype))
    return out[0], tuple(out[1:4]), tuple(out[4:8]), tuple(out[8:11]), tuple(out[11:14]), out[14], ok > 0


# Derivatives: a hand-written JVP in array form ((…, 3) vectors, (…, 3, 3) matrices, einsum
# products), linear in the tangents, with every primal factor (the block inverses, the
# rotation factors) computed once and shared by all tangents. Differentiating the
# per-component primal graph instead makes XLA:CPU duplicate the shared cotangent chains
# into every consumer (reverse mode then costs many times the forward); differentiating a
# step written with 6x6 matrices would push full 6x6 matrix tangents through
# broadcast-multiply-sum products, paid per tangent under the fits' ``vmap(jacfwd(rollout))``.


def _amv(A, x):
    return jnp.einsum("...ij,...j->...i", A, x)


def _amm(A, B):
    return jnp.einsum("...ij,...jk->...ik", A, B)


def _ahat(w):
    z = jnp.zeros_like(w[..., 0])
    return jnp.stack(
        [
            jnp.stack([z, -w[..., 2], w[..., 1]], -1),
            jnp.stack([w[..., 2], z, -w[..., 0]], -1),
            jnp.stack([-w[..., 1], w[..., 0], z], -1),
        ],
        -2,
    )


def _step_solver(body, w, dt):
    """``b -> (M/dt + R - K(w)/2)^-1 b`` for (…, 6) right-hand sides, by the block elimination
    of :func:`_solve_blocks` in array form; the factors are built once, for the primal and
    every tangent (no LAPACK call: a batched LAPACK custom call inside a vmapped scan can
    deadlock XLA:CPU's 2-thread pool, see benchmarks/README.md)."""
    R, J = body.resistance, body.inertia
    m_dt = (jnp.asarray(body.mass) / dt)[..., None, None] * jnp.eye(3, dtype=w.dtype)
    A21 = R[..., 3:, :3]
    inv11 = inv3_array(m_dt + R[..., :3, :3])
    P = _amm(inv11, R[..., :3, 3:])
    K = _ahat(_amv(J, w)) - _amm(_ahat(w), J)
    inv_s = inv3_array(J / dt[..., None, None] + R[..., 3:, 3:] - 0.5 * K - _amm(A21, P))

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
    dt, dt_t = jnp.asarray(dt), jnp.asarray(dt_t)
    dt3 = dt[..., None]
    m, J, R, g = jnp.asarray(body.mass)[..., None], body.inertia, body.resistance, body.gravity
    m_t, J_t, R_t, g_t = jnp.asarray(tbody.mass)[..., None], tbody.inertia, tbody.resistance, tbody.gravity
    X, Q, Vl, W = stack(x), stack(q), stack(v), stack(omega)
    X_t, Q_t, W_t = stack(x_t), stack(q_t), stack(w_t)
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
        re, im, dre, dim = so3.exp_coefficients(jnp.sum(phi * phi, -1))
        q1 = _aquat_mul(Q[..., 0], Q[..., 1:], re, im[..., None] * phi)
        return V1, X + dt3 * V1[..., :3], phi, (re, im, dre, dim), q1, jnp.sqrt(jnp.sum(q1 * q1, -1))

    # ``ok``: the acceptance flag of the primal step. A rejected member keeps its old state:
    # its increment is replaced by 0 before the tangent is formed, so no 0 * NaN (e.g. from a
    # NaN wrench) reaches the other members' gradients
    dV = jnp.where(ok[..., None], solve(F - _amv(R, V)), 0)
    V1, x1, phi, (re, im, dre, dim), q1, n = advance(dV)
    # tangent: A d(dV) = d(rhs) - dA dV, with dA = dM/dt - M ddt/dt^2 + dR - dK/2
    Jw_t = _amv(J_t, W) + _amv(J, W_t)
    F_t = jnp.concatenate(jnp.broadcast_arrays(m_t * g + m * g_t, -(jnp.cross(W_t, Jw) + jnp.cross(W, Jw_t))), -1)
    if wrench is not None:
        F_t = F_t + wrench_t
    V_t = jnp.concatenate([stack(v_t), W_t], -1)
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

    p = (t, x, q, v, omega, comps(x1, 3), (*comps(q1, 4), n), comps(V1[..., :3], 3), comps(V1[..., 3:], 3), dt)
    tt = (t_t, x_t, q_t, v_t, w_t, comps(x1_t, 3), (*comps(q1_t, 4), n_t), comps(v1_t, 3), comps(w1_t, 3), dt_t)
    return jax.jvp(finalize, p, tt)


@functools.partial(jax.custom_jvp, nondiff_argnums=(9, 10))
def _core(body, t, x, q, v, omega, wrench, dt, active, attitude, zeros):
    # zeros: the body's zero pattern, found outside (where the body may be concrete; inside
    # custom_jvp it is always traced)
    return _core_fast(body, t, x, q, v, omega, wrench, dt, active, attitude, zeros)


@_core.defjvp
@full_precision  # traced when a caller differentiates an already traced program (grad(jit(...)))
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
    ensemble with no gather/scatter of ``(N, 3)`` rows and no strided reads. Internal:
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
        position=comps(state.position, 3),
        orientation=comps(state.orientation, 4),
        velocity=comps(state.velocity, 3),
        angular_velocity=comps(state.angular_velocity, 3),
    )


def unpack_state(carry: MidpointCarry, like: RigidBodyState) -> RigidBodyState:
    """Stack a :class:`MidpointCarry` (any leading axes) back into ``like``'s pytree type."""
    return eqx.tree_at(
        lambda s: (s.time, s.position, s.orientation, s.velocity, s.angular_velocity),
        like,
        (
            carry.time,
            stack(carry.position),
            stack(carry.orientation),
            stack(carry.velocity),
            stack(carry.angular_velocity),
        ),
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
        body,
        carry.time,
        carry.position,
        carry.orientation,
        carry.velocity,
        carry.angular_velocity,
        wrench,
        dt,
        run,
        attitude,
        _zero_pattern(body),
    )
    status = rotation_status(step_status(finite=ok | ~run, valid=valid), rotation, max_rotation)
    info = make_info(status, jnp.ones_like(status), jnp.zeros_like(rotation), rotation)
    return MidpointCarry(t1, x1, q1, v1, w1), info
