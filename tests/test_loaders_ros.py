"""ROS 1 and ROS 2 bags (``rigidjax.io.ros``, the optional extra ``rigidjax[ros]``): every bag
is written here with rosbags' own writers and serializers (never a real recording copied in), in
sqlite3 and MCAP storage and as ROS 1 ``.bag`` files, and read back through ``rigidjax.io.load``:
header stamps (or receive times), body rates, the scalar-last quaternion reordered, free-flight
windows, folders of bags; malformed bags are refused naming the file, the topic and the message.
Skipped without ``rosbags`` (except the check that its absence names the extra)."""

import json
import shutil
import sys

import numpy as np
import pytest

from rigidjax import reference, so3
from rigidjax.cli import main
from rigidjax.io import (
    DETECTED,
    IMU,
    DataError,
    find_ros_bags,
    has_ros_bags,
    imu_topics,
    is_ros_bag,
    load,
    load_ros,
)

INERTIA = np.array([1.0, 2.0, 2.6])  # torque-free flight about the intermediate axis: a flip
T0_NS = 1_735_689_600_123_456_789  # the header stamps' epoch, ns
RATE = 200.0  # Hz
REST, FLIGHT = 0.6, 1.0  # s held still before and after, s in flight


@pytest.fixture
def rosbags():
    return pytest.importorskip("rosbags", reason="ROS 2 bags need the optional extra: pip install 'rigidjax[ros]'")


def _recording(seed=0):
    """Rest, a torque-free flight (exact rates and attitude, a non-trivial start attitude), rest;
    the rates with white noise of 2e-3 rad/s.

    Returns ``t`` (n,) s from 0, ``omega`` (n, 3) rad/s, ``q`` (n, 4) ``[w, x, y, z]`` body to
    world, ``f`` (n, 3) specific force m/s^2 (gravity at rest, 0 in flight), ``flight`` mask."""
    rng = np.random.default_rng(seed)
    n = int((2 * REST + FLIGHT) * RATE)
    t = np.arange(n) / RATE + rng.uniform(-1e-4, 1e-4, n)
    t -= t[0]
    flight = (t >= REST) & (t < REST + FLIGHT)
    q0 = np.array([0.8, 0.1, -0.5, 0.3])
    q0 /= np.linalg.norm(q0)
    tf = t[flight] - t[flight][0]
    omega = rng.normal(0, 2e-3, (n, 3))
    omega[flight] += reference.torque_free_omega(INERTIA, np.array([0.3, 6.0, 0.2]), tf)  # + gyro noise
    q = np.empty((n, 4))
    q[flight] = reference.torque_free_orientation(INERTIA, np.array([0.3, 6.0, 0.2]), q0, tf)
    q[: np.argmax(flight)] = q0
    q[np.argmax(flight) + flight.sum() :] = q[flight][-1]
    f = np.where(flight[:, None], 0.0, [0.0, 0.0, 9.81])
    return t, omega, q, f, flight


def _imu_messages(T, data, *, zero_stamps=False, nan_at=None, no_orientation=False, ros1=False):
    """``(receive ns, sensor_msgs/Imu)`` of ``data = (t, omega, q, f)`` (``q`` ``[w, x, y, z]``
    written x, y, z, w): stamps ``T0_NS + t``, received in the order written (whatever the stamps
    say) ~2 ms later with a jitter; ``nan_at = (message, axis)`` puts NaN in one rate;
    ``no_orientation``: the message's "no estimate" mark (zero quaternion, covariance[0] = -1)."""
    received = np.sort(data[0])
    for i, (ti, w, q, f) in enumerate(zip(*data)):
        stamp = T0_NS + round(ti * 1e9)
        recv = T0_NS + round(received[i] * 1e9) + 2_000_000 + 37_000 * (i % 3)  # plus a jittered latency
        w = w.copy()
        if nan_at is not None and nan_at[0] == i:
            w[nan_at[1]] = np.nan
        sec, nsec = divmod(0 if zero_stamps else stamp, 1_000_000_000)
        if no_orientation:
            q = np.zeros(4)
        q_cov = np.zeros(9)
        q_cov[0] = -1.0 if no_orientation else 0.0
        time = T["builtin_interfaces/msg/Time"](sec=sec, nanosec=nsec)  # ROS 1's secs, nsecs in rosbags
        header = T["std_msgs/msg/Header"](**({"seq": i} if ros1 else {}), stamp=time, frame_id="imu_link")
        yield (
            recv,
            T[IMU](
                header=header,
                orientation=T["geometry_msgs/msg/Quaternion"](x=q[1], y=q[2], z=q[3], w=q[0]),
                orientation_covariance=q_cov,
                angular_velocity=T["geometry_msgs/msg/Vector3"](x=w[0], y=w[1], z=w[2]),
                angular_velocity_covariance=np.zeros(9),
                linear_acceleration=T["geometry_msgs/msg/Vector3"](x=f[0], y=f[1], z=f[2]),
                linear_acceleration_covariance=np.zeros(9),
            ),
        )


