r"""Inertia (and angular drag, gyroscope bias) from measured body angular velocity.

Model (:mod:`rigidjax.identify._model`): ``I omega' = -omega x I omega - D omega``, the
gyroscope reads ``omega + b + noise``; least squares in rad/s at the measured timestamps.
What :func:`fit_inertia` does, window by window:

1. **Checks what can be identified before fitting**: a window with fewer than
   :data:`MIN_SAMPLES` samples, or whose rates do not vary above the gyroscope noise
   (signal RMS below :data:`SNR_MIN` times the noise: no motion, noise only, a steady spin
   about one axis) is :attr:`~FitStatus.UNIDENTIFIABLE` and not fitted. Windows longer than
   ``max_duration`` (free flight) or ``max_samples`` are refused (:class:`FitError`).
2. **Finds the least-squares minimum over the physically valid set**: bounded
   Levenberg-Marquardt (:mod:`rigidjax.identify._lm`) in second-moment coordinates where
   that set is a box, so thin-plate edges (``I_z = I_x + I_y``) are reached exactly; starts
   from the equation-error estimates and random valid inertias, the best continued to
   first-order optimality. Windows whose residual is far above their recording's others or
   their own signal (suspects) are refitted from the consensus of the other windows (all,
   and the same recording's) and :data:`RESCUE_RANDOM` more random starts; the lowest cost
   wins. A dense search (:func:`multistart_check`: 100 random starts per window) finds no
   lower minimum on any of the 69 shared racquet windows.
   ``converged`` means first-order optimality holds (see :mod:`rigidjax.identify._lm`).
3. **Keeps the step error out of the estimates**: sub-steps per sample interval are chosen
   per window from ``|omega| dt`` (:data:`ROT_TARGET` rad per sub-step), then the midpoint
   step's error (Richardson: ``k`` against ``2 k`` sub-steps) is converted into the shift it
   causes in every estimate; while a shift exceeds :data:`SHIFT_MAX` standard errors the
   window's sub-steps are doubled and it is refitted (up to :data:`K_MAX`). Each fitted
   window is then re-simulated by a tight independent integrator (SciPy DOP853): a residual
   that differs by more than :data:`REF_TOL` marks it :attr:`~FitStatus.STEP_ERROR`.
4. **Judges each window**: a residual above 5x the median over the windows of its recording
   (over all windows where it has fewer than 3) or 25 % of the window's signal, and above 10x
   its noise, is :attr:`~FitStatus.POOR_FIT` (a wrong basin or not free flight); a relative standard error of ``Ix/Iy`` or ``Iz/Iy`` above
   :data:`REL_SE_MAX`, or singular normal equations, :attr:`~FitStatus.UNIDENTIFIABLE`.
5. **Pools only what belongs together**: recordings (``Segment.source``) whose estimates
   disagree beyond their spread are named and left out (:mod:`rigidjax.identify._combine`;
   ``pool="all"`` forces pooling); the combined estimate carries a statistical error and a
   95 % interval covering the between-window scatter.

Joint fits (one inertia for all windows) run the per-window fits first (the same quality
rule and consistency check, and their estimates as starts), then fit the pooled windows
together; a window whose residual under the shared inertia fails the quality rule is left
out and the fit repeated.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from ..io import Segment, load
from . import _combine, _lm
from ._derived import FitError, derived_jacobian, lower_bound, names, parse_scale, standard_errors
from ._model import (
    DRAG_KINDS,
    V_MAX,
    Spec,
    chart_theta,
    equation_error_guess,
    noise_and_signal,
    pad,
    pad_length,
    phys_theta,
    random_chart,
    reference_rms,
    simulate,
    theta_chart,
    theta_phys,
)
from ._problems import Batch
from ._result import FitStatus, InertiaFit
from .pendulum import looks_like_pendulum

#: Fewer samples than this in a window: too few to determine inertia ratios (not fitted).
MIN_SAMPLES = 10
#: Signal (RMS of the rates about their mean) below this many times the noise: nothing to fit.
SNR_MIN = 5.0
#: Initial sub-steps: rotation per sub-step ``|omega| dt / k`` at most this (rad).
ROT_TARGET = 0.2
#: Most sub-steps per sample interval.
K_MAX = 64
#: Largest accepted shift of an estimate by the step error, in its standard errors.
SHIFT_MAX = 0.3
#: Largest accepted relative change of a window's residual RMS under the reference integrator.
REF_TOL = 0.10
#: Free flight: longest window (s) and most samples per window accepted by default.
MAX_DURATION = 10.0
MAX_SAMPLES = 20_000
#: Quality rule (see module): residual RMS above these multiples of the median over windows /
#: the window's signal, and above ``POOR_NOISE`` x its noise.
POOR_MEDIAN, POOR_SIGNAL, POOR_NOISE = 5.0, 0.25, 10.0
#: Joint fits: a window is a poor fit if its residual under the shared inertia is above
#: ``JOINT_OWN`` times its own fit's and ``JOINT_MEDIAN`` times the median over the pooled
#: windows (and ``POOR_NOISE`` x its noise): model error alone leaves 1-4x its own residual.
JOINT_OWN, JOINT_MEDIAN = 5.0, 3.0
#: Refit trigger (looser than the rule, so the refit sees every candidate).
SUSPECT_MEDIAN, SUSPECT_SIGNAL = 3.0, 0.10
#: Random starts of a refit, and how many of all its starts continue after the first phase.
RESCUE_RANDOM, RESCUE_KEEP = 16, 4
#: Relative standard error of Ix/Iy or Iz/Iy above which the window is unidentifiable (the
#: flattest racquet windows, on the thin-plate edge, are known to +-20-35 %).
REL_SE_MAX = 0.5
#: A window whose estimate sits on an edge of the physically valid set while the data ask
#: for an inertia beyond it (the unconstrained Gauss-Newton step would remove more than this
#: fraction of its cost) is a poor fit: not free flight, wrong axes or units, not rigid. On
#: the 69 racquet windows, those on an edge would gain at most 24 % (principal moments) and
#: 37 % (full tensor + drag).
EDGE_PUSH = 0.6
#: Rates above this (rad/s, ~8 rev/s) are beyond a hand throw (the racquet flips peak at
#: ~21 rad/s): such a window is refused, naming deg/s, unless ``max_rate`` is raised.
MAX_RATE = 50.0

_SEVERITY = (
    FitStatus.NONFINITE, FitStatus.MAX_STEPS, FitStatus.STALLED, FitStatus.INCONSISTENT, FitStatus.POOR_FIT,
    FitStatus.NOT_FREE, FitStatus.STEP_ERROR, FitStatus.UNIDENTIFIABLE, FitStatus.CONVERGED,
)
_LM_STATUS = {
    _lm.LMStatus.CONVERGED: FitStatus.CONVERGED, _lm.LMStatus.MAX_STEPS: FitStatus.MAX_STEPS,
    _lm.LMStatus.NONFINITE: FitStatus.NONFINITE, _lm.LMStatus.STALLED: FitStatus.STALLED,
}


def _as_segments(data) -> list[Segment]:
    if isinstance(data, Segment):
        return [data]
    if isinstance(data, (str, bytes)) or hasattr(data, "__fspath__"):
        return load(data)
    if isinstance(data, tuple) and len(data) == 2 and not isinstance(data[0], Segment):
        t, omega = data
        return [Segment(np.asarray(t, float), np.asarray(omega, float), name="window 0")]
    segs = list(data)
    if not segs:
        raise FitError("segments: no windows to fit (empty list)")
    for i, s in enumerate(segs):
        if not isinstance(s, Segment):
            raise FitError(f"segments[{i}]: expected a rigidjax.io.Segment; got {type(s).__name__}")
    return segs


def _label(s: Segment, i: int) -> str:
    return s.name or s.source or f"window {i}"


def _recording_labels(segs) -> list[str]:
    """A short name per window's recording: its source (the export folder for phyphox's
    ``Raw Data.csv``) relative to the folder all sources share."""
    from pathlib import PurePath

    paths = []
    for s in segs:
        p = PurePath(s.source) if s.source else PurePath("(no source)")
        paths.append(p.parent if p.name == "Raw Data.csv" else p)
    parts = [p.parts for p in paths]
    common = 0
    if len(set(paths)) > 1:
        while all(len(q) > common + 1 for q in parts) and len({q[common] for q in parts}) == 1:
            common += 1
    else:
        common = max(len(parts[0]) - 1, 0)
    return [str(PurePath(*q[common:])) if q[common:] else str(p) for q, p in zip(parts, paths)]


class _Run:
    """State shared by the stages of one fit."""

    def __init__(self, segs, spec, scale, *, seed, max_steps, phase1_steps, progress):
        self.segs = segs
        self.spec = spec
        self.scale = scale
        self.dtype = jnp.result_type(float)
        self.eps = float(np.finfo(self.dtype).eps)
        self.n_pad = pad_length(max(s.n for s in segs))
        self.data = pad(segs, self.n_pad, np.dtype(self.dtype))
        self.seed = seed
        self.max_steps = max_steps
        self.phase1_steps = phase1_steps
        self.progress = progress
        ns = [noise_and_signal(s.omega) for s in segs]
        self.noise = np.array([a for a, _ in ns])
        self.signal = np.array([b for _, b in ns])
        self.names = names(spec, scale)
        self.adapt = True

    def tick(self, n_active):
        if self.progress is not None:
            self.progress(n_active)

    def batch(self, k, seg_ids, groups, chart, R_ref=None):
        return Batch(self.spec, self.data, k, seg_ids, groups, chart=chart, R_ref=R_ref)

    def lm(self, batch, x0, rows, *, max_steps, state=None):
        lo, hi = batch.bounds(x0.shape[0]) if state is None else (None, None)
        return _lm.solve(
            batch.evaluate, x0, rows, lo, hi, eps=batch.eps, max_steps=max_steps, state=state, progress=self.tick,
        )


# ----------------------------------------------------------------------------- starts


def _window_starts(run: _Run, i: int, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` chart starts (shared part) and ``R_ref`` for window ``i``: the equation-error
    estimates of the full and of the simplest model, then random valid inertias."""
    spec = run.spec
    seg = run.segs[i]
    xs, Rs = [], []
    guesses = [equation_error_guess([seg], spec)]
    if spec.tensor or spec.drag:
        g = equation_error_guess([seg], Spec(False, None, False))
        if g is not None:
            th = np.zeros(spec.n_theta)
            th[:3] = g[:3]
            th[spec.n_icomp :] = 0.01 * np.trace(np.diag(g[:3]))
            guesses.append(th)
    for g in guesses[:n]:
        if g is not None:
            x, R = theta_chart(g, spec)
            xs.append(x[0])
            Rs.append(R[0])
    if len(xs) < n:
        x, R = random_chart(rng, n - len(xs), spec)
        xs += list(x)
        Rs += list(R)
    return np.array(xs[:n]), np.array(Rs[:n])


