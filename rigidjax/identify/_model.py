r"""The inertia-identification model: Euler's equations with drag, its parametrisations, its
compiled evaluator and the independent reference check.

Model (body = sensor frame): ``I omega' = -omega x I omega - D omega``, the gyroscope reads
``omega + b``. Simulated by the seed-000 midpoint step's rotational part
(:func:`rigidjax.midpoint.angular_velocity_step`) over the measured sample intervals, each
split into ``k`` equal sub-steps (``k`` per window, traced: one compilation serves every
``k``).

Coordinates of the shared parameters (inertia, drag), three of them:

* model values ``theta = [inertia components | drag]``: the diagonal ``(I_xx, I_yy, I_zz)``
  or the six ``(xx, yy, zz, xy, xz, yz)`` in sensor axes, then ``c`` (isotropic) or
  ``(c_x, c_y, c_z)`` (diagonal, sensor axes); what the evaluator differentiates;
* the optimiser's chart, in which the physically valid set is a BOX: principal moments
  from the second moments ``L_i >= 0`` of the mass distribution (``I_1 = L_2 + L_3``,
  ``I_2 = L_1 + L_3``, ``I_3 = L_1 + L_2``; positive definite with the triangle
  inequalities, ``L_k = 0`` the planar-lamina equality), scaled so that ``I_2 = 1``, i.e.
  ``L_1 = u in [0, 1]``, ``L_3 = 1 - u``, ``L_2 = v >= 0``:
  ``(I_1, I_2, I_3) = (v + 1 - u, 1, u + v)``; the principal axes ``R = R_ref exp(phi)``
  (full tensor; ``R_ref`` a per-problem constant, ``phi`` free) and the drag ``>= 0``.
  The edges ``u = 1`` (``I_3 = I_1 + I_2``: a thin plate, the racquet), ``u = 0`` and
  ``v = 0`` are reached exactly by the bounded optimiser;
* the reported coordinates, relative to ``I_yy`` (sensor y): ``Ix/Iy, Iz/Iy`` (+
  ``Ixy/Iy, Ixz/Iy, Iyz/Iy``) and ``drag/Iy``: unconstrained and linear in ``theta``; the
  covariance is computed here.

Torque-free motion with ``D`` scaled with ``I`` fixes the inertia only up to a factor: the
charts fix it (``I_2 = 1`` or ``I_yy = 1``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from scipy.spatial.transform import Rotation

from ..midpoint import angular_velocity_step
from ..reference import euler_omega
from ._stored import stored
from ._charts import _nearest_axes

DRAG_KINDS = (None, "isotropic", "diagonal")
#: Edge of the search: the second moment ``v`` (about the largest moment ratio) at most this.
#: A fit that ends there prefers a degenerate, rod-like body: the data do not determine it.
V_MAX = 1e4


@dataclasses.dataclass(frozen=True)
class Spec:
    """What is fitted: full tensor or principal moments along the sensor axes, the drag kind
    (``None``, ``"isotropic"``, ``"diagonal"``), a gyroscope bias."""

    tensor: bool
    drag: str | None
    bias: bool

    @property
    def n_icomp(self) -> int:
        return 6 if self.tensor else 3

    @property
    def n_drag(self) -> int:
        return {None: 0, "isotropic": 1, "diagonal": 3}[self.drag]

    @property
    def n_theta(self) -> int:
        return self.n_icomp + self.n_drag

    @property
    def n_bias(self) -> int:
        return 3 if self.bias else 0

    @property
    def n_chart(self) -> int:
        """Shared unknowns in the optimiser's chart: ``u, v`` (+ ``phi``) + drag."""
        return 2 + 3 * self.tensor + self.n_drag

    @property
    def n_phys(self) -> int:
        """Shared unknowns in the reported coordinates."""
        return len(self.inertia_names) + self.n_drag

    @property
    def inertia_names(self) -> tuple[str, ...]:
        return ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "Ixz/Iy", "Iyz/Iy") if self.tensor else ("Ix/Iy", "Iz/Iy")

    @property
    def drag_names(self) -> tuple[str, ...]:
        return {None: (), "isotropic": ("drag/Iy",), "diagonal": ("drag_x/Iy", "drag_y/Iy", "drag_z/Iy")}[self.drag]

    def chart_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Box of the optimiser's chart (shared part): ``u in [0, 1]``, ``0 <= v <=``
        :data:`V_MAX`, drag ``>= 0``."""
        lo = [0.0, 0.0] + [-np.inf] * (3 * self.tensor) + [0.0] * self.n_drag
        hi = [1.0, V_MAX] + [np.inf] * (3 * self.tensor) + [np.inf] * self.n_drag
        return np.array(lo), np.array(hi)


# ----------------------------------------------------------------------------- model values


def inertia_and_drag(theta, spec: Spec):
    """Model values ``theta`` -> ``(inertia (3, 3), damping (3,))`` (JAX, traceable)."""
    if spec.tensor:
        xx, yy, zz, xy, xz, yz = (theta[i] for i in range(6))
        inertia = jnp.stack([jnp.stack([xx, xy, xz]), jnp.stack([xy, yy, yz]), jnp.stack([xz, yz, zz])])
    else:
        inertia = jnp.diag(theta[:3])
    n = spec.n_icomp
    if spec.drag is None:
        damping = jnp.zeros(3, theta.dtype)
    elif spec.drag == "isotropic":
        damping = jnp.broadcast_to(theta[n], (3,))
    else:
        damping = theta[n : n + 3]
    return inertia, damping


def theta_tensor(theta: np.ndarray, spec: Spec) -> np.ndarray:
    """NumPy: model values ``(..., n_theta)`` -> inertia tensors ``(..., 3, 3)``."""
    th = np.asarray(theta, float)
    if not spec.tensor:
        return th[..., :3, None] * np.eye(3)
    xx, yy, zz, xy, xz, yz = (th[..., i] for i in range(6))
    return np.stack([np.stack([xx, xy, xz], -1), np.stack([xy, yy, yz], -1), np.stack([xz, yz, zz], -1)], -2)


def theta_drag(theta: np.ndarray, spec: Spec) -> np.ndarray:
    """NumPy: model values -> diagonal damping ``(..., 3)``."""
    th = np.asarray(theta, float)
    n = spec.n_icomp
    if spec.drag is None:
        return np.zeros(th.shape[:-1] + (3,))
    if spec.drag == "isotropic":
        return np.repeat(th[..., n : n + 1], 3, -1)
    return th[..., n : n + 3]


def _tensor_comps(inertia: np.ndarray, spec: Spec) -> np.ndarray:
    if not spec.tensor:
        return np.diagonal(inertia, axis1=-2, axis2=-1)
    i = inertia
    return np.stack([i[..., 0, 0], i[..., 1, 1], i[..., 2, 2], i[..., 0, 1], i[..., 0, 2], i[..., 1, 2]], -1)


def _hat(a):
    """NumPy ``hat(a) (..., 3, 3)``: ``hat(a) b = a x b`` (column j is ``a x e_j``)."""
    return np.swapaxes(np.cross(a[..., None, :], np.eye(3)), -1, -2)


def _right_jacobian(phi):
    """SO(3) right Jacobian ``J_r(phi)`` ``(..., 3, 3)``: ``Exp(phi + d) = Exp(phi) Exp(J_r d)``."""
    th2 = np.sum(phi * phi, -1)[..., None, None]
    th = np.sqrt(th2)
    small = th2 < 1e-8
    safe = np.where(small, 1.0, th)
    a = np.where(small, 0.5 - th2 / 24, (1 - np.cos(safe)) / np.where(small, 1.0, th2))
    b = np.where(small, 1 / 6 - th2 / 120, (safe - np.sin(safe)) / (safe * np.where(small, 1.0, th2)))
    K = _hat(phi)
    return np.eye(3) - a * K + b * (K @ K)


def chart_theta(xs: np.ndarray, R_ref: np.ndarray | None, spec: Spec):
    """Optimiser chart ``(na, n_chart)`` -> model values ``(na, n_theta)`` and their Jacobian
    ``(na, n_theta, n_chart)`` (NumPy; ``R_ref (na, 3, 3)`` for the full tensor)."""
    na = xs.shape[0]
    u, v = xs[:, 0], xs[:, 1]
    M = np.stack([v + 1 - u, np.ones(na), u + v], -1)
    dM = np.zeros((na, 3, 2))
    dM[:, 0] = [-1, 1]
    dM[:, 2] = [1, 1]
    n_i = spec.n_icomp
    T = np.zeros((na, spec.n_theta, spec.n_chart))
    if spec.tensor:
        phi = xs[:, 2:5]
        R = R_ref @ Rotation.from_rotvec(phi).as_matrix()
        inertia = (R * M[:, None, :]) @ np.swapaxes(R, -1, -2)
        comps = _tensor_comps(inertia, spec)
        for j in range(2):
            dI = (R * dM[:, None, :, j]) @ np.swapaxes(R, -1, -2)
            T[:, :n_i, j] = _tensor_comps(dI, spec)
        Jr = _right_jacobian(phi)
        Md = M[:, :, None] * np.eye(3)
        for j in range(3):
            H = _hat(Jr[:, :, j])
            dI = R @ (H @ Md - Md @ H) @ np.swapaxes(R, -1, -2)
            T[:, :n_i, 2 + j] = _tensor_comps(dI, spec)
        o = 5
    else:
        comps = M
        T[:, :3, :2] = dM
        o = 2
    theta = np.concatenate([comps, xs[:, o:]], 1)
    T[:, n_i:, o:] = np.eye(spec.n_drag)
    return theta, T


def phys_theta(xp: np.ndarray, spec: Spec):
    """Reported coordinates ``(na, n_phys)`` -> model values (``I_yy = 1``) and the constant
    Jacobian ``(na, n_theta, n_phys)``."""
    na = xp.shape[0]
    ni = len(spec.inertia_names)
    one = np.ones((na, 1))
    if spec.tensor:
        comps = np.concatenate([xp[:, :1], one, xp[:, 1:5]], 1)
        rows = [0, 2, 3, 4, 5]
    else:
        comps = np.concatenate([xp[:, :1], one, xp[:, 1:2]], 1)
        rows = [0, 2]
    T = np.zeros((na, spec.n_theta, spec.n_phys))
    for j, r in enumerate(rows):
        T[:, r, j] = 1.0
    T[:, spec.n_icomp :, ni:] = np.eye(spec.n_drag)
    return np.concatenate([comps, xp[:, ni:]], 1), T


def theta_phys(theta: np.ndarray, spec: Spec) -> np.ndarray:
    """Model values -> reported coordinates (divide by ``I_yy``)."""
    th = np.asarray(theta, float)
    iyy = th[:, 1:2]
    comps = th[:, [0, 2, 3, 4, 5]] if spec.tensor else th[:, [0, 2]]
    return np.concatenate([comps, th[:, spec.n_icomp :]], 1) / iyy


def theta_chart(theta: np.ndarray, spec: Spec):
    """Model values ``(na, n_theta)`` (any scale, possibly non-physical: projected) -> the
    optimiser's chart ``(na, n_chart)`` and ``R_ref (na, 3, 3)`` (``phi = 0``)."""
    th = np.atleast_2d(np.asarray(theta, float))
    na = th.shape[0]
    xs = np.zeros((na, spec.n_chart))
    R_ref = np.tile(np.eye(3), (na, 1, 1))
    for a in range(na):
        J = theta_tensor(th[a], spec)
        J = 0.5 * (J + J.T)
        if spec.tensor:
            moments, V = np.linalg.eigh(J)
            if np.linalg.det(V) < 0:
                V[:, 0] = -V[:, 0]
            Q, perm = _nearest_axes(V)
            moments = moments[perm]
            R_ref[a] = Q
        else:
            moments = np.diag(J).copy()
        m2 = moments[1]
        scale = m2 if m2 > 0 else max(np.max(np.abs(moments)), 1e-300)
        M = moments / scale
        xs[a, 0] = np.clip((M[2] - M[0] + 1) / 2, 0.0, 1.0)
        xs[a, 1] = max((M[0] + M[2] - 1) / 2, 0.0)
        o = 5 if spec.tensor else 2
        if spec.n_drag:
            xs[a, o:] = np.maximum(th[a, spec.n_icomp :] / scale, 0.0)
    return xs, R_ref


