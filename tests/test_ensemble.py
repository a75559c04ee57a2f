"""Sharded ensembles: the same results as the unsharded ``jax.vmap(rollout)``.

The multi-device case runs in a subprocess with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
(the flag must be set before JAX is imported; this pytest process has imported it already):
4 CPU devices, an ensemble of 6 (padded to 8), per-member bodies, loads and initial states.
Truth: the unsharded vmapped rollout in the same process (members are independent, so the
sharded run must reproduce it member by member).
"""

import json
import os
import subprocess
import sys
import textwrap
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax.ensemble import ensemble_rollout, ensemble_size

SCRIPT = textwrap.dedent(
    r"""
    import json, os
    from functools import partial
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import rigidjax as rj
    from rigidjax.ensemble import ensemble_rollout
    assert len(jax.devices()) == 4, jax.devices()
    E, n, dt = 6, 40, 0.01
    rng = np.random.default_rng(0)
    L = rng.uniform(0.3, 1.0, (E, 3))
    body = rj.RigidBody(rng.uniform(1, 2, E), np.stack([L[:, 1] + L[:, 2], L[:, 0] + L[:, 2], L[:, 0] + L[:, 1]], -1),
                        resistance=np.broadcast_to(np.diag([0.1] * 3 + [0.02] * 3), (E, 6, 6)))
    st = rj.RigidBodyState(velocity=rng.normal(size=(E, 3)), angular_velocity=rng.normal(size=(E, 3)) * 2)
    loads = rng.normal(size=(E, n, 6))
    loads[4, 20:, 3] = np.nan  # member 4 fails at step 20 and must freeze; the others are unaffected
    step = partial(rj.midpoint_step, attitude="midpoint")
    out = {}
    got = ensemble_rollout(step, body, st, dt, n, jnp.asarray(loads), checkpoint_every=16)
    ref = jax.vmap(lambda b, s, l: rj.rollout(step, b, s, dt, n, l))(body, st, jnp.asarray(loads))
    out["per_member"] = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                            for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)))
    out["shape"] = list(got.states.orientation.shape)
    out["status4"] = np.asarray(got.info.status)[4].tolist()
    out["status_others_ok"] = bool(np.all(np.asarray(got.info.converged)[[0, 1, 2, 3, 5]]))
    # one shared body, a callable load (same for every member), E = 8 (no padding): stays sharded
    E2 = 8
    st2 = rj.RigidBodyState(angular_velocity=rng.normal(size=(E2, 3)))
    shared = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    torque = lambda t, s: jnp.concatenate([jnp.zeros(3), 0.1 * jnp.sin(t) * jnp.ones(3)])
    got2 = ensemble_rollout(rj.midpoint_step, shared, st2, dt, n, torque, model_batched=False)
    ref2 = jax.vmap(lambda s: rj.rollout(rj.midpoint_step, shared, s, dt, n, torque))(st2)
    out["shared"] = float(
        np.abs(np.asarray(got2.states.angular_velocity) - np.asarray(ref2.states.angular_velocity)).max()
    )
    out["n_shards"] = len(got2.states.angular_velocity.addressable_shards)
    out["shard_rows"] = sorted({s.data.shape[0] for s in got2.states.angular_velocity.addressable_shards})
    print("RESULT" + json.dumps(out))
    """
)


def test_sharded_over_4_cpu_devices_equals_unsharded():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    out = json.loads(line[len("RESULT") :])
    # members are independent and run the same float64 operations: equal to round-off
    # (XLA may fuse the sharded program differently), here far below the 1e-12 bound
    assert out["per_member"] < 1e-12, out
    assert out["shared"] < 1e-12, out
    assert out["shape"] == [6, 41, 4]
    status4 = np.asarray(out["status4"])
    assert np.all(status4[:20] != int(rj.Status.NONFINITE)) and np.all(status4[20:] == int(rj.Status.NONFINITE))
    assert out["status_others_ok"]
    # E = 8 over 4 devices: four shards of two members each
    assert out["n_shards"] == 4 and out["shard_rows"] == [2]


