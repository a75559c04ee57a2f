r"""Rigid bodies in Euler-parameter coordinates, stepped by generalized-alpha (seed 002).

Source: ``../shared/seeds/002_102c065acc1d6a6b.txt`` (Exudyn's ``NodeRigidBodyEP`` with
``ObjectRigidBody``); the integrator is the generalized-alpha method for index-3 DAEs of
M. Arnold, O. Brüls, *Convergence of the generalized-alpha scheme for constrained
mechanical systems*, Multibody Syst. Dyn. 18 (2007) 185-202, with the parameters of
J. Chung, G. Hulbert, J. Appl. Mech. 60 (1993) 371-375.

Coordinates (the seed's node, per body ``i`` of ``nb``): reference coordinates
``q_ref = [p_ref (3), psi_ref (4)]`` (a unit quaternion ``[w, x, y, z]``, body to world) and
the 7 coordinates relative to them, ``q = [u (3), psi (4)]``, so that the configuration is
``p = p_ref + u`` (the centre of mass in the WORLD frame, m) and the Euler parameters
``theta = psi_ref + psi``. Velocities are the time derivatives ``q_t = [u_t, theta_t]``.

Equations of motion (``T = m |p_t|^2/2 + omega^T I omega/2`` with ``omega = G theta_t`` in
the BODY frame, ``G = 2 [-e, e0 E - hat(e)]``; the seed's ``4 G^T I G`` with the factor 2
inside ``G``):

.. math::

    m\,\ddot p = f_{world} + m g - (R V)_{1:3} + C_p^T\lambda , \qquad
    G^T I G\,\ddot\theta = G^T\big(\tau - \omega\times I\omega - (R V)_{4:6}\big)
        + C_\theta^T \lambda ,

with ``V = (p_t, G theta_t)`` the twist (``v`` world, ``omega`` body) and ``R`` the body's
resistance (the same as :func:`rigidjax.midpoint_step`). A torque given in the WORLD frame
enters as ``G_world^T tau_world``. ``G^T I G`` is singular along ``theta``: the Euler-parameter
constraint ``theta^T theta - 1 = 0`` (position level, index 3) or ``2 theta^T theta_t = 0``
(velocity level, index 2) closes the system; with ``euler_constraint="none"`` the model must
supply it among its own constraints. Extra holonomic constraints ``c(q_total) = 0``
(:class:`SphericalJoint`, or any JAX function) come with their multipliers.

The quadratic velocity term ``G^T (omega x I omega)`` (Newton-Euler form, as in Exudyn's
``ObjectRigidBody``) equals the Lagrange form ``2 G_t^T I G theta_t`` up to a vector along
``theta`` when ``theta^T theta_t = 0`` (taken up by the Euler-parameter multiplier); it does
not depend on the rate of ``|theta|``.

Two discretisations of the constraints (``ep_step(..., stabilized=...)``):

* ``stabilized=True`` (default): the stabilized index-2 (GGL) generalized-alpha method
  (C. W. Gear, B. Leimkuhler, G. K. Gupta, J. Comput. Appl. Math. 12-13 (1985) 77-90;
  for the alpha methods C. Lunk, B. Simeon, ZAMM 86 (2006) 772-784): the position
  constraints AND their time derivatives ``C q_t = 0`` hold at every step, with an extra
  position correction along the constraint gradients, ``C^T mu`` (one ``mu`` per position
  constraint, solved with the rest). Both ``|theta| = 1`` and
  ``theta^T theta_t = 0`` stay at round-off; the joint velocities are consistent.
* ``stabilized=False``: the plain index-3 form of Arnold & Brüls (positions only). Its
  velocities leave the hidden constraints, and for rotating bodies the rate of
  ``|theta|`` then grows without bound once ``|omega| dt`` reaches about 0.2 rad at
  ``rho_inf >= 0.9`` (measured: a free body spinning at 100 rad/s with dt = 2 ms fails
  after ~300 steps, with either form of the quadratic velocity term; at ``rho_inf = 0.5``
  it stays bounded). Kept for comparison with index-3 codes.

Each step solves the generalized-alpha equations for the new accelerations, all
multipliers (and ``mu``) by Newton's method (full Jacobian by forward-mode AD, LU with partial pivoting by
:mod:`rigidjax.linalg`: no LAPACK call, see there why). Each iteration is a Newton update
followed by a simplified-Newton update with the same LU factors (Shamanskii's method, as
:mod:`rigidjax.variational`; Exudyn's modified Newton likewise reuses its Jacobian): cubic
convergence per iteration matrix, and the convergence test measures the error the Newton
update left, so a step from the previous step's accelerations needs one iteration matrix. The solve is wrapped
in :func:`jax.lax.custom_root` (through ``rigidjax.numerics.custom_root``), so derivatives of a
step are those of the converged solution (implicit function theorem), never of the truncated
iteration, and no mode differentiates the ``while_loop``, second derivatives (``jax.hessian``,
reverse over reverse) included. Non-convergence, a singular iteration matrix or a
non-finite result return the INPUT state with the failure status (per ensemble member
under ``vmap``).

Output variables with the seed's names are in :func:`output`.
"""

from __future__ import annotations

import functools
from typing import Callable, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import newton, so3
from .numerics import (
    cross, mv,
    check_kinds, is_concrete, materialize, materialize_chunks, partial_jvp, static_zero, static_zeros, sum_nonzero, where_tree,
)
from .body import RigidBody
from .newton import custom_root
from .info import Status, StepInfo, make_info
from .linalg import lu_factor_small, lu_solve_components, lu_solve_small, solve_components, solve_small
from .linalg import singular as linalg_singular

