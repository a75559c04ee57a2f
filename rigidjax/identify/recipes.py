r"""Ready-made :class:`rigidjax.identify.Problem`\ s for common recordings.

:func:`window_problems` turns free-flight windows seen by a gyroscope into one problem per
window of :func:`~rigidjax.identify.fit_inertia`'s per-window model, for
:func:`~rigidjax.identify.fit_many` (``groups``: the recordings) and
:func:`~rigidjax.identify.combine`; :func:`reference_check` re-simulates the fitted windows by
SciPy's DOP853, as fit_inertia does.

:func:`free_body_problem` turns one :class:`rigidjax.io.Motion` (a free or torque-driven rigid
body seen by a gyroscope, motion capture and/or a position tracker) into a problem for
:func:`rigidjax.identify.fit`, with start values from the data:

* inertia: principal moments along the body axes, physically valid at every iterate
  (triangle inequalities included; a thin plate's face reached exactly): absolute (kg m^2,
  :class:`~rigidjax.identify.transforms.PrincipalMoments`) when the recording has known
  torques, else the ratios ``Ix/Iy, Iz/Iy`` (``Iy = 1``,
  :class:`~rigidjax.identify.transforms.MomentRatios`, as
  :func:`~rigidjax.identify.fit_inertia`'s; torque-free motion fixes only ratios). The start
  is the equation-error estimate in integral form (``I omega_dot = tau + (I omega) x omega``
  integrated over spans of the recording, solved in the least squares sense for the diagonal
  ``I``, with the rates from the gyroscope or from the orientation's finite differences,
  smoothed by a local cubic: :func:`smoothed_rates`), or ``(1, 1.5, 2)`` (scaled by the
  torques' integrals, where there are torques) where that is not physical;
* gravity (m/s^2, world), fitted where the position is measured, started from the mean
  second difference of the positions (any world axes);
* initial state: angular velocity always, the orientation where it is measured, position and
  velocity where the position is;
* observations weighted by noise levels estimated from second differences of each signal
  (white noise: ``std(diff2) / sqrt(6)``); the fit's covariance rescales by the residuals, so
  only the relative weights matter;
* sub-steps from the fastest rotation per sample: ``ceil(max |omega| dt / 0.05)`` at the
  largest interval ``dt`` (a gap over :data:`GAP_RATIO` times the median warns);
* the midpoint step with its second-order attitude update (``attitude="midpoint"``).

Units are checked first: rates above 50 rad/s (beyond a hand throw: most likely deg/s) and a
median sample interval above 0.5 s (most likely ms) raise :class:`rigidjax.identify.FitError`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..body import RigidBody, RigidBodyState
from ..io import Motion
from ..midpoint import Midpoint
from ._derived import FitError
from ._stored import warn_at_caller
from . import observations as obs
from .problem import FreeBodyInitial, MeasuredSegment, Parameter, Problem
from ._model import DRAG_KINDS, V_MAX, Spec, equation_error_guess, reference_rates, theta_chart
from ._windows import REF_TOL, _as_segments, _initial_substeps, _recording_labels
from ._result import FitStatus
from .transforms import Box, MomentRatios, PrincipalMoments, Real, TensorRatios

__all__ = [
    "free_body_problem",
    "window_problems",
    "window_groups",
    "reference_check",
    "noise_level",
    "rates_from_orientation",
    "smoothed_rates",
    "MAX_RATE",
    "MAX_SAMPLE_INTERVAL",
    "GAP_RATIO",
]

#: Fastest angular rate accepted, rad/s (beyond a hand throw: deg/s data).
MAX_RATE = 50.0
#: Longest median sample interval accepted, s (beyond it: timestamps in ms).
MAX_SAMPLE_INTERVAL = 0.5
#: A sample interval this many times the median is a gap (warned: it sets the sub-steps).
GAP_RATIO = 10.0


def noise_level(y: np.ndarray) -> float:
    """White-noise standard deviation of a smooth signal ``(n, k)`` from its second differences
    (robust: the median absolute deviation), at least ``1e-6`` of the signal's size and ``1e-6``."""
    y = np.asarray(y, float)
    d2 = np.diff(y, 2, axis=0)
    s = float(np.median(np.abs(d2 - np.median(d2, axis=0))) * 1.4826 / math.sqrt(6))
    # noise-free data: a floor at 1e-6 of the signal's size and at 1e-6 (m, rad/s): far below any real sensor
    return max(s, 1e-6 * float(np.max(np.abs(y))), 1e-6)


