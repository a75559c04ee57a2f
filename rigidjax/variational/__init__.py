r"""Midpoint variational integrator (trep's ``MidpointVI``): the constrained DEL equation.

Source: ``../shared/seeds/001_12a0721f797adf69.txt`` (trep, "Discrete Dynamics and
Variational Integrators"); J. E. Marsden, M. West, "Discrete mechanics and variational
integrators", Acta Numerica 10 (2001); E. R. Johnson, T. D. Murphey, "Scalable variational
integrators for constrained mechanical systems in generalized coordinates", IEEE T-RO 25 (2009).

A :class:`MechanicalSystem` is given by JAX functions: a Lagrangian ``L(q, qdot, t)``,
generalized forcing ``f(q, qdot, u, t)`` and holonomic constraints ``h(q) = 0``. Its ``n``
configuration variables split into *dynamic* ones (integrated) and *kinematic* ones
(prescribed inputs ``rho``, as in trep). With the midpoint discrete Lagrangian

.. math::

    L_d(q_1, q_2, t_1, t_2) = \Delta t\, L\Big(\tfrac{q_1+q_2}{2}, \tfrac{q_2-q_1}{\Delta t},
    \tfrac{t_1+t_2}{2}\Big), \qquad
    f_d^- = \Delta t\, f\Big(\tfrac{q_1+q_2}{2}, \tfrac{q_2-q_1}{\Delta t}, u_1, \tfrac{t_1+t_2}{2}\Big),
    \quad f_d^+ = 0,

(trep's choice, ``forcing_split="left"``; ``"symmetric"`` puts ``dt f / 2`` on each side, which
keeps second order with forcing: with ``"left"`` the force acts half a step late, a first-order
error), one step solves the constrained discrete Euler-Lagrange (DEL) equation for ``(q_2, lambda_1)``
(dynamic rows only; the kinematic entries of ``q_2`` are ``rho``):

.. math::

    p_1 + D_1 L_d(q_1, q_2) + f_d^- - Dh(q_1)^T \lambda_1 = 0, \qquad h(q_2) = 0,

then sets ``p_2 = D_2 L_d(q_1, q_2) + f_d^+``. The constraint force of the continuous system is
``-Dh(q)^T lambda_c`` with ``lambda_c ≈ lambda_1 / dt``: the discrete multiplier is an
*impulse* (N s for a length constraint), the time integral of the constraint force over a step.

Newton's method with the exact Jacobian (``jax.jacfwd``; LU with partial pivoting by
:mod:`rigidjax.linalg`, no LAPACK call) solves the DEL equation, warm-started
at ``q_2 = q_1 + dt * qdot`` with ``qdot`` the velocity of the previous step. Each iteration
is a Newton update followed by a simplified-Newton update with the same LU factors
(Shamanskii's method, V. E. Shamanskii, Ukrain. Mat. Zh. 19 (1967); C. T. Kelley, *Iterative
Methods for Linear and Nonlinear Equations*, SIAM 1995, ch. 5): cubic convergence per
Jacobian, and the second update measures the error the first left, so a step from a good
warm start needs ONE Jacobian and factorisation (plain Newton needs a second, confirming one).
It is wrapped in
``jax.lax.custom_root`` (through ``rigidjax.numerics.custom_root``): derivatives come from the
implicit function theorem on the DEL residual, so they do not depend on the iteration count
and no mode differentiates the while loop, second derivatives (``jax.hessian``, reverse over
reverse) included. Non-convergence, a singular Jacobian or a non-finite result are reported per
ensemble member in :class:`rigidjax.StepInfo`; a failed step returns its input state.

The step :func:`vi_step` has the signature every rigidjax stepper has, so
:func:`rigidjax.rollout` runs it unchanged; ``inputs`` is ``u`` (``(n_inputs,)`` or
``None``) or, when the system has kinematic variables, the pair ``(u, rho)``.
:func:`linearize` gives the first and second derivatives of the discrete map
``(q1, p1, u1, rho) -> (q2, p2, lambda1)`` (trep's ``dq2dq1``, ``dq2dq1dq1``, ...), and
:func:`state_space_step` / :func:`trajectory_jacobians` the state-space view
``X(k+1) = F(X(k), U(k))`` with ``X = (q, p)``, ``U = (u, rho)`` used by :mod:`rigidjax.lqr`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..numerics import check_kinds, is_concrete, where_tree
from ..newton import custom_root
from ..info import Status, StepInfo, make_info
from ..linalg import lu_factor_small, lu_solve_small, solve_small
from ..linalg import singular as linalg_singular

__all__ = [
    "MechanicalSystem",
    "VIState",
    "vi_state",
    "vi_state_from_configs",
    "vi_step",
    "discrete_lagrangian",
    "del_residual",
    "discrete_map",
    "linearize",
    "MapDerivatives",
    "generalized_velocity",
    "energy",
    "momentum_map",
    "state_space_step",
    "trajectory_jacobians",
    "split_state",
    "join_state",
]


# --------------------------------------------------------------------------- system


class _Static(eqx.Module):
    """A plain Python function held as static metadata (so the system stays an array pytree)."""

    fn: Callable = eqx.field(static=True)

    def __call__(self, *args):
        return self.fn(*args)


def _wrap(fn, name):
    if fn is None:
        return None
    if not callable(fn):
        raise TypeError(f"MechanicalSystem: {name} must be callable; got {type(fn).__name__}")
    return fn if isinstance(fn, eqx.Module) else _Static(fn)


def _zero_forcing(q, qdot, u, t):
    return jnp.zeros_like(q)


def _no_constraints(q):
    return jnp.zeros((0,), q.dtype)


class MechanicalSystem(eqx.Module):
    r"""A mechanical system in generalized coordinates, defined by JAX functions.

    Args:
        lagrangian: ``L(q, qdot, t) -> ()``, J. ``q``, ``qdot`` ``(n,)``, ``t`` scalar (s).
        n_config: ``n``, the number of configuration variables.
        forcing: optional ``f(q, qdot, u, t) -> (n,)``, generalized force (N or N m per
            coordinate) with inputs ``u`` ``(n_inputs,)``; only the dynamic rows are used.
        constraints: optional ``h(q) -> (n_constraints,)``, holonomic constraints ``h(q) = 0``.
        n_inputs: length of ``u`` (0 without inputs).
        kinematic: indices of the kinematic (prescribed) configuration variables; their next
            values ``rho`` are inputs of each step (trep's kinematic configs).
        rotation: optional ``rotation(q1, q2) -> ()`` in rad, the rotation of one step
            (reported as ``StepInfo.rotation``); default 0. The ready-made systems in
            :mod:`rigidjax.systems` report the relative attitude angle of a quaternion body,
            or the largest change of an angle coordinate.
        names: optional names of the ``n`` coordinates (documentation and CSV columns).

    The callables may be plain functions (held as static metadata) or ``equinox.Module``
    instances whose array fields are parameters: then ``jax.grad`` with respect to the system
    gives gradients in those parameters (e.g. masses, lengths, damping), and ``jax.vmap``
    over a batched system runs an ensemble of different systems.

    Raises:
        ValueError / TypeError: a Lagrangian that does not return a scalar, forcing or
            constraints of the wrong shape, kinematic indices out of range, no dynamic
            variable left.
    """

    lagrangian: Callable
    forcing: Callable
    constraints: Callable
    rotation: Callable | None
    n_config: int = eqx.field(static=True)
    n_inputs: int = eqx.field(static=True)
    n_constraints: int = eqx.field(static=True)
    kinematic: tuple[int, ...] = eqx.field(static=True)
    names: tuple[str, ...] | None = eqx.field(static=True)

    def __init__(
        self,
        lagrangian: Callable,
        n_config: int,
        forcing: Callable | None = None,
        constraints: Callable | None = None,
        *,
        n_inputs: int = 0,
        kinematic: Sequence[int] = (),
        rotation: Callable | None = None,
        names: Sequence[str] | None = None,
    ):
        n = int(n_config)
        if n < 1:
            raise ValueError(f"MechanicalSystem: n_config must be >= 1; got {n_config}")
        kin = tuple(sorted(int(i) for i in kinematic))
        if len(set(kin)) != len(kin) or any(i < 0 or i >= n for i in kin):
            raise ValueError(f"MechanicalSystem: kinematic indices must be distinct and in [0, {n}); got {tuple(kinematic)}")
        if len(kin) == n:
            raise ValueError("MechanicalSystem: every configuration variable is kinematic; at least one must be dynamic")
        if int(n_inputs) < 0:
            raise ValueError(f"MechanicalSystem: n_inputs must be >= 0; got {n_inputs}")
        if names is not None:
            names = tuple(str(s) for s in names)
            if len(names) != n:
                raise ValueError(f"MechanicalSystem: names must have n_config={n} entries; got {len(names)}")
        self.lagrangian = _wrap(lagrangian, "lagrangian")
        self.forcing = _wrap(forcing, "forcing") if forcing is not None else _Static(_zero_forcing)
        self.constraints = _wrap(constraints, "constraints") if constraints is not None else _Static(_no_constraints)
        self.rotation = _wrap(rotation, "rotation")
        self.n_config = n
        self.n_inputs = int(n_inputs)
        self.kinematic = kin
        self.names = names
        # shapes are static: check them once here, by abstract evaluation
        q = jax.ShapeDtypeStruct((n,), jnp.float32)
        t = jax.ShapeDtypeStruct((), jnp.float32)
        u = jax.ShapeDtypeStruct((self.n_inputs,), jnp.float32)
        try:
            L_shape = jax.eval_shape(self.lagrangian, q, q, t)
        except Exception as e:
            raise ValueError(f"MechanicalSystem: lagrangian(q, qdot, t) failed for q, qdot of shape ({n},): {e}") from None
        if getattr(L_shape, "shape", None) != ():
            raise ValueError(f"MechanicalSystem: lagrangian must return a scalar; got shape {getattr(L_shape, 'shape', L_shape)}")
        try:
            f_shape = jax.eval_shape(self.forcing, q, q, u, t)
        except Exception as e:
            raise ValueError(
                f"MechanicalSystem: forcing(q, qdot, u, t) failed for q of shape ({n},) and u of shape ({self.n_inputs},): {e}"
            ) from None
        if getattr(f_shape, "shape", None) != (n,):
            raise ValueError(f"MechanicalSystem: forcing must return shape ({n},); got {getattr(f_shape, 'shape', f_shape)}")
        try:
            h_shape = jax.eval_shape(self.constraints, q)
        except Exception as e:
            raise ValueError(f"MechanicalSystem: constraints(q) failed for q of shape ({n},): {e}") from None
        if len(getattr(h_shape, "shape", (None, None))) != 1:
            raise ValueError(f"MechanicalSystem: constraints must return a vector (n_constraints,); got {h_shape}")
        self.n_constraints = int(h_shape.shape[0])
        if self.n_constraints > n - len(kin):
            raise ValueError(
                f"MechanicalSystem: {self.n_constraints} constraints but only {n - len(kin)} dynamic variables"
            )

    @classmethod
    def from_energies(cls, kinetic: Callable, potential: Callable, n_config: int, **kwargs) -> "MechanicalSystem":
        """System with ``L = T(q, qdot, t) - V(q, t)``; other arguments as for the constructor."""
        return cls(_EnergyLagrangian(_wrap(kinetic, "kinetic"), _wrap(potential, "potential")), n_config, **kwargs)

    @property
    def dynamic(self) -> tuple[int, ...]:
        """Indices of the dynamic configuration variables (``n_dynamic`` of them)."""
        return tuple(i for i in range(self.n_config) if i not in self.kinematic)

    @property
    def n_dynamic(self) -> int:
        return self.n_config - len(self.kinematic)

    @property
    def n_kinematic(self) -> int:
        return len(self.kinematic)


class _EnergyLagrangian(eqx.Module):
    kinetic: Callable
    potential: Callable

    def __call__(self, q, qdot, t):
        return self.kinetic(q, qdot, t) - self.potential(q, t)


# --------------------------------------------------------------------------- state


class VIState(eqx.Module):
    r"""State of the variational integrator (a pytree; leading axes for ensembles/trajectories).

    Attributes:
        time: ``t_k``, s, shape ``(…)``.
        q: configuration ``q_k`` ``(…, n)`` (dynamic and kinematic entries).
        p: discrete momentum ``p_k = D_2 L_d(q_{k-1}, q_k)`` of the dynamic variables
            ``(…, n_dynamic)`` (generalized momentum, e.g. kg m/s or kg m^2/s).
        lam: the discrete constraint impulse ``lambda_{k-1}`` of the last step ``(…, n_constraints)``
            (``lambda / dt`` approximates the continuous multiplier; zeros initially).
        qdot: the velocity of the last step ``(q_k - q_{k-1}) / dt`` ``(…, n)`` (the given
            velocity initially); warm start of the next Newton solve and the kinematic
            velocities. Not a state variable of the DEL map.
    """

    time: jax.Array
    q: jax.Array
    p: jax.Array
    lam: jax.Array
    qdot: jax.Array


def _check_vi_state(state):
    if not isinstance(state, VIState):
        raise TypeError(
            f"vi_step: state must be a rigidjax.variational.VIState (vi_state(system, q, qdot); for a rigid body "
            f"systems.rigid_body_vi_state(system, rigid_body_state)); got {type(state).__name__}"
        )


def _dyn(system, x):
    return x[..., jnp.asarray(system.dynamic, jnp.int32)] if system.kinematic else x


def _assemble(system, q_dyn, rho):
    """Full configuration (n,) from dynamic entries (n_dynamic,) and kinematic ones (n_kinematic,)."""
    if not system.kinematic:
        return q_dyn
    q = jnp.zeros((system.n_config,), jnp.result_type(q_dyn, rho))
    q = q.at[jnp.asarray(system.dynamic, jnp.int32)].set(q_dyn)
    return q.at[jnp.asarray(system.kinematic, jnp.int32)].set(rho)


def _float(x, name, dtype=None):
    try:
        a = jnp.asarray(x) if dtype is None else jnp.asarray(x, dtype)
    except Exception as e:
        raise TypeError(f"{name}: cannot convert {type(x).__name__} to an array ({e})") from None
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.result_type(float))
    return a


def _check_last(a, size, name):
    if a.ndim == 0 or a.shape[-1] != size:
        raise ValueError(f"{name} must have shape (…, {size}); got {a.shape}")


def _legendre(system, q, qdot, t):
    """``∂L/∂qdot`` (n,)."""
    return jax.grad(system.lagrangian, argnums=1)(q, qdot, t)


def _tangent_mass_check(system, q, qdot, t):
    """(h(q), Dh qdot, min and max |eigenvalue| of the mass matrix on the constraint tangent space)."""
    d = jnp.asarray(system.dynamic, jnp.int32)
    M = jax.jacfwd(_legendre, argnums=2)(system, q, qdot, t)[d][:, d]
    M = 0.5 * (M + M.T)
    h = system.constraints(q)
    Dh = jax.jacfwd(system.constraints)(q)
    if system.n_constraints:
        # orthonormal basis of the null space of Dh restricted to the dynamic variables
        _, s, vt = jnp.linalg.svd(Dh[:, d], full_matrices=True)
        Z = vt[system.n_constraints :].T
        M = Z.T @ M @ Z
        rank_ok = jnp.min(s) > 0
    else:
        rank_ok = jnp.asarray(True)
    ev = jnp.linalg.eigvalsh(M) if M.shape[0] else jnp.ones((1,), M.dtype)
    return h, Dh @ qdot, ev, rank_ok


def _validate_state(system, q, qdot, t, where: str):
    """Concrete checks at the API boundary: finite, h(q)=0, Dh qdot = 0, mass matrix definite."""
    if not (is_concrete(q) and is_concrete(qdot) and is_concrete(t)):
        return
    qn, vn = np.asarray(q), np.asarray(qdot)
    if not np.all(np.isfinite(qn)):
        raise ValueError(f"{where}: q contains NaN or inf: {qn}")
    if not np.all(np.isfinite(vn)):
        raise ValueError(f"{where}: the velocity contains NaN or inf: {vn}")
    n = system.n_config
    qf = jnp.reshape(q, (-1, n))
    vf = jnp.reshape(jnp.broadcast_to(qdot, q.shape), (-1, n))
    tf = jnp.reshape(jnp.broadcast_to(t, q.shape[:-1]), (-1,))
    h, dh, ev, rank_ok = _check_batch(system, qf, vf, tf)
    h, dh, ev, rank_ok = map(np.asarray, (h, dh, ev, rank_ok))
    eps = np.finfo(qn.dtype).eps
    tol = np.sqrt(eps) * np.maximum(1.0, np.abs(qn).reshape(-1, n).max(-1))
    if h.size and np.any(np.abs(h).max(-1) > tol):
        i = int(np.argmax(np.abs(h).max(-1)))
        raise ValueError(
            f"{where}: inconsistent initial configuration: the constraints h(q) = 0 do not hold "
            f"(|h(q)| = {np.abs(h[i]).max():.3g} > {tol[i]:.1e} at member {i}, h = {h[i].tolist()}); "
            "project q onto the constraint manifold first"
        )
    vscale = np.maximum(1.0, np.abs(vn).reshape(-1, n).max(-1))
    if dh.size and np.any(np.abs(dh).max(-1) > np.sqrt(eps) * vscale):
        i = int(np.argmax(np.abs(dh).max(-1)))
        raise ValueError(
            f"{where}: inconsistent initial velocity: Dh(q) qdot = {dh[i].tolist()} != 0 (the velocity "
            "must be tangent to the constraints)"
        )
    if not np.all(rank_ok):
        raise ValueError(f"{where}: the constraint Jacobian Dh(q) is rank deficient on the dynamic variables (redundant constraints)")
    emax = np.abs(ev).max(-1)
    emin = np.abs(ev).min(-1)
    bad = emin <= 1e3 * eps * np.maximum(emax, np.finfo(qn.dtype).tiny)
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(
            f"{where}: singular mass matrix: ∂²L/∂qdot² of the dynamic variables (restricted to the "
            f"constraint tangent space) has eigenvalues {ev[i].tolist()}; the Lagrangian must be regular "
            "(every dynamic coordinate needs kinetic energy not removed by a constraint)"
        )


def _solve_velocity(system, q, p, qdot_guess, t):
    """Velocity ``v`` with ``∂L/∂qdot(q, v)_d + Dh_d^T mu = p``, ``Dh v = 0`` (kinematic entries fixed).

    Newton from ``qdot_guess`` (3 iterations): exact for Lagrangians quadratic in the velocities.
    """
    d = jnp.asarray(system.dynamic, jnp.int32)
    nd, nc = system.n_dynamic, system.n_constraints
    Dh = jax.jacfwd(system.constraints)(q) if nc else jnp.zeros((0, system.n_config), q.dtype)

    def F(x):
        v = _assemble(system, x[:nd], _kin(system, qdot_guess))
        mom = _dyn(system, _legendre(system, q, v, t)) + Dh[:, d].T @ x[nd:] - p
        return jnp.concatenate([mom, Dh @ v])

    x = jnp.concatenate([_dyn(system, qdot_guess), jnp.zeros((nc,), q.dtype)])
    for _ in range(3):
        x = x - solve_small(jax.jacfwd(F)(x), F(x))
    return _assemble(system, x[:nd], _kin(system, qdot_guess))


def _kin(system, x):
    return x[..., jnp.asarray(system.kinematic, jnp.int32)] if system.kinematic else x[..., :0]


def _flat_call(fn, batch, system, *arrays):
    """Call ``fn(system, *flat_arrays)`` on arrays flattened to one leading batch axis; unflatten the outputs."""
    B = int(np.prod(batch)) if batch else 1
    flat = [jnp.reshape(a, (B, *a.shape[len(batch) :])) for a in arrays]
    out = fn(system, *flat)
    return jax.tree_util.tree_map(lambda o: jnp.reshape(o, (*batch, *o.shape[1:])), out)


# jitted, vmapped helpers (cached per system structure: eager evaluation is slow)
@jax.jit
def _momentum_batch(system, q, qdot, t):
    return jax.vmap(lambda a, b, c: _dyn(system, _legendre(system, a, b, c)))(q, qdot, t)


@jax.jit
def _velocity_batch(system, q, p, qdot_guess, t):
    return jax.vmap(lambda a, b, c, d: _solve_velocity(system, a, b, c, d))(q, p, qdot_guess, t)


@functools.partial(jax.jit, static_argnums=0)
def _d2_batch(forcing_split, system, q0, q1, t0, dt, u):
    fn = lambda a, b, c, s, uu: _new_momentum(system, a, b, uu, c, c + s, forcing_split)
    return jax.vmap(fn)(q0, q1, t0, dt, u)


@jax.jit
def _check_batch(system, q, qdot, t):
    return jax.vmap(lambda a, b, c: _tangent_mass_check(system, a, b, c))(q, qdot, t)


@jax.jit
def _energy_batch(system, q, p, qdot, t):
    def E(q, p, qd, t):
        v = _solve_velocity(system, q, p, qd, t)
        return v @ _legendre(system, q, v, t) - system.lagrangian(q, v, t)

    return jax.vmap(E)(q, p, qdot, t)


@functools.partial(jax.jit, static_argnums=0)
def _momentum_map_batch(generator, system, q, p):
    return jax.vmap(lambda a, b: _dyn(system, generator(a)) @ b)(q, p)


def vi_state(system: MechanicalSystem, q, qdot=None, *, p=None, t=0.0, check: bool = True) -> VIState:
    r"""Initial :class:`VIState` from ``(q, qdot)`` or ``(q, p)`` (trep's ``initialize_from_state``).

    Args:
        system: the :class:`MechanicalSystem`.
        q: configuration ``(…, n)``; must satisfy ``h(q) = 0``.
        qdot: generalized velocity ``(…, n)``, tangent to the constraints (``Dh(q) qdot = 0``);
            then ``p = ∂L/∂qdot`` of the dynamic variables. Default zeros (when ``p`` is None).
        p: alternatively the momentum of the dynamic variables ``(…, n_dynamic)``; then
            the velocity is recovered by the constrained Legendre transform. Give one of the two.
        t: initial time, s.
        check: validate where values are concrete (outside ``jit``).

    Raises:
        ValueError: wrong shapes, NaN/inf, ``h(q) != 0`` (inconsistent initial configuration,
            tolerance ``sqrt(eps) max(1, |q|)``), a velocity not tangent to the constraints, or a
            singular mass matrix ``∂²L/∂qdot²`` on the constraint tangent space.
    """
    q = _float(q, "q")
    _check_last(q, system.n_config, "q")
    dtype = q.dtype
    batch = q.shape[:-1]
    t = jnp.broadcast_to(_float(t, "t", dtype), batch)
    if qdot is not None and p is not None:
        raise ValueError("vi_state: give the velocity qdot or the momentum p, not both")
    if p is None:
        qdot = jnp.zeros_like(q) if qdot is None else _float(qdot, "qdot", dtype)
        _check_last(qdot, system.n_config, "qdot")
        qdot = jnp.broadcast_to(qdot, q.shape)
        p = _flat_call(_momentum_batch, batch, system, q, qdot, t)
    else:
        p = _float(p, "p", dtype)
        _check_last(p, system.n_dynamic, "p")
        p = jnp.broadcast_to(p, (*batch, system.n_dynamic))
        if check and is_concrete(p) and not np.all(np.isfinite(np.asarray(p))):
            raise ValueError(f"vi_state: p contains NaN or inf: {np.asarray(p)}")
        qdot = _flat_call(_velocity_batch, batch, system, q, p, jnp.zeros_like(q), t)
    if check:
        _validate_state(system, q, qdot, t, "vi_state")
    lam = jnp.zeros((*batch, system.n_constraints), dtype)
    return VIState(time=t, q=q, p=p, lam=lam, qdot=qdot)


def vi_state_from_configs(
    system: MechanicalSystem, q0, q1, dt, *, t0=0.0, u=None, forcing_split: str = "left", check: bool = True
) -> VIState:
    r"""Initial :class:`VIState` at ``t1 = t0 + dt`` from two configurations (trep's ``initialize_from_configs``).

    ``p_1 = D_2 L_d(q_0, q_1, t_0, t_1) + f_d^+`` (``f_d^+ = 0`` for trep's ``"left"`` split, else
    ``dt f / 2`` with the input ``u`` of the step ``q0 -> q1``), ``qdot = (q_1 - q_0)/dt``, ``lam = 0``.
    ``q0``, ``q1`` ``(…, n)``; ``dt`` > 0 s; ``forcing_split`` as in :func:`vi_step`.

    Raises:
        ValueError: shapes, ``dt <= 0``, or either configuration violating ``h(q) = 0``.
    """
    q0 = _float(q0, "q0")
    q1 = _float(q1, "q1", q0.dtype)
    _check_last(q0, system.n_config, "q0")
    _check_last(q1, system.n_config, "q1")
    q0, q1 = jnp.broadcast_arrays(q0, q1)
    dt = _float(dt, "dt", q0.dtype)
    if is_concrete(dt) and np.any(np.asarray(dt) <= 0):
        raise ValueError(f"vi_state_from_configs: dt must be > 0 s; got {np.asarray(dt)}")
    t0 = jnp.broadcast_to(_float(t0, "t0", q0.dtype), q0.shape[:-1])
    dt = jnp.broadcast_to(dt, q0.shape[:-1])
    qdot = (q1 - q0) / dt[..., None]
    if check:
        _validate_state(system, q0, jnp.zeros_like(q0), t0, "vi_state_from_configs (q0)")
        _validate_state(system, q1, jnp.zeros_like(q1), t0 + dt, "vi_state_from_configs (q1)")
    u, _ = _split_inputs(system, (u, jnp.zeros(system.n_kinematic, q0.dtype)) if system.kinematic else u, q0.dtype, "vi_state_from_configs")
    _check_split(forcing_split)
    u = jnp.broadcast_to(u, (*q0.shape[:-1], system.n_inputs))
    p = _flat_call(functools.partial(_d2_batch, forcing_split), q0.shape[:-1], system, q0, q1, t0, dt, u)
    lam = jnp.zeros((*q0.shape[:-1], system.n_constraints), q0.dtype)
    return VIState(time=t0 + dt, q=q1, p=p, lam=lam, qdot=qdot)


# --------------------------------------------------------------------------- DEL equation


def discrete_lagrangian(system: MechanicalSystem, q1, q2, t1, t2) -> jax.Array:
    r"""Midpoint discrete Lagrangian ``L_d = dt L((q1+q2)/2, (q2-q1)/dt, (t1+t2)/2)``, J s; ``q`` (n,)."""
    dt = t2 - t1
    return dt * system.lagrangian(0.5 * (q1 + q2), (q2 - q1) / dt, 0.5 * (t1 + t2))


_SPLITS = ("left", "symmetric")


def _check_split(forcing_split):
    if forcing_split not in _SPLITS:
        raise ValueError(f"forcing_split must be one of {_SPLITS}; got {forcing_split!r}")


def _discrete_forcing(system, q1, q2, u, t1, t2):
    """``dt f(midpoint, (q2-q1)/dt, u, t_mid)`` (n,), the whole discrete force impulse of the step."""
    dt = t2 - t1
    return dt * system.forcing(0.5 * (q1 + q2), (q2 - q1) / dt, u, 0.5 * (t1 + t2))


def _forcing_minus_plus(system, q1, q2, u, t1, t2, forcing_split):
    """``(f_d^-, f_d^+)``: trep's ``(dt f, 0)`` ("left") or ``(dt f / 2, dt f / 2)`` ("symmetric")."""
    f = _discrete_forcing(system, q1, q2, u, t1, t2)
    if forcing_split == "left":
        return f, jnp.zeros_like(f)
    return 0.5 * f, 0.5 * f


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


class _NewtonAux(NamedTuple):
    iterations: jax.Array
    converged: jax.Array
    singular: jax.Array
    nonfinite: jax.Array | bool = False


def _newton(F, x0, rtol, atol, max_iter):
    """Newton's method with the exact Jacobian, each iteration a Newton and a simplified-Newton
    update (Shamanskii); stops when the latter's ``|dx_i| <= atol + rtol |x_i|`` for all i."""

    def value_and_jac(x):
        def Fa(y):
            r = F(y)
            return r, r

        J, r = jax.jacfwd(Fa, has_aux=True)(x)
        return r, J

    def cond(c):
        x, it, conv, sing = c
        return (it < max_iter) & ~conv & ~sing & jnp.all(jnp.isfinite(x))

    def body(c):
        x, it, _, _ = c
        r, J = value_and_jac(x)
        # no LAPACK custom call (rigidjax.linalg: XLA:CPU deadlock of batched calls)
        lu, pivots = lu_factor_small(J)
        # partial pivoting: a (relatively) vanishing pivot means a singular Jacobian
        sing = linalg_singular(pivots)
        x1 = x + lu_solve_small(lu, -r)
        # a simplified-Newton update with the same factors (Shamanskii): cubic convergence
        # per Jacobian, and the convergence test measures the error left after the Newton update
        dx = lu_solve_small(lu, -F(x1))
        x_new = x1 + dx
        conv = jnp.all(jnp.abs(dx) <= atol + rtol * jnp.abs(x_new))
        return x_new, it + 1, conv, sing

    c0 = (x0, jnp.asarray(0, jnp.int32), jnp.asarray(False), jnp.asarray(False))
    x, it, conv, sing = jax.lax.while_loop(cond, body, c0)
    return x, _NewtonAux(it, conv, sing)


def _tangent_solve(g, y):
    # g is the (linear) Jacobian-vector product of the DEL residual: materialise and solve
    J = jax.jacfwd(g)(y)
    # a failed member (non-finite Jacobian) gets a zero tangent, not NaN: under vmap its NaN
    # would otherwise reach every shared parameter's gradient (0 * NaN)
    ok = jnp.all(jnp.isfinite(J))
    return solve_small(jnp.where(ok, J, jnp.eye(J.shape[-1], dtype=J.dtype)), jnp.where(ok, y, 0))


def _default_tol(dtype, rtol, atol):
    eps = float(jnp.finfo(dtype).eps)
    # an update below eps^(2/3) leaves an error ~|dx|^2 / |dx_prev| or |dx|^2: round-off
    rtol = eps ** (2.0 / 3.0) if rtol is None else rtol
    atol = eps ** (2.0 / 3.0) if atol is None else atol
    return rtol, atol


def _solve_del(system, q1, p1, u, rho, t1, dt, guess, rtol, atol, max_iter, forcing_split):
    """Differentiable DEL solve (implicit function theorem via ``numerics.custom_root``): x, aux."""
    F = lambda x: del_residual(system, x, q1, p1, u, rho, t1, dt, forcing_split)

    def solve(f, x0):
        x, aux = _newton(f, x0, rtol, atol, max_iter)
        # a failed solve returns its guess (the step reports the failure and keeps its input
        # state): custom_root linearises at x, which must stay finite (see _tangent_solve)
        nonfinite = ~jnp.all(jnp.isfinite(x))
        x = jnp.where(aux.singular | nonfinite, x0, x)
        # custom_root's JVP wants float auxiliary outputs (integer/bool tangents are rejected)
        return x, jnp.stack([aux.iterations, aux.converged, aux.singular, nonfinite]).astype(x.dtype)

    x, aux = custom_root(F, guess, solve, _tangent_solve)
    aux = jax.lax.stop_gradient(aux)
    return x, _NewtonAux(aux[0].astype(jnp.int32), aux[1] > 0.5, aux[2] > 0.5, aux[3] > 0.5)


def _check_input_batch(a, batch, name, where="vi_step"):
    """``a (…, k)`` must broadcast against the state's batch axes without enlarging them."""
    try:
        ok = tuple(np.broadcast_shapes(tuple(jnp.shape(a)[:-1]), tuple(batch))) == tuple(batch)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{where}: {name} has batch shape {jnp.shape(a)[:-1]} but the state has {tuple(batch)}; inputs must "
            f"broadcast against the state's ensemble axes (per-step loads of a rollout: (n_steps, …, k))"
        )


def _split_inputs(system, inputs, dtype, where="vi_step"):
    if system.kinematic:
        if not (isinstance(inputs, (tuple, list)) and len(inputs) == 2):
            raise ValueError(
                f"{where}: this system has {system.n_kinematic} kinematic variable(s): inputs must be the "
                f"pair (u, rho) with u of shape ({system.n_inputs},) (or None) and rho of shape "
                f"({system.n_kinematic},), the kinematic configuration at the end of the step; got {type(inputs).__name__}"
            )
        u, rho = inputs
        if rho is None:
            raise ValueError(f"{where}: rho (the next kinematic configuration, ({system.n_kinematic},)) is required")
        rho = _float(rho, "rho", dtype)
        _check_last(rho, system.n_kinematic, f"{where}: rho")
    else:
        u, rho = inputs, jnp.zeros((0,), dtype)
    if u is None:
        u = jnp.zeros((system.n_inputs,), dtype)
    else:
        u = _float(u, "u", dtype)
        if system.n_inputs == 0:
            if u.size:
                raise ValueError(f"{where}: the system takes no force inputs (n_inputs = 0); got u of shape {u.shape}")
            u = jnp.zeros((0,), dtype)
        else:
            _check_last(u, system.n_inputs, f"{where}: u")
    return u, rho


def _new_momentum(system, q1, q2, u, t1, t2, forcing_split):
    """``p2 = D2 L_d(q1, q2) + f_d^+`` (dynamic rows)."""
    D2 = jax.grad(discrete_lagrangian, argnums=2)(system, q1, q2, t1, t2)
    _, fplus = _forcing_minus_plus(system, q1, q2, u, t1, t2, forcing_split)
    return _dyn(system, D2 + fplus)


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


def _step_single(system, state, u, rho, dt, rtol, atol, max_iter, forcing_split, max_rotation):
    q1, p1, t1 = state.q, state.p, state.time
    nd = system.n_dynamic
    # a non-finite input fails the step (NONFINITE below); it is replaced by 0 so that no NaN
    # enters the linearisation, whose coefficients reach the shared parameters' gradients
    u_ok = jnp.all(jnp.isfinite(u)) & jnp.all(jnp.isfinite(rho))
    u, rho = jnp.where(u_ok, u, 0), jnp.where(u_ok, rho, 0)
    guess = jnp.concatenate([_dyn(system, q1 + dt * state.qdot), state.lam])
    x, aux = _solve_del(system, q1, p1, u, rho, t1, dt, guess, rtol, atol, max_iter, forcing_split)
    t2 = t1 + dt
    q2 = _assemble(system, x[:nd], rho)
    lam = x[nd:]
    p2 = _new_momentum(system, q1, q2, u, t1, t2, forcing_split).astype(p1.dtype)
    new = VIState(time=t2, q=q2, p=p2, lam=lam, qdot=(q2 - q1) / dt)
    finite = jnp.all(jnp.isfinite(q2)) & jnp.all(jnp.isfinite(p2)) & jnp.all(jnp.isfinite(lam)) & ~aux.nonfinite & u_ok
    status = jnp.where(
        aux.singular,
        Status.SINGULAR,
        jnp.where(~finite, Status.NONFINITE, jnp.where(aux.converged, Status.SUCCESS, Status.MAX_ITERATIONS)),
    )
    # a traced dt (not checked at the boundary) out of range: nothing advances
    status = jnp.where((dt > 0) & jnp.isfinite(dt), status, Status.INVALID_INPUT)
    ok = status == Status.SUCCESS
    residual = jnp.linalg.norm(del_residual(system, jax.lax.stop_gradient(x), q1, p1, u, rho, t1, dt, forcing_split))
    # as midpoint_step / ep_step: max of the input's and the step's rotation on success, the
    # input's alone on failure (a failed solve's q2 says nothing about the motion)
    rot = _input_rotation(system, q1, state.qdot, dt)
    if system.rotation is not None:
        rot = jnp.where(ok, jnp.maximum(rot, system.rotation(q1, q2).astype(q1.dtype)), rot)
    status = jnp.where(ok & (rot > max_rotation), Status.ROTATION_LIMIT, status)
    out = where_tree(ok, new, state)
    return out, make_info(status, aux.iterations, jax.lax.stop_gradient(residual), jax.lax.stop_gradient(rot))


def vi_step(
    system: MechanicalSystem,
    state: VIState,
    inputs: Any,
    dt,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    max_iter: int = 20,
    forcing_split: str = "left",
    max_rotation: float = 0.5,
) -> tuple[VIState, StepInfo]:
    r"""One step of the midpoint variational integrator. Pure, jit-able, vmap-able, differentiable.

    Args:
        system: :class:`MechanicalSystem`.
        state: :class:`VIState` at ``t_k``; leading batch axes are mapped over (one system for
            all members; for ensembles of different systems ``jax.vmap`` over the system too).
        inputs: ``u`` ``(…, n_inputs)`` or ``None`` (zeros); for systems with kinematic
            variables the pair ``(u, rho)`` with ``rho`` ``(…, n_kinematic)`` the kinematic
            configuration at ``t_k + dt``. The force input is held over the step.
        dt: step, s (> 0; checked where concrete, e.g. by :func:`rigidjax.rollout`; a traced
            ``dt <= 0`` or NaN gives ``Status.INVALID_INPUT``, state unchanged).
        rtol, atol: Newton stops when every component of an iteration's final
            (simplified-Newton) update satisfies ``|dx_i| <= atol + rtol |x_i|``
            (``x = (q2_dynamic, lambda1)``); default ``eps^(2/3)`` of the dtype (3.7e-11 in
            float64, 2.5e-5 in float32) — after that update the error is at round-off.
        max_iter: iteration cap (Jacobian evaluations; each iteration makes a Newton and a
            simplified-Newton update, module docstring).
        forcing_split: ``"left"`` (trep's midpoint rule: ``f_d^- = dt f``, ``f_d^+ = 0``;
            second order without forcing but FIRST order in the forcing, the force acting half
            a step late) or ``"symmetric"`` (``f_d^- = f_d^+ = dt f / 2``: second order with
            forcing, e.g. damping or inputs). Unforced systems give identical results.
        max_rotation: rad; a successful step whose ``info.rotation`` exceeds it is flagged
            ``Status.ROTATION_LIMIT`` (state advanced, accuracy degrades: reduce ``dt``);
            default 0.5 as :func:`rigidjax.midpoint_step`; ``inf`` disables.

    Returns:
        ``(new_state, info)``. ``info.status``: ``SUCCESS``, ``MAX_ITERATIONS``, ``SINGULAR``
        (zero pivot in the DEL Jacobian, e.g. a coordinate without inertia), ``NONFINITE``,
        ``INVALID_INPUT`` (traced ``dt`` out of range); on failure the input state is returned unchanged. ``info.iterations``: Newton
        iterations (Jacobians evaluated); ``info.residual``: norm of the DEL residual at the solution;
        ``info.rotation``, rad (0 when the system defines no ``rotation``): on success the
        larger of ``system.rotation(q1, q2)`` and the rotation implied by the input velocity
        over ``dt`` (``|omega| dt`` for :func:`rigidjax.systems.rigid_body`); on failure the
        latter alone, so a too-large ``dt`` shows up there. ``ROTATION_LIMIT``: a successful
        step above ``max_rotation``.

    Raises:
        ValueError: (at trace time) state or inputs of the wrong size, kinematic systems
            called without ``(u, rho)``.

    Gradients (``jax.grad``/``jax.jvp``) follow from the implicit function theorem on the DEL
    residual (``jax.lax.custom_root``); they are independent of the iteration count and never
    differentiate the Newton loop. Gradients through a failed step are not meaningful.
    """
    check_kinds("vi_step", system, MechanicalSystem)
    _check_vi_state(state)
    dtype = state.q.dtype
    _check_last(state.q, system.n_config, "vi_step: state.q")
    _check_last(state.p, system.n_dynamic, "vi_step: state.p")
    if state.lam.shape[-1:] != (system.n_constraints,):
        raise ValueError(f"vi_step: state.lam must have shape (…, {system.n_constraints}); got {state.lam.shape}")
    u, rho = _split_inputs(system, inputs, dtype)
    _check_input_batch(u, state.q.shape[:-1], "u")
    _check_input_batch(rho, state.q.shape[:-1], "rho")
    rtol, atol = _default_tol(dtype, rtol, atol)
    _check_split(forcing_split)
    max_rotation = float(max_rotation)
    if not max_rotation > 0:
        raise ValueError(f"vi_step: max_rotation must be > 0 rad (inf disables the check); got {max_rotation}")
    batch = state.time.shape
    dt = jnp.asarray(dt, dtype)
    if not batch:
        if u.ndim != 1 or rho.ndim != 1 or dt.ndim != 0:
            raise ValueError(
                f"vi_step: unbatched state but inputs/dt have batch axes (u {u.shape}, rho {rho.shape}, dt {dt.shape})"
            )
        return _step_single(system, state, u, rho, dt, rtol, atol, max_iter, forcing_split, max_rotation)
    # ensemble given as a batched state: flatten the batch and vmap the single-member step
    B = int(np.prod(batch))
    flat = lambda a, k: jnp.reshape(jnp.broadcast_to(a, (*batch, *a.shape[a.ndim - k :])), (B, *a.shape[a.ndim - k :]))
    st = VIState(
        time=flat(state.time, 0), q=flat(state.q, 1), p=flat(state.p, 1), lam=flat(state.lam, 1), qdot=flat(state.qdot, 1)
    )
    fn = jax.vmap(lambda s, uu, rr, hh: _step_single(system, s, uu, rr, hh, rtol, atol, max_iter, forcing_split, max_rotation))
    out, info = fn(st, flat(u, 1), flat(rho, 1), flat(dt, 0))
    unflat = lambda a: jnp.reshape(a, (*batch, *a.shape[1:]))
    return jax.tree_util.tree_map(unflat, out), jax.tree_util.tree_map(unflat, info)


# --------------------------------------------------------------------------- derived quantities


def generalized_velocity(system: MechanicalSystem, state: VIState) -> jax.Array:
    r"""Velocity ``qdot_k`` (…, n) at the node ``t_k`` from the momentum ``p_k``.

    Constrained Legendre transform: ``∂L/∂qdot(q, qdot)_dyn + Dh_dyn^T mu = p``,
    ``Dh(q) qdot = 0``, kinematic entries taken from ``state.qdot``. Exact (to round-off) for
    Lagrangians quadratic in ``qdot``. Second-order accurate as an estimate of the true velocity.
    """
    return _flat_call(_velocity_batch, state.time.shape, system, state.q, state.p, state.qdot, state.time)


def energy(system: MechanicalSystem, state: VIState) -> jax.Array:
    r"""Energy ``E = qdot · ∂L/∂qdot - L`` (…,), J, at the node, with ``qdot`` from :func:`generalized_velocity`."""
    return _flat_call(_energy_batch, state.time.shape, system, state.q, state.p, state.qdot, state.time)


def momentum_map(system: MechanicalSystem, state: VIState, generator: Callable) -> jax.Array:
    r"""Discrete momentum map ``J = p_k · xi_Q(q_k)`` for a symmetry with generator ``xi_Q``.

    ``generator(q) -> (n,)`` is the infinitesimal generator of a one-parameter symmetry of
    ``L_d``, ``f_d`` and ``h`` (e.g. ``q -> (-y, x, 0)`` for a rotation about z); returns (…,).
    ``generator(q) -> (k, n)`` gives ``k`` components at once, (…, k) (e.g. the three
    components of the spatial angular momentum). Discrete Noether: ``J`` is conserved
    exactly (to solver tolerance) by :func:`vi_step` when forcing respects the symmetry.
    Pass a function defined once (it is a static argument of a jitted helper).
    """
    return _flat_call(functools.partial(_momentum_map_batch, generator), state.time.shape, system, state.q, state.p)


# --------------------------------------------------------------------------- linearisation


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
    max_iter: int = 20,
    forcing_split: str = "left",
):
    r"""The discrete flow ``(q1, p1, u1, rho) -> (q2, p2, lambda1)`` of one step, differentiable.

    Single member: ``q1`` (n,), ``p1`` (n_dynamic,), ``u`` (n_inputs,) or None, ``rho``
    (n_kinematic,) or None, ``t1`` and ``dt`` in s. ``guess``: optional starting ``q2`` (n,)
    (default ``q1``); derivatives do not depend on it. No status is returned: use
    :func:`vi_step` where failures must be caught (a failed solve gives unconverged values here).

    Returns ``(q2 (n,), p2 (n_dynamic,), lambda1 (n_constraints,))``.
    """
    q1 = _float(q1, "q1")
    dtype = q1.dtype
    p1 = jnp.asarray(p1, dtype)
    u, rho = _split_inputs(system, (u, rho) if system.kinematic else u, dtype, "discrete_map")
    rtol, atol = _default_tol(dtype, rtol, atol)
    t1 = jnp.asarray(t1, dtype)
    dt = jnp.asarray(dt, dtype)
    g = q1 if guess is None else jnp.asarray(guess, dtype)
    x0 = jnp.concatenate([_dyn(system, g), jnp.zeros((system.n_constraints,), dtype)])
    _check_split(forcing_split)
    x, _ = _solve_del(system, q1, p1, u, rho, t1, dt, x0, rtol, atol, max_iter, forcing_split)
    q2 = _assemble(system, x[: system.n_dynamic], rho)
    p2 = _new_momentum(system, q1, q2, u, t1, t1 + dt, forcing_split)
    return q2, p2, x[system.n_dynamic :]


class MapDerivatives(eqx.Module):
    r"""Derivatives of the discrete map at one step (trep's ``dq2dq1``, ``dp2du1``, ``dl1dk2dq1``, ...).

    ``first[out][inp]`` has shape ``out.shape + inp.shape``; ``second[out][a][b]`` has shape
    ``out.shape + a.shape + b.shape``. Keys: outputs ``"q2"`` (n,), ``"p2"`` (n_dynamic,),
    ``"lam1"`` (n_constraints,); inputs ``"q1"`` (n,), ``"p1"`` (n_dynamic,), ``"u1"``
    (n_inputs,), ``"rho"`` (n_kinematic,). ``second`` is None unless requested.
    """

    first: dict
    second: dict | None


_OUTS = ("q2", "p2", "lam1")
_INS = ("q1", "p1", "u1", "rho")


def linearize(
    system: MechanicalSystem,
    state: VIState,
    inputs: Any,
    dt,
    *,
    second_order: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    max_iter: int = 20,
    forcing_split: str = "left",
) -> MapDerivatives:
    r"""First (and optionally second) derivatives of ``(q1, p1, u1, rho) -> (q2, p2, lambda1)``.

    Exact derivatives by forward-mode differentiation of the implicit solution of the DEL
    equation (implicit function theorem, via ``jax.lax.custom_root``); second derivatives by
    differentiating that again. ``state`` single member; ``inputs`` as for :func:`vi_step`.
    """
    dtype = state.q.dtype
    u, rho = _split_inputs(system, inputs, dtype, "linearize")
    _check_split(forcing_split)
    return _linearize(system, state, u, rho, jnp.asarray(dt, dtype), second_order, rtol, atol, max_iter, forcing_split)


@functools.partial(jax.jit, static_argnums=(5, 6, 7, 8, 9))
def _linearize(system, state, u, rho, dt, second_order, rtol, atol, max_iter, forcing_split):
    guess = state.q + dt * state.qdot

    def F(q1, p1, u1, r):
        return discrete_map(
            system,
            q1,
            p1,
            u1,
            r if system.kinematic else None,
            t1=state.time,
            dt=dt,
            guess=guess,
            rtol=rtol,
            atol=atol,
            max_iter=max_iter,
            forcing_split=forcing_split,
        )

    args = (state.q, state.p, u, rho)
    J = jax.jacfwd(F, argnums=(0, 1, 2, 3))(*args)
    first = {o: {i: J[a][b] for b, i in enumerate(_INS)} for a, o in enumerate(_OUTS)}
    second = None
    if second_order:
        H = jax.jacfwd(jax.jacfwd(F, argnums=(0, 1, 2, 3)), argnums=(0, 1, 2, 3))(*args)
        second = {o: {i: {j: H[a][b][c] for c, j in enumerate(_INS)} for b, i in enumerate(_INS)} for a, o in enumerate(_OUTS)}
    return MapDerivatives(first=first, second=second)


# --------------------------------------------------------------------------- state-space view


def split_state(system: MechanicalSystem, X) -> tuple[jax.Array, jax.Array]:
    """``X = (q, p)`` (…, n + n_dynamic) -> ``(q, p)``."""
    return X[..., : system.n_config], X[..., system.n_config :]


def join_state(system: MechanicalSystem, state: VIState) -> jax.Array:
    """State-space vector ``X = (q, p)`` (…, n + n_dynamic) of a :class:`VIState`."""
    return jnp.concatenate([state.q, state.p], -1)


def _split_U(system, U):
    nu = system.n_inputs
    return U[..., :nu], U[..., nu:]


def state_space_step(
    system: MechanicalSystem, X, U, t, dt, *, guess=None, rtol=None, atol=None, max_iter: int = 20, forcing_split: str = "left"
):
    r"""``X(k+1) = F(X(k), U(k))`` with ``X = (q, p)`` (n + n_dynamic,), ``U = (u, rho)`` (n_inputs + n_kinematic,).

    Single member, differentiable (implicit function theorem). ``guess``: optional ``q2``
    starting point for Newton (e.g. the reference trajectory's next configuration).
    The kinematic entries of the next ``q`` are ``rho``, so ``B`` carries them directly.
    """
    q, p = split_state(system, X)
    u, rho = _split_U(system, U)
    q2, p2, _ = discrete_map(
        system,
        q,
        p,
        u,
        rho if system.kinematic else None,
        t1=t,
        dt=dt,
        guess=guess,
        rtol=rtol,
        atol=atol,
        max_iter=max_iter,
        forcing_split=forcing_split,
    )
    return jnp.concatenate([q2, p2])


def trajectory_jacobians(system: MechanicalSystem, X, U, t, dt, **kwargs) -> tuple[jax.Array, jax.Array]:
    r"""Jacobians ``A_k = ∂X(k+1)/∂X(k)``, ``B_k = ∂X(k+1)/∂U(k)`` along a trajectory.

    Args:
        X: states ``(N + 1, nx)`` with ``nx = n + n_dynamic``; ``X[k+1]`` warm-starts step ``k``.
        U: inputs ``(N, nU)`` with ``nU = n_inputs + n_kinematic``.
        t: times ``(N,)`` s (start of each step); dt: scalar or ``(N,)`` s.

    Returns ``A`` ``(N, nx, nx)``, ``B`` ``(N, nx, nU)``.
    """
    X = jnp.asarray(X)
    U = jnp.asarray(U, X.dtype)
    N = U.shape[0]
    if X.shape[0] != N + 1:
        raise ValueError(f"trajectory_jacobians: X must have N+1 = {N + 1} rows for U with N = {N}; got {X.shape}")
    t = jnp.broadcast_to(jnp.asarray(t, X.dtype), (N,))
    dt = jnp.broadcast_to(jnp.asarray(dt, X.dtype), (N,))
    return _trajectory_jacobians(system, X, U, t, dt, tuple(sorted(kwargs.items())))


@functools.partial(jax.jit, static_argnums=5)
def _trajectory_jacobians(system, X, U, t, dt, options):
    kwargs = dict(options)

    def jac(x, u, x_next, tk, hk):
        f = lambda a, b: state_space_step(system, a, b, tk, hk, guess=x_next[: system.n_config], **kwargs)
        return jax.jacfwd(f, argnums=(0, 1))(x, u)

    return jax.vmap(jac)(X[:-1], U, X[1:], t, dt)
