"""Fitting :class:`~rigidjax.identify.problem.Problem` s: :func:`fit` (one problem) and
:func:`fit_many` (many independent problems of one structure in one compiled program); the
checks before compiling, the multi-start search, the result and the step-error check. The
method, statuses and uncertainties are described in :mod:`rigidjax.identify.problem`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..info import Status
from ..rollout import rollout
from . import _across, _lm
from . import observations as obs
from ._problem_result import ProblemFit, flat_values, result, value_names
from ._program import _common_length, _evaluator, _structure
from ._result import FitStatus
from ._step_error import finer_residuals, refine_steps
from .problem import Problem, _Layout

__all__ = ["fit", "fit_many"]


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
) -> ProblemFit:
    """Fit ``problem`` (see the module for the method, statuses and uncertainties).

    Args:
        problem: the :class:`Problem`.
        starts: starts of the optimiser (the given values first, then random ones).
        spread: the random starts' perturbation of the model parameters' unconstrained
            coordinates (standard deviation).
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

    Returns:
        :class:`ProblemFit`.

    Raises:
        ValueError: bad options (``pad_to`` below the longest segment, ``starts`` or
            ``max_steps`` below 1); a signal map without an observation's signal; a stepper
            that does not accept the state or inputs; start values that cannot be simulated
            (a failed step or NaN at the given values, named).
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"fit: expected an identify.Problem; got {type(problem).__name__} (several: fit_many)")
    return _fit(
        [problem], starts, spread, seed, max_steps, dtype, pad_to, step_check, raise_on_failure=True, name="fit"
    )[0]


def fit_many(
    problems: Sequence[Problem],
    *,
    starts: int = 8,
    spread: float = 0.5,
    seed: int = 0,
    max_steps: int = 100,
    dtype=jnp.float64,
    pad_to: int | None = None,
    step_check: str = "refine",
    groups: Sequence | None = None,
) -> list[ProblemFit]:
    """Fit several independent problems of one structure at once (e.g. one per measured
    window, each with its own values): one compiled program evaluates every start of every
    problem per optimiser iteration (see :func:`fit` for the options, the same per problem).

    The problems must share everything the program is built from: the model's values, the
    stepper, the parameters (``where``, transform, ``into``, start shapes), observations
    (but their ``sigma``: it enters as data, for rigidjax's observation classes), initial
    state, signal map and the number of segments; their data, start values, ``sigma``,
    ``substeps`` (one program per count) and segment lengths may differ (every segment is
    padded to the longest of its sub-step count, or ``pad_to``). Each problem draws its
    random starts from a generator of its own seeded with ``seed``, so the result of problem
    ``i`` does not depend on the other problems: it equals ``fit(problems[i], ...)`` with the
    same ``seed`` and padded length, to round-off.

    Windows of one body (``groups``): where the problems are windows of one body, a label
    per problem naming its recording (one set of conditions; labels compare as strings)
    turns on the rules across windows of :func:`rigidjax.identify.fit_inertia`
    (:mod:`rigidjax.identify._across`), each observation judged in its data's unit (its
    ``ProblemFit.rms``) with its sigma as the noise:

    * a window whose optimiser did not converge, or whose residual is above 3x the median
      over its recording's windows (over all where the recording has fewer than 3) or 10 %
      of its signal (the RMS of its measured values about their mean), is refitted from the
      consensus of the other windows (the medoid of their model parameters, over all windows
      and over its recording's) and 16 random starts, through the same compiled program; the
      refit replaces the fit where it ends lower, and the message says so;
    * ``poor_fit`` is judged against the other windows instead of against sigma alone: a
      residual above 5x that median or 25 % of the signal, and above 10 sigma. Real data
      leave model error far above the sensor noise in every window (a residual of 20-70
      sigma is common): the rule leaves that shared error to the spread of the windows'
      estimates (:func:`rigidjax.identify.combine`) and marks the windows whose residual the
      others do not share (a wrong basin, or motion the model does not describe).

    With ``groups`` a result depends on the other windows (through the consensus and the
    medians); without it (``None``, the default) the problems are independent.

    Returns:
        ``[ProblemFit]`` in the order of ``problems``. A problem whose start values fail in a
        rollout (e.g. an unphysical inertia), or whose every start fails, gets the status
        ``nonfinite`` (its values are the start values, with infinite errors) instead of an
        exception: the others' fits are kept.

    Raises:
        ValueError: no problems; problems of different structures (naming the first part
            that differs); start values that are not finite or lie outside their transform's
            bounds (an input error, naming ``problems[i]``); the option and structure errors
            of :func:`fit`.
    """
    problems = list(problems)
    if not problems:
        raise ValueError("fit_many: no problems")
    for i, p in enumerate(problems):
        if not isinstance(p, Problem):
            raise TypeError(f"fit_many: problems[{i}] is a {type(p).__name__}, not an identify.Problem")
    if groups is not None:
        if isinstance(groups, (str, bytes)):
            raise TypeError("fit_many: groups must be a sequence of labels, one per problem (not one string)")
        groups = list(groups)
        if len(groups) != len(problems):
            raise ValueError(
                f"fit_many: groups has {len(groups)} labels for {len(problems)} problems (one per problem)"
            )
    return _many(problems, groups, starts, spread, seed, max_steps, dtype, pad_to, step_check)


