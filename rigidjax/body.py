r"""The rigid-body model and its state pytree.

Conventions (the same in every module):

* orientation: unit quaternion (Euler parameters) ``[w, x, y, z]``, body to world;
* twist ``V = (v, omega)``: ``v`` the centre-of-mass velocity in the WORLD frame (m/s),
  ``omega`` the angular velocity in the BODY frame (rad/s);
* wrench ``F = (f, tau)``: force in the WORLD frame (N), torque about the centre of mass in
  the BODY frame (N m);
* resistance ``R`` (6, 6) acting on the twist, ``F_res = -R V`` (blocks N s/m, N s, N m s);
* inertia in the body frame about the centre of mass (kg m^2).

Validation runs where values are concrete (the API boundary, outside ``jit``); inside
``jit``/``grad`` the fields are tracers and are not inspected (use checked modes).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from . import so3
from .numerics import as_float, check_finite, check_kinds, check_step_dt, full_precision, is_concrete

__all__ = [
    "check_step_inputs",
    "RigidBody",
    "RigidBodyState",
    "check_inertia",
    "inertia_tensor",
    "kinetic_energy",
    "angular_momentum",
    "angular_momentum_body",
    "linear_momentum",
]


def inertia_tensor(inertia) -> jax.Array:
    """Full symmetric tensor (…, 3, 3) from principal moments (…, 3) or a tensor (…, 3, 3)."""
    inertia = jnp.asarray(inertia)
    if inertia.ndim >= 2 and inertia.shape[-2:] == (3, 3):
        return inertia
    if inertia.ndim >= 1 and inertia.shape[-1] == 3:
        return inertia[..., :, None] * jnp.eye(3, dtype=inertia.dtype)
    raise ValueError(
        "inertia must have shape (3,) (principal moments) or (3, 3) (tensor), with optional leading batch axes; "
        f"got {inertia.shape}"
    )


def check_inertia(inertia, name: str = "inertia", rtol: float = 1e-9) -> None:
    """Raise ``ValueError`` unless ``inertia`` (…, 3, 3) is a physical rigid-body inertia tensor.

    Physical means symmetric, positive definite and with principal moments obeying the
    triangle inequality ``I_i + I_j >= I_k`` (equality is a planar lamina, e.g. the thin
    disk ``I3 = I1 + I2``). ``rtol`` relative to the trace absorbs round-off in the
    equality cases. Tracers (inside ``jit``) are not inspected.
    """
    if not is_concrete(inertia):
        return
    J = np.asarray(inertia)
    if np.issubdtype(J.dtype, np.floating):
        # round-off of the stored dtype (float32: ~1e-7) must not reject the equality cases
        rtol = max(rtol, 64 * float(np.finfo(J.dtype).eps))
    J = J.astype(float)
    if not np.all(np.isfinite(J)):
        raise ValueError(f"{name} contains NaN or inf")
    scale = np.abs(np.trace(J, axis1=-2, axis2=-1))[..., None, None] + 1e-300
    if np.any(np.abs(J - np.swapaxes(J, -1, -2)) > rtol * scale * 10):
        raise ValueError(
            f"{name} must be symmetric; got {J.tolist()} (a (…, 3, 3) array is read as tensors; "
            "for the principal moments of exactly 3 bodies pass diagonal tensors, moments[..., None] * jnp.eye(3))"
        )
    moments = np.linalg.eigvalsh(0.5 * (J + np.swapaxes(J, -1, -2)))
    if np.any(moments <= 0):
        raise ValueError(f"{name} must be positive definite; principal moments are {moments.tolist()} kg m^2")
    tr = moments.sum(-1, keepdims=True)
    excess = moments - (tr - moments)  # I_k - (I_i + I_j)
    if np.any(excess > rtol * tr):
        raise ValueError(
            f"{name} violates the triangle inequality I_i + I_j >= I_k (no rigid mass "
            f"distribution has it); principal moments are {moments.tolist()} kg m^2"
        )


class RigidBody(eqx.Module):
    r"""A rigid body: mass, body-frame inertia about the centre of mass, resistance, gravity.

    Args:
        mass: kg, scalar (or batch shape ``(…,)`` for an ensemble of bodies). Must be > 0.
        inertia: kg m^2, principal moments ``(…, 3)`` about the body axes or a full symmetric
            tensor ``(…, 3, 3)`` in the body frame; stored as the full tensor. A trailing
            ``(3, 3)`` is always read as a tensor (so a batch of exactly 3 moment vectors must
            be passed as diagonal tensors ``moments[..., None] * eye(3)``). Must be
            positive definite and obey the triangle inequality.
        resistance: ``(…, 6, 6)`` matrix ``R`` on the twist ``V = (v_world, omega_body)``,
            resisting wrench ``-R V`` (N s/m, N s, N m s); may couple translation and rotation.
            Default zeros. Integrated implicitly by every stepper.
        gravity: ``(…, 3)`` gravitational acceleration in the WORLD frame, m/s^2; adds the
            force ``mass * gravity``. Default zeros (free flight about the centre of mass).

    Raises:
        ValueError: wrong shapes, NaN/inf, ``mass <= 0``, inertia not physical.

    All fields are JAX arrays, so a ``RigidBody`` is a pytree: ``jax.grad`` with respect to
    it gives gradients in mass, inertia, resistance and gravity, and ``jax.vmap`` over a
    batched ``RigidBody`` runs an ensemble of different bodies.
    """

    mass: jax.Array
    inertia: jax.Array
    resistance: jax.Array
    gravity: jax.Array

    def __init__(self, mass, inertia, resistance=None, gravity=None):
        mass = as_float(mass, "mass")
        inertia = inertia_tensor(as_float(inertia, "inertia"))
        if resistance is not None:
            resistance = as_float(resistance, "resistance")
            if resistance.ndim < 2 or resistance.shape[-2:] != (6, 6):
                raise ValueError(f"resistance must have shape (6, 6) (on the twist (v, omega)); got {resistance.shape}")
        if gravity is not None:
            gravity = as_float(gravity, "gravity")
            if gravity.ndim < 1 or gravity.shape[-1:] != (3,):
                raise ValueError(f"gravity must have shape (3,) (world frame, m/s^2); got {gravity.shape}")
        # one float dtype for every field (mixed precision would fail deep inside XLA)
        given = [a for a in (mass, inertia, resistance, gravity) if a is not None]
        dtype = jnp.result_type(*[a.dtype for a in given])
        shapes = {"mass": mass.shape, "inertia": inertia.shape[:-2]}
        if resistance is not None:
            shapes["resistance"] = resistance.shape[:-2]
        if gravity is not None:
            shapes["gravity"] = gravity.shape[:-1]
        try:
            batch = jnp.broadcast_shapes(*shapes.values())
        except ValueError:
            raise ValueError(
                "RigidBody: the ensemble (batch) shapes of the fields do not match: "
                + ", ".join(f"{k} {v}" for k, v in shapes.items())
            ) from None
        if resistance is None:
            resistance = jnp.zeros((6, 6), dtype)
        if gravity is None:
            gravity = jnp.zeros(3, dtype)
        for a, n in ((mass, "mass"), (resistance, "resistance"), (gravity, "gravity")):
            check_finite(a, n)
        if is_concrete(mass) and np.any(np.asarray(mass) <= 0):
            raise ValueError(f"mass must be > 0 kg; got {np.asarray(mass)}")
        check_inertia(inertia)
        self.mass = jnp.broadcast_to(jnp.asarray(mass, dtype), batch)
        self.inertia = jnp.broadcast_to(jnp.asarray(inertia, dtype), (*batch, 3, 3))
        self.resistance = jnp.broadcast_to(jnp.asarray(resistance, dtype), (*batch, 6, 6))
        self.gravity = jnp.broadcast_to(jnp.asarray(gravity, dtype), (*batch, 3))

    @property
    def principal_moments(self) -> jax.Array:
        """Principal moments of inertia (…, 3), ascending, kg m^2."""
        return jnp.linalg.eigvalsh(self.inertia)

    @property
    def mass_matrix(self) -> jax.Array:
        """``M = blockdiag(m I3, I)`` (…, 6, 6) on the twist."""
        m = jnp.asarray(self.mass)[..., None, None] * jnp.eye(3, dtype=self.inertia.dtype)
        z = jnp.zeros_like(m)
        top = jnp.concatenate([m, z], -1)
        bottom = jnp.concatenate([z, self.inertia], -1)
        return jnp.concatenate([top, bottom], -2)


class RigidBodyState(eqx.Module):
    """State of a rigid body (a pytree; add leading axes for ensembles or trajectories).

    Attributes:
        time: s, shape ``(…)``.
        position: centre of mass in the WORLD frame, m, ``(…, 3)``.
        orientation: unit quaternion ``[w, x, y, z]``, body to world, ``(…, 4)``.
        velocity: centre-of-mass velocity in the WORLD frame, m/s, ``(…, 3)``.
        angular_velocity: angular velocity in the BODY frame, rad/s, ``(…, 3)``.

    Raises:
        ValueError: wrong shapes, NaN/inf, or an orientation that is not a unit quaternion
            (|‖q‖ - 1| above ``sqrt(eps)``, checked where values are concrete).
    """

    time: jax.Array
    position: jax.Array
    orientation: jax.Array
    velocity: jax.Array
    angular_velocity: jax.Array

    def __init__(self, position=None, orientation=None, velocity=None, angular_velocity=None, time=None):
        arrays = {
            "position": position,
            "orientation": orientation,
            "velocity": velocity,
            "angular_velocity": angular_velocity,
        }
        given = [jnp.asarray(a) for a in arrays.values() if a is not None]
        dtype = jnp.result_type(*given, float) if given else jnp.result_type(float)
        if not jnp.issubdtype(dtype, jnp.floating):
            dtype = jnp.result_type(float)
        batch = ()
        for name, a in arrays.items():
            if a is not None:
                size = 4 if name == "orientation" else 3
                a = jnp.asarray(a, dtype)
                if a.ndim == 0 or a.shape[-1] != size:
                    raise ValueError(f"{name} must have shape (…, {size}); got {a.shape}")
                try:
                    batch = jnp.broadcast_shapes(batch, a.shape[:-1])
                except ValueError:
                    shapes = {k: jnp.shape(v) for k, v in arrays.items() if v is not None}
                    raise ValueError(
                        "RigidBodyState: the ensemble (batch) shapes of the fields do not match: "
                        + ", ".join(f"{k} {v}" for k, v in shapes.items())
                    ) from None
        position = jnp.zeros((*batch, 3), dtype) if position is None else jnp.asarray(position, dtype)
        velocity = jnp.zeros((*batch, 3), dtype) if velocity is None else jnp.asarray(velocity, dtype)
        angular_velocity = (
            jnp.zeros((*batch, 3), dtype) if angular_velocity is None else jnp.asarray(angular_velocity, dtype)
        )
        orientation = so3.identity(batch, dtype) if orientation is None else jnp.asarray(orientation, dtype)
        time = jnp.zeros(batch, dtype) if time is None else jnp.asarray(time, dtype)
        for a, n in (
            (position, "position"),
            (orientation, "orientation"),
            (velocity, "velocity"),
            (angular_velocity, "angular_velocity"),
            (time, "time"),
        ):
            check_finite(a, n)
        if is_concrete(orientation):
            norm = np.linalg.norm(np.asarray(orientation), axis=-1)
            tol = float(np.sqrt(np.finfo(np.asarray(orientation).dtype).eps))
            if np.any(np.abs(norm - 1) > tol):
                raise ValueError(
                    f"orientation must be a unit quaternion [w, x, y, z] (|q| = 1 within {tol:.1e}); "
                    f"got |q| = {norm}. Normalise it with rigidjax.so3.normalize if intended."
                )
        if time.shape != batch:
            try:
                batch = jnp.broadcast_shapes(batch, time.shape)
            except ValueError:
                raise ValueError(
                    f"RigidBodyState: time has shape {time.shape}, the other fields batch shape {batch}"
                ) from None
        self.time = jnp.broadcast_to(time, batch)
        self.position = jnp.broadcast_to(position, (*batch, 3))
        self.orientation = jnp.broadcast_to(orientation, (*batch, 4))
        self.velocity = jnp.broadcast_to(velocity, (*batch, 3))
        self.angular_velocity = jnp.broadcast_to(angular_velocity, (*batch, 3))

    @property
    def twist(self) -> jax.Array:
        """``V = (v_world, omega_body)``, (…, 6)."""
        return jnp.concatenate([self.velocity, self.angular_velocity], -1)

    @property
    def rotation_matrix(self) -> jax.Array:
        """Body-to-world rotation matrix (…, 3, 3)."""
        return so3.to_matrix(self.orientation)

    @property
    def angular_velocity_world(self) -> jax.Array:
        """Angular velocity in the WORLD frame, rad/s, (…, 3)."""
        return so3.rotate(self.orientation, self.angular_velocity)


def check_step_inputs(body: RigidBody, state: RigidBodyState, wrench, dt, where: str) -> None:
    """Boundary checks shared by the rigid-body steppers (shapes and dtypes are static, so they
    run under ``jit`` too; the value of ``dt`` only where it is concrete)."""
    check_kinds(where, body, RigidBody, state, RigidBodyState)
    if wrench is not None and (jnp.ndim(wrench) == 0 or jnp.shape(wrench)[-1] != 6):
        raise ValueError(
            f"{where}: wrench must have shape (…, 6) = (force in world N, torque in body N m); got {jnp.shape(wrench)}"
        )
    b_dtype, s_dtype = body.inertia.dtype, state.angular_velocity.dtype
    if b_dtype != s_dtype:
        raise TypeError(
            f"{where}: body is {b_dtype} but state is {s_dtype}; build both with the same float dtype "
            "(rigidjax follows the input dtype and does not cast silently)"
        )
    b_batch, s_batch = body.mass.shape, state.time.shape

    def _fits(shape):  # broadcasts against the state's batch without enlarging it
        try:
            return tuple(np.broadcast_shapes(tuple(shape), tuple(s_batch))) == tuple(s_batch)
        except ValueError:
            return False

    if wrench is not None and not _fits(jnp.shape(wrench)[:-1]):
        raise ValueError(
            f"{where}: wrench has batch shape {jnp.shape(wrench)[:-1]} but the state has {s_batch}; a wrench "
            "(…, 6) must broadcast against the state's ensemble axes (per-step loads of a rollout: (n_steps, …, 6))"
        )
    if b_batch and not _fits(b_batch):
        raise ValueError(
            f"{where}: body has ensemble shape {b_batch} but state has {s_batch}; give the state the same "
            "leading axes, or jax.vmap over bodies and states together"
        )
    check_step_dt(dt, where)


def _apply(inertia, w):
    return jnp.einsum("...ij,...j->...i", inertia, w)


@full_precision
def kinetic_energy(body: RigidBody, state: RigidBodyState) -> jax.Array:
    """Kinetic energy ``m|v|^2/2 + omega.I omega/2`` (…,), J."""
    w = state.angular_velocity
    rot = 0.5 * jnp.sum(w * _apply(body.inertia, w), -1)
    return 0.5 * body.mass * jnp.sum(state.velocity**2, -1) + rot


@full_precision
def angular_momentum_body(body: RigidBody, state: RigidBodyState) -> jax.Array:
    """Angular momentum about the centre of mass in the BODY frame, ``I omega``, (…, 3), kg m^2/s."""
    return _apply(body.inertia, state.angular_velocity)


@full_precision
def angular_momentum(body: RigidBody, state: RigidBodyState) -> jax.Array:
    """Angular momentum about the centre of mass in the WORLD frame, ``R I omega``, (…, 3).

    Conserved by torque-free motion.
    """
    return so3.rotate(state.orientation, angular_momentum_body(body, state))


def linear_momentum(body: RigidBody, state: RigidBodyState) -> jax.Array:
    """Linear momentum ``m v`` in the WORLD frame, (…, 3), kg m/s."""
    return jnp.asarray(body.mass)[..., None] * state.velocity
