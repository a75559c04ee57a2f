"""``rollout(adjoint="discrete")``: the hand-written reverse sweep of the midpoint step.

Truths: central finite differences of the rollout itself, and autodiff through the scan
(``adjoint=None``), whose derivative comes from a separately written array-form step
(``midpoint._core_linearized``, the step's hand-written JVP), not from the sweep's formulas.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax.info import Status

N_STEPS = 20
ARGNAMES = ("inertia", "mass", "resistance", "gravity", "omega0", "v0", "q0", "wrench", "dt")


def _args(E=2, per_step_dt=False):
    rng = np.random.default_rng(3)
    J = jnp.array([[1.0, 0.1, 0.05], [0.1, 2.0, -0.2], [0.05, -0.2, 2.5]])
    R = jnp.asarray(rng.normal(size=(6, 6)) * 0.05 + np.eye(6) * 0.3)  # couples v and omega
    w0 = jnp.array([[0.3, 2.0, -0.5], [0.0, 0.0, 0.0]][:E])  # member 1 starts at zero rotation
    v0 = jnp.array([[1.0, -1.0, 0.5]] * E)
    q0 = jnp.array([[0.9, 0.1, -0.3, 0.2], [1.0, 0.0, 0.0, 0.0]][:E])
    wrench = jnp.asarray(rng.normal(size=(N_STEPS, E, 6)))
    dt = jnp.asarray(0.02 + 0.01 * rng.random(N_STEPS)) if per_step_dt else jnp.asarray(0.02)
    return [J, jnp.asarray(1.5), R, jnp.array([0.0, 0.0, -9.81]), w0, v0, q0, wrench, dt]


def _loss(J, m, R, g, w0, v0, q0, wrench, dt, adjoint, attitude):
    step = functools.partial(rj.midpoint_step, attitude=attitude, max_rotation=0.03)
    body = rj.RigidBody(m, J, R, g)
    q = q0 / jnp.linalg.norm(q0, axis=-1, keepdims=True)
    E = w0.shape[0]
    state = rj.RigidBodyState(
        position=jnp.full((E, 3), 0.1), orientation=q, velocity=v0, angular_velocity=w0, time=jnp.zeros(E)
    )
    tr = rj.rollout(step, body, state, dt, N_STEPS, wrench, adjoint=adjoint)
    s = tr.states
    k = jnp.arange(N_STEPS + 1, dtype=w0.dtype)[:, None, None]
    return (
        jnp.sum(k * s.angular_velocity**2)
        + jnp.sum(s.orientation[..., 1:] ** 3)
        + jnp.sum(s.position**2)
        + 0.7 * jnp.sum(s.velocity)
        + 0.1 * jnp.sum(s.time)
        + jnp.sum(tr.info.rotation)
    )


_grad = jax.jit(jax.grad(_loss, argnums=tuple(range(9))), static_argnums=(9, 10))
_value = jax.jit(_loss, static_argnums=(9, 10))


# "new" repeats the check for the seed's attitude update (slow: CI's budget)
@pytest.mark.parametrize("attitude", ["midpoint", pytest.param("new", marks=pytest.mark.slow)])
def test_discrete_adjoint_equals_autodiff(attitude):
    args = _args()
    gd = _grad(*args, "discrete", attitude)
    ga = _grad(*args, None, attitude)
    for name, a, d in zip(ARGNAMES, ga, gd):
        a, d = np.asarray(a), np.asarray(d)
        assert np.all(np.isfinite(d)), name  # incl. the member at zero rotation
        # two independent derivations of the same discrete map: round-off only
        np.testing.assert_allclose(d, a, rtol=1e-11, atol=1e-11 * np.max(np.abs(a)), err_msg=name)
    assert float(_value(*args, "discrete", attitude)) == float(_value(*args, None, attitude))


def test_discrete_adjoint_matches_finite_differences_with_failures_and_per_step_dt():
    """Per-step dt, a member that fails mid-rollout (NaN wrench at step 9) and steps flagged
    ROTATION_LIMIT: central differences, h = 1e-6 (truncation ~h^2 |f'''|, round-off
    ~eps |f| / h ~ 1e-8 on |f| ~ 50): rtol 1e-5 with an absolute floor of 1e-6."""
    args = _args(per_step_dt=True)
    args[7] = args[7].at[9, 1, 2].set(jnp.nan)
    E = 2
    tr = rj.rollout(
        functools.partial(rj.midpoint_step, attitude="midpoint", max_rotation=0.03),
        rj.RigidBody(args[1], args[0], args[2], args[3]),
        rj.RigidBodyState(
            orientation=args[6] / jnp.linalg.norm(args[6], axis=-1, keepdims=True),
            velocity=args[5],
            angular_velocity=args[4],
            position=jnp.zeros((E, 3)),
            time=jnp.zeros(E),
        ),
        args[8],
        N_STEPS,
        args[7],
    )
    status = np.asarray(tr.info.status)
    assert (status[9:, 1] == Status.NONFINITE).all() and (status[:, 0] == Status.ROTATION_LIMIT).any()
    g = _grad(*args, "discrete", "midpoint")
    f0 = float(_value(*args, "discrete", "midpoint"))
    assert np.isfinite(f0)
    h = 1e-6
    rng = np.random.default_rng(0)
    for i, name in enumerate(ARGNAMES):
        a = np.asarray(args[i], float)
        # probe a few random directions per argument (all entries would cost too many runs)
        for _ in range(2):
            d = rng.normal(size=a.shape)
            if name == "wrench":
                d[9, 1, 2] = 0.0  # the NaN entry has no derivative
            plus = list(args)
            minus = list(args)
            plus[i] = jnp.asarray(a + h * d)
            minus[i] = jnp.asarray(a - h * d)
            fd = (float(_value(*plus, "discrete", "midpoint")) - float(_value(*minus, "discrete", "midpoint"))) / (
                2 * h
            )
            gi = np.nan_to_num(np.asarray(g[i]))
            ad = float(np.sum(gi * d))
            assert ad == pytest.approx(fd, rel=1e-5, abs=1e-6), (name, ad, fd)


@pytest.mark.slow  # ~40 s of compiles; the ensemble test below covers the batched path in CI
def test_discrete_adjoint_shared_body_and_vmap():
    J = jnp.diag(jnp.array([1.0, 2.0, 3.0]))
    w0 = jnp.array([[0.01, 2.0, 0.0], [1.0, 0.5, -0.3], [0.0, 0.0, 0.0]])

    def loss(J, w0, adjoint):
        body = rj.RigidBody(1.0, J)  # one body shared by the batched states
        s = rj.RigidBodyState(
            angular_velocity=w0,
            orientation=jnp.tile(jnp.array([1.0, 0, 0, 0]), (3, 1)),
            position=jnp.zeros((3, 3)),
            velocity=jnp.zeros((3, 3)),
            time=jnp.zeros(3),
        )
        return jnp.sum(
            rj.rollout(rj.midpoint_step, body, s, 0.01, 15, adjoint=adjoint).states.angular_velocity[-1] ** 2
        )

    g = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    for a, b in zip(g(J, w0, "discrete"), g(J, w0, None)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)

    # per-member gradients through vmap of single-body rollouts, against autodiff's
    def single(J, w, adjoint):
        s = rj.RigidBodyState(angular_velocity=w)
        tr = rj.rollout(rj.midpoint_step, rj.RigidBody(1.0, J), s, 0.01, 15, adjoint=adjoint)
        return jnp.sum(tr.states.orientation[-1, 1:] ** 2)

    per_member = jax.jit(jax.vmap(jax.grad(single), in_axes=(None, 0, None)), static_argnums=2)
    np.testing.assert_allclose(
        np.asarray(per_member(J, w0, "discrete")), np.asarray(per_member(J, w0, None)), rtol=1e-12, atol=1e-15
    )


@pytest.mark.slow  # ~24 s of compile; CI budget
def test_ensemble_rollout_discrete_adjoint_and_loads():
    """ensemble_rollout runs the midpoint step over its members in one batched rollout: same
    states as vmap(rollout), per-member loads honoured, and its discrete-adjoint gradient
    equals autodiff through vmap(rollout) (round-off)."""
    from rigidjax.ensemble import ensemble_rollout

    E, n = 5, 12
    body = rj.RigidBody(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.0])))
    w0 = jnp.stack([jnp.array([0.01, 2.0, 0.0]) * (1 + 0.1 * k) for k in range(E)])
    states0 = rj.RigidBodyState(
        angular_velocity=w0,
        orientation=jnp.tile(jnp.array([1.0, 0, 0, 0]), (E, 1)),
        position=jnp.zeros((E, 3)),
        velocity=jnp.zeros((E, 3)),
        time=jnp.zeros(E),
    )
    loads = jnp.zeros((E, n, 6)).at[:, :, 3].set(jnp.arange(E, dtype=float)[:, None] * 0.1)

    def via_ensemble(J, adjoint):
        b = rj.RigidBody(1.0, J)
        tr = ensemble_rollout(rj.midpoint_step, b, states0, 0.01, n, loads, model_batched=False, adjoint=adjoint)
        return jnp.sum(tr.states.angular_velocity[:, -1] ** 2), tr

    def via_vmap(J):
        b = rj.RigidBody(1.0, J)
        tr = jax.vmap(lambda s, l: rj.rollout(rj.midpoint_step, b, s, 0.01, n, l))(states0, loads)
        return jnp.sum(tr.states.angular_velocity[:, -1] ** 2), tr

    J = body.inertia
    (v1, tr1), g1 = jax.value_and_grad(via_ensemble, has_aux=True)(J, "discrete")
    (v2, tr2), g2 = jax.value_and_grad(via_vmap, has_aux=True)(J)
    assert tr1.states.angular_velocity.shape == (E, n + 1, 3) and tr1.info.status.shape == (E, n)
    np.testing.assert_allclose(
        np.asarray(tr1.states.angular_velocity), np.asarray(tr2.states.angular_velocity), atol=1e-14
    )
    np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=1e-12, atol=1e-14)
    # member k is driven by torque 0.1 k about x: its final rate differs from member 0's scaled run
    assert float(jnp.abs(tr1.states.angular_velocity[4, -1, 0] - 1.4 * tr1.states.angular_velocity[0, -1, 0])) > 1e-3


# ~44 s of compile; CI budget (test_discrete_adjoint_matches_finite_differences_with_failures_and_per_step_dt stays)
@pytest.mark.slow
def test_failed_member_and_shared_loads_gradients():
    """Members never affect each other, also in gradients: a member frozen by a NaN wrench
    leaves every other gradient finite and equal to a run without it (both adjoints); a
    per-step wrench shared by all members gets the sum of their cotangents."""
    E, n = 4, 5
    w0 = jnp.array(np.random.default_rng(0).normal(size=(E, 3)))
    state = rj.RigidBodyState(
        angular_velocity=w0,
        velocity=jnp.ones((E, 3)),
        position=jnp.zeros((E, 3)),
        orientation=jnp.tile(jnp.array([1.0, 0, 0, 0]), (E, 1)),
        time=jnp.zeros(E),
    )
    keep = jnp.array([0, 2, 3])
    W = jnp.zeros((n, E, 6)).at[:, :, 3:].set(0.2).at[2, 1, 0].set(jnp.nan)

    def loss(J, W, adjoint, members):
        st = rj.rollout(
            rj.midpoint_step,
            rj.RigidBody(1.5, J),
            jax.tree_util.tree_map(lambda a: a[members], state),
            0.05,
            n,
            W[:, members],
            adjoint=adjoint,
        ).states
        return jnp.sum(st.angular_velocity[:, jnp.arange(len(members)) if len(members) == 3 else keep] ** 2)

    J = jnp.diag(jnp.array([1.0, 2.0, 2.5]))
    clean = jax.grad(loss)(J, W, None, keep)
    for adjoint in (None, "discrete"):
        g = jax.grad(loss)(J, W, adjoint, jnp.arange(E))
        np.testing.assert_allclose(np.asarray(g), np.asarray(clean), rtol=1e-12, atol=1e-14)

    shared = jnp.asarray(np.random.default_rng(1).normal(size=(n, 6)))  # (n_steps, 6) for every member

    def f(Ws, adjoint):
        st = rj.rollout(rj.midpoint_step, rj.RigidBody(1.5, J), state, 0.05, n, Ws, adjoint=adjoint).states
        return jnp.sum(st.angular_velocity**3) + jnp.sum(st.position[-1] ** 2)

    ga, gd = jax.grad(f)(shared, None), jax.grad(f)(shared, "discrete")
    assert gd.shape == (n, 6)
    np.testing.assert_allclose(np.asarray(gd), np.asarray(ga), rtol=1e-11, atol=1e-13)


def test_traced_inputs_out_of_range_are_flagged():
    """Values traced under jit cannot be checked at the boundary: dt <= 0, mass <= 0 and an
    inertia that is not positive definite or violates the triangle inequality give
    Status.INVALID_INPUT (state unchanged), and a checked rollout raises at run time."""
    body = rj.RigidBody(1.0, [1.0, 2.0, 2.5])
    s = rj.RigidBodyState(angular_velocity=jnp.array([0.1, 2.0, 0.0]))
    run = jax.jit(lambda m, J, dt: rj.rollout(rj.midpoint_step, rj.RigidBody(m, J), s, dt, 3))
    good = run(1.0, body.inertia, 0.01)
    assert (np.asarray(good.info.status) == Status.SUCCESS).all()
    for m, J, dt in (
        (1.0, body.inertia, -0.01),
        (-1.0, body.inertia, 0.01),
        (1.0, jnp.diag(jnp.array([-1.0, 2.0, 2.5])), 0.01),
    ):
        tr = run(m, J, dt)
        assert (np.asarray(tr.info.status) == Status.INVALID_INPUT).all()
        np.testing.assert_array_equal(np.asarray(tr.states.angular_velocity[-1]), np.asarray(s.angular_velocity))
    # the triangle inequality, traced: I_z > I_x + I_y (no mass distribution has it) is flagged;
    # a thin plate (equality), also rotated so that round-off blurs it, stays valid
    tr = run(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.5])), 0.01)
    assert (np.asarray(tr.info.status) == Status.INVALID_INPUT).all()
    Q = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))[0]
    for J in (jnp.diag(jnp.array([1.0, 2.0, 3.0])), jnp.asarray(Q @ np.diag([1.0, 2.0, 3.0]) @ Q.T)):
        assert (np.asarray(run(1.0, J, 0.01).info.status) == Status.SUCCESS).all()
        assert (np.asarray(run(1.0, J.astype(jnp.float32), jnp.float32(0.01)).info.status) == Status.SUCCESS).all()
    with pytest.raises(Exception, match="failed"):
        jax.jit(lambda dt: rj.rollout(rj.midpoint_step, body, s, dt, 3, checked=True).states.time)(
            -0.01
        ).block_until_ready()
    with pytest.raises(ValueError, match="wrench has batch shape"):
        batched = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), s)
        rj.rollout(rj.midpoint_step, body, batched, 0.01, 3, jnp.zeros((3, 3, 6)))
    with pytest.raises(ValueError, match="n_steps must be an integer"):
        rj.rollout(rj.midpoint_step, body, s, 0.01, 3.5)


def test_discrete_adjoint_unsupported_options_raise():
    J = jnp.diag(jnp.array([1.0, 2.0, 3.0]))
    w0 = jnp.array([[0.01, 2.0, 0.0]])
    body, state = rj.RigidBody(1.0, J), rj.RigidBodyState(angular_velocity=w0[0])
    for kw, msg in (
        (dict(adjoint="backsolve"), "adjoint must be"),
        (dict(adjoint="discrete", save_every=3), "save_every"),
        (dict(adjoint="discrete", checkpoint_every=3), "checkpoint_every"),
        (dict(adjoint="discrete", loads=lambda t, s: jnp.zeros(6)), "callable"),
    ):
        with pytest.raises(ValueError, match=msg):
            rj.rollout(rj.midpoint_step, body, state, 0.01, 5, **kw)
    with pytest.raises(ValueError, match="no discrete adjoint"):
        rj.rollout(lambda *a: rj.midpoint_step(*a), body, state, 0.01, 5, adjoint="discrete")
    with pytest.raises(TypeError):  # reverse mode only, as for any custom_vjp
        jax.jvp(
            lambda w: (
                rj.rollout(
                    rj.midpoint_step, body, rj.RigidBodyState(angular_velocity=w), 0.01, 5, adjoint="discrete"
                ).states.angular_velocity
            ),
            (w0[0],),
            (w0[0],),
        )
