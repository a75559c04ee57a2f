"""Benchmark: fit every kept flip of the shared racquet recordings, rigidjax vs a SciPy baseline.

    python -m benchmarks.bench_fit [--data DIR] [--baseline-segments N] [--starts K] [--quick]

``--quick`` fits 12 evenly spaced flips and 2 baseline segments.

Both fit, per segment, the same model (principal moments along the phone axes, up to scale,
plus the initial angular velocity) to the measured body rates at the measured timestamps:

* rigidjax: :func:`rigidjax.identify.fit_inertia` (Levenberg-Marquardt, forward-mode
  Jacobians through rollouts of the seed's midpoint step, all segments and starts vmapped);
  timed cold (first call: includes JAX compilation) and warm (second call).
* baseline: the straightforward approach, ``scipy.optimize.least_squares`` (trust-region
  reflective, finite-difference Jacobian) around ``scipy.integrate.solve_ivp`` (RK45,
  rtol 1e-6, atol 1e-8) of Euler's equations, one segment after another, from the same equation-error
  starting point rigidjax uses (so both solve the same problems from the same place).

Prints a table and writes ``benchmarks/results/bench_fit.json`` (the folder is created).
The shared data are not redistributed: the script reads them from ``../shared/data`` beside
the clone (or ``--data`` / ``RIGIDJAX_SHARED_DATA``) and exits with a message if absent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _default_data() -> Path:
    shared = Path(os.environ.get("RIGIDJAX_SHARED_DATA", ROOT.parent / "shared" / "data"))
    return shared / "racquet-flips" / "flips"


def scipy_fit(seg, start):
    """One segment with least_squares + solve_ivp; returns (Ix/Iy, Iz/Iy, rms, nfev, success)."""
    from scipy.integrate import solve_ivp
    from scipy.optimize import least_squares

    t = seg.t - seg.t[0]

    def residual(p):
        ix, iz = p[0], p[1]
        inertia = np.array([ix, 1.0, iz])

        def rhs(_t, w):
            return -np.cross(w, inertia * w) / inertia

        sol = solve_ivp(rhs, (0.0, t[-1]), p[2:], t_eval=t, rtol=1e-6, atol=1e-8)
        if not sol.success or sol.y.shape[1] != t.size:
            return np.full(3 * t.size, 1e3)
        return (sol.y.T - seg.omega).ravel()

    p0 = np.concatenate([start, seg.omega[0]])
    lo = np.array([1e-3, 1e-3, -np.inf, -np.inf, -np.inf])
    res = least_squares(residual, p0, bounds=(lo, np.inf), x_scale="jac")
    rms = float(np.sqrt(np.mean(res.fun**2)))
    return float(res.x[0]), float(res.x[1]), rms, int(res.nfev), bool(res.success)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="folder of phyphox exports (default: the shared racquet flips)")
    ap.add_argument(
        "--baseline-segments", type=int, default=8,
        help="fit N evenly spaced segments with SciPy and extrapolate to all (default 8; 0 = all)",
    )
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="12 evenly spaced flips, 2 baseline segments")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_fit.json"))
    args = ap.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    from rigidjax.identify import _Spec, _equation_error_guess, fit_inertia
    from rigidjax.midpoint import midpoint_step
    from rigidjax.io import load_phyphox

    data = Path(args.data) if args.data else _default_data()
    if not data.exists():
        print(f"bench_fit: shared recordings not found at {data} (not redistributed; set --data)", file=sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        segs = load_phyphox(data)
    if args.quick:
        segs = segs[:: max(1, len(segs) // 12)][:12]
        args.baseline_segments = 2
    n_samples = sum(s.n for s in segs)
    print(f"{len(segs)} kept flips, {n_samples} samples, from {data}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU(s) visible, jax {jax.__version__} ({jax.default_backend()})")

    rows = {}
    # the joint fit shares one body: rounds 2-3 only (round 1's tosses imply another body)
    racquet = [s for s in segs if "round1" not in s.source] or segs
    for label, kw, ss in (("per-segment", dict(joint=False), segs), ("joint (rounds 2-3)", dict(joint=True), racquet)):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = fit_inertia(ss, starts=args.starts, **kw)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = fit_inertia(ss, starts=args.starts, **kw)
        warm = time.perf_counter() - t0
        rows[f"rigidjax {label}"] = {
            "cold_s": cold, "warm_s": warm, "Ix/Iy": fit.estimates["Ix/Iy"], "Iz/Iy": fit.estimates["Iz/Iy"],
            "rms": fit.rms, "status": fit.status, "segments": len(ss),
            "converged": sum(s["status"] == "converged" for s in fit.segments) if label == "per-segment" else None,
        }
        if label == "per-segment":
            ours = fit

    n_base = len(segs) if args.baseline_segments <= 0 else min(args.baseline_segments, len(segs))
    pick = np.unique(np.linspace(0, len(segs) - 1, n_base).round().astype(int))  # spread over recordings
    n_base = pick.size
    spec = _Spec(False, None, False, 1, midpoint_step)
    base = []
    t0 = time.perf_counter()
    for s in (segs[i] for i in pick):
        moments, _, _ = _equation_error_guess([s], spec)
        moments = np.maximum(moments, 1e-3 * moments.sum())
        base.append(scipy_fit(s, np.array([moments[0], moments[2]]) / moments[1]))
    t_base = time.perf_counter() - t0
    base = np.array(base)
    ok = base[:, 4].astype(bool)
    ours_sub = np.array([[ours.segments[i]["estimates"]["Ix/Iy"], ours.segments[i]["estimates"]["Iz/Iy"], ours.segments[i]["rms"]] for i in pick])
    rows["scipy least_squares + solve_ivp"] = {
        "cold_s": t_base, "warm_s": t_base, "segments": n_base,
        "Ix/Iy": float(np.median(base[ok, 0])) if ok.any() else None,
        "Iz/Iy": float(np.median(base[ok, 1])) if ok.any() else None,
        "rms": float(np.sqrt(np.mean(base[:, 2] ** 2))), "status": f"{int(ok.sum())} of {n_base} succeeded",
        "rigidjax_rms_same_segments": float(np.sqrt(np.mean(ours_sub[:, 2] ** 2))),
        "nfev_median": float(np.median(base[:, 3])),
    }
    ours_time = rows["rigidjax per-segment"]
    # per-segment comparison of the two fits on the same segments (same problems, same start)
    agree = np.abs(ours_sub[:, 0] - base[:, 0]) / base[:, 0]
    base_per_seg = t_base / n_base
    est_all = base_per_seg * len(segs)
    summary = {
        "segments": len(segs),
        "samples": n_samples,
        "baseline_segments": n_base,
        "baseline_s_all_extrapolated": est_all,
        "speedup_warm": est_all / ours_time["warm_s"],
        "speedup_cold": est_all / ours_time["cold_s"],
        "median_rel_diff_Ix_over_Iy": float(np.median(agree)),
        "segments_within_1pct": int(np.sum(agree < 0.01)),
    }
    print()
    print(f"{'method':<34} {'time (s)':>18} {'median Ix/Iy':>13} {'median Iz/Iy':>13} {'RMS rad/s':>10}  status")
    for k, r in rows.items():
        tt = f"{r['cold_s']:.1f}" if k.startswith("scipy") else f"{r['cold_s']:.1f} / {r['warm_s']:.1f}"
        print(f"{k:<34} {tt:>18} {r['Ix/Iy'] or float('nan'):>13.3f} {r['Iz/Iy'] or float('nan'):>13.3f} {r['rms']:>10.4f}  {r['status']}")
    print("(rigidjax: cold = first call incl. JAX compilation / warm = second call)")
    print(
        f"\nSciPy baseline: {t_base:.1f} s for {n_base} segment(s) ({base_per_seg:.2f} s each; "
        f"{est_all:.0f} s for all {len(segs)}). Speed-up: {summary['speedup_warm']:.0f}x warm, "
        f"{summary['speedup_cold']:.0f}x cold. Same segments: median |ΔIx/Iy| / Ix/Iy = "
        f"{summary['median_rel_diff_Ix_over_Iy']:.2g}, {summary['segments_within_1pct']} of {n_base} within 1 %."
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(
        {"rows": rows, "summary": summary, "data": str(data), "jax": jax.__version__,
         "quick": args.quick}, indent=2,
    ))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
