r"""Identification from measured motion: inertia from free flights, a pendulum's moment.

* :func:`fit_inertia`: inertia ratios (or moments given one known value), angular air drag
  and gyroscope bias from gyroscope windows of free flight, per window or jointly; see
  :mod:`rigidjax.identify._fit` for the method, the statuses and the uncertainties.
* :func:`fit_pendulum`, :func:`fit_pendulum_segments`: a physical pendulum's frequency,
  moment about the pivot and damping through variational rollouts
  (:mod:`rigidjax.identify.pendulum`).
* :func:`fit` on a :class:`Problem`: any leaves of any model through any stepper (midpoint,
  Euler-parameter, variational), with sensor models (:mod:`rigidjax.identify.observations`),
  parametrisations (:mod:`rigidjax.identify.transforms`), known inputs and unknown initial
  states; see :mod:`rigidjax.identify.problem`. The observations (gyroscope
  :class:`~rigidjax.identify.observations.AngularVelocity`, accelerometer
  :class:`~rigidjax.identify.observations.SpecificForce`, ``Orientation``, ``Position``,
  ``Signal``) are in :mod:`rigidjax.identify.observations`. :func:`fit_many` fits many
  independent problems of one structure (e.g. one per window) in one compiled program; with
  ``groups`` (windows of one body) it judges them against each other as :func:`fit_inertia`
  does (:mod:`rigidjax.identify._across`), and :func:`combine` pools their estimates (the
  median over the recordings that agree, with an interval covering the scatter between
  windows: :mod:`rigidjax.identify._combine`).
* :class:`FitStatus`: one status vocabulary for every fit.
* :func:`keep_programs`: a folder where traced programs are kept between processes (the
  command line uses it beside JAX's compilation cache).
"""

from ._derived import FitError, parse_scale
from ._fit import fit_inertia
from ._search import multistart_check
from ._model import simulate_omega
from ._result import EXIT_CODES, FitStatus, InertiaFit, exit_code
from ._stored import keep_programs
from .pendulum import PendulumFit, fit_pendulum, fit_pendulum_segments
from . import observations, recipes, transforms
from ._problem_fit import fit
from ._fit_many import fit_many
from ._combine import Combined, combine
from .problem import FreeBodyInitial, InitialState, MeasuredSegment, Parameter, Problem, ProblemFit

__all__ = [
    "fit_inertia",
    "multistart_check",
    "InertiaFit",
    "FitStatus",
    "FitError",
    "parse_scale",
    "simulate_omega",
    "EXIT_CODES",
    "exit_code",
    "keep_programs",
    "fit_pendulum",
    "fit_pendulum_segments",
    "PendulumFit",
    "fit",
    "fit_many",
    "combine",
    "Combined",
    "Problem",
    "ProblemFit",
    "Parameter",
    "MeasuredSegment",
    "InitialState",
    "FreeBodyInitial",
    "observations",
    "transforms",
    "recipes",
]