__all__ = [
    "GeneralizedAlpha",
    "generalized_alpha",
    "newmark",
    "SphericalJoint",
    "HolonomicConstraint",
    "EPModel",
    "EPState",
    "initial_state",
    "euler_parameter_rates",
    "rotation_matrix",
    "mass_matrix",
    "generalized_forces",
    "constraint_residual",
    "ep_step",
    "output",
    "OUTPUT_VARIABLES",
    "energy",
]

EulerConstraint = Literal["position", "velocity", "none"]
TorqueFrame = Literal["body", "world"]


# ----------------------------------------------------------------------------- parameters


class GeneralizedAlpha(eqx.Module):
    r"""Parameters of the generalized-alpha method (Chung & Hulbert 1993; Arnold & Brüls 2007).

    The scheme, with ``a`` the algorithmic acceleration and ``h`` the step:

    .. math::

        (1-\alpha_m) a_{n+1} + \alpha_m a_n &= (1-\alpha_f) \ddot q_{n+1} + \alpha_f \ddot q_n,\\
        q_{n+1} &= q_n + h \dot q_n + h^2 (\tfrac12 - \beta) a_n + h^2 \beta a_{n+1},\\
        \dot q_{n+1} &= \dot q_n + h (1-\gamma) a_n + h \gamma a_{n+1}.

    Build with :func:`generalized_alpha` (from the spectral radius at infinity) or
    :func:`newmark`. Fields are Python floats (static).
    """

    alpha_m: float = eqx.field(static=True)
    alpha_f: float = eqx.field(static=True)
    beta: float = eqx.field(static=True)
    gamma: float = eqx.field(static=True)


def generalized_alpha(rho_inf: float = 0.9) -> GeneralizedAlpha:
    r"""Second-order, unconditionally stable parameters with spectral radius ``rho_inf`` at ``h -> inf``.

    ``alpha_m = (2 rho - 1)/(rho + 1)``, ``alpha_f = rho/(rho + 1)``,
    ``gamma = 1/2 - alpha_m + alpha_f``, ``beta = (1 - alpha_m + alpha_f)^2 / 4``.
    ``rho_inf = 1``: no numerical damping; ``rho_inf = 0``: asymptotic annihilation of the
    highest frequencies. Exudyn's default is 0.8-0.9.

    Raises:
        ValueError: ``rho_inf`` outside ``[0, 1]``.
    """
    rho = float(rho_inf)
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho_inf (spectral radius at infinity) must be in [0, 1]; got {rho_inf}")
    am = (2 * rho - 1) / (rho + 1)
    af = rho / (rho + 1)
    return GeneralizedAlpha(am, af, 0.25 * (1 - am + af) ** 2, 0.5 - am + af)


def newmark(beta: float = 0.25, gamma: float = 0.5) -> GeneralizedAlpha:
    """Newmark's method as the special case ``alpha_m = alpha_f = 0`` (default: trapezoidal rule).

    Second order only for ``gamma = 1/2``; ``gamma > 1/2`` damps (first order).

    Raises:
        ValueError: ``beta <= 0`` or ``gamma < 1/2`` (the iteration matrix or stability fails).
    """
    if not float(beta) > 0:
        raise ValueError(f"newmark: beta must be > 0; got {beta}")
    if not float(gamma) >= 0.5:
        raise ValueError(f"newmark: gamma must be >= 1/2 for stability; got {gamma}")
    return GeneralizedAlpha(0.0, 0.0, float(beta), float(gamma))


# ----------------------------------------------------------------------------- constraints


def rotation_matrix(theta: jax.Array) -> jax.Array:
    r"""The seed's rotation matrix (…, 3, 3) of Euler parameters ``theta`` (…, 4), body to world.

    The polynomial formula of seed 002 (``A_00 = 1 - 2 theta_2^2 - 2 theta_3^2``, ...), equal to
    :func:`rigidjax.so3.to_matrix` for unit ``theta`` and smooth for any ``theta`` (it is the
    form the constraint equations differentiate).
    """
    t0, t1, t2, t3 = (theta[..., i] for i in range(4))
    rows = [
        [1 - 2 * t3 * t3 - 2 * t2 * t2, 2 * t2 * t1 - 2 * t3 * t0, 2 * t3 * t1 + 2 * t2 * t0],
        [2 * t3 * t0 + 2 * t2 * t1, 1 - 2 * t3 * t3 - 2 * t1 * t1, 2 * t3 * t2 - 2 * t1 * t0],
        [2 * t3 * t1 - 2 * t2 * t0, 2 * t3 * t2 + 2 * t1 * t0, 1 - 2 * t2 * t2 - 2 * t1 * t1],
    ]
    return jnp.stack([jnp.stack(r, -1) for r in rows], -2)


def _rotate_ep(theta, b):
    """``R(theta) b`` (…, 3) with the seed's matrix, ``R = E + 2 theta0 hat(e) + 2 hat(e)^2`` (no matrix formed)."""
    t0, e = theta[..., :1], theta[..., 1:]
    eb = jnp.cross(e, b)
    return b + 2 * t0 * eb + 2 * jnp.cross(e, eb)


