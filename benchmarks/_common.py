"""Shared pieces of the benchmarks: machine description, JSON output, the standard case.

The standard case of every benchmark is the torque-free body of the issue:
``I = diag(1, 2, 3) kg m^2``, ``m = 1 kg``, ``omega0 = (0.01, 2, 0) rad/s`` (body frame),
no gravity, no resistance, ``dt = 1e-3 s`` (a near-separatrix spin: the tennis-racket flip).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from functools import partial
from pathlib import Path


RESULTS = Path(__file__).resolve().parent / "results"
INERTIA = (1.0, 2.0, 3.0)
OMEGA0 = (0.01, 2.0, 0.0)
DT = 1e-3


def machine() -> dict:
    """nproc, CPU model, load, jax/jaxlib versions, devices (for the README tables)."""
    import jax

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "load_avg_1_5_15": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
        "time_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=float))
    return path


def table(rows: list[dict], cols: list[str]) -> str:
    """A GitHub-markdown table of ``rows`` (dicts) in column order ``cols``."""

    def fmt(v):
        if isinstance(v, float):
            if v != v:
                return "n/a"
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return str(v)

    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out)


def timed(fn, *args, repeats: int = 3):
    """(first-call seconds incl. compilation, best wall seconds of ``repeats`` warm calls,
    process CPU seconds of that best call, result)."""
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    best, best_cpu = float("inf"), float("nan")
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(fn(*args))
        w, c = time.perf_counter() - t, time.process_time() - c
        if w < best:
            best, best_cpu = w, c
    return first, best, best_cpu, out


def have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:
        return False


# ------------------------------------------------------------------ rigidjax steppers


def standard_case(name: str, dtype):
    """``(step, model, state0, energy(model, states) -> (..., T))`` of one standard body."""
    import jax.numpy as jnp

    import rigidjax as rj

    body = rj.RigidBody(jnp.asarray(1.0, dtype), jnp.asarray(INERTIA, dtype))
    s0 = rj.RigidBodyState(angular_velocity=jnp.asarray(OMEGA0, dtype))
    if name == "midpoint":
        return partial(rj.midpoint_step, attitude="midpoint"), body, s0, rj.kinetic_energy
    if name == "midpoint-lu":
        return partial(midpoint_step_lu, attitude="midpoint"), body, s0, rj.kinetic_energy
    if name == "euler-parameters":
        from rigidjax import euler_parameters as ep

        model = ep.EPModel(body)
        st = ep.initial_state(model, angular_velocity=jnp.asarray(OMEGA0, dtype)[None])
        return ep.ep_step, model, st, lambda m, s: ep.energy(m, s)
    if name == "variational":
        from rigidjax import systems
        from rigidjax.variational import vi_step

        system = systems.rigid_body(body)
        st = systems.rigid_body_vi_state(system, s0)
        return vi_step, system, st, lambda m, s: rj.kinetic_energy(body, systems.rigid_body_state(m, s))
    raise ValueError(name)


def midpoint_step_lu(body, state, wrench, dt, *, attitude="new", max_rotation=0.5):
    """The foundation's midpoint step (array-of-structures, batched LAPACK ``solve`` on the
    6x6 system, jaxlie quaternion product): the layout baseline the fast step is measured
    against. Same maths and results as :func:`rigidjax.midpoint_step` (to round-off)."""
    import equinox as eqx
    import jax.numpy as jnp

    from rigidjax import so3
    from rigidjax.numerics import where_tree
    from rigidjax.info import Status, make_info
    from rigidjax.midpoint import gyroscopic_term, step_matrix

    dtype = state.angular_velocity.dtype
    dt = jnp.asarray(dt, dtype)
    V, w = state.twist, state.angular_velocity
    gyro = gyroscopic_term(body.inertia, w)
    F = jnp.concatenate([jnp.asarray(body.mass)[..., None] * body.gravity, -gyro], -1)
    if wrench is not None:
        F = F + wrench
    rhs = F - jnp.einsum("...ij,...j->...i", body.resistance, V)
    V1 = V + jnp.linalg.solve(step_matrix(body, w, dt[..., None, None]), rhs[..., None])[..., 0]
    v1, w1 = V1[..., :3], V1[..., 3:]
    w_att = w1 if attitude == "new" else 0.5 * (w + w1)
    q1 = so3.normalize(so3.multiply(state.orientation, so3.exp(dt[..., None] * w_att)))
    x1 = state.position + dt[..., None] * v1
    new = eqx.tree_at(
        lambda s: (s.time, s.position, s.orientation, s.velocity, s.angular_velocity),
        state,
        (state.time + dt, x1, q1, v1, w1),
    )
    finite = jnp.all(jnp.isfinite(V1), -1) & jnp.all(jnp.isfinite(q1), -1) & jnp.all(jnp.isfinite(x1), -1)
    new = where_tree(finite, new, state)
    rot = jnp.maximum(so3.safe_norm(w), so3.safe_norm(w1)) * dt
    status = jnp.where(finite, jnp.where(rot > max_rotation, Status.ROTATION_LIMIT, Status.SUCCESS), Status.NONFINITE)
    return new, make_info(status, jnp.ones_like(status), jnp.zeros_like(rot), rot)


def ensemble_fn(name: str, n_bodies: int, n_steps: int, dtype):
    """``(run, states0, drift)`` for ``n_bodies`` copies of the standard body.

    ``run(states0) -> (states, all_converged)`` is the jitted ensemble rollout (the timed
    part): ``rigidjax.ensemble.ensemble_rollout`` semantics (vmap of ``rollout`` over members,
    full trajectory stored; ``"<name>-final"``: ``save_every=n``, initial and final states
    only), one shared model. ``"<name>-ensemble"``: :func:`rigidjax.ensemble.ensemble_rollout`
    itself (sharded over ``jax.devices()``, the shared model compiled in as a constant).
    ``"<name>-traced"``: the model is an argument of the jitted
    function (as in a parameter fit), so the steps see no structural zeros in it (zero
    resistance, diagonal inertia: :func:`rigidjax.numerics.static_zeros`); otherwise it is a
    constant of the compiled program, as in a plain simulation.
    ``drift(states)`` is the max relative energy drift over members
    and time, computed apart (untimed: an energy evaluation is not simulation work, and for
    the variational step it cost as much as the rollout)."""
    import jax
    import jax.numpy as jnp

    import rigidjax as rj

    ensemble = name.endswith("-ensemble")
    name = name.removesuffix("-ensemble")
    traced = name.endswith("-traced")
    name = name.removesuffix("-traced")
    final = name.endswith("-final")  # keep the initial and final states only (save_every=n)
    step, model, s0, energy = standard_case(name.removesuffix("-final"), dtype)
    states0 = jax.tree_util.tree_map(lambda a: jnp.broadcast_to(a, (n_bodies, *jnp.shape(a))) + 0, s0)

    def run_model(model, states0):
        save = n_steps if final else None
        tr = jax.vmap(lambda s: rj.rollout(step, model, s, DT, n_steps, save_every=save))(states0)
        return tr.states, jnp.all(tr.info.converged)

    if ensemble:
        from rigidjax.ensemble import ensemble_rollout

        def run(states0):
            save = n_steps if final else None
            tr = ensemble_rollout(step, model, states0, DT, n_steps, save_every=save, model_batched=False)
            return tr.states, jnp.all(tr.info.converged)
    elif traced:
        run_jit = jax.jit(run_model)
        run = lambda states0: run_jit(model, states0)  # noqa: E731
    else:
        run = jax.jit(lambda states0: run_model(model, states0))

    def drift(states):
        # one time slice at a time: the variational energy goes through per-point Jacobians,
        # (N, T) of them at once exhausted 24 GB at N = 16384, T = 500
        T = jax.tree_util.tree_leaves(states)[0].shape[1]
        E = jax.lax.map(lambda k: energy(model, jax.tree_util.tree_map(lambda a: a[:, k], states)), jnp.arange(T)).T
        return jnp.max(jnp.abs(E / E[:, :1] - 1))

    return run, states0, jax.jit(drift)


def subprocess_json(code: str, timeout: float, env: dict | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (own XLA flags, a hard timeout); parse its last
    ``RESULT{json}`` line. Returns ``{"error": ...}`` on failure or timeout."""
    e = dict(os.environ)
    if env:
        e.update(env)
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=e)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
    if p.returncode != 0 or not lines:
        return {
            "error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else 'no output'}"
        }
    return json.loads(lines[-1][len("RESULT") :])
