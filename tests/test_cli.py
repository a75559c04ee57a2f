"""Command line `rigidjax simulate`: output file, summary, errors."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from rigidjax import reference
from rigidjax.cli import main


def test_simulate_midpoint_writes_trajectory(tmp_path, capsys):
    out = tmp_path / "traj.csv"
    assert (
        main(["simulate", "--t-end", "2", "--dt", "0.01", "--out", str(out), "--json", str(tmp_path / "s.json")]) == 0
    )
    df = pd.read_csv(out)
    assert list(df.columns) == ["t", "x", "y", "z", "qw", "qx", "qy", "qz", "wx", "wy", "wz"]
    assert len(df) == 201
    # the omega column follows the exact solution to the method's accuracy (2nd order, dt = 0.01)
    exact = reference.torque_free_omega([1.0, 2.0, 3.0], [0.01, 2.0, 0.0], df["t"].to_numpy())
    assert abs(df[["wx", "wy", "wz"]].to_numpy() - exact).max() < 1e-3
    text = capsys.readouterr().out
    assert "energy_drift" in text and "angular_momentum_drift" in text


def test_simulate_body_and_spin_against_exact(tmp_path, capsys):
    """--inertia / --omega0: another body and spin; the rate error against the exact solution
    (Jacobi elliptic, rigidjax.reference) is reported and shrinks 4x when dt halves (second
    order: a ratio between 3 and 5 allows for the higher-order terms)."""
    err = []
    for dt in (0.02, 0.01):
        out, js = tmp_path / f"t{dt}.csv", tmp_path / f"s{dt}.json"
        argv = ["simulate", "--inertia", "2,1,2.5", "--omega0", "0.1,0.2,1.5", "--dt", str(dt), "--t-end", "3"]
        assert main([*argv, "--out", str(out), "--json", str(js), "--plot", str(tmp_path / "w.png")]) == 0
        df = pd.read_csv(out)
        exact = reference.torque_free_omega([2.0, 1.0, 2.5], [0.1, 0.2, 1.5], df["t"].to_numpy())
        err.append(abs(df[["wx", "wy", "wz"]].to_numpy() - exact).max())
        summary = json.loads(js.read_text())
        # the CSV keeps 10 significant digits of rates ~1.5 rad/s: 1e-9 rad/s covers its rounding
        assert summary["max_rate_error_vs_exact"] == pytest.approx(err[-1], abs=1e-9)
    assert 3 < err[0] / err[1] < 5 and err[1] < 1e-4, err
    assert (tmp_path / "w.png").stat().st_size > 10_000
    assert "free spin, I = diag(2, 1, 2.5) kg m^2, omega0 = (0.1, 0.2, 1.5) rad/s" in capsys.readouterr().out


@pytest.mark.parametrize("stepper", ["ep", "vi"])
def test_simulate_other_steppers(stepper, tmp_path, capsys):
    out = tmp_path / "traj.csv"
    assert main(["simulate", "--stepper", stepper, "--t-end", "0.5", "--dt", "0.01", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    exact = reference.torque_free_omega([1.0, 2.0, 3.0], [0.01, 2.0, 0.0], df["t"].to_numpy())
    # both steppers are second order: at dt = 0.01 over 0.5 s the rate error is ~1e-4
    assert abs(df[["wx", "wy", "wz"]].to_numpy() - exact).max() < 1e-3
    text = capsys.readouterr().out
    assert "energy_drift" in text and "max_constraint_violation" in text


@pytest.mark.parametrize(
    "argv,match",
    [
        (["simulate", "--dt", "0"], "must be > 0"),
        (["simulate", "--dt", "-1"], "must be > 0"),
        (["simulate", "--dt", "nan"], "must be > 0"),
        (["simulate", "--t-end", "0"], "must be > 0"),
        (["simulate", "--dt", "1e-7"], "choose a larger --dt"),
        (["simulate", "--inertia", "1,1,5"], "exceeds the sum of the other two"),
        (["simulate", "--inertia", "1,-2,2"], "must be > 0"),
        (["simulate", "--omega0", "1,2"], "--omega0: expected three comma-separated numbers"),
        (["simulate", "--omega0", "1,x,2"], "--omega0: expected three comma-separated numbers"),
        (["simulate", "--omega0", "1,nan,2"], "omega0 must be 3 finite numbers"),
    ],
)
def test_simulate_bad_arguments(argv, match, tmp_path, capsys):
    assert main(argv + ["--out", str(tmp_path / "x.csv")]) == 2
    assert match in capsys.readouterr().err


def test_simulate_reaches_t_end(tmp_path):
    # t_end not a multiple of dt, and dt > t_end: a whole number of steps reaching t_end
    out = tmp_path / "t.csv"
    assert main(["simulate", "--dt", "0.03", "--t-end", "0.1", "--out", str(out)]) == 0
    assert pd.read_csv(out)["t"].iloc[-1] == pytest.approx(0.12)
    assert main(["simulate", "--dt", "0.2", "--t-end", "0.3", "--out", str(out)]) == 0
    assert len(pd.read_csv(out)) == 3


def test_simulate_too_large_step_is_a_clear_error(tmp_path, capsys):
    # |omega| dt = 2 rad: checked mode refuses it with the reason
    assert main(["simulate", "--dt", "1", "--t-end", "3", "--out", str(tmp_path / "t.csv")]) == 2
    assert "ROTATION_LIMIT" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full (writes to it fail: no space left on device)")
def test_stdout_that_cannot_be_written_is_a_clear_error(tmp_path):
    """``rigidjax simulate ... > /dev/full``: one line on stderr naming standard output and the
    reason, exit status 2 (was a traceback, status 1); the files are still written. Also on the
    way out through argparse (--version)."""
    env = {**os.environ, "RIGIDJAX_NO_COMPILATION_CACHE": "1"}
    out = tmp_path / "t.csv"
    argv = ["simulate", "--dt", "0.1", "--t-end", "0.1", "--out", str(out), "--json", str(tmp_path / "s.json")]
    for args, cmd in ((argv, "rigidjax simulate"), (["--version"], "rigidjax")):
        with open("/dev/full", "w") as full:
            r = subprocess.run(
                [sys.executable, "-m", "rigidjax", *args], stdout=full, stderr=subprocess.PIPE, text=True, env=env
            )
        assert r.returncode == 2, r.stderr
        assert r.stderr == f"{cmd}: error: cannot write to standard output: No space left on device\n"
    assert len(pd.read_csv(out)) == 2 and "energy_drift" in json.loads((tmp_path / "s.json").read_text())
    # stdout closed (>&-): the same line; stderr full: progress lost, the exit code the command's
    # own; a file that cannot be written: one line naming it, status 2 (was a pandas traceback)
    closed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; os.close(1); sys.argv[1:] = sys.argv[1:]; from rigidjax.cli import run; run()",
            *argv,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert closed.returncode == 2, closed.stderr
    # (a descriptor closed before Python starts leaves sys.stdout None: "it is closed")
    assert closed.stderr in (
        "rigidjax simulate: error: cannot write to standard output: Bad file descriptor\n",
        "rigidjax simulate: error: cannot write to standard output: it is closed\n",
    )
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "rigidjax", *argv], stdout=subprocess.PIPE, stderr=full, env=env)
    assert r.returncode == 0
    bad = [*argv[:-4], "--out", "/dev/full"]
    r = subprocess.run([sys.executable, "-m", "rigidjax", *bad], capture_output=True, text=True, env=env)
    assert (
        r.returncode == 2 and r.stderr == "rigidjax simulate: error: cannot write /dev/full: No space left on device\n"
    )
