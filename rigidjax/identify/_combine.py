"""Combining windows: which recordings may be pooled, and intervals that cover the scatter.

On real recordings the residual of a good fit is model error, not noise (on the racquet
flips 0.2-0.7 rad/s against ~0.01 rad/s of gyroscope noise), so the Gauss-Newton errors of
a window, or of a joint fit, are far smaller than the scatter of the estimates between
windows. Every combined estimate therefore comes with two uncertainties:

* statistical (noise only): the Gauss-Newton errors;
* total: an interval that covers the between-window scatter. Per-window mode: the
  distribution-free confidence interval of the median from order statistics (windows
  independent, each estimate's distribution with the truth as its median; exact coverage
  from the binomial distribution, no normality assumed). Joint mode: the random-effects
  error of an information-weighted combination of the windows' own estimates
  (:func:`random_effects_se`: each window carries its own model error, estimated from the
  scatter of the per-window fits), never below the statistical one, with Student's t on
  ``G - 1`` degrees of freedom.

Calibration (``tests/test_identify.py``, slow): synthetic flips with per-window model error
(a random 0.02 rad misalignment of the sensor per toss, the drag varying by 50 % between
tosses), 10 windows, 60 seeds: the 95 % intervals covered the truth 93-97 % of the time
per-window and 97-98 % joint. Tried and dropped for joint fits: the cluster-robust sandwich
and the delete-one-window jackknife (linearised, and by refits) covered 83-87 %: a joint
fit leans on its few most informative windows and inherits their model error, which these
resampling estimates see only through the same few windows (and the linearised
jackknife blows up when leaving out the one window that determines a ratio).

Before pooling, recordings (``Segment.source``) are compared: two recordings agree when for
every inertia ratio their medians differ by at most 3 times the combined spread of their
windows (log scale, robust spread; a recording with fewer than 3 windows borrows the pooled
within-recording spread) or by at most 10 %. The recordings connected by agreement to the
largest group (most windows) are pooled; the others are named and left out.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

#: Agreement of recordings: medians within ``Z_AGREE`` combined spreads (log scale) ...
Z_AGREE = 3.0
#: ... or within this relative difference.
REL_AGREE = 0.10
#: Floor of a recording's spread (log scale): noise-level synthetic windows scatter by far
#: less than any real difference between bodies.
SPREAD_FLOOR = 0.02


def robust_spread(v) -> float:
    """1.4826 x median absolute deviation (the standard deviation for normal data); ``nan`` below 2 values."""
    v = np.asarray(v, float)
    if v.size < 2:
        return float("nan")
    return float(1.4826 * np.median(np.abs(v - np.median(v))))


def median_interval(values, level: float = 0.95):
    """Distribution-free interval of the median: ``(lo, hi, coverage)``.

    ``[x_(j), x_(n+1-j)]`` (order statistics) with the largest ``j`` whose coverage
    ``1 - 2 P(Bin(n, 1/2) <= j - 1)`` is at least ``level``; with too few values to reach it
    (``n <= 5`` at 95 %) the full range and its actual coverage.
    """
    x = np.sort(np.asarray(values, float))
    n = x.size
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    cover = 1 - 2 * stats.binom.cdf(np.arange(n // 2 + 1), n, 0.5)  # cover[j - 1]: interval j
    ok = np.flatnonzero(cover[: max(n // 2, 1)] >= level)
    j = int(ok[-1]) + 1 if ok.size else 1
    return float(x[j - 1]), float(x[n - j]), float(cover[j - 1])


def median_se_stat(se) -> float:
    """Statistical 1-sigma of a median of estimates with errors ``se`` (noise only):
    ``1.2533 / sqrt(sum 1/se^2)`` (the median's efficiency for normal errors)."""
    se = np.asarray(se, float)
    se = se[np.isfinite(se) & (se > 0)]
    if se.size == 0:
        return float("nan")
    return float(1.2533 / math.sqrt(np.sum(1.0 / se**2)))


def t_interval(value, se, dof, level: float = 0.95):
    if not (np.isfinite(se) and dof >= 1):
        return (float("nan"), float("nan"))
    q = float(stats.t.ppf(0.5 + level / 2, dof))
    return (float(value - q * se), float(value + q * se))


def random_effects_se(est, se) -> float:
    """1-sigma of an information-weighted combination of window estimates ``est`` (errors
    ``se``) when each window also carries its own model error of variance ``tau^2``:
    ``sqrt(sum w^2 (se^2 + tau^2)) / sum w`` with ``w = 1/se^2`` (the weights a joint
    least-squares fit gives its windows) and ``tau^2`` the between-window variance beyond
    the windows' own errors (robust spread of ``est`` squared minus the median ``se^2``, at
    least 0). A combination dominated by a few precise windows inherits their model error:
    this keeps its interval from being narrower than the windows' agreement supports."""
    est, se = np.asarray(est, float), np.asarray(se, float)
    ok = np.isfinite(est) & np.isfinite(se) & (se > 0)
    est, se = est[ok], se[ok]
    if est.size < 2:
        return float("nan")
    tau2 = max(0.0, robust_spread(est) ** 2 - float(np.median(se**2)))
    w = 1.0 / se**2
    return float(np.sqrt(np.sum(w**2 * (se**2 + tau2))) / np.sum(w))


def consistency(values: dict, keys) -> tuple[list, dict, dict]:
    """Which recordings may be pooled.

    Args:
        values: source -> ``(n_windows, len(keys))`` estimates of positive ratios.
        keys: their names.

    Returns:
        ``(pooled sources, excluded {source: reason}, summaries {source: {key: {median,
        spread, n}}})``.
    """
    srcs = [s for s in values if len(values[s])]
    logs = {s: np.log(np.maximum(np.asarray(values[s], float), 1e-300)) for s in srcs}
    med = {s: np.median(logs[s], 0) for s in srcs}
    spread = {s: np.array([robust_spread(logs[s][:, j]) for j in range(len(keys))]) for s in srcs}
    big = [spread[s] for s in srcs if len(logs[s]) >= 3]
    pooled_spread = np.nanmedian(np.stack(big), 0) if big else np.full(len(keys), SPREAD_FLOOR)
    pooled_spread = np.where(np.isfinite(pooled_spread), pooled_spread, SPREAD_FLOOR)
    sp = {}
    for s in srcs:
        v = spread[s] if len(logs[s]) >= 3 else pooled_spread
        sp[s] = np.maximum(np.where(np.isfinite(v), v, pooled_spread), SPREAD_FLOOR)

    def agree(a, b):
        d = np.abs(med[a] - med[b])
        return bool(np.all((d <= Z_AGREE * np.hypot(sp[a], sp[b])) | (d <= math.log1p(REL_AGREE))))

    # connected components of the agreement graph
    comp = {s: None for s in srcs}
    groups = []
    for s in srcs:
        if comp[s] is not None:
            continue
        stack, members = [s], []
        comp[s] = len(groups)
        while stack:
            a = stack.pop()
            members.append(a)
            for b in srcs:
                if comp[b] is None and agree(a, b):
                    comp[b] = comp[s]
                    stack.append(b)
        groups.append(members)
    summaries = {
        s: {k: {"median": float(np.exp(med[s][j])), "spread": float(np.exp(med[s][j]) * sp[s][j]), "n": len(logs[s])}
            for j, k in enumerate(keys)}
        for s in srcs
    }
    if not groups:
        return [], {}, summaries
    main = max(groups, key=lambda g: (sum(len(logs[s]) for s in g), -groups.index(g)))
    pooled_med = np.median(np.concatenate([logs[s] for s in main]), 0)
    excluded = {}
    for s in srcs:
        if s in main:
            continue
        parts = ", ".join(
            f"{k} {np.exp(med[s][j]):.4g}" for j, k in enumerate(keys)
        )
        ref = ", ".join(f"{k} {np.exp(pooled_med[j]):.4g}" for j, k in enumerate(keys))
        excluded[s] = (
            f"{len(logs[s])} window(s) give {parts}; the pooled recordings give {ref} (beyond {Z_AGREE:g}x "
            f"their combined spread and {REL_AGREE:.0%}): a different body or mounting?"
        )
    return main, excluded, summaries
