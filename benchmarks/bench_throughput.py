"""Ensemble throughput (body-steps per second) of each stepper, against MuJoCo MJX and Exudyn.

    python -m benchmarks.bench_throughput [--quick] [--sizes 1,64,4096] [--steppers midpoint,...]
                                          [--dtypes float64,float32] [--no-peers]

N copies of the standard torque-free body (``I = diag(1, 2, 3)``, ``omega0 = (0.01, 2, 0)``,
``dt = 1e-3``), all in ONE process, side by side:

* rigidjax steppers (``midpoint`` = the library's step, ``midpoint-final`` = the same with
  ``save_every=n_steps`` (initial and final state kept, as the peers' runs below),
  ``euler-parameters-final`` and ``variational-final`` likewise; a ``-traced`` suffix passes
  the model as an argument of the jitted function, as a parameter fit does, so the steps see
  no structural zeros in it (zero resistance, diagonal inertia),
  ``midpoint-lu`` = the same step with
  a batched LAPACK solve on ``(N, 6, 6)`` and array-of-structures layout (the layout
  baseline), ``euler-parameters`` (generalized-alpha, Newton), ``variational`` (DEL,
  Newton)): ``jit(vmap(rollout))`` with the whole trajectory stored, as
  :func:`rigidjax.ensemble.ensemble_rollout` does on one device;
* MuJoCo MJX: one free body, ``jit(vmap(mjx.step))`` inside a ``lax.scan`` (final state only),
  MJX's default float32, Euler integrator, same inertia/rates/dt; above ``--mjx-chunk``
  members (2048) each step is a ``lax.map`` over vmaps of 2048, because one vmap of N >= 4096
  deadlocks in jaxlib's batched LAPACK on 2-core CPUs (README.md); each MJX size runs in a
  fresh subprocess under ``--peer-timeout``;
* Exudyn: N rigid bodies (Euler-parameter nodes) in ONE system, sparse solver (EigenSparse),
  its default generalized-alpha integrator, ``SolveDynamic`` timed.

Each row reports the energy drift the run reached (max over members and, for rigidjax,
over time; at the end for the peers), so speed is never bought with accuracy; it is computed
after the timed rollout, not inside it. Timing: best of 3 warm calls (wall clock; compile
excluded and reported separately). Writes
``benchmarks/results/bench_throughput.json``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ._common import DT, INERTIA, OMEGA0, ensemble_fn, have, machine, table, timed, write_json

FULL_SIZES = [1, 16, 256, 1024, 4096, 16384]
QUICK_SIZES = [1, 64, 1024]
# body-steps per measurement (n_steps = work / N, clipped): ~1 s of the slowest stepper
WORK = {
    "midpoint": 8_000_000,
    "midpoint-final": 20_000_000,
    "midpoint-lu": 1_000_000,
    "euler-parameters": 1_000_000,
    "euler-parameters-final": 1_000_000,
    "variational": 1_000_000,
    "variational-final": 1_000_000,
}
MIN_STEPS, MAX_STEPS = 10, 2000


def n_steps_for(stepper: str, N: int, quick: bool) -> int:
    w = WORK.get(stepper.removesuffix("-ensemble").removesuffix("-traced"), 100_000) // (8 if quick else 1)
    return int(np.clip(w // N, MIN_STEPS, MAX_STEPS // (4 if quick else 1)))


def bench_rigidjax(stepper: str, N: int, dtype_name: str, quick: bool) -> dict:
    import jax.numpy as jnp

    dtype = jnp.float64 if dtype_name == "float64" else jnp.float32
    n = n_steps_for(stepper, N, quick)
    fn, states0, drift_of = ensemble_fn(stepper, N, n, dtype)
    first, best, cpu, (states, ok) = timed(fn, states0)
    drift = drift_of(states)
    return {
        "code": f"rigidjax {stepper}",
        "dtype": dtype_name,
        "N": N,
        "steps": n,
        "body_steps_per_s": N * n / best,
        "body_steps_per_cpu_s": N * n / cpu if cpu > 0 else float("nan"),
        "compile_s": first - best,
        "energy_drift": float(drift),
        "all_converged": bool(ok),
    }


MJX_XML = f"""
<mujoco>
  <option timestep="{DT}" gravity="0 0 0" integrator="Euler"/>
  <worldbody><body><freejoint/>
    <inertial pos="0 0 0" mass="1" diaginertia="{INERTIA[0]} {INERTIA[1]} {INERTIA[2]}"/>
  </body></worldbody>