def rates_from_orientation(t: np.ndarray, q: np.ndarray, smooth: bool = False) -> np.ndarray:
    """Body angular velocity ``(n, 3)`` rad/s from unit quaternions ``(n, 4)`` as
    ``2 conj(q) dq/dt`` (signs of ``q`` made continuous first): ``dq/dt`` by central
    differences, or, with ``smooth``, ``q`` and ``dq/dt`` from a local quadratic
    (Savitzky-Golay over :data:`ORIENTATION_TURN` of rotation at the median rate, at most
    twice :data:`SMOOTHING_SPAN`), for start values: at the recording's ends a one-sided
    difference of noisy quaternions is off by several rad/s (0.01 noise at 100 Hz: ~5)."""
    q = np.array(q, float)
    for i in range(1, len(q)):
        if np.dot(q[i], q[i - 1]) < 0:
            q[i] = -q[i]
    dq = np.gradient(q, t, axis=0)
    if smooth:
        # a local quadratic over ORIENTATION_TURN of rotation (at the median rate), at most
        # 2 SMOOTHING_SPAN: 0.2 s at 3 rad/s; the end point's rate error at 100 Hz with 0.01
        # noise, 24 seeds: rms 0.45 rad/s, against 2.9 for a cubic over 0.1 s and ~5 for a
        # one-sided difference; noise-free bias 0.03 rad/s
        typical = float(np.median(np.linalg.norm(_body_rate(q, dq), axis=1)))
        window = _window(t, min(2 * SMOOTHING_SPAN, ORIENTATION_TURN / max(typical, 1e-9)))
        if window:
            from scipy.signal import savgol_filter

            dt = float(np.median(np.diff(t)))
            q, dq = savgol_filter(q, window, 2, axis=0), savgol_filter(q, window, 2, deriv=1, delta=dt, axis=0)
    return _body_rate(q, dq)


def _body_rate(q, dq):
    """``2 conj(q) dq / |q|^2``, vector part ``(n, 3)``: the body rate of a (near-)unit ``q``."""
    w, x, y, z = q.T
    dw, dx, dy, dz = dq.T
    # 2 conj(q) ⊗ dq, vector part (q unit; the smoothed q up to round-off of its norm)
    return (
        2
        * np.stack(
            [w * dx - x * dw - y * dz + z * dy, w * dy - y * dw - z * dx + x * dz, w * dz - z * dw - x * dy + y * dx],
            -1,
        )
        / np.sum(q * q, axis=1, keepdims=True)
    )


#: Span of the local cubic that smooths the rates for the start values, s.
SMOOTHING_SPAN = 0.1
#: Rotation (rad, at the median rate) spanned by the local quadratic of the quaternions
#: whose derivative gives the start's rates from orientation data.
ORIENTATION_TURN = 0.6
#: Spans of the integrals of the equation-error start, s (with half the recording).
INTEGRAL_SPANS = (0.2, 0.5, 1.0)


def _window(t, span: float = SMOOTHING_SPAN) -> int:
    """A local polynomial's window (samples, odd): ``span`` (s) at the median sample interval,
    at least 5, at most the recording; 0 for fewer than 5 samples."""
    n = len(t)
    w = max(5, int(round(span / float(np.median(np.diff(t))))) | 1)
    w = min(w, n if n % 2 else n - 1)
    return w if w >= 5 else 0


