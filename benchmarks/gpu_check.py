"""GPU check: the one script a lent GPU machine runs first (under 5 minutes on one H200).

    python -m benchmarks.gpu_check [--quick] [--sizes 1000,10000,100000,1000000]
                                   [--steppers midpoint,euler-parameters,variational]
                                   [--dtypes float32,float64] [--check-size 1000]
                                   [--budget 200] [--data DIR] [--no-fit] [--out PATH]

Sections, in this order (each one's failure is recorded and the script goes on):

1. **Throughput** (body-steps/s) of the three steppers on the standard body
   (``benchmarks/_common.py``: ``I = diag(1, 2, 3)``, ``omega0 = (0.01, 2, 0)``, ``dt = 1e-3``)
   for N identical members: :func:`rigidjax.ensemble.ensemble_rollout` (``model_batched=False``,
   ``save_every=n_steps``: initial and final states kept, so 10^6 members fit in memory) over
   ``jax.devices()``; ``n_steps = clip(work / N, 10, 1000)`` with ``work`` 10^8 body-steps for
   the midpoint step and 10^7 for the Newton steppers (Euler parameters, variational). Timing
   as the other benchmarks (``_common.timed``: best of 3 warm calls, wall clock, compilation
   reported apart). Here the midpoint rows, float32 (set against the goal of 10^9
   body-steps/s on one H200-class GPU: the printed ratio) then float64; the Newton
   steppers' rows come in step 4.
2. **Precision**: for each stepper one fixed rollout (``--check-size`` members, default 1000,
   ``n_steps`` as above, 1000 at that size) from seeded random initial body rates
   (``|omega0| = 2 rad/s``, uniform directions), in float64 (the reference), float32 at the
   default matmul precision and float32 under ``jax.default_matmul_precision("highest")``
   (TF32 and bf16 passes off on GPUs that use them for float32 dots by default). Reported:
   the largest difference of the final body rate (rad/s) and unit quaternion from float64's
   over the members; a check passes when float32 at the DEFAULT precision is within
   :data:`TOLERANCE` (ten times the largest float32 error measured on CPU, 2-core VM,
   2026-12-02: round-off, the Newton steppers' float32 stopping tolerance, no matmul
   shortcut there). The library traces its matrix products at ``'highest'`` whatever the
   caller's default (:func:`rigidjax.numerics.full_precision`), so ``highest/default`` is 1
   unless a product escapes that (a regression: one did, TF32 on an H200, before it); the
   whole float32 pipeline (initial states, rollout, outputs) runs under the precision
   tried. On an accelerator the float64 midpoint rollout is also run on the host CPU
   (``cpu_vs_device``: identical programs up to round-off, tolerance 1e-9 rad/s), and every
   stepper's float32 rollout too (``cpu_vs_device_f32``, reported). A
   512 x 512 float32 matmul against float64 (``matmul_probe``) says whether TF32 is active.
3. **Fit** of all shared racquet flips: :func:`rigidjax.identify.fit_inertia` per window
   (its defaults; float64), cold (compilation included) and warm wall time, status,
   estimates; on an accelerator the same fit on the host CPU and the differences of the
   estimates in their standard errors. Data from ``../shared/data/racquet-flips/flips``
   beside the clone (``--data``, ``RIGIDJAX_SHARED_DATA``); skipped with a note when absent.
4. The remaining throughput rows (the Newton steppers, Euler parameters and variational, by
   increasing N).

Budget (``--budget``, default 200 s counted from the start; the midpoint rows always run):
the Newton steppers' precision checks and the fit start only while the elapsed time is
within it, and a throughput row of step 4 only while the elapsed time plus its predicted
cost (the stepper's last compile time plus four calls scaled by N) is; anything skipped is
listed in ``skipped``. A section started just before the limit runs to its end, so the
whole run stays under 5 minutes unless one section takes more than ~1.5 min.

``--quick``: a CPU smoke run (N = 256, 1024 for the midpoint step, 256 for the others;
precision at N = 256, its 'highest' rerun for the midpoint step only, as XLA:CPU computes
float32 dots in float32 at any precision; 2 flips): ~1.5 min on the 2-core VM, nearly all
of it compiling the Newton steppers; ``--quick --steppers midpoint --sizes 256 --no-fit``
(what CI runs, ``tests/test_gpu_check.py``): ~12 s. float64 is enabled here with
``jax.config.update`` (a script; the library never flips it). Prints the tables under a
line with date, device and jax version; writes ``benchmarks/results/gpu_check.json`` (or
``--out``): ``header``, ``machine``, ``device``, ``throughput``, ``goal``, ``precision``,
``matmul_probe``, ``fit``, ``skipped``, ``errors``, ``ok``, ``wall_s``. Exit status 1 when
a precision check failed or a section raised, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from ._common import DT, machine, standard_case, table, timed, write_json

STEPPERS = ("midpoint", "euler-parameters", "variational")
FULL_SIZES = (1_000, 10_000, 100_000, 1_000_000)
QUICK_SIZES = {"midpoint": (256, 1024), "euler-parameters": (256,), "variational": (256,)}
#: body-steps per throughput call (n_steps = work / N, clipped to [MIN_STEPS, MAX_STEPS])
WORK = {"midpoint": 100_000_000, "euler-parameters": 10_000_000, "variational": 10_000_000}
MIN_STEPS, MAX_STEPS = 10, 1000
#: the GPU goal for the midpoint ensemble, float32, one H200-class GPU (body-steps/s)
GOAL = 1e9
#: float32 (default matmul precision) against float64 after the precision rollout: largest
#: difference of the final body rate (rad/s, |omega0| = 2 rad/s) and of the unit quaternion.
#: Ten times the largest measured on CPU (N = 256, 1000 steps, 2026-12-02: midpoint 3.4e-6 /
#: 2.8e-6, Euler parameters 1.7e-5 / 8.8e-6, variational 2.7e-3 / 4.6e-4; the variational
#: step stops its float32 Newton iteration at a looser tolerance), rounded up.
TOLERANCE = {
    "midpoint": {"omega": 1e-4, "quaternion": 1e-4},
    "euler-parameters": {"omega": 2e-4, "quaternion": 1e-4},
    "variational": {"omega": 3e-2, "quaternion": 5e-3},
}
#: float64 on the accelerator against float64 on the host CPU (rad/s): the same program up to
#: the order of floating-point operations, over 1000 steps.
CPU_VS_DEVICE_TOL = 1e-9
ROOT = Path(__file__).resolve().parents[1]


def n_steps_for(stepper: str, N: int) -> int:
    return int(np.clip(WORK[stepper] // N, MIN_STEPS, MAX_STEPS))


def _dtype(name: str):
    import jax.numpy as jnp

    return {"float32": jnp.float32, "float64": jnp.float64}[name]


@functools.lru_cache(maxsize=None)
def _case(stepper: str, dtype_name: str):
    """``standard_case`` once per (stepper, dtype): the same step object every call, so
    ``ensemble_rollout``'s compiled programs are shared between sections."""
    return standard_case(stepper, _dtype(dtype_name))


