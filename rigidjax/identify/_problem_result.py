"""The result of :func:`rigidjax.identify.fit`: statuses, values, uncertainties (see
:mod:`rigidjax.identify.problem` for what they mean)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..info import Status
from . import _lm
from ._result import FitStatus, pm


@dataclasses.dataclass
class ProblemFit:
    """The result of :func:`fit`.

    Attributes:
        status: :class:`rigidjax.identify.FitStatus`; ``message`` says why.
        values: ``{name: value}`` of the model parameters (as their transform gives them).
        se: ``{name: standard error}`` (same shapes; the larger of the classical and the
            block-sandwich estimate, see the module).
        sensor: per observation, ``{name: value}`` of its sensor parameters; ``sensor_se``
            their standard errors.
        initial: ``(S, nz)`` the fitted initial-state unknowns per segment.
        model: the model with the fitted values.
        cost: ``1/2 sum r^2`` at the optimum; ``rms``: per observation, the RMS residual in
            the data's units (times ``sigma``).
        covariance: of the flattened values (model then sensor), in ``names`` order.
        names: the flattened values' names.
        block: the sandwich's block length (samples).
        iterations: optimiser iterations of the best start; ``starts``: starts run;
            ``starts_at_best``: starts that reached the best cost (relative 1e-6).
        decrement: the first-order optimality measure at the optimum (``_lm.decrement``).
    """

    status: FitStatus
    message: str
    values: dict
    se: dict
    sensor: list
    sensor_se: list
    initial: np.ndarray
    model: Any
    cost: float
    rms: list
    covariance: np.ndarray
    names: list
    block: int
    iterations: int
    starts: int
    starts_at_best: int
    decrement: float
    x: np.ndarray

    def to_dict(self) -> dict:
        """JSON-ready: status, message, values and standard errors (lists), sensor parameters,
        initial unknowns, cost, RMS, the covariance with its names, the optimiser's counts."""

        def js(v):
            return jax.tree_util.tree_map(lambda a: np.asarray(a, float).tolist(), v)

        return {
            "status": str(self.status),
            "message": self.message,
            "values": js(self.values),
            "se": js(self.se),
            "sensor": js(self.sensor),
            "sensor_se": js(self.sensor_se),
            "initial": js(self.initial),
            "cost": float(self.cost),
            "rms": [float(r) for r in self.rms],
            "names": list(self.names),
            "covariance": np.where(np.isfinite(self.covariance), self.covariance, np.nan).tolist(),
            "block": int(self.block),
            "iterations": int(self.iterations),
            "starts": int(self.starts),
            "starts_at_best": int(self.starts_at_best),
            "decrement": float(self.decrement),
        }

    def __str__(self) -> str:
        lines = [f"status: {self.status} ({self.message})"]
        for name, v in self.values.items():
            lines += _rows(name, v, self.se[name])
        for i, (vals, ses) in enumerate(zip(self.sensor, self.sensor_se)):
            for name, v in vals.items():
                lines += _rows(f"sensor {i} {name}", v, ses[name])
        lines.append(
            f"cost {self.cost:.6g}; rms per observation {[float(f'{r:.4g}') for r in self.rms]}; "
            f"{self.starts_at_best}/{self.starts} starts at the best cost; {self.iterations} iterations"
        )
        return "\n".join(lines)


def _rows(name, v, e):
    v, e = np.atleast_1d(np.asarray(v, float)), np.atleast_1d(np.asarray(e, float))
    if v.size == 1:
        return [f"  {name:<28} {pm(v[0], e[0])}"]
    return [f"  {name}[{i}]".ljust(31) + f" {pm(a, b)}" for i, (a, b) in enumerate(zip(v.ravel(), e.ravel()))]


