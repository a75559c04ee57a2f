"""``rigidjax fit`` and ``rigidjax fit-pendulum``: identification from gyroscope recordings.

Wired into :mod:`rigidjax.cli` by ``add_parsers(subparsers)``. Exit codes (also in
``--help``): 0 converged; 1 a result that is not fully trustworthy (a window did not
converge, is a poor fit, is not determined by its data, or the step error shapes it: the
status line says which); 2 bad path, file or option; 3 recordings whose estimates disagree
were not pooled (``--pool-all`` pools them anyway).

Without PATH, ``fit`` runs on an embedded default: a recording synthesised into a temporary
folder in phyphox's layout (:func:`rigidjax.synthetic.synthesize_recording`, a racquet-like
body with noise, bias, drag and a small sensor misalignment), printing the truth beside the
estimate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

from .identify import FitError, FitStatus, exit_code, fit_inertia, parse_scale
from .identify._result import pm
from .identify.pendulum import combine_pendulum, fit_pendulum_segments, looks_like_pendulum
from .cli_motion import is_motion_csv, run_motion
from .io import DataError, load
from .synthetic import synthesize_recording

__all__ = ["add_parsers", "run", "run_pendulum"]

EXIT_HELP = """\
exit status:
  0  converged: every window reached its least-squares minimum and was pooled
  1  a result that is not fully trustworthy: some window did not converge, is a poor fit,
     is not determined by its data or is shaped by the step error (the status line and the
     table say which)
  2  bad path, file or option
  3  recordings whose estimates disagree were not pooled (--pool-all pools them anyway)
"""

PENDULUM_EXIT_HELP = """\
exit status:
  0  converged: every window swings freely and was fitted to its least-squares minimum
  1  a window was left out (not a free swing, a poor fit, no swing at all, not converged):
     the status line and the messages name it
  2  bad path, file or option
"""

DESCRIPTION = """\
Fit the inertia tensor (as ratios in sensor axes, or in kg m^2 with --scale) to measured body
angular velocity of free flights: least squares between the gyroscope and rollouts of the
torque-free Euler equations at the measured timestamps, over the physically valid inertias
(edges included), each window to its least-squares minimum. PATH: a phyphox "Gyroscope rotation
rate" export folder (windows from meta/segments.csv), a folder of many, a CSV (t,wx,wy,wz) or
an NPZ (t, omega). Without PATH: a synthetic recording with known truth.

A CSV with orientation (qw,qx,qy,qz: motion capture), position (x,y,z, m) or known body torques
(tau_x,tau_y,tau_z, N m: moments in kg m^2) is fitted with every column it has, through
rigidjax.identify.fit (gyro sensor model: --bias, --gain, --misalignment, --delay S).

Recordings whose estimates disagree (a different body?) are named and not pooled. Each
combined estimate comes with its statistical error (noise only) and a 95 % interval that
covers the scatter between windows.

examples:
  rigidjax fit                                   # synthetic demo, truth printed beside estimate
  rigidjax fit ../shared/data/racquet-flips/flips --tensor --drag --json fit.json
  rigidjax fit recording/ --joint --scale Iy=1.3911e-3 --plot fit.png --segment 3
  rigidjax fit mocap.csv                         # t,qw,qx,qy,qz[,x,y,z]: orientation (and position) only
  rigidjax fit satellite.csv --bias --gain --delay 0.05   # t,wx,wy,wz,tau_x,tau_y,tau_z: kg m^2