def _run_fn(stepper: str, dtype_name: str, n_steps: int, devices=None):
    """``run(states0) -> (final states, all converged)``: the ensemble rollout timed here."""
    import jax
    import jax.numpy as jnp

    from rigidjax.ensemble import ensemble_rollout

    step, model, _, _ = _case(stepper, dtype_name)

    def run(states0):
        tr = ensemble_rollout(
            step, model, states0, DT, n_steps, save_every=n_steps, model_batched=False, devices=devices
        )
        return jax.tree_util.tree_map(lambda a: a[:, -1], tr.states), jnp.all(tr.info.converged)

    return run


def _identical_states(stepper: str, dtype_name: str, N: int):
    import jax
    import jax.numpy as jnp

    s0 = _case(stepper, dtype_name)[2]
    return jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (N, *jnp.shape(a))) + 0, s0)


def _random_states(stepper: str, dtype_name: str, N: int, seed: int = 0):
    """``N`` members at rest in position, body rates ``2 u`` rad/s with ``u`` uniform on the sphere."""
    import jax
    import jax.numpy as jnp

    import rigidjax as rj
    from rigidjax import euler_parameters as ep
    from rigidjax import systems

    d = np.random.default_rng(seed).normal(size=(N, 3))
    w = jnp.asarray(2.0 * d / np.linalg.norm(d, axis=1, keepdims=True), _dtype(dtype_name))
    model = _case(stepper, dtype_name)[1]
    if stepper == "midpoint":
        make = lambda w: rj.RigidBodyState(angular_velocity=w)
    elif stepper == "euler-parameters":
        make = lambda w: ep.initial_state(model, angular_velocity=w[None])
    else:
        make = lambda w: systems.rigid_body_vi_state(model, rj.RigidBodyState(angular_velocity=w), check=False)
    return jax.vmap(make)(w)


