"""Fitting :class:`~rigidjax.identify.problem.Problem` s: :func:`fit` (one problem) and the
fit of many problems of one structure in one compiled program that :func:`~rigidjax.identify.fit_many` runs;
the checks before compiling, the multi-start search, the result and the step-error check. The
method, statuses and uncertainties are described in :mod:`rigidjax.identify.problem`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..info import Status
from ..rollout import rollout
from . import _across, _lm
from ._lm import one_blas_thread
from . import observations as obs
from ._problem_result import ProblemFit, flat_values, held_at_bounds, result, value_names
from ._program import _common_length, _evaluator, _stack_segments, call_rows, heavy, per_segment
from ._program_key import _structure, _uncoupled
from ._result import FitStatus
from ._step_error import finer_caller, refine_steps
from ._stored import warn_at_caller
from .problem import Problem, _Layout

__all__ = ["fit"]


@one_blas_thread
def fit(
    problem: Problem,
    *,
    starts: int = 8,
    spread: float = 0.5,
    seed: int = 0,
    max_steps: int = 100,
    dtype=jnp.float64,
    pad_to: int | None = None,
    step_check: str = "refine",
    progress: Callable | None = None,
    keep: int | None = None,
) -> ProblemFit:
    """Fit ``problem`` (see the module for the method, statuses and uncertainties).

    Args:
        problem: the :class:`Problem`.
        starts: starts of the optimiser (the given values first, then random ones).
        spread: the random starts' perturbation of the model parameters' unconstrained
            coordinates (standard deviation; times the transform's ``start_scale`` where it
            has one, see :mod:`rigidjax.identify.transforms`).
        seed: random starts.
        max_steps: Levenberg-Marquardt iterations per start.
        dtype: the evaluation dtype (float64 needs ``jax_enable_x64``).
        pad_to: the samples every segment is padded to (zero-weight samples, see the module);
            ``None``: the longest segment's. Problems of one structure (the same model values,
            stepper, parameters, observations, initial state, signals and segment count)
            padded to one length, fitted with one ``starts`` and ``dtype``, share one
            compiled program: give windows of different lengths one ``pad_to``.
        step_check: the stepper's error at the optimum (:mod:`rigidjax.identify._step_error`:
            how far it moves each fitted value, in standard errors; the result's ``substeps``
            and ``step_shift``). ``"refine"``: while a value moves by more than 0.3 standard
            errors, double ``Problem.substeps`` and refit from the optimum (at most 3 times;
            then the message says so); ``"report"``: measure and warn in the message, no
            refit; ``"off"``: neither (``step_shift`` empty). Each check compiles the forward
            residuals at twice the steps; each refinement the fit's program at the new steps.
        progress: optional ``progress(n_active)``, called after every optimiser iteration
            (the starts still iterating; refits and step refinements report too), e.g. to
            show a progress bar.
        keep: ``None`` (default): every start runs to its end (convergence or
            ``max_steps``). An integer: every start runs the first
            :data:`~rigidjax.identify._across.RESCUE_FIRST_STEPS` iterations, then only the
            ``keep`` lowest-cost ones continue (the others are dropped: ``starts_at_best``
            counts among the kept, ``ProblemFit.kept`` of them). On data with flat directions (a drag next to the
            inertia) starts that crawl along the valley would otherwise each run to
            ``max_steps`` (:func:`~rigidjax.identify.fit_inertia` keeps the best 1 of its 4
            starts after 12 iterations).

    Returns:
        :class:`ProblemFit`.

    Raises:
        ValueError: bad options (``pad_to`` below the longest segment, ``starts`` or
            ``max_steps`` or ``keep`` below 1); a signal map without an observation's signal; a stepper
            that does not accept the state or inputs; start values that cannot be simulated
            (a failed step or NaN at the given values, named).
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"fit: expected an identify.Problem; got {type(problem).__name__} (several: fit_many)")
    options = (starts, spread, seed, max_steps, dtype, pad_to, step_check)
    return _fit([problem], *options, raise_on_failure=True, name="fit", progress=progress, keep=keep)[0]


_START_HINTS = {
    "INVALID_INPUT": "an unphysical start, e.g. moments violating the triangle inequality "
    "(transforms.PseudoInertia keeps every point physical)",
    "ROTATION_LIMIT": "the body turns too far per step: raise substeps, check the units (time in ms? rates in "
    "deg/s?), or the start values (moments far too small for known torques spin the body up)",
}

