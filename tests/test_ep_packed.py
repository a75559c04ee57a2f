"""rollout's structure-of-arrays fast path for the Euler-parameter step (free bodies).

``rollout(ep_step, ...)`` on a model of free bodies runs
:meth:`rigidjax.GeneralizedAlphaEP.packed`'s step (Newton matrix assembled entry by entry,
:func:`rigidjax.linalg.solve_components`). Checked here: (1) it is the public step (a plain
``lax.scan`` of ``ep_step``, the autodiff-Jacobian implementation) iterate for iterate, in every
option; (2) against the exact torque-free motion (Jacobi elliptic functions) at second order;
(3) failure semantics per ensemble member; (4) reverse-mode gradients against central
differences; (5) only ep_step on free-body models is packed (joints take the general path).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax import euler_parameters as ep
from rigidjax.info import Status
from rigidjax.reference import torque_free_omega
from rigidjax.stepper import packed_form


def _scan(step, model, s0, dt, n, loads=None):
    """The public step in a plain scan (no fast path)."""

    def body(s, k):
        s1, info = step(model, s, None if loads is None else loads[k], dt)
        return s1, (s1, info)

    _, (states, info) = jax.lax.scan(body, s0, jnp.arange(n))
    return states, info


def _two_bodies(euler_constraint="position"):
    R = np.diag([0.1, 0.2, 0.3, 0.01, 0.02, 0.03])
    R[0, 4] = R[4, 0] = 0.005  # couples translation and rotation
    body = rj.RigidBody(
        mass=jnp.array([1.0, 2.0]),
        inertia=jnp.array([np.diag([1.0, 2.0, 3.0]), np.diag([2.0, 2.5, 1.0])]),
        resistance=R,
        gravity=jnp.array([0.0, 0.0, -9.81]),
    )
    model = ep.EPModel(body, euler_constraint=euler_constraint)
    s0 = ep.initial_state(
        model,
        angular_velocity=jnp.array([[0.01, 2.0, 0.0], [1.0, -3.0, 0.5]]),
        velocity=jnp.array([[1.0, 0, 0], [0, 1.0, 2.0]]),
    )
    return model, s0


CASES = [
    ("position", {}),
    pytest.param("velocity", {}, marks=pytest.mark.slow),  # slow: ~11 s of compile each
    ("position", {"stabilized": False, "torque_frame": "world"}),
    pytest.param("position", {"scheme": ep.newmark(), "max_rotation": 0.02}, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("euler_constraint,options", CASES)
def test_packed_rollout_is_the_step_iterate_for_iterate(euler_constraint, options):
    model, s0 = _two_bodies(euler_constraint)
    assert packed_form(functools.partial(ep.ep_step, **options), model) is not None
    step = functools.partial(ep.ep_step, **options)
    n, dt = 120, 1e-2
    loads = jnp.asarray(np.random.default_rng(0).normal(size=(n, 2, 6)))
    tr = jax.jit(lambda s: rj.rollout(step, model, s, dt, n, loads=loads))(s0)
    states, info = jax.jit(lambda s: _scan(step, model, s, dt, n, loads))(s0)
    for a, b in zip(jax.tree_util.tree_leaves(tr.states), jax.tree_util.tree_leaves(states)):
        # same operations up to their order (round-off, ~1e-16 relative, grows over 120 steps
        # of a damped, driven motion; multipliers of the unstabilized form carry 1/h^2)
        scale = max(1.0, float(jnp.max(jnp.abs(b))))
        np.testing.assert_allclose(np.asarray(a[1:]) / scale, np.asarray(b) / scale, atol=1e-10, rtol=0)
    np.testing.assert_array_equal(tr.info.iterations, info.iterations)
    np.testing.assert_array_equal(tr.info.status, info.status)
    if options.get("max_rotation") == 0.02:
        assert np.any(np.asarray(tr.info.status) == Status.ROTATION_LIMIT)  # the flag is exercised


INERTIA = np.array([1.0, 2.0, 3.0])
W0 = np.array([[0.01, 2.0, 0.0], [0.3, 1.0, -0.7]])  # near the separatrix and a generic spin


def _elliptic_error(dt, T=2.0):
    """Max error of the final body rates of a packed 2-member ensemble against the exact
    torque-free motion (rigidjax.reference, Jacobi elliptic functions)."""
    body = rj.RigidBody(mass=1.0, inertia=jnp.diag(jnp.asarray(INERTIA)))
    model = ep.EPModel(body)
    states0 = jax.vmap(lambda w: ep.initial_state(model, angular_velocity=w[None]))(jnp.asarray(W0))
    n = int(round(T / dt))
    tr = jax.jit(jax.vmap(lambda s: rj.rollout(ep.ep_step, model, s, dt, n, save_every=n)))(states0)
    assert np.all(np.asarray(tr.info.converged))
    x = model.reference + tr.states.coordinates[:, -1]
    w = jnp.einsum("bnij,bnj->bni", rj.so3.g_matrix_body(x[..., 3:]), tr.states.velocities[:, -1, :, 3:])[:, 0]
    exact = np.stack([torque_free_omega(INERTIA, W0[i], np.array([n * dt]))[0] for i in range(2)])
    return float(np.max(np.abs(np.asarray(w) - exact)))


@pytest.mark.slow  # ~27 s; tests/test_euler_parameters.py's elliptic order test runs rollout's packed path too
def test_packed_ensemble_matches_elliptic_solution():
    # measured 1.9e-6 at dt = 2 ms over 2 s (second order: 7.5e-6 at 4 ms, 4.7e-7 at 1 ms; see
    # the slow order test); 4e-6 leaves room for platform round-off, far below what a wrong
    # term would leave (O(1e-2))
    assert _elliptic_error(2e-3) < 4e-6


@pytest.mark.slow
def test_packed_ensemble_converges_at_second_order():
    errs = np.array([_elliptic_error(dt) for dt in (4e-3, 2e-3, 1e-3)])
    orders = np.log2(errs[:-1] / errs[1:])
    # generalized-alpha is second order: halving dt quarters the error (log2 ratio 2; 1.8 allows
    # the O(dt^3) remainder at these step sizes)
    assert np.all(orders > 1.8), (errs, orders)


def test_packed_failures_are_per_member_and_keep_the_input_state():
    body = rj.RigidBody(mass=1.0, inertia=jnp.diag(jnp.array([1.0, 2.0, 3.0])))
    model = ep.EPModel(body)
    s0 = ep.initial_state(model, angular_velocity=jnp.array([[0.01, 2.0, 0.0]]))
    states0 = jax.tree_util.tree_map(lambda a: jnp.stack([a, a, a, a, a]), s0)
    n = 6
    loads = jnp.zeros((5, n, 1, 6)).at[1, 2, 0, 4].set(jnp.nan)  # member 1: NaN torque at step 2
    # members 3, 4: a traced dt out of range (not checked at the boundary): INVALID_INPUT
    dts = jnp.array([1e-3, 1e-3, 1e-3, -1e-3, jnp.nan])
    run = jax.jit(jax.vmap(lambda s, w, dt: rj.rollout(ep.ep_step, model, s, dt, n, loads=w)))
    tr = run(states0, loads, dts)
    st = np.asarray(tr.info.status)
    assert np.all(st[0] == Status.SUCCESS) and np.all(st[2] == Status.SUCCESS)
    assert np.all(st[1, :2] == Status.SUCCESS) and np.all(st[1, 2:] == Status.NONFINITE)
    assert np.all(st[3:] == Status.INVALID_INPUT)
    np.testing.assert_array_equal(
        np.asarray(tr.states.coordinates[3:]), np.broadcast_to(s0.coordinates, (2, n + 1, 1, 7))
    )
    with pytest.raises(ValueError, match=r"must have shape \(nb, 7\).*vmap"):  # a batched state: vmap instead
        rj.rollout(ep.ep_step, model, states0, 1e-3, n)
    # the failed member keeps its last good state (after step 2, i.e. index 2) for the rest
    q = np.asarray(tr.states.coordinates)
    assert np.all(np.isfinite(q))
    np.testing.assert_array_equal(q[1, 3:], np.broadcast_to(q[1, 2], q[1, 3:].shape))
    np.testing.assert_array_equal(q[0], q[2])  # the others are unaffected (identical members)


@pytest.mark.slow  # ~8 s of compile; CI budget
def test_packed_max_iterations_keeps_the_input_state():
    body = rj.RigidBody(mass=1.0, inertia=jnp.diag(jnp.array([1.0, 2.0, 3.0])))
    model = ep.EPModel(body)
    s0 = ep.initial_state(model, angular_velocity=jnp.array([[0.01, 2.0, 0.0]]))
    # at dt = 0.1 one iteration (a Newton and a simplified-Newton update) cannot meet the tolerance
    tr1 = jax.jit(lambda s: rj.rollout(functools.partial(ep.ep_step, max_iterations=1), model, s, 0.1, 2))(s0)
    assert np.all(np.asarray(tr1.info.status) == Status.MAX_ITERATIONS)
    np.testing.assert_array_equal(np.asarray(tr1.states.coordinates[-1]), np.asarray(s0.coordinates))


@pytest.mark.slow  # ~50 s of compile; tests/test_euler_parameters.py checks a packed rollout's gradient too
def test_packed_gradient_matches_central_differences():
    s_w = jnp.array([[0.3, 2.0, -0.5]])

    def loss(i2, damping):
        R = jnp.diag(jnp.array([0.0, 0.0, 0.0, damping, damping, damping]))
        body = rj.RigidBody(mass=1.0, inertia=jnp.diag(jnp.stack([1.0, i2, 3.0])), resistance=R)
        model = ep.EPModel(body)
        s0 = ep.initial_state(model, angular_velocity=s_w)
        tr = rj.rollout(ep.ep_step, model, s0, 1e-2, 60)
        return jnp.sum(tr.states.velocities[-1] ** 2) + jnp.sum(tr.states.coordinates[-1, :, 3:] * jnp.arange(4.0))

    args = (2.0, 0.05)
    g = jax.jit(jax.grad(loss, argnums=(0, 1)))(*args)
    f = jax.jit(loss)
    for k, gk in enumerate(g):
        e = 1e-6
        up = list(args)
        dn = list(args)
        up[k] += e
        dn[k] -= e
        fd = (f(*up) - f(*dn)) / (2 * e)
        # central differences: O(e^2) truncation + round-off/e ~ 1e-9 relative
        np.testing.assert_allclose(float(gk), float(fd), rtol=1e-6, atol=1e-9)


def test_only_free_body_models_of_ep_step_are_packed():
    body = rj.RigidBody(mass=1.0, inertia=jnp.diag(jnp.array([1.0, 2.0, 3.0])), gravity=jnp.array([0.0, 0.0, -9.81]))
    model = ep.EPModel(body, constraints=[ep.SphericalJoint(0, [0.0, 0.0, 0.5])])
    assert packed_form(ep.ep_step, model) is None
    assert packed_form(rj.midpoint_step, ep.EPModel(body)) is None


def test_stepper_object_options():
    # defaults stated once, in the class; scheme=None is the default scheme
    default = ep.GeneralizedAlphaEP()
    assert default == ep.GeneralizedAlphaEP(scheme=None) == ep.GeneralizedAlphaEP(scheme=ep.generalized_alpha(0.9))
    assert rj.GeneralizedAlphaEP is ep.GeneralizedAlphaEP and ep.ep_step.stepper is ep.GeneralizedAlphaEP
    bound = functools.partial(ep.ep_step, stabilized=False)
    assert rj.stepper.as_stepper(bound) == ep.GeneralizedAlphaEP(stabilized=False)
    model = ep.EPModel(rj.RigidBody(mass=1.0, inertia=jnp.eye(3)))
    with pytest.raises(ValueError, match="torque_frame"):
        ep.GeneralizedAlphaEP(torque_frame="inertial")
    with pytest.raises(ValueError, match="max_iterations"):
        packed_form(functools.partial(ep.ep_step, max_iterations=0), model)
    assert packed_form(ep.GeneralizedAlphaEP(max_rotation=1.0), model) is not None
    unconstrained = ep.EPModel(rj.RigidBody(mass=1.0, inertia=jnp.eye(3)), euler_constraint="none")
    assert packed_form(default, unconstrained) is None
