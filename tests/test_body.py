"""RigidBody / RigidBodyState validation: bad input gets a clear error naming the argument."""

import jax.numpy as jnp
import numpy as np
import pytest

import rigidjax as rj


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(mass=0.0, inertia=[1, 2, 3]), "mass must be > 0"),
        (dict(mass=-1.0, inertia=[1, 2, 3]), "mass must be > 0"),
        (dict(mass=float("nan"), inertia=[1, 2, 3]), "mass contains NaN"),
        (dict(mass=1.0, inertia=[1, 2]), "inertia must have shape"),
        (dict(mass=1.0, inertia=[1, -2, 3]), "positive definite"),
        (dict(mass=1.0, inertia=[1, 1, 3]), "triangle inequality"),
        (dict(mass=1.0, inertia=[[1, 0.5, 0], [0, 2, 0], [0, 0, 2]]), "symmetric"),
        (dict(mass=1.0, inertia=[1, 2, float("nan")]), "inertia contains NaN"),
        (dict(mass=1.0, inertia=[1, 2, 2], resistance=np.eye(3)), "resistance must have shape"),
        (dict(mass=1.0, inertia=[1, 2, 2], gravity=[0, -9.81]), "gravity must have shape"),
    ],
)
def test_body_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rj.RigidBody(**kwargs)


def test_thin_disk_equality_case_is_accepted():
    # a thin disk: I3 = I1 + I2 exactly (a planar lamina) is physical
    b = rj.RigidBody(1.0, [0.25, 0.25, 0.5])
    np.testing.assert_allclose(b.principal_moments, [0.25, 0.25, 0.5])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(orientation=[0.0, 0.0, 0.0, 0.0]), "unit quaternion"),
        (dict(orientation=[1.0, 0.1, 0.0, 0.0]), "unit quaternion"),
        (dict(orientation=[1.0, 0.0, 0.0]), r"orientation must have shape \(…, 4\)"),
        (dict(position=[1.0, 2.0]), r"position must have shape \(…, 3\)"),
        (dict(angular_velocity=[1.0, float("nan"), 0.0]), "angular_velocity contains NaN"),
        (dict(velocity=[1.0, float("inf"), 0.0]), "velocity contains NaN or inf"),
    ],
)
def test_state_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rj.RigidBodyState(**kwargs)


def test_energy_and_momentum_definitions():
    body = rj.RigidBody(2.0, [1.0, 2.0, 2.5])
    s = rj.RigidBodyState(
        velocity=[1.0, 0.0, 0.0], angular_velocity=[0.0, 1.0, 0.0], orientation=[np.cos(0.5), 0, 0, np.sin(0.5)]
    )
    assert float(rj.kinetic_energy(body, s)) == pytest.approx(0.5 * 2 * 1 + 0.5 * 2 * 1)
    # body y-axis turned by 1 rad about world z: L_world = 2 * (-sin 1, cos 1, 0)
    np.testing.assert_allclose(rj.angular_momentum(body, s), [-2 * np.sin(1.0), 2 * np.cos(1.0), 0], atol=1e-14)
    np.testing.assert_allclose(rj.linear_momentum(body, s), [2.0, 0, 0])


def test_float32_thin_disk_accepted_and_one_dtype():
    # float32 round-off must not reject the equality case I3 = I1 + I2
    b = rj.RigidBody(np.float32(1), np.float32([0.1, 0.2, 0.3]))
    assert b.mass.dtype == b.inertia.dtype == b.resistance.dtype == b.gravity.dtype == jnp.float32


def test_body_fields_broadcast_to_one_ensemble_shape():
    b = rj.RigidBody([1.0, 2.0], [1.0, 2.0, 3.0])  # two bodies sharing the inertia
    assert b.inertia.shape == (2, 3, 3) and b.gravity.shape == (2, 3) and b.resistance.shape == (2, 6, 6)
    with pytest.raises(ValueError, match="batch\\) shapes of the fields do not match"):
        rj.RigidBody([1.0, 2.0], np.tile(np.diag([1.0, 2.0, 3.0]), (5, 1, 1)))
    with pytest.raises(ValueError, match="batch\\) shapes of the fields do not match"):
        rj.RigidBodyState(position=np.zeros((2, 3)), angular_velocity=np.zeros((5, 3)))
    s = rj.RigidBodyState(position=np.zeros((1, 3)), angular_velocity=np.zeros((4, 3)))
    assert s.position.shape == (4, 3) and s.orientation.shape == (4, 4) and s.time.shape == (4,)


@pytest.mark.parametrize(
    "wrench,dt,match",
    [
        (np.ones(3), 0.1, r"wrench must have shape \(…, 6\)"),
        (np.ones(7), 0.1, r"wrench must have shape \(…, 6\)"),
        (None, -0.01, "dt must be finite and > 0"),
        (None, 0.0, "dt must be finite and > 0"),
        (None, float("nan"), "dt must be finite and > 0"),
    ],
)
def test_step_bad_input(wrench, dt, match):
    with pytest.raises(ValueError, match=match):
        rj.midpoint_step(rj.RigidBody(1.0, [1.0, 2.0, 3.0]), rj.RigidBodyState(), wrench, dt)


def test_step_mismatched_body_and_state():
    with pytest.raises(ValueError, match="body has ensemble shape"):
        rj.midpoint_step(rj.RigidBody([1.0, 2.0], [1.0, 2.0, 3.0]), rj.RigidBodyState(), None, 0.1)
    with pytest.raises(TypeError, match="body is float64 but state is float32"):
        rj.midpoint_step(
            rj.RigidBody(1.0, [1.0, 2.0, 3.0]), rj.RigidBodyState(angular_velocity=np.float32([0.1, 2, 0])), None, 0.1
        )
    # a loads callable returning the wrong shape is caught too (shapes are static under jit)
    with pytest.raises(ValueError, match="wrench must have shape"):
        rj.rollout(
            rj.midpoint_step,
            rj.RigidBody(1.0, [1.0, 2.0, 3.0]),
            rj.RigidBodyState(),
            0.01,
            3,
            loads=lambda t, s: jnp.ones(3),
        )
