"""Solver status and per-step diagnostics shared by every stepper.

Inside ``jit`` nothing raises: each step returns a :class:`StepInfo` whose ``status``
says, per ensemble member, whether the step succeeded (like diffrax's ``RESULTS``).
Checked modes (``rollout(..., checked=True)``, :func:`check`) and the command line turn a
failure into a :class:`StepFailure` naming the step, the ensemble member and the cause.
"""

from __future__ import annotations

import enum

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .numerics import is_concrete

__all__ = ["Status", "StepInfo", "StepFailure", "check", "make_info", "rotation_status", "step_status"]


class Status(enum.IntEnum):
    """Outcome of one step (stored as ``int32`` in :attr:`StepInfo.status`).

    ``SUCCESS`` and ``ROTATION_LIMIT`` advance the state; every other code is a failure:
    the step returns its input state unchanged (never half-advanced) and rollouts keep a
    failed ensemble member frozen at its last good state.
    """

    SUCCESS = 0
    MAX_ITERATIONS = 1  #: Newton did not reach its tolerance within the iteration cap
    NONFINITE = 2  #: the new state would contain NaN or inf
    SINGULAR = 3  #: the step's linear system is singular (e.g. mass matrix not definite)
    ROTATION_LIMIT = 4  #: |omega| dt above the stepper's ``max_rotation`` (state advanced; accuracy lost)
    #: an input checked only at run time (traced under jit) is out of range: dt <= 0, mass <= 0,
    #: inertia not positive definite or violating the triangle inequality, a rollout's substeps < 1
    INVALID_INPUT = 5

    @property
    def message(self) -> str:
        return _MESSAGES[self]


_MESSAGES = {
    Status.SUCCESS: "success",
    Status.MAX_ITERATIONS: "Newton iteration did not converge within the iteration cap",
    Status.NONFINITE: "the step produced NaN or inf",
    Status.SINGULAR: "the step's linear system is singular",
    Status.ROTATION_LIMIT: (
        "rotation per step |omega|*dt exceeded max_rotation: the gyroscopic term is not resolved, reduce dt"
    ),
    Status.INVALID_INPUT: (
        "an input traced under jit is out of range (dt <= 0, mass <= 0, "
        "an inertia not positive definite or violating the triangle inequality, or a rollout's substeps < 1)"
    ),
}

FAILURES = (Status.MAX_ITERATIONS, Status.NONFINITE, Status.SINGULAR, Status.INVALID_INPUT)


class StepInfo(eqx.Module):
    """Diagnostics of one step; every field has the ensemble's batch shape (scalars per body).

    Attributes:
        status: ``int32``, a :class:`Status` code.
        iterations: ``int32``, Newton iterations used (1 for the linearly implicit midpoint step).
        residual: final residual norm of the step's equations (0 where none is iterated), input dtype.
        rotation: rotation per step ``|omega| * dt`` in rad (the accuracy indicator of every stepper).
    """

    status: jax.Array
    iterations: jax.Array
    residual: jax.Array
    rotation: jax.Array

    @property
    def converged(self) -> jax.Array:
        """``bool``: the step advanced the state (status SUCCESS or ROTATION_LIMIT)."""
        return (self.status == Status.SUCCESS) | (self.status == Status.ROTATION_LIMIT)

    @property
    def failed(self) -> jax.Array:
        return ~self.converged


def make_info(status, iterations, residual, rotation) -> StepInfo:
    """Build a :class:`StepInfo`, casting ``status``/``iterations`` to ``int32``."""
    return StepInfo(
        status=jnp.asarray(status, jnp.int32),
        iterations=jnp.asarray(iterations, jnp.int32),
        residual=jnp.asarray(residual),
        rotation=jnp.asarray(rotation),
    )


def step_status(solve_status=Status.SUCCESS, *, finite, valid) -> jax.Array:
    """Every stepper's failure rule (``int32``, per member), from the most to the least severe:
    ``INVALID_INPUT`` where not ``valid`` (a traced input out of range); else the solve's
    failure (``MAX_ITERATIONS``, ``SINGULAR``, ``NONFINITE``; :mod:`rigidjax.newton`); else
    ``NONFINITE`` where the new state is not ``finite``; else ``SUCCESS``. ``solve_status`` is
    ``SUCCESS`` for a linearly implicit step. A step then applies :func:`rotation_status`.
    """
    status = jnp.asarray(solve_status, jnp.int32)
    status = jnp.where((status == Status.SUCCESS) & ~finite, Status.NONFINITE, status)
    return jnp.where(valid, status, Status.INVALID_INPUT).astype(jnp.int32)


def rotation_status(status, rotation, max_rotation) -> jax.Array:
    """``ROTATION_LIMIT`` where a successful step turned by ``rotation > max_rotation`` (rad)."""
    return jnp.where((status == Status.SUCCESS) & (rotation > max_rotation), Status.ROTATION_LIMIT, status)


class StepFailure(RuntimeError):
    """Raised by checked modes when a step failed or exceeded ``max_rotation``."""


def failure_mask(status: jax.Array, allow_rotation_limit: bool = False) -> jax.Array:
    """``bool`` array: where ``status`` is a failure (and ROTATION_LIMIT unless allowed)."""
    codes = list(FAILURES) + ([] if allow_rotation_limit else [Status.ROTATION_LIMIT])
    return jnp.isin(status, jnp.asarray([int(c) for c in codes], jnp.int32))


def check(info: StepInfo, *, allow_rotation_limit: bool = False, leading: str = "step") -> StepInfo:
    """Raise :class:`StepFailure` if any step / ensemble member did not succeed.

    ``info`` may hold one step or a whole rollout (leading time axis, then ensemble axes).
    Outside ``jit`` the message names the first bad step, the ensemble member, the status
    and the rotation per step; inside ``jit`` an ``equinox.error_if`` raises at run time.
    ``leading``: what an entry of the leading axis is, for the message: ``"step"``, or a
    noun and its detail in brackets (a rollout with ``save_every`` or ``substeps``:
    ``"sample interval (4 steps each)"``, whose ``info`` holds the largest rotation and
    iteration count of its steps).

    Returns ``info`` unchanged (so it can be chained).
    """
    bad_codes = list(FAILURES) + ([] if allow_rotation_limit else [Status.ROTATION_LIMIT])
    if is_concrete(info.status):
        status = np.asarray(info.status)
        bad = np.isin(status, [int(c) for c in bad_codes])
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            code = Status(int(status[idx]))
            rot = float(np.asarray(info.rotation)[idx])
            n_bad = int(bad.sum())
            where = f"index {idx} (leading axis = {leading} for rollouts, then ensemble member)"
            per = "" if leading == "step" else "largest per step "
            raise StepFailure(
                f"rigidjax: {code.name} at {where}: {code.message}. "
                f"{per}|omega|*dt there = {rot:.3g} rad, {per}iterations = {int(np.asarray(info.iterations)[idx])}. "
                f"{n_bad} {leading.split(' (')[0]}(s) affected in total."
            )
        return info
    bad = failure_mask(info.status, allow_rotation_limit)
    status = eqx.error_if(
        info.status, bad, "rigidjax: a step failed (see StepInfo.status; Status codes in rigidjax.info)"
    )
    return eqx.tree_at(lambda i: i.status, info, status)
