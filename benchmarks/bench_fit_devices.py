"""Benchmark: ``identify.fit_many`` on the shared racquet flips with 1 and 2 host devices.

    python -m benchmarks.bench_fit_devices [--data DIR] [--devices 1 2] [--starts K] [--quick]

Each device count runs in its own process (``--xla_force_host_platform_device_count``; the
fit's rows, starts x windows, are split over ``jax.devices()``, see
:mod:`rigidjax.identify._program`): every kept flip of the shared rounds as one problem
(``Ix/Iy``, ``Iz/Iy`` in ``transforms.MomentRatios``, the initial body rate; gyroscope
``sigma = 1 rad/s``; midpoint step, 2 sub-steps per sample for every window; ``--starts``
starts from the same equation-error start; ``step_check="report"``), padded to the longest
window: one ``fit_many`` call, timed cold (compilation included) and warm (the second call):
wall clock and CPU (user + system, the child process). Prints a table with the speed-up of
each device count against one and the largest difference of the estimates against one
device (relative); writes ``benchmarks/results/bench_fit_devices.json``. ``--quick``: 12
windows. The shared data are not redistributed: read from ``../shared/data`` beside the
clone (or ``--data`` / ``RIGIDJAX_SHARED_DATA``); exits with a message if absent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

from benchmarks.bench_fit import ROOT, _cpu, _default_data


def _inertia(m):
    return m.inertia


def child(data: Path, starts: int, quick: bool) -> dict:
    """The fits in this process (on its devices): timings and estimates."""
    import dataclasses

    import jax

    jax.config.update("jax_enable_x64", True)  # a benchmark script; the library never flips it
    import jax.numpy as jnp
    import numpy as np

    import rigidjax as rj
    from benchmarks._sysid import chart, ratios
    from rigidjax import identify
    from rigidjax.identify import observations as obs
    from rigidjax.identify import transforms as tr
    from rigidjax.identify._model import Spec, equation_error_guess
    from rigidjax.io import load_phyphox

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        segs = load_phyphox(data)
    if quick:
        segs = segs[:: max(1, len(segs) // 12)][:12]
    spec = Spec(False, None, False)
    parameter = identify.Parameter(_inertia, tr.MomentRatios(), into=tr.MomentRatios.inertia)
    model, stepper = rj.RigidBody(1.0, np.eye(3)), rj.Midpoint(max_rotation=float("inf"))
    observations, initial = (
        [obs.AngularVelocity(bias=False, sigma=1.0)],
        identify.FreeBodyInitial(("angular_velocity",)),
    )
    problems = []
    for s in segs:
        th = equation_error_guess([s], spec)
        m = np.maximum(th[:3], 1e-3 * np.sum(np.abs(th[:3])))
        start = np.array(ratios(chart(m[0] / m[1], m[2] / m[1])))
        state0 = rj.RigidBodyState(angular_velocity=jnp.asarray(s.omega[0]))
        problems.append(
            identify.Problem(
                model=model,
                stepper=stepper,
                parameters={"ratios": dataclasses.replace(parameter, start=start)},
                observations=observations,
                segments=[identify.MeasuredSegment(t=s.t - s.t[0], data={"omega": s.omega}, state0=state0)],
                initial=initial,
                substeps=2,
            )
        )
    times = []
    for _ in range(2):
        t0, c0 = time.perf_counter(), _cpu()
        fits = identify.fit_many(problems, starts=starts, step_check="report")
        times.append((time.perf_counter() - t0, _cpu() - c0))
    return {
        "devices": len(jax.devices()),
        "windows": len(problems),
        "samples": int(sum(s.n for s in segs)),
        "cold_s": times[0][0],
        "cold_cpu_s": times[0][1],
        "warm_s": times[1][0],
        "warm_cpu_s": times[1][1],
        "ratios": [[float(v) for v in f.values["ratios"]] for f in fits],
        "status": [str(f.status) for f in fits],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    data = Path(args.data) if args.data else _default_data()
    if not data.exists():
        print(f"bench_fit_devices: shared recordings not found at {data} (not redistributed; set --data)")
        return 2
    if args.child:
        print(json.dumps(child(data, args.starts, args.quick)))
        return 0
    import numpy as np

    from benchmarks._common import machine, write_json

    rows = []
    for n in args.devices:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={n}", JAX_PLATFORMS="cpu")
        cmd = [sys.executable, "-m", "benchmarks.bench_fit_devices", "--child", "--data", str(data)]
        cmd += ["--starts", str(args.starts)] + (["--quick"] if args.quick else [])
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout[-2000:], p.stderr[-2000:])
            return 1
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    one = rows[0]
    print(f"identify.fit_many: {one['windows']} windows, {one['samples']} samples, {args.starts} starts each")
    print(f"{'devices':>7} {'cold s':>8} {'warm s':>8} {'warm CPU s':>10} {'speed-up warm':>13} {'max rel diff':>12}")
    for r in rows:
        r["speedup_warm"] = one["warm_s"] / r["warm_s"]
        a, b = np.array(r["ratios"]), np.array(one["ratios"])
        r["max_rel_diff"] = float(np.max(np.abs(a - b) / np.abs(b)))
        r["same_status"] = r["status"] == one["status"]
        print(
            f"{r['devices']:>7} {r['cold_s']:>8.1f} {r['warm_s']:>8.2f} {r['warm_cpu_s']:>10.2f} "
            f"{r['speedup_warm']:>13.2f} {r['max_rel_diff']:>12.1e}"
        )
    payload = {"machine": machine(), "starts": args.starts, "quick": args.quick, "rows": rows}
    print("wrote", write_json("bench_fit_devices", payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