_START_HINTS = {
    "INVALID_INPUT": "an unphysical start, e.g. moments violating the triangle inequality "
    "(transforms.PseudoInertia keeps every point physical)",
    "ROTATION_LIMIT": "the body turns too far per step: raise substeps, or check the units "
    "(time in ms? rates in deg/s?)",
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
    "substeps",
    "segment count",
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
):
    """The fit of :func:`fit` and :func:`fit_many`. ``sigma_rule``: see
    :func:`~rigidjax.identify._problem_result.result`. ``refits``: a list to which the fit
    appends ``refit(ws, given) -> {w: ProblemFit}``, a refit of its problems ``ws`` from the
    start points ``given[w] (n, P)`` (every start :data:`_across.RESCUE_FIRST_STEPS`
    iterations, the :data:`_across.RESCUE_KEEP` lowest of each problem to the end) through the
    same compiled program (fit_many's refit of suspect windows: no compilation)."""
    if not isinstance(starts, (int, np.integer)) or starts < 1:
        raise ValueError(f"{name}: starts must be an integer >= 1; got {starts!r}")
    if not spread >= 0:
        raise ValueError(f"{name}: spread must be >= 0; got {spread!r}")
    if not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"{name}: max_steps must be an integer >= 1; got {max_steps!r}")
    if step_check not in ("refine", "report", "off"):
        raise ValueError(f"{name}: step_check must be 'refine', 'report' or 'off'; got {step_check!r}")
    if jnp.dtype(dtype) == jnp.float64 and not jax.config.jax_enable_x64:
        raise ValueError(f"{name}: dtype float64 needs jax.config.update('jax_enable_x64', True) (or pass float32)")
    if pad_to is not None and not (isinstance(pad_to, (int, np.integer)) and pad_to >= 3):
        raise ValueError(f"{name}: pad_to must be None or an integer >= 3; got {pad_to!r}")
    # the model in the evaluation dtype (a float64 model fitted in float32, and vice versa)
    cast = lambda a: jnp.asarray(a, dtype) if eqx.is_inexact_array(a) else a  # noqa: E731
    problems = [dataclasses.replace(p, model=jax.tree_util.tree_map(cast, p.model)) for p in problems]
    layouts = []
    for i, p in enumerate(problems):
        try:
            layouts.append(_Layout(p))
        except ValueError as e:  # bad start values or bounds: an input error, named per problem
            raise ValueError(f"{name}: problems[{i}]: {e}" if len(problems) > 1 else str(e)) from None
    layout = layouts[0]
    _check_signals(problems[0], layout, dtype)
    _check_same_structure(problems, layouts, dtype, name)
    N = _common_length(problems, pad_to)
    stacked, run, evaluate, run_one = _evaluator(problems, layout, dtype, N, starts)
    W = len(problems)

    x0 = np.stack([lay.start() for lay in layouts])
    r0, status0, _ = run(x0, np.arange(W))
    failed = {}
    for w in range(W):
        if np.any(status0[w] != Status.SUCCESS) or not np.all(np.isfinite(r0[w])):
            codes = sorted({Status(int(c)).name for c in status0[w] if c != Status.SUCCESS})
            why = "; ".join(_START_HINTS.get(f, "a failed step at the start values") for f in codes) or "NaN residuals"
            failed[w] = f"the start values cannot be simulated: rollout steps failed with {codes} ({why})"
            if raise_on_failure:
                raise ValueError(f"{name}: {failed[w]}")
    X0 = np.repeat(x0, starts, 0)
    lo = np.repeat(np.stack([lay.lo for lay in layouts]), starts, 0)
    hi = np.repeat(np.stack([lay.hi for lay in layouts]), starts, 0)
    if starts > 1:
        mask = _model_mask(layout)
        for w in range(W):  # a generator per problem: its starts are those fit() draws for it alone
            X0[w * starts + 1 : (w + 1) * starts, : layout.n_global] += (
                spread * np.random.default_rng(seed).standard_normal((starts - 1, layout.n_global)) * mask
            )
    # the random starts into the transforms' box (the given start is inside: _Layout checks it)
    X0 = np.clip(X0, lo, hi)
    eps = float(jnp.finfo(dtype).eps)
    st = _lm.solve(evaluate, X0, np.arange(W * starts), lo, hi, eps=eps, max_steps=max_steps)
    cost = np.where(st["ok"], st["cost"], np.inf).reshape(W, starts)
    best = np.argmin(np.where(np.isfinite(cost), cost, np.inf), axis=1)
    rows = np.arange(W) * starts + best
    # every problem's best point in one evaluation of the fit's own program
    at_best_eval = run(st["x"][rows], np.arange(W))

    # the step check's residuals at twice the steps, at every problem's optimum in one call
    finer = finer_residuals(problems, layout, dtype, N, st["x"][rows]) if step_check != "off" and W > 1 else None

    def finish(w, st_, row, at_best, n_starts, one, first=False):
        """The result of problem ``w`` at row ``row`` of the optimiser's state ``st_``
        (``first``: the fit's own optimum, whose residuals at twice the steps are ``finer``)."""
        problem, lay = problems[w], layouts[w]
        x, g = st_["x"][row], st_["g"][row]
        res = result(problem, lay, stacked[w], one, x, st_, row, at_best, n_starts, dtype, sigma_rule)
        if step_check != "off":
            known = (finer[0][w], bool(finer[1][w])) if first and finer is not None else None
            res, x, g = refine_steps(
                problem, lay, res, one, x, g, dtype, N, max_steps, step_check == "refine", sigma_rule, known
            )
        held = _held(lay, x, g)
        if held:
            res = dataclasses.replace(res, message=f"{res.message}; held at a bound: {', '.join(held)}")
        return res

    out = []
    for w, (problem, lay) in enumerate(zip(problems, layouts)):
        if w not in failed and not np.any(np.isfinite(cost[w])):
            failed[w] = "no start could be evaluated (NaN or a failed step at every start)"
            if raise_on_failure:
                raise ValueError(f"{name}: {failed[w]}")
        if w in failed:
            out.append(_failed(problem, lay, x0[w], starts, failed[w], dtype))
            continue
        b, row = int(best[w]), int(rows[w])
        at_best = int(np.sum(cost[w] <= cost[w, b] * (1 + 1e-6) + 1e-300))
        one = _remembered(run_one(w), st["x"][row], tuple(a[w : w + 1] for a in at_best_eval))
        out.append(finish(w, st, row, at_best, starts, one, first=True))

    def refit(ws, given) -> dict:
        n = len(given[ws[0]])
        keep = min(_across.RESCUE_KEEP, n)
        X = np.concatenate([given[w] for w in ws])
        which = np.repeat(np.asarray(ws), n)
        lo_r, hi_r = np.stack([layouts[w].lo for w in which]), np.stack([layouts[w].hi for w in which])
        # rows w * starts: evaluate() reads a row's problem as row // starts
        r = _lm.solve(
            evaluate, np.clip(X, lo_r, hi_r), which * starts, lo_r, hi_r, eps=eps, max_steps=_across.RESCUE_FIRST_STEPS
        )
        c1 = np.where(r["ok"], r["cost"], np.inf).reshape(len(ws), n)
        r = _lm.select(r, (np.argsort(c1, 1)[:, :keep] + np.arange(len(ws))[:, None] * n).ravel())
        r = _lm.solve(evaluate, None, None, None, None, eps=eps, max_steps=max_steps, state=r)
        c2 = np.where(r["ok"], r["cost"], np.inf).reshape(len(ws), keep)
        found = {}
        for j, w in enumerate(ws):
            b = int(np.argmin(c2[j]))
            if np.isfinite(c2[j, b]):
                at_best = int(np.sum(c2[j] <= c2[j, b] * (1 + 1e-6) + 1e-300))
                found[w] = finish(w, r, j * keep + b, at_best, n, run_one(w))
        return found

    if refits is not None:
        refits.append(refit)
    return out