def _write_bag(path, topics, *, storage="mcap", zero_stamps=False, bad=None, no_orientation=False):
    """A rosbag2 folder at ``path``: ``topics`` ``{name: (t, omega, q, f)}`` as
    ``sensor_msgs/msg/Imu`` (:func:`_imu_messages`), or ``{name: None}`` for a
    ``std_msgs/msg/String`` topic; ``bad = (topic, message, axis)`` puts NaN in one rate."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    plugin = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}[storage]
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        _write_topics(
            writer, store, topics, store.serialize_cdr, bad, zero_stamps=zero_stamps, no_orientation=no_orientation
        )
    return path


def _write_topics(writer, store, topics, serialize, bad, cut=None, **kw):
    """Write ``topics`` (see :func:`_write_bag`) through an open rosbags ``writer``;
    ``serialize(msg, msgtype)`` is the bag's serialization; ``cut`` see :func:`_write_bag1`."""
    T = store.types
    for name, data in topics.items():
        if data is None:
            conn = writer.add_connection(name, "std_msgs/msg/String", typestore=store)
            writer.write(conn, T0_NS, serialize(T["std_msgs/msg/String"](data="hi"), conn.msgtype))
            continue
        conn = writer.add_connection(name, IMU, typestore=store)
        nan_at = bad[1:] if bad is not None and bad[0] == name else None
        for i, (recv, msg) in enumerate(_imu_messages(T, data, nan_at=nan_at, **kw)):
            raw = bytes(serialize(msg, IMU))
            writer.write(conn, recv, raw[:50] if cut == (name, i) else raw)