def smoothed_rates(t: np.ndarray, omega: np.ndarray) -> np.ndarray:
    """Rates ``(n, 3)`` (rad/s) smoothed by a local cubic (Savitzky-Golay over
    :data:`SMOOTHING_SPAN`, at least 5 samples, at the median sample interval; fewer samples:
    unchanged), for start values only."""
    from scipy.signal import savgol_filter

    window = _window(t)
    return savgol_filter(omega, window, 3, axis=0) if window else omega


def _moments_start(t, omega, torque) -> np.ndarray:
    """Equation-error estimate of the diagonal inertia (see module), in integral form: Euler's
    equations integrated over spans of :data:`INTEGRAL_SPANS` (at least one sample interval),
    ``I_1 (omega_1(b) - omega_1(a)) - (I_2 - I_3) int omega_2 omega_3 = int tau_1`` and cyclic,
    with the smoothed rates (:func:`smoothed_rates`). Why not derivatives: differencing noisy
    rates (twice, for rates from motion-capture quaternions) amplifies the noise, and noise in
    the regressors shrinks a least-squares estimate toward zero (QA: quaternions with 0.002
    noise at 100 Hz gave moments 1000x too small, whose first rollout failed)."""
    from scipy.integrate import cumulative_trapezoid

    omega = smoothed_rates(t, omega)
    w1, w2, w3 = omega.T
    n = len(t)
    dt = float(np.median(np.diff(t)))
    # spans from INTEGRAL_SPANS and half the recording (the rates' noise enters through the
    # ends only, so long spans carry the most signal per noise), overlapping
    spans = sorted({min(max(1, int(round(s / dt))), n - 1) for s in INTEGRAL_SPANS} | {max(1, (n - 1) // 2)})
    a = np.concatenate([np.arange(n - L) for L in spans])
    b = np.concatenate([np.arange(L, n) for L in spans])

    def span(f):  # integral of f over [t_a, t_b]
        c = cumulative_trapezoid(f, t, initial=0.0)
        return c[b] - c[a]

    dw = omega[b] - omega[a]
    p23, p31, p12 = span(w2 * w3), span(w3 * w1), span(w1 * w2)
    # rows: I1 dw1 - (I2 - I3) int w2 w3 = int tau1, and cyclic
    A = np.concatenate(
        [
            np.stack([dw[:, 0], -p23, p23], -1),
            np.stack([p31, dw[:, 1], -p31], -1),
            np.stack([-p12, p12, dw[:, 2]], -1),
        ]
    )
    b_ = None
    if torque is not None:  # held over each sample interval, as the problem applies it
        held = np.concatenate([np.zeros((1, 3)), np.cumsum(np.asarray(torque, float)[:-1] * np.diff(t)[:, None], 0)])
        b_ = np.ravel((held[b] - held[a]).T)
    if b_ is None:  # ratios: I1 = 1
        I23, *_ = np.linalg.lstsq(A[:, 1:], -A[:, 0], rcond=None)
        moments = np.concatenate([[1.0], I23])
    else:
        moments, *_ = np.linalg.lstsq(A, b_, rcond=None)
    m = np.sort(moments)
    if np.all(np.isfinite(moments)) and m[0] > 0 and m[0] + m[1] > m[2]:
        return moments
    scale = 1.0 if b_ is None else float(np.median(np.abs(b_)) / max(np.median(np.abs(dw)), 1e-9))
    return scale * np.array([1.0, 1.5, 2.0])


def _check_units(t, omega, source) -> float:
    """The median sample interval (s) of ``t``; raises :class:`FitError` where the timestamps
    look like ms (a median interval above :data:`MAX_SAMPLE_INTERVAL`) or the rates like deg/s
    (above :data:`MAX_RATE`)."""
    dt_med = float(np.median(np.diff(t))) if len(t) > 1 else 0.0
    if dt_med > MAX_SAMPLE_INTERVAL:
        raise FitError(
            f"{source}: the median sample interval is {dt_med:.4g} s: timestamps in ms? (t must be in seconds)"
        )
    if omega is not None and float(np.max(np.abs(omega))) > MAX_RATE:
        raise FitError(
            f"{source}: angular rates up to {float(np.max(np.abs(omega))):.4g}: above {MAX_RATE} rad/s, most likely "
            "deg/s (wx,wy,wz must be in rad/s)"
        )
    return dt_med


def _inside(transform, start, fallback):
    """``start`` where ``transform`` takes it (inside its box), else ``fallback``."""
    try:
        transform.inverse(start)
    except ValueError:
        return fallback
    return start


def free_body_problem(
    motion: Motion,
    *,
    bias: bool = False,
    gain: bool = False,
    misalignment: bool = False,
    max_delay: float | None = None,
    substeps: int | None = None,
) -> Problem:
    """The identification problem of a rigid body's recording (see module).

    Args:
        motion: the recording (:func:`rigidjax.io.load_motion_csv`).
        bias, gain, misalignment, max_delay: the gyroscope's sensor model
            (:class:`rigidjax.identify.observations.AngularVelocity`; used where the recording
            has a gyroscope); off by default, as in ``rigidjax fit`` and
            :func:`~rigidjax.identify.fit_inertia`.
        substeps: steps per sample interval; ``None``: from the fastest rotation (see module).

    Returns:
        A :class:`rigidjax.identify.Problem`: parameters ``moments`` (kg m^2, with torques
        held over each sample interval, as sampled; torque columns that are all zero warn and
        count as none;
        :class:`~rigidjax.identify.transforms.PrincipalMoments`) or ``ratios`` (``Ix/Iy,
        Iz/Iy``, as :func:`rigidjax.identify.fit_inertia`'s;
        :class:`~rigidjax.identify.transforms.MomentRatios`), and ``gravity`` where the
        position is measured.
    """
    t = np.asarray(motion.t, float)
    dt_med = _check_units(t, motion.omega, motion.source)
    has_q = motion.orientation is not None
    omega = (
        motion.omega
        if motion.omega is not None
        else (rates_from_orientation(t, motion.orientation, smooth=True) if has_q else None)
    )
    if omega is None:
        omega = np.zeros((len(t), 3))
    torque = motion.torque
    if torque is not None and not np.any(torque):
        warn_at_caller(
            f"{motion.source}: the torque columns are all zero: torque-free motion fixes only the ratios "
            "Ix/Iy, Iz/Iy (fitted instead of absolute moments)"
        )
        torque = None
    moments0 = _moments_start(t, omega, torque)
    params = {}
    # the physically valid set as a box (second moments >= 0): a plate-like body's optimum
    # may lie on its face, which the bounded optimiser reaches exactly
    if torque is not None:
        params["moments"] = Parameter(
            lambda m: m.inertia, PrincipalMoments(), into=PrincipalMoments.inertia, start=moments0
        )
    else:
        ratios0 = _inside(MomentRatios(), moments0[[0, 2]] / moments0[1], np.array([1.0, 2.0]) / 1.5)
        params["ratios"] = Parameter(lambda m: m.inertia, MomentRatios(), into=MomentRatios.inertia, start=ratios0)
    observations, fields = [], ["angular_velocity"]
    gravity0 = np.zeros(3)
    if motion.omega is not None:
        observations.append(
            obs.AngularVelocity(
                bias=bias, gain=gain, misalignment=misalignment, max_delay=max_delay, sigma=noise_level(motion.omega)
            )
        )
    if has_q:
        observations.append(obs.Orientation(sigma=2 * noise_level(motion.orientation)))
        fields.insert(0, "orientation")
    if motion.position is not None:
        observations.append(obs.Position(sigma=noise_level(motion.position)))
        fields = ["position", "velocity", *fields]
        dt = np.diff(t)
        gravity0 = np.median(np.diff(motion.position, 2, axis=0) / (dt[1:, None] * dt[:-1, None]), axis=0)
        params["gravity"] = Parameter(lambda m: m.gravity, Real(), start=gravity0)
    data = {}
    if motion.omega is not None:
        data["omega"] = motion.omega
    if has_q:
        data["q"] = motion.orientation
    if motion.position is not None:
        data["x"] = motion.position
    q0 = motion.orientation[0] * np.sign(motion.orientation[0, 0] or 1.0) if has_q else np.array([1.0, 0, 0, 0])
    x0 = motion.position[0] if motion.position is not None else np.zeros(3)
    v0 = (motion.position[1] - motion.position[0]) / (t[1] - t[0]) if motion.position is not None else np.zeros(3)
    state0 = RigidBodyState(position=x0, orientation=q0, velocity=v0, angular_velocity=omega[0])
    inputs = None
    if torque is not None:
        inputs = np.concatenate([np.zeros((len(t) - 1, 3)), torque[:-1]], -1)
    if substeps is None:
        dt_max = float(np.max(np.diff(t)))
        substeps = max(1, math.ceil(float(np.max(np.linalg.norm(omega, axis=1)) * dt_max / 0.05)))
        if dt_max > GAP_RATIO * dt_med and substeps > 1:
            warn_at_caller(
                f"{motion.source}: a gap in the timestamps ({dt_max:.4g} s, {dt_max / dt_med:.0f}x the median "
                f"interval) sets {substeps} sub-steps for every interval; cut the recording at the gap, or give "
                "substeps (rigidjax fit --substeps)"
            )
    segment = MeasuredSegment(t=t, data=data, state0=state0, inputs=inputs, name=motion.source)
    model = RigidBody(
        1.0, jnp.diag(jnp.asarray(moments0 / moments0[1] if torque is None else moments0)), gravity=gravity0
    )
    return Problem(
        model=model,
        stepper=Midpoint(attitude="midpoint"),
        parameters=params,
        observations=observations,
        segments=[segment],
        initial=FreeBodyInitial(tuple(fields)),
        substeps=int(substeps),
    )


# ----------------------------------------------------------------------------- gyroscope windows


def _inertia(m):
    return m.inertia


def _resistance(m):
    return m.resistance


def isotropic_drag(c):
    """The resistance ``(6, 6)`` of an angular drag ``c I_3`` (N m s, over ``I_yy`` in a ratio
    fit), no translational drag: the ``into`` of a drag :class:`Parameter` (JAX)."""
    c = jnp.asarray(c)
    return jnp.zeros((6, 6), c.dtype).at[3:, 3:].set(c * jnp.eye(3, dtype=c.dtype))


def diagonal_drag(d):
    """The resistance ``(6, 6)`` of an angular drag ``diag(d)`` (sensor axes), as
    :func:`isotropic_drag`."""
    d = jnp.asarray(d)
    return jnp.zeros((6, 6), d.dtype).at[3:, 3:].set(jnp.diag(d))


#: One stepper and one initial-state object for every window problem: problems of one
#: structure share one compiled program. No rotation limit per step: the sub-steps are chosen
#: from the rates (fit_inertia's rule).
_WINDOW = {}


def _window_parts():
    if not _WINDOW:
        _WINDOW.update(stepper=Midpoint(max_rotation=float("inf")), initial=FreeBodyInitial(("angular_velocity",)))
    return _WINDOW["stepper"], _WINDOW["initial"]


def window_groups(segments) -> list[str]:
    """The recording of each window (its ``Segment.source``, relative to the folder all
    sources share), as :func:`~rigidjax.identify.fit_inertia` names them: the ``groups`` of
    :func:`~rigidjax.identify.fit_many` and :func:`~rigidjax.identify.combine`."""
    return _recording_labels(_as_segments(segments))


def window_problems(segments, *, tensor: bool = False, drag: str | None = None, bias: bool = False, substeps="auto"):
    """:func:`~rigidjax.identify.fit_inertia`'s per-window model as one
    :class:`~rigidjax.identify.Problem` per free-flight window, all of one structure (one
    compiled program for :func:`~rigidjax.identify.fit_many`).

    Each problem: the ratios over ``I_yy`` (:class:`~rigidjax.identify.transforms.MomentRatios`,
    or the full tensor with ``tensor``: :class:`~rigidjax.identify.transforms.TensorRatios`),
    an angular drag over ``I_yy`` (``drag``: ``"isotropic"``, :func:`isotropic_drag`, or
    ``"diagonal"``, :func:`diagonal_drag`, each ``>= 0`` in a
    :class:`~rigidjax.identify.transforms.Box`), the window's initial rate, the gyroscope
    (``bias``: a constant bias per window) with the window's noise level as sigma
    (:func:`noise_level`); started from fit_inertia's equation-error estimate projected onto
    the valid box; its sub-steps per sample interval fit_inertia's (``"auto"``: from the
    rates, 0.2 rad per sub-step) or ``substeps``. Times start at 0 in every window.

    Args:
        segments: as :func:`~rigidjax.identify.fit_inertia`'s (``Segment`` s, one, a path, or
            ``(t, omega)``).
        tensor, drag, bias: the model, as fit_inertia's options.
        substeps: ``"auto"`` or a count for every window.

    Returns:
        ``list[Problem]``, the windows' order; names the windows' (``Segment.name``).

    Raises:
        FitError: no windows, a ``drag`` not in ``(None, "isotropic", "diagonal")``, a
            window whose rates exceed :data:`MAX_RATE` (deg/s?) or whose median sample
            interval exceeds :data:`MAX_SAMPLE_INTERVAL` (ms?).
    """
    segs = _as_segments(segments)
    if drag not in DRAG_KINDS:
        raise FitError(f"window_problems: drag must be one of {DRAG_KINDS}; got {drag!r}")
    for s in segs:
        _check_units(s.t, s.omega, s.name or s.source)
    spec = Spec(bool(tensor), drag, bool(bias))
    return _window_problems(segs, spec, _initial_substeps(segs, None if substeps == "auto" else substeps))


def _window_starts(s, spec: Spec, theta=None) -> dict:
    """``{parameter name: start value}`` of the window problem of ``s``, from the model values
    ``theta`` (``I_yy``-gauge, :mod:`rigidjax.identify._model`; default: the window's
    equation-error estimate) projected onto the valid set."""
    theta = equation_error_guess([s], spec) if theta is None else theta
    xs, R = theta_chart(np.ones(spec.n_theta) if theta is None else theta, spec)
    # a rod-like guess starts just inside the search, where the fit judges it: a moment
    # ratio beyond V_MAX 0.1 % inside that edge (the tensor's ratios, re-normalised in its
    # principal frame, stay inside), a vanishing moment (v = 0 with u at 0 or 1: a rod
    # along x or z) at 1e-3 of I_yy; on or beyond those edges the start is refused or
    # cannot be simulated
    # a guess on a face of the valid set (a thin plate, u = 0 or 1) starts 1e-4 inside it: the
    # fit reaches the face exactly (a bound of the box), but a start on it is refused as
    # unphysical by a float32 round-off (QA)
    u, v = min(max(xs[0, 0], 1e-4), 1 - 1e-4), min(max(xs[0, 1], 1e-3), 0.999 * V_MAX)
    moments = np.array([v + 1 - u, 1.0, u + v])
    inertia = R[0] @ np.diag(moments) @ R[0].T  # I_2 = 1
    if spec.tensor:
        out = {
            "ratios": np.array([inertia[0, 0], inertia[2, 2], inertia[0, 1], inertia[0, 2], inertia[1, 2]])
            / inertia[1, 1]
        }
    else:
        out = {"ratios": moments[[0, 2]]}
    if spec.drag is not None:
        c = xs[0, 2 + 3 * spec.tensor :] / inertia[1, 1]  # drag over I_2 -> over I_yy
        out["drag"] = c[0] if spec.drag == "isotropic" else c
    return out


def _window_parameters(spec: Spec, start: dict) -> dict:
    """The window model's parameters (:func:`window_problems`) started from ``start``
    (:func:`_window_starts`)."""
    params = {}
    if spec.tensor:
        params["ratios"] = Parameter(_inertia, TensorRatios(), into=TensorRatios.inertia, start=start["ratios"])
    else:
        params["ratios"] = Parameter(_inertia, MomentRatios(), into=MomentRatios.inertia, start=start["ratios"])
    if spec.drag is not None:
        into = isotropic_drag if spec.drag == "isotropic" else diagonal_drag
        params["drag"] = Parameter(_resistance, Box(0.0, np.inf), into=into, start=start["drag"])
    return params


def _window_segment(s, omega0=None) -> MeasuredSegment:
    """Window ``s`` as a segment from ``t = 0``, its initial rate ``omega0`` (default: the first sample)
    in a copy of one built state (NumPy; other leaves shared, read-only; built per window: 1.7 ms)."""
    w0 = np.asarray(s.omega[0] if omega0 is None else omega0)
    w0 = w0.astype(w0.dtype if np.issubdtype(w0.dtype, np.floating) else float)
    state0 = eqx.tree_at(lambda st: st.angular_velocity, _identity_state(w0.dtype.str), w0)
    return MeasuredSegment(t=s.t - s.t[0], data={"omega": s.omega}, state0=state0, name=s.name or s.source)


@functools.lru_cache(maxsize=4)
def _identity_state(dtype: str) -> RigidBodyState:
    """A body at rest at the origin in the identity attitude (NumPy leaves, shared: read-only)."""
    state = RigidBodyState(orientation=np.array([1.0, 0, 0, 0], dtype), angular_velocity=np.zeros(3, dtype))
    return jax.tree_util.tree_map(lambda a: np.lib.stride_tricks.as_strided(np.array(a), writeable=False), state)


def _window_problems(segs, spec: Spec, ks) -> list:
    """:func:`window_problems` of checked windows ``segs`` (fit_inertia checks its own
    bounds) with the model ``spec`` and the sub-steps ``ks`` (one per window)."""
    stepper, initial = _window_parts()
    model = RigidBody(1.0, jnp.eye(3))  # one (immutable) model for all: ~0.6 ms each
    return [
        Problem(
            model=model,
            stepper=stepper,
            parameters=_window_parameters(spec, _window_starts(s, spec)),
            observations=[obs.AngularVelocity(bias=bool(spec.bias), sigma=noise_level(s.omega))],
            segments=[_window_segment(s)],
            initial=initial,
            substeps=int(k),
        )
        for s, k in zip(segs, ks)
    ]


def _shared_problem(segs, spec: Spec, ks, groups, theta, omega0) -> Problem:
    """fit_inertia's joint model as one problem: the windows ``segs`` (a segment each, its
    initial rate unknown, started from ``omega0 (S, 3)``, sub-steps ``ks``) share the inertia
    and drag of ``spec`` (started from the model values ``theta``, ``I_yy`` gauge); with
    ``spec.bias`` one gyroscope per bias group (``groups (S,)``: 0, 1, ...; the recordings),
    each reading its windows, else one for all. Residuals in rad/s (``sigma = 1``): the fit
    estimates the noise from them, as the per-window rows do."""
    stepper, initial = _window_parts()
    groups = np.asarray(groups, int)
    if spec.bias:
        gyros = [
            obs.AngularVelocity(bias=True, sigma=1.0, segments=tuple(int(j) for j in np.flatnonzero(groups == g)))
            for g in range(int(groups.max()) + 1)
        ]
    else:
        gyros = [obs.AngularVelocity(bias=False, sigma=1.0)]
    return Problem(
        model=RigidBody(1.0, jnp.eye(3)),
        stepper=stepper,
        parameters=_window_parameters(spec, _window_starts(segs[0], spec, theta)),
        observations=gyros,
        segments=[_window_segment(s, w) for s, w in zip(segs, omega0)],
        initial=initial,
        substeps=tuple(int(k) for k in ks),
    )


def reference_check(problems, fits, *, tolerance: float = REF_TOL):
    """fit_inertia's re-simulation check for :func:`window_problems`' fits: each fitted window
    (its inertia, drag, initial rate and gyroscope bias) is integrated again by SciPy's DOP853
    at rtol 1e-10 (:func:`rigidjax.reference.euler_omega`: all windows in one call, each alone
    where that fails), an integrator independent of the midpoint step. A ``converged`` fit
    whose residual RMS
    under DOP853 differs from its own by more than ``tolerance`` (relative) becomes
    :attr:`~rigidjax.identify.FitStatus.STEP_ERROR`: the midpoint step's error, not the
    data, shapes that optimum. Complements the layer's Richardson check (the same stepper
    at twice the steps) with a second integrator.

    Args:
        problems: from :func:`window_problems` (possibly with other ``substeps``; the same
            objects or copies by ``dataclasses.replace``, whose initial-state object is the
            recipe's).
        fits: their :class:`~rigidjax.identify.ProblemFit` s (e.g. from
            :func:`~rigidjax.identify.fit_many`), in the same order.
        tolerance: the largest accepted relative change of the residual RMS
            (:data:`~rigidjax.identify._windows.REF_TOL`, 10 %, as fit_inertia).

    Returns:
        ``(fits, rms_reference)``: the fits, a converged one that fails the check replaced by
        a copy with status ``step_error`` and a message naming both residuals; and each
        window's residual RMS under DOP853 (rad/s; ``nan`` where the integration failed or
        the fit gave no finite values).

    Raises:
        ValueError: a problem not made by :func:`window_problems` (or with a gyroscope gain,
            misalignment or delay), ``fits`` of another length, a ``tolerance`` that is not
            a positive number.
    """
    problems, fits = list(problems), list(fits)
    initial = _window_parts()[1]
    if len(fits) != len(problems):
        raise ValueError(f"reference_check: {len(problems)} problems but {len(fits)} fits")
    if not (isinstance(tolerance, (int, float)) and 0 < tolerance < math.inf):
        raise ValueError(f"reference_check: tolerance must be a positive number; got {tolerance!r}")
    for i, p in enumerate(problems):
        if p.initial is not initial or len(p.segments) != 1 or len(p.observations) != 1:
            raise ValueError(f"reference_check: problem {i} was not made by window_problems (one torque-free window)")
        o = p.observations[0]
        if not isinstance(o, obs.AngularVelocity) or o.gain or o.misalignment or o.max_delay is not None:
            raise ValueError(
                f"reference_check: problem {i}'s gyroscope model has more than a bias (gain, misalignment or delay), "
                "which the DOP853 re-simulation does not apply"
            )
    ok = [
        i
        for i, f in enumerate(fits)
        if np.all(np.isfinite(np.asarray(f.initial, float))) and np.all(np.isfinite(np.asarray(f.model.inertia)))
    ]
    ref = np.full(len(fits), np.nan)
    if ok:
        models = [fits[i].model for i in ok]
        ws = reference_rates(
            np.stack([np.asarray(m.inertia, float) for m in models]),
            np.stack([np.asarray(fits[i].initial[0], float) for i in ok]),
            [np.asarray(problems[i].segments[0].t, float) for i in ok],
            np.stack([np.asarray(m.resistance, float)[3:, 3:] for m in models]),
        )
        for w, i in zip(ws, ok):
            if w is not None:
                b = np.asarray(fits[i].sensor[0].get("bias", np.zeros(3)), float)
                ref[i] = float(np.sqrt(np.mean((w + b - problems[i].segments[0].data["omega"]) ** 2)))
    out = []
    for f, r in zip(fits, ref):
        rms = float(f.rms[0])
        if f.status == FitStatus.CONVERGED and not np.isfinite(r):
            f = dataclasses.replace(
                f,
                status=FitStatus.STEP_ERROR,
                message="DOP853 could not re-simulate the fitted window (a degenerate inertia?): the step error of "
                "this fit is not checked",
            )
        elif f.status == FitStatus.CONVERGED and not abs(r - rms) <= tolerance * rms:
            f = dataclasses.replace(
                f,
                status=FitStatus.STEP_ERROR,
                message=f"re-simulated by DOP853 the residual is {r:.3g} rad/s against the fit's {rms:.3g}: the step "
                f"error ({f.substeps} sub-steps) shapes this fit (raise Problem.substeps)",
            )
        out.append(f)
    return out, ref
