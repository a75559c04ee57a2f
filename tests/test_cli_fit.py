"""``rigidjax fit``: the embedded synthetic default (truth known) and the shared real recordings
(checked against the pendulum moments in their README, measured independently of the flips)."""

import io
import json
import math
import os
import re
import subprocess
import sys

from pathlib import Path

import numpy as np
import pytest

from rigidjax import reference
from rigidjax.cli import build_parser, main
from rigidjax.cli_fit import NO_CACHE_ENV, Progress, compilation_cache_dir


# README of ../shared/data/racquet-flips: pendulum moments (kg m^2, 1-sigma), phone axes
PENDULUM = {"Ix": (1.8816e-2, 5.68e-3), "Iy": (1.3911e-3, 7.6e-5), "Iz": (2.0703e-2, 3.84e-3)}


def _ratio(num, den="Iy"):
    """Pendulum ratio and its propagated 1-sigma (independent errors): README's ~13.5 +- 4, ~14.9 +- 3."""
    (a, sa), (b, sb) = PENDULUM[num], PENDULUM[den]
    r = a / b
    return r, r * math.hypot(sa / a, sb / b)


def test_pendulum_ratios_as_in_readme():
    # the README quotes Ix/Iy ~ 13.5 +- 4 and Iz/Iy ~ 14.9 +- 3
    assert _ratio("Ix") == pytest.approx((13.5, 4.2), abs=0.1)
    assert _ratio("Iz") == pytest.approx((14.9, 2.9), abs=0.1)


