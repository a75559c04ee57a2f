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

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import so3
from .numerics import mv, static_zeros, sum_nonzero
from .body import RigidBody, RigidBodyState
from .newton import custom_root
from .variational import MechanicalSystem, VIState, _check_vi_state, generalized_velocity, vi_state

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
    a = jnp.asarray(x)
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.result_type(float))
    if not isinstance(a, jax.core.Tracer):
        v = np.asarray(a)
        if not np.all(np.isfinite(v)):
            raise ValueError(f"{name} contains NaN or inf: {v}")
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
        raise ValueError(f"cart_pendulum: masses and lengths must be (k,) of equal length; got {masses.shape}, {lengths.shape}")
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


class _FreeBodyL(eqx.Module):
    body: RigidBody

    def __call__(self, q, qdot, t):
        x, e = q[:3], q[3:]
        v, edot = qdot[:3], qdot[3:]
        w = so3.g_matrix_body(e) @ edot
        T = 0.5 * self.body.mass * v @ v + 0.5 * w @ (self.body.inertia @ w)
        V = -self.body.mass * self.body.gravity @ x
        return T - V


class _FreeBodyForcing(eqx.Module):
    """Generalized force of the wrench ``u = (force_world, torque_body)`` and of ``-R V``."""

    body: RigidBody

    def __call__(self, q, qdot, u, t):
        e, edot = q[3:], qdot[3:]
        G = so3.g_matrix_body(e)
        twist = jnp.concatenate([qdot[:3], G @ edot])
        wrench = u - self.body.resistance @ twist
        # virtual work: f . dx + tau . (G de)
        return jnp.concatenate([wrench[:3], G.T @ wrench[3:]])


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