class SphericalJoint(eqx.Module):
    r"""Spherical joint: a point of body ``body_a`` coincides with a point of ``body_b`` or of the ground.

    Constraint (3,), m: ``p_a + R_a point_a - (p_b + R_b point_b)``, or ``- point_b`` (a fixed
    WORLD point) when ``body_b`` is ``None``.

    Args:
        body_a: index of the first body in the model (0-based).
        point_a: (3,) the joint point in body ``a``'s frame relative to its centre of mass, m.
        body_b: index of the second body, or ``None`` for the ground.
        point_b: (3,) the joint point in body ``b``'s frame (relative to its centre of mass), or
            in the WORLD frame for the ground; default zeros.

    The points are JAX arrays (differentiable model parameters).
    """

    body_a: int = eqx.field(static=True)
    point_a: jax.Array
    body_b: int | None = eqx.field(static=True)
    point_b: jax.Array

    def __init__(self, body_a: int, point_a, body_b: int | None = None, point_b=None):
        if not isinstance(body_a, (int, np.integer)) or body_a < 0:
            raise ValueError(f"SphericalJoint: body_a must be a body index >= 0; got {body_a!r}")
        if body_b is not None and (not isinstance(body_b, (int, np.integer)) or body_b < 0 or body_b == body_a):
            raise ValueError(f"SphericalJoint: body_b must be None (ground) or another body index; got {body_b!r}")
        point_a = jnp.asarray(point_a)
        if not jnp.issubdtype(point_a.dtype, jnp.floating):
            point_a = point_a.astype(jnp.result_type(float))
        point_b = jnp.zeros_like(point_a) if point_b is None else jnp.asarray(point_b, point_a.dtype)
        for a, n in ((point_a, "point_a"), (point_b, "point_b")):
            if a.shape != (3,):
                raise ValueError(f"SphericalJoint: {n} must have shape (3,); got {a.shape}")
        self.body_a = int(body_a)
        self.point_a = point_a
        self.body_b = None if body_b is None else int(body_b)
        self.point_b = point_b

    def __call__(self, coordinates_total: jax.Array) -> jax.Array:
        x = coordinates_total
        pa = x[self.body_a, :3] + _rotate_ep(x[self.body_a, 3:], self.point_a)
        if self.body_b is None:
            return pa - self.point_b
        pb = x[self.body_b, :3] + _rotate_ep(x[self.body_b, 3:], self.point_b)
        return pa - pb


class HolonomicConstraint(eqx.Module):
    """Wrap a JAX function ``c(coordinates_total (nb, 7)) -> (m,)`` as a holonomic constraint ``c = 0``.

    ``coordinates_total`` holds, per body, the world position of the centre of mass and the
    Euler parameters (reference plus current coordinates). ``c`` must be twice
    differentiable, scleronomic (no time) and have a constant output size. The function is a
    static field: its identity enters jit's cache key.
    """

    function: Callable = eqx.field(static=True)

    def __call__(self, coordinates_total: jax.Array) -> jax.Array:
        return jnp.reshape(self.function(coordinates_total), (-1,))


# ----------------------------------------------------------------------------- model and state


def _batched_body(body: RigidBody) -> RigidBody:
    """The same bodies with a leading axis ``nb`` (a single body becomes nb = 1)."""
    if body.inertia.ndim == 2:
        return jax.tree_util.tree_map(lambda a: a[None], body)
    if body.inertia.ndim != 3:
        raise ValueError(
            f"EPModel: body must be one RigidBody or a batch of nb bodies (inertia (nb, 3, 3)); got inertia {body.inertia.shape}"
        )
    nb = body.inertia.shape[0]
    return _broadcast_bodies(body, nb)


def _broadcast_bodies(body: RigidBody, nb: int) -> RigidBody:
    # broadcast fields that were given once for all bodies (e.g. one gravity vector)
    return eqx.tree_at(
        lambda b: (b.mass, b.resistance, b.gravity),
        body,
        (
            jnp.broadcast_to(body.mass, (nb,)),
            jnp.broadcast_to(body.resistance, (nb, 6, 6)),
            jnp.broadcast_to(body.gravity, (nb, 3)),
        ),
    )