def _full_x(run: _Run, shared: np.ndarray, windows: np.ndarray, *, bias=None, w0=None) -> np.ndarray:
    """Per-window problem vectors ``[shared | bias | omega0]`` (omega0: first sample by default)."""
    n = shared.shape[0]
    b = np.zeros((n, run.spec.n_bias)) if bias is None else bias
    w = np.stack([run.segs[i].omega[0] for i in windows]) if w0 is None else w0
    return np.concatenate([shared, b, w], 1)


# ----------------------------------------------------------------------------- per-window fits


def _best_per_window(st, windows_of_row, n_windows, *, prefer_converged: bool):
    """Index of the best row per window: the lowest cost (after a first phase), or converged
    before not, then the lowest cost (after runs to the end)."""
    cost = np.where(st["ok"], st["cost"], np.inf)
    if prefer_converged:
        cost = cost * np.where(st["status"] == _lm.LMStatus.CONVERGED, 1.0, 1e6)
    best = np.full(n_windows, -1)
    for w in range(n_windows):
        rows = np.flatnonzero(windows_of_row == w)
        if rows.size:
            best[w] = rows[np.argmin(cost[rows])]
    return best


def _fit_windows(run: _Run, wins: np.ndarray, k: np.ndarray, starts: int) -> dict:
    """Multi-start bounded LM of each window in ``wins``; returns per window the LM state
    (rows in the order of ``wins``) and its ``R_ref``."""
    rng = np.random.default_rng(run.seed)
    xs, Rs, owner = [], [], []
    for j, i in enumerate(wins):
        x, R = _window_starts(run, i, starts, rng)
        xs.append(_full_x(run, x, np.full(len(x), i)))
        Rs.append(R)
        owner += [j] * len(x)
    x0, R_ref, owner = np.concatenate(xs), np.concatenate(Rs), np.array(owner)
    batch = run.batch(k, wins[owner][:, None], [0], "opt", R_ref)
    st = run.lm(batch, x0, np.arange(x0.shape[0]), max_steps=run.phase1_steps)
    best = _best_per_window(st, owner, len(wins), prefer_converged=False)
    keep = _lm.select(st, best)
    batch = run.batch(k, wins[owner[best]][:, None], [0], "opt", R_ref[best])
    keep["rows"] = np.arange(len(wins))
    st = run.lm(batch, None, None, max_steps=run.max_steps, state=keep)
    st["R_ref"] = R_ref[best]
    _rescue(run, wins, k, st)
    return st


def _medoid(theta: np.ndarray) -> np.ndarray:
    """The row of ``theta`` (model values, I_yy = 1) nearest the median (a physical point)."""
    z = np.log(np.maximum(np.abs(theta[:, [0, 2]]), 1e-12))
    return theta[np.argmin(np.abs(z - np.median(z, 0)).sum(1))]


def _recording_medians(run: _Run, wins, rms, fine) -> np.ndarray:
    """Per window: the median residual of the fine windows of its recording (one body, one
    set of conditions) where there are at least 3, else of all fine windows."""
    src = np.array([run.segs[i].source for i in wins])
    med_all = float(np.median(rms[fine])) if fine.any() else np.inf
    out = np.full(len(wins), med_all)
    for s_ in set(src):
        m = fine & (src == s_)
        if m.sum() >= 3:
            out[src == s_] = float(np.median(rms[m]))
    return out


