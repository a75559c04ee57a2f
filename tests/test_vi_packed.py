"""rollout's structure-of-arrays fast path for the variational step on a free rigid body.

``rollout(vi_step, systems.rigid_body(body), ...)`` runs :meth:`rigidjax.MidpointVI.packed`'s
step (closed-form DEL residual and Newton matrix on per-coordinate arrays,
:func:`rigidjax.linalg.solve_components`). Checked here: (1) it is the public step (a plain
``lax.scan`` of ``vi_step``, whose Newton matrix is ``jax.jacfwd`` of ``jax.grad`` of the
discrete Lagrangian: an independent derivation) iterate for iterate, with coupled resistance,
gravity and wrench inputs; (2) failure semantics per ensemble member; (3) reverse-mode
gradients in the body's parameters against central differences; (4) only free bodies are
packed. The exact torque-free motion, the momentum map and the constraint are checked through
the same path in ``tests/test_variational.py::test_free_rigid_body_vs_exact_elliptic_solution``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax import systems
from rigidjax.info import Status
from rigidjax.stepper import packed_form
from rigidjax.variational import vi_step

N_STEPS = 40
DT = 0.01


def _body(resistance_scale=0.1):
    rng = np.random.default_rng(0)
    A = rng.normal(size=(6, 6))
    return rj.RigidBody(
        2.0,
        jnp.array([[1.5, 0.1, 0.0], [0.1, 2.0, 0.05], [0.0, 0.05, 3.0]]),
        resistance=jnp.asarray(resistance_scale * (A @ A.T)),  # full 6x6: couples v and omega
        gravity=jnp.array([0.0, 0.0, -9.81]),
    )


def _states(system, n_members=3):
    rng = np.random.default_rng(1)
    s = rj.RigidBodyState(
        angular_velocity=jnp.asarray(2 * rng.normal(size=(n_members, 3))),
        orientation=rj.so3.normalize(jnp.asarray(rng.normal(size=(n_members, 4)))),
        velocity=jnp.asarray(rng.normal(size=(n_members, 3))),
        position=jnp.zeros((n_members, 3)),
        time=jnp.zeros(n_members),
    )
    return jax.vmap(lambda x: systems.rigid_body_vi_state(system, x, check=False))(s)


def _scan(step, system, s0, loads):
    """The public step in a plain scan (no fast path)."""

    def body(s, u):
        s1, info = step(system, s, u, DT)
        return s1, (s1, info)

    return jax.lax.scan(body, s0, loads)[1]


@pytest.mark.parametrize("split", ["symmetric", pytest.param("left", marks=pytest.mark.slow)])  # slow: ~20 s of compile
def test_packed_step_is_vi_step_iterate_for_iterate(split):
    system = systems.rigid_body(_body())
    st = _states(system)
    loads = jnp.asarray(np.random.default_rng(2).normal(size=(N_STEPS, 6)))
    step = functools.partial(vi_step, forcing_split=split)
    ref, ref_info = jax.jit(jax.vmap(lambda s: _scan(step, system, s, loads)))(st)
    tr = jax.jit(jax.vmap(lambda s: rj.rollout(step, system, s, DT, N_STEPS, loads)))(st)
    assert bool(jnp.all(ref_info.status == Status.SUCCESS))
    # same Newton iterates: equal counts and statuses
    np.testing.assert_array_equal(tr.info.iterations, ref_info.iterations)
    np.testing.assert_array_equal(tr.info.status, ref_info.status)
    # round-off of two evaluation orders of one residual, grown over 40 steps; momenta ~10 kg m^2/s
    for name, tol in (("q", 1e-12), ("p", 1e-11), ("lam", 1e-11), ("qdot", 1e-11)):
        np.testing.assert_allclose(getattr(tr.states, name)[:, 1:], getattr(ref, name), rtol=0, atol=tol, err_msg=name)
    np.testing.assert_allclose(tr.info.rotation, ref_info.rotation, rtol=1e-12, atol=1e-15)
    # the DEL residual at the solution: both at solver tolerance (eps^(2/3) ~ 4e-11 on the update)
    assert float(jnp.max(tr.info.residual)) < 1e-9


def test_packed_failures_are_per_member_and_return_the_input_state():
    system = systems.rigid_body(_body(0.0))
    st = _states(system, 2)
    loads = jnp.zeros((N_STEPS, 2, 6)).at[10, 1, 4].set(jnp.nan)  # member 1: NaN torque at step 10
    run = jax.jit(lambda s, u: rj.rollout(vi_step, system, s, DT, N_STEPS, u))
    tr = run(st, loads)
    clean = run(st, jnp.zeros_like(loads))
    status = np.asarray(tr.info.status)
    assert (status[:, 0] == Status.SUCCESS).all()
    assert (status[:10, 1] == Status.SUCCESS).all() and (status[10:, 1] == Status.NONFINITE).all()
    # member 0 untouched by member 1's failure (exactly: members never mix)
    np.testing.assert_array_equal(tr.states.q[:, 0], clean.states.q[:, 0])
    # member 1 frozen at its last good state, which is the clean run's
    np.testing.assert_array_equal(tr.states.q[11:, 1], np.broadcast_to(clean.states.q[10, 1], (N_STEPS - 10, 7)))
    np.testing.assert_array_equal(tr.states.q[:11, 1], clean.states.q[:11, 1])
    assert np.isfinite(np.asarray(tr.states.p)).all()


@pytest.mark.slow  # ~15 s of compile
def test_packed_max_iterations_returns_the_input_state():
    system = systems.rigid_body(_body(0.0))
    st = _states(system, 2)
    # one Newton iteration cannot meet the tolerance: MAX_ITERATIONS, input state returned
    one = jax.jit(lambda s: rj.rollout(functools.partial(vi_step, max_iterations=1), system, s, DT, 3))(st)
    assert (np.asarray(one.info.status) == Status.MAX_ITERATIONS).all()
    assert (np.asarray(one.info.iterations[0]) == 1).all()  # later steps: frozen members do not iterate
    np.testing.assert_array_equal(one.states.q[-1], st.q)


@pytest.mark.slow  # ~40 s: the reverse-mode compile
def test_packed_gradient_in_body_parameters_matches_central_differences():
    jax.config.update("jax_enable_x64", True)
    st = _states(systems.rigid_body(_body()), 2)

    def loss(theta):
        # inertia diagonal, one resistance entry coupling v_x and omega_y, the mass
        base = _body()
        R = base.resistance.at[0, 4].add(theta[3]).at[4, 0].add(theta[3])
        body = rj.RigidBody(
            theta[4],
            jnp.diag(theta[:3]) + (base.inertia - jnp.diag(jnp.diag(base.inertia))),
            resistance=R,
            gravity=base.gravity,
        )
        system = systems.rigid_body(body)
        tr = rj.rollout(vi_step, system, st, DT, 25)
        w = systems.rigid_body_state(system, jax.tree_util.tree_map(lambda a: a[-1], tr.states)).angular_velocity
        return jnp.sum(w * jnp.array([1.0, -2.0, 0.5])) + jnp.sum(tr.states.q[-1, :, :3] ** 2)

    theta = jnp.array([1.5, 2.0, 3.0, 0.02, 2.0])
    g = jax.jit(jax.grad(loss))(theta)
    f = jax.jit(loss)
    h = 1e-6  # central differences: truncation ~h^2, round-off ~eps/h ~ 1e-10 relative
    fd = np.array([(f(theta.at[i].add(h)) - f(theta.at[i].add(-h))) / (2 * h) for i in range(5)])
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-6, atol=1e-8)


def test_only_free_rigid_bodies_take_the_packed_path():
    body = _body(0.0)
    assert packed_form(vi_step, systems.rigid_body(body)) is not None
    assert (
        packed_form(functools.partial(vi_step, forcing_split="symmetric", max_iterations=5), systems.rigid_body(body))
        is not None
    )
    assert packed_form(vi_step, systems.rigid_body(body, pivot_to_com=[0.0, 0.0, 0.3])) is None
    assert packed_form(vi_step, systems.pendulum()) is None
    assert packed_form(rj.midpoint_step, systems.rigid_body(body)) is None
    with pytest.raises(ValueError, match="forcing_split"):
        packed_form(functools.partial(vi_step, forcing_split="right"), systems.rigid_body(body))


@pytest.mark.slow  # ~33 s of float32 compile (CI budget); tests/test_variational.py checks float32 on the generic path
def test_packed_step_follows_the_state_dtype():
    # float64 model (Python floats under x64), float32 state: vi_step computes in float32; so must the fast path
    system = systems.rigid_body(rj.RigidBody(mass=1.0, inertia=[1.0, 2.0, 3.0]))
    st = systems.rigid_body_vi_state(
        system, rj.RigidBodyState(angular_velocity=jnp.array([0.3, 3.0, 0.2], jnp.float32))
    )
    one, _ = vi_step(system, st, None, 0.01)
    tr = rj.rollout(vi_step, system, st, 0.01, 1)
    assert tr.states.q.dtype == jnp.float32
    np.testing.assert_array_equal(tr.states.q[-1], one.q)  # the same float32 iterates (observed bit-equal)


@pytest.mark.slow  # ~60 s: two reverse-mode compiles
def test_packed_gradients_symmetric_in_inertia_and_finite_despite_a_failed_member():
    jax.config.update("jax_enable_x64", True)
    I0 = jnp.array([[1.5, 0.1, 0.0], [0.1, 2.0, 0.05], [0.0, 0.05, 3.0]])
    body = _body()
    st = _states(systems.rigid_body(body), 4)
    loads = jnp.zeros((10, 4, 6)).at[5, 1, 3].set(jnp.nan)  # member 1 fails at step 5

    def loss(inertia, mass):
        system = systems.rigid_body(rj.RigidBody(mass, inertia, resistance=body.resistance, gravity=body.gravity))
        q = rj.rollout(vi_step, system, st, DT, 10, loads).states.q[-1]
        return jnp.sum(q[jnp.array([0, 2, 3])] * jnp.arange(7.0))  # the healthy members only

    gI, gm = jax.jit(jax.grad(loss, argnums=(0, 1)))(I0, 2.0)
    # inertia enters through its symmetric part (as autodiff of 1/2 omega.I omega): a symmetric gradient
    np.testing.assert_allclose(gI, gI.T, rtol=0, atol=1e-14)
    # the failed member's NaN load must not reach the shared parameters' gradient
    f = jax.jit(loss)
    h = 1e-6  # central differences: truncation ~h^2, round-off ~eps/h
    fd_m = (f(I0, 2.0 + h) - f(I0, 2.0 - h)) / (2 * h)
    E = jnp.zeros((3, 3)).at[0, 1].set(1.0).at[1, 0].set(1.0)  # a symmetric perturbation of I_01
    fd_I = (f(I0 + h * E, 2.0) - f(I0 - h * E, 2.0)) / (2 * h)
    np.testing.assert_allclose(gm, fd_m, rtol=1e-6)
    np.testing.assert_allclose(gI[0, 1] + gI[1, 0], fd_I, rtol=1e-6, atol=1e-10)


def test_loads_of_the_wrong_ensemble_size_are_a_clear_error():
    # 3 members, loads for 2: named at the boundary (fast path and the public step alike),
    # not a broadcasting TypeError from inside the trace
    system = systems.rigid_body(_body())
    s0 = _states(system)
    bad = jnp.zeros((N_STEPS, 2, 6))
    with pytest.raises(ValueError, match=r"u has batch shape \(2,\) but the state has \(3,\)"):
        rj.rollout(vi_step, system, s0, DT, N_STEPS, loads=bad)
    with pytest.raises(ValueError, match=r"u has batch shape \(2,\) but the state has \(3,\)"):
        vi_step(system, s0, bad[0], DT)


def test_traced_dt_out_of_range_is_invalid_input_and_keeps_the_state():
    # rollout checks a concrete dt; a traced one (here vmapped per member) is flagged per step
    system = systems.rigid_body(_body())
    s0 = _states(system)
    run = jax.jit(jax.vmap(lambda s, dt: rj.rollout(vi_step, system, s, dt, 3)))
    tr = run(s0, jnp.array([DT, -DT, jnp.nan]))
    st = np.asarray(tr.info.status)
    assert np.all(st[0] == Status.SUCCESS) and np.all(st[1:] == Status.INVALID_INPUT)
    np.testing.assert_array_equal(np.asarray(tr.states.q[1:, -1]), np.asarray(s0.q[1:]))
