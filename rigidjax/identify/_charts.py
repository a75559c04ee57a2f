"""Small NumPy and JAX kernels of the inertia charts of :mod:`rigidjax.identify.transforms`
and :mod:`rigidjax.identify._model`: principal frames, rotated tensors, second moments and the
rod-like edge."""

from __future__ import annotations

import itertools

import numpy as np

from .. import so3


def _rod(moments, v_max: float) -> str | None:
    """Why principal ``moments (3,)`` are a degenerate, rod-like body (the largest
    ``v_max`` times the smallest or more), in words; else ``None``."""
    m = np.asarray(moments, float)
    if m.max() >= v_max * m.min():
        return f"principal moments {m.max() / max(m.min(), 1e-300):.3g} : 1, a rod (a ratio beyond {v_max:g})"
    return None


def _nearest_axes(R: np.ndarray) -> np.ndarray:
    """Permute and sign the columns of the rotation ``R`` (principal axes) so that column i
    is the principal axis nearest sensor axis i, keeping ``det = +1``."""
    best, best_score = None, -1.0
    for perm in itertools.permutations(range(3)):
        score = sum(abs(R[i, perm[i]]) for i in range(3))
        if score > best_score:
            best, best_score = perm, score
    Q = R[:, list(best)].copy()
    for i in range(3):
        if Q[i, i] < 0:
            Q[:, i] = -Q[:, i]
    if np.linalg.det(Q) < 0:
        Q[:, 0] = -Q[:, 0]
    return Q, list(best)


def _principal_frame(tensor, name: str):
    """NumPy: a symmetric, positive definite tensor ``(3, 3)`` -> its principal moments
    ``(3,)`` and the rotation vector ``phi (3,)`` of its principal axes (``R = Exp(phi)``, the
    columns the axes nearest the frame's x, y, z: ``|phi| <= pi``, near 0 for a body whose
    principal axes are near the frame's). Raises for a tensor that is not symmetric or not
    positive definite."""
    from scipy.spatial.transform import Rotation

    T = np.asarray(tensor, float)
    if T.shape != (3, 3) or not np.all(np.isfinite(T)):
        raise ValueError(f"{name}: the start must be a finite (3, 3) inertia tensor; got {tensor!r}")
    # a tensor printed to 6-7 digits (from CAD) is symmetric to its rounding: symmetrised
    if not np.allclose(T, T.T, rtol=0.0, atol=1e-6 * np.max(np.abs(T))):
        raise ValueError(f"{name}: the start tensor is not symmetric: {T.tolist()}")
    w, V = np.linalg.eigh(0.5 * (T + T.T))
    if not np.all(w > 0):
        raise ValueError(f"{name}: the start tensor is not positive definite (principal moments {w})")
    if np.linalg.det(V) < 0:
        V[:, 0] = -V[:, 0]
    Q, perm = _nearest_axes(V)
    return w[perm], Rotation.from_matrix(Q).as_rotvec()


def _rotated(moments, phi):
    """JAX: ``R diag(moments) R^T`` with ``R = Exp(phi)`` (the principal axes as columns)."""
    R = so3.to_matrix(so3.exp(phi))
    return (R * moments) @ R.T


def _second_moments(moments, name: str) -> np.ndarray:
    """NumPy: principal moments -> second moments ``L = sum(I) / 2 - I``, raising where a
    triangle inequality fails beyond round-off (a face given by its equality, up to the
    eigendecomposition's round-off, is put on it: ``L = 0`` exactly)."""
    L = np.sum(moments) / 2 - moments
    tol = 8 * np.finfo(float).eps * np.max(moments)
    if np.any(L < -tol):
        raise ValueError(
            f"{name}: principal moments {moments} are not a physical body (the triangle inequalities: each moment "
            "at most the sum of the other two)"
        )
    return np.where(L <= tol, 0.0, L)
