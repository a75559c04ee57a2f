"""Rollouts: gradients vs central finite differences, ensembles with vmap, scan size, loads."""

import re
from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax import so3

DT, N = 0.01, 60


def _loss(params):
    mass, inertia, resistance, v0, w0, q0 = params
    body = rj.RigidBody(mass, inertia, resistance=resistance, gravity=jnp.array([0.0, 0.0, -9.81]))
    s0 = rj.RigidBodyState(velocity=v0, angular_velocity=w0, orientation=q0)
    wrench = jnp.array([0.3, 0.1, 0.0, 0.05, -0.02, 0.01])
    tr = rj.rollout(
        partial(rj.midpoint_step, attitude="midpoint"), body, s0, DT, N, loads=lambda t, s: wrench * jnp.cos(3 * t)
    )
    end = jax.tree_util.tree_map(lambda a: a[-1], tr.states)
    # touches every output: position, velocity, rates, attitude (via a rotated vector)
    return (
        jnp.sum(end.position * jnp.array([1.0, 2.0, 3.0]))
        + jnp.sum(end.velocity**2)
        + jnp.sum(end.angular_velocity * jnp.array([0.5, -1.0, 2.0]))
        + jnp.sum(so3.rotate(end.orientation, jnp.array([1.0, -0.5, 0.25])))
    )


def _params(w0):
    rng = np.random.default_rng(3)
    Rm = rng.normal(size=(6, 6)) * 0.05
    resistance = Rm @ Rm.T + 0.1 * np.eye(6)  # coupled, positive definite
    inertia = np.array([[1.0, 0.1, 0.0], [0.1, 2.0, -0.2], [0.0, -0.2, 2.5]])
    return [
        jnp.array(1.5),
        jnp.asarray(inertia),
        jnp.asarray(resistance),
        jnp.array([1.0, 0.0, 3.0]),
        jnp.asarray(w0),
        so3.exp(jnp.array([0.1, 0.2, -0.3])),
    ]


def _central_fd(f, params, i, idx, h):
    def shifted(sign):
        p = [a for a in params]
        p[i] = p[i].at[idx].add(sign * h)
        return float(f(p))

    return (shifted(1) - shifted(-1)) / (2 * h)


@pytest.mark.parametrize("w0", [[0.3, 2.0, -0.5], [0.0, 0.0, 0.0]], ids=["spinning", "zero_rotation"])
def test_gradient_matches_central_differences(w0):
    params = _params(w0)
    loss = jax.jit(_loss)
    grads = jax.jit(jax.grad(_loss))(params)
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g)))
    checks = [
        (0, ()),
        (1, (0, 0)),
        (1, (1, 2)),
        (1, (2, 2)),
        (2, (0, 0)),
        (2, (3, 4)),
        (2, (5, 5)),
        (3, (2,)),
        (4, (0,)),
        (4, (1,)),
        (4, (2,)),
    ]
    for i, idx in checks:
        h = 1e-6
        fd = _central_fd(loss, params, i, idx, h)
        g = float(np.asarray(grads[i])[idx])
        # central differences: truncation O(h^2) ~ 1e-12, round-off ~ eps*|f|/h ~ 1e-9
        assert abs(g - fd) <= 1e-6 * max(1.0, abs(fd)), (i, idx, g, fd)


@pytest.mark.slow  # ~22 s of compile; CI budget (the gradient tests above stay)
def test_gradient_wrt_initial_orientation_tangent():
    # perturb the initial attitude on the manifold: q0 ⊗ exp(delta); FD in delta
    params = _params([0.3, 2.0, -0.5])

    def f(delta):
        p = list(params)
        p[5] = so3.multiply(params[5], so3.exp(delta))
        return _loss(p)

    g = jax.grad(f)(jnp.zeros(3))
    for k in range(3):
        e = jnp.zeros(3).at[k].set(1e-6)
        fd = (f(e) - f(-e)) / 2e-6
        assert abs(g[k] - fd) < 1e-6 * max(1.0, abs(fd))