def _rescue(run: _Run, wins: np.ndarray, k: np.ndarray, st: dict) -> None:
    """Refit the suspect windows (see module) IN PLACE of ``st`` where a refit ends lower."""
    spec = run.spec
    rms = np.sqrt(2 * st["cost"] / np.array([3.0 * run.segs[i].n for i in wins]))
    conv = st["ok"] & (st["status"] == _lm.LMStatus.CONVERGED)
    if not conv.any():
        fine = st["ok"] & np.isfinite(rms)
    else:
        fine = conv
    med = _recording_medians(run, wins, rms, fine)
    sig = run.signal[wins]
    suspect = ~conv | (rms > SUSPECT_MEDIAN * med) | (rms > SUSPECT_SIGNAL * sig)
    if not suspect.any():
        return
    bad = np.flatnonzero(suspect)
    good = np.flatnonzero(~suspect)
    theta_all, _ = chart_theta(st["x"][:, : spec.n_chart], st["R_ref"], spec)
    theta_all = theta_all / theta_all[:, 1:2]
    rng = np.random.default_rng(run.seed + 1)
    xs, Rs, owner = [], [], []
    for j in bad:
        i = wins[j]
        cands = []
        if good.size:
            cands.append(_medoid(theta_all[good]))
            same = good[[run.segs[wins[g]].source == run.segs[i].source for g in good]]
            if same.size:
                cands.append(_medoid(theta_all[same]))
        for th in cands:
            x, R = theta_chart(th, spec)
            for w0 in (run.segs[i].omega[0], st["x"][j, -3:]):
                xs.append(_full_x(run, x, np.array([i]), w0=w0[None]))
                Rs.append(R)
                owner.append(j)
        x, R = random_chart(rng, RESCUE_RANDOM, spec)
        xs.append(_full_x(run, x, np.full(RESCUE_RANDOM, i)))
        Rs.append(R)
        owner += [j] * RESCUE_RANDOM
    x0, R_ref, owner = np.concatenate(xs), np.concatenate(Rs), np.array(owner)
    batch = run.batch(k, wins[owner][:, None], [0], "opt", R_ref)
    r = run.lm(batch, x0, np.arange(x0.shape[0]), max_steps=run.phase1_steps)
    # the RESCUE_KEEP lowest-cost starts of each window continue to convergence
    cost = np.where(r["ok"], r["cost"], np.inf)
    cont = np.concatenate([idx[np.argsort(cost[idx])[:RESCUE_KEEP]] for idx in (np.flatnonzero(owner == j) for j in bad)])
    r = _lm.select(r, cont)
    owner, R_ref = owner[cont], R_ref[cont]
    r["rows"] = np.arange(cont.size)
    batch = run.batch(k, wins[owner][:, None], [0], "opt", R_ref)
    r = run.lm(batch, None, None, max_steps=run.max_steps, state=r)
    best = _best_per_window(r, owner, len(wins), prefer_converged=True)
    for j in bad:
        b = best[j]
        if b < 0 or not r["ok"][b]:
            continue
        better_status = (r["status"][b] == _lm.LMStatus.CONVERGED) or (st["status"][j] != _lm.LMStatus.CONVERGED)
        if (not st["ok"][j]) or (r["cost"][b] < st["cost"][j] and better_status):
            for key in ("x", "cost", "A", "g", "aux", "ok", "lam", "nu", "status", "opt", "lo", "hi", "floor"):
                st[key][j] = r[key][b]
            st["it"][j] += r["it"][b]
            st["R_ref"][j] = R_ref[b]


# ----------------------------------------------------------------------------- reported coordinates


def _to_phys(run: _Run, st: dict) -> np.ndarray:
    """LM states in the optimiser's chart -> problem vectors in the reported coordinates."""
    spec = run.spec
    theta, _ = chart_theta(st["x"][:, : spec.n_chart], st.get("R_ref"), spec)
    return np.concatenate([theta_phys(theta, spec), st["x"][:, spec.n_chart :]], 1)


def _covariance(A, rss_total, m, p):
    """``(cov, s^2, singular)``: ``s^2 (J^T J)^-1`` with ``s^2 = RSS / (m - p)``."""
    dof = m - p
    s2 = rss_total / dof if dof > 0 else float("nan")
    d = np.sqrt(np.maximum(np.diag(A), 1e-300))
    An = A / d[:, None] / d[None, :]
    w = np.linalg.eigvalsh(An)
    if not np.all(np.isfinite(w)) or w.min() <= 1e-14 * w.max() or not np.isfinite(s2):
        return np.full_like(A, np.inf), s2, True
    return s2 * np.linalg.inv(An) / d[:, None] / d[None, :], s2, False


def _estimates(run: _Run, xp_sh: np.ndarray, cov_sh: np.ndarray):
    """Named estimates and standard errors of the reported shared coordinates."""
    v, J = derived_jacobian(xp_sh, run.spec, run.scale)
    se = standard_errors(J, cov_sh)
    return dict(zip(run.names, map(float, v))), dict(zip(run.names, map(float, se))), J


def _step_shift(run: _Run, batch: Batch, xp: np.ndarray, rows, k: np.ndarray, covs, s2s, Js, bias_names) -> tuple:
    """Richardson estimate of the step error of each problem at ``xp`` and the first-order
    shift it causes in every reported quantity, in standard errors.

    ``e = (w_k - w_2k) / (1 - 2^-2)`` (second order); the least-squares estimate moves by
    ``-(J^T J)^-1 J^T e``; ``J^T e`` comes from the fit's own evaluator with the data replaced
    by ``w_k + b - e``. Returns ``(shift_se dicts, step error RMS per window (na, S))``."""
    th, w0, bias, segs, _ = batch.lanes_of(xp, rows)
    dt = run.data[2][segs]
    kk = k[segs]
    w_k = simulate(run.spec, th, w0, dt, kk, run.dtype)
    w_2k = simulate(run.spec, th, w0, dt, 2 * kk, run.dtype)
    e = (w_k - w_2k) / 0.75
    weight = run.data[1][segs]
    ms = np.sum(weight, axis=1) * 3
    rms_e = np.sqrt(np.sum((e * weight[:, :, None]) ** 2, axis=(1, 2)) / np.maximum(ms, 1)).reshape(xp.shape[0], batch.S)
    fake = np.array(run.data[0], dtype=float)
    fake[segs] = w_k + bias[:, None, :] - e
    fb = Batch(run.spec, (fake.astype(run.data[0].dtype), run.data[1], run.data[2]), batch.k, batch.seg_ids, batch.groups, chart="phys")
    _, _, g_e, _, _ = fb.evaluate(xp, rows)
    out = []
    for a in range(xp.shape[0]):
        cov, s2, J = covs[a], s2s[a], Js[a]
        if not (np.all(np.isfinite(cov)) and s2 > 0):
            out.append({})
            continue
        shift = -(cov @ g_e[a]) / s2
        se = standard_errors(J, cov[: batch.n_sh, : batch.n_sh])
        d = {}
        for name, j in zip(run.names, range(J.shape[0])):
            if np.isfinite(se[j]) and se[j] > 0:
                d[name] = float(J[j] @ shift[: batch.n_sh] / se[j])
        for name, idx in bias_names:
            e_ = math.sqrt(max(cov[idx, idx], 0.0))
            if e_ > 0:
                d[name] = float(shift[idx] / e_)
        out.append(d)
    return out, rms_e


def _initial_substeps(segs, fixed) -> np.ndarray:
    if fixed is not None:
        return np.full(len(segs), int(fixed), np.int32)
    k = []
    for s in segs:
        rot = float(np.max(np.linalg.norm(s.omega, axis=1)[:-1] * np.diff(s.t))) if s.n > 1 else 0.0
        k.append(min(K_MAX, 1 << max(0, math.ceil(math.log2(max(rot / ROT_TARGET, 1.0))))))
    return np.array(k, np.int32)


# ----------------------------------------------------------------------------- main entry