#: What :func:`_structure` compares, in its key's order (for the message naming a difference).
_STRUCTURE_PARTS = (
    "model structure",
    "model values",
    "parameters",
    "parameter and sensor coordinates",
    "observations",
    "initial state",
    "stepper",
    "signal map",
    "known inputs",
    "segment count",
    "evaluation dtype",
    "program kind",
)


def _fit(
    problems,
    starts,
    spread,
    seed,
    max_steps,
    dtype,
    pad_to,
    step_check,
    raise_on_failure,
    name,
    sigma_rule=True,
    refits=None,
    laid_out=None,
    progress=None,
    keep=None,
    first_steps=None,
    given=None,
    classical=False,
):
    """The fit of :func:`fit` and :func:`~rigidjax.identify.fit_many`. ``sigma_rule``: see
    :func:`~rigidjax.identify._problem_result.result`. ``refits``: a list to which the fit
    appends ``refit(ws, given) -> {w: ProblemFit}``, a refit of its problems ``ws`` from the
    start points ``given[w] (n, P)`` (every start ``first_steps`` (:data:`_across.RESCUE_FIRST_STEPS`)
    iterations, the :data:`_across.RESCUE_KEEP` lowest of each problem to ``max_steps`` in all) through the
    same compiled program (fit_many's refit of suspect windows: no compilation). ``laid_out``:
    ``(problems in dtype, their layouts)`` already checked (layouts, sub-steps, one structure)
    by the caller, which :func:`~rigidjax.identify.fit_many` does for all its problems at once.
    ``progress``: ``progress(n_active)`` after every optimiser iteration; ``keep``: the
    starts per problem that continue after the first phase (see :func:`fit`); ``first_steps``:
    the first phase's iterations where ``keep`` is below ``starts`` (default
    :data:`_across.RESCUE_FIRST_STEPS`; fit_inertia's ``phase1_steps``); ``given``: ``{w:
    (n, P)}`` start points of problem ``w`` that replace its first random starts (after its
    own start; fit_inertia's other equation-error estimates); ``classical``: the step-error
    check's shifts in the classical standard errors (:func:`refine_steps`)."""
    if progress is not None and not callable(progress):
        raise TypeError(f"{name}: progress must be a callable progress(n_active) or None; got {progress!r}")
    if isinstance(starts, bool) or not isinstance(starts, (int, np.integer)) or starts < 1:
        raise ValueError(f"{name}: starts must be an integer >= 1; got {starts!r}")
    if keep is not None and (isinstance(keep, bool) or not (isinstance(keep, (int, np.integer)) and keep >= 1)):
        raise ValueError(f"{name}: keep must be None or an integer >= 1; got {keep!r}")
    if not spread >= 0:
        raise ValueError(f"{name}: spread must be >= 0; got {spread!r}")
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"{name}: max_steps must be an integer >= 1; got {max_steps!r}")
    if step_check not in ("refine", "report", "off"):
        raise ValueError(f"{name}: step_check must be 'refine', 'report' or 'off'; got {step_check!r}")
    if jnp.dtype(dtype) == jnp.float64 and not jax.config.jax_enable_x64:
        raise ValueError(f"{name}: dtype float64 needs jax.config.update('jax_enable_x64', True) (or pass float32)")
    if pad_to is not None and not (isinstance(pad_to, (int, np.integer)) and pad_to >= 3):
        raise ValueError(f"{name}: pad_to must be None or an integer >= 3; got {pad_to!r}")
    if jnp.dtype(dtype) != jnp.float64:
        warn_at_caller(
            f"{name}: fitting in {jnp.dtype(dtype).name}: the rollouts' round-off limits the cost's decrease "
            "and the standard errors; for a trustworthy fit use float64 (jax_enable_x64)"
        )
    if laid_out is None:
        problems = in_dtype(problems, dtype)
        layouts = []
        for i, p in enumerate(problems):
            try:
                layouts.append(_Layout(p))
            except ValueError as e:  # bad start values or bounds: an input error, named per problem
                raise ValueError(f"{name}: problems[{i}]: {e}" if len(problems) > 1 else str(e)) from None
        _check_same_structure(problems, layouts, dtype, name)
    else:  # checked by the caller (fit_many)
        problems, layouts = laid_out
    layout = layouts[0]
    _check_signals(problems[0], layout, dtype)
    N = _common_length(problems, pad_to)
    # too few measured values for a standard error (result's rule: m >= 2 P), counting each
    # weighted sample's residual components: unidentifiable before any compilation
    few, counted, stacked = {}, {}, []
    for w, p in enumerate(problems):
        st_w = _stack_segments(p, dtype, N)
        stacked.append(st_w)
        m = int(
            sum(np.sum(wo > 0) * o.residual_size(obs.data_width(p, o)) for o, wo in zip(p.observations, st_w.weights))
        )
        counted[w] = m
        if m < 2 * layouts[w].P:
            few[w] = (
                f"too few measured values ({m}) for {layouts[w].P} unknowns (need >= {2 * layouts[w].P}): not fitted"
            )
    if len(few) == len(problems):
        if refits is not None:
            refits.append(lambda ws, given: {})  # nothing to refit
        x0 = [lay.start() for lay in layouts]
        return [
            _failed(p, lay, x, starts, few[w], dtype, FitStatus.UNIDENTIFIABLE, counted[w])
            for w, (p, lay, x) in enumerate(zip(problems, layouts, x0))
        ]
    stacked, run, evaluate, run_one = _evaluator(problems, layout, dtype, N, starts, stacked=stacked)
    W = len(problems)

    x0 = np.stack([lay.start() for lay in layouts])
    r0, status0, _ = run(x0, np.arange(W))
    failed = {}
    for w in range(W):
        if np.any(status0[w] != Status.SUCCESS) or not np.all(np.isfinite(r0[w])):
            codes = sorted({Status(int(c)).name for c in status0[w] if c != Status.SUCCESS})
            why = "; ".join(_START_HINTS.get(f, "a failed step at the start values") for f in codes) or "NaN residuals"
            if "INVALID_INPUT" in codes and _uncoupled(problems[w], layouts[w]):
                why += (
                    "; or the fitted resistance couples translation and rotation at these values, though not at "
                    "the points checked before rolling out the body rate alone (make its off-diagonal blocks "
                    "zero everywhere, or pass a signals function that reads the whole state)"
                )
            failed[w] = f"the start values cannot be simulated: rollout steps failed with {codes} ({why})"
            if raise_on_failure:
                raise ValueError(f"{name}: {failed[w]}")
    X0 = np.repeat(x0, starts, 0)
    lo = np.repeat(np.stack([lay.lo for lay in layouts]), starts, 0)
    hi = np.repeat(np.stack([lay.hi for lay in layouts]), starts, 0)
    if starts > 1:
        for w in range(W):  # a generator per problem: its starts are those fit() draws for it alone
            X0[w * starts + 1 : (w + 1) * starts, : layout.n_global] += (
                spread
                * np.random.default_rng(seed).standard_normal((starts - 1, layout.n_global))
                * _spread_scale(layouts[w], x0[w])
            )
    for w, X in (given or {}).items():  # given starts in place of the first random ones
        n = min(len(X), starts - 1)
        X0[w * starts + 1 : w * starts + 1 + n] = X[:n]
    # the random starts into the transforms' box (the given start is inside: _Layout checks it)
    X0 = np.clip(X0, lo, hi)
    eps = float(jnp.finfo(dtype).eps)
    # every start the first RESCUE_FIRST_STEPS iterations, then the `keep` lowest of each
    # problem to max_steps (all of them where keep is None)
    kept = starts if keep is None else min(keep, starts)
    phase = _across.RESCUE_FIRST_STEPS if first_steps is None else first_steps
    first = max_steps if kept == starts else min(phase, max_steps)
    # a problem whose every row is a large evaluation (a joint fit of many segments) runs its
    # second phase in calls of its kept rows (another compilation, repaid within a few calls)
    evaluate_then = evaluate
    if kept < starts and W * kept < call_rows(W, starts) and heavy(layout, N):
        evaluate_then = _evaluator(problems, layout, dtype, N, starts, rows=W * kept, stacked=stacked)[2]
    st = _two_phase(
        evaluate,
        X0,
        np.arange(W * starts),
        lo,
        hi,
        starts,
        kept,
        eps,
        first,
        max_steps - first,
        progress,
        evaluate_then,
    )
    cost = np.where(st["ok"], st["cost"], np.inf).reshape(W, kept)
    best = np.argmin(np.where(np.isfinite(cost), cost, np.inf), axis=1)
    rows = np.arange(W) * kept + best
    # every problem's best point in one evaluation of the fit's own program
    at_best_eval = run(st["x"][rows], np.arange(W))

    # the step check's residuals at twice the steps, at every problem's optimum in one call
    # (and of a refit's problems), through the fit's own program in calls of the fit's rows
    finer_at = finer_caller(problems, layout, dtype, N, call_rows(W, starts), stacked) if step_check != "off" else None
    # the sub-steps as data: a refinement's refits and checks through this program (its shapes)
    shared = (W, call_rows(W, starts)) if step_check != "off" else None
    finer = finer_at(st["x"][rows], np.arange(W)) if finer_at is not None else None

    def finish(w, st_, row, at_best, n_starts, n_kept, one, first=False):
        """The result of problem ``w`` at row ``row`` of the optimiser's state ``st_``
        (``first``: the fit's own optimum, whose residuals at twice the steps are ``finer``)."""
        problem, lay = problems[w], layouts[w]
        x, g = st_["x"][row], st_["g"][row]
        res = result(problem, lay, stacked[w], one, x, st_, row, at_best, n_starts, dtype, sigma_rule)
        if step_check != "off":
            known = None
            if first and finer is not None:
                known = (finer[0][w], bool(finer[1][w]))
            elif finer_at is not None:
                r_2k, ok = finer_at(x[None], np.array([w]))
                known = (r_2k[0], bool(ok[0]))
            res, x, g = refine_steps(
                problem,
                lay,
                res,
                one,
                x,
                g,
                dtype,
                N,
                max_steps,
                step_check == "refine",
                sigma_rule,
                known,
                progress,
                shared,
                classical,
            )
        held = held_at_bounds(lay, x, g)
        if held:
            res = dataclasses.replace(res, message=f"{res.message}; held at a bound: {', '.join(held)}")
        return dataclasses.replace(res, kept=n_kept if n_kept < n_starts else None)

    out = []
    for w, (problem, lay) in enumerate(zip(problems, layouts)):
        if w in few:
            out.append(_failed(problem, lay, x0[w], starts, few[w], dtype, FitStatus.UNIDENTIFIABLE, counted[w]))
            continue
        if w not in failed and not np.any(np.isfinite(cost[w])):
            failed[w] = "no start could be evaluated (NaN or a failed step at every start)"
            if raise_on_failure:
                raise ValueError(f"{name}: {failed[w]}")
        if w in failed:
            out.append(_failed(problem, lay, x0[w], starts, failed[w], dtype, measured=counted[w]))
            continue
        b, row = int(best[w]), int(rows[w])
        at_best = int(np.sum(cost[w] <= cost[w, b] * (1 + 1e-6) + 1e-300))
        one = _remembered(run_one(w), st["x"][row], tuple(a[w : w + 1] for a in at_best_eval))
        out.append(finish(w, st, row, at_best, starts, kept, one, first=True))

    def refit(ws, given) -> dict:
        n = len(given[ws[0]])
        keep = min(_across.RESCUE_KEEP, n)
        X = np.concatenate([given[w] for w in ws])
        which = np.repeat(np.asarray(ws), n)
        lo_r, hi_r = np.stack([layouts[w].lo for w in which]), np.stack([layouts[w].hi for w in which])
        # rows w * starts: evaluate() reads a row's problem as row // starts
        r = _two_phase(
            evaluate,
            X,
            which * starts,
            lo_r,
            hi_r,
            n,
            keep,
            eps,
            min(phase, max_steps),
            max_steps - min(phase, max_steps),
            progress,
        )
        c2 = np.where(r["ok"], r["cost"], np.inf).reshape(len(ws), keep)
        found = {}
        for j, w in enumerate(ws):
            b = int(np.argmin(c2[j]))
            if np.isfinite(c2[j, b]):
                at_best = int(np.sum(c2[j] <= c2[j, b] * (1 + 1e-6) + 1e-300))
                found[w] = finish(w, r, j * keep + b, at_best, n, keep, run_one(w))
        return found

    if refits is not None:
        refits.append(refit)
    return out