def test_ensemble_vmap_over_bodies_states_and_loads():
    n_bodies = 8
    rng = np.random.default_rng(0)
    moments = jnp.asarray(np.sort(rng.uniform(1.0, 2.0, (n_bodies, 3)), axis=1))
    bodies = rj.RigidBody(jnp.linspace(1.0, 2.0, n_bodies), moments)
    states = rj.RigidBodyState(angular_velocity=jnp.asarray(rng.normal(size=(n_bodies, 3))))
    loads = jnp.asarray(rng.normal(size=(n_bodies, N, 6)) * 0.1)

    run = jax.jit(jax.vmap(lambda b, s, l: rj.rollout(rj.midpoint_step, b, s, DT, N, loads=l)))
    ens = run(bodies, states, loads)
    assert ens.states.angular_velocity.shape == (n_bodies, N + 1, 3)
    assert ens.info.status.shape == (n_bodies, N)
    # each member equals its own single rollout (independent members)
    for k in (0, 5):
        b = jax.tree_util.tree_map(lambda a: a[k], bodies)
        s = jax.tree_util.tree_map(lambda a: a[k], states)
        single = rj.rollout(rj.midpoint_step, b, s, DT, N, loads=loads[k])
        np.testing.assert_allclose(
            ens.states.angular_velocity[k], single.states.angular_velocity, rtol=1e-12, atol=1e-14
        )
    # the same ensemble passed as batched pytrees without vmap broadcasts too
    direct = rj.rollout(rj.midpoint_step, bodies, states, DT, N, loads=jnp.swapaxes(loads, 0, 1))
    np.testing.assert_allclose(
        jnp.swapaxes(direct.states.angular_velocity, 0, 1), ens.states.angular_velocity, rtol=1e-12, atol=1e-14
    )


def test_failure_reported_per_member_and_frozen():
    bodies = rj.RigidBody(jnp.ones(3), jnp.tile(jnp.diag(jnp.array([1.0, 2.0, 3.0])), (3, 1, 1)))
    states = rj.RigidBodyState(angular_velocity=jnp.tile(jnp.array([0.1, 1.0, 0.0]), (3, 1)))
    loads = jnp.zeros((3, 20, 6)).at[1, 7].set(jnp.nan)  # member 1 gets a NaN wrench at step 7
    ens = jax.vmap(lambda b, s, l: rj.rollout(rj.midpoint_step, b, s, DT, 20, loads=l))(bodies, states, loads)
    status = np.asarray(ens.info.status)
    assert np.all(status[[0, 2]] == rj.Status.SUCCESS)
    assert np.all(status[1, :7] == rj.Status.SUCCESS) and np.all(status[1, 7:] == rj.Status.NONFINITE)
    np.testing.assert_array_equal(
        ens.states.angular_velocity[1, 8:], np.broadcast_to(ens.states.angular_velocity[1, 7], (13, 3))
    )
    assert list(np.asarray(ens.info.converged.all(axis=1))) == [True, False, True]
    with pytest.raises(rj.StepFailure, match=r"NONFINITE at index \(1, 7\)"):
        rj.check(eqx.tree_at(lambda i: i.status, ens.info, ens.info.status))


def test_checked_inside_jit_raises():
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    s0 = rj.RigidBodyState(angular_velocity=[0.0, 20.0, 0.1])
    f = jax.jit(lambda b, s: rj.rollout(rj.midpoint_step, b, s, 0.05, 5, checked=True).states.time[-1])
    with pytest.raises(Exception, match="a step failed"):
        jax.block_until_ready(f(body, s0))


def test_per_step_dt_non_uniform():
    # non-uniform steps (measured timestamps): the time axis is the cumulative sum
    dts = jnp.asarray(np.random.default_rng(1).uniform(0.005, 0.015, N))
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    tr = rj.rollout(rj.midpoint_step, body, rj.RigidBodyState(angular_velocity=[0.1, 2.0, 0.0]), dts)
    np.testing.assert_allclose(tr.states.time[1:], np.cumsum(dts), rtol=1e-13)


