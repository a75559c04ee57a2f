r"""Parametrisations of fitted quantities: unconstrained coordinates ``u`` to model values.

The optimiser of :func:`rigidjax.identify.fit` works in unconstrained coordinates; each
fitted quantity names the map from them to its value, so that every point the optimiser
visits is a valid model:

* :class:`Real`: ``value = u`` (any real array);
* :class:`Positive`: ``value = exp(u)`` (moments, masses, lengths, damping);
* :class:`Bounded`: ``value = lo + (hi - lo) / (1 + exp(-u))`` (a delay within a window;
  the ends are reached only as ``u -> +-inf``);
* :class:`Box`: ``value = u`` with box bounds ``lo <= u <= hi``: the ends are reached
  exactly (a value whose optimum lies on a bound);
* :class:`MomentRatios`: principal-moment ratios ``(Ix/Iy, Iz/Iy)`` in the chart of
  :func:`rigidjax.identify.fit_inertia`, where the physically valid set is a box whose edges
  (the thin plate ``Iz = Ix + Iy``, ...) are reached exactly;
* :class:`PrincipalMoments`: principal moments ``(Ix, Iy, Iz)`` (kg m^2) from the second
  moments of the mass distribution, each ``>= 0``: the same edges, reached exactly, for
  absolute moments (known torques);
* :class:`TensorRatios` and :class:`InertiaTensor`: the full inertia tensor (over ``I_yy``, or
  in kg m^2) from the principal second moments in the same box and the principal axes
  ``Exp(phi)``;
* :class:`PseudoInertia`: the 10 inertial parameters of a rigid body (mass, centre of mass,
  inertia tensor) through the log-Cholesky factor of the pseudo-inertia matrix (Rucker &
  Wensing, "Smooth parameterization of rigid-body inertia", IEEE RA-L 7(2), 2022): every
  ``u`` in R^10 is a physically consistent body (positive mass, inertia positive definite
  and obeying the triangle inequality) and every such body has exactly one ``u``.

Each map has ``size(like)`` (the number of coordinates for a value shaped like ``like``),
``forward(u, like)`` (JAX, differentiable) and ``inverse(value)`` (NumPy, for starts).
A map may also declare box bounds on its coordinates, ``bounds(like) -> (lo, hi)`` (NumPy,
each of shape ``(size(like),)``, ``-inf``/``inf`` for none, ``lo <= hi``): the optimiser
(the projected Levenberg-Marquardt of :mod:`rigidjax.identify._lm`) then keeps ``u`` in
``[lo, hi]`` and reaches a bound exactly, holding a coordinate there while the cost's
gradient points out of the box. A map without ``bounds`` is unconstrained. ``forward`` must
be valid on the whole box, bounds included, and ``inverse`` must return a point inside it
(:func:`rigidjax.identify.fit` checks it). A map whose coordinates carry the value's units
may declare ``start_scale(u0) -> (size(like),)``, the random starts' perturbation per
coordinate (times the fit's ``spread``) around the start's coordinates ``u0``; else 1
(unitless coordinates: logarithms, ratios). A map of quantities that are determined only
when their relative error is small (moments of inertia) may declare ``relative_se_max``: a
fit at its optimum whose value has a relative standard error above it is
``unidentifiable`` (the local model behind the standard errors does not hold that far from the
estimate: see :mod:`rigidjax.identify.problem`), on the entries of the flattened value
``relative_entries`` where it declares them (else every entry). An inertia map may declare
``degenerate(u) -> str | None``: why the coordinates ``u`` are a degenerate body (a rod: the
largest principal moment :data:`V_MAX` times the smallest or more, where a simulation is
ill-conditioned and the data determine nothing); a fit ending there, or heading there when
it stops, is ``unidentifiable``.
Uncertainties are reported on the values, mapped from ``u`` by the map's Jacobian (the delta
method), so a positive quantity's interval is symmetric in its value, as printed. A
coordinate held at a bound keeps the error of the unconstrained local model (see
:mod:`rigidjax.identify.problem`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ._charts import _principal_frame, _rod, _rotated, _second_moments

__all__ = [
    "Real",
    "Positive",
    "Bounded",
    "Box",
    "MomentRatios",
    "PrincipalMoments",
    "TensorRatios",
    "InertiaTensor",
    "PseudoInertia",
    "pseudo_inertia",
    "rigid_body_parameters",
    "bounds_of",
    "REL_SE_MAX",
]

#: Relative standard error above which a moment of inertia (or a ratio of two) is not
#: determined by the data (:class:`MomentRatios`, :class:`PrincipalMoments`, and
#: :func:`rigidjax.identify.fit_inertia`'s ratios): far beyond the local quadratic model of
#: the cost, its standard errors say nothing. The flattest racquet windows, on the thin-plate
#: edge, are known to +-20-35 %; motion capture of 12 samples (0.11 s, a third of a turn)
#: put a moment 11 standard errors from the truth while the other two were known to
#: +-350-730 %.
REL_SE_MAX = 0.5


def bounds_of(transform, like) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` of ``transform``'s coordinates for a value shaped like ``like``: its
    ``bounds(like)`` where it has one, else ``(-inf, inf)`` for each; checked (shapes
    ``(size(like),)``, no NaN, ``lo <= hi``, ``lo < inf``, ``hi > -inf``)."""
    n = transform.size(like)
    if not hasattr(transform, "bounds"):
        return np.full(n, -np.inf), np.full(n, np.inf)
    lo, hi = transform.bounds(like)
    lo = np.asarray(lo, float)
    hi = np.asarray(hi, float)
    name = type(transform).__name__
    if lo.shape != (n,) or hi.shape != (n,):
        raise ValueError(f"{name}.bounds: lo and hi must have shape ({n},); got {lo.shape} and {hi.shape}")
    if np.any(np.isnan(lo)) or np.any(np.isnan(hi)):
        raise ValueError(f"{name}.bounds: NaN in lo={lo} or hi={hi}")
    if np.any(lo > hi) or np.any(lo == np.inf) or np.any(hi == -np.inf):
        raise ValueError(f"{name}.bounds: need lo <= hi, lo < inf and hi > -inf; got lo={lo}, hi={hi}")
    return lo, hi


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


