r"""Observation models: what a sensor measures of a simulated trajectory, with its errors.

Each observation reads one measured array of a :class:`rigidjax.identify.MeasuredSegment`
(``data[key]``, samples along axis 0 at the segment's times ``t``) and one simulated signal
(``signals[signal]``, from the problem's signal map, e.g.
:func:`rigid_body_signals`), and returns the weighted residual ``(measured - predicted) / sigma``
per sample. Its sensor parameters are fitted with the model, shared by all segments:

* :class:`AngularVelocity` (a gyroscope, rad/s, body axes): ``y(t) = G R omega(t - tau) + b``
  with bias ``b`` (rad/s), per-axis gain ``G = diag(g)`` (> 0), misalignment ``R = exp(phi)``
  (rad) and time delay ``tau`` (s; the simulated signal interpolated linearly between samples,
  so a delay of a fraction of a sample is resolved);
* :class:`Orientation` (motion capture or an attitude filter; unit quaternions ``[w, x, y, z]``,
  body to world): ``q_meas = q_off ⊗ q(t)`` with an optional constant frame offset ``q_off =
  exp(phi)``; the residual is the rotation vector ``log(conj(q_off ⊗ q) ⊗ q_meas)`` (rad),
  blind to the sign of ``q_meas``;
* :class:`Signal` (any signal, e.g. an encoder's angle) and :class:`Position` (m, world):
  ``y = x(t) + offset`` with an optional constant offset.

``sigma`` weights an observation (the same unit as its residual): with two kinds of data,
give each its noise level so that the cost is a sum of squared standardised residuals.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from .. import so3
from ..body import RigidBodyState
from ..euler_parameters.outputs import output
from .transforms import Bounded, Positive, Real

__all__ = ["AngularVelocity", "Orientation", "Position", "Signal", "rigid_body_signals", "ep_signals"]


def rigid_body_signals(model, states: RigidBodyState) -> dict:
    """The signals of a :class:`rigidjax.RigidBodyState` trajectory (leading time axis):
    ``angular_velocity`` (rad/s, body), ``orientation`` (body to world), ``position`` (m,
    world), ``velocity`` (m/s, world)."""
    return {
        "angular_velocity": states.angular_velocity,
        "orientation": states.orientation,
        "position": states.position,
        "velocity": states.velocity,
    }


def ep_signals(body: int = 0):
    """A signal map for :class:`rigidjax.euler_parameters.EPState` trajectories: body
    ``body``'s ``angular_velocity`` (rad/s, body axes), ``orientation`` (normalised Euler
    parameters, body to world), ``position`` (centre of mass, m, world)."""

    def signals(model, states) -> dict:
        x = model.reference + states.coordinates
        theta = x[..., body, 3:]
        return {
            "angular_velocity": output(model, states, "AngularVelocityLocal")[..., body, :],
            "orientation": theta / jnp.linalg.norm(theta, axis=-1, keepdims=True),
            "position": x[..., body, :3],
        }

    return signals


def _check_sigma(o) -> None:
    if not (isinstance(o.sigma, (int, float, np.floating)) and np.isfinite(o.sigma) and o.sigma > 0):
        raise ValueError(f"{type(o).__name__}: sigma must be a finite number > 0; got {o.sigma!r}")


def _delayed(y, t, tau):
    """``y(t - tau)`` by linear interpolation between the samples (held at the ends)."""
    return jnp.stack([jnp.interp(t - tau, t, y[:, i]) for i in range(y.shape[1])], -1)


def _edge_samples(t: np.ndarray, max_delay: float) -> int:
    """Samples at each end whose delayed prediction would need the signal outside the segment."""
    if max_delay <= 0:
        return 0
    return int(math.ceil(max_delay / float(np.min(np.diff(t))))) + 1


@dataclasses.dataclass(frozen=True)
class AngularVelocity:
    """A gyroscope: body angular velocity, rad/s, ``(N, 3)`` in ``data[key]``.

    Args:
        key: the segment's data key.
        signal: the simulated signal it measures.
        bias: fit a constant bias (rad/s, 3).
        gain: fit a per-axis gain (3, > 0; 1 = ideal).
        misalignment: fit a small rotation of the sensor axes (rotation vector, rad, 3).
        max_delay: ``None`` (no delay) or the bound (s) of a fitted delay ``|tau| <
            max_delay``; samples within it of a segment's ends are left out of the residual.
        sigma: the residual's scale (rad/s).
    """

    key: str = "omega"
    signal: str = "angular_velocity"
    bias: bool = True
    gain: bool = False
    misalignment: bool = False
    max_delay: float | None = None
    sigma: float = 1.0

    #: the measured array's width (values per sample); ``None``: any
    width = 3

    def __post_init__(self):
        _check_sigma(self)

    def residual_size(self, width: int) -> int:
        return 3

    def parameters(self, width: int = 3) -> dict:
        """``{name: (transform, start value)}`` of the sensor parameters."""
        p = {}
        if self.bias:
            p["bias"] = (Real(), np.zeros(3))
        if self.gain:
            p["gain"] = (Positive(), np.ones(3))
        if self.misalignment:
            p["misalignment"] = (Real(), np.zeros(3))
        if self.max_delay is not None:
            if not self.max_delay > 0:
                raise ValueError(f"AngularVelocity: max_delay must be > 0 s; got {self.max_delay}")
            p["delay"] = (Bounded(-self.max_delay, self.max_delay), np.zeros(()))
        return p

    def magnitude(self, measured: np.ndarray) -> np.ndarray:
        """``|measured| / sigma`` per residual component: the scale of its round-off."""
        return np.abs(np.asarray(measured, float)) / self.sigma

    def weight(self, t: np.ndarray) -> np.ndarray:
        w = np.ones(len(t))
        e = _edge_samples(t, self.max_delay or 0.0)
        if 2 * e + 3 > len(t):
            raise ValueError(
                f"AngularVelocity: max_delay {self.max_delay} s leaves fewer than 3 samples of a segment of "
                f"{t[-1] - t[0]:.3g} s ({len(t)} samples) in the residual (samples within it of either end are dropped)"
            )
        if e:
            w[:e] = 0
            w[-e:] = 0
        return w

    def residual(self, predicted, t, measured, p: dict):
        y = predicted
        if "delay" in p:
            y = _delayed(y, t, p["delay"])
        if "misalignment" in p:
            y = so3.rotate(so3.exp(p["misalignment"]), y)
        if "gain" in p:
            y = y * p["gain"]
        if "bias" in p:
            y = y + p["bias"]
        return (measured - y) / self.sigma


@dataclasses.dataclass(frozen=True)
class Orientation:
    """Measured orientation: unit quaternions ``[w, x, y, z]`` (body to world), ``(N, 4)``.

    Args:
        key, signal: the data key and the simulated signal.
        frame_offset: fit a constant rotation of the measuring frame (rotation vector, rad).
            Identifiable only where the initial orientations are known or the dynamics
            depend on the orientation (gravity acting off the centre of mass, world torques):
            for a free body it duplicates the initial orientation's unknowns.
        sigma: the residual's scale (rad).
    """

    key: str = "q"
    signal: str = "orientation"
    frame_offset: bool = False
    sigma: float = 1.0

    #: the measured array's width (values per sample); ``None``: any
    width = 4

    def __post_init__(self):
        _check_sigma(self)

    def residual_size(self, width: int) -> int:
        return 3

    def parameters(self, width: int = 3) -> dict:
        return {"frame_offset": (Real(), np.zeros(3))} if self.frame_offset else {}

    def magnitude(self, measured: np.ndarray) -> np.ndarray:
        """The scale of the residual's round-off per component (unit quaternions: ``1 / sigma``)."""
        return np.ones((len(measured), 3)) / self.sigma

    def weight(self, t: np.ndarray) -> np.ndarray:
        return np.ones(len(t))

    def residual(self, predicted, t, measured, p: dict):
        q = predicted
        if "frame_offset" in p:
            q = so3.multiply(so3.exp(p["frame_offset"]), q)
        return so3.log(so3.multiply(so3.conjugate(q), measured)) / self.sigma