def random_chart(rng: np.random.Generator, n: int, spec: Spec, *, drag0: float = 0.02):
    """``n`` random physically valid points of the chart (and ``R_ref``): ``u`` uniform,
    ratios spread over ~0.05-60 (``v`` log-uniform), principal axes uniform on SO(3) for
    half of them and within ~20 deg of the sensor axes for the other half, drag ``drag0``."""
    xs = np.zeros((n, spec.n_chart))
    xs[:, 0] = rng.uniform(0, 1, n)
    xs[:, 1] = np.where(rng.uniform(size=n) < 0.1, 0.0, 10 ** rng.uniform(-2, 1.8, n))
    R_ref = np.tile(np.eye(3), (n, 1, 1))
    if spec.tensor:
        near = Rotation.from_rotvec(rng.normal(0, 0.2, (n, 3))).as_matrix()
        anywhere = Rotation.random(n, random_state=rng).as_matrix()
        R_ref = np.where((np.arange(n) % 2 == 0)[:, None, None], near, anywhere)
    if spec.n_drag:
        xs[:, 2 + 3 * spec.tensor :] = drag0
    return xs, R_ref


# ----------------------------------------------------------------------------- compiled kernels


def _trajectory(theta, w0, dt, k, spec: Spec):
    """Rates ``(N, 3)`` at the samples: ``dt (N-1,)`` sample intervals, ``k`` sub-steps each
    (a traced integer: one compilation serves every ``k``)."""
    inertia, damping = inertia_and_drag(theta, spec)
    kf = k.astype(theta.dtype)

    def sample(w, dti):
        h = dti / kf
        w = jax.lax.fori_loop(0, k, lambda _, w_: angular_velocity_step(inertia, w_, h, damping=damping), w)
        return w, w

    _, w = jax.lax.scan(sample, w0, dt)
    return jnp.concatenate([w0[None], w], 0)


