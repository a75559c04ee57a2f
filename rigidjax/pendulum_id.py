r"""Physical-pendulum identification from gyroscope data by gradients through VI rollouts.

Model: one angle ``theta`` about the pivot axis, the midpoint variational integrator
(:mod:`rigidjax.variational`) with, per unit moment of inertia about the pivot,

.. math::

    L = \tfrac12 \dot\theta^2 + \omega_0^2 \cos\theta, \qquad f = -c\,\dot\theta ,

stepped (symmetric forcing split, second order) at the MEASURED sample times (``dt_k = t_{k+1} - t_k``, nothing resampled). The
gyroscope reads ``omega_meas = theta_dot + bias`` about the pivot axis. Unknowns: the natural
frequency ``omega0`` (rad/s), the damping rate ``c`` (1/s), the initial angle and rate, and the
gyro bias; fitted by Levenberg-Marquardt (optimistix) on the residuals at every sample, with
the Jacobian by forward-mode differentiation through the rollout (implicit function theorem
in each step). Derived: the moment of inertia about the pivot ``I_p = m g d / omega0^2``, the
damping coefficient ``b = c I_p`` (N m s), the period at the fitted amplitude (complete
elliptic integral) and at small amplitude ``2 pi / omega0``.

Data: ``../shared/data/racquet-flips/pendulum/x-axis`` (a tennis racquet + phone swinging
about a dowel through the butt, about the phone x axis; mass 0.45728 kg, pivot-to-centre-of-mass
correction ``m r^2 = 78.0 g m^2``; the study reports the period 1.436 +- 0.039 s and
``I_p = 96.8 +- 5.4 g m^2``). Load it with :func:`rigidjax.io.load_phyphox`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
from scipy import special

from .rollout import rollout
from .systems import _PhysicalPendulumL, _ViscousDamping
from .variational import MechanicalSystem, VIState, vi_step

__all__ = ["PendulumFit", "fit_pendulum", "fit_pendulum_segments", "RACQUET_MASS", "RACQUET_PIVOT_DISTANCE"]

#: kg, racquet 0.285 + phone 0.17228 (data README)
RACQUET_MASS = 0.45728
#: m, pivot to centre of mass: m r^2 = 78.0 g m^2 (data README)
RACQUET_PIVOT_DISTANCE = math.sqrt(0.078 / RACQUET_MASS)


@dataclasses.dataclass(frozen=True)
class PendulumFit:
    """Result of :func:`fit_pendulum` (SI units; numpy floats).

    Attributes:
        omega0: small-amplitude natural frequency, rad/s.
        damping_rate: ``c`` in ``theta_ddot = -omega0^2 sin(theta) - c theta_dot``, 1/s.
        theta0: angle at the first sample, rad; rate0: ``theta_dot`` there, rad/s.
        bias: gyro bias, rad/s.
        amplitude: mean swing amplitude over the window, rad (from the fitted trajectory).
        period_small: ``2 pi / omega0``, s.
        period: period at ``amplitude``, ``4 K(sin^2(amplitude/2)) / omega0``, s (what a stopwatch measures).
        inertia_pivot: ``I_p = m g d / omega0^2``, kg m^2.
        damping: ``b = c I_p``, N m s (torque ``-b theta_dot``).
        rms: RMS residual, rad/s; n: samples; converged: the least-squares solver converged.
        model_omega: fitted gyro signal at the sample times (n,), rad/s.
        name: the segment's name (if fitted from a segment).
    """

    omega0: float
    damping_rate: float
    theta0: float
    rate0: float
    bias: float
    amplitude: float
    period_small: float
    period: float
    inertia_pivot: float
    damping: float
    rms: float
    n: int
    converged: bool
    model_omega: np.ndarray
    name: str = ""


def _model(params, t, dtype):
    """Gyro signal (n,) of the VI pendulum with ``params = (log omega0, c, theta0, rate0, bias)``."""
    log_w0, c, th0, w0, bias = params
    system = MechanicalSystem(_PhysicalPendulumL(jnp.ones((), dtype), jnp.exp(2 * log_w0)), 1, forcing=_ViscousDamping(c, None))
    state0 = VIState(time=t[0], q=th0[None], p=w0[None], lam=jnp.zeros((0,), dtype), qdot=w0[None])
    # symmetric forcing split: second order with damping (trep's left split biases omega0 by ~c dt/4)
    traj = rollout(functools.partial(vi_step, forcing_split="symmetric"), system, state0, jnp.diff(t))
    # p_k = D2 L_d + f_d^+ is theta_dot at the node to O(dt^2) (unit inertia)
    return traj.states.p[:, 0] + bias, traj


def _residuals(params, args):
    t, w, mask = args
    return (_model(params, t, t.dtype)[0] - w) * mask


_model_jit = jax.jit(lambda p, t: _model(p, t, t.dtype))


def _initial_guess(t, w):
    """Bias, frequency (from zero crossings), angle by integrating the rate, rate at t0."""
    bias = float(np.mean(w))
    x = w - bias
    s = np.signbit(x)
    idx = np.nonzero(s[1:] != s[:-1])[0]
    tc = t[idx] + (t[idx + 1] - t[idx]) * x[idx] / (x[idx] - x[idx + 1])
    if len(tc) < 3:
        raise ValueError("fit_pendulum: fewer than 3 zero crossings of the rate: not a swinging pendulum window")
    half = float(np.median(np.diff(tc)))
    omega0 = math.pi / half
    theta = np.concatenate([[0.0], np.cumsum(0.5 * (x[1:] + x[:-1]) * np.diff(t))])
    theta0 = -float(np.mean(theta))
    return np.array([math.log(omega0), 0.0, theta0, float(x[0]), bias])


def fit_pendulum(
    t,
    omega,
    *,
    axis: int = 0,
    mass: float = RACQUET_MASS,
    distance: float = RACQUET_PIVOT_DISTANCE,
    gravity: float = 9.81,
    max_steps: int = 100,
    pad_to: int | None = None,
    name: str = "",
) -> PendulumFit:
    r"""Identify ``omega0``, damping, initial state and gyro bias of a swinging physical pendulum.

    Args:
        t: sample times (n,), s, strictly increasing (non-uniform allowed: the VI steps at them).
        omega: gyro rates (n,) about the pivot axis, or (n, 3) body rates (column ``axis``), rad/s.
        axis: column of ``omega`` that is the pivot axis (default 0, the phone x axis).
        mass: kg; distance: pivot to centre of mass, m; gravity: m/s^2 (for ``I_p = m g d / omega0^2``).
        max_steps: Levenberg-Marquardt iteration cap.
        pad_to: pad the window to this many samples (masked residuals, so the fit is
            unchanged) so that windows of different lengths share one compilation.
        name: label carried into the result.

    Returns:
        :class:`PendulumFit`.

    Raises:
        ValueError: shapes, NaN, non-increasing ``t``, fewer than 3 zero crossings.
    """
    t = np.asarray(t, float)
    w = np.asarray(omega, float)
    if w.ndim == 2:
        if w.shape[1] <= axis:
            raise ValueError(f"fit_pendulum: omega has {w.shape[1]} columns; axis={axis}")
        w = w[:, axis]
    if t.ndim != 1 or w.shape != t.shape:
        raise ValueError(f"fit_pendulum: t must be (n,) and omega (n,) or (n, 3); got {t.shape} and {np.shape(omega)}")
    if t.size < 10 or not (np.all(np.isfinite(t)) and np.all(np.isfinite(w))):
        raise ValueError("fit_pendulum: need >= 10 finite samples")
    if np.any(np.diff(t) <= 0):
        raise ValueError("fit_pendulum: t must be strictly increasing")
    p0 = _initial_guess(t, w)
    n = t.size
    n_pad = max(n, int(pad_to or n))
    # the rollout starts at t[0]; time relative to it keeps float round-off small
    step = float(np.median(np.diff(t)))
    tp = np.concatenate([t - t[0], (t[-1] - t[0]) + step * np.arange(1, n_pad - n + 1)])
    wp = np.concatenate([w, np.zeros(n_pad - n)])
    mask = np.concatenate([np.ones(n), np.zeros(n_pad - n)])
    args = (jnp.asarray(tp), jnp.asarray(wp), jnp.asarray(mask))
    solver = optx.LevenbergMarquardt(rtol=1e-10, atol=1e-10)
    sol = optx.least_squares(_residuals, solver, jnp.asarray(p0), args, max_steps=max_steps, throw=False)
    params = sol.value
    model, traj = _model_jit(params, args[0])
    model = np.asarray(model)[:n]
    traj = jax.tree_util.tree_map(lambda a: a[:n], traj)
    log_w0, c, th0, rate0, bias = (float(v) for v in params)
    omega0 = math.exp(log_w0)
    theta = np.asarray(traj.states.q[:, 0])
    rate = np.asarray(traj.states.p[:, 0])
    # energy amplitude: 1 - cos(A) = (1 - cos(theta)) + rate^2 / (2 omega0^2), averaged over the window
    cosA = np.cos(theta) - rate**2 / (2 * omega0**2)
    amplitude = float(np.mean(np.arccos(np.clip(cosA, -1, 1))))
    period_small = 2 * math.pi / omega0
    period = float(4 * special.ellipk(math.sin(amplitude / 2) ** 2) / omega0)
    I_p = mass * gravity * distance / omega0**2
    res = np.asarray(model) - w
    return PendulumFit(
        omega0=omega0,
        damping_rate=c,
        theta0=th0,
        rate0=rate0,
        bias=bias,
        amplitude=amplitude,
        period_small=period_small,
        period=period,
        inertia_pivot=I_p,
        damping=c * I_p,
        rms=float(np.sqrt(np.mean(res**2))),
        n=int(t.size),
        converged=bool(sol.result == optx.RESULTS.successful),
        model_omega=np.asarray(model),
        name=name,
    )


def fit_pendulum_segments(segments, **kwargs) -> list[PendulumFit]:
    """:func:`fit_pendulum` on each :class:`rigidjax.io.Segment` (``.t``, ``.omega``, ``.name``).

    Windows are padded to the longest one (rounded up to 50 samples) so one compilation serves all.
    """
    segments = list(segments)
    if not segments:
        return []
    longest = max(len(s.t) for s in segments)
    kwargs.setdefault("pad_to", 50 * ((longest + 49) // 50))
    return [fit_pendulum(s.t, s.omega, name=getattr(s, "name", ""), **kwargs) for s in segments]