def _unit_norm(q):
    e = q[-4:]
    return jnp.atleast_1d(0.5 * (e @ e - 1.0))


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
    """
    if not isinstance(body, RigidBody):
        raise TypeError(f"rigid_body: body must be a rigidjax.RigidBody; got {type(body).__name__}")
    if pivot_to_com is None:
        names = ("x", "y", "z", "qw", "qx", "qy", "qz")
        return MechanicalSystem(
            _FreeBodyL(body), 7, forcing=_FreeBodyForcing(body), constraints=_unit_norm, n_inputs=6, rotation=_quat_rotation, names=names
        )
    c = jnp.asarray(pivot_to_com, body.inertia.dtype)
    if c.shape != (3,):
        raise ValueError(f"rigid_body: pivot_to_com must have shape (3,) (body frame, m); got {c.shape}")
    return MechanicalSystem(
        _TopL(body, c),
        4,
        forcing=_TopForcing(body),
        constraints=_unit_norm,
        n_inputs=3,
        rotation=_quat_rotation,
        names=("qw", "qx", "qy", "qz"),
    )


def _edot(e, omega_body):
    """``e_dot = 1/2 e ⊗ (0, omega_body)``."""
    w0 = jnp.concatenate([jnp.zeros_like(omega_body[..., :1]), omega_body], -1)
    return 0.5 * so3.multiply(e, w0)


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


# --------------------------------------------------------------------------- CLI scenario


# --------------------------------------------------------------------------- packed form
# rollout's fast path for vi_step on a free rigid body (rigid_body(body) without a pivot): the
# same DEL solve, iterate for iterate, with every coordinate its own array over the ensemble
# (structure of arrays) and the DEL residual and its Newton matrix in closed form.


class VICarry(eqx.Module):
    """:class:`rigidjax.variational.VIState` of a free :func:`rigid_body` split into
    per-coordinate arrays (structure of arrays): ``q``, ``p``, ``qdot`` tuples of 7 arrays of
    the batch shape, ``lam`` one array. The form in which :func:`rigidjax.rollout` carries a
    :func:`rigidjax.variational.vi_step` rollout of a free rigid body. Internal; see
    :func:`packed_form`."""

    time: jax.Array
    q: tuple
    p: tuple
    lam: jax.Array
    qdot: tuple


def _pack_vi(state: VIState) -> VICarry:
    _check_vi_state(state)
    split = lambda a: tuple(a[..., i] for i in range(a.shape[-1]))
    return VICarry(time=state.time, q=split(state.q), p=split(state.p), lam=state.lam[..., 0], qdot=split(state.qdot))


def _unpack_vi(carry: VICarry, like) -> VIState:
    stack = lambda c: jnp.stack(c, -1)
    return VIState(time=carry.time, q=stack(carry.q), p=stack(carry.p), lam=carry.lam[..., None], qdot=stack(carry.qdot))


def _free_body_del(body, resistance, q1, p1, u, h, c_minus, c_plus):
    r"""Closed-form pieces of the free body's constrained DEL equation (midpoint rule).

    With ``q_m = (q1 + q2)/2``, ``qd = (q2 - q1)/h``, ``omega = G_b(e_m) ed`` and
    ``G_b(e) ed = -G_b(ed) e`` (``omega`` is bilinear in ``e``, ``e_dot``):
    ``D_{1,2} L_d = h/2 L_q -/+ L_qdot`` with ``L_qdot = (m xd, G_b(e_m)^T I omega)``,
    ``L_q = (m g, -G_b(ed)^T I omega)``; the force impulse ``h f`` with
    ``f = (F - (R V)_v, G_b(e_m)^T (tau - (R V)_omega))``, ``V = (xd, omega)``, split
    ``c_minus h f`` into the residual and ``c_plus h f`` into the new momentum.

    Returns ``residual(em, ed, xd, e2, lam) -> 8 components`` (the dynamic rows of
    ``p1 + D1 L_d + f^- - Dh(q1)^T lam`` and ``h(q2)``) and
    ``momentum(em, ed, xd) -> 7 components`` (``p2 = D2 L_d + f^+``).
    """

    dtype = q1[0].dtype  # the state's precision, as vi_step (the model may be float64)
    m = jnp.asarray(body.mass, dtype)
    # the symmetric part, as autodiff of 1/2 omega.I omega uses: symmetric inertia gradients
    Is = (0.5 * (body.inertia + jnp.swapaxes(body.inertia, -1, -2))).astype(dtype)
    # entries known to vanish (a model held fixed) are structural zeros: terms not traced
    J, R = static_zeros(Is, 0), static_zeros(jnp.asarray(resistance, dtype), 0)
    g = tuple(body.gravity[i].astype(dtype) for i in range(3))
    e1 = q1[3:]

    def parts(em, ed, xd):
        w = so3.g_body_apply(em, ed)
        Iw = mv(J, w)
        tw = (*xd, *w)
        force = tuple(u[i] - sum_nonzero((R[i][j], tw[j]) for j in range(6)) for i in range(6))
        Lv = (*(m * v for v in xd), *so3.g_transpose_apply(em, Iw, 1))
        Lq = (*(m * gi for gi in g), *(-t for t in so3.g_transpose_apply(ed, Iw, 1)))
        f = (*force[:3], *so3.g_transpose_apply(em, force[3:], 1))
        return Lv, Lq, f

    def residual(em, ed, xd, e2, lam):
        Lv, Lq, f = parts(em, ed, xd)
        r = [p1[i] + 0.5 * h * Lq[i] - Lv[i] + c_minus * h * f[i] for i in range(7)]
        for j in range(4):
            r[3 + j] = r[3 + j] - e1[j] * lam
        return (*r, 0.5 * (e2[0] * e2[0] + e2[1] * e2[1] + e2[2] * e2[2] + e2[3] * e2[3] - 1))

    def momentum(em, ed, xd):
        Lv, Lq, f = parts(em, ed, xd)
        return tuple(0.5 * h * Lq[i] + Lv[i] + c_plus * h * f[i] for i in range(7))

    return residual, momentum


def _quat_angle(a, b):
    """Angle (rad) of ``conj(a) ⊗ b`` for 4-component tuples, as :func:`rigidjax.so3.angle_between`."""
    w = a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]
    x = a[0] * b[1] - a[1] * b[0] - (a[2] * b[3] - a[3] * b[2])
    y = a[0] * b[2] - a[2] * b[0] - (a[3] * b[1] - a[1] * b[3])
    z = a[0] * b[3] - a[3] * b[0] - (a[1] * b[2] - a[2] * b[1])
    sq = x * x + y * y + z * z
    pos = sq > 0
    return 2 * jnp.arctan2(jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1)), 0), jnp.abs(w))


def _packed_vi_step(system, carry: VICarry, inputs, dt, active, *, rtol, atol, max_iter, forcing_split, max_rotation):
    """:func:`rigidjax.variational.vi_step` on a :class:`VICarry` of a free rigid body; members
    where ``active`` is False keep their input state. Returns ``(carry, info)``."""
    from .numerics import materialize, materialize_chunks, partial_jvp, static_zero
    from .info import Status, make_info
    from .linalg import lu_solve_components, singular, solve_components, solve_small
    from .variational import _default_tol

    dtype = carry.q[0].dtype
    rtol, atol = _default_tol(dtype, rtol, atol)
    h = jnp.asarray(dt, dtype)
    # as the generic path: mass, inertia, gravity from the Lagrangian, resistance from the forcing
    body = system.lagrangian.body
    u = jnp.zeros((6,), dtype) if inputs is None else jnp.asarray(inputs, dtype)
    u = tuple(u[..., i] for i in range(6))
    # a non-finite wrench fails the step (NONFINITE below); it is replaced by 0 so that no NaN
    # enters the linearisation, whose coefficients reach the shared parameters' gradients
    u_ok = functools.reduce(jnp.logical_and, [jnp.isfinite(c) for c in u])
    u = tuple(jnp.where(u_ok, c, 0) for c in u)
    c_minus, c_plus = (1.0, 0.0) if forcing_split == "left" else (0.5, 0.5)
    q1, p1, lam1, qd1 = carry.q, carry.p, carry.lam, carry.qdot
    residual, momentum = _free_body_del(body, system.forcing.body.resistance, q1, p1, u, h, c_minus, c_plus)

    def midpoint(z):
        em = tuple(0.5 * (q1[3 + j] + z[3 + j]) for j in range(4))
        ed = tuple((z[3 + j] - q1[3 + j]) / h for j in range(4))
        xd = tuple((z[i] - q1[i]) / h for i in range(3))
        return em, ed, xd

    def full(z):
        em, ed, xd = midpoint(z)
        return residual(em, ed, xd, z[3:7], z[7])

    def newton_matrix(z):
        """``F(z)`` and ``dF/dz`` entry by entry: forward derivatives along each unknown through
        only the quantities it moves (so JAX traces no zero tangents)."""
        em, ed, xd = midpoint(z)
        args = [list(em), list(ed), list(xd), list(z[3:7]), z[7]]
        F = residual(*args)

        def column(slots, tangents):
            return partial_jvp(residual, args, slots, tangents, dtype)

        inv_h = 1 / h
        cols = [column([(2, i)], [inv_h]) for i in range(3)]
        cols += [column([(0, j), (1, j), (3, j)], [0.5, inv_h, 1.0]) for j in range(4)]
        zero = jnp.zeros_like(F[0])
        cols.append((0.0,) * 3 + tuple(-q1[3 + j] + zero for j in range(4)) + (0.0,))
        # one set of loops for the whole matrix (XLA would otherwise recompute it in every consumer)
        # column by column: one column's entries share its tangents; structural zeros stay
        ent = [cols[c][r] for c in range(8) for r in range(8)]
        live = [k for k, e in enumerate(ent) if not static_zero(e)]
        flat = materialize_chunks(*F, *(ent[k] for k in live), size=8)
        for k, v in zip(live, flat[8:]):
            ent[k] = v
        return flat[:8], [[ent[8 * c + r] for c in range(8)] for r in range(8)]

    act = jnp.asarray(active) if active is not None else jnp.bool_(True)
    batch = jnp.shape(q1[0])

    def newton(f, z0):
        # vi_step's Newton member by member: x <- x + dx, dx = -J^{-1} F, until every
        # |dx_i| <= atol + rtol |x_i|, a singular pivot, a non-finite iterate or max_iter
        def running(it, z, conv, sing):
            finite = functools.reduce(jnp.logical_and, [jnp.isfinite(c) for c in z])
            return (it < max_iter) & ~conv & ~sing & finite

        def cond(c):
            it, z, conv, sing = c
            return jnp.any(running(it, z, conv, sing))

        def body_fn(c):
            it, z, conv, sing = c
            run = running(it, z, conv, sing)
            r, A = newton_matrix(z)
            # translation first, pivoting within its block ((m/h) I + c R_vv: well conditioned)
            d, piv, lu = solve_components(A, [-x for x in r], materialize_b=True, factors=True, leading=3)
            # one loop for the back substitution and the running flag (else every consumer
            # recomputes them: XLA:CPU fuses producers into each consumer)
            *d, run = materialize(*d, run.astype(dtype))
            run = run > 0.5
            z1 = tuple(zi + di for zi, di in zip(z, d))
            # the simplified-Newton update with the same factors (vi_step's _newton)
            d = materialize(*lu_solve_components(lu, [-x for x in full(z1)]))
            z1 = tuple(zi + di for zi, di in zip(z1, d))
            conv1 = functools.reduce(
                jnp.logical_and, [jnp.abs(di) <= atol + rtol * jnp.abs(zi) for di, zi in zip(d, z1)]
            )
            sing1 = singular(jnp.stack(piv, -1))
            z1 = tuple(jnp.where(run, a, b) for a, b in zip(z1, z))
            return it + run.astype(jnp.int32), z1, jnp.where(run, conv1, conv), jnp.where(run, sing1, sing)

        init = (
            jnp.zeros(batch, jnp.int32), z0,
            jnp.zeros(batch, bool), ~jnp.broadcast_to(act, batch),  # inactive: stopped from the start
        )
        it, z, conv, sing = jax.lax.while_loop(cond, body_fn, init)
        # a member that failed (status set below) keeps a finite point: custom_root linearises
        # there, and a NaN would reach every shared parameter's gradient (0 * NaN)
        nonfinite = ~functools.reduce(jnp.logical_and, [jnp.isfinite(c) for c in z])
        z = materialize(*(jnp.where(sing | nonfinite, b, a) for a, b in zip(z, z0)))  # one loop, not 8
        return z, (it.astype(dtype), conv.astype(dtype), sing.astype(dtype), nonfinite.astype(dtype))

    def tangent_solve(g, y):
        # block diagonal over the members: one column per unknown for all at once
        # (one vmapped evaluation, as jax.jacfwd: eight separate ones compiled ~2x slower in reverse mode)
        eye = jnp.eye(8, dtype=y[0].dtype).reshape((8, 8) + (1,) * jnp.ndim(y[0]))
        rows = jax.vmap(g)(tuple(jnp.broadcast_to(eye[k], (8, *jnp.shape(y[0]))) for k in range(8)))
        A = jnp.stack([jnp.moveaxis(r, 0, -1) for r in rows], -2)  # (..., 8, 8)
        # failed members (non-finite matrix, e.g. a NaN load) get a zero tangent, not NaN
        ok = jnp.all(jnp.isfinite(A), (-2, -1))
        A = jnp.where(ok[..., None, None], A, jnp.eye(8, dtype=A.dtype))
        x = solve_small(A, jnp.where(ok[..., None], jnp.stack(y, -1), 0))
        return tuple(x[..., k] for k in range(8))

    z0 = materialize(*(q1[i] + h * qd1[i] for i in range(7))) + (lam1,)
    z, aux = custom_root(full, z0, newton, tangent_solve)
    aux = jax.lax.stop_gradient(aux)
    iterations = aux[0].astype(jnp.int32)
    converged, sing, nonfinite = aux[1] > 0.5, aux[2] > 0.5, aux[3] > 0.5

    q2 = z[:7]
    em, ed, xd = midpoint(z)
    # the new state in one loop (each select below would otherwise recompute all of it)
    flat = materialize(*momentum(em, ed, xd), *((q2[i] - q1[i]) / h for i in range(7)))
    p2, qd2 = flat[:7], flat[7:]
    new = VICarry(time=carry.time + h, q=q2, p=p2, lam=z[7], qdot=qd2)
    finite = functools.reduce(jnp.logical_and, [jnp.isfinite(c) for c in (*q2, *p2, z[7])]) & ~nonfinite & u_ok
    status = jnp.where(
        sing, Status.SINGULAR, jnp.where(~finite, Status.NONFINITE, jnp.where(converged, Status.SUCCESS, Status.MAX_ITERATIONS))
    )
    status = jnp.where((h > 0) & jnp.isfinite(h), status, Status.INVALID_INPUT)  # a traced dt out of range
    status = jnp.where(act, status, Status.SUCCESS)
    ok = (status == Status.SUCCESS) & act
    ok = materialize(ok.astype(dtype))[0] > 0.5  # once, not inside each of the 22 selects
    res = residual(*midpoint(jax.lax.stop_gradient(z)), jax.lax.stop_gradient(z[3:7]), jax.lax.stop_gradient(z[7]))
    res = jnp.sqrt(sum(x * x for x in res))
    # the rotation of variational._input_rotation: a probe step along the input velocity
    speed = functools.reduce(jnp.maximum, [jnp.abs(v) for v in qd1])
    s = jnp.where(speed * h > 1e-2, 1e-2 / jnp.where(speed > 0, speed, 1), h)
    e1 = q1[3:]
    rot = _quat_angle(e1, tuple(e1[j] + s * qd1[3 + j] for j in range(4))) * (h / s)
    rot = jnp.where(ok, jnp.maximum(rot, _quat_angle(e1, q2[3:])), rot)
    status = jnp.where(ok & (rot > max_rotation), Status.ROTATION_LIMIT, status)
    leaves, treedef = jax.tree_util.tree_flatten(new)
    sel = [jnp.where(ok, a, b) for a, b in zip(leaves, jax.tree_util.tree_leaves(carry))]
    out = jax.tree_util.tree_unflatten(treedef, materialize_chunks(*sel, size=8))  # 3 loops, not 22
    return out, make_info(status, iterations, jax.lax.stop_gradient(res), jax.lax.stop_gradient(rot))


def packed_form(step, system):
    """The structure-of-arrays form of ``step`` for :func:`rigidjax.rollout` if ``step`` is
    :func:`rigidjax.variational.vi_step` (optionally with keyword options bound through
    ``functools.partial``) and ``system`` a free :func:`rigid_body` (no pivot), else ``None``.

    The packed step is :func:`~rigidjax.variational.vi_step` iterate for iterate (same DEL
    residual, Newton updates, convergence test and status codes; round-off apart) with the
    residual, the momentum and the 8x8 Newton matrix written in closed form on per-coordinate
    arrays (:func:`_free_body_del`) and eliminated entry by entry
    (:func:`rigidjax.linalg.solve_components`) instead of ``jax.jacfwd`` of ``jax.grad`` of
    the discrete Lagrangian on ``(..., 7)`` arrays. As there, the inertia enters through its
    symmetric part (symmetric gradients) and the model follows the state's dtype.

    Two savings keep the iterates (round-off apart): a body held fixed in the rollout (a
    constant of the compiled program, not traced) has its zero entries (off-diagonal inertia,
    resistance, translation-rotation coupling) as structural zeros, so their terms are never
    traced and the Newton matrix keeps exact zeros that the elimination skips; and the
    elimination takes the three translation unknowns first, pivoting within their block
    (``(m/h) I`` plus damping; ``leading=3``), then the rest through its Schur complement.
    A traced body (a fit of its parameters) gets the dense path. The singularity test then
    reads that elimination's pivots (not LAPACK's): a translation block made singular by an
    unphysical (negative) damping of order ``m/h`` reports ``SINGULAR``.
    """
    from .stepper import unwrap_partial
    from .stepper import PackedStep
    from .variational import _check_input_batch, _check_split, _split_inputs, vi_step

    step, kwargs = unwrap_partial(step)
    if step is not vi_step or not isinstance(system, MechanicalSystem):
        return None
    if not (
        isinstance(system.lagrangian, _FreeBodyL)
        and isinstance(system.forcing, _FreeBodyForcing)
        and getattr(system.constraints, "fn", None) is _unit_norm
        and system.n_config == 7
        and not system.kinematic
    ):
        return None
    options = dict(rtol=None, atol=None, max_iter=20, forcing_split="left", max_rotation=0.5)
    if not set(kwargs) <= set(options):
        return None
    options.update(kwargs)
    _check_split(options["forcing_split"])
    options["max_rotation"] = float(options["max_rotation"])
    if not options["max_rotation"] > 0:
        raise ValueError(f"vi_step: max_rotation must be > 0 rad (inf disables the check); got {options['max_rotation']}")

    def check(system, state, inputs, dt):
        u, _ = _split_inputs(system, inputs, state.q.dtype)
        _check_input_batch(u, state.q.shape[:-1], "u")

    return PackedStep(
        pack=_pack_vi, unpack=_unpack_vi, step=functools.partial(_packed_vi_step, **options), check=check
    )
