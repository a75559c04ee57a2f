"""Loaders: the shared phyphox recordings (counted against their own segments.csv, read here
with the standard csv module, not with rigidjax), and malformed files written to tmp_path."""

import csv
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from rigidjax.io import DataError, Segment, load, load_csv, load_npz, load_phyphox

PHYPHOX_HEADER = '"Time (s)","Gyroscope x (rad/s)","Gyroscope y (rad/s)","Gyroscope z (rad/s)","Absolute (rad/s)"'


def _windows(seg_csv: Path):
    """(start, end, keep) per row of a segments.csv, parsed independently of rigidjax."""
    rows = []
    with open(seg_csv, newline="") as f:
        for r in csv.DictReader(f, skipinitialspace=True):
            r = {k.strip(): (v or "").strip() for k, v in r.items()}
            rows.append((r["start"], r["end"], r["keep"].lower() != "false"))
    return rows


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one pendulum window spans a recording pause (tested below)
        yield


def test_shared_recordings_windows_and_keep(racquet_dir, quiet):
    segs = load_phyphox(racquet_dir)
    everything = load_phyphox(racquet_dir, keep_only=False)
    files = sorted(racquet_dir.rglob("segments.csv"))
    assert len(files) == 7
    n_keep = n_drop_bounded = 0
    for f in files:
        for start, end, keep in _windows(f):
            if keep:
                n_keep += 1
            elif start and end:
                n_drop_bounded += 1
    assert len(segs) == n_keep == 91
    assert len(everything) == n_keep + n_drop_bounded
    assert all(s.keep for s in segs) and sum(not s.keep for s in everything) == n_drop_bounded
    flips = load_phyphox(racquet_dir / "flips")
    assert len(flips) == 69
    kinds = {s.comment for s in flips}
    assert kinds == {
        "Intermediate axis rotation",
        "Fast intermediate axis rotation",
        "Tertiary axis rotation",
        "Primary axis rotation",
    }
    for s in flips:
        # each window holds the measured samples in [start, end] at ~100 Hz, unresampled
        assert isinstance(s, Segment) and s.omega.shape == (s.n, 3)
        assert 0.4 < s.duration < 1.3 and np.all(np.diff(s.t) > 0)
        assert 0.009 < np.median(np.diff(s.t)) < 0.011
        assert Path(s.source).name == "Raw Data.csv" and Path(s.source).is_file()
    # one export folder (with spaces in its path) gives its own windows only
    one = next(p.parent.parent for p in (racquet_dir / "flips" / "round2").rglob("segments.csv"))
    assert " " in str(one)
    assert len(load(one)) == len(_windows(one / "meta" / "segments.csv")) == 5


def test_shared_first_window_matches_raw_rows(racquet_dir):
    export = next((racquet_dir / "flips" / "round1").glob("*17-03-03"))
    (seg,) = load_phyphox(export)
    start, end, _ = _windows(export / "meta" / "segments.csv")[0]
    with open(export / "Raw Data.csv", newline="") as f:
        rows = [[float(v) for v in r] for r in list(csv.reader(f))[1:]]
    rows = np.array([r for r in rows if float(start) <= r[0] <= float(end)])
    np.testing.assert_array_equal(seg.t, rows[:, 0])
    np.testing.assert_array_equal(seg.omega, rows[:, 1:4])


def test_pause_inside_window_warns(racquet_dir):
    with pytest.warns(UserWarning, match="spans a recording pause"):
        load_phyphox(racquet_dir / "pendulum")


# ----------------------------------------------------------------------------- small files


def _export(root: Path, rows, segments=None, header=PHYPHOX_HEADER, name="Gyroscope rotation rate 2025-01-01 10-00-00"):
    d = root / name
    (d / "meta").mkdir(parents=True)
    (d / "Raw Data.csv").write_text(header + "\n" + "\n".join(rows) + "\n")
    if segments is not None:
        (d / "meta" / "segments.csv").write_text("segment,start,end,keep,comment\n" + "\n".join(segments))
    return d


