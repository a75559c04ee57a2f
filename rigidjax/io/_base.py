"""What every loader shares: :class:`DataError`, :class:`Segment`, :class:`Motion`, reading a
CSV in any of the dialects phone apps write (separator ``,``/``;``/tab, decimal point or comma)
from a folder or a zip archive, and cell checks that name file, line and column."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shutil
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
import pandas as pd

from .rest import Rest

_TRUE = {"", "true", "1", "yes", "y", "t", "keep"}
_FALSE = {"false", "0", "no", "n", "f", "drop"}
_NONFINITE = ("nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity")


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
        rest: what the gyroscope reads while the body lies still in the window's whole
            recording (:class:`rigidjax.io.rest.Rest`: the measured bias), or ``None`` where the
            body never lies still there (the loaders fill it: :func:`rigidjax.io.rest.rest_reading`).

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
    rest: Rest | None = None

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
        if self.rest is not None and not isinstance(self.rest, Rest):
            raise DataError(f"{where}: rest must be a rigidjax.io.rest.Rest or None; got {type(self.rest).__name__}")
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
        if self.rest is not None:
            extra += f", at rest {self.rest.duration:.3g} s"
        return (
            f"Segment({self.name!r}, n={self.n}, t=[{self.t[0]:.3f}, {self.t[-1]:.3f}] s{extra}"
            f"{', comment=' + repr(self.comment) if self.comment else ''}{'' if self.keep else ', keep=False'})"
        )


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


# ----------------------------------------------------------------------------- folders and zips


class _Files:
    """A folder or a zip archive (optionally a folder inside it): read files by relative path
    (``/``-separated) and label them for messages (``archive.zip/inner/Raw Data.csv``)."""

    def __init__(self, root: Path, archive: zipfile.ZipFile | None = None, prefix: str = ""):
        self.root = root
        self.archive = archive
        self.prefix = prefix.strip("/")

    @classmethod
    def open_zip(cls, path: Path) -> zipfile.ZipFile:
        try:
            return zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as e:
            raise DataError(f"{path}: not a readable zip archive ({e})") from None

    def _member(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def exists(self, rel: str) -> bool:
        if self.archive is None:
            return (self.root / rel).is_file()
        return self._member(rel) in self.archive.NameToInfo

    def read(self, rel: str) -> bytes:
        if self.archive is None:
            try:
                return (self.root / rel).read_bytes()
            except FileNotFoundError:
                raise DataError(f"{self.label(rel)}: file not found") from None
        try:
            return self.archive.read(self._member(rel))
        except KeyError:
            raise DataError(f"{self.label(rel)}: file not found in the archive") from None
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError) as e:
            raise DataError(f"{self.label(rel)}: cannot be read from the archive ({e})") from None

    def label(self, rel: str = "") -> str:
        if self.archive is None:
            return str(self.root / rel) if rel else str(self.root)
        inner = self._member(rel)
        return f"{self.root}/{inner}" if inner else str(self.root)

    def listing(self) -> list[str]:
        """Relative paths of every file (sorted)."""
        if self.archive is None:
            return sorted(str(p.relative_to(self.root).as_posix()) for p in self.root.rglob("*") if p.is_file())
        pre = self.prefix + "/" if self.prefix else ""
        return sorted(n[len(pre) :] for n in self.archive.namelist() if n.startswith(pre) and not n.endswith("/"))


def _zip_dirs(archive: zipfile.ZipFile, filename: str) -> list[str]:
    """Folders (``""`` for the root) inside ``archive`` holding a file named ``filename``;
    macOS's ``__MACOSX/`` resource copies are skipped."""
    out = []
    for n in archive.namelist():
        p = PurePosixPath(n)
        if p.name == filename and not n.startswith("__MACOSX/"):
            out.append(str(p.parent) if str(p.parent) != "." else "")
    return sorted(set(out))


