"""The loaders beyond phyphox's default export: every phyphox CSV dialect and its zip, Sensor
Logger folders and zips, any CSV through a column map and units, motion-capture poses, and the
unit plausibility check. Every sample is written here (never a real recording copied in);
each format is read back and a malformed variant is refused naming file, line and column."""

import re
import zipfile

import numpy as np
import pytest

from rigidjax import so3
from rigidjax.io import (
    DataError,
    has_phyphox,
    load,
    load_csv,
    load_motion_csv,
    load_phyphox,
    load_sensor_logger,
    load_sensor_logger_motion,
    parse_columns,
)
from rigidjax.io.units import check_plausible

# phyphox writes 10 significant digits: values agree with the written ones to 5e-10 relative
RTOL = 1e-9


def _signal(n=60, dt=0.01, seed=0):
    """Jittered times (s) and smooth rates (rad/s, a few rad/s: a hand-thrown body)."""
    rng = np.random.default_rng(seed)
    t = 0.02 + np.cumsum(dt + rng.uniform(-2e-4, 2e-4, n))
    w = np.stack([3 * np.sin(2 * t), 2 * np.cos(3 * t), 0.5 + 0.1 * t], axis=1)
    return t, w


def _phyphox_number(v: float, decimal: str) -> str:
    """As phyphox writes numbers: 10 significant digits, unpadded exponent ("3.293812500E-2")."""
    s = f"{v:.9E}"
    mant, exp = s.split("E")
    return mant.replace(".", decimal) + "E" + str(int(exp))


DIALECTS = [(",", "."), ("\t", "."), (";", "."), ("\t", ","), (";", ",")]  # phyphox's five CSV exports
HEADER = ("Time (s)", "Gyroscope x (rad/s)", "Gyroscope y (rad/s)", "Gyroscope z (rad/s)", "Absolute (rad/s)")


def _phyphox_files(t, w, sep, decimal, header=HEADER, bad=None):
    """``{relative path: text}`` of a phyphox export; ``bad = (row, col, text)`` spoils one cell."""
    lines = [sep.join(f'"{h}"' for h in header)]
    for i, (ti, wi) in enumerate(zip(t, w)):
        cells = [_phyphox_number(v, decimal) for v in (ti, *wi, np.linalg.norm(wi))]
        if bad is not None and bad[0] == i:
            cells[bad[1]] = bad[2]
        lines.append(sep.join(cells))
    time_csv = [
        sep.join(f'"{h}"' for h in ("event", "experiment time", "system time", "system time text")),
        sep.join(['"START"', _phyphox_number(0.0, decimal), _phyphox_number(1.7e9, decimal), '"2025-01-01"']),
    ]
    return {"Raw Data.csv": "\n".join(lines), "meta/time.csv": "\n".join(time_csv), "meta/device.csv": '"a","b"\n'}