def test_compiled_size_independent_of_steps():
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    s0 = rj.RigidBodyState(angular_velocity=[0.1, 2.0, 0.0])

    def text(n):
        f = jax.jit(lambda b, s: rj.rollout(rj.midpoint_step, b, s, 0.01, n).states.angular_velocity[-1])
        return f.lower(body, s0).as_text()

    small, large = text(10), text(10_000)
    # a scan: same program, only the trip count and output shapes differ
    assert abs(len(large) - len(small)) < 200, (len(small), len(large))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(dt=0.0, n_steps=5), "dt must be > 0"),
        (dict(dt=-0.01, n_steps=5), "dt must be > 0"),
        (dict(dt=float("nan"), n_steps=5), "dt contains NaN"),
        (dict(dt=0.01), "n_steps is required"),
        (dict(dt=jnp.full(4, 0.01), n_steps=5), "n_steps=5"),
        (dict(dt=0.01, n_steps=5, loads=jnp.zeros((4, 6))), "leading axis of length n_steps=5"),
    ],
)
def test_rollout_bad_input(kwargs, match):
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=match):
        rj.rollout(rj.midpoint_step, body, rj.RigidBodyState(), **kwargs)


def test_wrong_model_or_state_kind_names_the_stepper():
    """A model or state meant for another stepper: one sentence naming the stepper that takes
    it (was an AttributeError from deep inside the step); a shared model in an ensemble: the
    option that allows it."""
    from rigidjax import systems

    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    s = rj.RigidBodyState(angular_velocity=jnp.array([0.1, 2.0, 0.0]))
    pend = systems.pendulum()
    vs = rj.vi_state(pend, jnp.array([0.3]), jnp.array([0.0]))
    for call, msg in (
        (
            lambda: rj.midpoint_step(pend, s, None, 0.01),
            "midpoint_step: model must be a rigidjax.RigidBody; got a MechanicalSystem: "
            "a MechanicalSystem steps with rigidjax.vi_step",
        ),
        (lambda: rj.rollout(rj.midpoint_step, pend, s, 0.01, 3), "midpoint_step: model must be a rigidjax.RigidBody"),
        (lambda: rj.midpoint_step(body, vs, None, 0.01), "state must be a rigidjax.RigidBodyState; got a VIState"),
        (lambda: rj.ep_step(body, s, None, 0.01), "ep_step: model must be a rigidjax.EPModel; got a RigidBody"),
        (
            lambda: rj.vi_step(body, vs, None, 0.01),
            "vi_step: model must be a rigidjax.MechanicalSystem; got a RigidBody",
        ),
        (lambda: rj.rollout(rj.vi_step, body, vs, 0.01, 3), "vi_step: model must be"),
    ):
        with pytest.raises(TypeError, match=re.escape(msg)):
            call()
    states = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), s)
    with pytest.raises(ValueError, match="pass model_batched=False"):
        rj.ensemble_rollout(rj.midpoint_step, body, states, 0.01, 3)
    ok = rj.ensemble_rollout(rj.midpoint_step, body, states, 0.01, 3, model_batched=False)
    assert ok.states.angular_velocity.shape == (2, 4, 3)