def _bound_value(x, name: str) -> float | tuple[float, ...]:
    """A bound as a float or a tuple of floats (hashable: a transform is part of the key of a
    compiled program)."""
    a = np.asarray(x, float)
    if a.ndim > 1:
        raise ValueError(f"Box: {name} must be a number or a 1-D sequence; got shape {a.shape}")
    return float(a) if a.ndim == 0 else tuple(float(v) for v in a)


@dataclasses.dataclass(frozen=True)
class Box:
    """``value = u`` with every entry in ``[lo, hi]``, both ends reachable.

    For a quantity whose least-squares optimum may lie ON a bound (a non-negative drag that
    the data would make negative, a fraction in ``[0, 1]``): unlike :class:`Bounded`, whose
    sigmoid reaches its ends only at ``u -> +-inf``, the bounded optimiser stops exactly at
    the bound and reports it converged there (first-order optimality with the gradient
    pointing out of the box: the projected Levenberg-Marquardt of
    :mod:`rigidjax.identify._lm`, after Kanzow, Yamashita & Fukushima 2004).

    Args:
        lo, hi: numbers or 1-D sequences broadcast (NumPy rules) against the value's shape;
            ``-inf``/``inf`` for a one-sided box; ``lo < hi`` everywhere (a fixed quantity
            is not fitted: leave it out of the parameters).

    Shapes: ``size(like) = like.size`` coordinates, ``forward(u, like)`` of ``like``'s
    shape, ``bounds(like)`` two ``(like.size,)`` arrays. ``inverse`` raises for a start
    outside ``[lo, hi]``.
    """

    lo: float | tuple = 0.0
    hi: float | tuple = np.inf

    def __post_init__(self):
        lo, hi = _bound_value(self.lo, "lo"), _bound_value(self.hi, "hi")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        a, b = np.asarray(lo), np.asarray(hi)
        try:
            a, b = np.broadcast_arrays(a, b)
        except ValueError:
            raise ValueError(f"Box: lo and hi do not broadcast: lo={lo}, hi={hi}") from None
        if np.any(np.isnan(a)) or np.any(np.isnan(b)) or not np.all(a < b) or np.any(a == np.inf):
            raise ValueError(f"Box: need lo < hi (not NaN; -inf/inf allowed for a one-sided box); got lo={lo}, hi={hi}")

    def size(self, like) -> int:
        return int(np.size(like))

    def bounds(self, like):
        shape = np.shape(like)
        try:
            lo = np.broadcast_to(np.asarray(self.lo, float), shape)
            hi = np.broadcast_to(np.asarray(self.hi, float), shape)
        except ValueError:
            raise ValueError(
                f"Box: bounds lo={self.lo}, hi={self.hi} do not broadcast to the value's shape {shape}"
            ) from None
        return np.ravel(lo).copy(), np.ravel(hi).copy()

    def forward(self, u, like):
        return jnp.reshape(u, np.shape(like))

    def inverse(self, value) -> np.ndarray:
        v = np.asarray(value, float)
        lo, hi = self.bounds(v)
        v = np.ravel(v)
        if not np.all((v >= lo) & (v <= hi)):
            raise ValueError(f"Box: the start value must lie in [lo, hi] (lo={self.lo}, hi={self.hi}); got {v}")
        return v