class EPModel(eqx.Module):
    r"""Rigid bodies on Euler-parameter nodes with holonomic constraints (seed 002).

    Args:
        body: a :class:`rigidjax.RigidBody` or a batch of ``nb`` bodies (mass ``(nb,)``,
            inertia ``(nb, 3, 3)``; gravity/resistance may be given once). Inertia in the body
            frame about the centre of mass; the node's reference point is the centre of mass.
        reference: reference coordinates ``(7,)`` or ``(nb, 7)``: centre-of-mass position in
            the WORLD frame (m) and a unit quaternion ``[w, x, y, z]`` (body to world). Default:
            origin and the identity. (The seed's default of zeros is not a unit quaternion and
            is rejected.)
        constraints: holonomic constraints: :class:`SphericalJoint`, :class:`HolonomicConstraint`
            or plain functions ``c(coordinates_total (nb, 7)) -> (m,)`` (wrapped).
        euler_constraint: ``"position"`` (``theta^T theta - 1 = 0``, index 3, default),
            ``"velocity"`` (``2 theta^T theta_t = 0``, index 2; ``|theta|`` may drift) or
            ``"none"`` (the model's ``constraints`` must fix the norm of every ``theta``).

    Raises:
        ValueError: bad shapes, NaN, a reference quaternion that is not unit, unknown
            ``euler_constraint``.

    Multipliers are ordered: one per body for the Euler-parameter constraint (unless
    ``"none"``), then the outputs of ``constraints`` in order.
    """

    body: RigidBody
    reference: jax.Array
    constraints: tuple
    euler_constraint: str = eqx.field(static=True)

    def __init__(self, body: RigidBody, reference=None, constraints=(), euler_constraint: EulerConstraint = "position"):
        if not isinstance(body, RigidBody):
            raise TypeError(f"EPModel: body must be a rigidjax.RigidBody; got {type(body).__name__}")
        if euler_constraint not in ("position", "velocity", "none"):
            raise ValueError(f"euler_constraint must be 'position', 'velocity' or 'none'; got {euler_constraint!r}")
        body = _batched_body(body)
        nb = body.inertia.shape[0]
        dtype = body.inertia.dtype
        # one dtype, never weakly typed: equal models then hit the same jit cache entry
        body = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), body)
        if reference is None:
            reference = jnp.zeros((nb, 7), dtype).at[:, 3].set(1)
        reference = jnp.asarray(reference, dtype)
        if reference.shape == (7,):
            reference = jnp.broadcast_to(reference, (nb, 7))
        if reference.shape != (nb, 7):
            raise ValueError(f"reference must have shape (7,) or (nb, 7) = ({nb}, 7); got {reference.shape}")
        if is_concrete(reference):
            r = np.asarray(reference)
            if not np.all(np.isfinite(r)):
                raise ValueError(f"reference contains NaN or inf: {r}")
            norm = np.linalg.norm(r[:, 3:], axis=-1)
            tol = float(np.sqrt(np.finfo(r.dtype).eps))
            if np.any(np.abs(norm - 1) > tol):
                raise ValueError(
                    "reference: the reference Euler parameters (entries 3..6) must be a unit quaternion "
                    f"[w, x, y, z], e.g. [1, 0, 0, 0] for no rotation; got |psi_ref| = {norm}. "
                    "(The seed's default of zeros is not a unit quaternion.)"
                )
        cons = []
        for c in tuple(constraints):
            if isinstance(c, eqx.Module):
                cons.append(c)
            elif callable(c):
                cons.append(HolonomicConstraint(c))
            else:
                raise TypeError(f"constraints: expected callables c(coordinates_total) -> (m,); got {type(c).__name__}")
        for c in cons:
            if isinstance(c, SphericalJoint) and max(c.body_a, -1 if c.body_b is None else c.body_b) >= nb:
                raise ValueError(f"SphericalJoint refers to body {max(c.body_a, c.body_b or 0)} but the model has {nb} bodies")
        self.body = body
        self.reference = reference
        self.constraints = tuple(cons)
        self.euler_constraint = euler_constraint

    @property
    def n_bodies(self) -> int:
        return self.reference.shape[0]

    @property
    def n_multipliers(self) -> int:
        """Number of Lagrange multipliers (Euler-parameter constraints, then the model's)."""
        x = jax.ShapeDtypeStruct(self.reference.shape, self.reference.dtype)
        n = sum(int(np.prod(jax.eval_shape(c, x).shape)) for c in self.constraints)
        return n + (0 if self.euler_constraint == "none" else self.n_bodies)


class EPState(eqx.Module):
    """State of an :class:`EPModel` (a pytree; rollouts add a leading time axis, vmap an ensemble axis).

    Attributes:
        time: s, ``()``.
        coordinates: ``(nb, 7)`` displacement (m, WORLD) and change of the Euler parameters,
            relative to the model's reference coordinates (the seed's ``Coordinates``).
        velocities: ``(nb, 7)`` their time derivatives (``Coordinates_t``; m/s and 1/s).
        accelerations: ``(nb, 7)`` second derivatives (``Coordinates_tt``).
        algorithmic_accelerations: ``(nb, 7)`` the generalized-alpha variable ``a``.
        multipliers: ``(n_multipliers,)`` Lagrange multipliers (Euler-parameter constraints,
            then the model's constraints); units of force (N) for position constraints in m.

    Build consistent states with :func:`initial_state`.
    """

    time: jax.Array
    coordinates: jax.Array
    velocities: jax.Array
    accelerations: jax.Array
    algorithmic_accelerations: jax.Array
    multipliers: jax.Array


# ----------------------------------------------------------------------------- dynamics


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
    blocks = jnp.concatenate(
        [jnp.concatenate([mt, z], -1), jnp.concatenate([jnp.swapaxes(z, -1, -2), Mr], -1)], -2
    )
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


def constraint_residual(model: EPModel, coordinates_total, velocities) -> jax.Array:
    """All constraints ``(n_multipliers,)`` in multiplier order: Euler parameters (position or velocity level), then the model's."""
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
    phi = lambda y: _position_constraints(model, y)
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
    return EPState(time=t, coordinates=q, velocities=v, accelerations=qtt, algorithmic_accelerations=qtt, multipliers=lam)


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


# ----------------------------------------------------------------------------- the step


def _default_tol(dtype) -> float:
    return float(np.sqrt(np.finfo(dtype).eps))


