"""``rigidjax fit-pendulum``: a physical pendulum from gyroscope recordings."""

from __future__ import annotations

import json
import math
import sys
import time

from ..identify import FitStatus, exit_code
from ..identify._result import pm
from ..identify.pendulum import combine_pendulum, fit_pendulum_segments
from ..io import DataError
from ._common import error, load_paths, prepare_outputs, write_output

__all__ = ["PENDULUM_EXIT_HELP", "PENDULUM_DESCRIPTION", "run_pendulum"]

PENDULUM_EXIT_HELP = """\
exit status:
  0  converged: every window swings freely and was fitted to its least-squares minimum
  1  a window was left out (not a free swing, a poor fit, no swing at all, not converged):
     the status line and the messages name it
  2  bad path, file or option
  130  interrupted (Ctrl-C)
"""


PENDULUM_DESCRIPTION = """\
Fit a physical pendulum to gyroscope recordings of a body swinging about a fixed axis: per
window the natural frequency, the period at the swing's amplitude, the damping and, with
--mass and --pivot-distance, the moment of inertia about the pivot and about the centre of
mass (I_cm = I_pivot - m d^2), through variational rollouts at the measured timestamps. The
swing axis is detected per window; windows that do not swing freely from their start (held,
pushed) are flagged and left out of the combined values.

example:
  rigidjax fit-pendulum ../shared/data/racquet-flips/pendulum --mass 0.45728 --pivot-distance 0.413
"""


