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
from ._program_key import _stable_key, _structure
from ._stored import stored
from . import _verdict
from ._result import FitStatus, pm
from .observations import data_of, data_width
from .transforms import Positive


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
        initial: ``(S, nz)`` the fitted initial-state unknowns per segment; ``initial_se``:
            their standard errors (as ``se``: the larger of the classical and the sandwich
            estimate; inf where undetermined).
        model: the model with the fitted values.
        cost: ``1/2 sum r^2`` at the optimum; ``rms``: per observation, the RMS residual in
            the data's units (times ``sigma``).
        covariance: of the flattened values (model then sensor), in ``names`` order.
        covariance_classical: ``(V + S nz, V + S nz)``: the classical ``s^2 (J^T J)^-1``
            alone (right for white residuals; the errors of ``se_classical``) of the
            flattened values (``names`` order) then the initial-state unknowns (``initial``
            row by row); rows and columns of undetermined quantities inf.
        measured: the measured values the fit used (weighted residual components that
            depend on the unknowns or are not zero; where not fitted, the weighted components
            of the data); fewer than twice the unknowns is ``too_few``.
        names: the flattened values' names.
        block: the sandwich's block length (samples).
        iterations: optimiser iterations of the best start; ``starts``: starts run;
            ``starts_at_best``: starts that reached the best cost (relative 1e-6), counted
            among the ``kept`` starts that ran past the first phase (``fit``'s ``keep``;
            a :func:`fit_many` refit: among its own; ``None``: every start ran to its end).
        decrement: the first-order optimality measure at the optimum (``_lm.decrement``).
        x: the unknown vector at the optimum.
        se_classical: ``{name: standard error}`` of the model values from the classical
            ``s^2 (J^T J)^-1`` alone (right for white residuals).
        substeps: the stepper's steps per sample interval of this fit (``Problem.substeps``,
            or more after the step-error check doubled them).
        step_shift: per value (``names`` order), how far the stepper's error at ``substeps``
            moves it, in standard errors (:mod:`rigidjax.identify._step_error`); empty when
            the check was not run. ``step_delta``: the same move, signed, in the values' units
            (the exact model's estimate minus the fitted one, to first order); ``step_rms``:
            the RMS of the step-error estimate over the measured values, in units of their
            ``sigma`` (NaN when the check was not run or a step failed at twice the steps).
        segment_cost: ``(S,)`` each segment's part of ``cost`` (``1/2 sum r^2`` over its
            samples, weighted residuals).
        segment_influence: ``(S, V + S nz)`` each segment's first-order influence on the
            flattened values (``names`` order) and the initial-state unknowns:
            ``T A^+ J_s^T r_s`` (``A = J^T J``, ``T`` the values' Jacobian), to first order how
            far leaving the segment out would move them. Segments as clusters: the
            cluster-robust (sandwich) covariance is ``sum_s d_s d_s^T S / (S - 1)``, robust to
            model error that differs between segments (fit_inertia's joint mode); NaN in the
            columns of undetermined quantities. Meaningful at a first-order optimum with no
            value held at a bound (there the influences sum to zero); at a bound, or where the
            fit did not converge, they do not. First order: a segment that pulls the fit far
            (another body among the segments) moves it further than its influence says.
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
    se_classical: dict = dataclasses.field(default_factory=dict)
    substeps: int | tuple = 1
    step_shift: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    kept: int | None = None
    initial_se: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0)))
    covariance_classical: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0)))
    measured: int | None = None
    step_delta: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    step_rms: float = float("nan")
    segment_cost: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    segment_influence: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0)))

    @property
    def too_few(self) -> bool:
        """Whether the data held fewer than two measured values per unknown (``unidentifiable``:
        no standard error means anything), found before the fit (not fitted) or after it."""
        return self.measured is not None and self.measured < 2 * np.size(self.x)

    def to_dict(self) -> dict:
        """JSON-ready: status, message, values and standard errors (the reported and the
        classical ones; lists), sensor parameters, initial unknowns, cost, RMS, the covariance
        with its names, the optimiser's counts, the step check's ``substeps``, ``step_shift``,
        ``step_delta`` and ``step_rms``, ``segment_cost``, ``segment_influence`` and the unknown
        vector ``x`` (non-finite numbers as ``null``)."""

        def clean(a):
            a = np.asarray(a, float)
            return float(a) if a.ndim == 0 and np.isfinite(a) else None if a.ndim == 0 else [clean(x) for x in a]

        def js(v):
            return jax.tree_util.tree_map(clean, v)

        return {
            "status": str(self.status),
            "message": self.message,
            "values": js(self.values),
            "se": js(self.se),
            "se_classical": js(self.se_classical),
            "sensor": js(self.sensor),
            "sensor_se": js(self.sensor_se),
            "initial": js(self.initial),
            "initial_se": js(self.initial_se),
            "cost": clean(self.cost),
            "rms": clean(self.rms),
            "names": list(self.names),
            "covariance": clean(self.covariance),
            "covariance_classical": clean(self.covariance_classical),
            "block": int(self.block),
            "iterations": int(self.iterations),
            "starts": int(self.starts),
            "starts_at_best": int(self.starts_at_best),
            "kept": None if self.kept is None else int(self.kept),
            "measured": None if self.measured is None else int(self.measured),
            "decrement": clean(self.decrement),
            "substeps": list(self.substeps) if isinstance(self.substeps, tuple) else int(self.substeps),
            "step_shift": clean(self.step_shift),
            "step_delta": clean(self.step_delta),
            "step_rms": clean(self.step_rms),
            "segment_cost": clean(self.segment_cost),
            "segment_influence": clean(self.segment_influence),
            "x": clean(self.x),
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
            + (
                f"{self.starts_at_best}/{self.starts} starts at the best cost"
                if self.kept is None
                else f"{self.starts_at_best}/{self.kept} kept starts at the best cost ({self.starts} started)"
            )
            + f"; {self.iterations} iterations"
        )
        if np.size(self.step_shift) and np.all(np.isfinite(self.step_shift)):
            k = int(np.argmax(self.step_shift))
            lines.append(
                f"step error at substeps={self.substeps}: moves {self.names[k]} by "
                f"{self.step_shift[k]:.2g} standard errors (the most)"
            )
        return "\n".join(lines)


