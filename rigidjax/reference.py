r"""Closed-form and tightly integrated reference solutions (independent truths for tests).

These use NumPy/SciPy in float64 and are not differentiable; they exist to check the
steppers, never to be checked against them.

* :func:`torque_free_omega`: body angular velocity of a torque-free rigid body, exact, via
  Jacobi elliptic functions (Landau & Lifshitz, *Mechanics*, §37).
* :func:`torque_free_orientation`: its attitude by a tight SciPy (DOP853) integration of
  ``q_dot = q ⊗ (0, omega_exact(t)) / 2``.
* :func:`euler_omega`: body angular velocity under an angular resistance ``-D omega`` (air
  drag; no closed form), by a tight SciPy (DOP853) integration of Euler's equations.
* :func:`pendulum_period`: period of a simple / physical pendulum at any amplitude,
  ``T = 4 K(sin^2(theta0/2)) / omega0`` (complete elliptic integral of the first kind).
"""

from __future__ import annotations

import numpy as np
from scipy import integrate, special

__all__ = ["torque_free_omega", "torque_free_orientation", "euler_omega", "pendulum_period", "flip_period"]


def _principal(inertia):
    J = np.asarray(inertia, float)
    if J.shape == (3,):
        return J, np.eye(3)
    moments, axes = np.linalg.eigh(J)
    if np.linalg.det(axes) < 0:  # keep a proper rotation so cross products keep their sign
        axes[:, 0] = -axes[:, 0]
    return moments, axes


def torque_free_omega(inertia, omega0, t) -> np.ndarray:
    r"""Exact body angular velocity ``omega(t)`` (len(t), 3), rad/s, of a torque-free body.

    Args:
        inertia: principal moments (3,) about the body axes, or a symmetric tensor (3, 3)
            (then the solution is computed in principal axes and rotated back), kg m^2.
        omega0: body angular velocity at ``t = 0``, (3,), rad/s.
        t: times (n,), s.

    Uses ``cn, sn, dn`` (``scipy.special.ellipj``) with the energy and ``|L|^2`` of
    ``omega0``; the phase and signs come from ``omega0``. Handles both families
    (``|L|^2`` above and below ``2 T I_2``); the separatrix itself is not supported.
    Equal moments (symmetric top) are solved by the closed form with cos/sin.
    """
    moments, axes = _principal(inertia)
    w0 = axes.T @ np.asarray(omega0, float)
    t = np.asarray(t, float)
    order = np.argsort(moments)
    I = moments[order]
    w = w0[order]
    # an odd permutation of the axes flips the sign of cross products, i.e. reverses time
    parity = np.linalg.det(np.eye(3)[order])
    out = _omega_sorted(I, w, t * parity)
    res = np.empty_like(out)
    res[:, order] = out
    return res @ axes.T


def _omega_sorted(I, w, t):
    I1, I2, I3 = I
    two_T = float(np.sum(I * w * w))
    M2 = float(np.sum((I * w) ** 2))
    tol = 1e-12 * max(I3, 1e-300)
    if abs(I3 - I1) < tol:  # sphere: constant
        return np.tile(w, (len(t), 1))
    if abs(I2 - I1) < tol or abs(I3 - I2) < tol:
        # symmetric top: axis a is the symmetry axis, rate about it constant
        a = 2 if abs(I2 - I1) < tol else 0
        b, c = [i for i in range(3) if i != a]
        Iperp = I[b]
        Omega = (I[a] - Iperp) / Iperp * w[a]
        # with (b, c, a) cyclic: (w_b + i w_c)' = i Omega (w_b + i w_c)
        s = 1.0 if (b, c) in ((0, 1), (1, 2), (2, 0)) else -1.0
        ang = s * Omega * t
        out = np.empty((len(t), 3))
        out[:, a] = w[a]
        out[:, b] = w[b] * np.cos(ang) - w[c] * np.sin(ang)
        out[:, c] = w[b] * np.sin(ang) + w[c] * np.cos(ang)
        return out
    if M2 < two_T * I2:
        # swap the roles of axes 1 and 3 (an odd permutation: time reversed), solve, swap back
        Ir = I[::-1].copy()
        wr = w[::-1].copy()
        out = _omega_family(Ir, wr, -t)
        return out[:, ::-1]
    return _omega_family(I, w, t)


