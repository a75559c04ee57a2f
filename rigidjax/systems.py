r"""Ready-made mechanical systems for the variational integrator (:mod:`rigidjax.variational`).

Every constructor returns a :class:`rigidjax.variational.MechanicalSystem` whose parameters
(masses, lengths, gravity, damping, the :class:`rigidjax.RigidBody`) are array fields of
equinox modules: ``jax.grad`` with respect to the system differentiates in them.

Planar systems use the x axis horizontal and gravity along ``-y``; angles ``theta`` (rad) are
measured from the downward vertical (``theta = pi`` is upright), positive counter-clockwise.

* :func:`pendulum`, :func:`physical_pendulum`, :func:`double_pendulum`,
  :func:`cart_pendulum` (one or more links on a cart; cart driven by a force or prescribed
  as a kinematic variable): planar chains in angle coordinates.
* :func:`point_on_circle`: a point mass held at distance ``r`` from the origin by the
  holonomic constraint ``h = (|x|^2 - r^2)/(2r)`` (a pendulum in Cartesian coordinates;
  ``lambda/dt`` is the rod tension in N).
* :func:`spherical_pendulum`: the same in 3-D.
* :func:`rigid_body`: a free rigid body in quaternion coordinates ``q = (x, e)`` with the
  unit-norm constraint, or a heavy top about a fixed pivot (``q = e``); ``L = T - V`` with
  ``omega_body = G_b(e) e_dot`` (:func:`rigidjax.so3.g_matrix_body`, which includes the
  factor 2), ``T_rot = 1/2 e_dot^T G_b^T I G_b e_dot``.
"""

from __future__ import annotations


import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import so3
from .body import RigidBody, RigidBodyState
from .numerics import as_float, check_finite, full_precision, is_concrete
from .variational import MechanicalSystem, VIState, generalized_velocity, vi_state
from .variational.free_body import FreeBodyForcing, FreeBodyLagrangian, unit_norm_constraint

__all__ = [
    "pendulum",
    "physical_pendulum",
    "double_pendulum",
    "cart_pendulum",
    "point_on_circle",
    "spherical_pendulum",
    "rigid_body",
    "rigid_body_vi_state",
    "rigid_body_state",
    "STANDARD_GRAVITY",
]

#: m/s^2
STANDARD_GRAVITY = 9.80665


def _arr(x, name, positive=True):
    a = as_float(x, name)
    check_finite(a, name)
    if is_concrete(a):
        v = np.asarray(a)
        if positive and np.any(v <= 0):
            raise ValueError(f"{name} must be > 0; got {v}")
        if not positive and np.any(v < 0):
            raise ValueError(f"{name} must be >= 0; got {v}")
    return a


# --------------------------------------------------------------------------- planar pendulums


class _PhysicalPendulumL(eqx.Module):
    inertia: jax.Array  # about the pivot, kg m^2
    moment: jax.Array  # m g d, N m

    def __call__(self, q, qdot, t):
        return 0.5 * self.inertia * qdot[0] ** 2 + self.moment * jnp.cos(q[0])


class _ViscousDamping(eqx.Module):
    """Generalized force ``-c qdot`` (per coordinate) plus ``B u``."""

    damping: jax.Array
    input_matrix: jax.Array | None

    def __call__(self, q, qdot, u, t):
        f = -self.damping * qdot
        if self.input_matrix is not None:
            f = f + self.input_matrix @ u
        return f


class _AngleRotation(eqx.Module):
    """Rotation of one step: the largest change of the angle coordinates ``idx`` (rad)."""

    idx: tuple[int, ...] = eqx.field(static=True)

    def __call__(self, q1, q2):
        i = jnp.asarray(self.idx, jnp.int32)
        return jnp.max(jnp.abs(q2[i] - q1[i]))


def _angle_rotation(idx):
    return _AngleRotation(tuple(int(i) for i in idx))


