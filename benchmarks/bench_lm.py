"""Benchmark: rigidjax's Levenberg-Marquardt (``identify._lm``) against optimistix's on the same problems.

    python -m benchmarks.bench_lm [--repeats 3]

The same residual function (``identify.problem``'s, one jitted rollout per segment), the same
start, one start each; truths by SciPy DOP853 (rtol 1e-12) plus noise:

* ``known-torques``: a body driven by known torques, a gyroscope with bias (0.01 rad/s noise,
  150 samples, substeps 4); unknowns: 3 moments, 3 biases, the initial rate (9);
* ``known-torques x4``: four such segments (3 + 3 + 4 x 3 = 18 unknowns, block-sparse);
* ``vi-pendulum``: a pendulum's length and damping through the variational step from an
  encoder (two swings, 300 samples, substeps 2; 2 + 2 x 2 = 6 unknowns).

Rows: ``rigidjax fit`` (``identify.fit(problem, starts=1, step_check="off")``, the same
discrete model: NumPy LM iterations around one jitted, vmapped residual-and-Jacobian call,
forward mode) and ``optimistix LM``
(``optx.least_squares`` with ``optx.LevenbergMarquardt(rtol=1e-10, atol=1e-10)``, forward-mode
Jacobian, the whole loop compiled). Columns: first call (compilation included) and best warm
wall time, iterations, final cost ``1/2 |r|^2`` and its excess over the smaller of the two.
Prints a table and writes ``benchmarks/results/bench_lm.json``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks._common import machine, table, write_json


def _free_body_truth(inertia, w0, t, torque):
    from scipy.integrate import solve_ivp

    I, Iinv = np.diag(inertia), np.diag(1 / np.asarray(inertia))
    y, out = np.asarray(w0, float), [np.asarray(w0, float)]
    for i in range(len(t) - 1):
        f = lambda s, w, tau: Iinv @ (np.cross(I @ w, w) + tau)  # noqa: E731
        y = solve_ivp(f, (t[i], t[i + 1]), y, method="DOP853", rtol=1e-12, atol=1e-14, args=(torque[i],)).y[:, -1]
        out.append(y)
    return np.array(out)


def torque_problem(n_segments: int, seed: int = 0):
    import jax.numpy as jnp

    import rigidjax as rj
    from rigidjax import identify
    from rigidjax.identify import observations as obs, transforms as tr

    rng = np.random.default_rng(seed)
    inertia, dt, n, noise = np.array([1.0, 2.0, 2.8]), 0.01, 150, 0.01
    t = np.arange(n) * dt
    segs = []
    for s in range(n_segments):
        torque = 1.5 * np.stack([np.sin(3 * t[:-1] + s), 0.8 * np.cos(2 * t[:-1]), 0.6 * np.sin(5 * t[:-1] + 1)], -1)
        w0 = np.array([0.4, -0.3, 0.8]) + 0.3 * s
        y = (
            _free_body_truth(inertia, w0, t, torque)
            + np.array([0.02, -0.01, 0.015])
            + noise * rng.standard_normal((n, 3))
        )
        inputs = np.concatenate([np.zeros((n - 1, 3)), torque], -1)
        segs.append(
            identify.MeasuredSegment(
                t=t, data={"omega": y}, state0=rj.RigidBodyState(angular_velocity=y[0]), inputs=inputs
            )
        )
    return identify.Problem(
        model=rj.RigidBody(1.0, inertia),
        stepper=rj.Midpoint(),
        parameters={
            "moments": identify.Parameter(lambda m: m.inertia, tr.Positive(), into=jnp.diag, start=[1.5, 1.5, 1.5])
        },
        observations=[obs.AngularVelocity(bias=True, sigma=noise)],
        segments=segs,
        initial=identify.FreeBodyInitial(("angular_velocity",)),
        substeps=4,
    )


def pendulum_problem(seed: int = 0):
    from scipy.integrate import solve_ivp

    import rigidjax as rj
    from rigidjax import identify, systems
    from rigidjax.identify import observations as obs, transforms as tr
    from rigidjax.variational import vi_state

    rng = np.random.default_rng(seed)
    G, L, c, m, noise, dt, n = 9.81, 0.8, 0.05, 1.0, 1e-3, 0.01, 300
    t = np.arange(n) * dt
    segs = []
    for th0 in (0.5, 1.2):
        rhs = lambda s, y: [y[1], -G / L * np.sin(y[0]) - c / (m * L**2) * y[1]]  # noqa: E731
        sol = solve_ivp(rhs, (0, t[-1]), [th0, 0.0], t_eval=t, method="DOP853", rtol=1e-12, atol=1e-14)
        meas = sol.y[0][:, None] + noise * rng.standard_normal((n, 1))
        segs.append(identify.MeasuredSegment(t=t, data={"theta": meas}, state0=np.array([meas[0, 0], 0.0])))
    return identify.Problem(
        model=systems.pendulum(length=1.0, mass=m, gravity=G, damping=0.01),
        stepper=rj.MidpointVI(forcing_split="symmetric"),
        parameters={
            "length": identify.Parameter(
                lambda sy: (sy.lagrangian.inertia, sy.lagrangian.moment),
                tr.Positive(),
                into=lambda v: (m * v[0] ** 2, m * G * v[0]),
                start=np.array([1.0]),
            ),
            "damping": identify.Parameter(lambda sy: sy.forcing.damping, tr.Positive(), start=np.array(0.01)),
        },
        observations=[obs.Signal("theta", "theta", sigma=noise)],
        segments=segs,
        initial=identify.InitialState(2, lambda sy, z, s0: vi_state(sy, z[:1], z[1:2], check=False), np.asarray),
        signals=lambda sy, states: {"theta": states.q},
        substeps=2,
    )


def _timed(fn, repeats):
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        warm.append(time.perf_counter() - t0)
    return out, first, min(warm)


def compare(name, problem, repeats):
    import jax
    import jax.numpy as jnp
    import optimistix as optx

    from rigidjax import identify
    from rigidjax.identify._program import _residual_fn, _stack_segments
    from rigidjax.identify.problem import _Layout

    layout = _Layout(problem)
    residuals = _residual_fn(problem, layout)
    arrays = _stack_segments(problem, jnp.float64).arrays()
    x0 = jnp.asarray(layout.start())
    # the body-rate rollout steps the longest segment's sample intervals (steps: arrays[6])
    trip = int(np.max(np.sum(np.asarray(arrays[6]), axis=-1)))
    fn = lambda x, _: residuals(arrays, x, trip)[0].reshape(-1)  # noqa: E731

    ours, ours_first, ours_warm = _timed(lambda: identify.fit(problem, starts=1, step_check="off"), repeats)
    solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-10)

    @jax.jit
    def run_optx(x):
        sol = optx.least_squares(fn, solver, x, max_steps=200, throw=False, options=dict(jac="fwd"))
        return sol.value, sol.stats["num_steps"], sol.result == optx.RESULTS.successful

    def optx_fit():
        out = run_optx(x0)
        jax.block_until_ready(out)
        return out

    (xo, steps_o, ok_o), o_first, o_warm = _timed(optx_fit, repeats)
    cost_ours = 0.5 * float(np.sum(np.asarray(fn(jnp.asarray(ours.x), None)) ** 2))
    cost_optx = 0.5 * float(np.sum(np.asarray(fn(xo, None)) ** 2))
    best = min(cost_ours, cost_optx)
    return [
        {
            "problem": name,
            "unknowns": int(layout.P),
            "solver": "rigidjax fit (starts=1)",
            "first_s": round(ours_first, 2),
            "warm_s": round(ours_warm, 3),
            "iterations": int(ours.iterations),
            "cost": cost_ours,
            "excess": (cost_ours - best) / best,
            "status": ours.status.value,
        },
        {
            "problem": name,
            "unknowns": int(layout.P),
            "solver": "optimistix LM",
            "first_s": round(o_first, 2),
            "warm_s": round(o_warm, 3),
            "iterations": int(steps_o),
            "cost": cost_optx,
            "excess": (cost_optx - best) / best,
            "status": "successful" if bool(ok_o) else "not successful",
        },
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="warm calls timed (best reported)")
    args = ap.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    rows = []
    for name, make in (
        ("known-torques", lambda: torque_problem(1)),
        ("known-torques x4", lambda: torque_problem(4)),
        ("vi-pendulum", pendulum_problem),
    ):
        rows += compare(name, make(), args.repeats)
    for r in rows:
        r["cost"] = f"{r['cost']:.6g}"
        r["excess"] = f"{r['excess']:.1e}"
    cols = ["problem", "unknowns", "solver", "first_s", "warm_s", "iterations", "cost", "excess", "status"]
    print(table(rows, cols))
    path = write_json("bench_lm", {"machine": machine(), "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
