"""Built-in scenarios of the command line (``rigidjax simulate``), one definition each.

The tennis-racket flip (Dzhanibekov effect): a free body of mass 1 kg with principal moments
``(1, 2, 3)`` kg m^2, torque-free, at rest at the origin with the identity attitude, spinning
about the intermediate axis, body rate ``omega0 = (0.01, 2, 0)`` rad/s. Every stepper runs the
same body from the same state and is summarised the same way from the same columns.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import euler_parameters as ep
from . import systems, variational
from .body import RigidBody, RigidBodyState
from .info import check
from .midpoint import midpoint_step
from .rollout import rollout

__all__ = ["RACQUET_INERTIA", "RACQUET_OMEGA0", "STEPPERS", "check_body", "racquet_flip", "summarize"]

#: principal moments, kg m^2 (body frame), and the initial body rate, rad/s
RACQUET_INERTIA = (1.0, 2.0, 3.0)
RACQUET_OMEGA0 = (0.01, 2.0, 0.0)

#: the command line's stepper names
STEPPERS = ("midpoint", "ep", "vi")

#: the command line's options of each stepper (its own defaults otherwise)
_DEFAULT_OPTIONS = {"midpoint": {"attitude": "midpoint"}, "ep": {"max_rotation": np.inf}, "vi": {}}


def _racquet_rollout(stepper: str, dt: float, n: int, options: dict, inertia=RACQUET_INERTIA, omega0=RACQUET_OMEGA0):
    """``(body states (RigidBodyState, leading time axis), info)`` of the flip."""
    body = RigidBody(1.0, jnp.diag(jnp.asarray(inertia, float)))
    s0 = RigidBodyState(angular_velocity=jnp.asarray(omega0, float))
    options = {**_DEFAULT_OPTIONS[stepper], **options}
    if stepper == "midpoint":
        traj = jax.jit(lambda m, s: rollout(functools.partial(midpoint_step, **options), m, s, dt, n))(body, s0)
        return traj.states, traj.info
    if stepper == "ep":
        model = ep.EPModel(body)
        state0 = ep.initial_state(model, angular_velocity=s0.angular_velocity)
        traj = jax.jit(lambda m, s: rollout(functools.partial(ep.ep_step, **options), m, s, dt, n))(model, state0)
        st = traj.states
        states = RigidBodyState(
            position=ep.output(model, st, "Position")[:, 0],
            orientation=ep.output(model, st, "CoordinatesTotal")[:, 0, 3:],
            velocity=ep.output(model, st, "Velocity")[:, 0],
            angular_velocity=ep.output(model, st, "AngularVelocityLocal")[:, 0],
            time=st.time,
        )
        return states, traj.info
    if stepper == "vi":
        system = systems.rigid_body(body)
        state0 = systems.rigid_body_vi_state(system, s0)
        traj = jax.jit(lambda s: rollout(functools.partial(variational.vi_step, **options), system, s, dt, n))(state0)
        return systems.rigid_body_state(system, traj.states), traj.info
    raise ValueError(f"stepper must be one of {STEPPERS}; got {stepper!r}")


def summarize(columns: dict, dt: float, info=None, inertia=RACQUET_INERTIA) -> dict:
    """The flip's summary from its columns (and the rollout's step info, when given);
    ``inertia``: the body's principal moments (3,), kg m^2.

    Keys: ``steps``; ``energy_drift`` (max relative deviation of the kinetic energy);
    ``angular_momentum_drift`` (max deviation of the WORLD angular momentum vector relative to
    its initial norm); ``max_constraint_violation`` (max ``| |q| - 1 |``);
    ``max_rotation_per_step`` (max ``|omega| dt``, rad); with ``info``:
    ``mean_newton_iterations``, ``max_newton_iterations``, ``failed_steps``.
    """
    inertia = np.asarray(inertia, float)
    w = np.stack([columns["wx"], columns["wy"], columns["wz"]], -1)
    q = np.stack([columns["qw"], columns["qx"], columns["qy"], columns["qz"]], -1)
    E = 0.5 * np.sum(inertia * w * w, -1)
    Lb = inertia * w
    qv, q0 = q[:, 1:], q[:, :1]  # world angular momentum R(q) L_body (scalar-first quaternion)
    Lw = Lb + 2 * np.cross(qv, np.cross(qv, Lb) + q0 * Lb)
    summary = {
        "steps": int(len(w) - 1),
        "energy_drift": float(np.abs(E / E[0] - 1).max()),
        "angular_momentum_drift": float(np.linalg.norm(Lw - Lw[0], axis=-1).max() / np.linalg.norm(Lw[0])),
        "max_constraint_violation": float(np.abs(np.linalg.norm(q, axis=-1) - 1).max()),
        "max_rotation_per_step": float(np.linalg.norm(w, axis=-1).max() * dt),
    }
    if info is not None:
        it = np.asarray(info.iterations)
        summary.update(
            mean_newton_iterations=float(it.mean()),
            max_newton_iterations=int(it.max()),
            failed_steps=int(np.sum(np.asarray(info.failed))),
        )
    return summary


def racquet_flip(stepper: str, dt: float, t_end: float, *, inertia=RACQUET_INERTIA, omega0=RACQUET_OMEGA0, **options):
    """Run the tennis-racket flip (or another torque-free spin) with one stepper and summarise it.

    Args:
        stepper: ``"midpoint"`` (seed 000, ``attitude="midpoint"``), ``"ep"`` (Euler
            parameters, generalized-alpha, seed 002, no rotation flag) or ``"vi"``
            (variational midpoint, seed 001).
        dt: step, s (> 0); t_end: final time, s (>= dt). ``n = round(t_end / dt)`` steps.
        inertia: principal moments ``(3,)`` along the body axes, kg m^2 (default
            :data:`RACQUET_INERTIA`): positive, each at most the sum of the other two.
        omega0: initial body angular velocity ``(3,)``, rad/s (default :data:`RACQUET_OMEGA0`).
        options: the stepper's own options (e.g. ``scheme=generalized_alpha(0.8)``).

    Returns:
        ``(t, columns, summary)``: ``t (n+1,)`` s; ``columns`` maps ``t``, ``x, y, z`` (m,
        world), ``qw, qx, qy, qz`` (body to world) and ``wx, wy, wz`` (rad/s, body) to numpy
        arrays ``(n+1,)``; ``summary`` as :func:`summarize` with the step info.

    Raises:
        ValueError: an unknown ``stepper``; ``dt <= 0``, ``t_end < dt`` or non-finite values;
            an ``inertia`` or ``omega0`` that is not 3 finite numbers, or non-physical moments.
        rigidjax.StepFailure: a step failed.
    """
    dt, t_end = float(dt), float(t_end)
    if not (np.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be > 0 s; got {dt}")
    if not (np.isfinite(t_end) and t_end >= dt):
        raise ValueError(f"t_end must be >= dt; got t_end={t_end}, dt={dt}")
    if stepper not in STEPPERS:
        raise ValueError(f"stepper must be one of {STEPPERS}; got {stepper!r}")
    inertia, omega0 = check_body(inertia, omega0)
    n = int(round(t_end / dt))
    states, info = _racquet_rollout(stepper, dt, n, options, tuple(inertia), tuple(omega0))
    check(info)
    pos, q, w = (np.asarray(a) for a in (states.position, states.orientation, states.angular_velocity))
    columns = {"t": np.asarray(states.time)}
    columns.update({k: pos[:, i] for i, k in enumerate("xyz")})
    columns.update({k: q[:, i] for i, k in enumerate(("qw", "qx", "qy", "qz"))})
    columns.update({k: w[:, i] for i, k in enumerate(("wx", "wy", "wz"))})
    return columns["t"], columns, summarize(columns, dt, info, inertia)


def check_body(inertia, omega0) -> tuple[np.ndarray, np.ndarray]:
    """``(inertia (3,), omega0 (3,))`` as float arrays; ``ValueError`` naming the problem for
    anything but 3 finite numbers each, a moment <= 0, or one above the sum of the other two."""
    out = []
    for name, v, unit in (("inertia", inertia, "kg m^2"), ("omega0", omega0, "rad/s")):
        a = np.asarray(v, float).ravel() if np.ndim(v) else np.array([v], float)
        if a.shape != (3,) or not np.all(np.isfinite(a)):
            raise ValueError(f"{name} must be 3 finite numbers ({unit}); got {v!r}")
        out.append(a)
    m = out[0]
    if np.any(m <= 0):
        raise ValueError(f"inertia: principal moments must be > 0 kg m^2; got {m.tolist()}")
    if np.any(m > m.sum() - m + 1e-12 * m.sum()):
        raise ValueError(
            f"inertia {m.tolist()}: a moment exceeds the sum of the other two (triangle inequality): no body has it"
        )
    return out[0], out[1]
