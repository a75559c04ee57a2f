"""``identify.fit_many`` splits its rows over every device, in one process or several, and
gives the one-device fit.

The worker (``tests/_identify_devices_worker.py``) fits four windows; run here on this
process's one CPU device, in a subprocess with two host devices
(``--xla_force_host_platform_device_count=2``), and as two processes joined by
:mod:`rigidjax.launch` with one device each (both ``slow``: 1-4 min on the 2-core VM, a
compilation in each interpreter). Each row (a start of a window) is evaluated on
one device with the same arithmetic; only the rows per device differ, which may change XLA's
vectorisation and so the rounding: values and costs are compared to 1e-9 relative (the
optimiser stops at a relative decrement of 1e-10, so round-off in the last iterations may
move the optimum by that order) and the statuses exactly.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rigidjax import launch

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "_identify_devices_worker.py"
sys.path.insert(0, str(WORKER.parent))
import _identify_devices_worker as worker  # noqa: E402


def _env(**extra):
    env = dict(os.environ)
    for k in (launch.ENV_COORDINATOR, launch.ENV_NUM_PROCESSES, launch.ENV_PROCESS_ID, "XLA_FLAGS"):
        env.pop(k, None)
    env.update(extra)
    return env


def _compare(z, meta, devices, processes):
    assert meta["devices"] == devices and meta["process_count"] == processes, meta
    here = worker.fits()  # this process: one CPU device
    assert list(z["status"]) == list(here["status"]) == ["converged"] * 4, (z["status"], here["status"])
    for k in ("ratios", "se", "cost", "initial", "step_shift"):
        np.testing.assert_allclose(z[k], here[k], rtol=1e-9, atol=1e-12, err_msg=k)


@pytest.mark.slow  # ~1-2 min on 2 cores: a second interpreter compiles the fit for two devices
def test_two_host_devices_equal_one(tmp_path):
    out = tmp_path / "two.npz"
    p = subprocess.run(
        [sys.executable, str(WORKER), str(out)],
        cwd=ROOT,
        env=_env(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    z = np.load(out)
    _compare(z, json.loads(str(z["meta"])), devices=2, processes=1)


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    out = tmp_path / "mp.npz"
    cmd = [sys.executable, "-m", "rigidjax.launch", "-n", "2", "--devices-per-process", "1", "--timeout", "600"]
    p = subprocess.run([*cmd, str(WORKER), str(out)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=660)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    z = np.load(out)
    _compare(z, json.loads(str(z["meta"])), devices=2, processes=2)
