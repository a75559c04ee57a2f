"""Loaders for measured motion: phyphox gyroscope exports, plain CSV, NPZ.

Every loader returns a list of :class:`Segment`: one free-motion window each, with the
MEASURED timestamps (nothing is resampled; models are compared at these times) and the
angular velocity in the sensor's BODY frame.

phyphox ("Gyroscope rotation rate" experiment, https://phyphox.org) exports one folder per
recording::

    <name>/Raw Data.csv      "Time (s)","Gyroscope x (rad/s)","Gyroscope y (rad/s)",
                             "Gyroscope z (rad/s)","Absolute (rad/s)"
    <name>/meta/time.csv     START/PAUSE events (experiment time, s)
    <name>/meta/device.csv   app and phone
    <name>/meta/segments.csv (optional, written by the experimenter, not by phyphox)
                             segment,start,end,keep,comment

``segments.csv`` lists hand-picked windows in experiment time (s); ``keep`` false drops a
window, empty ``keep`` keeps it. Without ``segments.csv`` the whole recording is one segment.

Malformed input raises :class:`DataError` (a ``ValueError``) naming the file, the line
(1-based, the header is line 1) and the column.
"""

from __future__ import annotations

import dataclasses
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["DataError", "Segment", "Motion", "load", "load_phyphox", "load_csv", "load_npz", "load_motion_csv"]

RAW_DATA = "Raw Data.csv"
#: phyphox's column names of the "Gyroscope rotation rate" experiment (Raw Data.csv).
PHYPHOX_TIME = "Time (s)"
PHYPHOX_GYRO = ("Gyroscope x (rad/s)", "Gyroscope y (rad/s)", "Gyroscope z (rad/s)")
PHYPHOX_ABS = "Absolute (rad/s)"

_TRUE = {"", "true", "1", "yes", "y", "t", "keep"}
_FALSE = {"false", "0", "no", "n", "f", "drop"}


class DataError(ValueError):
    """A malformed measurement file or window; the message names the file, line and column."""


def _where(path, line=None, column=None) -> str:
    s = f"{path}"
    if line is not None:
        s += f", line {line}"
    if column is not None:
        s += f", column {column!r}"
    return s