def _many(problems, groups, starts, spread, seed, max_steps, dtype, pad_to, step_check) -> list[ProblemFit]:
    """:func:`fit_many`: the fits (one program per sub-step count); for windows of one body
    (``groups``) the refit of suspect windows from the others' consensus and the poor-fit
    rule across windows (:mod:`rigidjax.identify._across`)."""
    W = len(problems)
    one_body = groups is not None

    refit_of = {}  # sub-step count -> (the part's windows, its refit through the part's program)
    options = (spread, seed, max_steps, dtype, pad_to, step_check)

    def fit_parts(ws, n_starts):
        res = {}
        for k in sorted({problems[w].substeps for w in ws}):  # one program per sub-step count
            idx = [w for w in ws if problems[w].substeps == k]
            part = [problems[w] for w in idx]
            hook = []
            try:
                fits = _fit(part, n_starts, *options, False, "fit_many", not one_body, refits=hook)
            except ValueError as e:  # name the problems by their place in the call
                raise ValueError(_renumbered(str(e), idx)) from None
            refit_of[k] = (idx, hook[0])
            res.update(zip(idx, fits))
        return res

    if not one_body:
        found = fit_parts(range(W), starts)
        return [found[w] for w in range(W)]
    layouts = [_Layout(p) for p in problems]
    kinds = [[(k, n, size) for k, n, _, _, _, size in lay.slots] + [lay.S, lay.nz] for lay in layouts]
    for i in range(1, W):
        if kinds[i] != kinds[0]:
            raise ValueError(
                f"fit_many: problems[{i}] has other unknowns than problems[0] ({kinds[i]} against {kinds[0]}): "
                "windows of one body (groups) share their model parameters"
            )

    found = fit_parts(range(W), starts)
    out = [found[w] for w in range(W)]
    signal = np.array([_signals(p) for p in problems])  # (W, observations), data units
    q = np.array([_residuals(f) for f in out])
    conv = np.array([f.status in _JUDGED for f in out])
    suspect = np.zeros(W, bool)
    for i in range(signal.shape[1]):  # each observation in its data's unit
        suspect |= _across.suspects(q[:, i], signal[:, i], conv, groups)
    bad, good = np.flatnonzero(suspect), np.flatnonzero(~suspect & np.all(np.isfinite(q), axis=1))
    if bad.size:
        mask, ng = _model_mask(layouts[0]).astype(bool), layouts[0].n_global
        z = np.stack([np.asarray(f.x, float)[:ng][mask] for f in out])
        # the consensus: the medoid in model coordinates scaled by their spread over the good windows
        spread_z = np.ones(z.shape[1])
        if good.size >= 2:
            mad = np.median(np.abs(z[good] - np.median(z[good], 0)), 0)
            spread_z = np.where(mad > 0, mad, 1.0)
        n_cons = 4
        given = {}
        for w in bad:
            lay_w = layouts[w]
            x0 = lay_w.start()
            cands = []
            if good.size:
                cands.append(int(good[_across.medoid(z[good] / spread_z)]))
                same = good[[str(groups[g]) == str(groups[w]) for g in good]]
                if same.size:
                    cands.append(int(same[_across.medoid(z[same] / spread_z)]))
            xs = []
            for c in dict.fromkeys(cands):
                for base in (x0, np.asarray(out[w].x, float)):  # its own start and optimum for the rest
                    x = base.copy()
                    x[:ng][mask] = z[c]
                    xs.append(x)
            rng = np.random.default_rng([seed, 1, int(w)])
            n_rand = _across.RESCUE_RANDOM + n_cons - len(xs)
            x = np.repeat(x0[None], n_rand, 0)
            x[:, :ng] += spread * rng.standard_normal((n_rand, ng)) * mask
            given[int(w)] = np.clip(np.concatenate([np.array(xs).reshape(-1, len(x0)), x]), lay_w.lo, lay_w.hi)
        refit = {}
        for idx, run_refit in refit_of.values():
            local = [j for j, w in enumerate(idx) if int(w) in given]
            if local:
                found = run_refit(local, {j: given[idx[j]] for j in local})
                refit.update({idx[j]: f for j, f in found.items()})
        for w, f in refit.items():
            old = out[w]
            # lower beyond round-off (the same minimum again keeps the first fit), or the same cost
            # where only the refit reached the minimum
            lower = np.isfinite(f.cost) and (not np.isfinite(old.cost) or f.cost < old.cost * (1 - 1e-8))
            same = np.isfinite(f.cost) and f.cost <= old.cost * (1 + 1e-8)
            if (lower and (f.status in _JUDGED or old.status not in _JUDGED)) or (
                same and f.status in _JUDGED and old.status not in _JUDGED
            ):
                res = ", ".join(
                    f"{v:.3g}{' ' + o.unit if getattr(o, 'unit', '') else ''}"
                    for v, o in zip(q[w], problems[w].observations)
                )
                note = (
                    f"refit from the other windows' consensus and random starts ({f.starts}; the first fit, residual "
                    f"{res}, {old.status.value}, was a suspect: cost {old.cost:.6g} -> {f.cost:.6g})"
                )
                out[w] = dataclasses.replace(f, message=f"{f.message}; {note}", starts=old.starts + f.starts)
    _judge(out, groups, signal, [p.observations for p in problems])
    return out


