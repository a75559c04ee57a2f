"""The seed's node output variables of an Euler-parameter trajectory: :data:`OUTPUT_VARIABLES`, :func:`output`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import so3
from ..numerics import full_precision
from .model import EPModel, EPState, rotation_matrix

__all__ = ["OUTPUT_VARIABLES", "output"]

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


@full_precision
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
