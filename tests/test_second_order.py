"""Second derivatives of rollouts: every composition of forward and reverse mode, every
stepper, its fast (structure-of-arrays) path and its generic path, with respect to the
initial state and a model parameter together.

Independent truth: central differences of the gradient. The four compositions must also
agree with each other (they are computed by different code: forward mode through the
steps' custom JVP rules, reverse over reverse through the primal Newton solve's implicit
derivative, see ``rigidjax.newton.custom_root``).

Tolerances (float64): the compositions agree to 1e-9 relative to the largest entry (round-off
through two linear solves per step, and the Newton solves' own tolerance ~eps^(2/3) ~ 4e-11);
central differences with h = 1e-5 carry O(h^2) ~ 1e-10 truncation and ~eps |g| / h ~ 1e-11
round-off, checked at 1e-7.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj
from rigidjax import euler_parameters as ep
from rigidjax import systems
from rigidjax.variational import vi_state, vi_step

MODES = {
    "hessian (fwd over rev)": jax.hessian,
    "rev over rev": lambda f: jax.jacrev(jax.jacrev(f)),
    "rev over fwd": lambda f: jax.jacrev(jax.jacfwd(f)),
    "fwd over fwd": lambda f: jax.jacfwd(jax.jacfwd(f)),
}


def _generic(step):
    """The same step, unrecognisable to rollout's fast-path dispatch (a plain scan of it)."""
    return lambda model, state, load, dt: step(model, state, load, dt)


def _body(i2):
    return rj.RigidBody(
        1.3,
        jnp.diag(jnp.stack([jnp.ones_like(i2), i2, 2.5 * jnp.ones_like(i2)])),
        resistance=0.05 * jnp.eye(6),
        gravity=jnp.array([0.0, 0.0, -9.81]),
    )


def _midpoint(step):
    def f(p):  # p = (omega_0 (3), I_yy)
        s0 = rj.RigidBodyState(angular_velocity=p[:3], velocity=jnp.array([0.2, 0.0, 0.1]))
        tr = rj.rollout(step, _body(p[3]), s0, 0.05, 3)
        return jnp.sum(tr.states.angular_velocity[-1] * jnp.array([1.0, -2.0, 0.5])) + tr.states.orientation[-1, 1]

    return f


def _ep(step):
    def f(p):
        model = ep.EPModel(_body(p[3]))
        s0 = ep.initial_state(model, angular_velocity=p[None, :3], velocity=jnp.array([[0.2, 0.0, 0.1]]))
        tr = rj.rollout(step, model, s0, 0.05, 2)
        return jnp.sum(tr.states.velocities[-1, 0, 3:] * jnp.arange(1.0, 5.0)) + tr.states.coordinates[-1, 0, 0]

    return f


def _vi_body(step):
    def f(p):
        system = systems.rigid_body(_body(p[3]))
        s0 = systems.rigid_body_vi_state(system, rj.RigidBodyState(angular_velocity=p[:3]), check=False)
        tr = rj.rollout(step, system, s0, 0.05, 2)
        return jnp.sum(tr.states.q[-1, 3:] * jnp.arange(1.0, 5.0))

    return f


def _vi_pendulum(step):
    def f(p):  # p = (theta_0, theta_dot_0, damping)
        pend = systems.pendulum(length=1.2, damping=p[2])
        tr = rj.rollout(step, pend, vi_state(pend, p[:1], p[1:2], check=False), 0.1, 3)
        return tr.states.q[-1, 0] + 0.3 * tr.states.p[-1, 0]

    return f


CASES = {
    "midpoint fast": (_midpoint(rj.midpoint_step), [0.3, 2.0, -0.5, 2.0]),
    "midpoint generic": (_midpoint(_generic(rj.midpoint_step)), [0.3, 2.0, -0.5, 2.0]),
    "ep fast": (_ep(ep.ep_step), [0.3, 2.0, -0.5, 2.0]),
    "ep generic": (_ep(_generic(ep.ep_step)), [0.3, 2.0, -0.5, 2.0]),
    "vi fast": (_vi_body(vi_step), [0.3, 2.0, -0.5, 2.0]),
    "vi generic": (_vi_pendulum(vi_step), [1.0, 0.5, 0.1]),
}


# the fast set: the midpoint fast path (the materialize primitive) and a Newton stepper (the
# implicit derivative through reverse over reverse) in two modes, jax.hessian and reverse over
# reverse (~1 min of compile); their other two modes and the other cases are compile time
# only (2-8 min per case: the Euler-parameter and free-body variational fast paths' Hessians
# are 50,000-line XLA programs), so slow
SLOW = {"midpoint generic", "ep fast", "ep generic", "vi fast"}
FAST_MODES = ("hessian (fwd over rev)", "rev over rev")


def _params():
    for c in CASES:
        if c in SLOW:
            yield pytest.param(c, tuple(MODES), marks=pytest.mark.slow, id=f"{c}-all modes")
        else:
            yield pytest.param(c, FAST_MODES, id=f"{c}-hessian, rev over rev")
            others = ("hessian (fwd over rev)",) + tuple(m for m in MODES if m not in FAST_MODES)
            yield pytest.param(c, others, marks=pytest.mark.slow, id=f"{c}-other modes")


