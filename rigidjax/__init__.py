"""rigidjax: differentiable rigid-body dynamics in JAX.

Conventions: unit quaternions ``[w, x, y, z]`` rotate body to world; twist
``V = (v_world, omega_body)``; wrench ``(force_world, torque_body)``; inertia in the
body frame about the centre of mass. rigidjax never changes global JAX config: enable
float64 yourself with ``jax.config.update("jax_enable_x64", True)``; every function
follows the dtype of its inputs.

The steppers are objects whose fields are their options (:class:`Midpoint`,
:class:`GeneralizedAlphaEP`, :class:`MidpointVI`; :mod:`rigidjax.stepper` is the protocol the
rollouts use); ``midpoint_step``, ``ep_step`` and ``vi_step`` are their function forms. The
layers of the package: ``docs/architecture.md``.
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
from .midpoint import Midpoint, gyroscopic_jacobian, gyroscopic_term, midpoint_step
from .rollout import Trajectory, rollout
from . import (
    euler_parameters,
    identify,
    inertia,
    io,
    linalg,
    lqr,
    midpoint,
    newton,
    numerics,
    reference,
    scenarios,
    stepper,
    synthetic,
    systems,
    variational,
)
from .stepper import AbstractStepper
from .ensemble import ensemble_rollout
from .euler_parameters import (
    EPModel,
    EPState,
    GeneralizedAlpha,
    GeneralizedAlphaEP,
    HolonomicConstraint,
    SphericalJoint,
    ep_step,
    generalized_alpha,
    newmark,
)
from .identify import InertiaFit, fit_inertia
from .inertia import InertiaProperties
from .io import DataError, Segment, load, load_csv, load_npz, load_phyphox
from .synthetic import synthesize_recording
from .variational import MechanicalSystem, MidpointVI, VIState, linearize, vi_state, vi_state_from_configs, vi_step

__version__ = "0.1.0"

__all__ = [
    "so3",
    "midpoint",
    "newton",
    "numerics",
    "scenarios",
    "stepper",
    "AbstractStepper",
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
    "Midpoint",
    "Trajectory",
    "rollout",
    "ensemble_rollout",
    "euler_parameters",
    "inertia",
    "identify",
    "io",
    "linalg",
    "lqr",
    "reference",
    "synthetic",
    "systems",
    "variational",
    "EPModel",
    "EPState",
    "GeneralizedAlpha",
    "GeneralizedAlphaEP",
    "HolonomicConstraint",
    "SphericalJoint",
    "ep_step",
    "generalized_alpha",
    "newmark",
    "InertiaFit",
    "fit_inertia",
    "InertiaProperties",
    "DataError",
    "Segment",
    "load",
    "load_csv",
    "load_npz",
    "load_phyphox",
    "synthesize_recording",
    "MechanicalSystem",
    "VIState",
    "MidpointVI",
    "linearize",
    "vi_state",
    "vi_state_from_configs",
    "vi_step",
]