def _physical(stepper: str, dtype_name: str, states):
    """(body rate (N, 3) rad/s, unit quaternion (N, 4)) of final states, as float64 NumPy."""
    from rigidjax import euler_parameters as ep
    from rigidjax import systems

    model = _case(stepper, dtype_name)[1]
    if stepper == "midpoint":
        w, q = states.angular_velocity, states.orientation
    elif stepper == "euler-parameters":
        w = ep.output(model, states, "AngularVelocityLocal")[:, 0]
        q = ep.output(model, states, "CoordinatesTotal")[:, 0, 3:]
    else:
        s = systems.rigid_body_state(model, states)
        w, q = s.angular_velocity, s.orientation
    q = np.asarray(q, float)
    return np.asarray(w, float), q / np.linalg.norm(q, axis=-1, keepdims=True)


def _diff(a, b) -> dict:
    (wa, qa), (wb, qb) = a, b
    sign = np.sign(np.sum(qa * qb, -1, keepdims=True))  # q and -q are the same attitude
    sign[sign == 0] = 1
    return {"omega": float(np.max(np.abs(wa - wb))), "quaternion": float(np.max(np.abs(qa - sign * qb)))}


class Clock:
    """Seconds since the start and the ``--budget`` test of step 4."""

    def __init__(self, budget: float):
        self.t0 = time.perf_counter()
        self.budget = budget

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def allows(self, predicted: float) -> bool:
        return self.budget <= 0 or self.elapsed() + predicted <= self.budget


def throughput_row(stepper: str, dtype_name: str, N: int) -> dict:
    import jax

    n = n_steps_for(stepper, N)
    run = _run_fn(stepper, dtype_name, n)
    states0 = _identical_states(stepper, dtype_name, N)
    first, best, cpu, (states, ok) = timed(run, states0)
    leaf = jax.tree_util.tree_leaves(states)[-1]
    return {
        "stepper": stepper,
        "dtype": dtype_name,
        "N": N,
        "steps": n,
        "body_steps_per_s": N * n / best,
        "run_s": best,
        "compile_s": max(first - best, 0.0),
        "converged": bool(ok),
        "state_dtype": str(leaf.dtype),
    }