def _write_bag1(path, topics, *, zero_stamps=False, bad=None, cut=None):
    """A ROS 1 ``.bag`` file at ``path`` (rosbags' rosbag1 writer, ROS 1 serialization of
    ``sensor_msgs/Imu``): ``topics`` as :func:`_write_bag`; ``bad = (topic, message, axis)``
    puts NaN in one rate; ``cut = (topic, message)`` stores that message truncated."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    with Writer(path) as writer:
        _write_topics(writer, store, topics, store.serialize_ros1, bad, cut, zero_stamps=zero_stamps, ros1=True)
    return path


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_bag_folder_and_storage_file(rosbags, tmp_path, storage):
    t, omega, q, f, flight = _recording()
    bag = _write_bag(tmp_path / "run 1", {"/imu/data": (t, omega, q, f)}, storage=storage)
    assert is_ros_bag(bag) and imu_topics(bag) == ["/imu/data"]
    (seg,) = load(bag)  # the detected free flight (no segments.csv), as for app exports
    assert seg.comment == DETECTED and seg.source == f"{bag}:/imu/data" and seg.name == "run 1:/imu/data #0"
    i0 = int(np.argmin(np.abs(t - seg.t[0])))
    sel = slice(i0, i0 + seg.n)
    # header stamps in s since the first one: the written times to their 1 ns resolution
    np.testing.assert_allclose(seg.t, t[sel], rtol=0, atol=2e-9)
    assert np.all(flight[sel]) and seg.duration > FLIGHT - 0.1
    np.testing.assert_array_equal(seg.omega, omega[sel])  # float64 in the message: exact, rad/s
    # orientation stored x, y, z, w in the message, [w, x, y, z] here (a non-trivial attitude:
    # a scalar left last, or a conjugate, would not match)
    np.testing.assert_allclose(seg.orientation, q[sel], rtol=0, atol=1e-15)
    assert abs(seg.orientation[0, 0]) < 0.9
    # and the package's convention (so3: body to world, omega in the body frame) holds:
    # q_i^-1 q_i+1 turns the body by the rate over the step
    step = np.asarray(so3.log(so3.multiply(so3.conjugate(seg.orientation[:-1]), seg.orientation[1:])))
    rate = step / seg.dt[:, None]
    np.testing.assert_allclose(rate, 0.5 * (seg.omega[1:] + seg.omega[:-1]), atol=2e-3 * np.abs(omega).max())
    # the whole recording on request; the storage file alone (a bare .mcap / .db3) reads the same
    (whole,) = load(bag, windows="file")
    np.testing.assert_allclose(whole.t, t, rtol=0, atol=2e-9)
    (storage_file,) = [p for p in bag.iterdir() if p.suffix in (".mcap", ".db3")]
    bare = shutil.copy(storage_file, tmp_path / f"bare{storage_file.suffix}")
    (alone,) = load(bare, windows="file")
    np.testing.assert_array_equal(alone.omega, whole.omega)
    np.testing.assert_array_equal(alone.orientation, whole.orientation)


def test_zero_stamps_and_no_orientation(rosbags, tmp_path):
    """Stamps all zero: the bag's receive times; orientation marked absent: ``None``."""
    t, omega, q, f, _ = _recording()
    bag = _write_bag(tmp_path / "b", {"/imu": (t, omega, q, f)}, zero_stamps=True, no_orientation=True)
    (seg,) = load(bag, windows="file")
    latency = 2e-3 + 37e-6 * (np.arange(len(t)) % 3)
    np.testing.assert_allclose(seg.t, (t + latency) - latency[0], rtol=0, atol=2e-9)
    assert seg.orientation is None
    np.testing.assert_array_equal(seg.omega, omega)


def test_topics_chosen_or_listed(rosbags, tmp_path):
    t, omega, q, f, _ = _recording()
    two = _write_bag(tmp_path / "two", {"/imu/a": (t, omega, q, f), "/imu/b": (t, -omega, q, f), "/chatter": None})
    with pytest.raises(DataError, match=r"two: 2 sensor_msgs/msg/Imu topics \['/imu/a', '/imu/b'\]; choose one"):
        load(two)
    (b,) = load(two, topic="/imu/b", windows="file")
    np.testing.assert_array_equal(b.omega, -omega)
    with pytest.raises(DataError, match=r"two: topic '/chatter' is std_msgs/msg/String, not sensor_msgs/msg/Imu"):
        load(two, topic="/chatter")
    with pytest.raises(DataError, match=r"two: no topic '/imu/c'; its sensor_msgs/msg/Imu topics: \['/imu/a', "):
        load(two, topic="/imu/c")
    none = _write_bag(tmp_path / "none", {"/chatter": None}, storage="sqlite3")
    with pytest.raises(DataError, match=r"none: no sensor_msgs/msg/Imu topic; the topics present: /chatter \(std_msgs"):
        load(none)


def test_malformed_bags(rosbags, tmp_path):
    t, omega, q, f, _ = _recording()
    nan = _write_bag(tmp_path / "nan", {"/imu": (t, omega, q, f)}, bad=("/imu", 7, 1))
    with pytest.raises(DataError, match=r"nan, topic '/imu', message 7: angular_velocity has NaN or inf"):
        load(nan)
    back = _write_bag(tmp_path / "back", {"/imu": (t[[0, 1, 3, 2, 4]], omega[:5], q[:5], f[:5])})
    with pytest.raises(DataError, match=r"back, topic '/imu', message 3: time must be strictly increasing"):
        load(back)
    slack = _write_bag(tmp_path / "slack", {"/imu": (t, omega, 1.01 * q, f)})
    with pytest.raises(DataError, match=r"slack, topic '/imu', message 0: orientation is not a unit quaternion"):
        load(slack)
    junk = tmp_path / "junk.mcap"
    junk.write_bytes(b"not a bag")
    with pytest.raises(DataError, match=r"junk.mcap: not a readable ROS 2 bag"):
        load(junk)
    with pytest.raises(DataError, match=r"a ROS bag is in s and rad/s"):
        load(nan, rate_unit="deg/s")


