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

Two discretisations of the constraints (``GeneralizedAlphaEP(stabilized=...)``):

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
  ``rho_inf >= 0.9``, with either form of the quadratic velocity term (at
  ``rho_inf = 0.5`` it stays bounded). Kept for comparison with index-3 codes.

Each step solves the generalized-alpha equations for the new accelerations, all
multipliers (and ``mu``) by Newton's method (full Jacobian by forward-mode AD, LU with partial pivoting by
:mod:`rigidjax.linalg`: no LAPACK call, see there why). Each iteration is a Newton update
followed by a simplified-Newton update with the same LU factors (Shamanskii's method, as
:mod:`rigidjax.variational`; Exudyn's modified Newton likewise reuses its Jacobian): cubic
convergence per iteration matrix, and the convergence test measures the error the Newton
update left, so a step from the previous step's accelerations needs one iteration matrix. The solve is wrapped
in :func:`jax.lax.custom_root` (through :func:`rigidjax.newton.solve`), so derivatives of a
step are those of the converged solution (implicit function theorem), never of the truncated
iteration, and no mode differentiates the ``while_loop``, second derivatives (``jax.hessian``,
reverse over reverse) included. Non-convergence, a singular iteration matrix or a
non-finite result return the INPUT state with the failure status (per ensemble member
under ``vmap``).

Output variables with the seed's names are in :func:`output`.

Modules: :mod:`~rigidjax.euler_parameters.model` (:class:`GeneralizedAlpha`, the constraints,
:class:`EPModel`, :class:`EPState`), :mod:`~rigidjax.euler_parameters.equations` (mass matrix,
generalized forces, residuals, constraints, energy, :func:`initial_state`),
:mod:`~rigidjax.euler_parameters.step` (:class:`GeneralizedAlphaEP`, :func:`ep_step`),
:mod:`~rigidjax.euler_parameters.packed` (the structure-of-arrays form the rollouts run for free
bodies), :mod:`~rigidjax.euler_parameters.outputs` (:func:`output`).
"""

from .equations import (
    constraint_residual,
    energy,
    euler_parameter_rates,
    generalized_forces,
    initial_state,
    mass_matrix,
)
from .model import (
    EPModel,
    EPState,
    GeneralizedAlpha,
    HolonomicConstraint,
    SphericalJoint,
    generalized_alpha,
    newmark,
    rotation_matrix,
)
from .outputs import OUTPUT_VARIABLES, output
from .packed import EPCarry
from .step import GeneralizedAlphaEP, ep_step

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
    "GeneralizedAlphaEP",
    "ep_step",
    "EPCarry",
    "output",
    "OUTPUT_VARIABLES",
    "energy",
]