def walk_folder(path: Path):
    """``(folder, subfolder names, file names)`` of ``path`` and of every folder below it, as
    ``os.walk`` (top-down; names sorted; a caller may prune the subfolder list in place),
    but following symbolic links: a recording kept elsewhere and linked into the searched folder
    is found as a real one (``Path.rglob`` does not enter linked folders on Python 3.11).

    Each real folder and file is listed once, and the real path wins: a link to a folder or
    file really below ``path`` is skipped (so a link to an ancestor does not loop, and a link
    beside its target does not load it twice); of several links to one folder or file outside
    ``path``, the first met (names in sorted order, depth first) is listed. "File names" are the
    entries that are not folders, as ``os.walk`` gives them, less broken links (a link whose
    target is gone is no recording: one must not abort a whole search)."""
    top = os.fspath(path)
    tree = list(os.walk(top))  # what really lies below path: linked folders are not entered
    mine_dirs = {os.path.realpath(root) for root, _, _ in tree}
    mine_files = {
        os.path.realpath(os.path.join(r, f)) for r, _, fs in tree for f in fs if not os.path.islink(os.path.join(r, f))
    }
    really = {top}  # folders reached without a link on the way
    seen: set[str] = set()  # the real paths of what a link reached

    def new(root: str, names: list[str], mine: set[str]) -> list[str]:
        out = []
        for name in sorted(names):
            full = os.path.join(root, name)
            if root in really and not os.path.islink(full):
                out.append(name)  # really below path: its own
                continue
            target = os.path.realpath(full)
            if target not in mine and target not in seen:  # else a loop, or reached already
                seen.add(target)
                out.append(name)
        return out

    for root, dirs, files in os.walk(top, followlinks=True):
        dirs[:] = new(root, dirs, mine_dirs)
        if root in really:
            really.update(os.path.join(root, d) for d in dirs if not os.path.islink(os.path.join(root, d)))
        yield Path(root), dirs, [f for f in new(root, files, mine_files) if os.path.exists(os.path.join(root, f))]


# ----------------------------------------------------------------------------- reading tables

_DECIMAL_COMMA = re.compile(r"^[+-]?\d+,\d*(?:[eE][+-]?\d+)?$")


