"""ROS 1 and ROS 2 bags with ``sensor_msgs/msg/Imu`` messages, read through the ``rosbags``
package (optional: ``pip install 'rigidjax[ros]'``).

A bag is a rosbag2 folder (``metadata.yaml`` beside its sqlite3 ``.db3`` or ``.mcap`` storage
files), one ROS 2 storage file alone (a bare ``.mcap`` or ``.db3``), or a ROS 1 ``.bag`` file
(``sensor_msgs/Imu``: the same fields). A folder that is not a bag itself is searched for bags
in and below it (:func:`find_ros_bags`): each one found is a recording of its own, loaded in the
order of their paths, as folders of app exports are. One topic of type ``sensor_msgs/msg/Imu``
is read per bag (its only one, or the one named by ``topic``); of each message:

    header.stamp          sec + nanosec: the sample time (differenced as integer ns). When every
                          stamp is zero (drivers that leave the header empty) the bag's receive
                          time of each message is used instead
    angular_velocity      x, y, z, rad/s, in the IMU's frame (``header.frame_id``): the BODY frame
    orientation           x, y, z, w: the quaternion SCALAR LAST, IMU frame to the fixed frame;
                          reordered to the package's ``[w, x, y, z]`` (:mod:`rigidjax.so3`).
                          Absent (``orientation_covariance[0] == -1``, the message's own "no
                          estimate" mark, or all four zero) in every message: no orientation
    linear_acceleration   x, y, z, m/s^2, gravity included: the accelerometer test of the
                          free-flight detection (:mod:`rigidjax.io.detect`), where every message
                          carries a finite one (``linear_acceleration_covariance[0] != -1``)

Messages are taken in the bag's order. ``sensor_msgs/Imu`` is SI by definition: no unit options;
the plausibility check (:mod:`rigidjax.io.units`) still runs. A bag has no ``segments.csv``: its
windows are the free flights detected from the rate, as for app exports without one.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from ._base import DataError, Segment, walk_folder
from .detect import WINDOWS, cut_flights
from .rest import rest_reading
from .units import check_plausible

__all__ = [
    "IMU",
    "ROS_SUFFIXES",
    "ROS1_SUFFIX",
    "ROS_EXTRA",
    "is_ros_bag",
    "find_ros_bags",
    "has_ros_bags",
    "imu_topics",
    "load_ros",
]

#: the message type read (rosbags names ROS 1's ``sensor_msgs/Imu`` so too)
IMU = "sensor_msgs/msg/Imu"
#: a ROS 1 bag file
ROS1_SUFFIX = ".bag"
#: bag files read alone: ROS 2 storage files and ROS 1 bags
ROS_SUFFIXES = (".mcap", ".db3", ROS1_SUFFIX)
#: how to install what reading a bag needs
ROS_EXTRA = "pip install 'rigidjax[ros]'"
_METADATA = "metadata.yaml"
_BAG_KEY = "rosbag2_bagfile_information"  # the top-level key of a rosbag2 metadata.yaml
_UNIT_TOL = 1e-3  # |q| off 1 by more is refused (as the CSV loaders do)


def _is_rosbag2_folder(p: Path) -> bool:
    try:
        return _BAG_KEY in (p / _METADATA).read_text(errors="replace")
    except OSError:
        return False


def is_ros_bag(path) -> bool:
    """One bag: a rosbag2 folder (its ``metadata.yaml`` holds ``rosbag2_bagfile_information``),
    a ``.mcap`` / ``.db3`` file or a ROS 1 ``.bag`` file. Needs no ``rosbags``."""
    p = Path(path)
    if p.is_dir():
        return _is_rosbag2_folder(p)
    return p.is_file() and p.suffix.lower() in ROS_SUFFIXES


def find_ros_bags(path) -> list[Path]:
    """Every bag in or below ``path``, sorted by path: ``[path]`` where it is a bag itself;
    else the rosbag2 folders (their storage files are part of them, not bags of their own) and
    the ``.bag`` / ``.mcap`` / ``.db3`` files outside them. Symbolic links are followed (a bag
    or a folder of bags kept elsewhere is found), each real folder and file once: a link to an
    ancestor does not loop, and a link beside its target does not list the bag twice (the real
    path wins). Needs no ``rosbags``."""
    p = Path(path)
    if is_ros_bag(p):
        return [p]
    if not p.is_dir():
        return []
    found = []
    for here, dirs, files in walk_folder(p):  # symbolic links followed, each real folder and file once
        for d in list(dirs):
            if _is_rosbag2_folder(here / d):
                found.append(here / d)
                dirs.remove(d)  # its storage files belong to it
        found += [here / f for f in files if Path(f).suffix.lower() in ROS_SUFFIXES]
    return sorted(found, key=str)


def has_ros_bags(path) -> bool:
    """Whether ``path`` is a bag or a folder with one in or below it (:func:`find_ros_bags`)."""
    return bool(find_ros_bags(path))


def _is_ros1(p: Path) -> bool:
    return p.is_file() and p.suffix.lower() == ROS1_SUFFIX


def _rosbags(p: Path):
    """``(Reader, deserialize)`` of the installed ``rosbags`` for the bag ``p``; DataError
    naming the extra without it."""
    ros1 = _is_ros1(p)
    try:
        if ros1:
            from rosbags.rosbag1 import Reader
        else:
            from rosbags.rosbag2 import Reader
        from rosbags.typesys import Stores, get_typestore
    except ImportError:
        raise DataError(f"{p}: reading a {_kind(p)} needs the rosbags package: {ROS_EXTRA}") from None
    # sensor_msgs/Imu has had one layout in every ROS 1 and every ROS 2 release: the bag's own
    # definitions are not needed
    store = get_typestore(Stores.ROS1_NOETIC if ros1 else Stores.ROS2_HUMBLE)
    return Reader, store.deserialize_ros1 if ros1 else store.deserialize_cdr


def _kind(p: Path) -> str:
    return "ROS 1 bag" if _is_ros1(p) else "ROS 2 bag"


def _open(p: Path):
    Reader, deserialize = _rosbags(p)
    try:
        reader = Reader(p)
        reader.open()
    except Exception as e:  # rosbags' ReaderError, and sqlite3 / MCAP errors of a damaged file
        raise DataError(f"{p}: not a readable {_kind(p)} ({type(e).__name__}: {e})") from None
    return reader, deserialize


def _topics(reader) -> dict[str, str]:
    """``{topic: message type}`` of every connection, sorted by topic."""
    return dict(sorted((c.topic, c.msgtype) for c in reader.connections))


def imu_topics(path) -> list[str]:
    """The ``sensor_msgs/msg/Imu`` topics of a bag (sorted).

    Raises:
        DataError: not a readable bag; ``rosbags`` not installed (the message names the extra).
    """
    p = Path(path)
    reader, _ = _open(p)
    try:
        return [k for k, v in _topics(reader).items() if v == IMU]
    finally:
        reader.close()


def _choose(p: Path, topics: dict[str, str], topic: str | None) -> str:
    imus = [k for k, v in topics.items() if v == IMU]
    present = ", ".join(f"{k} ({v})" for k, v in topics.items()) or "none"
    if topic is not None:
        if topics.get(topic) == IMU:
            return topic
        if topic in topics:
            raise DataError(f"{p}: topic {topic!r} is {topics[topic]}, not {IMU}; its {IMU} topics: {imus or 'none'}")
        raise DataError(f"{p}: no topic {topic!r}; its {IMU} topics: {imus or 'none'}")
    if not imus:
        raise DataError(f"{p}: no {IMU} topic; the topics present: {present}")
    if len(imus) > 1:
        raise DataError(f"{p}: {len(imus)} {IMU} topics {imus}; choose one (topic=..., --topic)")
    return imus[0]


def _read(p: Path, topic: str | None):
    """``(topic, receive ns (n,), stamp ns (n,), rows (n, 12))`` of the chosen Imu topic; rows
    are ``angular_velocity xyz, orientation xyzw, orientation_covariance[0],
    linear_acceleration xyz, linear_acceleration_covariance[0]``."""
    reader, deserialize = _open(p)
    try:
        topic = _choose(p, _topics(reader), topic)
        where = f"{p}, topic {topic!r}"
        conns = [c for c in reader.connections if c.topic == topic]
        recv, stamp, rows = [], [], []
        i = 0
        try:
            for _, ns, raw in reader.messages(connections=conns):
                try:
                    m = deserialize(raw, IMU)
                except Exception as e:  # rosbags' SerdeError, or struct errors of a truncated message
                    raise DataError(
                        f"{where}, message {i}: cannot be decoded as {IMU} ({type(e).__name__}: {e})"
                    ) from None
                w, q, a = m.angular_velocity, m.orientation, m.linear_acceleration
                recv.append(ns)
                stamp.append(int(m.header.stamp.sec) * 1_000_000_000 + int(m.header.stamp.nanosec))
                rows.append(
                    (w.x, w.y, w.z, q.x, q.y, q.z, q.w, m.orientation_covariance[0])
                    + (a.x, a.y, a.z, m.linear_acceleration_covariance[0])
                )
                i += 1
        except DataError:
            raise
        except Exception as e:  # a damaged storage file, found while reading it
            raise DataError(f"{where}, message {i}: cannot be read ({type(e).__name__}: {e})") from None
    finally:
        reader.close()
    return topic, np.array(recv, dtype=np.int64), np.array(stamp, dtype=np.int64), np.array(rows, dtype=float)


def _first(bad: np.ndarray) -> int:
    return int(np.argmax(bad.any(axis=1) if bad.ndim == 2 else bad))


def load_ros(
    path,
    *,
    topic: str | None = None,
    check_units: bool = True,
    windows: str = "auto",
) -> list[Segment]:
    """Load the ``sensor_msgs/msg/Imu`` messages of a ROS 1 or ROS 2 bag, or of every bag in a
    folder (see the module).

    Args:
        path: a rosbag2 folder (with ``metadata.yaml``), a ``.mcap`` / ``.db3`` file, a ROS 1
            ``.bag`` file, or a folder holding any of them (searched recursively, symbolic links
            followed; each bag is a recording, in the order of their paths; :func:`find_ros_bags`).
        topic: the Imu topic to read (of every bag); default: each bag's only one.
        check_units: run :func:`rigidjax.io.units.check_plausible`.
        windows: ``auto`` (default): the detected free flights (:mod:`rigidjax.io.detect`),
            else the whole recording (warned); ``file``: the whole recording; ``detect``: the
            detected flights, none an error (in a folder: none in any bag).

    Returns:
        One :class:`Segment` per window: ``t`` ``(n,)`` float64 s since the topic's first
        message (``header.stamp``, or the receive time where every stamp is zero),
        ``omega`` ``(n, 3)`` rad/s in the IMU's (body) frame, ``orientation`` ``(n, 4)``
        ``[w, x, y, z]`` body to world, renormalised, or ``None`` (no message carries one, or
        not all: warned); ``source`` ``"PATH:TOPIC"``; ``name`` ``"BAG:TOPIC"`` (in a
        folder, BAG is the bag's path relative to it).

    Raises:
        DataError: ``rosbags`` not installed (the message names ``pip install 'rigidjax[ros]'``);
            not a readable bag; a folder without bags; no Imu topic (the topics present are
            listed), several without ``topic`` (they are listed), ``topic`` absent or not Imu;
            fewer than 2 messages; a message that does not decode, with NaN/inf rates or
            orientation, with ``|q|`` off 1 by more than 1e-3, with a zero stamp among non-zero
            ones, or a time not after the previous message's; implausible units. Messages name
            the bag and the topic and number the messages from 0 in bag order.
    """
    if windows not in WINDOWS:
        raise DataError(f"windows must be one of {WINDOWS}; got {windows!r}")
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    if is_ros_bag(p):
        segs, why = _load_bag(p, p.name, topic, check_units, windows)
        if why:
            raise DataError(why)
        return segs
    bags = find_ros_bags(p)
    if not bags:
        raise DataError(
            f"{p}: no ROS bag found in it or below it (a rosbag2 folder with its metadata.yaml, a .mcap or .db3 "
            "file, a ROS 1 .bag file)"
            if p.is_dir()
            else f"{p}: not a ROS bag (expected a rosbag2 folder, a .mcap, .db3 or ROS 1 .bag file)"
        )
    out, empty = [], []
    for bag in bags:
        segs, why = _load_bag(bag, bag.relative_to(p).as_posix(), topic, check_units, windows)
        out += segs
        if why:
            empty.append(why)
    if not out:
        raise DataError(f"{p}: no segments to load: " + "; ".join(empty))
    return out


def _load_bag(p: Path, name: str, topic, check_units, windows) -> tuple[list[Segment], str]:
    """The windows of one bag and, where there are none (``windows="detect"``), why."""
    topic, recv, stamp, rows = _read(p, topic)
    where = f"{p}, topic {topic!r}"
    n = len(rows)
    if n < 2:
        raise DataError(f"{where}: needs at least 2 messages; got {n}")
    if not stamp.any():
        ns, clock = recv, "receive time"
    elif not stamp.all():
        raise DataError(f"{where}, message {_first(stamp == 0)}: header.stamp is zero where other messages carry one")
    else:
        ns, clock = stamp, "header.stamp"
    step = np.diff(ns)
    if np.any(step <= 0):
        i = int(np.argmax(step <= 0)) + 1
        raise DataError(
            f"{where}, message {i}: time must be strictly increasing; its {clock} {ns[i]} ns follows {ns[i - 1]} ns"
        )
    t = (ns - ns[0]) * 1e-9
    omega = rows[:, 0:3]
    if not np.isfinite(omega).all():
        raise DataError(f"{where}, message {_first(~np.isfinite(omega))}: angular_velocity has NaN or inf")
    orientation = _orientation(rows[:, 3:8], where)
    accel = rows[:, 8:11]
    use_accel = np.isfinite(accel).all() and np.all(rows[:, 11] != -1)
    if check_units:
        check_plausible(t, omega, where)
    whole = Segment(t, omega, orientation, name=f"{name}:{topic}", source=f"{p}:{topic}", rest=rest_reading(t, omega))
    found = [] if windows == "file" else cut_flights(whole, accel=(t, accel) if use_accel else None)
    if not found and windows == "detect":
        return [], f"{where}: no free-flight window detected (rigidjax.io.detect)"
    if not found and windows == "auto":
        warnings.warn(
            f"{where}: no free-flight window detected (rigidjax.io.detect); the whole recording is one window",
            stacklevel=4,
        )
    return found or [whole], ""


def _orientation(cols: np.ndarray, where: str) -> np.ndarray | None:
    """``(n, 4)`` ``[w, x, y, z]`` from the messages' ``x, y, z, w, covariance[0]``, or ``None``."""
    xyzw, cov0 = cols[:, :4], cols[:, 4]
    present = (cov0 != -1) & np.any(xyzw != 0, axis=1)
    if not present.any():
        return None
    if not present.all():
        warnings.warn(
            f"{where}, message {_first(~present)}: no orientation (covariance[0] = -1 or all zero) where other "
            "messages carry one; the orientation is left out",
            stacklevel=5,
        )
        return None
    if not np.isfinite(xyzw).all():
        raise DataError(f"{where}, message {_first(~np.isfinite(xyzw))}: orientation has NaN or inf")
    norm = np.linalg.norm(xyzw, axis=1)
    bad = np.abs(norm - 1) > _UNIT_TOL
    if bad.any():
        i = _first(bad)
        raise DataError(f"{where}, message {i}: orientation is not a unit quaternion (|q| = {norm[i]:.6g})")
    return (xyzw / norm[:, None])[:, [3, 0, 1, 2]]
