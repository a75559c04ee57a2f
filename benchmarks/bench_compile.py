"""Compile time against the number of steps: flat, because rollouts are one ``lax.scan``.

    python -m benchmarks.bench_compile [--quick]

``jax.jit(rollout).lower(...).compile()`` for each stepper and ``n_steps`` = 10 ... 100000
(the standard torque-free body, float64), forward and reverse mode (``grad`` of the final
kinetic energy); the first run's tracing+compile seconds. Writes
``benchmarks/results/bench_compile.json``.
"""

from __future__ import annotations

import argparse
import time

from ._common import DT, machine, standard_case, table, write_json


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steppers", default="midpoint,euler-parameters,variational")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    import rigidjax as rj

    jax.config.update("jax_enable_x64", True)
    counts = [10, 1000, 100000] if args.quick else [10, 100, 1000, 10000, 100000]
    rows = []
    for stepper in args.steppers.split(","):
        step, model, s0, energy = standard_case(stepper, jnp.float64)
        for n in counts:
            row = {"stepper": stepper, "n_steps": n}
            for mode in ("forward", "grad"):

                def loss(s, n=n, step=step, model=model):
                    tr = rj.rollout(step, model, s, DT, n)
                    final = jax.tree_util.tree_map(lambda a: a[-1], tr.states)
                    return jnp.sum(energy(model, final))

                f = jax.jit(loss if mode == "forward" else jax.grad(loss))
                t = time.perf_counter()
                f.lower(s0).compile()
                row[f"{mode}_compile_s"] = time.perf_counter() - t
            rows.append(row)
            print(table([row], COLS).splitlines()[-1], flush=True)
    print()
    print(table(rows, COLS))
    print("wrote", write_json("bench_compile", {"machine": machine(), "rows": rows}))


COLS = ["stepper", "n_steps", "forward_compile_s", "grad_compile_s"]

if __name__ == "__main__":
    main()
