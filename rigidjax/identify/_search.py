"""The proof by search that a fit reached its minimum: :func:`multistart_check`, a dense
multi-start refit of every fitted window with its own chart and optimiser (independent of the
identification layer that made the fit).

Part of :func:`rigidjax.identify.fit_inertia`'s checks (module docstring of
:mod:`rigidjax.identify._fit`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ._model import (
    chart_theta,
    random_chart,
    theta_chart,
    theta_phys,
)
from ._fit_many import multistart_problems
from ._problem_result import ProblemFit
from ._result import FitStatus, InertiaFit
from ._windows import (
    _Run,
    _full_x,
)


def multistart_check(
    fit: InertiaFit | ProblemFit | list,
    *,
    starts: int = 100,
    seed: int = 12345,
    extra=(),
    max_steps: int = 300,
    progress: Callable | None = None,
    problems=None,
    spread: float = 1.0,
) -> list[dict]:
    """Search every fitted window of a per-window fit densely for a lower least-squares cost.

    Each window is refitted from ``starts`` random physically valid inertias
    (:func:`rigidjax.identify._model.random_chart`: ratios spread over ~0.05-60, principal
    axes anywhere), from the consensus (the median of the converged windows' estimates) and
    from ``extra`` (model values in the ``I_yy = 1`` gauge, e.g. a joint estimate), each with
    the first sample and with the reported initial rate, every start to convergence with the
    same sub-steps as the fit. An independent check of the fit's search (another seed, far
    more starts), not part of it: what it reports should be the minimum.

    ``fit`` may also be the layer's result: a :class:`~rigidjax.identify.ProblemFit` or a list
    of them (from :func:`~rigidjax.identify.fit` / :func:`~rigidjax.identify.fit_many`) with
    ``problems`` the :class:`~rigidjax.identify.Problem` s they fitted, in the same order. Each
    problem is then fitted again from ``starts`` points (its given values and random ones,
    ``spread`` around them in the transforms' coordinates, see ``fit``), every start to its
    end (``max_steps``), at the sub-steps its fit ended with; one dict per fit with
    ``name`` (``problems[i]``), ``reported_cost``, ``best_cost`` (``ProblemFit.cost``: 1/2
    the weighted RSS), ``excess`` (``inf`` where the fit has no finite cost but the search
    found one; ``nan``, with ``best_cost`` nan and ``best_values`` ``None``, where no start of
    the search could be evaluated, e.g. the problem's given values fail), ``best_values``
    (the best start's ``values``), ``starts_at_best`` (relative 1e-6) and ``n_starts``.
    ``extra`` applies to an :class:`InertiaFit` only, ``spread`` to the layer's fits only.

    Returns:
        For an :class:`InertiaFit`, one dict per fitted window (empty where no window was
        fitted): ``name``, ``reported_cost`` and ``best_cost`` (1/2 RSS, rad^2/s^2),
        ``excess`` (``reported / best - 1``: > 0 where a start found a lower cost),
        ``best_estimates`` (Ix/Iy, Iz/Iy of the best start), ``hits`` (starts within 0.5 % of
        the best) and ``n_starts``. For the layer's fits, one dict per fit (above).

    Raises:
        TypeError: ``fit`` is none of these, or a list holding something else than
            ``ProblemFit`` s (named by index).
        ValueError: the layer's fits without one problem each; the problems' errors of
            :func:`~rigidjax.identify.fit_many`.
    """
    if not isinstance(fit, InertiaFit):
        return multistart_problems(
            fit, problems, starts=starts, seed=seed, spread=spread, max_steps=max_steps, progress=progress
        )
    spec = fit._model["spec"]
    segs = fit._data
    rows = fit.segments
    wins = np.array([i for i, r in enumerate(rows) if r.get("rms") is not None and "estimates" in r and r["estimates"]])
    if wins.size == 0:  # nothing was fitted (every window unidentifiable or not free): nothing to search
        return []
    run = _Run(segs, spec, None, seed=seed, max_steps=max_steps, phase1_steps=0, progress=progress)
    k = np.asarray(fit._model["substeps"], np.int32)
    theta = np.array(fit._model["theta"])
    conv = [i for i in wins if rows[i]["status"] == FitStatus.CONVERGED]
    cands = [np.median(theta[conv], 0)] if conv else []
    cands += [np.asarray(e, float) for e in extra]
    rng = np.random.default_rng(seed)
    xs, Rs, owner = [], [], []
    for j, i in enumerate(wins):
        x, R = random_chart(rng, starts, spec)
        xs.append(_full_x(run, x, np.full(starts, i)))
        Rs.append(R)
        owner += [j] * starts
        for th in cands:
            xc, Rc = theta_chart(th, spec)
            for w0 in (segs[i].omega[0], np.asarray(fit._model["omega0"][i])):
                xs.append(_full_x(run, xc, np.array([i]), w0=w0[None]))
                Rs.append(Rc)
                owner.append(j)
    x0, R_ref, owner = np.concatenate(xs), np.concatenate(Rs), np.array(owner)
    batch = run.batch(k, wins[owner][:, None], [0], R_ref)
    r = run.lm(batch, x0, np.arange(x0.shape[0]), max_steps=max_steps)
    cost = np.where(r["ok"], r["cost"], np.inf)
    out = []
    theta_r, _ = chart_theta(r["x"][:, : spec.n_chart], R_ref, spec)
    for j, i in enumerate(wins):
        idx = np.flatnonzero(owner == j)
        b = idx[np.argmin(cost[idx])]
        rep = 0.5 * rows[i]["rms"] ** 2 * 3 * segs[i].n
        ph = theta_phys(theta_r[b : b + 1], spec)[0]
        out.append(
            {
                "name": rows[i]["name"],
                "reported_cost": rep,
                "best_cost": float(cost[b]),
                "excess": rep / float(cost[b]) - 1 if cost[b] > 0 else 0.0,
                "best_estimates": {"Ix/Iy": float(ph[0]), "Iz/Iy": float(ph[1])},
                "hits": int(np.sum(cost[idx] <= 1.005 * cost[b])),
                "n_starts": int(idx.size),
            }
        )
    return out
