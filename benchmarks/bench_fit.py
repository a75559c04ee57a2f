"""Benchmark: fit the shared racquet flips; rigidjax against SciPy and mujoco.sysid, CPU and accuracy.

    python -m benchmarks.bench_fit [--data DIR] [--baseline-segments N] [--starts K] [--keep K]
                                   [--commands] [--search N] [--quick]

The model all three fit per window (``fit_inertia``'s default): torque-free Euler equations
with the principal axes along the phone's axes, the gyroscope reading the body rate (no
drag, no bias); unknowns ``Ix/Iy``, ``Iz/Iy`` (``Iy = 1``) restricted to the physically
valid set (triangle inequalities; rigidjax's box chart ``(u, v)``, used by all three) and
the initial body rate ``omega0``: five per window. Objective: the sum of squares of the rate
residuals (rad/s) at every measured timestamp.

Rows:

* ``rigidjax per-window``: :func:`rigidjax.identify.fit_inertia` on every kept flip
  (the model above, all windows in one batched call), timed cold (first call, JAX
  compilation included) and warm (the least CPU of the next two calls): wall clock and CPU
  (user + system of the process, both cores).
* ``rigidjax per-window, one core``: the same in a child process pinned to one core
  (Linux; skipped with ``--quick``): XLA:CPU's thread pool then has one thread.
* ``rigidjax joint``: one inertia for the pooled windows (the recordings it refuses to pool
  are named in its status).
* ``rigidjax identify.fit_many``: the general layer (:func:`rigidjax.identify.fit_many`) with
  the same model: ``transforms.MomentRatios`` (fit_inertia's box chart, edges reached exactly),
  ``AngularVelocity(bias=False, sigma=the window's noise)`` (``recipes.noise_level``),
  ``FreeBodyInitial(("angular_velocity",))``, the midpoint step with the sub-steps
  ``fit_inertia`` chose for the window (its adapted ``substeps``), ``--starts`` starts from
  the same equation-error start as SciPy's (the rest random, the layer's ``spread``), the
  ``--keep`` lowest of them per window run on past the first iterations (default 1, as
  fit_inertia keeps its best start after its first phase; 0: every start to its end); one
  problem per window, every window padded to the longest, all windows in one ``fit_many``
  call with ``groups`` (fit_inertia's recording labels: the rules across windows; one
  program, the sub-steps data), then :func:`rigidjax.identify.combine`; timed cold (first
  pass, compilation included) and warm (the least CPU of the next two); its statuses against fit_inertia's per
  window; per window (the ``N`` baseline windows, column ``identify.fit``) its DOP853 cost
  against the best and its estimates against fit_inertia's in fit_inertia's standard errors.
* ``rigidjax identify.fit joint``: one inertia for the windows ``combine`` pooled, through
  the layer: one problem with a segment per window (its own initial rate; 2 + 3 x windows
  unknowns, the Jacobian in blocks), ``substeps`` per segment (fit_inertia's), from
  ``combine``'s estimate, ``--starts`` starts and the step check; timed cold and warm as
  above (after the ``fit_many`` row: add its time for the whole joint fit).
* ``scipy least_squares + solve_ivp``: the straightforward approach, per window,
  ``scipy.optimize.least_squares`` (trust-region reflective, finite-difference Jacobian)
  around ``scipy.integrate.solve_ivp`` (RK45, rtol 1e-6, atol 1e-8) of Euler's equations,
  from the same equation-error start, on ``N`` evenly spaced windows, extrapolated to all.
* ``mujoco.sysid`` (optional, the ``bench`` extra ``mujoco[sysid]``; skipped with a message
  when it does not import): the same windows, the same model and start, through
  ``benchmarks/_sysid.py`` (a free body in MJCF, RK4 at 1 ms, finite-difference
  Levenberg-Marquardt, ``omega0`` through a custom rollout hook; details there).
* Per window (the ``N`` windows): each method's CPU, its own residual RMS, its estimates, and
  the cost of its estimate re-simulated by DOP853 (rtol 1e-10: the exact-ODE objective, the
  integrator of ``rms_reference``) relative to the best of the methods on that window.
  rigidjax fits all windows in one batched call: its per-window CPU is the warm per-window
  fit's CPU divided by the number of windows.
* Summary: CPU of rigidjax (cold, warm) against SciPy and sysid (extrapolated to all windows),
  the largest cost excess of rigidjax over the best per window, and the targets: residual at
  or below the others' (within 0.5 % of cost) on every window, >= 30x less CPU than SciPy,
  >= 5x less than sysid.
* ``--commands``: ``rigidjax fit PATH --quiet`` as a subprocess on all flips and on each
  round (what a user runs: import, compilation and fit), CPU of the child.
* ``--search N``: :func:`rigidjax.identify.multistart_check` with ``N`` random starts per
  window: the largest relative cost excess of the reported minimum over the best start
  (should be <= 0.5 %).

``--quick`` fits 12 evenly spaced flips and 2 baseline windows. Prints the tables and writes
``benchmarks/results/bench_fit.json`` (``rows``, ``summary``, ``per_window``, ...). The shared
data are not redistributed: read from ``../shared/data`` beside the clone (or ``--data`` /
``RIGIDJAX_SHARED_DATA``); the script exits with a message if absent.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks._sysid import V_MAX, available, chart, ratios, sysid_fit

ROOT = Path(__file__).resolve().parents[1]


def _default_data() -> Path:
    shared = Path(os.environ.get("RIGIDJAX_SHARED_DATA", ROOT.parent / "shared" / "data"))
    return shared / "racquet-flips" / "flips"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def scipy_fit(seg, start) -> dict:
    """One window with least_squares + solve_ivp from ``start = (Ix/Iy, Iz/Iy)`` and the first
    measured rate: the model and unknowns of ``fit_inertia``'s per-window default (``Ix/Iy,
    Iz/Iy`` in its chart of the physically valid set, ``omega0``). Returns ``Ix/Iy``, ``Iz/Iy``,
    ``omega0``, ``rms`` (its own, RK45), ``nfev``, ``success``, ``cpu_s``, ``wall_s``."""
    from scipy.integrate import solve_ivp
    from scipy.optimize import least_squares

    t0, c0 = time.perf_counter(), _cpu()
    t = seg.t - seg.t[0]

    def residual(p):
        ix, iz = ratios(p[:2])
        inertia = np.array([ix, 1.0, iz])

        def rhs(_t, w):
            return -np.cross(w, inertia * w) / inertia

        sol = solve_ivp(rhs, (0.0, t[-1]), p[2:], t_eval=t, rtol=1e-6, atol=1e-8)
        if not sol.success or sol.y.shape[1] != t.size:
            return np.full(3 * t.size, 1e3)
        return (sol.y.T - seg.omega).ravel()

    p0 = np.concatenate([chart(*start), seg.omega[0]])
    lo = np.array([0.0, 0.0, -np.inf, -np.inf, -np.inf])
    hi = np.array([1.0, V_MAX, np.inf, np.inf, np.inf])
    res = least_squares(residual, p0, bounds=(lo, hi), x_scale="jac")
    ix, iz = ratios(res.x[:2])
    return {
        "Ix/Iy": ix,
        "Iz/Iy": iz,
        "omega0": [float(v) for v in res.x[2:]],
        "rms": float(np.sqrt(np.mean(res.fun**2))),
        "nfev": int(res.nfev),
        "success": bool(res.success),
        "cpu_s": _cpu() - c0,
        "wall_s": time.perf_counter() - t0,
    }


def _inertia(m):
    return m.inertia


def layer_problem(seg, start, substeps: int, sigma: float = 1.0):
    """One window as a :class:`rigidjax.identify.Problem` of the general layer (the row
    ``rigidjax identify.fit_many``, see module): ``start = (Ix/Iy, Iz/Iy)`` projected onto the
    valid box (as SciPy's and sysid's: an equation-error start may violate it), ``omega0``
    from the first sample, ``substeps`` fit_inertia's for the window. Module-level selector
    and one stepper, observation and initial-state object: every window is a problem of one
    structure (one compiled program; the rate alone is rolled out, its sub-steps data)."""
    import jax.numpy as jnp

    import rigidjax as rj
    from rigidjax import identify
    from rigidjax.identify import observations as obs
    from rigidjax.identify import transforms as tr

    state0 = rj.RigidBodyState(orientation=jnp.array([1.0, 0, 0, 0]), angular_velocity=jnp.asarray(seg.omega[0]))
    return identify.Problem(
        model=rj.RigidBody(1.0, np.eye(3)),
        stepper=_LAYER["stepper"],
        parameters={
            "ratios": identify.Parameter(
                _inertia, tr.MomentRatios(), into=tr.MomentRatios.inertia, start=np.array(ratios(chart(*start)))
            )
        },
        observations=[obs.AngularVelocity(bias=False, sigma=float(sigma))],
        segments=[identify.MeasuredSegment(t=seg.t - seg.t[0], data={"omega": seg.omega}, state0=state0)],
        initial=_LAYER["initial"],
        substeps=int(substeps),
    )


_LAYER: dict = {}


def layer_fits(
    segs, starts_of, substeps, starts: int, pad_to: int, groups, keep: int | None = None
) -> tuple[dict, float, float, object]:
    """Every window with :func:`rigidjax.identify.fit_many` in one call with ``groups``
    (``substeps[i]``, fit_inertia's: data of one program; every window padded to
    ``pad_to``; each window's sigma its noise level; ``keep``: fit_many's), then
    :func:`rigidjax.identify.combine`.
    Returns ``({window index: result}, wall s, CPU s, combined)``; each result: ``Ix/Iy``,
    ``Iz/Iy``, ``omega0``, ``rms`` (its own, midpoint at its sub-steps), ``se`` (the layer's:
    the larger of the classical and the block-sandwich estimate), ``se_classical`` (``s^2
    (J^T J)^-1``, as fit_inertia's), ``status`` (after combining), ``message``,
    ``iterations``, ``starts_at_best``, ``substeps`` (after the layer's own step-error
    check), ``at_edge`` (a chart coordinate held at a bound), ``chart``, ``cpu_s`` (the
    call's CPU divided by the windows)."""
    import rigidjax as rj
    from rigidjax import identify
    from rigidjax.identify.recipes import noise_level

    if not _LAYER:
        _LAYER.update(
            stepper=rj.Midpoint(max_rotation=float("inf")), initial=identify.FreeBodyInitial(("angular_velocity",))
        )
    out = {}
    t0, c0 = time.perf_counter(), _cpu()
    problems = [layer_problem(s, starts_of(s), k, noise_level(s.omega)) for s, k in zip(segs, substeps)]
    fits = identify.fit_many(problems, starts=starts, pad_to=pad_to, groups=groups, keep=keep)
    combined = identify.combine(fits, groups)
    cpu_each = (_cpu() - c0) / len(segs)
    for i, f in enumerate(combined.fits):
        ix, iz = (float(v) for v in f.values["ratios"])
        out[i] = {
            "Ix/Iy": ix,
            "Iz/Iy": iz,
            "omega0": [float(v) for v in f.initial[0]],
            "rms": float(f.rms[0]),
            "se": [float(v) for v in f.se["ratios"]],
            "se_classical": [float(v) for v in f.se_classical["ratios"]],
            "status": str(f.status.value),
            "message": f.message,
            "iterations": int(f.iterations),
            "starts_at_best": int(f.starts_at_best),
            "substeps": int(f.substeps),
            "substeps_given": int(substeps[i]),
            "at_edge": "held at a bound" in f.message,
            "chart": [float(v) for v in f.x[:2]],
            "cpu_s": cpu_each,
        }
    return out, time.perf_counter() - t0, _cpu() - c0, combined


def layer_joint(segs, start, substeps, starts: int) -> tuple[dict, float, float]:
    """One inertia for the windows ``segs`` through the general layer: one
    :class:`rigidjax.identify.Problem` with a segment per window (its own initial rate),
    ``substeps`` per segment (fit_inertia's: data of the one program), ``MomentRatios`` from
    ``start = (Ix/Iy, Iz/Iy)`` (the layer's combined estimate), sigma the windows' median
    noise, :func:`rigidjax.identify.fit` with ``starts`` starts and its step check. Returns
    ``(result, wall s, CPU s)``; result: ``Ix/Iy``, ``Iz/Iy``, ``se``, ``rms``, ``status``,
    ``message``, ``iterations``, ``unknowns``."""
    import jax.numpy as jnp

    import rigidjax as rj
    from rigidjax import identify
    from rigidjax.identify import observations as obs
    from rigidjax.identify import transforms as tr
    from rigidjax.identify.recipes import noise_level

    t0, c0 = time.perf_counter(), _cpu()
    segments = [
        identify.MeasuredSegment(
            t=s.t - s.t[0],
            data={"omega": s.omega},
            state0=rj.RigidBodyState(orientation=jnp.array([1.0, 0, 0, 0]), angular_velocity=jnp.asarray(s.omega[0])),
        )
        for s in segs
    ]
    problem = identify.Problem(
        model=rj.RigidBody(1.0, np.eye(3)),
        stepper=_LAYER["stepper"],
        parameters={
            "ratios": identify.Parameter(_inertia, tr.MomentRatios(), into=tr.MomentRatios.inertia, start=start)
        },
        observations=[obs.AngularVelocity(bias=False, sigma=float(np.median([noise_level(s.omega) for s in segs])))],
        segments=segments,
        initial=_LAYER["initial"],
        substeps=tuple(int(k) for k in substeps),
    )
    f = identify.fit(problem, starts=starts)
    ix, iz = (float(v) for v in f.values["ratios"])
    out = {
        "Ix/Iy": ix,
        "Iz/Iy": iz,
        "se": [float(v) for v in f.se["ratios"]],
        "rms": float(f.rms[0]),
        "status": str(f.status.value),
        "message": f.message,
        "iterations": int(f.iterations),
        "unknowns": int(len(f.x)),
    }
    return out, time.perf_counter() - t0, _cpu() - c0


def _dop853_rms(seg, ix, iz, w0) -> float:
    """Residual RMS (rad/s) of an estimate re-simulated by DOP853 at rtol 1e-10 (the exact-ODE
    objective; the integrator of ``fit_inertia``'s ``rms_reference``)."""
    from rigidjax.reference import euler_omega

    if ix is None or iz is None or w0 is None:
        return float("nan")
    try:
        w = euler_omega(np.array([ix, 1.0, iz]), np.asarray(w0, float), seg.t, rtol=1e-10)
    except (RuntimeError, np.linalg.LinAlgError, ValueError):
        return float("nan")
    return float(np.sqrt(np.mean((w - seg.omega) ** 2)))


def _short(name: str) -> str:
    return name.replace("Gyroscope rotation rate ", "")


#: Warm passes after the cold one; a row's warm time is the pass of least CPU (the VM's timings
#: vary by up to 1.5x between passes of one process).
WARM_PASSES = 2


def _best(times):
    """The ``(wall, CPU)`` pair of least CPU."""
    return min(times, key=lambda t: t[1])


_ONE_CORE = """
import json, os, resource, sys, time, warnings
os.sched_setaffinity(0, {int(sys.argv[3])})  # before JAX starts its threads
import jax
jax.config.update("jax_enable_x64", True)
from rigidjax.identify import fit_inertia
from rigidjax.io import load_phyphox
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    segs = load_phyphox(sys.argv[1])
    out = []
    for _ in range(3):
        t0, c0 = time.perf_counter(), cpu()
        fit = fit_inertia(segs, starts=int(sys.argv[2]))
        out.append((time.perf_counter() - t0, cpu() - c0))
print(json.dumps({"times": out, "Ix/Iy": fit.estimates.get("Ix/Iy"), "Iz/Iy": fit.estimates.get("Iz/Iy"),
                  "status": fit.status.value, "rms": fit.rms}))
"""


def _one_core(data: Path, starts: int, quick: bool) -> dict | None:
    """``fit_inertia`` on every window in a child process pinned to one core (Linux
    ``sched_setaffinity`` before JAX is imported: XLA:CPU's pool then has one thread), cold then
    the better of two warm passes; ``None`` where affinity cannot be set. Why: on the 2-core
    VM the fit's small programs spend more CPU in the pool's work stealing than they save."""
    if not hasattr(os, "sched_setaffinity") or quick:
        return None
    core = min(os.sched_getaffinity(0))
    p = subprocess.run(
        [sys.executable, "-c", _ONE_CORE, str(data), str(starts), str(core)], capture_output=True, text=True
    )
    if p.returncode != 0:
        print(f"bench_fit: the one-core run failed: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    r = json.loads(p.stdout.strip().splitlines()[-1])
    (cw, cc), *warm = r["times"]
    ww, wc = _best(warm)
    return {
        "cold_s": cw,
        "warm_s": ww,
        "cold_cpu_s": cc,
        "warm_cpu_s": wc,
        "Ix/Iy": r["Ix/Iy"],
        "Iz/Iy": r["Iz/Iy"],
        "rms": r["rms"],
        "status": r["status"],
        "method": "fit_inertia per window, a child process pinned to one core (XLA:CPU's pool of one thread)",
    }


def _command(path: Path) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "rigidjax", "fit", str(path), "--quiet"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    status = next((ln.split("status:")[1].strip() for ln in p.stdout.splitlines() if "status:" in ln), "?")
    return {"path": str(path), "wall_s": wall, "cpu_s": cpu, "exit": p.returncode, "status": status}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="folder of phyphox exports (default: the shared racquet flips)")
    ap.add_argument(
        "--baseline-segments",
        type=int,
        default=8,
        help="fit N evenly spaced windows with SciPy and sysid, extrapolate to all (default 8; 0 = all)",
    )
    ap.add_argument("--starts", type=int, default=4)
    ap.add_argument(
        "--keep", type=int, default=1, help="identify.fit_many: starts run past the first iterations (0: all)"
    )
    ap.add_argument("--commands", action="store_true", help="also time `rigidjax fit` on all flips and on each round")
    ap.add_argument(
        "--search", type=int, default=0, metavar="N", help="dense multi-start check with N starts per window"
    )
    ap.add_argument("--quick", action="store_true", help="12 evenly spaced flips, 2 baseline windows")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_fit.json"))
    args = ap.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    from rigidjax.identify import fit_inertia, multistart_check
    from rigidjax.identify._model import V_MAX as RJ_V_MAX
    from rigidjax.identify._model import Spec, equation_error_guess
    from rigidjax.io import load_phyphox

    assert V_MAX == RJ_V_MAX  # the same valid box for the three methods
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
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU(s)"
    print(f"{len(segs)} kept flips, {n_samples} samples, from {data}")
    print(f"{stamp}; {machine}; jax {jax.__version__} ({jax.default_backend()}); load average {os.getloadavg()[0]:.2f}")

    rows = {}
    for label, kw in (("per-window", dict(joint=False)), ("joint", dict(joint=True))):
        times = []
        for _ in range(1 + WARM_PASSES):
            t0, c0 = time.perf_counter(), _cpu()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit = fit_inertia(segs, starts=args.starts, **kw)
            times.append((time.perf_counter() - t0, _cpu() - c0))
        warm = _best(times[1:])
        rows[f"rigidjax {label}"] = {
            "cold_s": times[0][0],
            "warm_s": warm[0],
            "cold_cpu_s": times[0][1],
            "warm_cpu_s": warm[1],
            "Ix/Iy": fit.estimates.get("Ix/Iy"),
            "Iz/Iy": fit.estimates.get("Iz/Iy"),
            "interval_Ix/Iy": fit.intervals.get("Ix/Iy"),
            "rms": fit.rms,
            "status": fit.status.value,
            "message": fit.message,
            "windows": len(segs),
            "pooled": fit.combined.get("n"),
        }
        if label == "per-window":
            ours = fit
    one_core = _one_core(data, args.starts, args.quick)
    if one_core is not None:
        rows["rigidjax per-window, one core"] = one_core

    n_base = len(segs) if args.baseline_segments <= 0 else min(args.baseline_segments, len(segs))
    pick = np.unique(np.linspace(0, len(segs) - 1, n_base).round().astype(int))  # spread over recordings
    n_base = pick.size
    why_not = available()
    if why_not is None:
        import mujoco.sysid  # noqa: F401 (imported before timing, as JAX is)
    spec = Spec(False, None, False)
    rj_cpu_window = rows["rigidjax per-window"]["warm_cpu_s"] / len(segs)
    methods = ("rigidjax", "identify.fit", "scipy") + (("sysid",) if why_not is None else ())

    def _start(s):
        th = equation_error_guess([s], spec)
        moments = np.maximum(th[:3], 1e-3 * np.sum(np.abs(th[:3])))
        return np.array([moments[0], moments[2]]) / moments[1]

    # the general layer on every window: two passes (cold, warm), fit_inertia's sub-steps
    pad_to = max(s.n for s in segs)
    layer_times = []
    for _ in range(1 + WARM_PASSES):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer, wall, cpu, layer_combined = layer_fits(
                segs,
                _start,
                [ours.segments[i]["substeps"] for i in range(len(segs))],
                args.starts,
                pad_to,
                [ours.segments[i]["recording"] for i in range(len(segs))],
                keep=args.keep or None,
            )
        layer_times.append((wall, cpu))
    # one inertia for the windows the layer pooled, from its combined estimate
    pooled_idx = [int(i) for i in layer_combined.windows]
    joint_start = np.array([layer_combined.estimates["ratios[0]"], layer_combined.estimates["ratios[1]"]])
    joint_times = []
    for _ in range(1 + WARM_PASSES):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layer_joint_fit, wall, cpu = layer_joint(
                [segs[i] for i in pooled_idx],
                joint_start,
                [ours.segments[i]["substeps"] for i in pooled_idx],
                args.starts,
            )
        joint_times.append((wall, cpu))
    per_window = []
    for i in pick:
        s = segs[i]
        seg_row = ours.segments[i]
        est = seg_row.get("estimates") or {}
        w = {
            "window": s.name or f"window {i}",
            "index": int(i),
            "n": int(s.n),
            "rigidjax": {
                "cpu_s": rj_cpu_window,
                "rms": seg_row.get("rms"),
                "Ix/Iy": est.get("Ix/Iy"),
                "Iz/Iy": est.get("Iz/Iy"),
                "omega0": seg_row.get("omega0"),
                "status": getattr(seg_row.get("status"), "value", seg_row.get("status")),
            },
        }
        start = _start(s)
        w["identify.fit"] = layer[i]
        # the layer's estimates against fit_inertia's, in fit_inertia's standard errors
        se_fi = seg_row.get("se") or {}
        w["identify.fit"]["diff_se_vs_fit_inertia"] = [
            (layer[i][k] - est[k]) / se_fi[k] if est.get(k) is not None and se_fi.get(k) else None
            for k in ("Ix/Iy", "Iz/Iy")
        ]
        w["scipy"] = scipy_fit(s, start)
        if why_not is None:
            t0 = time.perf_counter()
            w["sysid"] = sysid_fit(s, start)
            w["sysid"]["wall_s"] = time.perf_counter() - t0
        for m in methods:
            r = w[m]
            r["rms_dop853"] = _dop853_rms(s, r["Ix/Iy"], r["Iz/Iy"], r["omega0"])
        best = np.nanmin([w[m]["rms_dop853"] for m in methods])
        for m in methods:
            # cost = sum of squares = 3 n rms^2: relative to the lowest of the methods on this window
            w[m]["cost_excess"] = float(w[m]["rms_dop853"] ** 2 / best**2 - 1)
        per_window.append(w)

    scale = len(segs) / n_base

    def _baseline_row(m: str, label: str) -> dict:
        rs = [w[m] for w in per_window]
        ok = np.array([r["success"] for r in rs])
        cpu = sum(r["cpu_s"] for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        return {
            "cold_s": wall * scale,
            "warm_s": wall * scale,
            "cold_cpu_s": cpu * scale,
            "warm_cpu_s": cpu * scale,
            "windows": n_base,
            "extrapolated_to": len(segs),
            "Ix/Iy": float(np.median([r["Ix/Iy"] for r, o in zip(rs, ok) if o])) if ok.any() else None,
            "Iz/Iy": float(np.median([r["Iz/Iy"] for r, o in zip(rs, ok) if o])) if ok.any() else None,
            "rms": float(np.sqrt(np.mean([r["rms"] ** 2 for r in rs]))),
            "status": f"{int(ok.sum())} of {n_base} succeeded",
            "nfev": [r["nfev"] for r in rs],
            "method": label,
        }

    # rigidjax's estimate re-simulated by DOP853 (rms_reference): the same exact-ODE objective
    ours_ref = np.array([ours.segments[i].get("rms_reference") or np.nan for i in pick])
    scipy_rms = np.array([w["scipy"]["rms"] for w in per_window])
    rows["scipy least_squares + solve_ivp"] = _baseline_row(
        "scipy", "least_squares (TRF, 2-point Jacobian) around solve_ivp (RK45, rtol 1e-6, atol 1e-8)"
    )
    rows["scipy least_squares + solve_ivp"].update(
        rigidjax_rms_same_windows=float(np.sqrt(np.nanmean(ours_ref**2))),
        scipy_rms_over_rigidjax_same_windows=[float(b / a) for a, b in zip(ours_ref, scipy_rms)],
    )
    rows["rigidjax identify.fit_many"] = {
        "cold_s": layer_times[0][0],
        "warm_s": _best(layer_times[1:])[0],
        "cold_cpu_s": layer_times[0][1],
        "warm_cpu_s": _best(layer_times[1:])[1],
        "windows": len(segs),
        "Ix/Iy": layer_combined.estimates.get("ratios[0]"),
        "Iz/Iy": layer_combined.estimates.get("ratios[1]"),
        "interval_Ix/Iy": layer_combined.intervals.get("ratios[0]"),
        "rms": float(np.sqrt(np.mean([r["rms"] ** 2 for r in layer.values()]))),
        "status": f"{sum(r['status'] == 'converged' for r in layer.values())} of {len(segs)} converged, "
        f"{len(layer_combined.windows)} pooled",
        "statuses_as_fit_inertia": int(
            sum(layer[i]["status"] == ours.segments[i]["status"].value for i in range(len(segs)))
        ),
        "method": "rigidjax.identify.fit_many(groups=recordings) + identify.combine: MomentRatios, "
        "AngularVelocity(bias=False, sigma=noise), FreeBodyInitial(angular_velocity), midpoint at fit_inertia's "
        f"sub-steps, one call, {args.starts} starts, keep={args.keep or None}",
    }
    rows["rigidjax identify.fit joint"] = {
        "cold_s": joint_times[0][0],
        "warm_s": _best(joint_times[1:])[0],
        "cold_cpu_s": joint_times[0][1],
        "warm_cpu_s": _best(joint_times[1:])[1],
        "windows": len(pooled_idx),
        "Ix/Iy": layer_joint_fit["Ix/Iy"],
        "Iz/Iy": layer_joint_fit["Iz/Iy"],
        "se": layer_joint_fit["se"],
        "rms": layer_joint_fit["rms"],
        "status": f"{layer_joint_fit['status']}; {len(pooled_idx)} windows, {layer_joint_fit['unknowns']} unknowns",
        "message": layer_joint_fit["message"],
        "method": "rigidjax.identify.fit of one Problem, a segment per window fit_many + combine pooled, "
        "per-segment sub-steps (fit_inertia's), from combine's estimate",
    }
    if why_not is None:
        rows["mujoco.sysid"] = _baseline_row(
            "sysid", "mujoco.sysid.optimize (mujoco.minimize, finite differences) around mujoco.rollout (RK4, 1 ms)"
        )
    pw = rows["rigidjax per-window"]
    ratio_scipy = np.array(rows["scipy least_squares + solve_ivp"]["scipy_rms_over_rigidjax_same_windows"]) ** 2 - 1
    rj_excess = np.array([w["rigidjax"]["cost_excess"] for w in per_window])
    summary = {
        "windows": len(segs),
        "samples": n_samples,
        "baseline_windows": n_base,
        "cpu_ratio_cold": rows["scipy least_squares + solve_ivp"]["cold_cpu_s"] / pw["cold_cpu_s"],
        "cpu_ratio_warm": rows["scipy least_squares + solve_ivp"]["cold_cpu_s"] / pw["warm_cpu_s"],
        "cpu_ratio_warm_one_core": rows["scipy least_squares + solve_ivp"]["cold_cpu_s"] / one_core["warm_cpu_s"]
        if one_core
        else None,
        "identify_fit_many_cpu_ratio_warm": rows["scipy least_squares + solve_ivp"]["cold_cpu_s"]
        / rows["rigidjax identify.fit_many"]["warm_cpu_s"],
        "identify_fit_many_cpu_ratio_cold": rows["scipy least_squares + solve_ivp"]["cold_cpu_s"]
        / rows["rigidjax identify.fit_many"]["cold_cpu_s"],
        # SciPy's fit of the same window (one start, its own RK45 residual), against rigidjax's estimate under DOP853
        "scipy_cost_excess_median": float(np.nanmedian(ratio_scipy)),
        "scipy_cost_excess_max": float(np.nanmax(ratio_scipy)),
        # every estimate re-simulated by DOP853 (rtol 1e-10), relative to the best of the methods per window
        "rigidjax_cost_excess_max": float(np.nanmax(rj_excess)),
        "identify_fit_cost_excess_max": float(np.nanmax([w["identify.fit"]["cost_excess"] for w in per_window])),
        "identify_fit_max_diff_se_vs_fit_inertia": float(
            np.nanmax(
                [abs(d) for w in per_window for d in w["identify.fit"]["diff_se_vs_fit_inertia"] if d is not None]
                or [np.nan]
            )
        ),
        "sysid": why_not or "ran",
    }
    if why_not is None:
        summary["sysid_cpu_ratio_cold"] = rows["mujoco.sysid"]["cold_cpu_s"] / pw["cold_cpu_s"]
        summary["sysid_cpu_ratio_warm"] = rows["mujoco.sysid"]["cold_cpu_s"] / pw["warm_cpu_s"]
    targets = {
        "residual_within_0.5%_every_window": bool(np.all(np.nan_to_num(rj_excess, nan=np.inf) <= 0.005)),
        "cpu_30x_below_scipy_cold": bool(summary["cpu_ratio_cold"] >= 30),
        "cpu_30x_below_scipy_warm": bool(summary["cpu_ratio_warm"] >= 30),
    }
    if one_core:  # one XLA:CPU thread, as SciPy's one thread: no CPU on the pool's work stealing
        targets["cpu_30x_below_scipy_warm_one_core"] = bool(summary["cpu_ratio_warm_one_core"] >= 30)
    if why_not is None:
        targets["cpu_5x_below_sysid_cold"] = bool(summary["sysid_cpu_ratio_cold"] >= 5)
        targets["cpu_5x_below_sysid_warm"] = bool(summary["sysid_cpu_ratio_warm"] >= 5)
    summary["targets"] = targets

    print()
    print(
        f"{'method':<34} {'wall (s) cold/warm':>19} {'CPU (s) cold/warm':>19} "
        f"{'Ix/Iy':>8} {'Iz/Iy':>8} {'RMS':>7}  status"
    )
    for k, r in rows.items():
        w_ = f"{r['cold_s']:.1f} / {r['warm_s']:.1f}"
        c = f"{r['cold_cpu_s']:.1f} / {r['warm_cpu_s']:.1f}"
        ix = f"{r['Ix/Iy']:.3f}" if r.get("Ix/Iy") else "—"
        iz = f"{r['Iz/Iy']:.3f}" if r.get("Iz/Iy") else "—"
        print(f"{k:<34} {w_:>19} {c:>19} {ix:>8} {iz:>8} {r['rms']:>7.4f}  {r['status']}")
    if why_not is not None:
        print(f"({why_not}: its columns are skipped.)")

    print(
        f"\nPer window ({n_base} evenly spaced): CPU (s); RMS (rad/s, each method's own integrator); "
        "Ix/Iy, Iz/Iy; cost = the estimate re-simulated by DOP853 (rtol 1e-10), % above the best of the "
        f"{len(methods)} on the window. rigidjax fits all {len(segs)} windows in one batched call: its CPU per "
        "window is the warm per-window fit's CPU divided by the number of windows."
    )
    head = f"{'window':<30}" + "".join(
        f" | {m:<12}{'CPU':>6} {'RMS':>7} {'Ix/Iy':>7} {'Iz/Iy':>7} {'cost%':>7}" for m in methods
    )
    print(head)
    print("-" * len(head))

    def _f(v, fmt):
        return format(v, fmt) if v is not None and np.isfinite(v) else "—"

    for w_ in per_window:
        line = f"{_short(w_['window'])[:30]:<30}"
        for m in methods:
            r = w_[m]
            line += (
                f" | {'':<12}{_f(r['cpu_s'], '6.3f')} {_f(r['rms'], '7.4f')} {_f(r['Ix/Iy'], '7.3f')} "
                f"{_f(r['Iz/Iy'], '7.3f')} {_f(100 * r['cost_excess'], '+7.2f')}"
            )
        print(line)

    print(
        f"\n(SciPy{' and sysid' if why_not is None else ''}: {n_base} windows timed, extrapolated to {len(segs)}.) "
        f"CPU: rigidjax needs {summary['cpu_ratio_cold']:.0f}x less than SciPy cold (compilation included), "
        f"{summary['cpu_ratio_warm']:.0f}x warm"
        + (
            f" ({summary['cpu_ratio_warm_one_core']:.0f}x warm pinned to one core)"
            if summary["cpu_ratio_warm_one_core"]
            else ""
        )
        + (
            f"; {summary['sysid_cpu_ratio_cold']:.1f}x less than mujoco.sysid cold, "
            f"{summary['sysid_cpu_ratio_warm']:.1f}x warm."
            if why_not is None
            else "."
        )
    )
    print(
        "Cost under DOP853: rigidjax's estimate is at most "
        f"{100 * summary['rigidjax_cost_excess_max']:+.3f} % above the best of the methods on any window "
        f"(SciPy's own fits: {100 * summary['scipy_cost_excess_median']:+.2f} % median, largest "
        f"{100 * summary['scipy_cost_excess_max']:+.1f} %, against rigidjax's under DOP853)."
    )
    print(
        f"identify.fit_many (the general layer, all {len(segs)} windows in one call with groups, fit_inertia's "
        f"sub-steps, then combine): statuses as fit_inertia's on "
        f"{rows['rigidjax identify.fit_many']['statuses_as_fit_inertia']} of {len(segs)} windows; "
        f"{summary['identify_fit_many_cpu_ratio_warm']:.0f}x less CPU than SciPy warm, "
        f"{summary['identify_fit_many_cpu_ratio_cold']:.0f}x cold; cost under DOP853 at most "
        f"{100 * summary['identify_fit_cost_excess_max']:+.3f} % above the best on any window; estimates within "
        f"{summary['identify_fit_max_diff_se_vs_fit_inertia']:.3g} of fit_inertia's standard errors of its estimates."
    )
    for w_ in per_window:
        r = w_["identify.fit"]
        d = ", ".join("—" if v is None else f"{v:+.3f}" for v in r["diff_se_vs_fit_inertia"])
        print(
            f"  {_short(w_['window'])[:30]:<30} {r['status']:<10} k={r['substeps']:<3} chart (u, v) = "
            f"({r['chart'][0]:.6g}, {r['chart'][1]:.6g}){' on an edge' if r['at_edge'] else ''}; "
            f"Ix/Iy, Iz/Iy - fit_inertia's: ({d}) se"
        )
    print("Targets: " + "; ".join(f"{k.replace('_', ' ')}: {'yes' if v else 'NO'}" for k, v in targets.items()))
    out = {
        "rows": rows,
        "summary": summary,
        "per_window": per_window,
        "data": str(data),
        "jax": jax.__version__,
        "quick": args.quick,
        "when": stamp,
        "machine": machine,
    }
    if args.commands:
        paths = [data] + sorted(p for p in data.iterdir() if p.is_dir())
        cmds = [_command(p) for p in paths]
        print("\n`rigidjax fit PATH --quiet` (subprocess: import, compilation, fit):")
        print(f"{'path':<40} {'wall (s)':>9} {'CPU (s)':>8} {'exit':>5}  status")
        for c_ in cmds:
            print(
                f"{Path(c_['path']).name:<40} {c_['wall_s']:>9.1f} {c_['cpu_s']:>8.1f} {c_['exit']:>5}  {c_['status']}"
            )
        out["commands"] = cmds
    if args.search:
        t0 = time.perf_counter()
        res = multistart_check(ours, starts=args.search)
        worst = max(res, key=lambda r: r["excess"])
        out["search"] = {
            "starts_per_window": res[0]["n_starts"],
            "windows": len(res),
            "max_excess": worst["excess"],
            "worst": worst,
            "within_0.5%": int(sum(r["excess"] <= 0.005 for r in res)),
            "min_hits": int(min(r["hits"] for r in res)),
            "seconds": time.perf_counter() - t0,
        }
        print(
            f"\ndense multi-start ({res[0]['n_starts']} starts per window, {out['search']['seconds']:.0f} s): "
            f"{out['search']['within_0.5%']} of {len(res)} windows at the best cost found (0.5 %); largest excess "
            f"{100 * worst['excess']:.2g} % ({worst['name']}); fewest starts reaching the minimum: "
            f"{out['search']['min_hits']}"
        )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=float))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
