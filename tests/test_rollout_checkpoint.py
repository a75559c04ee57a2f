"""``rollout(..., checkpoint_every=k)``: chunked, rematerialised scans for long-rollout gradients.

Truths: the plain scan (same step, same order of operations: values and gradients agree to
round-off), central finite differences for the gradient, the frozen-failure contract, and
XLA's own compiled memory analysis for the bounded-memory claim.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax.info import make_info

STEP = partial(rj.midpoint_step, attitude="midpoint")
BODY = rj.RigidBody(1.3, [1.0, 2.0, 3.0], resistance=np.diag([0.1, 0.2, 0.3, 0.01, 0.02, 0.03]), gravity=[0, 0, -9.81])
STATE0 = rj.RigidBodyState(velocity=[1.0, 0.0, 2.0], angular_velocity=[0.01, 2.0, 0.3])
N = 37  # not a multiple of the chunk lengths below: exercises the remainder chunk


def _light_step(model, state, wrench, dt):
    """A cheap stepper of the standard shape (explicit Euler on Euler's equations, attitude by
    the exponential map): the chunking machinery is stepper-agnostic, and this keeps the
    reverse-mode compilations of the gradient test to seconds."""
    w = state.angular_velocity
    Iw = model.inertia @ w
    wdot = jnp.linalg.solve(model.inertia, -jnp.cross(w, Iw) + (0 if wrench is None else wrench[3:]))
    new = rj.RigidBodyState(
        position=state.position + dt * state.velocity,
        orientation=rj.so3.normalize(rj.so3.multiply(state.orientation, rj.so3.exp(dt * w))),
        velocity=state.velocity + dt * model.gravity,
        angular_velocity=w + dt * wdot,
        time=state.time + dt,
    )
    z = jnp.zeros_like(state.time)
    return new, make_info(
        jnp.zeros(jnp.shape(z), jnp.int32), jnp.ones(jnp.shape(z), jnp.int32), z, dt * rj.so3.safe_norm(w)
    )


def _loss(inertia, omega0, k, dt=0.01):
    body = rj.RigidBody(1.3, inertia, gravity=BODY.gravity)
    state = rj.RigidBodyState(velocity=STATE0.velocity, angular_velocity=omega0)
    tr = rj.rollout(_light_step, body, state, dt, N, checkpoint_every=k)
    # a functional of the whole trajectory (every stored state contributes)
    return jnp.sum(tr.states.angular_velocity[:, 1] ** 2) + jnp.sum(tr.states.orientation[:, 1:] ** 2)


_grad = jax.jit(jax.grad(_loss, argnums=(0, 1)), static_argnums=2)
_roll = jax.jit(lambda k, dt, loads: rj.rollout(STEP, BODY, STATE0, dt, N, loads, checkpoint_every=k), static_argnums=0)


@pytest.mark.parametrize("k", [1, 8])
def test_values_equal_plain_scan(k):
    rng = np.random.default_rng(k)
    dt = jnp.asarray(rng.uniform(0.005, 0.02, N))  # per-step dt, chunked with the steps
    loads = jnp.asarray(rng.normal(size=(N, 6)))  # per-step wrenches, chunked likewise
    ref = _roll(None, dt, loads)
    got = _roll(k, dt, loads)
    assert got.states.position.shape == (N + 1, 3) and got.info.status.shape == (N,)
    # identical operations in the same order; XLA may fuse differently: 1e-13 relative
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-13, atol=1e-13)


def test_gradients_equal_plain_scan_and_finite_differences():
    I0 = jnp.diag(jnp.array([1.0, 2.0, 3.0]))
    w0 = jnp.array([0.01, 2.0, 0.3])
    g_ref = _grad(I0, w0, None)
    for k in (4, 10):
        g = _grad(I0, w0, k)
        # rematerialisation recomputes the same forward values: round-off agreement
        for a, b in zip(g, g_ref):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-11, atol=1e-12)
    # independent truth: central differences in omega0 (truncation ~h^2, round-off ~1e-16/h)
    f = jax.jit(lambda w: _loss(I0, w, None))
    h = 1e-6
    for i in range(3):
        e = jnp.zeros(3).at[i].set(h)
        fd = (f(w0 + e) - f(w0 - e)) / (2 * h)
        np.testing.assert_allclose(float(g_ref[1][i]), float(fd), rtol=1e-6, atol=1e-7)


def test_callable_loads_and_frozen_failure_survive_chunking():
    # member 1 gets a NaN torque at t >= 0.1 s: it must freeze with NONFINITE in every chunk after
    def loads(t, state):
        bad = (t >= 0.1) & (jnp.arange(2) == 1)
        return jnp.where(bad[:, None], jnp.nan, 0.0) * jnp.ones((2, 6))

    s0 = rj.RigidBodyState(angular_velocity=jnp.array([[0.01, 2.0, 0.0], [0.0, 1.0, 1.0]]))
    run = jax.jit(lambda k: rj.rollout(STEP, BODY, s0, 0.01, N, loads, checkpoint_every=k), static_argnums=0)
    ref, got = run(None), run(6)
    np.testing.assert_array_equal(np.asarray(got.info.status), np.asarray(ref.info.status))
    status = np.asarray(got.info.status)[:, 1]
    first = int(np.argmax(status == int(rj.Status.NONFINITE)))
    assert 9 <= first <= 11 and np.all(status[first:] == int(rj.Status.NONFINITE))
    w = np.asarray(got.states.angular_velocity)[:, 1]
    assert np.all(w[first + 1 :] == w[first])  # frozen at its last good state
    assert np.all(np.asarray(got.info.status)[:, 0] != int(rj.Status.NONFINITE))


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_rejects_bad_checkpoint_every(bad):
    # validated before tracing: nothing is compiled
    with pytest.raises(ValueError, match="checkpoint_every"):
        rj.rollout(STEP, BODY, STATE0, 0.01, 5, checkpoint_every=bad)


@pytest.mark.slow  # two reverse-mode compilations (~40 s on 2 busy cores); run with -m slow
def test_checkpointing_bounds_backward_memory():
    # XLA's compiled memory analysis (deterministic, no timing): the temporaries of the
    # reverse pass grow with n_steps without checkpointing and much less with k = sqrt(n)
    def temp_bytes(n, k):
        def loss(w0):
            s = rj.RigidBodyState(angular_velocity=w0)
            tr = rj.rollout(STEP, BODY, s, 1e-3, n, checkpoint_every=k)
            return jnp.sum(tr.states.angular_velocity[-1] ** 2)

        ma = jax.jit(jax.grad(loss)).lower(jnp.array([0.01, 2.0, 0.0])).compile().memory_analysis()
        if ma is None:
            pytest.skip("this backend gives no compiled memory analysis")
        return ma.temp_size_in_bytes

    n = 4096
    plain, ckpt = temp_bytes(n, None), temp_bytes(n, 64)
    # without checkpointing the residuals are O(n x per-step intermediates); with k = 64
    # they are O(n/k + k) carries: expect well below half (measured ~10x, benchmarks/README.md)
    assert ckpt < 0.5 * plain, (plain, ckpt)
