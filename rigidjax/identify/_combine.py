"""Combining windows: which recordings may be pooled, and intervals that cover the scatter.

On real recordings the residual of a good fit is model error, not noise (on the racquet
flips 0.2-0.7 rad/s against ~0.01 rad/s of gyroscope noise), so the Gauss-Newton errors of
a window, or of a joint fit, are far smaller than the scatter of the estimates between
windows. Every combined estimate therefore comes with two uncertainties:

* statistical (noise only): the Gauss-Newton errors;
* total: an interval that covers the between-window scatter. Per-window mode
  (:func:`window_interval`): with six windows or more the distribution-free confidence
  interval of the median from order statistics (windows independent, each estimate's
  distribution with the truth as its median; exact coverage from the binomial, no
  normality assumed); with two to five, Student's t about the median. Joint mode: the
  cluster-robust (sandwich) covariance over windows (:func:`sandwich`), never below the
  statistical one, with Student's t on the Satterthwaite degrees of freedom of the windows'
  influences (:func:`cluster_dof`: ``G - 1`` for windows of equal weight, towards 1 where a
  few windows carry the fit); where that interval and the windows' own (per-window)
  interval do not overlap, the joint estimate is pulled by model error and the interval
  spans both.

Calibration (``tests/test_identify.py``, slow): synthetic flips with per-window model error
(a random 0.02 rad misalignment of the sensor per toss, the drag varying by 50 % between
tosses), 10 windows, 60 seeds: the 95 % intervals covered the truth 93 % (Ix/Iy) and 97 %
(Iz/Iy) of the time per window, 95 % and 95 % joint (binomial sampling error +-2.8 %), the
joint interval a quarter as wide as the per-window one. Tried and dropped for joint fits:
the sandwich with ``G - 1`` degrees of freedom, or the delete-one-window jackknife (82-92 %:
a joint fit leans on its few most informative windows and inherits their model error, which
``G - 1`` degrees of freedom overstate); a random-effects error of the windows' own
estimates (calibrated on that body, but 30-80x too wide where single windows determine
little that the joint fit pins down, and too narrow on the racquet's full tensor, where the
joint optimum moved 13 of its errors).

Before pooling, recordings (``Segment.source``) are compared: two recordings agree when for
every inertia ratio their medians differ by at most 3 times the combined spread of their
windows (log scale, robust spread; a recording with fewer than 3 windows borrows the pooled
within-recording spread; never below its windows' typical relative statistical error) or by
at most 10 %. The pooled group is the one with the most windows in which every pair agrees
(:func:`agreement_groups`); the others are named and left out. (Connected components of the
agreement graph, used before, let one loosely determined recording bridge two bodies: on the
racquet rounds with a gyroscope bias per window, round 1's phone was pooled with the racquet.)
In a model with a gyroscope bias a joint fit compares the recordings again, by their
windows fitted jointly (:func:`rigidjax.identify._joint._recordings_agree`: one bias per
recording pins down what a bias per window absorbs); where that check can judge, its
verdict replaces this one.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special

from ._derived import standard_errors
from ._result import FitStatus

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
    cover = 1 - 2 * special.bdtr(np.arange(n // 2 + 1), n, 0.5)  # binomial CDF; cover[j - 1]: interval j
    ok = np.flatnonzero(cover[: max(n // 2, 1)] >= level)
    j = int(ok[-1]) + 1 if ok.size else 1
    return float(x[j - 1]), float(x[n - j]), float(cover[j - 1])


def median_se_stat(se) -> float:
    """Statistical 1-sigma of a median of estimates with errors ``se`` (noise only):
    ``1.2533 / sqrt(sum 1/se^2)`` (the median's efficiency for normal errors); 0 for a value
    fixed in every window (a given scale), as a joint fit reports it."""
    se = np.asarray(se, float)
    se = se[np.isfinite(se)]
    if se.size and np.all(se == 0):
        return 0.0
    se = se[se > 0]
    if se.size == 0:
        return float("nan")
    return float(1.2533 / math.sqrt(np.sum(1.0 / se**2)))


def t_interval(value, se, dof, level: float = 0.95):
    if not (np.isfinite(se) and dof >= 1):
        return (float("nan"), float("nan"))
    # Student t quantile (what scipy.stats.t.ppf evaluates; scipy.stats alone adds ~0.8 s to every import)
    q = float(special.stdtrit(dof, 0.5 + level / 2))
    return (float(value - q * se), float(value + q * se))


def window_interval(values, level: float = 0.95):
    """95 % interval of the median of window estimates: ``(lo, hi, coverage, method)``.

    Six windows or more: :func:`median_interval` (order statistics, distribution-free,
    coverage at least ``level``, exact from the binomial). Two to five (where no
    order-statistic interval reaches 95 %): the median ``± t(0.975, n-1) 1.2533 s / sqrt(n)``
    with ``s`` the sample standard deviation (normal windows; wide, as two to five windows
    warrant). One window: ``nan`` (no scatter to measure).
    """
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    n = v.size
    if n < 2:
        return float("nan"), float("nan"), float("nan"), "one window: no scatter between windows to measure"
    if n >= 6:
        lo, hi, cov = median_interval(v, level)
        return (
            lo,
            hi,
            cov,
            f"order statistics of the {n} window estimates (distribution-free interval of the median, "
            f"coverage {100 * cov:.1f} %)",
        )
    med = float(np.median(v))
    lo, hi = t_interval(med, 1.2533 * float(np.std(v, ddof=1)) / math.sqrt(n), n - 1, level)
    return lo, hi, level, f"median ± Student t of the {n} window estimates (too few windows for order statistics)"


def sandwich(A: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Cluster-robust covariance ``A^-1 (sum_g s_g s_g^T) A^-1 G/(G-1)`` of a joint least-squares
    fit with Gauss-Newton matrix ``A (P, P)`` and per-window gradient contributions
    ``scores (G, P)`` at its optimum (windows as clusters)."""
    G = scores.shape[0]
    Ainv = np.linalg.pinv(A)
    return Ainv @ (scores.T @ scores) @ Ainv * G / max(G - 1, 1)


def cluster_sandwich(f, J: np.ndarray, n_phys: int, n_sh: int):
    """The cluster sandwich of a joint fit ``f`` (a :class:`~rigidjax.identify.ProblemFit`)
    over its S windows: ``(covariance (n_sh, n_sh) of the shared and bias coordinates,
    standard errors of the named estimates (Jacobian ``J`` of the first ``n_phys``), their
    degrees of freedom (:func:`cluster_dof`))``."""
    d = np.asarray(f.segment_influence, float)[:, :n_sh]  # (S, n_sh) each window's first-order pull
    S = d.shape[0]
    sw = d.T @ d * S / (S - 1)
    return sw, standard_errors(J, sw[:n_phys, :n_phys]), cluster_dof(J @ d[:, :n_phys].T)


def cluster_dof(influence) -> np.ndarray:
    """Degrees of freedom of a cluster-robust variance: ``(sum_g d_g^2)^2 / sum_g d_g^4 - 1``
    per row of ``influence (K, G)``, ``d_g`` cluster ``g``'s first-order shift of an estimate
    (Satterthwaite: ``G - 1`` for equal influences, towards 1 where a few clusters dominate),
    at least 1; ``nan`` for an estimate no cluster moves (a fixed scale)."""
    d2 = np.asarray(influence, float) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        g_eff = d2.sum(1) ** 2 / (d2**2).sum(1)
    return np.where(np.isfinite(g_eff), np.maximum(g_eff - 1.0, 1.0), np.nan)


def agreement_groups(values: dict, spread: dict, weight: dict, rel: float = REL_AGREE) -> tuple[list, dict, list]:
    """The recordings to pool: the largest group in which every pair agrees.

    Two recordings agree when for every ratio their log values differ by at most
    :data:`Z_AGREE` times the combined spread (``hypot``) or by at most ``rel`` (relative;
    default :data:`REL_AGREE`). The pooled group is the clique of the agreement graph with
    the most windows (ties: the one whose first recording comes first), found exactly among
    the maximal cliques (Bron-Kerbosch with pivoting; recordings are few). Every pair in it
    agrees: a recording that determines little (a wide spread) cannot bridge two bodies into
    one, as connected components of the agreement graph would.

    Args:
        values: source -> log values ``(K,)``.
        spread: source -> their 1-sigma spreads ``(K,)`` (log scale; ``inf``: undetermined,
            agrees with every recording).
        weight: source -> the number of windows.
        rel: the relative difference below which two recordings always agree.

    Returns:
        ``(pooled sources in their order, {left-out source: the pooled sources it disagrees
        with}, ties)``; ``([], {}, [])`` without sources. A left-out source disagrees with at
        least one pooled source (the pooled group is a maximal clique). ``ties``: the other
        groups in which every pair agrees with as many windows as the pooled one (listing
        order chose between them: :func:`tie_note` says so).
    """
    order = list(values)

    def agree(a, b):
        d = np.abs(values[a] - values[b])
        return bool(np.all((d <= Z_AGREE * np.hypot(spread[a], spread[b])) | (d <= math.log1p(rel))))

    near = {a: {b for b in order if b != a and agree(a, b)} for a in order}
    best: list = []
    cliques: list = []

    def key(c):
        return (sum(weight[s_] for s_ in c), [-order.index(s_) for s_ in sorted(c, key=order.index)])

    def expand(r: set, p: set, x: set):
        nonlocal best
        if not p and not x:
            cliques.append(sorted(r, key=order.index))
            if not best or key(r) > key(best):
                best = list(r)
            return
        pivot = max(p | x, key=lambda u: len(near[u] & p))
        for v in sorted(p - near[pivot], key=order.index):
            expand(r | {v}, p & near[v], x & near[v])
            p = p - {v}
            x = x | {v}

    if order:
        expand(set(), set(order), set())
    main = sorted(best, key=order.index)
    top = key(main)[0] if main else 0
    ties = [c for c in cliques if c != main and sum(weight[s_] for s_ in c) == top]
    return main, {s_: [m for m in main if m not in near[s_]] for s_ in order if s_ not in main}, ties


def tie_note(source, ties: list) -> str:
    """For a left-out ``source`` in one of :func:`agreement_groups`' ``ties``: a note that its
    group is as large as the pooled one, so the listing order chose the body; else ``""``."""
    group = next((t for t in ties if source in t), None)
    if group is None:
        return ""
    who = (
        "this recording alone has"
        if len(group) == 1
        else "a group of recordings that agree among themselves, this one among them, has"
    )
    return (
        f" ({who} as many windows as the pooled group: which is the body the data cannot tell; the listing order chose)"
    )


def _apart(them: list, main: list) -> str:
    """Which pooled recordings a left-out one disagrees with, in words."""
    return "from every pooled recording" if len(them) == len(main) else f"from {len(them)} of the {len(main)} pooled"


def consistency(values: dict, keys, errors: dict | None = None) -> tuple[list, dict, dict]:
    """Which recordings may be pooled.

    A recording's spread (log scale) is the robust spread of its windows' estimates (with
    fewer than 3 windows: the pooled spread of the recordings with 3 or more, else
    :data:`SPREAD_FLOOR`), at least :data:`SPREAD_FLOOR` and at least the median relative
    statistical error of its windows: a window's estimate tells no more than its own error
    (where every recording has one or two poorly determined windows, the floor alone called
    windows 16 % apart different bodies).

    Args:
        values: source -> ``(n_windows, len(keys))`` estimates of positive ratios.
        keys: their names.
        errors: source -> their standard errors, the same shape (``None``: not used).

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
        if errors is not None and len(errors.get(s, ())):
            with np.errstate(invalid="ignore", divide="ignore"):
                rel = np.nanmedian(np.asarray(errors[s], float) / np.asarray(values[s], float), 0)
            sp[s] = np.fmax(sp[s], np.where(np.isfinite(rel), rel, 0.0))

    main, apart, ties = agreement_groups(med, sp, {s: len(logs[s]) for s in srcs})
    summaries = {
        s: {
            k: {"median": float(np.exp(med[s][j])), "spread": float(np.exp(med[s][j]) * sp[s][j]), "n": len(logs[s])}
            for j, k in enumerate(keys)
        }
        for s in srcs
    }
    if not main:
        return [], {}, summaries
    pooled_med = np.median(np.concatenate([logs[s] for s in main]), 0)
    excluded = {}
    for s in srcs:
        if s in main:
            continue
        parts = ", ".join(f"{k} {np.exp(med[s][j]):.4g}" for j, k in enumerate(keys))
        ref = ", ".join(f"{k} {np.exp(pooled_med[j]):.4g}" for j, k in enumerate(keys))
        excluded[s] = (
            f"{len(logs[s])} window(s) give {parts}; the pooled recordings give {ref} ({_apart(apart[s], main)} "
            f"beyond {Z_AGREE:g}x the combined spread and {REL_AGREE:.0%}): a different body or mounting?"
        ) + tie_note(s, ties)
        if not big:
            excluded[s] += (
                " (no recording has 3 windows, so the scatter between windows is not measured: the spread is the "
                f"{SPREAD_FLOOR:.0%} floor or the windows' own errors; pool='all' (--pool-all) pools anyway)"
            )
    return main, excluded, summaries


@dataclasses.dataclass(frozen=True)
class Combined:
    """The combination of windows of one body fitted by :func:`rigidjax.identify.fit_many`
    (:func:`combine`).

    Attributes:
        estimates: ``{name: median}`` over the pooled converged windows, per flattened model
            value (``ProblemFit.names``' model part, e.g. ``"ratios[0]"``).
        se_stat: ``{name: 1-sigma}`` from the windows' own errors alone (noise only,
            :func:`median_se_stat`).
        se_total: ``{name: 1-sigma}`` covering the scatter between windows (the interval's
            half width over 1.96; ``nan`` with one window).
        intervals: ``{name: (lo, hi)}``, the 95 % interval of :func:`window_interval`.
        method: how the interval was formed.
        windows: indices of the pooled windows; ``recordings`` their groups.
        excluded: ``{group: reason}`` of the recordings left out (inconsistent).
        by_recording: per group, per compared value: median, spread, windows.
        fits: the fits, the windows of excluded recordings with status ``inconsistent``.
    """

    estimates: dict
    se_stat: dict
    se_total: dict
    intervals: dict
    method: str
    windows: list
    recordings: list
    excluded: dict
    by_recording: dict
    fits: list

    def to_dict(self) -> dict:
        """JSON-ready (non-finite numbers as ``None``; the fits by their ``to_dict``)."""

        def clean(v):
            if isinstance(v, (tuple, list)):
                return [clean(a) for a in v]
            return float(v) if np.isfinite(v) else None

        return {
            "estimates": {k: clean(v) for k, v in self.estimates.items()},
            "se_stat": {k: clean(v) for k, v in self.se_stat.items()},
            "se_total": {k: clean(v) for k, v in self.se_total.items()},
            "intervals": {k: clean(v) for k, v in self.intervals.items()},
            "method": self.method,
            "windows": list(self.windows),
            "recordings": list(self.recordings),
            "excluded": dict(self.excluded),
            "by_recording": self.by_recording,
            "fits": [f.to_dict() for f in self.fits],
        }


def combine(fits, groups=None, *, pool: str = "consistent") -> Combined:
    """Combine windows of one body fitted by :func:`rigidjax.identify.fit_many` (with the same
    ``groups``): the median of each model value over the converged windows of the recordings
    that agree, its statistical error and the interval covering the scatter between windows
    (module docstring).

    Recordings are compared (:func:`consistency`) on the model values that are positive in
    every converged window (moments, ratios, lengths, damping: log scale); sensor values
    (a bias, a frame offset) belong to each recording and are not combined.

    Args:
        fits: ``[ProblemFit]`` of windows of one body (one structure).
        groups: a recording label per fit (``None``: one recording).
        pool: ``"consistent"`` (leave out recordings that disagree with the largest agreeing
            set, naming them) or ``"all"``.

    Returns:
        :class:`Combined`.

    Raises:
        ValueError: no fits, a ``groups`` of another length, a bad ``pool``, fits whose model
            values differ in names.
    """
    fits = list(fits)
    if not fits:
        raise ValueError("combine: no fits")
    if isinstance(groups, (str, bytes)):
        raise TypeError("combine: groups must be a sequence of labels, one per fit (not one string)")
    groups = ["all"] * len(fits) if groups is None else [str(g) for g in groups]
    if len(groups) != len(fits):
        raise ValueError(f"combine: groups has {len(groups)} labels for {len(fits)} fits (one per fit)")
    if pool not in ("consistent", "all"):
        raise ValueError(f"combine: pool must be 'consistent' or 'all'; got {pool!r}")
    names = [n for n in fits[0].names if not n.startswith("sensor")]
    if any([n for n in f.names if not n.startswith("sensor")] != names for f in fits):
        raise ValueError("combine: the fits' model values differ in names (fit windows of one structure)")

    def flat(d):
        return np.concatenate([np.ravel(np.asarray(v, float)) for v in d.values()])[: len(names)]

    values = np.array([flat(f.values) for f in fits])
    errors = np.array([flat(f.se) for f in fits])
    conv = [i for i, f in enumerate(fits) if f.status == FitStatus.CONVERGED]
    positive = [j for j in range(len(names)) if conv and np.all(values[conv, j] > 0)]
    by_group: dict = {}
    for i in conv:
        by_group.setdefault(groups[i], []).append(values[i, positive])
    err_group: dict = {}
    for i in conv:
        err_group.setdefault(groups[i], []).append(errors[i, positive])
    main, excluded, summaries = consistency(
        {g: np.array(v) for g, v in by_group.items()},
        [names[j] for j in positive],
        {g: np.array(v) for g, v in err_group.items()},
    )
    if pool == "all" or not positive:
        main, excluded = list(by_group), {}
    out = list(fits)
    for i in conv:
        if groups[i] not in main:
            out[i] = dataclasses.replace(
                fits[i], status=FitStatus.INCONSISTENT, message="recording not pooled: " + excluded.get(groups[i], "")
            )
    pooled = [i for i in conv if groups[i] in main]
    est, se_stat, se_tot, intervals, method = {}, {}, {}, {}, ""
    for j, name in enumerate(names):
        v, e = values[pooled, j], errors[pooled, j]
        if len(pooled) == 1:
            est[name], se_stat[name] = float(v[0]), float(e[0])
            se_tot[name], intervals[name] = float("nan"), (float("nan"), float("nan"))
            method = "one window: no scatter between windows to measure"
        elif pooled:
            lo, hi, _, method = window_interval(v)
            est[name], se_stat[name] = float(np.median(v)), median_se_stat(e)
            intervals[name], se_tot[name] = (lo, hi), (hi - lo) / (2 * 1.959964)
    return Combined(
        estimates=est,
        se_stat=se_stat,
        se_total=se_tot,
        intervals=intervals,
        method=method,
        windows=pooled,
        recordings=[g for g in dict.fromkeys(groups[i] for i in pooled)],
        excluded=excluded,
        by_recording=summaries,
        fits=out,
    )