def _renumbered(message: str, idx) -> str:
    """``message`` of a fit of the problems ``idx`` with its ``problems[i]`` named by their
    index in the whole call."""
    import re

    return re.sub(r"problems\[(\d+)\]", lambda m: f"problems[{idx[int(m.group(1))]}]", message)


#: Statuses of a window fitted to its minimum (judged against the others).
_JUDGED = (FitStatus.CONVERGED, FitStatus.STEP_ERROR, FitStatus.UNIDENTIFIABLE)


def _signals(problem: Problem) -> list[float]:
    """Per observation, a window's signal for the rules across windows, in its data's unit:
    the RMS of the residual a constant prediction at the data's mean leaves (the observation's
    own residual without sensor parameters, times sigma: the variation of the measured
    values; quaternions about their mean orientation), over the segments it reads."""
    out = []
    for o in problem.observations:
        total, m = 0.0, 0
        for i, s in enumerate(problem.segments):
            if not obs.reads(o, i):
                continue
            t = np.asarray(s.t, float)
            y = np.asarray(s.data[o.key], float)
            c = y.mean(0)
            if isinstance(o, obs.Orientation):  # the sign-aligned mean quaternion, normalised
                c = np.mean(y * np.where(y @ y[0] < 0, -1.0, 1.0)[:, None], 0)
                c = c / np.linalg.norm(c)
            r = np.asarray(o.residual(jnp.asarray(np.broadcast_to(c, y.shape)), t, jnp.asarray(y), {}), float)
            r = r[o.weight(t) > 0]
            total += float(np.sum(r * r))
            m += r.size
        out.append(float(o.sigma) * float(np.sqrt(total / max(m, 1))))
    return out