def fit_inertia(
    segments,
    *,
    tensor: bool = False,
    drag: str | None = None,
    bias: bool = False,
    joint: bool = False,
    scale=None,
    substeps="auto",
    starts: int = 4,
    seed: int = 0,
    max_steps: int = 200,
    phase1_steps: int = 12,
    pool: str = "consistent",
    max_duration: float = MAX_DURATION,
    max_samples: int = MAX_SAMPLES,
    max_rate: float = MAX_RATE,
    reference_check: bool = True,
    progress: Callable | None = None,
) -> InertiaFit:
    """Fit the inertia (ratios, or moments given a scale) to measured body angular velocity.

    What is fitted, how the minimum is found and checked, and what the statuses and the two
    uncertainties mean: :mod:`rigidjax.identify._fit` (this module), :mod:`rigidjax.identify._lm`
    and :mod:`rigidjax.identify._combine`; the statuses: :class:`rigidjax.identify.FitStatus`.

    Args:
        segments: a list of :class:`rigidjax.io.Segment` (free-flight windows), one Segment,
            a path understood by :func:`rigidjax.io.load`, or a ``(t, omega)`` pair (s, rad/s).
        tensor: fit the full inertia tensor (principal axes rotated from the sensor axes)
            instead of principal moments along the sensor axes.
        drag: ``None``, ``"isotropic"`` (``D = c I_3``) or ``"diagonal"`` (sensor axes).
        bias: fit a constant gyroscope bias (rad/s): per window, and per recording
            (``Segment.source``) in a joint fit.
        joint: one shared inertia (and drag) for the pooled windows, each with its own initial
            angular velocity; ``False`` (default) fits every window alone and combines.
        scale: a known value fixing the scale: ``"Iy=1.3911e-3"``, ``{"Iy": ...}``,
            ``("trace", ...)`` (kg m^2); without it only ratios are reported.
        substeps: ``"auto"`` (default: per window from ``|omega| dt``, doubled while the step
            error shifts an estimate by more than :data:`SHIFT_MAX` standard errors) or a fixed
            integer >= 1 for every window (the shift is still reported, and warns above 1).
        starts: starts per window (the equation-error estimates first, then random ones).
        seed: random starts.
        max_steps: Levenberg-Marquardt iterations after the multi-start phase.
        phase1_steps: iterations every start gets before the best is kept.
        pool: ``"consistent"`` (default: leave out recordings that disagree with the others,
            naming them) or ``"all"`` (pool every converged window regardless).
        max_duration: longest window accepted, s (free flight; a longer torque-free window is
            rarely free flight and its least-squares landscape is rugged).
        max_samples: most samples per window accepted.
        max_rate: highest angular speed accepted, rad/s (default 50, ~8 rev/s: beyond a hand
            throw; a window above it is most likely in deg/s).
        reference_check: re-simulate every fitted window with SciPy's DOP853 (see module).
        progress: optional callable ``progress(n_active)`` called after every iteration.

    Returns:
        :class:`InertiaFit`.

    Raises:
        FitError: no windows, bad option values, a window longer than ``max_duration`` or
            ``max_samples`` or faster than ``max_rate``, a joint fit with fewer measured values than unknowns.
            (:class:`rigidjax.io.DataError` for NaN / malformed data.)

    Warns:
        UserWarning: a fit that is not converged (the message says why and names the
            windows and recordings), a step error above 1 standard error with a fixed
            ``substeps``, and a fit in float32 (without ``jax_enable_x64``).
    """
    segs = _as_segments(segments)
    if drag not in DRAG_KINDS:
        raise FitError(f"drag must be one of {DRAG_KINDS}; got {drag!r}")
    if substeps != "auto" and not (isinstance(substeps, (int, np.integer)) and not isinstance(substeps, bool) and 1 <= substeps <= 1024):
        raise FitError(f"substeps must be 'auto' or an integer in [1, 1024]; got {substeps!r}")
    for name, v, lo in (("starts", starts, 1), ("max_steps", max_steps, 1), ("phase1_steps", phase1_steps, 0), ("max_samples", max_samples, MIN_SAMPLES)):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo):
            raise FitError(f"{name} must be an integer >= {lo}; got {v!r}")
    if pool not in ("consistent", "all"):
        raise FitError(f"pool must be 'consistent' or 'all'; got {pool!r}")
    for name, v, unit in (("max_duration", max_duration, "seconds"), ("max_rate", max_rate, "rad/s")):
        if not (isinstance(v, (int, float, np.floating)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise FitError(f"{name} must be a positive number of {unit}; got {v!r}")
    scale = parse_scale(scale)
    for i, s in enumerate(segs):
        if s.n > max_samples or s.duration > max_duration:
            raise FitError(
                f"{_label(s, i)}: {s.n} samples over {s.duration:.3g} s: longer than the free-flight bound "
                f"(max_duration={max_duration:g} s, max_samples={max_samples}). A torque-free fit needs windows of "
                "free flight (a toss: about a second); split the recording into windows (meta/segments.csv) or raise "
                "the bound (--max-duration / --max-samples) if this really is torque-free motion"
            )
    peak = [float(np.max(np.linalg.norm(s.omega, axis=1))) if s.n else 0.0 for s in segs]
    fast = [i for i in range(len(segs)) if peak[i] > max_rate]
    if fast:
        i = max(fast, key=lambda j: peak[j])
        raise FitError(
            f"{len(fast)} window(s) spin faster than {max_rate:g} rad/s, beyond a hand throw; {_label(segs[i], i)} reaches "
            f"{peak[i]:.4g} rad/s ({math.degrees(peak[i]):.4g} deg/s). If the rates are in deg/s, convert them to rad/s "
            "(x pi/180); if the body really spins this fast, raise the bound (max_rate / --max-rate)"
        )
    spec = Spec(bool(tensor), drag, bool(bias))
    dtype = jnp.result_type(float)
    if jnp.dtype(dtype) != jnp.float64:
        warnings.warn(
            f"fit_inertia: fitting in {jnp.dtype(dtype).name} (JAX's default without 64-bit mode): round-off in the "
            "simulated rates and their derivatives can stall the optimiser (status 'stalled') and degrades the "
            'standard errors; for a trustworthy fit enable float64 first: jax.config.update("jax_enable_x64", True)',
            stacklevel=2,
        )
    run = _Run(segs, spec, scale, seed=seed, max_steps=max_steps, phase1_steps=phase1_steps, progress=progress)
    run.adapt = substeps == "auto"
    n = len(segs)
    p_window = spec.n_phys + spec.n_bias + 3

    # ---- 1. what can be identified at all
    pre = {}
    not_free = {}
    for i, s in enumerate(segs):
        swing = looks_like_pendulum(s.omega) if s.n >= MIN_SAMPLES else None
        if s.n < MIN_SAMPLES or 3 * s.n <= p_window + 3:
            pre[i] = f"{s.n} samples: too few to determine {p_window} parameters (at least {MIN_SAMPLES} samples)"
        elif run.signal[i] <= SNR_MIN * run.noise[i]:
            pre[i] = (
                f"the rates vary by {run.signal[i]:.2g} rad/s RMS, within {SNR_MIN:g}x the gyroscope noise "
                f"({run.noise[i]:.2g} rad/s): no motion, noise only, or a steady spin about one axis, which fits any inertia"
            )
        elif swing is not None:
            not_free[i] = (
                f"the rates oscillate about the {'xyz'[swing]} axis alone: a pendulum swing, not free flight (fit it "
                "with rigidjax.identify.pendulum / `rigidjax fit-pendulum`)"
            )
    wins = np.array([i for i in range(n) if i not in pre and i not in not_free], int)
    k = _initial_substeps(segs, None if substeps == "auto" else substeps)

    labels = _recording_labels(segs)
    rows = [
        dict(name=s.name or f"window {i}", comment=s.comment, source=s.source, recording=labels[i], n=s.n, index=s.index)
        for i, s in enumerate(segs)
    ]
    per = _per_window(run, wins, k, starts, adapt=(substeps == "auto"), reference_check=reference_check)
    for i in range(n):
        r = rows[i]
        r["noise"], r["signal"] = float(run.noise[i]), float(run.signal[i])
        r["substeps"] = int(k[i])
        if i in pre:
            r.update(status=FitStatus.UNIDENTIFIABLE, reason=pre[i], rms=None, estimates={}, se={}, iterations=0)
        elif i in not_free:
            r.update(status=FitStatus.NOT_FREE, reason=not_free[i], rms=None, estimates={}, se={}, iterations=0)
        else:
            r.update(per[i])
    _quality(run, rows, [i for i in range(n) if i not in pre])
    result = _combine_windows(run, rows, pool)
    if joint:
        result = _joint(run, rows, result, k, pool, reference_check=reference_check, starts=starts)
    result._data = segs
    result.options = {
        "tensor": spec.tensor, "drag": drag, "bias": spec.bias, "substeps": substeps, "starts": starts,
        "scale": list(scale) if scale else None, "joint": bool(joint), "pool": pool,
        "stepper": "rigidjax.midpoint.angular_velocity_step (seed 000)",
    }
    _warn(result, substeps)
    return result


def _per_window(run: _Run, wins, k, starts, *, adapt: bool, reference_check: bool) -> dict:
    """Fit each window of ``wins`` alone (with sub-step adaptation); returns ``{i: row fields}``."""
    spec = run.spec
    out = {}
    if wins.size == 0:
        return out
    st = _fit_windows(run, wins, k, starts)
    bias_names = [(f"bias_{c}", spec.n_phys + a) for a, c in enumerate("xyz")] if spec.bias else []
    sub = np.arange(0)  # the windows refitted in the previous round
    for _round in range(8):
        xp = _to_phys(run, st)
        phy = run.batch(k, wins[:, None], [0], "phys")
        _, A_p, _, ok_p, rss_p = phy.evaluate(xp, np.arange(wins.size))
        covs, s2s, Js, ests, ses, sing = [], [], [], [], [], []
        for j, i in enumerate(wins):
            cov, s2, singular = _covariance(A_p[j], float(rss_p[j, 0]), 3 * run.segs[i].n, phy.P)
            est, se, J = _estimates(run, xp[j, : spec.n_phys], cov[: spec.n_phys, : spec.n_phys])
            covs.append(cov), s2s.append(s2), Js.append(J), ests.append(est), ses.append(se), sing.append(singular)
        shifts, rms_e = _step_shift(run, phy, xp, np.arange(wins.size), k, covs, s2s, Js, bias_names)
        worst = np.array([max((abs(v) for v in d.values()), default=0.0) for d in shifts])
        theta, _ = phys_theta(xp[:, : spec.n_phys], spec)
        w0 = xp[:, -3:]
        b = xp[:, spec.n_phys : spec.n_phys + spec.n_bias] if spec.bias else np.zeros((wins.size, 3))
        rms_all = np.sqrt(rss_p[:, 0] / np.array([3.0 * run.segs[i].n for i in wins]))
        if not reference_check:
            ref = np.full(wins.size, np.nan)
        elif _round == 0:
            ref = reference_rms([run.segs[i] for i in wins], theta, w0, b, spec)
        else:  # only the windows refitted in the previous round changed
            ref[sub] = reference_rms([run.segs[i] for i in wins[sub]], theta[sub], w0[sub], b[sub], spec)
        ref_bad = reference_check & ~(np.abs(ref - rms_all) <= REF_TOL * rms_all)
        need = adapt & ((worst > SHIFT_MAX) | ref_bad) & (k[wins] < K_MAX) & st["ok"]
        if not need.any():
            break
        # finer sub-steps for those windows; continue from the current estimate (the cost
        # changes with k: a fresh iteration from the current point)
        k[wins[need]] = np.minimum(2 * k[wins[need]], K_MAX)
        sub = np.flatnonzero(need)
        batch = run.batch(k, wins[sub][:, None], [0], "opt", st["R_ref"][sub])
        part = run.lm(batch, st["x"][sub], np.arange(sub.size), max_steps=run.max_steps)
        part["it"] += st["it"][sub]
        for key in ("x", "cost", "A", "g", "aux", "ok", "lam", "nu", "status", "opt", "it", "lo", "hi", "floor"):
            st[key][sub] = part[key]
    for j, i in enumerate(wins):
        rms = float(np.sqrt(rss_p[j, 0] / (3 * run.segs[i].n)))
        status = _LM_STATUS[_lm.LMStatus(int(st["status"][j]))] if (st["ok"][j] and ok_p[j]) else FitStatus.NONFINITE
        reason = {
            FitStatus.CONVERGED: "",
            FitStatus.MAX_STEPS: f"no first-order optimum within {run.max_steps} iterations (raise max_steps)",
            FitStatus.STALLED: f"the optimiser stopped short of first-order optimality (relative decrement {st['opt'][j]:.2g})",
            FitStatus.NONFINITE: "the simulation gave NaN or inf",
        }[status]
        rel = [ses[j][key] / abs(ests[j][key]) if ests[j][key] else np.inf for key in ("Ix/Iy", "Iz/Iy")]
        if status in (FitStatus.CONVERGED, FitStatus.STALLED) and st["x"][j, 1] >= V_MAX:
            status = FitStatus.UNIDENTIFIABLE
            reason = (
                f"the least-squares minimum lies at a degenerate, rod-like inertia (a ratio beyond {V_MAX:g}, the edge "
                "of the search): the data do not determine the inertia"
            )
        elif status == FitStatus.CONVERGED and (push := _edge_push(spec, st, j)) is not None:
            status = FitStatus.POOR_FIT
            reason = (
                f"the data ask for {push[0]}, beyond the physically valid set: the least-squares minimum sits on its "
                f"edge and an unconstrained step would remove {100 * push[1]:.0f} % of the residual (not free flight, "
                "wrong axes or units, or not a rigid body)"
            )
        elif status == FitStatus.CONVERGED and (sing[j] or max(rel) > REL_SE_MAX):
            status = FitStatus.UNIDENTIFIABLE
            reason = (
                "singular normal equations: the data do not determine the inertia ratios" if sing[j] else
                f"the data determine Ix/Iy and Iz/Iy only to ±{100 * rel[0]:.0f} % and ±{100 * rel[1]:.0f} %"
            )
        if status == FitStatus.CONVERGED and reference_check and not (abs(ref[j] - rms) <= REF_TOL * rms):
            status = FitStatus.STEP_ERROR
            reason = (
                f"re-simulated by DOP853 the residual is {ref[j]:.3g} rad/s against the fit's {rms:.3g}: the step "
                f"error ({k[i]} sub-steps) shapes this fit (raise substeps)"
            )
        row = dict(
            status=status, reason=reason, rms=rms, rms_reference=float(ref[j]), iterations=int(st["it"][j]),
            optimality=float(st["opt"][j]), omega0=w0[j].tolist(), omega0_se=np.sqrt(np.maximum(np.diag(covs[j])[-3:], 0)).tolist(),
            estimates=ests[j], se=ses[j], step_shift_se=shifts[j], step_error_rms=float(rms_e[j, 0]),
            _theta=theta[j], _w0=w0[j], _bias=b[j], _xp=xp[j], _cov=covs[j], _J=Js[j],
        )
        if spec.bias:
            row["bias"] = b[j].tolist()
            row["bias_se"] = np.sqrt(np.maximum(np.diag(covs[j])[spec.n_phys : spec.n_phys + 3], 0)).tolist()
        out[i] = row
    return out


_EDGES = {  # (chart coordinate, bound) -> what lies beyond it
    (0, "hi"): "I3 > I1 + I2", (0, "lo"): "I1 > I2 + I3", (1, "lo"): "I2 > I1 + I3",
}


def _edge_push(spec: Spec, st: dict, j: int):
    """``(what, fraction)`` where window ``j``'s estimate sits on an edge of the valid set and
    the unconstrained Gauss-Newton step would remove more than :data:`EDGE_PUSH` of its cost,
    else ``None``. ``I1, I2, I3``: the principal moments (along sensor x, y, z without
    ``tensor``)."""
    x, g, lo, hi = st["x"][j], st["g"][j], st["lo"][j], st["hi"][j]
    held = [(c, b) for c in range(spec.n_chart) for b, at in (("lo", x[c] <= lo[c] and g[c] > 0), ("hi", x[c] >= hi[c] and g[c] < 0)) if at]
    if not held:
        return None
    inf = np.full((1, x.size), np.inf)
    free = _lm.decrement(st["A"][j : j + 1], g[None], st["cost"][j : j + 1], x[None], -inf, inf, st["floor"][j : j + 1])[0]
    if not free > EDGE_PUSH:
        return None
    c, b = held[0]
    what = _EDGES.get((c, b), "a negative drag (a body that speeds up)" if c >= 2 + 3 * spec.tensor else "a degenerate inertia")
    return what, min(float(free), 1.0)


def _quality(run: _Run, rows, fitted) -> None:
    """The residual rule (see module), IN PLACE on ``rows``. The median is over the windows of
    the same recording (one body, one set of conditions) where it has at least 3, else over
    all windows."""
    conv = [i for i in fitted if rows[i]["status"] in (FitStatus.CONVERGED, FitStatus.STEP_ERROR, FitStatus.UNIDENTIFIABLE)]
    if not conv:
        return
    rms_c = np.array([rows[i]["rms"] for i in conv])
    meds = _recording_medians(run, np.array(conv), rms_c, np.ones(len(conv), bool))
    n_src = {s_: sum(rows[j]["source"] == s_ for j in conv) for s_ in {rows[j]["source"] for j in conv}}
    for j, i in enumerate(conv):
        r = rows[i]
        med, n_med = meds[j], (n_src[r["source"]] if n_src[r["source"]] >= 3 else len(conv))
        rms = r["rms"]
        why = []
        if rms > POOR_MEDIAN * med and n_med > 1:
            scope = "its recording's windows" if n_src[r["source"]] >= 3 else "the windows"
            why.append(f"{rms / med:.1f}x the median over {scope} ({med:.3g} rad/s)")
        if rms > POOR_SIGNAL * run.signal[i]:
            why.append(
                f"{rms / run.signal[i]:.0%} of the window's own variation ({run.signal[i]:.3g} rad/s RMS; a good fit leaves "
                f"under {POOR_SIGNAL:.0%})"
            )
        if why and rms > POOR_NOISE * run.noise[i]:
            r["status"] = FitStatus.POOR_FIT
            r["reason"] = (
                f"residual {rms:.3g} rad/s: " + " and ".join(why) + f", and {rms / run.noise[i]:.0f}x its noise "
                f"({run.noise[i]:.2g} rad/s): a wrong basin, or not free flight"
            )


def _overall(rows, excluded: dict, extra: list[str] = ()) -> tuple[FitStatus, str]:
    counts = {}
    for r in rows:
        counts.setdefault(r["status"], []).append(r["name"])
    parts = []
    for st_ in _SEVERITY[:-1]:
        if st_ in counts and st_ != FitStatus.INCONSISTENT:
            parts.append(f"{len(counts[st_])} of {len(rows)} window(s) {st_.value}")
    if excluded:
        parts.append(f"{len(excluded)} recording(s) not pooled (inconsistent): " + "; ".join(excluded))
    parts += list(extra)
    present = [s for s in _SEVERITY if s in counts or (s == FitStatus.INCONSISTENT and excluded)]
    status = present[0] if present else FitStatus.UNIDENTIFIABLE
    if status == FitStatus.CONVERGED:
        return status, f"every window converged to its least-squares minimum ({len(rows)} window(s))"
    return status, "; ".join(parts) + " (left out of the combined estimate)"


def _combine_windows(run: _Run, rows, pool: str) -> InertiaFit:
    """Per-window mode: consistency, the median and its intervals."""
    spec = run.spec
    conv = [i for i, r in enumerate(rows) if r["status"] == FitStatus.CONVERGED]
    keys = ["Ix/Iy", "Iz/Iy"]
    by_src = {}
    for i in conv:
        by_src.setdefault(rows[i]["recording"], []).append([rows[i]["estimates"][k_] for k_ in keys])
    main, excluded, summaries = _combine.consistency({s: np.array(v) for s, v in by_src.items()}, keys)
    if pool == "all":
        main, excluded = list(by_src), {}
    for i in conv:
        if rows[i]["recording"] not in main:
            rows[i]["status"] = FitStatus.INCONSISTENT
            rows[i]["reason"] = "recording not pooled: " + excluded.get(rows[i]["recording"], "")
    pooled = [i for i in conv if rows[i]["recording"] in main]
    est, se_stat, se_tot, intervals = {}, {}, {}, {}
    method = ""
    if len(pooled) == 1:
        r = rows[pooled[0]]
        est, se_stat = dict(r["estimates"]), dict(r["se"])
        se_tot = {k_: float("nan") for k_ in est}
        intervals = {k_: (float("nan"), float("nan")) for k_ in est}
    elif pooled:
        for name in run.names:
            v = np.array([rows[i]["estimates"][name] for i in pooled])
            e = np.array([rows[i]["se"][name] for i in pooled])
            est[name] = float(np.median(v))
            se_stat[name] = _combine.median_se_stat(e)
            lo, hi, _, method = _combine.window_interval(v)
            intervals[name] = (max(lo, lower_bound(name)), hi)  # never beyond the physically possible
            se_tot[name] = (hi - lo) / (2 * 1.959964)
    status, message = _overall(rows, excluded)
    m_tot = sum(3 * run.segs[i].n for i in pooled)
    rms = float(np.sqrt(sum(rows[i]["rms"] ** 2 * 3 * run.segs[i].n for i in pooled) / m_tot)) if pooled else float("nan")
    shifts = [r["step_shift_se"] for r in rows if r.get("step_shift_se")]
    worst = {}
    for d in shifts:
        for k_, v_ in d.items():
            if abs(v_) > abs(worst.get(k_, 0.0)):
                worst[k_] = v_
    fitted = [r for r in rows if "step_error_rms" in r]
    m_f = sum(3 * r["n"] for r in fitted)
    step_error = {
        "substeps": [int(r["substeps"]) for r in rows],
        "rms": float(np.sqrt(sum(r["step_error_rms"] ** 2 * 3 * r["n"] for r in fitted) / m_f)) if m_f else 0.0,
        "shift_se": worst, "max_shift_se": max((abs(v_) for v_ in worst.values()), default=0.0),
    }
    combined = {
        "n": len(pooled), "windows": pooled, "sources": list(main) if pooled else [], "excluded": excluded,
        "method": method, "by_source": summaries, "pool": pool,
    }
    model = {
        "spec": spec,
        "theta": [r.get("_theta", np.full(spec.n_theta, np.nan)) for r in rows],
        "omega0": [r.get("_w0", np.full(3, np.nan)) for r in rows],
        "bias": [r.get("_bias", np.zeros(3)) for r in rows],
        "substeps": [int(r["substeps"]) for r in rows],
    }
    res = InertiaFit(
        mode="per-window", options={}, status=status, message=message, estimates=est, uncertainties=se_stat,
        total_uncertainties=se_tot, intervals=intervals, segments=rows, combined=combined, rms=rms,
        step_error=step_error, _model=model,
    )
    for r in rows:
        for key in [k_ for k_ in r if k_.startswith("_")]:
            r.pop(key)
    return res


def _joint_starts(run: _Run, pooled, theta_w, n: int) -> list[np.ndarray]:
    """Shared model values to start a joint fit from: the median of the windows' estimates,
    the medoid window's, the joint equation-error estimate."""
    spec = run.spec
    cands = [np.median(theta_w, 0), _medoid(theta_w)]
    g = equation_error_guess([run.segs[i] for i in pooled], spec)
    if g is not None:
        cands.append(g)
    return cands[: max(1, n)]


def _joint(run: _Run, rows, per: InertiaFit, k, pool, *, reference_check: bool, starts: int) -> InertiaFit:
    """Joint mode: the pooled windows with one shared inertia (see module).

    Pooled: the windows of the pooled recordings whose own fit reached its minimum, including
    those that alone could not determine the ratios (a joint fit may). Each row keeps its own
    fit under ``own`` (status, rms, estimates, se) and reports the joint fit's residual,
    status and bias."""
    spec = run.spec
    main = set(per.combined.get("sources") or [])
    determined = FitStatus.CONVERGED, FitStatus.UNIDENTIFIABLE
    pooled = [
        i for i, r in enumerate(rows)
        if r["status"] in determined and r.get("estimates") and (pool == "all" or r["recording"] in main)
    ]
    for r in rows:
        r["own"] = {key: r.get(key) for key in ("status", "reason", "rms", "estimates", "se", "substeps")}
    base = dict(
        mode="joint", options={}, estimates={}, uncertainties={}, total_uncertainties={}, intervals={},
        segments=rows, rms=float("nan"), step_error=per.step_error, _model=per._model,
    )
    if not pooled:
        status, message = _overall(rows, per.combined.get("excluded", {}), ["no window left to pool"])
        return InertiaFit(status=status, message=message, combined=dict(per.combined, n=0), **base)
    theta_all = np.array(per._model["theta"])
    excluded_joint = []
    for _attempt in range(3):
        S = len(pooled)
        sources = sorted({rows[i]["recording"] for i in pooled})
        groups = [sources.index(rows[i]["recording"]) for i in pooled] if spec.bias else [0] * S
        G = max(groups) + 1
        n_b = spec.n_bias
        w0 = np.concatenate([per._model["omega0"][i] for i in pooled])
        b = np.zeros(G * n_b)
        if spec.bias:
            for g_ in range(G):
                b[3 * g_ : 3 * g_ + 3] = np.median([per._model["bias"][i] for i, gg in zip(pooled, groups) if gg == g_], 0)
        good = [i for i in pooled if rows[i]["status"] == FitStatus.CONVERGED] or pooled
        cands = _joint_starts(run, pooled, theta_all[good], starts)
        xs, Rs = theta_chart(np.array(cands), spec)
        x0 = np.concatenate([xs, np.tile(b, (len(cands), 1)), np.tile(w0, (len(cands), 1))], 1)
        seg_ids = np.tile(np.array(pooled), (len(cands), 1))
        m = 3 * sum(run.segs[i].n for i in pooled)
        p = spec.n_phys + G * n_b + 3 * S
        if m <= p:
            raise FitError(f"joint fit: {m} measured values cannot determine its {p} parameters")
        batch = run.batch(k, seg_ids, groups, "opt", Rs)
        st = run.lm(batch, x0, np.arange(len(cands)), max_steps=run.phase1_steps)
        best = int(np.argmin(np.where(st["ok"], st["cost"], np.inf)))
        keep = _lm.select(st, [best])
        keep["rows"] = np.array([0])
        batch = run.batch(k, seg_ids[best : best + 1], groups, "opt", Rs[best : best + 1])
        st = run.lm(batch, None, None, max_steps=run.max_steps, state=keep)
        st["R_ref"] = Rs[best : best + 1]
        rss = st["aux"][0]
        rms_w = np.sqrt(rss / np.array([3.0 * run.segs[i].n for i in pooled]))
        med = float(np.median(rms_w))
        # far above the window's own fit and the other windows' (a wrong basin, or a body the
        # others do not share); a window the shared body explains up to model error stays:
        # leaving such windows out would bias the estimate
        bad = [
            j for j, i in enumerate(pooled)
            if rms_w[j] > JOINT_OWN * rows[i]["own"]["rms"] and (rms_w[j] > JOINT_MEDIAN * med or S == 1)
            and rms_w[j] > POOR_NOISE * run.noise[i]
        ]
        if not bad:
            break
        for j in bad:
            i = pooled[j]
            rows[i]["status"] = FitStatus.POOR_FIT
            rows[i]["reason"] = (
                f"under the shared inertia its residual is {rms_w[j]:.3g} rad/s, above {JOINT_OWN:g}x its own fit's "
                f"({rows[i]['own']['rms']:.3g}) and {JOINT_MEDIAN:g}x the median over the pooled windows ({med:.3g}): not "
                "explained by the body the others share (a wrong basin?); left out of the joint fit"
            )
            excluded_joint.append(i)
        pooled = [i for j, i in enumerate(pooled) if j not in bad]
        if not pooled:
            status, message = _overall(rows, per.combined.get("excluded", {}), ["no window left to pool"])
            return InertiaFit(status=status, message=message, combined=dict(per.combined, n=0), **base)
    # ---- report in the reported coordinates; finer sub-steps while the step error shifts an estimate
    bias_names = []
    if spec.bias:
        for g_ in range(G):
            src = f" ({sources[g_]})" if G > 1 else ""
            bias_names += [(f"bias_{c}{src}", spec.n_phys + 3 * g_ + a) for a, c in enumerate("xyz")]
    G_w = len(pooled)
    R_best = st["R_ref"]
    for _round in range(8):
        xp = _to_phys(run, st)
        phy = run.batch(k, np.array(pooled)[None], groups, "phys")
        _, A_p, _, ok_p, rss_p = phy.evaluate(xp, np.array([0]))
        cov, s2, singular = _covariance(A_p[0], float(rss_p[0].sum()), m, phy.P)
        est, se, J = _estimates(run, xp[0, : spec.n_phys], cov[: spec.n_phys, : spec.n_phys])
        shifts, rms_e = _step_shift(run, phy, xp, np.array([0]), k, [cov], [s2], [J], bias_names)
        worst = max((abs(v_) for v_ in shifts[0].values()), default=0.0)
        if not (run.adapt and worst > SHIFT_MAX and np.any(k[pooled] < K_MAX) and st["ok"][0]):
            break
        k[pooled] = np.minimum(2 * k[pooled], K_MAX)
        batch = run.batch(k, np.array(pooled)[None], groups, "opt", R_best)
        st = run.lm(batch, st["x"], np.array([0]), max_steps=run.max_steps)
        st["R_ref"] = R_best
    # total: the sandwich over windows (never below the statistical), Student t; where it
    # misses the windows' own interval, the model error pulls the joint estimate: span both
    se_tot = {name: float("nan") for name in run.names}
    intervals = {name: (float("nan"), float("nan")) for name in run.names}
    widened, dof = [], np.full(len(run.names), float(G_w - 1))
    if not singular and G_w > 1:
        scores = phy.scores(xp[0], 0)
        sw = _combine.sandwich(A_p[0], scores)
        se_sw = standard_errors(J, sw[: spec.n_phys, : spec.n_phys])
        dof = _combine.cluster_dof(J @ (np.linalg.pinv(A_p[0]) @ scores.T)[: spec.n_phys])
        for j_, n_ in enumerate(run.names):
            se_tot[n_] = float(np.fmax(se_sw[j_], se[n_]))
            lo, hi = _combine.t_interval(est[n_], se_tot[n_], dof[j_] if np.isfinite(dof[j_]) else G_w - 1)
            own = [rows[i]["own"]["estimates"][n_] for i in pooled if rows[i]["own"]["status"] == FitStatus.CONVERGED]
            w_lo, w_hi, _, _ = _combine.window_interval(own)
            if np.isfinite(w_lo) and (w_hi < lo or w_lo > hi):
                lo, hi = min(lo, w_lo), max(hi, w_hi)
                widened.append(n_)
            intervals[n_] = (max(lo, lower_bound(n_)), hi)  # never beyond the physically possible
    theta, _ = phys_theta(xp[:, : spec.n_phys], spec)
    off_w = spec.n_phys + G * n_b
    w0s = xp[0, off_w:].reshape(-1, 3)
    bias_w = np.array([xp[0, spec.n_phys + 3 * g_ : spec.n_phys + 3 * g_ + 3] if spec.bias else np.zeros(3) for g_ in groups])
    bias_se = np.sqrt(np.maximum(np.diag(cov), 0.0)) if np.all(np.isfinite(cov)) else np.full(phy.P, np.inf)
    ref = (
        reference_rms([run.segs[i] for i in pooled], np.repeat(theta, len(pooled), 0), w0s, bias_w, spec)
        if reference_check else np.full(len(pooled), np.nan)
    )
    lm_status = _LM_STATUS[_lm.LMStatus(int(st["status"][0]))] if (st["ok"][0] and ok_p[0]) else FitStatus.NONFINITE
    rel = [se[key] / abs(est[key]) if est[key] else np.inf for key in ("Ix/Iy", "Iz/Iy")]
    joint_reason = ""
    if lm_status == FitStatus.CONVERGED and (singular or max(rel) > REL_SE_MAX):
        lm_status = FitStatus.UNIDENTIFIABLE
        joint_reason = "the joint fit: the pooled windows do not determine the inertia ratios"
    elif lm_status != FitStatus.CONVERGED:
        joint_reason = f"the joint fit: {lm_status.value}"
    model = per._model
    for j, i in enumerate(pooled):
        r = rows[i]
        r["rms"] = float(np.sqrt(rss_p[0, j] / (3 * run.segs[i].n)))
        r["rms_reference"] = float(ref[j])
        r["omega0"] = w0s[j].tolist()
        r["omega0_se"] = bias_se[off_w + 3 * j : off_w + 3 * j + 3].tolist()
        r["step_error_rms"] = float(rms_e[0, j])
        r["status"], r["reason"] = lm_status, joint_reason
        if spec.bias:
            ob = spec.n_phys + 3 * groups[j]
            r["bias"] = bias_w[j].tolist()
            r["bias_se"] = bias_se[ob : ob + 3].tolist()
        if lm_status == FitStatus.CONVERGED and reference_check and not (abs(ref[j] - r["rms"]) <= REF_TOL * r["rms"]):
            r["status"] = FitStatus.STEP_ERROR
            r["reason"] = f"re-simulated by DOP853 the residual is {ref[j]:.3g} rad/s against the joint fit's {r['rms']:.3g}"
        model["theta"][i] = theta[0]
        model["omega0"][i] = w0s[j]
        model["bias"][i] = bias_w[j]
        model["substeps"][i] = r["substeps"] = int(k[i])
    status, message = _overall(rows, per.combined.get("excluded", {}))
    bias = {}
    if spec.bias:
        for g_ in range(G):
            ob = spec.n_phys + 3 * g_
            bias[sources[g_]] = {"value": xp[0, ob : ob + 3].tolist(), "se": bias_se[ob : ob + 3].tolist()}
    method = (
        f"cluster-robust (sandwich) error over the {G_w} windows, at least the statistical one; Student t with "
        f"the windows' effective degrees of freedom ({np.nanmin(dof):.1f}-{np.nanmax(dof):.1f} of at most {G_w - 1})"
    )
    if widened:
        method += (
            f"; for {', '.join(widened)} that interval misses the windows' own fits' interval (model error pulls the "
            "joint estimate): the interval spans both"
        )
    combined = dict(
        per.combined, n=len(pooled), windows=pooled, sources=sources, excluded_windows=[rows[i]["name"] for i in excluded_joint],
        method=method, widened=widened, dof={n_: (float(d_) if np.isfinite(d_) else None) for n_, d_ in zip(run.names, dof)}, sigma=math.sqrt(s2) if math.isfinite(s2) else None, iterations=int(st["it"][0]), bias=bias,
    )
    m_tot = sum(3 * run.segs[i].n for i in pooled)
    step_error = {
        "substeps": [int(kk) for kk in k], "rms": float(np.sqrt(np.sum(rms_e[0] ** 2 * np.array([3 * run.segs[i].n for i in pooled])) / m_tot)),
        "shift_se": shifts[0], "max_shift_se": max((abs(v_) for v_ in shifts[0].values()), default=0.0),
    }
    base.update(
        estimates=est, uncertainties=se, total_uncertainties=se_tot, intervals=intervals,
        rms=float(np.sqrt(rss_p[0].sum() / m_tot)), step_error=step_error, _model=model,
    )
    return InertiaFit(status=status, message=message, combined=combined, **base)


def _warn(result: InertiaFit, substeps) -> None:
    if result.status != FitStatus.CONVERGED:
        warnings.warn(f"fit_inertia: status {result.status.value}: {result.message}", stacklevel=3)
    if substeps != "auto" and result.step_error and result.step_error["max_shift_se"] > 1.0:
        se_ = result.step_error
        worst = max(se_["shift_se"], key=lambda k_: abs(se_["shift_se"][k_]))
        warnings.warn(
            f"fit_inertia: the simulation's step error (substeps={substeps}) shifts the estimates by up to "
            f"{se_['max_shift_se']:.1f} standard errors ({worst}), which the reported errors do not include: use "
            "substeps='auto' or raise substeps",
            stacklevel=3,
        )


# ----------------------------------------------------------------------------- proof by search


def multistart_check(fit: InertiaFit, *, starts: int = 100, seed: int = 12345, extra=(), max_steps: int = 300,
                     progress: Callable | None = None) -> list[dict]:
    """Search every fitted window of a per-window fit densely for a lower least-squares cost.

    Each window is refitted from ``starts`` random physically valid inertias
    (:func:`rigidjax.identify._model.random_chart`: ratios spread over ~0.05-60, principal
    axes anywhere), from the consensus (the median of the converged windows' estimates) and
    from ``extra`` (model values in the ``I_yy = 1`` gauge, e.g. a joint estimate), each with
    the first sample and with the reported initial rate, every start to convergence with the
    same sub-steps as the fit. An independent check of the fit's search (another seed, far
    more starts), not part of it: what it reports should be the minimum.

    Returns:
        Per fitted window: ``name``, ``reported_cost`` and ``best_cost`` (1/2 RSS, rad^2/s^2),
        ``excess`` (``reported / best - 1``: > 0 where a start found a lower cost),
        ``best_estimates`` (Ix/Iy, Iz/Iy of the best start), ``hits`` (starts within 0.5 % of
        the best) and ``n_starts``.
    """
    spec = fit._model["spec"]
    segs = fit._data
    rows = fit.segments
    wins = np.array([i for i, r in enumerate(rows) if r.get("rms") is not None and "estimates" in r and r["estimates"]])
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
    batch = run.batch(k, wins[owner][:, None], [0], "opt", R_ref)
    r = run.lm(batch, x0, np.arange(x0.shape[0]), max_steps=max_steps)
    cost = np.where(r["ok"], r["cost"], np.inf)
    out = []
    theta_r, _ = chart_theta(r["x"][:, : spec.n_chart], R_ref, spec)
    for j, i in enumerate(wins):
        idx = np.flatnonzero(owner == j)
        b = idx[np.argmin(cost[idx])]
        rep = 0.5 * rows[i]["rms"] ** 2 * 3 * segs[i].n
        ph = theta_phys(theta_r[b : b + 1], spec)[0]
        out.append({
            "name": rows[i]["name"], "reported_cost": rep, "best_cost": float(cost[b]),
            "excess": rep / float(cost[b]) - 1 if cost[b] > 0 else 0.0,
            "best_estimates": {"Ix/Iy": float(ph[0]), "Iz/Iy": float(ph[1])},
            "hits": int(np.sum(cost[idx] <= 1.005 * cost[b])), "n_starts": int(idx.size),
        })
    return out
