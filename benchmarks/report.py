"""Render the latest ``benchmarks/results/*.json`` as the markdown tables of ``benchmarks/README.md``.

python -m benchmarks.report
"""

from __future__ import annotations

import json

from ._common import RESULTS, table


def _load(name):
    p = RESULTS / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def main():
    out = []
    thr = _load("bench_throughput")
    if thr:
        m = thr["machine"]
        out.append(
            f"Machine: {m['nproc']} cores ({m['cpu']}), jax {m['jax']}, load average {m['load_avg_1_5_15']} "
            f"at {m['time_utc']} UTC\n"
        )
        out.append("### Ensemble throughput (body-steps/s, wall clock, best of 3)\n")
        out.append(
            table(
                thr["rows"],
                [
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
                ],
            )
        )
        out.append("\n" + table(thr["ratios"], list(thr["ratios"][0].keys())))
        for n in thr.get("notes", []):
            out.append(f"\nNote: {n}")
    for name, title, cols in (
        ("bench_large_ensemble", "Large ensembles in subprocesses with a timeout (deadlock probe)", None),
        ("bench_single", "Single body (steps/s)", None),
        ("bench_compile", "Compile time against number of steps (s)", None),
        ("bench_float32", "float32 against float64 (dt = 1e-3)", None),
    ):
        d = _load(name)
        if d:
            rows = d["rows"]
            cols = cols or [k for k in rows[0].keys() if k != "note"]
            out.append(f"\n### {title}\n")
            out.append(table(rows, cols))
    g = _load("bench_gradient")
    if g:
        out.append("\n### Reverse mode through 1000 steps\n")
        out.append(table(g["cost"], list(g["cost"][0].keys())))
        out.append("\n### Memory of the gradient against rollout length (XLA temp buffers, MB)\n")
        out.append(
            table(
                g["memory"],
                [
                    c
                    for c in [
                        "n_steps",
                        "forward_temp_MB",
                        "plain_temp_MB",
                        "k",
                        "checkpointed_temp_MB",
                        "discrete_temp_MB",
                    ]
                    if c in g["memory"][0]
                ],
            )
        )
    print("\n".join(out))


if __name__ == "__main__":
    main()