@dataclasses.dataclass(frozen=True, eq=False)
class Segment:
    """One window of measured rigid-body motion (numpy float64, measured timestamps).

    Attributes:
        t: ``(n,)`` sample times, s (experiment time of the recording, strictly increasing,
            not resampled; ``n >= 2``).
        omega: ``(n, 3)`` angular velocity in the sensor's BODY frame, rad/s.
        orientation: ``(n, 4)`` unit quaternions ``[w, x, y, z]`` body to world, or ``None``.
        position: ``(n, 3)`` position in the WORLD frame, m, or ``None``.
        name: human-readable label (recording and window number).
        source: the file (or export folder) it came from.
        index: the window's ``segment`` number in ``segments.csv`` (``None`` for whole files).
        comment: the window's comment (e.g. ``"Intermediate axis rotation"``).
        keep: ``False`` for windows that ``segments.csv`` marks as discarded (only returned
            with ``load_phyphox(..., keep_only=False)``).

    Raises:
        DataError: inconsistent shapes, NaN/inf, fewer than 2 samples, non-increasing time.
    """

    t: np.ndarray
    omega: np.ndarray
    orientation: np.ndarray | None = None
    position: np.ndarray | None = None
    name: str = ""
    source: str = ""
    index: int | None = None
    comment: str = ""
    keep: bool = True

    def __post_init__(self):
        where = self.name or self.source or "Segment"
        t = np.asarray(self.t, dtype=float)
        omega = np.asarray(self.omega, dtype=float)
        if t.ndim != 1:
            raise DataError(f"{where}: t must have shape (n,); got {t.shape}")
        n = t.shape[0]
        if n < 2:
            raise DataError(f"{where}: a segment needs at least 2 samples; got {n} (empty or one-sample window)")
        if omega.shape != (n, 3):
            raise DataError(f"{where}: omega must have shape ({n}, 3); got {omega.shape}")
        arrays = {"t": t, "omega": omega}
        for field, size in (("orientation", 4), ("position", 3)):
            v = getattr(self, field)
            if v is not None:
                v = np.asarray(v, dtype=float)
                if v.shape != (n, size):
                    raise DataError(f"{where}: {field} must have shape ({n}, {size}); got {v.shape}")
                arrays[field] = v
        for field, v in arrays.items():
            bad = ~np.isfinite(v)
            if bad.any():
                i = int(np.argwhere(bad)[0][0])
                raise DataError(f"{where}: {field} has NaN or inf at sample {i} (t index)")
        dt = np.diff(t)
        if np.any(dt <= 0):
            i = int(np.argmax(dt <= 0))
            raise DataError(
                f"{where}: time must be strictly increasing; "
                f"t[{i + 1}] = {float(t[i + 1])!r} <= t[{i}] = {float(t[i])!r}"
            )
        if "orientation" in arrays:
            norm = np.linalg.norm(arrays["orientation"], axis=-1)
            if np.any(np.abs(norm - 1) > 1e-6):
                i = int(np.argmax(np.abs(norm - 1) > 1e-6))
                raise DataError(
                    f"{where}: orientation must be unit quaternions [w, x, y, z]; |q| = {norm[i]} at sample {i}"
                )
        for field, v in arrays.items():
            v.setflags(write=False)
            object.__setattr__(self, field, v)

    @property
    def n(self) -> int:
        """Number of samples."""
        return int(self.t.shape[0])

    @property
    def duration(self) -> float:
        """``t[-1] - t[0]``, s."""
        return float(self.t[-1] - self.t[0])

    @property
    def dt(self) -> np.ndarray:
        """``(n - 1,)`` sample intervals, s."""
        return np.diff(self.t)

    def __repr__(self) -> str:
        extra = "".join(f", {f}" for f in ("orientation", "position") if getattr(self, f) is not None)
        return (
            f"Segment({self.name!r}, n={self.n}, t=[{self.t[0]:.3f}, {self.t[-1]:.3f}] s{extra}"
            f"{', comment=' + repr(self.comment) if self.comment else ''}{'' if self.keep else ', keep=False'})"
        )


# ----------------------------------------------------------------------------- helpers


def _read_table(path: Path, **kw) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, skipinitialspace=True, dtype=str, keep_default_na=False, **kw)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: the file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a readable CSV file ({e})") from None
    df.columns = [str(c).strip() for c in df.columns]
    return df.apply(lambda col: col.str.strip())


def _bad_cell(raw: pd.Series, path: Path, i: int, col: str) -> DataError:
    cell = raw.iloc[i]
    what = (
        "empty cell"
        if cell == ""
        else ("NaN/inf sample" if cell.lower() in _NONFINITE else f"non-numeric cell {cell!r}")
    )
    return DataError(f"{_where(path, i + 2, col)}: {what}")


_NONFINITE = ("nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity")


def _numeric_columns(df: pd.DataFrame, path: Path, columns, *, allow_empty=False, allow_nonfinite=False) -> np.ndarray:
    """Columns as float64 ``(n, len(columns))``; DataError naming line/column on bad cells.

    ``allow_nonfinite``: empty and NaN/inf cells become NaN (the caller checks the samples it
    uses, see :func:`_check_finite`); text that is not a number is still an error.
    """
    out = np.empty((len(df), len(columns)))
    for j, col in enumerate(columns):
        raw = df[col]
        num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(num)
        if allow_empty:
            bad &= raw.to_numpy() != ""
        if allow_nonfinite:
            cells = raw.str.lower().to_numpy()
            bad &= (cells != "") & ~np.isin(cells, _NONFINITE)
            num = np.where(np.isfinite(num), num, np.nan)
        if bad.any():
            raise _bad_cell(raw, path, int(np.argmax(bad)), col)
        out[:, j] = num
    return out


