"""The Euler-parameter model: integrator parameters, constraints, :class:`EPModel` and :class:`EPState`."""

from __future__ import annotations

from typing import Callable, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..body import RigidBody
from ..numerics import is_concrete

__all__ = [
    "GeneralizedAlpha",
    "generalized_alpha",
    "newmark",
    "rotation_matrix",
    "SphericalJoint",
    "HolonomicConstraint",
    "EPModel",
    "EPState",
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
            "EPModel: body must be one RigidBody or a batch of nb bodies (inertia (nb, 3, 3)); "
            f"got inertia {body.inertia.shape}"
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
                raise ValueError(
                    f"SphericalJoint refers to body {max(c.body_a, c.body_b or 0)} but the model has {nb} bodies"
                )
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