#: The largest second moment ``v`` of :class:`MomentRatios` (the same edge as
#: :data:`rigidjax.identify._model.V_MAX` of :func:`rigidjax.identify.fit_inertia`).
V_MAX = 1e4


@dataclasses.dataclass(frozen=True)
class MomentRatios:
    r"""Principal-moment ratios ``value = [Ix/Iy, Iz/Iy]`` (shape ``(2,)``) from 2 coordinates
    ``(u, v)`` in a box where every point is a physical body.

    .. math:: I_x/I_y = v + 1 - u, \qquad I_z/I_y = u + v, \qquad u \in [0, 1],\; v \in [0, v_{max}]

    The chart of :func:`rigidjax.identify.fit_inertia` (:mod:`rigidjax.identify._model`):
    with ``I_y = 1`` the second moments of the mass distribution (``I_x = L_y + L_z`` and
    cyclic; the body is physical exactly when every ``L >= 0``) are ``L_x = u``,
    ``L_z = 1 - u``, ``L_y = v`` (physical consistency as non-negative second moments:
    Wensing, Kim & Slotine, "Linear matrix inequalities for physically consistent inertial
    parameter identification", IEEE RA-L 3(1), 2018), so the triangle inequalities are the
    box: ``u = 1`` is ``Iz = Ix + Iy`` (a thin plate in the x-y plane, e.g. a racquet),
    ``u = 0`` is ``Ix = Iy + Iz`` (a plate in y-z), ``v = 0`` is ``Iy = Ix + Iz`` (a plate in
    x-z); the bounded optimiser reaches these edges exactly. The corners ``(u, v) = (1, 0)`` and ``(0, 0)`` are
    rods (``Ix = 0`` or ``Iz = 0``): not positive definite, a simulation fails there. ``v <=
    v_max`` bounds the search (the largest ratio at most about ``v_max``): a fit that ends
    there prefers a degenerate, rod-like body (fit_inertia reports it unidentifiable).

    Use with ``Parameter(lambda m: m.inertia, MomentRatios(), into=MomentRatios.inertia,
    start=[Ix/Iy, Iz/Iy])``: :meth:`inertia` is ``diag(Ix/Iy, 1, Iz/Iy)``, torque-free motion
    fixing only the ratios. ``inverse([Ix/Iy, Iz/Iy])`` gives ``(u, v)`` and raises for a pair
    outside the box (violating a triangle inequality, or beyond ``v_max``).

    Args:
        v_max: the upper bound of ``v`` (default :data:`V_MAX`, as fit_inertia's).
    """

    #: see the module: a value known only to more than this (relative) is not determined
    relative_se_max: ClassVar[float] = REL_SE_MAX
    #: what lies beyond each edge of the box, ``(coordinate, "lower" | "upper")`` (a fit's
    #: message names it where the optimum is held there)
    beyond: ClassVar[dict] = {(0, "upper"): "Iz > Ix + Iy", (0, "lower"): "Ix > Iy + Iz", (1, "lower"): "Iy > Ix + Iz"}

    v_max: float = V_MAX

    def __post_init__(self):
        if not (np.isfinite(self.v_max) and self.v_max > 0):
            raise ValueError(f"MomentRatios: v_max must be a finite number > 0; got {self.v_max}")
        object.__setattr__(self, "v_max", float(self.v_max))

    def size(self, like) -> int:
        return 2

    def bounds(self, like):
        return np.array([0.0, 0.0]), np.array([1.0, self.v_max])

    def degenerate(self, u) -> str | None:
        """Why the coordinates ``u`` are a rod-like body (see the module), else ``None``."""
        return _rod([u[1] + 1 - u[0], 1.0, u[0] + u[1]], self.v_max)

    def forward(self, u, like):
        u = jnp.asarray(u)
        return jnp.stack([u[1] + 1 - u[0], u[0] + u[1]])

    def inverse(self, value) -> np.ndarray:
        r = np.ravel(np.asarray(value, float))
        if r.shape != (2,) or not np.all(np.isfinite(r)):
            raise ValueError(f"MomentRatios: the start must be 2 finite ratios [Ix/Iy, Iz/Iy]; got {value!r}")
        a, c = r
        u, v = (c - a + 1) / 2, (a + c - 1) / 2
        # round-off at an edge (a thin plate given as Ix/Iy + 1 = Iz/Iy) stays on it
        tol = 8 * np.finfo(float).eps * max(1.0, a, c)
        if not (-tol <= u <= 1 + tol and -tol <= v <= self.v_max):
            raise ValueError(
                f"MomentRatios: Ix/Iy = {a}, Iz/Iy = {c} is not a physical body (the triangle inequalities "
                f"|Iz/Iy - Ix/Iy| <= 1 <= Ix/Iy + Iz/Iy) or beyond the search (Ix/Iy + Iz/Iy <= 1 + 2 v_max)"
            )
        return np.array([min(max(u, 0.0), 1.0), max(v, 0.0)])

    @staticmethod
    def inertia(r):
        """``diag(Ix/Iy, 1, Iz/Iy)`` (3, 3) of the ratios ``r (2,)`` (JAX): the ``into`` of a
        :class:`rigidjax.identify.Parameter` on a rigid body's inertia."""
        r = jnp.asarray(r)
        return jnp.diag(jnp.stack([r[0], jnp.ones_like(r[0]), r[1]]))


