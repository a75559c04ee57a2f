"""The equations of the Euler-parameter DAE: mass matrix, generalized forces, residuals, constraints,
energy and consistent initial states (package docstring: the maths)."""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import so3
from ..linalg import solve_small
from ..numerics import full_precision, is_concrete
from .model import EPModel, EPState, TorqueFrame

__all__ = [
    "euler_parameter_rates",
    "mass_matrix",
    "generalized_forces",
    "constraint_residual",
    "energy",
    "initial_state",
]

# ----------------------------------------------------------------------------- dynamics


@full_precision
def euler_parameter_rates(theta, angular_velocity, frame: Literal["body", "world"] = "body") -> jax.Array:
    r"""``theta_t = G^T omega / 4`` (…, 4) for Euler parameters ``theta`` (…, 4) and ``omega`` (…, 3) rad/s.

    ``frame`` says where ``omega`` is given (``G = so3.g_matrix_body`` or ``g_matrix_world``).
    The result satisfies ``theta^T theta_t = 0`` (Exudyn's ``AngularVelocity2EulerParameters_t``).
    """
    if frame not in ("body", "world"):
        raise ValueError(f"frame must be 'body' or 'world'; got {frame!r}")
    G = so3.g_matrix_body(theta) if frame == "body" else so3.g_matrix_world(theta)
    # G G^T = 4 E and G theta = 0 for unit theta (the factor 2 is inside G)
    return 0.25 * jnp.einsum("...ji,...j->...i", G, angular_velocity)


def _block_diag(blocks):
    nb, k, _ = blocks.shape
    eye = jnp.eye(nb, dtype=blocks.dtype)
    return jnp.einsum("ij,iab->iajb", eye, blocks).reshape(nb * k, nb * k)


@full_precision
def mass_matrix(model: EPModel, coordinates_total: jax.Array) -> jax.Array:
    r"""Mass matrix ``(7 nb, 7 nb)``: per body ``blockdiag(m E3, G^T I G)`` with ``G`` = body G of ``theta``.

    Singular along each ``theta`` (rank ``6 nb``): the Euler-parameter constraint closes it.
    """
    theta = coordinates_total[:, 3:]
    G = so3.g_matrix_body(theta)
    Mr = jnp.einsum("bki,bkl,blj->bij", G, model.body.inertia, G)
    dtype = Mr.dtype
    mt = model.body.mass[:, None, None] * jnp.eye(3, dtype=dtype)
    z = jnp.zeros((model.n_bodies, 3, 4), dtype)
    blocks = jnp.concatenate([jnp.concatenate([mt, z], -1), jnp.concatenate([jnp.swapaxes(z, -1, -2), Mr], -1)], -2)
    return _block_diag(blocks)


def _wrench_array(model: EPModel, wrench, dtype) -> jax.Array:
    nb = model.n_bodies
    if wrench is None:
        return jnp.zeros((nb, 6), dtype)
    w = jnp.asarray(wrench, dtype)
    if w.shape == (6,) and nb == 1:
        return w[None]
    if w.shape != (nb, 6):
        raise ValueError(
            f"wrench must have shape (nb, 6) = ({nb}, 6) (or (6,) for one body); got {w.shape}. Per-member "
            "wrenches of an ensemble: jax.vmap over states and loads together (rigidjax.ensemble.ensemble_rollout)"
        )
    return w


