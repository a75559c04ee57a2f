r"""Identify any parameter of any model from measured trajectories, with any of the steppers.

A problem is: a model pytree and a stepper (:class:`rigidjax.Midpoint` for free bodies,
:class:`rigidjax.GeneralizedAlphaEP` for jointed bodies, :class:`rigidjax.MidpointVI` for any
Lagrangian); measured segments (:class:`MeasuredSegment`: sample times, measured arrays, known
inputs per step); the quantities to fit (:class:`Parameter`: leaves of the model, each with a
parametrisation from :mod:`rigidjax.identify.transforms`); the observations with their sensor
models (:mod:`rigidjax.identify.observations`); and each segment's initial state, fully or
partly unknown (:class:`FreeBodyInitial`, or :class:`InitialState` for any state).

:func:`~rigidjax.identify.fit` minimises the sum of squared standardised residuals over

``x = [model parameters | sensor parameters | initial-state unknowns of every segment]``

by the bounded Levenberg-Marquardt of :mod:`rigidjax.identify._lm` with the exact Jacobian
(forward mode through the rollouts, all starts and segments in one compiled, vmapped call),
from several starts: the given values and random ones around them (``spread``: the standard
deviation of the perturbation of the model parameters' coordinates, e.g. a factor
``exp(0.5)`` of a positive one). The box is the transforms' bounds
(:class:`~rigidjax.identify.transforms.Box`,
:class:`~rigidjax.identify.transforms.MomentRatios`; ``-inf, inf`` for the others and the
initial states): the given start must lie in it (``ValueError`` naming the parameter), the
random starts are clipped into it, and an optimum on a bound is reached exactly (the
message names the coordinates held there). What the result's ``status`` means:

* ``converged``: the best start reached first-order optimality (:mod:`rigidjax.identify._lm`;
  at a bound: the gradient points out of the box), every step of every rollout succeeded at
  the optimum, and the data determine every fitted coordinate (``J^T J`` well conditioned);
* ``unidentifiable``: the optimum was reached but a combination of the fitted coordinates is
  not determined (e.g. a frame offset and a free body's initial orientation), or a value
  whose transform declares ``relative_se_max`` (moments of inertia and their ratios: 50 %,
  :data:`~rigidjax.identify.transforms.REL_SE_MAX`) has a larger relative classical
  standard error: that far from the estimate the local model behind every standard error
  does not hold (motion capture of 12 samples put a moment 11 standard errors from the
  truth while the other two were known to +-350 %), as
  :func:`~rigidjax.identify.fit_inertia` judges its ratios; also an optimiser that ran out of
  iterations or stalled where the decrease its Gauss-Newton model still promises is below
  the 95 % quantile of chi^2(1) residual variances (insignificant) while the normal
  equations are singular or such a value is known only to more than twice that limit
  (:func:`rigidjax.identify._verdict.flat`, fit_inertia's rule): the descent heads for a
  minimum the data do not determine; or an inertia whose transform declares ``degenerate``
  ending at, or heading for, a rod-like body (a principal moment 1e4 times another); or
  fewer than two measured values (weighted residual components) per unknown (no standard
  error means anything; ``too_few``): found before any compilation where the data show it
  (not fitted: 0 iterations, no cost), else by the fit; outside :func:`fit_many`'s rules
  across windows either way;
* ``nonfinite``: a rollout step failed (a Newton solve, NaN) at the best point;
* ``max_steps`` / ``stalled``: the optimiser's cap came first / no step lowered the cost;
* ``poor_fit``: an optimum whose residuals are over 5 times the stated ``sigma`` (wrong units,
  a missing effect, or a ``sigma`` too small), or an optimum held at a bound of the box where
  a step without the bound would remove more than 60 % of the residual sum of squares
  (:data:`~rigidjax.identify._verdict.EDGE_PUSH`, fit_inertia's rule): the data ask for a body
  beyond the valid set (a negative drag, an inertia violating the triangle inequality);
* ``step_error``: an optimum, but the stepper's own error moves a value by more than 0.3
  standard errors after the step-error check below (raise ``Problem.substeps``).

``starts_at_best`` counts the starts that reached the best cost (relative 1e-6): one start
out of many reaching it is a warning that the landscape has several basins. With ``keep``
it counts among the ``kept`` starts that ran past the first phase.

Step error. The fitted model is the discrete one, ``substeps`` steps per sample interval.
At the optimum, :mod:`rigidjax.identify._step_error` estimates how far the stepper's own
error moves each fitted value (Richardson, from the residuals at twice the steps), in
standard errors (``step_shift``); above 0.3, ``step_check="refine"`` (the default) doubles
the steps and refits from the optimum, at most three times, and the message names what
remains; a shift still above 0.3 makes a converged fit ``step_error``. Generalized-alpha
under a load held per sample interval is first order in the step (each jump of the load
leaves its acceleration-like variable inconsistent): known loads through the
Euler-parameter step need many substeps, which the check measures.

Segments may have different lengths: each is padded to a common length ``N`` (the longest,
or :func:`~rigidjax.identify.fit`'s ``pad_to``: problems of one structure padded to one length share one
compiled program) with samples of zero weight, its times continued at the segment's median
step and its inputs zero; a padded sample enters no count, sum or statistic below.

Uncertainty. Two covariances of the fitted coordinates are computed at the optimum:
the classical ``s^2 (J^T J)^-1`` (``s^2 = RSS / (m - p)``, right for white noise) and a
block sandwich ``A^-1 (sum_b J_b^T r_b r_b^T J_b) A^-1 m / (m - p)`` over blocks of ``L``
consecutive samples of each segment, with ``L`` where the residuals' autocorrelation has
fallen below 0.1: residuals that model error makes smooth (correlated) count as fewer
independent samples than there are. The reported standard error of each value is the
larger of the two, mapped to the value by the parametrisation's Jacobian.

At a bound. A coordinate held at its bound (the gradient pointing out of the box) is not
treated as fixed: both covariances use the whole ``J^T J``, the bound playing no part, so
its standard error (and those of the values it enters) is the unconstrained local model's,
what the data alone determine. This is what :func:`rigidjax.identify.fit_inertia` does at
the edges of its chart (:mod:`rigidjax.identify._windows`: ``s^2 (J^T J)^-1`` of every
coordinate at the bounded optimum). The interval may reach beyond the bound; only its part
inside is physical (a one-sided interval). Fixing the coordinate instead would report a zero
error for a quantity the data determine only to within that interval.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import so3
from ..body import RigidBodyState
from ._problem_result import ProblemFit
from .observations import data_width, reads, rigid_body_signals
from .transforms import Positive, bounds_of

__all__ = [
    "MeasuredSegment",
    "Parameter",
    "InitialState",
    "FreeBodyInitial",
    "Problem",
    "ProblemFit",
]


@dataclasses.dataclass(frozen=True)
class MeasuredSegment:
    """One measured stretch of motion.

    Args:
        t: ``(N,)`` sample times, s, strictly increasing.
        data: ``{key: (N, k) array}``: the measured values the observations read.
        state0: the initial state's start value (e.g. a :class:`rigidjax.RigidBodyState`);
            its unknown parts are fitted (see the problem's ``initial``).
        inputs: ``None`` or the stepper's known inputs per sample interval, leading axis
            ``N - 1`` (e.g. ``(N - 1, 6)`` wrenches ``(force world N, torque body N m)`` for the
            midpoint step), held over each interval.
        name: a label for tables.
    """

    t: Any
    data: dict
    state0: Any
    inputs: Any = None
    name: str = ""

    def __post_init__(self):
        t = np.asarray(self.t, float)
        if t.ndim != 1 or len(t) < 3:
            raise ValueError(f"MeasuredSegment {self.name!r}: t must be 1-D with >= 3 samples; got shape {t.shape}")
        if not np.all(np.isfinite(t)) or np.any(np.diff(t) <= 0):
            raise ValueError(f"MeasuredSegment {self.name!r}: t must be finite and strictly increasing")
        for k, v in self.data.items():
            v = np.asarray(v)
            if v.shape[:1] != t.shape:
                raise ValueError(
                    f"MeasuredSegment {self.name!r}: data[{k!r}] has {v.shape[:1]} samples, t has {len(t)}"
                )
            if not np.all(np.isfinite(v)):
                raise ValueError(f"MeasuredSegment {self.name!r}: data[{k!r}] contains NaN or inf")
        if self.inputs is not None:
            for leaf in jax.tree_util.tree_leaves(self.inputs):
                if np.shape(leaf)[:1] != (len(t) - 1,):
                    raise ValueError(
                        f"MeasuredSegment {self.name!r}: inputs need a leading axis of N - 1 = {len(t) - 1} "
                        f"(one per sample interval); got {np.shape(leaf)}"
                    )
                bad = np.argwhere(~np.isfinite(np.asarray(leaf, float)))
                if len(bad):
                    raise ValueError(
                        f"MeasuredSegment {self.name!r}: inputs contain NaN or inf ({len(bad)} values, the first at "
                        f"index {tuple(int(i) for i in bad[0])})"
                    )
        for leaf in jax.tree_util.tree_leaves(self.state0):
            if not np.all(np.isfinite(np.asarray(leaf, float))):
                raise ValueError(f"MeasuredSegment {self.name!r}: state0 contains NaN or inf")


@dataclasses.dataclass(frozen=True)
class Parameter:
    """A fitted quantity of the model.

    Args:
        where: ``where(model)`` returns the leaf (or a tuple of leaves) it sets, as for
            :func:`equinox.tree_at`.
        transform: the parametrisation (:class:`~rigidjax.identify.transforms.Positive`,
            ``Real``, ``Bounded``, ``PseudoInertia``); default ``Positive()``.
        into: ``None`` or ``into(value)`` returning what ``where`` points at, for a value that
            is not the leaf itself (e.g. a pivot distance ``L`` into a joint point
            ``(0, 0, L)``).
        start: the start value; ``None``: the model's current leaf (needs ``into=None``).
    """

    where: Callable
    transform: Any = Positive()
    into: Callable | None = None
    start: Any = None

    def start_value(self, model):
        if self.start is not None:
            return self.start
        if self.into is not None:
            raise ValueError("Parameter: give `start` when `into` maps the value into the model")
        return jax.tree_util.tree_map(np.asarray, self.where(model))


@dataclasses.dataclass(frozen=True)
class InitialState:
    """Each segment's initial state from its unknowns ``z`` (``size`` of them).

    Args:
        size: unknowns per segment (0: the initial state is known).
        build: ``build(model, z, state0) -> state``: the state from the unknowns and the
            segment's ``state0`` (JAX, differentiable in ``model`` and ``z``).
        guess: ``guess(state0) -> z0`` (NumPy): the unknowns' start value of a segment.
    """

    size: int
    build: Callable
    guess: Callable


def FreeBodyInitial(fit: Sequence[str] = ("orientation", "angular_velocity")) -> InitialState:
    """The unknowns of a :class:`rigidjax.RigidBodyState`: any of ``"position"`` (m),
    ``"orientation"`` (a rotation vector ``phi``, rad: ``q0 = state0.orientation ⊗ exp(phi)``),
    ``"velocity"`` (m/s, world) and ``"angular_velocity"`` (rad/s, body); 3 each, starting at
    the segment's ``state0`` (``phi = 0``); ``()``: the initial state is known (``state0``)."""
    fields = ("position", "orientation", "velocity", "angular_velocity")
    fit = tuple(fit)
    bad = [f for f in fit if f not in fields]
    if bad:
        raise ValueError(f"FreeBodyInitial: unknown fields {bad}; choose from {fields}")

    def build(model, z, s0: RigidBodyState):
        new = {}
        for i, f in enumerate(fit):
            zi = z[3 * i : 3 * i + 3]
            new[f] = so3.multiply(s0.orientation, so3.exp(zi)) if f == "orientation" else zi
        return eqx.tree_at(lambda s: tuple(getattr(s, f) for f in fit), s0, tuple(new[f] for f in fit))

    def guess(s0: RigidBodyState):
        parts = [np.zeros(3) if f == "orientation" else np.asarray(getattr(s0, f), float) for f in fit]
        return np.concatenate(parts) if parts else np.zeros(0)

    return InitialState(3 * len(fit), build, guess)


@dataclasses.dataclass(frozen=True)
class Problem:
    """A least-squares identification problem (see the module).

    Args:
        model: the model pytree (e.g. :class:`rigidjax.RigidBody`, an EP model, a mechanical
            system); its non-fitted leaves are held fixed.
        stepper: a stepper object or step function (``step(model, state, inputs, dt)``).
        parameters: ``{name: Parameter}``.
        observations: the observation models (:mod:`rigidjax.identify.observations`).
        segments: the :class:`MeasuredSegment` list, of any lengths (padded to a common
            length when fitted, see the module).
        initial: the initial-state unknowns (:func:`FreeBodyInitial` by default).
        signals: ``signals(model, states) -> {name: (N, k)}``: what the observations read of
            a trajectory (:func:`~rigidjax.identify.observations.rigid_body_signals` default).
        substeps: steps per sample interval (an integer >= 1), or one per segment (a tuple:
            e.g. windows that need different steps in one joint fit); a tuple of equal counts
            is that count. Data of the compiled program: problems that differ only here share
            one.
    """

    model: Any
    stepper: Callable
    parameters: dict
    observations: Sequence
    segments: Sequence[MeasuredSegment]
    initial: InitialState = dataclasses.field(default_factory=FreeBodyInitial)
    signals: Callable = rigid_body_signals
    substeps: int | tuple = 1

    def __post_init__(self):
        if not self.segments:
            raise ValueError("Problem: no segments")
        k = self.substeps
        if isinstance(k, np.ndarray) and k.ndim <= 1:
            k = k.item() if k.ndim == 0 else tuple(k.tolist())
        if isinstance(k, (list, tuple)):
            if len(k) != len(self.segments) or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in k
            ):
                raise ValueError(
                    f"Problem: substeps per segment must be {len(self.segments)} integers >= 1 (one per segment); "
                    f"got {k!r}"
                )
            k = tuple(int(v) for v in k)
            object.__setattr__(self, "substeps", k[0] if len(set(k)) == 1 else k)
        elif not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(
                f"Problem: substeps must be an integer >= 1, or one per segment (a tuple, list or 1-d array); got {k!r}"
            )
        for o in self.observations:
            idx = getattr(o, "segments", None)
            if idx is not None and max(idx) >= len(self.segments):
                raise ValueError(
                    f"Problem: {type(o).__name__} reads segments {list(idx)} of {len(self.segments)} "
                    f"(indices 0-{len(self.segments) - 1})"
                )
            widths = set()
            for i, s in enumerate(self.segments):
                if not reads(o, i):
                    continue
                if o.key not in s.data:
                    raise ValueError(f"Problem: segment {s.name!r} has no data[{o.key!r}] for {type(o).__name__}")
                shape = np.shape(s.data[o.key])
                if len(shape) != 2 or (o.width is not None and shape[1] != o.width):
                    want = f"(N, {o.width})" if o.width is not None else "(N, k)"
                    raise ValueError(
                        f"Problem: {type(o).__name__} reads data[{o.key!r}] of segment {s.name!r} as {want}; "
                        f"got shape {shape}"
                    )
                o.weight(np.asarray(s.t, float))  # raises where a delay bound leaves too few samples
                widths.add(shape[1])
            if len(widths) > 1:
                raise ValueError(
                    f"Problem: {type(o).__name__} reads data[{o.key!r}] of widths {sorted(widths)} in different "
                    "segments (one width per observation)"
                )
        unread = [i for i in range(len(self.segments)) if not any(reads(o, i) for o in self.observations)]
        if unread:
            raise ValueError(
                f"Problem: segment(s) {unread} ({', '.join(repr(self.segments[i].name) for i in unread)}) are read by "
                "no observation (check the observations' segments=)"
            )
        if not self.parameters:
            raise ValueError("Problem: no parameters to fit")
        for name, p in self.parameters.items():
            if not isinstance(p, Parameter):
                raise TypeError(f"Problem: parameters[{name!r}] must be an identify.Parameter; got {type(p).__name__}")


