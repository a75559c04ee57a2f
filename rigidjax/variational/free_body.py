r"""The free rigid body in quaternion coordinates as a :class:`MechanicalSystem`'s parts, and
their recognition by the structure-of-arrays fast path (:mod:`rigidjax.variational.packed`).

``q = (x, e)`` (7,): ``x`` the centre of mass in the WORLD frame (m), ``e = [w, x, y, z]``
the Euler parameters, body to world; ``omega_body = G_b(e) e_dot``
(:func:`rigidjax.so3.g_matrix_body`, which includes the factor 2). :func:`rigidjax.systems.rigid_body`
builds its free body from these parts; a system made of them (and of nothing else) is one
:func:`is_free_body` recognises, so the rollouts run it in closed form.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp

from .. import so3
from ..body import RigidBody
from .system import MechanicalSystem

__all__ = ["FreeBodyLagrangian", "FreeBodyForcing", "unit_norm_constraint", "is_free_body"]


class FreeBodyLagrangian(eqx.Module):
    r"""``L(q, qdot, t) = 1/2 m |x_dot|^2 + 1/2 omega^T I omega + m g · x``, J, with
    ``omega = G_b(e) e_dot`` (rad/s, body frame); mass (kg), inertia (kg m^2, body frame,
    about the centre of mass) and gravity (m/s^2, WORLD) from ``body``."""

    body: RigidBody

    def __call__(self, q, qdot, t):
        x, e = q[:3], q[3:]
        v, edot = qdot[:3], qdot[3:]
        w = so3.g_matrix_body(e) @ edot
        T = 0.5 * self.body.mass * v @ v + 0.5 * w @ (self.body.inertia @ w)
        V = -self.body.mass * self.body.gravity @ x
        return T - V


class FreeBodyForcing(eqx.Module):
    r"""Generalized force (7,) of the wrench ``u = (force_world N, torque_body N m)`` and of the
    resistance ``-R V`` on the twist ``V = (x_dot, G_b(e) e_dot)`` (``R = body.resistance``):
    by virtual work ``f . dx + tau . (G_b de)``, i.e. ``(f, G_b^T tau)``."""

    body: RigidBody

    def __call__(self, q, qdot, u, t):
        e, edot = q[3:], qdot[3:]
        G = so3.g_matrix_body(e)
        twist = jnp.concatenate([qdot[:3], G @ edot])
        wrench = u - self.body.resistance @ twist
        return jnp.concatenate([wrench[:3], G.T @ wrench[3:]])


def unit_norm_constraint(q):
    """The unit-norm constraint ``h(q) = (e·e - 1)/2`` (1,) of the trailing four coordinates
    ``e`` (Euler parameters) of ``q``."""
    e = q[-4:]
    return jnp.atleast_1d(0.5 * (e @ e - 1.0))


def is_free_body(system) -> bool:
    """Whether ``system`` is a free rigid body made of this module's parts: Lagrangian
    :class:`FreeBodyLagrangian`, forcing :class:`FreeBodyForcing`, constraint
    :func:`unit_norm_constraint`, seven coordinates, none kinematic. The fast path's closed form
    is this system's DEL equation; it reports as ``info.rotation`` the attitude angle of a step,
    as :func:`rigidjax.systems.rigid_body`'s ``rotation`` does."""
    return (
        isinstance(system, MechanicalSystem)
        and isinstance(system.lagrangian, FreeBodyLagrangian)
        and isinstance(system.forcing, FreeBodyForcing)
        and getattr(system.constraints, "fn", None) is unit_norm_constraint
        and system.n_config == 7
        and not system.kinematic
    )