def _check_finite(df: pd.DataFrame, values: np.ndarray, rows: np.ndarray, path: Path, columns) -> None:
    """DataError naming the first line/column among ``rows`` (indices) whose value is not finite."""
    bad = ~np.isfinite(values[rows])
    if bad.any():
        k, j = np.argwhere(bad)[0]
        raise _bad_cell(df[columns[j]], path, int(rows[k]), columns[j])


def _require_columns(df: pd.DataFrame, path: Path, required) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataError(f"{_where(path, 1)}: missing column(s) {missing}; the header has {list(df.columns)}")


def _check_increasing(t: np.ndarray, path: Path, column: str, first_line: int = 2) -> None:
    dt = np.diff(t)
    if np.any(dt <= 0):
        i = int(np.argmax(dt <= 0)) + 1
        raise DataError(
            f"{_where(path, i + first_line, column)}: time must be strictly increasing; "
            f"{float(t[i])!r} s follows {float(t[i - 1])!r} s"
        )


def _parse_keep(value: str, path: Path, line: int) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise DataError(f"{_where(path, line, 'keep')}: expected true/false or empty (kept); got {value!r}")


# ----------------------------------------------------------------------------- phyphox


def _find_exports(path: Path) -> list[Path]:
    if (path / RAW_DATA).is_file():
        return [path]
    found = sorted({p.parent for p in path.rglob(RAW_DATA) if p.is_file()}, key=lambda p: str(p))
    return found


def _read_phyphox_raw(csv: Path, allow_nonfinite: bool = False) -> tuple[np.ndarray, np.ndarray, pd.DataFrame]:
    """Time (finite, increasing) and rates; ``allow_nonfinite``: NaN/empty rates left for the windows to check."""
    df = _read_table(csv)
    _require_columns(df, csv, (PHYPHOX_TIME, *PHYPHOX_GYRO))
    if len(df) < 2:
        raise DataError(f"{csv}: needs at least 2 samples; got {len(df)}")
    t = _numeric_columns(df, csv, [PHYPHOX_TIME])[:, 0]
    _check_increasing(t, csv, PHYPHOX_TIME)
    omega = _numeric_columns(df, csv, list(PHYPHOX_GYRO), allow_nonfinite=allow_nonfinite)
    return t, omega, df


def _pause_times(export: Path) -> np.ndarray:
    """Experiment times of PAUSE events (the data jump there); empty where time.csv is absent."""
    f = export / "meta" / "time.csv"
    if not f.is_file():
        return np.empty(0)
    try:
        df = _read_table(f)
    except DataError:
        return np.empty(0)
    if "event" not in df.columns or "experiment time" not in df.columns:
        return np.empty(0)
    sel = df["event"].str.upper() == "PAUSE"
    return pd.to_numeric(df.loc[sel, "experiment time"], errors="coerce").dropna().to_numpy(float)


def _label(export: Path, root: Path) -> str:
    try:
        rel = export.relative_to(root)
        return str(rel) if str(rel) != "." else export.name
    except ValueError:
        return export.name