#: The value shapes :func:`_check_parameter` found, by :func:`_shape_key` (the transform's
#: ``forward`` and ``into`` op by op: ~0.8 ms per problem, 69 window problems of fit_inertia),
#: the most recent :data:`_VALUE_SHAPES_KEPT`. Like the compiled programs (keyed by the same
#: objects), it takes a transform's ``forward`` and an ``into`` for pure functions: one whose
#: output shape changes with outside state between fits is not checked again.
_VALUE_SHAPES: collections.OrderedDict = collections.OrderedDict()
_VALUE_SHAPES_KEPT = 64


def _shape_key(p: Parameter, like, u):
    """What the shapes of ``p``'s value depend on: its transform and ``into`` and the shapes
    and dtypes of the start and its coordinates ``u``; ``None`` where unhashable."""
    leaves, tree = jax.tree_util.tree_flatten((like, u))
    key = (p.transform, p.into, tree, tuple((np.shape(a), np.result_type(a).str) for a in leaves))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _check_parameter(name: str, p: Parameter, model):
    """The start value of ``p``, checked: ``where`` finds leaves, the transform accepts the
    start, and the value (through ``into``) has the shapes of the leaves it replaces."""
    try:
        target = p.where(model)
    except Exception as e:  # a user's selector: any error means it does not fit the model
        raise ValueError(f"Parameter {name!r}: where(model) failed on this model: {type(e).__name__}: {e}") from None
    try:
        like = p.start_value(model)
        u = p.transform.inverse(like)
        key = _shape_key(p, like, u)
        shapes = _VALUE_SHAPES.get(key) if key is not None else None
        if shapes is None:
            value = p.transform.forward(jnp.asarray(u), like)
            if p.into is not None:
                value = p.into(value)
            shapes = [np.shape(a) for a in jax.tree_util.tree_leaves(value)]
            if key is not None:
                _VALUE_SHAPES[key] = shapes
                while len(_VALUE_SHAPES) > _VALUE_SHAPES_KEPT:
                    _VALUE_SHAPES.popitem(last=False)
        else:
            _VALUE_SHAPES.move_to_end(key)
    except Exception as e:  # bad start value or shape: say which parameter (and what failed, unless a ValueError)
        why = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        raise ValueError(f"Parameter {name!r}: {why}") from None
    want = [np.shape(a) for a in jax.tree_util.tree_leaves(target)]
    if shapes != want:
        raise ValueError(
            f"Parameter {name!r}: its value has shapes {shapes} but where(model) selects leaves of shapes {want} "
            "(give a start of the leaf's shape, or an `into` that maps the value to it)"
        )
    return like


