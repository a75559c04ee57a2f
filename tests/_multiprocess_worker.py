"""One process of tests/test_multiprocess.py (run by ``python -m rigidjax.launch``, or alone).

    python tests/_multiprocess_worker.py OUT.npz [stepper ...]

Joins the others through :func:`rigidjax.launch.initialize`, runs
:func:`rigidjax.ensemble.ensemble_rollout` of each named stepper (``midpoint``,
``euler-parameters``, ``variational``; default all) on the same seeded ensemble in every
process (``E = 8`` members, and ``E = 7``: padded to the device count; body
``I = diag(1, 2, 3) kg m^2``, body rates ``2 u`` rad/s, ``u`` uniform on the sphere,
``dt = 1e-3 s``, 200 steps, float64, the initial and final states kept), gathers the final
states on every process (``process_allgather``: a cross-process collective) and process 0
writes them to ``OUT.npz`` as ``<stepper>/<E>/<field>`` arrays, with ``meta`` (JSON:
process count, global and local devices, members held by process 0).
"""

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import rigidjax as rj
from rigidjax import euler_parameters as ep
from rigidjax import systems
from rigidjax.ensemble import ensemble_rollout
from rigidjax.launch import initialize
from rigidjax.variational import vi_step

jax.config.update("jax_enable_x64", True)  # a test script; the library never flips it

N_STEPS, DT = 200, 1e-3
STEPPERS = ("midpoint", "euler-parameters", "variational")


def case(name, E):
    """(step, shared model, states0 with leading axis E as host NumPy arrays)."""
    body = rj.RigidBody(jnp.asarray(1.0), jnp.asarray([1.0, 2.0, 3.0]))
    d = np.random.default_rng(3).normal(size=(E, 3))
    w = jnp.asarray(2.0 * d / np.linalg.norm(d, axis=1, keepdims=True))
    if name == "midpoint":
        step, model = rj.Midpoint(attitude="midpoint"), body
        make = lambda w: rj.RigidBodyState(angular_velocity=w)
    elif name == "euler-parameters":
        step, model = ep.ep_step, ep.EPModel(body)
        make = lambda w: ep.initial_state(model, angular_velocity=w[None])
    else:
        step, model = vi_step, systems.rigid_body(body)
        make = lambda w: systems.rigid_body_vi_state(model, rj.RigidBodyState(angular_velocity=w), check=False)
    states0 = jax.tree_util.tree_map(np.asarray, jax.vmap(make)(w))
    return step, model, states0


def run(name, E):
    """``ensemble_rollout`` of ``E`` members: (final states, converged per member, the trajectory)."""
    step, model, states0 = case(name, E)
    tr = ensemble_rollout(step, model, states0, DT, N_STEPS, save_every=N_STEPS, model_batched=False)
    final = jax.tree_util.tree_map(lambda a: a[:, -1], tr.states)
    return final, jnp.all(tr.info.converged, axis=1), tr


def main(out, names, info):
    result, meta = {}, {"info": info, "process_count": jax.process_count(), "devices": len(jax.devices())}
    meta["local_devices"] = len(jax.local_devices())
    for name in names:
        # E = 8 (a multiple of the device count: the result stays sharded, each process holds
        # its own members only) and E = 7 (padded to 8: the same compiled program)
        for E in (8, 7):
            final, conv, tr = run(name, E)
            leaf = tr.states.time
            meta[f"{name}/{E}/addressable_members"] = int(sum(s.data.shape[0] for s in leaf.addressable_shards))
            gathered = multihost_utils.process_allgather(final, tiled=True)
            for f in dataclasses.fields(gathered):
                result[f"{name}/{E}/{f.name}"] = np.asarray(getattr(gathered, f.name))
            result[f"{name}/{E}/converged"] = np.asarray(multihost_utils.process_allgather(conv, tiled=True))
    if jax.process_index() == 0:
        np.savez(out, meta=json.dumps(meta), **result)
    multihost_utils.sync_global_devices("rigidjax test done")


if __name__ == "__main__":
    info = initialize()  # before any JAX computation
    main(sys.argv[1], sys.argv[2:] or STEPPERS, info)
