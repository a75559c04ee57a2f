"""The covariance of an inertia fit's parameters, its inertia tensor, principal moments and
principal axes, with uncertainties: what :meth:`rigidjax.identify.InertiaFit.to_dict` adds.

Frame: the **sensor (phone) axes** x, y, z of the gyroscope throughout. Units: with a scale
(``scale="Iy=..."``) the tensor and moments are in kg m^2; without one they are relative to
``I_yy`` (the tensor's y-y component in sensor axes is 1), as the ratios are.

Uncertainties are propagated from the covariance of the fitted parameters by the **delta
method** (first order: ``J C J^T`` with ``J`` the Jacobian of the tensor, the eigenvalues
and the rotation of the principal axes, by central differences, step ``1e-6 max(1, |x|)``).
``tests/test_report.py`` checks it against sampling from the covariance (Monte Carlo). It
fails where two principal moments are nearly equal (their axes are then undetermined): the
axes' errors are then ``inf``.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

from ._model import Spec, phys_theta, theta_tensor

#: the median's variance over the mean's for normal errors, (pi / 2); 1.2533^2
MEDIAN_EFFICIENCY = np.pi / 2
#: relative gap of principal moments below which their axes count as undetermined
DEGENERATE_GAP = 1e-6

FRAME = "sensor (phone) axes x, y, z"


def tensor_of(xp: np.ndarray, spec: Spec, scale) -> np.ndarray:
    """Shared reported coordinates ``(n_phys,)`` -> inertia tensor ``(3, 3)`` in sensor axes:
    kg m^2 with ``scale`` (``(key, value)``), else relative to ``I_yy``."""
    theta, _ = phys_theta(np.asarray(xp, float)[None], spec)
    inertia = theta_tensor(theta[0], spec)
    if scale is None:
        return inertia
    key, value = scale
    ref = np.trace(inertia) if key == "trace" else inertia["xyz".index(key[1]), "xyz".index(key[1])]
    return inertia * (value / ref)


def principal(inertia: np.ndarray, axes_like: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(moments (3,), R (3, 3))``: principal moments in ascending order and the rotation
    whose columns are the principal axes in sensor axes (``inertia = R diag(moments) R^T``).

    Signs: each axis points so that its largest component is positive; where that gives a
    left-handed set, the last axis (largest moment) is reversed, so that ``det R = +1``. With
    ``axes_like`` the signs follow that rotation instead (for differences near a base point).
    """
    m, V = np.linalg.eigh(0.5 * (inertia + inertia.T))
    if axes_like is not None:
        s = np.sign(np.sum(V * axes_like, axis=0))
    else:
        s = np.sign(V[np.argmax(np.abs(V), axis=0), np.arange(3)])
    V = V * np.where(s == 0, 1.0, s)
    if np.linalg.det(V) < 0:
        V[:, 2] *= -1
    return m, V


def _features(xp, spec: Spec, scale, R0) -> np.ndarray:
    """tensor (9), moments (3), rotation vector of ``R0^T R`` (3, rad, principal frame)."""
    inertia = tensor_of(xp, spec, scale)
    m, R = principal(inertia, R0)
    rv = Rotation.from_matrix(R0.T @ R).as_rotvec() if R0 is not None else np.zeros(3)
    return np.concatenate([inertia.ravel(), m, rv])


def _jacobian(xp: np.ndarray, spec: Spec, scale, R0) -> np.ndarray:
    J = np.zeros((15, xp.size))
    for i in range(xp.size):
        h = 1e-6 * max(1.0, abs(xp[i]))
        a, b = xp.copy(), xp.copy()
        a[i] += h
        b[i] -= h
        J[:, i] = (_features(a, spec, scale, R0) - _features(b, spec, scale, R0)) / (2 * h)
    return J


def _propagate(J: np.ndarray, cov) -> np.ndarray | None:
    if cov is None:
        return None
    cov = np.asarray(cov, float)
    if not np.all(np.isfinite(cov)):
        return np.full((J.shape[0], J.shape[0]), np.inf)
    return J @ cov @ J.T


def _sd(c: np.ndarray | None, idx) -> list | None:
    if c is None:
        return None
    return np.sqrt(np.maximum(np.diag(c)[idx], 0.0)).tolist()


