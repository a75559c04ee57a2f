r"""Mass properties of rigid parts: standard solids, sums, parallel-axis shifts, rotations.

Source: the inertia helpers that go with Exudyn's ``ObjectRigidBody`` (seed 002:
``InertiaCuboid(density, sideLengths)``, ``GetInertia6D()``); formulas from any
mechanics text (e.g. Meriam & Kraige, *Engineering Mechanics: Dynamics*, appendix D).

A part is described by :class:`InertiaProperties` ``(mass, com, inertia)`` in the PART
frame: ``com`` is the centre of mass (m), ``inertia`` the tensor about the centre of mass
(kg m^2). Parts add (``a + b``, ``sum([...])``): masses add, the centre of mass is the
mass-weighted mean and each part's inertia moves to the common centre of mass with the
parallel-axis (Huygens-Steiner) theorem ``I_P = I_C + m (|d|^2 E - d d^T)``.
``to_rigid_body()`` gives the :class:`rigidjax.RigidBody` (inertia about the centre of
mass), ``inertia_about(point)`` the tensor about any other point.

The 6-vector order is Exudyn's ``[Ixx, Iyy, Izz, Iyz, Ixz, Ixy]`` (:func:`to_inertia6`,
:func:`from_inertia6`).

Everything is JAX (differentiable in densities, dimensions and positions) and follows the
input dtype. Physically impossible inputs (negative mass or density, negative lengths, an
inner radius above the outer one, an inertia that is not positive semi-definite or breaks
the triangle inequality ``I_i + I_j >= I_k``) raise ``ValueError`` where values are concrete.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .numerics import as_float, check_finite, full_precision, is_concrete
from .body import RigidBody

__all__ = [
    "InertiaProperties",
    "cuboid",
    "cylinder",
    "sphere",
    "hollow_sphere",
    "rod",
    "point_mass",
    "to_inertia6",
    "from_inertia6",
    "parallel_axis",
]


def _arr(x, name, shape=None):
    a = as_float(x, name)
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {a.shape}")
    check_finite(a, name)
    return a


def _nonneg(a, name, strict=False):
    if is_concrete(a):
        v = np.asarray(a)
        if np.any(v < 0) or (strict and np.any(v == 0)):
            raise ValueError(f"{name} must be {'> 0' if strict else '>= 0'}; got {v}")


def _check_semidefinite(J, name="inertia", rtol=1e-9):
    """Physical inertia of a part (possibly massless along an axis): symmetric, PSD, triangle inequality."""
    if not is_concrete(J):
        return
    J = np.asarray(J, float)
    scale = abs(np.trace(J)) + 1e-300
    if np.any(np.abs(J - J.T) > 10 * rtol * scale):
        raise ValueError(f"{name} must be symmetric; got {J.tolist()}")
    moments = np.linalg.eigvalsh(0.5 * (J + J.T))
    if np.any(moments < -rtol * scale):
        raise ValueError(f"{name} must be positive semi-definite; principal moments are {moments.tolist()} kg m^2")
    excess = moments - (moments.sum() - moments)
    if np.any(excess > rtol * scale):
        raise ValueError(
            f"{name} violates the triangle inequality I_i + I_j >= I_k (no mass distribution has it); "
            f"principal moments are {moments.tolist()} kg m^2"
        )


@full_precision
def parallel_axis(mass, inertia, d) -> jax.Array:
    r"""Inertia (3, 3) about a point at ``-d`` from the centre of mass: ``I + m (|d|^2 E - d d^T)``.

    ``inertia`` is about the centre of mass, ``d`` (3,) the vector from the new point to
    the centre of mass (m); ``mass`` kg. Huygens-Steiner theorem.

    Raises:
        ValueError: ``d`` not of shape (3,), ``inertia`` not (3, 3), ``mass`` not a scalar
            (shapes are static, so this holds under ``jit`` too).
    """
    d = jnp.asarray(d)
    if d.shape != (3,):
        raise ValueError(
            f"parallel_axis: d (offset from the new point to the centre of mass, m) must have shape (3,); got {d.shape}"
        )
    if jnp.shape(inertia) != (3, 3):
        raise ValueError(f"parallel_axis: inertia must have shape (3, 3); got {jnp.shape(inertia)}")
    if jnp.ndim(mass) != 0:
        raise ValueError(f"parallel_axis: mass must be a scalar (kg); got shape {jnp.shape(mass)}")
    E = jnp.eye(3, dtype=d.dtype)
    return inertia + mass * (jnp.dot(d, d) * E - jnp.outer(d, d))


class InertiaProperties(eqx.Module):
    r"""Mass, centre of mass and inertia of a rigid part, in the part frame.

    Attributes:
        mass: kg, scalar ``>= 0``.
        com: centre of mass (3,), m, in the part frame.
        inertia: (3, 3) tensor about the centre of mass in the part frame, kg m^2;
            symmetric positive semi-definite with ``I_i + I_j >= I_k`` (a thin rod or a
            point mass has zero moments; :meth:`to_rigid_body` needs positive definite).

    Operations (all differentiable, return new objects):
        ``a + b`` / ``sum(parts)``: the combined part (masses add, parallel-axis shift to the
        common centre of mass). ``translated(offset)``: the part moved by ``offset`` (3,) in
        its frame (centre of mass moves, inertia about it unchanged). ``rotated(R)``: the part
        turned by the rotation matrix ``R`` (3, 3) about the frame origin (``com -> R com``,
        ``I -> R I R^T``). ``inertia_about(point)``: tensor about ``point`` (parallel axis).
        ``inertia6``: ``[Ixx, Iyy, Izz, Iyz, Ixz, Ixy]`` about the centre of mass.
        ``to_rigid_body(resistance=None, gravity=None)``: the :class:`rigidjax.RigidBody`.

    Raises:
        ValueError: wrong shapes, NaN, negative mass, non-physical inertia (where concrete).

    Example (the seed's cuboid)::

        part = cuboid([0.4, 0.2, 0.1], density=1000.0)   # 8 kg
        body = part.to_rigid_body()
    """

    mass: jax.Array
    com: jax.Array
    inertia: jax.Array

    def __init__(self, mass, com=None, inertia=None):
        mass = _arr(mass, "mass", ())
        dtype = mass.dtype
        com = jnp.zeros(3, dtype) if com is None else _arr(com, "com", (3,))
        inertia = jnp.zeros((3, 3), dtype) if inertia is None else _arr(inertia, "inertia", (3, 3))
        _nonneg(mass, "mass")
        _check_semidefinite(inertia)
        self.mass = mass
        self.com = com
        self.inertia = inertia

    def __add__(self, other: "InertiaProperties") -> "InertiaProperties":
        if not isinstance(other, InertiaProperties):
            return NotImplemented
        m = self.mass + other.mass
        # a massless sum has no centre of mass; keep the origin there (inertia is zero anyway)
        safe_m = jnp.where(m > 0, m, 1)
        com = jnp.where(m > 0, (self.mass * self.com + other.mass * other.com) / safe_m, 0 * self.com)
        J = parallel_axis(self.mass, self.inertia, self.com - com) + parallel_axis(
            other.mass, other.inertia, other.com - com
        )
        return InertiaProperties(m, com, 0.5 * (J + J.T))

    def __radd__(self, other):
        # lets the builtin sum() start from 0
        if isinstance(other, (int, float)) and other == 0:
            return self
        return NotImplemented

    def translated(self, offset) -> "InertiaProperties":
        """The part moved by ``offset`` (3,), m, in its frame; inertia about the centre of mass unchanged."""
        return InertiaProperties(self.mass, self.com + _arr(offset, "offset", (3,)), self.inertia)

    def rotated(self, rotation) -> "InertiaProperties":
        """The part turned about the frame origin by the rotation matrix ``rotation`` (3, 3)."""
        R = _arr(rotation, "rotation", (3, 3))
        if is_concrete(R):
            Rn = np.asarray(R, float)
            if not np.allclose(Rn @ Rn.T, np.eye(3), atol=1e-6) or np.linalg.det(Rn) < 0:
                raise ValueError(
                    f"rotation must be a proper rotation matrix (R R^T = E, det R = +1); got {Rn.tolist()}"
                )
        J = R @ self.inertia @ R.T
        return InertiaProperties(self.mass, R @ self.com, 0.5 * (J + J.T))

    def inertia_about(self, point=None) -> jax.Array:
        """Inertia tensor (3, 3) about ``point`` (3,) of the part frame (default: its origin), kg m^2."""
        p = jnp.zeros(3, self.com.dtype) if point is None else _arr(point, "point", (3,))
        return parallel_axis(self.mass, self.inertia, self.com - p)

    @property
    def inertia6(self) -> jax.Array:
        """``[Ixx, Iyy, Izz, Iyz, Ixz, Ixy]`` (6,) about the centre of mass, kg m^2 (Exudyn's GetInertia6D)."""
        return to_inertia6(self.inertia)

    def to_rigid_body(self, resistance=None, gravity=None) -> RigidBody:
        """The :class:`rigidjax.RigidBody` of this part (inertia about its centre of mass, part axes).

        Raises ``ValueError`` (from :class:`rigidjax.RigidBody`) if the mass is zero or the
        inertia is not positive definite (a thin rod or a lone point mass).
        """
        return RigidBody(self.mass, self.inertia, resistance=resistance, gravity=gravity)


def to_inertia6(inertia) -> jax.Array:
    """``[Ixx, Iyy, Izz, Iyz, Ixz, Ixy]`` (…, 6) of a tensor (…, 3, 3) (Exudyn's order)."""
    J = jnp.asarray(inertia)
    if J.shape[-2:] != (3, 3):
        raise ValueError(f"inertia must have shape (…, 3, 3); got {J.shape}")
    return jnp.stack([J[..., 0, 0], J[..., 1, 1], J[..., 2, 2], J[..., 1, 2], J[..., 0, 2], J[..., 0, 1]], -1)


def from_inertia6(inertia6) -> jax.Array:
    """Symmetric tensor (…, 3, 3) from ``[Ixx, Iyy, Izz, Iyz, Ixz, Ixy]`` (…, 6)."""
    v = jnp.asarray(inertia6)
    if v.shape[-1:] != (6,):
        raise ValueError(f"inertia6 must have shape (…, 6) = [Ixx, Iyy, Izz, Iyz, Ixz, Ixy]; got {v.shape}")
    xx, yy, zz, yz, xz, xy = (v[..., i] for i in range(6))
    return jnp.stack(
        [jnp.stack([xx, xy, xz], -1), jnp.stack([xy, yy, yz], -1), jnp.stack([xz, yz, zz], -1)],
        -2,
    )


def _mass_of(volume, density, mass, shape_name):
    if (density is None) == (mass is None):
        raise ValueError(f"{shape_name}: give exactly one of density (kg/m^3) or mass (kg)")
    if mass is not None:
        m = _arr(mass, "mass", ())
        _nonneg(m, "mass")
        return m
    rho = _arr(density, "density", ())
    _nonneg(rho, "density")
    return rho * volume


def cuboid(side_lengths, density=None, *, mass=None) -> InertiaProperties:
    r"""Solid cuboid centred at the origin with edges along the axes.

    Args:
        side_lengths: ``(a, b, c)`` along x, y, z, m, each > 0.
        density: kg/m^3 (or give ``mass`` in kg instead).

    ``I = m/12 diag(b^2 + c^2, a^2 + c^2, a^2 + b^2)`` (Exudyn's ``InertiaCuboid``).
    """
    s = _arr(side_lengths, "side_lengths", (3,))
    _nonneg(s, "side_lengths", strict=True)
    m = _mass_of(s[0] * s[1] * s[2], density, mass, "cuboid")
    sq = s * s
    J = m / 12 * jnp.diag(jnp.stack([sq[1] + sq[2], sq[0] + sq[2], sq[0] + sq[1]]))
    return InertiaProperties(m, jnp.zeros(3, J.dtype), J)


def _axis_index(axis):
    if axis not in (0, 1, 2):
        raise ValueError(f"axis must be 0, 1 or 2 (x, y, z); got {axis!r}")
    return axis


def _axial_tensor(axial, transverse, axis, dtype):
    d = jnp.stack([transverse, transverse, transverse]).astype(dtype)
    d = d.at[axis].set(axial)
    return jnp.diag(d)


def cylinder(length, outer_radius, density=None, *, inner_radius=0.0, axis=0, mass=None) -> InertiaProperties:
    r"""Solid or hollow circular cylinder (tube) centred at the origin, axis along ``axis``.

    Args:
        length: m, > 0. outer_radius: m, > 0. inner_radius: m, ``0 <= inner < outer``.
        density: kg/m^3 (or ``mass`` in kg). axis: 0, 1 or 2 (x, y, z).

    ``I_axial = m (R^2 + r^2)/2``, ``I_transverse = m (3 (R^2 + r^2) + L^2)/12``.
    """
    axis = _axis_index(axis)
    L = _arr(length, "length", ())
    R = _arr(outer_radius, "outer_radius", ())
    r = _arr(inner_radius, "inner_radius", ())
    _nonneg(L, "length", strict=True)
    _nonneg(R, "outer_radius", strict=True)
    _nonneg(r, "inner_radius")
    if is_concrete(R) and is_concrete(r) and float(r) >= float(R):
        raise ValueError(f"inner_radius must be < outer_radius; got {float(r)} >= {float(R)}")
    m = _mass_of(jnp.pi * (R * R - r * r) * L, density, mass, "cylinder")
    s = R * R + r * r
    J = _axial_tensor(m * s / 2, m * (3 * s + L * L) / 12, axis, jnp.result_type(m, L))
    return InertiaProperties(m, jnp.zeros(3, J.dtype), J)


def sphere(radius, density=None, *, mass=None) -> InertiaProperties:
    """Solid sphere centred at the origin: ``I = 2/5 m r^2`` about every axis."""
    r = _arr(radius, "radius", ())
    _nonneg(r, "radius", strict=True)
    m = _mass_of(4 / 3 * jnp.pi * r**3, density, mass, "sphere")
    return InertiaProperties(m, jnp.zeros(3, r.dtype), 0.4 * m * r * r * jnp.eye(3, dtype=r.dtype))


def hollow_sphere(outer_radius, inner_radius, density=None, *, mass=None) -> InertiaProperties:
    r"""Spherical shell between ``inner_radius`` and ``outer_radius`` (m), centred at the origin.

    ``I = 2/5 m (R^5 - r^5)/(R^3 - r^3)``; with ``inner_radius == outer_radius`` and ``mass``
    given, the thin shell ``I = 2/3 m R^2`` (Exudyn's ``InertiaHollowSphere``).
    """
    R = _arr(outer_radius, "outer_radius", ())
    r = _arr(inner_radius, "inner_radius", ())
    _nonneg(R, "outer_radius", strict=True)
    _nonneg(r, "inner_radius")
    if is_concrete(R) and is_concrete(r):
        if float(r) > float(R):
            raise ValueError(f"inner_radius must be <= outer_radius; got {float(r)} > {float(R)}")
        if float(r) == float(R) and mass is None:
            raise ValueError("hollow_sphere: a thin shell (inner_radius == outer_radius) has no volume; give mass")
    m = _mass_of(4 / 3 * jnp.pi * (R**3 - r**3), density, mass, "hollow_sphere")
    # (R^5 - r^5)/(R^3 - r^3) written without the 0/0 of the thin shell
    k = r / R
    ratio = R * R * (1 + k + k**2 + k**3 + k**4) / (1 + k + k**2)
    return InertiaProperties(m, jnp.zeros(3, R.dtype), 0.4 * m * ratio * jnp.eye(3, dtype=R.dtype))


def rod(mass, length, axis=0) -> InertiaProperties:
    """Thin straight rod centred at the origin along ``axis``: ``m L^2/12`` transverse, 0 axial.

    Zero axial moment: add it to other parts (or use :func:`cylinder`) before
    :meth:`InertiaProperties.to_rigid_body`, which needs a positive definite inertia.
    """
    axis = _axis_index(axis)
    m = _arr(mass, "mass", ())
    L = _arr(length, "length", ())
    _nonneg(m, "mass")
    _nonneg(L, "length", strict=True)
    J = _axial_tensor(jnp.zeros((), m.dtype), m * L * L / 12, axis, jnp.result_type(m, L))
    return InertiaProperties(m, jnp.zeros(3, J.dtype), J)


def point_mass(mass, position=None) -> InertiaProperties:
    """A point mass (kg) at ``position`` (3,), m: zero inertia about its own centre of mass."""
    m = _arr(mass, "mass", ())
    _nonneg(m, "mass")
    com = jnp.zeros(3, m.dtype) if position is None else _arr(position, "position", (3,))
    return InertiaProperties(m, com, jnp.zeros((3, 3), jnp.result_type(m, com)))
