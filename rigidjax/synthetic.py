"""Synthetic gyroscope recordings in phyphox's export layout, from a known body (a test truth).

:func:`synthesize_recording` writes what the phyphox app exports for its "Gyroscope rotation
rate" experiment (``Raw Data.csv`` with phyphox's header and number format, ``meta/time.csv``,
``meta/device.csv``) plus the experimenter's ``meta/segments.csv`` of toss windows, for a
rigid body tossed several times. The motion comes from a tight SciPy integration (DOP853,
``rtol = atol = 1e-12``) of Euler's equations with an isotropic angular air drag,

.. math:: I\\dot\\omega = -\\omega\\times I\\omega - c\\,\\omega \\qquad (\\text{sensor frame}),

i.e. NOT from the rigidjax steppers that :func:`rigidjax.identify.fit_inertia` fits with, and
the gyroscope reads ``omega + bias + white noise`` at jittered ~100 Hz timestamps. The default
body resembles the racquet of ``../shared/data/racquet-flips`` (README: pendulum moments
``Ix = 1.88e-2, Iy = 1.39e-3, Iz = 2.07e-2`` kg m^2 in phone axes); those published values
violate the triangle inequality slightly (``Ix + Iy < Iz``: a nearly planar racquet within its
error bars), so the default takes ``Iz = 2.00e-2`` (physical), with the principal axes turned
a few degrees from the phone axes (sensor misalignment).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy.spatial.transform import Rotation

from .io import PHYPHOX_ABS, PHYPHOX_GYRO, PHYPHOX_TIME, RAW_DATA
from .reference import euler_omega

__all__ = ["synthesize_recording", "RACQUET_MOMENTS"]

#: Default principal moments (kg m^2) about axes near phone x, y, z: the racquet's pendulum
#: values with Iz lowered from 2.07e-2 to 2.00e-2 to satisfy the triangle inequality.
RACQUET_MOMENTS = (1.88e-2, 1.39e-3, 2.00e-2)


def _phyphox_float(x: float) -> str:
    """phyphox's number format: 10 significant digits, ``E`` and an unpadded exponent."""
    if x == 0:
        return "0.000000000E0"
    return np.format_float_scientific(x, precision=9, unique=False, exp_digits=1).upper().replace("E+", "E")


