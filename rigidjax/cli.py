"""Command line: ``rigidjax simulate`` and ``rigidjax fit``.

The command line enables float64 (``jax_enable_x64``) before it computes anything; the
library itself never changes global JAX configuration. Failures exit with status 2 and
a one-line message; a step that fails in a simulation raises a clear error (checked mode).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

__all__ = ["main", "simulate_midpoint"]

STEPPERS = ("midpoint", "ep", "vi")


def simulate_midpoint(dt: float, t_end: float, attitude: str = "midpoint"):
    """Default scenario with the midpoint step: the tennis-racket flip.

    Body ``mass = 1 kg``, principal moments ``(1, 2, 3) kg m^2``, torque-free, body rate
    ``omega0 = (0.01, 2, 0) rad/s`` (near the intermediate axis). Returns ``(t (n,),
    columns dict, summary dict)``; raises :class:`rigidjax.StepFailure` if a step fails.
    """
    from functools import partial

    import jax.numpy as jnp

    import rigidjax as rj

    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    s0 = rj.RigidBodyState(angular_velocity=[0.01, 2.0, 0.0])
    n = int(round(t_end / dt))
    tr = rj.rollout(partial(rj.midpoint_step, attitude=attitude), body, s0, dt, n, checked=True)
    st = tr.states
    E = np.asarray(rj.kinetic_energy(body, st))
    L = np.linalg.norm(np.asarray(rj.angular_momentum(body, st)), axis=-1)
    cols = {
        "t": np.asarray(st.time),
        **{k: np.asarray(st.position[:, i]) for i, k in enumerate("xyz")},
        **{k: np.asarray(st.orientation[:, i]) for i, k in enumerate(["qw", "qx", "qy", "qz"])},
        **{k: np.asarray(st.angular_velocity[:, i]) for i, k in enumerate(["wx", "wy", "wz"])},
    }
    summary = {
        "energy_drift": float(np.abs(E / E[0] - 1).max()),
        "angular_momentum_drift": float(np.abs(L / L[0] - 1).max()),
        "max_rotation_per_step": float(jnp.max(tr.info.rotation)),
        "steps": float(n),
    }
    return cols["t"], cols, summary


def _scenario(stepper: str):
    if stepper == "midpoint":
        return simulate_midpoint
    if stepper == "ep":
        from .euler_parameters import simulate_scenario

        return simulate_scenario
    if stepper == "vi":
        from .systems import simulate_scenario

        return simulate_scenario
    raise ValueError(stepper)


MAX_STEPS = 5_000_000


def _common_summary(cols: dict, dt: float) -> dict:
    """Drifts computed the same way for every stepper, from the written columns.

    The scenario body is ``I = diag(1, 2, 3) kg m^2`` (body frame), torque-free.
    """
    I = np.array([1.0, 2.0, 3.0])
    w = np.stack([cols["wx"], cols["wy"], cols["wz"]], -1)
    q = np.stack([cols["qw"], cols["qx"], cols["qy"], cols["qz"]], -1)
    E = 0.5 * np.sum(I * w * w, -1)
    Lb = I * w
    # world angular momentum R(q) L_body (quaternion rotation, scalar first)
    qv, q0 = q[:, 1:], q[:, :1]
    Lw = Lb + 2 * np.cross(qv, np.cross(qv, Lb) + q0 * Lb)
    L0 = np.linalg.norm(Lw[0])
    return {
        "steps": int(len(w) - 1),
        "energy_drift": float(np.abs(E / E[0] - 1).max()),
        "angular_momentum_drift": float(np.linalg.norm(Lw - Lw[0], axis=-1).max() / L0),
        "max_constraint_violation": float(np.abs(np.linalg.norm(q, axis=-1) - 1).max()),
        "max_rotation_per_step": float(np.linalg.norm(w, axis=-1).max() * dt),
    }


def _cmd_simulate(args) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    if not (np.isfinite(args.dt) and args.dt > 0):
        return _fail(f"--dt must be > 0 s; got {args.dt}")
    if not (np.isfinite(args.t_end) and args.t_end > 0):
        return _fail(f"--t-end must be > 0 s; got {args.t_end}")
    n = int(np.ceil(args.t_end / args.dt - 1e-9))
    if n > MAX_STEPS:
        return _fail(f"--t-end / --dt asks for {n} steps (more than {MAX_STEPS}); choose a larger --dt or a shorter --t-end")
    t_end = n * args.dt  # a whole number of steps, reaching at least --t-end
    fn = _scenario(args.stepper)
    t, cols, own = fn(args.dt, t_end)
    summary = _common_summary(cols, args.dt)
    summary.update({k: v for k, v in own.items() if k not in summary})
    import pandas as pd

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(cols).to_csv(out, index=False, float_format="%.10g")
    print(
        f"rigidjax simulate --stepper {args.stepper}: tennis-racket flip, I = diag(1, 2, 3) kg m^2, "
        f"omega0 = (0.01, 2, 0) rad/s, dt = {args.dt} s, t_end = {t_end:g} s"
    )
    print("  (drifts: max relative deviation of kinetic energy and of the world angular momentum vector;")
    print("   constraint violation: max | |q| - 1 |; rotation per step: max |omega| dt in rad)")
    for k, v in summary.items():
        print(f"  {k:32s} {v:.6g}" if isinstance(v, float) else f"  {k:32s} {v}")
    print(f"  trajectory ({len(t)} rows) -> {out}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        for k in ("wx", "wy", "wz"):
            ax.plot(t, cols[k], label=k)
        ax.set_xlabel("t (s)")
        ax.set_ylabel("body angular velocity (rad/s)")
        ax.set_title(f"tennis-racket flip ({args.stepper} step, dt = {args.dt} s)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"  plot -> {args.plot}")
    return 0


def _fail(msg: str) -> int:
    print(f"rigidjax simulate: error: {msg}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rigidjax", description="Differentiable rigid-body dynamics in JAX.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("simulate", help="simulate a built-in scenario (default: a tennis-racket flip) and write CSV")
    s.add_argument("--stepper", choices=STEPPERS, default="midpoint", help="midpoint (seed 000), ep (Euler parameters, generalized-alpha, seed 002), vi (variational midpoint, seed 001)")
    s.add_argument("--dt", type=float, default=0.01, help="time step, s (default 0.01)")
    s.add_argument("--t-end", type=float, default=10.0, help="duration, s (default 10)")
    s.add_argument("--out", default="trajectory.csv", help="CSV output (default trajectory.csv)")
    s.add_argument("--json", default=None, help="write the summary as JSON")
    s.add_argument("--plot", default=None, help="write a PNG of omega(t)")
    s.set_defaults(func=_cmd_simulate)
    from . import cli_fit

    cli_fit.add_parsers(sub)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SystemExit:
        raise
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        print(f"rigidjax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
