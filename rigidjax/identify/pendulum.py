r"""Physical-pendulum identification from gyroscope data by gradients through VI rollouts.

Model: one angle ``theta`` about the pivot axis, the midpoint variational integrator
(:mod:`rigidjax.variational`, seed 001) on :func:`rigidjax.systems.physical_pendulum` with
unit moment about the pivot,

.. math::

    L = \tfrac12 \dot\theta^2 + \omega_0^2 \cos\theta, \qquad f = -c\,\dot\theta ,

stepped (symmetric forcing split, second order) at the MEASURED sample times. The gyroscope
reads ``theta_dot + bias`` about the pivot axis.

Method: each window is a :class:`rigidjax.identify.Problem` fitted by
:func:`rigidjax.identify.fit`. Unknowns: the natural frequency ``omega0`` (rad/s, fitted as
``log omega0``), the damping rate ``c`` (1/s, either sign), the initial angle and rate (the
segment's initial state) and the gyro bias (a
:class:`~rigidjax.identify.observations.Signal` offset); residuals in rad/s at every sample
(unit weights). The layer's Levenberg-Marquardt with the exact Jacobian (forward mode through
the rollout, implicit function theorem in each step) runs from ``starts`` starts, 4 by
default: the start values from the data (the frequency from the zero crossings, the angle
from the integrated rate, the bias from 0) and random ones around them (:data:`SPREAD` in ``log omega0`` and
``c``); the best is reported. Standard errors: the Gauss-Newton covariance ``s^2
(J^T J)^-1`` (the layer's ``se_classical``). The layer's ``max_steps``, ``stalled``,
``nonfinite`` and ``unidentifiable`` carry over; at an optimum the checks below decide.
Windows padded to one length (``pad_to``) share one compiled program.

Frequency: the midpoint step turns an oscillator of frequency ``w`` by ``2 atan(w dt / 2)``
per step: the reported ``omega0`` is the frequency the fitted discrete motion has, ``sum 2
atan(w dt_k / 2) / sum dt_k`` (exact for small amplitude), which removes the step's
``(omega0 dt)^2 / 12`` relative bias (1.6e-4 at 100 Hz, several statistical errors on the racquet's swings). Derived:
the period at the fitted amplitude (complete elliptic integral) and at small amplitude
``2 pi / omega0``; with the mass ``m`` and the pivot-to-centre-of-mass distance ``d``, the
moment about the pivot ``I_p = m g d / omega0^2``, about the centre of mass
``I_cm = I_p - m d^2`` and the damping coefficient ``b = c I_p`` (N m s).

Checks (each window gets a :class:`rigidjax.identify.FitStatus`):

* the swing axis: the gyroscope column holding most of the rate variance
  (:func:`swing_axis`); a column that does not swing (under :data:`SWING_SHARE` of the
  variance, or fewer than 3 zero crossings: free flight, a tumble) is refused with a message
  naming the one that does;
* free swing from the start: a window that begins while the body is still held or pushed
  leaves a residual over its first period far above the rest (more than
  :data:`NOT_FREE_RATIO` times, and above 5x the noise), or a fit that gains energy
  (damping rate below zero by 2 standard errors): :attr:`~FitStatus.NOT_FREE`;
* a residual above 10 % of the swing's rate RMS: :attr:`~FitStatus.POOR_FIT`.

Data: ``../shared/data/racquet-flips/pendulum/x-axis`` (a tennis racquet + phone swinging
about a dowel through the butt, about the phone x axis; mass 0.45728 kg, pivot-to-centre-of-mass
correction ``m r^2 = 78.0 g m^2``; the study reports the period 1.436 +- 0.039 s and
``I_p = 96.8 +- 5.4 g m^2``).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from ..rollout import rollout
from ..systems import physical_pendulum
from ..variational import MidpointVI, vi_state
from . import _combine
from . import observations as obs
from ._model import noise_and_signal
from ._result import FitStatus
from ._problem_fit import fit
from .problem import InitialState, MeasuredSegment, Parameter, Problem
from .transforms import Positive, Real

__all__ = [
    "PendulumFit",
    "fit_pendulum",
    "fit_pendulum_segments",
    "combine_pendulum",
    "swing_axis",
    "looks_like_pendulum",
    "RACQUET_MASS",
    "RACQUET_PIVOT_DISTANCE",
]

#: kg, racquet 0.285 + phone 0.17228 (data README)
RACQUET_MASS = 0.45728
#: m, pivot to centre of mass: m r^2 = 78.0 g m^2 (data README)
RACQUET_PIVOT_DISTANCE = math.sqrt(0.078 / RACQUET_MASS)
#: Residual over the first period above this many times the rest's: not in free swing at the start.
NOT_FREE_RATIO = 3.0
#: A swing about a fixed axis: that gyroscope axis holds at least this share of the rate
#: variance (the racquet's swings: 99 %; its free flips: 50-80 %).
SWING_SHARE = 0.8
_AXES = "xyz"


@dataclasses.dataclass(frozen=True)
class PendulumFit:
    """Result of :func:`fit_pendulum` (SI units; ``*_se``: 1-sigma Gauss-Newton errors).

    Attributes:
        name: the window's name. axis: the gyroscope column fitted (0, 1, 2 = x, y, z).
        status: :class:`rigidjax.identify.FitStatus`; reason: why, in words ("" if converged).
        omega0: small-amplitude natural frequency, rad/s.
        damping_rate: ``c`` in ``theta_ddot = -omega0^2 sin(theta) - c theta_dot``, 1/s.
        theta0: angle at the first sample, rad; rate0: ``theta_dot`` there, rad/s.
        bias: gyro bias, rad/s.
        amplitude: mean swing amplitude over the window, rad (from the fitted trajectory).
        period_small: ``2 pi / omega0``, s.
        period: period at ``amplitude``, ``4 K(sin^2(amplitude/2)) / omega0``, s (what a stopwatch measures).
        inertia_pivot: ``I_p = m g d / omega0^2``, kg m^2 (``nan`` without mass and distance).
        inertia_cm: ``I_p - m d^2``, kg m^2, about the parallel axis through the centre of mass.
        damping: ``b = c I_p``, N m s (torque ``-b theta_dot``).
        rms: RMS residual, rad/s; noise: the gyroscope noise estimate, rad/s; n: samples.
        model_omega: fitted gyro signal at the sample times ``(n,)``, rad/s.
    """

    name: str
    axis: int
    status: FitStatus
    reason: str
    omega0: float
    omega0_se: float
    damping_rate: float
    damping_rate_se: float
    theta0: float
    rate0: float
    bias: float
    amplitude: float
    period_small: float
    period: float
    period_se: float
    inertia_pivot: float
    inertia_pivot_se: float
    inertia_cm: float
    inertia_cm_se: float
    damping: float
    rms: float
    noise: float
    n: int
    model_omega: np.ndarray

    @property
    def converged(self) -> bool:
        return self.status == FitStatus.CONVERGED


def swing_axis(omega) -> tuple[int, np.ndarray, np.ndarray]:
    """``(axis, variance fraction (3,), zero crossings (3,))`` of body rates ``(n, 3)``: the
    column holding most of the rate variance about the mean, and each column's share and
    sign changes about its median, counted with hysteresis: only between samples beyond
    :data:`CROSS_LEVEL` of the column's largest deviation (sensor noise about a rest is not
    a swing)."""
    w = np.asarray(omega, float)
    x = w - np.median(w, axis=0)
    var = np.mean((w - w.mean(0)) ** 2, axis=0)
    frac = var / max(var.sum(), 1e-300)
    cross = np.zeros(w.shape[1], int)
    for c in range(w.shape[1]):
        big = x[np.abs(x[:, c]) > CROSS_LEVEL * np.max(np.abs(x[:, c])), c]
        cross[c] = int(np.sum(np.signbit(big[1:]) != np.signbit(big[:-1])))
    return int(np.argmax(var)), frac, cross


#: Sign changes of a rate count as swings only between samples beyond this fraction of its
#: largest deviation from the median (:func:`swing_axis`): a swing whose amplitude stays above
#: 20 % of its largest for two periods has 4 of them; noise about a rest (~1 % of a flip's rate)
#: has none.
CROSS_LEVEL = 0.2


def looks_like_pendulum(omega) -> int | None:
    """The swing axis if body rates ``(n, 3)`` look like a pendulum's (one axis holds at least
    95 % of the rate variance and its rate changes sign at least 4 times: an oscillation about
    a fixed axis, not a free flight), else ``None``."""
    axis, frac, cross = swing_axis(omega)
    return axis if frac[axis] >= 0.95 and cross[axis] >= 4 else None


#: The step: the midpoint variational integrator with the symmetric forcing split (second order
#: with damping; trep's left split biases omega0 by ~c dt/4).
_STEPPER = MidpointVI(forcing_split="symmetric")
#: The layer's random starts perturb log(omega0) and the damping rate (1/s) by this much (sd).
SPREAD = 0.1


def _system(omega0, damping):
    """The pendulum of unit moment about the pivot: ``L = theta_dot^2 / 2 + omega0^2 cos(theta)``."""
    one = jnp.ones_like(jnp.asarray(omega0))
    return physical_pendulum(one, omega0**2, one, gravity=one, damping=damping)


# the problem's parts, module-level so that every window's problem has the same structure
# (one compiled program, see rigidjax.identify.problem)
def _moment(system):
    return system.lagrangian.moment


def _square(omega0):
    return omega0**2


def _damping(system):
    return system.forcing.damping


def _build_initial(system, z, state0):
    # p = theta_dot at unit moment
    return vi_state(system, z[:1], z[1:2], check=False)


def _guess_initial(state0):
    return np.asarray(state0, float)


def _signals(system, states):
    return {"rate": states.p}


_INITIAL = InitialState(2, _build_initial, _guess_initial)
#: the gyroscope about the pivot axis: ``theta_dot + bias``, residuals in rad/s (unit weights)
_GYRO = obs.Signal("omega", "rate", offset=True, sigma=1.0)


def _problem(t, w, p0) -> Problem:
    """The layer's problem of one window (``t`` from 0) with the start ``p0`` of :func:`_initial_guess`."""
    log_w0, c, th0, rate0, _ = p0
    segment = MeasuredSegment(t=t, data={"omega": w[:, None]}, state0=np.array([th0, rate0]))
    return Problem(
        model=_system(jnp.asarray(1.0), jnp.asarray(0.0)),
        stepper=_STEPPER,
        parameters={
            "omega0": Parameter(_moment, Positive(), into=_square, start=np.array(math.exp(log_w0))),
            "damping_rate": Parameter(_damping, Real(), start=np.array(c)),
        },
        observations=[_GYRO],
        segments=[segment],
        initial=_INITIAL,
        signals=_signals,
    )