@dataclasses.dataclass(frozen=True)
class PrincipalMoments:
    r"""Principal moments ``value = [Ix, Iy, Iz]`` (kg m^2, shape ``(3,)``) from the second
    moments of the mass distribution ``L = (L_x, L_y, L_z)``, each in ``[0, inf)``.

    .. math:: I_x = L_y + L_z, \qquad I_y = L_x + L_z, \qquad I_z = L_x + L_y

    (``L_x = \int x^2 dm``, body frame at the centre of mass along the principal axes). A body
    is physical exactly when every ``L >= 0`` (the triangle inequalities ``I_x <= I_y + I_z``
    and cyclic: Wensing, Kim & Slotine, IEEE RA-L 3(1), 2018), so the valid set is a box and
    the bounded optimiser reaches its faces exactly: ``L_z = 0`` is the thin plate in the x-y
    plane (``I_z = I_x + I_y``; a racquet, a book), where a least-squares optimum of noisy data
    from a plate lies about half the time. A parametrisation that keeps each moment positive
    (:class:`Positive`) but not the triangle inequality lets the optimiser step off that face
    into invalid bodies (failed steps) and end ``stalled`` there. Two ``L`` at 0 is a rod
    (singular inertia: a step fails there), all three the zero body.

    The absolute counterpart of :class:`MomentRatios`, for motion that fixes the scale (known
    torques). Use with ``Parameter(lambda m: m.inertia, PrincipalMoments(),
    into=PrincipalMoments.inertia, start=[Ix, Iy, Iz])``. ``inverse`` raises for moments that
    violate a triangle inequality (beyond round-off) or are not positive.
    """

    #: see the module: a value known only to more than this (relative) is not determined
    relative_se_max: ClassVar[float] = REL_SE_MAX

    def size(self, like) -> int:
        return 3

    def bounds(self, like):
        return np.zeros(3), np.full(3, np.inf)

    def degenerate(self, u) -> str | None:
        """Why the second moments ``u`` are a rod-like body (see the module), else ``None``."""
        return _rod([u[1] + u[2], u[0] + u[2], u[0] + u[1]], V_MAX)

    def start_scale(self, u0):
        """The random starts' perturbation per coordinate (times ``spread``): the start's mean
        second moment, so that the starts scatter alike in any units (kg m^2 or g cm^2)."""
        return np.full(3, max(float(np.mean(u0)), np.finfo(float).tiny))

    def forward(self, u, like):
        u = jnp.asarray(u)
        return jnp.stack([u[1] + u[2], u[0] + u[2], u[0] + u[1]])

    def inverse(self, value) -> np.ndarray:
        m = np.ravel(np.asarray(value, float))
        if m.shape != (3,) or not np.all(np.isfinite(m)) or not np.all(m > 0):
            raise ValueError(f"PrincipalMoments: the start must be 3 finite moments > 0 [Ix, Iy, Iz]; got {value!r}")
        return _second_moments(m, "PrincipalMoments")

    @staticmethod
    def inertia(m):
        """``diag(Ix, Iy, Iz)`` (3, 3) of the moments ``m (3,)`` (JAX): the ``into`` of a
        :class:`rigidjax.identify.Parameter` on a rigid body's inertia."""
        return jnp.diag(jnp.asarray(m))


