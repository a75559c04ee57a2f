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
    s = rj.RigidBodyState(velocity=[1.0, 0.0, 0.0], angular_velocity=[0.0, 1.0, 0.0], orientation=[np.cos(0.5), 0, 0, np.sin(0.5)])
    assert float(rj.kinetic_energy(body, s)) == pytest.approx(0.5 * 2 * 1 + 0.5 * 2 * 1)
    # body y-axis turned by 1 rad about world z: L_world = 2 * (-sin 1, cos 1, 0)
    np.testing.assert_allclose(rj.angular_momentum(body, s), [-2 * np.sin(1.0), 2 * np.cos(1.0), 0], atol=1e-14)
    np.testing.assert_allclose(rj.linear_momentum(body, s), [2.0, 0, 0])