@full_precision
def generalized_forces(
    model: EPModel, coordinates_total, velocities, wrench=None, torque_frame: TorqueFrame = "body"
) -> jax.Array:
    r"""Right-hand side ``(nb, 7)`` of ``M q_tt = Q + C^T lambda``: applied, gravity, resistance, quadratic velocity.

    Args:
        coordinates_total: ``(nb, 7)`` centre-of-mass positions (WORLD, m) and Euler parameters.
        velocities: ``(nb, 7)`` their time derivatives.
        wrench: ``(nb, 6)`` (or ``(6,)`` for one body): force in the WORLD frame (N) and torque
            about the centre of mass (N m) in the frame ``torque_frame``; ``None`` for zero.
        torque_frame: ``"body"`` (projected with ``G_body^T``) or ``"world"`` (``G_world^T``).
    """
    if torque_frame not in ("body", "world"):
        raise ValueError(f"torque_frame must be 'body' or 'world'; got {torque_frame!r}")
    body = model.body
    dtype = coordinates_total.dtype
    theta, theta_t = coordinates_total[:, 3:], velocities[:, 3:]
    W = _wrench_array(model, wrench, dtype)
    Gb = so3.g_matrix_body(theta)
    omega = jnp.einsum("bij,bj->bi", Gb, theta_t)
    Iw = jnp.einsum("bij,bj->bi", body.inertia, omega)
    quad = -jnp.einsum("bji,bj->bi", Gb, jnp.cross(omega, Iw))
    twist = jnp.concatenate([velocities[:, :3], omega], -1)
    res = -jnp.einsum("bij,bj->bi", body.resistance, twist)
    Gtau = so3.g_matrix_body(theta) if torque_frame == "body" else so3.g_matrix_world(theta)
    f = W[:, :3] + body.mass[:, None] * body.gravity + res[:, :3]
    tq = jnp.einsum("bji,bj->bi", Gtau, W[:, 3:]) + jnp.einsum("bji,bj->bi", Gb, res[:, 3:]) + quad
    return jnp.concatenate([f, tq], -1)


def _g_body(theta, x):
    """``G_body(theta) x`` (…, 3) for ``x`` (…, 4), without forming the matrix."""
    e0, e = theta[..., :1], theta[..., 1:]
    return 2 * (-x[..., :1] * e + e0 * x[..., 1:] - jnp.cross(e, x[..., 1:]))


def _g_body_t(theta, y):
    """``G_body(theta)^T y`` (…, 4) for ``y`` (…, 3)."""
    e0, e = theta[..., :1], theta[..., 1:]
    return 2 * jnp.concatenate([-jnp.sum(e * y, -1, keepdims=True), e0 * y + jnp.cross(e, y)], -1)


def _g_world_t(theta, y):
    """``G_world(theta)^T y`` (…, 4) for ``y`` (…, 3)."""
    e0, e = theta[..., :1], theta[..., 1:]
    return 2 * jnp.concatenate([-jnp.sum(e * y, -1, keepdims=True), e0 * y - jnp.cross(e, y)], -1)


def _apply(A, x):
    return jnp.sum(A * x[..., None, :], -1)


def _dynamics_residual(model: EPModel, x, v, qtt, W, torque_frame):
    """``M(x) q_tt - Q(x, v)`` (nb, 7) by G-products (the same equations as mass_matrix and generalized_forces)."""
    body = model.body
    theta, theta_t, theta_tt = x[:, 3:], v[:, 3:], qtt[:, 3:]
    omega = _g_body(theta, theta_t)
    omega_t = _g_body(theta, theta_tt)  # G_t theta_t = 0
    twist = jnp.concatenate([v[:, :3], omega], -1)
    res = -_apply(body.resistance, twist)
    lin = body.mass[:, None] * (qtt[:, :3] - body.gravity) - W[:, :3] - res[:, :3]
    Iw = _apply(body.inertia, omega)
    load = _apply(body.inertia, omega_t) - res[:, 3:]
    if torque_frame == "body":
        rot = _g_body_t(theta, load - W[:, 3:])
    else:
        rot = _g_body_t(theta, load) - _g_world_t(theta, W[:, 3:])
    rot = rot + _g_body_t(theta, jnp.cross(omega, Iw))
    return jnp.concatenate([lin, rot], -1)


