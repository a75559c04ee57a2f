"""Command line: ``rigidjax simulate``, ``rigidjax fit`` and ``rigidjax fit-pendulum``.

The command line enables float64 (``jax_enable_x64``) and JAX's persistent compilation cache
(:func:`rigidjax.cli_fit.enable_compilation_cache`; ``--no-cache`` or
``RIGIDJAX_NO_COMPILATION_CACHE=1`` turn it off) before it computes anything; the library itself
never changes global JAX configuration. Failures exit with status 2 and a one-line message; a
step that fails in a simulation raises a clear error (checked mode).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from . import cli_fit
from .reference import torque_free_omega
from .scenarios import RACQUET_INERTIA, RACQUET_OMEGA0, STEPPERS, check_body, racquet_flip

__all__ = ["main", "build_parser"]

#: the most steps ``rigidjax simulate`` runs (the trajectory is written as CSV)
MAX_STEPS = 5_000_000


def _cmd_simulate(args) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    if not (np.isfinite(args.dt) and args.dt > 0):
        return _fail(f"--dt must be > 0 s; got {args.dt}")
    if not (np.isfinite(args.t_end) and args.t_end > 0):
        return _fail(f"--t-end must be > 0 s; got {args.t_end}")
    n = int(np.ceil(args.t_end / args.dt - 1e-9))
    if n > MAX_STEPS:
        return _fail(
            f"--t-end / --dt asks for {n} steps (more than {MAX_STEPS}); choose a larger --dt or a shorter --t-end"
        )
    t_end = n * args.dt  # a whole number of steps, reaching at least --t-end
    try:
        inertia, omega0 = check_body(_triple(args.inertia, "--inertia"), _triple(args.omega0, "--omega0"))
    except ValueError as e:
        return _fail(str(e))
    t, cols, summary = racquet_flip(args.stepper, args.dt, t_end, inertia=inertia, omega0=omega0)
    w = np.stack([cols["wx"], cols["wy"], cols["wz"]], -1)
    try:  # the exact solution (Jacobi elliptic functions), the stepper's yardstick
        exact = torque_free_omega(inertia, omega0, t)
        if not np.all(np.isfinite(exact)):
            raise ValueError("not finite")
        summary["max_rate_error_vs_exact"] = float(np.abs(w - exact).max())
    except (ValueError, ZeroDivisionError, FloatingPointError) as e:
        exact = None
        print(f"  (no exact solution drawn: {e}; e.g. a spin on the separatrix)")
    import pandas as pd

    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with cli_fit.replacing(out) as tmp:  # no partial file under the name (Ctrl-C, a full disk)
            pd.DataFrame(cols).to_csv(tmp, index=False, float_format="%.10g")
    except OSError as e:  # a full disk, a folder in the way, no permission
        return _fail(f"cannot write {out}: {e.strerror or e}")
    what = "tennis-racket flip" if (tuple(inertia), tuple(omega0)) == (RACQUET_INERTIA, RACQUET_OMEGA0) else "free spin"
    print(
        f"rigidjax simulate --stepper {args.stepper}: {what}, I = diag({', '.join(f'{v:g}' for v in inertia)}) kg m^2, "
        f"omega0 = ({', '.join(f'{v:g}' for v in omega0)}) rad/s, dt = {args.dt} s, t_end = {t_end:g} s"
    )
    print("  (drifts: max relative deviation of kinetic energy and of the world angular momentum vector;")
    print("   constraint violation: max | |q| - 1 |; rotation per step: max |omega| dt in rad;")
    print("   rate error: max |omega - exact| over the components, rad/s, against rigidjax.reference)")
    for k, v in summary.items():
        print(f"  {k:32s} {v:.6g}" if isinstance(v, float) else f"  {k:32s} {v}")
    print(f"  trajectory ({len(t)} rows) -> {out}")
    if args.json:
        try:
            with cli_fit.replacing(args.json) as tmp:
                tmp.write_text(json.dumps(summary, indent=2))
        except OSError as e:
            return _fail(f"cannot write {args.json}: {e.strerror or e}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        for i, k in enumerate(("wx", "wy", "wz")):
            ax.plot(t, cols[k], color=f"C{i}", label=f"{k} ({args.stepper})")
            if exact is not None:
                ax.plot(t, exact[:, i], "--", color="k", lw=0.9, label="exact (Jacobi elliptic)" if i == 0 else None)
        ax.set_xlabel("t (s)")
        ax.set_ylabel("body angular velocity (rad/s)")
        ax.set_title(f"{what} ({args.stepper} step, dt = {args.dt} s)")
        ax.legend()
        fig.tight_layout()
        with cli_fit.replacing(args.plot) as tmp:
            fig.savefig(tmp, dpi=120)
        print(f"  plot -> {args.plot}")
    return 0


def _triple(text, opt: str):
    """``"1,2,3"`` -> three floats (``ValueError`` naming the option otherwise)."""
    try:
        v = [float(x) for x in str(text).split(",")]
    except ValueError:
        raise ValueError(f"{opt}: expected three comma-separated numbers, e.g. 1,2,3; got {text!r}") from None
    if len(v) != 3:
        raise ValueError(f"{opt}: expected three comma-separated numbers, e.g. 1,2,3; got {text!r}")
    return v


def _fail(msg: str) -> int:
    print(f"rigidjax simulate: error: {msg}", file=sys.stderr)
    return 2


EXIT_HELP = """\
exit status (every command; `rigidjax COMMAND --help` says what each means there):
  0  success (fit: converged)
  1  a result that is not fully trustworthy (fit, fit-pendulum)
  2  bad path, file or option
  3  recordings whose estimates disagree were not pooled (fit)
  130  interrupted (Ctrl-C)
