"""fit_inertia's per-window fits on the identification layer: every window a
:func:`~rigidjax.identify.recipes.window_problems` problem, all fitted by one
:func:`~rigidjax.identify.fit_many` call with the windows' recordings as ``groups`` (the
multi-start, the refit of suspect windows from the others' consensus, the step-error check and
the poor-fit rule across windows), then :func:`~rigidjax.identify.recipes.reference_check`
(DOP853); each :class:`~rigidjax.identify.ProblemFit` becomes one of
:class:`~rigidjax.identify.InertiaFit`'s rows.

Part of :func:`rigidjax.identify.fit_inertia` (module docstring of :mod:`rigidjax.identify._fit`).
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np

from . import recipes
from ._fit_many import _many
from ._problem_fit import _fit
from ._model import Spec, equation_error_guess, phys_theta
from ._result import FitStatus
from ._step_error import RICHARDSON
from ._windows import K_MAX, REF_TOL, _estimates
from .problem import _Layout

#: fit_inertia's rows state the step error by the second-order Richardson factor
#: ``2^2 / (2^2 - 1)`` of the midpoint step; the layer's check bounds it by the first-order
#: factor :data:`~rigidjax.identify._step_error.RICHARDSON` (2). Rows scale the layer's move by
#: their ratio (2/3).
SECOND_ORDER = (4.0 / 3.0) / RICHARDSON

#: What a poor window's message names as its likely cause.
POOR_CAUSE = "a wrong basin, or not free flight"


def per_window(run, wins: np.ndarray, k: np.ndarray, starts: int, *, adapt: bool, reference_check: bool) -> dict:
    """Fit each window of ``wins`` alone; returns ``{i: row fields}`` (the rows' underscored
    fields feed :func:`~rigidjax.identify._joint._combine_windows` and the joint fit). ``k``:
    the sub-steps per window, updated IN PLACE to those each fit ended with. ``adapt``: the
    layer's step-error refinement (``substeps="auto"``), else its report only."""
    if wins.size == 0:
        return {}
    spec = run.spec
    segs = [run.segs[i] for i in wins]
    ks = [int(k[i]) for i in wins]
    problems = recipes._window_problems(segs, spec, ks)
    given = _other_guesses(run, wins, problems, starts - 1)
    options = dict(
        spread=0.5,
        seed=run.seed,
        max_steps=run.phase1_steps + run.max_steps,
        dtype=run.dtype,
        pad_to=None,
        step_check="refine" if adapt else "report",
    )
    with warnings.catch_warnings():  # fit_inertia warns of float32 itself
        warnings.filterwarnings("ignore", message="fit_many: fitting in float32")
        fits = _many(
            problems,
            [run.labels[i] for i in wins],
            starts,
            **options,
            progress=run.progress,
            keep=1,
            first_steps=run.phase1_steps,
            cause=POOR_CAUSE,
            given=given,
            classical=True,
        )
        if reference_check:
            fits, ref = _reference_refined(run, problems, fits, adapt, options)
        else:
            ref = np.full(len(fits), np.nan)
    out = {}
    n_phys, n_bias = spec.n_phys, spec.n_bias
    for j, (i, f, p) in enumerate(zip(wins, fits, problems)):
        k[i] = int(f.substeps)
        cov = np.asarray(f.covariance_classical, float)  # [ratios | drag | bias | omega0]
        w0 = np.asarray(f.initial, float)[0]
        b = np.asarray(f.sensor[0]["bias"], float) if spec.bias else np.zeros(3)
        xp = np.concatenate([np.ravel(f.values["ratios"]), np.ravel(f.values.get("drag", [])), b[:n_bias], w0])
        est, se, J = _estimates(run, xp[:n_phys], cov[:n_phys, :n_phys])
        row = dict(
            status=f.status,
            reason="" if f.status == FitStatus.CONVERGED else _in_our_names(spec, f.message),
            rms=float(f.rms[0]),
            rms_reference=float(ref[j]),
            iterations=int(f.iterations),
            optimality=float(f.decrement),
            omega0=w0.tolist(),
            omega0_se=np.sqrt(np.maximum(np.diag(cov)[-3:], 0)).tolist(),
            estimates=est,
            se=se,
            step_shift_se=_shift_se(run, f, J, se, cov),
            _theta=phys_theta(xp[None, :n_phys], spec)[0][0],
            _w0=w0,
            _bias=b,
            _xp=xp,
            _cov=cov,
            _J=J,
        )
        if np.isfinite(f.step_rms):
            row["step_error_rms"] = float(SECOND_ORDER * p.observations[0].sigma * f.step_rms)
        if spec.bias:
            row["bias"] = b.tolist()
            row["bias_se"] = np.sqrt(np.maximum(np.diag(cov)[n_phys : n_phys + 3], 0)).tolist()
        out[int(i)] = row
    return out