def _position_constraints(model: EPModel, x: jax.Array) -> jax.Array:
    parts = []
    if model.euler_constraint == "position":
        parts.append(jnp.sum(x[:, 3:] ** 2, -1) - 1)
    parts += [jnp.reshape(c(x), (-1,)) for c in model.constraints]
    if not parts:
        return jnp.zeros((0,), x.dtype)
    return jnp.concatenate(parts)


def _n_ep_velocity(model: EPModel) -> int:
    return model.n_bodies if model.euler_constraint == "velocity" else 0


def _velocity_constraints(model: EPModel, x, v) -> jax.Array:
    """``C(x) v`` (n_multipliers,): all constraints on the velocity level, in multiplier order."""
    _, cv = jax.jvp(lambda y: _position_constraints(model, y), (x,), (v,))
    if model.euler_constraint == "velocity":
        return jnp.concatenate([2 * jnp.sum(x[:, 3:] * v[:, 3:], -1), cv])
    return cv


@full_precision
def constraint_residual(model: EPModel, coordinates_total, velocities) -> jax.Array:
    """All constraints ``(n_multipliers,)`` in multiplier order: Euler parameters (position or velocity
    level), then the model's."""
    pos = _position_constraints(model, coordinates_total)
    if model.euler_constraint == "velocity":
        vel = 2 * jnp.sum(coordinates_total[:, 3:] * velocities[:, 3:], -1)
        return jnp.concatenate([vel, pos])
    return pos


def _constraint_force(model: EPModel, x, lam):
    """``C^T lambda`` (nb, 7) with ``C`` the Jacobian of the constraints (velocity Jacobian for index 2)."""
    nv = _n_ep_velocity(model)
    lam_v, lam_p = lam[:nv], lam[nv:]
    _, vjp = jax.vjp(lambda y: _position_constraints(model, y), x)
    (force,) = vjp(lam_p)
    if nv:
        force = force.at[:, 3:].add(2 * x[:, 3:] * lam_v[:, None])
    return force


def _constraint_jacobian(model: EPModel, x):
    """``C`` (n_multipliers, 7 nb): derivative of the constraints w.r.t. the velocities."""
    nb = model.n_bodies
    Jp = jax.jacfwd(lambda y: _position_constraints(model, y))(x).reshape(-1, 7 * nb)
    if _n_ep_velocity(model):
        Jv = jnp.zeros((nb, nb, 7), x.dtype)
        Jv = Jv.at[jnp.arange(nb), jnp.arange(nb), 3:].set(2 * x[:, 3:]).reshape(nb, 7 * nb)
        return jnp.concatenate([Jv, Jp], 0)
    return Jp


def _acceleration_bias(model: EPModel, x, v):
    """``-(d/dt C) v`` (n_multipliers,): the right side of the acceleration-level constraints ``C q_tt = bias``."""

    # second directional derivative of the position constraints along v
    def phi(y):
        return _position_constraints(model, y)

    _, hvv = jax.jvp(lambda y: jax.jvp(phi, (y,), (v,))[1], (x,), (v,))
    if model.euler_constraint == "velocity":
        # d/dt (2 theta^T theta_t) = 2 |theta_t|^2 + 2 theta^T theta_tt
        return -jnp.concatenate([2 * jnp.sum(v[:, 3:] ** 2, -1), hvv])
    return -hvv


def _saddle_solve(model: EPModel, x, v, wrench, torque_frame):
    """Accelerations (nb, 7) and multipliers of ``[M C^T; C 0] [q_tt; -lambda] = [Q; bias]`` and its matrix."""
    n = 7 * model.n_bodies
    M = mass_matrix(model, x)
    C = _constraint_jacobian(model, x)
    Q = generalized_forces(model, x, v, wrench, torque_frame).reshape(-1)
    nc = C.shape[0]
    A = jnp.block([[M, C.T], [C, jnp.zeros((nc, nc), x.dtype)]])
    rhs = jnp.concatenate([Q, _acceleration_bias(model, x, v)])
    sol = solve_small(A, rhs)
    return sol[:n].reshape(-1, 7), sol[n:], A


