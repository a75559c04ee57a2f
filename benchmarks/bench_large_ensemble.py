"""Large vmapped rollouts (the XLA:CPU deadlock probe): N = 4096 and 16384 bodies, each in its
own subprocess under a hard timeout.

    python -m benchmarks.bench_large_ensemble [--quick] [--timeout 300] [--sizes 4096,16384]
                                              [--steppers midpoint,midpoint-lu,ep,vi]
                                              [--dtypes float64,float32] [--steps N]

Another JAX simulator hangs on this kind of machine (2 cores) at 4096+ bodies in a vmapped
scan; this script runs ``jit(vmap(rollout))`` of a stepper at those sizes with the full
trajectory stored, each case in a fresh interpreter killed after ``--timeout`` seconds, and
reports whether it finished, its time and body-steps/s. A hang shows as ``timeout``.
Steppers: ``midpoint``, the LAPACK-based layout baseline ``midpoint-lu``, ``ep`` (Euler
parameters, generalized-alpha Newton) and ``vi`` (variational, DEL Newton); by default the
midpoint cases (float64, float32) and ``midpoint-lu`` (float64). ``--steps`` overrides the
number of steps (default 1000 / 500 at N <= / > 4096, a tenth with ``--quick``). Writes
``benchmarks/results/bench_large_ensemble.json``.
"""

from __future__ import annotations

import argparse
import textwrap

from ._common import machine, subprocess_json, table, write_json

CODE = textwrap.dedent(
    """
    import json, time
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    from benchmarks._common import ensemble_fn
    fn, s0, drift_of = ensemble_fn({stepper!r}, {N}, {n}, jnp.{dtype})
    t = time.perf_counter(); out = jax.block_until_ready(fn(s0)); first = time.perf_counter() - t
    t = time.perf_counter(); out = jax.block_until_ready(fn(s0)); run = time.perf_counter() - t
    print("RESULT" + json.dumps(dict(first_s=first, run_s=run, drift=float(drift_of(out[0])), converged=bool(out[1]))))
    """
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--sizes", default="4096,16384")
    ap.add_argument("--steppers", default=None, help="comma-separated: midpoint, midpoint-lu, ep, vi")
    ap.add_argument("--dtypes", default=None, help="comma-separated: float64, float32 (with --steppers)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default by N)")
    args = ap.parse_args(argv)
    rows = []
    if args.steppers is None:
        cases = [("midpoint", "float64"), ("midpoint", "float32"), ("midpoint-lu", "float64")]
    else:
        names = [STEPPERS.get(s.strip(), s.strip()) for s in args.steppers.split(",")]
        unknown = sorted(set(names) - set(STEPPERS.values()))
        if unknown:
            ap.error(f"unknown stepper(s) {unknown}; choose from {sorted(STEPPERS)}")
        cases = [(s, d.strip()) for s in names for d in (args.dtypes or "float64").split(",")]
    for N in [int(s) for s in args.sizes.split(",")]:
        n = (100 if args.quick else 1000) if N <= 4096 else (50 if args.quick else 500)
        n = args.steps or n
        for stepper, dtype in cases:
            r = subprocess_json(CODE.format(stepper=stepper, N=N, n=n, dtype=dtype), args.timeout)
            row = {"stepper": stepper, "dtype": dtype, "N": N, "steps": n}
            if "error" in r:
                row["outcome"] = r["error"]
            else:
                row.update(
                    outcome="finished",
                    first_call_s=r["first_s"],
                    run_s=r["run_s"],
                    body_steps_per_s=N * n / r["run_s"],
                    energy_drift=r["drift"],
                    converged=r["converged"],
                )
            rows.append(row)
            print(table([row], COLS).splitlines()[-1], flush=True)
    print()
    print(table(rows, COLS))
    print("wrote", write_json("bench_large_ensemble", {"machine": machine(), "rows": rows, "timeout_s": args.timeout}))


STEPPERS = {"midpoint": "midpoint", "midpoint-lu": "midpoint-lu", "ep": "euler-parameters", "vi": "variational"}
COLS = [
    "stepper",
    "dtype",
    "N",
    "steps",
    "outcome",
    "first_call_s",
    "run_s",
    "body_steps_per_s",
    "energy_drift",
    "converged",
]

if __name__ == "__main__":
    main()