def physical_pendulum(inertia, mass, distance, gravity=STANDARD_GRAVITY, damping=0.0, *, torque_input: bool = False):
    r"""Physical pendulum about a fixed horizontal axis: ``q = (theta,)``.

    ``L = 1/2 I_p theta_dot^2 + m g d cos(theta)``, generalized force ``-b theta_dot (+ u)``.

    Args:
        inertia: moment of inertia about the pivot axis ``I_p``, kg m^2.
        mass: kg; distance: pivot to centre of mass ``d``, m; gravity: m/s^2 (magnitude).
        damping: viscous coefficient ``b`` >= 0, N m s (torque ``-b theta_dot``).
        torque_input: add one input ``u`` = torque about the pivot, N m.

    Small-amplitude angular frequency ``omega0 = sqrt(m g d / I_p)``.
    """
    I = _arr(inertia, "inertia")
    m, d, g = _arr(mass, "mass"), _arr(distance, "distance"), _arr(gravity, "gravity")
    b = _arr(damping, "damping", positive=False)
    return MechanicalSystem(
        _PhysicalPendulumL(I, m * g * d),
        1,
        forcing=_ViscousDamping(b, jnp.ones((1, 1), I.dtype) if torque_input else None),
        n_inputs=1 if torque_input else 0,
        rotation=_angle_rotation([0]),
        names=("theta",),
    )


def pendulum(length=1.0, mass=1.0, gravity=STANDARD_GRAVITY, damping=0.0, *, torque_input: bool = False):
    r"""Simple pendulum (point mass on a massless rod): ``q = (theta,)``, ``omega0 = sqrt(g / l)``.

    ``length`` m, ``mass`` kg, ``gravity`` m/s^2, ``damping`` N m s; see :func:`physical_pendulum`.
    """
    l, m = _arr(length, "length"), _arr(mass, "mass")
    return physical_pendulum(m * l**2, m, l, gravity, damping, torque_input=torque_input)


class _PlanarChain(eqx.Module):
    """Point masses on a chain of massless rods in the vertical plane, optionally on a cart."""

    masses: jax.Array  # (k,)
    lengths: jax.Array  # (k,)
    cart_mass: jax.Array | None
    gravity: jax.Array

    def positions(self, q):
        if self.cart_mass is not None:
            x0, th = q[0], q[1:]
        else:
            x0, th = jnp.zeros((), q.dtype), q
        x = x0 + jnp.cumsum(self.lengths * jnp.sin(th))
        y = -jnp.cumsum(self.lengths * jnp.cos(th))
        return x, y

    def __call__(self, q, qdot, t):
        (x, y), (vx, vy) = jax.jvp(self.positions, (q,), (qdot,))
        T = 0.5 * jnp.sum(self.masses * (vx**2 + vy**2))
        if self.cart_mass is not None:
            T = T + 0.5 * self.cart_mass * qdot[0] ** 2
        V = self.gravity * jnp.sum(self.masses * y)
        return T - V


def double_pendulum(m1=1.0, m2=1.0, l1=1.0, l2=1.0, gravity=STANDARD_GRAVITY):
    r"""Double pendulum of two point masses, absolute angles ``q = (theta1, theta2)`` (rad).

    ``m1``, ``m2`` kg; ``l1``, ``l2`` m; ``gravity`` m/s^2.
    """
    masses = jnp.stack([_arr(m1, "m1"), _arr(m2, "m2")])
    lengths = jnp.stack([_arr(l1, "l1"), _arr(l2, "l2")])
    return MechanicalSystem(
        _PlanarChain(masses, lengths, None, _arr(gravity, "gravity")),
        2,
        rotation=_angle_rotation([0, 1]),
        names=("theta1", "theta2"),
    )


def cart_pendulum(
    cart_mass=1.0,
    masses=(0.5,),
    lengths=(1.0,),
    gravity=STANDARD_GRAVITY,
    *,
    kinematic_cart: bool = False,
):
    r"""Pendulum chain (``k`` links) on a cart on a horizontal rail: ``q = (x, theta_1..theta_k)``.

    Args:
        cart_mass: kg; masses: ``(k,)`` point masses, kg; lengths: ``(k,)`` rods, m.
        gravity: m/s^2.
        kinematic_cart: if False (cart-pole), the cart position ``x`` is dynamic and the
            input ``u`` (1,) is the horizontal force on the cart, N; if True, ``x`` is a
            kinematic variable (prescribed by ``rho`` each step, trep style) and there are no
            force inputs: ``inputs = (None, rho)``.

    ``k = 1``: pendulum on a cart; ``k = 2`` with ``theta = (pi, pi)``: inverted double pendulum.
    """
    masses = jnp.atleast_1d(_arr(masses, "masses"))
    lengths = jnp.atleast_1d(_arr(lengths, "lengths"))
    if masses.shape != lengths.shape or masses.ndim != 1:
        raise ValueError(
            f"cart_pendulum: masses and lengths must be (k,) of equal length; got {masses.shape}, {lengths.shape}"
        )
    k = masses.shape[0]
    lag = _PlanarChain(masses, lengths, _arr(cart_mass, "cart_mass"), _arr(gravity, "gravity"))
    n = k + 1
    names = ("x",) + tuple(f"theta{i + 1}" for i in range(k))
    if kinematic_cart:
        return MechanicalSystem(lag, n, kinematic=(0,), rotation=_angle_rotation(range(1, n)), names=names)
    Bm = jnp.zeros((n, 1), masses.dtype).at[0, 0].set(1.0)
    return MechanicalSystem(
        lag,
        n,
        forcing=_ViscousDamping(jnp.zeros((n,), masses.dtype), Bm),
        n_inputs=1,
        rotation=_angle_rotation(range(1, n)),
        names=names,
    )


