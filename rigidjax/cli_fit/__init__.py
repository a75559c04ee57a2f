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

from ..identify import FitError, exit_code, fit_inertia, parse_scale
from ..identify.pendulum import looks_like_pendulum
from ..io import DataError
from ..report import ReportError, parse_reference, write_report
from ..synthetic import synthesize_recording
from ._common import (
    CACHE_MIN_COMPILE_S,
    NO_CACHE_ENV,
    Progress,
    add_cache_option,
    add_input_options,
    compilation_cache_dir,
    enable_compilation_cache,
    error,
    load_paths,
    plain_csv,
    prepare_outputs,
    replacing,
    write_output,
)
from .motion import is_motion_csv, run_motion
from .pendulum import PENDULUM_DESCRIPTION, PENDULUM_EXIT_HELP, run_pendulum

__all__ = [
    "NO_CACHE_ENV",
    "CACHE_MIN_COMPILE_S",
    "add_parsers",
    "add_cache_option",
    "enable_compilation_cache",
    "compilation_cache_dir",
    "Progress",
    "replacing",
    "run",
    "run_pendulum",
]

#: environment variable that turns the persistent compilation cache off (any value but 0/false/no)

EXIT_HELP = """\
exit status:
  0  converged: every window reached its least-squares minimum and was pooled
  1  a result that is not fully trustworthy: some window did not converge, is a poor fit,
     is not determined by its data or is shaped by the step error (the status line and the
     table say which)
  2  bad path, file or option
  3  recordings whose estimates disagree were not pooled (--pool-all pools them anyway);
     3 takes precedence over 1 (the status line names both)
  130  interrupted (Ctrl-C)
"""

DESCRIPTION = """\
Fit the inertia tensor (as ratios in sensor axes, or in kg m^2 with --scale) to measured body
angular velocity of free flights: least squares between the gyroscope and rollouts of the
torque-free Euler equations at the measured timestamps, over the physically valid inertias
(edges included), each window to its least-squares minimum. PATH (one or several): a phyphox
"Gyroscope rotation rate" export folder or its .zip (any of its CSV dialects; windows from
meta/segments.csv, or without it the free flights detected from the rate and listed with their
rows: --windows, --segment N), a Sensor Logger export folder or .zip (Gyroscope.csv), a folder of many, a
ROS bag (rosbag2 folder, .mcap, .db3 or ROS 1 .bag, or a folder of them: its sensor_msgs/msg/Imu
topic, --topic NAME where it has several; needs pip install 'rigidjax[ros]'), a CSV (t,wx,wy,wz,
or any names with --columns t=Time,wx=gx,wy=gy,wz=gz and --time-unit, --rate-unit) or an NPZ (t, omega). Without PATH: a
synthetic recording with known truth.

Units are checked at load time: rates that turn the body by more than 1 rad per sample but read
sensibly as deg/s, or a median time step of 1 s or more, stop with the likely unit and the flag
(--rate-unit deg/s, --time-unit ms); --no-unit-check skips the check.

Compiled programs are kept in JAX's persistent compilation cache (in the user's cache folder,
e.g. ~/.cache/rigidjax/jax-compilation-cache) and a gyroscope fit's traced programs beside it
(programs/), so a second run of the same command neither traces nor compiles them (the README
demo: ~2x faster); --no-cache or RIGIDJAX_NO_COMPILATION_CACHE=1 turns both off.

A CSV with orientation (qw,qx,qy,qz: motion capture), position (x,y,z, m) or known body torques
(tau_x,tau_y,tau_z, N m: moments in kg m^2; each row's torque held until the next row, so
sample a varying torque finely or give its mean over each interval) is fitted with every
column it has, through rigidjax.identify.fit (gyro sensor model: --bias, --gain,
--misalignment, --delay S).

Recordings whose estimates disagree (a different body?) are named and not pooled. Each
combined estimate comes with its statistical error (noise only) and a 95 % interval that
covers the scatter between windows. --json also holds the covariance of the fitted parameters,
the inertia tensor, its principal moments and principal axes (sensor axes, delta-method errors);
--report DIR writes them with figures into DIR/index.html.

examples:
  rigidjax fit                                   # synthetic demo, truth printed beside estimate
  rigidjax fit ../shared/data/racquet-flips/flips --tensor --drag --json fit.json
  rigidjax fit recording/ --joint --scale Iy=1.3911e-3 --plot fit.png --segment 3
  rigidjax fit recording/ --report out/ --reference Ix/Iy=13.5+-4   # out/index.html, self-contained
  rigidjax fit mocap.csv                         # t,qw,qx,qy,qz[,x,y,z]: orientation (and position) only
  rigidjax fit vicon.csv --columns t=Time,r11=R11,...,x=TX,y=TY,z=TZ --length-unit mm   # rotation matrices
  rigidjax fit phyphox.zip "Sensor Logger.zip" imu.csv --columns t=ts,wx=gx,wy=gy,wz=gz --time-unit ms
  rigidjax fit satellite.csv --bias --gain --delay 0.05   # t,wx,wy,wz,tau_x,tau_y,tau_z: kg m^2
"""