def _load_export(export: Path, root: Path, keep_only: bool) -> tuple[list[Segment], str]:
    """The export's segments and, where there are none, why (for the caller's error)."""
    csv = export / RAW_DATA
    seg_file = export / "meta" / "segments.csv"
    # with windows, only the samples inside the loaded windows need to be finite
    t, omega, raw = _read_phyphox_raw(csv, allow_nonfinite=seg_file.is_file())
    label = _label(export, root)
    if not seg_file.is_file():
        return [Segment(t, omega, name=label, source=str(csv), index=None, comment="")], ""
    df = _read_table(seg_file)
    _require_columns(df, seg_file, ("start", "end"))
    pauses = _pause_times(export)
    out = []
    for i, row in enumerate(df.itertuples(index=False)):
        line = i + 2
        rec = dict(zip(df.columns, row))
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
        _check_finite(raw, omega, np.flatnonzero(sel), csv, list(PHYPHOX_GYRO))
        tw = t[sel]
        inside = pauses[(pauses > tw[0]) & (pauses < tw[-1])]  # samples on both sides of a pause
        if inside.size:
            warnings.warn(
                f"{_where(seg_file, line)}: window [{start}, {end}] s spans a recording pause at "
                f"{inside[0]:.3f} s (time.csv); the motion is discontinuous there",
                stacklevel=3,
            )
        out.append(
            Segment(
                t[sel],
                omega[sel],
                name=f"{label} #{index}",
                source=str(csv),
                index=index,
                comment=comment,
                keep=keep,
            )
        )
    if out:
        why = ""
    elif len(df) == 0:
        why = f"{seg_file} lists no windows"
    else:
        why = f"all {len(df)} windows in {seg_file} are marked keep=false"
    return out, why


def load_phyphox(path, *, keep_only: bool = True) -> list[Segment]:
    """Load phyphox "Gyroscope rotation rate" exports.

    Args:
        path: an export folder (holding ``Raw Data.csv`` and ``meta/``), a parent folder
            holding many (searched recursively, sorted by path), or a ``Raw Data.csv`` file.
            Spaces in paths are fine.
        keep_only: drop windows whose ``keep`` is false in ``meta/segments.csv`` (default).
            With ``False`` they are returned too (``Segment.keep = False``) where they have
            valid bounds.

    Returns:
        One :class:`Segment` per window of ``meta/segments.csv`` (``start <= t <= end``,
        measured timestamps), or one per recording without ``segments.csv``; ``omega`` in
        the PHONE's body frame (rad/s).

    Raises:
        DataError: no export found; missing columns; non-numeric cells; NaN/inf/empty rates
            inside a loaded window (or anywhere, without ``segments.csv``; rates outside
            every loaded window may be NaN); non-finite or non-increasing time; a window with
            bad bounds, fewer than 2 samples, or outside the recording; nothing to load (a
            ``segments.csv`` with no rows, or all rows ``keep=false``). Messages name the file,
            line and column.
    """
    p = Path(path)
    if p.is_file():
        if p.name != RAW_DATA:
            raise DataError(f"{p}: not a phyphox export (expected a folder holding {RAW_DATA!r})")
        p = p.parent
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    exports = _find_exports(p)
    if not exports:
        raise DataError(f"{p}: no phyphox export found (no {RAW_DATA!r} in it or below it)")
    root = p if len(exports) > 1 or exports[0] != p else p.parent
    segments: list[Segment] = []
    empty = []
    for e in exports:
        segs, why = _load_export(e, root, keep_only)
        segments.extend(segs)
        if why:
            empty.append(why)
    if not segments:
        raise DataError(f"{p}: no segments to load: " + "; ".join(empty))
    return segments


# ----------------------------------------------------------------------------- CSV / NPZ

_CSV_OMEGA = ("wx", "wy", "wz")
_CSV_QUAT = ("qw", "qx", "qy", "qz")
_CSV_POS = ("x", "y", "z")


