"""Command line `rigidjax simulate`: output file, summary, errors."""

import pandas as pd
import pytest

from rigidjax import reference
from rigidjax.cli import main


def test_simulate_midpoint_writes_trajectory(tmp_path, capsys):
    out = tmp_path / "traj.csv"
    assert main(["simulate", "--t-end", "2", "--dt", "0.01", "--out", str(out), "--json", str(tmp_path / "s.json")]) == 0
    df = pd.read_csv(out)
    assert list(df.columns) == ["t", "x", "y", "z", "qw", "qx", "qy", "qz", "wx", "wy", "wz"]
    assert len(df) == 201
    # the omega column follows the exact solution to the method's accuracy (2nd order, dt = 0.01)
    exact = reference.torque_free_omega([1.0, 2.0, 3.0], [0.01, 2.0, 0.0], df["t"].to_numpy())
    assert abs(df[["wx", "wy", "wz"]].to_numpy() - exact).max() < 1e-3
    text = capsys.readouterr().out
    assert "energy_drift" in text and "angular_momentum_drift" in text


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


@pytest.mark.parametrize("argv", [["simulate", "--dt", "0"], ["simulate", "--dt", "-1"], ["simulate", "--t-end", "0"]])
def test_simulate_bad_arguments(argv, tmp_path):
    with pytest.raises(SystemExit, match="must be > 0"):
        main(argv + ["--out", str(tmp_path / "x.csv")])