def ep_step(
    model: EPModel,
    state: EPState,
    wrench: jax.Array | None,
    dt,
    *,
    scheme: GeneralizedAlpha | None = None,
    torque_frame: TorqueFrame = "body",
    rtol: float | None = None,
    atol: float | None = None,
    max_iterations: int = 10,
    max_rotation: float = 0.5,
    stabilized: bool = True,
) -> tuple[EPState, StepInfo]:
    r"""One generalized-alpha step of the Euler-parameter DAE (seed 002). Pure, jit/vmap/grad-able.

    Args:
        model: :class:`EPModel` (bodies, reference coordinates, constraints).
        state: :class:`EPState` at time ``t`` (from :func:`initial_state` or a previous step).
        wrench: ``(nb, 6)`` (``(6,)`` for one body) held over the step: force in the WORLD frame
            (N), torque about the centre of mass (N m) in ``torque_frame``; ``None`` for zero.
            Gravity and resistance come from ``model.body``.
        dt: step, s (> 0; checked by :func:`rigidjax.rollout` where concrete; a traced
            ``dt <= 0`` or NaN gives ``Status.INVALID_INPUT``, state unchanged).
        scheme: :class:`GeneralizedAlpha` parameters; default ``generalized_alpha(0.9)``.
        torque_frame: ``"body"`` or ``"world"``.
        rtol, atol: Newton stops when an iteration's final (simplified-Newton) increment of
            the new accelerations and of the multipliers is below ``atol + rtol * |value|``
            (max norms, per block); default
            ``sqrt(eps)`` of the dtype (the error after that update is then at round-off). The
            position-correction multipliers (``stabilized=True``) are also accepted once the
            position change they make is below ``8 eps |x|``, the positions' resolution, so
            float32 (and very small ``dt``) converge with the defaults; ``stabilized=False``
            in float32 needs looser tolerances (e.g. ``rtol = atol = 1e-3``). In float64,
            ``1e-14`` can stall at the round-off floor of the constraint rows (scaled by
            ``1 / (beta' h^2)``; measured at dt = 1e-3: ``MAX_ITERATIONS`` after ~80 steps,
            reported, state kept); ``1e-12``-``1e-13`` converge.
        max_iterations: iteration cap (iteration matrices evaluated; each iteration makes a
            Newton and a simplified-Newton update, module docstring).
        max_rotation: rad; ``max_i |omega_i| dt`` above it is flagged ``Status.ROTATION_LIMIT``
            (state advanced; accuracy degrades: the energy error of a heavy top over 10^4
            steps is ~3e-5 at 0.5 rad and ~3e-4 at 1 rad per step with Newmark); ``inf`` disables.
        stabilized: ``True`` for the stabilized index-2 (GGL) form, ``False`` for plain
            index 3 (see the module docstring; index 3 is unstable for fast spins).

    Returns:
        ``(new_state, info)``; ``info.iterations`` Newton iterations, ``info.residual`` the max
        norm of the scaled residual before the final (simplified-Newton) update, which
        removed it to first order (the increment was below tolerance, so the residual at the
        solution is smaller still), ``info.rotation`` ``max |omega| dt``. On
        ``MAX_ITERATIONS``, ``SINGULAR``, ``NONFINITE`` or ``INVALID_INPUT`` the input state is
        returned unchanged.

    Derivatives (``jax.grad``/``jvp`` w.r.t. model, state, wrench, dt) are those of the
    converged solution via the implicit function theorem (:func:`jax.lax.custom_root`).
    One system per call; use ``jax.vmap`` (or ``eqx.filter_vmap``) for ensembles.

    Raises:
        ValueError: ``state.coordinates`` not ``(nb, 7)`` (a batched state: vmap instead),
            a wrench of the wrong shape, an unknown ``torque_frame``, ``max_iterations < 1``.
    """
    if scheme is None:
        scheme = generalized_alpha(0.9)
    if torque_frame not in ("body", "world"):
        raise ValueError(f"torque_frame must be 'body' or 'world'; got {torque_frame!r}")
    if int(max_iterations) < 1:
        raise ValueError(f"max_iterations must be >= 1; got {max_iterations}")
    check_kinds("ep_step", model, EPModel, state, EPState)
    _check_state_shape(model, state)
    dtype = state.coordinates.dtype
    rtol = _default_tol(dtype) if rtol is None else float(rtol)
    atol = _default_tol(dtype) if atol is None else float(atol)
    h = jnp.asarray(dt, dtype)
    am, af, beta, gamma = scheme.alpha_m, scheme.alpha_f, scheme.beta, scheme.gamma
    nb = model.n_bodies
    n = 7 * nb
    nv = _n_ep_velocity(model)
    q0, v0, qtt0, a0, lam0 = (
        state.coordinates,
        state.velocities,
        state.accelerations,
        state.algorithmic_accelerations,
        state.multipliers,
    )
    nc = lam0.shape[0]
    W = _wrench_array(model, wrench, dtype)

    # scale the constraint rows (and the position correction) so the iteration matrix is
    # O(M) independently of h (Arnold & Brüls' scaling)
    beta_p = beta * (1 - af) / (1 - am)
    gamma_p = gamma * (1 - af) / (1 - am)
    npos = nc - nv
    n_mu = npos if stabilized else 0

    def unpack(z):
        qtt1 = z[:n].reshape(nb, 7)
        lam1, mu = z[n : n + nc], z[n + nc :]
        a1 = ((1 - af) * qtt1 + af * qtt0 - am * a0) / (1 - am)
        q1 = q0 + h * v0 + h * h * ((0.5 - beta) * a0 + beta * a1)
        v1 = v0 + h * ((1 - gamma) * a0 + gamma * a1)
        if n_mu:
            # GGL: move the positions along the constraint gradients, C_p(q_hat)^T mu
            _, vjp = jax.vjp(lambda y: _position_constraints(model, y), model.reference + q1)
            q1 = q1 + beta_p * h * h * vjp(mu)[0]
        return qtt1, a1, q1, v1, lam1

    def residual(z):
        qtt1, _, q1, v1, lam1 = unpack(z)
        x1 = model.reference + q1
        dyn = (_dynamics_residual(model, x1, v1, qtt1, W, torque_frame) - _constraint_force(model, x1, lam1)).reshape(-1)
        if stabilized:
            pos = _position_constraints(model, x1) / (beta_p * h * h)
            vel = _velocity_constraints(model, x1, v1) / (gamma_p * h)
            return jnp.concatenate([dyn, pos, vel])
        cons = constraint_residual(model, x1, v1)
        scale = jnp.concatenate(
            [jnp.full((nv,), 1 / (gamma_p * h), dtype), jnp.full((npos,), 1 / (beta_p * h * h), dtype)]
        )
        return jnp.concatenate([dyn, cons * scale])

    eps = jnp.finfo(dtype).eps

    def update(f, z):
        r, lin = jax.linearize(f, z)
        J = jax.vmap(lin, out_axes=1)(jnp.eye(z.shape[0], dtype=z.dtype))
        # no LAPACK custom call (rigidjax.linalg: XLA:CPU deadlock of batched calls)
        lu, pivots = lu_factor_small(J)
        z1 = z - lu_solve_small(lu, r)
        # a simplified-Newton update with the same factors (Shamanskii): cubic convergence
        # per iteration matrix, and the tests below measure the error left by the Newton update
        r = f(z1)
        d = lu_solve_small(lu, r)
        z1 = z1 - d
        small_a = jnp.max(jnp.abs(d[:n])) <= atol + rtol * jnp.max(jnp.abs(z1[:n]))
        dl, zl = d[n : n + nc], z1[n : n + nc]
        small_l = jnp.max(jnp.abs(dl), initial=0.0) <= atol + rtol * jnp.max(jnp.abs(zl), initial=0.0)
        # mu is O(h^3): its increment is compared with the accelerations' scale, or accepted
        # once the position correction it makes, beta_p h^2 |d_mu| (constraint gradients
        # O(1)), is below the resolution of the positions: the position rows are evaluated
        # to ~eps |x| only, so in float32 (or at tiny h) the iteration cannot reduce d_mu
        # below ~eps |x| / (beta_p h^2) and would otherwise stall (MAX_ITERATIONS)
        d_mu = jnp.max(jnp.abs(d[n + nc :]), initial=0.0)
        x_scale = jnp.maximum(1.0, jnp.max(jnp.abs(model.reference + unpack(z1)[2])))
        small_l &= (d_mu <= atol + rtol * jnp.max(jnp.abs(z1[:n]))) | (beta_p * h * h * d_mu <= 8 * eps * x_scale)
        # a zero pivot relative to the largest: the iteration matrix is singular
        return newton.Update(
            z1, small_a & small_l, linalg_singular(pivots), ~jnp.all(jnp.isfinite(z1)), jnp.max(jnp.abs(r))
        )

    z0 = jnp.concatenate([qtt0.reshape(-1), lam0, jnp.zeros((n_mu,), dtype)])
    z, (iterations, status, res) = newton.solve(
        residual, z0, update, newton.dense_tangent_solve, max_iterations=max_iterations
    )
    qtt1, a1, q1, v1, lam1 = unpack(z)
    new = EPState(
        time=state.time + h,
        coordinates=q1,
        velocities=v1,
        accelerations=qtt1,
        algorithmic_accelerations=a1,
        multipliers=lam1,
    )
    finite = jnp.all(jnp.isfinite(z)) & jnp.all(jnp.isfinite(q1)) & jnp.all(jnp.isfinite(v1))
    status = jnp.where((status == Status.SUCCESS) & ~finite, Status.NONFINITE, status)
    status = jnp.where((h > 0) & jnp.isfinite(h), status, Status.INVALID_INPUT)  # a traced dt out of range
    ok = status == Status.SUCCESS
    new = where_tree(ok, new, state)

    def omega_max(q, v):
        x = model.reference + q
        w = jnp.einsum("bij,bj->bi", so3.g_matrix_body(x[:, 3:]), v[:, 3:])
        return jnp.max(so3.safe_norm(w))

    rotation = jnp.maximum(omega_max(q0, v0), omega_max(new.coordinates, new.velocities)) * h
    status = jnp.where(ok & (rotation > max_rotation), Status.ROTATION_LIMIT, status)
    info = make_info(status, iterations, res, rotation)
    return new, info