def _rows(n=50, dt=0.01, jitter=True):
    rng = np.random.default_rng(0)
    t = np.cumsum(np.full(n, dt) + (rng.uniform(-1e-4, 1e-4, n) if jitter else 0))
    return [f"{ti:.9E},{np.sin(ti):.9E},{np.cos(ti):.9E},{0.1:.9E},1.0" for ti in t], t


def test_small_export_windows_whitespace_and_jitter(tmp_path):
    rows, t = _rows()
    d = _export(
        tmp_path / "a b", rows, [" 0 , 0.05 , 0.2 , , first", "1,0.25,0.4,false,dropped", "2, 0.3 ,0.45, TRUE ,third"]
    )
    segs = load_phyphox(d)
    assert [s.index for s in segs] == [0, 2] and [s.comment for s in segs] == ["first", "third"]
    sel = (t >= 0.05) & (t <= 0.2)
    np.testing.assert_allclose(segs[0].t, t[sel], rtol=1e-9, atol=0)  # written with 10 significant digits
    assert len(load_phyphox(d, keep_only=False)) == 3
    # parent folder: recursive
    assert len(load(tmp_path)) == 2


def test_no_segments_file_is_one_segment(tmp_path):
    rows, t = _rows(30)
    d = _export(tmp_path, rows)
    (s,) = load(d / "Raw Data.csv")
    assert s.n == 30 and s.index is None


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (
            lambda r: r[:5] + ["0.06,abc,0,0,0"] + r[6:],
            r"line 7, column 'Gyroscope x \(rad/s\)': non-numeric cell 'abc'",
        ),
        (lambda r: r[:3] + ["0.04,NaN,0,0,0"] + r[4:], r"line 5, column 'Gyroscope x \(rad/s\)': NaN"),
        (lambda r: r[:3] + ["0.04,,0,0,0"] + r[4:], r"line 5, column 'Gyroscope x \(rad/s\)': empty cell"),
        (lambda r: r[:10] + [r[8]] + r[11:], r"line 12, column 'Time \(s\)': time must be strictly increasing"),
    ],
)
def test_malformed_raw_data(tmp_path, mutate, pattern):
    rows, _ = _rows(jitter=False)
    d = _export(tmp_path, mutate(rows))
    with pytest.raises(DataError, match=pattern) as e:
        load_phyphox(d)
    assert "Raw Data.csv" in str(e.value)


def test_missing_column(tmp_path):
    rows, _ = _rows()
    d = _export(
        tmp_path, [r.rsplit(",", 2)[0] for r in rows], header='"Time (s)","Gyroscope x (rad/s)","Gyroscope y (rad/s)"'
    )
    with pytest.raises(DataError, match=r"Raw Data.csv, line 1: missing column\(s\) \['Gyroscope z \(rad/s\)'\]"):
        load_phyphox(d)


@pytest.mark.parametrize(
    "segments, pattern",
    [
        (["0,0.2,0.205,,empty"], r"segments.csv, line 2, column 'start': window \[0.2, 0.205\] s holds [01] sample"),
        (
            ["0,0.1,0.2,,ok", "1,0.3,9.0,,late"],
            r"segments.csv, line 3, column 'end': window \[0.3, 9.0\] s lies outside",
        ),
        (["0,-5,-4,,early"], r"line 2, column 'start': .* lies outside"),
        (["0,0.3,0.2,,reversed"], r"line 2, column 'end': window end 0.2 s is not after start 0.3 s"),
        (["0,zero,0.2,,bad"], r"line 2, column 'start': expected a time in s; got 'zero'"),
        (["0,,,,missing bounds"], r"line 2, column 'start': expected a time"),
        (["0,0.1,0.2,maybe,bad keep"], r"line 2, column 'keep': expected true/false"),
    ],
)
def test_malformed_windows(tmp_path, segments, pattern):
    rows, _ = _rows()
    d = _export(tmp_path, rows, segments)
    with pytest.raises(DataError, match=pattern):
        load_phyphox(d)


