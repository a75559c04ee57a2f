"""Two JAX processes on this machine (CPU, gloo collectives, coordinator on 127.0.0.1) give the
single-process ensemble; rigidjax.launch starts them and rigidjax.launch.initialize joins them.

The two-process runs start ``tests/_multiprocess_worker.py`` through ``python -m
rigidjax.launch -n 2 --devices-per-process 2`` (4 global devices); each process passes the same
full ensemble to :func:`rigidjax.ensemble.ensemble_rollout`, which shards the members over
the 4 devices, and gathers the final states with ``process_allgather``. Measured on the
2-core VM (2026-12-02): the two runs agree bit for bit (largest difference 0 for every
stepper and field). Runtimes there: the midpoint test ~33 s (three interpreter starts and
imports, a compile in each process and here), the three steppers ~2.7 min (``slow``: each
Newton stepper compiles ~10 s, in both processes at once on the 2 cores, and here).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from rigidjax import launch

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "_multiprocess_worker.py"
sys.path.insert(0, str(WORKER.parent))
import _multiprocess_worker as worker  # noqa: E402


def _env():
    env = dict(os.environ)
    for k in (launch.ENV_COORDINATOR, launch.ENV_NUM_PROCESSES, launch.ENV_PROCESS_ID, "XLA_FLAGS"):
        env.pop(k, None)
    return env


def _two_processes(tmp_path, steppers, timeout):
    out = tmp_path / "mp.npz"
    cmd = [sys.executable, "-m", "rigidjax.launch", "-n", "2", "--devices-per-process", "2", "--timeout", str(timeout)]
    p = subprocess.run(
        [*cmd, str(WORKER), str(out), *steppers],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    z = np.load(out)
    meta = json.loads(str(z["meta"]))
    assert meta["info"] == {"source": "environment", "process_id": 0, "num_processes": 2}
    assert meta["process_count"] == 2 and meta["devices"] == 4 and meta["local_devices"] == 2
    return z, meta


def _compare(z, meta, name):
    # E = 8 over 4 devices stays sharded: process 0 holds its 4 members only
    assert meta[f"{name}/8/addressable_members"] == 4
    for E in (8, 7):
        final, conv, _ = worker.run(name, E)  # this process alone: one CPU device
        assert np.all(z[f"{name}/{E}/converged"]) and bool(np.all(conv))
        fields = [k.split("/")[-1] for k in z.files if k.startswith(f"{name}/{E}/") and not k.endswith("converged")]
        assert "time" in fields and len(fields) >= 3
        for f in fields:
            a, b = z[f"{name}/{E}/{f}"], np.asarray(getattr(final, f))
            assert a.shape == b.shape, (name, E, f)
            # the same per-member arithmetic in both runs; only the batch each device holds
            # differs (8 members against 2 per device), which may change XLA's vectorisation
            # and so the rounding: 200 steps of rates ~2 rad/s, 1e-12 is ~5000 eps
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=f"{name} E={E} {f}")


def test_two_processes_midpoint_equal_one_process(tmp_path):
    z, meta = _two_processes(tmp_path, ["midpoint"], timeout=150)
    _compare(z, meta, "midpoint")


@pytest.mark.slow
def test_two_processes_every_stepper_equal_one_process(tmp_path):
    steppers = ["midpoint", "euler-parameters", "variational"]
    z, meta = _two_processes(tmp_path, steppers, timeout=400)
    for name in steppers:
        _compare(z, meta, name)


def test_launch_sets_environment_and_returns_first_failure(tmp_path):
    code = (
        "import os, sys, pathlib; e = os.environ; i = e['RIGIDJAX_PROCESS_ID']; "
        f"pathlib.Path(r'{tmp_path}', i).write_text(e['RIGIDJAX_COORDINATOR_ADDRESS'] + ' ' + "
        "e['RIGIDJAX_NUM_PROCESSES'] + ' ' + e['XLA_FLAGS'] + ' ' + e['JAX_PLATFORMS']); "
        "sys.exit(3 if i == '1' else 0)"
    )
    rc = launch.launch(["-c", code], 3, devices_per_process=2, env=_env(), grace=5)
    assert rc == 3
    seen = [(tmp_path / str(i)).read_text().split() for i in range(3)]
    assert len({s[0] for s in seen}) == 1 and seen[0][0].startswith("127.0.0.1:")
    assert all(s[1:] == ["3", "--xla_force_host_platform_device_count=2", "cpu"] for s in seen)
    assert launch.launch(["-c", "pass"], 2, env=_env()) == 0


def test_launch_stops_the_others_after_a_failure():
    # process 1 fails at once; process 0 would sleep a minute: stopped after the grace period
    code = "import os, sys, time; sys.exit(2) if os.environ['RIGIDJAX_PROCESS_ID'] == '1' else time.sleep(60)"
    rc = launch.launch(["-c", code], 2, env=_env(), grace=0.5, timeout=30)
    assert rc == 2


def test_initialize_without_peers_does_nothing(monkeypatch):
    for k in (launch.ENV_COORDINATOR, launch.ENV_NUM_PROCESSES, launch.ENV_PROCESS_ID, "SLURM_JOB_ID"):
        monkeypatch.delenv(k, raising=False)
    assert launch.initialize() == {"source": "none", "process_id": 0, "num_processes": 1}
    assert not jax.distributed.is_initialized()


def test_initialize_refuses_partial_settings(monkeypatch):
    with pytest.raises(ValueError, match="together"):
        launch.initialize("127.0.0.1:1234", 2)
    monkeypatch.setenv(launch.ENV_COORDINATOR, "127.0.0.1:1234")
    monkeypatch.delenv(launch.ENV_NUM_PROCESSES, raising=False)
    with pytest.raises(ValueError, match="RIGIDJAX_NUM_PROCESSES"):
        launch.initialize()
    monkeypatch.setenv(launch.ENV_NUM_PROCESSES, "2")
    monkeypatch.setenv(launch.ENV_PROCESS_ID, "2")
    with pytest.raises(ValueError, match="process_id"):
        launch.initialize()
    monkeypatch.setenv(launch.ENV_PROCESS_ID, "x")
    with pytest.raises(ValueError, match="integers"):
        launch.initialize()
    with pytest.raises(ValueError, match="host:port"):
        launch.initialize("localhost", 2, 0)
    assert not jax.distributed.is_initialized()


@pytest.mark.slow
def test_readme_scaling_recipe(tmp_path):
    """README's "Scaling out" script and local command, as written (~30 s)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n# scaled.py\n") + len("```python\n")
    (tmp_path / "scaled.py").write_text(text[start : text.index("```", start)])
    command = "python -m rigidjax.launch -n 2 --devices-per-process 2 scaled.py"
    assert f"`{command}`" in text
    p = subprocess.run(
        [sys.executable, *command.split()[1:]], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 processes, 4 devices, final rates (4096, 3)" in p.stdout