def precision_row(stepper: str, N: int, on_accelerator: bool, highest: bool = True) -> dict:
    """float32 (default and, with ``highest``, 'highest' matmul precision) against float64
    after one rollout of ``N`` random members (module docstring); ``ok`` against :data:`TOLERANCE`."""
    import jax

    n = n_steps_for(stepper, N)
    out, conv, compile_s = {}, {}, {}
    configs = [("float64", "float64", None), ("float32", "float32", None)]
    if highest:
        configs.append(("float32-highest", "float32", "highest"))
    for label, dtype_name, prec in configs:
        # the whole pipeline (initial states, rollout, outputs) under the precision tried
        with jax.default_matmul_precision(prec) if prec else contextlib.nullcontext():
            run = _run_fn(stepper, dtype_name, n)
            s0 = _random_states(stepper, dtype_name, N)
            t = time.perf_counter()
            states, ok = jax.block_until_ready(run(s0))
            compile_s[label] = time.perf_counter() - t
            out[label], conv[label] = _physical(stepper, dtype_name, states), bool(ok)
    tol = TOLERANCE[stepper]
    d32 = _diff(out["float32"], out["float64"])
    nan = {"omega": float("nan"), "quaternion": float("nan")}
    d32h = _diff(out["float32-highest"], out["float64"]) if highest else nan
    row = {
        "stepper": stepper,
        "N": N,
        "steps": n,
        "f32_vs_f64_omega": d32["omega"],
        "f32_vs_f64_quaternion": d32["quaternion"],
        "f32highest_vs_f64_omega": d32h["omega"],
        "f32highest_vs_f64_quaternion": d32h["quaternion"],
        "default_vs_highest_omega": _diff(out["float32"], out["float32-highest"])["omega"] if highest else nan["omega"],
        "highest_over_default": d32h["omega"] / d32["omega"] if d32["omega"] > 0 else float("nan"),
        "tol_omega": tol["omega"],
        "tol_quaternion": tol["quaternion"],
        "converged": all(conv.values()),
        "first_call_s": compile_s,
    }
    row["ok"] = bool(row["converged"] and d32["omega"] <= tol["omega"] and d32["quaternion"] <= tol["quaternion"])
    if on_accelerator:
        # the same programs on the host CPU (initial states, rollout and outputs there):
        # float64 of the midpoint step to round-off (checked), float32 of each (reported: the
        # device's float32 against the CPU's, where TF32 or other shortcuts would show)
        cpu0 = jax.devices("cpu")[0]
        for dtype_name in ("float64", "float32") if stepper == "midpoint" else ("float32",):
            with jax.default_device(cpu0):
                cpu_run = _run_fn(stepper, dtype_name, n, devices=[cpu0])
                cpu_states, _ = jax.block_until_ready(cpu_run(_random_states(stepper, dtype_name, N)))
                dc = _diff(_physical(stepper, dtype_name, cpu_states), out[dtype_name])
            if dtype_name == "float64":
                row["cpu_vs_device_omega"] = dc["omega"]
                row["ok"] = row["ok"] and dc["omega"] <= CPU_VS_DEVICE_TOL
            else:
                row["cpu_vs_device_f32_omega"] = dc["omega"]
    return row


