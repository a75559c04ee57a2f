"""float32 against float64 on the standard cases: accuracy, not speed.

    python -m benchmarks.bench_float32 [--quick]

Torque-free body ``I = diag(1, 2, 3)``, ``omega0 = (0.01, 2, 0)`` (the racquet flip, near the
separatrix) and a generic spin ``I = diag(1, 2, 2.5)``, ``omega0 = (1, 0.5, 1.5)``; ``dt = 1e-3``,
1000 steps and 10000 steps. For each stepper and dtype: the max error of the body rates
against the exact Jacobi-elliptic solution (``rigidjax.reference.torque_free_omega``), the
max relative drift of the kinetic energy and of ``|L|`` (world angular momentum), and the
unit-norm error of the quaternion. Writes ``benchmarks/results/bench_float32.json``.
"""

from __future__ import annotations

import argparse
from functools import partial

import numpy as np

from ._common import machine, table, write_json

CASES = {"racquet flip": ((1.0, 2.0, 3.0), (0.01, 2.0, 0.0)), "generic spin": ((1.0, 2.0, 2.5), (1.0, 0.5, 1.5))}


def run(stepper, inertia, omega0, dtype, n, dt):
    import jax
    import jax.numpy as jnp

    import rigidjax as rj
    from rigidjax import systems

    body = rj.RigidBody(jnp.asarray(1.0, dtype), jnp.asarray(inertia, dtype))
    s0 = rj.RigidBodyState(angular_velocity=jnp.asarray(omega0, dtype))
    if stepper == "midpoint":
        tr = jax.jit(lambda s: rj.rollout(partial(rj.midpoint_step, attitude="midpoint"), body, s, dt, n))(s0)
        states = tr.states
    elif stepper == "euler-parameters":
        from rigidjax import euler_parameters as ep

        model = ep.EPModel(body)
        st = ep.initial_state(model, angular_velocity=jnp.asarray(omega0, dtype)[None])
        tr = jax.jit(lambda s: rj.rollout(ep.ep_step, model, s, dt, n))(st)
        q = np.asarray(ep.output(model, tr.states, "CoordinatesTotal"), dtype=float)[:, 0, 3:]  # raw Euler parameters
        w = np.asarray(ep.output(model, tr.states, "AngularVelocityLocal"), dtype=float)[:, 0]
        qu = q / np.linalg.norm(q, axis=-1, keepdims=True)
        states = rj.RigidBodyState(
            orientation=jnp.asarray(qu, jnp.float64), angular_velocity=jnp.asarray(w, jnp.float64)
        )
        qnorm_err = float(np.max(np.abs(np.linalg.norm(q, axis=-1) - 1)))
    else:
        from rigidjax.variational import vi_step

        system = systems.rigid_body(body)
        st = systems.rigid_body_vi_state(system, s0)
        tr = jax.jit(lambda s: rj.rollout(vi_step, system, s, dt, n))(st)
        qn = np.asarray(tr.states.q, dtype=float)[:, 3:]
        states = systems.rigid_body_state(system, tr.states)
        qnorm_err = float(np.max(np.abs(np.linalg.norm(qn, axis=-1) - 1)))
    w = np.asarray(states.angular_velocity, dtype=float)
    if stepper == "midpoint":
        qnorm_err = float(np.max(np.abs(np.linalg.norm(np.asarray(states.orientation, dtype=float), axis=-1) - 1)))
    b64 = rj.RigidBody(1.0, np.asarray(inertia, float))
    s64 = rj.RigidBodyState(
        orientation=np.asarray(states.orientation, float)
        / np.linalg.norm(np.asarray(states.orientation, float), axis=-1, keepdims=True),
        angular_velocity=w,
    )
    E = np.asarray(rj.kinetic_energy(b64, s64))
    L = np.linalg.norm(np.asarray(rj.angular_momentum(b64, s64)), axis=-1)
    return w, E, L, qnorm_err, bool(np.all(np.asarray(tr.info.converged)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steppers", default="midpoint,euler-parameters,variational")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from rigidjax import reference

    jax.config.update("jax_enable_x64", True)
    dt = 1e-3
    rows = []
    for case, (inertia, omega0) in CASES.items():
        for n in (1000,) if args.quick else (1000, 10000):
            t = np.arange(n + 1) * dt
            w_exact = reference.torque_free_omega(np.asarray(inertia), np.asarray(omega0), t)
            for stepper in args.steppers.split(","):
                for dtype in (jnp.float64, jnp.float32):
                    try:
                        w, E, L, qn, ok = run(stepper, inertia, omega0, dtype, n, dt)
                    except Exception as e:
                        rows.append(
                            {
                                "case": case,
                                "steps": n,
                                "stepper": stepper,
                                "dtype": jnp.dtype(dtype).name,
                                "omega_err_max": float("nan"),
                                "note": f"{type(e).__name__}: {e}"[:120],
                            }
                        )
                        continue
                    rows.append(
                        {
                            "case": case,
                            "steps": n,
                            "stepper": stepper,
                            "dtype": jnp.dtype(dtype).name,
                            "omega_err_max": float(np.max(np.abs(w - w_exact))),
                            "omega_err_end": float(np.max(np.abs(w[-1] - w_exact[-1]))),
                            "energy_drift": float(np.max(np.abs(E / E[0] - 1))),
                            "L_drift": float(np.max(np.abs(L / L[0] - 1))),
                            "quat_norm_err": qn,
                            "converged": ok,
                        }
                    )
                    print(table([rows[-1]], COLS).splitlines()[-1], flush=True)
    print()
    print(table(rows, COLS))
    print("wrote", write_json("bench_float32", {"machine": machine(), "rows": rows, "dt": dt}))


COLS = [
    "case",
    "steps",
    "stepper",
    "dtype",
    "omega_err_max",
    "omega_err_end",
    "energy_drift",
    "L_drift",
    "quat_norm_err",
    "converged",
    "note",
]

if __name__ == "__main__":
    main()