@pytest.mark.parametrize("case, modes", list(_params()))
def test_second_derivatives_agree_in_every_mode_and_with_differences(case, modes):
    f, p = CASES[case]
    p = jnp.asarray(p, jnp.float64)
    hs = {name: np.asarray(jax.jit(MODES[name](f))(p)) for name in modes}
    ref = hs["hessian (fwd over rev)"]
    scale = np.max(np.abs(ref))
    assert np.all(np.isfinite(ref)) and scale > 0
    for name, h in hs.items():
        np.testing.assert_allclose(h, ref, rtol=0, atol=1e-9 * scale, err_msg=f"{case}: {name} vs jax.hessian")
    g = jax.jit(jax.grad(f))
    e = 1e-5
    fd = np.stack([(np.asarray(g(p.at[i].add(e))) - np.asarray(g(p.at[i].add(-e)))) / (2 * e) for i in range(p.size)])
    np.testing.assert_allclose(
        ref, fd, rtol=0, atol=1e-7 * scale, err_msg=f"{case}: jax.hessian vs central differences"
    )
    # and symmetric, as a Hessian is
    np.testing.assert_allclose(ref, ref.T, rtol=0, atol=1e-9 * scale)


@pytest.mark.slow  # ~1 min of compile
def test_second_derivatives_through_the_discrete_adjoint():
    """``adjoint="discrete"`` (a ``custom_vjp`` whose backward sweep is written by hand):
    reverse over reverse and forward over reverse equal the autodiff Hessian."""

    def f(p, adjoint):
        s0 = rj.RigidBodyState(angular_velocity=p[:3], velocity=jnp.array([0.2, 0.0, 0.1]))
        tr = rj.rollout(rj.midpoint_step, _body(p[3]), s0, 0.05, 3, adjoint=adjoint)
        return jnp.sum(tr.states.angular_velocity[-1] * jnp.array([1.0, -2.0, 0.5])) + tr.states.orientation[-1, 1]

    p = jnp.asarray([0.3, 2.0, -0.5, 2.0])
    ref = np.asarray(jax.hessian(lambda p: f(p, None))(p))
    scale = np.max(np.abs(ref))
    for name, mode in (("hessian", jax.hessian), ("rev over rev", MODES["rev over rev"])):
        h = np.asarray(jax.jit(mode(lambda p: f(p, "discrete")))(p))
        np.testing.assert_allclose(h, ref, rtol=0, atol=1e-9 * scale, err_msg=name)


def test_custom_root_value_is_the_iterate_and_derivatives_are_implicit():
    """``rigidjax.newton.custom_root`` on x^3 + theta x - a = 0, solved by a Newton
    ``while_loop`` inside a scan: the value is the Newton iterate bit for bit, and the first
    and second derivatives in theta, in all four compositions, are the implicit function's
    closed forms x' = -x / (3 x^2 + theta), x'' = -(6 x x'^2 + 2 x') / (3 x^2 + theta)."""
    from rigidjax.newton import custom_root

    def newton(F, x0):
        def body(c):
            x, k = c
            return x - F(x) / jax.grad(F)(x), k + 1

        x, k = jax.lax.while_loop(lambda c: (c[1] < 30) & (jnp.abs(F(c[0])) > 1e-15), body, (x0, 0))
        return x, k.astype(x.dtype)

    def root(theta, a=2.0):
        F = lambda x: x**3 + theta * x - a  # noqa: E731
        return custom_root(F, jnp.asarray(1.0, jnp.float64), newton, lambda g, y: y / g(1.0))[0]

    def in_scan(theta):  # the same root, reached inside lax.scan (where reverse mode inlines it)
        return jax.lax.scan(lambda c, _: (root(theta), None), jnp.float64(0.0), None, length=1)[0]

    theta = jnp.float64(0.7)
    x = float(jax.jit(in_scan)(theta))
    ref_x, _ = newton(lambda x: x**3 + theta * x - 2.0, jnp.asarray(1.0, jnp.float64))
    assert x == float(ref_x)
    d1 = -x / (3 * x * x + 0.7)
    d2 = -(6 * x * d1 * d1 + 2 * d1) / (3 * x * x + 0.7)
    assert float(jax.grad(in_scan)(theta)) == pytest.approx(d1, rel=1e-14)
    for name, mode in MODES.items():
        assert float(mode(in_scan)(theta)) == pytest.approx(d2, rel=1e-13), name


def test_the_primitives_transpose_and_take_mixed_precisions():
    """``materialize`` is the identity and ``derivative_only`` the zero map as linear maps
    (``jax.linear_transpose``), and ``materialize`` takes float widths side by side."""
    from rigidjax.numerics import derivative_only, materialize

    x = jnp.arange(3.0)
    (t,) = jax.jit(jax.linear_transpose(lambda u: materialize(u, 2 * u)[1] + derivative_only(u), x))(jnp.ones(3))
    np.testing.assert_array_equal(t, 2 * np.ones(3))
    a, b, i = jax.jit(materialize)(jnp.ones(3, jnp.float32), jnp.full(3, -0.0, jnp.float16), jnp.arange(3))
    assert (a.dtype, b.dtype, i.dtype) == (jnp.float32, jnp.float16, jnp.arange(3).dtype)
    assert np.all(np.signbit(np.asarray(b))) and np.array_equal(np.asarray(i), np.arange(3))