def _block_length(r: np.ndarray) -> int:
    """Lag (samples) where the residuals' mean autocorrelation first falls below 0.1."""
    S, N, c = r.shape
    x = r - r.mean(axis=1, keepdims=True)
    var = np.sum(x * x, axis=1)  # (S, c)
    ok = var > 0
    if not np.any(ok):
        return 1
    for lag in range(1, N // 4):
        ac = np.sum(x[:, lag:] * x[:, :-lag], axis=1)
        if np.mean(ac[ok] / var[ok]) < 0.1:
            return lag
    return max(1, N // 4)


def result(problem, layout, run, x, st, b, at_best, starts, dtype) -> ProblemFit:
    """The :class:`ProblemFit` of the best start ``b`` of the optimiser's state ``st``."""
    xj = jnp.asarray(x, dtype)
    r, status, J = run(np.asarray(x)[None])
    S, P = layout.S, layout.P
    N = len(np.asarray(problem.segments[0].t))
    r, ok, J = r[0].reshape(S, N, -1), status[0] == Status.SUCCESS, J[0].reshape(S, N, -1, P)
    Jf = J.reshape(-1, P)
    rf = r.reshape(-1)
    live = np.any(Jf != 0, axis=1) | (rf != 0)
    m = int(np.sum(live))
    A = Jf.T @ Jf
    rss = float(rf @ rf)
    dof = m - P
    s2 = rss / dof if dof > 0 else float("nan")
    d = np.sqrt(np.maximum(np.diag(A), 1e-300))
    An = A / d[:, None] / d[None, :]
    w = np.linalg.eigvalsh(An)
    singular = not np.all(np.isfinite(w)) or w.min() <= 1e-12 * w.max() or not np.isfinite(s2)
    if singular:
        cov = np.full((P, P), np.inf)
    else:
        Ainv = np.linalg.inv(An) / d[:, None] / d[None, :]
        cov_classic = s2 * Ainv
        L = _block_length(r)
        scores = []
        for s in range(S):
            for i in range(0, N, L):
                Jb = J[s, i : i + L].reshape(-1, P)
                scores.append(Jb.T @ r[s, i : i + L].reshape(-1))
        G = np.einsum("bi,bj->ij", np.array(scores), np.array(scores))
        cov_hac = Ainv @ G @ Ainv * m / dof
        cov = cov_classic
        big = np.diag(cov_hac) > np.diag(cov_classic)
        # the larger variance per coordinate, correlations of the classical estimate
        scale = np.sqrt(np.where(big, np.diag(cov_hac) / np.diag(cov_classic), 1.0))
        cov = cov_classic * scale[:, None] * scale[None, :]
    L = _block_length(r) if not singular else 1

    # values and their covariance (delta method through the transforms)
    ng = layout.n_global

    def value_vec(xg):
        mv, sv = layout.values(jnp.concatenate([xg, xj[ng:]]))
        # in insertion order (as the names below), not tree_leaves' sorted keys
        vals = [v for v in mv.values()] + [v for d_ in sv for v in d_.values()]
        return jnp.concatenate([jnp.ravel(jnp.asarray(a)) for a in jax.tree_util.tree_leaves(vals)])

    Tv = np.asarray(jax.jacfwd(value_vec)(xj[:ng]), float)
    cov_v = Tv @ cov[:ng, :ng] @ Tv.T if np.all(np.isfinite(cov[:ng, :ng])) else np.full((len(Tv), len(Tv)), np.inf)
    se_flat = np.sqrt(np.maximum(np.diag(cov_v), 0))
    mv, sv = layout.values(xj)
    names, values, se, pos = [], {}, {}, 0
    for name, v in mv.items():
        v = jax.tree_util.tree_map(np.asarray, v)
        values[name] = v
        sizes = [np.size(a) for a in jax.tree_util.tree_leaves(v)]
        parts = np.split(se_flat[pos : pos + sum(sizes)], np.cumsum(sizes)[:-1])
        se[name] = jax.tree_util.tree_unflatten(
            jax.tree_util.tree_structure(v),
            [p.reshape(np.shape(a)) for p, a in zip(parts, jax.tree_util.tree_leaves(v))],
        )
        names += [f"{name}[{i}]" if sum(sizes) > 1 else name for i in range(sum(sizes))]
        pos += sum(sizes)
    sensor, sensor_se = [], []
    for i, d_ in enumerate(sv):
        vals, ses = {}, {}
        for name, v in d_.items():
            v = np.asarray(v)
            vals[name] = v
            ses[name] = se_flat[pos : pos + v.size].reshape(v.shape)
            names += [f"sensor{i}.{name}[{j}]" if v.size > 1 else f"sensor{i}.{name}" for j in range(v.size)]
            pos += v.size
        sensor.append(vals)
        sensor_se.append(ses)

    # per observation RMS in data units
    rms, col = [], 0
    for o in problem.observations:
        n_c = o.residual_size(np.shape(problem.segments[0].data[o.key])[-1])
        w = np.stack([o.weight(np.asarray(s.t, float)) for s in problem.segments])
        block = r[:, :, col : col + n_c] * o.sigma
        rms.append(float(np.sqrt(np.sum(block**2) / max(1, n_c * np.sum(w > 0)))))
        col += n_c

    # the cost's round-off: a decrease the Gauss-Newton model still promises below it cannot be
    # verified in this precision (noise-free data fitted to the simulation's own accuracy)
    eps = float(jnp.finfo(dtype).eps)
    mag = np.concatenate(
        [np.stack([o.magnitude(s.data[o.key]) for s in problem.segments]) for o in problem.observations], -1
    )
    resolution = float(np.sum(np.abs(r) * mag))
    lm_status = int(st["status"][b])
    decrement = float(st["opt"][b])
    if not np.all(ok):
        status, msg = FitStatus.NONFINITE, "a rollout step failed at the best point"
    elif lm_status == _lm.LMStatus.MAX_STEPS:
        status, msg = FitStatus.MAX_STEPS, "the iteration cap came first (raise max_steps)"
    elif lm_status == _lm.LMStatus.STALLED and decrement * 0.5 * rss > 10 * eps * resolution:
        status, msg = FitStatus.STALLED, "no step lowers the cost, yet the point is not first-order optimal"
    elif lm_status not in (_lm.LMStatus.CONVERGED, _lm.LMStatus.STALLED):
        status, msg = FitStatus.NONFINITE, "the best start could not be evaluated"
    elif singular:
        status, msg = FitStatus.UNIDENTIFIABLE, "J^T J is singular: a combination of the unknowns is not determined"
    elif lm_status == _lm.LMStatus.STALLED:
        status, msg = FitStatus.CONVERGED, f"first-order optimal to the cost's round-off (decrement {decrement:.1e})"
    else:
        status, msg = FitStatus.CONVERGED, f"first-order optimal (decrement {decrement:.1e})"
    return ProblemFit(
        status=status,
        message=msg,
        values=values,
        se=se,
        sensor=sensor,
        sensor_se=sensor_se,
        initial=np.asarray(x[ng:]).reshape(layout.S, layout.nz),
        model=layout.model(xj),
        cost=0.5 * rss,
        rms=rms,
        covariance=cov_v,
        names=names,
        block=L,
        iterations=int(st["it"][b]),
        starts=starts,
        starts_at_best=at_best,
        decrement=decrement,
        x=np.asarray(x),
    )
