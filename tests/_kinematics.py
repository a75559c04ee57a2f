"""Reference kinematics for the tests' independent integrators (NumPy, written from the
textbook formula, not from rigidjax): the rate of a unit quaternion (Hamilton, scalar first,
body to world) under a body angular velocity, ``dq/dt = q (x) (0, omega) / 2``."""

import numpy as np


def quaternion_rate(q, w) -> np.ndarray:
    """``dq/dt`` (4,) of the quaternion ``q = (w, x, y, z)`` (4,) at the body rate ``w`` (3,), rad/s."""
    q0, x, y, z = q
    return 0.5 * np.array(
        [
            -x * w[0] - y * w[1] - z * w[2],
            q0 * w[0] + y * w[2] - z * w[1],
            q0 * w[1] + z * w[0] - x * w[2],
            q0 * w[2] + x * w[1] - y * w[0],
        ]
    )