@dataclasses.dataclass(frozen=True)
class TensorRatios:
    r"""The full inertia tensor over ``I_yy`` (sensor axes): ``value = [Ix/Iy, Iz/Iy, Ixy/Iy,
    Ixz/Iy, Iyz/Iy]`` (shape ``(5,)``; ``Ixy`` the tensor's entry ``I[0, 1]``, as
    :func:`rigidjax.identify.fit_inertia` reports with ``tensor=True``) from 5 coordinates
    ``(u, v, phi)``: the principal moments of :class:`MomentRatios`' box, ``(I1, I2, I3) = (v
    + 1 - u, 1, u + v)`` (the names a fit's message uses for the edges), along the principal
    axes ``R = Exp(phi)``,

    .. math:: I = R\,\mathrm{diag}(v + 1 - u,\; 1,\; u + v)\,R^T / (\ldots)_{yy},

    every point a physical body, the thin-plate edges (``u = 0, 1``, ``v = 0``) reached exactly
    by the bounded optimiser; ``phi`` is free (the chart of ``fit_inertia(tensor=True)`` with
    its reference axes the sensor axes: ``inverse`` takes the principal axes nearest the sensor
    axes, so ``phi`` starts near 0 for a body whose principal axes are near the sensor's). For
    torque-free motion, which fixes the tensor only up to a factor. Two equal principal moments
    leave the rotation about their common axis undetermined: singular normal equations, the
    fit ``unidentifiable``.

    Use with ``Parameter(lambda m: m.inertia, TensorRatios(), into=TensorRatios.inertia,
    start=[Ix/Iy, Iz/Iy, Ixy/Iy, Ixz/Iy, Iyz/Iy])``. ``inverse`` raises for a tensor that is not
    positive definite, violates a triangle inequality, or lies beyond ``v_max``.

    Args:
        v_max: the upper bound of ``v`` (default :data:`V_MAX`).
    """

    #: see the module; judged on the diagonal ratios (the products of inertia may be 0)
    relative_se_max: ClassVar[float] = REL_SE_MAX
    relative_entries: ClassVar[tuple] = (0, 1)
    #: as :class:`MomentRatios`' (``I1, I2, I3`` the principal moments ``(v + 1 - u, 1, u + v)``)
    beyond: ClassVar[dict] = {(0, "upper"): "I3 > I1 + I2", (0, "lower"): "I1 > I2 + I3", (1, "lower"): "I2 > I1 + I3"}

    v_max: float = V_MAX

    def __post_init__(self):
        if not (np.isfinite(self.v_max) and self.v_max > 0):
            raise ValueError(f"TensorRatios: v_max must be a finite number > 0; got {self.v_max}")
        object.__setattr__(self, "v_max", float(self.v_max))

    def size(self, like) -> int:
        return 5

    def degenerate(self, u) -> str | None:
        """Why the coordinates ``u`` are a rod-like body (see the module), else ``None``."""
        return _rod([u[1] + 1 - u[0], 1.0, u[0] + u[1]], self.v_max)

    def bounds(self, like):
        return np.array([0.0, 0.0, -np.inf, -np.inf, -np.inf]), np.array([1.0, self.v_max, np.inf, np.inf, np.inf])

    def forward(self, u, like):
        u = jnp.asarray(u)
        moments = jnp.stack([u[1] + 1 - u[0], jnp.ones_like(u[0]), u[0] + u[1]])
        i = _rotated(moments, u[2:5])
        return jnp.stack([i[0, 0], i[2, 2], i[0, 1], i[0, 2], i[1, 2]]) / i[1, 1]

    def inverse(self, value) -> np.ndarray:
        r = np.ravel(np.asarray(value, float))
        if r.shape != (5,) or not np.all(np.isfinite(r)):
            raise ValueError(
                f"TensorRatios: the start must be 5 finite ratios [Ix/Iy, Iz/Iy, Ixy/Iy, Ixz/Iy, Iyz/Iy]; got {value!r}"
            )
        moments, phi = _principal_frame(np.asarray(self.inertia(r)), "TensorRatios")
        L = _second_moments(moments / moments[1], "TensorRatios")
        u, v = L[0], L[1]
        if v > self.v_max:
            raise ValueError(f"TensorRatios: principal moments {moments} are beyond the search (v_max)")
        return np.concatenate([[min(u, 1.0), v], phi])

    @staticmethod
    def inertia(r):
        """The tensor ``(3, 3)`` with ``I_yy = 1`` of the ratios ``r (5,)`` (JAX): the ``into``
        of a :class:`rigidjax.identify.Parameter` on a rigid body's inertia."""
        r = jnp.asarray(r)
        one = jnp.ones_like(r[0])
        return jnp.stack([jnp.stack([r[0], r[2], r[3]]), jnp.stack([r[2], one, r[4]]), jnp.stack([r[3], r[4], r[1]])])


