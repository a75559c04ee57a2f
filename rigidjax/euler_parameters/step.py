"""The public Euler-parameter step: :class:`GeneralizedAlphaEP` and :func:`ep_step` (maths: the package docstring)."""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import numpy as np
import jax.numpy as jnp

from .. import newton, so3
from ..info import Status, StepInfo, make_info, rotation_status, step_status
from ..linalg import METHODS, lu_factor_small, lu_solve_small
from ..linalg import singular as linalg_singular
from ..numerics import check_kinds, check_step_dt, full_precision, where_tree
from ..stepper import AbstractStepper, PackedStep, check_options, make
from .equations import (
    _check_state_shape,
    _constraint_force,
    _default_tol,
    _dynamics_residual,
    _n_ep_velocity,
    _position_constraints,
    _velocity_constraints,
    _wrench_array,
    constraint_residual,
)
from .model import EPModel, EPState, GeneralizedAlpha, TorqueFrame, generalized_alpha
from .packed import _check_packed, _pack_ep, _packed_ep_step, _unpack_ep

__all__ = ["GeneralizedAlphaEP", "ep_step"]


def _scheme(scheme: GeneralizedAlpha | None) -> GeneralizedAlpha:
    """The default scheme, ``generalized_alpha(0.9)``, where ``scheme`` is ``None``."""
    return generalized_alpha(0.9) if scheme is None else scheme