def _omega_family(I, w, t):
    # family with M^2 > 2T I2 for the ordering in I (I1 < I2 < I3 or reversed);
    # Euler's equations I1 w1' = (I2 - I3) w2 w3 (cyclic).
    I1, I2, I3 = I
    two_T = float(np.sum(I * w * w))
    M2 = float(np.sum((I * w) ** 2))
    A1 = np.sqrt(max((two_T * I3 - M2) / (I1 * (I3 - I1)), 0.0))
    A2 = np.sqrt(max((two_T * I3 - M2) / (I2 * (I3 - I2)), 0.0))
    A3 = np.sqrt(max((M2 - two_T * I1) / (I3 * (I3 - I1)), 0.0))
    lam = np.sqrt((I3 - I2) * (M2 - two_T * I1) / (I1 * I2 * I3))
    m = (I2 - I1) * (two_T * I3 - M2) / ((I3 - I2) * (M2 - two_T * I1))
    s3 = 1.0 if w[2] >= 0 else -1.0
    # w1 = A1 cn(u), w2 = sigma A2 sn(u), w3 = s3 A3 dn(u), u = lam t + u0 with sigma chosen
    # so that Euler's equations hold: I1 A1 (-sn dn) lam = (I2 - I3) sigma s3 A2 A3 sn dn.
    sigma = s3 * np.sign(I3 - I2)
    if A1 == 0 and A2 == 0:
        return np.tile(w, (len(t), 1))
    phi0 = np.arctan2(sigma * w[1] / A2 if A2 > 0 else 0.0, w[0] / A1 if A1 > 0 else 1.0)
    # F(phi | m) for phi beyond pi/2 by quasi-periodicity
    K = special.ellipk(m)
    n_half = np.round(phi0 / np.pi)
    u0 = 2 * n_half * K + special.ellipkinc(phi0 - n_half * np.pi, m)
    u = lam * t + u0
    sn, cn, dn, _ = special.ellipj(u, m)
    return np.stack([A1 * cn, sigma * A2 * sn, s3 * A3 * dn], -1)


