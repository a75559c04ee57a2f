"""Single-body steps per second: rigidjax (jitted scan) against Exudyn and MuJoCo's C step.

    python -m benchmarks.bench_single [--quick]

One standard torque-free body (``I = diag(1, 2, 3)``, ``omega0 = (0.01, 2, 0)``, ``dt = 1e-3``),
``n`` steps, one process:

* rigidjax: ``jit(rollout)`` of each stepper (a ``lax.scan``; trajectory stored), best of 3;
* MuJoCo C: ``mujoco.mj_step`` in a Python loop and ``mujoco.rollout`` (the C loop) where present;
* Exudyn: one rigid body, ``SolveDynamic`` (its default generalized-alpha, sparse solver).

Writes ``benchmarks/results/bench_single.json``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ._common import DT, OMEGA0, have, machine, standard_case, table, timed, write_json
from .bench_throughput import MJX_XML, bench_exudyn


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    import rigidjax as rj

    jax.config.update("jax_enable_x64", True)
    n = 2000 if args.quick else 20000
    rows = []
    for stepper in ("midpoint", "midpoint-lu", "euler-parameters", "variational"):
        for dtype in (jnp.float64, jnp.float32):
            step, model, s0, energy = standard_case(stepper, dtype)
            m = n if stepper.startswith("midpoint") else n // 10
            f = jax.jit(lambda s, step=step, model=model, m=m: rj.rollout(step, model, s, DT, m))
            first, best, cpu, tr = timed(f, s0)
            E = np.asarray(energy(model, tr.states), dtype=float)
            rows.append(
                {
                    "code": f"rigidjax {stepper} (jit scan)",
                    "dtype": jnp.dtype(dtype).name,
                    "steps": m,
                    "steps_per_s": m / best,
                    "compile_s": first - best,
                    "energy_drift": float(np.max(np.abs(E / E[0] - 1))),
                }
            )
            print(table([rows[-1]], COLS).splitlines()[-1], flush=True)
    notes = []
    if have("mujoco"):
        import mujoco

        model = mujoco.MjModel.from_xml_string(MJX_XML)
        data = mujoco.MjData(model)
        data.qvel[3:] = OMEGA0
        t = time.perf_counter()
        for _ in range(n):
            mujoco.mj_step(model, data)
        w = time.perf_counter() - t
        I = np.array([1.0, 2.0, 3.0])
        E0 = 0.5 * np.sum(I * np.asarray(OMEGA0) ** 2)
        drift = abs(0.5 * np.sum(I * data.qvel[3:] ** 2) / E0 - 1)
        rows.append(
            {
                "code": f"MuJoCo {mujoco.__version__} mj_step (Python loop)",
                "dtype": "float64",
                "steps": n,
                "steps_per_s": n / w,
                "compile_s": 0.0,
                "energy_drift": float(drift),
            }
        )
        print(table([rows[-1]], COLS).splitlines()[-1], flush=True)
        try:
            from mujoco import rollout as mj_rollout

            data2 = mujoco.MjData(model)
            data2.qvel[3:] = OMEGA0
            state0 = np.zeros(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS))
            mujoco.mj_getState(model, data2, state0, mujoco.mjtState.mjSTATE_FULLPHYSICS)
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                st, _ = mj_rollout.rollout(model, data2, state0[None], nstep=n)
                best = min(best, time.perf_counter() - t)
            qvel = st[0, -1, 1 + model.nq : 1 + model.nq + model.nv]
            drift = abs(0.5 * np.sum(I * qvel[3:] ** 2) / E0 - 1)
            rows.append(
                {
                    "code": f"MuJoCo {mujoco.__version__} rollout (C loop)",
                    "dtype": "float64",
                    "steps": n,
                    "steps_per_s": n / best,
                    "compile_s": 0.0,
                    "energy_drift": float(drift),
                }
            )
            print(table([rows[-1]], COLS).splitlines()[-1], flush=True)
        except Exception as e:  # older/newer mujoco without rollout
            notes.append(f"mujoco.rollout unavailable: {type(e).__name__}: {e}"[:200])
    else:
        notes.append("MuJoCo not installed (pip install 'rigidjax[bench]'): skipped")
    if have("exudyn"):
        r = bench_exudyn(1, args.quick)
        rows.append(
            {
                "code": r["code"],
                "dtype": "float64",
                "steps": r["steps"],
                "steps_per_s": r["body_steps_per_s"],
                "compile_s": 0.0,
                "energy_drift": r["energy_drift"],
            }
        )
        print(table([rows[-1]], COLS).splitlines()[-1], flush=True)
    else:
        notes.append("Exudyn not installed (pip install 'rigidjax[bench]'): skipped")
    print()
    print(table(rows, COLS))
    for n_ in notes:
        print("note:", n_)
    print("wrote", write_json("bench_single", {"machine": machine(), "rows": rows, "notes": notes}))


COLS = ["code", "dtype", "steps", "steps_per_s", "compile_s", "energy_drift"]

if __name__ == "__main__":
    main()