def _two_phase(evaluate, X, rows, lo, hi, n, keep, eps, first, then, progress, evaluate_then=None) -> dict:
    """:func:`_lm.solve` from the starts ``X`` (consecutive groups of ``n`` per problem): every
    start ``first`` iterations, then the ``keep`` lowest-cost of each group ``then`` more
    (``then == 0``: one call; through ``evaluate_then`` where given). A start stops where it
    cannot reach a converged start of its group (:func:`_lm._outrun`). Returns the state of
    the kept rows (``keep`` per group, in group order)."""
    st = _lm.solve(
        evaluate,
        np.clip(X, lo, hi),
        rows,
        lo,
        hi,
        eps=eps,
        max_steps=first,
        running_scale=True,
        progress=progress,
        groups=np.arange(len(X)) // n,
    )
    if keep < n:
        c1 = np.where(st["ok"], st["cost"], np.inf).reshape(-1, n)
        st = _lm.select(st, (np.argsort(c1, 1, kind="stable")[:, :keep] + np.arange(len(c1))[:, None] * n).ravel())
    if then < 1:
        return st
    return _lm.solve(
        evaluate_then or evaluate,
        None,
        None,
        None,
        None,
        eps=eps,
        max_steps=then,
        state=st,
        running_scale=True,
        progress=progress,
    )


