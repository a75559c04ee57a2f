r"""The mechanical system and the state of the variational integrator, the midpoint discrete
Lagrangian and forcing, and the shape checks of the step's arguments.

Equations and sources: the package docstring (:mod:`rigidjax.variational`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..numerics import as_float, full_precision

__all__ = ["MechanicalSystem", "VIState", "discrete_lagrangian"]


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
            raise ValueError(
                f"MechanicalSystem: kinematic indices must be distinct and in [0, {n}); got {tuple(kinematic)}"
            )
        if len(kin) == n:
            raise ValueError(
                "MechanicalSystem: every configuration variable is kinematic; at least one must be dynamic"
            )
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
            raise ValueError(
                f"MechanicalSystem: lagrangian(q, qdot, t) failed for q, qdot of shape ({n},): {e}"
            ) from None
        if getattr(L_shape, "shape", None) != ():
            raise ValueError(
                f"MechanicalSystem: lagrangian must return a scalar; got shape {getattr(L_shape, 'shape', L_shape)}"
            )
        try:
            f_shape = jax.eval_shape(self.forcing, q, q, u, t)
        except Exception as e:
            raise ValueError(
                f"MechanicalSystem: forcing(q, qdot, u, t) failed for q of shape ({n},) "
                f"and u of shape ({self.n_inputs},): {e}"
            ) from None
        if getattr(f_shape, "shape", None) != (n,):
            raise ValueError(
                f"MechanicalSystem: forcing must return shape ({n},); got {getattr(f_shape, 'shape', f_shape)}"
            )
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


def _check_last(a, size, name):
    if a.ndim == 0 or a.shape[-1] != size:
        raise ValueError(f"{name} must have shape (…, {size}); got {a.shape}")


def _legendre(system, q, qdot, t):
    """``∂L/∂qdot`` (n,)."""
    return jax.grad(system.lagrangian, argnums=1)(q, qdot, t)


def _kin(system, x):
    return x[..., jnp.asarray(system.kinematic, jnp.int32)] if system.kinematic else x[..., :0]


# --------------------------------------------------------------------------- DEL equation


@full_precision
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


def _default_tol(dtype, rtol, atol):
    eps = float(jnp.finfo(dtype).eps)
    # an update below eps^(2/3) leaves an error ~|dx|^2 / |dx_prev| or |dx|^2: round-off
    rtol = eps ** (2.0 / 3.0) if rtol is None else rtol
    atol = eps ** (2.0 / 3.0) if atol is None else atol
    return rtol, atol


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
                f"({system.n_kinematic},), the kinematic configuration at the end of the step; "
                f"got {type(inputs).__name__}"
            )
        u, rho = inputs
        if rho is None:
            raise ValueError(f"{where}: rho (the next kinematic configuration, ({system.n_kinematic},)) is required")
        rho = as_float(rho, "rho", dtype)
        _check_last(rho, system.n_kinematic, f"{where}: rho")
    else:
        u, rho = inputs, jnp.zeros((0,), dtype)
    if u is None:
        u = jnp.zeros((system.n_inputs,), dtype)
    else:
        u = as_float(u, "u", dtype)
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