@functools.lru_cache(maxsize=16)
def evaluator(spec: Spec):
    """Jitted, vmapped over lanes: ``(theta (Q, n_theta), w0 (Q, 3), bias (Q, 3), omega (Q, N, 3),
    weight (Q, N), dt (Q, N-1), k (Q,)) -> (A (Q, nm, nm), g (Q, nm), rss (Q,), ok (Q,))`` with
    ``m = [theta | w0 (| bias)]``: the Gauss-Newton matrix, gradient and residual sum of squares
    of the weighted residual ``(omega_model + bias - omega) * weight``.

    Forward sensitivities ``S = d omega / d [theta, w0]`` are carried through the scan
    (``jax.jvp`` of the step, vmapped over the ``n_theta + 3`` directions) and ``A``, ``g``
    accumulated sample by sample: memory independent of the window length ``N``."""
    n_t = spec.n_theta

    def f(w, th, h):
        inertia, damping = inertia_and_drag(th, spec)
        return angular_velocity_step(inertia, w, h, damping=damping)

    def lane(theta, w0, bias, omega, weight, dt, k):
        dtype = theta.dtype
        kf = k.astype(dtype)
        E = jnp.concatenate([jnp.eye(n_t, dtype=dtype), jnp.zeros((3, n_t), dtype)])
        eye3 = jnp.eye(3, dtype=dtype)

        def accumulate(acc, w, S, om, wt):
            A, g, rss = acc
            r = (w + bias - om) * wt
            J = S * wt  # (n_t + 3, 3): d r / d [theta, w0]
            if spec.bias:
                J = jnp.concatenate([J, eye3 * wt], 0)
            return A + J @ J.T, g + J @ r, rss + r @ r

        def sub(_, c):
            w, S, h = c
            w1, S1 = jax.vmap(lambda dw, dth: jax.jvp(lambda w_, th_: f(w_, th_, h), (w, theta), (dw, dth)))(S, E)
            return w1[0], S1, h

        def sample(c, xs):
            w, S, acc = c
            dti, om, wt = xs
            w, S, _ = jax.lax.fori_loop(0, k, sub, (w, S, dti / kf))
            return (w, S, accumulate(acc, w, S, om, wt)), None

        nm = n_t + 3 + spec.n_bias
        S0 = jnp.concatenate([jnp.zeros((n_t, 3), dtype), eye3])
        acc0 = accumulate(
            (jnp.zeros((nm, nm), dtype), jnp.zeros(nm, dtype), jnp.zeros((), dtype)), w0, S0, omega[0], weight[0]
        )
        (_, _, (A, g, rss)), _ = jax.lax.scan(sample, (w0, S0, acc0), (dt, omega[1:], weight[1:]))
        ok = jnp.isfinite(rss) & jnp.all(jnp.isfinite(A)) & jnp.all(jnp.isfinite(g))
        return A, g, rss, ok

    return stored(jax.jit(jax.vmap(lane)), ("evaluator", spec))


