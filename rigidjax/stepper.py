"""The stepper protocol: what :func:`rigidjax.rollout` and :func:`rigidjax.ensemble_rollout` ask of a step.

A *step* is any callable ``step(model, state, inputs, dt) -> (state, info)`` with ``info`` a
:class:`rigidjax.StepInfo`. The rollouts run any such callable through its public form. A
*stepper object* (a subclass of :class:`AbstractStepper`: an ``equinox.Module`` whose fields
are its options, e.g. :class:`rigidjax.Midpoint`) may also offer a faster equivalent form
through :meth:`AbstractStepper.packed`; the rollouts ask for it and import no stepper.

A plain step function (``rigidjax.midpoint_step``, ``ep_step``, ``vi_step``) names its
stepper class in the attribute ``stepper``: :func:`as_stepper` turns the function, or a
``functools.partial`` of it with keyword options only, into that class's object, so
``rollout(partial(midpoint_step, attitude="midpoint"), ...)`` runs the fast form as
``rollout(Midpoint(attitude="midpoint"), ...)`` does.

Layers (``docs/architecture.md``): this module sits below the steppers and rollouts and
imports neither.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import numbers
from typing import Callable

import equinox as eqx
import numpy as np

__all__ = ["AbstractStepper", "PackedStep", "as_stepper", "check_options", "make", "packed_form", "unwrap_partial"]


class PackedStep(eqx.Module):
    """A stepper's structure-of-arrays form, for the rollouts' fast path.

    Fields (all static: functions, not data):
        pack: ``pack(state) -> carry``, the public state as per-component arrays.
        unpack: ``unpack(carry, like) -> state``, back to the layout of ``like`` (a state or
            a shape-only template of one).
        step: ``step(model, carry, inputs, dt, active) -> (carry, info)``: equal to the public
            step on ``unpack(carry)`` for members where ``active`` is True (the same iterates,
            round-off apart) and returning inactive members unchanged.
        check: ``check(model, state, inputs, dt)``: the public step's shape checks (raises
            ``ValueError``/``TypeError`` at trace time), run on the public view.
        discrete_adjoint: ``None``, or ``discrete_adjoint(body, model, carry0, dt, loads, n)
            -> (states, info)``: the scan of ``body`` over ``n`` steps with a hand-written
            reverse-mode derivative (``rollout(..., adjoint="discrete")``).
        native_batch: ``step`` takes leading ensemble axes on model, carry and inputs as they
            are, so :func:`rigidjax.ensemble_rollout` runs one rollout over its local members
            (every component contiguous over them) instead of ``vmap`` over members.
    """

    pack: Callable = eqx.field(static=True)
    unpack: Callable = eqx.field(static=True)
    step: Callable = eqx.field(static=True)
    check: Callable = eqx.field(static=True)
    discrete_adjoint: Callable | None = eqx.field(static=True, default=None)
    native_batch: bool = eqx.field(static=True, default=False)


class AbstractStepper(eqx.Module):
    """Base of the stepper objects: options as (static) fields, called as a step.

    Subclasses implement ``__call__(model, state, inputs, dt) -> (state, info)`` and may
    override :meth:`packed`. Options are checked when the object is made (``ValueError``).
    """

    @abc.abstractmethod
    def __call__(self, model, state, inputs, dt):
        """One step: ``(new_state, rigidjax.StepInfo)``."""

    def packed(self, model) -> PackedStep | None:
        """The structure-of-arrays form of this stepper on ``model``, or ``None`` where there
        is none (the rollouts then run :meth:`__call__`)."""
        return None

    def rate_step(self, model, *, uncoupled: bool = False) -> Callable | None:
        """The step of the body angular velocity alone, where it evolves independently of the
        rest of the state on ``model`` (e.g. a free body: Euler's equations), or ``None``.

        ``rate_step(omega (3,), torque (3,) or None, dt) -> (omega', status)`` with the
        stepper's own numbers and status rule for ``omega'`` (round-off apart): a fit whose
        observations read only the body rate (:mod:`rigidjax.identify`) rolls it out instead
        of the whole state, so its Jacobian carries 3 components instead of the state's 13.
        ``uncoupled``: the caller states that the parts of ``model`` that could couple the
        rate to the rest of the state are zero whatever their (traced) values, e.g. a fitted
        angular drag (a stepper checks the statement at run time where it takes it)."""
        return None


def check_options(stepper, *, rotation=True, newton=True) -> None:
    """The option checks every stepper shares (``ValueError`` naming the option):
    ``max_rotation`` a number ``> 0`` rad (``inf`` disables the flag); with ``newton``,
    ``max_iterations`` an integer ``>= 1`` and ``rtol``/``atol`` ``None`` or finite ``>= 0``."""
    name = type(stepper).__name__
    if rotation:
        r = stepper.max_rotation
        if isinstance(r, bool) or not isinstance(r, numbers.Real) or not r > 0:
            raise ValueError(f"{name}: max_rotation must be a number > 0 rad (inf disables the flag); got {r!r}")
    if newton:
        k = stepper.max_iterations
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"{name}: max_iterations must be an integer >= 1; got {k!r}")
        for tol in ("rtol", "atol"):
            v = getattr(stepper, tol)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 <= v < np.inf):
                raise ValueError(f"{name}: {tol} must be None (the dtype's default) or a finite number >= 0; got {v!r}")


def make(cls, function: str, options: dict):
    """``cls(**options)`` for the function form ``function`` of a stepper; an unknown option
    raises a ``TypeError`` that names the function and the options it takes."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"{function}: unknown option(s) {unknown}; the options are {known} (rigidjax.{cls.__name__})")
    return cls(**options)


def unwrap_partial(step):
    """``(function, keyword options)`` of a step bound through (nested) ``functools.partial``
    with keywords only; ``(None, {})`` if any positional argument is bound."""
    kwargs = {}
    while isinstance(step, functools.partial):
        if step.args:
            return None, {}
        kwargs = {**step.keywords, **kwargs}
        step = step.func
    return step, kwargs


def as_stepper(step):
    """The stepper object behind ``step``, or ``step`` itself.

    ``step`` is returned as it is when it already is an :class:`AbstractStepper` or a callable
    that names no stepper class. A function with a ``stepper`` attribute (the class), bare or
    bound through ``functools.partial`` with keyword options that are all fields of that class,
    gives ``stepper(**options)``: invalid option values raise that class's ``ValueError``.
    Options the class does not have leave ``step`` as it is (its public form then runs).
    """
    if isinstance(step, AbstractStepper):
        return step
    fn, kwargs = unwrap_partial(step)
    cls = getattr(fn, "stepper", None)
    if cls is None or not (isinstance(cls, type) and issubclass(cls, AbstractStepper)):
        return step
    if not set(kwargs) <= {f.name for f in dataclasses.fields(cls)}:
        return step
    return cls(**kwargs)


def packed_form(step, model) -> PackedStep | None:
    """The :class:`PackedStep` the rollouts use for ``step`` on ``model``, or ``None``."""
    stepper = as_stepper(step)
    return stepper.packed(model) if isinstance(stepper, AbstractStepper) else None
