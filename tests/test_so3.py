"""SO(3) maths: identities checked against independent constructions (Rodrigues, scipy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.transform import Rotation

from rigidjax import so3

vec3 = st.lists(st.floats(-4.0, 4.0, allow_nan=False), min_size=3, max_size=3)


def _rodrigues(phi):
    # independent truth: Rodrigues' formula for the rotation matrix of a rotation vector
    phi = np.asarray(phi, float)
    th = np.linalg.norm(phi)
    if th < 1e-12:
        return np.eye(3)
    k = phi / th
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + np.sin(th) * K + (1 - np.cos(th)) * K @ K


@settings(max_examples=40, deadline=None)
@given(vec3)
def test_exp_matches_rodrigues(phi):
    R = np.asarray(so3.to_matrix(so3.exp(jnp.asarray(phi))))
    np.testing.assert_allclose(R, _rodrigues(phi), atol=1e-12)  # round-off of O(1) entries


@settings(max_examples=40, deadline=None)
@given(vec3)
def test_log_exp_round_trip(phi):
    phi = np.asarray(phi)
    q = so3.exp(jnp.asarray(phi))
    # exp(log(q)) == q up to sign; log gives the angle in [0, pi]
    q2 = so3.exp(so3.log(q))
    assert float(so3.angle_between(q, q2)) < 1e-7  # angle_between ~ sqrt(round-off) near 0
    assert float(jnp.linalg.norm(so3.log(q))) <= np.pi + 1e-12


def test_matches_scipy_conventions():
    rng = np.random.default_rng(0)
    r = Rotation.random(5, random_state=1)
    xyzw = r.as_quat()
    q = jnp.asarray(np.concatenate([xyzw[:, 3:], xyzw[:, :3]], 1))  # scipy is scalar-last
    v = rng.normal(size=(5, 3))
    np.testing.assert_allclose(so3.rotate(q, v), r.apply(v), atol=1e-13)
    np.testing.assert_allclose(so3.to_matrix(q), r.as_matrix(), atol=1e-13)
    np.testing.assert_allclose(so3.to_matrix(so3.from_matrix(r.as_matrix())), r.as_matrix(), atol=1e-13)
    # product composes matrices: R(p q) = R(p) R(q)
    p = q[::-1]
    np.testing.assert_allclose(so3.to_matrix(so3.multiply(p, q)), so3.to_matrix(p) @ so3.to_matrix(q), atol=1e-13)
    # Tait-Bryan xyz (intrinsic x, y, z) is scipy's "XYZ"
    np.testing.assert_allclose(
        so3.to_matrix(so3.from_tait_bryan_xyz(jnp.asarray(r.as_euler("XYZ")))), r.as_matrix(), atol=1e-13
    )
    np.testing.assert_allclose(so3.to_tait_bryan_xyz(q), r.as_euler("XYZ"), atol=1e-12)


def test_hat_vee():
    w, v = jnp.array([0.3, -1.2, 2.0]), jnp.array([1.0, 0.5, -0.7])
    np.testing.assert_allclose(so3.hat(w) @ v, jnp.cross(w, v), atol=1e-15)
    np.testing.assert_allclose(so3.vee(so3.hat(w)), w, atol=1e-15)


@pytest.mark.parametrize("name", ["zero", "half_turn", "generic"])
def test_gradients_finite_at_singular_points(name):
    phi = {"zero": jnp.zeros(3), "half_turn": jnp.array([np.pi, 0.0, 0.0]), "generic": jnp.array([0.2, -0.1, 0.4])}[
        name
    ]
    funcs = [
        lambda p: so3.exp(p).sum(),
        lambda p: so3.log(so3.exp(p)).sum(),
        lambda p: so3.angle(so3.exp(p)),
        lambda p: so3.to_tait_bryan_xyz(so3.exp(p)).sum(),
        lambda p: so3.rotate(so3.exp(p), jnp.array([1.0, 2.0, 3.0])).sum(),
    ]
    for f in funcs:
        g = jax.grad(f)(phi)
        assert np.all(np.isfinite(g)), (name, g)


def test_gimbal_lock_no_nan():
    q = so3.from_tait_bryan_xyz(jnp.array([0.3, np.pi / 2, 0.2]))
    a = so3.to_tait_bryan_xyz(q)
    assert np.all(np.isfinite(a))
    # the rotation is reproduced even though the split between phi0 and phi2 is conventional
    assert float(so3.angle_between(so3.from_tait_bryan_xyz(a), q)) < 1e-6
    assert np.all(np.isfinite(jax.jacfwd(lambda qq: so3.to_tait_bryan_xyz(qq))(q)))


def test_g_matrices_give_angular_velocity():
    # q_dot = q ⊗ (0, w_body)/2 is the kinematics; G_body q_dot must return w_body,
    # G_world q_dot must return R w_body (independent: quaternion kinematics, Sola 2017 eq. 107)
    q = so3.exp(jnp.array([0.4, -0.3, 1.1]))
    w = jnp.array([0.7, -2.0, 0.3])
    qdot = 0.5 * so3.multiply(q, jnp.concatenate([jnp.zeros(1), w]))
    np.testing.assert_allclose(so3.g_matrix_body(q) @ qdot, w, atol=1e-14)
    np.testing.assert_allclose(so3.g_matrix_world(q) @ qdot, so3.rotate(q, w), atol=1e-14)


def test_dtype_follows_input():
    phi = jnp.array([0.1, 0.2, 0.3], jnp.float32)
    assert so3.exp(phi).dtype == jnp.float32
    assert so3.log(so3.exp(phi)).dtype == jnp.float32
    assert so3.to_tait_bryan_xyz(so3.exp(phi)).dtype == jnp.float32


@pytest.mark.parametrize("offset", [-1e-7, 0.0, 1e-7], ids=["below", "at", "above"])
def test_log_derivative_at_a_half_turn(offset):
    """``log(exp(v))`` is ``v`` below a half turn and the antipodal vector ``v - 2 pi v/|v|``
    above it: along the axis its derivative is 1 on both sides and at the half turn itself
    (jaxlie's constant factor there gave 0). Checked against the closed form and a central
    difference along the axis (step 1e-8 rad, inside the 1e-7 offset; the round trip's
    round-off / h ~ 3e-8). An attitude-error loss ``|log(exp(v))|^2`` has the gradient
    ``2 log`` along the axis (its closed form) at all three points."""
    a = np.pi + offset
    v = jnp.array([a, 0.0, 0.0])
    J = np.asarray(jax.jacfwd(lambda p: so3.log(so3.exp(p)))(v))
    np.testing.assert_allclose(J[:, 0], [1.0, 0.0, 0.0], atol=1e-9)
    side = 1.0 if a <= np.pi else -1.0  # transverse: identity below, -1 (antipode) above
    np.testing.assert_allclose(np.diag(J)[1:], [side, side], atol=1e-6)
    if offset:  # at exactly pi a central difference straddles the antipodal jump
        h = 1e-8
        fd = (so3.log(so3.exp(v.at[0].add(h / 2)))[0] - so3.log(so3.exp(v.at[0].add(-h / 2)))[0]) / h
        assert float(fd) == pytest.approx(1.0, abs=1e-6)
    loss = lambda p: jnp.sum(so3.log(so3.exp(p)) ** 2)  # noqa: E731
    g = np.asarray(jax.grad(loss)(v))
    np.testing.assert_allclose(g, 2 * np.asarray(so3.log(so3.exp(v))), atol=1e-9)
