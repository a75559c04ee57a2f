"""phyphox ("Gyroscope rotation rate" experiment, https://phyphox.org) exports: folders and zips.

One export per recording, as a folder or as the zip the app's share button gives (same files,
at the archive's root or in one folder inside it)::

    Raw Data.csv      "Time (s)","Gyroscope x (rad/s)","Gyroscope y (rad/s)",
                      "Gyroscope z (rad/s)","Absolute (rad/s)"
    meta/time.csv     START/PAUSE events (experiment time, s)
    meta/device.csv   app and phone
    meta/segments.csv (optional, written by the experimenter, not by phyphox)
                      segment,start,end,keep,comment

Every CSV dialect phyphox writes is read: "CSV (Comma, decimal point)", "(Tabulator, decimal
point)", "(Semicolon, decimal point)", "(Tabulator, decimal comma)", "(Semicolon, decimal comma)";
values are scientific with 10 significant digits, missing ones ``""``. Where the app ran in
another language the column names are translated (e.g. "Gyroskop x (rad/s)") and the data file
may be named after the translated set: then the time is the first column whose name ends in
``(s)``, the rates the columns naming the axis letter and ending in ``(rad/s)``, and the data
file the one CSV beside ``meta/``.

``segments.csv`` lists hand-picked windows in experiment time (s); ``keep`` false drops a
window, empty ``keep`` keeps it. Without ``segments.csv`` (``windows="auto"``, the default) the
free flights are detected from the rate (:mod:`rigidjax.io.detect`; an ``Accelerometer.csv``
beside the data, specific force in m/s^2 with gravity, is used too when present); where none is
found the whole recording is one segment (warned). ``windows="file"``: ``segments.csv`` or the
whole recording; ``windows="detect"``: detected even where ``segments.csv`` exists.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from ._base import (
    DataError,
    Segment,
    _check_finite,
    _check_increasing,
    _Files,
    _numeric_columns,
    _parse_keep,
    _read_table,
    walk_folder,
    _where,
    _zip_dirs,
)
from .detect import WINDOWS, cut_flights
from .rest import rest_reading
from .units import check_plausible, unit_factor

__all__ = ["RAW_DATA", "PHYPHOX_TIME", "PHYPHOX_GYRO", "PHYPHOX_ABS", "load_phyphox", "is_phyphox_zip", "has_phyphox"]

RAW_DATA = "Raw Data.csv"
#: phyphox's column names of the "Gyroscope rotation rate" experiment (Raw Data.csv).
PHYPHOX_TIME = "Time (s)"
PHYPHOX_GYRO = ("Gyroscope x (rad/s)", "Gyroscope y (rad/s)", "Gyroscope z (rad/s)")
PHYPHOX_ABS = "Absolute (rad/s)"
_META = ("meta/time.csv", "meta/device.csv")


def _columns(df: pd.DataFrame, label: str) -> tuple[str, list[str]]:
    """The time and the three rate columns: phyphox's English names, else by unit and axis."""
    if PHYPHOX_TIME in df.columns and all(c in df.columns for c in PHYPHOX_GYRO):
        return PHYPHOX_TIME, list(PHYPHOX_GYRO)
    cols = list(df.columns)
    time = next((c for c in cols if re.search(r"\(s\)$", c)), None)
    rates = []
    for a in "xyz":
        found = [c for c in cols if re.search(r"\(rad/s\)$", c) and re.search(rf"(^|[\s_]){a}($|[\s_(])", c, re.I)]
        rates.append(found[0] if len(found) == 1 else None)
    if time is None or None in rates:
        missing = [c for c in (PHYPHOX_TIME, *PHYPHOX_GYRO) if c not in df.columns]
        raise DataError(f"{_where(label, 1)}: missing column(s) {missing}; the header has {cols}")
    return time, rates


def _data_file(files: _Files) -> str:
    """The export's data CSV: ``Raw Data.csv``, or the one top-level CSV (translated name)."""
    if files.exists(RAW_DATA):
        return RAW_DATA
    top = [f for f in files.listing() if "/" not in f and f.lower().endswith(".csv")]
    if len(top) == 1:
        return top[0]
    raise DataError(
        f"{files.label()}: no {RAW_DATA!r}" + (f" and several CSV files {top}: which one is the data?" if top else "")
    )