@jax.jit
def _trajectory(omega0, damping, theta0, rate0, t):
    """Angle and rate ``(n,)`` of the fitted pendulum at the times ``t``."""
    system = _system(omega0, damping)
    traj = rollout(_STEPPER, system, vi_state(system, theta0[None], rate0[None], check=False), jnp.diff(t))
    return traj.states.q[:, 0], traj.states.p[:, 0]


def _initial_guess(t, w):
    """Bias, frequency (from zero crossings), angle by integrating the rate, rate at t0."""
    bias = float(np.mean(w))
    x = w - bias
    s = np.signbit(x)
    idx = np.nonzero(s[1:] != s[:-1])[0]
    tc = t[idx] + (t[idx + 1] - t[idx]) * x[idx] / (x[idx] - x[idx + 1])
    if len(tc) < 3:
        raise ValueError("fit_pendulum: fewer than 3 zero crossings of the rate: not a swinging pendulum window")
    half = float(np.median(np.diff(tc)))
    omega0 = math.pi / half
    theta = np.concatenate([[0.0], np.cumsum(0.5 * (x[1:] + x[:-1]) * np.diff(t))])
    theta0 = -float(np.mean(theta))
    return np.array([math.log(omega0), 0.0, theta0, float(x[0]), bias])


def _column(omega, axis, name):
    w = np.asarray(omega, float)
    if w.ndim == 1:
        return w, 0 if axis is None else int(axis)
    if w.ndim != 2 or w.shape[1] != 3:
        raise ValueError(f"fit_pendulum: omega must be (n,) or (n, 3); got {w.shape}")
    best, frac, cross = swing_axis(w)
    where = f"{name}: " if name else ""
    if axis is None:
        if frac[best] < SWING_SHARE or cross[best] < 3:
            raise ValueError(
                f"fit_pendulum: {where}no gyroscope axis swings (axis {_AXES[best]}, with the most rate variance, "
                f"holds {100 * frac[best]:.1f} % of it and crosses zero {int(cross[best])} times; "
                f"a swing about a fixed axis needs at least {100 * SWING_SHARE:.0f} % and 3 crossings): "
                "not a pendulum window (free flight? `rigidjax fit`)"
            )
        axis = best
    if axis not in (0, 1, 2):
        raise ValueError(f"fit_pendulum: axis must be 0, 1 or 2 (x, y, z); got {axis!r}")
    if frac[axis] < SWING_SHARE or cross[axis] < 3:
        other = (
            f"; the swing is about axis {_AXES[best]} ({100 * frac[best]:.1f} %, {int(cross[best])} crossings): pass "
            f"axis={best} (--axis {_AXES[best]}) or leave the axis to be detected"
            if best != axis and frac[best] >= SWING_SHARE and cross[best] >= 3
            else "; no axis swings: not a pendulum window (free flight? `rigidjax fit`)"
        )
        raise ValueError(
            f"fit_pendulum: {where}gyroscope axis {_AXES[axis]} does not swing (it holds {100 * frac[axis]:.1f} % of "
            f"the rate variance and crosses zero {int(cross[axis])} times){other}"
        )
    return w[:, axis], axis