def load_csv(path) -> list[Segment]:
    """Load a plain CSV of one segment.

    Columns (header required, any order, whitespace tolerated): ``t`` (s), ``wx, wy, wz``
    (body angular velocity, rad/s); optional ``qw, qx, qy, qz`` (orientation, body to world)
    and ``x, y, z`` (world position, m). Optional groups must be complete.

    Returns:
        ``[Segment]``.

    Raises:
        DataError: missing columns, incomplete optional groups, non-numeric/NaN cells,
            non-increasing time, fewer than 2 rows (file, line and column named).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    df = _read_table(p)
    _require_columns(df, p, ("t", *_CSV_OMEGA))
    if len(df) < 2:
        raise DataError(f"{p}: needs at least 2 rows of samples; got {len(df)}")
    t = _numeric_columns(df, p, ["t"])[:, 0]
    _check_increasing(t, p, "t")
    omega = _numeric_columns(df, p, list(_CSV_OMEGA))
    extra = {}
    for field, cols in (("orientation", _CSV_QUAT), ("position", _CSV_POS)):
        present = [c for c in cols if c in df.columns]
        if present and len(present) < len(cols):
            raise DataError(f"{_where(p, 1)}: {field} needs all of {list(cols)}; found only {present}")
        if present:
            extra[field] = _numeric_columns(df, p, list(cols))
    if "orientation" in extra:
        norm = np.linalg.norm(extra["orientation"], axis=-1)
        bad = np.abs(norm - 1) > 1e-6
        if bad.any():
            i = int(np.argmax(bad))
            raise DataError(f"{_where(p, i + 2, 'qw')}: orientation is not a unit quaternion (|q| = {norm[i]})")
    return [Segment(t, omega, name=p.stem, source=str(p), **extra)]


_CSV_TORQUE = ("tau_x", "tau_y", "tau_z")


@dataclasses.dataclass(frozen=True)
class Motion:
    """One recording of motion for :func:`rigidjax.identify.fit` (numpy float64, read-only).

    Attributes:
        t: ``(n,)`` sample times, s, strictly increasing.
        omega: ``(n, 3)`` body angular velocity, rad/s, or ``None``.
        orientation: ``(n, 4)`` unit quaternions ``[w, x, y, z]`` body to world, or ``None``.
        position: ``(n, 3)`` WORLD position, m, or ``None``.
        torque: ``(n, 3)`` known applied torque in the BODY frame, N m, or ``None`` (held
            from each sample to the next; the last row is not used).
        source: the file.
    """

    t: np.ndarray
    omega: np.ndarray | None
    orientation: np.ndarray | None
    position: np.ndarray | None
    torque: np.ndarray | None
    source: str = ""

    @property
    def kinds(self) -> list[str]:
        """The measured quantities present (``omega``, ``orientation``, ``position``)."""
        return [k for k in ("omega", "orientation", "position") if getattr(self, k) is not None]


def load_motion_csv(path) -> Motion:
    """Load a CSV of one recording with whatever it measured.

    Columns (header required, any order): ``t`` (s) and at least one of ``wx, wy, wz`` (body
    angular velocity, rad/s), ``qw, qx, qy, qz`` (orientation, body to world: motion capture
    or an attitude filter) and ``x, y, z`` (world position, m); optional ``tau_x, tau_y,
    tau_z`` (known torque on the body, body frame, N m). Every group must be complete.
    Quaternions are renormalised (exports round them); ``|q|`` off 1 by more than 1e-3 is refused.

    Raises:
        DataError: no measured group, incomplete groups, non-numeric/NaN cells,
            non-increasing time, non-unit quaternions, fewer than 3 rows (file, line, column).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    df = _read_table(p)
    _require_columns(df, p, ("t",))
    if len(df) < 3:
        raise DataError(f"{p}: needs at least 3 rows of samples; got {len(df)}")
    t = _numeric_columns(df, p, ["t"])[:, 0]
    _check_increasing(t, p, "t")
    out = {}
    groups = (("omega", _CSV_OMEGA), ("orientation", _CSV_QUAT), ("position", _CSV_POS), ("torque", _CSV_TORQUE))
    for field, cols in groups:
        present = [c for c in cols if c in df.columns]
        if present and len(present) < len(cols):
            raise DataError(f"{_where(p, 1)}: {field} needs all of {list(cols)}; found only {present}")
        out[field] = _numeric_columns(df, p, list(cols)) if present else None
    if all(out[k] is None for k in ("omega", "orientation", "position")):
        raise DataError(
            f"{_where(p, 1)}: no measured quantity: give wx,wy,wz (rad/s), qw,qx,qy,qz or x,y,z (m) "
            f"besides t; the columns are {list(df.columns)}"
        )
    if out["orientation"] is not None:
        # exports round to a few decimals: renormalised within 1e-3, refused beyond
        norm = np.linalg.norm(out["orientation"], axis=-1)
        bad = np.abs(norm - 1) > 1e-3
        if bad.any():
            i = int(np.argmax(bad))
            raise DataError(f"{_where(p, i + 2, 'qw')}: orientation is not a unit quaternion (|q| = {norm[i]})")
        out["orientation"] = out["orientation"] / norm[:, None]
    for v in [t, *out.values()]:
        if v is not None:
            v.setflags(write=False)
    return Motion(t=t, source=str(p), **out)