# ----------------------------------------------------------------------------- outputs

OUTPUT_VARIABLES = (
    "Position",
    "Displacement",
    "Velocity",
    "Acceleration",
    "Coordinates",
    "CoordinatesTotal",
    "Coordinates_t",
    "Coordinates_tt",
    "RotationMatrix",
    "Rotation",
    "AngularVelocity",
    "AngularVelocityLocal",
    "AngularAcceleration",
)


def output(model: EPModel, states: EPState, variable: str) -> jax.Array:
    r"""The seed's node output variable for every body, shape ``(…, nb, k)``.

    ``states`` may be one :class:`EPState` or stacked (``Trajectory.states``, ensembles): the
    leading axes are kept. Variables (frames as in seed 002):

    * ``Position`` (3) centre of mass, WORLD, m: ``p_ref + u``; ``Displacement`` (3) ``u``;
      ``Velocity`` (3) m/s and ``Acceleration`` (3) m/s^2, WORLD.
    * ``Coordinates`` / ``Coordinates_t`` / ``Coordinates_tt`` (7): ``q``, ``q_t``, ``q_tt``;
      ``CoordinatesTotal`` (7): ``q_ref + q``.
    * ``RotationMatrix`` (9): body-to-world matrix, row-major (seed's polynomial formula).
    * ``Rotation`` (3): Tait-Bryan angles xyz, rad, ``R = R_x(phi0) R_y(phi1) R_z(phi2)``
      (:func:`rigidjax.so3.to_tait_bryan_xyz` of the normalised Euler parameters; finite at
      gimbal lock).
    * ``AngularVelocity`` (3) WORLD ``G_world theta_t``; ``AngularVelocityLocal`` (3) BODY
      ``G_body theta_t``, rad/s; ``AngularAcceleration`` (3) WORLD ``G_world theta_tt``
      (``G_t theta_t = 0``), rad/s^2.

    Raises:
        ValueError: an unknown variable name.
    """
    if variable not in OUTPUT_VARIABLES:
        raise ValueError(f"unknown output variable {variable!r}; choose from {OUTPUT_VARIABLES}")
    ref = model.reference
    q = states.coordinates
    x = ref + q
    theta = x[..., 3:]
    if variable == "Position":
        return x[..., :3]
    if variable == "Displacement":
        return q[..., :3]
    if variable == "Velocity":
        return states.velocities[..., :3]
    if variable == "Acceleration":
        return states.accelerations[..., :3]
    if variable == "Coordinates":
        return q
    if variable == "CoordinatesTotal":
        return x
    if variable == "Coordinates_t":
        return states.velocities
    if variable == "Coordinates_tt":
        return states.accelerations
    if variable == "RotationMatrix":
        R = rotation_matrix(theta)
        return R.reshape(*R.shape[:-2], 9)
    if variable == "Rotation":
        return so3.to_tait_bryan_xyz(theta / so3.safe_norm(theta, keepdims=True))
    if variable == "AngularVelocity":
        return jnp.einsum("...ij,...j->...i", so3.g_matrix_world(theta), states.velocities[..., 3:])
    if variable == "AngularVelocityLocal":
        return jnp.einsum("...ij,...j->...i", so3.g_matrix_body(theta), states.velocities[..., 3:])
    # AngularAcceleration
    return jnp.einsum("...ij,...j->...i", so3.g_matrix_world(theta), states.accelerations[..., 3:])