def test_ros1_bag(rosbags, tmp_path):
    """A ROS 1 ``.bag`` (ROS 1 serialization, a header with ``seq``) reads as a ROS 2 bag does:
    header stamps, exact rates, the scalar-last quaternion reordered to ``[w, x, y, z]``."""
    t, omega, q, f, flight = _recording(seed=1)
    bag = _write_bag1(tmp_path / "flip.bag", {"/imu/data": (t, omega, q, f), "/chatter": None})
    assert is_ros_bag(bag) and imu_topics(bag) == ["/imu/data"] and find_ros_bags(bag) == [bag]
    (seg,) = load(bag)  # the detected free flight
    assert seg.comment == DETECTED and seg.source == f"{bag}:/imu/data" and seg.name == "flip.bag:/imu/data #0"
    i0 = int(np.argmin(np.abs(t - seg.t[0])))
    sel = slice(i0, i0 + seg.n)
    np.testing.assert_allclose(seg.t, t[sel], rtol=0, atol=2e-9)
    assert np.all(flight[sel]) and seg.duration > FLIGHT - 0.1
    np.testing.assert_array_equal(seg.omega, omega[sel])
    np.testing.assert_allclose(seg.orientation, q[sel], rtol=0, atol=1e-15)
    assert abs(seg.orientation[0, 0]) < 0.9  # not the identity: a scalar left last would not match
    # the known motion: q_i^-1 q_i+1 turns the body by the measured rate over the step
    step = np.asarray(so3.log(so3.multiply(so3.conjugate(seg.orientation[:-1]), seg.orientation[1:])))
    rate = step / seg.dt[:, None]
    np.testing.assert_allclose(rate, 0.5 * (seg.omega[1:] + seg.omega[:-1]), atol=2e-3 * np.abs(omega).max())
    # stamps all zero: the receive times (the bag's own time of each message)
    zero = _write_bag1(tmp_path / "zero.bag", {"/imu": (t, omega, q, f)}, zero_stamps=True)
    (whole,) = load(zero, windows="file")
    latency = 2e-3 + 37e-6 * (np.arange(len(t)) % 3)
    np.testing.assert_allclose(whole.t, (t + latency) - latency[0], rtol=0, atol=2e-9)
    np.testing.assert_allclose(whole.orientation, q, rtol=0, atol=1e-15)