@full_precision
def energy(model: EPModel, states: EPState) -> jax.Array:
    r"""Total mechanical energy (…,), J: ``sum_i m|p_t|^2/2 + omega^T I omega/2 - m g . p`` (gravity potential).

    Works on single states or stacked trajectories (any leading axes).
    """
    x = model.reference + states.coordinates
    v = states.velocities
    omega = jnp.einsum("...ij,...j->...i", so3.g_matrix_body(x[..., 3:]), v[..., 3:])
    b = model.body
    T = 0.5 * b.mass * jnp.sum(v[..., :3] ** 2, -1) + 0.5 * jnp.einsum("...i,...ij,...j->...", omega, b.inertia, omega)
    U = -b.mass * jnp.sum(b.gravity * x[..., :3], -1)
    return jnp.sum(T + U, -1)


# ----------------------------------------------------------------------------- initial state


@full_precision
def initial_state(
    model: EPModel,
    coordinates=None,
    velocities=None,
    *,
    velocity=None,
    angular_velocity=None,
    angular_velocity_frame: Literal["body", "world"] = "body",
    wrench=None,
    torque_frame: TorqueFrame = "body",
    time=0.0,
    atol: float | None = None,
) -> EPState:
    r"""A consistent :class:`EPState`: coordinates, velocities, accelerations and multipliers.

    Args:
        model: the :class:`EPModel`.
        coordinates: ``(nb, 7)`` (or ``(7,)`` for one body) relative to ``model.reference``
            (the seed's ``initialCoordinates``); default zeros (start at the reference).
        velocities: ``(nb, 7)`` time derivatives (``initialVelocities``). Or give instead:
        velocity: ``(nb, 3)`` centre-of-mass velocity, WORLD, m/s, and
        angular_velocity: ``(nb, 3)`` rad/s in ``angular_velocity_frame`` (``"body"`` or
            ``"world"``), turned into ``theta_t = G^T omega / 4``.
        wrench, torque_frame: the load at ``time`` (as in :func:`ep_step`) for the initial
            accelerations.
        time: s.
        atol: tolerance of the consistency checks (default ``sqrt(eps)`` of the dtype, scaled).

    The accelerations and multipliers solve the acceleration-level constraints with the
    equations of motion (consistent initial values of the index-3 DAE); the
    generalized-alpha variable starts as ``a_0 = q_tt(0)``. Jit/grad-able; the checks run
    where values are concrete.

    Raises:
        ValueError: bad shapes or NaN; Euler parameters not unit (position level); constraints
            violated at the initial coordinates; velocities inconsistent with the constraints
            (``theta^T theta_t != 0`` or ``C q_t != 0``); a singular constrained mass matrix
            (e.g. ``euler_constraint="none"`` without a constraint that fixes ``|theta|``).
    """
    nb = model.n_bodies
    dtype = model.reference.dtype

    def as_nb(a, k, name):
        a = jnp.asarray(a, dtype)
        if a.shape == (k,) and nb == 1:
            a = a[None]
        if a.shape != (nb, k):
            raise ValueError(f"{name} must have shape (nb, {k}) = ({nb}, {k}) (or ({k},) for one body); got {a.shape}")
        if is_concrete(a) and not np.all(np.isfinite(np.asarray(a))):
            raise ValueError(f"{name} contains NaN or inf")
        return a

    q = jnp.zeros((nb, 7), dtype) if coordinates is None else as_nb(coordinates, 7, "coordinates")
    x = model.reference + q
    if velocities is not None and (velocity is not None or angular_velocity is not None):
        raise ValueError("initial_state: give either velocities (nb, 7) or velocity/angular_velocity, not both")
    if velocities is not None:
        v = as_nb(velocities, 7, "velocities")
    else:
        lin = jnp.zeros((nb, 3), dtype) if velocity is None else as_nb(velocity, 3, "velocity")
        ang = jnp.zeros((nb, 3), dtype) if angular_velocity is None else as_nb(angular_velocity, 3, "angular_velocity")
        v = jnp.concatenate([lin, euler_parameter_rates(x[:, 3:], ang, angular_velocity_frame)], -1)
    W = _wrench_array(model, wrench, dtype)
    qtt, lam, A, c, C = _initial_core(model, x, v, W, torque_frame)
    if all(is_concrete(a) for a in (x, v, A)):
        _check_initial(model, x, v, A, c, C, atol)
    t = jnp.asarray(time, dtype)
    return EPState(
        time=t, coordinates=q, velocities=v, accelerations=qtt, algorithmic_accelerations=qtt, multipliers=lam
    )