# --------------------------------------------------------------------------- distance constraints


class _PointMassL(eqx.Module):
    mass: jax.Array
    gravity: jax.Array  # magnitude, acts along -(last axis)

    def __call__(self, q, qdot, t):
        return 0.5 * self.mass * qdot @ qdot - self.mass * self.gravity * q[-1]


class _Distance(eqx.Module):
    radius: jax.Array

    def __call__(self, q):
        # (|x|^2 - r^2)/(2r): smooth everywhere, gradient x/r = unit radial vector on the constraint
        return jnp.atleast_1d((q @ q - self.radius**2) / (2 * self.radius))


def _planar_rotation(q1, q2):
    return jnp.abs(jnp.arctan2(q1[0] * q2[1] - q1[1] * q2[0], q1 @ q2))


def _polar_rotation(q1, q2):
    c = jnp.cross(q1, q2)
    return jnp.arctan2(so3.safe_norm(jnp.atleast_1d(c)), q1 @ q2)


def point_on_circle(mass=1.0, radius=1.0, gravity=STANDARD_GRAVITY):
    r"""Point mass in the vertical plane held at distance ``r`` from the origin: ``q = (x, y)``, m.

    Constraint ``h(q) = (x^2 + y^2 - r^2) / (2 r)`` (so ``Dh = x/r``, the unit radial vector
    on the circle); gravity along ``-y``. The constraint force on the mass is
    ``-Dh^T lambda_c``: ``lambda_c = lambda / dt`` (N) is the rod tension
    ``m g cos(theta) + m r theta_dot^2`` with ``theta`` from the downward vertical.
    """
    m, r, g = _arr(mass, "mass"), _arr(radius, "radius"), _arr(gravity, "gravity")

    return MechanicalSystem(_PointMassL(m, g), 2, constraints=_Distance(r), rotation=_planar_rotation, names=("x", "y"))


def spherical_pendulum(mass=1.0, length=1.0, gravity=STANDARD_GRAVITY):
    r"""Spherical pendulum in Cartesian coordinates ``q = (x, y, z)`` (m), ``|q| = l``, gravity along ``-z``.

    The vertical angular momentum ``x p_y - y p_x`` is a discrete momentum map (exactly
    conserved). ``lambda/dt`` is the rod tension, N.
    """
    m, l, g = _arr(mass, "mass"), _arr(length, "length"), _arr(gravity, "gravity")
    return MechanicalSystem(
        _PointMassL(m, g), 3, constraints=_Distance(l), rotation=_polar_rotation, names=("x", "y", "z")
    )


# --------------------------------------------------------------------------- rigid body


class _TopL(eqx.Module):
    body: RigidBody
    com: jax.Array  # pivot -> centre of mass, body frame, m

    def __call__(self, q, qdot, t):
        w = so3.g_matrix_body(q) @ qdot
        c = self.com
        m = self.body.mass
        Ip = self.body.inertia + m * ((c @ c) * jnp.eye(3, dtype=c.dtype) - jnp.outer(c, c))
        # R(e) c written bilinearly so it also holds at the non-unit midpoint quaternion
        com_world = so3.rotate(q, c)
        return 0.5 * w @ (Ip @ w) + m * self.body.gravity @ com_world


class _TopForcing(eqx.Module):
    body: RigidBody

    def __call__(self, q, qdot, u, t):
        G = so3.g_matrix_body(q)
        w = G @ qdot
        tau = u - self.body.resistance[3:, 3:] @ w
        return G.T @ tau


def _quat_rotation(q1, q2):
    return so3.angle(so3.multiply(so3.conjugate(q1[-4:]), q2[-4:]))


