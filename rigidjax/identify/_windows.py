"""fit_inertia's windows and shared state: the input checks and labels, the initial sub-steps,
the reported coordinates and their covariance, the step-error shift and the overall verdict
(the per-window fits themselves: :mod:`rigidjax.identify._window_fits`; the joint fit:
:mod:`rigidjax.identify._joint`).

Part of :func:`rigidjax.identify.fit_inertia` (module docstring of :mod:`rigidjax.identify._fit`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ..io import Segment, load
from . import _lm
from ._derived import FitError, derived_jacobian, names, standard_errors
from ._model import (
    chart_theta,
    noise_and_signal,
    pad,
    pad_length,
    simulate,
    theta_phys,
)
from ._across import medoid
from ._problems import Batch
from ._result import FitStatus

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
#: Joint fits: a window is a poor fit if its residual under the shared inertia is above
#: ``JOINT_OWN`` times its own fit's and ``JOINT_MEDIAN`` times the median over the pooled
#: windows (and ``POOR_NOISE`` x its noise): model error alone leaves 1-4x its own residual.
JOINT_OWN, JOINT_MEDIAN = 5.0, 3.0
#: Rates above this (rad/s, ~8 rev/s) are beyond a hand throw (the racquet flips peak at
#: ~21 rad/s): such a window is refused, naming deg/s, unless ``max_rate`` is raised.
MAX_RATE = 50.0

_SEVERITY = (
    FitStatus.NONFINITE,
    FitStatus.MAX_STEPS,
    FitStatus.STALLED,
    FitStatus.INCONSISTENT,
    FitStatus.POOR_FIT,
    FitStatus.NOT_FREE,
    FitStatus.STEP_ERROR,
    FitStatus.UNIDENTIFIABLE,
    FitStatus.CONVERGED,
)
_LM_STATUS = {
    _lm.LMStatus.CONVERGED: FitStatus.CONVERGED,
    _lm.LMStatus.MAX_STEPS: FitStatus.MAX_STEPS,
    _lm.LMStatus.NONFINITE: FitStatus.NONFINITE,
    _lm.LMStatus.STALLED: FitStatus.STALLED,
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
        self.labels = _recording_labels(segs)
        self.adapt = True

    def tick(self, n_active):
        if self.progress is not None:
            self.progress(n_active)

    def batch(self, k, seg_ids, groups, chart, R_ref=None):
        return Batch(self.spec, self.data, k, seg_ids, groups, chart=chart, R_ref=R_ref)

    def lm(self, batch, x0, rows, *, max_steps, state=None):
        lo, hi = batch.bounds(x0.shape[0]) if state is None else (None, None)
        return _lm.solve(
            batch.evaluate,
            x0,
            rows,
            lo,
            hi,
            eps=batch.eps,
            max_steps=max_steps,
            state=state,
            progress=self.tick,
        )


# ----------------------------------------------------------------------------- starts


def _full_x(run: _Run, shared: np.ndarray, windows: np.ndarray, *, bias=None, w0=None) -> np.ndarray:
    """Per-window problem vectors ``[shared | bias | omega0]`` (omega0: first sample by default)."""
    n = shared.shape[0]
    b = np.zeros((n, run.spec.n_bias)) if bias is None else bias
    w = np.stack([run.segs[i].omega[0] for i in windows]) if w0 is None else w0
    return np.concatenate([shared, b, w], 1)


def _medoid(theta: np.ndarray) -> np.ndarray:
    """The row of ``theta`` (model values, I_yy = 1) nearest the median in log ratios (a physical point)."""
    return theta[medoid(np.log(np.maximum(np.abs(theta[:, [0, 2]]), 1e-12)))]


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
    rms_e = np.sqrt(np.sum((e * weight[:, :, None]) ** 2, axis=(1, 2)) / np.maximum(ms, 1)).reshape(
        xp.shape[0], batch.S
    )
    fake = np.array(run.data[0], dtype=float)
    fake[segs] = w_k + bias[:, None, :] - e
    fb = Batch(
        run.spec,
        (fake.astype(run.data[0].dtype), run.data[1], run.data[2]),
        batch.k,
        batch.seg_ids,
        batch.groups,
        chart="phys",
    )
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