def fit_pendulum(
    t,
    omega,
    *,
    axis: int | None = None,
    mass: float | None = None,
    distance: float | None = None,
    gravity: float = 9.81,
    max_steps: int = 100,
    pad_to: int | None = None,
    name: str = "",
    starts: int = 4,
) -> PendulumFit:
    r"""Identify ``omega0``, damping, initial state and gyro bias of a swinging physical pendulum.

    Args:
        t: sample times (n,), s, strictly increasing (non-uniform allowed: the VI steps at them).
        omega: gyro rates (n,) about the pivot axis, or (n, 3) body rates, rad/s.
        axis: column of an (n, 3) ``omega`` that is the pivot axis; ``None`` (default): the
            column that swings (:func:`swing_axis`). A column that does not swing raises.
        mass: kg, and distance: pivot to centre of mass, m; both needed for the moments
            (``inertia_pivot``, ``inertia_cm``, ``damping``; ``nan`` otherwise).
        gravity: m/s^2.
        max_steps: Levenberg-Marquardt iteration cap (per start).
        pad_to: pad the window to this many samples (zero-weight samples, so the fit is
            unchanged) so that windows of different lengths share one compilation.
        name: label carried into the result.
        starts: starts of the optimiser: the data's start values and ``starts - 1`` random
            ones around them (:data:`SPREAD`); the best is reported.

    Returns:
        :class:`PendulumFit`.

    Raises:
        ValueError: shapes, NaN, non-increasing ``t``, fewer than 10 samples, a column that
            does not swing, fewer than 3 zero crossings.
    """
    t = np.asarray(t, float)
    w, axis = _column(omega, axis, name)
    if t.ndim != 1 or w.shape != t.shape:
        raise ValueError(f"fit_pendulum: t must be (n,) and omega (n,) or (n, 3); got {t.shape} and {np.shape(omega)}")
    if t.size < 10:
        raise ValueError(f"fit_pendulum: need >= 10 samples; got {t.size}")
    for label, a in (("t", t), ("omega", w)):
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            raise ValueError(f"fit_pendulum: {label} has {bad.size} NaN or inf values, the first at sample {bad[0]}")
    if np.any(np.diff(t) <= 0):
        raise ValueError("fit_pendulum: t must be strictly increasing")
    for label, v in (("mass", mass), ("distance", distance), ("gravity", gravity)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"fit_pendulum: {label} must be a positive number; got {v!r}")
    if not isinstance(starts, (int, np.integer)) or starts < 1:
        raise ValueError(f"fit_pendulum: starts must be an integer >= 1; got {starts!r}")
    p0 = _initial_guess(t, w)
    n = t.size
    n_pad = max(n, int(pad_to or n))
    # the rollout starts at t[0]; time relative to it keeps float round-off small
    tr = t - t[0]
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    # one step per sample: the reported omega0 removes the midpoint rule's frequency error
    # analytically (below), so the layer's step-error refinement is not used
    f = fit(
        _problem(tr, w, p0),
        starts=starts,
        spread=SPREAD,
        max_steps=max_steps,
        dtype=dtype,
        pad_to=n_pad,
        step_check="off",
    )
    w_fit, c = float(f.values["omega0"]), float(f.values["damping_rate"])
    th0, rate0 = (float(v) for v in f.initial[0])
    bias = float(f.sensor[0]["offset"][0])
    # Gauss-Newton standard errors (the layer's classical s^2 (J^T J)^-1): of log(omega0),
    # i.e. relative, and of the damping rate
    se_log, se_c = float(f.se_classical["omega0"]) / w_fit, float(f.se_classical["damping_rate"])
    # the trajectory at the samples (padded like the fit's, so one compilation serves all windows)
    step = float(np.median(np.diff(t)))
    tp = np.concatenate([tr, tr[-1] + step * np.arange(1, n_pad - n + 1)])
    theta, rate = (
        np.asarray(a, float)[:n] for a in _trajectory(*(jnp.asarray(v, dtype) for v in (w_fit, c, th0, rate0, tp)))
    )
    model = rate + bias
    # the midpoint rule turns an oscillator of frequency w by 2 atan(w dt / 2) per step, not
    # w dt: the fitted frequency is the discrete model's; the physical one oscillates as it does
    # (exact for small amplitude; removes the (w dt)^2 / 12 relative bias, 1.6e-4 at 100 Hz)
    d = np.diff(t)
    omega0 = float(np.sum(2 * np.arctan(0.5 * w_fit * d)) / np.sum(d))
    # energy amplitude: 1 - cos(A) = (1 - cos(theta)) + rate^2 / (2 omega0^2), averaged over the window
    cosA = np.cos(theta) - rate**2 / (2 * w_fit**2)
    amplitude = float(np.mean(np.arccos(np.clip(cosA, -1, 1))))
    period_small = 2 * math.pi / omega0
    period = float(4 * special.ellipk(math.sin(amplitude / 2) ** 2) / omega0)
    res = model - w
    rss = float(res @ res)
    omega0_se = omega0 * se_log  # d omega0 = omega0 d log omega0
    period_se = period * se_log  # the period scales as 1/omega0 (the amplitude's share is far smaller)
    if mass is not None and distance is not None:
        I_p = mass * gravity * distance / omega0**2
        I_p_se = 2 * I_p * se_log
        I_cm = I_p - mass * distance**2
        damping = c * I_p
    else:
        I_p = I_p_se = I_cm = damping = float("nan")
    noise, _ = noise_and_signal(w)
    swing_rms = float(np.sqrt(np.mean((w - w.mean()) ** 2)))
    rms = float(np.sqrt(rss / n))
    # the layer's status; a reached optimum (converged, or its residual-versus-sigma poor fit,
    # which unit weights make moot) goes on to the pendulum's own checks
    status, reason = f.status, f.message
    if status == FitStatus.MAX_STEPS:
        reason = f"Levenberg-Marquardt did not converge within {max_steps} steps: {f.message}"
    elif status in (FitStatus.CONVERGED, FitStatus.POOR_FIT):
        status, reason = FitStatus.CONVERGED, ""
    period_len = int(np.searchsorted(t, t[0] + period))
    first, rest = res[:period_len], res[period_len:]
    rms_first = float(np.sqrt(np.mean(first**2))) if first.size else 0.0
    rms_rest = float(np.sqrt(np.mean(rest**2))) if rest.size else 0.0
    if (
        status == FitStatus.CONVERGED
        and rest.size >= period_len
        and rms_first > NOT_FREE_RATIO * max(rms_rest, 1e-300)
        and rms_first > 5 * noise
    ):
        status = FitStatus.NOT_FREE
        reason = (
            f"not in free swing at its start (held or pushed?): residual {rms_first:.3g} rad/s over the first period "
            f"against {rms_rest:.3g} afterwards"
        )
    elif status == FitStatus.CONVERGED and c < -2 * se_c:
        status = FitStatus.NOT_FREE
        reason = (
            f"the swing gains energy (damping rate {c:.3g} ± {se_c:.2g} 1/s): held, pushed or driven "
            "during the window, not a free swing"
        )
    elif status == FitStatus.CONVERGED and rms > 0.1 * swing_rms:
        status = FitStatus.POOR_FIT
        reason = f"residual {rms:.3g} rad/s above 10 % of the swing's rate ({swing_rms:.3g} rad/s RMS)"
    return PendulumFit(
        name=name,
        axis=axis,
        status=status,
        reason=reason,
        omega0=omega0,
        omega0_se=float(omega0_se),
        damping_rate=c,
        damping_rate_se=se_c,
        theta0=th0,
        rate0=rate0,
        bias=bias,
        amplitude=amplitude,
        period_small=period_small,
        period=period,
        period_se=float(period_se),
        inertia_pivot=float(I_p),
        inertia_pivot_se=float(I_p_se),
        inertia_cm=float(I_cm),
        inertia_cm_se=float(I_p_se),
        damping=float(damping),
        rms=rms,
        noise=float(noise),
        n=int(n),
        model_omega=model,
    )