def rigid_body(body: RigidBody, pivot_to_com=None) -> MechanicalSystem:
    r"""Rigid body in quaternion (Euler-parameter) coordinates with ``h = (e·e - 1)/2 = 0``.

    Free body (``pivot_to_com=None``): ``q = (x, e)`` (7,), ``x`` the centre of mass in the
    WORLD frame (m), ``e = [w, x, y, z]`` body to world;
    ``L = 1/2 m |x_dot|^2 + 1/2 e_dot^T G_b^T I G_b e_dot + m g · x``. Inputs ``u`` (6,):
    the wrench ``(force_world N, torque_body N m)``; ``body.resistance`` acts as ``-R V`` on
    the twist ``V = (x_dot, G_b e_dot)``; gravity ``body.gravity`` (world).

    Heavy top (``pivot_to_com`` = body-frame vector from the fixed pivot to the centre of
    mass, m): ``q = e`` (4,), inertia about the pivot by the parallel-axis theorem,
    ``V = -m g · R(e) c``. Inputs ``u`` (3,): torque about the pivot, body frame, N m.

    ``G_b^T I G_b`` is singular along ``e``; the unit-norm constraint removes that direction
    (the step's Jacobian is regular on the constraint manifold). The spatial angular momentum
    ``p_e · (1/2 (0, xi) ⊗ e)`` is a discrete momentum map of the free body.

    The free body is made of :mod:`rigidjax.variational.free_body`'s parts, so the rollouts run
    :class:`rigidjax.variational.MidpointVI` on it in structure-of-arrays form
    (:mod:`rigidjax.variational.packed`); a fit of ``body``'s parameters runs there too.
    """
    if not isinstance(body, RigidBody):
        raise TypeError(f"rigid_body: body must be a rigidjax.RigidBody; got {type(body).__name__}")
    if pivot_to_com is None:
        names = ("x", "y", "z", "qw", "qx", "qy", "qz")
        return MechanicalSystem(
            FreeBodyLagrangian(body),
            7,
            forcing=FreeBodyForcing(body),
            constraints=unit_norm_constraint,
            n_inputs=6,
            rotation=_quat_rotation,
            names=names,
        )
    c = jnp.asarray(pivot_to_com, body.inertia.dtype)
    if c.shape != (3,):
        raise ValueError(f"rigid_body: pivot_to_com must have shape (3,) (body frame, m); got {c.shape}")
    return MechanicalSystem(
        _TopL(body, c),
        4,
        forcing=_TopForcing(body),
        constraints=unit_norm_constraint,
        n_inputs=3,
        rotation=_quat_rotation,
        names=("qw", "qx", "qy", "qz"),
    )


def _edot(e, omega_body):
    """``e_dot = 1/2 e ⊗ (0, omega_body)``."""
    w0 = jnp.concatenate([jnp.zeros_like(omega_body[..., :1]), omega_body], -1)
    return 0.5 * so3.multiply(e, w0)


@full_precision
def rigid_body_vi_state(system: MechanicalSystem, state: RigidBodyState, *, check: bool = True) -> VIState:
    """:class:`VIState` of a :func:`rigid_body` system from a :class:`rigidjax.RigidBodyState`.

    Free body: ``q = (position, orientation)``, ``qdot = (velocity, 1/2 e ⊗ (0, omega_body))``;
    heavy top: ``q = orientation`` (position and velocity ignored).
    """
    e = state.orientation
    edot = _edot(e, state.angular_velocity)
    if system.n_config == 7:
        q = jnp.concatenate([state.position, e], -1)
        qdot = jnp.concatenate([state.velocity, edot], -1)
    else:
        q, qdot = e, edot
    return vi_state(system, q, qdot, t=state.time, check=check)


@full_precision
def rigid_body_state(system: MechanicalSystem, state: VIState) -> RigidBodyState:
    """:class:`rigidjax.RigidBodyState` (position, orientation, velocity, body angular velocity) of a VI state.

    Velocities at the node ``t_k`` from the momentum (:func:`rigidjax.variational.generalized_velocity`),
    ``omega_body = G_b(e) e_dot``. The orientation is normalised (it is unit to solver tolerance).
    Works with leading batch/time axes.
    """
    v = generalized_velocity(system, state)
    e = so3.normalize(state.q[..., -4:])
    w = jnp.einsum("...ij,...j->...i", so3.g_matrix_body(e), v[..., -4:])
    if system.n_config == 7:
        pos, vel = state.q[..., :3], v[..., :3]
    else:
        pos = jnp.zeros((*e.shape[:-1], 3), e.dtype)
        vel = pos
    return RigidBodyState(position=pos, orientation=e, velocity=vel, angular_velocity=w, time=state.time)