def _rows(name, v, e):
    v, e = np.atleast_1d(np.asarray(v, float)), np.atleast_1d(np.asarray(e, float))
    if v.size == 1:
        return [f"  {name:<28} {pm(v[0], e[0])}"]
    return [f"  {name}[{i}]".ljust(31) + f" {pm(a, b)}" for i, (a, b) in enumerate(zip(v.ravel(), e.ravel()))]


#: Residual variance (in units of the stated sigma^2) above which a fit is a poor fit.
POOR_FIT_S2 = 25.0


def _coordinate_names(layout) -> list[str]:
    """A name per unknown coordinate (model and sensor slots, then each segment's initial state)."""
    names = []
    for kind, name, _, _, _, n in layout.slots:
        prefix = name if kind == "model" else f"{kind}.{name}"
        names += [f"{prefix}[{k}]" if n > 1 else prefix for k in range(n)]
    for s in range(layout.S):
        names += [f"initial[{s}][{k}]" for k in range(layout.nz)]
    return names


def _weakest(V, w, names) -> str:
    """The combination of coordinates along the smallest eigenvalue of the normalised ``J^T J``."""
    v = V[:, int(np.argmin(w))]
    idx = [i for i in np.argsort(-np.abs(v)) if abs(v[i]) > 0.2][:4]
    return "the combination " + " ".join(f"{v[i]:+.2f} {names[i]}" for i in idx)