@dataclasses.dataclass(frozen=True)
class Signal:
    """Any measured signal ``(N, k)`` compared directly with the simulated one:
    ``y = signal(t) + offset`` (e.g. an encoder's angle, a joint's rate, a marker's position).

    Args:
        key, signal: the data key and the simulated signal.
        offset: fit a constant offset (k values, the signal's unit).
        sigma: the residual's scale (the signal's unit).
    """

    key: str
    signal: str
    offset: bool = False
    sigma: float = 1.0

    #: the measured array's width (values per sample); ``None``: any
    width = None

    def __post_init__(self):
        _check_sigma(self)

    def residual_size(self, width: int) -> int:
        return width

    def parameters(self, width: int = 3) -> dict:
        return {"offset": (Real(), np.zeros(width))} if self.offset else {}

    def magnitude(self, measured: np.ndarray) -> np.ndarray:
        """``|measured| / sigma`` per residual component: the scale of its round-off."""
        return np.abs(np.asarray(measured, float)) / self.sigma

    def weight(self, t: np.ndarray) -> np.ndarray:
        return np.ones(len(t))

    def residual(self, predicted, t, measured, p: dict):
        y = predicted + p["offset"] if "offset" in p else predicted
        return (measured - y) / self.sigma


@dataclasses.dataclass(frozen=True)
class Position(Signal):
    """Measured position (m, world), ``(N, 3)``; ``offset``: fit a constant offset (m)."""

    key: str = "x"
    signal: str = "position"
    #: the measured array's width (m, world)
    width = 3
