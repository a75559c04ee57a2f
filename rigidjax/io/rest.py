"""What a gyroscope reads while its body lies still: its bias, measured, not fitted.

A fitted gyroscope bias (``fit_inertia(..., bias=True)``) can absorb model error: on the
racquet's round 3 (``../shared/data/racquet-flips``), the first nine tosses of one recording
fit a bias of 0.17 and -0.22 rad/s about x and y, and the ratio ``Ix/Iy`` moves from 14.9
(no bias) to 23.7, while the same phone lying on the table between tosses reads below
0.0003 rad/s on every axis. The stretches of a recording where the body lies still measure the
bias directly (plus the Earth's rotation, 7.3e-5 rad/s at most); :func:`rest_reading` finds
them and the loaders attach the result to every window they cut from the recording
(:attr:`rigidjax.io.Segment.rest`), so that a fit can check its bias against it or use it.

The rule: the recording (its finite samples) is cut into consecutive blocks of ``block`` s; a
block is *still* when no sample interval inside it is longer than ``gap`` median steps, it
spans no pause, and on every axis the standard deviation of its readings is at most
``noise_factor`` times the gyroscope's white noise ``sigma`` (estimated from the recording's
second differences: :func:`noise_sigma`; at least a quantised gyroscope's rounding, its
smallest step over sqrt(12), and 1e-9 rad/s, so that noiseless data can be still) and its mean at most
``max_bias`` (a body turning steadily is not at rest; 0.1 rad/s = 5.7 deg/s is beyond the
zero-rate offset of consumer MEMS gyroscopes, about 1-3 deg/s). The reading is the median of the
still blocks' means; its ``sd`` the scatter of those means (robust: 1.4826 x their median
absolute deviation, from three blocks up), at least the noise of one block's mean (the still
blocks' own standard deviation over ``sqrt(samples per block)``) and a quantised gyroscope's
rounding (step / sqrt(12): a gyroscope whose noise is below one step reads a constant that
averaging does not correct): how far the bias may lie from
the reading at any moment of the recording (drift included), not the error of their mean,
which is smaller.

On the shared recordings (0.5 s blocks, defaults): the racquet rounds 2 and 3 lie still in 8-86
blocks (4-43 s) per recording and read at most 1.9e-4 rad/s on any axis (``sd`` 2.4e-4 to
5.9e-4 rad/s; the phone reports a calibrated rate); round 1, hand-held throughout, has no still
block: its calmest blocks vary by 9.4 ``sigma`` and more, where a still block may vary by 3.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["Rest", "rest_reading", "noise_sigma"]


@dataclasses.dataclass(frozen=True, eq=False)
class Rest:
    """A gyroscope's reading while its body lies still (:func:`rest_reading`).

    Attributes:
        value: ``(3,)`` rad/s, sensor (body) frame: the bias (Earth's rotation included).
        sd: ``(3,)`` rad/s: how far the bias may lie from ``value`` at any moment of the
            recording (the scatter of the still blocks' means, at least one block mean's noise:
            noise and drift).
        duration: total still time, s.
        spans: ``((start, end), ...)`` of the still blocks, s (the recording's time).
    """

    value: np.ndarray
    sd: np.ndarray
    duration: float
    spans: tuple

    def __repr__(self) -> str:
        v = ", ".join(f"{x:.2g}" for x in self.value)
        s = ", ".join(f"{x:.2g}" for x in self.sd)
        return f"Rest(value=[{v}] rad/s, sd=[{s}] rad/s, {self.duration:.3g} s still in {len(self.spans)} block(s))"

    def to_dict(self) -> dict:
        """JSON-ready: value, sd (rad/s), duration (s), blocks (count)."""
        return {
            "value": self.value.tolist(),
            "sd": self.sd.tolist(),
            "duration": float(self.duration),
            "blocks": len(self.spans),
        }


def noise_sigma(omega: np.ndarray) -> float:
    """Gyroscope white noise, rad/s per axis: the robust standard deviation of the second
    differences of ``omega`` (``(n, 3)``, rad/s, finite; white noise gives variance
    ``6 sigma^2``), over the calmest half of the recording (held still or lying down); 0.0 for
    fewer than 3 samples. Used by :func:`rest_reading` and
    :func:`rigidjax.io.detect.detect_flights`."""
    d2 = np.linalg.norm(omega[2:] - 2 * omega[1:-1] + omega[:-2], axis=1)
    if d2.size == 0:
        return 0.0
    calm = np.sort(d2)[: max(1, d2.size // 2)]
    # |3-vector of N(0, 6 s^2)| has median ~ 1.54 sqrt(6) s
    return float(np.median(calm) / (1.54 * np.sqrt(6)))


def rest_reading(
    t,
    omega,
    *,
    pauses=(),
    block: float = 0.5,
    noise_factor: float = 3.0,
    max_bias: float = 0.1,
    gap: float = 3.0,
) -> Rest | None:
    """The gyroscope's reading over the still stretches of one recording (module docstring).

    Args:
        t: ``(n,)`` increasing sample times, s.
        omega: ``(n, 3)`` body angular velocity, rad/s (non-finite samples are skipped).
        pauses: times, s, where the recording was paused (no block spans one).
        block: block length, s.
        noise_factor: a still block's per-axis standard deviation is at most this times the
            gyroscope's white noise.
        max_bias: a still block's per-axis mean is at most this, rad/s.
        gap: a sample interval longer than this many median steps breaks a block.

    Returns:
        :class:`Rest`, or ``None`` where no block is still (a body never at rest, a recording
        shorter than a block, a block of fewer than 3 samples (times in ms read as s),
        timestamps so irregular that every block holds a gap).

    Raises:
        ValueError: ``t`` not ``(n,)``, ``omega`` not ``(n, 3)``, times not increasing, or a
            rule parameter that is not a positive number.
    """
    t = np.asarray(t, float)
    omega = np.asarray(omega, float)
    if t.ndim != 1 or omega.shape != (t.shape[0], 3):
        raise ValueError(f"rest_reading: t must be (n,) and omega (n, 3); got {t.shape} and {omega.shape}")
    for name, v in (("block", block), ("noise_factor", noise_factor), ("max_bias", max_bias), ("gap", gap)):
        if (
            isinstance(v, (bool, np.bool_))
            or not isinstance(v, (int, float, np.integer, np.floating))
            or not (np.isfinite(v) and v > 0)
        ):
            raise ValueError(f"rest_reading: {name} must be a positive number; got {v!r}")
    ok = np.all(np.isfinite(omega), axis=1) & np.isfinite(t)
    t, omega = t[ok], omega[ok]
    if t.size < 3:
        return None
    dt = np.diff(t)
    if np.any(dt <= 0):
        raise ValueError(f"rest_reading: times must increase; t[{int(np.argmax(dt <= 0)) + 1}] does not")
    step = float(np.median(dt))
    per = int(round(block / step))
    if per < 3 or t.size < per:
        return None
    # the noise, at least a quantised gyroscope's rounding (step / sqrt(12)) and 1e-9 rad/s: a
    # still block of a noiseless or coarsely quantised gyroscope varies by no more than that
    steps = np.abs(np.diff(omega, axis=0))
    lsb = float(np.min(steps[steps > 0])) if np.any(steps > 0) else 0.0
    rounding = max(lsb / np.sqrt(12.0), 1e-9)
    sigma = max(noise_sigma(omega), rounding)
    pauses = np.asarray(pauses, float)
    pauses = pauses[np.isfinite(pauses)]
    means, spreads, spans = [], [], []
    for a in range(0, t.size - per + 1, per):
        w = omega[a : a + per]
        t0, t1 = t[a], t[a + per - 1]
        if np.any(dt[a : a + per - 1] > gap * step) or np.any((pauses > t0) & (pauses < t1)):
            continue
        if np.all(w.std(0) <= noise_factor * sigma) and np.all(np.abs(w.mean(0)) <= max_bias):
            means.append(w.mean(0))
            spreads.append(w.var(0, ddof=1))
            spans.append((float(t0), float(t1)))
    if not means:
        return None
    means = np.array(means)
    value = np.median(means, axis=0)
    # at least the noise of one block's mean, and the rounding of a quantised gyroscope (which
    # averaging does not remove where the noise is below one step) and 1e-9 rad/s
    floor = np.maximum(np.sqrt(np.mean(spreads, axis=0) / per), rounding)
    sd = np.maximum(1.4826 * np.median(np.abs(means - value), axis=0), floor) if len(means) >= 3 else floor
    value.setflags(write=False)
    sd.setflags(write=False)
    return Rest(value, sd, float(len(spans) * per * step), tuple(spans))
