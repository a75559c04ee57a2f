"""Sensor Logger (the Android/iOS app by Kelvin Choi, https://github.com/tszheichoi/awesome-sensor-logger)
exports: a folder, or the zip the app shares, with one CSV per sensor::

    Gyroscope.csv     time,seconds_elapsed,z,y,x
                      time: UTC epoch, ns (integer); seconds_elapsed: s since the recording
                      started (the same clock in every file); z,y,x: rad/s, phone axes
    Orientation.csv   time,seconds_elapsed,qz,qy,qx,qw,roll,pitch,yaw
    segments.csv      (optional, as phyphox's meta/segments.csv: segment,start,end,keep,comment,
                      times in seconds_elapsed; without it the free flights are detected from
                      the gyroscope alone, :mod:`rigidjax.io.detect`, as for phyphox)

Nothing is resampled: each file keeps its own timestamps. The quaternion is read as the phone's
attitude, body (phone) to world, as Android's rotation vector defines it (not checked against
the iOS app, whose CoreMotion attitude could be the inverse: compare with the gyroscope before
relying on its sense).
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np

from ._base import (
    DataError,
    Motion,
    Segment,
    _check_increasing,
    _Files,
    _numeric_columns,
    _read_table,
    _require_columns,
    _unit_quaternions,
    walk_folder,
    _zip_dirs,
)
from .detect import WINDOWS, cut_flights
from .rest import rest_reading
from .phyphox import _cut_windows, _why_empty
from .units import check_plausible, unit_factor

__all__ = ["GYROSCOPE", "ORIENTATION", "load_sensor_logger", "load_sensor_logger_motion", "is_sensor_logger"]

GYROSCOPE = "Gyroscope.csv"
ORIENTATION = "Orientation.csv"
_GYRO_COLUMNS = ("x", "y", "z")  # stored z,y,x: read by name
_QUAT_COLUMNS = ("qw", "qx", "qy", "qz")  # stored qz,qy,qx,qw: read by name


def is_sensor_logger(path) -> bool:
    """A folder holding ``Gyroscope.csv`` or ``Orientation.csv``, or a zip holding one."""
    p = Path(path)
    if p.is_dir():
        return (p / GYROSCOPE).is_file() or (p / ORIENTATION).is_file()
    if p.is_file() and zipfile.is_zipfile(p):
        try:
            with zipfile.ZipFile(p) as z:
                return bool(_zip_dirs(z, GYROSCOPE) or _zip_dirs(z, ORIENTATION))
        except (zipfile.BadZipFile, OSError):
            return False
    return False


def _exports(path: Path, name: str) -> list[tuple[_Files, str]]:
    """``(files, label)`` of every export holding ``name`` in or below ``path`` (folders, then
    zips, each sorted by path; symbolic links followed, :func:`rigidjax.io._base.walk_folder`)."""
    if path.is_file():
        archive = _Files.open_zip(path)
        dirs = _zip_dirs(archive, name)
        return [(_Files(path, archive, d), str(PurePosixPath(path.name, d)) if d else path.name) for d in dirs]
    if (path / name).is_file():
        return [(_Files(path), path.name)]
    folders, zips = [], []
    for here, _, files in walk_folder(path):  # symbolic links followed, each real folder and file once
        if name in files:
            folders.append(here)
        zips += [here / f for f in files if f.endswith(".zip")]
    out = [(_Files(d), str(d.relative_to(path))) for d in sorted(folders)]
    for z in sorted(zips):
        if is_sensor_logger(z):
            out += [(f, str(Path(z.relative_to(path).parent, lab))) for f, lab in _exports(z, name)]
    return out


def _time(df, label: str, time_unit) -> tuple[np.ndarray, str]:
    """Seconds since the recording started: ``seconds_elapsed``, else ``time`` (ns, integer
    differences: no float rounding of the epoch)."""
    if "seconds_elapsed" in df.columns:
        t = _numeric_columns(df, label, ["seconds_elapsed"])[:, 0] * unit_factor("time", time_unit)
        return t, "seconds_elapsed"
    _require_columns(df, label, ("time",))
    raw = df["time"]
    ints = raw.str.fullmatch(r"[+-]?\d+")
    if not ints.all():
        i = int(np.argmax(~ints.to_numpy()))
        raise DataError(f"{label}, line {i + 2}, column 'time': expected an integer time in ns; got {raw.iloc[i]!r}")
    ns = raw.astype(np.int64).to_numpy()
    factor = unit_factor("time", time_unit if time_unit is not None else "ns")
    return (ns - ns[0]) * factor, "time"


def _read(files: _Files, rel: str, columns, time_unit, allow_nonfinite=False) -> tuple:
    label = files.label(rel)
    df = _read_table(None, label=label, data=files.read(rel))
    _require_columns(df, label, columns)
    if len(df) < 2:
        raise DataError(f"{label}: needs at least 2 samples; got {len(df)}")
    t, tcol = _time(df, label, time_unit)
    _check_increasing(t, label, tcol)
    return t, _numeric_columns(df, label, list(columns), allow_nonfinite=allow_nonfinite), df, label


def load_sensor_logger(
    path,
    *,
    keep_only: bool = True,
    time_unit: str | None = None,
    rate_unit: str | None = None,
    check_units=True,
    windows: str = "auto",
) -> list[Segment]:
    """Load the gyroscope of Sensor Logger exports (folders or zips, see the module).

    Args:
        path: an export folder (holding ``Gyroscope.csv``), its ``.zip``, or a folder holding
            many of either (searched recursively, symbolic links followed, each export once;
            sorted by path).
        keep_only: as :func:`rigidjax.io.load_phyphox` (for a ``segments.csv`` beside
            ``Gyroscope.csv``).
        time_unit: unit of ``seconds_elapsed`` (default s) or, without it, of ``time``
            (default ns); rate_unit: default rad/s (:mod:`rigidjax.io.units`).
        check_units: run :func:`rigidjax.io.units.check_plausible` on each recording.
        windows: as :func:`rigidjax.io.load_phyphox` (``auto``: ``segments.csv``, else detected
            free flights from the gyroscope alone, else the whole recording, warned).

    Returns:
        One :class:`Segment` per window of its ``segments.csv``, per detected flight, or per recording: ``t`` in s
        since the recording started, ``omega`` ``(n, 3)`` rad/s in the PHONE's axes (x, y, z:
        the file's ``z,y,x`` columns read by name).

    Raises:
        DataError: no ``Gyroscope.csv``; missing columns; bad cells; non-increasing time;
            implausible units; bad windows (file, line and column named).
    """
    if windows not in WINDOWS:
        raise DataError(f"windows must be one of {WINDOWS}; got {windows!r}")
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    exports = _exports(p, GYROSCOPE)
    if not exports:
        raise DataError(f"{p}: no Sensor Logger export found (no {GYROSCOPE!r} in it, below it or in its zip)")
    out, empty = [], []
    try:
        for files, label in exports:
            listed = files.exists("segments.csv") and windows != "detect"  # else every sample must be finite
            t, omega, df, csv = _read(files, GYROSCOPE, _GYRO_COLUMNS, time_unit, allow_nonfinite=listed)
            omega = omega * unit_factor("rate", rate_unit)
            if check_units:
                check_plausible(t, omega, csv)
            if not listed:
                whole = Segment(t, omega, name=label, source=csv, rest=rest_reading(t, omega))
                found = [] if windows == "file" else cut_flights(whole)
                if not found and windows == "auto":
                    warnings.warn(
                        f"{csv}: no segments.csv and no free-flight window detected (rigidjax.io.detect); "
                        "the whole recording is one window",
                        stacklevel=3,
                    )
                out += found or ([] if windows == "detect" else [whole])
                if not found and windows == "detect":
                    empty.append(f"no free-flight window detected in {csv} (rigidjax.io.detect)")
                continue
            seg_file = files.label("segments.csv")
            segs_df = _read_table(None, label=seg_file, data=files.read("segments.csv"), sniff=False)
            cols = list(_GYRO_COLUMNS)
            segs = _cut_windows(t, omega, df, cols, csv, segs_df, seg_file, label, keep_only, np.empty(0))
            out += segs
            if not segs:
                empty.append(_why_empty(segs, segs_df, seg_file))
    finally:
        for files, _ in exports:
            if files.archive is not None:
                files.archive.close()
    if not out:
        raise DataError(f"{p}: no segments to load: " + "; ".join(empty))
    return out


def load_sensor_logger_motion(path, *, time_unit: str | None = None, rate_unit: str | None = None) -> Motion:
    """The orientation of one Sensor Logger export as a :class:`Motion` for
    :func:`rigidjax.identify.fit` (pose observations), at ``Orientation.csv``'s own timestamps.

    ``omega`` is filled from ``Gyroscope.csv`` only where both files carry the same ``time``
    column (the same samples); otherwise it is ``None`` (nothing is resampled; load the
    gyroscope with :func:`load_sensor_logger`).

    Returns:
        ``Motion(t (n,) s, orientation (n, 4) [w, x, y, z] body to world, renormalised,
        omega (n, 3) rad/s or None)``.

    Raises:
        DataError: not exactly one export; no ``Orientation.csv``; missing columns; bad cells;
            non-increasing time; ``|q|`` off 1 by more than 1e-3 (file, line, column).
    """
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    exports = _exports(p, ORIENTATION)
    try:
        if len(exports) != 1:
            raise DataError(
                f"{p}: expected one Sensor Logger export with {ORIENTATION!r}; found {len(exports)}"
                + (f" ({', '.join(lab for _, lab in exports)})" if exports else "")
            )
        files, _ = exports[0]
        label = files.label(ORIENTATION)
        t, q, df, _ = _read(files, ORIENTATION, _QUAT_COLUMNS, time_unit)
        q = _unit_quaternions(q, label, "qw")
        omega = None
        if files.exists(GYROSCOPE):
            _, w, dg, _ = _read(files, GYROSCOPE, _GYRO_COLUMNS, time_unit)
            if "time" in df.columns and "time" in dg.columns and df["time"].equals(dg["time"]):
                omega = w * unit_factor("rate", rate_unit)
    finally:
        for files, _ in exports:
            if files.archive is not None:
                files.archive.close()
    for v in (t, q, omega):
        if v is not None:
            v.setflags(write=False)
    return Motion(t=t, omega=omega, orientation=q, position=None, torque=None, source=label)