"""


def version() -> str:
    """The installed package's version (``unknown`` when run from an uninstalled tree)."""
    try:
        return metadata.version("rigidjax")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rigidjax",
        description="Differentiable rigid-body dynamics in JAX.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"rigidjax {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "simulate",
        help="simulate a torque-free spin (default: a tennis-racket flip), write CSV, compare with the exact solution",
    )
    s.add_argument(
        "--stepper",
        choices=STEPPERS,
        default="midpoint",
        help=(
            "midpoint (seed 000), ep (Euler parameters, generalized-alpha, seed 002), "
            "vi (variational midpoint, seed 001)"
        ),
    )
    s.add_argument(
        "--inertia",
        default=",".join(f"{v:g}" for v in RACQUET_INERTIA),
        metavar="I1,I2,I3",
        help="principal moments along the body axes, kg m^2 (default 1,2,3)",
    )
    s.add_argument(
        "--omega0",
        default=",".join(f"{v:g}" for v in RACQUET_OMEGA0),
        metavar="WX,WY,WZ",
        help="initial body angular velocity, rad/s (default 0.01,2,0: about the intermediate axis)",
    )
    s.add_argument("--dt", type=float, default=0.01, help="time step, s (default 0.01)")
    s.add_argument("--t-end", type=float, default=10.0, help="duration, s (default 10)")
    s.add_argument("--out", default="trajectory.csv", help="CSV output (default trajectory.csv)")
    s.add_argument("--json", default=None, help="write the summary as JSON")
    s.add_argument("--plot", default=None, help="write a PNG of omega(t), the exact solution dashed beside it")
    cli_fit.add_cache_option(s)
    s.set_defaults(func=_cmd_simulate)
    cli_fit.add_parsers(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cli_fit.enable_compilation_cache(getattr(args, "no_cache", False))
    try:
        return int(args.func(args) or 0)
    except SystemExit:
        raise
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        print(f"rigidjax {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, not JAX's traceback; the shell's code for SIGINT
        return _interrupted(f"rigidjax {args.command}")


def _interrupted(cmd: str) -> int:
    """Say that ``cmd`` was interrupted (on a line of its own after a terminal's progress line)
    and return the shell's exit status for SIGINT."""
    print(f"{chr(10) if sys.stderr.isatty() else ''}{cmd}: interrupted", file=sys.stderr)
    return 130


class _PipeSafe:
    """An output stream (stdout, stderr) that stops writing, silently, once its reader has gone
    (``rigidjax fit | head``, ``2>&1 | head``):
    the command still writes its --json, --plot and --report files and exits with its own code.
    Any other failure to write (``> /dev/full``: no space left on device; a closed stdout,
    ``>&-``) stops the writing too, and is kept in :attr:`error`: :func:`run` then reports a
    failed stdout and exits with status 2 (a failed stderr, which carries progress and
    messages, not the result, changes no exit code)."""

    def __init__(self, stream):
        self._stream = stream
        self._gone = False
        self.error: OSError | None = None

    def _try(self, op):
        if self._gone:
            return
        try:
            op()
        except BrokenPipeError:
            self._gone = True
        except OSError as e:
            self._gone = True
            self.error = e

    def write(self, text):
        self._try(lambda: self._stream.write(text))
        return len(text)

    def flush(self):
        self._try(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _output_failed(out: _PipeSafe, err: _PipeSafe) -> bool:
    """Flush both streams; where writing one failed (not a reader that has gone), say so on
    stderr (where that still works) and return True."""
    for stream in (out, err):
        try:
            stream.flush()
        except ValueError:  # a closed stream
            pass
    if out.error is not None:
        sub = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else None
        cmd = f"rigidjax {sub}" if sub else "rigidjax"
        err.write(f"{cmd}: error: cannot write to standard output: {out.error.strerror or out.error}\n")
        err.flush()
    # stderr carries progress and messages, not the result: its failure alone changes no exit code
    return out.error is not None


def run() -> None:
    """The console entry point (``rigidjax``, ``python -m rigidjax``): :func:`main`, then the
    process ends at once with its exit code. When ``main`` returns, every output is written
    and closed (a demo's temporary folder removed); what remains is the interpreter's own
    teardown of JAX, XLA and the ~1,600 modules imported, ~0.5 s of every command on the
    2-core VM (``python -c "import rigidjax.cli"``: 0.5-0.6 s from its last statement to the
    process's end). It is skipped: stdout and stderr are flushed and ``os._exit`` ends the
    process. ``--help``, usage errors and exceptions leave the usual way. Output piped into a
    reader that stops early (``| head``) is cut there without an error (:class:`_PipeSafe`);
    output that cannot be written otherwise (``> /dev/full``) ends in a one-line error and
    exit status 2 once the command is done (its files written)."""
    out, err = _PipeSafe(sys.stdout), _PipeSafe(sys.stderr)
    if sys.stdout is None:  # started with stdout closed (>&-): nothing it prints can be written
        out = _PipeSafe(open(os.devnull, "w"))
        out.error = OSError(errno.EBADF, "it is closed")
    if sys.stderr is None:  # closed: nothing can be said there
        err = _PipeSafe(open(os.devnull, "w"))
    sys.stdout, sys.stderr = out, err
    try:
        code = main()
    except KeyboardInterrupt:  # before the command ran (parsing, the cache's set-up)
        code = _interrupted("rigidjax")
    except SystemExit:  # --help, --version, usage errors
        if _output_failed(out, err):
            raise SystemExit(2) from None
        raise
    if _output_failed(out, err):
        code = 2
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