def test_help_lists_the_exit_codes(capsys):
    for cmd in ("fit", "fit-pendulum"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([cmd, "--help"])
        text = capsys.readouterr().out
        assert "exit status:" in text and "2  bad path, file or option" in text and "130  interrupted" in text
        # only `fit` pools recordings, so only it can refuse recordings that disagree
        assert ("3  recordings whose estimates disagree" in text) == (cmd == "fit")


def test_demo_pulls_over_seeds(tmp_path):
    """Over fresh noise seeds, (estimate - truth) / standard error of the demo's joint fit must
    look like N(0, 1) (truth: the DOP853 recordings of rigidjax.synthetic). QA history: with 1
    sub-step the midpoint step's own error shifted the gyro bias by 3 standard errors; the
    automatic sub-steps keep every shift below 0.3."""
    import warnings

    from rigidjax.cli_fit import _z_scores
    from rigidjax.identify import fit_inertia
    from rigidjax.io import load_phyphox
    from rigidjax.synthetic import synthesize_recording

    keys = ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "Ixz/Iy", "Iyz/Iy", "drag/Iy", "bias_x", "bias_y", "bias_z")
    pulls = []
    for seed in range(10, 15):  # seeds the other tests do not use; 3 tosses: padded to 128 samples like the demo test
        truth = synthesize_recording(tmp_path / str(seed), n_tosses=3, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # converged, and no warning
            fit = fit_inertia(
                load_phyphox(truth["path"]),
                tensor=True,
                drag="isotropic",
                bias=True,
                joint=True,
                starts=2,
                seed=seed,
                scale=("Iy", truth["Iy"]),
            )
        assert fit.converged
        assert fit.step_error["max_shift_se"] <= 0.3, fit.step_error
        z = _z_scores(fit, truth)
        pulls.append([z[k] for k in keys])
    pulls = np.array(pulls)  # (5 seeds, 9 quantities)
    # N(0,1): |z| < 4 for each of the 45 values (P ~ 6e-5 each)
    assert np.all(np.abs(pulls) < 4), pulls
    # per quantity, the RMS over 5 seeds: chi2(5)/5 exceeds 2.2^2 with P ~ 2e-4
    rms = np.sqrt(np.mean(pulls**2, axis=0))
    assert np.all(rms < 2.2), dict(zip(keys, rms))
    # pooled over all 45 (correlated within a seed, ~15 effective): RMS within [0.5, 1.6]
    assert 0.5 < np.sqrt(np.mean(pulls**2)) < 1.6, pulls


def test_real_flips_quick(racquet_dir, tmp_path, capsys):
    # one recording (round 2: five intermediate-axis tosses), principal moments along the phone axes
    rec = next((racquet_dir / "flips" / "round2").iterdir())
    out, png = tmp_path / "real.json", tmp_path / "fit plot.png"
    code = main(["fit", str(rec), "--json", str(out), "--plot", str(png), "--segment", "1", "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    d = json.loads(out.read_text())
    assert d["mode"] == "per-window" and len(d["segments"]) == 5 and d["status"] == "converged"
    for key in ("Ix", "Iz"):
        ref, sigma = _ratio(key)
        median = d["estimates"][f"{key}/Iy"]
        assert abs(median - ref) < sigma, (key, median, ref, sigma)  # within the pendulum's 1-sigma
        lo, hi = d["intervals"][f"{key}/Iy"]
        assert lo <= median <= hi and hi - lo > 4 * d["uncertainties"][f"{key}/Iy"]  # model error > noise
    # a gyroscope fit, not noise-level: the real residual is a few tenths of a rad/s out of ~10
    assert all(s["rms"] < 0.6 for s in d["segments"])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_errors_exit_2(tmp_path, capsys):
    assert main(["fit", str(tmp_path / "nope"), "--quiet"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["fit", "--scale", "Iy", "--quiet"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    bad = tmp_path / "rec" / "Gyroscope rotation rate x"
    (bad / "meta").mkdir(parents=True)
    (bad / "Raw Data.csv").write_text('"Time (s)","Gyroscope x (rad/s)"\n0,1\n0.01,2\n')
    assert main(["fit", str(tmp_path / "rec"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Raw Data.csv, line 1: missing column(s)" in err
    long = tmp_path / "long.csv"  # a 30 s window: not free flight
    long.write_text("t,wx,wy,wz\n" + "\n".join(f"{0.01 * i:.2f},1,2,3" for i in range(3000)))
    assert main(["fit", str(long), "--quiet"]) == 2
    assert "longer than the free-flight bound" in capsys.readouterr().err
    # output folders: created before the fit (like simulate --out), or exit 2 at once
    assert main(["fit", str(tmp_path / "nope"), "--json", str(tmp_path / "new" / "dir" / "f.json"), "--quiet"]) == 2
    assert (tmp_path / "new" / "dir").is_dir()
    capsys.readouterr()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["fit", str(long), "--plot", str(blocker / "x.png"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err and "cannot create its folder" in err
    assert main(["fit", str(long), "--json", str(tmp_path), "--quiet"]) == 2  # a folder, not a file
    assert "--json" in capsys.readouterr().err
    deg = tmp_path / "deg.csv"  # a flip in deg/s
    deg.write_text("t,wx,wy,wz\n" + "\n".join(f"{0.01 * i:.2f},{20 * i},1100,30" for i in range(100)))
    assert main(["fit", str(deg), "--quiet"]) == 2
    assert "deg/s" in capsys.readouterr().err
    for argv, msg in (
        (["--starts", "0"], "--starts must be >= 1"),
        (["--max-rate", "-1"], "--max-rate must be > 0"),
        (["--substeps", "two"], "--substeps must be 'auto'"),
        (["--bias", "nonsense"], "--bias takes 'fit', 'rest' or nothing"),
    ):
        assert main(["fit", *argv]) == 2
        assert msg in capsys.readouterr().err


def test_bias_read_at_rest_and_bias_before_the_path(tmp_path, capsys):
    """``--bias rest`` subtracts each recording's reading at rest (the synthetic recording lies
    still 1.2 s before each toss); ``--bias PATH`` fits a bias to PATH (the optional value is
    not mistaken for one); a recording that never lies still (0.3 s between tosses, below one
    0.5 s block) is refused for ``--bias rest`` with exit 2."""
    from rigidjax.synthetic import synthesize_recording

    truth = synthesize_recording(tmp_path / "still", n_tosses=3, seed=3)
    out = tmp_path / "rest.json"
    assert main(["fit", "--bias", "rest", truth["path"], "--quiet", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gyro bias read at rest" in printed and "read at rest over" in printed
    d = json.loads(out.read_text())
    assert d["options"]["bias"] == "rest"
    (b,) = d["combined"]["bias"].values()
    assert b["measured"] == "at rest" and np.allclose(b["value"], truth["bias"], atol=4 * max(b["se"]))
    assert main(["fit", "--bias", truth["path"], "--quiet"]) in (0, 1)
    assert "gyro bias)" in capsys.readouterr().out
    busy = synthesize_recording(tmp_path / "busy", n_tosses=3, seed=3, rest=0.3)
    assert main(["fit", busy["path"], "--bias", "rest", "--quiet"]) == 2
    assert "have no reading at rest" in capsys.readouterr().err


@pytest.mark.slow
def test_all_real_flips(racquet_dir, capsys, tmp_path):
    """Every kept flip of the shared recordings (69 windows), per window and jointly, principal
    moments and full tensor + drag (``pytest -m slow tests/test_cli_fit.py``, ~2 min). Round 1
    is a different body (every toss ~3.7 / 4.6; the data README): its two recordings are
    named and not pooled (exit 3); the combined estimates of rounds 2-3 agree with the
    pendulum ratios, and their 95 % intervals cover the scatter (wider than the statistical)."""
    flips = str(racquet_dir / "flips")
    for extra in ([], ["--tensor", "--drag"], ["--joint"], ["--joint", "--tensor", "--drag"]):
        out = tmp_path / "fit.json"
        code = main(["fit", flips, "--quiet", "--json", str(out), *extra])
        printed = capsys.readouterr().out
        assert code == 3, (extra, printed[-2000:])
        assert printed.count("NOT POOLED: round1/") == 2
        d = json.loads(out.read_text())
        assert set(d["combined"]["sources"]) == {s["recording"] for s in d["segments"] if "round1" not in s["source"]}
        for key in ("Ix", "Iz"):
            ref, sigma = _ratio(key)
            est = d["estimates"][f"{key}/Iy"]
            lo, hi = d["intervals"][f"{key}/Iy"]
            assert abs(est - ref) < sigma and lo < est < hi and (hi - lo) > 2 * 1.96 * d["uncertainties"][f"{key}/Iy"]
        # pool anyway: exit 1 or 0, never 3
        assert main(["fit", flips, "--quiet", "--pool-all", *extra]) in (0, 1)
        capsys.readouterr()


def test_version_and_top_level_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and re.fullmatch(r"rigidjax \S+\n", capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "exit status" in text and "2  bad path, file or option" in text


def test_compilation_cache_dir_rules(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    if sys.platform.startswith("linux"):
        assert compilation_cache_dir(False, env) == tmp_path / "xdg" / "rigidjax" / "jax-compilation-cache"
    assert compilation_cache_dir(False, env) is not None
    assert compilation_cache_dir(True, env) is None  # --no-cache
    for off in ("1", "yes", "true"):
        assert compilation_cache_dir(False, {**env, NO_CACHE_ENV: off}) is None
    for on in ("", "0", "false"):
        assert compilation_cache_dir(False, {**env, NO_CACHE_ENV: on}) is not None


def test_compilation_cache_written_by_the_command(tmp_path):
    """One short simulate in a fresh process writes compiled programs into the user cache folder."""
    env = {k: v for k, v in os.environ.items() if k != NO_CACHE_ENV}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path))
    argv = [sys.executable, "-m", "rigidjax", "simulate", "--t-end", "0.1", "--out", str(tmp_path / "t.csv")]
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=300)
    cache = tmp_path / "cache" / "rigidjax" / "jax-compilation-cache"
    if sys.platform.startswith("linux"):
        assert any(cache.iterdir()), "no compiled program was cached"


def test_second_fit_loads_its_programs(tmp_path):
    """The same ``rigidjax fit`` twice in fresh processes: the second neither traces nor compiles
    (programs from rigidjax.identify.keep_programs' folder, executables from JAX's cache), gives
    the same result and the same exit code, also when its output's reader stops early; a bad
    path still exits 2 through the console entry."""
    env = {k: v for k, v in os.environ.items() if k != NO_CACHE_ENV}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HOME=str(tmp_path))
    argv = [sys.executable, "-m", "rigidjax", "fit", "--tosses", "2", "--starts", "1", "--json"]
    first = subprocess.run([*argv, str(tmp_path / "1.json")], env=env, capture_output=True, text=True, timeout=300)
    # the second one's reader stops after one line (as `| head -1`): no error, the JSON is written
    with open(tmp_path / "err.txt", "w") as err:
        p = subprocess.Popen([*argv, str(tmp_path / "2.json")], env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        p.stdout.readline()
        p.stdout.close()
        p.wait(timeout=300)
    runs = [first, subprocess.CompletedProcess(argv, p.returncode, "", (tmp_path / "err.txt").read_text())]
    assert runs[0].returncode == runs[1].returncode and runs[0].returncode in (0, 1), runs[1].stderr
    assert "error" not in runs[1].stderr
    assert list((tmp_path / "cache" / "rigidjax" / "programs").glob("*.jaxexport"))
    m = re.search(r"compiled (\d+) program\(s\) in [0-9.]+ s, (\d+) from the cache", runs[1].stderr.splitlines()[-1])
    assert m and m.group(1) == m.group(2), runs[1].stderr
    a, b = (json.loads((tmp_path / f"{i}.json").read_text()) for i in (1, 2))
    assert a["estimates"] == b["estimates"] and a["uncertainties"] == b["uncertainties"]
    bad = subprocess.run(
        [sys.executable, "-m", "rigidjax", "fit", str(tmp_path / "nothing")], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "no such file or folder" in bad.stderr


def test_progress_plain_lines():
    out = io.StringIO()  # not a terminal: one plain line per phase change
    with Progress(stream=out, every=1e9) as p:
        p.set_phase("loading 1/2: a.csv")
        p.start_fit(8, "2 window(s), 4 start(s) each")
        p.tick(8)
        p.tick(3)  # not shown: lines only on phase changes and the heartbeat (every 1e9 s here)
        p.set_phase("done")
    lines = out.getvalue().splitlines()
    assert [re.sub(r"^\[ *[0-9.]+ s\] ", "", line) for line in lines] == [
        "loading 1/2: a.csv",
        "compiling (then fitting 2 window(s), 4 start(s) each)",
        "fitting: LM iteration 1, 8 of 8 start(s) iterating",
        "done",
    ]
    quiet = io.StringIO()
    with Progress(quiet=True, stream=quiet) as p:
        p.set_phase("loading")
        p.tick(1)
    assert quiet.getvalue() == ""


def test_several_paths_column_map_and_units(tmp_path, capsys):
    """Two CSV files with their own column names in ms and deg/s, fitted in one call: the
    estimates match the exact solution's moments (data: reference.torque_free_omega)."""
    inertia = np.array([1.0, 2.0, 2.6])
    rng = np.random.default_rng(4)
    paths = []
    for k, w0 in enumerate(([0.3, 4.0, 0.2], [3.0, 0.4, 0.5])):
        t = np.arange(100) * 0.01
        w = reference.torque_free_omega(inertia, np.array(w0), t) + rng.normal(0, 1e-3, (100, 3))
        f = tmp_path / f"imu {k}.csv"
        rows = [f"{1e3 * ti:.3f};{a:.8g};{b:.8g};{c:.8g}" for ti, (a, b, c) in zip(t, np.degrees(w))]
        f.write_text("ts;gyro_x;gyro_y;gyro_z\n" + "\n".join(rows) + "\n")
        paths.append(str(f))
    cols = "t=ts,wx=gyro_x,wy=gyro_y,wz=gyro_z"
    out = tmp_path / "fit.json"
    argv = ["fit", *paths, "--columns", cols, "--time-unit", "ms", "--rate-unit", "deg/s", "--starts", "2"]
    code = main([*argv, "--json", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    d = json.loads(out.read_text())
    assert d["paths"] == paths and len(d["segments"]) == 2
    # noise 1e-3 rad/s on rates of a few rad/s over 100 samples: errors ~1e-3 relative;
    # 2 % still catches a unit slip (57x) or swapped axes
    assert d["estimates"]["Ix/Iy"] == pytest.approx(0.5, rel=0.02)
    assert d["estimates"]["Iz/Iy"] == pytest.approx(1.3, rel=0.02)
    # per-window mode: the covariance of the median of the two windows, the tensor without a scale
    # (relative to I_yy) and principal axes that are the sensor axes by the model's assumption
    assert d["covariance"]["parameters"] == ["Ix/Iy", "Iz/Iy"]
    C = np.array(d["covariance"]["matrix"])
    assert np.all(np.linalg.eigvalsh(C) > 0) and np.array(d["covariance"]["matrix_total"]).shape == (2, 2)
    assert d["segments"][1]["covariance"]["parameters"] == ["Ix/Iy", "Iz/Iy"]
    inr = d["inertia"]
    assert inr["unit"].startswith("relative to I_yy") and inr["principal_axes"]["fixed_by_model"]
    assert inr["principal_moments"]["value"] == pytest.approx([0.5, 1.0, 1.3], rel=0.02)
    R = np.array(inr["principal_axes"]["rotation"])
    assert np.linalg.det(R) == pytest.approx(1.0) and np.allclose(np.abs(R), [[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    # progress on stderr (not a terminal): plain lines with the elapsed time and the phases
    for phase in ("loading 2/2", "compiling (then fitting 2 window(s)", "fitting: LM iteration"):
        assert re.search(r"\[ *[0-9.]+ s\] " + re.escape(phase), printed.err), printed.err
    # without the units: the unit check names the flag
    assert main(["fit", *paths, "--columns", cols, "--quiet"]) == 2
    assert "--time-unit ms" in capsys.readouterr().err
    # a missing second path exits 2 naming it, before anything is fitted
    assert main(["fit", paths[0], str(tmp_path / "nope.csv"), "--quiet"]) == 2
    assert "nope.csv: no such file or folder" in capsys.readouterr().err


def test_ctrl_c_ends_with_one_line_and_status_130(tmp_path):
    """Ctrl-C (SIGINT) while the fit compiles ends the command with one line on stderr and the
    shell's status for SIGINT (130), not JAX's traceback."""
    import signal

    def as_from_a_terminal():
        # the child inherits the test process's signal mask: a test worker that ran other tests
        # may have SIGINT blocked (seen under pytest-xdist: the child then never received it and
        # finished with 0); a command started from a shell has it unblocked and at its default
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    env = {**os.environ, NO_CACHE_ENV: "1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "rigidjax", "fit", "--tosses", "2", "--json", str(tmp_path / "out.json")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
    )
    seen = []
    for line in p.stderr:  # one plain line per phase (not a terminal)
        seen.append(line)
        if "compiling" in line:
            break
    p.send_signal(signal.SIGINT)
    _, rest = p.communicate(timeout=120)
    err = "".join(seen) + rest
    assert p.returncode == 130, err
    assert "rigidjax fit: interrupted" in err and "Traceback" not in err, err


def test_outputs_appear_only_when_complete(tmp_path):
    """The command line writes every output (--json, --plot, simulate's CSV) into a temporary
    file moved onto its name when complete: an interrupted write (Ctrl-C, a full disk) leaves
    no partial file under the name, a file already there stays as it was, and no temporary
    file is left behind."""
    from rigidjax.cli_fit import replacing

    out = tmp_path / "traj.csv"
    with pytest.raises(KeyboardInterrupt):
        with replacing(out) as tmp:
            tmp.write_text("t,wx\n0,1\n")
            raise KeyboardInterrupt
    assert not out.exists() and list(tmp_path.iterdir()) == []
    out.write_text("old")
    with pytest.raises(OSError):
        with replacing(out) as tmp:
            tmp.write_text("half")
            raise OSError("disk full")
    assert out.read_text() == "old" and list(tmp_path.iterdir()) == [out]
    with replacing(tmp_path / "plot.png") as tmp:
        assert tmp.suffix == ".png"  # matplotlib reads the format from the suffix
        tmp.write_bytes(b"png")
    assert (tmp_path / "plot.png").read_bytes() == b"png" and len(list(tmp_path.iterdir())) == 2
    assert main(["simulate", "--t-end", "0.05", "--out", str(tmp_path / "sim.csv")]) == 0
    assert (tmp_path / "sim.csv").read_text().startswith("t,") and len(list(tmp_path.iterdir())) == 3
    # a device is written in place, never replaced by a file
    with replacing(os.devnull) as tmp:
        assert str(tmp) == os.devnull
        tmp.write_text("nothing")
    assert not Path(os.devnull).is_file()
