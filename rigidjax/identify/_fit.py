r"""Inertia (and angular drag, gyroscope bias) from measured body angular velocity.

Model (:mod:`rigidjax.identify._model`): ``I omega' = -omega x I omega - D omega``, the
gyroscope reads ``omega + b + noise``; least squares in rad/s at the measured timestamps.
What :func:`fit_inertia` does, window by window:

1. **Checks what can be identified before fitting**: a window with fewer than
   :data:`MIN_SAMPLES` samples, or whose rates do not vary above the gyroscope noise
   (signal RMS below :data:`SNR_MIN` times the noise: no motion, noise only, a steady spin
   about one axis) is :attr:`~FitStatus.UNIDENTIFIABLE` and not fitted. Windows longer than
   ``max_duration`` (free flight) or ``max_samples`` are refused (:class:`FitError`).
2. **Finds the least-squares minimum over the physically valid set**, on the
   identification layer (:mod:`rigidjax.identify._window_fits`): every window is a
   :func:`~rigidjax.identify.recipes.window_problems` problem (principal-moment or tensor
   ratios over ``I_yy`` in transforms whose box is the valid set, so thin-plate edges
   ``I_z = I_x + I_y`` are reached exactly; drag; initial rate; gyroscope bias), all fitted by
   one :func:`~rigidjax.identify.fit_many` call with the windows' recordings as ``groups``:
   bounded Levenberg-Marquardt (:mod:`rigidjax.identify._lm`) from the equation-error
   estimates (of the window, of all windows of its recording, of principal moments alone)
   and random starts around the first, ``phase1_steps`` iterations each, the best continued
   to first-order optimality. Windows whose residual is far above their
   recording's others or their own signal (suspects) are refitted from the consensus of the
   other windows (all, and the same recording's) and random starts; the lowest cost wins.
   A dense search (:func:`multistart_check`: 100 random starts per window) finds no lower
   minimum on any of the 69 shared racquet windows.
   ``converged`` means first-order optimality holds (see :mod:`rigidjax.identify._lm`).
3. **Keeps the step error out of the estimates**: sub-steps per sample interval start per
   window from ``|omega| dt`` (:data:`ROT_TARGET` rad per sub-step); the layer's step-error
   check (:mod:`rigidjax.identify._step_error`: Richardson, ``k`` against ``2 k``
   sub-steps, bounded by the first-order factor 2) converts the midpoint step's error into
   the shift it causes in every estimate and, while a shift exceeds 0.3 classical standard
   errors (those the rows report), doubles the window's sub-steps and refits (up to 8 times
   the first; with a fixed ``substeps`` it only reports, and a shift above 0.3 standard
   errors is :attr:`~FitStatus.STEP_ERROR`). Each fitted window is then re-simulated by a
   tight independent integrator (SciPy DOP853,
   :func:`~rigidjax.identify.recipes.reference_check`): a residual that differs by more than
   :data:`REF_TOL` doubles the window's sub-steps again (``substeps="auto"``, up to
   :data:`K_MAX`, refitted from its optimum), else marks it :attr:`~FitStatus.STEP_ERROR`.
   The rows state the shift at the midpoint step's second-order factor (4/3).
4. **Judges each window**: a residual above 5x the median over the windows of its recording
   (over all windows where it has fewer than 3) or 25 % of the window's signal, and above 10x
   its noise, is :attr:`~FitStatus.POOR_FIT` (a wrong basin or not free flight); so is a
   minimum on the valid set's edge where the data ask for more (an unconstrained step would
   remove over 60 % of the residual); a relative standard error of a ratio above 50 %, or
   singular normal equations, :attr:`~FitStatus.UNIDENTIFIABLE`; so is a window whose
   optimiser ran out of iterations or stalled on its way to a degenerate minimum: at a
   rod-like inertia (a principal-moment ratio beyond ``V_MAX``), or where the Gauss-Newton
   model promises an insignificant further decrease (below
   :data:`~rigidjax.identify._verdict.CHI2_1_95` residual variances) while the ratios stay
   undetermined (``_verdict.flat``).
5. **Checks a fitted gyroscope bias against the gyroscope at rest** (``bias=True``): where the
   window's recording lies still somewhere (:attr:`rigidjax.io.Segment.rest`), a bias more than
   3.3 errors from the reading there (more over many windows: Bonferroni) absorbs model
   error: the fit is :attr:`~FitStatus.POOR_FIT` (after pooling, which it does not change;
   :mod:`rigidjax.identify._rest`). ``bias="rest"`` subtracts the reading instead of fitting
   a bias.
6. **Pools only what belongs together**: recordings (``Segment.source``) whose estimates
   disagree beyond their spread are named and left out (:mod:`rigidjax.identify._combine`;
   ``pool="all"`` forces pooling); the combined estimate carries a statistical error and a
   95 % interval covering the between-window scatter.

Joint fits (one inertia for all windows) run the per-window fits first (the same quality
rule and consistency check, and their estimates as starts); with a gyroscope bias the
recordings are compared again, each recording's windows fitted jointly (one bias per
recording pins down what a bias per window absorbs:
:func:`~rigidjax.identify._joint._recordings_agree`); then the pooled windows are fitted
together on the layer (:mod:`rigidjax.identify._joint`): one problem with a segment per
window (its own initial rate), the shared inertia and drag, a gyroscope bias per recording,
started from the median of the windows' estimates, the medoid window's and the joint
equation-error estimate (the first ``starts`` of them), with the same phases and step-error
check. A window whose residual
under the shared inertia is far above its own fit's and the others' is left out and the fit
repeated (:data:`~rigidjax.identify._joint.JOINT_ROUNDS` times at most). The total error is
the cluster-robust (sandwich) error over windows from each window's first-order influence on
the estimate (``ProblemFit.segment_influence``), with Student t at the windows' effective
degrees of freedom. With a bias, each recording's joint bias is finally checked against its
reading at rest as in 5. (:func:`~rigidjax.identify._rest.judge_recordings`): a contradiction
makes the whole fit ``poor_fit``, its estimate kept and flagged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from ._derived import FitError, parse_scale
from ._lm import one_blas_thread
from ._stored import warn_at_caller
from . import _rest
from ._model import (
    DRAG_KINDS,
    Spec,
)
from ._result import FitStatus, InertiaFit
from .pendulum import looks_like_pendulum
from ._joint import _combine_windows, _joint
from ._windows import (
    MAX_DURATION,
    MAX_RATE,
    MAX_SAMPLES,
    MIN_SAMPLES,
    SNR_MIN,
    _Run,
    _as_segments,
    _initial_substeps,
    _label,
    _recording_labels,
)
from ._window_fits import per_window

# ----------------------------------------------------------------------------- main entry


@one_blas_thread
def fit_inertia(
    segments,
    *,
    tensor: bool = False,
    drag: str | None = None,
    bias: bool | str = False,
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
        bias: ``False`` (default), ``True`` (or ``"fit"``): fit a constant gyroscope bias (rad/s): per
            window, and per recording (``Segment.source``) in a joint fit; where a recording
            lies still somewhere (``Segment.rest``) the fitted bias is judged against the
            gyroscope's reading at rest (:mod:`rigidjax.identify._rest`: a contradicted bias
            absorbs model error, status ``poor_fit``). ``"rest"``: the bias is that reading,
            subtracted from the rates, not fitted (every recording must lie still somewhere).
        joint: one shared inertia (and drag) for the pooled windows, each with its own initial
            angular velocity; ``False`` (default) fits every window alone and combines.
        scale: a known value fixing the scale: ``"Iy=1.3911e-3"``, ``{"Iy": ...}``,
            ``("trace", ...)`` (kg m^2); without it only ratios are reported.
        substeps: ``"auto"`` (default: per window from ``|omega| dt``, doubled while the step
            error shifts an estimate by more than :data:`SHIFT_MAX` standard errors) or a fixed
            integer >= 1 for every window (the shift is still reported: a window whose estimates
            it moves by more than 0.3 standard errors is ``step_error``, and the fit warns above 1).
        starts: starts per window (the equation-error estimates of the window, its recording and
            principal moments alone first, then random ones around the first).
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
            ``max_samples`` or faster than ``max_rate``, ``bias="rest"`` with a recording that
            never lies still, a joint fit with fewer measured values than unknowns.
            (:class:`rigidjax.io.DataError` for NaN / malformed data.)

    Warns:
        UserWarning: a fit that is not converged (the message says why and names the
            windows and recordings), a step error above 1 standard error with a fixed
            ``substeps``, and a fit in float32 (without ``jax_enable_x64``).
    """
    segs = _as_segments(segments)
    if drag not in DRAG_KINDS:
        raise FitError(f"drag must be one of {DRAG_KINDS}; got {drag!r}")
    if substeps != "auto" and not (
        isinstance(substeps, (int, np.integer)) and not isinstance(substeps, bool) and 1 <= substeps <= 1024
    ):
        raise FitError(f"substeps must be 'auto' or an integer in [1, 1024]; got {substeps!r}")
    for name, v, lo in (
        ("starts", starts, 1),
        ("max_steps", max_steps, 1),
        ("phase1_steps", phase1_steps, 0),
        ("max_samples", max_samples, MIN_SAMPLES),
    ):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo):
            raise FitError(f"{name} must be an integer >= {lo}; got {v!r}")
    if progress is not None and not callable(progress):
        raise FitError(f"progress must be a callable progress(n_active) or None; got {progress!r}")
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
                "free flight (a toss: about a second); split the recording into windows (meta/segments.csv), let "
                "rigidjax find the free flights (--windows detect; rigidjax.io.load(path, windows='detect')), or "
                "raise the bound (--max-duration / --max-samples) if this really is torque-free motion"
            )
    peak = [float(np.max(np.linalg.norm(s.omega, axis=1))) if s.n else 0.0 for s in segs]
    fast = [i for i in range(len(segs)) if peak[i] > max_rate]
    if fast:
        i = max(fast, key=lambda j: peak[j])
        raise FitError(
            f"{len(fast)} window(s) spin faster than {max_rate:g} rad/s, beyond a hand throw; "
            f"{_label(segs[i], i)} reaches {peak[i]:.4g} rad/s ({math.degrees(peak[i]):.4g} deg/s). "
            "If the rates are in deg/s, convert them to rad/s "
            "(x pi/180); if the body really spins this fast, raise the bound (max_rate / --max-rate)"
        )
    if isinstance(bias, str) and bias in ("fit", "rest"):
        bias = True if bias == "fit" else bias
    elif bias is None or isinstance(bias, (bool, np.bool_)) or (isinstance(bias, (int, np.integer)) and bias in (0, 1)):
        bias = bool(bias)
    else:
        raise FitError(
            f"bias must be True/'fit', False/None or 'rest'; got {bias!r} (a known bias: subtract it from the "
            "segments' rates, or give it as the recording's reading at rest, Segment.rest)"
        )
    labels = _recording_labels(segs)
    fit_segs, at_rest = _rest.subtract(segs, labels) if bias == "rest" else (segs, None)
    spec = Spec(bool(tensor), drag, bias is True)
    dtype = jnp.result_type(float)
    if jnp.dtype(dtype) != jnp.float64:
        warn_at_caller(
            f"fit_inertia: fitting in {jnp.dtype(dtype).name} (JAX's default without 64-bit mode): round-off in the "
            "simulated rates and their derivatives can stall the optimiser (status 'stalled') and degrades the "
            'standard errors; for a trustworthy fit enable float64 first: jax.config.update("jax_enable_x64", True)'
        )
    run = _Run(fit_segs, spec, scale, seed=seed, max_steps=max_steps, phase1_steps=phase1_steps, progress=progress)
    run.adapt = substeps == "auto"
    n = len(segs)
    p_window = spec.n_phys + spec.n_bias + 3

    # ---- 1. what can be identified at all
    pre = {}
    not_free = {}
    for i, s in enumerate(segs):
        swing = looks_like_pendulum(fit_segs[i].omega) if s.n >= MIN_SAMPLES else None
        if s.n < MIN_SAMPLES or 3 * s.n <= p_window + 3:
            pre[i] = f"{s.n} samples: too few to determine {p_window} parameters (at least {MIN_SAMPLES} samples)"
        elif run.signal[i] <= SNR_MIN * run.noise[i]:
            pre[i] = (
                f"the rates vary by {run.signal[i]:.2g} rad/s RMS, within {SNR_MIN:g}x the gyroscope noise "
                f"({run.noise[i]:.2g} rad/s): no motion, noise only, or a steady spin about one axis, "
                "which fits any inertia"
            )
        elif swing is not None:
            not_free[i] = (
                f"the rates oscillate about the {'xyz'[swing]} axis alone: a pendulum swing, not free flight (fit it "
                "with rigidjax.identify.pendulum / `rigidjax fit-pendulum`)"
            )
    wins = np.array([i for i in range(n) if i not in pre and i not in not_free], int)
    k = _initial_substeps(segs, None if substeps == "auto" else substeps)

    rows = [
        dict(
            name=s.name or f"window {i}", comment=s.comment, source=s.source, recording=labels[i], n=s.n, index=s.index
        )
        for i, s in enumerate(segs)
    ]
    per = per_window(run, wins, k, starts, adapt=(substeps == "auto"), reference_check=reference_check)
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
    result = _combine_windows(run, rows, pool)
    if spec.bias and not joint:
        _rest.judge_windows(result, segs)
    if joint:
        result = _joint(run, rows, result, k, pool, reference_check=reference_check, starts=starts)
        if spec.bias:
            _rest.judge_recordings(result, segs, labels)
    if at_rest is not None:  # the model reads omega + the bias at rest, against the raw rates
        result.combined["bias"] = at_rest
        if result._model is not None:
            result._model["bias"] = [s.rest.value for s in segs]
    result._data = segs
    result.options = {
        "tensor": spec.tensor,
        "drag": drag,
        "bias": "rest" if at_rest is not None else spec.bias,
        "substeps": substeps,
        "starts": starts,
        "scale": list(scale) if scale else None,
        "joint": bool(joint),
        "pool": pool,
        "stepper": "rigidjax.midpoint.angular_velocity_step (seed 000)",
    }
    _warn(result, substeps)
    return result


def _warn(result: InertiaFit, substeps) -> None:
    if result.status != FitStatus.CONVERGED:
        warn_at_caller(f"fit_inertia: status {result.status.value}: {result.message}")
    if substeps != "auto" and result.step_error and result.step_error["max_shift_se"] > 1.0:
        se_ = result.step_error
        worst = max(se_["shift_se"], key=lambda k_: abs(se_["shift_se"][k_]))
        warn_at_caller(
            f"fit_inertia: the simulation's step error (substeps={substeps}) shifts the estimates by up to "
            f"{se_['max_shift_se']:.1f} standard errors ({worst}), which the reported errors do not include: use "
            "substeps='auto' or raise substeps"
        )