# ----------------------------------------------------------------------------- packed form
# rollout's fast path for models of free bodies (no constraints but the Euler-parameter one):
# the same step as ep_step, iterate for iterate, with every coordinate its own array over the
# bodies/ensemble (structure of arrays) and the Newton matrix assembled entry by entry.


class EPCarry(eqx.Module):
    """:class:`EPState` split into per-coordinate arrays (structure of arrays).

    The form in which :func:`rigidjax.rollout` carries an Euler-parameter rollout of free
    bodies: ``coordinates``, ``velocities``, ``accelerations`` and
    ``algorithmic_accelerations`` are tuples of 7 arrays of shape ``(..., nb)``,
    ``multipliers`` one array ``(..., nb)``; for one body (``nb = 1``) the body axis is
    dropped, so an ensemble's components are flat ``(N,)`` arrays (XLA:CPU vectorises the
    innermost axis: a trailing axis of length 1 left every loop scalar). Internal; see
    :func:`packed_form`.
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
    model: EPModel, carry: EPCarry, wrench, dt, active, *, scheme, torque_frame, rtol, atol,
    max_iterations, max_rotation, stabilized,
):
    """:func:`ep_step` on an :class:`EPCarry` of free bodies; members where ``active`` is False
    keep their input state. Returns ``(carry, info)``."""
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
    bexp = (lambda a: a) if one else (lambda a: a[..., None])  # per-system -> per-body

    body = model.body
    m = b_(body.mass)
    # entries known to vanish (a model held fixed: diagonal inertia, no resistance or no
    # coupling, no gravity) are structural zeros: their terms are never traced, and the Newton
    # matrix keeps the zeros they leave for the elimination to skip
    entries = lambda a: jax.tree_util.tree_map(lambda e: e if static_zero(e) else b_(e), static_zeros(a))  # noqa: E731
    J, Rm, g = entries(body.inertia), entries(body.resistance), entries(body.gravity)
    ref = tuple(b_(model.reference[:, i]) for i in range(7))
    W = _wrench_array(model, wrench, dtype)
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
        """The rows of ep_step's residual for one body (dynamics, then the scaled constraints)."""
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

    def newton(f, z0):
        def cond(c):
            it, _, done, status, _ = c
            return (it < max_iterations) & ~done & (status == Status.SUCCESS)

        def body_fn(c):
            it, z, _, _, _ = c
            r, A = newton_matrix(z)
            # translation first, pivoting within its block (m I + c_v R_vv: well conditioned)
            d, piv, lu = solve_components(A, list(r), materialize_b=True, factors=True, leading=3)
            d = materialize(*d)  # one loop for the back substitution (else one per consumer)
            z1 = tuple(zi - di for zi, di in zip(z, d))
            # the simplified-Newton update with the same factors (ep_step's newton)
            r = materialize(*full(z1))
            d = materialize(*lu_solve_components(lu, list(r)))
            z1 = tuple(zi - di for zi, di in zip(z1, d))
            pivots = jnp.stack(piv, -1)  # (..., [nb,] n): the system's pivots, as ep_step's one LU
            sing = linalg_singular(pivots if one else pivots.reshape(*pivots.shape[:-2], -1))
            nonfinite = bmax(~jnp.all(jnp.isfinite(jnp.stack(z1, -1)), -1))
            small_a = amax(d[:7]) <= atol + rtol * amax(z1[:7])
            small_l = amax(d[7:8]) <= atol + rtol * amax(z1[7:8])
            if with_mu:
                d_mu = amax(d[8:9])
                th_hat, th, _, _ = configuration(z1)
                xs = [ref[i] + q_pred[i] + c_q * z1[i] for i in range(3)] + list(th)
                x_scale = jnp.maximum(1.0, amax(xs))
                small_l &= (d_mu <= atol + rtol * amax(z1[:7])) | (beta_p * h * h * d_mu <= 8 * eps * x_scale)
            status = jnp.where(sing, Status.SINGULAR, jnp.where(nonfinite, Status.NONFINITE, Status.SUCCESS))
            status = status.astype(jnp.int32)
            done = small_a & small_l & (status == Status.SUCCESS)
            keep = status == Status.SUCCESS
            z1 = tuple(jnp.where(bexp(keep), a, b) for a, b in zip(z1, z))
            return it + 1, z1, done, status, amax(r)

        batch = jnp.shape(z0[0]) if one else jnp.shape(z0[0])[:-1]
        init = (
            jnp.zeros(batch, jnp.int32), z0, ~jnp.broadcast_to(act, batch),
            jnp.full(batch, Status.SUCCESS, jnp.int32), jnp.full(batch, jnp.inf, dtype),
        )
        it, z, done, status, res = jax.lax.while_loop(cond, body_fn, init)
        status = jnp.where(done, Status.SUCCESS, jnp.where(status == Status.SUCCESS, Status.MAX_ITERATIONS, status))
        return z, (it.astype(dtype), status.astype(dtype), res)

    def tangent_solve(g, y):
        # the Jacobian is block diagonal over the bodies: one column per unknown for all at once
        ones = jnp.ones_like(y[0])
        cols = [g(tuple(ones if k == c else jnp.zeros_like(ones) for k in range(n_unknowns))) for c in range(n_unknowns)]
        # array form here: differentiation only, and it compiles ~2x faster when transposed
        A = jnp.stack([jnp.stack(col, -1) for col in cols], -1)  # (..., [nb,] n, n)
        x = solve_small(A, jnp.stack(y, -1))
        return tuple(x[..., k] for k in range(n_unknowns))

    z0 = (*qtt0, lam0) + ((jnp.zeros_like(lam0),) if with_mu else ())
    z, aux = custom_root(full, z0, newton, tangent_solve)
    aux = jax.lax.stop_gradient(aux)
    iterations, status, res = aux[0].astype(jnp.int32), aux[1].astype(jnp.int32), aux[2]

    qtt1 = z[:7]
    a1 = tuple(c_a * qtt1[k] + base[k] for k in range(7))
    q1 = [q_pred[k] + c_q * qtt1[k] for k in range(7)]
    if with_mu:
        for j in range(4):
            q1[3 + j] = q1[3 + j] + k_mu * z[8] * (ref[3 + j] + q1[3 + j])
    v1 = tuple(v_pred[k] + c_v * qtt1[k] for k in range(7))

    def omega_max(q, v):
        w = so3.g_body_apply(tuple(ref[3 + j] + q[3 + j] for j in range(4)), v[3:])
        sq = w[0] * w[0] + w[1] * w[1] + w[2] * w[2]
        pos = sq > 0
        return bmax(jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1)), 0))

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
    status = jnp.where((status == Status.SUCCESS) & ~finite, Status.NONFINITE, status)
    status = jnp.where(dt_ok, status, Status.INVALID_INPUT)
    ok = (status == Status.SUCCESS) & act
    if not one:
        new = where_tree(ok, new, carry)
        rotation = jnp.maximum(omega_max(q0, v0), omega_max(new.coordinates, new.velocities)) * h
    status = jnp.where(ok & (rotation > max_rotation), Status.ROTATION_LIMIT, status)
    return new, make_info(status, iterations, res, rotation)