def _pause_times(files: _Files) -> np.ndarray:
    """Experiment times of PAUSE events (the data jump there); empty where time.csv is absent."""
    if not files.exists("meta/time.csv"):
        return np.empty(0)
    try:
        df = _read_table(None, label=files.label("meta/time.csv"), data=files.read("meta/time.csv"))
    except DataError:
        return np.empty(0)
    if "event" not in df.columns or "experiment time" not in df.columns:
        return np.empty(0)
    sel = df["event"].str.upper() == "PAUSE"
    return pd.to_numeric(df.loc[sel, "experiment time"], errors="coerce").dropna().to_numpy(float)


def _cut_windows(t, omega, df, rate_cols, csv, segs_df, seg_file, label, keep_only, pauses) -> list[Segment]:
    """The windows of ``segs_df`` (a ``segments.csv``: ``segment,start,end,keep,comment``, times in
    the recording's time, s) cut from ``t, omega`` (read from ``df``'s ``rate_cols`` of ``csv``)."""
    if "start" not in segs_df.columns or "end" not in segs_df.columns:
        missing = [c for c in ("start", "end") if c not in segs_df.columns]
        raise DataError(f"{_where(seg_file, 1)}: missing column(s) {missing}; the header has {list(segs_df.columns)}")
    out = []
    rest = rest_reading(t, omega, pauses=pauses)
    for i, row in enumerate(segs_df.itertuples(index=False)):
        line = i + 2
        rec = dict(zip(segs_df.columns, row))
        keep = _parse_keep(rec.get("keep", ""), seg_file, line)
        index_raw = rec.get("segment", "")
        try:
            index = int(float(index_raw)) if index_raw != "" else i
        except ValueError:
            raise DataError(f"{_where(seg_file, line, 'segment')}: expected an integer; got {index_raw!r}") from None
        comment = rec.get("comment", "")
        if not keep and (keep_only or rec["start"] == "" or rec["end"] == ""):
            continue  # a discarded window needs no valid bounds
        bounds = []
        for col in ("start", "end"):
            try:
                v = float(rec[col])
            except ValueError:
                v = float("nan")
            if not np.isfinite(v):
                raise DataError(f"{_where(seg_file, line, col)}: expected a time in s; got {rec[col]!r}")
            bounds.append(v)
        start, end = bounds
        if not end > start:
            raise DataError(f"{_where(seg_file, line, 'end')}: window end {end} s is not after start {start} s")
        if start < t[0] - 0.5 * (t[1] - t[0]) or end > t[-1] + 0.5 * (t[-1] - t[-2]):
            raise DataError(
                f"{_where(seg_file, line, 'start' if start < t[0] else 'end')}: window [{start}, {end}] s "
                f"lies outside the recording {csv} ([{t[0]:.4f}, {t[-1]:.4f}] s)"
            )
        sel = (t >= start) & (t <= end)
        n = int(sel.sum())
        if n < 2:
            raise DataError(
                f"{_where(seg_file, line, 'start')}: window [{start}, {end}] s holds {n} sample(s) of {csv}; "
                "a window needs at least 2"
            )
        _check_finite(df, omega, np.flatnonzero(sel), csv, rate_cols)
        tw = t[sel]
        inside = pauses[(pauses > tw[0]) & (pauses < tw[-1])]  # samples on both sides of a pause
        if inside.size:
            warnings.warn(
                f"{_where(seg_file, line)}: window [{start}, {end}] s spans a recording pause at "
                f"{inside[0]:.3f} s (time.csv); the motion is discontinuous there",
                stacklevel=4,
            )
        out.append(
            Segment(
                t[sel],
                omega[sel],
                name=f"{label} #{index}",
                source=csv,
                index=index,
                comment=comment,
                keep=keep,
                rest=rest,
            )
        )
    return out


ACCELEROMETER = "Accelerometer.csv"


