r"""SO(3) maths on unit quaternions (Euler parameters).

Convention, used everywhere in rigidjax: a unit quaternion is stored scalar first,
``q = [w, x, y, z]``, and rotates BODY coordinates into WORLD coordinates,
``p_world = R(q) p_body``. Rotation vectors ``phi`` (rad) are axis times angle.
Composition ``q_wb ⊗ exp(phi)`` turns the body by ``phi`` given in the BODY frame.

Every function broadcasts over leading batch axes and follows the input dtype.
Gradients are finite everywhere, including at zero rotation and at a half turn.
Products, rotations, matrices and the exponential come from
`jaxlie <https://github.com/brentyi/jaxlie>`_; what jaxlie lacks (hat/vee with
batch axes, safe angles, Tait-Bryan angles, the G matrices, a logarithm whose derivative
is right at a half turn) is written here.

References: J. Solà, "Quaternion kinematics for the error-state Kalman filter" (2017);
J. Peraire, S. Widnall, MIT 16.07 lecture notes (2009).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxlie
from jaxlie.utils import get_epsilon

from .numerics import full_precision, safe_sqrt

__all__ = [
    "identity",
    "normalize",
    "multiply",
    "conjugate",
    "rotate",
    "to_matrix",
    "from_matrix",
    "exp",
    "log",
    "hat",
    "vee",
    "angle",
    "angle_between",
    "to_tait_bryan_xyz",
    "from_tait_bryan_xyz",
    "g_matrix_world",
    "g_matrix_body",
    "g_body_apply",
    "g_transpose_apply",
    "safe_norm",
    "exp_coefficients",
]


def safe_norm(x: jax.Array, axis: int = -1, keepdims: bool = False) -> jax.Array:
    """Euclidean norm along ``axis`` whose gradient at ``x = 0`` is zero, not NaN."""
    return safe_sqrt(jnp.sum(x * x, axis=axis, keepdims=keepdims))


def exp_coefficients(t2: jax.Array):
    r"""``(c, s, dc, ds)`` of the quaternion exponential ``exp(phi) = (c, s phi)`` as functions
    of ``t2 = |phi|^2`` (rad^2): ``c = cos(|phi|/2)``, ``s = sin(|phi|/2) / |phi|`` and their
    derivatives ``dc/dt2``, ``ds/dt2``.

    Below ``t2 = eps`` (jaxlie's ``get_epsilon`` of the dtype: 1e-10 in float64, 1e-5 in
    float32) each is its Taylor series, as in :func:`jaxlie.SO3.exp`, so values and
    derivatives stay finite at zero rotation. Elementwise on any shape; follows ``t2``'s dtype.
    The per-component and hand-differentiated steps use it; :func:`exp` is jaxlie's own.
    """
    t2 = jnp.asarray(t2)
    taylor = t2 < get_epsilon(jnp.dtype(t2.dtype))
    safe = jnp.where(taylor, jnp.ones_like(t2), t2)
    th = jnp.sqrt(safe)
    c = jnp.where(taylor, 1.0 - t2 / 8.0 + t2 * t2 / 384.0, jnp.cos(0.5 * th))
    s = jnp.where(taylor, 0.5 - t2 / 48.0 + t2 * t2 / 3840.0, jnp.sin(0.5 * th) / th)
    dc = jnp.where(taylor, -1.0 / 8.0 + t2 / 192.0, -0.25 * s)
    ds = jnp.where(taylor, -1.0 / 48.0 + t2 / 1920.0, (0.5 * c - s) / (2 * safe))
    return c, s, dc, ds


def _so3(q: jax.Array) -> jaxlie.SO3:
    return jaxlie.SO3(wxyz=jnp.asarray(q))


def identity(shape: tuple[int, ...] = (), dtype=None) -> jax.Array:
    """Identity quaternion ``[1, 0, 0, 0]`` with batch ``shape``; returns ``(*shape, 4)``."""
    q = jnp.zeros((*shape, 4), dtype=dtype)
    return q.at[..., 0].set(1)


def normalize(q: jax.Array) -> jax.Array:
    """Scale ``q`` (…, 4) to unit norm (projection back onto S^3 after a step)."""
    return q / jnp.linalg.norm(q, axis=-1, keepdims=True)


@full_precision
def multiply(p: jax.Array, q: jax.Array) -> jax.Array:
    """Hamilton product ``p ⊗ q`` of quaternions (…, 4); ``R(p ⊗ q) = R(p) R(q)``."""
    p, q = jnp.broadcast_arrays(jnp.asarray(p), jnp.asarray(q))
    return (_so3(p) @ _so3(q)).wxyz


def conjugate(q: jax.Array) -> jax.Array:
    """Conjugate (the inverse of a unit quaternion), (…, 4)."""
    return _so3(q).inverse().wxyz


@full_precision
def rotate(q: jax.Array, v: jax.Array) -> jax.Array:
    """Rotate vectors ``v`` (…, 3) by ``q`` (…, 4): ``R(q) v``, body to world."""
    q, v = jnp.asarray(q), jnp.asarray(v)
    batch = jnp.broadcast_shapes(q.shape[:-1], v.shape[:-1])
    q = jnp.broadcast_to(q, (*batch, 4))
    v = jnp.broadcast_to(v, (*batch, 3))
    return _so3(q) @ v


@full_precision
def to_matrix(q: jax.Array) -> jax.Array:
    """Rotation matrix (…, 3, 3) of a unit quaternion (…, 4), body to world."""
    return _so3(q).as_matrix()


@full_precision
def from_matrix(R: jax.Array) -> jax.Array:
    """Unit quaternion (…, 4), ``w >= 0``, of a rotation matrix (…, 3, 3)."""
    q = jaxlie.SO3.from_matrix(jnp.asarray(R)).wxyz
    return jnp.where(q[..., :1] < 0, -q, q)


@full_precision
def exp(phi: jax.Array) -> jax.Array:
    """Exponential map: rotation vector ``phi`` (…, 3), rad, to a unit quaternion (…, 4).

    Uses a Taylor expansion near ``phi = 0`` so that value and derivatives are exact there.
    """
    return jaxlie.SO3.exp(jnp.asarray(phi)).wxyz


@full_precision
def log(q: jax.Array) -> jax.Array:
    """Logarithm: unit quaternion (…, 4) to the rotation vector (…, 3), angle in [0, pi].

    ``exp(log(q))`` equals ``q`` up to sign (``q`` and ``-q`` are the same rotation).
    ``log = 2 atan2(|v|, w) v / |v|`` for ``q = [w, v]``, smooth through a half turn
    (``w = 0``) and with its Taylor series ``(2 / w - 2 |v|^2 / (3 w^3)) v`` where ``|v|^2``
    is below the dtype's eps. Written here rather than taken from jaxlie: jaxlie replaces
    the factor by the constant ``pi / |v|`` where ``|w| < eps``, which zeroes its derivative
    at a half turn (``d log(exp(v)) / dv`` at ``v = [pi, 0, 0]`` gave 0 instead of 1 along
    the axis).
    """
    q = jnp.asarray(q)
    # take the shortest arc, so the angle is in [0, pi]
    q = jnp.where(q[..., :1] < 0, -q, q)
    w, v = q[..., 0], q[..., 1:]
    n2 = jnp.sum(v * v, axis=-1)
    small = n2 < jnp.finfo(q.dtype).eps
    n = jnp.sqrt(jnp.where(small, 1.0, n2))  # double where: finite gradients in both branches
    w_s = jnp.where(small, w, 1.0)  # w ~ 1 where |v| is small
    factor = jnp.where(small, 2 / w_s - (2 / 3) * n2 / w_s**3, 2 * jnp.arctan2(n, w) / n)
    return factor[..., None] * v


def hat(w: jax.Array) -> jax.Array:
    """Skew matrix (…, 3, 3) with ``hat(w) @ v == cross(w, v)``."""
    w = jnp.asarray(w)
    z = jnp.zeros_like(w[..., 0])
    x, y, zz = w[..., 0], w[..., 1], w[..., 2]
    return jnp.stack(
        [
            jnp.stack([z, -zz, y], -1),
            jnp.stack([zz, z, -x], -1),
            jnp.stack([-y, x, z], -1),
        ],
        -2,
    )


def vee(W: jax.Array) -> jax.Array:
    """Inverse of :func:`hat`: the vector (…, 3) of the skew part of ``W`` (…, 3, 3)."""
    W = jnp.asarray(W)
    return 0.5 * jnp.stack(
        [W[..., 2, 1] - W[..., 1, 2], W[..., 0, 2] - W[..., 2, 0], W[..., 1, 0] - W[..., 0, 1]],
        -1,
    )


def angle(q: jax.Array) -> jax.Array:
    """Rotation angle (…,), rad, in [0, pi]; gradient finite at 0 and at pi."""
    q = jnp.asarray(q)
    s = safe_norm(q[..., 1:])
    return 2 * jnp.arctan2(s, jnp.abs(q[..., 0]))


@full_precision
def angle_between(p: jax.Array, q: jax.Array) -> jax.Array:
    """Angle (…,), rad, of the relative rotation ``p^-1 ⊗ q``; the attitude error metric."""
    return angle(multiply(conjugate(p), q))


def _safe_atan2(y, x):
    ok = (x != 0) | (y != 0)
    return jnp.where(ok, jnp.arctan2(jnp.where(ok, y, 0), jnp.where(ok, x, 1)), 0)


@full_precision
def to_tait_bryan_xyz(q: jax.Array) -> jax.Array:
    """Tait-Bryan angles (…, 3), rad, xyz sequence: ``R = R_x(phi0) R_y(phi1) R_z(phi2)``.

    At gimbal lock (``|phi1| = pi/2``) ``phi2`` is set to 0 and ``phi0`` takes the whole
    remaining rotation: values and gradients stay finite (no NaN).
    Same definition as Exudyn's ``Rotation`` output variable (seed 002).
    """
    R = to_matrix(q)
    s1 = jnp.clip(R[..., 0, 2], -1, 1)
    c1 = safe_norm(jnp.stack([R[..., 0, 0], R[..., 0, 1]], -1))
    phi1 = jnp.arctan2(s1, c1)
    lock = c1 < 1e3 * jnp.finfo(R.dtype).eps
    # regular case
    phi0 = _safe_atan2(-R[..., 1, 2], R[..., 2, 2])
    phi2 = _safe_atan2(-R[..., 0, 1], R[..., 0, 0])
    # gimbal lock: R[1,0] = sin(phi0 ± phi2), R[1,1] = cos(phi0 ± phi2); put all in phi0
    phi0_lock = _safe_atan2(R[..., 1, 0], R[..., 1, 1])
    phi0 = jnp.where(lock, phi0_lock, phi0)
    phi2 = jnp.where(lock, 0, phi2)
    return jnp.stack([phi0, phi1, phi2], -1)


@full_precision
def from_tait_bryan_xyz(phi: jax.Array) -> jax.Array:
    """Unit quaternion (…, 4) of Tait-Bryan xyz angles (…, 3), see :func:`to_tait_bryan_xyz`."""
    phi = jnp.asarray(phi)
    e = jnp.eye(3, dtype=phi.dtype)
    qx = exp(phi[..., 0:1] * e[0])
    qy = exp(phi[..., 1:2] * e[1])
    qz = exp(phi[..., 2:3] * e[2])
    return multiply(multiply(qx, qy), qz)


def g_matrix_world(q: jax.Array) -> jax.Array:
    r"""``G`` (…, 3, 4) with world angular velocity ``omega_world = G(q) q_dot`` for unit ``q``.

    ``G = 2 [-e, e0 I + hat(e)]`` with ``q = [e0, e]`` (Exudyn's ``^0G``, seed 002).
    """
    q = jnp.asarray(q)
    e0, e = q[..., 0], q[..., 1:]
    I3 = jnp.eye(3, dtype=q.dtype)
    right = e0[..., None, None] * I3 + hat(e)
    return 2 * jnp.concatenate([-e[..., :, None], right], -1)


def g_matrix_body(q: jax.Array) -> jax.Array:
    r"""``G`` (…, 3, 4) with body angular velocity ``omega_body = G(q) q_dot`` for unit ``q``.

    ``G = 2 [-e, e0 I - hat(e)]`` with ``q = [e0, e]`` (Exudyn's ``^bG``, seed 002).
    """
    q = jnp.asarray(q)
    e0, e = q[..., 0], q[..., 1:]
    I3 = jnp.eye(3, dtype=q.dtype)
    right = e0[..., None, None] * I3 - hat(e)
    return 2 * jnp.concatenate([-e[..., :, None], right], -1)


# Per-component forms (each argument a tuple of arrays of one batch shape; what the
# structure-of-arrays steppers use): the products with the G matrices written out.


def g_body_apply(theta, x):
    """``G_body(theta) x`` (3 arrays) for Euler parameters ``theta`` and ``x`` (4 arrays each)."""
    e0, e1, e2, e3 = theta
    x0, x1, x2, x3 = x
    return (
        2 * (-x0 * e1 + e0 * x1 - (e2 * x3 - e3 * x2)),
        2 * (-x0 * e2 + e0 * x2 - (e3 * x1 - e1 * x3)),
        2 * (-x0 * e3 + e0 * x3 - (e1 * x2 - e2 * x1)),
    )


def g_transpose_apply(theta, y, sign):
    """``G_body(theta)^T y`` (``sign = 1``) or ``G_world(theta)^T y`` (``sign = -1``): 4 arrays
    for ``theta`` (4 arrays) and ``y`` (3 arrays)."""
    e0, e1, e2, e3 = theta
    y0, y1, y2 = y
    return (
        -2 * (e1 * y0 + e2 * y1 + e3 * y2),
        2 * (e0 * y0 + sign * (e2 * y2 - e3 * y1)),
        2 * (e0 * y1 + sign * (e3 * y0 - e1 * y2)),
        2 * (e0 * y2 + sign * (e1 * y1 - e2 * y0)),
    )