def synthesize_recording(
    out_dir,
    *,
    moments=RACQUET_MOMENTS,
    misalignment=(0.03, -0.02, 0.04),
    drag: float = 1e-4,
    bias=(0.004, -0.003, 0.002),
    noise_std: float = 0.01,
    n_tosses: int = 5,
    spin: tuple[float, float] = (7.0, 11.0),
    wobble: float = 0.3,
    spin_axis: int = 0,
    toss_duration: float = 0.9,
    rest: float = 1.2,
    rate: float = 100.0,
    jitter: float = 1e-4,
    seed: int = 0,
    name: str = "Gyroscope rotation rate 2026-01-01 12-00-00",
    window_misalignment: float = 0.0,
    drag_spread: float = 0.0,
) -> dict:
    """Write a synthetic phyphox recording of tossed rigid-body flights; return the truth.

    Args:
        out_dir: folder in which the export folder ``name`` is created (spaces allowed).
        moments: principal moments of inertia ``(3,)``, kg m^2, about the principal axes, which
            are the sensor axes turned by ``misalignment``. Must be positive and obey the
            triangle inequality (equality allowed: a planar lamina such as a thin disk).
        misalignment: rotation vector (rad) taking sensor axes to principal axes; the sensor-
            frame tensor is ``R diag(moments) R^T`` with ``R = exp(misalignment)``.
        drag: isotropic angular resistance ``c`` >= 0, N m s (torque ``-c omega``).
        bias: constant gyroscope bias ``(3,)``, rad/s, sensor axes.
        noise_std: white gyroscope noise, rad/s (1-sigma, each axis).
        n_tosses: number of free flights (one ``segments.csv`` window each).
        spin: range of the spin rate, rad/s, about principal axis ``spin_axis`` at release.
        wobble: 1-sigma of the other two initial rate components, rad/s (what lets an
            intermediate-axis spin flip).
        spin_axis: 0, 1 or 2: the principal axis the tosses spin about (default 0, near phone
            x: the racquet's intermediate axis).
        toss_duration: flight time per toss, s.
        rest: time at rest (rate = bias + noise) before each toss and at the end, s.
        rate: sampling rate, Hz. Timestamps are ``1/rate`` apart plus uniform jitter
            ``± jitter`` s (strictly increasing, NOT uniform, as in phyphox exports).
        seed: random seed (noise, jitter, initial rates).
        name: export folder name.
        window_misalignment: 1-sigma (rad) of a further random rotation of the sensor, drawn
            anew for each toss (a phone shifting in its mount between throws): model error
            that differs from window to window for a fit with principal axes along the
            sensor's. 0 (default): none.
        drag_spread: relative 1-sigma of the drag, drawn anew for each toss (log-normal with
            mean ``drag``): a per-throw model error for a fit with one drag. 0 (default): none.

    Returns:
        The truth: ``inertia`` (3x3, sensor frame), ``moments``, ``misalignment``, ratios
        ``Ix/Iy``, ``Iz/Iy``, ``Ixy/Iy``, ``Ixz/Iy``, ``Iyz/Iy`` (tensor entries in sensor axes
        over ``I_yy``), ``Ix``, ``Iy``, ``Iz`` (kg m^2), ``drag`` (N m s), ``drag/Iy`` (1/s),
        ``bias``, ``noise_std``, ``omega0`` per window (rate at the window's first sample,
        without bias/noise), ``windows`` [(start, end)], ``path`` (the export folder), and per
        toss ``window_rotvec`` (its extra sensor rotation, rad) and ``window_drag`` (N m s).

    Raises:
        ValueError: non-physical moments, negative drag/noise, bad sizes.
    """
    moments = np.asarray(moments, float)
    if (
        moments.shape != (3,)
        or np.any(moments <= 0)
        or np.any(moments > moments.sum() - moments + 1e-12 * moments.sum())
    ):
        raise ValueError(f"moments must be 3 positive values obeying the triangle inequality; got {moments}")
    if drag < 0 or noise_std < 0 or window_misalignment < 0 or drag_spread < 0:
        raise ValueError(
            f"drag, noise_std, window_misalignment and drag_spread must be >= 0; got {drag}, {noise_std}, "
            f"{window_misalignment}, {drag_spread}"
        )
    if n_tosses < 1 or rate <= 0 or toss_duration <= 0 or jitter * rate >= 0.5:
        raise ValueError("need n_tosses >= 1, rate > 0, toss_duration > 0 and jitter < 0.5 / rate")
    rng = np.random.default_rng(seed)
    R = Rotation.from_rotvec(np.asarray(misalignment, float)).as_matrix()
    inertia = R @ np.diag(moments) @ R.T
    bias = np.asarray(bias, float)

    total = n_tosses * (rest + toss_duration) + rest
    n = int(total * rate) + 1
    dt = 1.0 / rate + rng.uniform(-jitter, jitter, n)
    t = 0.0317 + np.concatenate([[0.0], np.cumsum(dt[1:])])  # phyphox's first sample is not at 0
    omega = np.zeros((n, 3))
    windows, omega0, rotvecs, drags = [], [], [], []
    for k in range(n_tosses):
        t_start = t[0] + rest + k * (rest + toss_duration)
        t_end = t_start + toss_duration
        sel = (t >= t_start) & (t <= t_end)
        w_principal = rng.normal(0, wobble, 3)
        w_principal[spin_axis] = rng.uniform(*spin) * rng.choice([-1, 1])
        xi = rng.normal(0, window_misalignment, 3) if window_misalignment > 0 else np.zeros(3)
        d_k = drag * math.exp(drag_spread * rng.normal() - 0.5 * drag_spread**2) if drag_spread > 0 else drag
        R_k = R @ Rotation.from_rotvec(xi).as_matrix()
        inertia_k = R_k @ np.diag(moments) @ R_k.T
        rotvecs.append(xi.tolist())
        drags.append(float(d_k))
        w_release = R_k @ w_principal
        ts = t[sel]
        span = np.concatenate([[t_start], ts]) if ts[0] > t_start else ts  # released at t_start
        omega[sel] = euler_omega(inertia_k, w_release, span, damping=d_k, rtol=1e-12)[-ts.size :]
        # the window the experimenter marks: a little inside the flight
        w_lo, w_hi = ts[0] + 0.02, ts[-1] - 0.02
        windows.append((round(w_lo, 3), round(w_hi, 3)))
        first = np.searchsorted(ts, windows[-1][0])
        omega0.append(omega[sel][first].tolist())
    measured = omega + bias + rng.normal(0, noise_std, omega.shape)

    export = Path(out_dir) / name
    (export / "meta").mkdir(parents=True, exist_ok=True)
    header = ",".join(f'"{c}"' for c in (PHYPHOX_TIME, *PHYPHOX_GYRO, PHYPHOX_ABS))
    absolute = np.linalg.norm(measured, axis=1)
    lines = [header] + [",".join(_phyphox_float(v) for v in (ti, *wi, ai)) for ti, wi, ai in zip(t, measured, absolute)]
    (export / RAW_DATA).write_text("\n".join(lines) + "\n")
    seg_lines = ["segment,start,end,keep,comment", f"0, {t[0] + 0.1:.2f}, {t[0] + 0.6:.2f},false,Not a trial (at rest)"]
    for k, (lo, hi) in enumerate(windows):
        pad = " " if k % 2 else ""  # whitespace varies between real files too
        seg_lines.append(
            f"{k + 1},{pad}{lo:.3f},{pad}{hi:.3f},,"
            f"{'Intermediate axis rotation' if spin_axis == 0 else 'Spin about principal axis ' + str(spin_axis)}"
        )
    (export / "meta" / "segments.csv").write_text("\n".join(seg_lines))
    t_sys = 1.767268800e9
    (export / "meta" / "time.csv").write_text(
        '"event","experiment time","system time","system time text"\n'
        f'"START",{_phyphox_float(0.0)},{_phyphox_float(t_sys)},"2026-01-01 12:00:00.000 UTC+00:00"\n'
        f'"PAUSE",{_phyphox_float(float(t[-1]))},{_phyphox_float(t_sys + float(t[-1]))},'
        f'"2026-01-01 12:00:{t[-1]:06.3f} UTC+00:00"\n'
    )
    (export / "meta" / "device.csv").write_text(
        '"property","value"\n"version","rigidjax.synthetic"\n"build","0"\n"fileFormat","1.18"\n'
        '"deviceModel","synthetic (scipy DOP853 of Euler\'s equations with drag)"\n'
    )
    iyy = inertia[1, 1]
    return {
        "path": str(export),
        "inertia": inertia.tolist(),
        "moments": moments.tolist(),
        "misalignment": list(map(float, misalignment)),
        "Ix/Iy": inertia[0, 0] / iyy,
        "Iz/Iy": inertia[2, 2] / iyy,
        "Ixy/Iy": inertia[0, 1] / iyy,
        "Ixz/Iy": inertia[0, 2] / iyy,
        "Iyz/Iy": inertia[1, 2] / iyy,
        "Ix": inertia[0, 0],
        "Iy": iyy,
        "Iz": inertia[2, 2],
        "drag": float(drag),
        "drag/Iy": float(drag) / iyy,
        "bias": bias.tolist(),
        "noise_std": float(noise_std),
        "omega0": omega0,
        "windows": windows,
        # largest angle between a principal axis and its nearest sensor axis (as fit_inertia reports)
        "misalignment_deg": math.degrees(math.acos(min(1.0, float(np.max(np.abs(R), axis=0).min())))),
        "window_rotvec": rotvecs,
        "window_drag": drags,
    }