def fit_pendulum_segments(segments, **kwargs) -> list[PendulumFit]:
    """:func:`fit_pendulum` on each :class:`rigidjax.io.Segment` (``.t``, ``.omega``, ``.name``).

    Windows are padded to the longest one (rounded up to 50 samples) so one compilation serves
    all. A window that does not swing at all (fewer than 3 zero crossings) gets the status
    ``UNIDENTIFIABLE`` instead of raising; an explicit ``axis`` that does not swing raises.
    """
    segments = list(segments)
    if not segments:
        return []
    longest = max(len(s.t) for s in segments)
    kwargs.setdefault("pad_to", 50 * ((longest + 49) // 50))
    out = []
    for s in segments:
        name = getattr(s, "name", "")
        try:
            out.append(fit_pendulum(s.t, s.omega, name=name, **kwargs))
        except ValueError as e:
            if kwargs.get("axis") is not None or not any(
                m in str(e) for m in ("zero crossings", "does not swing", "no gyroscope axis swings")
            ):
                raise
            nan = float("nan")
            reason = str(e).replace("fit_pendulum: ", "").replace(f"{name}: ", "", 1)
            out.append(
                PendulumFit(
                    name=name,
                    axis=-1,
                    status=FitStatus.UNIDENTIFIABLE,
                    reason=reason,
                    omega0=nan,
                    omega0_se=nan,
                    damping_rate=nan,
                    damping_rate_se=nan,
                    theta0=nan,
                    rate0=nan,
                    bias=nan,
                    amplitude=nan,
                    period_small=nan,
                    period=nan,
                    period_se=nan,
                    inertia_pivot=nan,
                    inertia_pivot_se=nan,
                    inertia_cm=nan,
                    inertia_cm_se=nan,
                    damping=nan,
                    rms=nan,
                    noise=nan,
                    n=len(s.t),
                    model_omega=np.full(len(s.t), nan),
                )
            )
    return out


#: Quantities :func:`combine_pendulum` combines, with their standard-error attribute.
COMBINED = (
    ("period", "period_se"),
    ("omega0", "omega0_se"),
    ("damping_rate", "damping_rate_se"),
    ("inertia_pivot", "inertia_pivot_se"),
    ("inertia_cm", "inertia_cm_se"),
)


def combine_pendulum(fits: list[PendulumFit]) -> dict:
    """Median over the converged windows of each quantity, its statistical 1-sigma (noise
    only) and the distribution-free 95 % interval of the median (covering the scatter
    between windows, see :mod:`rigidjax.identify._combine`). ``{}`` without a converged window."""
    good = [f for f in fits if f.status == FitStatus.CONVERGED]
    out = {}
    if not good:
        return out
    for name, se_name in COMBINED:
        v = np.array([getattr(f, name) for f in good])
        if not np.all(np.isfinite(v)):
            continue
        lo, hi, cov = _combine.median_interval(v)
        out[name] = {
            "median": float(np.median(v)),
            "se_stat": _combine.median_se_stat([getattr(f, se_name) for f in good]),
            "interval": (lo, hi) if len(v) > 1 else (float("nan"), float("nan")),
            "coverage": cov,
            "n": int(v.size),
        }
    return out
