"""Reported quantities derived from the fitted shared parameters, and their standard errors."""

from __future__ import annotations

import math

import numpy as np

from ._model import Spec, phys_theta, theta_tensor

SCALE_KEYS = ("Ix", "Iy", "Iz", "trace")


class FitError(ValueError):
    """Bad input to an identification (the message names the argument or window)."""


def parse_scale(scale) -> tuple[str, float] | None:
    """``None``, ``"Iy=1.39e-3"``, ``{"Iy": 1.39e-3}`` or ``("trace", 0.04)`` -> ``(key, value)``.

    Keys: ``Ix``, ``Iy``, ``Iz`` (the diagonal component of the tensor in sensor axes, kg m^2)
    or ``trace``. Raises :class:`FitError` otherwise.
    """
    if scale is None:
        return None
    given = scale
    if isinstance(scale, str):
        if "=" not in scale:
            raise FitError(f"scale: expected KEY=VALUE with KEY in {SCALE_KEYS}, e.g. 'Iy=1.3911e-3'; got {scale!r}")
        k, v = scale.split("=", 1)
        scale = (k.strip(), v.strip())
    elif isinstance(scale, dict):
        if len(scale) != 1:
            raise FitError(f"scale: give exactly one known value; got {scale!r}")
        scale = next(iter(scale.items()))
    try:
        k, v = scale
        v = float(v)
    except (TypeError, ValueError):
        raise FitError(f"scale: expected KEY=VALUE with a number; got {given!r}") from None
    if k not in SCALE_KEYS:
        raise FitError(f"scale: key must be one of {SCALE_KEYS}; got {k!r}")
    if not (math.isfinite(v) and v > 0):
        raise FitError(f"scale: {k} must be a positive number (kg m^2); got {v}")
    return k, v


def names(spec: Spec, scale) -> list[str]:
    """The reported names, in order."""
    out = list(spec.inertia_names)
    if spec.tensor:
        out += ["Imid/Imin", "Imax/Imin", "misalignment_deg"]
    out += list(spec.drag_names)
    if scale is not None:
        out += ["Ix", "Iy", "Iz"] + (["Ixy", "Ixz", "Iyz"] if spec.tensor else [])
        out += [n.replace("/Iy", "") for n in spec.drag_names]
    return out


def lower_bound(name: str) -> float:
    """The smallest physically possible value of a reported quantity (``-inf`` for products
    of inertia): moments, their ratios, drags and angles are non-negative, the ratios of
    principal moments at least 1."""
    if name in ("Imid/Imin", "Imax/Imin"):
        return 1.0
    if name.startswith("drag") or name == "misalignment_deg" or name.split("/")[0] in ("Ix", "Iy", "Iz"):
        return 0.0
    return -math.inf


def misalignment_deg(inertia: np.ndarray) -> float:
    """Largest angle (deg) between a principal axis and its nearest sensor axis."""
    _, V = np.linalg.eigh(inertia)
    cos = np.max(np.abs(V), axis=0)
    return float(np.degrees(np.arccos(np.clip(cos.min(), -1, 1))))


def derived(xp: np.ndarray, spec: Spec, scale) -> np.ndarray:
    """Reported shared coordinates ``(n_phys,)`` -> the values of :func:`names` (NumPy)."""
    theta, _ = phys_theta(np.asarray(xp, float)[None], spec)
    inertia = theta_tensor(theta[0], spec)
    drag = np.asarray(xp[len(spec.inertia_names) :], float)
    out = list(xp[: len(spec.inertia_names)])
    if spec.tensor:
        m = np.linalg.eigvalsh(0.5 * (inertia + inertia.T))
        out += [m[1] / m[0], m[2] / m[0], misalignment_deg(inertia)]
    out += list(drag)
    if scale is not None:
        key, value = scale
        c = value / (np.trace(inertia) if key == "trace" else inertia["xyz".index(key[1]), "xyz".index(key[1])])
        out += list(c * np.diag(inertia))
        if spec.tensor:
            out += [c * inertia[0, 1], c * inertia[0, 2], c * inertia[1, 2]]
        out += list(c * drag)
    return np.asarray(out, float)


def derived_jacobian(xp: np.ndarray, spec: Spec, scale) -> tuple[np.ndarray, np.ndarray]:
    """``(values, d values / d xp)`` by central differences (step ``1e-6 max(1, |x|)``: the
    derived maps are smooth away from equal principal moments; errors ~1e-9 relative)."""
    xp = np.asarray(xp, float)
    v0 = derived(xp, spec, scale)
    J = np.zeros((v0.size, xp.size))
    for i in range(xp.size):
        h = 1e-6 * max(1.0, abs(xp[i]))
        a, b = xp.copy(), xp.copy()
        a[i] += h
        b[i] -= h
        J[:, i] = (derived(a, spec, scale) - derived(b, spec, scale)) / (2 * h)
    return v0, J


def standard_errors(J: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """Delta-method standard errors ``sqrt(diag(J C J^T))`` (``inf`` for an infinite ``C``)."""
    if not np.all(np.isfinite(cov)):
        return np.full(J.shape[0], np.inf)
    var = np.einsum("ij,jk,ik->i", J, cov, J)
    return np.sqrt(np.maximum(var, 0.0))
