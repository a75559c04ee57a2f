r"""Linearly implicit midpoint step of the Newton-Euler equations (seed 000).

Source: ``../shared/seeds/000_767e6f3038d23db2.txt`` (node ``RigidInertialMidpointNode``,
algorithm MIME-NODE-112); references Peraire & Widnall (2009), Solà (2017).

The twist ``V = (v, omega)`` (``v`` world, ``omega`` body) advances by one Rosenbrock step
with the exact Jacobian of the gyroscopic term and the resistance implicit:

.. math::

    V' = V + \Big(\frac{M}{\Delta t} + R - \tfrac12 K\Big)^{-1}
         \Big(F - \begin{bmatrix}0\\ \omega \times I\omega\end{bmatrix} - R V\Big),
    \qquad K = \frac{\partial(-\omega\times I\omega)}{\partial \omega}
             = \widehat{I\omega} - \hat\omega I ,

``M = blockdiag(m I3, I)``. Then ``x' = x + dt v'`` and
``q' = normalize(q ⊗ exp(dt omega'))`` (the seed's update, first order in attitude) or,
with ``attitude="midpoint"``, ``q' = normalize(q ⊗ exp(dt (omega + omega')/2))`` (second
order). Torque-free, kinetic energy and ``|L|`` are kept to second order in ``dt``.

The step matrix is not symmetric for unequal moments: it is solved as a general system.
The seed warns that nothing resolves the gyroscopic term once ``|omega| dt`` exceeds about
0.5; here every step reports ``|omega| dt`` in ``info.rotation`` and flags
``Status.ROTATION_LIMIT`` above ``max_rotation``; checked modes raise on it.

Implementation (speed, not maths): the 6x6 system is solved in closed form by block
elimination (translation block ``m/dt + R_vv``, then the rotation block's Schur complement
``S = I/dt + R_ww - K/2 - R_wv (m/dt + R_vv)^-1 R_vw``), each 3x3 inverse by scaled cofactors,
and every quantity is carried as separate per-component arrays of the batch shape
(structure of arrays), so XLA fuses a step into a few elementwise loops that vectorise over
the ensemble, with no LAPACK call (a batched LAPACK ``solve`` on ``(N, 6, 6)`` is a custom call
per step on tiny matrices, and can deadlock XLA:CPU inside a vmapped scan;
``benchmarks/README.md`` has the timings against it, row ``midpoint-lu``). Results agree with
``jnp.linalg.solve(step_matrix(...))`` to round-off (``tests/test_midpoint_layout.py``). Needs
``m/dt + R_vv`` invertible, true for any dissipative resistance (symmetric part of ``R``
positive semi-definite).

Modules: :mod:`~rigidjax.midpoint.equations` (the gyroscopic Jacobian, the step matrix and its
block solve), :mod:`~rigidjax.midpoint.core` (the per-component kernel and its JVP),
:mod:`~rigidjax.midpoint.adjoint` (the discrete adjoint), :mod:`~rigidjax.midpoint.step`
(:class:`Midpoint`, :func:`midpoint_step`).
"""

from . import adjoint
from .core import MidpointCarry, pack_state, unpack_state
from .equations import angular_velocity_step, gyroscopic_jacobian, gyroscopic_term, step_matrix, step_solve
from .step import Midpoint, midpoint_step

__all__ = [
    "Midpoint",
    "MidpointCarry",
    "adjoint",
    "angular_velocity_step",
    "gyroscopic_jacobian",
    "gyroscopic_term",
    "midpoint_step",
    "pack_state",
    "step_matrix",
    "step_solve",
    "unpack_state",
]