def _residuals(f: ProblemFit) -> list[float]:
    """Per observation, a window's residual RMS in its data's unit (``inf`` where not finite)."""
    return [float(r) if np.isfinite(r) else np.inf for r in f.rms]


def _judge(out: list, groups, signal, observations) -> None:
    """The poor-fit rule across windows (:mod:`rigidjax.identify._across`) IN PLACE on the
    results of :func:`fit_many` with ``groups``: each observation in its data's unit, its sigma
    the noise; a window is poor where any observation is."""
    judged = [w for w, f in enumerate(out) if f.status in _JUDGED]
    if not judged:
        return
    q = np.array([_residuals(out[w]) for w in judged])
    reasons = [[] for _ in judged]
    for i, o in enumerate(observations[judged[0]]):
        why = _across.poor_reasons(
            q[:, i],
            signal[judged, i],
            [observations[w][i].sigma for w in judged],
            [groups[w] for w in judged],
            unit=getattr(o, "unit", ""),
            cause="a wrong basin, or motion the model does not describe",
        )
        for j, reason in enumerate(why):
            if reason is not None:
                label = f"{type(o).__name__} {o.key!r}: " if len(observations[judged[0]]) > 1 else ""
                reasons[j].append(label + reason)
    for j, w in enumerate(judged):
        if reasons[j]:
            out[w] = dataclasses.replace(out[w], status=FitStatus.POOR_FIT, message="; ".join(reasons[j]))