def test_time_does_not_drift():
    """The rollout's clock stays within a few ulps of ``t0 + k dt``: 10^5 float32 midpoint steps
    of 1e-3 s (the plain ``t + dt`` ended at 99.9567 s, 0.043 s early), and 2 x 10^4 float64
    steps of every stepper's fast path (the plain sum drifts ~1e-12 s there, hundreds of
    ulps). ``k dt`` itself rounded once is the truth."""
    from rigidjax import euler_parameters as ep
    from rigidjax import systems

    n, dt = 100_000, np.float32(1e-3)
    body32 = rj.RigidBody(jnp.float32(1.0), jnp.array([1.0, 2.0, 3.0], jnp.float32))
    s32 = jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float32), rj.RigidBodyState(angular_velocity=jnp.array([0.1, 2.0, 0.0]))
    )
    t = float(rj.rollout(rj.midpoint_step, body32, s32, dt, n, save_every=n).states.time[-1])
    exact = np.float32(n * np.float64(dt))
    assert abs(t - exact) <= 4 * np.spacing(exact), (t, exact)

    n, dt = 20_000, 1e-3
    body = rj.RigidBody(1.0, [1.0, 2.0, 3.0])
    s = rj.RigidBodyState(angular_velocity=jnp.array([0.1, 2.0, 0.0]), time=jnp.asarray(0.25))
    model = ep.EPModel(body)
    system = systems.rigid_body(body)
    runs = {
        "midpoint": (rj.midpoint_step, body, s),
        "euler-parameters": (
            ep.ep_step,
            model,
            ep.initial_state(model, angular_velocity=s.angular_velocity[None], time=0.25),
        ),
        "variational": (rj.vi_step, system, systems.rigid_body_vi_state(system, s)),
    }
    exact = 0.25 + n * dt
    for name, (step, m, s0) in runs.items():
        t = float(jax.jit(lambda m, s0, step=step: rj.rollout(step, m, s0, dt, n, save_every=n).states.time[-1])(m, s0))
        assert abs(t - exact) <= 4 * np.spacing(exact), (name, t, exact)


def _sub_case():
    body = rj.RigidBody(1.5, jnp.diag(jnp.array([1.0, 2.0, 2.8])), gravity=jnp.array([0.0, 0.0, -9.81]))
    state = rj.RigidBodyState(angular_velocity=jnp.array([0.4, 2.5, -0.6]), velocity=jnp.array([0.1, 0.0, 1.0]))
    dts = jnp.array([0.01, 0.02, 0.015, 0.01, 0.03])
    loads = jnp.asarray(np.random.default_rng(1).normal(size=(5, 6)))
    return body, state, dts, loads


def _every(traj, k):
    """The states at every k-th step and info reduced over each k steps (the definition of
    rollout's substeps, from the plain rollout of ``dt / k``)."""
    states = jax.tree_util.tree_map(lambda a: a[::k], traj.states)
    status = np.asarray(traj.info.status).reshape(-1, k).max(axis=1)
    return states, status


@pytest.mark.parametrize("stepper", [rj.Midpoint(attitude="midpoint"), rj.euler_parameters.GeneralizedAlphaEP()])
@pytest.mark.parametrize("k", [1, 3])
def test_substeps_are_the_steps_of_dt_over_k(stepper, k):
    """``substeps=k`` (a Python int, and traced under jit) gives the plain rollout of the
    per-step ``dt / k`` (loads repeated) at every k-th state, to round-off (the same steps:
    1e-14 relative); statuses per interval; its time is the sum of the intervals."""
    body, state, dts, loads = _sub_case()
    if isinstance(stepper, rj.euler_parameters.GeneralizedAlphaEP):
        body = rj.euler_parameters.EPModel(body)  # the packed (structure-of-arrays) form
        state = rj.euler_parameters.initial_state(body, angular_velocity=jnp.array([[0.4, 2.5, -0.6]]))
        loads = None
    fine = rj.rollout(
        stepper, body, state, jnp.repeat(dts / k, k), 5 * k, None if loads is None else jnp.repeat(loads, k, axis=0)
    )
    ref, ref_status = _every(fine, k)
    run = lambda kk: rj.rollout(stepper, body, state, dts, 5, loads, substeps=kk)  # noqa: E731
    for traj in (run(k), jax.jit(run)(jnp.int32(k))):
        for a, b in zip(jax.tree_util.tree_leaves(traj.states), jax.tree_util.tree_leaves(ref)):
            np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)
        np.testing.assert_array_equal(traj.info.status, ref_status)
        assert traj.info.status.shape == (5,)


