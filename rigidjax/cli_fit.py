"""``rigidjax fit``: identify inertia ratios (and drag, gyroscope bias) from gyroscope recordings.

Wired into :mod:`rigidjax.cli` by ``add_parser(subparsers)``; ``run(args) -> int`` is the body
(exit 0: converged; 1: some fit did not converge, is a poor_fit, i.e. an implausible
residual, a wrong local minimum, or does not determine the ratios (singular normal equations,
e.g. a steady spin about one axis); 2: bad path, file or option, or an output folder that
cannot be created).

Without PATH it runs on an embedded default: a recording synthesised into a temporary folder
in phyphox's layout (:func:`rigidjax.synthetic.synthesize_recording`, a racquet-like body with
noise, bias, drag and a small sensor misalignment), printing the truth beside the estimate.
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

__all__ = ["add_parser", "run"]

#: Sub-steps of the synthetic demo: its noise-level residual (0.01 rad/s) makes the midpoint
#: step's own error at the 10 ms sample interval (RMS ~0.005 rad/s, |omega| dt ~ 0.1) shift the
#: estimates by 1-4 standard errors with 1 sub-step (the gyroscope bias most); 4 sub-steps cut it
#: 16x (< 0.3 standard errors), so the errors it prints cover the truth.
DEMO_SUBSTEPS = 4

DESCRIPTION = """\
Fit the inertia tensor (as ratios in sensor axes, or in kg m^2 with --scale) to measured body
angular velocity of free flights: least squares between the gyroscope and rollouts of the
torque-free Euler equations at the measured timestamps. PATH: a phyphox "Gyroscope rotation
rate" export folder (windows from meta/segments.csv), a folder of many, a CSV (t,wx,wy,wz) or
an NPZ (t, omega). Without PATH: a synthetic recording with known truth.