def _decode(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        try:
            return data.decode("cp1252")  # spreadsheets on Windows
        except UnicodeDecodeError as e:
            raise DataError(f"{label}: not a text file ({e})") from None


def _sniff(text: str, label: str) -> tuple[str, str]:
    """``(separator, decimal)`` of a CSV: the separator is the first of tab, ``;``, ``,`` found
    in the header line; a decimal comma is recognised in the data lines (only with tab or
    ``;`` separators: phyphox's "CSV (Tabulator|Semicolon, decimal comma)" exports)."""
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise DataError(f"{label}: the file is empty (or its first line is)")
    header = lines[0]
    sep = "\t" if "\t" in header else ";" if ";" in header else ","
    decimal = "."
    if sep != ",":
        for line in lines[1:50]:
            cells = [c.strip().strip('"') for c in line.split(sep)]
            if any(_DECIMAL_COMMA.match(c) for c in cells):
                decimal = ","
                break
    return sep, decimal


def _read_table(path, *, label: str | None = None, data: bytes | None = None, sniff: bool = True) -> pd.DataFrame:
    """A CSV as strings (whitespace stripped), from ``path`` or from ``data`` (bytes); with
    ``sniff`` the separator and decimal mark are detected (:func:`_sniff`) and decimal commas
    turned into points. ``df.attrs['dialect']`` says what was read, e.g. ``';' + decimal ','``."""
    label = str(path) if label is None else label
    if data is None:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise DataError(f"{label}: file not found") from None
        except IsADirectoryError:
            raise DataError(f"{label}: is a folder, not a CSV file") from None
    text = _decode(data, label)
    if not text.strip():
        raise DataError(f"{label}: the file is empty")
    sep, decimal = _sniff(text, label) if sniff else (",", ".")
    try:
        df = pd.read_csv(
            io.StringIO(text), sep=sep, skipinitialspace=True, dtype=str, keep_default_na=False, skip_blank_lines=False
        )
    except pd.errors.EmptyDataError:
        raise DataError(f"{label}: the file is empty") from None
    except pd.errors.ParserError as e:
        raise DataError(f"{label}: not a readable CSV file ({e})") from None
    df.columns = [str(c).strip().strip('"').strip() for c in df.columns]
    df = df.apply(lambda col: col.str.strip())
    # blank lines are kept above (line numbers stay true); trailing ones are dropped here
    blank = (df == "").all(axis=1).to_numpy()
    n = len(df)
    while n and blank[n - 1]:
        n -= 1
    df = df.iloc[:n]
    if decimal == ",":
        df = df.apply(lambda col: col.str.replace(",", ".", regex=False))
    df.attrs["dialect"] = f"separator {'tab' if sep == chr(9) else repr(sep)}, decimal {decimal!r}"
    df.attrs["label"] = label
    return df


def _bad_cell(raw: pd.Series, path, i: int, col: str) -> DataError:
    cell = raw.iloc[i]
    what = (
        "empty cell"
        if cell == ""
        else ("NaN/inf sample" if cell.lower() in _NONFINITE else f"non-numeric cell {cell!r}")
    )
    return DataError(f"{_where(path, i + 2, col)}: {what}")


def _numeric_columns(df: pd.DataFrame, path, columns, *, allow_empty=False, allow_nonfinite=False) -> np.ndarray:
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


def _check_finite(df: pd.DataFrame, values: np.ndarray, rows: np.ndarray, path, columns) -> None:
    """DataError naming the first line/column among ``rows`` (indices) whose value is not finite."""
    bad = ~np.isfinite(values[rows])
    if bad.any():
        k, j = np.argwhere(bad)[0]
        raise _bad_cell(df[columns[j]], path, int(rows[k]), columns[j])


def _require_columns(df: pd.DataFrame, path, required) -> None:
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise DataError(f"{_where(path, 1)}: missing column(s) {missing}; the header has {list(df.columns)}")


def _check_increasing(t: np.ndarray, path, column: str, first_line: int = 2) -> None:
    dt = np.diff(t)
    if np.any(dt <= 0):
        i = int(np.argmax(dt <= 0)) + 1
        raise DataError(
            f"{_where(path, i + first_line, column)}: time must be strictly increasing; "
            f"{float(t[i])!r} s follows {float(t[i - 1])!r} s"
        )


def _parse_keep(value: str, path, line: int) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise DataError(f"{_where(path, line, 'keep')}: expected true/false or empty (kept); got {value!r}")


def _unit_quaternions(q: np.ndarray, path, column: str, *, tol: float = 1e-3) -> np.ndarray:
    """Rows of ``q`` renormalised; a row whose norm is off 1 by more than ``tol`` is refused
    naming its line (exports round quaternions to a few decimals)."""
    norm = np.linalg.norm(q, axis=-1)
    bad = np.abs(norm - 1) > tol
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(f"{_where(path, i + 2, column)}: orientation is not a unit quaternion (|q| = {norm[i]:.6g})")
    return q / norm[:, None]


@contextlib.contextmanager
def replacing(path):
    """A temporary path beside ``path`` (same folder and suffix: matplotlib reads the format
    from it), moved onto ``path`` (``os.replace``, atomic) only when the block ends without an
    exception: an interrupted (Ctrl-C) or failed write leaves no partial file under the final
    name, and a file already there stays as it was (its replacement takes its permission
    bits). A path that is not a regular file (a device such as ``/dev/null``, a pipe, a
    symbolic link) is written in place."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        # a device (/dev/null, /dev/stdout), a pipe or a link: written in place, never replaced
        yield path
        return
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.part{path.suffix}")
    try:
        yield tmp
        if path.is_file():  # the replacement keeps the file's permissions
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        try:
            tmp.unlink()
        except OSError:  # moved into place, or never written
            pass
