"""Loaders for measured motion: phone apps' exports, ROS bags, plain CSV, motion capture, NPZ.

Every gyroscope loader returns a list of :class:`Segment`: one free-motion window each, with
the MEASURED timestamps (nothing is resampled; models are compared at these times) and the
angular velocity in the sensor's BODY frame, in s and rad/s. Formats:

- **phyphox** ("Gyroscope rotation rate"; :mod:`rigidjax.io.phyphox`): export folders or the
  app's ``.zip``, in all five CSV dialects it writes (comma / tab / semicolon separators,
  decimal point or comma), translated column names too; windows from ``meta/segments.csv``,
  or, without it, the free flights detected from the rate (:mod:`rigidjax.io.detect`).
- **Sensor Logger** (:mod:`rigidjax.io.sensorlogger`): folders or zips with ``Gyroscope.csv``
  (``time`` ns, ``seconds_elapsed``, ``z,y,x`` rad/s); ``Orientation.csv`` quaternions through
  :func:`load_sensor_logger_motion`.
- **ROS 1 and ROS 2 bags** (:mod:`rigidjax.io.ros`, optional extra ``rigidjax[ros]``):
  rosbag2 folders (sqlite3 ``.db3`` or MCAP storage), a bare ``.mcap`` / ``.db3`` file, ROS 1
  ``.bag`` files, folders of any of them (each bag a recording); one ``sensor_msgs/msg/Imu``
  topic per bag (``angular_velocity``; ``orientation``, stored scalar last, as
  ``[w, x, y, z]``); windows: the detected free flights.
- **Any CSV** (:mod:`rigidjax.io.table`): a column map (``columns="t=Time,wx=gx,..."``) and
  units (``time_unit`` s/ms/us/ns, ``rate_unit`` rad/s or deg/s, ``length_unit`` m/cm/mm).
- **Motion capture / pose CSV** (:func:`load_motion_csv` -> :class:`Motion`): time +
  quaternion or rotation matrix (+ position, + gyroscope, + known torques).
- **NPZ**: ``t``, ``omega`` (+ ``orientation``, ``position``).

Units are checked at load time (:mod:`rigidjax.io.units`): a rotation per sample above 1 rad
or a median time step of 1 s or more is refused with a :class:`DataError` naming the likely
unit (deg/s, ms, ...) and the flag that fixes it. Malformed input raises :class:`DataError` (a
``ValueError``) naming the file (``archive.zip/inner/file.csv`` inside zips), the line (1-based,
the header is line 1) and the column.

Writing: :func:`replacing` gives a temporary path that becomes the file only when complete (the
command line's outputs and :func:`rigidjax.report.write_report` use it).
"""

from __future__ import annotations

from pathlib import Path

from ._base import DataError, Motion, Segment, replacing, walk_folder
from .detect import DETECTED, WINDOWS, Flight, cut_flights, describe_windows, detect_flights
from .phyphox import PHYPHOX_ABS, PHYPHOX_GYRO, PHYPHOX_TIME, RAW_DATA, has_phyphox, is_phyphox_zip, load_phyphox
from .rest import Rest, rest_reading
from .ros import IMU, ROS_EXTRA, find_ros_bags, has_ros_bags, imu_topics, is_ros_bag, load_ros
from .sensorlogger import GYROSCOPE, ORIENTATION, is_sensor_logger, load_sensor_logger, load_sensor_logger_motion
from .table import TARGETS, csv_quantities, load_csv, load_motion_csv, load_npz, parse_columns
from .units import LENGTH_UNITS, RATE_UNITS, TIME_UNITS, check_plausible

__all__ = [
    "DataError",
    "replacing",
    "Segment",
    "Motion",
    "load",
    "load_phyphox",
    "load_sensor_logger",
    "load_sensor_logger_motion",
    "load_ros",
    "is_ros_bag",
    "find_ros_bags",
    "has_ros_bags",
    "imu_topics",
    "load_csv",
    "load_motion_csv",
    "load_npz",
    "detect_flights",
    "cut_flights",
    "describe_windows",
    "Flight",
    "Rest",
    "rest_reading",
    "DETECTED",
    "WINDOWS",
    "parse_columns",
    "csv_quantities",
    "check_plausible",
    "TARGETS",
    "TIME_UNITS",
    "RATE_UNITS",
    "LENGTH_UNITS",
    "RAW_DATA",
    "PHYPHOX_TIME",
    "PHYPHOX_GYRO",
    "PHYPHOX_ABS",
    "GYROSCOPE",
    "ORIENTATION",
    "IMU",
    "ROS_EXTRA",
]


def _has_sensor_logger(p: Path) -> bool:
    """A Sensor Logger export, or a folder with one (folder or zip) in or below it, symbolic
    links followed as :func:`load_sensor_logger` follows them."""
    return is_sensor_logger(p) or any(
        GYROSCOPE in files or any(is_sensor_logger(here / f) for f in files if f.endswith(".zip"))
        for here, _, files in walk_folder(p)
    )