def _plot_pendulum(seg, fit, out: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    t = seg.t - seg.t[0]
    w = seg.omega[:, fit.axis]
    ax1.plot(t, w, ".", ms=2, color="0.4", label="measured")
    ax1.plot(t, fit.model_omega, "-", lw=1.2, color="C0", label="fitted")
    ax1.set_ylabel(f"$\\omega_{'xyz'[fit.axis]}$ (rad/s)")
    ax1.legend(fontsize=8)
    ax2.plot(t, w - fit.model_omega, lw=0.8, color="C3")
    ax2.set_ylabel("residual")
    ax2.set_xlabel("time in window (s)")
    fig.suptitle(f"{fit.name}: period {fit.period:.4g} s, status {fit.status.value}", fontsize=9)
    fig.savefig(out, dpi=120)


def run_pendulum(args) -> int:
    """Body of ``rigidjax fit-pendulum``; returns the exit code."""
    import jax
    import numpy as np

    jax.config.update("jax_enable_x64", True)

    for name in ("mass", "pivot_distance", "gravity"):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            return error("fit-pendulum", f"--{name.replace('_', '-')} must be > 0; got {v}")
    if (args.mass is None) != (args.pivot_distance is None):
        return error("fit-pendulum", "--mass and --pivot-distance go together (the moments need both)")
    code = prepare_outputs("fit-pendulum", args)
    if code is not None:
        return code
    try:
        segs = load_paths("fit-pendulum", args.path, args)
        if isinstance(segs, int):
            return segs
        if args.plot and not (0 <= args.segment < len(segs)):
            return error("fit-pendulum", f"--segment {args.segment} out of range: {len(segs)} window(s)")
        t0 = time.perf_counter()
        fits = fit_pendulum_segments(
            segs,
            axis=None if args.axis is None else "xyz".index(args.axis),
            mass=args.mass,
            distance=args.pivot_distance,
            gravity=args.gravity,
        )
        elapsed = time.perf_counter() - t0
    except (DataError, ValueError) as e:
        return error("fit-pendulum", str(e).replace("fit_pendulum: ", ""))
    moments = args.mass is not None
    where = ", ".join(map(str, args.path))
    print(f"\n{len(segs)} window(s) from {where}; physical pendulum (variational rollouts); {elapsed:.1f} s\n")
    head = f"{'#':>3} {'window':<40} {'n':>4} {'axis':>4} {'amp':>6} {'period (s)':>18} {'damping (1/s)':>18}"
    head += f" {'I_pivot (g m^2)':>18}" if moments else ""
    head += f" {'rms':>7} status"
    print(head)
    print("-" * len(head))
    for i, f in enumerate(fits):
        name = f.name if len(f.name) <= 40 else "…" + f.name[-39:]
        axis = "xyz"[f.axis] if f.axis >= 0 else "—"
        row = (
            f"{i:>3} {name:<40} {f.n:>4} {axis:>4} {math.degrees(f.amplitude):>5.1f}° "
            f"{_pm(f.period, f.period_se):>18} {_pm(f.damping_rate, f.damping_rate_se):>18}"
        )
        if moments:
            row += f" {_pm(1e3 * f.inertia_pivot, 1e3 * f.inertia_pivot_se):>18}"
        row += f" {f.rms:>7.4f} {f.status.value}"
        print(row)
    comb = combine_pendulum(fits)
    n_good = sum(f.status == FitStatus.CONVERGED for f in fits)
    print()
    if comb:
        print(
            f"median over {n_good} converged window(s): estimate ± statistical 1σ, "
            "95 % interval incl. between-window scatter"
        )
        scale = {
            "inertia_pivot": ("g m^2", 1e3),
            "inertia_cm": ("g m^2", 1e3),
            "period": ("s", 1),
            "omega0": ("rad/s", 1),
            "damping_rate": ("1/s", 1),
        }
        for name, c in comb.items():
            unit, k = scale[name]
            lo, hi = c["interval"]
            iv = f"[{k * lo:.5g}, {k * hi:.5g}]" if np.isfinite(lo) else "—"
            print(f"  {name + ' (' + unit + ')':<22} {_pm(k * c['median'], k * c['se_stat']):>22}   {iv}")
        if moments:
            print(f"  (I_cm = I_pivot - m d^2 with m = {args.mass} kg, d = {args.pivot_distance} m)")
    else:
        print("no converged window: no combined values")
    bad = [f for f in fits if f.status != FitStatus.CONVERGED]
    for f in bad:
        print(f"  {f.name}: {f.status.value}: {f.reason}", file=sys.stderr)
    status = FitStatus.CONVERGED if not bad and comb else (bad[0].status if bad else FitStatus.UNIDENTIFIABLE)
    print(f"status: {status.value}" + (f" ({len(bad)} of {len(fits)} window(s) left out)" if bad else ""))
    if args.json:

        def clean(v):
            return float(v) if isinstance(v, float) and math.isfinite(v) else (None if isinstance(v, float) else v)

        out = {
            "path": ", ".join(map(str, args.path)),
            "paths": [str(q) for q in args.path],
            "status": status.value,
            "elapsed_s": elapsed,
            "windows": [
                {
                    k: (
                        clean(v)
                        if not isinstance(v, (np.ndarray, FitStatus))
                        else (v.value if isinstance(v, FitStatus) else None)
                    )
                    for k, v in f.__dict__.items()
                    if k != "model_omega"
                }
                for f in fits
            ],
            "combined": {
                k: {kk: (list(map(clean, vv)) if isinstance(vv, tuple) else clean(vv)) for kk, vv in c.items()}
                for k, c in comb.items()
            },
            "options": {
                "mass": args.mass,
                "pivot_distance": args.pivot_distance,
                "gravity": args.gravity,
                "axis": args.axis,
            },
        }
        code = write_output(
            "fit-pendulum",
            "--json",
            args.json,
            lambda tmp: tmp.write_text(json.dumps(out, indent=2, allow_nan=False)),
        )
        if code is not None:
            return code
        print(f"wrote {args.json}")
    if args.plot:
        code = write_output(
            "fit-pendulum",
            "--plot",
            args.plot,
            lambda tmp: _plot_pendulum(segs[args.segment], fits[args.segment], tmp),
        )
        if code is not None:
            return code
        print(f"wrote {args.plot} (window {args.segment})")
    return exit_code(status)


def _pm(v, e) -> str:

    return pm(v, e)