def load_npz(path) -> list[Segment]:
    """Load an NPZ of one segment: keys ``t`` (n,), ``omega`` (n, 3); optional
    ``orientation`` (n, 4), ``position`` (n, 3), ``comment`` (str).

    Raises:
        DataError: missing keys, wrong shapes, NaN, non-increasing time (the key is named).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    if not zipfile.is_zipfile(p):
        raise DataError(
            f"{p}: not a valid NPZ file (an NPZ is a zip archive of .npy arrays, as written by numpy.savez)"
        )
    try:
        z = np.load(p, allow_pickle=False)
    except Exception as e:  # numpy raises several types for corrupt archives
        raise DataError(f"{p}: not a readable NPZ archive ({e})") from None
    with z:
        missing = [k for k in ("t", "omega") if k not in z.files]
        if missing:
            raise DataError(f"{p}: missing key(s) {missing}; the archive has {z.files}")
        arrays = {}
        for k in ("t", "omega", "orientation", "position"):
            if k in z.files:
                a = z[k]
                if not np.issubdtype(a.dtype, np.number):
                    raise DataError(f"{p}, key {k!r}: expected numbers; got dtype {a.dtype}")
                bad = ~np.isfinite(a.astype(float))
                if bad.any():
                    raise DataError(f"{p}, key {k!r}: NaN or inf at index {tuple(int(i) for i in np.argwhere(bad)[0])}")
                arrays[k] = a.astype(float)
        comment = str(z["comment"]) if "comment" in z.files else ""
    t = arrays["t"]
    if t.ndim == 1 and t.size >= 2:
        dt = np.diff(t)
        if np.any(dt <= 0):
            i = int(np.argmax(dt <= 0)) + 1
            raise DataError(
                f"{p}, key 't': time must be strictly increasing; "
                f"t[{i}] = {float(t[i])!r} <= t[{i - 1}] = {float(t[i - 1])!r}"
            )
    try:
        return [Segment(name=p.stem, source=str(p), comment=comment, **arrays)]
    except DataError as e:
        # Segment names itself (p.stem); name the file once instead
        msg = str(e).removeprefix(f"{p.stem}: ")
        raise DataError(f"{p}: {msg}") from None


def load(path, **kw) -> list[Segment]:
    """Load segments from ``path``, dispatching on what it is.

    A folder -> :func:`load_phyphox`; ``Raw Data.csv`` -> :func:`load_phyphox` on its folder;
    another ``.csv`` -> :func:`load_csv`; ``.npz`` -> :func:`load_npz`. ``kw`` goes to
    :func:`load_phyphox` (``keep_only``).

    Raises:
        DataError: the path does not exist, has an unknown suffix, or is malformed.
    """
    p = Path(path)
    if p.is_dir():
        return load_phyphox(p, **kw)
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    if p.name == RAW_DATA:
        return load_phyphox(p, **kw)
    suffix = p.suffix.lower()
    if suffix == ".csv":
        return load_csv(p)
    if suffix == ".npz":
        return load_npz(p)
    raise DataError(f"{p}: unknown file type {p.suffix!r} (expected a phyphox folder, .csv or .npz)")
