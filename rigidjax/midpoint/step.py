"""The public midpoint stepper: :class:`Midpoint` and :func:`midpoint_step` (equations: the package docstring)."""

from __future__ import annotations

import functools
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..body import RigidBody, RigidBodyState, check_step_inputs
from ..info import StepInfo, rotation_status, step_status
from ..numerics import full_precision, norm3
from ..stepper import AbstractStepper, PackedStep, check_options, make
from .adjoint import discrete_adjoint_scan
from .core import _packed_step, _valid_inputs, pack_state, unpack_state
from .equations import angular_velocity_step

__all__ = ["Midpoint", "midpoint_step"]


class Midpoint(AbstractStepper):
    r"""The linearly implicit midpoint step (seed 000) as a stepper object.

    Fields (options, checked when made):
        attitude: ``"new"`` turns the orientation by ``exp(dt omega')`` as in the seed (first
            order in attitude); ``"midpoint"`` by ``exp(dt (omega + omega')/2)`` (second order).
        max_rotation: rad; a step with ``|omega| dt`` above it is flagged
            ``Status.ROTATION_LIMIT`` (state still advanced). ``inf`` disables the flag.

    ``Midpoint(...)(body, state, inputs, dt) -> (new_state, info)``:

    Args:
        body: :class:`rigidjax.RigidBody` (mass kg, body inertia kg m^2, resistance, gravity).
        state: :class:`rigidjax.RigidBodyState` at time ``t``.
        inputs: the applied wrench ``(..., 6)`` = (force in WORLD, N; torque in BODY about
            the centre of mass, N m), held over the step; ``None`` for zero. Gravity comes
            from ``body``.
        dt: step, s, scalar > 0 (checked where concrete; inside ``jit`` a traced ``dt`` is
            not inspected: :func:`rigidjax.rollout` checks it before tracing).

    Raises:
        ValueError: ``inputs`` not of shape ``(..., 6)``; ``dt <= 0`` or NaN (concrete);
            body and state batch shapes that do not match; an unknown ``attitude``.
        TypeError: body and state of different float dtypes (e.g. float64 body, float32 state).

    Returns:
        ``(new_state, info)``. ``info.rotation`` is ``max(|omega|, |omega'|) * dt``;
        ``info.iterations`` is 1. If the new state is not finite the input state is returned
        unchanged with ``Status.NONFINITE``; where values traced under ``jit`` are out of range
        (``dt <= 0``, ``mass <= 0``, inertia not positive definite or violating the triangle
        inequality) it is returned unchanged with ``Status.INVALID_INPUT``.

    The rollouts run it in structure-of-arrays form (:meth:`packed`), and
    ``rollout(..., adjoint="discrete")`` differentiates it by the hand-written discrete
    adjoint of :mod:`rigidjax.midpoint.adjoint`.
    """

    attitude: Literal["new", "midpoint"] = eqx.field(static=True, default="new")
    max_rotation: float = eqx.field(static=True, default=0.5)

    def __check_init__(self):
        if self.attitude not in ("new", "midpoint"):
            raise ValueError(f"attitude must be 'new' or 'midpoint'; got {self.attitude!r}")
        check_options(self, newton=False)

    @full_precision
    def __call__(
        self, body: RigidBody, state: RigidBodyState, inputs: jax.Array | None, dt
    ) -> tuple[RigidBodyState, StepInfo]:
        check_step_inputs(body, state, inputs, dt, "midpoint_step")
        carry, info = _packed_step(body, pack_state(state), inputs, dt, None, self.attitude, self.max_rotation)
        return unpack_state(carry, state), info

    def packed(self, model) -> PackedStep | None:
        """The step on a :class:`rigidjax.midpoint.MidpointCarry` (any :class:`RigidBody`)."""
        if not isinstance(model, RigidBody):
            return None
        return PackedStep(
            pack=pack_state,
            unpack=unpack_state,
            step=functools.partial(_packed_step, attitude=self.attitude, max_rotation=self.max_rotation),
            check=functools.partial(check_step_inputs, where="midpoint_step"),
            discrete_adjoint=functools.partial(discrete_adjoint_scan, attitude=self.attitude),
            native_batch=True,
        )

    def rate_step(self, model, *, uncoupled: bool = False):
        """The body-rate part of this step (see :meth:`rigidjax.stepper.AbstractStepper.rate_step`):
        :func:`rigidjax.midpoint.angular_velocity_step` with the step's validity, acceptance
        and rotation-limit rule, for a :class:`RigidBody` whose resistance does not couple
        translation and rotation (its off-diagonal 3x3 blocks zero). Gravity, applied forces
        and the attitude then do not enter ``omega'``.

        A concrete resistance is inspected: coupling blocks not zero give ``None``. A traced
        resistance (being fitted) gives ``None`` unless ``uncoupled`` (the caller states that
        those blocks are zero whatever the fitted values, e.g. a fitted angular drag
        ``blockdiag(0, D)``: :mod:`rigidjax.identify` decides it from the parametrisation);
        the step then takes the rotation block ``D = R[3:, 3:]`` and reports
        :attr:`~rigidjax.Status.INVALID_INPUT` where the coupling blocks are not zero (a
        statement that does not hold is a failed step, never a silently wrong ``omega'``)."""
        if not isinstance(model, RigidBody):
            return None
        R = model.resistance
        coupling = None
        if isinstance(R, jax.core.Tracer):
            if not uncoupled or R.ndim != 2:
                return None
            damping, coupling = R[3:, 3:], jnp.concatenate([R[:3, 3:], R[3:, :3]])
        else:
            R = np.asarray(R)
            if R.ndim != 2 or np.any(R[:3, 3:]) or np.any(R[3:, :3]):
                return None
            damping = R[3:, 3:] if np.any(R[3:, 3:]) else None
        max_rotation = self.max_rotation

        def step(omega, torque, dt):
            dt = jnp.asarray(dt, omega.dtype)
            valid = _valid_inputs(model, dt, ())
            if coupling is not None:
                valid = valid & jnp.all(coupling == 0)
            w1 = angular_velocity_step(model.inertia, omega, dt, damping=damping, torque=torque)
            ok = jnp.all(jnp.isfinite(w1)) & valid
            n0 = norm3(tuple(omega[i] for i in range(3)))
            rotation = jnp.where(ok, jnp.maximum(n0, norm3(tuple(w1[i] for i in range(3)))), n0) * dt
            status = rotation_status(step_status(finite=ok | ~valid, valid=valid), rotation, max_rotation)
            return jnp.where(ok, w1, omega), status

        return step


def midpoint_step(
    body: RigidBody, state: RigidBodyState, inputs: jax.Array | None, dt, **options
) -> tuple[RigidBodyState, StepInfo]:
    """One linearly implicit midpoint step: ``Midpoint(**options)(body, state, inputs, dt)``.

    Pure, jit-able, vmap-able, differentiable. ``options`` are :class:`Midpoint`'s fields
    (``attitude``, ``max_rotation``); arguments, returns and errors are :class:`Midpoint`'s.
    Bind options with ``functools.partial(midpoint_step, attitude="midpoint")``: the rollouts
    then run the same stepper object (``midpoint_step.stepper``).
    """
    return make(Midpoint, "midpoint_step", options)(body, state, inputs, dt)


midpoint_step.stepper = Midpoint
