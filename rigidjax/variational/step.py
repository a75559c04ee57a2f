r"""The step of the midpoint variational integrator: the DEL residual, its Newton solve, the
stepper object :class:`MidpointVI` and :func:`vi_step`, and the discrete map of one step.

Equations and sources: the package docstring (:mod:`rigidjax.variational`).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import newton
from ..info import Status, StepInfo, make_info, rotation_status, step_status
from ..linalg import METHODS, lu_factor_small, lu_solve_small
from ..linalg import singular as linalg_singular
from ..numerics import as_float, check_kinds, check_step_dt, full_precision, where_tree
from ..stepper import AbstractStepper, PackedStep, check_options, make
from .packed import free_body_packed_step
from .system import (
    MechanicalSystem,
    VIState,
    _assemble,
    _check_input_batch,
    _check_last,
    _check_split,
    _check_vi_state,
    _default_tol,
    _dyn,
    _forcing_minus_plus,
    _new_momentum,
    _split_inputs,
    discrete_lagrangian,
)

__all__ = ["MidpointVI", "vi_step", "del_residual", "discrete_map"]


@full_precision
def del_residual(system: MechanicalSystem, x, q1, p1, u, rho, t1, dt, forcing_split: str = "left") -> jax.Array:
    r"""Residual ``(n_dynamic + n_constraints,)`` of the constrained DEL equation.

    ``x = (q2_dynamic, lambda1)``; returns ``(p1 + D1 L_d + f_d^- - Dh(q1)^T lambda1)_dynamic``
    stacked over ``h(q2)``. Single member (no batch axes).
    """
    nd = system.n_dynamic
    t2 = t1 + dt
    q2 = _assemble(system, x[:nd], rho)
    lam = x[nd:]
    D1 = jax.grad(discrete_lagrangian, argnums=1)(system, q1, q2, t1, t2)
    fd, _ = _forcing_minus_plus(system, q1, q2, u, t1, t2, forcing_split)
    r = p1 + _dyn(system, D1 + fd)
    if system.n_constraints:
        Dh1 = jax.jacfwd(system.constraints)(q1)
        r = r - _dyn(system, Dh1).T @ lam
        r = jnp.concatenate([r, system.constraints(q2)])
    # follow the dtype of the unknowns (parameters of another precision must not promote it)
    return r.astype(x.dtype)


def _shamanskii_update(f, x, *, rtol, atol, linear_solver="elimination"):
    """One iteration of the DEL solve for :func:`rigidjax.newton.solve`: a Newton update with
    the exact Jacobian (``jax.jacfwd``) and a simplified-Newton update with the same LU factors
    (Shamanskii); converged when the latter's ``|dx_i| <= atol + rtol |x_i|`` for all ``i``.

    ``residual``: ``max |f|`` at the Newton iterate (the last residual evaluated), or at ``x``
    where the update fails (singular or non-finite: the solve keeps ``x``).
    """

    def value(y):
        r = f(y)
        return r, r

    J, r = jax.jacfwd(value, has_aux=True)(x)
    # no LAPACK custom call (rigidjax.linalg: XLA:CPU deadlock of batched calls)
    lu, pivots = lu_factor_small(J, method=linear_solver)
    # partial pivoting: a (relatively) vanishing pivot means a singular Jacobian
    singular = linalg_singular(pivots)
    x1 = x + lu_solve_small(lu, -r)
    # the simplified-Newton update: cubic convergence per Jacobian, and the convergence test
    # measures the error left after the Newton update
    r1 = f(x1)
    dx = lu_solve_small(lu, -r1)
    x_new = x1 + dx
    converged = jnp.all(jnp.abs(dx) <= atol + rtol * jnp.abs(x_new))
    nonfinite = ~jnp.all(jnp.isfinite(x_new))
    residual = jnp.where(singular | nonfinite, jnp.max(jnp.abs(r)), jnp.max(jnp.abs(r1)))
    return newton.Update(x_new, converged, singular, nonfinite, residual)


def _solve_del(
    system, q1, p1, u, rho, t1, dt, guess, rtol, atol, max_iterations, forcing_split, linear_solver="elimination"
):
    """The DEL equation solved for ``x = (q2_dynamic, lambda1)`` from ``guess``, differentiable
    (implicitly): ``(x, rigidjax.newton.NewtonInfo)``."""

    def F(x):
        return del_residual(system, x, q1, p1, u, rho, t1, dt, forcing_split)

    update = functools.partial(_shamanskii_update, rtol=rtol, atol=atol, linear_solver=linear_solver)
    tangent_solve = functools.partial(newton.dense_tangent_solve, method=linear_solver)
    return newton.solve(F, guess, update, tangent_solve, max_iterations=max_iterations)


def _input_rotation(system, q1, qdot, dt):
    """Rotation in rad over ``dt`` implied by the INPUT velocity (``|omega| dt`` for a rigid body).

    ``system.rotation`` evaluated on a short probe step ``q1 + s qdot`` (at most 0.01 in the
    largest coordinate, where the rotation is linear in ``s`` to ~1e-5) and scaled by ``dt / s``:
    finite for any ``dt`` and independent of whether the step's solve converged.
    """
    if system.rotation is None:
        return jnp.zeros((), q1.dtype)
    speed = jnp.max(jnp.abs(qdot), initial=0.0)
    s = jnp.where(speed * dt > 1e-2, 1e-2 / jnp.where(speed > 0, speed, 1), dt)
    return (system.rotation(q1, q1 + s * qdot) * (dt / s)).astype(q1.dtype)


def _step_single(system, state, u, rho, dt, rtol, atol, max_iterations, forcing_split, max_rotation, linear_solver):
    q1, p1, t1 = state.q, state.p, state.time
    nd = system.n_dynamic
    # a non-finite input fails the step (NONFINITE below); it is replaced by 0 so that no NaN
    # enters the linearisation, whose coefficients reach the shared parameters' gradients
    u_ok = jnp.all(jnp.isfinite(u)) & jnp.all(jnp.isfinite(rho))
    u, rho = jnp.where(u_ok, u, 0), jnp.where(u_ok, rho, 0)
    guess = jnp.concatenate([_dyn(system, q1 + dt * state.qdot), state.lam])
    x, solve = _solve_del(
        system, q1, p1, u, rho, t1, dt, guess, rtol, atol, max_iterations, forcing_split, linear_solver
    )
    t2 = t1 + dt
    q2 = _assemble(system, x[:nd], rho)
    lam = x[nd:]
    p2 = _new_momentum(system, q1, q2, u, t1, t2, forcing_split).astype(p1.dtype)
    new = VIState(time=t2, q=q2, p=p2, lam=lam, qdot=(q2 - q1) / dt)
    finite = jnp.all(jnp.isfinite(q2)) & jnp.all(jnp.isfinite(p2)) & jnp.all(jnp.isfinite(lam)) & u_ok
    # valid: a traced dt (not checked at the boundary) out of range: nothing advances
    status = step_status(solve.status, finite=finite, valid=(dt > 0) & jnp.isfinite(dt))
    ok = status == Status.SUCCESS
    # as midpoint_step / ep_step: max of the input's and the step's rotation on success, the
    # input's alone on failure (a failed solve's q2 says nothing about the motion)
    rot = _input_rotation(system, q1, state.qdot, dt)
    if system.rotation is not None:
        rot = jnp.where(ok, jnp.maximum(rot, system.rotation(q1, q2).astype(q1.dtype)), rot)
    status = rotation_status(status, rot, max_rotation)
    out = where_tree(ok, new, state)
    return out, make_info(status, solve.iterations, solve.residual, jax.lax.stop_gradient(rot))


class MidpointVI(AbstractStepper):
    r"""The midpoint variational integrator (trep's ``MidpointVI``) as a stepper object.

    Fields (options, checked when made):
        rtol, atol: Newton stops when every component of an iteration's final
            (simplified-Newton) update satisfies ``|dx_i| <= atol + rtol |x_i|``
            (``x = (q2_dynamic, lambda1)``); ``None``: ``eps^(2/3)`` of the state's dtype
            (3.7e-11 in float64, 2.5e-5 in float32): after that update the error is at round-off.
        max_iterations: iteration cap, ``>= 1`` (Jacobian evaluations; each iteration makes a
            Newton and a simplified-Newton update, package docstring).
        forcing_split: ``"left"`` (trep's midpoint rule: ``f_d^- = dt f``, ``f_d^+ = 0``;
            second order without forcing but FIRST order in the forcing, the force acting half
            a step late) or ``"symmetric"`` (``f_d^- = f_d^+ = dt f / 2``: second order with
            forcing, e.g. damping or inputs). Unforced systems give identical results.
        max_rotation: rad, ``> 0``; a successful step whose ``info.rotation`` exceeds it is
            flagged ``Status.ROTATION_LIMIT`` (state advanced, accuracy degrades: reduce ``dt``);
            the default 0.5 is :class:`rigidjax.Midpoint`'s; ``inf`` disables the flag.
        linear_solver: the Newton matrix's solver, one of :data:`rigidjax.linalg.METHODS`:
            ``"elimination"`` (default; no LAPACK call, and the fast form of a free rigid
            body) or ``"lapack"`` (XLA's LAPACK: see :mod:`rigidjax.linalg` for the
            batched-call deadlock on small CPU machines).

    ``MidpointVI(...)(system, state, inputs, dt) -> (new_state, info)``, pure, jit-able,
    vmap-able, differentiable:

    Args:
        system: :class:`MechanicalSystem`.
        state: :class:`VIState` at ``t_k``; leading batch axes are mapped over (one system for
            all members; for ensembles of different systems ``jax.vmap`` over the system too).
        inputs: ``u`` ``(…, n_inputs)`` or ``None`` (zeros); for systems with kinematic
            variables the pair ``(u, rho)`` with ``rho`` ``(…, n_kinematic)`` the kinematic
            configuration at ``t_k + dt``. The force input is held over the step.
        dt: step, s (> 0; ``ValueError`` where concrete, here and in :func:`rigidjax.rollout`; a traced
            ``dt <= 0`` or NaN gives ``Status.INVALID_INPUT``, state unchanged).

    Returns:
        ``(new_state, info)``. ``info.status``: ``SUCCESS``, ``MAX_ITERATIONS``, ``SINGULAR``
        (zero pivot in the DEL Jacobian, e.g. a coordinate without inertia), ``NONFINITE``,
        ``INVALID_INPUT`` (traced ``dt`` out of range); on failure the input state is returned
        unchanged. ``info.iterations``: Newton iterations (Jacobians evaluated);
        ``info.residual``: ``max |F|`` of the DEL residual at the last Newton iterate (before
        the final simplified-Newton update, which removes it to first order);
        ``info.rotation``, rad (0 when the system defines no ``rotation``): on success the
        larger of ``system.rotation(q1, q2)`` and the rotation implied by the input velocity
        over ``dt`` (``|omega| dt`` for :func:`rigidjax.systems.rigid_body`); on failure the
        latter alone, so a too-large ``dt`` shows up there. ``ROTATION_LIMIT``: a successful
        step above ``max_rotation``.

    Raises:
        ValueError: (when made) an unknown ``forcing_split``, ``max_rotation <= 0``,
            ``max_iterations < 1``; (at trace time) state or inputs of the wrong size,
            kinematic systems called without ``(u, rho)``.
        TypeError: ``system`` not a :class:`MechanicalSystem` or ``state`` not a :class:`VIState`.

    Gradients (``jax.grad``/``jax.jvp``, to second order) follow from the implicit function
    theorem on the DEL residual (:func:`rigidjax.newton.solve`); they are independent of the
    iteration count and never differentiate the Newton loop. Gradients through a failed step
    are not meaningful.

    The rollouts run a free :func:`rigidjax.systems.rigid_body` in structure-of-arrays form
    (:meth:`packed`, :mod:`rigidjax.variational.packed`).
    """

    rtol: float | None = eqx.field(static=True, default=None)
    atol: float | None = eqx.field(static=True, default=None)
    max_iterations: int = eqx.field(static=True, default=20)
    forcing_split: Literal["left", "symmetric"] = eqx.field(static=True, default="left")
    max_rotation: float = eqx.field(static=True, default=0.5, converter=float)
    linear_solver: str = eqx.field(static=True, default="elimination")

    def __check_init__(self):
        if self.linear_solver not in METHODS:
            raise ValueError(f"linear_solver must be one of {METHODS}; got {self.linear_solver!r}")
        _check_split(self.forcing_split)
        check_options(self)
        if not self.max_rotation > 0:
            raise ValueError(f"max_rotation must be > 0 rad (inf disables the check); got {self.max_rotation}")
        if int(self.max_iterations) < 1:
            raise ValueError(f"max_iterations must be >= 1; got {self.max_iterations}")

    @full_precision
    def __call__(self, system: MechanicalSystem, state: VIState, inputs: Any, dt) -> tuple[VIState, StepInfo]:
        check_kinds("vi_step", system, MechanicalSystem)
        _check_vi_state(state)
        check_step_dt(dt, "vi_step")
        dtype = state.q.dtype
        _check_last(state.q, system.n_config, "vi_step: state.q")
        _check_last(state.p, system.n_dynamic, "vi_step: state.p")
        if state.lam.shape[-1:] != (system.n_constraints,):
            raise ValueError(f"vi_step: state.lam must have shape (…, {system.n_constraints}); got {state.lam.shape}")
        u, rho = _split_inputs(system, inputs, dtype)
        _check_input_batch(u, state.q.shape[:-1], "u")
        _check_input_batch(rho, state.q.shape[:-1], "rho")
        rtol, atol = _default_tol(dtype, self.rtol, self.atol)
        options = (rtol, atol, int(self.max_iterations), self.forcing_split, self.max_rotation, self.linear_solver)
        batch = state.time.shape
        dt = jnp.asarray(dt, dtype)
        if not batch:
            if u.ndim != 1 or rho.ndim != 1 or dt.ndim != 0:
                raise ValueError(
                    "vi_step: unbatched state but inputs/dt have batch axes "
                    f"(u {u.shape}, rho {rho.shape}, dt {dt.shape})"
                )
            return _step_single(system, state, u, rho, dt, *options)
        # ensemble given as a batched state: flatten the batch and vmap the single-member step
        B = int(np.prod(batch))

        def flat(a, k):
            tail = a.shape[a.ndim - k :]
            return jnp.reshape(jnp.broadcast_to(a, (*batch, *tail)), (B, *tail))

        st = VIState(
            time=flat(state.time, 0),
            q=flat(state.q, 1),
            p=flat(state.p, 1),
            lam=flat(state.lam, 1),
            qdot=flat(state.qdot, 1),
        )
        fn = jax.vmap(lambda s, uu, rr, hh: _step_single(system, s, uu, rr, hh, *options))
        out, info = fn(st, flat(u, 1), flat(rho, 1), flat(dt, 0))

        def unflat(a):
            return jnp.reshape(a, (*batch, *a.shape[1:]))

        return jax.tree_util.tree_map(unflat, out), jax.tree_util.tree_map(unflat, info)

    def packed(self, model) -> PackedStep | None:
        """The free-body structure-of-arrays step (:mod:`rigidjax.variational.packed`) where
        ``model`` is a free :func:`rigidjax.systems.rigid_body` and the linear solver the
        default elimination, else ``None``."""
        if self.linear_solver != "elimination":
            return None
        return free_body_packed_step(
            model,
            rtol=self.rtol,
            atol=self.atol,
            max_iterations=int(self.max_iterations),
            forcing_split=self.forcing_split,
            max_rotation=self.max_rotation,
        )


def vi_step(system: MechanicalSystem, state: VIState, inputs: Any, dt, **options) -> tuple[VIState, StepInfo]:
    r"""One step of the midpoint variational integrator: ``MidpointVI(**options)(system, state, inputs, dt)``.

    Pure, jit-able, vmap-able, differentiable. ``options`` are :class:`MidpointVI`'s fields
    (``rtol``, ``atol``, ``max_iterations``, ``forcing_split``, ``max_rotation``); arguments,
    returns and errors are :class:`MidpointVI`'s. Bind options with
    ``functools.partial(vi_step, forcing_split="symmetric")``: the rollouts then run the same
    stepper object (``vi_step.stepper``).
    """
    return make(MidpointVI, "vi_step", options)(system, state, inputs, dt)


vi_step.stepper = MidpointVI


@full_precision
def discrete_map(
    system: MechanicalSystem,
    q1,
    p1,
    u=None,
    rho=None,
    *,
    t1=0.0,
    dt,
    guess=None,
    rtol: float | None = None,
    atol: float | None = None,
    max_iterations: int = 20,
    forcing_split: str = "left",
):
    r"""The discrete flow ``(q1, p1, u1, rho) -> (q2, p2, lambda1)`` of one step, differentiable.

    Single member: ``q1`` (n,), ``p1`` (n_dynamic,), ``u`` (n_inputs,) or None, ``rho``
    (n_kinematic,) or None, ``t1`` and ``dt`` in s. ``guess``: optional starting ``q2`` (n,)
    (default ``q1``); derivatives do not depend on it. Options as for :class:`MidpointVI`.
    No status is returned: use :func:`vi_step` where failures must be caught (a failed solve
    gives its last finite, unconverged iterate here).

    Returns ``(q2 (n,), p2 (n_dynamic,), lambda1 (n_constraints,))``.
    """
    q1 = as_float(q1, "q1")
    dtype = q1.dtype
    p1 = jnp.asarray(p1, dtype)
    u, rho = _split_inputs(system, (u, rho) if system.kinematic else u, dtype, "discrete_map")
    rtol, atol = _default_tol(dtype, rtol, atol)
    t1 = jnp.asarray(t1, dtype)
    dt = jnp.asarray(dt, dtype)
    g = q1 if guess is None else jnp.asarray(guess, dtype)
    x0 = jnp.concatenate([_dyn(system, g), jnp.zeros((system.n_constraints,), dtype)])
    _check_split(forcing_split)
    x, _ = _solve_del(system, q1, p1, u, rho, t1, dt, x0, rtol, atol, max_iterations, forcing_split)
    q2 = _assemble(system, x[: system.n_dynamic], rho)
    p2 = _new_momentum(system, q1, q2, u, t1, t1 + dt, forcing_split)
    return q2, p2, x[system.n_dynamic :]