def matmul_probe() -> dict:
    """Relative error of a 512 x 512 float32 matmul (default and 'highest' precision) against float64."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 512, 512))
    ref = a @ b
    mm = jax.jit(jnp.matmul)
    a32, b32 = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    err = lambda c: float(np.max(np.abs(np.asarray(c, float) - ref)) / np.max(np.abs(ref)))
    default = err(mm(a32, b32))
    with jax.default_matmul_precision("highest"):
        highest = err(jax.jit(jnp.matmul)(a32, b32))
    return {
        "default_rel_err": default,
        "highest_rel_err": highest,
        # TF32 keeps 10 mantissa bits (~1e-3 relative per product); float32 24 (~1e-7)
        "tf32_or_lower_by_default": default > 1e-5,
    }


def _data_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    shared = Path(os.environ.get("RIGIDJAX_SHARED_DATA", ROOT.parent / "shared" / "data"))
    return shared / "racquet-flips" / "flips"


def fit_section(data: Path, quick: bool, on_accelerator: bool) -> dict:
    """fit_inertia on the shared flips (per window), cold and warm; on an accelerator, against the host CPU."""
    import jax

    from rigidjax.identify import fit_inertia
    from rigidjax.io import load_phyphox

    if not data.exists():
        return {"skipped": f"shared recordings not found at {data} (not redistributed; --data, RIGIDJAX_SHARED_DATA)"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        segs = load_phyphox(data)
        if quick:
            segs = segs[:2]
        times = []
        for _ in range(2):
            t = time.perf_counter()
            fit = fit_inertia(segs)
            times.append(time.perf_counter() - t)
        out = {
            "windows": len(segs),
            "samples": int(sum(s.n for s in segs)),
            "cold_s": times[0],
            "warm_s": times[1],
            "status": fit.status.value,
            "estimates": {k: float(v) for k, v in fit.estimates.items()},
            "uncertainties": {k: float(v) for k, v in fit.uncertainties.items()},
            "rms": float(fit.rms),
        }
        if on_accelerator:
            t = time.perf_counter()
            with jax.default_device(jax.devices("cpu")[0]):
                cpu = fit_inertia(segs)
            out["cpu_s"] = time.perf_counter() - t
            out["cpu_status"] = cpu.status.value
            out["device_minus_cpu_se"] = {
                k: float((fit.estimates[k] - cpu.estimates[k]) / fit.uncertainties[k])
                for k in fit.estimates
                if k in cpu.estimates and fit.uncertainties.get(k)
            }
    return out


TP_COLS = ["stepper", "dtype", "N", "steps", "body_steps_per_s", "compile_s", "converged"]
PR_COLS = [
    "stepper",
    "N",
    "steps",
    "f32_vs_f64_omega",
    "f32highest_vs_f64_omega",
    "f32_vs_f64_quaternion",
    "tol_omega",
    "tol_quaternion",
    "highest_over_default",
    "cpu_vs_device_f32_omega",
    "ok",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: small N, 2 flips")
    ap.add_argument("--sizes", default=None, help="comma-separated N (default 10^3 ... 10^6)")
    ap.add_argument("--steppers", default=",".join(STEPPERS))
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--check-size", type=int, default=None, help="members of the precision rollout (1000; quick 256)")
    ap.add_argument("--budget", type=float, default=None, help="s; later sections skipped (200; quick: 0 = none)")
    ap.add_argument("--data", default=None, help="folder of the racquet flips (default ../shared/data/...)")
    ap.add_argument("--no-fit", action="store_true")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/gpu_check.json)")
    args = ap.parse_args(argv)
    steppers = [s.strip() for s in args.steppers.split(",") if s.strip()]
    if set(steppers) - set(STEPPERS):
        ap.error(f"unknown stepper(s) {sorted(set(steppers) - set(STEPPERS))}; choose from {STEPPERS}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if set(dtypes) - {"float32", "float64"}:
        ap.error("--dtypes: float32 and/or float64")
    if args.sizes:
        sizes = {s: tuple(int(x) for x in args.sizes.split(",")) for s in STEPPERS}
    else:
        sizes = QUICK_SIZES if args.quick else {s: FULL_SIZES for s in STEPPERS}
    check_size = args.check_size or (256 if args.quick else 1000)
    clock = Clock(args.budget if args.budget is not None else (0.0 if args.quick else 200.0))

    import jax

    jax.config.update("jax_enable_x64", True)  # float64 rows; float32 rows pass their dtype explicitly
    dev = jax.devices()[0]
    on_acc = dev.platform != "cpu"
    device = {
        "platform": dev.platform,
        "kind": getattr(dev, "device_kind", str(dev)),
        "count": jax.device_count(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = f"{stamp}; device {device['kind']} x {device['count']} ({device['platform']}); jax {jax.__version__}"
    print(header, flush=True)
    rows, prec, skipped, errors = [], [], [], []
    result = {"header": header, "device": device, "quick": args.quick, "budget_s": clock.budget}

    def attempt(what, fn, *a):
        try:
            return fn(*a)
        except Exception as e:  # a check script: record, go on
            errors.append({"what": what, "error": f"{type(e).__name__}: {e}"})
            traceback.print_exc()
            print(f"ERROR in {what}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return None

    def tp(stepper, dtype_name, N):
        row = attempt(f"throughput {stepper} {dtype_name} N={N}", throughput_row, stepper, dtype_name, N)
        if row is not None:
            rows.append(row)
            print(table([row], TP_COLS).splitlines()[-1], flush=True)
        return row

    # 1. the goal: midpoint float32 (then float64) at every size
    if "midpoint" in steppers:
        for d in [d for d in ("float32", "float64") if d in dtypes]:
            for N in sizes["midpoint"]:
                tp("midpoint", d, N)
    mid32 = [r["body_steps_per_s"] for r in rows if r["stepper"] == "midpoint" and r["dtype"] == "float32"]
    best32 = max(mid32, default=None)
    result["goal"] = {
        "goal_body_steps_per_s": GOAL,
        "midpoint_float32_best": best32,
        "ratio": None if best32 is None else best32 / GOAL,
    }
    if best32 is not None:
        print(f"midpoint ensemble float32: best {best32:.3g} body-steps/s = {best32 / GOAL:.3g} x the goal", flush=True)

    # 2. precision
    result["matmul_probe"] = attempt("matmul probe", matmul_probe)
    for s in steppers:
        # XLA:CPU computes float32 dots in float32 at any precision (matmul_probe): a CPU
        # --quick run recompiles for 'highest' only for the midpoint step (seconds, not ~10 s)
        highest = on_acc or not args.quick or s == "midpoint"
        if s != "midpoint" and not clock.allows(0.0):
            skipped.append(dict(section=f"precision {s}", elapsed_s=clock.elapsed()))
            print(f"skipped precision {s}: past the {clock.budget:.0f} s budget", flush=True)
            continue
        row = attempt(f"precision {s}", precision_row, s, check_size, on_acc, highest)
        if row is not None:
            prec.append(row)
            print(table([row], PR_COLS).splitlines()[-1], flush=True)

    # 3. fit
    if args.no_fit:
        result["fit"] = {"skipped": "--no-fit"}
    elif not clock.allows(0.0):
        result["fit"] = {"skipped": f"past the {clock.budget:.0f} s budget at {clock.elapsed():.0f} s"}
    else:
        result["fit"] = attempt("fit", fit_section, _data_dir(args.data), args.quick, on_acc) or {"skipped": "error"}

    # 4. the Newton steppers by increasing N, while the budget lasts
    last_compile, last_run = {}, {}
    for N in sorted({N for s in steppers if s != "midpoint" for N in sizes[s]}):
        for s in [s for s in steppers if s != "midpoint" and N in sizes[s]]:
            for d in dtypes:
                key = (s, d)
                pred = 0.0
                if key in last_compile:
                    pred = last_compile[key] + 4 * last_run[key][1] * N / last_run[key][0]
                if not clock.allows(pred):
                    skipped.append(dict(stepper=s, dtype=d, N=N, predicted_s=pred, elapsed_s=clock.elapsed()))
                    print(f"skipped {s} {d} N={N}: predicted {pred:.0f} s, past the {clock.budget:.0f} s budget")
                    continue
                row = tp(s, d, N)
                if row is not None:
                    last_compile[key], last_run[key] = row["compile_s"], (N, row["run_s"])

    result.update(
        machine=machine(),
        throughput=rows,
        precision=prec,
        skipped=skipped,
        errors=errors,
        ok=not errors and all(r["ok"] for r in prec),
        wall_s=clock.elapsed(),
    )
    print()
    print(header)
    print(table(rows, TP_COLS))
    if best32 is not None:
        print(f"\nmidpoint ensemble float32, best: {best32:,.0f} body-steps/s; goal 1e9: ratio {best32 / GOAL:.3g}")
    print()
    print(table(prec, PR_COLS))
    if result["matmul_probe"]:
        print("\nmatmul probe (512^2 float32 vs float64, rel. err.):", json.dumps(result["matmul_probe"]))
    print("fit:", json.dumps(result["fit"], default=float))
    if skipped:
        print(f"skipped (budget): {len(skipped)} cases")
    print(f"errors: {len(errors)}; ok: {result['ok']}; wall {result['wall_s']:.0f} s")
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2, default=float))
    else:
        path = write_json("gpu_check", result)
    print("wrote", path)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