def _remembered(run, x, value):
    """``run`` (one problem's ``run_one``, compiled on its first call) that answers ``value``
    for the point ``x`` alone without evaluating: the result and the step check evaluate at
    the optimum, which the batched evaluation above already did."""

    def f(X):
        if len(X) == 1 and np.array_equal(X[0], x):
            return value
        return run(X)

    return f


def _failed(problem, layout, x0, starts, message, dtype, status=FitStatus.NONFINITE, measured=None) -> ProblemFit:
    """The result of a problem that could not be fitted (``status``: ``nonfinite``, or
    ``unidentifiable`` where its data cannot give a standard error): the start values with
    infinite errors (:func:`~rigidjax.identify.fit_many` keeps the other problems' fits)."""
    xj = jnp.asarray(x0, dtype)
    mv, sv = layout.values(xj)
    values = {k: jax.tree_util.tree_map(np.asarray, v) for k, v in mv.items()}
    inf = lambda v: jax.tree_util.tree_map(lambda a: np.full(np.shape(a), np.inf), v)  # noqa: E731
    sensor = [{k: np.asarray(v) for k, v in d.items()} for d in sv]
    n = int(np.size(np.asarray(flat_values(layout, xj))))
    return ProblemFit(
        status=status,
        message=message,
        values=values,
        se=inf(values),
        sensor=sensor,
        sensor_se=[inf(d) for d in sensor],
        initial=np.asarray(x0[layout.n_global :]).reshape(layout.S, layout.nz),
        model=layout.model(xj),
        cost=float("nan"),
        rms=[float("nan")] * len(problem.observations),
        covariance=np.full((n, n), np.inf),
        names=value_names(values, sensor),
        block=1,
        iterations=0,
        starts=starts,
        starts_at_best=0,
        decrement=float("inf"),
        x=np.asarray(x0),
        se_classical=inf(values),
        substeps=problem.substeps,
        initial_se=np.full((layout.S, layout.nz), np.inf),
        covariance_classical=np.full((n + layout.S * layout.nz,) * 2, np.inf),
        measured=measured,
        segment_cost=np.full(layout.S, np.nan),
        segment_influence=np.full((layout.S, n + layout.S * layout.nz), np.nan),
    )