def test_substeps_callable_loads_and_rotation_limit():
    """A callable ``loads`` is evaluated before every sub-step (as the plain rollout of ``dt / k``
    does); a sub-step above ``max_rotation`` makes its interval's status ``ROTATION_LIMIT``,
    and a checked rollout's error names that interval."""
    body, state, dts, _ = _sub_case()
    loads = lambda t, s: jnp.array([0.0, 0.0, 0.0, jnp.sin(40 * t), 0.3, -0.2])  # noqa: E731
    fine = rj.rollout(rj.Midpoint(), body, state, jnp.repeat(dts / 4, 4), 20, loads)
    traj = rj.rollout(rj.Midpoint(), body, state, dts, 5, loads, substeps=4)
    np.testing.assert_allclose(traj.states.angular_velocity, fine.states.angular_velocity[::4], rtol=1e-14)
    tight = rj.Midpoint(max_rotation=0.016)  # |omega| dt / 4: ~0.0195 in the 0.03 s interval, <= 0.013 elsewhere
    status = rj.rollout(tight, body, state, dts, 5, substeps=4).info.status
    assert np.asarray(status).tolist() == [0, 0, 0, 0, int(rj.Status.ROTATION_LIMIT)], status
    # a checked rollout names the interval and the largest rotation of its sub-steps
    with pytest.raises(
        rj.StepFailure,
        match=r"index \(4,\) \(leading axis = sample interval \(4 steps each\).*"
        r"largest per step \|omega\|\*dt there = 0.0\d+ rad.* 1 sample interval\(s\) affected",
    ):
        rj.rollout(tight, body, state, dts, 5, substeps=4, checked=True)


def test_substeps_derivatives():
    """Reverse mode through a Python-int ``substeps`` and forward mode through a traced one equal
    the plain rollout's of ``dt / k`` (1e-12 relative: the same operations), and central
    differences (1e-6: step 1e-5, error O(h^2) x the third derivative)."""
    body, state, dts, loads = _sub_case()

    def end(I, k=3, **kw):
        b = eqx.tree_at(lambda m: m.inertia, body, I)
        return rj.rollout(rj.Midpoint(), b, state, dts, 5, loads, **kw).states.angular_velocity[-1] @ jnp.array(
            [1.0, -2.0, 0.5]
        )

    def plain(I):
        b = eqx.tree_at(lambda m: m.inertia, body, I)
        traj = rj.rollout(rj.Midpoint(), b, state, jnp.repeat(dts / 3, 3), 15, jnp.repeat(loads, 3, axis=0))
        return traj.states.angular_velocity[-1] @ jnp.array([1.0, -2.0, 0.5])

    I0, dI = body.inertia, jnp.diag(jnp.array([0.3, -0.2, 0.1])) + 0.05
    g = jax.grad(lambda I: end(I, substeps=3))(I0)
    np.testing.assert_allclose(g, jax.grad(plain)(I0), rtol=1e-12, atol=1e-14)
    tangent = jax.jit(lambda I, k: jax.jvp(lambda J: end(J, substeps=k), (I,), (dI,))[1])(I0, jnp.int32(3))
    np.testing.assert_allclose(tangent, jnp.sum(g * dI), rtol=1e-12)
    h = 1e-5
    fd = (end(I0 + h * dI, substeps=3) - end(I0 - h * dI, substeps=3)) / (2 * h)
    np.testing.assert_allclose(tangent, fd, rtol=1e-6)


