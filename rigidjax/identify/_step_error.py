r"""Does the stepper's own error move the estimates? The step-error check of :func:`fit`.

:func:`rigidjax.identify.fit` fits the DISCRETE model: the stepper at ``substeps`` steps per
sample interval. Its prediction differs from the exact motion by the global step error
``e = r_k - r_exact`` (``r``: the weighted residuals; ``k`` steps per sample), which the
least-squares estimate absorbs. Richardson's estimate from the same point at ``2k``
steps, ``e ~= (r_k - r_2k) 2^p / (2^p - 1)`` for a method of order ``p``, is taken with
``p = 1`` (the factor 2): an upper bound for every order >= 1, exact for the first-order
attitude of ``Midpoint(attitude="new")``, 1.5 times the estimate of the second-order
steppers (midpoint rates and ``attitude="midpoint"``, generalized-alpha, the variational
midpoint rule).

The estimate of the exact model moves, to first order, by ``dx = (J^T J)^+ J^T e`` (the
Gauss-Newton step of the residuals with ``e`` removed, the pseudo-inverse on the directions
the data determine); each fitted value moves by ``v(x + dx) - v(x)``, reported in its
standard errors. Above :data:`STEP_SHIFT_MAX` the stepper's error is not negligible next
to the noise: :func:`fit` doubles ``substeps`` and refits from the optimum, and stops when
the largest shift no longer shrinks (below :data:`SHRINK_MIN` of the previous one): the
difference is then round-off (e.g. float32), not step error. That comparison measures the
shifts in the FIRST fit's standard errors: each refit's own standard errors shrink with the
model error they contain (the residual variance, the block sandwich), so the shift in its
own units may stay flat while the shift itself halves. A converged fit whose values
still move by more than :data:`STEP_SHIFT_MAX` after the check (``step_check="report"``, the
doublings exhausted, or a refit that failed; not where the shift stopped shrinking, which
is round-off and only named in the message) gets the status
:attr:`~rigidjax.identify.FitStatus.STEP_ERROR`: the optimum of the discrete model was
reached, but the stepper's error biases the values by more than the stated amount.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from ..info import Status
from . import _lm
from ._problem_result import flat_values_of, result
from ._program import CHUNK_ROWS, _caller, _chunked, _evaluator, _program, _stack_many, doubled
from ._result import FitStatus

#: A step-error shift of any fitted value above this many standard errors makes :func:`fit`
#: refine the steps (a 0.3 se bias changes a 95 % interval's coverage by under 2 points).
STEP_SHIFT_MAX = 0.3

#: At most this many doublings of ``substeps`` (8 times the given steps).
MAX_DOUBLINGS = 3

#: A doubling that leaves the largest shift above this fraction of the previous one stops the
#: refinement: a step error of order >= 1 halves at least; what does not shrink is round-off.
SHRINK_MIN = 0.75

#: ``2^p / (2^p - 1)`` at ``p = 1``: the Richardson factor bounding every order >= 1.
RICHARDSON = 2.0


def shift(r_k: np.ndarray, r_2k: np.ndarray, J: np.ndarray, x: np.ndarray, values, se: np.ndarray, measured=None):
    """What the step error does to the fitted values.

    Args:
        r_k: ``(m,)`` weighted residuals at ``x`` with the fit's steps; ``r_2k``: with twice
            as many (padded samples 0 in both).
        J: ``(m, P)`` their Jacobian at ``x`` (the fit's steps).
        x: ``(P,)`` the optimum.
        values: ``values(x) -> (V,)`` the flattened fitted values (model then sensor).
        se: ``(V,)`` their standard errors (inf where undetermined).
        measured: the number of measured residual components (the RMS's denominator;
            default ``m``).

    Returns:
        ``(shift, delta, rms)``: ``shift`` ``(V,)`` ``|v(x + dx) - v(x)| / se`` (0 where ``se``
        is inf or 0); ``delta`` ``(V,)`` the signed ``v(x + dx) - v(x)`` in the values' units
        (where the exact model's estimate lies from the fitted one, to first order); ``rms``
        the RMS of the step-error estimate ``e`` over the measured residual components, in
        units of their ``sigma``.
    """
    e = RICHARDSON * (np.asarray(r_k, float) - np.asarray(r_2k, float))
    dx = gauss_newton_step(J, e)
    delta = np.asarray(values(x + dx), float) - np.asarray(values(x), float)
    se = np.asarray(se, float)
    ok = np.isfinite(se) & (se > 0)
    m = e.size if measured is None else max(int(measured), 1)
    return np.where(ok, np.abs(delta) / np.where(ok, se, 1.0), 0.0), delta, float(np.sqrt(np.sum(e**2) / m))


def gauss_newton_step(J: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``(J^T J)^+ J^T e`` for ``J (m, P)``, ``e (m,)``: from the normal equations scaled to
    a unit diagonal, the pseudo-inverse on eigenvalues above 1e-12 of the largest (the
    directions the data determine, as the fit's covariance). Not ``lstsq`` on ``J`` (an SVD):
    in fit_inertia's joint fit of the 69 racquet flips with a bias per recording (a Jacobian
    of 24.6k x 213) it took 3.9 s of the warm fit's 20.5 s, this 0.4 s (the fit 15.4 s); the
    results agree to 1e-13 (relative) on a random matrix of that shape and condition 1e3.
    The shift is a first-order estimate judged at 0.3 standard errors: the squared
    condition number of the scaled equations costs nothing there in float64."""
    J = np.asarray(J, float)
    A = J.T @ J
    d = np.sqrt(np.maximum(np.diag(A), 1e-300))
    w, V = np.linalg.eigh(A / d[:, None] / d[None, :])
    keep = w > 1e-12 * max(w.max(), 1e-300)
    return (V[:, keep] / w[keep]) @ (V[:, keep].T @ ((J.T @ np.asarray(e, float)) / d)) / d


def finer_caller(problems, layout, dtype, N, rows: int | None = None, stacked=None):
    """``finer(X, which) -> (r_2k, ok)``: the weighted residuals of problems ``which`` at the
    points ``X`` with twice their sub-steps (``ok``: every step succeeded), through one
    program over all of ``problems``' data in calls of ``rows`` rows (default: the problems,
    at most :data:`CHUNK_ROWS`): the first check of :func:`refine_steps` of a fit's
    problems, batched (one call per window: ~6 ms each), and later checks of single problems
    of that fit (a refit) without a program compiled for them alone. The sub-steps are data,
    so the fit's own Jacobian program serves (``rows``: the fit's) and the check compiles
    nothing (the 69 racquet flips: ~1.5 s of tracing and compilation saved). ``stacked``:
    ``problems``' :class:`~rigidjax.identify._program._Stacked` where the caller has them
    (their sub-steps doubled here instead of stacking the segments again)."""
    finer = [dataclasses.replace(p, substeps=doubled(p.substeps)) for p in problems]
    if stacked is not None:
        stacked = [dataclasses.replace(s, k=2 * s.k) for s in stacked]
    _, arrays = _stack_many(finer, dtype, N, stacked)
    call = _caller(_program(finer[0], layout, dtype), arrays, dtype)
    rows = min(len(problems), CHUNK_ROWS) if rows is None else rows

    def at(X, which):
        r_2k, status = _chunked(call, np.asarray(X), np.asarray(which), rows)[:2]
        return np.asarray(r_2k, float), np.all(np.asarray(status) == Status.SUCCESS, axis=1)

    return at


def _step_shift(problem, layout, out, run, x, dtype, N, finer=None, shape=None, classical=False) -> tuple:
    """:func:`shift` at ``x``, ``(shift, delta, rms)`` (NaN where a step failed at twice the
    steps; segments padded to ``N``; ``finer``: ``(r_2k, ok)`` at ``x`` where already
    evaluated, see :func:`finer_caller`; ``shape``: see :func:`refine_steps`)."""
    r_k, _, J = run(x[None])
    if finer is None:
        copies, rows = shape or (1, None)
        r_2k, ok = finer_caller([problem] * copies, layout, dtype, N, rows)(np.asarray(x)[None], np.zeros(1, int))
        finer = (r_2k[0], bool(ok[0]))
    r_2k, ok = finer
    if not ok:
        return np.full(len(out.names), np.nan), np.full(len(out.names), np.nan), float("nan")
    se = _se(out, classical)
    values = flat_values_of(problem, layout, dtype)
    return shift(r_k[0], np.asarray(r_2k, float), J[0], x, values, se, out.measured)


def refine_steps(
    problem,
    layout,
    out,
    run,
    x,
    g,
    dtype,
    N,
    max_steps,
    refine,
    sigma_rule: bool = True,
    finer=None,
    progress=None,
    shape=None,
    classical=False,
):
    """The step-error check (:mod:`rigidjax.identify._step_error`): while the stepper's error
    moves a value by more than ``STEP_SHIFT_MAX`` standard errors, double ``substeps`` (at most
    ``MAX_DOUBLINGS`` times; none without ``refine``) and refit from the optimum (one start:
    the multi-start search was done). Returns ``(out, x, g)`` of the last fit, with
    ``substeps``, ``step_shift``, ``step_delta`` and ``step_rms``. ``finer``: the residuals at
    twice the steps at ``x`` where already evaluated (:func:`finer_caller`). ``progress``: the
    fit's (after every iteration).
    ``shape``: ``(problems, rows per call)`` of the fit's program (the sub-steps are data):
    the refits and checks at other steps then run through that program with this problem in every row of its data (the
    same shapes: no trace or compilation; a 32-row call per iteration, ~7 ms for the racquet
    windows, instead of a program traced and compiled for one problem, 1.5-5 s); ``None``: a
    program for this problem alone. ``classical``: shifts in the classical standard errors
    (fit_inertia's rows report those) instead of the reported ones (:func:`_se`)."""
    first, previous, roundoff = out, np.inf, False
    se_first = _se(first, classical)
    for doubling in range(MAX_DOUBLINGS + 1):
        shift, delta, rms = _step_shift(
            problem, layout, out, run, x, dtype, N, finer if doubling == 0 else None, shape, classical
        )
        worst = int(np.nanargmax(shift)) if np.any(np.isfinite(shift)) else 0
        # the shift itself (not in this fit's standard errors, which shrink with the model
        # error they contain), in the first fit's standard errors: a fixed scale
        se_now = _se(out, classical)
        ok = np.isfinite(se_now) & np.isfinite(se_first) & (se_first > 0)
        moved = float(np.max(np.where(ok, shift * np.where(ok, se_now, 0.0) / np.where(ok, se_first, 1.0), shift)))
        out = dataclasses.replace(out, substeps=problem.substeps, step_shift=shift, step_delta=delta, step_rms=rms)
        if not np.all(np.isfinite(shift)):
            why = f"a step failed at substeps={doubled(problem.substeps)}"
            out = dataclasses.replace(out, message=f"{out.message}; no step-error check ({why})")
            break
        small = bool(np.all(shift <= STEP_SHIFT_MAX))
        if small or out.status not in (FitStatus.CONVERGED, FitStatus.POOR_FIT):
            break
        if moved > SHRINK_MIN * previous:
            out = dataclasses.replace(
                out,
                message=f"{out.message}; the steps' error estimate moves {out.names[worst]} by {shift[worst]:.2g} "
                f"standard errors at substeps={problem.substeps} and does not shrink with the steps (round-off?)",
            )
            roundoff = True
            break
        previous = moved
        if doubling == MAX_DOUBLINGS or not refine:
            out = dataclasses.replace(
                out,
                message=f"{out.message}; the steps' error {'still ' if doubling else ''}moves {out.names[worst]} by "
                f"{shift[worst]:.2g} standard errors at substeps={problem.substeps}: raise Problem.substeps",
            )
            break
        problem = dataclasses.replace(problem, substeps=doubled(problem.substeps))
        copies, rows = shape or (1, None)
        stacked, _, evaluate, run_one = _evaluator([problem] * copies, layout, dtype, N, 1, rows)
        stacked, run = stacked[0], run_one(0)
        lo, hi = layout.lo[None], layout.hi[None]
        st = _lm.solve(
            evaluate,
            x[None],
            np.arange(1),
            lo,
            hi,
            eps=float(jnp.finfo(dtype).eps),
            max_steps=max_steps,
            running_scale=True,
            progress=progress,
        )
        finer = None
        if st["ok"][0] and np.isfinite(st["cost"][0]):
            finer = result(
                problem, layout, stacked, run, st["x"][0], st, 0, first.starts_at_best, first.starts, dtype, sigma_rule
            )
        if finer is None or finer.status not in (FitStatus.CONVERGED, FitStatus.POOR_FIT):
            # keep the fit that reached its optimum, and say why the steps were not refined
            why = "could not be evaluated" if finer is None else f"ended {finer.status}"
            out = dataclasses.replace(
                out,
                message=f"{out.message}; the steps' error moves {out.names[worst]} by {shift[worst]:.2g} standard "
                f"errors at substeps={out.substeps}, and the refit at substeps={problem.substeps} {why}",
            )
            break
        out, x, g = finer, st["x"][0], st["g"][0]
    return _conclude(out, first.substeps, roundoff), x, g


def _se(out, classical: bool = False) -> np.ndarray:
    """The standard errors of ``out``'s flattened values (``names`` order): the reported ones
    (the larger of classical and sandwich), or the classical ones alone (``classical``)."""
    if classical:
        V = len(out.names)
        return np.sqrt(np.maximum(np.diag(np.asarray(out.covariance_classical, float))[:V], 0.0))
    return np.sqrt(np.maximum(np.diag(np.asarray(out.covariance, float)), 0.0))


def _conclude(out, given: int, roundoff: bool):
    """The status and message after the check: ``STEP_ERROR`` where a value still moves by
    more than :data:`STEP_SHIFT_MAX` standard errors (a converged fit of the discrete model
    whose values the stepper's error biases), unless the shift stopped shrinking with the
    steps (``roundoff``: the difference is the evaluation's round-off, which more steps do not
    remove; the message says so); the message says when the steps were refined."""
    if out.substeps != given:
        out = dataclasses.replace(
            out, message=f"{out.message}; steps refined to substeps={out.substeps} (from {given})"
        )
    shift = np.asarray(out.step_shift, float)
    if out.status == FitStatus.CONVERGED and not roundoff and shift.size and np.all(np.isfinite(shift)):
        if np.max(shift) > STEP_SHIFT_MAX:
            out = dataclasses.replace(out, status=FitStatus.STEP_ERROR)
    return out