@eqx.filter_jit
def _initial_core(model, x, v, W, torque_frame):
    qtt, y, A = _saddle_solve(model, x, v, W, torque_frame)
    # the saddle system solves for -lambda (C^T lambda is on the right-hand side of M q_tt)
    n = 7 * model.n_bodies
    return qtt, -y, A, _position_constraints(model, x), A[n:, :n]


def _check_initial(model, x, v, A, c, C, atol):
    eps = float(np.finfo(np.asarray(x).dtype).eps)
    tol = float(np.sqrt(eps)) if atol is None else float(atol)
    xn, vn = np.asarray(x), np.asarray(v)
    norm = np.linalg.norm(xn[:, 3:], axis=-1)
    if model.euler_constraint != "none" and np.any(np.abs(norm - 1) > tol):
        raise ValueError(
            f"initial_state: the Euler parameters (reference + coordinates) must be a unit quaternion; |theta| = {norm}"
        )
    if model.euler_constraint != "none":
        dot = np.sum(xn[:, 3:] * vn[:, 3:], -1)
        scale = np.linalg.norm(vn[:, 3:], axis=-1) + 1
        if np.any(np.abs(dot) > tol * scale):
            raise ValueError(
                "initial_state: inconsistent initial velocities: theta^T theta_t must be 0 (|theta| = 1 is kept); "
                f"got theta^T theta_t = {dot}. Use angular_velocity=... (theta_t = G^T omega / 4)."
            )
    c = np.asarray(c)
    if c.size and np.max(np.abs(c)) > tol * (1 + np.max(np.abs(xn))):
        raise ValueError(f"initial_state: the initial coordinates violate the constraints: c(q) = {c}")
    C = np.asarray(C)
    if C.size:
        cv = C @ vn.reshape(-1)
        if np.max(np.abs(cv)) > tol * (1 + np.max(np.abs(C)) * np.max(np.abs(vn))):
            raise ValueError(
                f"initial_state: inconsistent initial velocities: the velocity-level constraints C q_t = {cv} are not 0"
            )
    An = np.asarray(A)
    cond = np.linalg.cond(An)
    # singular to working precision (float64: cond > 4.5e14; float32: cond > 8e5)
    if not np.isfinite(cond) or cond * eps > 0.1:
        raise ValueError(
            "initial_state: singular mass matrix: the constrained system [M C^T; C 0] is singular "
            f"(condition number {cond:.3g}). Each body needs mass > 0, a positive definite inertia and "
            "a constraint fixing |theta| (euler_constraint='position'/'velocity', or one of the model's)."
        )


def _default_tol(dtype) -> float:
    return float(np.sqrt(np.finfo(dtype).eps))


def _check_state_shape(model: EPModel, state: EPState):
    want = (model.n_bodies, 7)
    if tuple(state.coordinates.shape) != want:
        raise ValueError(
            f"ep_step: state.coordinates must have shape (nb, 7) = {want} (one system); got "
            f"{tuple(state.coordinates.shape)}. Ensembles: jax.vmap over the states "
            "(rigidjax.ensemble.ensemble_rollout)"
        )
