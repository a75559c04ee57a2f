"""Free-flight windows found in the gyroscope rate alone, for recordings without ``segments.csv``.

The rule (:func:`detect_flights`), from the torque-free Euler equations: in free flight
``I1 w1' = (I2 - I3) w2 w3`` (and cyclic), and ``|I2 - I3| <= I1`` for every rigid body (the
triangle inequality of the moments), so whatever the body,

    |d omega/dt| <= |omega|^2 / sqrt(3)

(each component is bounded by the product of the other two). A hand that holds, swings, winds
up, catches or hits the body applies torques that break this bound at low rates (held: the
hand turns it while ``|omega|`` is small) and at a catch or an impact (a spike of the rate
derivative: tens of rad/s within one sample). A sample interval ``[t_i, t_i+1]`` is *flight-like*
when

1. ``|omega|`` (mean of its two ends) is at least ``max(min_rate, rest_factor * hand level)``,
   the hand level being the median ``|omega|`` of the recording (mostly held or lying still);
2. ``|omega_i+1 - omega_i| / dt <= slack * |omega|^2 / sqrt(3) + noise``, ``noise`` the
   finite-difference noise of the gyroscope (``4 sqrt(2) sigma / dt``; ``sigma`` estimated from
   the recording's second differences at rest, robustly);
3. with an accelerometer (specific force ``f``, m/s^2, gravity included; the phyphox loader
   reads an ``Accelerometer.csv`` beside the data, the Sensor Logger one none yet): ``|f| <= free_fall * g +
   lever * 2 |omega|^2`` (free fall reads ``|f| = 0`` at the centre of mass; a sensor up to
   ``lever`` m from it adds the centripetal and tangential terms); held, ``|f|`` is about g.
   At the default 0.2 m this refutes only slow "flights" (below ~5 rad/s): a spinning body's
   sensor off its centre of mass reads tens of m/s^2 in free fall, so the rate rule does the work;
4. it does not span a pause of the recording or a gap longer than ``gap`` median steps.

A *window* is a run of consecutive flight-like intervals; ``margin`` s is trimmed at both ends
(release and catch leave a sample or two that pass the test), and windows shorter than
``min_duration`` or longer than ``max_duration`` (after trimming) are dropped. Defaults:
``min_rate`` 3 rad/s, ``rest_factor`` 3, ``slack`` 1.25, ``min_duration`` 0.3 s,
``max_duration`` 10 s, ``margin`` 20 ms, ``gap`` 3 steps.

Checked against the hand-labelled ``meta/segments.csv`` of the shared racquet recordings
(``../shared/data/racquet-flips/flips``, 5 recordings, 69 labelled tosses; labels ignored,
defaults below; ``tests/test_detect.py``):

    found (overlap >= 80 % of the labelled window): 69 of 69
    extra windows: 1 (round 1, 4.94 - 6.11 s: the row the authors labelled "Not a trial",
                   keep=false: a flight-like stretch they discarded)
    start error (detected - labelled): median -3 ms, mean |.| 25 ms, max |.| 193 ms
    end error:                         median -19 ms, mean |.| 19 ms, max |.| 30 ms
    the two pendulum recordings (pendulum/x-axis): no window detected (swings break the bound)

The labels start where the wind-up has ended and stop at the catch, as the rule does; the one
large start error (193 ms) is round 2's toss labelled from 76.80 s, whose rate meets the bound
(wind-up over) from 76.61 s. Every rule parameter may be changed per call; the loaders use the
defaults.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._base import Segment
from .rest import noise_sigma

__all__ = ["Flight", "detect_flights", "cut_flights", "describe_windows", "DETECTED", "WINDOWS", "GRAVITY"]

GRAVITY = 9.80665
#: the ``comment`` of every detected window
DETECTED = "detected free flight"
#: where windows come from: ``auto`` (``segments.csv``, else detected, else the whole recording,
#: warned), ``file`` (``segments.csv``, else the whole recording), ``detect`` (always detected)
WINDOWS = ("auto", "file", "detect")


@dataclasses.dataclass(frozen=True)
class Flight:
    """One detected free-flight window: ``start``/``end`` s (sample times of the recording,
    margin trimmed), ``n`` samples, ``median_rate`` the median ``|omega|`` in rad/s."""

    start: float
    end: float
    n: int
    median_rate: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def detect_flights(
    t,
    omega,
    *,
    accel=None,
    pauses=(),
    min_rate: float = 3.0,
    rest_factor: float = 3.0,
    slack: float = 1.25,
    noise: float | None = None,
    free_fall: float = 0.5,
    lever: float = 0.2,
    min_duration: float = 0.3,
    max_duration: float = 10.0,
    margin: float = 0.02,
    gap: float = 3.0,
) -> list[Flight]:
    """Free-flight windows of one recording by the rule of this module's docstring.

    Args:
        t: ``(n,)`` increasing sample times, s.
        omega: ``(n, 3)`` body angular velocity, rad/s (finite).
        accel: optional ``(t_a, f)``: accelerometer times ``(m,)`` s and specific force ``(m, 3)``
            m/s^2 (gravity included), interpolated linearly onto ``t``.
        pauses: times, s, where the recording was paused (no window spans one).
        min_rate: lowest ``|omega|`` of a flight, rad/s.
        rest_factor: a flight's ``|omega|`` is at least this times the recording's median.
        slack: factor on the torque-free bound ``|omega|^2 / sqrt(3)`` (sampling, drag).
        noise: allowance on ``|d omega/dt|``, rad/s^2; default ``4 sqrt(2) sigma / dt``.
        free_fall, lever: accelerometer test ``|f| <= free_fall g + 2 lever |omega|^2``.
        min_duration, max_duration: accepted window lengths after trimming, s.
        margin: trimmed at both ends of each window, s.
        gap: a sample step longer than ``gap`` median steps ends a window.

    Returns:
        The windows in time order (possibly none).
    """
    t = np.asarray(t, float)
    omega = np.asarray(omega, float)
    if t.size < 3:
        return []
    dt = np.diff(t)
    step = float(np.median(dt))
    speed = np.linalg.norm(omega, axis=1)
    mid = 0.5 * (speed[1:] + speed[:-1])
    deriv = np.linalg.norm(np.diff(omega, axis=0), axis=1) / dt
    if noise is None:
        noise = 4 * np.sqrt(2) * noise_sigma(omega) / step
    level = max(min_rate, rest_factor * float(np.median(speed)))
    ok = (mid >= level) & (deriv <= slack * mid**2 / np.sqrt(3) + noise) & (dt <= gap * step)
    if accel is not None:
        ta, fa = (np.asarray(a, float) for a in accel)
        f = np.linalg.norm(fa, axis=1)
        fi = np.interp(0.5 * (t[1:] + t[:-1]), ta, f)
        ok &= fi <= free_fall * GRAVITY + 2 * lever * mid**2
    for p in np.asarray(pauses, float):
        ok &= ~((t[:-1] < p) & (t[1:] > p))
    # runs of consecutive flight-like intervals: interval i joins samples i and i + 1
    edges = np.diff(np.concatenate([[0], ok.astype(np.int8), [0]]))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    out = []
    for a, b in zip(starts, stops):  # intervals a .. b-1 -> samples a .. b
        t0, t1 = t[a] + margin, t[b] - margin
        sel = (t >= t0 - 1e-9) & (t <= t1 + 1e-9)
        n = int(sel.sum())
        if n < 2 or not (min_duration <= t[sel][-1] - t[sel][0] <= max_duration):
            continue
        ts = t[sel]
        out.append(Flight(float(ts[0]), float(ts[-1]), n, float(np.median(speed[sel]))))
    return out


def cut_flights(segment: Segment, *, accel=None, pauses=(), **rule) -> list[Segment]:
    """The detected free-flight windows of ``segment`` (a whole recording) as segments named
    ``"<name> #k"``, ``index`` k, ``comment`` :data:`DETECTED`; ``rule``: :func:`detect_flights`'s
    keywords."""
    out = []
    for k, f in enumerate(detect_flights(segment.t, segment.omega, accel=accel, pauses=pauses, **rule)):
        sel = (segment.t >= f.start) & (segment.t <= f.end)
        extra = {a: getattr(segment, a)[sel] for a in ("orientation", "position") if getattr(segment, a) is not None}
        name = f"{segment.name} #{k}" if segment.name else f"#{k}"
        out.append(
            Segment(
                segment.t[sel],
                segment.omega[sel],
                **extra,
                name=name,
                source=segment.source,
                index=k,
                comment=DETECTED,
                rest=segment.rest,
            )
        )
    return out


def describe_windows(segments, first_row: int = 0) -> str:
    """One line per detected window (``comment`` :data:`DETECTED`) of ``segments``, grouped by
    recording: its row (position in ``segments`` + ``first_row``, as ``--segment`` counts),
    start, end and duration; ``""`` when none was detected."""
    lines, source = [], None
    for row, s in enumerate(segments, first_row):
        if s.comment != DETECTED:
            continue
        if s.source != source:
            source = s.source
            n = sum(1 for q in segments if q.source == source and q.comment == DETECTED)
            lines.append(f"{source}: {n} free-flight window(s) detected from the rate (rigidjax.io.detect):")
        lines.append(f"  row {row:3d}: {s.name}: {s.t[0]:9.3f} - {s.t[-1]:9.3f} s ({s.duration:.2f} s, {s.n} samples)")
    return "\n".join(lines)
