"""Many problems at once: :func:`fit_many` (one compiled program for all, or one per sub-step
count where the whole state is rolled out), and for
windows of one body (``groups``) the refit of suspect windows from the others' consensus and
the poor-fit rule across windows (:mod:`rigidjax.identify._across`); :func:`~rigidjax.identify.fit` and the
method: :mod:`rigidjax.identify._problem_fit`."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from .. import so3
from . import _across
from ._lm import one_blas_thread
from . import observations as obs
from ._problem_fit import _check_same_structure, _fit, _model_mask, _spread_scale, in_dtype
from ._problem_result import ProblemFit
from ._result import FitStatus
from .problem import Problem, _Layout

__all__ = ["fit_many"]


@one_blas_thread
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
    progress: Callable | None = None,
    keep: int | None = None,
) -> list[ProblemFit]:
    """Fit several independent problems of one structure at once (e.g. one per measured
    window, each with its own values): one compiled program evaluates every start of every
    problem per optimiser iteration (see :func:`~rigidjax.identify.fit` for the options, the same per problem).

    The problems must share everything the program is built from: the model's values, the
    stepper, the parameters (``where``, transform, ``into``, start shapes), observations
    (but their ``sigma``: it enters as data, for rigidjax's observation classes), initial
    state, signal map and the number of segments; their data, start values, ``sigma``,
    ``substeps`` and segment lengths may differ (every segment is padded to the longest, or
    ``pad_to``). The sub-steps enter the program as data: one program serves every problem
    (the problems run ordered by sub-steps, as a call's rows take as long as their most
    sub-steps). Each problem draws its
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

    ``progress``: as :func:`~rigidjax.identify.fit`'s, ``progress(n_active)`` after every
    optimiser iteration, counting the starts of every problem still iterating. ``keep``: as
    :func:`~rigidjax.identify.fit`'s, per problem (the refits of suspects always keep
    ``_across.RESCUE_KEEP``, 4).

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
            of :func:`~rigidjax.identify.fit`.
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
    return _many(problems, groups, starts, spread, seed, max_steps, dtype, pad_to, step_check, progress, keep)


def _many(
    problems,
    groups,
    starts,
    spread,
    seed,
    max_steps,
    dtype,
    pad_to,
    step_check,
    progress=None,
    keep=None,
    first_steps=None,
    cause="a wrong basin, or motion the model does not describe",
    given=None,
    classical=False,
) -> list[ProblemFit]:
    """:func:`fit_many`: the fits (one program, see :func:`fit_many`); for windows of one body
    (``groups``) the refit of suspect windows from the others' consensus and the poor-fit
    rule across windows (:mod:`rigidjax.identify._across`). ``first_steps``: see
    :func:`~rigidjax.identify._problem_fit._fit`, and ``given`` (``{w: (n, P)}``, problems
    numbered as in ``problems``) and ``classical``; ``cause``: what a poor fit's message names as its likely
    cause (fit_inertia: "not free flight")."""
    W = len(problems)
    one_body = groups is not None

    # the problems' layouts and structure first (one structure): a refused
    # problem is named before anything is fitted
    typed = in_dtype(problems, dtype)
    layouts = [_layout(p) for p in typed]
    for i, lay in enumerate(layouts):
        if isinstance(lay, ValueError):
            raise ValueError(f"fit_many: problems[{i}]: {lay}")
    _check_same_structure(typed, layouts, dtype, "fit_many")
    # one program for all (the sub-steps are data), the problems ordered by sub-steps, then
    # length: a call's rows run the most sub-steps and the longest segment among them
    idx = sorted(range(W), key=lambda w: (np.max(problems[w].substeps), max(len(s.t) for s in problems[w].segments)))
    part = [typed[w] for w in idx]
    hook = []
    try:
        options = (spread, seed, max_steps, dtype, pad_to, step_check)
        fits = _fit(
            part,
            starts,
            *options,
            False,
            "fit_many",
            not one_body,
            refits=hook,
            laid_out=(part, [layouts[w] for w in idx]),
            progress=progress,
            keep=keep,
            first_steps=first_steps,
            given={j: given[w] for j, w in enumerate(idx) if w in given} if given else None,
            classical=classical,
        )
    except ValueError as e:  # name the problems by their place in the call
        msg = str(e)
        if W == 1 and not msg.startswith("fit_many:"):  # one problem: unnamed
            msg = f"fit_many: problems[0]: {msg}"
        raise ValueError(_renumbered(msg, idx)) from None
    out = [None] * W
    for w, f in zip(idx, fits):
        out[w] = f
    if not one_body:
        return out
    signal = np.array([_signals(p) for p in problems])  # (W, observations), data units
    q = np.array([_residuals(f) for f in out])
    # a window with too little data (not fitted, or fitted and found so: its residual is
    # the overfit's) is never a suspect, nor in any median
    fitted = np.flatnonzero([not f.too_few for f in out])
    conv = np.array([out[w].status in _JUDGED for w in fitted], bool)
    suspect = np.zeros(W, bool)
    for i in range(signal.shape[1]):  # each observation in its data's unit
        if fitted.size:
            suspect[fitted] |= _across.suspects(q[fitted, i], signal[fitted, i], conv, [groups[w] for w in fitted])
    bad, good = np.flatnonzero(suspect), np.flatnonzero(~suspect & np.all(np.isfinite(q), axis=1))
    if bad.size:
        given = _consensus_starts(out, layouts, groups, bad, good, seed, spread)
        refit = {}
        local = [j for j, w in enumerate(idx) if int(w) in given]
        if local:
            found = hook[0](local, {j: given[idx[j]] for j in local})
            refit.update({idx[j]: f for j, f in found.items()})
        for w, f in refit.items():
            old = out[w]
            if _better(f, old):
                res = ", ".join(
                    f"{v:.3g}{' ' + o.unit if getattr(o, 'unit', '') else ''}"
                    for v, o in zip(q[w], problems[w].observations)
                )
                note = (
                    f"refit from the other windows' consensus and random starts ({f.starts}; the first fit, residual "
                    f"{res}, {old.status.value}, was a suspect: cost {old.cost:.6g} -> {f.cost:.6g})"
                )
                # starts_at_best counts among the refit's kept starts (all where it kept all)
                kept = f.starts if f.kept is None else f.kept
                out[w] = dataclasses.replace(f, message=f"{f.message}; {note}", starts=old.starts + f.starts, kept=kept)
    _judge(out, groups, signal, [p.observations for p in problems], cause)
    return out