class _Layout:
    """Where each quantity sits in the unknown vector ``x``, and its box ``lo <= x <= hi``
    (the transforms' :func:`~rigidjax.identify.transforms.bounds_of`; the initial-state
    unknowns are unbounded). Raises ``ValueError`` naming the parameter for bad bounds or a
    start outside them."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.slots = []  # (kind, name, transform, like, offset, size)
        los, his = [], []
        off = 0
        for name, p in problem.parameters.items():
            like = _check_parameter(name, p, problem.model)
            n = p.transform.size(like)
            self.slots.append(("model", name, p.transform, like, off, n))
            off += n
        for i, o in enumerate(problem.observations):
            for name, (tr, start) in o.parameters(data_width(problem, o)).items():
                n = tr.size(start)
                self.slots.append((f"sensor{i}", name, tr, start, off, n))
                off += n
        for kind, name, tr, like, _, n in self.slots:
            label = (
                f"Parameter {name!r}"
                if kind == "model"
                else f"{type(problem.observations[int(kind[6:])]).__name__} {name!r}"
            )
            try:
                lo, hi = bounds_of(tr, like)
            except ValueError as e:
                raise ValueError(f"{label}: {e}") from None
            u = np.asarray(tr.inverse(like), float)
            if not np.all(np.isfinite(u)):
                raise ValueError(
                    f"{label}: the start value {np.asarray(like).tolist()} is not finite in its transform's "
                    f"coordinates {u.tolist()} ({type(tr).__name__})"
                )
            if not np.all((u >= lo) & (u <= hi)):
                raise ValueError(
                    f"{label}: the start value {np.asarray(like).tolist()} has coordinates {u.tolist()} outside "
                    f"its transform's bounds [{lo.tolist()}, {hi.tolist()}] ({type(tr).__name__})"
                )
            los.append(lo)
            his.append(hi)
        self.n_global = off
        self.nz = problem.initial.size
        self.S = len(problem.segments)
        self.P = off + self.nz * self.S
        free = np.full(self.P - off, np.inf)
        self.lo = np.concatenate(los + [-free])
        self.hi = np.concatenate(his + [free])

    def values(self, x):
        """``(model values {name: value}, sensor values [ {name: value} per observation ])``."""
        model_vals, sensor = {}, [dict() for _ in self.problem.observations]
        for kind, name, tr, like, off, n in self.slots:
            v = tr.forward(x[off : off + n], like)
            if kind == "model":
                model_vals[name] = v
            else:
                sensor[int(kind[6:])][name] = v
        return model_vals, sensor

    def model(self, x):
        model_vals, _ = self.values(x)
        m = self.problem.model
        for name, p in self.problem.parameters.items():
            v = model_vals[name]
            if p.into is not None:
                v = p.into(v)
            v = jax.tree_util.tree_map(lambda a, old: jnp.asarray(a, jnp.asarray(old).dtype), v, p.where(m))
            m = eqx.tree_at(p.where, m, v)
        return m

    def start(self) -> np.ndarray:
        x = np.zeros(self.P)
        for _, _, tr, like, off, n in self.slots:
            x[off : off + n] = tr.inverse(like)
        for s, seg in enumerate(self.problem.segments):
            x[self.n_global + s * self.nz : self.n_global + (s + 1) * self.nz] = self.problem.initial.guess(seg.state0)
        return x