"""


def _error(cmd: str, msg: str) -> int:
    print(f"rigidjax {cmd}: error: {msg}", file=sys.stderr)
    return 2


def add_parsers(subparsers) -> None:
    """Add ``fit`` and ``fit-pendulum`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "fit",
        help="identify inertia (and drag, gyro bias) from gyroscope recordings of free flight",
        description=DESCRIPTION,
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="?", default=None, help="recording(s); omit for the synthetic demo")
    p.add_argument(
        "--tensor", action="store_true", help="full inertia tensor (principal axes may be rotated from the sensor axes)"
    )
    p.add_argument(
        "--drag",
        nargs="?",
        const="isotropic",
        default=None,
        choices=["isotropic", "diagonal"],
        help="fit an angular air drag (default isotropic)",
    )
    p.add_argument("--bias", action="store_true", help="fit a constant gyroscope bias (per recording when --joint)")
    p.add_argument("--gain", action="store_true", help="motion CSV: fit a per-axis gyroscope gain")
    p.add_argument("--misalignment", action="store_true", help="motion CSV: fit a small rotation of the gyro axes")
    p.add_argument("--delay", type=float, default=None, metavar="S", help="motion CSV: fit a gyro delay |tau| < S")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--per-window",
        dest="joint",
        action="store_false",
        help="fit every window on its own, then combine (default with PATH)",
    )
    mode.add_argument(
        "--joint",
        dest="joint",
        action="store_true",
        help="one inertia shared by the pooled windows (default for the demo)",
    )
    p.set_defaults(joint=None)
    p.add_argument("--pool-all", action="store_true", help="pool every recording even when their estimates disagree")
    p.add_argument(
        "--scale",
        default=None,
        metavar="KEY=VALUE",
        help="a known value fixing the scale, e.g. Iy=1.3911e-3 or trace=0.04 (kg m^2)",
    )
    p.add_argument(
        "--select", default=None, metavar="TEXT", help="only windows whose comment contains TEXT (case-insensitive)"
    )
    p.add_argument(
        "--json", default=None, metavar="OUT.json", help="write estimates, uncertainties and per-window results"
    )
    p.add_argument("--plot", default=None, metavar="OUT.png", help="draw measured vs fitted omega(t) for --segment")
    p.add_argument("--segment", type=int, default=0, metavar="N", help="window to plot (row number in the table)")
    p.add_argument("--starts", type=int, default=4, metavar="K", help="starts per window (default 4)")
    p.add_argument(
        "--substeps",
        default="auto",
        metavar="K",
        help="rollout sub-steps per sample interval: auto (default: per window, so that the step error shifts no "
        "estimate by more than 0.3 standard errors) or a fixed integer",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=200,
        help="Levenberg-Marquardt iterations of the best start, after 12 for every start (default 200)",
    )
    p.add_argument(
        "--max-duration",
        type=float,
        default=None,
        metavar="S",
        help="longest window accepted, s (default 10: free flight)",
    )
    p.add_argument(
        "--max-samples", type=int, default=None, metavar="N", help="most samples per window accepted (default 20000)"
    )
    p.add_argument(
        "--max-rate",
        type=float,
        default=None,
        metavar="RAD_S",
        help="highest angular speed accepted, rad/s (default 50: beyond a hand throw, most likely deg/s)",
    )
    p.add_argument("--tosses", type=int, default=5, help="synthetic demo: number of tosses (default 5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (starts; synthetic demo)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)

    q = subparsers.add_parser(
        "fit-pendulum",
        help="identify a physical pendulum (period, moment about the pivot, damping) from gyroscope recordings",
        description=PENDULUM_DESCRIPTION,
        epilog=PENDULUM_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("path", help="recording(s) of a swinging body (phyphox folder(s), CSV, NPZ)")
    q.add_argument(
        "--axis",
        choices=["x", "y", "z"],
        default=None,
        help="gyroscope axis of the swing (default: detected per window)",
    )
    q.add_argument(
        "--mass", type=float, default=None, metavar="KG", help="mass, kg (with --pivot-distance: the moments)"
    )
    q.add_argument("--pivot-distance", type=float, default=None, metavar="M", help="pivot to centre of mass, m")
    q.add_argument("--gravity", type=float, default=9.81, metavar="G", help="m/s^2 (default 9.81)")
    q.add_argument("--json", default=None, metavar="OUT.json", help="write the per-window and combined results")
    q.add_argument("--plot", default=None, metavar="OUT.png", help="draw measured vs fitted rate for --segment")
    q.add_argument("--segment", type=int, default=0, metavar="N", help="window to plot (row number)")
    q.add_argument("--quiet", action="store_true", help="no progress output")
    q.set_defaults(func=run_pendulum)


def _prepare_outputs(cmd, args) -> int | None:
    """Check the output paths before the fit, not after it: missing folders are created (like
    simulate --out); a folder in the way or one that cannot be written exits 2 at once."""
    import os

    for opt, out in (("--json", args.json), ("--plot", args.plot)):
        if not out:
            continue
        p = Path(out)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return _error(cmd, f"{opt} {out}: cannot create its folder {p.parent}: {e.strerror or e}")
        if p.is_dir():
            return _error(cmd, f"{opt} {out}: is a folder; give a file name")
        if not os.access(p if p.exists() else p.parent, os.W_OK):
            return _error(cmd, f"{opt} {out}: not writable")
    return None


def _write(cmd, opt, path, write) -> int | None:
    try:
        write()
    except OSError as e:
        return _error(cmd, f"{opt} {path}: cannot write: {e.strerror or e}")
    return None


def _load(cmd, path, select=None):
    """Windows of ``path`` (warnings printed), or an exit code."""

    if not Path(path).exists():
        return _error(cmd, f"{path}: no such file or folder")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        segs = load(path)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    if select:
        segs = [s for s in segs if select.lower() in s.comment.lower()]
        if not segs:
            return _error(cmd, f"no window's comment contains {select!r}")
    return segs


def _plot(result, i: int, out: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    t, measured, fitted = result.predict(i)
    seg = result.segments[i]
    fig = Figure(figsize=(8, 6.5), constrained_layout=True)
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 1, sharex=True)
    for k, ax in enumerate(axes):
        ax.plot(t - t[0], measured[:, k], ".", ms=3, color="0.4", label="measured")
        ax.plot(t - t[0], fitted[:, k], "-", lw=1.4, color="C%d" % k, label="fitted")
        ax.set_ylabel(f"$\\omega_{'xyz'[k]}$ (rad/s)")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("time in window (s)")
    which = "joint fit" if result.mode == "joint" and i in result.combined.get("windows", ()) else "its own fit"
    rms = f"residual RMS {seg['rms']:.3g} rad/s" if seg.get("rms") is not None else "no fit"
    fig.suptitle(f"{seg['name']}  {seg['comment']}\n{rms} ({which}; status {seg['status']})", fontsize=9)
    fig.savefig(out, dpi=120)


def _z_scores(result, truth) -> dict:
    """(estimate - truth) / standard error of every estimated quantity with a known truth and a
    finite, non-zero error (a value fixed by --scale has none), bias components included."""
    z = {}
    for k, v in result.estimates.items():
        e = result.uncertainties.get(k)
        if isinstance(truth.get(k), (int, float)) and e is not None and math.isfinite(e) and e > 0:
            z[k] = (v - truth[k]) / e
    seg = result.segments[0] if len(result.segments) == 1 or result.mode == "joint" else None
    if seg is not None and "bias" in seg and "bias" in truth:
        for c, b, e, tb in zip("xyz", seg["bias"], seg["bias_se"], truth["bias"]):
            if e is not None and math.isfinite(e) and e > 0:
                z[f"bias_{c}"] = (b - tb) / e
    return z


def run(args) -> int:
    """Body of ``rigidjax fit``; returns the exit code (prints the table to stdout)."""
    import jax

    jax.config.update("jax_enable_x64", True)  # the command's choice; the library never flips it

    for name, lo in (("starts", 1), ("max_steps", 1), ("tosses", 1), ("max_samples", 10)):
        if getattr(args, name) is not None and getattr(args, name) < lo:
            return _error("fit", f"--{name.replace('_', '-')} must be >= {lo}; got {getattr(args, name)}")
    for name, unit in (("max_duration", "s"), ("max_rate", "rad/s")):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            return _error("fit", f"--{name.replace('_', '-')} must be > 0 {unit}; got {v}")
    substeps = args.substeps
    if substeps != "auto":
        try:
            substeps = int(substeps)
            if substeps < 1:
                raise ValueError
        except ValueError:
            return _error("fit", f"--substeps must be 'auto' or an integer >= 1; got {args.substeps!r}")
    try:
        scale = parse_scale(args.scale)
    except FitError as e:
        return _error("fit", str(e))
    code = _prepare_outputs("fit", args)
    if code is not None:
        return code

    truth = None
    tmp = None
    tensor, drag, bias = args.tensor, args.drag, args.bias
    joint = bool(args.joint)
    try:
        if args.path is None:
            tmp = tempfile.TemporaryDirectory(prefix="rigidjax-fit-")
            truth = synthesize_recording(tmp.name, n_tosses=args.tosses, seed=args.seed)
            path = truth["path"]
            print(
                f"No PATH given: synthesised {args.tosses} tosses of a racquet-like body into {path}\n"
                f"  (scipy DOP853 of Euler's equations; noise {truth['noise_std']} rad/s, bias {truth['bias']} rad/s, "
                f"drag {truth['drag']} N m s, sensor misaligned {truth['misalignment_deg']:.1f} deg)"
            )
            if not (tensor or drag or bias):
                tensor, drag, bias = True, "isotropic", True
                print("  fitting the model it was made with: --tensor --drag --bias")
            if args.joint is None:
                joint = True
                print("  one body: joint fit of all tosses (--per-window to fit each alone)")
            if scale is None:
                scale = ("Iy", truth["Iy"])
                print(f"  scale fixed by the true Iy = {truth['Iy']:.6g} kg m^2")
        else:
            path = args.path
            general = bool(args.gain or args.misalignment or args.delay is not None)
            if is_motion_csv(path) or (general and Path(path).suffix.lower() == ".csv"):
                return run_motion(args, path)
            if general:
                return _error(
                    "fit", f"--gain, --misalignment and --delay need a CSV (the general fit); {path} is not one"
                )
        segs = _load("fit", path, args.select)
        if isinstance(segs, int):
            return segs
        if not (0 <= args.segment < len(segs)) and args.plot:
            return _error("fit", f"--segment {args.segment} out of range: {len(segs)} window(s)")
        swings = [looks_like_pendulum(s.omega) for s in segs]
        if segs and all(a is not None for a in swings):
            axes = sorted({"xyz"[a] for a in swings})
            return _error(
                "fit",
                f"the {len(segs)} window(s) of {path} look like pendulum swings (the rate oscillates about the "
                f"{'/'.join(axes)} axis alone), not free flight: use `rigidjax fit-pendulum {path}`",
            )

        from tqdm.auto import tqdm

        bar = tqdm(
            desc="fit (LM iterations)", unit="it", disable=True if args.quiet else None, leave=False, file=sys.stderr
        )

        def progress(n_active):
            bar.update(1)
            bar.set_postfix(active=n_active, refresh=False)

        kw = {}
        if args.max_duration is not None:
            kw["max_duration"] = args.max_duration
        if args.max_samples is not None:
            kw["max_samples"] = args.max_samples
        if args.max_rate is not None:
            kw["max_rate"] = args.max_rate
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fit_inertia(
                segs,
                tensor=tensor,
                drag=drag,
                bias=bias,
                joint=joint,
                scale=scale,
                starts=args.starts,
                substeps=substeps,
                max_steps=args.max_steps,
                seed=args.seed,
                pool="all" if args.pool_all else "consistent",
                progress=progress,
                **kw,
            )
        bar.close()
        elapsed = time.perf_counter() - t0
        result.truth = truth
        model = "full tensor" if tensor else "principal moments along sensor axes"
        model += f", drag {drag}" if drag else ", no drag"
        model += ", gyro bias" if bias else ""
        print(f"\n{len(segs)} window(s) from {path}; {result.mode} fit ({model}); {elapsed:.1f} s\n")
        print(result.table())
        for w in caught:  # after the table: the status line says the same, this names each window
            if not str(w.message).startswith("fit_inertia: status"):
                print(f"warning: {w.message}", file=sys.stderr)
        for s in result.segments:
            if s["status"] != "converged" and s.get("reason"):
                print(f"  {s['name']}: {s['status']}: {s['reason']}", file=sys.stderr)
        if args.json:
            out = result.to_dict()
            out["path"] = str(path)
            out["elapsed_s"] = elapsed
            code = _write(
                "fit",
                "--json",
                args.json,
                lambda: Path(args.json).write_text(json.dumps(out, indent=2, allow_nan=False)),
            )
            if code is not None:
                return code
            print(f"wrote {args.json}")
        if args.plot:
            code = _write("fit", "--plot", args.plot, lambda: _plot(result, args.segment, args.plot))
            if code is not None:
                return code
            print(f"wrote {args.plot} (window {args.segment})")
        if truth is not None:
            print(
                "estimate - truth in standard errors: "
                + ", ".join(f"{k} {v:+.2f}" for k, v in _z_scores(result, truth).items())
            )
        return exit_code(result.status)
    except (DataError, FitError) as e:
        return _error("fit", str(e))
    except OSError as e:
        return _error("fit", f"{e.filename or ''}: {e.strerror or e}")
    finally:
        if tmp is not None:
            tmp.cleanup()


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
            return _error("fit-pendulum", f"--{name.replace('_', '-')} must be > 0; got {v}")
    if (args.mass is None) != (args.pivot_distance is None):
        return _error("fit-pendulum", "--mass and --pivot-distance go together (the moments need both)")
    code = _prepare_outputs("fit-pendulum", args)
    if code is not None:
        return code
    try:
        segs = _load("fit-pendulum", args.path)
        if isinstance(segs, int):
            return segs
        if args.plot and not (0 <= args.segment < len(segs)):
            return _error("fit-pendulum", f"--segment {args.segment} out of range: {len(segs)} window(s)")
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
        return _error("fit-pendulum", str(e).replace("fit_pendulum: ", ""))
    moments = args.mass is not None
    print(f"\n{len(segs)} window(s) from {args.path}; physical pendulum (variational rollouts); {elapsed:.1f} s\n")
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
            "path": str(args.path),
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
        code = _write(
            "fit-pendulum",
            "--json",
            args.json,
            lambda: Path(args.json).write_text(json.dumps(out, indent=2, allow_nan=False)),
        )
        if code is not None:
            return code
        print(f"wrote {args.json}")
    if args.plot:
        code = _write(
            "fit-pendulum",
            "--plot",
            args.plot,
            lambda: _plot_pendulum(segs[args.segment], fits[args.segment], args.plot),
        )
        if code is not None:
            return code
        print(f"wrote {args.plot} (window {args.segment})")
    return exit_code(status)


def _pm(v, e) -> str:

    return pm(v, e)