def _layout(problem: Problem):
    """``problem``'s layout, or the ``ValueError`` refusing it."""
    try:
        return _Layout(problem)
    except ValueError as e:
        return e


def _consensus_starts(out, layouts, groups, bad, good, seed, spread) -> dict:
    """``{w: (n, P)}`` start points of the refit of each suspect window ``w`` in ``bad``: the
    consensus of the ``good`` windows (the medoid of their model coordinates, each scaled by
    its spread over them; over all, and over ``w``'s recording) with ``w``'s own start and
    its optimum for the other unknowns (up to 4 points), then random starts around its start
    (``spread``, seeded per window) to :data:`_across.RESCUE_RANDOM` + 4 in all."""
    mask, ng = _model_mask(layouts[0]).astype(bool), layouts[0].n_global
    z = np.stack([np.asarray(f.x, float)[:ng][mask] for f in out])
    spread_z = np.ones(z.shape[1])
    if good.size >= 2:
        mad = np.median(np.abs(z[good] - np.median(z[good], 0)), 0)
        spread_z = np.where(mad > 0, mad, 1.0)
    n_cons = 4  # two consensus points x two bases
    given = {}
    for w in bad:
        lay = layouts[w]
        x0 = lay.start()
        cands = []
        if good.size:
            cands.append(int(good[_across.medoid(z[good] / spread_z)]))
            same = good[[str(groups[g]) == str(groups[w]) for g in good]]
            if same.size:
                cands.append(int(same[_across.medoid(z[same] / spread_z)]))
        xs = []
        for c in dict.fromkeys(cands):
            for base in (x0, np.asarray(out[w].x, float)):
                x = base.copy()
                x[:ng][mask] = z[c]
                xs.append(x)
        rng = np.random.default_rng([seed, 1, int(w)])
        n_rand = _across.RESCUE_RANDOM + n_cons - len(xs)
        x = np.repeat(x0[None], n_rand, 0)
        x[:, :ng] += spread * rng.standard_normal((n_rand, ng)) * _spread_scale(lay, x0)
        given[int(w)] = np.clip(np.concatenate([np.array(xs).reshape(-1, len(x0)), x]), lay.lo, lay.hi)
    return given


def _better(f: ProblemFit, old: ProblemFit) -> bool:
    """Whether a refit ``f`` replaces the first fit ``old``: lower beyond round-off (the same
    minimum again keeps the first fit) without losing the minimum, or the same cost where only
    the refit reached the minimum."""
    lower = np.isfinite(f.cost) and (not np.isfinite(old.cost) or f.cost < old.cost * (1 - 1e-8))
    same = np.isfinite(f.cost) and f.cost <= old.cost * (1 + 1e-8)
    return bool(
        (lower and (f.status in _JUDGED or old.status not in _JUDGED))
        or (same and f.status in _JUDGED and old.status not in _JUDGED)
    )


def _renumbered(message: str, idx) -> str:
    """``message`` of a fit of the problems ``idx`` with its ``problems[i]`` named by their
    index in the whole call."""
    return re.sub(r"problems\[(\d+)\]", lambda m: f"problems[{idx[int(m.group(1))]}]", message)


