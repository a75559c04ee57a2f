"""``rigidjax fit FILE.csv`` for recordings beyond a gyroscope: orientation (motion capture or an
attitude filter), position, and known torques, through :func:`rigidjax.identify.fit`
(:func:`rigidjax.identify.recipes.free_body_problem`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..identify import FitError, exit_code, fit
from ..identify.recipes import free_body_problem
from ..io import DataError, csv_quantities, load_motion_csv
from ._common import Progress, replacing

__all__ = ["is_motion_csv", "run_motion"]

#: The most samples the dense general fit accepts in one recording.
MAX_SAMPLES = 20_000


def is_motion_csv(path, columns=None) -> bool:
    """A plain CSV (not an app export) with orientation (quaternion or rotation matrix), position
    or torque columns after the column map ``columns``: the general layer's recording
    (:func:`rigidjax.io.load_motion_csv`). A CSV with none of them goes to the gyroscope fit,
    whose loader names the missing rate columns."""
    p = Path(path)
    if not (p.is_file() and p.suffix.lower() == ".csv" and p.name not in ("Raw Data.csv", "Gyroscope.csv")):
        return False
    have = csv_quantities(p, columns)
    if have is None:
        return False
    return bool(have & {"orientation", "position", "torque"})


def _error(msg: str) -> int:
    print(f"rigidjax fit: error: {msg}", file=sys.stderr)
    return 2


def run_motion(args, path) -> int:
    """Fit one motion CSV (see module); returns the exit code (0 converged, 1 not fully
    trustworthy, 2 bad input)."""
    try:
        motion = load_motion_csv(
            path,
            columns=args.columns,
            time_unit=args.time_unit,
            rate_unit=args.rate_unit,
            length_unit=args.length_unit,
            check_units=not args.no_unit_check,
        )
    except DataError as e:
        return _error(str(e))
    if len(motion.t) > MAX_SAMPLES:
        return _error(f"{path}: {len(motion.t)} samples; at most {MAX_SAMPLES} per recording (cut it into windows)")
    if args.tensor or args.drag or args.joint or args.scale:
        return _error(
            "--tensor, --drag, --joint and --scale apply to gyroscope-only recordings; this file has "
            f"{', '.join(motion.kinds)}{' and torques' if motion.torque is not None else ''}"
        )
    if args.bias == "rest":
        return _error("--bias rest reads the bias where a gyroscope-only recording lies still; fit it here (--bias)")
    if args.delay is not None and not args.delay > 0:
        return _error(f"--delay must be > 0 s; got {args.delay}")
    gyro_flags = [
        f
        for f, on in (
            ("--bias", args.bias is not None),
            ("--gain", args.gain),
            ("--misalignment", args.misalignment),
            ("--delay", args.delay is not None),
        )
        if on
    ]
    if gyro_flags and motion.omega is None:
        return _error(f"{', '.join(gyro_flags)}: the gyroscope's sensor model, but {path} has no wx,wy,wz columns")
    substeps = None if args.substeps == "auto" else int(args.substeps)
    try:
        problem = free_body_problem(
            motion,
            bias=args.bias is not None,
            gain=args.gain,
            misalignment=args.misalignment,
            max_delay=args.delay,
            substeps=substeps,
        )
    except (ValueError, FitError) as e:
        return _error(str(e))
    kinds = ", ".join(motion.kinds)
    if motion.torque is not None:
        kinds += " with known torques" if "moments" in problem.parameters else " (torque columns all zero)"
    if not args.quiet:
        print(f"{path}: {len(motion.t)} samples of {kinds}; {problem.substeps} sub-steps", file=sys.stderr)
    # the gyroscope fit's progress: elapsed time, compiling, LM iterations, programs compiled
    with Progress(quiet=args.quiet) as progress:
        progress.start_fit(args.starts, f"{args.starts} start(s)")
        try:
            result = fit(problem, starts=args.starts, seed=args.seed, max_steps=args.max_steps, progress=progress.tick)
        except ValueError as e:
            progress.close()
            return _error(str(e))
        progress.set_phase("done")
    print(f"{Path(path).name}: {kinds}")
    print(result)
    if "ratios" in result.values:
        more = (
            "add tau_x,tau_y,tau_z columns for kg m^2"
            if motion.torque is None
            else "the torque columns are all zero: no scale"
        )
        print(f"  (torque-free motion fixes only ratios: Ix/Iy, Iz/Iy; {more})")
    if args.json:
        try:
            doc = {"file": str(path), "data": kinds, **result.to_dict()}
            with replacing(args.json) as tmp:
                tmp.write_text(json.dumps(doc, indent=1, allow_nan=False))
        except OSError as e:
            return _error(f"--json {args.json}: cannot write: {e.strerror or e}")
    return exit_code(result.status)
