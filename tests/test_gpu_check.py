"""benchmarks/gpu_check.py --quick runs on CPU and writes the JSON a GPU run will write.

The fast test runs the midpoint step alone at one size without the fit (~8 s on the 2-core
VM: interpreter start, three small compilations); the slow one runs the whole ``--quick``
(the Newton steppers, the fit of two shared flips when present; ~90 s).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, *args, timeout=300):
    out = tmp_path / "gpu_check.json"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # one host device, as the script documents for --quick
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--quick", "--out", str(out), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text()), p.stdout


def _check_common(r, stdout):
    assert r["ok"] and r["errors"] == []
    assert r["device"]["platform"] == "cpu" and r["device"]["jax"]
    assert r["machine"]["time_utc"]
    # the header (date, device, jax version) and the goal ratio are printed
    assert "device cpu" in stdout and "jax " in stdout and "goal 1e9: ratio" in stdout
    for row in r["throughput"]:
        assert row["body_steps_per_s"] > 0 and row["converged"]
        assert row["state_dtype"] == row["dtype"]  # float32 rows stay float32 with x64 on
    g = r["goal"]
    assert g["goal_body_steps_per_s"] == 1e9 and g["ratio"] == pytest.approx(g["midpoint_float32_best"] / 1e9)
    for p in r["precision"]:
        # float32 against float64 differs by round-off (> 0) and within the stated tolerance
        assert 0 < p["f32_vs_f64_omega"] <= p["tol_omega"]
        assert 0 < p["f32_vs_f64_quaternion"] <= p["tol_quaternion"]
    assert r["matmul_probe"]["tf32_or_lower_by_default"] is False  # XLA:CPU: float32 dots in float32


def test_gpu_check_quick_midpoint(tmp_path):
    r, stdout = _run(tmp_path, "--steppers", "midpoint", "--sizes", "256", "--no-fit", timeout=120)
    _check_common(r, stdout)
    assert [(x["stepper"], x["dtype"], x["N"]) for x in r["throughput"]] == [
        ("midpoint", "float32", 256),
        ("midpoint", "float64", 256),
    ]
    (p,) = r["precision"]
    # on CPU the 'highest' precision recompiles and gives the very same float32 numbers
    assert p["f32highest_vs_f64_omega"] == p["f32_vs_f64_omega"] and p["default_vs_highest_omega"] == 0
    assert r["fit"] == {"skipped": "--no-fit"}


@pytest.mark.slow
def test_gpu_check_quick_full(tmp_path, racquet_path):
    r, stdout = _run(tmp_path, timeout=600)
    _check_common(r, stdout)
    assert {x["stepper"] for x in r["throughput"]} == {"midpoint", "euler-parameters", "variational"}
    assert {x["stepper"] for x in r["precision"]} == {"midpoint", "euler-parameters", "variational"}
    if racquet_path.is_dir():
        assert r["fit"]["windows"] == 2 and r["fit"]["warm_s"] > 0 and r["fit"]["estimates"]
    else:
        assert "not found" in r["fit"]["skipped"]
