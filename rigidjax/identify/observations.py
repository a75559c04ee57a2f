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
  ``y = x(t) + offset`` with an optional constant offset;
* :class:`SpecificForce` (an accelerometer, m/s^2, body axes, at a body-fixed point ``r``):
  ``y(t) = G R (C^T (a_P(t) - g)) + b``, the specific force (a resting accelerometer reads
  ``+|g|`` along the body axis that points up), with an optional fitted sensor position ``r``,
  bias, per-axis gain and misalignment.

``sigma`` weights an observation (the same unit as its residual): with two kinds of data,
give each its noise level so that the cost is a sum of squared standardised residuals.
"""

from __future__ import annotations

import dataclasses
import math
import operator

import jax.numpy as jnp
import numpy as np

from .. import so3
from ..body import RigidBodyState
from ..euler_parameters.outputs import output
from .transforms import Bounded, Positive, Real

__all__ = [
    "reads",
    "AngularVelocity",
    "Orientation",
    "Position",
    "Signal",
    "SpecificForce",
    "rigid_body_signals",
    "ep_signals",
]


def _rate(y, t):
    r"""The time derivative of a sampled signal ``y (T, ..., k)`` at its sample times ``t (T, ...)``.

    Interior samples: the three-point formula on a possibly uneven grid, second order,
    ``y'_j = (h_+ d_- + h_- d_+) / (h_- + h_+)`` with ``d_-``, ``d_+`` the difference quotients
    of the steps before and after sample ``j`` and ``h_-``, ``h_+`` their lengths (on an even
    grid: the central difference ``(y_{j+1} - y_{j-1}) / 2h``). The first and last samples get
    their one step's quotient (first order): observations that read them leave them out. A
    step that did not advance the time (a failed step, the state held) counts as zero rate.
    """
    T = y.shape[0]
    if T < 2:
        return jnp.full_like(y, jnp.nan)
    h = jnp.diff(t, axis=0)
    h = jnp.where(h > 0, h, 1)[..., None]
    d = jnp.diff(y, axis=0) / h
    if T == 2:
        return jnp.concatenate([d, d], 0)
    hm, hp = h[:-1], h[1:]
    mid = (hp * d[:-1] + hm * d[1:]) / (hm + hp)
    return jnp.concatenate([d[:1], mid, d[-1:]], 0)


def _body_axes(q, v):
    """``C^T v``: a world vector ``v (..., 3)`` in the body axes of ``q`` (body to world)."""
    return so3.rotate(so3.conjugate(q), v)


def rigid_body_signals(model, states: RigidBodyState) -> dict:
    r"""The signals of a :class:`rigidjax.RigidBodyState` trajectory (leading time axis ``T``):

    * ``angular_velocity`` (rad/s, body), ``orientation`` (body to world), ``position`` (m,
      world), ``velocity`` (m/s, world): the state's fields;
    * ``acceleration`` (m/s^2, world, centre of mass) and ``angular_acceleration`` (rad/s^2,
      body axes; the body-frame derivative of ``omega_body``, equal to the world angular
      acceleration expressed in the body axes): derived from the trajectory, which does not
      carry them, by the second-order three-point difference of the sampled ``velocity`` and
      ``angular_velocity`` in ``states.time`` (on an even grid the central difference, equal
      to the mean of the two adjacent steps' own average accelerations ``(V' - V) / dt``).
      The first and last samples are one-sided (first order);
    * ``specific_force`` (m/s^2, body axes, at the centre of mass): ``C^T (a - g)`` with ``C``
      the orientation and ``g`` the model's ``gravity`` (world);
    * ``accelerometer`` ``(T, 9)``: ``[specific_force, angular_velocity,
      angular_acceleration]``, all body axes: what :class:`SpecificForce` reads to move the
      specific force to a sensor off the centre of mass.

    Accuracy of the derived signals against the exact motion: the midpoint step's twist is
    second order in ``dt`` (its error a smooth function of time, whose difference quotients are
    then second order too) and the central difference adds an ``O(dt^2)`` truncation, so
    ``acceleration`` and ``angular_acceleration`` are second order at the interior samples.
    ``specific_force`` rotates by the orientation: second order with
    ``Midpoint(attitude="midpoint")``, first order with the default ``attitude="new"``.
    Use a fine enough step (``Problem(substeps=...)``): the differences are taken on the
    rollout's own steps, then subsampled. Round-off: about ``eps |v| / dt`` (float32 with
    small steps loses digits).
    """
    t = states.time
    a = _rate(states.velocity, t)
    alpha = _rate(states.angular_velocity, t)
    f = _body_axes(states.orientation, a - model.gravity)
    return {
        "angular_velocity": states.angular_velocity,
        "orientation": states.orientation,
        "position": states.position,
        "velocity": states.velocity,
        "acceleration": a,
        "angular_acceleration": alpha,
        "specific_force": f,
        "accelerometer": jnp.concatenate([f, states.angular_velocity, alpha], -1),
    }


def ep_signals(body: int = 0):
    r"""A signal map for :class:`rigidjax.euler_parameters.EPState` trajectories: body
    ``body``'s ``angular_velocity`` (rad/s, body axes), ``orientation`` (normalised Euler
    parameters, body to world), ``position`` (centre of mass, m, world), and from the state's
    own accelerations (``Coordinates_tt``, which the generalized-alpha step solves for with
    the equations of motion at each step: no differencing, every sample valid):
    ``acceleration`` (m/s^2, world, centre of mass), ``angular_acceleration`` (rad/s^2, body
    axes, ``G_body(theta) theta_tt``), ``specific_force`` (m/s^2, body axes, centre of mass,
    ``C^T (a - g)`` with the body's gravity) and ``accelerometer`` ``(T, 9)`` =
    ``[specific_force, angular_velocity, angular_acceleration]`` for :class:`SpecificForce`
    (use ``SpecificForce(drop_ends=False)``). For constrained systems (index 3) the
    generalized-alpha accelerations may carry an ``O(dt)`` transient that the numerical
    damping removes over the first steps (Arnold & Brüls 2007, Multibody Syst. Dyn. 18)."""

    def signals(model, states) -> dict:
        x = model.reference + states.coordinates
        theta = x[..., body, 3:]
        q = theta / jnp.linalg.norm(theta, axis=-1, keepdims=True)
        w = output(model, states, "AngularVelocityLocal")[..., body, :]
        a = states.accelerations[..., body, :3]
        alpha = jnp.einsum("...ij,...j->...i", so3.g_matrix_body(theta), states.accelerations[..., body, 3:])
        f = _body_axes(q, a - model.body.gravity[body])
        return {
            "angular_velocity": w,
            "orientation": q,
            "position": x[..., body, :3],
            "acceleration": a,
            "angular_acceleration": alpha,
            "specific_force": f,
            "accelerometer": jnp.concatenate([f, w, alpha], -1),
        }

    return signals


def _triad_parameters(o) -> dict:
    """The sensor parameters of a three-axis sensor ``o`` with ``bias``, ``gain`` and
    ``misalignment`` flags: ``{name: (transform, start value)}`` (zero bias, unit gains, no
    misalignment)."""
    p = {}
    if o.bias:
        p["bias"] = (Real(), np.zeros(3))
    if o.gain:
        p["gain"] = (Positive(), np.ones(3))
    if o.misalignment:
        p["misalignment"] = (Real(), np.zeros(3))
    return p


def _triad_reading(y, p: dict):
    """What a three-axis sensor reads of the true body-axis signal ``y (..., 3)``: turned by
    the misalignment rotation (a rotation vector, rad), scaled per axis by the gains, plus the
    bias (each where ``p`` has it)."""
    if "misalignment" in p:
        y = so3.rotate(so3.exp(p["misalignment"]), y)
    if "gain" in p:
        y = y * p["gain"]
    if "bias" in p:
        y = y + p["bias"]
    return y


def _check_sigma(o) -> None:
    if not (isinstance(o.sigma, (int, float, np.floating)) and np.isfinite(o.sigma) and o.sigma > 0):
        raise ValueError(f"{type(o).__name__}: sigma must be a finite number > 0; got {o.sigma!r}")


def _check_segments(o) -> None:
    if o.segments is None:
        return
    given = tuple(o.segments) if isinstance(o.segments, (tuple, list, range, np.ndarray)) else None
    try:
        idx = tuple(operator.index(i) for i in given if not isinstance(i, (bool, np.bool_)))
        ok = len(idx) == len(given) > 0 and min(idx) >= 0 and len(set(idx)) == len(idx)
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{type(o).__name__}: segments must be None or a sequence of distinct segment indices >= 0 "
            f"(integers); got {o.segments!r}"
        )
    object.__setattr__(o, "segments", idx)


def reads(o, s: int) -> bool:
    """Whether observation ``o`` reads segment ``s`` (its ``segments``; every segment where it
    has none)."""
    idx = getattr(o, "segments", None)
    return idx is None or s in idx


def data_width(problem, o) -> int:
    """The width of ``data[o.key]`` in the segments observation ``o`` reads."""
    s = next(i for i in range(len(problem.segments)) if reads(o, i))
    return int(np.shape(problem.segments[s].data[o.key])[-1])


def data_of(problem, o, s: int) -> np.ndarray:
    """``data[o.key]`` of segment ``s``, or zeros of its shape where ``o`` does not read it
    (its residual there has weight 0)."""
    seg = problem.segments[s]
    if reads(o, s):
        return np.asarray(seg.data[o.key])
    return np.zeros((len(np.asarray(seg.t)), data_width(problem, o)))


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
        segments: ``None`` (every segment of the problem) or the indices of the segments it
            reads (e.g. a gyroscope bias per recording: one observation per recording's
            segments); the other segments need no ``data[key]``.
    """

    key: str = "omega"
    signal: str = "angular_velocity"
    bias: bool = True
    gain: bool = False
    misalignment: bool = False
    max_delay: float | None = None
    sigma: float = 1.0
    segments: tuple | None = None

    #: the unit of its data and residual (messages; ``""``: not named)
    unit = "rad/s"

    #: the measured array's width (values per sample); ``None``: any
    width = 3

    def __post_init__(self):
        _check_sigma(self)
        _check_segments(self)

    def residual_size(self, width: int) -> int:
        return 3

    def parameters(self, width: int = 3) -> dict:
        """``{name: (transform, start value)}`` of the sensor parameters."""
        p = _triad_parameters(self)
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
        y = _triad_reading(y, p)
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
        segments: ``None`` (every segment of the problem) or the indices of the segments it
            reads (e.g. a gyroscope bias per recording: one observation per recording's
            segments); the other segments need no ``data[key]``.
    """

    key: str = "q"
    signal: str = "orientation"
    frame_offset: bool = False
    sigma: float = 1.0
    segments: tuple | None = None

    #: the unit of its data and residual (messages; ``""``: not named)
    unit = "rad"

    #: the measured array's width (values per sample); ``None``: any
    width = 4

    def __post_init__(self):
        _check_sigma(self)
        _check_segments(self)

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
        segments: ``None`` (every segment of the problem) or the indices of the segments it
            reads (e.g. a gyroscope bias per recording: one observation per recording's
            segments); the other segments need no ``data[key]``.
    """

    key: str
    signal: str
    offset: bool = False
    sigma: float = 1.0
    segments: tuple | None = None

    #: the unit of its data and residual (messages; ``""``: not named)
    unit = ""

    #: the measured array's width (values per sample); ``None``: any
    width = None

    def __post_init__(self):
        _check_sigma(self)
        _check_segments(self)

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
    unit = "m"


@dataclasses.dataclass(frozen=True)
class SpecificForce:
    r"""An accelerometer: the specific force at a body-fixed point, m/s^2, body axes, ``(N, 3)``
    in ``data[key]``.

    The reading of an ideal accelerometer at the point ``r`` (m, body frame, from the centre
    of mass) is the specific force

    .. math::

        f = C^T (a_P - g), \qquad
        C^T a_P = C^T a + \alpha \times r + \omega \times (\omega \times r),

    with ``C`` the orientation (body to world), ``a`` the centre of mass's acceleration and
    ``g`` the model's gravity (both WORLD), ``omega`` and ``alpha = d omega / dt`` in BODY
    axes (the rigid-body acceleration of a point, its centripetal and tangential lever-arm
    terms; specific force as in Titterton & Weston, *Strapdown Inertial Navigation
    Technology*, 2nd ed., IET 2004). Sign: ``f`` is the
    non-gravitational force per unit mass, so a body at rest on a table (``a = 0``) reads
    ``-C^T g``: ``+9.81`` along the body axis that points up; a body in free fall reads 0.
    The sensor model (like :class:`AngularVelocity`'s):
    ``y = G R f + b`` with bias ``b`` (m/s^2), per-axis gain ``G = diag(k)`` (> 0) and
    misalignment ``R = exp(phi)`` (rad) of the sensing axes.

    It reads the signal ``signal`` ``(N, 9)`` = ``[C^T (a - g), omega, alpha]`` (body axes)
    of the signal map: ``"accelerometer"`` of
    :func:`rigid_body_signals` (the midpoint free body; accelerations by central
    differences of the rollout's steps, second order with ``Midpoint(attitude="midpoint")``)
    or of :func:`ep_signals` (the Euler-parameter stepper's own accelerations).

    Args:
        key: the segment's data key.
        signal: the simulated signal it reads (``(N, 9)``, see above).
        position: the sensor's point ``r`` (m, body frame, from the centre of mass, 3): known,
            or the start value where ``fit_position``.
        fit_position: fit ``r`` (m, 3; needs angular motion that varies, else it is not
            separable from the bias).
        bias: fit a constant bias (m/s^2, 3).
        gain: fit a per-axis gain (3, > 0; 1 = ideal).
        misalignment: fit a small rotation of the sensing axes (rotation vector, rad, 3).
        drop_ends: leave the first and last samples of each segment out of the residual
            (``True``: :func:`rigid_body_signals` can only difference one-sidedly there, first
            order); ``False`` for :func:`ep_signals`, whose accelerations are the state's.
        sigma: the residual's scale (m/s^2).
        segments: ``None`` (every segment of the problem) or the indices of the segments it
            reads (e.g. a gyroscope bias per recording: one observation per recording's
            segments); the other segments need no ``data[key]``.
    """

    key: str = "f"
    signal: str = "accelerometer"
    position: tuple = (0.0, 0.0, 0.0)
    fit_position: bool = False
    bias: bool = True
    gain: bool = False
    misalignment: bool = False
    drop_ends: bool = True
    sigma: float = 1.0
    segments: tuple | None = None

    #: the unit of its data and residual (messages; ``""``: not named)
    unit = "m/s^2"

    #: the measured array's width (m/s^2, body axes)
    width = 3

    def __post_init__(self):
        _check_sigma(self)
        _check_segments(self)
        r = np.asarray(self.position, dtype=float) if np.ndim(self.position) == 1 else None
        if r is None or r.shape != (3,) or not np.all(np.isfinite(r)):
            raise ValueError(
                f"SpecificForce: position must be 3 finite numbers (m, body frame, from the centre of mass); "
                f"got {self.position!r}"
            )

    def residual_size(self, width: int) -> int:
        return 3

    def parameters(self, width: int = 3) -> dict:
        """``{name: (transform, start value)}`` of the sensor parameters."""
        p = _triad_parameters(self)
        if self.fit_position:
            p["position"] = (Real(), np.asarray(self.position, float))
        return p

    def magnitude(self, measured: np.ndarray) -> np.ndarray:
        """``|measured| / sigma`` per residual component: the scale of its round-off."""
        return np.abs(np.asarray(measured, float)) / self.sigma

    def weight(self, t: np.ndarray) -> np.ndarray:
        w = np.ones(len(t))
        if self.drop_ends:
            if len(t) < 5:
                raise ValueError(
                    f"SpecificForce: a segment of {len(t)} samples leaves fewer than 3 in the residual "
                    "(its first and last samples are dropped: drop_ends=True)"
                )
            w[0] = w[-1] = 0
        return w

    def predict(self, predicted, p: dict):
        """The reading ``(N, 3)`` from the signal ``(N, 9)`` and the sensor values ``p``."""
        if predicted.shape[-1] != 9:
            raise ValueError(
                f"SpecificForce reads signal {self.signal!r} as (N, 9) [specific force at the centre of mass, "
                f"angular velocity, angular acceleration; body axes], e.g. 'accelerometer' of "
                f"rigid_body_signals or ep_signals; got shape {tuple(predicted.shape)}"
            )
        f, w, alpha = predicted[..., :3], predicted[..., 3:6], predicted[..., 6:]
        r = p["position"] if "position" in p else jnp.asarray(self.position, predicted.dtype)
        y = f + jnp.cross(alpha, r) + jnp.cross(w, jnp.cross(w, r))
        y = _triad_reading(y, p)
        return y

    def residual(self, predicted, t, measured, p: dict):
        return (measured - self.predict(predicted, p)) / self.sigma