</mujoco>
"""


# Largest vmap of mjx.step measured not to deadlock on the 2-core VM (1024 and 2048 finish;
# 4096 hangs in jaxlib's batched Cholesky, see README.md)
MJX_CHUNK = 2048


def bench_mjx(N: int, quick: bool, dtype_name: str = "float32", chunk: int = MJX_CHUNK) -> dict:
    """MJX throughput; ``chunk > 0`` and ``N > chunk``: each step is a ``lax.map`` over
    ``N / chunk`` vmaps of ``chunk`` members (the deadlock work-around; ``chunk = 0``: one vmap
    of all N, which hangs at N >= 4096 on 2 cores)."""
    import jax

    # MJX follows the x64 flag (its float32 mode needs x64 off while tracing and running)
    with jax.enable_x64(dtype_name == "float64"):
        return _bench_mjx(N, quick, dtype_name, chunk)


def _bench_mjx(N: int, quick: bool, dtype_name: str, chunk: int) -> dict:
    import jax
    import jax.numpy as jnp
    import mujoco
    from mujoco import mjx

    m = mujoco.MjModel.from_xml_string(MJX_XML)
    d = mujoco.MjData(m)
    d.qvel[3:] = OMEGA0  # free joint: angular velocity in the body (local) frame
    mx = mjx.put_model(m)
    dx = mjx.put_data(m, d)
    n = n_steps_for("midpoint-lu", N, quick)
    batch = jax.tree_util.tree_map(
        lambda a: jnp.broadcast_to(a, (N, *jnp.shape(a))) + 0 if hasattr(a, "shape") else a, dx
    )
    vstep = jax.vmap(mjx.step, in_axes=(None, 0))
    k = N // chunk if chunk and N > chunk and N % chunk == 0 else 1
    tmap = jax.tree_util.tree_map

    @jax.jit
    def run(b):
        if k == 1:
            return jax.lax.scan(lambda c, _: (vstep(mx, c), None), b, None, length=n)[0]
        # (k, chunk, ...) layout for the whole rollout; lax.map runs the k vmaps one after another
        b = tmap(lambda a: a.reshape(k, N // k, *a.shape[1:]), b)
        out = jax.lax.scan(lambda c, _: (jax.lax.map(lambda x: vstep(mx, x), c), None), b, None, length=n)[0]
        return tmap(lambda a: a.reshape(N, *a.shape[2:]), out)

    first, best, cpu, out = timed(run, batch)
    w = np.asarray(out.qvel[:, 3:], dtype=float)
    Ivec = np.asarray(INERTIA)
    E0 = 0.5 * float(np.sum(Ivec * np.asarray(OMEGA0) ** 2))
    E = 0.5 * np.sum(Ivec * w**2, -1)
    return {
        "code": "MuJoCo MJX " + mujoco.__version__ + (f" ({k} x {N // k} vmap)" if k > 1 else ""),
        "dtype": str(out.qvel.dtype),
        "N": N,
        "steps": n,
        "body_steps_per_s": N * n / best,
        "body_steps_per_cpu_s": N * n / cpu if cpu > 0 else float("nan"),
        "compile_s": first - best,
        "energy_drift": float(np.max(np.abs(E / E0 - 1))),
        "all_converged": bool(np.all(np.isfinite(w))),
    }


def _isolated_mjx(N: int, quick: bool, dtype_name: str, timeout: float, chunk: int = MJX_CHUNK) -> dict:
    """MJX in a fresh interpreter under a timeout: on 2-core CPUs ``jit(vmap(mjx.step))`` at
    N >= 4096 deadlocks inside jaxlib's batched LAPACK (``ParallelBatchMap`` of two
    concurrent Cholesky custom calls waits on XLA's 2-thread pool; see README.md)."""
    from ._common import subprocess_json

    code = (
        "import json, jax\n"
        "jax.config.update('jax_enable_x64', True)\n"
        "from benchmarks.bench_throughput import bench_mjx\n"
        f"print('RESULT' + json.dumps(bench_mjx({N}, {quick}, {dtype_name!r}, {chunk})))\n"
    )
    r = subprocess_json(code, timeout)
    if "error" in r:
        return {
            "code": "MuJoCo MJX",
            "dtype": dtype_name,
            "N": N,
            "error": ("hung (deadlock), killed: " if "timeout" in r["error"] else "") + r["error"],
        }
    return r