def _check_state_shape(model: EPModel, state: EPState):
    want = (model.n_bodies, 7)
    if tuple(state.coordinates.shape) != want:
        raise ValueError(
            f"ep_step: state.coordinates must have shape (nb, 7) = {want} (one system); got "
            f"{tuple(state.coordinates.shape)}. Ensembles: jax.vmap over the states "
            "(rigidjax.ensemble.ensemble_rollout)"
        )


def _check_packed(model, state, wrench, dt, torque_frame):
    _check_state_shape(model, state)
    _wrench_array(model, wrench, state.coordinates.dtype)


def packed_form(step, model):
    """The structure-of-arrays form of ``step`` for :func:`rigidjax.rollout` if ``step`` is
    :func:`ep_step` (optionally bound with keyword options through ``functools.partial``) and
    ``model`` an :class:`EPModel` of free bodies (no constraints besides the Euler-parameter one,
    ``euler_constraint`` ``"position"`` or ``"velocity"``), else ``None``.

    The packed step is :func:`ep_step` iterate for iterate (same residual, scaling, Newton
    matrix, convergence tests, status codes; round-off apart), with each coordinate its own
    array and the Newton matrix assembled and eliminated entry by entry
    (:func:`rigidjax.linalg.solve_components`), which XLA:CPU runs as a few vectorised loops.

    A model held fixed in the rollout (a constant of the compiled program) has its zero
    entries (off-diagonal inertia, resistance, translation-rotation coupling, gravity) as
    structural zeros: their terms are never traced and the Newton matrix keeps exact zeros
    that the elimination skips (no coupling: a 3 x 3 and a 6 x 6 elimination instead of one
    9 x 9; measured 2x the throughput at N = 4096). A traced model (a fit) gets the dense
    path. The elimination takes the translation unknowns first, pivoting within their block
    (``m I`` plus damping; ``leading=3``), then the rest through its Schur complement, so the
    singularity test reads that elimination's pivots: a translation block made singular by an
    unphysical (negative) damping reports ``SINGULAR``.
    """
    from .stepper import PackedStep, unwrap_partial

    step, kwargs = unwrap_partial(step)
    if step is not ep_step or not isinstance(model, EPModel):
        return None
    if model.constraints or model.euler_constraint not in ("position", "velocity"):
        return None
    options = dict(
        scheme=generalized_alpha(0.9), torque_frame="body", rtol=None, atol=None, max_iterations=10,
        max_rotation=0.5, stabilized=True,
    )
    if not set(kwargs) <= set(options):
        return None
    options.update(kwargs)
    if options["scheme"] is None:
        options["scheme"] = generalized_alpha(0.9)
    if options["torque_frame"] not in ("body", "world"):
        raise ValueError(f"torque_frame must be 'body' or 'world'; got {options['torque_frame']!r}")
    if int(options["max_iterations"]) < 1:
        raise ValueError(f"max_iterations must be >= 1; got {options['max_iterations']}")
    return PackedStep(
        pack=_pack_ep,
        unpack=_unpack_ep,
        step=functools.partial(_packed_ep_step, **options),
        check=lambda model, state, wrench, dt: _check_packed(model, state, wrench, dt, options["torque_frame"]),
    )