class GeneralizedAlphaEP(AbstractStepper):
    r"""One generalized-alpha step of the Euler-parameter DAE (seed 002) as a stepper object.

    Fields (options, checked when made):
        scheme: :class:`GeneralizedAlpha` parameters; ``None`` (or omitted) gives the default,
            ``generalized_alpha(0.9)``.
        torque_frame: ``"body"`` or ``"world"``: the frame of the applied torque.
        rtol, atol: Newton stops when an iteration's final (simplified-Newton) increment of
            the new accelerations and of the multipliers is below ``atol + rtol * |value|``
            (max norms, per block); ``None`` gives ``sqrt(eps)`` of the dtype (the error after
            that update is then at round-off). The position-correction multipliers
            (``stabilized=True``) are also accepted once the position change they make is
            below ``8 eps |x|``, the positions' resolution, so float32 (and very small ``dt``)
            converge with the defaults; ``stabilized=False`` in float32 needs looser
            tolerances (e.g. ``rtol = atol = 1e-3``). In float64, ``1e-14`` lies below the
            round-off floor of the constraint rows (scaled by ``1 / (beta' h^2)``) and can
            stall (``MAX_ITERATIONS``, reported, state kept); ``1e-12``-``1e-13`` converge.
        max_iterations: iteration cap, ``>= 1`` (iteration matrices evaluated; each iteration
            makes a Newton and a simplified-Newton update, package docstring).
        max_rotation: rad; ``max_i |omega_i| dt`` above it is flagged ``Status.ROTATION_LIMIT``
            (state advanced; the accuracy degrades as ``|omega| dt`` grows); ``inf`` disables.
        stabilized: ``True`` for the stabilized index-2 (GGL) form, ``False`` for plain
            index 3 (see the package docstring; index 3 is unstable for fast spins).
        linear_solver: the Newton matrix's solver, one of :data:`rigidjax.linalg.METHODS`:
            ``"elimination"`` (default; no LAPACK call, and the fast form of free bodies) or
            ``"lapack"`` (XLA's LAPACK: see :mod:`rigidjax.linalg` for the batched-call
            deadlock on small CPU machines).

    ``GeneralizedAlphaEP(...)(model, state, inputs, dt) -> (new_state, info)``; pure,
    jit/vmap/grad-able:

    Args:
        model: :class:`EPModel` (bodies, reference coordinates, constraints).
        state: :class:`EPState` at time ``t`` (from :func:`initial_state` or a previous step).
        inputs: the applied wrench ``(nb, 6)`` (``(6,)`` for one body) held over the step:
            force in the WORLD frame (N), torque about the centre of mass (N m) in
            ``torque_frame``; ``None`` for zero. Gravity and resistance come from ``model.body``.
            The acceleration-like variable carries the previous step's load: a load that
            jumps between steps (held per sample interval), or an initial state whose
            accelerations ignore the first load (:func:`initial_state`'s ``wrench``), makes
            the velocities first order in ``dt`` (a compound pendulum under a torque held per
            5 ms interval: ``r_k - r_2k`` halves per doubling of the steps; with a constant
            torque and consistent initial accelerations it quarters).
        dt: step, s (> 0; ``ValueError`` where concrete, here and in :func:`rigidjax.rollout`; a traced
            ``dt <= 0`` or NaN gives ``Status.INVALID_INPUT``, state unchanged).

    Returns:
        ``(new_state, info)``; ``info.iterations`` Newton iterations, ``info.residual`` the max
        norm of the scaled residual before the final (simplified-Newton) update, which
        removed it to first order (the increment was below tolerance, so the residual at the
        solution is smaller still), ``info.rotation`` ``max |omega| dt``. On
        ``MAX_ITERATIONS``, ``SINGULAR``, ``NONFINITE`` or ``INVALID_INPUT`` the input state is
        returned unchanged.

    Derivatives (``jax.grad``/``jvp`` w.r.t. model, state, inputs, dt) are those of the
    converged solution via the implicit function theorem (:func:`rigidjax.newton.solve`).
    One system per call; use ``jax.vmap`` (or ``eqx.filter_vmap``) for ensembles. The
    rollouts run models of free bodies in structure-of-arrays form (:meth:`packed`).

    Raises:
        ValueError: when made: an unknown ``torque_frame``, ``max_iterations < 1``; when
            called: ``state.coordinates`` not ``(nb, 7)`` (a batched state: vmap instead),
            a wrench of the wrong shape.
        TypeError: a model or state that is not an :class:`EPModel` / :class:`EPState`.
    """

    scheme: GeneralizedAlpha = eqx.field(static=True, default=None, converter=_scheme)
    torque_frame: TorqueFrame = eqx.field(static=True, default="body")
    rtol: float | None = eqx.field(static=True, default=None)
    atol: float | None = eqx.field(static=True, default=None)
    max_iterations: int = eqx.field(static=True, default=10)
    max_rotation: float = eqx.field(static=True, default=0.5)
    stabilized: bool = eqx.field(static=True, default=True)
    linear_solver: str = eqx.field(static=True, default="elimination")

    def __check_init__(self):
        if self.linear_solver not in METHODS:
            raise ValueError(f"linear_solver must be one of {METHODS}; got {self.linear_solver!r}")
        if not isinstance(self.scheme, GeneralizedAlpha):
            raise ValueError(f"scheme must be a GeneralizedAlpha (generalized_alpha, newmark); got {self.scheme!r}")
        if not isinstance(self.stabilized, (bool, np.bool_)):
            raise ValueError(f"stabilized must be True or False; got {self.stabilized!r}")
        check_options(self)
        if self.torque_frame not in ("body", "world"):
            raise ValueError(f"torque_frame must be 'body' or 'world'; got {self.torque_frame!r}")
        if int(self.max_iterations) < 1:
            raise ValueError(f"max_iterations must be >= 1; got {self.max_iterations}")

    @full_precision
    def __call__(self, model: EPModel, state: EPState, inputs: jax.Array | None, dt) -> tuple[EPState, StepInfo]:
        check_kinds("ep_step", model, EPModel, state, EPState)
        _check_state_shape(model, state)
        check_step_dt(dt, "ep_step")
        stabilized, torque_frame = self.stabilized, self.torque_frame
        dtype = state.coordinates.dtype
        rtol = _default_tol(dtype) if self.rtol is None else float(self.rtol)
        atol = _default_tol(dtype) if self.atol is None else float(self.atol)
        h = jnp.asarray(dt, dtype)
        am, af, beta, gamma = self.scheme.alpha_m, self.scheme.alpha_f, self.scheme.beta, self.scheme.gamma
        nb = model.n_bodies
        n = 7 * nb
        nv = _n_ep_velocity(model)
        q0, v0, qtt0, a0, lam0 = (
            state.coordinates,
            state.velocities,
            state.accelerations,
            state.algorithmic_accelerations,
            state.multipliers,
        )
        nc = lam0.shape[0]
        W = _wrench_array(model, inputs, dtype)

        # scale the constraint rows (and the position correction) so the iteration matrix is
        # O(M) independently of h (Arnold & Brüls' scaling)
        beta_p = beta * (1 - af) / (1 - am)
        gamma_p = gamma * (1 - af) / (1 - am)
        npos = nc - nv
        n_mu = npos if stabilized else 0

        def unpack(z):
            qtt1 = z[:n].reshape(nb, 7)
            lam1, mu = z[n : n + nc], z[n + nc :]
            a1 = ((1 - af) * qtt1 + af * qtt0 - am * a0) / (1 - am)
            q1 = q0 + h * v0 + h * h * ((0.5 - beta) * a0 + beta * a1)
            v1 = v0 + h * ((1 - gamma) * a0 + gamma * a1)
            if n_mu:
                # GGL: move the positions along the constraint gradients, C_p(q_hat)^T mu
                _, vjp = jax.vjp(lambda y: _position_constraints(model, y), model.reference + q1)
                q1 = q1 + beta_p * h * h * vjp(mu)[0]
            return qtt1, a1, q1, v1, lam1

        def residual(z):
            qtt1, _, q1, v1, lam1 = unpack(z)
            x1 = model.reference + q1
            dyn = _dynamics_residual(model, x1, v1, qtt1, W, torque_frame) - _constraint_force(model, x1, lam1)
            dyn = dyn.reshape(-1)
            if stabilized:
                pos = _position_constraints(model, x1) / (beta_p * h * h)
                vel = _velocity_constraints(model, x1, v1) / (gamma_p * h)
                return jnp.concatenate([dyn, pos, vel])
            cons = constraint_residual(model, x1, v1)
            scale = jnp.concatenate(
                [jnp.full((nv,), 1 / (gamma_p * h), dtype), jnp.full((npos,), 1 / (beta_p * h * h), dtype)]
            )
            return jnp.concatenate([dyn, cons * scale])

        eps = jnp.finfo(dtype).eps

        def update(f, z):
            r, lin = jax.linearize(f, z)
            J = jax.vmap(lin, out_axes=1)(jnp.eye(z.shape[0], dtype=z.dtype))
            # no LAPACK custom call (rigidjax.linalg: XLA:CPU deadlock of batched calls)
            lu, pivots = lu_factor_small(J, method=self.linear_solver)
            z1 = z - lu_solve_small(lu, r)
            # a simplified-Newton update with the same factors (Shamanskii): cubic convergence
            # per iteration matrix, and the tests below measure the error left by the Newton update
            r = f(z1)
            d = lu_solve_small(lu, r)
            z1 = z1 - d
            small_a = jnp.max(jnp.abs(d[:n])) <= atol + rtol * jnp.max(jnp.abs(z1[:n]))
            dl, zl = d[n : n + nc], z1[n : n + nc]
            small_l = jnp.max(jnp.abs(dl), initial=0.0) <= atol + rtol * jnp.max(jnp.abs(zl), initial=0.0)
            # mu is O(h^3): its increment is compared with the accelerations' scale, or accepted
            # once the position correction it makes, beta_p h^2 |d_mu| (constraint gradients
            # O(1)), is below the resolution of the positions: the position rows are evaluated
            # to ~eps |x| only, so in float32 (or at tiny h) the iteration cannot reduce d_mu
            # below ~eps |x| / (beta_p h^2) and would otherwise stall (MAX_ITERATIONS)
            d_mu = jnp.max(jnp.abs(d[n + nc :]), initial=0.0)
            x_scale = jnp.maximum(1.0, jnp.max(jnp.abs(model.reference + unpack(z1)[2])))
            small_l &= (d_mu <= atol + rtol * jnp.max(jnp.abs(z1[:n]))) | (beta_p * h * h * d_mu <= 8 * eps * x_scale)
            # a zero pivot relative to the largest: the iteration matrix is singular
            return newton.Update(
                z1, small_a & small_l, linalg_singular(pivots), ~jnp.all(jnp.isfinite(z1)), jnp.max(jnp.abs(r))
            )

        z0 = jnp.concatenate([qtt0.reshape(-1), lam0, jnp.zeros((n_mu,), dtype)])
        z, (iterations, status, res) = newton.solve(
            residual,
            z0,
            update,
            functools.partial(newton.dense_tangent_solve, method=self.linear_solver),
            max_iterations=self.max_iterations,
        )
        qtt1, a1, q1, v1, lam1 = unpack(z)
        new = EPState(
            time=state.time + h,
            coordinates=q1,
            velocities=v1,
            accelerations=qtt1,
            algorithmic_accelerations=a1,
            multipliers=lam1,
        )
        finite = jnp.all(jnp.isfinite(z)) & jnp.all(jnp.isfinite(q1)) & jnp.all(jnp.isfinite(v1))
        status = step_status(status, finite=finite, valid=(h > 0) & jnp.isfinite(h))  # valid: a traced dt
        ok = status == Status.SUCCESS
        new = where_tree(ok, new, state)

        def omega_max(q, v):
            x = model.reference + q
            w = jnp.einsum("bij,bj->bi", so3.g_matrix_body(x[:, 3:]), v[:, 3:])
            return jnp.max(so3.safe_norm(w))

        rotation = jnp.maximum(omega_max(q0, v0), omega_max(new.coordinates, new.velocities)) * h
        status = rotation_status(status, rotation, self.max_rotation)
        info = make_info(status, iterations, res, rotation)
        return new, info

    def packed(self, model) -> PackedStep | None:
        """The structure-of-arrays form on an :class:`EPModel` of free bodies (no constraints
        besides the Euler-parameter one, ``euler_constraint`` ``"position"`` or
        ``"velocity"``), else ``None``.

        The packed step is :meth:`__call__` iterate for iterate (same residual, scaling, Newton
        matrix, convergence tests, status codes; round-off apart), with each coordinate its own
        array and the Newton matrix assembled and eliminated entry by entry
        (:func:`rigidjax.linalg.solve_components`), which XLA:CPU runs as a few vectorised
        loops; see :mod:`rigidjax.euler_parameters.packed` for the structural zeros of a model
        held fixed and the order of the elimination.
        """
        if not isinstance(model, EPModel) or self.linear_solver != "elimination":
            return None
        if model.constraints or model.euler_constraint not in ("position", "velocity"):
            return None
        return PackedStep(
            pack=_pack_ep,
            unpack=_unpack_ep,
            step=functools.partial(
                _packed_ep_step,
                scheme=self.scheme,
                torque_frame=self.torque_frame,
                rtol=self.rtol,
                atol=self.atol,
                max_iterations=self.max_iterations,
                max_rotation=self.max_rotation,
                stabilized=self.stabilized,
            ),
            check=_check_packed,
        )


def ep_step(model: EPModel, state: EPState, inputs: jax.Array | None, dt, **options) -> tuple[EPState, StepInfo]:
    """One generalized-alpha step of the Euler-parameter DAE:
    ``GeneralizedAlphaEP(**options)(model, state, inputs, dt)``.

    Pure, jit/vmap/grad-able. ``options`` are :class:`GeneralizedAlphaEP`'s fields (``scheme``,
    ``torque_frame``, ``rtol``, ``atol``, ``max_iterations``, ``max_rotation``,
    ``stabilized``); arguments, returns and errors are :class:`GeneralizedAlphaEP`'s
    (``inputs``: the applied wrench ``(nb, 6)``, force WORLD N, torque N m in ``torque_frame``,
    or ``None``). Bind options with ``functools.partial(ep_step, stabilized=False)``: the
    rollouts then run the same stepper object (``ep_step.stepper``).
    """
    return make(GeneralizedAlphaEP, "ep_step", options)(model, state, inputs, dt)


ep_step.stepper = GeneralizedAlphaEP