#: ``--report-windows``: window figures drawn by default (a figure takes ~0.1-0.5 s to draw)
REPORT_WINDOWS = 12


def _report_windows(text: str) -> int | None:
    if text.strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0 or 'all', got {text!r}")
    return n


def add_parsers(subparsers) -> None:
    """Add ``fit`` and ``fit-pendulum`` to an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "fit",
        help="identify inertia (and drag, gyro bias) from gyroscope recordings of free flight",
        description=DESCRIPTION,
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="*", default=[], help="recording(s), one or several; omit for the synthetic demo")
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
    p.add_argument(
        "--bias",
        nargs="?",
        const="fit",
        default=None,
        metavar="{fit,rest}",
        help="a constant gyroscope bias: fitted (default; per recording when --joint; judged against the "
        "gyroscope's reading where the body lies still, status poor_fit where they disagree) or 'rest': read "
        "where the body lies still in each recording and subtracted",
    )
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
    p.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="write DIR/index.html: a self-contained report (statuses, combined estimate, tensor and principal axes, "
        "per-window estimates and measured vs fitted rates with residuals; inline SVG, no network)",
    )
    p.add_argument(
        "--report-windows",
        type=_report_windows,
        default=REPORT_WINDOWS,
        metavar="N",
        help=f"--report: draw the rates of at most N windows, those with the worst status, then the largest residual "
        f"(the table lists every window; default {REPORT_WINDOWS}; 'all': every window)",
    )
    p.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="NAME=V+-E",
        help="a reference value drawn in the report beside the estimates, e.g. Ix/Iy=13.5+-4 (repeatable)",
    )
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
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_input_options(p)
    add_cache_option(p)
    p.set_defaults(func=run)

    q = subparsers.add_parser(
        "fit-pendulum",
        help="identify a physical pendulum (period, moment about the pivot, damping) from gyroscope recordings",
        description=PENDULUM_DESCRIPTION,
        epilog=PENDULUM_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("path", nargs="+", help="recording(s) of a swinging body (phyphox, Sensor Logger, CSV, NPZ)")
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
    add_input_options(q, windows="file")
    add_cache_option(q)
    q.set_defaults(func=run_pendulum)


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

    if args.bias not in (None, "fit", "rest"):  # `--bias FILE`: the optional value took the path
        if not Path(args.bias).exists():
            if any(c in args.bias for c in "/\\.") or len(args.path) == 0:  # meant as a path
                return error("fit", f"{args.bias}: no such file or folder (or --bias takes 'fit', 'rest' or nothing)")
            return error("fit", f"--bias takes 'fit', 'rest' or nothing; got {args.bias!r}")
        args.path, args.bias = [args.bias, *args.path], "fit"
    for name, lo in (("starts", 1), ("max_steps", 1), ("tosses", 1), ("max_samples", 10)):
        if getattr(args, name) is not None and getattr(args, name) < lo:
            return error("fit", f"--{name.replace('_', '-')} must be >= {lo}; got {getattr(args, name)}")
    for name, unit in (("max_duration", "s"), ("max_rate", "rad/s")):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            return error("fit", f"--{name.replace('_', '-')} must be > 0 {unit}; got {v}")
    substeps = args.substeps
    if substeps != "auto":
        try:
            substeps = int(substeps)
            if substeps < 1:
                raise ValueError
        except ValueError:
            return error("fit", f"--substeps must be 'auto' or an integer >= 1; got {args.substeps!r}")
    try:
        scale = parse_scale(args.scale)
    except FitError as e:
        return error("fit", str(e))
    code = prepare_outputs("fit", args)
    if code is not None:
        return code
    try:
        references = [parse_reference(r) for r in args.reference]
    except ReportError as e:
        return error("fit", str(e))
    if references and not args.report:
        return error("fit", "--reference is drawn in the report: give --report DIR too")
    if args.report and Path(args.report).exists() and not Path(args.report).is_dir():
        return error("fit", f"--report {args.report}: is a file; give a folder")

    truth = None
    tmp = None
    tensor, drag = args.tensor, args.drag
    bias = {None: False, "fit": True, "rest": "rest"}[args.bias]
    joint = bool(args.joint)
    progress = Progress(quiet=args.quiet)
    try:
        if not args.path:
            tmp = tempfile.TemporaryDirectory(prefix="rigidjax-fit-")
            truth = synthesize_recording(tmp.name, n_tosses=args.tosses, seed=args.seed)
            path = truth["path"]
            paths = [path]
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
            paths = list(args.path)
            path = paths[0] if len(paths) == 1 else ", ".join(map(str, paths))
            for q in paths:
                if not Path(q).exists():
                    return error("fit", f"{q}: no such file or folder")
            general = bool(args.gain or args.misalignment or args.delay is not None)
            motion = [q for q in paths if is_motion_csv(q, args.columns) or (general and plain_csv(q))]
            if motion and len(paths) > 1:
                return error(
                    "fit",
                    f"{motion[0]} is fitted by the general layer (orientation, position, torques or gyro "
                    "sensor model): give it alone, one recording per call",
                )
            if motion and args.report:
                return error(
                    "fit", "--report covers the gyroscope fit (rigidjax.identify.fit_inertia); not a motion CSV"
                )
            if motion:
                return run_motion(args, path)
            if general:
                return error(
                    "fit", f"--gain, --misalignment and --delay need a CSV (the general fit); {path} is not one"
                )
        progress.__enter__()
        segs = load_paths("fit", paths, args, progress, args.select)
        if isinstance(segs, int):
            return segs
        if not (0 <= args.segment < len(segs)) and args.plot:
            return error("fit", f"--segment {args.segment} out of range: {len(segs)} window(s)")
        swings = [looks_like_pendulum(s.omega) for s in segs]
        if segs and all(a is not None for a in swings):
            axes = sorted({"xyz"[a] for a in swings})
            return error(
                "fit",
                f"the {len(segs)} window(s) of {path} look like pendulum swings (the rate oscillates about the "
                f"{'/'.join(axes)} axis alone), not free flight: use `rigidjax fit-pendulum {path}`",
            )

        n_rec = len({s.source for s in segs})
        progress.start_fit(
            len(segs) * args.starts,
            f"{len(segs)} window(s) of {n_rec} recording(s), {args.starts} start(s) each",
        )

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
                progress=progress.tick,
                **kw,
            )
        progress.set_phase("done")
        progress.close()
        elapsed = time.perf_counter() - t0
        result.truth = truth
        model = "full tensor" if tensor else "principal moments along sensor axes"
        model += f", drag {drag}" if drag else ", no drag"
        model += {True: ", gyro bias", "rest": ", gyro bias read at rest"}.get(bias, "")
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
            out["paths"] = [str(q) for q in paths]
            out["elapsed_s"] = elapsed
            code = write_output(
                "fit",
                "--json",
                args.json,
                lambda tmp: tmp.write_text(json.dumps(out, indent=2, allow_nan=False)),
            )
            if code is not None:
                return code
            print(f"wrote {args.json}")
        if args.plot:
            code = write_output("fit", "--plot", args.plot, lambda tmp: _plot(result, args.segment, tmp))
            if code is not None:
                return code
            print(f"wrote {args.plot} (window {args.segment})")
        if args.report:
            notes = [str(w.message) for w in caught] + [
                f"{s['name']}: {s['status']}: {s['reason']}"
                for s in result.segments
                if s["status"] != "converged" and s.get("reason")
            ]
            refs = list(references)
            if truth is not None:  # the demo: the truth as a reference (no error)
                refs += [(k, float(truth[k]), 0.0) for k in ("Ix/Iy", "Iz/Iy") if k not in {r[0] for r in refs}]
            command = "rigidjax " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["fit"] else None
            shown = Progress(quiet=args.quiet)  # the fit's progress is closed: a new one, on the same clock
            shown.t0 = progress.t0
            try:
                with shown:
                    out_html = write_report(
                        result,
                        args.report,
                        references=refs,
                        warnings=notes,
                        command=command,
                        max_windows=args.report_windows,
                        show_all="--report-windows all",
                        progress=shown.set_phase,
                    )
                    shown.set_phase("report: done")
            except (ReportError, OSError) as e:
                return error("fit", f"--report {args.report}: {e}")
            print(f"wrote {out_html}")
        if truth is not None:
            print(
                "estimate - truth in standard errors: "
                + ", ".join(f"{k} {v:+.2f}" for k, v in _z_scores(result, truth).items())
            )
        return exit_code(result.status, bool((result.combined or {}).get("excluded")))
    except (DataError, FitError) as e:
        return error("fit", str(e))
    except OSError as e:
        return error("fit", f"{e.filename}: {e.strerror or e}" if e.filename else f"{e.strerror or e}")
    finally:
        progress.close()
        if tmp is not None:
            tmp.cleanup()
