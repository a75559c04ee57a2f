"""Units of measured motion and the plausibility check every loader runs.

Units are converted at load time to the package's SI units (s, rad/s, m): ``time_unit`` one of
:data:`TIME_UNITS`, ``rate_unit`` one of :data:`RATE_UNITS`, ``length_unit`` one of
:data:`LENGTH_UNITS`.

The check (:func:`check_plausible`), after conversion:

1. **Time step.** The median sample interval must be below :data:`MAX_MEDIAN_STEP` (1 s: a
   motion sensor samples at 1 Hz or faster). Above it, the timestamps are read as ms, us or ns:
   the first of these that puts the median interval within [0.1 ms, 1 s) (10 kHz to 1 Hz) is
   named with ``--time-unit`` in the error.
2. **Rotation per sample.** The 99th percentile of ``|omega|`` (rad/s) times the median
   interval (s) must be at most :data:`MAX_ROTATION_PER_SAMPLE` (1 rad, 57 degrees): a phone or
   IMU gyroscope is low-pass filtered well below its sampling rate (consumer full scale
   2000 deg/s = 35 rad/s, at 100 Hz 0.35 rad per sample), and beyond ~1 rad per sample a
   rollout at the measured timestamps cannot follow the motion. Above it the error names deg/s
   (``--rate-unit deg/s``) when the rates read as deg/s pass, otherwise the time unit or a
   too-coarse sampling. The percentile (not the peak) lets an isolated glitch through.

Both raise :class:`DataError` naming the file, the numbers and the flag that fixes it;
``check_units=False`` (``--no-unit-check``) skips them for data that really is that coarse.
"""

from __future__ import annotations

import math

import numpy as np

from ._base import DataError

__all__ = [
    "TIME_UNITS",
    "RATE_UNITS",
    "LENGTH_UNITS",
    "MAX_MEDIAN_STEP",
    "MAX_ROTATION_PER_SAMPLE",
    "unit_factor",
    "check_plausible",
]

#: seconds per unit of time
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
#: rad/s per unit of angular rate
RATE_UNITS = {"rad/s": 1.0, "deg/s": math.pi / 180}
#: metres per unit of length
LENGTH_UNITS = {"m": 1.0, "cm": 1e-2, "mm": 1e-3}
#: slowest accepted median sample interval, s
MAX_MEDIAN_STEP = 1.0
#: largest accepted rotation per sample (99th percentile of |omega| times the median step), rad
MAX_ROTATION_PER_SAMPLE = 1.0
_PLAUSIBLE_STEP = (1e-4, MAX_MEDIAN_STEP)

_FLAGS = {"time": "--time-unit", "rate": "--rate-unit", "length": "--length-unit"}


def unit_factor(kind: str, unit: str | None) -> float:
    """SI factor of ``unit`` (``None``: 1) for ``kind`` in ``time``, ``rate``, ``length``.

    Raises:
        DataError: an unknown unit (the known ones are listed).
    """
    table = {"time": TIME_UNITS, "rate": RATE_UNITS, "length": LENGTH_UNITS}[kind]
    if unit is None:
        return 1.0
    u = str(unit).strip().lower().replace("µ", "u").replace("rad/sec", "rad/s").replace("deg/sec", "deg/s")
    if u not in table:
        raise DataError(f"unknown {kind} unit {unit!r}; expected one of {', '.join(table)} ({_FLAGS[kind]})")
    return table[u]


def check_plausible(t: np.ndarray, omega: np.ndarray | None, where: str) -> None:
    """Refuse timestamps or rates whose numbers only make sense in another unit (module docs).

    Args:
        t: ``(n,)`` times, s, increasing (``n >= 2``).
        omega: ``(n, 3)`` angular velocity, rad/s (NaN rows ignored), or ``None``.
        where: the file, for the message.

    Raises:
        DataError: the median step is 1 s or more, or the rotation per sample exceeds 1 rad;
            the message names the likely unit and the flag (``--time-unit``, ``--rate-unit``,
            ``--no-unit-check``).
    """
    t = np.asarray(t, float)
    if t.size < 2:
        return
    dt = float(np.median(np.diff(t)))
    if not dt < MAX_MEDIAN_STEP:
        for unit in ("ms", "us", "ns"):
            s = dt * TIME_UNITS[unit]
            if _PLAUSIBLE_STEP[0] <= s < _PLAUSIBLE_STEP[1]:
                raise DataError(
                    f"{where}: the median time step is {dt:.4g} s ({1 / dt:.3g} Hz), too slow for a motion "
                    f"sensor; the timestamps look like {unit} ({s:.4g} s, {1 / s:.4g} Hz): pass --time-unit {unit} "
                    f"(time_unit={unit!r}), or --no-unit-check if they really are seconds"
                )
        raise DataError(
            f"{where}: the median time step is {dt:.4g} s, too slow for a motion sensor (at least 1 Hz) and no "
            "unit among ms, us, ns makes it plausible; check the time column, or pass --no-unit-check"
        )
    if omega is None:
        return
    speed = np.linalg.norm(np.asarray(omega, float), axis=-1)
    speed = speed[np.isfinite(speed)]
    if speed.size == 0:
        return
    p99 = float(np.percentile(speed, 99, method="lower"))  # a sample, never interpolated towards a glitch
    per_sample = p99 * dt
    if per_sample <= MAX_ROTATION_PER_SAMPLE:
        return
    head = (
        f"{where}: the rates turn the body by {per_sample:.3g} rad per sample (99th percentile of |omega| "
        f"{p99:.4g} rad/s at the median step {dt:.4g} s), more than {MAX_ROTATION_PER_SAMPLE:g} rad; "
    )
    as_deg = per_sample * RATE_UNITS["deg/s"]
    if as_deg <= MAX_ROTATION_PER_SAMPLE:
        raise DataError(
            head + f"they look like deg/s ({p99 * RATE_UNITS['deg/s']:.4g} rad/s, {as_deg:.3g} rad per sample): "
            "pass --rate-unit deg/s (rate_unit='deg/s'), or --no-unit-check if they really are rad/s"
        )
    raise DataError(
        head + "neither rad/s nor deg/s makes that plausible: check the time unit (--time-unit) and the rate "
        "columns, or pass --no-unit-check if the sampling really is that coarse"
    )
