r"""Parametrisations of fitted quantities: unconstrained coordinates ``u`` to model values.

The optimiser of :func:`rigidjax.identify.fit` works in unconstrained coordinates; each
fitted quantity names the map from them to its value, so that every point the optimiser
visits is a valid model:

* :class:`Real`: ``value = u`` (any real array);
* :class:`Positive`: ``value = exp(u)`` (moments, masses, lengths, damping);
* :class:`Bounded`: ``value = lo + (hi - lo) / (1 + exp(-u))`` (a delay within a window);
* :class:`PseudoInertia`: the 10 inertial parameters of a rigid body (mass, centre of mass,
  inertia tensor) through the log-Cholesky factor of the pseudo-inertia matrix (Rucker &
  Wensing, "Smooth parameterization of rigid-body inertia", IEEE RA-L 7(2), 2022): every
  ``u`` in R^10 is a physically consistent body (positive mass, inertia positive definite
  and obeying the triangle inequality) and every such body has exactly one ``u``.

Each map has ``size(like)`` (the number of coordinates for a value shaped like ``like``),
``forward(u, like)`` (JAX, differentiable) and ``inverse(value)`` (NumPy, for starts).
Uncertainties are reported on the values, mapped from ``u`` by the map's Jacobian (the delta
method), so a positive quantity's interval is symmetric in its value, as printed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Real", "Positive", "Bounded", "PseudoInertia", "pseudo_inertia", "rigid_body_parameters"]


@dataclasses.dataclass(frozen=True)
class Real:
    """``value = u``: an unconstrained real array of the leaf's shape."""

    def size(self, like) -> int:
        return int(np.size(like))

    def forward(self, u, like):
        return jnp.reshape(u, np.shape(like))

    def inverse(self, value) -> np.ndarray:
        return np.ravel(np.asarray(value, float))


@dataclasses.dataclass(frozen=True)
class Positive:
    """``value = exp(u)`` elementwise: every entry > 0."""

    def size(self, like) -> int:
        return int(np.size(like))

    def forward(self, u, like):
        return jnp.reshape(jnp.exp(u), np.shape(like))

    def inverse(self, value) -> np.ndarray:
        v = np.ravel(np.asarray(value, float))
        if np.any(v <= 0):
            raise ValueError(f"Positive: the start value must be > 0; got {v}")
        return np.log(v)


@dataclasses.dataclass(frozen=True)
class Bounded:
    """``value = lo + (hi - lo) sigmoid(u)`` elementwise: ``lo < value < hi``."""

    lo: float
    hi: float

    def __post_init__(self):
        if not (np.isfinite(self.lo) and np.isfinite(self.hi) and self.lo < self.hi):
            raise ValueError(f"Bounded: need finite lo < hi; got lo={self.lo}, hi={self.hi}")

    def size(self, like) -> int:
        return int(np.size(like))

    def forward(self, u, like):
        return jnp.reshape(self.lo + (self.hi - self.lo) * jax.nn.sigmoid(u), np.shape(like))

    def inverse(self, value) -> np.ndarray:
        v = np.ravel(np.asarray(value, float))
        if np.any(v <= self.lo) or np.any(v >= self.hi):
            raise ValueError(f"Bounded: the start value must lie in ({self.lo}, {self.hi}); got {v}")
        s = (v - self.lo) / (self.hi - self.lo)
        return np.log(s) - np.log1p(-s)


def _upper(u):
    """The log-Cholesky factor ``U`` (4x4, upper triangular) of the pseudo-inertia."""
    alpha, d1, d2, d3, s12, s23, s13, t1, t2, t3 = (u[i] for i in range(10))
    z = jnp.zeros_like(alpha)
    U = jnp.stack(
        [
            jnp.stack([jnp.exp(d1), s12, s13, t1]),
            jnp.stack([z, jnp.exp(d2), s23, t2]),
            jnp.stack([z, z, jnp.exp(d3), t3]),
            jnp.stack([z, z, z, jnp.ones_like(alpha)]),
        ]
    )
    return jnp.exp(alpha) * U


def pseudo_inertia(u) -> jax.Array:
    """The pseudo-inertia ``J = U U^T`` (4x4) of the 10 log-Cholesky coordinates ``u``:
    ``J = [[Sigma, m c], [m c^T, m]]`` with ``Sigma = tr(I_o)/2 1 - I_o`` (``I_o``: the inertia
    about the body frame's origin, kg m^2; ``c``: the centre of mass, m, body frame)."""
    U = _upper(jnp.asarray(u))
    return U @ U.T


def rigid_body_parameters(u):
    """``(mass (kg), com (3,) m, inertia about the centre of mass (3, 3) kg m^2)`` of the 10
    log-Cholesky coordinates ``u`` (:class:`PseudoInertia`)."""
    J = pseudo_inertia(u)
    m = J[3, 3]
    c = J[:3, 3] / m
    sigma = J[:3, :3]
    eye = jnp.eye(3, dtype=J.dtype)
    inertia_origin = jnp.trace(sigma) * eye - sigma
    inertia_com = inertia_origin - m * (jnp.dot(c, c) * eye - jnp.outer(c, c))
    return m, c, inertia_com


@dataclasses.dataclass(frozen=True)
class PseudoInertia:
    """The 10 inertial parameters of one rigid body, physically consistent for every ``u``.

    ``forward(u, like)`` returns ``(mass, com, inertia_com)`` (kg; m, body frame; kg m^2 about
    the centre of mass, body axes): a :class:`rigidjax.identify.Parameter` puts them into three
    leaves of the model (``where`` returning three nodes, or an ``into`` map, e.g. a joint
    point ``-com``). ``inverse((mass, com, inertia_com))`` gives the start's coordinates and
    raises for a body that is not physical. Fix a part (e.g. the centre of mass) by fitting
    fewer quantities instead: the map has no partial form.
    """

    def size(self, like) -> int:
        return 10

    def forward(self, u, like):
        return rigid_body_parameters(u)

    def inverse(self, value) -> np.ndarray:
        m, c, inertia = (np.asarray(v, float) for v in value)
        m = float(m)
        c = np.reshape(c, 3)
        inertia = np.reshape(inertia, (3, 3))
        if m <= 0:
            raise ValueError(f"PseudoInertia: mass must be > 0; got {m}")
        eye = np.eye(3)
        i_o = inertia + m * (c @ c * eye - np.outer(c, c))
        sigma = 0.5 * np.trace(i_o) * eye - i_o
        J = np.block([[sigma, m * c[:, None]], [m * c[None, :], np.array([[m]])]])
        # J = U U^T with U upper triangular: the Cholesky factor of J with rows and columns reversed
        P = np.eye(4)[::-1]
        try:
            L = np.linalg.cholesky(P @ J @ P)
        except np.linalg.LinAlgError:
            raise ValueError(
                "PseudoInertia: the start is not a physical rigid body (pseudo-inertia not positive "
                "definite: inertia not positive definite or violating the triangle inequality)"
            ) from None
        U = P @ L @ P
        a = np.log(U[3, 3])
        U = U / U[3, 3]
        return np.array(
            [a, np.log(U[0, 0]), np.log(U[1, 1]), np.log(U[2, 2]), U[0, 1], U[1, 2], U[0, 2], U[0, 3], U[1, 3], U[2, 3]]
        )