def _block_length(r: np.ndarray, n: np.ndarray) -> int:
    """Lag (samples) where the residuals' mean autocorrelation first falls below 0.1, over
    each segment's ``n`` real samples (of the ``N`` padded ones of ``r (S, N, c)``)."""
    S, N, c = r.shape
    real = (np.arange(N)[None, :] < n[:, None])[:, :, None]
    mean = np.sum(np.where(real, r, 0), axis=1, keepdims=True) / n[:, None, None]
    x = np.where(real, r - mean, 0)
    var = np.sum(x * x, axis=1)  # (S, c)
    ok = var > 0
    if not np.any(ok):
        return 1
    cap = int(np.min(n)) // 4
    for lag in range(1, cap):
        ac = np.sum(x[:, lag:] * x[:, :-lag], axis=1)
        if np.mean(ac[ok] / var[ok]) < 0.1:
            return lag
    return max(1, cap)


def _pad(a: np.ndarray, N: int) -> np.ndarray:
    """``a (n, ...)`` followed by zeros to ``N`` rows."""
    a = np.asarray(a, float)
    return np.concatenate([a, np.zeros((N - len(a),) + a.shape[1:])])


def value_names(values: dict, sensor: list) -> list[str]:
    """The flattened values' names (``ProblemFit.names``): ``name`` or ``name[i]`` per model
    value, then ``sensor{k}.name`` or ``sensor{k}.name[i]`` per sensor value of observation k."""
    names = []
    for name, v in values.items():
        size = sum(int(np.size(a)) for a in jax.tree_util.tree_leaves(v))
        names += [f"{name}[{i}]" if size > 1 else name for i in range(size)]
    for k, d in enumerate(sensor):
        for name, v in d.items():
            size = int(np.size(v))
            names += [f"sensor{k}.{name}[{i}]" if size > 1 else f"sensor{k}.{name}" for i in range(size)]
    return names


def flat_values(layout, x):
    """The fitted values at ``x``, flattened in ``ProblemFit.names`` order: model values in
    the problem's insertion order (not ``tree_leaves``' sorted keys), then sensor values."""
    mv, sv = layout.values(x)
    vals = [v for v in mv.values()] + [v for d_ in sv for v in d_.values()]
    return jnp.concatenate([jnp.ravel(jnp.asarray(a)) for a in jax.tree_util.tree_leaves(vals)])


#: Jitted :func:`_values_and_jacobian` and :func:`flat_values_of` per problem structure
#: (:func:`rigidjax.identify._program_key._structure`).
_VALUE_PROGRAMS: dict = {}


def _kept(key, make):
    """The program kept under ``key``, made by ``make()`` where there is none (the oldest of 32
    dropped)."""
    if key not in _VALUE_PROGRAMS:
        if len(_VALUE_PROGRAMS) >= 32:
            _VALUE_PROGRAMS.pop(next(iter(_VALUE_PROGRAMS)))
        _VALUE_PROGRAMS[key] = make()
    return _VALUE_PROGRAMS[key]


def flat_values_of(problem, layout, dtype):
    """``v(x) -> (V,)``: :func:`flat_values` of ``problem`` jitted once per problem structure
    (op by op ~1.6 ms a call; the step check's shift takes two per fitted problem)."""
    key = _structure(problem, layout, dtype, jacobian="flat")
    f = lambda x: flat_values(layout, x)  # noqa: E731
    f = f if key is None else _kept(key, lambda: jax.jit(f))
    np_dtype = np.dtype(jnp.dtype(dtype).name)
    return lambda x: f(np.asarray(x, np_dtype))


def _values_and_jacobian(problem, layout, dtype):
    """``f(x) -> (model values, sensor values, d flat_values / d x_global, model)``, jitted
    once per problem structure (problems of one structure differ only in data and start
    values, which enter the transforms through their shapes). Run op by op instead, it took
    ~23 ms per fitted problem, most of a 69-window ``fit_many``'s result building."""

    def f(x):
        ng = layout.n_global
        Tv = jax.jacfwd(lambda xg: flat_values(layout, jnp.concatenate([xg, x[ng:]])))(x[:ng])
        mv, sv = layout.values(x)
        # lists: a dict leaving jit comes back with its keys sorted, not in the problem's order;
        # the model as its leaves (a stored program returns no custom pytree nodes)
        return list(mv.values()), [list(d.values()) for d in sv], Tv, jax.tree_util.tree_leaves(layout.model(x))

    key = _structure(problem, layout, dtype, jacobian="values")

    def make():
        stable = _stable_key(problem, layout, dtype, "values")
        return jax.jit(f) if stable is None else stored(jax.jit(f), ("identify.values", stable))

    run = f if key is None else _kept(key, make)
    model_tree = jax.tree_util.tree_structure(problem.model)
    model_names = [name for kind, name, *_ in layout.slots if kind == "model"]
    sensor_names = [
        [name for kind, name, *_ in layout.slots if kind == f"sensor{i}"] for i in range(len(problem.observations))
    ]

    def values_and_jacobian(x):
        mv, sv, Tv, model = run(x)
        return (
            dict(zip(model_names, mv)),
            [dict(zip(names, d)) for names, d in zip(sensor_names, sv)],
            Tv,
            jax.tree_util.tree_unflatten(model_tree, model),
        )

    return values_and_jacobian