@functools.lru_cache(maxsize=16)
def simulator(spec: Spec):
    """Jitted, vmapped: ``(theta (Q, n_theta), w0 (Q, 3), dt (Q, N-1), k (Q,)) -> omega (Q, N, 3)``."""
    return stored(jax.jit(jax.vmap(lambda theta, w0, dt, k: _trajectory(theta, w0, dt, k, spec))), ("simulator", spec))


def lanes(n_pad: int) -> int:
    """Lanes per compiled call for windows padded to ``n_pad`` samples: ``4096 / n_pad``
    clipped to [4, 32]. One shape per window length: one compilation. Why 32: the call's
    cost grows about linearly with the lanes above ~16 (racquet flips, 128 samples: 5 ms
    for 32 lanes, 19 ms for 128, 2.8 ms for 8), so 32 lanes waste little at the start of a
    fit. Its tail, when only a few problems are still iterating, runs in calls of
    :data:`SMALL_LANES` (:func:`lane_chunks`)."""
    return int(min(32, max(SMALL_LANES, 4096 // n_pad)))


#: Lanes of the second compiled call shape, for the few problems still iterating at the end of
#: a fit. Measured (2-core VM, full tensor + drag + bias, 128 samples, one call): 1 lane
#: 2.5 ms, 2 lanes 3.5 ms, 4 lanes 4.6 ms, 16 lanes 9.3 ms, 32 lanes 26 ms. On the README demo
#: 394 of 463 evaluations had at most 4 lanes; padded to 32 each cost ~6x more.
SMALL_LANES = 4


def lane_chunks(n: int, Q: int, small: int = SMALL_LANES) -> list[tuple[int, int]]:
    """Split ``n`` lanes into calls ``(start, lanes of the call)``: full calls of ``Q`` lanes,
    then the remainder in calls of ``small`` lanes when at most two of them hold it,
    else one more call of ``Q``. Two call shapes: two compilations, whatever ``n``."""
    small = min(small, Q)
    out = []
    c0 = 0
    while n - c0 >= Q:
        out.append((c0, Q))
        c0 += Q
    r = n - c0
    if r > 2 * small:
        out.append((c0, Q))
    else:
        while c0 < n:
            out.append((c0, small))
            c0 += small
    return out


def pad_length(n: int) -> int:
    """Samples a window of ``n`` is padded to: a power of two >= 64 (few compilations)."""
    return int(max(64, 1 << (int(n) - 1).bit_length()))


def pad(segs, n_pad: int, dtype):
    """Windows -> padded ``(omega (S, n_pad, 3), weight (S, n_pad), dt (S, n_pad - 1))``;
    padded samples have zero weight and the median interval."""
    S = len(segs)
    omega = np.zeros((S, n_pad, 3))
    weight = np.zeros((S, n_pad))
    dt = np.zeros((S, n_pad - 1))
    for i, s in enumerate(segs):
        n = s.n
        omega[i, :n] = s.omega
        omega[i, n:] = s.omega[-1]
        weight[i, :n] = 1
        d = np.diff(s.t)
        dt[i, : n - 1] = d
        dt[i, n - 1 :] = np.median(d)
    return omega.astype(dtype), weight.astype(dtype), dt.astype(dtype)


def simulate(spec: Spec, theta, w0, dt, k, dtype):
    """Batched simulation through :func:`simulator` in lanes: ``theta (na, n_theta), w0 (na, 3),
    dt (na, N-1), k (na,)`` -> ``omega (na, N, 3)`` (NumPy)."""
    na, N = dt.shape[0], dt.shape[1] + 1
    out = np.empty((na, N, 3))
    sim = simulator(spec)
    for c0, Q in lane_chunks(na, lanes(N)):
        sl = np.arange(c0, min(c0 + Q, na))
        n_real = sl.size
        sl = np.concatenate([sl, np.full(Q - n_real, sl[-1])])
        w = sim(
            np.asarray(theta[sl], dtype),
            np.asarray(w0[sl], dtype),
            np.asarray(dt[sl], dtype),
            np.asarray(k[sl], np.int32),
        )
        out[c0 : c0 + n_real] = np.asarray(w, float)[:n_real]
    return out


def simulate_omega(inertia, omega0, t, *, drag=None, bias=None, substeps: int = 1):
    """Body angular velocity of the model :func:`rigidjax.identify.fit_inertia` fits.

    ``I omega' = -omega x I omega - D omega`` stepped by the seed's midpoint step
    (:func:`rigidjax.midpoint.angular_velocity_step`) over the intervals ``diff(t)``, each in
    ``substeps`` equal sub-steps. Pure JAX (jit/vmap/grad-able, follows the input dtype).

    Args:
        inertia: ``(3,)`` principal moments along the body axes or ``(3, 3)`` tensor, body
            frame, kg m^2 (or any common scale, with ``drag`` in the same scale).
        omega0: ``(3,)`` body angular velocity at ``t[0]``, rad/s.
        t: ``(n,)`` strictly increasing sample times, s.
        drag: ``None``, a scalar (``c I_3``) or ``(3,)`` diagonal angular resistance, N m s.
        bias: ``(3,)`` added to the output (gyroscope bias), rad/s.
        substeps: equal sub-steps per sample interval (a positive integer, may be traced).

    Returns:
        ``(omega (n, 3), ok)``: rad/s, body frame, and ``ok`` (bool): every value finite.
    """
    omega0 = jnp.asarray(omega0)
    dtype = jnp.result_type(omega0, float)
    inertia = jnp.asarray(inertia, dtype)
    inertia = jnp.diag(inertia) if inertia.shape == (3,) else inertia
    d = jnp.zeros(3, dtype) if drag is None else jnp.broadcast_to(jnp.asarray(drag, dtype), (3,))
    t = jnp.asarray(t, dtype)
    k = jnp.asarray(substeps, jnp.int32)
    spec = Spec(True, "diagonal", False)
    comps = jnp.stack([inertia[0, 0], inertia[1, 1], inertia[2, 2], inertia[0, 1], inertia[0, 2], inertia[1, 2]])
    w = _trajectory(jnp.concatenate([comps, d]), omega0.astype(dtype), jnp.diff(t), k, spec)
    if bias is not None:
        w = w + jnp.asarray(bias, dtype)
    return w, jnp.all(jnp.isfinite(w))


# ----------------------------------------------------------------------------- data checks


def noise_and_signal(omega: np.ndarray) -> tuple[float, float]:
    """``(noise, signal)`` RMS of measured rates ``(n, 3)`` (or ``(n,)``), rad/s.

    Noise: robust (1.4826 MAD) scale of the second differences ``w[i+1] - 2 w[i] + w[i-1]``
    over ``sqrt(6)`` (white noise of variance ``s^2`` gives differences of variance
    ``6 s^2``; a smooth motion adds ``~|w''| dt^2``, so on real data it is an upper bound).
    Signal: RMS of the rates about their mean (the variation a model has to explain).
    """
    w = np.asarray(omega, float)
    signal = float(np.sqrt(np.mean((w - w.mean(0)) ** 2)))
    if w.shape[0] < 3:
        return 0.0, signal
    d2 = (w[2:] - 2 * w[1:-1] + w[:-2]).reshape(-1)
    return 1.4826 * float(np.median(np.abs(d2 - np.median(d2)))) / math.sqrt(6), signal


def equation_error_guess(segs, spec: Spec):
    """Linear (equation-error) estimate of the model values, up to scale: the smallest right
    singular vector of the stacked Euler equations ``I w' + w x I w + D w = 0`` with ``w'``
    from central differences of the measured rates. A start for the nonlinear fit that
    needs no search. Returns ``theta`` scaled to ``trace(I) = 2`` (possibly non-physical: the
    chart projects it), or ``None``."""
    rows = []
    for s in segs:
        if s.n < 3:
            continue
        w = s.omega[1:-1]
        wd = (s.omega[2:] - s.omega[:-2]) / (s.t[2:] - s.t[:-2])[:, None]
        basis = [np.diag(e) for e in np.eye(3)]
        if spec.tensor:
            for i, j in ((0, 1), (0, 2), (1, 2)):
                E = np.zeros((3, 3))
                E[i, j] = E[j, i] = 1
                basis.append(E)
        cols = [wd @ E.T + np.cross(w, w @ E.T) for E in basis]
        if spec.drag == "isotropic":
            cols.append(w)
        elif spec.drag == "diagonal":
            for k in range(3):
                c = np.zeros_like(w)
                c[:, k] = w[:, k]
                cols.append(c)
        rows.append(np.stack(cols, -1).reshape(-1, len(cols)))
    if not rows:
        return None
    A = np.concatenate(rows)
    colscale = np.linalg.norm(A, axis=0) + 1e-300
    _, _, Vt = np.linalg.svd(A / colscale, full_matrices=False)
    v = Vt[-1] / colscale
    tr = v[0] + v[1] + v[2]
    if not np.isfinite(tr) or abs(tr) < 1e-300:
        return None
    v = 2 * v / tr
    if spec.n_drag:
        v[spec.n_icomp :] = np.maximum(v[spec.n_icomp :], 0.0)
    return v


# ----------------------------------------------------------------------------- reference check


def reference_rates(inertia, w0, ts, damping) -> list:
    """Body rates of windows by SciPy's DOP853 (rtol 1e-10, :func:`rigidjax.reference.euler_omega`):
    all windows in one call, and where that fails each alone, so that one window the
    integrator cannot follow (a singular inertia) costs only its own reference: a list of
    ``(n_b, 3)`` arrays, ``None`` where the integration failed."""
    fails = (RuntimeError, np.linalg.LinAlgError, ValueError)
    try:
        return list(euler_omega(inertia, w0, ts, damping=damping, rtol=1e-10))
    except fails:
        out = []
        for b in range(len(ts)):
            try:
                out.append(euler_omega(inertia[b], w0[b], ts[b], damping=damping[b], rtol=1e-10))
            except fails:
                out.append(None)
        return out


def reference_rms(segs, theta: np.ndarray, w0: np.ndarray, bias: np.ndarray, spec: Spec) -> np.ndarray:
    """Residual RMS (rad/s) of each window with its fitted parameters simulated by a tight
    independent integrator (:func:`reference_rates`) instead of the midpoint step: what the
    fit's residual would be without step error. ``nan`` where the integration fails."""
    ws = reference_rates(theta_tensor(theta, spec), w0, [s.t for s in segs], theta_drag(theta, spec))
    return np.array(
        [np.nan if w is None else float(np.sqrt(np.mean((w + b - s.omega) ** 2))) for w, b, s in zip(ws, bias, segs)]
    )
