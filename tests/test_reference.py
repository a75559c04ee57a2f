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
    J = np.diag(I) if seed % 2 == 0 else Rotation.random(random_state=seed).as_matrix() @ np.diag(I) @ Rotation.random(random_state=seed).as_matrix().T
    w0 = rng.normal(size=3) * 2
    t = np.linspace(0, 5, 40)
    exact = reference.torque_free_omega(J, w0, t)
    ivp = solve_ivp(_euler, (0, 5), w0, t_eval=t, args=(J,), rtol=1e-12, atol=1e-12, method="DOP853").y.T
    np.testing.assert_allclose(exact, ivp, atol=1e-9)  # DOP853 at rtol 1e-12 over 5 s


def test_pendulum_period_limits():
    # small amplitude: 2 pi / omega; 90 degrees: the tabulated 1.18034 * 2 pi / omega
    assert reference.pendulum_period(1e-6, 2.0) == pytest.approx(np.pi, rel=1e-12)
    assert reference.pendulum_period(np.pi / 2, 1.0) == pytest.approx(1.18034060 * 2 * np.pi, rel=1e-8)
