"""The reference solutions themselves, checked against tight DOP853 integrations."""

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.spatial.transform import Rotation

from rigidjax import reference


def _euler(t, w, J):
    return np.linalg.solve(J, np.cross(J @ w, w))


@pytest.mark.parametrize("seed", range(6))
def test_torque_free_omega_matches_dop853(seed):
    rng = np.random.default_rng(seed)
    I = rng.permutation(np.sort(rng.uniform(1, 2, 3)))  # permuted: exercises handedness
    if seed == 4:
        I[0] = I[1]  # symmetric top branch
    J = (
        np.diag(I)
        if seed % 2 == 0
        else Rotation.random(random_state=seed).as_matrix()
        @ np.diag(I)
        @ Rotation.random(random_state=seed).as_matrix().T
    )
    w0 = rng.normal(size=3) * 2
    t = np.linspace(0, 5, 40)
    exact = reference.torque_free_omega(J, w0, t)
    ivp = solve_ivp(_euler, (0, 5), w0, t_eval=t, args=(J,), rtol=1e-12, atol=1e-12, method="DOP853").y.T
    np.testing.assert_allclose(exact, ivp, atol=1e-9)  # DOP853 at rtol 1e-12 over 5 s


def test_pendulum_period_limits():
    # small amplitude: 2 pi / omega; 90 degrees: the tabulated 1.18034 * 2 pi / omega
    assert reference.pendulum_period(1e-6, 2.0) == pytest.approx(np.pi, rel=1e-12)
    assert reference.pendulum_period(np.pi / 2, 1.0) == pytest.approx(1.18034060 * 2 * np.pi, rel=1e-8)


def test_euler_omega_with_drag_against_closed_forms():
    """Torque-free: the exact elliptic solution. Isotropic drag on a sphere: the rate decays
    as exp(-c t / I) exactly. Batched windows of different spans equal one-by-one calls."""
    I, w0, t = np.array([1.0, 2.0, 3.0]), np.array([0.05, 4.0, 0.1]), np.linspace(0.0, 2.0, 81)
    np.testing.assert_allclose(reference.euler_omega(I, w0, t), reference.torque_free_omega(I, w0, t), atol=1e-8)
    w = reference.euler_omega([2.0, 2.0, 2.0], [1.0, -2.0, 0.5], t, damping=0.3)
    np.testing.assert_allclose(w, np.exp(-0.15 * t)[:, None] * [1.0, -2.0, 0.5], rtol=1e-8)
    t2 = 5.0 + np.cumsum(np.full(40, 0.013))
    J2 = (
        Rotation.from_rotvec([0.1, -0.2, 0.3]).as_matrix()
        @ np.diag([1.0, 1.5, 2.2])
        @ Rotation.from_rotvec([0.1, -0.2, 0.3]).as_matrix().T
    )
    both = reference.euler_omega(
        np.stack([np.diag(I), J2]),
        np.stack([w0, [3.0, 0.2, -1.0]]),
        [t, t2],
        damping=np.array([[0.0] * 3, [0.1, 0.2, 0.05]]),
    )
    np.testing.assert_allclose(both[0], reference.torque_free_omega(I, w0, t), atol=1e-8)
    np.testing.assert_allclose(
        both[1], reference.euler_omega(J2, [3.0, 0.2, -1.0], t2, damping=[0.1, 0.2, 0.05]), atol=1e-8
    )
    # one scalar shared by a batch is c I_3 for every body: two spheres decay as exp(-c t / I)
    two = reference.euler_omega(np.full((2, 3), 2.0), [[1.0, -2.0, 0.5], [0.0, 1.0, 0.0]], [t, t], damping=0.3)
    np.testing.assert_allclose(two[1], np.exp(-0.15 * t)[:, None] * [0.0, 1.0, 0.0], rtol=1e-8)
    # a shape that is neither shared nor per body is refused, not broadcast into a full matrix
    with pytest.raises(ValueError, match="damping of shape"):
        reference.euler_omega(
            np.full((2, 3), 2.0), [[1.0, -2.0, 0.5], [0.0, 1.0, 0.0]], [t, t], damping=[0.1, 0.2, 0.3]
        )
