"""rigidjax: differentiable rigid-body dynamics in JAX.

Conventions: unit quaternions ``[w, x, y, z]`` rotate body to world; twist
``V = (v_world, omega_body)``; wrench ``(force_world, torque_body)``; inertia in the
body frame about the centre of mass. rigidjax never changes global JAX config: enable
float64 yourself with ``jax.config.update("jax_enable_x64", True)``; every function
follows the dtype of its inputs.
"""

from . import so3
from .body import (
    RigidBody,
    RigidBodyState,
    angular_momentum,
    angular_momentum_body,
    check_inertia,
    inertia_tensor,
    kinetic_energy,
    linear_momentum,
)
from .info import Status, StepFailure, StepInfo, check
from .midpoint import gyroscopic_jacobian, gyroscopic_term, midpoint_step
from .rollout import Trajectory, rollout

__version__ = "0.1.0"

__all__ = [
    "so3",
    "RigidBody",
    "RigidBodyState",
    "angular_momentum",
    "angular_momentum_body",
    "check_inertia",
    "inertia_tensor",
    "kinetic_energy",
    "linear_momentum",
    "Status",
    "StepFailure",
    "StepInfo",
    "check",
    "gyroscopic_jacobian",
    "gyroscopic_term",
    "midpoint_step",
    "Trajectory",
    "rollout",
]