def test_single_device_and_validation():
    E, n = 4, 10  # (E = 3 would make a (3, 3) inertia read as one tensor)
    body = rj.RigidBody(np.ones(E), np.tile([1.0, 2.0, 3.0], (E, 1)))
    st = rj.RigidBodyState(
        angular_velocity=np.array([[0.01, 2.0, 0.0], [1.0, 0.0, 0.5], [0.0, 0.3, 3.0], [0.2, 0.2, 0.2]])
    )
    got = ensemble_rollout(rj.midpoint_step, body, st, 0.01, n, devices=jax.devices()[:1], checked=True)
    ref = jax.vmap(lambda b, s: rj.rollout(rj.midpoint_step, b, s, 0.01, n))(body, st)
    np.testing.assert_allclose(
        np.asarray(got.states.orientation), np.asarray(ref.states.orientation), rtol=0, atol=1e-13
    )
    assert ensemble_size(st) == E
    with pytest.raises(ValueError, match="states0"):
        ensemble_rollout(rj.midpoint_step, body, rj.RigidBodyState(angular_velocity=[0.0, 1.0, 0.0]), 0.01, n)
    with pytest.raises(ValueError, match="models"):
        ensemble_rollout(rj.midpoint_step, rj.RigidBody(np.ones(2), np.tile([1.0, 2.0, 3.0], (2, 1))), st, 0.01, n)
    with pytest.raises(ValueError, match="loads"):
        ensemble_rollout(rj.midpoint_step, body, st, 0.01, n, jnp.zeros((E, n + 1, 6)))
    with pytest.raises(ValueError, match="dt"):
        ensemble_rollout(rj.midpoint_step, body, st, -0.01, n)
    # checked mode names the member: a NaN torque on member 2
    bad = jnp.zeros((E, n, 6)).at[2, 3:, 3].set(jnp.nan)
    with pytest.raises(rj.StepFailure, match=r"index \(3, 2\)"):
        ensemble_rollout(rj.midpoint_step, body, st, 0.01, n, bad, devices=jax.devices()[:1], checked=True)


def _shared_case(kind, inertia):
    """(step, shared model, states0 of 4 members) for one free body with no resistance."""
    body = rj.RigidBody(1.0, inertia)
    omegas = np.array([[0.01, 2.0, 0.0], [1.0, 0.0, 0.5], [0.0, 0.3, 3.0], [0.2, -0.4, 0.2]])
    if kind == "midpoint":
        return partial(rj.midpoint_step, attitude="midpoint"), body, rj.RigidBodyState(angular_velocity=omegas)
    if kind == "euler-parameters":
        from rigidjax import euler_parameters as ep

        model = ep.EPModel(body)
        sts = [ep.initial_state(model, angular_velocity=w[None]) for w in omegas]
        return ep.ep_step, model, jax.tree_util.tree_map(lambda *a: jnp.stack(a), *sts)
    from rigidjax import systems
    from rigidjax.variational import vi_step

    system = systems.rigid_body(body)
    sts = [systems.rigid_body_vi_state(system, rj.RigidBodyState(angular_velocity=w)) for w in omegas]
    return vi_step, system, jax.tree_util.tree_map(lambda *a: jnp.stack(a), *sts)


