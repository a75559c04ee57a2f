"""Plain CSV (any column names, through a column map and units), motion-capture poses, NPZ.

Column map: which header column holds each quantity, as ``{"t": "Time", "wx": "gx", ...}`` or
the command line's string ``"t=Time,wx=gx,wy=gy,wz=gz"``. Quantities (targets):

    t                      time (``time_unit``, default s)
    wx, wy, wz             body angular velocity (``rate_unit``, default rad/s)
    qw, qx, qy, qz         orientation quaternion, body to world (scalar first by name: map
                           scalar-last exports by naming their columns)
    r11 ... r33            orientation as a rotation matrix, body to world, row-major
                           (``R @ v_body = v_world``: the columns of R are the body axes in world)
    x, y, z                world position of the body origin (``length_unit``, default m)
    tau_x, tau_y, tau_z    known torque on the body, body frame, N m

A target left out of the map is read from the column of its own name, when there is one. A
source written ``-name`` is that column negated (axes that point the other way).
The separator (``,``, ``;``, tab) and a decimal comma are detected.
"""

from __future__ import annotations

import dataclasses

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from ._base import (
    DataError,
    Motion,
    Segment,
    _check_increasing,
    _numeric_columns,
    _read_table,
    _unit_quaternions,
    _where,
)
from .rest import rest_reading
from .units import check_plausible, unit_factor

__all__ = ["TARGETS", "parse_columns", "load_csv", "load_motion_csv", "load_npz", "csv_quantities"]

_OMEGA = ("wx", "wy", "wz")
_QUAT = ("qw", "qx", "qy", "qz")
_MATRIX = tuple(f"r{i}{j}" for i in (1, 2, 3) for j in (1, 2, 3))
_POS = ("x", "y", "z")
_TORQUE = ("tau_x", "tau_y", "tau_z")
#: every quantity a column map may name
TARGETS = ("t", *_OMEGA, *_QUAT, *_MATRIX, *_POS, *_TORQUE)


def parse_columns(spec) -> dict[str, str]:
    """A column map from ``"t=Time,wx=gx,..."`` (or a dict, checked the same way).

    Raises:
        DataError: an entry without ``=``, an unknown target (the known ones are listed), a
            target given twice.
    """
    if spec is None:
        return {}
    if isinstance(spec, dict):
        items = list(spec.items())
    else:
        items = []
        for part in str(spec).split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise DataError(f"--columns: expected TARGET=COLUMN entries separated by commas; got {part.strip()!r}")
            k, v = part.split("=", 1)
            items.append((k, v))
    out: dict[str, str] = {}
    for k, v in items:
        k, v = str(k).strip(), str(v).strip()
        if k not in TARGETS:
            raise DataError(f"--columns: unknown quantity {k!r}; expected one of {', '.join(TARGETS)}")
        if k in out:
            raise DataError(f"--columns: {k!r} is given twice")
        if not v:
            raise DataError(f"--columns: {k}= names no column")
        out[k] = v
    return out


def _resolve(df: pd.DataFrame, label: str, columns: dict) -> dict[str, tuple[str, float]]:
    """``target -> (header column, sign)`` for every target present."""
    cols = set(df.columns)
    found = {}
    for target in TARGETS:
        src = columns.get(target)
        if src is None:
            if target in cols:
                found[target] = (target, 1.0)
            continue
        if src in cols:
            found[target] = (src, 1.0)
        elif src.startswith("-") and src[1:].strip() in cols:
            found[target] = (src[1:].strip(), -1.0)
        else:
            raise DataError(
                f"{_where(label, 1)}: the column map gives {target}={src}, but the header has no column {src!r}; "
                f"it has {list(df.columns)}"
            )
    return found


def _group(df, label, found, field, names, required=False) -> np.ndarray | None:
    present = [n for n in names if n in found]
    missing = [n for n in names if n not in found]
    if required and missing:
        raise DataError(
            f"{_where(label, 1)}: missing column(s) {missing}; the header has {list(df.columns)} "
            f"(name the {field} columns with --columns {','.join(n + '=NAME' for n in missing)})"
        )
    if not present:
        return None
    if missing:
        raise DataError(f"{_where(label, 1)}: {field} needs all of {list(names)}; found only {present}")
    cols = [found[n][0] for n in names]
    signs = np.array([found[n][1] for n in names])
    return _numeric_columns(df, label, cols) * signs