def _remembered(run, x, value):
    """``run`` (one problem's ``run_one``, compiled on its first call) that answers ``value``
    for the point ``x`` alone without evaluating: the result and the step check evaluate at
    the optimum, which the batched evaluation above already did."""

    def f(X):
        if len(X) == 1 and np.array_equal(X[0], x):
            return value
        return run(X)

    return f


def _failed(problem, layout, x0, starts, message, dtype) -> ProblemFit:
    """The ``nonfinite`` result of a problem that could not be fitted: the start values with
    infinite errors (:func:`fit_many` keeps the other problems' fits)."""
    xj = jnp.asarray(x0, dtype)
    mv, sv = layout.values(xj)
    values = {k: jax.tree_util.tree_map(np.asarray, v) for k, v in mv.items()}
    inf = lambda v: jax.tree_util.tree_map(lambda a: np.full(np.shape(a), np.inf), v)  # noqa: E731
    sensor = [{k: np.asarray(v) for k, v in d.items()} for d in sv]
    n = int(np.size(np.asarray(flat_values(layout, xj))))
    return ProblemFit(
        status=FitStatus.NONFINITE,
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
    )


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
            part = next((what for what, a, b in zip(_STRUCTURE_PARTS, key0, key or ()) if a != b), "its structure")
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
    n_steps = (len(np.asarray(seg.t)) - 1) * problem.substeps
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
        inputs = jax.tree_util.tree_map(lambda a: jnp.repeat(cast(a), problem.substeps, axis=0), seg.inputs)
    dts = jnp.full((n_steps,), float(np.median(np.diff(np.asarray(seg.t, float)))) / problem.substeps, dtype)

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


def _held(layout: _Layout, x, g) -> list[str]:
    """``"name (Transform coordinate k) = bound (lower|upper)"`` for each coordinate the
    optimiser holds at a bound at ``x`` (gradient ``g`` pointing out of the box, as
    :mod:`rigidjax.identify._lm`'s active set): the bound is on the transform's coordinate,
    not on the value (e.g. ``MomentRatios``' ``u = 1``: the edge ``Iz = Ix + Iy``)."""
    lo_, hi_ = (x <= layout.lo) & (g > 0), (x >= layout.hi) & (g < 0)
    out = []
    for i in np.flatnonzero(lo_ | hi_):
        for kind, name, tr, _, off, n in layout.slots:
            if off <= i < off + n:
                label = name if kind == "model" else f"{kind}.{name}"
                k = f" {i - off}" if n > 1 else ""
                out.append(
                    f"{label} ({type(tr).__name__} coordinate{k}) = {x[i]:.6g} ({'lower' if lo_[i] else 'upper'} bound)"
                )
    return out


def _model_mask(layout: _Layout) -> np.ndarray:
    m = np.zeros(layout.n_global)
    for kind, _, _, _, off, n in layout.slots:
        if kind == "model":
            m[off : off + n] = 1
    return m