def bench_exudyn(N: int, quick: bool) -> dict:
    import exudyn as exu
    import exudyn.utilities as eu

    n = n_steps_for("euler-parameters", N, quick) if N > 1 else 1000
    SC = exu.SystemContainer()
    mbs = SC.AddSystem()
    inertia = eu.RigidBodyInertia(mass=1.0, inertiaTensor=np.diag(INERTIA))
    bodies = [
        mbs.CreateRigidBody(
            inertia=inertia, referencePosition=[3.0 * i, 0, 0], initialAngularVelocity=list(OMEGA0), gravity=[0, 0, 0]
        )
        for i in range(N)
    ]
    mbs.Assemble()
    ss = exu.SimulationSettings()
    ss.timeIntegration.numberOfSteps = n
    ss.timeIntegration.endTime = n * DT
    ss.timeIntegration.verboseMode = 0
    ss.linearSolver.solverType = exu.LinearSolverType.EigenSparse
    ss.solution.file.write = False
    ss.show.computationTime = False
    ss.show.statistics = False
    best, best_cpu = float("inf"), float("nan")
    for _ in range(2):  # SolveDynamic restarts from the initial values each time
        t, c = time.perf_counter(), time.process_time()
        exu.SolveDynamic(mbs, ss)
        w, c = time.perf_counter() - t, time.process_time() - c
        if w < best:
            best, best_cpu = w, c
    nodes = [mbs.GetObject(b)["nodeNumber"] for b in bodies]
    wl = np.array([mbs.GetNodeOutput(k, exu.OutputVariableType.AngularVelocityLocal) for k in nodes])
    Ivec = np.asarray(INERTIA)
    E0 = 0.5 * float(np.sum(Ivec * np.asarray(OMEGA0) ** 2))
    E = 0.5 * np.sum(Ivec * wl**2, -1)
    return {
        "code": "Exudyn " + exu.__version__ + " (EigenSparse)",
        "dtype": "float64",
        "N": N,
        "steps": n,
        "body_steps_per_s": N * n / best,
        "body_steps_per_cpu_s": N * n / best_cpu if best_cpu > 0 else float("nan"),
        "compile_s": 0.0,
        "energy_drift": float(np.max(np.abs(E / E0 - 1))),
        "all_converged": bool(np.all(np.isfinite(wl))),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes and few steps (a smoke run)")
    ap.add_argument("--sizes", default=None, help="comma-separated ensemble sizes N")
    ap.add_argument(
        "--steppers",
        default="midpoint,midpoint-final,midpoint-lu,euler-parameters,euler-parameters-final,variational,variational-final",
    )
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("--no-peers", action="store_true", help="skip MuJoCo MJX and Exudyn")
    ap.add_argument("--no-mjx", action="store_true", help="skip MuJoCo MJX only")
    ap.add_argument(
        "--mjx-chunk",
        type=int,
        default=MJX_CHUNK,
        help="MJX ensembles larger than this run as a lax.map over vmaps of this size (one vmap of "
        "N >= 4096 deadlocks on 2 cores); 0: one vmap of all N, to reproduce the deadlock",
    )
    ap.add_argument("--mjx-dtypes", default="float32", help="MJX precisions to run (MJX's default is float32)")
    ap.add_argument("--max-n-newton", type=int, default=16384, help="largest N for the Newton-based steppers")
    ap.add_argument(
        "--peer-timeout",
        type=float,
        default=240.0,
        help="MJX runs in a subprocess killed after this many seconds (it deadlocks at N >= 4096 on 2 cores)",
    )
    ap.add_argument(
        "--host-devices",
        type=int,
        default=None,
        help="split the CPU into this many JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count); "
        "the '-ensemble' rows shard over them",
    )
    args = ap.parse_args(argv)
    if args.host_devices:
        import os

        if "jax" in sys.modules:
            ap.error("--host-devices must be set before JAX is imported: run python -m benchmarks.bench_throughput")
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.host_devices}"
        ).strip()

    import jax

    jax.config.update("jax_enable_x64", True)  # float64 available; each run picks its dtype
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if args.quick else FULL_SIZES)
    rows, notes = [], []
    for stepper in args.steppers.split(","):
        for dt_name in args.dtypes.split(","):
            for N in sizes:
                if (
                    stepper.removesuffix("-ensemble").removesuffix("-traced").removesuffix("-final")
                    in ("euler-parameters", "variational")
                    and N > args.max_n_newton
                ):
                    continue
                try:
                    r = bench_rigidjax(stepper, N, dt_name, args.quick)
                except Exception as e:  # report, keep going
                    r = {
                        "code": f"rigidjax {stepper}",
                        "dtype": dt_name,
                        "N": N,
                        "error": f"{type(e).__name__}: {e}"[:200],
                    }
                rows.append(r)
                print(table([r], COLS).splitlines()[-1], flush=True)
    if not args.no_peers:
        peers = (
            []
            if args.no_mjx
            else [
                (
                    "MuJoCo MJX",
                    "mujoco.mjx",
                    lambda N, q, d=d: _isolated_mjx(N, q, d, args.peer_timeout, args.mjx_chunk),
                )
                for d in args.mjx_dtypes.split(",")
            ]
        )
        peers.append(("Exudyn", "exudyn", bench_exudyn))
        for name, mod, fn in peers:
            if not have(mod):
                notes.append(f"{name} not installed (pip install 'rigidjax[bench]'): skipped")
                print(notes[-1])
                continue
            for N in sizes:
                try:
                    r = fn(N, args.quick)
                except Exception as e:
                    r = {"code": name, "N": N, "error": f"{type(e).__name__}: {e}"[:200]}
                rows.append(r)
                print(table([r], COLS).splitlines()[-1], flush=True)
    # ratios against the peers at each N, same process; "final" rows keep only the last state
    # (as the MJX and Exudyn runs do), the others store the whole trajectory
    ratios = []
    for N in sizes:
        get = lambda code, dt=None: next(  # noqa: E731
            (
                r["body_steps_per_s"]
                for r in rows
                if r.get("N") == N
                and (r.get("code") == code or (code in ("MuJoCo MJX", "Exudyn") and r.get("code", "").startswith(code)))
                and "error" not in r
                and (dt is None or r.get("dtype") == dt)
            ),
            None,
        )
        mjx_, exu_ = get("MuJoCo MJX", "float32"), get("Exudyn")

        def ratio(a, b):
            return a / b if a and b else float("nan")

        fin64, fin32 = get("rigidjax midpoint-final", "float64"), get("rigidjax midpoint-final", "float32")
        mid64, lu64 = get("rigidjax midpoint", "float64"), get("rigidjax midpoint-lu", "float64")
        ratios.append(
            {
                "N": N,
                "midpoint-final f64 / MJX f32": ratio(fin64, mjx_),
                "midpoint-final f32 / MJX f32": ratio(fin32, mjx_),
                "midpoint-final f64 / Exudyn": ratio(fin64, exu_),
                "midpoint (trajectory) f64 / Exudyn": ratio(mid64, exu_),
                "EP-final f64 / Exudyn": ratio(get("rigidjax euler-parameters-final", "float64"), exu_),
                "EP (trajectory) f64 / Exudyn": ratio(get("rigidjax euler-parameters", "float64"), exu_),
                "VI-final f64 / Exudyn": ratio(get("rigidjax variational-final", "float64"), exu_),
                "VI (trajectory) f64 / Exudyn": ratio(get("rigidjax variational", "float64"), exu_),
                "EP-final-traced f64 / Exudyn": ratio(get("rigidjax euler-parameters-final-traced", "float64"), exu_),
                "VI-final-traced f64 / Exudyn": ratio(get("rigidjax variational-final-traced", "float64"), exu_),
                "midpoint / midpoint-lu (f64)": ratio(mid64, lu64),
                "midpoint-final-ensemble f64 / MJX f32": ratio(
                    get("rigidjax midpoint-final-ensemble", "float64"), mjx_
                ),
                "midpoint-final-ensemble f64 / Exudyn": ratio(get("rigidjax midpoint-final-ensemble", "float64"), exu_),
                "EP-final-ensemble f64 / Exudyn": ratio(
                    get("rigidjax euler-parameters-final-ensemble", "float64"), exu_
                ),
                "VI-final-ensemble f64 / Exudyn": ratio(get("rigidjax variational-final-ensemble", "float64"), exu_),
            }
        )
    # keep the columns this run measured
    keep = [k for k in ratios[0] if k == "N" or any(np.isfinite(r[k]) for r in ratios)] if ratios else []
    ratios = [{k: r[k] for k in keep} for r in ratios]
    print()
    print(table(rows, COLS))
    print()
    if ratios and len(ratios[0]) > 1:  # some ratio was measured
        print(table(ratios, list(ratios[0].keys())))
    for n_ in notes:
        print("note:", n_)
    payload = {
        "machine": machine(),
        "host_devices": args.host_devices,
        "rows": rows,
        "ratios": ratios,
        "notes": notes,
        "quick": args.quick,
    }
    print("wrote", write_json("bench_throughput", payload))
    return payload


COLS = [
    "code",
    "dtype",
    "N",
    "steps",
    "body_steps_per_s",
    "body_steps_per_cpu_s",
    "compile_s",
    "energy_drift",
    "all_converged",
    "error",
]

if __name__ == "__main__":
    main()