def test_dropped_window_needs_no_bounds(tmp_path):
    rows, _ = _rows()
    d = _export(tmp_path, rows, ["0,,,false,random noise", "1,0.1,0.3,,ok"])
    assert [s.index for s in load_phyphox(d, keep_only=False)] == [1]


def test_no_export_and_missing_path(tmp_path):
    with pytest.raises(DataError, match="no phyphox export found"):
        load_phyphox(tmp_path)
    with pytest.raises(DataError, match="no such file or folder"):
        load(tmp_path / "nope")
    (tmp_path / "x.txt").write_text("1")
    with pytest.raises(DataError, match="unknown file type"):
        load(tmp_path / "x.txt")


def test_plain_csv_and_npz_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    n = 20
    t = np.cumsum(rng.uniform(0.009, 0.011, n))
    w = rng.normal(size=(n, 3))
    q = rng.normal(size=(n, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    x = rng.normal(size=(n, 3))
    lines = [" t , wx, wy, wz, qw, qx, qy, qz, x, y, z"] + [
        ", ".join(repr(float(v)) for v in (ti, *wi, *qi, *xi)) for ti, wi, qi, xi in zip(t, w, q, x)
    ]
    f = tmp_path / "plain motion.csv"
    f.write_text("\n".join(lines) + "\n")
    (s,) = load(f)
    np.testing.assert_array_equal(s.t, t)
    np.testing.assert_array_equal(s.omega, w)
    np.testing.assert_array_equal(s.orientation, q)
    np.testing.assert_array_equal(s.position, x)
    np.savez(tmp_path / "m.npz", t=t, omega=w, orientation=q)
    (s2,) = load(tmp_path / "m.npz")
    np.testing.assert_array_equal(s2.omega, w)
    assert s2.position is None


def test_plain_csv_errors(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("t,wx,wy\n0,1,2\n0.1,1,2\n")
    with pytest.raises(DataError, match=re.escape("a.csv, line 1: missing column(s) ['wz']")):
        load_csv(f)
    f.write_text("t,wx,wy,wz,qw,qx\n0,1,2,3,1,0\n0.1,1,2,3,1,0\n")
    with pytest.raises(DataError, match="orientation needs all of"):
        load_csv(f)
    f.write_text("t,wx,wy,wz\n0,1,2,3\n0.1,1,nan,3\n")
    with pytest.raises(DataError, match="line 3, column 'wy': NaN"):
        load_csv(f)
    f.write_text("t,wx,wy,wz\n0,1,2,3\n")
    with pytest.raises(DataError, match="at least 2"):
        load_csv(f)


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "a.npz", t=np.arange(3.0), w=np.zeros((3, 3)))
    with pytest.raises(DataError, match=r"missing key\(s\) \['omega'\]"):
        load_npz(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", t=np.array([0.0, 0.1, 0.1]), omega=np.zeros((3, 3)))
    with pytest.raises(DataError, match="key 't': time must be strictly increasing"):
        load_npz(tmp_path / "b.npz")
    np.savez(tmp_path / "c.npz", t=np.arange(3.0), omega=np.array([[0, 0, 0], [0, np.nan, 0], [0, 0, 0]]))
    with pytest.raises(DataError, match=r"key 'omega': NaN or inf at index \(1, 1\)"):
        load_npz(tmp_path / "c.npz")
    np.savez(tmp_path / "d.npz", t=np.arange(3.0), omega=np.zeros((3, 2)))
    with pytest.raises(DataError, match=r"omega must have shape \(3, 3\)"):
        load_npz(tmp_path / "d.npz")


def test_segment_validation():
    with pytest.raises(DataError, match="at least 2 samples"):
        Segment(np.zeros(1), np.zeros((1, 3)))
    with pytest.raises(DataError, match="strictly increasing"):
        Segment(np.array([0.0, 0.0]), np.zeros((2, 3)))
    s = Segment(np.array([0.0, 0.1]), np.ones((2, 3)))
    with pytest.raises(ValueError):
        s.omega[0, 0] = 2.0  # read-only: segments are values


def test_time_error_shows_plain_floats(tmp_path):
    rows, t = _rows(jitter=False)
    d = _export(tmp_path, rows[:10] + [rows[8]] + rows[11:])
    with pytest.raises(DataError, match=r"time must be strictly increasing; 0\.09 s follows 0\.1 s$") as e:
        load_phyphox(d)
    assert "np.float64" not in str(e.value)
    np.savez(tmp_path / "b.npz", t=np.array([0.0, 0.1, 0.1]), omega=np.zeros((3, 3)))
    with pytest.raises(DataError, match=re.escape("t[2] = 0.1 <= t[1] = 0.1")):
        load_npz(tmp_path / "b.npz")


def test_npz_not_zip_and_name_once(tmp_path):
    f = tmp_path / "text.npz"
    f.write_text("t,wx\n0,1\n")
    with pytest.raises(DataError, match="text.npz: not a valid NPZ file") as e:
        load_npz(f)
    assert "pickle" not in str(e.value)
    np.savez(tmp_path / "npz_2d_t.npz", t=np.zeros((3, 1)), omega=np.zeros((3, 3)))
    with pytest.raises(DataError) as e:
        load_npz(tmp_path / "npz_2d_t.npz")
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / "npz_2d_t.npz") + ": t must have shape (n,)") and msg.count("npz_2d_t") == 1


def test_nan_only_matters_inside_kept_windows(tmp_path):
    rows, t = _rows(jitter=False)  # t = 0.01 ... 0.50, row k on line k + 2
    nan_rows = rows[:3] + ["0.04,NaN,0,0,0"] + rows[4:39] + ["0.4,,0,0,0"] + rows[40:]
    # the NaN at 0.04 s and the empty cell at 0.40 s lie outside the kept window [0.1, 0.3] s
    # and in a dropped one: the kept window loads, with the file's own values
    d = _export(tmp_path / "a", nan_rows, ["0,0.1,0.3,,ok", "1,0.35,0.45,false,dropped"])
    (s,) = load_phyphox(d)
    np.testing.assert_allclose(s.omega[:, 0], np.sin(s.t), atol=1e-9)  # written with 10 digits
    # a NaN inside a kept window is still an error naming file, line and column
    d = _export(tmp_path / "b", nan_rows, ["0,0.02,0.3,,ok"])
    with pytest.raises(DataError, match=r"Raw Data.csv, line 5, column 'Gyroscope x \(rad/s\)': NaN/inf sample"):
        load_phyphox(d)
    # loading the dropped window too (keep_only=False) requires its samples to be finite
    d = _export(tmp_path / "c", nan_rows, ["0,0.1,0.3,,ok", "1,0.35,0.45,false,dropped"])
    with pytest.raises(DataError, match=r"line 41, column 'Gyroscope x \(rad/s\)': empty cell"):
        load_phyphox(d, keep_only=False)
    # text is malformed anywhere
    d = _export(tmp_path / "d", rows[:3] + ["0.04,abc,0,0,0"] + rows[4:], ["0,0.1,0.3,,ok"])
    with pytest.raises(DataError, match="line 5, .*non-numeric cell 'abc'"):
        load_phyphox(d)


def test_no_windows_to_load_says_why(tmp_path):
    rows, _ = _rows()
    d = _export(tmp_path / "a", rows, ["0,0.1,0.2,false,x", "1,,,false,y", "2,0.3,0.4,no,z"])
    with pytest.raises(DataError, match=r"all 3 windows in .*segments.csv are marked keep=false"):
        load_phyphox(d)
    d = _export(tmp_path / "b", rows, [])
    with pytest.raises(DataError, match=r"segments.csv lists no windows"):
        load_phyphox(d)
