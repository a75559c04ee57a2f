"""ROS 2 bags (``rigidjax.io.ros``, the optional extra ``rigidjax[ros]``): every bag is written
here with rosbags' own writer and serializer (never a real recording copied in), in sqlite3 and
MCAP storage, and read back through ``rigidjax.io.load``: header stamps (or receive times), body
rates, the scalar-last quaternion reordered, free-flight windows; malformed bags are refused
naming the file, the topic and the message. Skipped without ``rosbags`` (except the check that
its absence names the extra)."""

import json
import shutil
import sys

import numpy as np
import pytest

from rigidjax import reference, so3
from rigidjax.cli import main
from rigidjax.io import DETECTED, IMU, DataError, imu_topics, is_ros_bag, load

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


def _write_bag(path, topics, *, storage="mcap", zero_stamps=False, bad=None, no_orientation=False):
    """A rosbag2 folder at ``path``: ``topics`` ``{name: (t, omega, q, f)}`` as
    ``sensor_msgs/msg/Imu`` (``q`` ``[w, x, y, z]`` written x, y, z, w), or ``{name: None}`` for
    a ``std_msgs/msg/String`` topic; ``bad = (topic, message, field)`` puts NaN in one field;
    ``no_orientation``: the message's "no estimate" mark (zero quaternion, covariance[0] = -1)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    T = store.types
    plugin = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}[storage]
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        for name, data in topics.items():
            if data is None:
                conn = writer.add_connection(name, "std_msgs/msg/String", typestore=store)
                writer.write(conn, T0_NS, store.serialize_cdr(T["std_msgs/msg/String"](data="hi"), conn.msgtype))
                continue
            conn = writer.add_connection(name, IMU, typestore=store)
            received = np.sort(data[0])  # in the order written, whatever the stamps say
            for i, (ti, w, q, f) in enumerate(zip(*data)):
                stamp = T0_NS + round(ti * 1e9)
                recv = T0_NS + round(received[i] * 1e9) + 2_000_000 + 37_000 * (i % 3)  # plus a jittered latency
                w = w.copy()
                if bad is not None and bad[:2] == (name, i):
                    w[bad[2]] = np.nan
                sec, nsec = divmod(0 if zero_stamps else stamp, 1_000_000_000)
                if no_orientation:
                    q = np.zeros(4)
                q_cov = np.zeros(9)
                q_cov[0] = -1.0 if no_orientation else 0.0
                msg = T[IMU](
                    header=T["std_msgs/msg/Header"](
                        stamp=T["builtin_interfaces/msg/Time"](sec=sec, nanosec=nsec), frame_id="imu_link"
                    ),
                    orientation=T["geometry_msgs/msg/Quaternion"](x=q[1], y=q[2], z=q[3], w=q[0]),
                    orientation_covariance=q_cov,
                    angular_velocity=T["geometry_msgs/msg/Vector3"](x=w[0], y=w[1], z=w[2]),
                    angular_velocity_covariance=np.zeros(9),
                    linear_acceleration=T["geometry_msgs/msg/Vector3"](x=f[0], y=f[1], z=f[2]),
                    linear_acceleration_covariance=np.zeros(9),
                )
                writer.write(conn, recv, store.serialize_cdr(msg, IMU))
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
    with pytest.raises(DataError, match=r"a ROS 2 bag is in s and rad/s"):
        load(nan, rate_unit="deg/s")


def test_without_rosbags_names_the_extra(tmp_path, monkeypatch):
    bag = tmp_path / "rec.mcap"
    bag.write_bytes(b"")
    monkeypatch.setitem(sys.modules, "rosbags.rosbag2", None)  # import fails as if not installed
    with pytest.raises(DataError, match=r"rec.mcap: reading a ROS 2 bag needs the rosbags package: pip install "):
        load(bag)
    csv = tmp_path / "x.csv"
    csv.write_text("t,wx,wy,wz\n0,1,2,3\n0.01,1,2,3\n")
    with pytest.raises(DataError, match=r"x.csv: --topic applies to a ROS 2 bag"):
        load(csv, topic="/imu")


def test_fit_command_on_a_bag(rosbags, tmp_path, capsys):
    """``rigidjax fit BAG --topic NAME``: the detected flight's moments are the truth's."""
    t, omega, q, f, _ = _recording()
    bag = _write_bag(tmp_path / "bag", {"/imu/a": (t, omega, q, f), "/imu/b": (t, omega, q, f)})
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
    assert "--topic applies to ROS 2 bags" in capsys.readouterr().err