examples:
  rigidjax fit                                   # synthetic demo, truth printed beside estimate
  rigidjax fit ../shared/data/racquet-flips/flips --tensor --drag --json fit.json
  rigidjax fit recording/ --joint --scale Iy=1.3911e-3 --plot fit.png --segment 3
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``fit`` subcommand to an ``argparse`` subparsers object; returns its parser."""
    p = subparsers.add_parser(
        "fit",
        help="identify inertia (and drag, gyro bias) from gyroscope recordings",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", nargs="?", default=None, help="recording(s); omit for the synthetic demo")
    p.add_argument("--tensor", action="store_true", help="full inertia tensor (principal axes may be rotated from the sensor axes)")
    p.add_argument(
        "--drag", nargs="?", const="isotropic", default=None, choices=["isotropic", "diagonal"],
        help="fit an angular air drag (default isotropic)",
    )
    p.add_argument("--bias", action="store_true", help="fit a constant gyroscope bias (per recording when --joint)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--per-segment", dest="joint", action="store_false",
        help="fit every window on its own (default with PATH)",
    )
    mode.add_argument("--joint", dest="joint", action="store_true", help="one inertia shared by all windows (default for the demo)")
    p.set_defaults(joint=None)
    p.add_argument("--scale", default=None, metavar="KEY=VALUE", help="a known value fixing the scale, e.g. Iy=1.3911e-3 or trace=0.04 (kg m^2)")
    p.add_argument("--select", default=None, metavar="TEXT", help="only windows whose comment contains TEXT (case-insensitive)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="write estimates, uncertainties and per-segment results")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="draw measured vs fitted omega(t) for --segment")
    p.add_argument("--segment", type=int, default=0, metavar="N", help="segment to plot (row number in the table)")
    p.add_argument("--starts", type=int, default=4, metavar="K", help="multi-start count (default 4)")
    p.add_argument(
        "--substeps", type=int, default=None, metavar="K",
        help=f"rollout sub-steps per sample interval (default 1; the synthetic demo {DEMO_SUBSTEPS}: see the step-error line)",
    )
    p.add_argument("--max-steps", type=int, default=200, help="Levenberg-Marquardt iterations (default 200)")
    p.add_argument("--tosses", type=int, default=5, help="synthetic demo: number of tosses (default 5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (starts; synthetic demo)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def _error(msg: str) -> int:
    print(f"rigidjax fit: error: {msg}", file=sys.stderr)
    return 2


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
    fig.suptitle(f"{seg['name']}  {seg['comment']}\nresidual RMS {seg['rms']:.3g} rad/s ({result.mode} fit)", fontsize=9)
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

    from .identify import FitError, fit_inertia, parse_scale
    from .io import DataError, load
    from .synthetic import synthesize_recording

    for name, lo in (("starts", 1), ("substeps", 1), ("max_steps", 1), ("tosses", 1)):
        if getattr(args, name) is not None and getattr(args, name) < lo:
            return _error(f"--{name.replace('_', '-')} must be >= {lo}; got {getattr(args, name)}")
    try:
        scale = parse_scale(args.scale)
    except FitError as e:
        return _error(str(e))

    for opt, out in (("--json", args.json), ("--plot", args.plot)):
        if out:  # before the fit, not after it; missing folders are created like simulate --out
            try:
                Path(out).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                return _error(f"{opt} {out}: cannot create its folder {Path(out).parent}: {e.strerror or e}")

    truth = None
    tmp = None
    tensor, drag, bias = args.tensor, args.drag, args.bias
    joint = bool(args.joint)
    substeps = args.substeps or 1
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
                print("  one body: joint fit of all tosses (--per-segment to fit each alone)")
            if scale is None:
                scale = ("Iy", truth["Iy"])
                print(f"  scale fixed by the true Iy = {truth['Iy']:.6g} kg m^2")
            if args.substeps is None:
                substeps = DEMO_SUBSTEPS
                print(f"  {substeps} sub-steps per sample (noise-level data: the step error must stay below the standard errors)")
        else:
            path = args.path
            if not Path(path).exists():
                return _error(f"{path}: no such file or folder")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            segs = load(path)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        if args.select:
            segs = [s for s in segs if args.select.lower() in s.comment.lower()]
            if not segs:
                return _error(f"no window's comment contains {args.select!r}")
        if not (0 <= args.segment < len(segs)) and args.plot:
            return _error(f"--segment {args.segment} out of range: {len(segs)} segment(s)")

        from tqdm.auto import tqdm

        bar = tqdm(desc="fit (LM iterations)", unit="it", disable=True if args.quiet else None, leave=False, file=sys.stderr)

        def progress(n_active):
            bar.update(1)
            bar.set_postfix(active=n_active, refresh=False)

        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fit_inertia(
                segs, tensor=tensor, drag=drag, bias=bias, joint=joint, scale=scale,
                starts=args.starts, substeps=substeps, max_steps=args.max_steps, seed=args.seed,
                progress=progress,
            )
        bar.close()
        elapsed = time.perf_counter() - t0
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        result.truth = truth
        model = "full tensor" if tensor else "principal moments along sensor axes"
        model += f", drag {drag}" if drag else ", no drag"
        model += ", gyro bias" if bias else ""
        print(f"\n{len(segs)} segment(s) from {path}; {result.mode} fit ({model}); {elapsed:.1f} s\n")
        print(result.table())
        if args.json:
            out = result.to_dict()
            out["path"] = str(path)
            out["elapsed_s"] = elapsed
            Path(args.json).write_text(json.dumps(out, indent=2, allow_nan=False))
            print(f"wrote {args.json}")
        if args.plot:
            _plot(result, args.segment, args.plot)
            print(f"wrote {args.plot} (segment {args.segment})")
        if truth is not None:
            print("estimate - truth in standard errors: " + ", ".join(f"{k} {v:+.2f}" for k, v in _z_scores(result, truth).items()))
        return 0 if result.converged else 1
    except (DataError, FitError) as e:
        return _error(str(e))
    except OSError as e:
        return _error(f"{e.filename or ''}: {e.strerror or e}")
    finally:
        if tmp is not None:
            tmp.cleanup()