def load(
    path,
    *,
    keep_only: bool = True,
    columns=None,
    time_unit: str | None = None,
    rate_unit: str | None = None,
    length_unit: str | None = None,
    check_units: bool = True,
    windows: str = "auto",
    topic: str | None = None,
) -> list[Segment]:
    """Load gyroscope segments from ``path``, dispatching on what it is.

    A folder -> every phyphox export (:func:`load_phyphox`), every Sensor Logger export
    (:func:`load_sensor_logger`) and every ROS bag (:func:`load_ros`) in or below it, in this
    order; a ``.zip`` -> the export it holds; ``Raw Data.csv`` -> :func:`load_phyphox` on its
    folder; ``Gyroscope.csv`` -> :func:`load_sensor_logger` on its folder; a ROS bag (a folder
    whose ``metadata.yaml`` is rosbag2's, a ``.mcap`` or ``.db3`` file, a ROS 1 ``.bag`` file)
    -> :func:`load_ros` (its Imu topic ``topic``, needs ``pip install 'rigidjax[ros]'``);
    another ``.csv`` -> :func:`load_csv` (with
    ``columns``, ``length_unit``); ``.npz`` -> :func:`load_npz`. ``time_unit``/``rate_unit``
    override the format's units; ``check_units`` runs :func:`rigidjax.io.units.check_plausible`.

    ``windows`` (app exports): ``"auto"`` (default) cuts the windows of ``segments.csv`` or,
    without it, the free flights detected from the rate (:func:`detect_flights`; comment
    :data:`DETECTED`, listed by :func:`describe_windows`), else keeps the whole recording
    (warned); ``"file"``: ``segments.csv`` or the whole recording; ``"detect"``: detected
    flights even where ``segments.csv`` exists. A plain CSV or NPZ is one window except with
    ``"detect"``.

    Raises:
        DataError: the path does not exist, holds no recording, has an unknown suffix, or is
            malformed; ``columns``/``length_unit`` given for a format that has fixed columns;
            ``topic`` given for a path that is not a ROS bag or holds none; ``time_unit``/
            ``rate_unit`` for a NPZ or a bag (s and rad/s by definition).
    """
    if windows not in WINDOWS:
        raise DataError(f"windows must be one of {WINDOWS}; got {windows!r}")
    segs = _load(Path(path), keep_only, columns, time_unit, rate_unit, length_unit, check_units, windows, topic)
    if windows == "detect" and any(s.comment != DETECTED for s in segs):  # plain CSV / NPZ: whole files
        segs = [w for s in segs for w in (cut_flights(s) if s.comment != DETECTED else [s])]
        if not segs:
            raise DataError(f"{path}: no free-flight window detected (rigidjax.io.detect)")
    return segs


def _load(p: Path, keep_only, columns, time_unit, rate_unit, length_unit, check_units, windows, topic) -> list[Segment]:
    units = dict(time_unit=time_unit, rate_unit=rate_unit, check_units=check_units)
    apps = dict(keep_only=keep_only, windows=windows, **units)
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    is_csv = p.is_file() and p.suffix.lower() == ".csv"
    generic = is_csv and p.name not in (RAW_DATA, GYROSCOPE)
    if (columns or length_unit) and not generic:
        raise DataError(
            f"{p}: --columns and --length-unit apply to a plain CSV file; this is "
            + ("a folder" if p.is_dir() else "an app export, ROS bag or NPZ")
            + " with fixed columns"
        )
    ros = is_ros_bag(p)
    bags = ros or (p.is_dir() and has_ros_bags(p))
    if topic is not None and not bags:
        raise DataError(
            f"{p}: --topic applies to a ROS bag (a rosbag2 folder, .mcap, .db3 or .bag) or a folder of them; "
            "this is neither"
        )
    if ros:
        if time_unit or rate_unit:
            raise DataError(f"{p}: a ROS bag is in s and rad/s; --time-unit and --rate-unit apply to CSV files")
        return load_ros(p, topic=topic, check_units=check_units, windows=windows)
    if p.is_dir():
        segs: list[Segment] = []
        phyphox = has_phyphox(p)
        sensor_logger = _has_sensor_logger(p)
        if phyphox:
            segs += load_phyphox(p, **apps)
        if sensor_logger:
            segs += load_sensor_logger(p, **apps)
        if bags:
            if (time_unit or rate_unit) and not (phyphox or sensor_logger):
                raise DataError(f"{p}: its ROS bags are in s and rad/s; --time-unit and --rate-unit apply to CSV files")
            segs += load_ros(p, topic=topic, check_units=check_units, windows=windows)
        if not (phyphox or sensor_logger or bags):
            raise DataError(
                f"{p}: no recording found: no phyphox export ({RAW_DATA!r} or meta/), no Sensor Logger export "
                f"({GYROSCOPE!r}) in it, below it or in a .zip, and no ROS bag (a rosbag2 folder with its "
                "metadata.yaml, a .mcap, .db3 or .bag file)"
            )
        return segs
    suffix = p.suffix.lower()
    if suffix == ".zip":
        if is_phyphox_zip(p):
            return load_phyphox(p, **apps)
        if is_sensor_logger(p):
            return load_sensor_logger(p, **apps)
        raise DataError(f"{p}: a zip without a phyphox export ({RAW_DATA!r}) or a Sensor Logger one ({GYROSCOPE!r})")
    if p.name == RAW_DATA:
        return load_phyphox(p, **apps)
    if p.name == GYROSCOPE:
        return load_sensor_logger(p.parent, **apps)
    if suffix == ".csv":
        return load_csv(p, columns=columns, length_unit=length_unit, **units)
    if suffix == ".npz":
        if time_unit or rate_unit:
            raise DataError(f"{p}: an NPZ is in s and rad/s; --time-unit and --rate-unit apply to CSV files")
        return load_npz(p, check_units=check_units)
    raise DataError(
        f"{p}: unknown file type {p.suffix!r} (expected a phyphox or Sensor Logger folder or .zip, a ROS 2 bag "
        "folder, .mcap or .db3, a ROS 1 .bag, a .csv or a .npz)"
    )