def _write_folder(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _write_zip(path, files, inner=""):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, text in files.items():
            z.writestr(f"{inner}/{rel}" if inner else rel, text)
    return path


@pytest.mark.parametrize("sep, decimal", DIALECTS, ids=["comma", "tab", "semicolon", "tab-dec-comma", "semi-dec-comma"])
def test_phyphox_dialects_folder_and_zip(tmp_path, sep, decimal):
    t, w = _signal()
    files = _phyphox_files(t, w, sep, decimal)
    (seg,) = load_phyphox(_write_folder(tmp_path / "Gyroscope rotation rate 1", files))
    np.testing.assert_allclose(seg.t, t, rtol=RTOL)
    np.testing.assert_allclose(seg.omega, w, rtol=RTOL, atol=1e-12)
    # the share button's zip: files at the archive's root, or inside one folder
    for inner in ("", "Gyroscope rotation rate 2025-01-01"):
        z = _write_zip(tmp_path / f"export{len(inner)}.zip", files, inner)
        (zs,) = load(z)
        np.testing.assert_array_equal(zs.omega, seg.omega)
        assert zs.source.endswith("Raw Data.csv") and str(z) in zs.source


@pytest.mark.parametrize("sep, decimal", DIALECTS, ids=["comma", "tab", "semicolon", "tab-dec-comma", "semi-dec-comma"])
def test_phyphox_dialects_malformed(tmp_path, sep, decimal):
    t, w = _signal()
    files = _phyphox_files(t, w, sep, decimal, bad=(6, 2, "abc"))  # row 6 -> line 8
    with pytest.raises(DataError, match=r"Raw Data.csv, line 8, column 'Gyroscope y \(rad/s\)': non-numeric cell"):
        load_phyphox(_write_folder(tmp_path / "f", files))
    z = _write_zip(tmp_path / "bad.zip", _phyphox_files(t, w, sep, decimal, bad=(3, 0, '""')))
    with pytest.raises(DataError, match=r"bad.zip/Raw Data.csv, line 5, column 'Time \(s\)': empty cell"):
        load(z)


def test_phyphox_translated_export_and_zip_tree(tmp_path):
    """A German phone: translated column names and data file; a folder of zips is searched."""
    t, w = _signal()
    header = ("Zeit (s)", "Gyroskop x (rad/s)", "Gyroskop y (rad/s)", "Gyroskop z (rad/s)", "Betrag (rad/s)")
    files = _phyphox_files(t, w, ";", ",", header=header)
    files["Rohdaten.csv"] = files.pop("Raw Data.csv")
    (seg,) = load_phyphox(_write_folder(tmp_path / "de", files))
    np.testing.assert_allclose(seg.omega, w, rtol=RTOL, atol=1e-12)
    tree = tmp_path / "tree"
    tree.mkdir()
    _write_zip(tree / "a.zip", files)
    _write_zip(tree / "b.zip", _phyphox_files(t, w, ",", "."))
    segs = load(tree)
    assert [s.name for s in segs] == ["a.zip", "b.zip"]
    # a header with no rate columns at all names what is missing
    files["Rohdaten.csv"] = '"Zeit (s)";"Druck (hPa)"\n0;1\n'
    with pytest.raises(DataError, match=r"Rohdaten.csv, line 1: missing column\(s\)"):
        load_phyphox(_write_folder(tmp_path / "de2", files))


def test_phyphox_zip_with_segments(tmp_path):
    t, w = _signal()
    files = _phyphox_files(t, w, ",", ".")
    files["meta/segments.csv"] = "segment,start,end,keep,comment\n0,0.1,0.3,,toss\n1,0.35,0.5,false,drop\n"
    (seg,) = load(_write_zip(tmp_path / "rec.zip", files))
    sel = (t >= 0.1) & (t <= 0.3)
    np.testing.assert_allclose(seg.t, t[sel], rtol=RTOL)
    assert seg.comment == "toss" and seg.name == "rec.zip #0"
    files["meta/segments.csv"] = "segment,start,end,keep,comment\n0,0.1,zero,,toss\n"
    with pytest.raises(DataError, match=r"rec2.zip/meta/segments.csv, line 2, column 'end': expected a time"):
        load(_write_zip(tmp_path / "rec2.zip", files))


def test_phyphox_exports_behind_symlinks(tmp_path, symlinks):
    """A folder searched for recordings (``rigidjax fit FOLDER``) finds an export behind a
    symbolic link (to its folder, to its zip, to a folder holding one) as a real one; a link to
    an ancestor does not loop, and an export reached twice is loaded once."""
    t, w = _signal()
    files = _phyphox_files(t, w, ",", ".")
    elsewhere = tmp_path / "elsewhere"
    _write_folder(elsewhere / "rec", files)
    _write_zip(elsewhere / "shared.zip", files)
    _write_folder(tmp_path / "more" / "deep", files)
    top = tmp_path / "top"
    _write_folder(top / "real", files)
    (top / "folder link").symlink_to(elsewhere / "rec", target_is_directory=True)
    (top / "zip link.zip").symlink_to(elsewhere / "shared.zip")
    (top / "tree link").symlink_to(tmp_path / "more", target_is_directory=True)
    (top / "real" / "loop").symlink_to(top, target_is_directory=True)  # a link to an ancestor
    (top / "again").symlink_to(top / "real", target_is_directory=True)  # the same export twice: loaded once, as "real"
    _write_zip(top / "b.zip", files)
    (top / "a.zip").symlink_to(top / "b.zip")  # the same zip twice: loaded once, as "b.zip"
    (top / "sub").mkdir()
    (top / "sub" / "all").symlink_to(elsewhere, target_is_directory=True)  # both exports, linked above already
    assert has_phyphox(top / "folder link") and has_phyphox(top / "zip link.zip")
    segs = load(top)
    assert sorted(s.name for s in segs) == ["b.zip", "folder link", "real", "tree link/deep", "zip link.zip"]
    for s in segs:
        np.testing.assert_allclose(s.omega, w, rtol=RTOL, atol=1e-12)
    (seg,) = load(top / "folder link")  # the link itself, given as the path
    np.testing.assert_allclose(seg.t, t, rtol=RTOL)


# ----------------------------------------------------------------------------- Sensor Logger


def _sensor_logger_files(t, w, q=None, t0_ns=1_718_030_736_872_695_300, bad=None):
    ns = t0_ns + np.round(t * 1e9).astype(np.int64)
    rows = ["time,seconds_elapsed,z,y,x"]
    for i, (n, ti, wi) in enumerate(zip(ns, t, w)):
        cells = [str(n), repr(float(ti)), repr(float(wi[2])), repr(float(wi[1])), repr(float(wi[0]))]
        if bad is not None and bad[0] == i:
            cells[bad[1]] = bad[2]
        rows.append(",".join(cells))
    files = {"Gyroscope.csv": "\n".join(rows) + "\n", "Metadata.csv": "version,device\n1,phone\n"}
    if q is not None:
        rows = ["time,seconds_elapsed,qz,qy,qx,qw,roll,pitch,yaw"]
        for n, ti, qi in zip(ns, t, q):
            rows.append(",".join([str(n), repr(float(ti)), *(repr(float(v)) for v in qi[[3, 2, 1, 0]]), "0,0,0"]))
        files["Orientation.csv"] = "\n".join(rows) + "\n"
    return files


def test_sensor_logger_folder_and_zip(tmp_path):
    t, w = _signal()
    files = _sensor_logger_files(t, w)
    (seg,) = load(_write_folder(tmp_path / "2025-01-01_10-00-00", files))
    np.testing.assert_array_equal(seg.t, t)  # seconds_elapsed, written with repr: exact
    np.testing.assert_array_equal(seg.omega, w)  # z,y,x columns read by name into x, y, z
    (zs,) = load(_write_zip(tmp_path / "share.zip", files, "2025-01-01_10-00-00"))
    np.testing.assert_array_equal(zs.omega, w)
    assert zs.source == f"{tmp_path / 'share.zip'}/2025-01-01_10-00-00/Gyroscope.csv"
    # without seconds_elapsed: the ns epoch, differenced as integers (1 ns resolution kept)
    files["Gyroscope.csv"] = "\n".join(
        ",".join(c for j, c in enumerate(line.split(",")) if j != 1) for line in files["Gyroscope.csv"].splitlines()
    )
    (ns,) = load_sensor_logger(_write_folder(tmp_path / "ns", files))
    np.testing.assert_allclose(ns.t, t - t[0], atol=1e-9)


def test_sensor_logger_malformed(tmp_path):
    t, w = _signal()
    with pytest.raises(DataError, match=r"Gyroscope.csv, line 12, column 'y': non-numeric cell 'x1'"):
        load(_write_zip(tmp_path / "a.zip", _sensor_logger_files(t, w, bad=(10, 3, "x1"))))
    files = _sensor_logger_files(t, w)
    files["Gyroscope.csv"] = files["Gyroscope.csv"].replace("time,seconds_elapsed,z,y,x", "time,seconds_elapsed,z,y")
    with pytest.raises(DataError, match=r"Gyroscope.csv, line 1: missing column\(s\) \['x'\]"):
        load(_write_folder(tmp_path / "b", files))


def test_sensor_logger_orientation(tmp_path):
    t, w = _signal()
    rng = np.random.default_rng(3)
    q = rng.normal(size=(len(t), 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    m = load_sensor_logger_motion(_write_folder(tmp_path / "r", _sensor_logger_files(t, w, q)))
    np.testing.assert_allclose(m.orientation, q, rtol=0, atol=1e-15)  # qz,qy,qx,qw reordered to [w, x, y, z]
    np.testing.assert_array_equal(m.omega, w)  # the same `time` column in both files: the same samples
    assert m.kinds == ["omega", "orientation"]
    bad = _sensor_logger_files(t, w, 1.1 * q)
    with pytest.raises(DataError, match=r"Orientation.csv, line 2, column 'qw': orientation is not a unit"):
        load_sensor_logger_motion(_write_folder(tmp_path / "s", bad))


def test_sensor_logger_exports_behind_symlinks(tmp_path, symlinks):
    """A folder searched for Sensor Logger exports finds one behind a symbolic link (to its
    folder, to its zip, to a folder holding one) as a real one; a link to an ancestor does not
    loop, and an export reached twice is loaded once, under its real path where it has one."""
    t, w = _signal()
    files = _sensor_logger_files(t, w)
    elsewhere = tmp_path / "elsewhere"
    _write_folder(elsewhere / "rec", files)
    _write_zip(elsewhere / "shared.zip", files, "inner")
    _write_folder(tmp_path / "more" / "deep", files)
    top = tmp_path / "top"
    top.mkdir()
    (top / "linked").symlink_to(elsewhere / "rec", target_is_directory=True)
    (seg,) = load(top, windows="file")  # the only export is behind a link (was: "no recording found")
    assert seg.name == "linked"
    np.testing.assert_array_equal(seg.omega, w)
    _write_folder(top / "real", files)
    (top / "real" / "loop").symlink_to(top, target_is_directory=True)  # a link to an ancestor
    (top / "again").symlink_to(top / "real", target_is_directory=True)  # the same export twice: once, as "real"
    (top / "zip link.zip").symlink_to(elsewhere / "shared.zip")
    _write_zip(top / "share.zip", files, "inner")
    (top / "a.zip").symlink_to(top / "share.zip")  # the same zip twice: once, as "share.zip"
    (top / "tree").symlink_to(tmp_path / "more", target_is_directory=True)
    (top / "sub").mkdir()
    (top / "sub" / "all").symlink_to(elsewhere, target_is_directory=True)  # both exports, linked above already
    segs = load(top, windows="file")
    names = ["linked", "real", "tree/deep", "share.zip/inner", "zip link.zip/inner"]  # folders, then zips
    assert [s.name for s in segs] == names
    assert [s.name for s in load_sensor_logger(top, windows="file")] == names
    for s in segs:
        np.testing.assert_array_equal(s.omega, w)
    # searched alone, the folder holding only a link to "elsewhere" finds both its exports
    assert [s.name for s in load(top / "sub", windows="file")] == ["all/rec", "all/shared.zip/inner"]


# ----------------------------------------------------------------------------- any CSV


def test_column_map_and_units(tmp_path):
    t, w = _signal()
    f = tmp_path / "imu.csv"
    lines = ["Time;gx;gy;gz;temp"] + [
        ";".join(f"{v:.10g}".replace(".", ",") for v in (1e3 * ti, *np.degrees(wi[[0, 1]]), -np.degrees(wi[2]), 25))
        for ti, wi in zip(t, w)
    ]
    f.write_text("\n".join(lines) + "\n")
    (seg,) = load(f, columns="t=Time,wx=gx,wy=gy,wz=-gz", time_unit="ms", rate_unit="deg/s")
    np.testing.assert_allclose(seg.t, t, rtol=1e-9)  # 10 significant digits written
    np.testing.assert_allclose(seg.omega, w, rtol=1e-9, atol=1e-12)
    # the same file without units: the unit check names the unit and the flag
    with pytest.raises(DataError, match=r"imu.csv: the median time step .* look like ms .* --time-unit ms"):
        load_csv(f, columns="t=Time,wx=gx,wy=gy,wz=-gz", rate_unit="deg/s")
    with pytest.raises(DataError, match=r"imu.csv, line 1: the column map gives wy=gyro_y, .* no column 'gyro_y'"):
        load_csv(f, columns="t=Time,wx=gx,wy=gyro_y,wz=gz")
    with pytest.raises(DataError, match=r"imu.csv, line 1: missing column\(s\) \['wx', 'wy', 'wz'\]"):
        load_csv(f, columns="t=Time")
    cells = lines[5].split(";")
    cells[2] = "n/a"  # the fifth sample's gy, on line 6
    f.write_text("\n".join(lines[:5] + [";".join(cells)] + lines[6:]) + "\n")
    with pytest.raises(DataError, match=r"imu.csv, line 6, column 'gy': non-numeric cell 'n/a'"):
        load_csv(f, columns="t=Time,wx=gx,wy=gy,wz=gz", time_unit="ms", rate_unit="deg/s")


@pytest.mark.parametrize(
    "spec, match",
    [("t=Time,omega=gx", "unknown quantity 'omega'"), ("t", "TARGET=COLUMN"), ("t=a,t=b", "given twice")],
)
def test_parse_columns_errors(spec, match):
    with pytest.raises(DataError, match=match):
        parse_columns(spec)


# ----------------------------------------------------------------------------- motion capture


def _quat_to_matrix(q):
    """Body-to-world rotation matrix of unit quaternions [w, x, y, z] (Hamilton), written out."""
    w, x, y, z = q.T
    return np.stack(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    ).transpose(2, 0, 1)


def test_motion_capture_matrix_and_quaternion(tmp_path):
    rng = np.random.default_rng(5)
    n = 40
    t = np.arange(n) / 120.0  # a 120 Hz motion-capture system
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    R = _quat_to_matrix(q)
    pos_mm = rng.normal(size=(n, 3)) * 100
    head = ["Frame", "Time"] + [f"R{i}{j}" for i in (1, 2, 3) for j in (1, 2, 3)] + ["TX", "TY", "TZ"]
    rows = [",".join(head)] + [",".join(repr(float(v)) for v in (k, t[k], *R[k].ravel(), *pos_mm[k])) for k in range(n)]
    f = tmp_path / "vicon.csv"
    f.write_text("\n".join(rows) + "\n")
    cmap = ",".join([f"r{i}{j}=R{i}{j}" for i in (1, 2, 3) for j in (1, 2, 3)] + ["t=Time", "x=TX", "y=TY", "z=TZ"])
    m = load_motion_csv(f, columns=cmap, length_unit="mm")
    # the same rotation (q or -q), to the round-off of a matrix -> quaternion conversion
    dots = np.abs(np.einsum("ni,ni->n", m.orientation, q))
    np.testing.assert_allclose(dots, 1.0, atol=1e-12)
    # body to world in the package's convention: so3.rotate(q, v) = R v
    v = rng.normal(size=(n, 3))
    np.testing.assert_allclose(np.asarray(so3.rotate(m.orientation, v)), np.einsum("nij,nj->ni", R, v), atol=1e-12)
    np.testing.assert_allclose(m.position, pos_mm / 1000, rtol=1e-15)
    assert m.kinds == ["orientation", "position"] and m.omega is None
    # neighbours on the same side (q and -q are one rotation)
    assert np.all(np.einsum("ni,ni->n", m.orientation[1:], m.orientation[:-1]) > 0)
    # a sheared matrix and a reflection are refused on their line
    bad = R.copy()
    bad[7, 0, 1] += 0.01
    bad[12] = -bad[12]
    rows = [",".join(head)] + [",".join(repr(float(v)) for v in (k, t[k], *bad[k].ravel(), 0, 0, 0)) for k in range(n)]
    f.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match=r"vicon.csv, line 9, column 'R11': not a rotation matrix \(max \|R\^T R - I\|"):
        load_motion_csv(f, columns=cmap)
    # quaternions, renormalised within 1e-3; a position group with a column missing is refused
    g = tmp_path / "quat.csv"
    g.write_text("t,qw,qx,qy,qz,x,y\n" + "\n".join(f"{k * 0.01},1.0004,0,0,0,1,2" for k in range(5)) + "\n")
    with pytest.raises(DataError, match=r"quat.csv, line 1: position needs all of \['x', 'y', 'z'\]"):
        load_motion_csv(g)
    g.write_text("t,qw,qx,qy,qz\n" + "\n".join(f"{k * 0.01},1.0004,0,0,0" for k in range(5)) + "\n")
    np.testing.assert_allclose(load_motion_csv(g).orientation, [[1, 0, 0, 0]] * 5, atol=1e-15)


# ----------------------------------------------------------------------------- unit checks


def test_unit_check_names_the_unit_and_flag(tmp_path):
    t, w = _signal()  # 100 Hz, up to ~3.6 rad/s: 0.04 rad per sample
    check_plausible(t, w, "ok")
    with pytest.raises(DataError, match=r"x.csv: .* they look like deg/s .* pass --rate-unit deg/s"):
        check_plausible(t, np.degrees(w) * 3, "x.csv")  # a fast toss: 10 rad/s written in deg/s
    with pytest.raises(DataError, match=r"look like ms .* --time-unit ms"):
        check_plausible(t * 1e3, w / 1e3, "x.csv")
    with pytest.raises(DataError, match=r"look like ns .* --time-unit ns"):
        check_plausible(t * 1e9, w, "x.csv")
    with pytest.raises(DataError, match=r"neither rad/s nor deg/s"):
        check_plausible(t, w * 1e4, "x.csv")
    # a single glitch does not trip it (99th percentile, not the peak)
    w2 = w.copy()
    w2[5] = 500.0
    check_plausible(t, w2, "glitch")
    # through a loader: a phyphox-layout file in deg/s, then fixed by the flag or skipped
    f = tmp_path / "deg.csv"
    f.write_text(
        "t,wx,wy,wz\n" + "\n".join(",".join(repr(float(v)) for v in (ti, *wi)) for ti, wi in zip(t, 3 * np.degrees(w)))
    )
    with pytest.raises(DataError, match=re.escape(str(f)) + r": the rates turn the body by"):
        load(f)
    np.testing.assert_allclose(load(f, rate_unit="deg/s")[0].omega, 3 * w, rtol=1e-12)
    assert load(f, check_units=False)[0].omega.max() > 100


def test_broken_links_do_not_abort_a_folder_search(tmp_path, symlinks):
    """A link whose target is gone, beside real exports, is no recording: the search goes on
    (it raised 'file not found' for a linked Gyroscope.csv and aborted the whole folder)."""
    t, w = _signal()
    _write_folder(tmp_path / "top" / "rec", _sensor_logger_files(t, w))
    (tmp_path / "top" / "zz").mkdir()
    (tmp_path / "top" / "zz" / "Gyroscope.csv").symlink_to(tmp_path / "gone.csv")
    (tmp_path / "top" / "old.zip").symlink_to(tmp_path / "gone.zip")
    (seg,) = load(tmp_path / "top", windows="file")
    np.testing.assert_array_equal(seg.omega, w)
