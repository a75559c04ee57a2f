"""Reverse-mode gradient cost through long rollouts, with and without checkpointing.

    python -m benchmarks.bench_gradient [--quick] [--steppers midpoint,...]

Loss: ``sum_k |omega_k|^2 + sum_k |q_k|^2`` over a whole rollout of the standard torque-free
body (float64, ``dt = 1e-3``); gradient with respect to the inertia tensor and ``omega0``.
``N = 256``: the midpoint step runs one rollout of a batched state (256 initial rates, one
shared body), as ``ensemble_rollout`` does; the other steppers ``vmap`` the single-body loss.

1. time: ``jit(grad(loss))`` against ``jit(loss)`` through 1000 steps (best of 3 warm calls),
   plain scan, ``checkpoint_every = 32`` (~sqrt(1000)) and, for the midpoint step,
   ``adjoint="discrete"`` (the hand-written reverse sweep); target <= 4x;
2. memory against rollout length: XLA's compiled memory analysis (``temp_size_in_bytes``:
   scratch the program needs besides its inputs/outputs) of the gradient for
   ``n_steps`` = 100 ... 100000, plain, ``checkpoint_every = round(sqrt(n))`` and the
   discrete adjoint.

Writes ``benchmarks/results/bench_gradient.json``.
"""

from __future__ import annotations

import argparse
import math

from ._common import DT, machine, standard_case, table, timed, write_json


def _loss_fn(stepper, n, k, members=None, adjoint=None):
    import jax.numpy as jnp

    import rigidjax as rj

    step, model, s0, _ = standard_case(stepper, jnp.float64)
    body0 = rj.RigidBody(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.0])))

    def loss(inertia, omega0):
        if members is not None and not stepper.startswith("midpoint"):
            import jax  # other steppers: vmap of the single-body loss over omega0 (N, 3)

            single, _ = _loss_fn(stepper, n, k, adjoint=adjoint)
            return jnp.sum(jax.vmap(single, in_axes=(None, 0))(inertia, omega0))
        if stepper.startswith("midpoint"):
            # one body shared by a batched state (N, 3): the ensemble form ensemble_rollout uses
            m = rj.RigidBody(body0.mass, inertia)
            N_ = omega0.shape[:-1]
            s = rj.RigidBodyState(
                angular_velocity=omega0,
                position=jnp.zeros((*N_, 3)),
                velocity=jnp.zeros((*N_, 3)),
                orientation=jnp.broadcast_to(jnp.array([1.0, 0, 0, 0]), (*N_, 4)) + 0.0,
                time=jnp.zeros(N_),
            )
        else:  # the model/state types of the other steppers: perturb omega0 only
            m, s = model, s0
        tr = rj.rollout(step, m, s, DT, n, checkpoint_every=k, adjoint=adjoint)
        leaves = [
            a
            for a in (getattr(tr.states, "angular_velocity", None), getattr(tr.states, "orientation", None))
            if a is not None
        ]
        if not leaves:
            leaves = [tr.states.q if hasattr(tr.states, "q") else tr.states.coordinates]
        return sum(jnp.sum(a**2) for a in leaves) + 0.0 * jnp.sum(omega0) + 0.0 * jnp.sum(inertia)

    return loss, body0.inertia


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steppers", default="midpoint")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    w0 = jnp.array([0.01, 2.0, 0.0])
    cost = []
    for stepper in args.steppers.split(","):
        for N in (1, 256):
            n = 1000
            variants = [(None, None), (32, None)] + ([(None, "discrete")] if stepper.startswith("midpoint") else [])
            for k, adjoint in variants:
                loss, I0 = _loss_fn(stepper, n, k, None if N == 1 else N, adjoint)
                w = w0 if N == 1 else jnp.broadcast_to(w0, (N, 3)) + 0.0
                _, t_f, _, _ = timed(jax.jit(loss), I0, w)
                _, t_g, _, _ = timed(jax.jit(jax.grad(loss, argnums=(0, 1))), I0, w)
                row = {
                    "stepper": stepper,
                    "N": N,
                    "n_steps": n,
                    "checkpoint_every": k or "-",
                    "adjoint": adjoint or "autodiff",
                    "forward_s": t_f,
                    "grad_s": t_g,
                    "grad/forward": t_g / t_f,
                }
                cost.append(row)
                print(table([row], COST_COLS).splitlines()[-1], flush=True)
    mem = []
    lengths = [100, 1000] if args.quick else [100, 1000, 10000, 100000]
    for n in lengths:
        row = {"n_steps": n}
        for label, k, adjoint in (
            ("plain", None, None),
            ("checkpointed", max(1, round(math.sqrt(n))), None),
            ("discrete", None, "discrete"),
        ):
            loss, I0 = _loss_fn("midpoint", n, k, adjoint=adjoint)
            ma = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(I0, w0).compile().memory_analysis()
            row[f"{label}_temp_MB"] = ma.temp_size_in_bytes / 2**20 if ma is not None else float("nan")
            row["k"] = k if k else row.get("k")
        fwd = jax.jit(_loss_fn("midpoint", n, None)[0]).lower(I0, w0).compile().memory_analysis()
        row["forward_temp_MB"] = fwd.temp_size_in_bytes / 2**20 if fwd is not None else float("nan")
        mem.append(row)
        print(table([row], MEM_COLS).splitlines()[-1], flush=True)
    print()
    print(table(cost, COST_COLS))
    print()
    print(table(mem, MEM_COLS))
    print("wrote", write_json("bench_gradient", {"machine": machine(), "cost": cost, "memory": mem}))


COST_COLS = ["stepper", "N", "n_steps", "checkpoint_every", "adjoint", "forward_s", "grad_s", "grad/forward"]
MEM_COLS = ["n_steps", "forward_temp_MB", "plain_temp_MB", "k", "checkpointed_temp_MB", "discrete_temp_MB"]

if __name__ == "__main__":
    main()
