"""fit_inertia's windows and shared state: the input checks and labels, the initial sub-steps,
the reported quantities and their errors, and the overall verdict
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
    noise_and_signal,
    pad,
    pad_length,
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

    def batch(self, k, seg_ids, groups, R_ref=None):
        return Batch(self.spec, self.data, k, seg_ids, groups, R_ref=R_ref)

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


def _estimates(run: _Run, xp_sh: np.ndarray, cov_sh: np.ndarray):
    """Named estimates and standard errors of the reported shared coordinates."""
    v, J = derived_jacobian(xp_sh, run.spec, run.scale)
    se = standard_errors(J, cov_sh)
    return dict(zip(run.names, map(float, v))), dict(zip(run.names, map(float, se))), J


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
    # a recording none of whose windows converged adds nothing to the combined estimate: named
    # where others are pooled (the counts above say only how many windows)
    fine = {r.get("recording") for r in rows if r["status"] == FitStatus.CONVERGED}
    lost = [g for g in dict.fromkeys(r.get("recording") for r in rows) if g not in fine and g not in excluded]
    if fine and lost:
        names = "; ".join(map(str, lost))
        parts.append(f"no window of {len(lost)} recording(s) converged, none of them pooled: {names}")
    parts += list(extra)
    present = [s for s in _SEVERITY if s in counts or (s == FitStatus.INCONSISTENT and excluded)]
    status = present[0] if present else FitStatus.UNIDENTIFIABLE
    if status == FitStatus.CONVERGED:
        return status, f"every window converged to its least-squares minimum ({len(rows)} window(s))"
    return status, "; ".join(parts) + " (left out of the combined estimate)"