def in_dtype(problems, dtype) -> list:
    """``problems`` with their models in the evaluation dtype (a float64 model fitted in
    float32, and vice versa)."""
    cast = lambda a: jnp.asarray(a, dtype) if eqx.is_inexact_array(a) else a  # noqa: E731
    return [dataclasses.replace(p, model=jax.tree_util.tree_map(cast, p.model)) for p in problems]


def _check_same_structure(problems, layouts, dtype, name) -> None:
    """Every problem has the first one's compiled-program structure (:func:`_structure`), the
    same data widths and the same shapes of state and inputs; else ``ValueError`` naming the
    problem and the part."""
    if len(problems) == 1:
        return
    key0 = _structure(problems[0], layouts[0], dtype)
    if key0 is None:
        raise ValueError(
            f"{name}: the problems' structure is not hashable (a model leaf or an option); fit them one by one"
        )

    def shapes(p):
        s = p.segments
        return (
            [{k: np.shape(v)[1:] for k, v in seg.data.items()} for seg in s],
            [jax.tree_util.tree_structure(seg.state0) for seg in s],
            [[np.shape(a) for a in jax.tree_util.tree_leaves(seg.state0)] for seg in s],
            [[np.shape(a)[1:] for a in jax.tree_util.tree_leaves(seg.inputs)] for seg in s],
            [seg.inputs is None for seg in s],
        )

    shapes0 = shapes(problems[0])
    for i, (p, lay) in enumerate(zip(problems[1:], layouts[1:]), 1):
        key = _structure(p, lay, dtype)
        if key != key0:
            part = next((what for what, a, b in zip(_STRUCTURE_PARTS, key0, key or ()) if a != b), "structure")
            raise ValueError(f"{name}: problems[{i}] differs from problems[0] in its {part}; fit it separately")
        if shapes(p) != shapes0:
            raise ValueError(
                f"{name}: problems[{i}] has data, state or input shapes (beyond the sample axis) other than "
                "problems[0]'s"
            )