def _accelerometer(files: _Files, time_unit) -> tuple[np.ndarray, np.ndarray] | None:
    """``(t, f)`` of an ``Accelerometer.csv`` beside the data (time: the first column ending in
    ``(s)``, else the first; force: the three columns after it), or ``None`` where absent."""
    if not files.exists(ACCELEROMETER):
        return None
    label = files.label(ACCELEROMETER)
    df = _read_table(None, label=label, data=files.read(ACCELEROMETER))
    cols = list(df.columns)
    time = next((c for c in cols if re.search(r"\(s\)$", c)), cols[0])
    rest = [c for c in cols if c != time][:3]
    if len(rest) < 3 or len(df) < 2:
        raise DataError(f"{_where(label, 1)}: expected a time and three acceleration columns; the header has {cols}")
    t = _numeric_columns(df, label, [time])[:, 0] * unit_factor("time", time_unit)
    _check_increasing(t, label, time)
    return t, _numeric_columns(df, label, rest)


def _load_export(
    files: _Files, label: str, keep_only: bool, time_unit, rate_unit, check_units, windows="auto"
) -> tuple[list, str]:
    """The export's segments and, where there are none, why (for the caller's error)."""
    rel = _data_file(files)
    csv = files.label(rel)
    df = _read_table(None, label=csv, data=files.read(rel))
    time_col, rate_cols = _columns(df, csv)
    if len(df) < 2:
        raise DataError(f"{csv}: needs at least 2 samples; got {len(df)}")
    has_windows = files.exists("meta/segments.csv") and windows != "detect"
    t = _numeric_columns(df, csv, [time_col])[:, 0] * unit_factor("time", time_unit)
    _check_increasing(t, csv, time_col)
    # with windows, only the samples inside the loaded windows need to be finite
    omega = _numeric_columns(df, csv, rate_cols, allow_nonfinite=has_windows) * unit_factor("rate", rate_unit)
    if check_units:
        check_plausible(t, omega, csv)
    pauses = _pause_times(files) * unit_factor("time", time_unit)
    if not has_windows:
        whole = Segment(t, omega, name=label, source=csv, rest=rest_reading(t, omega, pauses=pauses))
        if windows == "file":
            return [whole], ""
        found = cut_flights(whole, accel=_accelerometer(files, time_unit), pauses=pauses)
        if found or windows == "detect":
            return found, "" if found else f"no free-flight window detected in {csv} (rigidjax.io.detect)"
        warnings.warn(
            f"{csv}: no segments.csv and no free-flight window detected (rigidjax.io.detect); "
            "the whole recording is one window",
            stacklevel=4,
        )
        return [whole], ""
    seg_file = files.label("meta/segments.csv")
    segs_df = _read_table(None, label=seg_file, data=files.read("meta/segments.csv"), sniff=False)
    out = _cut_windows(t, omega, df, rate_cols, csv, segs_df, seg_file, label, keep_only, pauses)
    return out, _why_empty(out, segs_df, seg_file)


def _why_empty(out, segs_df, seg_file) -> str:
    if out:
        why = ""
    elif len(segs_df) == 0:
        why = f"{seg_file} lists no windows"
    else:
        why = f"all {len(segs_df)} windows in {seg_file} are marked keep=false"
    return why


def is_phyphox_zip(path) -> bool:
    """Whether ``path`` is a zip archive holding a phyphox export (``Raw Data.csv`` or ``meta/``)."""
    p = Path(path)
    if not (p.is_file() and zipfile.is_zipfile(p)):
        return False
    try:
        with zipfile.ZipFile(p) as z:
            return bool(_zip_dirs(z, RAW_DATA) or _zip_dirs(z, "time.csv") or _zip_dirs(z, "device.csv"))
    except (zipfile.BadZipFile, OSError):
        return False


def _zip_exports(path: Path) -> list[tuple[_Files, str]]:
    archive = _Files.open_zip(path)
    dirs = set(_zip_dirs(archive, RAW_DATA))
    for name in ("time.csv", "device.csv"):  # the meta/ folder of an export with a translated data file
        dirs |= {d.rsplit("/", 1)[0] if "/" in d else "" for d in _zip_dirs(archive, name) if d.endswith("meta")}
    return [(_Files(path, archive, d), d) for d in sorted(dirs)]


