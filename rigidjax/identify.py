r"""Identify inertia (and angular air drag, gyroscope bias) from measured body angular velocity.

Model (body = sensor frame): the torque-free Euler equations with an angular resistance,

.. math::  I\dot\omega = -\omega\times I\omega - D\,\omega, \qquad
           \omega_\text{measured}(t_i) = \omega(t_i) + b + \text{noise},

simulated with :func:`rigidjax.rollout` of any stepper (default :func:`rigidjax.midpoint_step`,
the seed's linearly implicit midpoint step) over the MEASURED sample intervals ``diff(t)`` (optionally ``substeps`` equal sub-steps each),
and compared at the measured timestamps. Least squares in the body angular velocity (rad/s).

Unknowns: the inertia tensor in sensor axes, either principal moments along the sensor axes
(``tensor=False``) or a full tensor whose principal axes may be rotated from the sensor axes
(``tensor=True``); the initial angular velocity of each segment; optionally the angular
resistance ``D`` (``drag="isotropic"``: ``c I_3``; ``"diagonal"``: ``diag(c_x, c_y, c_z)``, in
sensor axes, N m s) and a constant gyroscope bias ``b`` (rad/s).

Physical validity by construction: principal moments come from second moments
``L_i = s_i^2 >= 0`` as ``I_1 = L_2 + L_3, I_2 = L_1 + L_3, I_3 = L_1 + L_2`` (positive
definite, triangle inequalities; ``L_k = 0`` is the planar-lamina equality ``I_k = I_i + I_j``,
e.g. a thin disk), rotated by ``exp(phi)`` for the full tensor; drag ``c = d^2 >= 0``.

Scale: torque-free motion (and ``D`` scaled with ``I``) fixes inertia only up to a factor, so
the optimiser holds ``trace(I) = 2`` (a gauge residual ``|s|^2 - 1``) and the results are
REPORTED relative to ``I_yy`` (sensor y): ``Ix/Iy = I_xx/I_yy``, ``Iz/Iy``, ``drag/Iy`` (1/s).
A known scale (``scale={"Iy": 1.39e-3}`` or ``{"trace": ...}``) turns them into kg m^2 and
N m s.

Optimiser: Levenberg-Marquardt (Nielsen's damping update, Marquardt diagonal scaling,
MINPACK-style termination), written here because the joint problem is block-sparse: each
segment's residual depends only on the shared parameters, its recording's bias and its own
initial state. One jitted, vmapped evaluator gives per segment ``J^T J``, ``J^T r`` and the RSS
in "model coordinates" (inertia components, drag, omega0, bias: at most 15 forward-mode
tangents through the rollout); the optimiser's coordinates enter by the chain rule and the
blocks are scattered into dense normal equations (NumPy, a few hundred unknowns at most).
A dense solver (optimistix' LM materialising ``J``) would push ``3 S + 5`` tangents through
every segment instead, and compile once per layout; here one compilation serves latent and
reported coordinates, joint and per-segment fits and every start. Start 0 is the linear
equation-error estimate (stacked Euler equations with differentiated rates, SVD), the others
the simplest model's estimate and random inertias; every start gets ``phase1_steps``
iterations, the best continues to convergence. Per segment, outliers are then refitted from
the consensus and by a drag-free continuation, and a residual-based quality rule marks what
is still implausible ``"poor_fit"`` (see :func:`fit_inertia`). Standard errors come from the Gauss-Newton
Hessian ``J^T J`` evaluated in the REPORTED (physical, unconstrained) coordinates,
``cov = s^2 (J^T J)^{-1}`` with ``s^2 = RSS / (m - p)``, and the delta method for derived
quantities; they stay finite when an estimate lies on the boundary (thin disk, zero drag).
They do not include the simulation's own step error, a systematic model error: after the
fit it is estimated (Richardson, ``substeps`` against ``2 substeps``) and converted into the
shift it causes in every estimate, in standard errors (:attr:`InertiaFit.step_error`; a
warning above 1). On noise-level data sampled at 100 Hz one sub-step is not enough.
They assume white residuals: on real data, where the residual is model error rather than
noise, the spread over segments is the honest uncertainty.

Data: the racquet recordings of ``../shared/data/racquet-flips`` (phyphox, see
:mod:`rigidjax.io`); the intermediate-axis ("tennis racquet") theorem is what makes a free
flip informative on both ratios.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy.spatial.transform import Rotation

from . import so3
from .body import RigidBody, RigidBodyState
from .io import DataError, Segment, load
from .midpoint import midpoint_step
from .rollout import rollout

__all__ = [
    "InertiaFit", "FitError", "fit_inertia", "simulate_omega", "parse_scale", "STATUS",
    "POOR_FIT", "UNIDENTIFIABLE",
]

#: Solver outcome per problem (segment or joint fit). Per segment, the quality rule of
#: :func:`fit_inertia` may replace "converged" by :data:`POOR_FIT`.
STATUS = {0: "converged", 1: "max_steps", 2: "nonfinite", 3: "stalled"}
_DRAG = (None, "isotropic", "diagonal")
_MIN_SAMPLES = 3  # the equation-error start differentiates the rates (central differences)
#: Status of a fit whose normal equations are singular at the optimum: the data do not
#: determine the ratios (e.g. a steady spin about one principal axis); errors are infinite.
UNIDENTIFIABLE = "converged (ratios not identifiable)"
_SCALE_KEYS = ("Ix", "Iy", "Iz", "trace")


class FitError(ValueError):
    """Bad input to :func:`fit_inertia` (the message names the argument or segment)."""


# ----------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class _Spec:
    tensor: bool
    drag: str | None
    bias: bool
    substeps: int
    stepper: Callable

    @property
    def n_drag(self) -> int:
        return {None: 0, "isotropic": 1, "diagonal": 3}[self.drag]

    @property
    def n_bias(self) -> int:
        return 3 if self.bias else 0

    @property
    def n_inertia(self) -> int:
        """Reported inertia coordinates (relative to I_yy)."""
        return 5 if self.tensor else 2

    @property
    def inertia_names(self) -> tuple[str, ...]:
        return ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "Ixz/Iy", "Iyz/Iy") if self.tensor else ("Ix/Iy", "Iz/Iy")

    @property
    def drag_names(self) -> tuple[str, ...]:
        return {None: (), "isotropic": ("drag/Iy",), "diagonal": ("drag_x/Iy", "drag_y/Iy", "drag_z/Iy")}[self.drag]


def _drag_vector(c, spec: _Spec, dtype):
    if spec.drag is None:
        return jnp.zeros(3, dtype)
    return jnp.broadcast_to(c, (3,)) if spec.drag == "isotropic" else c


def _latent_model(sh, spec: _Spec):
    """Latent shared parameters -> (inertia (3,3), drag (3,)) in the trace(I)=2 gauge."""
    L = sh["s"] ** 2
    moments = jnp.stack([L[1] + L[2], L[0] + L[2], L[0] + L[1]])
    if spec.tensor:
        R = so3.to_matrix(so3.exp(sh["phi"]))
        inertia = (R * moments) @ R.T
    else:
        inertia = jnp.diag(moments)
    drag = _drag_vector(sh["d"] ** 2, spec, L.dtype) if spec.drag else jnp.zeros(3, L.dtype)
    return inertia, drag


def _phys_model(sh, spec: _Spec):
    """Reported shared parameters (relative to I_yy) -> (inertia, drag) in the I_yy = 1 gauge."""
    th = sh["inertia"]
    one = jnp.ones((), th.dtype)
    if spec.tensor:
        inertia = jnp.stack(
            [jnp.stack([th[0], th[2], th[3]]), jnp.stack([th[2], one, th[4]]), jnp.stack([th[3], th[4], th[1]])]
        )
    else:
        inertia = jnp.diag(jnp.stack([th[0], one, th[1]]))
    drag = _drag_vector(sh["d"], spec, th.dtype) if spec.drag else jnp.zeros(3, th.dtype)
    return inertia, drag


def _latent_to_phys(sh, spec: _Spec):
    inertia, drag = _latent_model(sh, spec)
    iyy = inertia[1, 1]
    if spec.tensor:
        th = jnp.stack([inertia[0, 0], inertia[2, 2], inertia[0, 1], inertia[0, 2], inertia[1, 2]]) / iyy
    else:
        th = jnp.stack([inertia[0, 0], inertia[2, 2]]) / iyy
    out = {"inertia": th}
    if spec.drag:
        out["d"] = sh["d"] ** 2 / iyy
    return out


def simulate_omega(inertia, omega0, t, *, drag=None, bias=None, stepper: Callable | None = None, substeps: int = 1):
    """Body angular velocity of the torque-free body with angular resistance at the times ``t``.

    The model :func:`fit_inertia` fits (pure JAX, jit/vmap/grad-able, follows the input dtype).

    Args:
        inertia: ``(3,)`` principal moments along the body axes or ``(3, 3)`` tensor, body
            frame, kg m^2 (or any common scale, with ``drag`` in the same scale).
        omega0: ``(3,)`` body angular velocity at ``t[0]``, rad/s.
        t: ``(n,)`` strictly increasing sample times, s (the rollout steps ``diff(t)``).
        drag: ``None``, a scalar (``c I_3``) or ``(3,)`` diagonal angular resistance, N m s.
        bias: ``(3,)`` added to the output (gyroscope bias), rad/s.
        stepper: any rigidjax stepper ``step(body, state, wrench, dt)``; default
            :func:`rigidjax.midpoint_step`.
        substeps: equal sub-steps per sample interval.

    Returns:
        ``(omega (n, 3), ok)``: rad/s in the body frame, and ``ok`` (bool) that every step
        advanced (see :class:`rigidjax.StepInfo`).
    """
    omega0 = jnp.asarray(omega0)
    dtype = jnp.result_type(omega0, float)
    inertia = jnp.asarray(inertia, dtype)
    if inertia.shape == (3,):
        inertia = jnp.diag(inertia)
    d = jnp.zeros(3, dtype) if drag is None else jnp.broadcast_to(jnp.asarray(drag, dtype), (3,))
    t = jnp.asarray(t, dtype)
    dt = jnp.repeat(jnp.diff(t) / substeps, substeps)
    w, ok = _simulate(inertia, d, omega0.astype(dtype), dt, stepper or midpoint_step, substeps)
    if bias is not None:
        w = w + jnp.asarray(bias, dtype)
    return w, ok


def _simulate(inertia, drag, omega0, dt_sub, stepper, substeps):
    dtype = omega0.dtype
    resistance = jnp.zeros((6, 6), dtype).at[3:, 3:].set(jnp.diag(drag))
    body = RigidBody(jnp.ones((), dtype), inertia, resistance=resistance)
    state0 = RigidBodyState(angular_velocity=omega0, time=jnp.zeros((), dtype))
    traj = rollout(stepper, body, state0, dt_sub)
    w = traj.states.angular_velocity[::substeps]
    ok = jnp.all(traj.info.converged) & jnp.all(jnp.isfinite(w))
    return w, ok


# ----------------------------------------------------------------------------- problem
#
# Per-segment "model coordinates" m = [inertia components | drag (3) | omega0 (3) | bias (3)]
# (inertia components: the 3 diagonal entries, or xx, yy, zz, xy, xz, yz for a tensor).
# One compiled evaluator gives, per segment, J^T J, J^T r and the RSS in m (forward-mode
# autodiff through the rollout); the optimiser's coordinates enter by the chain rule through
# cheap maps, so the latent (optimised) and reported (covariance) parametrisations, and every
# joint / per-segment / multi-start layout, share that one compilation.


def _n_icomp(spec: _Spec) -> int:
    return 6 if spec.tensor else 3


def _icomp_to_tensor(c, tensor: bool):
    if not tensor:
        return jnp.diag(c)
    xx, yy, zz, xy, xz, yz = c
    return jnp.stack([jnp.stack([xx, xy, xz]), jnp.stack([xy, yy, yz]), jnp.stack([xz, yz, zz])])


def _tensor_to_icomp(inertia, tensor: bool):
    if not tensor:
        return jnp.diagonal(inertia)
    return jnp.stack([inertia[0, 0], inertia[1, 1], inertia[2, 2], inertia[0, 1], inertia[0, 2], inertia[1, 2]])


@functools.lru_cache(maxsize=16)
def _evaluator(tensor: bool, has_drag: bool, has_bias: bool, substeps: int, stepper: Callable):
    """Jitted ``(m (Q, nm), omega (Q, N, 3), weight (Q, N), dt (Q, (N-1) k)) -> (A, g, rss, ok)``."""
    nI = 6 if tensor else 3

    def residual(m, omega, weight, dt):
        inertia = _icomp_to_tensor(m[:nI], tensor)
        o = nI
        drag = m[o : o + 3] if has_drag else jnp.zeros(3, m.dtype)
        o += 3 * has_drag
        w0 = m[o : o + 3]
        bias = m[o + 3 : o + 6] if has_bias else 0.0
        w, ok = _simulate(inertia, drag, w0, dt, stepper, substeps)
        r = ((w + bias - omega) * weight[:, None]).reshape(-1)
        return r, (r, ok)

    def one(m, omega, weight, dt):
        J, (r, ok) = jax.jacfwd(residual, has_aux=True)(m, omega, weight, dt)
        rss = r @ r
        return J.T @ J, J.T @ r, rss, ok & jnp.isfinite(rss) & jnp.all(jnp.isfinite(J))

    return jax.jit(jax.vmap(one))


def _unflat_latent(x, spec: _Spec) -> dict:
    """Flat latent shared vector ``[s (3) | phi (3, tensor) | d (drag)]`` -> dict."""
    out = {"s": x[:3]}
    i = 3
    if spec.tensor:
        out["phi"] = x[3:6]
        i = 6
    if spec.drag:
        out["d"] = x[i : i + spec.n_drag]
    return out


def _unflat_phys(x, spec: _Spec) -> dict:
    """Flat reported shared vector ``[inertia / I_yy (2 or 5) | drag / I_yy]`` -> dict."""
    ni = spec.n_inertia
    out = {"inertia": x[:ni]}
    if spec.drag:
        out["d"] = x[ni : ni + spec.n_drag]
    return out


@functools.lru_cache(maxsize=32)
def _shared_maps(spec: _Spec):
    """Jitted, batched maps of the shared parameters: latent/reported -> model values + Jacobian."""

    def model_vals(to_model, unflat):
        def f(x):
            inertia, drag = to_model(unflat(x, spec), spec)
            parts = [_tensor_to_icomp(inertia, spec.tensor)]
            if spec.drag:
                parts.append(drag)
            return jnp.concatenate(parts)

        def both(x):
            return f(x), jax.jacfwd(f)(x)

        return jax.jit(jax.vmap(both))

    def lat_to_phys(x):
        ph = _latent_to_phys(_unflat_latent(x, spec), spec)
        return jnp.concatenate([ph["inertia"], ph.get("d", x[:0])])

    return {
        "latent": model_vals(_latent_model, _unflat_latent),
        "phys": model_vals(_phys_model, _unflat_phys),
        "lat_to_phys": jax.jit(jax.vmap(lat_to_phys)),
    }


class _Problems:
    """A batch of least-squares problems with one layout: ``x = [shared | bias per group |
    omega0 per segment]``; problem ``a`` fits the segments ``seg_ids[a]`` (indices into the
    padded data)."""

    def __init__(self, spec: _Spec, data, seg_ids, groups, *, latent: bool, chunk: int):
        self.spec = spec
        self.data = data  # numpy (omega (Ns, N, 3), weight (Ns, N), dt (Ns, (N-1) k))
        self.seg_ids = np.asarray(seg_ids)  # (nb, S_p)
        self.S = self.seg_ids.shape[1]
        self.groups = np.asarray(groups)  # (S_p,)
        self.G = int(self.groups.max()) + 1
        self.latent = latent
        self.chunk = chunk
        self.n_sh = (3 + 3 * spec.tensor + spec.n_drag) if latent else (spec.n_inertia + spec.n_drag)
        self.n_b = spec.n_bias
        self.P = self.n_sh + self.G * self.n_b + 3 * self.S
        self.nID = _n_icomp(spec) + 3 * (spec.drag is not None)
        self.n_loc = self.n_sh + self.n_b + 3
        idx = []
        for s, g in enumerate(self.groups):
            idx.append(
                list(range(self.n_sh))
                + list(range(self.n_sh + g * self.n_b, self.n_sh + (g + 1) * self.n_b))
                + list(range(self.n_sh + self.G * self.n_b + 3 * s, self.n_sh + self.G * self.n_b + 3 * s + 3))
            )
        self.idx = np.asarray(idx, dtype=np.intp)  # (S_p, n_loc)
        self.map = _shared_maps(spec)["latent" if latent else "phys"]
        self.ev = _evaluator(spec.tensor, spec.drag is not None, spec.bias, spec.substeps, spec.stepper)
        self.dtype = data[0].dtype

    def evaluate(self, x, rows):
        """x (na, P) for problems ``rows`` (na,) -> cost (na,), A (na,P,P), g (na,P), ok (na,), rss (na,S)."""
        na = x.shape[0]
        sh = x[:, : self.n_sh]
        bucket = max(64, 1 << (na - 1).bit_length())  # few batch sizes: few compilations
        sh_pad = np.concatenate([sh, np.repeat(sh[-1:], bucket - na, 0)])
        vals, Tsh = (np.asarray(v, float)[:na] for v in self.map(jnp.asarray(sh_pad, self.dtype)))
        loc = x[:, self.idx]  # (na, S, n_loc)
        w0 = loc[:, :, self.n_sh + self.n_b :]
        m_parts = [np.broadcast_to(vals[:, None, :], (na, self.S, self.nID)), w0]
        if self.n_b:
            m_parts.append(loc[:, :, self.n_sh : self.n_sh + self.n_b])
        m = np.concatenate(m_parts, -1).reshape(na * self.S, -1)
        segs = self.seg_ids[rows].reshape(-1)
        nq = m.shape[0]
        Q = self.chunk
        outs = []
        for c0 in range(0, nq, Q):
            sl = np.arange(c0, min(c0 + Q, nq))
            sl = np.concatenate([sl, np.full(Q - sl.size, sl[-1])])  # fixed shape: one compilation
            si = segs[sl]
            o = self.ev(
                jnp.asarray(m[sl], self.dtype), self.data[0][si], self.data[1][si], self.data[2][si]
            )
            outs.append([np.asarray(v) for v in o])
        A_m, g_m, rss, ok = (np.concatenate([o[k] for o in outs])[:nq] for k in range(4))
        nm = A_m.shape[-1]
        A_m = A_m.reshape(na, self.S, nm, nm).astype(float)
        g_m = g_m.reshape(na, self.S, nm).astype(float)
        rss = rss.reshape(na, self.S).astype(float)
        ok = ok.reshape(na, self.S).all(1)
        # chain rule: m = [vals(shared) | omega0 | bias] as a function of the local vector
        T = np.zeros((na, nm, self.n_loc))
        T[:, : self.nID, : self.n_sh] = Tsh
        T[:, self.nID : self.nID + 3, self.n_sh + self.n_b :] = np.eye(3)
        if self.n_b:
            T[:, self.nID + 3 :, self.n_sh : self.n_sh + self.n_b] = np.eye(3)
        A_loc = np.einsum("aji,asjk,akl->asil", T, A_m, T)
        g_loc = np.einsum("aji,asj->asi", T, g_m)
        A = np.zeros((na, self.P, self.P))
        g = np.zeros((na, self.P))
        for s in range(self.S):
            ix = self.idx[s]
            A[:, ix[:, None], ix[None, :]] += A_loc[:, s]
            g[:, ix] += g_loc[:, s]
        cost = 0.5 * rss.sum(1)
        if self.latent:  # gauge residual |s|^2 - 1 fixes trace(I) = 2 (the model is scale-free)
            s_ = x[:, :3]
            rg = np.sum(s_ * s_, 1) - 1
            Jg = 2 * s_
            A[:, :3, :3] += Jg[:, :, None] * Jg[:, None, :]
            g[:, :3] += Jg * rg[:, None]
            cost = cost + 0.5 * rg * rg
        ok = ok & np.isfinite(cost) & np.all(np.isfinite(A), axis=(1, 2))
        return cost, A, g, ok, rss


def _solve_batch(M, rhs):
    try:
        return np.linalg.solve(M, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        out = np.empty_like(rhs)
        for i in range(M.shape[0]):
            out[i] = np.linalg.lstsq(M[i], rhs[i], rcond=None)[0]
        return out


def _lm(prob: _Problems, x0, rows, max_steps: int, state=None, progress=None):
    """Levenberg-Marquardt (Nielsen's damping update, Marquardt scaling) on a batch of problems.

    Termination per problem (MINPACK-style, tolerances from the dtype): relative actual and
    predicted cost decrease below ``ftol``, relative step below ``xtol``, or the largest cosine
    between the residual and a Jacobian column below ``gtol``. Status codes: :data:`STATUS`.
    """
    eps = float(np.finfo(prob.dtype).eps)
    # sqrt(eps) in float64 (1.5e-8); in float32 sqrt(eps) = 3e-4 would stop after one step
    # at a 10x worse fit, while 10 eps (1.2e-6) still lies above the evaluation's round-off
    ftol = xtol = math.sqrt(eps) if eps < 1e-10 else 10 * eps
    gtol = 10 * ftol
    nb = x0.shape[0]
    if state is None:
        cost, A, g, ok, rss = prob.evaluate(x0, rows)
        state = dict(
            x=x0.copy(), cost=cost, A=A, g=g, rss=rss, ok=ok,
            lam=1e-3 * np.max(np.diagonal(A, axis1=1, axis2=2), axis=1),
            nu=np.full(nb, 2.0), it=np.zeros(nb, int), status=np.where(ok, 1, 2),
        )
    st = state
    active = st["ok"] & (st["status"] != 0)
    steps = np.zeros(nb, int)

    def cosine(cost, A, g):
        d = np.maximum(np.diagonal(A, axis1=1, axis2=2), 1e-300)
        return np.max(np.abs(g) / np.sqrt(d * 2 * np.maximum(cost, 1e-300)[:, None]), axis=1)

    while active.any():
        a = np.flatnonzero(active)
        x, cost, A, g, lam, nu = (st[k][a] for k in ("x", "cost", "A", "g", "lam", "nu"))
        dA = np.diagonal(A, axis1=1, axis2=2)
        scale = np.maximum(dA, 1e-12 * dA.max(1, keepdims=True))
        M = A + lam[:, None, None] * (scale[:, :, None] * np.eye(A.shape[1]))
        h = -_solve_batch(M, g)
        finite_h = np.all(np.isfinite(h), 1)
        h = np.where(finite_h[:, None], h, 0)
        x_new = x + h
        cost_n, A_n, g_n, ok_n, rss_n = prob.evaluate(x_new, rows[a])
        pred = 0.5 * (np.einsum("ai,ai->a", h, lam[:, None] * scale * h) - np.einsum("ai,ai->a", h, g))
        actual = cost - cost_n
        accept = ok_n & finite_h & (actual > 0) & (pred > 0)
        rho = actual / np.where(pred > 0, pred, 1)
        lam = np.where(accept, lam * np.maximum(1 / 3, 1 - (2 * rho - 1) ** 3), lam * nu)
        nu = np.where(accept, 2.0, 2 * nu)
        for k, new in (("x", x_new), ("cost", cost_n), ("A", A_n), ("g", g_n), ("rss", rss_n)):
            old = st[k][a]
            mask = accept.reshape((-1,) + (1,) * (old.ndim - 1))
            st[k][a] = np.where(mask, new, old)
        st["lam"][a], st["nu"][a] = lam, nu
        st["it"][a] += 1
        steps[a] += 1
        cost_c = st["cost"][a]
        small_f = accept & (actual <= ftol * cost_c) & (pred <= ftol * cost_c)
        small_x = accept & (np.linalg.norm(h, axis=1) <= xtol * (np.linalg.norm(st["x"][a], axis=1) + xtol))
        cos = cosine(cost_c, st["A"][a], st["g"][a])
        converged = small_f | small_x | (cos <= gtol)
        stalled = (lam > 1e16) | ~np.isfinite(lam)
        status = np.where(converged, 0, np.where(stalled, np.where(cos <= 1e-4, 0, 3), 1))
        st["status"][a] = status
        done = converged | stalled | (steps[a] >= max_steps)
        active[a] = ~done
        if progress is not None:
            progress(int(active.sum()))
    return st


def _noise_and_signal(seg: Segment) -> tuple[float, float]:
    """(noise, signal) RMS of one segment's measured rates, rad/s. Noise: robust (1.4826 MAD)
    scale of the second differences ``w[i+1] - 2 w[i] + w[i-1]`` over ``sqrt(6)`` (white noise of
    variance s^2 gives differences of variance 6 s^2; the smooth flip contributes ~|w''| dt^2,
    so on real data this is an upper bound of the noise). Signal: RMS of the rates about their
    mean (the variation a fitted model has to explain)."""
    w = seg.omega
    if seg.n < 3:
        return 0.0, float(np.sqrt(np.mean((w - w.mean(0)) ** 2)))
    d2 = (w[2:] - 2 * w[1:-1] + w[:-2]).reshape(-1)
    noise = 1.4826 * float(np.median(np.abs(d2 - np.median(d2)))) / math.sqrt(6)
    return noise, float(np.sqrt(np.mean((w - w.mean(0)) ** 2)))


#: Per-segment quality rule (see :func:`fit_inertia`): a residual RMS above ``_POOR_MEDIAN``
#: times the median over the fit's segments, or above ``_POOR_SIGNAL`` times the segment's own
#: signal RMS, and above ``_POOR_NOISE`` times its noise estimate, is a poor fit.
_POOR_MEDIAN, _POOR_SIGNAL, _POOR_NOISE = 5.0, 0.25, 10.0
#: Refit trigger (looser than the rule, so the refit sees every candidate): 3x median, 10 % signal.
_SUSPECT_MEDIAN, _SUSPECT_SIGNAL = 3.0, 0.10
POOR_FIT = "poor_fit"
_RESCUE_RANDOM = 4


def _segment_rms(st, segs) -> np.ndarray:
    return np.sqrt(st["rss"][:, 0] / np.array([3.0 * s.n for s in segs]))


def _rescue(spec: _Spec, data, segs, st, n_lat: int, phase1_steps: int, max_steps: int, chunk: int, seed: int, tick):
    """Per-segment mode: refit the segments whose residual is far above the consensus, IN PLACE
    of ``st`` where a refit ends at a lower cost.

    A segment is a suspect when its residual RMS exceeds ``_SUSPECT_MEDIAN`` x the median over
    segments or ``_SUSPECT_SIGNAL`` x its own signal RMS (a torque-free model that leaves that
    much of a one-second flip unexplained sits in a wrong basin: on the racquet flips the good
    fits leave 1-5 %). Its new starts, all run batched through the same compiled evaluator:

    * consensus: the shared parameters of the good segment nearest the median (a medoid, so a
      physical point), over all segments and over those of the suspect's recording (the same
      body), omega0 from the first sample and from the suspect's own fit;
    * continuation (with drag): the simplest model's equation-error inertia with the drag held
      at exactly zero (``d = 0`` is a stationary point of ``c = d^2``: the LM then solves the
      drag-free problem), then the drag switched on at the consensus value and refitted;
    * ``_RESCUE_RANDOM`` random inertias from another seed (a body unlike the others).

    Every start runs to convergence (up to ``max_steps``); per segment the lowest cost among
    the converged ones is kept if it is below the first pass's.
    """
    n = len(segs)
    rms = _segment_rms(st, segs)
    signal = np.array([_noise_and_signal(s)[1] for s in segs])
    fine = st["ok"] & np.isfinite(rms)
    if not fine.any():
        return
    med = float(np.median(rms[fine]))
    suspect = ~fine | (rms > _SUSPECT_MEDIAN * med) | (rms > _SUSPECT_SIGNAL * signal)
    if not suspect.any():
        return
    bad = np.flatnonzero(suspect)
    good = np.flatnonzero(~suspect)
    x = st["x"]
    P = x.shape[1]
    lat = np.abs(x[:, :3])  # L = s^2: the sign of s is irrelevant
    starts = []  # (segment, x0, continuation?)
    def medoid(members):
        z = np.concatenate([lat[members], x[members, 3:n_lat]], 1)
        c = x[members[np.argmin(np.abs(z - np.median(z, 0)).sum(1))], :n_lat].copy()
        c[:3] = np.abs(c[:3])
        return c

    cons = medoid(good) if good.size else None
    simple = _Spec(False, None, False, spec.substeps, spec.stepper)
    for i in bad:
        w_first = segs[i].omega[0]
        # fresh random inertias (another seed): a body unlike the consensus (a different
        # object, a spin about another axis) needs a wider search, not the others' answer
        for x0 in _initial(spec, n_lat, segs[i : i + 1], 2 + _RESCUE_RANDOM, seed + 1, spec.n_bias, 1)[2:]:
            starts.append((i, x0, False))
        # consensus of all good segments, and of the good ones of the same recording (one body)
        same = np.array([j for j in good if segs[j].source == segs[i].source], dtype=int)
        for c in ([cons] if cons is not None else []) + ([medoid(same)] if same.size else []):
            for w0 in (w_first, x[i, n_lat:] if P - n_lat == 3 else w_first):
                x0 = np.zeros(P)
                x0[:n_lat] = c
                x0[n_lat:] = w0
                starts.append((i, x0, False))
        if spec.drag:
            g = _equation_error_guess(segs[i : i + 1], simple)
            x0 = np.zeros(P)
            x0[:3] = _moments_to_s(g[0]) if g is not None else np.full(3, 1 / np.sqrt(3))
            x0[n_lat:] = w_first  # phi = 0 (tensor), d = 0: the drag-free problem
            starts.append((i, x0, True))
    if not starts:
        return
    seg_of = np.array([a for a, _, _ in starts])
    x0 = np.stack([b for _, b, _ in starts])
    cont = np.array([c for _, _, c in starts])
    prob = _Problems(spec, data, seg_of[:, None], [0], latent=True, chunk=chunk)
    rows = np.arange(len(starts))
    if cont.any():  # drag-free fit to convergence, then drag on (the continuation)
        r = _lm(prob, x0[cont], rows[cont], max_steps, progress=tick)
        xc = r["x"].copy()
        d_on = cons[n_lat - spec.n_drag : n_lat] if cons is not None else np.full(spec.n_drag, 0.03)
        xc[:, n_lat - spec.n_drag : n_lat] = np.maximum(np.abs(d_on), 1e-3)
        x0[cont] = xc
    # every start to convergence (a few suspects: cheap), so a start that is slow at first is
    # not dropped after phase 1; the lowest final cost wins, converged before not converged
    r = _lm(prob, x0, rows, max_steps, progress=tick)
    cost = np.where(r["ok"], r["cost"], np.inf) * np.where(r["status"] == 0, 1.0, 1e3)
    pick = np.array([k[np.argmin(cost[k])] for k in (np.flatnonzero(seg_of == i) for i in bad)])
    r = {k: v[pick] for k, v in r.items()}
    better = r["ok"] & (~st["ok"][bad] | (r["cost"] < st["cost"][bad])) & ((r["status"] == 0) | (st["status"][bad] != 0))
    for key in st:
        if key == "it":
            st[key][bad] = np.where(better, st[key][bad] + r[key], st[key][bad])
        else:
            mask = better.reshape((-1,) + (1,) * (st[key].ndim - 1))
            st[key][bad] = np.where(mask, r[key], st[key][bad])


def _equation_error_guess(segs: list[Segment], spec: _Spec):
    """Linear (equation-error) estimate of inertia and drag, up to scale: the smallest right
    singular vector of the stacked Euler equations ``I w' + w x I w + D w = 0`` with ``w'`` from
    central differences of the measured rates. A robust starting point for the nonlinear fit
    (it avoids the wrong basins a multi-start alone can miss). Returns (moments (3,), R (3,3),
    drag (n_drag,)) with trace(I) = 2."""
    rows = []
    for s in segs:
        if s.n < 3:
            continue
        w = s.omega[1:-1]
        wd = (s.omega[2:] - s.omega[:-2]) / (s.t[2:] - s.t[:-2])[:, None]
        cols = []
        # unknowns: inertia components (diag: xx, yy, zz; tensor: + xy, xz, yz), then drag
        basis = [np.diag(e) for e in np.eye(3)]
        if spec.tensor:
            for i, j in ((0, 1), (0, 2), (1, 2)):
                E = np.zeros((3, 3))
                E[i, j] = E[j, i] = 1
                basis.append(E)
        for E in basis:
            cols.append(wd @ E.T + np.cross(w, w @ E.T))
        if spec.drag == "isotropic":
            cols.append(w)
        elif spec.drag == "diagonal":
            for k in range(3):
                c = np.zeros_like(w)
                c[:, k] = w[:, k]
                cols.append(c)
        rows.append(np.stack(cols, -1).reshape(-1, len(cols)))
    A = np.concatenate(rows)
    colscale = np.linalg.norm(A, axis=0) + 1e-300
    _, _, Vt = np.linalg.svd(A / colscale, full_matrices=False)
    v = Vt[-1] / colscale
    nI = 6 if spec.tensor else 3
    J = np.diag(v[:3])
    if spec.tensor:
        J[0, 1] = J[1, 0] = v[3]
        J[0, 2] = J[2, 0] = v[4]
        J[1, 2] = J[2, 1] = v[5]
    if np.trace(J) < 0:
        J, v = -J, -v
    tr = np.trace(J)
    if not np.isfinite(tr) or tr <= 0:
        return None
    J, d = 2 * J / tr, 2 * v[nI:] / tr
    moments, R = np.linalg.eigh(J) if spec.tensor else (np.diag(J), np.eye(3))
    if np.linalg.det(R) < 0:
        R[:, 0] = -R[:, 0]
    return moments, R, np.maximum(d, 0)


def _moments_to_s(moments):
    """Principal moments -> latent s (|s| = 1) via second moments, clipped to physical values."""
    L = np.maximum(0.5 * np.sum(moments) - np.asarray(moments), 1e-3 * np.sum(np.abs(moments)) + 1e-12)
    s = np.sqrt(L)
    return s / np.linalg.norm(s)


def _initial(spec: _Spec, n_sh: int, segs: list[Segment], starts: int, seed: int, n_b: int, G: int) -> np.ndarray:
    """(starts, P) latent starting points. Start 0: the equation-error estimate; start 1: that
    of the simplest model (or a sphere); others random second moments (and axes, for a tensor).
    omega0 starts at the first sample."""
    rng = np.random.default_rng(seed)
    w0s = np.stack([s.omega[0] for s in segs])
    S = w0s.shape[0]
    x0 = np.zeros((starts, n_sh + G * n_b + 3 * S))
    guess = _equation_error_guess(segs, spec)
    # the simplest model's guess (moments along the sensor axes, no drag) is more robust on
    # real data than the richer one: it is the second start when the model is richer
    simple = _Spec(False, None, False, spec.substeps, spec.stepper)
    guess1 = _equation_error_guess(segs, simple) if (spec.tensor or spec.drag) else None
    for k in range(starts):
        s = np.full(3, 1 / np.sqrt(3))
        phi = np.zeros(3)
        d = np.full(spec.n_drag, 0.03)  # c = 1e-3 in the trace(I) = 2 gauge
        if k == 0 and guess is not None:
            moments, R, dg = guess
            s = _moments_to_s(moments)
            phi = Rotation.from_matrix(R).as_rotvec()
            d = np.sqrt(np.maximum(dg, 1e-6))
        elif k == 1 and guess1 is not None:
            s = _moments_to_s(guess1[0])
        elif k > 1 or (k == 0 and guess is None):
            s = np.abs(rng.normal(size=3)) + 0.05
            s /= np.linalg.norm(s)
            phi = rng.normal(size=3) * (0.3 if k % 2 else 1.5)
        parts = [s]
        if spec.tensor:
            parts.append(phi)
        if spec.drag:
            parts.append(d)
        x0[k, :n_sh] = np.concatenate(parts)
        x0[k, n_sh + G * n_b :] = w0s.reshape(-1)
    return x0


# ----------------------------------------------------------------------------- inputs


def parse_scale(scale) -> tuple[str, float] | None:
    """``None``, ``"Iy=1.39e-3"``, ``{"Iy": 1.39e-3}`` or ``("trace", 0.04)`` -> ``(key, value)``.

    Keys: ``Ix``, ``Iy``, ``Iz`` (the diagonal component of the tensor in sensor axes, kg m^2)
    or ``trace``. Raises :class:`FitError` otherwise.
    """
    if scale is None:
        return None
    if isinstance(scale, str):
        if "=" not in scale:
            raise FitError(f"scale: expected KEY=VALUE with KEY in {_SCALE_KEYS}, e.g. 'Iy=1.3911e-3'; got {scale!r}")
        k, v = scale.split("=", 1)
        scale = (k.strip(), v.strip())
    elif isinstance(scale, dict):
        if len(scale) != 1:
            raise FitError(f"scale: give exactly one known value; got {scale!r}")
        scale = next(iter(scale.items()))
    try:
        k, v = scale
        v = float(v)
    except (TypeError, ValueError):
        raise FitError(f"scale: expected KEY=VALUE with a number; got {scale!r}") from None
    if k not in _SCALE_KEYS:
        raise FitError(f"scale: key must be one of {_SCALE_KEYS}; got {k!r}")
    if not (math.isfinite(v) and v > 0):
        raise FitError(f"scale: {k} must be a positive number (kg m^2); got {v}")
    return k, v


def _as_segments(data) -> list[Segment]:
    if isinstance(data, Segment):
        return [data]
    if isinstance(data, (str, bytes)) or hasattr(data, "__fspath__"):
        return load(data)
    if isinstance(data, tuple) and len(data) == 2 and not isinstance(data[0], Segment):
        t, omega = data
        return [Segment(np.asarray(t, float), np.asarray(omega, float), name="segment 0")]
    segs = list(data)
    if not segs:
        raise FitError("segments: no segments to fit (empty list)")
    for i, s in enumerate(segs):
        if not isinstance(s, Segment):
            raise FitError(f"segments[{i}]: expected a rigidjax.io.Segment; got {type(s).__name__}")
    return segs


def _pad(segs: list[Segment], substeps: int, n_pad: int, dtype):
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
        # padded steps: the typical dt (> 0, and no 1/dt overflow in float32 tangents), zero weight
        dt[i, n - 1 :] = np.median(d)
    dt = np.repeat(dt / substeps, substeps, axis=1)
    return (omega.astype(dtype), weight.astype(dtype), dt.astype(dtype))


# ----------------------------------------------------------------------------- results


def _derived(theta, spec: _Spec, scale):
    """Reported shared coordinates (flat) -> dict of named derived quantities (jax)."""
    th = theta[: spec.n_inertia]
    d = theta[spec.n_inertia :]
    out = {}
    for name, v in zip(spec.inertia_names, th):
        out[name] = v
    inertia, _ = _phys_model({"inertia": th, "d": d}, spec)
    if spec.tensor:
        moments = jnp.linalg.eigvalsh(inertia)
        out["Imid/Imin"] = moments[1] / moments[0]
        out["Imax/Imin"] = moments[2] / moments[0]
    for name, v in zip(spec.drag_names, d):
        out[name] = v
    if scale is not None:
        key, value = scale
        c = value / (jnp.trace(inertia) if key == "trace" else inertia["xyz".index(key[1]), "xyz".index(key[1])])
        for name, v in zip(("Ix", "Iy", "Iz"), jnp.diag(inertia)):
            out[name] = c * v
        if spec.tensor:
            out["Ixy"], out["Ixz"], out["Iyz"] = c * inertia[0, 1], c * inertia[0, 2], c * inertia[1, 2]
        for name, v in zip(spec.drag_names, d):
            out[name.replace("/Iy", "")] = c * v
    return out


@functools.lru_cache(maxsize=32)
def _derived_jit(spec: _Spec, scale):
    f = functools.partial(_derived, spec=spec, scale=scale)
    return jax.jit(lambda th: (f(th), jax.jacfwd(f)(th)))


def _misalignment_deg(theta, spec: _Spec) -> float:
    """Largest angle (deg) between a principal axis and its nearest sensor axis."""
    inertia, _ = _phys_model({"inertia": jnp.asarray(theta[: spec.n_inertia]), "d": jnp.zeros(spec.n_drag)}, spec)
    _, V = np.linalg.eigh(np.asarray(inertia))
    cos = np.max(np.abs(V), axis=0)
    return float(np.degrees(np.arccos(np.clip(cos.min(), -1, 1))))


def _name_order(spec: _Spec, scale) -> list[str]:
    names = list(spec.inertia_names)
    if spec.tensor:
        names += ["Imid/Imin", "Imax/Imin"]
    names += list(spec.drag_names)
    if scale is not None:
        names += ["Ix", "Iy", "Iz"] + (["Ixy", "Ixz", "Iyz"] if spec.tensor else [])
        names += [n.replace("/Iy", "") for n in spec.drag_names]
    return names


def _estimates_and_se(x_phys, cov, spec: _Spec, scale, n_sh):
    theta = jnp.asarray(x_phys[:n_sh], jnp.result_type(float))
    vals, Jd = _derived_jit(spec, scale)(theta)
    C = np.asarray(cov[:n_sh, :n_sh])
    est, se = {}, {}
    for k in _name_order(spec, scale):
        est[k] = float(vals[k])
        row = np.asarray(Jd[k])
        with np.errstate(invalid="ignore", over="ignore"):
            var = float(row @ C @ row) if np.all(np.isfinite(C)) else float("inf")
        # a known scale value has zero error; singular normal equations give inf
        se[k] = math.sqrt(var) if var >= 0 and np.isfinite(var) else (float("inf") if var == float("inf") else float("nan"))
    if spec.tensor:
        th = np.asarray(theta, float)
        a0 = _misalignment_deg(th, spec)
        est["misalignment_deg"] = a0
        # delta method with a central-difference gradient (the angle is a max/min over axes:
        # smooth away from ties, where the difference quotient is still a fair local slope)
        grad = np.zeros(n_sh)
        for i in range(spec.n_inertia):
            h = 1e-6 * max(1.0, abs(th[i]))
            tp, tm = th.copy(), th.copy()
            tp[i] += h
            tm[i] -= h
            grad[i] = (_misalignment_deg(tp, spec) - _misalignment_deg(tm, spec)) / (2 * h)
        with np.errstate(invalid="ignore", over="ignore"):
            var = float(grad @ C @ grad) if np.all(np.isfinite(C)) else float("inf")
        se["misalignment_deg"] = math.sqrt(var) if np.isfinite(var) and var >= 0 else float("inf")
    return est, se


def _covariance(A, rss_total, m, p):
    dof = m - p
    s2 = rss_total / dof if dof > 0 else float("nan")
    A = np.asarray(A, dtype=float)
    d = np.sqrt(np.maximum(np.diag(A), 1e-300))
    An = A / d[:, None] / d[None, :]
    try:
        w = np.linalg.eigvalsh(An)
        if not np.all(np.isfinite(w)) or w.min() <= 1e-14 * w.max():
            raise np.linalg.LinAlgError
        inv = np.linalg.inv(An) / d[:, None] / d[None, :]
    except np.linalg.LinAlgError:
        # singular: some combination of parameters is not determined (infinite variance)
        return np.full_like(A, np.inf), s2, True
    return s2 * inv, s2, False


@functools.lru_cache(maxsize=8)
def _predict_jit(stepper, substeps):
    return jax.jit(lambda inertia, drag, w0, dt: _simulate(inertia, drag, w0, dt, stepper, substeps))


#: Warn when the simulation's step error shifts an estimate by more than this many standard errors.
_STEP_SHIFT_WARN = 1.0


@functools.lru_cache(maxsize=8)
def _step_error_jit(tensor: bool, substeps: int, stepper: Callable):
    """Jitted, vmapped over segments: ``(m (S, nm), dt_k (S, (N-1) k), dt_2k (S, (N-1) 2k)) ->
    (w_k (S, N, 3), e (S, N, 3))``, ``m = [inertia components | drag (3) | omega0 (3)]``: the
    rates simulated with ``k`` sub-steps and their Richardson step-error estimate
    ``(w_k - w_2k) / (1 - 2^-2)`` (the midpoint step's rates are second order). One
    compilation for both rollouts."""
    nI = 6 if tensor else 3

    def one(m, dt_k, dt_2k):
        inertia = _icomp_to_tensor(m[:nI], tensor)
        w_k, _ = _simulate(inertia, m[nI : nI + 3], m[nI + 3 : nI + 6], dt_k, stepper, substeps)
        w_2k, _ = _simulate(inertia, m[nI : nI + 3], m[nI + 3 : nI + 6], dt_2k, stepper, 2 * substeps)
        return w_k, (w_k - w_2k) / 0.75

    return jax.jit(jax.vmap(one))


def _step_error(spec: _Spec, segs, data, problems, x_phys, phy: "_Problems", chunk: int):
    """Step error of the fitted model and the shift it causes in the estimates (per problem).

    Richardson estimate ``e`` (rad/s at every sample, :func:`_step_error_jit`). To first order
    the least-squares estimate moves by ``-(J^T J)^{-1} J^T e`` (``e`` acts like a systematic
    error in the data); ``J^T e`` comes from the fit's own evaluator with the data replaced by
    ``w_k + b - e``. Returns per problem ``(g = J^T e (P,), rss_e (S_p,))``.
    """
    k = spec.substeps
    dtype = data[0].dtype
    n_pad = data[0].shape[1]
    dt2 = _pad(segs, 2 * k, n_pad, dtype)[2]
    na = x_phys.shape[0]
    bucket = max(64, 1 << (na - 1).bit_length())  # the shared-map batch sizes the fit compiled
    sh = x_phys[:, : phy.n_sh]
    vals, _ = phy.map(jnp.asarray(np.concatenate([sh, np.repeat(sh[-1:], bucket - na, 0)]), dtype))
    vals = np.asarray(vals, float)[:na]
    if spec.drag is None:
        vals = np.concatenate([vals, np.zeros((na, 3))], 1)
    off_w = phy.n_sh + phy.G * phy.n_b
    m, seg, bias = [], [], []
    for j, (ids, grp) in enumerate(problems):
        for kk, i in enumerate(ids):
            m.append(np.concatenate([vals[j], x_phys[j, off_w + 3 * kk : off_w + 3 * kk + 3]]))
            seg.append(i)
            ob = phy.n_sh + phy.n_b * grp[kk]
            bias.append(x_phys[j, ob : ob + 3] if spec.bias else np.zeros(3))
    n = len(seg)
    nb = max(8, 1 << (n - 1).bit_length())  # few batch sizes: few compilations
    rows = np.concatenate([np.arange(n), np.full(nb - n, n - 1)])
    seg = np.asarray(seg)
    w_k, e = _step_error_jit(spec.tensor, k, spec.stepper)(
        jnp.asarray(np.stack(m)[rows], dtype), jnp.asarray(data[2][seg[rows]]), jnp.asarray(dt2[seg[rows]])
    )
    fake = np.array(data[0], dtype=float)
    fake[seg] = np.asarray(w_k, float)[:n] + np.stack(bias)[:, None, :] - np.asarray(e, float)[:n]
    prob = _Problems(spec, (fake.astype(dtype), data[1], data[2]), phy.seg_ids, phy.groups, latent=False, chunk=chunk)
    _, _, g, _, rss = prob.evaluate(x_phys, np.arange(len(problems)))
    return g, rss


def _shift_in_se(theta, shift, spec: _Spec, scale, se: dict, se_all, bias_idx) -> dict:
    """Shift ``shift`` (reported coordinates, (P,)) of every reported quantity with a finite,
    non-zero standard error, in units of it: shared quantities by the delta method (the
    Jacobian of :func:`_derived`), bias components ``bias_idx`` [(name, index)] directly."""
    _, Jd = _derived_jit(spec, scale)(jnp.asarray(theta, jnp.result_type(float)))
    out = {}
    for k in _name_order(spec, scale):
        e = se.get(k)
        if e is not None and math.isfinite(e) and e > 0:
            out[k] = float(np.asarray(Jd[k], float) @ shift[: len(theta)]) / e
    for name, i in bias_idx:
        e = float(se_all[i])
        if math.isfinite(e) and e > 0:
            out[name] = float(shift[i]) / e
    return out


@dataclasses.dataclass
class InertiaFit:
    """Result of :func:`fit_inertia` (NumPy values; JSON-ready via :meth:`to_dict`).

    Attributes:
        mode: ``"joint"`` (shared inertia/drag) or ``"per-segment"``.
        options: the fit's options (tensor, drag, bias, substeps, starts, stepper, scale).
        estimates: name -> value. Joint: the joint estimate; per-segment: the MEDIAN over the
            converged segments. Names: ``Ix/Iy``, ``Iz/Iy`` (diagonal of the tensor in sensor
            axes over ``I_yy``), ``Ixy/Iy``..., ``Imid/Imin``, ``Imax/Imin``,
            ``misalignment_deg`` (full tensor), ``drag/Iy`` (1/s); with a scale ``Ix, Iy, Iz``
            (kg m^2), ``drag`` (N m s).
        uncertainties: joint, and per-segment with ONE segment: 1-sigma standard errors
            (Gauss-Newton; ``inf`` where the data do not determine a value); per-segment: the
            robust spread over segments (1.4826 MAD).
        segments: one dict per segment: name, comment, source, n, rms (rad/s), status
            (:data:`STATUS` values, or ``"poor_fit"``: an implausible residual at a stationary
            point, see :func:`fit_inertia`), iterations, omega0 (rad/s), and (per-segment mode)
            estimates/se, noise (rad/s, the estimate the quality rule uses), (with bias) bias.
        combined: per-segment mode: name -> {median, spread, p16, p84, n} over converged
            segments (``"poor_fit"`` ones excluded), also per comment (``by_comment``).
        rms: residual RMS over all samples, rad/s.
        status: ``"converged"``, :data:`UNIDENTIFIABLE` (the optimiser converged but the normal
            equations are singular: the ratios are not determined), or the reason it is not
            converged (segments that did not converge, or
            ``"k of n segment(s) poor_fit (local minimum?), excluded from the medians"``).
        truth: the true values where known (synthetic data), else ``None``.
        step_error: the simulation's own step error at the fitted model (see :func:`fit_inertia`):
            ``substeps``, ``rms`` (rad/s over all samples), ``shift_se`` (name -> first-order shift
            of that estimate caused by the step error, in its standard errors; per-segment mode:
            the largest over converged segments) and ``max_shift_se``. Per segment also
            ``step_error_rms`` and (per-segment mode) ``step_shift_se`` in :attr:`segments`.
    """

    mode: str
    options: dict
    estimates: dict
    uncertainties: dict
    segments: list
    combined: dict
    rms: float
    status: str
    truth: dict | None = None
    step_error: dict | None = None
    _model: dict = dataclasses.field(default=None, repr=False)
    _data: list = dataclasses.field(default=None, repr=False)

    @property
    def converged(self) -> bool:
        return self.status == "converged"

    def predict(self, i: int, *, t=None):
        """``(t, measured omega, fitted omega)`` of segment ``i`` (rad/s, sensor axes)."""
        seg = self._data[i]
        t = seg.t if t is None else np.asarray(t, float)
        m = self._model
        k = self.options["substeps"]
        n_pad = int(64 * math.ceil(len(t) / 64))  # padded like the fit: one compilation
        d = np.diff(t)
        dt = np.repeat(np.concatenate([d, np.full(n_pad - len(t), np.median(d))]) / k, k)
        dtype = jnp.result_type(float)
        w, _ = _predict_jit(m["stepper"], k)(
            *(jnp.asarray(a, dtype) for a in (m["inertia"][i], m["drag"][i], m["omega0"][i], dt))
        )
        return t, seg.omega, np.asarray(w)[: len(t)] + m["bias"][i]

    def to_dict(self) -> dict:
        def clean(v):
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, (list, tuple)):
                return [clean(x) for x in v]
            if isinstance(v, np.ndarray):
                return clean(v.tolist())
            if isinstance(v, (np.floating, float)):
                return float(v) if np.isfinite(v) else None
            if isinstance(v, np.integer):
                return int(v)
            return v

        return clean(
            {
                "mode": self.mode, "options": self.options, "status": self.status, "rms": self.rms,
                "estimates": self.estimates, "uncertainties": self.uncertainties,
                "combined": self.combined, "segments": self.segments, "truth": self.truth,
                "step_error": self.step_error,
            }
        )

    def table(self, *, max_name: int = 44) -> str:
        """A plain-text table: one row per segment, then the combined / joint estimate."""
        keys = [k for k in self.estimates if k != "misalignment_deg"][:4]
        lines = []
        wc = max([7] + [len(s["comment"]) for s in self.segments])  # comments in full
        wst = max([10] + [len(s["status"]) for s in self.segments])
        head = f"{'#':>3} {'segment':<{max_name}} {'comment':<{wc}} {'n':>4} {'rms':>7} {'status':<{wst}}"
        if self.mode == "per-segment":
            head += "".join(f" {k:>20}" for k in keys)
        lines.append(head)
        lines.append("-" * len(head))
        for i, s in enumerate(self.segments):
            name = s["name"] if len(s["name"]) <= max_name else "…" + s["name"][-(max_name - 1) :]
            row = f"{i:>3} {name:<{max_name}} {s['comment']:<{wc}} {s['n']:>4} {s['rms']:>7.4f} {s['status']:<{wst}}"
            if self.mode == "per-segment":
                row += "".join(f" {_pm(s['estimates'].get(k), s['se'].get(k)):>20}" for k in keys)
            lines.append(row)
        lines.append("")
        if self.mode == "per-segment" and len(self.segments) == 1 and self.segments[0]["status"] != POOR_FIT:
            lines.append("single segment: its estimate (± 1-sigma, Gauss-Newton):")
            for k, v in self.estimates.items():
                lines.append(f"  {k:<18} {_pm(v, self.uncertainties.get(k))}")
        elif self.mode == "per-segment":
            n_poor = sum(s["status"] == POOR_FIT for s in self.segments)
            if n_poor:
                lines.append(
                    f"{POOR_FIT}: {n_poor} segment(s) with an implausible residual (> {_POOR_MEDIAN:g}x the median "
                    f"or > {_POOR_SIGNAL:g}x the signal RMS, and > {_POOR_NOISE:g}x the noise): a wrong local "
                    "minimum or a window that is not free flight; EXCLUDED from the medians below"
                )
            lines.append(f"combined over {self.combined.get('n', 0)} converged segment(s): median ± robust spread (1.4826 MAD)")
            for k in self.estimates:
                c = self.combined["all"].get(k, {})
                lines.append(f"  {k:<18} {_pm(c.get('median'), c.get('spread'))}")
            if len(self.combined.get("by_comment", {})) > 1:
                lines.append("by comment (median ± spread, n):")
                for com, d in self.combined["by_comment"].items():
                    vals = "  ".join(
                        f"{k} {_pm(v['median'], v['spread']) if v['n'] > 1 else format(v['median'], '.5g')}"
                        for k, v in list(d.items())[:2]
                    )
                    n = next(iter(d.values()))["n"] if d else 0
                    lines.append(f"  {com[:30]:<30} n={n:<3} {vals}")
        else:
            lines.append(f"joint estimate over {len(self.segments)} segment(s) (± 1-sigma, Gauss-Newton):")
            for k, v in self.estimates.items():
                lines.append(f"  {k:<18} {_pm(v, self.uncertainties.get(k))}")
            shown = set()
            for s in self.segments:
                if "bias" in s and s["source"] not in shown:
                    shown.add(s["source"])
                    b = ", ".join(_pm(v, e) for v, e in zip(s["bias"], s["bias_se"]))
                    lines.append(f"  {'bias (rad/s)':<18} [{b}]" + (f"  ({s['source']})" if len(self.segments) > 1 and len({x['source'] for x in self.segments}) > 1 else ""))
        med = float(np.median([s["rms"] for s in self.segments])) if self.segments else float("nan")
        lines.append(f"residual RMS {self.rms:.4g} rad/s (median over segments {med:.4g}); status: {self.status}")
        if self.step_error:
            se_ = self.step_error
            worst = max(se_["shift_se"], key=lambda k: abs(se_["shift_se"][k]), default=None)
            lines.append(
                f"step error of the simulation (substeps {se_['substeps']}): RMS {se_['rms']:.2g} rad/s; shifts the "
                f"estimates by up to {se_['max_shift_se']:.2f} standard errors" + (f" ({worst})" if worst else "")
            )
        if self.truth:
            lines.append("truth (synthetic) beside the estimate:")
            for k, v in self.truth.items():
                if isinstance(v, (int, float)) and k in self.estimates:
                    e = self.uncertainties.get(k)
                    z = f"  ({(self.estimates[k] - v) / e:+.2f} sigma)" if e and np.isfinite(e) else ""
                    lines.append(f"  {k:<18} truth {v:<12.6g} estimate {self.estimates[k]:.6g}{z}")
            if "bias" in self.truth and self.segments and "bias" in self.segments[0]:
                lines.append(f"  {'bias (rad/s)':<18} truth {self.truth['bias']}  estimate {np.round(self.segments[0]['bias'], 5).tolist()}")
        return "\n".join(lines)


def _pm(v, e) -> str:
    if v is None or not np.isfinite(v):
        return "—"
    if e is None or np.isnan(e):
        return f"{v:.5g} (derived)"
    if not np.isfinite(e):
        return f"{v:.5g} ± inf"
    if e == 0:
        return f"{v:.5g} (fixed)"
    return f"{v:.5g} ± {e:.2g}"


def _summary(values: list[dict], keys) -> dict:
    out = {}
    for k in keys:
        v = np.array([d[k] for d in values if k in d and np.isfinite(d[k])])
        if v.size == 0:
            continue
        med = float(np.median(v))
        out[k] = {
            "median": med,
            # one value has no spread (NaN, not 0: 0 would read as exact)
            "spread": float(1.4826 * np.median(np.abs(v - med))) if v.size > 1 else float("nan"),
            "p16": float(np.percentile(v, 16)),
            "p84": float(np.percentile(v, 84)),
            "n": int(v.size),
        }
    return out


# ----------------------------------------------------------------------------- main entry


def fit_inertia(
    segments,
    *,
    tensor: bool = False,
    drag: str | None = None,
    bias: bool = False,
    joint: bool = False,
    scale=None,
    stepper: Callable | None = None,
    substeps: int = 1,
    starts: int = 4,
    seed: int = 0,
    max_steps: int = 200,
    phase1_steps: int = 12,
    chunk: int = 32,
    progress: Callable | None = None,
) -> InertiaFit:
    """Fit the inertia (ratios, or moments given a scale) to measured body angular velocity.

    Args:
        segments: a list of :class:`rigidjax.io.Segment` (free-motion windows), one Segment,
            a path understood by :func:`rigidjax.io.load`, or a ``(t, omega)`` pair.
        tensor: fit the full inertia tensor (principal axes rotated from the sensor axes)
            instead of principal moments along the sensor axes.
        drag: ``None``, ``"isotropic"`` (``D = c I_3``) or ``"diagonal"`` (sensor axes).
        bias: fit a constant gyroscope bias (rad/s): per recording (``Segment.source``) in a
            joint fit, per segment otherwise.
        joint: one shared inertia (and drag) for all segments, each with its own initial
            angular velocity; ``False`` (default) fits every segment independently.
        scale: a known value fixing the scale: ``"Iy=1.3911e-3"``, ``{"Iy": ...}``,
            ``("trace", ...)`` (kg m^2); without it only ratios are reported.
        stepper: any rigidjax stepper ``step(body, state, wrench, dt) -> (state, info)``
            (bind options with ``functools.partial``); default :func:`rigidjax.midpoint_step`
            (seed 000; its forward-mode Jacobians, what the fits evaluate, come from a
            hand-written JVP).
        substeps: equal sub-steps per measured sample interval (accuracy of the model). The
            step error is estimated after the fit (Richardson: ``substeps`` vs ``2 substeps``),
            converted into the shift it causes in every estimate (in standard errors, reported
            in :attr:`InertiaFit.step_error`), and a shift above 1 standard error warns: on
            noise-level synthetic flips at 100 Hz (``|omega| dt ~ 0.1``) ``substeps=1`` shifts the
            ratios and the gyroscope bias by 1-4 standard errors, ``substeps=4`` by < 0.3.
        starts: multi-start count (vmapped), best kept.
        seed: random starts.
        max_steps: Levenberg-Marquardt iterations after the multi-start phase.
        phase1_steps: iterations every start gets before the best is kept.
        chunk: segment simulations per vmapped call (padded, so every call shares one
            compilation per sample count rounded up to 64).
        progress: optional callable ``progress(n_active)`` called after every iteration with
            the number of problems still iterating.

    Wrong local minima (per-segment mode): the least-squares cost of a flip has several basins;
    the multi-start can end in a wrong one that is still a stationary point, so the optimiser
    reports convergence there. Two safeguards:

    * Refit: every segment whose residual RMS is above 3x the median over the fit's segments or
      above 10 % of its own signal RMS (rates about their mean) is refitted from the consensus
      (the shared parameters of the good segment nearest the median, over all segments and
      over the same recording), from four further random
      inertias and, with drag, by continuation (fit without drag, then switch the drag on);
      the lowest cost wins. On the
      racquet flips this takes throws that ended at RMS 4-8 rad/s with Ix/Iy 0.05-1.3 back to
      0.2-0.6 rad/s and Ix/Iy ~ 13-16.
    * Quality rule, independent of stationarity: a converged segment whose residual RMS is
      above 5x the median over segments OR above 25 % of its signal RMS, AND above 10x its
      noise estimate (robust scale of second differences of the measured rates), gets status
      :data:`POOR_FIT` (``"poor_fit"``), is left out of the combined medians, and is named in
      :meth:`InertiaFit.table` and a warning. Why these numbers: a good fit of a one-second
      flip leaves model error only (on the racquet flips 1-5 % of the signal, within 3x of the
      median throw), and a fit in a wrong basin leaves tens of per cent; the noise condition
      keeps segments whose residual is white noise anyway (synthetic data, a steady spin)
      from being flagged because the others happen to be quieter. A single segment is judged
      by the signal condition only (its median is itself).

    Returns:
        :class:`InertiaFit`.

    Raises:
        FitError: no segments, a segment with fewer samples than the parameters it must fit,
            bad option values. (:class:`rigidjax.io.DataError` for NaN / malformed data.)

    Warns:
        UserWarning: a fit that did not converge (its status says why), a segment with status
            ``"poor_fit"`` (see above), singular normal equations (a spin about one principal
            axis determines little: infinite errors, status :data:`UNIDENTIFIABLE`), a step error
            that shifts an estimate by more than 1 standard error (raise ``substeps``), and a fit in
            float32 (without ``jax_enable_x64``: it runs, with tolerances for float32, but its
            round-off can stall the optimiser and degrades the standard errors).
    """
    segs = _as_segments(segments)
    if drag not in _DRAG:
        raise FitError(f"drag must be one of {_DRAG}; got {drag!r}")
    if not (isinstance(substeps, (int, np.integer)) and substeps >= 1):
        raise FitError(f"substeps must be an integer >= 1; got {substeps!r}")
    if not (isinstance(starts, (int, np.integer)) and starts >= 1):
        raise FitError(f"starts must be an integer >= 1; got {starts!r}")
    scale = parse_scale(scale)
    if stepper is None:
        stepper = midpoint_step
    if not callable(stepper):
        raise FitError(f"stepper must be a rigidjax stepper (callable); got {stepper!r}")
    spec = _Spec(bool(tensor), drag, bool(bias), int(substeps), stepper)
    n_shared = spec.n_inertia + spec.n_drag
    dtype = jnp.result_type(float)
    if jnp.dtype(dtype) != jnp.float64:
        # The LM's tolerances follow the dtype (see _lm), so the estimates match float64's on the
        # racquet flips; but the rollout's round-off in the Jacobian can stall the optimiser short
        # of its tests (status "stalled") and coarsens the standard errors.
        warnings.warn(
            f"fit_inertia: fitting in {jnp.dtype(dtype).name} (JAX's default without 64-bit mode): round-off "
            "in the simulated rates and their derivatives can stall the optimiser (status 'stalled') and "
            'degrades the standard errors; for a trustworthy fit enable float64 first: '
            'jax.config.update("jax_enable_x64", True)',
            stacklevel=2,
        )
    if joint:
        sources = sorted({s.source for s in segs})
        groups = [sources.index(s.source) for s in segs] if bias else [0] * len(segs)
        p = n_shared + (max(groups) + 1) * spec.n_bias + 3 * len(segs)
        m = 3 * sum(s.n for s in segs)
        if m <= p:
            raise FitError(f"segments: {m} measured values cannot determine {p} parameters of the joint fit")
        for i, s in enumerate(segs):
            if s.n < _MIN_SAMPLES:
                raise FitError(
                    f"segments[{i}] ({s.name or s.source}): {s.n} samples: window too short (at least "
                    f"{_MIN_SAMPLES} samples: rates and their derivative start the fit)"
                )
    else:
        p = n_shared + spec.n_bias + 3
        for i, s in enumerate(segs):
            if s.n < _MIN_SAMPLES and 3 * s.n > p:
                raise FitError(
                    f"segments[{i}] ({s.name or s.source}): {s.n} samples: window too short for the {p} "
                    f"parameters it must fit (at least {_MIN_SAMPLES} samples: rates and their derivative "
                    "start the fit)"
                )
            if 3 * s.n <= p:
                raise FitError(
                    f"segments[{i}] ({s.name or s.source}): {s.n} samples x 3 = {3 * s.n} values cannot "
                    f"determine the {p} parameters it must fit (window too short)"
                )
    rot = max(float(np.max(np.linalg.norm(s.omega, axis=1)[:-1] * np.diff(s.t))) for s in segs) / substeps
    if rot > 0.5:
        warnings.warn(f"|omega| dt up to {rot:.2f} rad per step: raise substeps for accuracy", stacklevel=2)
    n_pad = int(64 * math.ceil(max(s.n for s in segs) / 64))  # few shapes: few compilations
    data = _pad(segs, spec.substeps, n_pad, np.dtype(dtype))

    def info_row(s):
        return {"name": s.name, "comment": s.comment, "source": s.source, "n": s.n, "index": s.index}

    w0s = np.stack([s.omega[0] for s in segs])
    n_lat = 3 + 3 * spec.tensor + spec.n_drag
    maps = _shared_maps(spec)

    def tick(n_active):
        if progress is not None:
            progress(n_active)

    # ---- optimise (latent coordinates): multi-start phase, then the best start to convergence
    if joint:
        G = max(groups) + 1
        x0 = _initial(spec, n_lat, segs, starts, seed, spec.n_bias, G)
        lat = _Problems(spec, data, np.tile(np.arange(len(segs)), (starts, 1)), groups, latent=True, chunk=chunk)
        st = _lm(lat, x0, np.arange(starts), phase1_steps, progress=tick)
        best = int(np.argmin(np.where(st["ok"], st["cost"], np.inf)))
        keep = {k: v[best : best + 1].copy() for k, v in st.items()}
        st = _lm(lat, keep["x"], np.array([best]), max_steps, state=keep, progress=tick)
        problems = [(list(range(len(segs))), groups)]
        xs = st["x"]
        statuses = st["status"]
        iters = st["it"]
        oks = st["ok"]
    else:
        n = len(segs)
        x0 = np.concatenate([_initial(spec, n_lat, segs[i : i + 1], starts, seed, spec.n_bias, 1) for i in range(n)])
        seg_ids = np.repeat(np.arange(n), starts)[:, None]
        lat = _Problems(spec, data, seg_ids, [0], latent=True, chunk=chunk)
        st = _lm(lat, x0, np.arange(n * starts), phase1_steps, progress=tick)
        cost = np.where(st["ok"], st["cost"], np.inf).reshape(n, starts)
        best = np.arange(n) * starts + np.argmin(cost, axis=1)
        keep = {k: v[best].copy() for k, v in st.items()}
        st = _lm(lat, keep["x"], best, max_steps, state=keep, progress=tick)
        _rescue(spec, data, segs, st, n_lat, phase1_steps, max_steps, chunk, seed, tick)
        problems = [([i], [0]) for i in range(n)]
        xs, statuses, iters, oks = st["x"], st["status"], st["it"], st["ok"]

    # ---- report: reported (physical) coordinates, Gauss-Newton covariance there
    nxs = xs.shape[0]
    bucket = max(64, 1 << (nxs - 1).bit_length())
    lat_pad = np.concatenate([xs[:, :n_lat], np.repeat(xs[-1:, :n_lat], bucket - nxs, 0)])
    x_phys = np.concatenate(
        [np.asarray(maps["lat_to_phys"](jnp.asarray(lat_pad, dtype)), float)[:nxs], xs[:, n_lat:]], axis=1
    )
    seg_ids = np.asarray([p_[0] for p_ in problems])
    phy = _Problems(spec, data, seg_ids, problems[0][1], latent=False, chunk=chunk)
    _, A_p, _, ok_p, rss_p = phy.evaluate(x_phys, np.arange(len(problems)))
    model = {"inertia": [], "drag": [], "omega0": [], "bias": [], "stepper": stepper}
    options = {
        "tensor": spec.tensor, "drag": drag, "bias": spec.bias, "substeps": spec.substeps, "starts": starts,
        "stepper": getattr(stepper, "__name__", repr(stepper)), "scale": list(scale) if scale else None,
        "joint": bool(joint),
    }
    # the simulation's own step error at the fitted model (Richardson) and what it does to the estimates
    g_e, rss_e = _step_error(spec, segs, data, problems, x_phys, phy, chunk)
    rows = []
    fits = []
    for j, (ids, grp) in enumerate(problems):
        m_j = 3 * sum(segs[i].n for i in ids)
        cov, s2, singular = _covariance(A_p[j], float(np.sum(rss_p[j])), m_j, phy.P)
        est, se = _estimates_and_se(x_phys[j], cov, spec, scale, phy.n_sh)
        status = STATUS[int(statuses[j])] if (oks[j] and ok_p[j]) else "nonfinite"
        if singular and status in ("converged", "stalled"):
            # a flat direction: the optimiser stops (or stalls, an exact fit leaves no descent)
            # wherever it is along it; the estimate is a stationary point, not a determined one
            status = UNIDENTIFIABLE
        se_all = np.sqrt(np.maximum(np.diag(cov), 0)) if np.all(np.isfinite(cov)) else np.full(phy.P, np.inf)
        inertia_m, drag_m = _phys_model(_unflat_phys(jnp.asarray(x_phys[j, : phy.n_sh]), spec), spec)
        off_w = phy.n_sh + phy.G * phy.n_b
        shift_se = {}
        if np.all(np.isfinite(cov)) and s2 > 0 and np.all(np.isfinite(g_e[j])):
            bias_idx = []
            for g_ in dict.fromkeys(grp) if spec.bias else ():
                src = f" ({segs[ids[list(grp).index(g_)]].source})" if len(set(grp)) > 1 else ""
                bias_idx += [(f"bias_{c}{src}", phy.n_sh + phy.n_b * g_ + a) for a, c in enumerate("xyz")]
            shift_se = _shift_in_se(x_phys[j, : phy.n_sh], -(cov @ g_e[j]) / s2, spec, scale, se, se_all, bias_idx)
        fits.append({
            "estimates": est, "se": se, "status": status, "sigma": math.sqrt(s2) if s2 == s2 else None,
            "shift_se": shift_se,
        })
        for k, i in enumerate(ids):
            s = segs[i]
            row = info_row(s)
            row["rms"] = float(np.sqrt(rss_p[j, k] / (3 * s.n)))
            row["step_error_rms"] = float(np.sqrt(rss_e[j, k] / (3 * s.n)))
            if not joint:
                row["step_shift_se"] = shift_se
            row["status"] = status
            row["iterations"] = int(iters[j])
            w0 = x_phys[j, off_w + 3 * k : off_w + 3 * k + 3]
            row["omega0"] = w0.tolist()
            row["omega0_se"] = se_all[off_w + 3 * k : off_w + 3 * k + 3].tolist()
            b = np.zeros(3)
            if spec.bias:
                ob = phy.n_sh + phy.n_b * grp[k]
                b = x_phys[j, ob : ob + 3]
                row["bias"] = b.tolist()
                row["bias_se"] = se_all[ob : ob + 3].tolist()
            if not joint:
                row["estimates"], row["se"] = est, se
            rows.append(row)
            model["inertia"].append(np.asarray(inertia_m))
            model["drag"].append(np.asarray(drag_m))
            model["omega0"].append(np.asarray(w0))
            model["bias"].append(b)
    m_tot = sum(3 * s.n for s in segs)
    rms = float(np.sqrt(np.sum(rss_p) / m_tot))
    if joint:
        f = fits[0]
        result = InertiaFit(
            mode="joint", options=options, estimates=f["estimates"], uncertainties=f["se"], segments=rows,
            combined={}, rms=rms, status=f["status"],
        )
        result.options["sigma"] = f["sigma"]
    else:
        # quality rule, independent of the optimiser's stationarity (see the docstring)
        med_rms = float(np.median([r_["rms"] for r_ in rows]))
        for j, r_ in enumerate(rows):
            noise, signal = _noise_and_signal(segs[j])
            r_["noise"] = noise
            implausible = r_["rms"] > _POOR_MEDIAN * med_rms or r_["rms"] > _POOR_SIGNAL * signal
            if r_["status"] == "converged" and implausible and r_["rms"] > _POOR_NOISE * noise:
                r_["status"] = fits[j]["status"] = POOR_FIT
        per = [f["estimates"] for f in fits if f["status"] == "converged"]
        n_unid = sum(f["status"] == UNIDENTIFIABLE for f in fits)
        keys = list(fits[0]["estimates"])
        combined = {"n": len(per), "all": _summary(per, keys), "by_comment": {}}
        for com in dict.fromkeys(r_["comment"] for r_ in rows):
            vals = [r_["estimates"] for r_ in rows if r_["comment"] == com and r_["status"] == "converged"]
            combined["by_comment"][com] = _summary(vals, keys)
        n_poor = sum(f["status"] == POOR_FIT for f in fits)
        n_bad = sum(f["status"] not in ("converged", POOR_FIT, UNIDENTIFIABLE) for f in fits)
        why = []
        if n_bad:
            why.append(f"{n_bad} of {len(fits)} segment(s) did not converge")
        if n_poor:
            why.append(f"{n_poor} of {len(fits)} segment(s) {POOR_FIT} (local minimum?)")
        if n_unid and len(fits) > 1:
            why.append(f"{n_unid} of {len(fits)} segment(s) {UNIDENTIFIABLE}")
        if len(fits) == 1 and fits[0]["status"] != POOR_FIT:
            # one segment: its own estimate with its Gauss-Newton standard error (no spread)
            estimates, uncertainties = dict(fits[0]["estimates"]), dict(fits[0]["se"])
            status = "; ".join(why) if n_bad else fits[0]["status"]
        else:
            estimates = {k: v["median"] for k, v in combined["all"].items()}
            uncertainties = {k: v["spread"] for k, v in combined["all"].items()}
            status = "; ".join(why) + ", excluded from the medians" if why else "converged"
        result = InertiaFit(
            mode="per-segment", options=options, estimates=estimates, uncertainties=uncertainties,
            segments=rows, combined=combined, rms=rms, status=status,
        )
    # step error: joint / single segment its own shifts; per segment the largest over converged ones
    shifts = [fits[0]["shift_se"]] if joint or len(fits) == 1 else [f["shift_se"] for f in fits if f["status"] == "converged"]
    worst = {}
    for d in shifts:
        for k_, v_ in d.items():
            if abs(v_) > abs(worst.get(k_, 0.0)):
                worst[k_] = v_
    result.step_error = {
        "substeps": spec.substeps,
        "rms": float(np.sqrt(np.sum(rss_e) / m_tot)),
        "shift_se": worst,
        "max_shift_se": max((abs(v_) for v_ in worst.values()), default=0.0),
    }
    result._model = {k: (np.stack(v) if k != "stepper" else v) for k, v in model.items()}
    result._data = segs
    unid = [r_["name"] for r_ in result.segments if r_["status"] == UNIDENTIFIABLE]
    if unid:
        warnings.warn(
            "fit_inertia: singular normal equations for " + "; ".join(dict.fromkeys(unid)) + ": the data do not "
            "determine the inertia ratios (a spin about one principal axis, with no flip or nutation, fits any "
            "ratios); standard errors are infinite and the estimates are arbitrary",
            stacklevel=2,
        )
    bad = [
        r_["name"] + ": " + r_["status"] for r_ in result.segments
        if r_["status"] not in ("converged", POOR_FIT, UNIDENTIFIABLE)
    ]
    if bad:
        warnings.warn(
            "fit_inertia: the fit did not converge for " + "; ".join(dict.fromkeys(bad)) +
            " (max_steps: raise max_steps; stalled: no descent direction found; nonfinite: the simulation "
            "failed, check the data and substeps)",
            stacklevel=2,
        )
    se_ = result.step_error
    if se_["max_shift_se"] > _STEP_SHIFT_WARN:
        worst_name = max(se_["shift_se"], key=lambda k_: abs(se_["shift_se"][k_]))
        warnings.warn(
            f"fit_inertia: the simulation's step error (substeps={spec.substeps}: RMS {se_['rms']:.2g} rad/s at the "
            f"samples, Richardson estimate) shifts the estimates by up to {se_['max_shift_se']:.1f} standard errors "
            f"({worst_name}), which the reported errors do not include: raise substeps (each doubling cuts the "
            "shift about 4x)",
            stacklevel=2,
        )
    poor = [f"{r_['name']} (rms {r_['rms']:.3g} rad/s)" for r_ in result.segments if r_["status"] == POOR_FIT]
    if poor:
        warnings.warn(
            f"fit_inertia: {POOR_FIT} (local minimum?) for " + "; ".join(poor) + f": residual RMS above "
            f"{_POOR_MEDIAN:g}x the median over segments or {_POOR_SIGNAL:g}x the segment's signal RMS, and above "
            f"{_POOR_NOISE:g}x its noise estimate, although the optimiser stopped at a stationary point; "
            "excluded from the combined medians (inspect the segment: fit.predict(i))",
            stacklevel=2,
        )
    return result