#: Problem structures and first-segment shapes :func:`_check_signals` has passed (a check
#: traces a whole rollout: ~0.14 s, repeated for every fit of the same structure otherwise).
_SIGNALS_CHECKED: set = set()


def _check_signals(problem: Problem, layout: _Layout, dtype) -> None:
    """Trace (without running) the first segment's rollout and signals at the start values:
    the stepper accepts the state and the known inputs, and the signal map gives every
    observation's ``signal`` with the measured width. Raises ``ValueError`` naming what
    does not fit."""
    seg = problem.segments[0]
    k = int(per_segment(problem.substeps, len(problem.segments))[0])
    n_steps = (len(np.asarray(seg.t)) - 1) * k
    structure = _structure(problem, layout, dtype, jacobian="signals")
    seg_shapes = jax.tree_util.tree_map(
        np.shape, (seg.state0, seg.inputs, {o.key: obs.data_of(problem, o, 0) for o in problem.observations})
    )
    key = None if structure is None else (structure, n_steps, str(seg_shapes))
    if key is not None and key in _SIGNALS_CHECKED:
        return
    x0 = jnp.asarray(layout.start(), dtype)
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    inputs = None
    if seg.inputs is not None:
        inputs = jax.tree_util.tree_map(lambda a: jnp.repeat(cast(a), k, axis=0), seg.inputs)
    dts = jnp.full((n_steps,), float(np.median(np.diff(np.asarray(seg.t, float)))) / k, dtype)

    def signals(x, state0, u):
        model = layout.model(x)
        st0 = problem.initial.build(model, x[layout.n_global : layout.n_global + layout.nz], state0)
        traj = rollout(problem.stepper, model, st0, dts, n_steps, u)
        return problem.signals(model, traj.states)

    state0 = jax.tree_util.tree_map(cast, seg.state0)
    try:
        shapes = jax.eval_shape(signals, x0, state0, inputs)
    except Exception as e:  # the user's stepper, state, inputs or signal map: say where it failed
        what = (
            ""
            if seg.inputs is None
            else f" with inputs of shapes {[np.shape(a) for a in jax.tree_util.tree_leaves(seg.inputs)]}"
        )
        raise ValueError(f"fit: segment {seg.name!r} cannot be simulated{what}: {type(e).__name__}: {e}") from None
    for o in problem.observations:
        if o.signal not in shapes:
            raise ValueError(
                f"fit: {type(o).__name__} reads the signal {o.signal!r}, which the problem's signal map does not "
                f"give; it gives {sorted(shapes)}"
            )
    if key is not None:
        _SIGNALS_CHECKED.add(key)


def _model_mask(layout: _Layout) -> np.ndarray:
    m = np.zeros(layout.n_global)
    for kind, _, _, _, off, n in layout.slots:
        if kind == "model":
            m[off : off + n] = 1
    return m


def _spread_scale(layout: _Layout, x0) -> np.ndarray:
    """Per global coordinate, the scale of the random starts' perturbation (times ``spread``):
    0 for sensor parameters, 1 for a model parameter's coordinates, or its transform's
    ``start_scale(u0)`` of the start's coordinates ``u0`` where it has one (coordinates that
    carry the value's units, e.g. :class:`~rigidjax.identify.transforms.PrincipalMoments`'
    second moments in kg m^2: a unit perturbation would be far off for a 0.02 kg m^2 body)."""
    m = np.zeros(layout.n_global)
    for kind, _, tr, _, off, n in layout.slots:
        if kind == "model":
            scale = getattr(tr, "start_scale", None)
            m[off : off + n] = 1.0 if scale is None else np.broadcast_to(scale(np.asarray(x0[off : off + n])), (n,))
    return m