def _matrix_to_quaternion(R: np.ndarray, label: str, column: str) -> np.ndarray:
    """``(n, 3, 3)`` rotation matrices -> ``(n, 4)`` quaternions ``[w, x, y, z]``, sign-continuous.

    Raises:
        DataError: a matrix off orthonormal by more than 1e-3 (max entry of ``R^T R - I``) or a
            reflection (det < 0), naming its line.
    """
    from scipy.spatial.transform import Rotation

    err = np.abs(np.einsum("nki,nkj->nij", R, R) - np.eye(3)).max(axis=(1, 2))
    det = np.linalg.det(R)
    bad = (err > 1e-3) | (det < 0)
    if bad.any():
        i = int(np.argmax(bad))
        why = f"det = {det[i]:.4g} (a reflection)" if det[i] < 0 else f"max |R^T R - I| = {err[i]:.3g}"
        raise DataError(f"{_where(label, i + 2, column)}: not a rotation matrix ({why}); expected r11..r33 row-major")
    xyzw = Rotation.from_matrix(R).as_quat()
    q = np.concatenate([xyzw[:, 3:], xyzw[:, :3]], axis=1)
    # q and -q are the same rotation: keep neighbours on the same side
    flips = np.concatenate([[1.0], np.sign(np.einsum("ni,ni->n", q[1:], q[:-1]))])
    flips[flips == 0] = 1.0
    return q * np.cumprod(flips)[:, None]


def _read_quantities(path, columns, time_unit, rate_unit, length_unit, min_rows, gyro=False) -> dict:
    """Every quantity of a CSV as SI arrays (``None`` where absent), ``label`` and ``header``."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file")
    label = str(p)
    df = _read_table(p)
    found = _resolve(df, label, parse_columns(columns))
    if "t" not in found:
        raise DataError(
            f"{_where(label, 1)}: missing column(s) ['t']; the header has {list(df.columns)} "
            "(name the time column with --columns t=NAME)"
        )
    if len(df) < min_rows:
        raise DataError(f"{p}: needs at least {min_rows} rows of samples; got {len(df)}")
    tcol = found["t"][0]
    t = _numeric_columns(df, label, [tcol])[:, 0] * unit_factor("time", time_unit)
    _check_increasing(t, label, tcol)
    out = {"t": t, "label": label, "header": list(df.columns)}
    omega = _group(df, label, found, "angular velocity", _OMEGA, required=gyro)
    out["omega"] = None if omega is None else omega * unit_factor("rate", rate_unit)
    q = _group(df, label, found, "orientation", _QUAT)
    R = _group(df, label, found, "orientation matrix", _MATRIX)
    if q is not None and R is not None:
        raise DataError(f"{_where(label, 1)}: both a quaternion (qw..qz) and a rotation matrix (r11..r33): give one")
    if q is not None:
        norm = np.linalg.norm(q, axis=-1)
        q = np.where(np.abs(norm - 1)[:, None] > 1e-9, _unit_quaternions(q, label, found["qw"][0]), q)
    elif R is not None:
        q = _matrix_to_quaternion(R.reshape(-1, 3, 3), label, found["r11"][0])
    out["orientation"] = q
    pos = _group(df, label, found, "position", _POS)
    out["position"] = None if pos is None else pos * unit_factor("length", length_unit)
    out["torque"] = _group(df, label, found, "torque", _TORQUE)
    return out


def csv_quantities(path, columns=None) -> set[str] | None:
    """The quantities a CSV's header provides (``{"t", "omega", "orientation", "position",
    "torque"}`` subsets) after the column map, from its first line only; ``None`` when it cannot
    be read. For routing (the command line sends pose and torque files to the general fit)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            header = f.readline()
    except (OSError, UnicodeDecodeError):
        return None
    sep = "\t" if "\t" in header else ";" if ";" in header else ","
    names = {c.strip().strip('"').strip() for c in header.split(sep)}
    try:
        cmap = parse_columns(columns)
    except DataError:
        return None
    have = {k for k in TARGETS if k in names or (k in cmap and cmap[k].lstrip("-").strip() in names)}
    groups = (("t", "t"), ("omega", "wx"), ("position", "x"), ("torque", "tau_x"))
    out = {k for k, first in groups if first in have}
    if "qw" in have or "r11" in have:
        out.add("orientation")
    return out


