r"""Midpoint variational integrator (trep's ``MidpointVI``): the constrained DEL equation.

Source: ``../shared/seeds/001_12a0721f797adf69.txt`` (trep, "Discrete Dynamics and
Variational Integrators"); J. E. Marsden, M. West, "Discrete mechanics and variational
integrators", Acta Numerica 10 (2001); E. R. Johnson, T. D. Murphey, "Scalable variational
integrators for constrained mechanical systems in generalized coordinates", IEEE T-RO 25 (2009).

A :class:`MechanicalSystem` is given by JAX functions: a Lagrangian ``L(q, qdot, t)``,
generalized forcing ``f(q, qdot, u, t)`` and holonomic constraints ``h(q) = 0``. Its ``n``
configuration variables split into *dynamic* ones (integrated) and *kinematic* ones
(prescribed inputs ``rho``, as in trep). With the midpoint discrete Lagrangian

.. math::

    L_d(q_1, q_2, t_1, t_2) = \Delta t\, L\Big(\tfrac{q_1+q_2}{2}, \tfrac{q_2-q_1}{\Delta t},
    \tfrac{t_1+t_2}{2}\Big), \qquad
    f_d^- = \Delta t\, f\Big(\tfrac{q_1+q_2}{2}, \tfrac{q_2-q_1}{\Delta t}, u_1, \tfrac{t_1+t_2}{2}\Big),
    \quad f_d^+ = 0,

(trep's choice, ``forcing_split="left"``; ``"symmetric"`` puts ``dt f / 2`` on each side, which
keeps second order with forcing: with ``"left"`` the force acts half a step late, a first-order
error), one step solves the constrained discrete Euler-Lagrange (DEL) equation for ``(q_2, lambda_1)``
(dynamic rows only; the kinematic entries of ``q_2`` are ``rho``):

.. math::

    p_1 + D_1 L_d(q_1, q_2) + f_d^- - Dh(q_1)^T \lambda_1 = 0, \qquad h(q_2) = 0,

then sets ``p_2 = D_2 L_d(q_1, q_2) + f_d^+``. The constraint force of the continuous system is
``-Dh(q)^T lambda_c`` with ``lambda_c ≈ lambda_1 / dt``: the discrete multiplier is an
*impulse* (N s for a length constraint), the time integral of the constraint force over a step.

Newton's method with the exact Jacobian (``jax.jacfwd``; LU with partial pivoting by
:mod:`rigidjax.linalg`, no LAPACK call) solves the DEL equation, warm-started at
``q_2 = q_1 + dt * qdot`` with ``qdot`` the velocity of the previous step. Each iteration is a
Newton update followed by a simplified-Newton update with the same LU factors (Shamanskii's
method, V. E. Shamanskii, Ukrain. Mat. Zh. 19 (1967); C. T. Kelley, *Iterative Methods for
Linear and Nonlinear Equations*, SIAM 1995, ch. 5): cubic convergence per Jacobian, and the
second update measures the error the first left, so a step from a good warm start needs ONE
Jacobian and factorisation (plain Newton needs a second, confirming one). The loop is
:func:`rigidjax.newton.solve`: derivatives come from the implicit function theorem on the DEL
residual, so they do not depend on the iteration count and no mode differentiates the while
loop, second derivatives (``jax.hessian``, reverse over reverse) included. Non-convergence, a
singular Jacobian or a non-finite result are reported per ensemble member in
:class:`rigidjax.StepInfo`; a failed step returns its input state.

The stepper object :class:`MidpointVI` (options as fields) and the function :func:`vi_step`
have the signature every rigidjax stepper has, so :func:`rigidjax.rollout` runs them
unchanged; ``inputs`` is ``u`` (``(n_inputs,)`` or ``None``) or, when the system has kinematic
variables, the pair ``(u, rho)``. :func:`linearize` gives the first and second derivatives of
the discrete map ``(q1, p1, u1, rho) -> (q2, p2, lambda1)`` (trep's ``dq2dq1``,
``dq2dq1dq1``, ...), and :func:`state_space_step` / :func:`trajectory_jacobians` the
state-space view ``X(k+1) = F(X(k), U(k))`` with ``X = (q, p)``, ``U = (u, rho)`` used by
:mod:`rigidjax.lqr`.

Modules: :mod:`~rigidjax.variational.system` (the system, the state, the discrete Lagrangian
and forcing), :mod:`~rigidjax.variational.state` (initial states, velocity, energy, momentum
maps), :mod:`~rigidjax.variational.step` (the DEL residual, its solve, :class:`MidpointVI`),
:mod:`~rigidjax.variational.linearize` (derivatives of the discrete map),
:mod:`~rigidjax.variational.free_body` and :mod:`~rigidjax.variational.packed` (a free rigid
body's parts and the rollouts' structure-of-arrays step for it).
"""

from __future__ import annotations

from .linearize import MapDerivatives, join_state, linearize, split_state, state_space_step, trajectory_jacobians
from .state import energy, generalized_velocity, momentum_map, vi_state, vi_state_from_configs
from .step import MidpointVI, del_residual, discrete_map, vi_step
from .system import MechanicalSystem, VIState, discrete_lagrangian

__all__ = [
    "MechanicalSystem",
    "VIState",
    "MidpointVI",
    "vi_state",
    "vi_state_from_configs",
    "vi_step",
    "discrete_lagrangian",
    "del_residual",
    "discrete_map",
    "linearize",
    "MapDerivatives",
    "generalized_velocity",
    "energy",
    "momentum_map",
    "state_space_step",
    "trajectory_jacobians",
    "split_state",
    "join_state",
]