def torque_free_orientation(inertia, omega0, q0, t, rtol: float = 1e-13) -> np.ndarray:
    """Attitude (len(t), 4), ``[w, x, y, z]`` body to world, of a torque-free body.

    Integrates ``q_dot = q ⊗ (0, omega(t)) / 2`` with the exact ``omega(t)`` of
    :func:`torque_free_omega` by SciPy's DOP853 at ``rtol`` (default 1e-13; errors ~1e-12).
    """
    t = np.asarray(t, float)

    def rhs(s, q):
        w = torque_free_omega(inertia, omega0, np.array([s]))[0]
        q0_, x, y, z = q
        wx, wy, wz = w
        return 0.5 * np.array(
            [
                -x * wx - y * wy - z * wz,
                q0_ * wx + y * wz - z * wy,
                q0_ * wy + z * wx - x * wz,
                q0_ * wz + x * wy - y * wx,
            ]
        )

    sol = integrate.solve_ivp(
        rhs, (0.0, float(t[-1])), np.asarray(q0, float), method="DOP853", t_eval=t, rtol=rtol, atol=rtol * 1e-2
    )
    q = sol.y.T
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def euler_omega(inertia, omega0, t, *, damping=None, rtol: float = 1e-10):
    r"""Body angular velocity, rad/s, of a rigid body with angular resistance, by DOP853.

    Integrates Euler's equations ``I omega' = -omega x I omega - D omega`` (torque ``-D
    omega`` about the centre of mass, e.g. air drag; ``D = 0``: torque-free) from
    ``omega(t[0]) = omega0`` with SciPy's DOP853 at ``rtol`` (``atol = 1e-2 rtol (1 +
    |omega0|)``), reporting at the times ``t``.

    Batched: with ``omega0 (B, 3)``, ``inertia (B, 3[, 3])``, ``damping`` per body and ``t`` a
    sequence of ``B`` time arrays, the ``B`` bodies are integrated as ONE system in the
    normalised time ``s = (t - t_b[0]) / (t_b[-1] - t_b[0])`` (each window scaled to
    ``[0, 1]``) and read at their own times: one call, one step-size sequence (that of the
    fastest body), far less Python overhead than ``B`` calls.

    Args:
        inertia: principal moments ``(3,)`` or a tensor ``(3, 3)`` (batched: a leading
            ``B``), body frame, kg m^2 (any common scale, with ``damping`` in the same scale).
        omega0: ``(3,)`` (or ``(B, 3)``) body rate at the first time, rad/s.
        t: ``(n,)`` increasing times, s (batched: a sequence of ``B`` such arrays).
        damping: ``None``, a scalar (``c I_3``), diagonal ``(3,)`` or a matrix ``(3, 3)``, N m s
            (batched: one scalar for every body, or a leading ``B``: ``(B,)``, ``(B, 3)``,
            ``(B, 3, 3)``; other shapes raise ``ValueError``).
        rtol: relative tolerance (default 1e-10: errors ~1e-9 of the rates over a few flips).

    Returns:
        ``(n, 3)``, or a list of ``B`` arrays ``(n_b, 3)`` when batched.
    """
    w0 = np.asarray(omega0, float)
    batched = w0.ndim == 2
    if not batched:
        w0, t = w0[None], [t]
        inertia = np.asarray(inertia, float)[None]
        damping = None if damping is None else np.asarray(damping, float)[None]
    B = w0.shape[0]
    J = np.asarray(inertia, float)
    J = J[..., :, None] * np.eye(3) if J.shape[-1:] == (3,) and J.ndim == 2 else J
    J = np.broadcast_to(J, (B, 3, 3))
    D = np.asarray(0.0 if damping is None else damping, float)
    if D.ndim == 0:  # one scalar for every body
        D = D * np.eye(3)
    elif D.shape == (B,):  # scalars per body
        D = D[:, None, None] * np.eye(3)
    elif D.shape == (B, 3):  # diagonals per body
        D = D[:, :, None] * np.eye(3)
    elif D.shape != (B, 3, 3):
        shape = D.shape[1:] if not batched else D.shape
        want = "a scalar, (3,) or (3, 3)" if not batched else f"a scalar, ({B},), ({B}, 3) or ({B}, 3, 3)"
        raise ValueError(f"euler_omega: damping of shape {shape}; expected {want} (N m s)")
    D = np.broadcast_to(D, (B, 3, 3))
    inv = np.linalg.inv(J)
    ts = [np.asarray(tb, float) for tb in t]
    span = np.array([max(tb[-1] - tb[0], 0.0) for tb in ts])
    # omega' in the normalised time: -span I^-1 (omega x I omega + D omega), as one product of
    # [I^-1 | I^-1 D] (B, 3, 6) with [omega x I omega, omega] (B, 6)
    M = -span[:, None, None] * np.concatenate([inv, inv @ D], -1)
    nxt, prv = [1, 2, 0], [2, 0, 1]

    def rhs(_s, y):
        w = y.reshape(B, 3)
        Lw = np.einsum("bij,bj->bi", J, w)
        c = w[:, nxt] * Lw[:, prv] - w[:, prv] * Lw[:, nxt]
        return np.einsum("bij,bj->bi", M, np.concatenate([c, w], 1)).reshape(-1)

    atol = rtol * 1e-2 * (1.0 + float(np.max(np.linalg.norm(w0, axis=1))))
    if np.all(span == 0):
        out = [np.tile(w0[b], (ts[b].size, 1)) for b in range(B)]
    else:
        s_b = [(tb - tb[0]) / span[b] if span[b] > 0 else np.zeros_like(tb) for b, tb in enumerate(ts)]
        s_all = np.unique(np.clip(np.concatenate(s_b), 0.0, 1.0))
        sol = integrate.solve_ivp(rhs, (0.0, 1.0), w0.reshape(-1), method="DOP853", t_eval=s_all, rtol=rtol, atol=atol)
        if not sol.success:
            raise RuntimeError(f"euler_omega: DOP853 failed: {sol.message}")
        y_all = sol.y.reshape(B, 3, -1)
        out = []
        for b, sb in enumerate(s_b):
            y = y_all[b][:, np.searchsorted(s_all, np.clip(sb, 0.0, 1.0))].T.copy()
            y[0] = w0[b]
            out.append(y)
    return out if batched else out[0]


def pendulum_period(theta0, omega_small) -> float:
    r"""Period (s) of a pendulum released from rest at amplitude ``theta0`` (rad).

    ``T = 4 K(k^2) / omega_small`` with ``k = sin(theta0/2)`` and ``omega_small`` the
    small-amplitude angular frequency (rad/s): ``sqrt(g/l)``, or ``sqrt(m g d / I_pivot)``
    for a physical pendulum.
    """
    return 4.0 * special.ellipk(np.sin(0.5 * theta0) ** 2) / omega_small


def flip_period(inertia, omega0) -> float:
    """Period (s) of the body-frame angular velocity of a torque-free asymmetric body.

    ``4 K(m) / lambda`` in the notation of :func:`torque_free_omega`: for a spin near the
    intermediate axis this is twice the time between successive flips (Dzhanibekov effect).
    """
    moments, axes = _principal(inertia)
    w = axes.T @ np.asarray(omega0, float)
    order = np.argsort(moments)
    I = moments[order]
    w = w[order]
    two_T = float(np.sum(I * w * w))
    M2 = float(np.sum((I * w) ** 2))
    if M2 < two_T * I[1]:
        I = I[::-1]
    I1, I2, I3 = I
    lam = np.sqrt((I3 - I2) * (M2 - two_T * I1) / (I1 * I2 * I3))
    m = (I2 - I1) * (two_T * I3 - M2) / ((I3 - I2) * (M2 - two_T * I1))
    return float(4 * special.ellipk(m) / lam)
