"""Large vmapped rollouts (the XLA:CPU deadlock probe): N = 4096 and 16384 bodies, each in its
own subprocess under a hard timeout.

    python -m benchmarks.bench_large_ensemble [--quick] [--timeout 300] [--sizes 4096,16384]

Another JAX simulator hangs on this kind of machine (2 cores) at 4096+ bodies in a vmapped
scan; this script runs ``jit(vmap(rollout))`` of the midpoint step (and of the LAPACK-based
layout baseline ``midpoint-lu``) at those sizes with the full trajectory stored, float64 and
float32, each case in a fresh interpreter killed after ``--timeout`` seconds, and reports
whether it finished, its time and body-steps/s. A hang shows as ``timeout``. Writes
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
    fn, s0 = ensemble_fn({stepper!r}, {N}, {n}, jnp.{dtype})
    t = time.perf_counter(); out = jax.block_until_ready(fn(s0)); first = time.perf_counter() - t
    t = time.perf_counter(); out = jax.block_until_ready(fn(s0)); run = time.perf_counter() - t
    print("RESULT" + json.dumps(dict(first_s=first, run_s=run, drift=float(out[1]), converged=bool(out[2]))))
    """
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--sizes", default="4096,16384")
    args = ap.parse_args(argv)
    rows = []
    cases = [("midpoint", "float64"), ("midpoint", "float32"), ("midpoint-lu", "float64")]
    for N in [int(s) for s in args.sizes.split(",")]:
        n = (100 if args.quick else 1000) if N <= 4096 else (50 if args.quick else 500)
        for stepper, dtype in cases:
            r = subprocess_json(CODE.format(stepper=stepper, N=N, n=n, dtype=dtype), args.timeout)
            row = {"stepper": stepper, "dtype": dtype, "N": N, "steps": n}
            if "error" in r:
                row["outcome"] = r["error"]
            else:
                row.update(outcome="finished", first_call_s=r["first_s"], run_s=r["run_s"], body_steps_per_s=N * n / r["run_s"], energy_drift=r["drift"], converged=r["converged"])
            rows.append(row)
            print(table([row], COLS).splitlines()[-1], flush=True)
    print()
    print(table(rows, COLS))
    print("wrote", write_json("bench_large_ensemble", {"machine": machine(), "rows": rows, "timeout_s": args.timeout}))


COLS = ["stepper", "dtype", "N", "steps", "outcome", "first_call_s", "run_s", "body_steps_per_s", "energy_drift", "converged"]

if __name__ == "__main__":
    main()