def test_substeps_bad_values():
    """A Python count below 1, a float, a bool, a string or a traced float is refused; a traced
    count below 1 runs no step and gives ``INVALID_INPUT`` with the state held; the discrete
    adjoint does not take substeps; no steps at all is the initial state."""
    body, state, dts, _ = _sub_case()
    for bad in (0, -1, 1.5, True, "2", np.array([1, 2])):
        with pytest.raises(ValueError, match="substeps"):
            rj.rollout(rj.Midpoint(), body, state, dts, 5, substeps=bad)
    with pytest.raises(ValueError, match="integer scalar"):
        jax.jit(lambda k: rj.rollout(rj.Midpoint(), body, state, dts, 5, substeps=k))(1.0)
    held = jax.jit(lambda k: rj.rollout(rj.Midpoint(), body, state, dts, 5, substeps=k))(jnp.int32(0))
    assert np.all(np.asarray(held.info.status) == rj.Status.INVALID_INPUT)
    np.testing.assert_array_equal(held.states.angular_velocity, np.tile(state.angular_velocity, (6, 1)))
    with pytest.raises(ValueError, match="substeps is set"):
        rj.rollout(rj.Midpoint(), body, state, dts, 5, substeps=2, adjoint="discrete")
    empty = rj.rollout(rj.Midpoint(), body, state, dts[:0], 0, substeps=2)
    assert empty.states.angular_velocity.shape == (1, 3)


def test_status_carries_start_batched():
    """The rollout's status carries start from ``numerics.zeros_like_batch``: exact zeros
    (also from NaN and inf), no derivative, and batched under ``vmap`` with the state, so that
    JAX's loop batching rules need no extra fixpoint round (``out_axes=None`` refuses a
    batched output: that is the check)."""
    from rigidjax.numerics import zeros_like_batch

    x = jnp.array([[1.5, np.nan, 2.0], [np.inf, -np.inf, 0.0]])
    for dtype in (jnp.int32, x.dtype):
        z = jax.vmap(lambda r: zeros_like_batch({"a": r, "b": None}, (2,), dtype))(x)
        assert z.dtype == dtype and z.shape == (2, 2) and np.all(np.asarray(z) == 0)
    assert float(jax.grad(lambda r: zeros_like_batch(r, (), r.dtype) + 0.0)(x[0]).sum()) == 0.0
    with pytest.raises(ValueError, match="out_axes"):
        jax.vmap(lambda r: zeros_like_batch(r), out_axes=None)(x)
    jax.vmap(lambda r: jnp.zeros((), jnp.int32), out_axes=None)(x)  # what jnp.zeros gives: unbatched


@pytest.mark.parametrize("name", ["midpoint", "ep", "vi"])
@pytest.mark.parametrize("dt", [0.0, -1e-3, float("nan")])
def test_every_step_refuses_a_concrete_bad_dt(name, dt):
    """A concrete ``dt`` that is not finite and > 0 is a ``ValueError`` at each step's boundary
    (the Euler-parameter and variational steps returned ``INVALID_INPUT`` silently before);
    traced, it is the member's ``INVALID_INPUT`` and the state is held."""
    from rigidjax import euler_parameters as ep
    from rigidjax import systems
    from rigidjax.info import Status

    body = rj.RigidBody(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.0])))
    s = rj.RigidBodyState(angular_velocity=jnp.array([0.1, 2.0, 0.0]))
    if name == "midpoint":
        step, model = rj.midpoint_step, body
    elif name == "ep":
        step, model = ep.ep_step, ep.EPModel(body)
        s = ep.initial_state(model, angular_velocity=s.angular_velocity[None])
    else:
        step, model = rj.vi_step, systems.rigid_body(body)
        s = systems.rigid_body_vi_state(model, s)
    with pytest.raises(ValueError, match=r"dt must be finite and > 0 s"):
        step(model, s, None, dt)
    for wrong in (None, "0.001", True):  # not a number of seconds
        with pytest.raises(TypeError, match=r"dt must be a number of seconds"):
            step(model, s, None, wrong)
    new, info = jax.jit(lambda d: step(model, s, None, d))(dt)
    assert int(info.status) == Status.INVALID_INPUT
    assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda a, b: bool(jnp.all(a == b)), new, s)))