#: Statuses of a window fitted to its minimum (judged against the others).
_JUDGED = (FitStatus.CONVERGED, FitStatus.STEP_ERROR, FitStatus.UNIDENTIFIABLE)


def _signals(problem: Problem) -> list[float]:
    """Per observation, a window's signal for the rules across windows, in its data's unit:
    the RMS of its measured values about their mean (quaternions: the rotation angle from
    their mean orientation), over the segments it reads."""
    out = []
    for o in problem.observations:
        parts = []
        for i, s in enumerate(problem.segments):
            if not obs.reads(o, i):
                continue
            y = np.asarray(s.data[o.key], float)
            if isinstance(o, obs.Orientation):  # the angle from the sign-aligned mean quaternion
                y = y * np.where(y @ y[0] < 0, -1.0, 1.0)[:, None]
                c = np.mean(y, 0) / np.linalg.norm(np.mean(y, 0))
                parts.append(np.asarray(so3.log(so3.multiply(so3.conjugate(jnp.asarray(c)), jnp.asarray(y))), float))
            else:
                parts.append(y - y.mean(0))
        d = np.concatenate([p.reshape(len(p), -1) for p in parts])
        out.append(float(np.sqrt(np.mean(d * d))))
    return out


def _residuals(f: ProblemFit) -> list[float]:
    """Per observation, a window's residual RMS in its data's unit (``inf`` where not finite)."""
    return [float(r) if np.isfinite(r) else np.inf for r in f.rms]


def _judge(out: list, groups, signal, observations, cause: str) -> None:
    """The poor-fit rule across windows (:mod:`rigidjax.identify._across`) IN PLACE on the
    results of :func:`fit_many` with ``groups``: each observation in its data's unit, its sigma
    the noise; a window is poor where any observation is."""
    judged = [w for w, f in enumerate(out) if f.status in _JUDGED and not f.too_few]
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
            cause=cause,
        )
        for j, reason in enumerate(why):
            if reason is not None:
                label = f"{type(o).__name__} {o.key!r}: " if len(observations[judged[0]]) > 1 else ""
                reasons[j].append(label + reason)
    for j, w in enumerate(judged):
        if reasons[j]:
            # the reasons first, then what the fit said (its optimum, a refit's note)
            message = "; ".join(reasons[j]) + f"; the fit: {out[w].message}"
            out[w] = dataclasses.replace(out[w], status=FitStatus.POOR_FIT, message=message)


def multistart_problems(fits, problems, *, starts: int, seed: int, spread: float, max_steps: int, progress=None):
    """:func:`~rigidjax.identify.multistart_check` of the layer's fits: each problem fitted
    again from ``starts`` points (its given values and random ones, ``spread`` around them,
    another ``seed`` than the fit's), every start to its end, at the sub-steps the fit ended
    with, no step check. Returns one dict per fit (see ``multistart_check``)."""
    if isinstance(fits, ProblemFit):
        fits = [fits]
    elif not isinstance(fits, (list, tuple)):
        raise TypeError(
            "multistart_check: expected an InertiaFit, a ProblemFit or a list of ProblemFits; "
            f"got {type(fits).__name__}"
        )
    problems = [problems] if isinstance(problems, Problem) else list(problems or [])
    for i, f in enumerate(fits):
        if not isinstance(f, ProblemFit):
            raise TypeError(f"multistart_check: fits[{i}] is a {type(f).__name__}, not a ProblemFit")
    if len(problems) != len(fits):
        raise ValueError(
            f"multistart_check: the layer's fits need their problems, one per fit (problems=...); got {len(fits)} "
            f"fit(s) and {len(problems)} problem(s)"
        )
    again = [dataclasses.replace(p, substeps=f.substeps) for p, f in zip(problems, fits)]
    found = fit_many(
        again, starts=starts, seed=seed, spread=spread, max_steps=max_steps, step_check="off", progress=progress
    )
    out = []
    for i, (f, g) in enumerate(zip(fits, found)):
        rep, best = float(f.cost), float(g.cost)
        searched = g.status != FitStatus.NONFINITE and np.isfinite(best)
        if not searched:  # no start could be evaluated: nothing to compare with
            excess = np.nan
        elif not np.isfinite(rep):  # the fit has no cost, the search found one
            excess = np.inf
        else:
            excess = rep / best - 1 if best > 0 else (0.0 if rep == 0 else np.inf)
        out.append(
            {
                "name": f"problems[{i}]",
                "reported_cost": rep,
                "best_cost": best if searched else np.nan,
                "excess": excess,
                "best_values": {k: np.asarray(v).tolist() for k, v in g.values.items()} if searched else None,
                "starts_at_best": int(g.starts_at_best),
                "n_starts": int(g.starts),
            }
        )
    return out