def test_malformed_ros1_bags(rosbags, tmp_path):
    t, omega, q, f, _ = _recording()
    nan = _write_bag1(tmp_path / "nan.bag", {"/imu": (t, omega, q, f)}, bad=("/imu", 7, 2))
    with pytest.raises(DataError, match=r"nan.bag, topic '/imu', message 7: angular_velocity has NaN or inf"):
        load(nan)
    cut = _write_bag1(tmp_path / "cut.bag", {"/imu": (t, omega, q, f)}, cut=("/imu", 12))
    with pytest.raises(DataError, match=r"cut.bag, topic '/imu', message 12: cannot be decoded as sensor_msgs/msg/Imu"):
        load(cut)
    data = nan.read_bytes()
    (tmp_path / "half.bag").write_bytes(data[: len(data) // 2])  # a recording cut short: no index
    with pytest.raises(DataError, match=r"half.bag: not a readable ROS 1 bag"):
        load(tmp_path / "half.bag")
    with pytest.raises(DataError, match=r"none.bag: no sensor_msgs/msg/Imu topic; the topics present: /chatter"):
        load(_write_bag1(tmp_path / "none.bag", {"/chatter": None}))
    with pytest.raises(DataError, match=r"nan.bag: a ROS bag is in s and rad/s"):
        load(nan, time_unit="ms")


def test_folder_of_bags(rosbags, tmp_path):
    """A folder holding bags: each bag found (in or below it) is one recording, in path order;
    the storage file inside a rosbag2 folder is part of it, not a bag of its own."""
    t, omega, q, f, flight = _recording()
    rec = tmp_path / "recordings"
    rec.mkdir()
    _write_bag(rec / "b", {"/imu": (t, -omega, q, f)}, storage="sqlite3")  # a rosbag2 folder
    _write_bag1(rec / "a.bag", {"/imu": (t, omega, q, f)})
    (rec / "notes.txt").write_text("two tosses")
    assert not is_ros_bag(rec) and has_ros_bags(rec)
    assert find_ros_bags(rec) == [rec / "a.bag", rec / "b"]
    a, b = load(rec, windows="file", topic="/imu")
    assert (a.name, b.name) == ("a.bag:/imu", "b:/imu")
    assert (a.source, b.source) == (f"{rec / 'a.bag'}:/imu", f"{rec / 'b'}:/imu")
    np.testing.assert_array_equal(a.omega, omega)
    np.testing.assert_array_equal(b.omega, -omega)
    assert [s.comment for s in load(rec)] == [DETECTED, DETECTED]  # one flight each
    with pytest.raises(DataError, match=r"recordings/a.bag: no topic '/imu/x'"):
        load(rec, topic="/imu/x")
    with pytest.raises(DataError, match=r"recordings: its ROS bags are in s and rad/s"):
        load(rec, rate_unit="deg/s")
    # a bag without a flight: its whole recording (warned), or, with windows="detect", left
    # out of the folder's windows; an error where no bag of the folder has one
    rest = ~flight
    (rec / "sub").mkdir()
    _write_bag1(rec / "sub" / "still.bag", {"/imu": (t[rest], omega[rest], q[rest], f[rest])})
    with pytest.warns(UserWarning, match=r"still.bag, topic '/imu': no free-flight window detected"):
        assert [s.name for s in load(rec)] == ["a.bag:/imu #0", "b:/imu #0", "sub/still.bag:/imu"]
    assert [s.name for s in load(rec, windows="detect")] == ["a.bag:/imu #0", "b:/imu #0"]
    with pytest.raises(DataError, match=r"sub: no segments to load: .*still.bag, topic '/imu': no free-flight"):
        load(rec / "sub", windows="detect")
    # nothing readable: named as such
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "sub" / "notes.txt").write_text("")
    with pytest.raises(DataError, match=r"empty: no recording found: .*and no ROS bag"):
        load(empty)
    with pytest.raises(DataError, match=r"empty: no ROS bag found in it or below it"):
        load_ros(empty)
    with pytest.raises(DataError, match=r"empty: --topic applies to a ROS bag"):
        load(empty, topic="/imu")
    (empty / "sub" / "junk.bag").write_bytes(b"#ROSBAG V2.0\n")
    with pytest.raises(DataError, match=r"junk.bag: not a readable ROS 1 bag"):
        load(empty)


def test_bags_behind_symlinks(rosbags, tmp_path, symlinks):
    """A folder searched for bags finds a bag behind a symbolic link (to a rosbag2 folder, to a
    bag file, to a folder holding bags) as a real one; a link to an ancestor does not loop, and
    a bag reached twice is listed and loaded once, under its real path where it has one."""
    t, omega, q, f, _ = _recording()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _write_bag(elsewhere / "rec", {"/imu": (t, omega, q, f)}, storage="sqlite3")
    _write_bag1(elsewhere / "x.bag", {"/imu": (t, -omega, q, f)})
    (tmp_path / "more" / "deep").mkdir(parents=True)
    _write_bag1(tmp_path / "more" / "deep" / "c.bag", {"/imu": (t, omega, q, f)})
    top = tmp_path / "top"
    top.mkdir()
    (top / "tree").symlink_to(tmp_path / "more", target_is_directory=True)
    assert has_ros_bags(top) and find_ros_bags(top) == [top / "tree" / "deep" / "c.bag"]  # was: none
    (top / "linked").symlink_to(elsewhere / "rec", target_is_directory=True)
    _write_bag(top / "b", {"/imu": (t, omega, q, f)}, storage="mcap")
    (top / "a").symlink_to(top / "b", target_is_directory=True)  # the same bag folder twice: once, as "b"
    _write_bag1(top / "real.bag", {"/imu": (t, omega, q, f)})
    (top / "again.bag").symlink_to(top / "real.bag")  # the same bag file twice: once, as "real.bag"
    (top / "sub").mkdir()
    (top / "sub" / "up").symlink_to(top, target_is_directory=True)  # a link to an ancestor
    (top / "sub" / "all").symlink_to(elsewhere, target_is_directory=True)  # "rec" linked above already
    bags = ["b", "linked", "real.bag", "sub/all/x.bag", "tree/deep/c.bag"]
    assert find_ros_bags(top) == [top / b for b in bags]
    segs = load(top, windows="file", topic="/imu")
    assert [s.name for s in segs] == [f"{b}:/imu" for b in bags]
    for s, sign in zip(segs, [1, 1, 1, -1, 1]):
        np.testing.assert_array_equal(s.omega, sign * omega)
    # searched alone, "sub" reaches "top" through its link "up" (outside it: searched, but not
    # "sub" again); there the first of two links to one bag is the one listed ("a", "again.bag")
    sub = ["all/rec", "all/x.bag", "up/a", "up/again.bag", "up/tree/deep/c.bag"]
    assert find_ros_bags(top / "sub") == [top / "sub" / b for b in sub]


def test_without_rosbags_names_the_extra(tmp_path, monkeypatch):
    bag = tmp_path / "rec.mcap"
    bag.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "rosbags.rosbag2", None)  # import fails as if not installed
    with pytest.raises(DataError, match=r"rec.mcap: reading a ROS 2 bag needs the rosbags package: pip install "):
        load(bag)
    old = tmp_path / "rec.bag"
    old.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "rosbags.rosbag1", None)
    with pytest.raises(DataError, match=r"rec.bag: reading a ROS 1 bag needs the rosbags package: pip install "):
        load(old)
    csv = tmp_path / "x.csv"
    csv.write_text("t,wx,wy,wz\n0,1,2,3\n0.01,1,2,3\n")
    with pytest.raises(DataError, match=r"x.csv: --topic applies to a ROS bag"):
        load(csv, topic="/imu")


