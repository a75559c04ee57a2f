r"""Linearly implicit midpoint step of the Newton-Euler equations (seed 000).

Source: ``../shared/seeds/000_767e6f3038d23db2.txt`` (node ``RigidInertialMidpointNode``,
algorithm MIME-NODE-112); references Peraire & Widnall (2009), Solà (2017).

The twist ``V = (v, omega)`` (``v`` world, ``omega`` body) advances by one Rosenbrock step
with the exact Jacobian of the gyroscopic term and the resistance implicit:

.. math::

    V' = V + \Big(\frac{M}{\Delta t} + R - \tfrac12 K\Big)^{-1}
         \Big(F - \begin{bmatrix}0\\ \omega \times I\omega\end{bmatrix} - R V\Big),
    \qquad K = \frac{\partial(-\omega\times I\omega)}{\partial \omega}
             = \widehat{I\omega} - \hat\omega I ,

``M = blockdiag(m I3, I)``. Then ``x' = x + dt v'`` and
``q' = normalize(q ⊗ exp(dt omega'))`` (the seed's update, first order in attitude) or,
with ``attitude="midpoint"``, ``q' = normalize(q ⊗ exp(dt (omega + omega')/2))`` (second
order). Torque-free, kinetic energy and ``|L|`` are kept to second order in ``dt``.

The step matrix is not symmetric for unequal moments: it is solved as a general system.
The seed warns that nothing resolves the gyroscopic term once ``|omega| dt`` exceeds about
0.5; here every step reports ``|omega| dt`` in ``info.rotation`` and flags
``Status.ROTATION_LIMIT`` above ``max_rotation``; checked modes raise on it.
"""

from __future__ import annotations

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp

from . import so3
from ._util import where_tree
from .body import RigidBody, RigidBodyState
from .info import Status, StepInfo, make_info

__all__ = ["gyroscopic_term", "gyroscopic_jacobian", "midpoint_step", "step_matrix"]


def _apply(A, x):
    return jnp.einsum("...ij,...j->...i", A, x)


def gyroscopic_term(inertia: jax.Array, omega: jax.Array) -> jax.Array:
    """``omega × (I omega)`` (…, 3), N m; ``inertia`` (…, 3, 3) body frame, ``omega`` (…, 3) body, rad/s."""
    return jnp.cross(omega, _apply(inertia, omega))


def gyroscopic_jacobian(inertia: jax.Array, omega: jax.Array) -> jax.Array:
    r"""``K = ∂(-omega × I omega)/∂omega = hat(I omega) - hat(omega) I``, (…, 3, 3).

    Closed form for any symmetric inertia tensor (not only diagonal), body frame.
    ``inertia`` (…, 3, 3) kg m^2 or principal moments (…, 3); ``omega`` (…, 3) rad/s.
    """
    inertia = jnp.asarray(inertia)
    if inertia.shape[-2:] != (3, 3):
        inertia = inertia[..., :, None] * jnp.eye(3, dtype=inertia.dtype)
    return so3.hat(_apply(inertia, omega)) - so3.hat(omega) @ inertia


def step_matrix(body: RigidBody, omega: jax.Array, dt) -> jax.Array:
    """The step's matrix ``M/dt + R - K/2`` (…, 6, 6) (``K`` padded to 6x6 in the rotation block)."""
    K = gyroscopic_jacobian(body.inertia, omega)
    Kfull = jnp.zeros((*K.shape[:-2], 6, 6), K.dtype).at[..., 3:, 3:].set(K)
    return body.mass_matrix / dt + body.resistance - 0.5 * Kfull


def midpoint_step(
    body: RigidBody,
    state: RigidBodyState,
    wrench: jax.Array | None,
    dt,
    *,
    attitude: Literal["new", "midpoint"] = "new",
    max_rotation: float = 0.5,
) -> tuple[RigidBodyState, StepInfo]:
    r"""One linearly implicit midpoint step (seed 000). Pure, jit-able, vmap-able, differentiable.

    Args:
        body: :class:`RigidBody` (mass kg, body inertia kg m^2, resistance, gravity).
        state: :class:`RigidBodyState` at time ``t``.
        wrench: applied wrench ``(6,)`` = (force in WORLD, N; torque in BODY about the centre
            of mass, N m), held over the step; ``None`` for zero. Gravity comes from ``body``.
        dt: step, s (scalar > 0; check at the boundary with :func:`rigidjax.rollout`).
        attitude: ``"new"`` turns the orientation by ``exp(dt omega')`` as in the seed (first
            order in attitude); ``"midpoint"`` by ``exp(dt (omega + omega')/2)`` (second order).
        max_rotation: rad; a step with ``|omega| dt`` above it is flagged
            ``Status.ROTATION_LIMIT`` (state still advanced). ``inf`` disables the flag.

    Returns:
        ``(new_state, info)``. ``info.rotation`` is ``max(|omega|, |omega'|) * dt``;
        ``info.iterations`` is 1. If the new state is not finite the input state is returned
        unchanged with ``Status.NONFINITE``.
    """
    if attitude not in ("new", "midpoint"):
        raise ValueError(f"attitude must be 'new' or 'midpoint'; got {attitude!r}")
    dtype = state.angular_velocity.dtype
    dt = jnp.asarray(dt, dtype)
    V = state.twist
    omega = state.angular_velocity
    gyro = gyroscopic_term(body.inertia, omega)
    force = jnp.asarray(body.mass)[..., None] * body.gravity
    F = jnp.concatenate([force, jnp.zeros_like(gyro)], -1)
    if wrench is not None:
        F = F + jnp.asarray(wrench, dtype)
    rhs = F - jnp.concatenate([jnp.zeros_like(gyro), gyro], -1) - _apply(body.resistance, V)
    A = step_matrix(body, omega, dt[..., None, None])
    dV = jnp.linalg.solve(A, rhs[..., None])[..., 0]
    V1 = V + dV
    v1, w1 = V1[..., :3], V1[..., 3:]
    x1 = state.position + dt[..., None] * v1
    w_att = w1 if attitude == "new" else 0.5 * (omega + w1)
    q1 = so3.normalize(so3.multiply(state.orientation, so3.exp(dt[..., None] * w_att)))
    new = eqx.tree_at(
        lambda s: (s.time, s.position, s.orientation, s.velocity, s.angular_velocity),
        state,
        (state.time + dt, x1, q1, v1, w1),
    )
    finite = jnp.all(jnp.isfinite(V1), -1) & jnp.all(jnp.isfinite(q1), -1) & jnp.all(jnp.isfinite(x1), -1)
    new = where_tree(finite, new, state)
    rotation = jnp.maximum(so3.safe_norm(omega), so3.safe_norm(w1)) * dt
    rotation = jnp.where(finite, rotation, so3.safe_norm(omega) * dt)
    status = jnp.where(
        finite, jnp.where(rotation > max_rotation, Status.ROTATION_LIMIT, Status.SUCCESS), Status.NONFINITE
    )
    info = make_info(status, jnp.ones_like(status), jnp.zeros_like(rotation), rotation)
    return new, info