def _reference_refined(run, problems, fits, adapt: bool, options: dict):
    """:func:`~rigidjax.identify.recipes.reference_check` of the fits; with ``adapt``, a
    window it marks ``step_error`` (its DOP853 residual more than :data:`REF_TOL` off the
    fit's own) is refitted at twice its sub-steps (from its optimum and its first start,
    up to :data:`K_MAX` sub-steps) and checked again. Returns ``(fits, rms_reference)``."""
    fits = list(fits)
    checked, ref = recipes.reference_check(problems, fits, tolerance=REF_TOL)
    for _ in range(8):
        need = [
            j
            for j, (f, c) in enumerate(zip(fits, checked))
            if adapt and f.status == FitStatus.CONVERGED and c.status == FitStatus.STEP_ERROR and f.substeps < K_MAX
        ]
        if not need:
            break
        finer = [dataclasses.replace(problems[j], substeps=min(2 * int(fits[j].substeps), K_MAX)) for j in need]
        again = _fit(
            finer,
            2,
            **dict(options, step_check="report"),
            raise_on_failure=False,
            name="fit_inertia",
            sigma_rule=False,
            progress=run.progress,
            keep=1,
            first_steps=run.phase1_steps,
            given={a: np.asarray(fits[j].x, float)[None] for a, j in enumerate(need)},
            classical=True,
        )
        redo, ref_new = recipes.reference_check(finer, again, tolerance=REF_TOL)
        for a, j in enumerate(need):
            note = f"sub-steps doubled to {again[a].substeps} by the DOP853 check"
            fits[j] = dataclasses.replace(again[a], message=f"{again[a].message}; {note}")
            checked[j] = dataclasses.replace(redo[a], message=f"{redo[a].message}; {note}")
            ref[j] = ref_new[a]
    return checked, ref


#: Names in the layer's messages -> fit_inertia's (model values over I_yy, sensor bias, initial rate).
_PRINCIPAL = ("Ix/Iy", "Iz/Iy")
_TENSOR = ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "Ixz/Iy", "Iyz/Iy")


def _in_our_names(spec, message: str, sources=None, windows=None) -> str:
    """A layer message with its value names as fit_inertia reports them (``ratios[0]`` ->
    ``Ix/Iy``, ``drag`` -> ``drag/Iy``, ``sensor0.bias[1]`` -> ``bias_y``,
    ``initial[0][2]`` -> ``omega0_z``) and the sub-step option's name. A joint fit's
    (``sources``: the recording of each gyroscope, ``windows``: the name of each segment):
    ``sensor1.bias[1]`` -> ``bias_y (recording)``, ``initial[4][2]`` -> ``omega0_z (window)``."""
    ratios = _TENSOR if spec.tensor else _PRINCIPAL
    message = re.sub(r"\bratios\[(\d)\]", lambda m: ratios[int(m.group(1))], message)
    drag = spec.drag_names
    if len(drag) == 1:
        message = re.sub(r"\bdrag\b(?!/)", drag[0], message)
    else:
        message = re.sub(r"\bdrag\[(\d)\]", lambda m: drag[int(m.group(1))], message)
    message = re.sub(
        r"\bsensor(\d+)\.bias\[(\d)\]",
        lambda m: "bias_" + "xyz"[int(m.group(2))] + (f" ({sources[int(m.group(1))]})" if sources else ""),
        message,
    )
    message = re.sub(
        r"\binitial\[(\d+)\]\[(\d)\]",
        lambda m: "omega0_" + "xyz"[int(m.group(2))] + (f" ({windows[int(m.group(1))]})" if windows else ""),
        message,
    )
    return message.replace("Problem.substeps", "substeps").replace("(1 sub-steps)", "(1 sub-step)")