def test_fit_command_on_a_bag(rosbags, tmp_path, capsys):
    """``rigidjax fit BAG --topic NAME``: the detected flight's moments are the truth's."""
    t, omega, q, f, _ = _recording()
    (tmp_path / "recs").mkdir()
    bag = _write_bag(tmp_path / "recs" / "bag", {"/imu/a": (t, omega, q, f), "/imu/b": (t, omega, q, f)})
    assert main(["fit", str(bag), "--quiet"]) == 2
    assert "choose one (topic=..., --topic)" in capsys.readouterr().err
    out = tmp_path / "fit.json"
    code = main(["fit", str(bag), "--topic", "/imu/b", "--starts", "2", "--quiet", "--json", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    assert "1 free-flight window(s) detected" in printed.out
    d = json.loads(out.read_text())
    # noise 2e-3 rad/s on rates of ~6 rad/s over 190 samples: errors ~1e-3 relative; 2 % still
    # catches a unit slip or swapped axes
    assert d["estimates"]["Ix/Iy"] == pytest.approx(0.5, rel=0.02)
    assert d["estimates"]["Iz/Iy"] == pytest.approx(1.3, rel=0.02)
    assert main(["fit", str(out), "--topic", "/imu", "--quiet"]) == 2
    assert "--topic applies to ROS bags" in capsys.readouterr().err
    # a folder holding the bag takes --topic as the bag does
    assert main(["fit", str(tmp_path / "recs"), "--topic", "/imu/b", "--starts", "2", "--quiet"]) == 0