def tensor_summary(xp: np.ndarray, spec: Spec, scale, cov=None, cov_total=None) -> dict:
    """The inertia tensor, its principal moments and axes, with their 1-sigma errors.

    Args:
        xp: shared reported coordinates ``(n_phys,)`` (``spec.inertia_names`` then
            ``spec.drag_names``).
        spec: the fitted model.
        scale: ``None`` or ``(key, value)`` (kg m^2).
        cov: statistical covariance of ``xp`` ``(n_phys, n_phys)`` (``inf`` entries: singular),
            or ``None`` (no errors).
        cov_total: a covariance covering the between-window scatter, or ``None``.

    Returns:
        dict: ``frame``, ``unit``, ``method``; ``tensor`` ``{value (3, 3), se (3, 3),
        se_total}``; ``principal_moments`` ``{value (3,) ascending, se, se_total}`` (every
        ``se_total`` at least its ``se``);
        ``principal_axes`` ``{rotation (3, 3)`` (columns: the axes of the ascending moments,
        in sensor axes, ``det +1``), ``se_deg`` (3,): the 1-sigma tilt of each axis, degrees,
        ``se_total_deg``, ``rotation_covariance`` (3, 3): covariance of the small rotation
        ``R_true = R exp([phi])``, ``phi`` in the principal frame, rad^2 ``}``. Without a
        full tensor (``spec.tensor`` false) the axes are the sensor axes by the model's
        assumption: ``se_deg`` is 0 and ``fixed_by_model`` is true.
    """
    xp = np.asarray(xp, float)
    inertia = tensor_of(xp, spec, scale)
    moments, R = principal(inertia)
    J = _jacobian(xp, spec, scale, R)
    c_stat, c_tot = _propagate(J, cov), _propagate(J, cov_total)
    gaps = np.diff(moments) / max(abs(moments[-1]), 1e-300)
    degenerate = bool(np.any(gaps < DEGENERATE_GAP))

    def tilt(c):
        if c is None:
            return None
        if not spec.tensor:
            return [0.0, 0.0, 0.0]
        if degenerate:
            return [float("inf")] * 3
        v = np.maximum(np.diag(c)[12:15], 0.0)
        return [float(np.degrees(np.sqrt(v.sum() - v[k]))) for k in range(3)]

    rot_cov = None
    if c_stat is not None and spec.tensor:
        rot_cov = np.full((3, 3), np.inf) if degenerate else c_stat[12:15, 12:15]
    elif c_stat is not None:
        rot_cov = np.zeros((3, 3))

    def at_least(tot, stat):
        """``tot`` no smaller than ``stat`` anywhere: the total covariance is a rescaled
        sandwich over the windows, of rank at most (windows - 1), so a direction it does not
        span can propagate below the statistical error."""
        if tot is None or stat is None:
            return tot
        return np.maximum(np.asarray(tot, float), np.asarray(stat, float)).tolist()  # NaN stays NaN

    unit = "kg m^2" if scale is not None else "relative to I_yy (the tensor's y-y component in sensor axes); no scale"
    sd = lambda c: None if c is None else np.reshape(_sd(c, slice(0, 9)), (3, 3)).tolist()  # noqa: E731
    return {
        "frame": FRAME,
        "unit": unit,
        "method": "delta method: first-order propagation of the parameters' covariance (central differences)",
        "tensor": {"value": inertia.tolist(), "se": sd(c_stat), "se_total": at_least(sd(c_tot), sd(c_stat))},
        "principal_moments": {
            "value": moments.tolist(),
            "se": _sd(c_stat, slice(9, 12)),
            "se_total": at_least(_sd(c_tot, slice(9, 12)), _sd(c_stat, slice(9, 12))),
        },
        "principal_axes": {
            "rotation": R.tolist(),
            "columns": "principal axes of the ascending moments, in sensor axes (det +1)",
            "se_deg": tilt(c_stat),
            "se_total_deg": at_least(tilt(c_tot), tilt(c_stat)),
            "rotation_covariance": None if rot_cov is None else rot_cov.tolist(),
            "fixed_by_model": not spec.tensor,
            "degenerate": degenerate,
        },
    }


def combined_covariance(covs: list, values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-window mode: covariances of the median of the pooled windows' shared parameters.

    Statistical: ``(pi/2) (sum_i C_i^-1)^-1`` (the inverse-variance weighted mean's covariance
    times the median's efficiency loss; on the diagonal, for uncorrelated parameters, the
    ``1.2533 / sqrt(sum 1/se^2)`` of the reported statistical errors). Between windows (when
    ``values (n, P)`` has ``n >= 2``): ``(pi/2) S / n`` with ``S`` the windows' sample
    covariance (their scatter, normal approximation of the median).
    """
    good = [np.asarray(c, float) for c in covs if c is not None and np.all(np.isfinite(c))]
    if not good:
        P = np.asarray(covs[0]).shape[0]
        stat = np.full((P, P), np.inf)
    else:
        try:
            info = sum(np.linalg.inv(c) for c in good)
            stat = MEDIAN_EFFICIENCY * np.linalg.inv(info)
        except np.linalg.LinAlgError:
            stat = np.full_like(good[0], np.inf)
    total = None
    if values is not None and len(values) >= 2:
        v = np.asarray(values, float)
        total = MEDIAN_EFFICIENCY * np.cov(v, rowvar=False).reshape(v.shape[1], v.shape[1]) / len(v)
    return stat, total