@pytest.mark.parametrize(
    "kind",
    [
        "midpoint",
        pytest.param("euler-parameters", marks=pytest.mark.slow),
        pytest.param("variational", marks=pytest.mark.slow),
    ],
)
def test_shared_model_compiled_as_constant_equals_traced_model(kind):
    """A shared concrete model is compiled in as a constant (its zero entries become structural
    zeros; rigidjax.ensemble._ConstantModel); the same model as a traced jit argument keeps
    every term. Truth: the traced run (independent code path for the model's entries)."""
    from rigidjax import ensemble

    n, dt, dev = 25, 0.01, jax.devices()[:1]
    step, model, st = _shared_case(kind, [1.0, 2.0, 3.0])
    run = lambda m, s: ensemble_rollout(step, m, s, dt, n, model_batched=False, devices=dev)  # noqa: E731
    fixed = run(model, st)
    traced = jax.jit(run)(model, st)
    assert bool(jnp.all(fixed.info.converged)) and bool(jnp.all(traced.info.converged))
    # dropping terms that multiply exact zeros changes only the order of the remaining
    # float64 operations: round-off over 25 steps, bound 1e-12 on O(1) states
    for a, b in zip(jax.tree_util.tree_leaves(fixed.states), jax.tree_util.tree_leaves(traced.states)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)
    if kind != "midpoint":
        return  # the cache is stepper-independent: checked once, where compiling is cheap
    # keyed by value: an equal model built anew reuses the compiled program ...
    hits = ensemble._compiled.cache_info().hits
    _, model_again, _ = _shared_case(kind, [1.0, 2.0, 3.0])
    again = run(model_again, st)
    assert ensemble._compiled.cache_info().hits == hits + 1
    np.testing.assert_array_equal(
        np.asarray(jax.tree_util.tree_leaves(again.states)[0]), np.asarray(jax.tree_util.tree_leaves(fixed.states)[0])
    )
    # ... and a different model never does: its own results, equal to its traced run
    _, other, _ = _shared_case(kind, [1.0, 2.0, 2.5])
    got, ref = run(other, st), jax.jit(run)(other, st)
    leaves = lambda tr: [np.asarray(a) for a in jax.tree_util.tree_leaves(tr.states)]  # noqa: E731
    for a, b in zip(leaves(got), leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    # another inertia moves the flip's rates by O(1) within 0.25 s
    assert max(np.max(np.abs(a - c)) for a, c in zip(leaves(got), leaves(fixed))) > 1e-3


def test_shared_model_with_array_static_field_falls_back_to_no_cache():
    # equinox static fields holding arrays cannot be compared by the program cache (QA, seventh
    # session: a ValueError on the second call); the call then compiles without the cache
    import equinox as eqx

    class Tagged(eqx.Module):
        body: rj.RigidBody
        tag: object = eqx.field(static=True)

    def step(m, s, u, dt):
        return rj.midpoint_step(m.body, s, u, dt)

    st = rj.RigidBodyState(angular_velocity=np.array([[0.01, 2.0, 0.0], [1.0, 0.0, 0.5]]))
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    with pytest.warns(UserWarning):  # equinox warns about a JAX array in a static field
        models = [Tagged(body, jnp.ones(3)), Tagged(body, jnp.zeros(3))]
    ref = jax.vmap(lambda s: rj.rollout(rj.midpoint_step, body, s, 0.01, 5))(st)
    for m in models:
        got = ensemble_rollout(step, m, st, 0.01, 5, model_batched=False, devices=jax.devices()[:1])
        np.testing.assert_allclose(
            np.asarray(got.states.angular_velocity), np.asarray(ref.states.angular_velocity), rtol=0, atol=1e-15
        )


def test_dt_of_any_float_kind_compiles_once(caplog):
    """``dt`` as a Python float, a NumPy float64 and a float64 array: one compiled ensemble
    program (JAX's cache key includes the weak type of a Python float; the rollout casts
    ``dt`` to the state's time dtype first). Counted from JAX's compile log: programs that
    take the ensemble's (4, 3, 3) inertia."""
    import logging

    body = rj.RigidBody(jnp.ones(4), jnp.tile(jnp.diag(jnp.array([1.0, 2.0, 3.0])), (4, 1, 1)))
    states = rj.RigidBodyState(
        time=jnp.zeros(4),
        position=jnp.zeros((4, 3)),
        orientation=jnp.tile(jnp.array([1.0, 0, 0, 0]), (4, 1)),
        velocity=jnp.zeros((4, 3)),
        angular_velocity=jnp.tile(jnp.array([0.1, 2.0, 0.0]), (4, 1)),
    )
    n_steps = 7  # a step count no other test uses: no program from before in the cache
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        for dt in (0.01, np.float64(0.02), jnp.asarray(0.03, jnp.float64), 0.04):
            rj.ensemble_rollout(rj.midpoint_step, body, states, dt, n_steps).states.time.block_until_ready()
    programs = [
        r for r in caplog.records if r.getMessage().startswith("Compiling") and "float64[4,3,3]" in r.getMessage()
    ]
    assert len(programs) == 1, [r.getMessage()[:120] for r in programs]