def held_at_bounds(layout, x, g) -> list[str]:
    """``"name (Transform coordinate k) = bound (lower|upper bound)"`` for each coordinate the
    optimiser holds at a bound at ``x`` (gradient ``g`` pointing out of the box, as
    :mod:`rigidjax.identify._lm`'s active set): the bound is on the transform's coordinate,
    not on the value (e.g. ``MomentRatios``' ``u = 1``: the edge ``Iz = Ix + Iy``), and where
    the transform names what lies beyond (its ``beyond``), ``"...; beyond it Iz > Ix + Iy)"``."""
    lo_, hi_ = (x <= layout.lo) & (g > 0), (x >= layout.hi) & (g < 0)
    out = []
    for i in np.flatnonzero(lo_ | hi_):
        for kind, name, tr, _, off, n in layout.slots:
            if off <= i < off + n:
                label = name if kind == "model" else f"{kind}.{name}"
                k = f" {i - off}" if n > 1 else ""
                side = "lower" if lo_[i] else "upper"
                past = getattr(tr, "beyond", {}).get((i - off, side))
                out.append(
                    f"{label} ({type(tr).__name__} coordinate{k}) = {x[i]:.6g} ({side} bound"
                    + (f"; beyond it {past})" if past else ")")
                )
    return out


def result(problem, layout, stacked, run, x, st, b, at_best, starts, dtype, sigma_rule: bool = True) -> ProblemFit:
    """The :class:`ProblemFit` of the best start ``b`` of the optimiser's state ``st``
    (``stacked``: the padded segments; padded samples enter no count or statistic).
    ``sigma_rule=False``: no ``poor_fit`` from the residual against the stated sigma (windows
    of one body are judged against each other instead: :mod:`rigidjax.identify._across`)."""
    xj = jnp.asarray(x, dtype)
    r, status, J = run(np.asarray(x)[None])
    S, P = layout.S, layout.P
    n = stacked.n
    N = int(stacked.t.shape[1])
    r, ok, J = r[0].reshape(S, N, -1), status[0] == Status.SUCCESS, J[0].reshape(S, N, -1, P)
    real = np.broadcast_to((np.arange(N)[None, :] < n[:, None])[:, :, None], r.shape)
    Jf = J.reshape(-1, P)
    rf = r.reshape(-1)
    live = (np.any(Jf != 0, axis=1) | (rf != 0)) & real.reshape(-1)
    m = int(np.sum(live))
    A = Jf.T @ Jf
    rss = float(rf @ rf)
    dof = m - P
    # fewer than two measured values per unknown: no standard error means anything (a perfect
    # fit of 9 values by 5 unknowns reported errors of 0 as if the values were fixed)
    s2 = rss / dof if dof >= P else float("nan")
    d = np.sqrt(np.maximum(np.diag(A), 1e-300))
    An = A / d[:, None] / d[None, :]
    finite = bool(np.all(np.isfinite(An)))
    w, V = np.linalg.eigh(np.where(np.isfinite(An), An, 0))
    null = (w <= 1e-12 * max(w.max(), 1e-300)) | (not finite)
    cond = float(w.max() / max(w.min(), 1e-300))
    # the pseudo-inverse on the determined directions; coordinates with a part in the null
    # space are undetermined (infinite error), the others keep finite errors
    Ainv = (V[:, ~null] / w[~null]) @ V[:, ~null].T / d[:, None] / d[None, :]
    undetermined = np.sum(V[:, null] ** 2, axis=1) > 1e-8
    singular = bool(np.any(null)) or not np.isfinite(s2)
    cov_classic = s2 * Ainv if np.isfinite(s2) else np.full((P, P), np.nan)
    L = _block_length(r, n)
    scores = []
    for s in range(S):
        for i in range(0, int(n[s]), L):
            Jb = J[s, i : i + L].reshape(-1, P)
            scores.append(Jb.T @ r[s, i : i + L].reshape(-1))
    G = np.einsum("bi,bj->ij", np.array(scores), np.array(scores))
    cov_hac = Ainv @ G @ Ainv * (m / dof if dof > 0 else np.nan)
    # the larger variance per coordinate, correlations of the classical estimate
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.diag(cov_hac) / np.diag(cov_classic)
    scale = np.sqrt(np.where(np.isfinite(ratio) & (ratio > 1), ratio, 1.0))
    cov = cov_classic * scale[:, None] * scale[None, :]
    names_x = _coordinate_names(layout)

    # values and their covariance (delta method through the transforms)
    ng = layout.n_global

    mv, sv, Tv, model = _values_and_jacobian(problem, layout, dtype)(xj)
    Tv = np.asarray(Tv, float)
    cov_v = Tv @ np.nan_to_num(cov[:ng, :ng]) @ Tv.T
    # a value that moves with an undetermined coordinate has no finite error (nor covariance)
    lost = (np.abs(Tv) @ undetermined[:ng].astype(float) > 0) | ~np.isfinite(s2)
    cov_v[lost, :] = np.inf
    cov_v[:, lost] = np.inf
    se_flat = np.sqrt(np.maximum(np.diag(cov_v), 0))
    # the classical covariance of the values and the initial-state unknowns together (the
    # initial states are unknowns themselves: identity); its diagonal gives se_classical
    V_ = Tv.shape[0]
    T = np.zeros((V_ + P - ng, P))
    T[:V_, :ng], T[V_:, ng:] = Tv, np.eye(P - ng)
    gone = np.concatenate([lost, undetermined[ng:] | ~np.isfinite(s2)])
    cov_all = T @ np.nan_to_num(cov_classic) @ T.T
    cov_all[gone, :] = np.inf
    cov_all[:, gone] = np.inf
    se_w_flat = np.sqrt(np.maximum(np.diag(cov_all)[:V_], 0))
    se_init = np.where(gone[V_:], np.inf, np.sqrt(np.maximum(np.diag(cov)[ng:], 0)))
    # each segment's share of the cost and its first-order influence on the values (the
    # clusters of a sandwich covariance; padded samples have r = 0 and J = 0)
    r_real = np.where(real, r, 0.0)
    segment_cost = 0.5 * np.sum(r_real**2, axis=(1, 2))
    g_seg = np.einsum("snkp,snk->sp", np.where(real[..., None], J, 0.0), r_real)
    influence = (T @ Ainv @ g_seg.T).T
    influence[:, gone] = np.nan
    values, se, se_classical, pos = {}, {}, {}, 0
    for name, v in mv.items():
        v = jax.tree_util.tree_map(np.asarray, v)
        values[name] = v
        sizes = [np.size(a) for a in jax.tree_util.tree_leaves(v)]
        for out, flat in ((se, se_flat), (se_classical, se_w_flat)):
            parts = np.split(flat[pos : pos + sum(sizes)], np.cumsum(sizes)[:-1])
            out[name] = jax.tree_util.tree_unflatten(
                jax.tree_util.tree_structure(v),
                [p.reshape(np.shape(a)) for p, a in zip(parts, jax.tree_util.tree_leaves(v))],
            )
        pos += sum(sizes)
    sensor, sensor_se = [], []
    for i, d_ in enumerate(sv):
        vals, ses = {}, {}
        for name, v in d_.items():
            v = np.asarray(v)
            vals[name] = v
            ses[name] = se_flat[pos : pos + v.size].reshape(v.shape)
            pos += v.size
        sensor.append(vals)
        sensor_se.append(ses)

    names = value_names(values, sensor)

    # the verdicts of fit_inertia on any problem: an optimum held at a bound of a transform's
    # box while the data ask for values beyond it, and a moment known only to more than its
    # transform's relative_se_max by the cost's own curvature (the classical error, as
    # fit_inertia: whether the local model holds; the sandwich adds the model error)
    held = held_at_bounds(layout, np.asarray(x), Jf.T @ rf)
    push = 0.0
    if held and rss > 0:
        g = Jf.T @ rf
        push = min(float(g @ Ainv @ g) / rss, 1.0)  # the unconstrained step's share of the cost
    rel, limit = {}, np.inf  # value -> relative classical error, where the transform judges it
    for name, p in problem.parameters.items():
        if (lim := getattr(p.transform, "relative_se_max", None)) is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                r_ = np.ravel(np.asarray(se_classical[name]) / np.abs(np.asarray(values[name])))
            entries = getattr(p.transform, "relative_entries", range(r_.size))
            r_ = {k: r_[k] for k in entries}
            rel.update({f"{name}[{k}]" if np.size(values[name]) > 1 else name: float(v) for k, v in r_.items()})
            limit = min(limit, lim)
    vague = {k: v for k, v in rel.items() if not v <= limit}
    # a Positive value (exp(u)) whose coordinate fell by over 1e6x from its start heads for 0,
    # which it never reaches: more iterations do not help (QA: a drag with its optimum at 0
    # ended max_steps at 1.7e-16, the message said "raise max_steps")
    u0 = layout.start()
    to_zero = [
        name
        for kind, name, tr, _, off, n in layout.slots
        if kind == "model"
        and isinstance(tr, Positive)
        and np.any(np.asarray(x)[off : off + n] < u0[off : off + n] - np.log(1e6))
    ]
    heads_to_zero = (
        f"; {', '.join(to_zero)} heads for 0, which a Positive value (exp(u)) never reaches: "
        "transforms.Box(0, inf) holds a value at 0 exactly"
        if to_zero
        else ""
    )
    rods = [
        f"{name}: {why}"
        for kind, name, tr, _, off, n in layout.slots
        if kind == "model" and hasattr(tr, "degenerate") and (why := tr.degenerate(np.asarray(x)[off : off + n]))
    ]

    # per observation RMS in data units
    rms, col = [], 0
    for o in problem.observations:
        n_c = o.residual_size(data_width(problem, o))
        wt = np.asarray(stacked.weights[len(rms)])  # 0 at padded samples
        block = r[:, :, col : col + n_c] * o.sigma
        rms.append(float(np.sqrt(np.sum(block**2) / max(1, n_c * np.sum(wt > 0)))))
        col += n_c

    # the cost's round-off: a decrease the Gauss-Newton model still promises below it cannot be
    # verified in this precision (noise-free data fitted to the simulation's own accuracy)
    eps = float(jnp.finfo(dtype).eps)
    mag = np.concatenate(
        [
            np.stack([_pad(o.magnitude(data_of(problem, o, i)), N) for i in range(len(problem.segments))])
            for o in problem.observations
        ],
        -1,
    )
    resolution = float(np.sum(np.abs(r) * mag))
    lm_status = int(st["status"][b])
    decrement = float(st["opt"][b])
    rss_left = decrement * rss  # the decrease of the RSS the Gauss-Newton model still promises
    weak = _weakest(V, w, names_x)
    weakly = f"; the data barely determine {weak} (condition number {cond:.1e})" if cond > 1e10 else ""
    if not np.all(ok):
        status, msg = FitStatus.NONFINITE, "a rollout step failed at the best point"
    elif dof < P:
        status, msg = FitStatus.UNIDENTIFIABLE, f"too few measured values ({m}) for {P} unknowns (need >= {2 * P})"
    elif rods and lm_status in (_lm.LMStatus.CONVERGED, _lm.LMStatus.MAX_STEPS, _lm.LMStatus.STALLED):
        where = (
            "the least-squares minimum lies at"
            if lm_status == _lm.LMStatus.CONVERGED
            else f"the optimiser heads for ({'max_steps' if lm_status == _lm.LMStatus.MAX_STEPS else 'stalled'} after "
            f"{int(st['it'][b])} iterations)"
        )
        status, msg = (
            FitStatus.UNIDENTIFIABLE,
            f"{where} a degenerate, rod-like inertia ({'; '.join(rods)}): the data do not determine the inertia",
        )
    elif lm_status in (_lm.LMStatus.MAX_STEPS, _lm.LMStatus.STALLED) and (
        why := _verdict.flat(rss_left, s2, singular, rel, limit)
    ):
        ended = "max_steps" if lm_status == _lm.LMStatus.MAX_STEPS else "stalled"
        status, msg = (
            FitStatus.UNIDENTIFIABLE,
            f"the optimiser heads for a minimum the data do not determine ({ended} after {int(st['it'][b])} "
            f"iterations): {why}" + (f" (the data do not determine {weak})" if singular else ""),
        )
    elif lm_status == _lm.LMStatus.MAX_STEPS:
        status, msg = (
            FitStatus.MAX_STEPS,
            f"the iteration cap came first ({int(st['it'][b])} iterations)"
            + (heads_to_zero or weakly or " (raise max_steps)"),
        )
    elif lm_status == _lm.LMStatus.STALLED and decrement * 0.5 * rss > 10 * eps * resolution:
        status, msg = (
            FitStatus.STALLED,
            "no step lowers the cost, yet the point is not first-order optimal" + (heads_to_zero or weakly),
        )
    elif lm_status not in (_lm.LMStatus.CONVERGED, _lm.LMStatus.STALLED):
        status, msg = FitStatus.NONFINITE, "the best start could not be evaluated"
    elif singular:
        # the weakest direction, and every coordinate with a part in the null space (QA: a
        # steady spin leaves both ratios undetermined, the message named one)
        und = [names_x[i] for i in np.flatnonzero(undetermined)]
        listed = ", ".join(und[:8]) + (f" and {len(und) - 8} more" if len(und) > 8 else "")
        status, msg = (
            FitStatus.UNIDENTIFIABLE,
            f"J^T J is singular: the data do not determine {weak}"
            + (f"; undetermined (infinite standard errors): {listed}" if und else ""),
        )
    elif s2 > POOR_FIT_S2 and sigma_rule:
        status, msg = (
            FitStatus.POOR_FIT,
            f"the residuals are {np.sqrt(s2):.3g} times the stated sigma: the model does not describe the data "
            "(wrong units, e.g. deg/s or ms? a missing effect?) or sigma is too small",
        )
    elif push > _verdict.EDGE_PUSH:
        status, msg = (
            FitStatus.POOR_FIT,
            # the edge itself: the message's "held at a bound" (rigidjax.identify._problem_fit)
            "the data ask for values beyond the valid set: the minimum sits on its edge, "
            f"where a step without the bound would remove {100 * push:.0f} % of the residual sum of squares "
            "(a missing effect, wrong axes or units, or not this model)",
        )
    elif vague:
        status, msg = (
            FitStatus.UNIDENTIFIABLE,
            "the data determine "
            + ", ".join(f"{k} only to ±{100 * v:.0f} %" for k, v in vague.items())
            + f" (relative standard errors above {100 * limit:.0f} %: not determined; a longer recording or "
            "livelier motion)",
        )
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
        model=model,
        cost=0.5 * rss,
        rms=rms,
        covariance=cov_v,
        names=names,
        block=L,
        iterations=int(st["it"][b]),
        starts=starts,
        starts_at_best=at_best,
        decrement=decrement,
        substeps=problem.substeps,
        x=np.asarray(x),
        se_classical=se_classical,
        initial_se=se_init.reshape(layout.S, layout.nz),
        covariance_classical=cov_all,
        measured=m,
        segment_cost=segment_cost,
        segment_influence=influence,
    )