def _other_guesses(run, wins: np.ndarray, problems, n: int) -> dict:
    """``{j: (m, P)}`` further start points of window ``wins[j]`` (``m <= n``), in the layer's
    coordinates: the equation-error estimate of all windows of its recording (one body: a
    short or noisy window's own linear estimate can be far off), and of the simplest model
    (principal moments, no drag: the tensor's and the drag's estimates are the least
    determined) with a drag of 1 % of the trace. Each problem's own start is its window's
    estimate; random starts fill the rest."""
    spec = run.spec
    if n < 1:
        return {}
    cands = [[] for _ in wins]
    by_source = {}
    for j, i in enumerate(wins):
        src = run.segs[i].source
        if src not in by_source:
            same = [s for s in run.segs if s.source == src]
            by_source[src] = equation_error_guess(same, spec) if len(same) > 1 else None
        if by_source[src] is not None:
            cands[j].append(by_source[src])
        if spec.tensor or spec.drag:
            g = equation_error_guess([run.segs[i]], Spec(False, None, False))
            if g is not None:
                th = np.zeros(spec.n_theta)
                th[:3] = g[:3]
                th[spec.n_icomp :] = 0.01 * np.sum(g[:3])
                cands[j].append(th)
    out = {}
    lay = _Layout(problems[0])  # one structure: the same slots for every window
    for j, p in enumerate(problems):
        for theta in cands[j][:n]:
            x = start_vector(lay, p, recipes._window_starts(run.segs[wins[j]], spec, theta))
            out.setdefault(j, []).append(x)
    return {j: np.array(x) for j, x in out.items()}


def start_vector(lay, problem, values: dict, biases=None) -> np.ndarray:
    """A start point of a window or joint problem (layout ``lay``) in the layer's
    coordinates: the model ``values`` (:func:`~rigidjax.identify.recipes._window_starts`), each
    segment's initial rate from its ``state0``, and the gyroscopes' ``biases`` (one (3,) per
    observation; default: their own start, 0)."""
    x = lay.start()
    x[lay.n_global :] = np.concatenate([np.asarray(problem.initial.guess(s.state0), float) for s in problem.segments])
    for kind, name, tr, _, off, size in lay.slots:
        if kind == "model":
            x[off : off + size] = np.ravel(tr.inverse(values[name]))
        elif name == "bias" and biases is not None:
            x[off : off + size] = biases[int(kind[6:])]
    return x


def _shift_se(run, f, J: np.ndarray, se: dict, cov: np.ndarray, bias_names=None) -> dict:
    """The rows' ``step_shift_se``: how far the step error moves each reported quantity, in its
    (classical) standard errors, signed as fitted minus exact (the layer's ``step_delta`` is
    exact minus fitted), at the second-order factor (:data:`SECOND_ORDER`). Empty where the
    check did not run or failed. ``bias_names``: ``[(name, index)]`` of the biases in the
    fit's values (default: one gyroscope's, ``bias_x`` ... after the model values)."""
    delta = np.asarray(f.step_delta, float)
    n_phys = run.spec.n_phys
    if delta.size < n_phys or not np.all(np.isfinite(delta)):
        return {}
    move = -SECOND_ORDER * delta
    out = {}
    for j, name in enumerate(run.names):
        if np.isfinite(se[name]) and se[name] > 0:
            out[name] = float(J[j] @ move[:n_phys] / se[name])
    if bias_names is None:
        bias_names = [(f"bias_{c}", n_phys + a) for a, c in enumerate("xyz"[: run.spec.n_bias])]
    for name, a in bias_names:
        e = float(np.sqrt(max(cov[a, a], 0.0)))
        if e > 0 and np.isfinite(e):
            out[name] = float(move[a] / e)
    return out