@dataclasses.dataclass(frozen=True)
class InertiaTensor:
    r"""A full inertia tensor ``value`` (kg m^2, shape ``(3, 3)``, body axes about the centre
    of mass) from 6 coordinates ``(L, phi)``: the second moments of the mass distribution
    ``L = (L_1, L_2, L_3) >= 0`` along the principal axes ``R = Exp(phi)``,

    .. math:: I = R\,\mathrm{diag}(L_2 + L_3,\; L_1 + L_3,\; L_1 + L_2)\,R^T,

    every point a physical body (positive semidefinite second moments: the triangle
    inequalities), the faces ``L_k = 0`` (thin plates) reached exactly by the bounded
    optimiser; ``phi`` is free (``inverse`` takes the principal axes nearest the body axes).
    The tensor alone of :class:`PseudoInertia`'s 10 parameters, for a fit whose mass and centre
    of mass are known (known torques on a free body); :class:`PrincipalMoments` with rotated
    axes. Two equal principal moments leave the rotation about their common axis undetermined
    (singular normal equations).

    Use with ``Parameter(lambda m: m.inertia, InertiaTensor(), start=I0)``. ``inverse`` raises
    for a tensor that is not symmetric, not positive definite or violates a triangle
    inequality.
    """

    #: see the module; judged on the diagonal (the products of inertia may be 0)
    relative_se_max: ClassVar[float] = REL_SE_MAX
    relative_entries: ClassVar[tuple] = (0, 4, 8)

    def size(self, like) -> int:
        return 6

    def degenerate(self, u) -> str | None:
        """Why the coordinates ``u`` are a rod-like body (see the module), else ``None``."""
        return _rod([u[1] + u[2], u[0] + u[2], u[0] + u[1]], V_MAX)

    def bounds(self, like):
        return np.r_[np.zeros(3), np.full(3, -np.inf)], np.full(6, np.inf)

    def start_scale(self, u0):
        """The random starts' perturbation per coordinate (times ``spread``): the start's mean
        second moment for ``L`` (any units), 1 rad for ``phi``."""
        return np.r_[np.full(3, max(float(np.mean(u0[:3])), np.finfo(float).tiny)), np.ones(3)]

    def forward(self, u, like):
        u = jnp.asarray(u)
        moments = jnp.stack([u[1] + u[2], u[0] + u[2], u[0] + u[1]])
        return _rotated(moments, u[3:6])

    def inverse(self, value) -> np.ndarray:
        moments, phi = _principal_frame(value, "InertiaTensor")
        return np.concatenate([_second_moments(moments, "InertiaTensor"), phi])


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