def _find_exports(path: Path) -> list[tuple[_Files, Path]]:
    """``(files, where)`` of every export in or below ``path`` (folders and zips), sorted by path."""
    if path.is_file():
        return [(f, path / d if d else path) for f, d in _zip_exports(path)]
    if (path / RAW_DATA).is_file() or any((path / m).is_file() for m in _META):
        return [(_Files(path), path)]
    out = []
    for here, _, files in walk_folder(path):
        if (here / RAW_DATA).is_file() or any((here / m).is_file() for m in _META):
            out.append((_Files(here), here))
        for z in (here / f for f in files if f.endswith(".zip")):
            if is_phyphox_zip(z):
                out += [(f, z / d if d else z) for f, d in _zip_exports(z)]
    return sorted(out, key=lambda fw: str(fw[1]))


def has_phyphox(path) -> bool:
    """Whether ``path`` is a phyphox export (folder or zip) or a folder with one in or below it."""
    p = Path(path)
    if p.is_file():
        return is_phyphox_zip(p)
    return p.is_dir() and bool(_find_exports(p))


def _label(where: Path, root: Path) -> str:
    try:
        rel = where.relative_to(root)
        return str(rel) if str(rel) != "." else where.name
    except ValueError:
        return where.name


def load_phyphox(
    path,
    *,
    keep_only: bool = True,
    time_unit: str | None = None,
    rate_unit: str | None = None,
    check_units=True,
    windows: str = "auto",
) -> list[Segment]:
    """Load phyphox "Gyroscope rotation rate" exports (folders or zips, any CSV dialect).

    Args:
        path: an export folder (holding ``Raw Data.csv`` and ``meta/``), an export ``.zip``,
            a parent folder holding many of either (searched recursively, symbolic links
            followed, each export once; sorted by path), or a ``Raw Data.csv`` file. Spaces in paths are fine.
        keep_only: drop windows whose ``keep`` is false in ``meta/segments.csv`` (default).
            With ``False`` they are returned too (``Segment.keep = False``) where they have
            valid bounds.
        time_unit, rate_unit: override phyphox's own units (s, rad/s) for files edited by
            hand (:mod:`rigidjax.io.units`).
        check_units: run :func:`rigidjax.io.units.check_plausible` on each recording.
        windows: ``"auto"`` (default): ``meta/segments.csv``, else the detected free flights
            (:mod:`rigidjax.io.detect`), else the whole recording (warned); ``"file"``:
            ``segments.csv``, else the whole recording; ``"detect"``: detected flights only,
            ``segments.csv`` ignored.

    Returns:
        One :class:`Segment` per window of ``meta/segments.csv`` (``start <= t <= end``,
        measured timestamps) or per detected flight (``comment`` ``"detected free flight"``,
        ``index`` its number in the recording), or one per recording; ``omega`` in the PHONE's
        body frame (rad/s).

    Raises:
        DataError: no export found; missing columns; non-numeric cells; NaN/inf/empty rates
            inside a loaded window (or anywhere, without ``segments.csv``; rates outside
            every loaded window may be NaN); non-finite or non-increasing time; implausible
            units; a window with bad bounds, fewer than 2 samples, or outside the recording;
            nothing to load (a ``segments.csv`` with no rows, or all rows ``keep=false``; no
            flight detected with ``windows="detect"``); an unknown ``windows``.
            Messages name the file (``archive.zip/Raw Data.csv`` inside a zip), line and column.
    """
    if windows not in WINDOWS:
        raise DataError(f"windows must be one of {WINDOWS}; got {windows!r}")
    p = Path(path)
    if p.is_file() and p.suffix.lower() != ".zip":
        if p.name != RAW_DATA and not (p.suffix.lower() == ".csv" and (p.parent / "meta").is_dir()):
            raise DataError(f"{p}: not a phyphox export (expected a folder holding {RAW_DATA!r}, or its .zip)")
        p = p.parent
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    exports = _find_exports(p)
    if not exports:
        raise DataError(f"{p}: no phyphox export found (no {RAW_DATA!r} or meta/ folder in it or below it)")
    root = p if len(exports) > 1 or exports[0][1] != p else p.parent
    segments: list[Segment] = []
    empty = []
    try:
        for files, where in exports:
            segs, why = _load_export(files, _label(where, root), keep_only, time_unit, rate_unit, check_units, windows)
            segments.extend(segs)
            if why:
                empty.append(why)
    finally:
        for files, _ in exports:
            if files.archive is not None:
                files.archive.close()
    if not segments:
        raise DataError(f"{p}: no segments to load: " + "; ".join(empty))
    return segments