def load_csv(
    path,
    *,
    columns=None,
    time_unit: str | None = None,
    rate_unit: str | None = None,
    length_unit: str | None = None,
    check_units: bool = True,
) -> list[Segment]:
    """Load a CSV of one gyroscope segment, any column names (module docs: the column map).

    Needs ``t`` and ``wx, wy, wz``; optional orientation (``qw..qz`` or ``r11..r33``) and
    position ``x, y, z``. Optional groups must be complete. Quaternions are renormalised
    within 1e-3 (exports round them); rows already unit to 1e-9 are kept as written.

    Args:
        path: the CSV (separator ``,``/``;``/tab, decimal point or comma).
        columns: column map (dict or ``"t=Time,wx=gx,..."``).
        time_unit, rate_unit, length_unit: units of the file (default s, rad/s, m).
        check_units: :func:`rigidjax.io.units.check_plausible` (deg/s rates, ms timestamps).

    Returns:
        ``[Segment]`` in s, rad/s, m.

    Raises:
        DataError: missing columns, a map naming an absent column, incomplete optional
            groups, non-numeric/NaN cells, non-increasing time, fewer than 2 rows, non-unit
            quaternions or non-rotation matrices, implausible units (file, line, column named).
    """
    d = _read_quantities(path, columns, time_unit, rate_unit, length_unit, 2, gyro=True)
    if check_units:
        check_plausible(d["t"], d["omega"], d["label"])
    p = Path(path)
    extra = {k: d[k] for k in ("orientation", "position")}
    rest = rest_reading(d["t"], d["omega"])
    return [Segment(d["t"], d["omega"], name=p.stem, source=str(p), rest=rest, **extra)]


def load_motion_csv(
    path,
    *,
    columns=None,
    time_unit: str | None = None,
    rate_unit: str | None = None,
    length_unit: str | None = None,
    check_units: bool = True,
) -> Motion:
    """Load a CSV of one recording with whatever it measured: gyroscope, motion-capture poses
    (quaternion or rotation matrix, position), known torques (module docs: the column map).

    Needs ``t`` and at least one of ``wx, wy, wz`` (body angular velocity), an orientation
    (``qw, qx, qy, qz`` or ``r11..r33``, body to world: motion capture or an attitude filter)
    and ``x, y, z`` (world position); optional ``tau_x, tau_y, tau_z`` (known torque on the
    body, body frame, N m). Every group must be complete. Quaternions are renormalised within
    1e-3; rotation matrices must be orthonormal within 1e-3 and are turned into quaternions
    (sign-continuous).

    Args:
        path: the CSV. columns, time_unit, rate_unit, length_unit, check_units: as
            :func:`load_csv` (a pose-only file gets the time-step check only).

    Returns:
        :class:`Motion` in s, rad/s, m, N m.

    Raises:
        DataError: no measured group, incomplete groups, non-numeric/NaN cells,
            non-increasing time, non-unit quaternions, non-rotation matrices, implausible
            units, fewer than 3 rows (file, line, column).
    """
    d = _read_quantities(path, columns, time_unit, rate_unit, length_unit, 3)
    if all(d[k] is None for k in ("omega", "orientation", "position")):
        raise DataError(
            f"{_where(d['label'], 1)}: no measured quantity: give wx,wy,wz (rad/s), qw,qx,qy,qz or r11..r33, "
            f"or x,y,z (m) besides t (or map them with --columns); the columns are {d['header']}"
        )
    if check_units:
        check_plausible(d["t"], d["omega"], d["label"])
    arrays = {k: d[k] for k in ("omega", "orientation", "position", "torque")}
    for v in [d["t"], *arrays.values()]:
        if v is not None:
            v.setflags(write=False)
    return Motion(t=d["t"], source=str(path), **arrays)


def load_npz(path, *, check_units: bool = True) -> list[Segment]:
    """Load an NPZ of one segment: keys ``t`` (n,) s, ``omega`` (n, 3) rad/s; optional
    ``orientation`` (n, 4), ``position`` (n, 3), ``comment`` (str).

    Raises:
        DataError: missing keys, wrong shapes, NaN, non-increasing time (the key is named),
            implausible units (:func:`rigidjax.io.units.check_plausible`).
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
        seg = Segment(name=p.stem, source=str(p), comment=comment, **arrays)
    except DataError as e:
        # Segment names itself (p.stem); name the file once instead
        msg = str(e).removeprefix(f"{p.stem}: ")
        raise DataError(f"{p}: {msg}") from None
    if check_units:
        check_plausible(seg.t, seg.omega, str(p))
    seg = dataclasses.replace(seg, rest=rest_reading(seg.t, seg.omega))
    return [seg]
