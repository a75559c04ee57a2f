"""``rollout(save_every=...)`` and the structure-of-arrays fast path of the midpoint step.

Truths used: the full trajectory of the same rollout (saving thins the output, never the
dynamics), the generic scan path of ``rollout`` (any callable step takes it; the fast path
must be the same arithmetic), the closed-form decay under resistance, and central finite
differences for gradients.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax.info import Status
from rigidjax.stepper import packed_form

STEP = functools.partial(rj.midpoint_step, attitude="midpoint", max_rotation=0.05)


def generic(model, state, load, dt):
    # a plain callable: rollout cannot recognise it, so it takes the generic (array) path
    return STEP(model, state, load, dt)


def _ensemble(E=3):
    body = rj.RigidBody(
        mass=jnp.array([1.0, 2.0, 0.5][:E]), inertia=jnp.array([[1.0, 2.0, 3.0]] * E)[..., None] * jnp.eye(3)
    )
    w = jnp.array([[0.01, 2.0, 0.0], [1.0, -0.5, 0.3], [0.2, 0.1, 4.0]][:E])
    state = rj.RigidBodyState(
        position=jnp.zeros((E, 3)),
        orientation=jnp.tile(jnp.array([1.0, 0, 0, 0]), (E, 1)),
        velocity=jnp.array([[1.0, 0, 0]] * E),
        angular_velocity=w,
        time=jnp.zeros(E),
    )
    return body, state


def test_packed_form_recognises_midpoint_only():
    BODY = _ensemble()[0]
    assert packed_form(rj.midpoint_step, BODY) is not None
    assert packed_form(STEP, BODY) is not None
    assert packed_form(functools.partial(STEP, attitude="new"), BODY) is not None
    assert packed_form(rj.Midpoint(attitude="midpoint"), BODY) is not None
    assert packed_form(generic, BODY) is None
    assert packed_form(functools.partial(rj.midpoint_step, max_rotation=1.0, other=1), BODY) is None
    with pytest.raises(ValueError, match="attitude"):
        packed_form(functools.partial(rj.midpoint_step, attitude="old"), BODY)


@pytest.fixture(scope="module")
def runs():
    """One 23-step rollout of a 3-member ensemble with a wrench and a NaN load on member 1 at
    step 12 (fails there), on both paths and with save_every=5."""
    body, state = _ensemble()
    n = 23
    wrench = jnp.zeros((n, 3, 6)).at[:, :, 3].set(0.3).at[:, :, 0].set(-0.2)
    wrench = wrench.at[12, 1, 4].set(jnp.nan)
    dt = 0.01
    fast = rj.rollout(STEP, body, state, dt, n, wrench)
    slow = rj.rollout(generic, body, state, dt, n, wrench)
    saved = rj.rollout(STEP, body, state, dt, n, wrench, save_every=5)
    return fast, slow, saved


def test_fast_path_equals_generic_path(runs):
    fast, slow, _ = runs
    # the same arithmetic in another memory layout: equal to round-off (1e-13 on O(1) values)
    for a, b in zip(jax.tree_util.tree_leaves(fast.states), jax.tree_util.tree_leaves(slow.states)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-13)
    np.testing.assert_array_equal(np.asarray(fast.info.status), np.asarray(slow.info.status))
    # rotation agrees while a member runs; once frozen, the fast path reports the frozen
    # state's |omega| dt (the generic path re-runs the step on it and reports that result)
    live = np.asarray(fast.info.converged)
    np.testing.assert_allclose(np.asarray(fast.info.rotation)[live], np.asarray(slow.info.rotation)[live], atol=1e-15)
    # member 1 failed at step 12 and stayed frozen with its code; the others never failed
    st = np.asarray(fast.info.status)
    assert (st[12:, 1] == Status.NONFINITE).all() and (st[:12, 1] != Status.NONFINITE).all()
    assert np.isin(st[:, [0, 2]], [Status.SUCCESS, Status.ROTATION_LIMIT]).all()
    np.testing.assert_array_equal(
        np.asarray(fast.states.angular_velocity[13:, 1]),
        np.asarray(fast.states.angular_velocity[12, 1])[None].repeat(11, 0),
    )


def test_save_every_thins_the_trajectory(runs):
    fast, _, saved = runs
    idx = [0, 5, 10, 15, 20, 23]  # every 5th step and always the last
    for a, b in zip(jax.tree_util.tree_leaves(saved.states), jax.tree_util.tree_leaves(fast.states)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[idx])
    # info per interval (steps 0-4, 5-9, 10-14, 15-19, 20-22): worst status, maxima
    st, rot = np.asarray(fast.info.status), np.asarray(fast.info.rotation)
    bounds = [(0, 5), (5, 10), (10, 15), (15, 20), (20, 23)]
    for j, (lo, hi) in enumerate(bounds):
        np.testing.assert_array_equal(np.asarray(saved.info.rotation[j]), rot[lo:hi].max(0))
        for m in range(3):
            codes = st[lo:hi, m]
            fail = [c for c in codes if c in (1, 2, 3)]
            want = (
                fail[-1]
                if fail
                else (Status.ROTATION_LIMIT if (codes == Status.ROTATION_LIMIT).any() else Status.SUCCESS)
            )
            assert int(saved.info.status[j, m]) == int(want), (j, m, codes)
    assert int(saved.info.status[2, 1]) == Status.NONFINITE and int(saved.info.status[4, 1]) == Status.NONFINITE
    # member 2 spins at 4 rad/s: |omega| dt = 0.04 < 0.05 ... member-wise flags are exercised below
    assert saved.info.iterations.shape == (5, 3) and int(saved.info.iterations.max()) == 1


def test_save_every_edge_cases_and_errors():
    body, state = _ensemble(1)
    body, state = jax.tree_util.tree_map(lambda a: a[0], (body, state))
    # |omega| = 2 rad/s: rotation_limit flagged only where dt makes it exceed 0.05 rad
    dts = jnp.array([0.01, 0.01, 0.04, 0.01, 0.01, 0.01, 0.01])
    full = rj.rollout(STEP, body, state, dts)
    for s, idx in ((3, [0, 3, 6, 7]), (100, [0, 7])):
        tr = rj.rollout(STEP, body, state, dts, save_every=s)
        np.testing.assert_array_equal(np.asarray(tr.states.time), np.asarray(full.states.time)[idx])
    tr = rj.rollout(STEP, body, state, dts, save_every=3)
    assert [int(c) for c in tr.info.status] == [Status.ROTATION_LIMIT, Status.SUCCESS, Status.SUCCESS]
    assert bool(tr.converged)
    with pytest.raises(rj.StepFailure, match="ROTATION_LIMIT"):
        rj.rollout(STEP, body, state, dts, save_every=3, checked=True)
    zero = rj.rollout(STEP, body, state, 0.01, 0, save_every=4)
    assert zero.states.time.shape == (1,) and zero.info.status.shape == (0,)
    for bad in (0, -2, 1.5, True, "3"):
        with pytest.raises(ValueError, match="save_every"):
            rj.rollout(STEP, body, state, 0.01, 5, save_every=bad)


@pytest.mark.slow  # ~30 s of compiles (CI budget); run with python -m pytest -m slow
def test_save_every_with_checkpoint_gradient_matches_finite_differences():
    """d(final |omega|^2 + x)/d(inertia, resistance) through save_every=4 x checkpoint_every=8,
    against central differences (h = 1e-6: truncation ~h^2, round-off ~1e-16/h ~ 1e-10)."""
    body, state = _ensemble(1)
    body, state = jax.tree_util.tree_map(lambda a: a[0], (body, state))
    R = jnp.diag(jnp.array([0.3, 0.1, 0.2, 0.05, 0.02, 0.04]))

    def loss(J, Rs, save, ckpt):
        b = rj.RigidBody(body.mass, J, Rs * R)
        tr = rj.rollout(STEP, b, state, 0.01, 30, save_every=save, checkpoint_every=ckpt)
        return jnp.sum(tr.states.angular_velocity[-1] ** 2) + tr.states.position[-1, 0]

    J0 = jnp.diag(jnp.array([1.0, 2.0, 3.0]))
    g = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=(2, 3))
    gJ, gR = g(J0, 1.0, 4, 8)
    f = jax.jit(loss, static_argnums=(2, 3))
    h = 1e-6
    for i in range(3):
        E = jnp.zeros((3, 3)).at[i, i].set(h)
        fd = (f(J0 + E, 1.0, 4, 8) - f(J0 - E, 1.0, 4, 8)) / (2 * h)
        # the loss is O(4): round-off in the difference ~ 4 eps / h ~ 1e-9, hence atol 1e-8
        np.testing.assert_allclose(float(gJ[i, i]), float(fd), rtol=1e-6, atol=1e-8)
    fdR = (f(J0, 1.0 + h, 4, 8) - f(J0, 1.0 - h, 4, 8)) / (2 * h)
    np.testing.assert_allclose(float(gR), float(fdR), rtol=1e-6, atol=1e-8)


def test_fast_path_resistance_decay_callable_loads_and_vmap():
    """Translational decay under resistance r is exactly (1 + r dt/m)^-n (the implicit step);
    a callable load that cancels it gives constant velocity; vmap over bodies works."""
    m, r, dt, n = 2.0, 0.5, 0.01, 40
    body = rj.RigidBody(m, [1.0, 2.0, 3.0], resistance=jnp.diag(jnp.array([r, r, r, 0.0, 0.0, 0.0])))
    state = rj.RigidBodyState(velocity=jnp.array([1.0, -2.0, 0.5]), angular_velocity=jnp.array([0.0, 0.0, 1.0]))
    tr = rj.rollout(rj.midpoint_step, body, state, dt, n, save_every=10)
    want = np.array([1.0, -2.0, 0.5]) * (1 + r * dt / m) ** -n
    np.testing.assert_allclose(np.asarray(tr.states.velocity[-1]), want, rtol=1e-13)

    def push(t, s):  # cancels the resistance force at the start-of-step velocity
        return jnp.concatenate([r * s.velocity, jnp.zeros(3)])

    tr2 = rj.rollout(rj.midpoint_step, body, state, dt, n, push)
    # implicit resistance against an explicit push: v_k = v0 exactly only to first order; the
    # drift per step is r dt/m * (v_k - v_{k+1}) = O(dt^2) -> bound 1e-6 relative over 40 steps
    np.testing.assert_allclose(np.asarray(tr2.states.velocity[-1]), np.array([1.0, -2.0, 0.5]), rtol=1e-6)

    masses = jnp.array([1.0, 2.0, 4.0])
    bodies = jax.vmap(lambda mm: rj.RigidBody(mm, [1.0, 2.0, 3.0], resistance=body.resistance))(masses)
    trs = jax.vmap(lambda b: rj.rollout(rj.midpoint_step, b, state, dt, n, save_every=n))(bodies)
    want = np.array([1.0, -2.0, 0.5])[None] * ((1 + r * dt / np.asarray(masses)) ** -n)[:, None]
    np.testing.assert_allclose(np.asarray(trs.states.velocity[:, -1]), want, rtol=1e-13)
    assert trs.states.velocity.shape == (3, 2, 3)
