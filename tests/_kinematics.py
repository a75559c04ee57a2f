"""Reference kinematics for the tests' independent integrators (NumPy, written from the
textbook formula, not from rigidjax): the rate of a unit quaternion (Hamilton, scalar first,
body to world) under a body angular velocity, ``dq/dt = q (x) (0, omega) / 2``, and a free
rigid body's motion under body torques by SciPy's DOP853 (rtol 1e-12)."""

import numpy as np
from scipy.integrate import solve_ivp


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


def free_body_truth(inertia, w0, q0, t, torque=None):
    """Body angular velocity ``(N, 3)`` and orientation ``(N, 4)`` of a rigid body (principal
    moments ``(3,)`` or a tensor ``(3, 3)``, body axes) from ``w0``, ``q0`` at the times ``t``,
    with a body torque ``(N - 1, 3)`` held over each sample interval (``None``: torque-free),
    by DOP853 at rtol 1e-12 of Euler's equations ``I w' = I w x w + tau`` and
    :func:`quaternion_rate`."""
    I = np.diag(inertia) if np.ndim(inertia) == 1 else np.asarray(inertia, float)
    Iinv = np.linalg.inv(I)

    def rhs(s, y, tau):
        w, q = y[:3], y[3:]
        return np.concatenate([Iinv @ (np.cross(I @ w, w) + tau), quaternion_rate(q, w)])

    y = np.concatenate([w0, q0])
    out = [y]
    for i in range(len(t) - 1):
        tau = np.zeros(3) if torque is None else torque[i]
        sol = solve_ivp(rhs, (t[i], t[i + 1]), y, method="DOP853", rtol=1e-12, atol=1e-14, args=(tau,))
        y = sol.y[:, -1]
        out.append(y)
    Y = np.array(out)
    q = Y[:, 3:] / np.linalg.norm(Y[:, 3:], axis=1, keepdims=True)
    return Y[:, :3], q
