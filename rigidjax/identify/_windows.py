"""Per-window inertia fits: the windows and their starts, the multi-start Levenberg-Marquardt
fits, the refit of suspect windows, the reported coordinates and each window's quality verdict.

Part of :func:`rigidjax.identify.fit_inertia` (module docstring of :mod:`rigidjax.identify._fit`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from ..io import Segment, load
from . import _lm
from ._derived import FitError, derived_jacobian, names, standard_errors
from ._model import (
    V_MAX,
    chart_theta,
    noise_and_signal,
    pad,
    pad_length,
    phys_theta,
    random_chart,
    reference_rms,
    simulate,
    theta_chart,
    theta_phys,
)
from ._across import RESCUE_KEEP, RESCUE_RANDOM, medoid, poor_reasons, suspects
from ._problems import Batch
from ._starts import window_starts
from ._verdict import REL_SE_MAX, degenerate, edge_push
from ._result import FitStatus

#: Fewer samples than this in a window: too few to determine inertia ratios (not fitted).
MIN_SAMPLES = 10
#: Signal (RMS of the rates about their mean) below this many times the noise: nothing to fit.
SNR_MIN = 5.0
#: Initial sub-steps: rotation per sub-step ``|omega| dt / k`` at most this (rad).
ROT_TARGET = 0.2
#: Most sub-steps per sample interval.
K_MAX = 64
#: Largest accepted shift of an estimate by the step error, in its standard errors.
SHIFT_MAX = 0.3
#: Largest accepted relative change of a window's residual RMS under the reference integrator.
REF_TOL = 0.10
#: Free flight: longest window (s) and most samples per window accepted by default.
MAX_DURATION = 10.0
MAX_SAMPLES = 20_000
#: Joint fits: a window is a poor fit if its residual under the shared inertia is above
#: ``JOINT_OWN`` times its own fit's and ``JOINT_MEDIAN`` times the median over the pooled
#: windows (and ``POOR_NOISE`` x its noise): model error alone leaves 1-4x its own residual.
JOINT_OWN, JOINT_MEDIAN = 5.0, 3.0
#: Rates above this (rad/s, ~8 rev/s) are beyond a hand throw (the racquet flips peak at
#: ~21 rad/s): such a window is refused, naming deg/s, unless ``max_rate`` is raised.
MAX_RATE = 50.0

_SEVERITY = (
    FitStatus.NONFINITE,
    FitStatus.MAX_STEPS,
    FitStatus.STALLED,
    FitStatus.INCONSISTENT,
    FitStatus.POOR_FIT,
    FitStatus.NOT_FREE,
    FitStatus.STEP_ERROR,
    FitStatus.UNIDENTIFIABLE,
    FitStatus.CONVERGED,
)
_LM_STATUS = {
    _lm.LMStatus.CONVERGED: FitStatus.CONVERGED,
    _lm.LMStatus.MAX_STEPS: FitStatus.MAX_STEPS,
    _lm.LMStatus.NONFINITE: FitStatus.NONFINITE,
    _lm.LMStatus.STALLED: FitStatus.STALLED,
}


def _as_segments(data) -> list[Segment]:
    if isinstance(data, Segment):
        return [data]
    if isinstance(data, (str, bytes)) or hasattr(data, "__fspath__"):
        return load(data)
    if isinstance(data, tuple) and len(data) == 2 and not isinstance(data[0], Segment):
        t, omega = data
        return [Segment(np.asarray(t, float), np.asarray(omega, float), name="window 0")]
    segs = list(data)
    if not segs:
        raise FitError("segments: no windows to fit (empty list)")
    for i, s in enumerate(segs):
        if not isinstance(s, Segment):
            raise FitError(f"segments[{i}]: expected a rigidjax.io.Segment; got {type(s).__name__}")
    return segs


def _label(s: Segment, i: int) -> str:
    return s.name or s.source or f"window {i}"


def _recording_labels(segs) -> list[str]:
    """A short name per window's recording: its source (the export folder for phyphox's
    ``Raw Data.csv``) relative to the folder all sources share."""
    from pathlib import PurePath

    paths = []
    for s in segs:
        p = PurePath(s.source) if s.source else PurePath("(no source)")
        paths.append(p.parent if p.name == "Raw Data.csv" else p)
    parts = [p.parts for p in paths]
    common = 0
    if len(set(paths)) > 1:
        while all(len(q) > common + 1 for q in parts) and len({q[common] for q in parts}) == 1:
            common += 1
    else:
        common = max(len(parts[0]) - 1, 0)
    return [str(PurePath(*q[common:])) if q[common:] else str(p) for q, p in zip(parts, paths)]


class _Run:
    """State shared by the stages of one fit."""

    def __init__(self, segs, spec, scale, *, seed, max_steps, phase1_steps, progress):
        self.segs = segs
        self.spec = spec
        self.scale = scale
        self.dtype = jnp.result_type(float)
        self.eps = float(np.finfo(self.dtype).eps)
        self.n_pad = pad_length(max(s.n for s in segs))
        self.data = pad(segs, self.n_pad, np.dtype(self.dtype))
        self.seed = seed
        self.max_steps = max_steps
        self.phase1_steps = phase1_steps
        self.progress = progress
        ns = [noise_and_signal(s.omega) for s in segs]
        self.noise = np.array([a for a, _ in ns])
        self.signal = np.array([b for _, b in ns])
        self.names = names(spec, scale)
        self.adapt = True

    def tick(self, n_active):
        if self.progress is not None:
            self.progress(n_active)

    def batch(self, k, seg_ids, groups, chart, R_ref=None):
        return Batch(self.spec, self.data, k, seg_ids, groups, chart=chart, R_ref=R_ref)

    def lm(self, batch, x0, rows, *, max_steps, state=None):
        lo, hi = batch.bounds(x0.shape[0]) if state is None else (None, None)
        return _lm.solve(
            batch.evaluate,
            x0,
            rows,
            lo,
            hi,
            eps=batch.eps,
            max_steps=max_steps,
            state=state,
            progress=self.tick,
        )


# ----------------------------------------------------------------------------- starts


def _full_x(run: _Run, shared: np.ndarray, windows: np.ndarray, *, bias=None, w0=None) -> np.ndarray:
    """Per-window problem vectors ``[shared | bias | omega0]`` (omega0: first sample by default)."""
    n = shared.shape[0]
    b = np.zeros((n, run.spec.n_bias)) if bias is None else bias
    w = np.stack([run.segs[i].omega[0] for i in windows]) if w0 is None else w0
    return np.concatenate([shared, b, w], 1)


# ----------------------------------------------------------------------------- per-window fits


def _best_per_window(st, windows_of_row, n_windows, *, prefer_converged: bool):
    """Index of the best row per window: the lowest cost (after a first phase), or converged
    before not, then the lowest cost (after runs to the end)."""
    cost = np.where(st["ok"], st["cost"], np.inf)
    if prefer_converged:
        cost = cost * np.where(st["status"] == _lm.LMStatus.CONVERGED, 1.0, 1e6)
    best = np.full(n_windows, -1)
    for w in range(n_windows):
        rows = np.flatnonzero(windows_of_row == w)
        if rows.size:
            best[w] = rows[np.argmin(cost[rows])]
    return best


def _fit_windows(run: _Run, wins: np.ndarray, k: np.ndarray, starts: int) -> dict:
    """Multi-start bounded LM of each window in ``wins``; returns per window the LM state
    (rows in the order of ``wins``) and its ``R_ref``."""
    rng = np.random.default_rng(run.seed)
    xs, Rs, owner = [], [], []
    for j, i in enumerate(wins):
        x, R = window_starts(run, i, starts, rng)
        xs.append(_full_x(run, x, np.full(len(x), i)))
        Rs.append(R)
        owner += [j] * len(x)
    x0, R_ref, owner = np.concatenate(xs), np.concatenate(Rs), np.array(owner)
    batch = run.batch(k, wins[owner][:, None], [0], "opt", R_ref)
    st = run.lm(batch, x0, np.arange(x0.shape[0]), max_steps=run.phase1_steps)
    best = _best_per_window(st, owner, len(wins), prefer_converged=False)
    keep = _lm.select(st, best)
    first = keep["it"].copy()
    batch = run.batch(k, wins[owner[best]][:, None], [0], "opt", R_ref[best])
    keep["rows"] = np.arange(len(wins))
    st = run.lm(batch, None, None, max_steps=run.max_steps, state=keep)
    st["R_ref"] = R_ref[best]
    # per window, the optimiser runs behind the reported point: (phase, iterations); the last
    # one's status is the window's (the message names it and the total). ``lost``: iterations
    # of a refit from other starts that ended no lower (not behind the reported point)
    st["phases"] = [[("multi-start", int(a)), ("main", int(b - a))] for a, b in zip(first, st["it"])]
    st["lost"] = np.zeros(len(wins), int)
    _rescue(run, wins, k, st)
    return st


def _medoid(theta: np.ndarray) -> np.ndarray:
    """The row of ``theta`` (model values, I_yy = 1) nearest the median in log ratios (a physical point)."""
    return theta[medoid(np.log(np.maximum(np.abs(theta[:, [0, 2]]), 1e-12)))]


def _rescue(run: _Run, wins: np.ndarray, k: np.ndarray, st: dict) -> None:
    """Refit the suspect windows (see module) IN PLACE of ``st`` where a refit ends lower."""
    spec = run.spec
    rms = np.sqrt(2 * st["cost"] / np.array([3.0 * run.segs[i].n for i in wins]))
    conv = st["ok"] & (st["status"] == _lm.LMStatus.CONVERGED)
    rms = np.where(st["ok"], rms, np.inf)
    suspect = suspects(rms, run.signal[wins], conv, [run.segs[i].source for i in wins])
    if not suspect.any():
        return
    bad = np.flatnonzero(suspect)
    good = np.flatnonzero(~suspect)
    theta_all, _ = chart_theta(st["x"][:, : spec.n_chart], st["R_ref"], spec)
    theta_all = theta_all / theta_all[:, 1:2]
    rng = np.random.default_rng(run.seed + 1)
    xs, Rs, owner = [], [], []
    for j in bad:
        i = wins[j]
        cands = []
        if good.size:
            cands.append(_medoid(theta_all[good]))
            same = good[[run.segs[wins[g]].source == run.segs[i].source for g in good]]
            if same.size:
                cands.append(_medoid(theta_all[same]))
        for th in cands:
            x, R = theta_chart(th, spec)
            for w0 in (run.segs[i].omega[0], st["x"][j, -3:]):
                xs.append(_full_x(run, x, np.array([i]), w0=w0[None]))
                Rs.append(R)
                owner.append(j)
        x, R = random_chart(rng, RESCUE_RANDOM, spec)
        xs.append(_full_x(run, x, np.full(RESCUE_RANDOM, i)))
        Rs.append(R)
        owner += [j] * RESCUE_RANDOM
    x0, R_ref, owner = np.concatenate(xs), np.concatenate(Rs), np.array(owner)
    batch = run.batch(k, wins[owner][:, None], [0], "opt", R_ref)
    r = run.lm(batch, x0, np.arange(x0.shape[0]), max_steps=run.phase1_steps)
    # the RESCUE_KEEP lowest-cost starts of each window continue to convergence
    cost = np.where(r["ok"], r["cost"], np.inf)
    cont = np.concatenate(
        [idx[np.argsort(cost[idx])[:RESCUE_KEEP]] for idx in (np.flatnonzero(owner == j) for j in bad)]
    )
    r = _lm.select(r, cont)
    first = r["it"].copy()
    owner, R_ref = owner[cont], R_ref[cont]
    r["rows"] = np.arange(cont.size)
    batch = run.batch(k, wins[owner][:, None], [0], "opt", R_ref)
    r = run.lm(batch, None, None, max_steps=run.max_steps, state=r)
    best = _best_per_window(r, owner, len(wins), prefer_converged=True)
    for j in bad:
        b = best[j]
        if b < 0 or not r["ok"][b]:
            continue
        better_status = (r["status"][b] == _lm.LMStatus.CONVERGED) or (st["status"][j] != _lm.LMStatus.CONVERGED)
        if (not st["ok"][j]) or (r["cost"][b] < st["cost"][j] and better_status):
            for key in ("x", "cost", "A", "g", "aux", "ok", "lam", "nu", "status", "opt", "lo", "hi", "floor"):
                st[key][j] = r[key][b]
            st["it"][j] += r["it"][b]
            st["R_ref"][j] = R_ref[b]
            st["phases"][j] = st["phases"][j] + [
                ("multi-start of the refit from other starts", int(first[b])),
                ("refit from other starts", int(r["it"][b] - first[b])),
            ]
        else:
            st["lost"][j] = int(r["it"][b])


# ----------------------------------------------------------------------------- reported coordinates


def _to_phys(run: _Run, st: dict) -> np.ndarray:
    """LM states in the optimiser's chart -> problem vectors in the reported coordinates."""
    spec = run.spec
    theta, _ = chart_theta(st["x"][:, : spec.n_chart], st.get("R_ref"), spec)
    return np.concatenate([theta_phys(theta, spec), st["x"][:, spec.n_chart :]], 1)


def _covariance(A, rss_total, m, p):
    """``(cov, s^2, singular)``: ``s^2 (J^T J)^-1`` with ``s^2 = RSS / (m - p)``."""
    dof = m - p
    s2 = rss_total / dof if dof > 0 else float("nan")
    d = np.sqrt(np.maximum(np.diag(A), 1e-300))
    An = A / d[:, None] / d[None, :]
    w = np.linalg.eigvalsh(An)
    if not np.all(np.isfinite(w)) or w.min() <= 1e-14 * w.max() or not np.isfinite(s2):
        return np.full_like(A, np.inf), s2, True
    return s2 * np.linalg.inv(An) / d[:, None] / d[None, :], s2, False


def _estimates(run: _Run, xp_sh: np.ndarray, cov_sh: np.ndarray):
    """Named estimates and standard errors of the reported shared coordinates."""
    v, J = derived_jacobian(xp_sh, run.spec, run.scale)
    se = standard_errors(J, cov_sh)
    return dict(zip(run.names, map(float, v))), dict(zip(run.names, map(float, se))), J


def _step_shift(run: _Run, batch: Batch, xp: np.ndarray, rows, k: np.ndarray, covs, s2s, Js, bias_names) -> tuple:
    """Richardson estimate of the step error of each problem at ``xp`` and the first-order
    shift it causes in every reported quantity, in standard errors.

    ``e = (w_k - w_2k) / (1 - 2^-2)`` (second order); the least-squares estimate moves by
    ``-(J^T J)^-1 J^T e``; ``J^T e`` comes from the fit's own evaluator with the data replaced
    by ``w_k + b - e``. Returns ``(shift_se dicts, step error RMS per window (na, S))``."""
    th, w0, bias, segs, _ = batch.lanes_of(xp, rows)
    dt = run.data[2][segs]
    kk = k[segs]
    w_k = simulate(run.spec, th, w0, dt, kk, run.dtype)
    w_2k = simulate(run.spec, th, w0, dt, 2 * kk, run.dtype)
    e = (w_k - w_2k) / 0.75
    weight = run.data[1][segs]
    ms = np.sum(weight, axis=1) * 3
    rms_e = np.sqrt(np.sum((e * weight[:, :, None]) ** 2, axis=(1, 2)) / np.maximum(ms, 1)).reshape(
        xp.shape[0], batch.S
    )
    fake = np.array(run.data[0], dtype=float)
    fake[segs] = w_k + bias[:, None, :] - e
    fb = Batch(
        run.spec,
        (fake.astype(run.data[0].dtype), run.data[1], run.data[2]),
        batch.k,
        batch.seg_ids,
        batch.groups,
        chart="phys",
    )
    _, _, g_e, _, _ = fb.evaluate(xp, rows)
    out = []
    for a in range(xp.shape[0]):
        cov, s2, J = covs[a], s2s[a], Js[a]
        if not (np.all(np.isfinite(cov)) and s2 > 0):
            out.append({})
            continue
        shift = -(cov @ g_e[a]) / s2
        se = standard_errors(J, cov[: batch.n_sh, : batch.n_sh])
        d = {}
        for name, j in zip(run.names, range(J.shape[0])):
            if np.isfinite(se[j]) and se[j] > 0:
                d[name] = float(J[j] @ shift[: batch.n_sh] / se[j])
        for name, idx in bias_names:
            e_ = math.sqrt(max(cov[idx, idx], 0.0))
            if e_ > 0:
                d[name] = float(shift[idx] / e_)
        out.append(d)
    return out, rms_e


def _initial_substeps(segs, fixed) -> np.ndarray:
    if fixed is not None:
        return np.full(len(segs), int(fixed), np.int32)
    k = []
    for s in segs:
        rot = float(np.max(np.linalg.norm(s.omega, axis=1)[:-1] * np.diff(s.t))) if s.n > 1 else 0.0
        k.append(min(K_MAX, 1 << max(0, math.ceil(math.log2(max(rot / ROT_TARGET, 1.0))))))
    return np.array(k, np.int32)


def _per_window(run: _Run, wins, k, starts, *, adapt: bool, reference_check: bool) -> dict:
    """Fit each window of ``wins`` alone (with sub-step adaptation); returns ``{i: row fields}``."""
    spec = run.spec
    out = {}
    if wins.size == 0:
        return out
    st = _fit_windows(run, wins, k, starts)
    bias_names = [(f"bias_{c}", spec.n_phys + a) for a, c in enumerate("xyz")] if spec.bias else []
    sub = np.arange(0)  # the windows refitted in the previous round
    for _round in range(8):
        xp = _to_phys(run, st)
        phy = run.batch(k, wins[:, None], [0], "phys")
        _, A_p, _, ok_p, rss_p = phy.evaluate(xp, np.arange(wins.size))
        covs, s2s, Js, ests, ses, sing = [], [], [], [], [], []
        for j, i in enumerate(wins):
            cov, s2, singular = _covariance(A_p[j], float(rss_p[j, 0]), 3 * run.segs[i].n, phy.P)
            est, se, J = _estimates(run, xp[j, : spec.n_phys], cov[: spec.n_phys, : spec.n_phys])
            covs.append(cov), s2s.append(s2), Js.append(J), ests.append(est), ses.append(se), sing.append(singular)
        shifts, rms_e = _step_shift(run, phy, xp, np.arange(wins.size), k, covs, s2s, Js, bias_names)
        worst = np.array([max((abs(v) for v in d.values()), default=0.0) for d in shifts])
        theta, _ = phys_theta(xp[:, : spec.n_phys], spec)
        w0 = xp[:, -3:]
        b = xp[:, spec.n_phys : spec.n_phys + spec.n_bias] if spec.bias else np.zeros((wins.size, 3))
        rms_all = np.sqrt(rss_p[:, 0] / np.array([3.0 * run.segs[i].n for i in wins]))
        if not reference_check:
            ref = np.full(wins.size, np.nan)
        elif _round == 0:
            ref = reference_rms([run.segs[i] for i in wins], theta, w0, b, spec)
        else:  # only the windows refitted in the previous round changed
            ref[sub] = reference_rms([run.segs[i] for i in wins[sub]], theta[sub], w0[sub], b[sub], spec)
        ref_bad = reference_check & ~(np.abs(ref - rms_all) <= REF_TOL * rms_all)
        need = adapt & ((worst > SHIFT_MAX) | ref_bad) & (k[wins] < K_MAX) & st["ok"]
        if not need.any():
            break
        # finer sub-steps for those windows; continue from the current estimate (the cost
        # changes with k: a fresh iteration from the current point)
        k[wins[need]] = np.minimum(2 * k[wins[need]], K_MAX)
        sub = np.flatnonzero(need)
        batch = run.batch(k, wins[sub][:, None], [0], "opt", st["R_ref"][sub])
        part = run.lm(batch, st["x"][sub], np.arange(sub.size), max_steps=run.max_steps)
        for jj, n_it in zip(sub, part["it"]):
            st["phases"][jj] = st["phases"][jj] + [(f"refit at {k[wins[jj]]} sub-steps", int(n_it))]
        part["it"] += st["it"][sub]
        for key in ("x", "cost", "A", "g", "aux", "ok", "lam", "nu", "status", "opt", "it", "lo", "hi", "floor"):
            st[key][sub] = part[key]
    for j, i in enumerate(wins):
        rms = float(np.sqrt(rss_p[j, 0] / (3 * run.segs[i].n)))
        status = _LM_STATUS[_lm.LMStatus(int(st["status"][j]))] if (st["ok"][j] and ok_p[j]) else FitStatus.NONFINITE
        phases = st["phases"][j]
        reason = {
            FitStatus.CONVERGED: "",
            FitStatus.MAX_STEPS: (
                f"no first-order optimum: the optimiser's last run ({phases[-1][0]}) used up its max_steps="
                f"{run.max_steps} iterations; {int(st['it'][j])} iterations to this point ("
                + " + ".join(f"{n_} {name}" for name, n_ in phases)
                + ")"
                + (f"; a refit from other starts ended no lower ({st['lost'][j]} iterations)" if st["lost"][j] else "")
                + " (raise max_steps)"
            ),
            FitStatus.STALLED: (
                f"the optimiser stopped short of first-order optimality (relative decrement {st['opt'][j]:.2g})"
            ),
            FitStatus.NONFINITE: "the simulation gave NaN or inf",
        }[status]
        rel = [ses[j][key] / abs(ests[j][key]) if ests[j][key] else np.inf for key in ("Ix/Iy", "Iz/Iy")]
        if status in (FitStatus.CONVERGED, FitStatus.STALLED) and st["x"][j, 1] >= V_MAX:
            status = FitStatus.UNIDENTIFIABLE
            reason = (
                f"the least-squares minimum lies at a degenerate, rod-like inertia (a ratio beyond {V_MAX:g}, the edge "
                "of the search): the data do not determine the inertia"
            )
        elif status in (FitStatus.MAX_STEPS, FitStatus.STALLED) and (why := degenerate(st, j, s2s[j], sing[j], rel)):
            reason = (
                f"the optimiser heads for a degenerate minimum ({status.value} after {int(st['it'][j])} iterations): "
                f"{why}: the data do not determine the inertia"
            )
            status = FitStatus.UNIDENTIFIABLE
        elif status == FitStatus.CONVERGED and (push := edge_push(spec, st, j)) is not None:
            status = FitStatus.POOR_FIT
            reason = (
                f"the data ask for {push[0]}, beyond the physically valid set: the least-squares minimum sits on its "
                f"edge and an unconstrained step would remove {100 * push[1]:.0f} % of the residual (not free flight, "
                "wrong axes or units, or not a rigid body)"
            )
        elif status == FitStatus.CONVERGED and (sing[j] or max(rel) > REL_SE_MAX):
            status = FitStatus.UNIDENTIFIABLE
            reason = (
                "singular normal equations: the data do not determine the inertia ratios"
                if sing[j]
                else f"the data determine Ix/Iy and Iz/Iy only to ±{100 * rel[0]:.0f} % and ±{100 * rel[1]:.0f} %"
            )
        if status == FitStatus.CONVERGED and reference_check and not (abs(ref[j] - rms) <= REF_TOL * rms):
            status = FitStatus.STEP_ERROR
            reason = (
                f"re-simulated by DOP853 the residual is {ref[j]:.3g} rad/s against the fit's {rms:.3g}: the step "
                f"error ({k[i]} sub-steps) shapes this fit (raise substeps)"
            )
        row = dict(
            status=status,
            reason=reason,
            rms=rms,
            rms_reference=float(ref[j]),
            iterations=int(st["it"][j]),
            optimality=float(st["opt"][j]),
            omega0=w0[j].tolist(),
            omega0_se=np.sqrt(np.maximum(np.diag(covs[j])[-3:], 0)).tolist(),
            estimates=ests[j],
            se=ses[j],
            step_shift_se=shifts[j],
            step_error_rms=float(rms_e[j, 0]),
            _theta=theta[j],
            _w0=w0[j],
            _bias=b[j],
            _xp=xp[j],
            _cov=covs[j],
            _J=Js[j],
        )
        if spec.bias:
            row["bias"] = b[j].tolist()
            row["bias_se"] = np.sqrt(np.maximum(np.diag(covs[j])[spec.n_phys : spec.n_phys + 3], 0)).tolist()
        out[i] = row
    return out


def _quality(run: _Run, rows, fitted) -> None:
    """The poor-fit rule of :mod:`rigidjax.identify._across`, IN PLACE on ``rows`` (over the
    windows fitted to their minimum; the median over the windows of the same recording where
    it has at least 3, else over all)."""
    conv = [
        i for i in fitted if rows[i]["status"] in (FitStatus.CONVERGED, FitStatus.STEP_ERROR, FitStatus.UNIDENTIFIABLE)
    ]
    if not conv:
        return
    why = poor_reasons(
        [rows[i]["rms"] for i in conv],
        run.signal[conv],
        run.noise[conv],
        [rows[i]["source"] for i in conv],
        unit="rad/s",
        cause="a wrong basin, or not free flight",
    )
    for i, reason in zip(conv, why):
        if reason is not None:
            rows[i]["status"], rows[i]["reason"] = FitStatus.POOR_FIT, reason


def _overall(rows, excluded: dict, extra: list[str] = ()) -> tuple[FitStatus, str]:
    counts = {}
    for r in rows:
        counts.setdefault(r["status"], []).append(r["name"])
    parts = []
    for st_ in _SEVERITY[:-1]:
        if st_ in counts and st_ != FitStatus.INCONSISTENT:
            parts.append(f"{len(counts[st_])} of {len(rows)} window(s) {st_.value}")
    if excluded:
        parts.append(f"{len(excluded)} recording(s) not pooled (inconsistent): " + "; ".join(excluded))
    parts += list(extra)
    present = [s for s in _SEVERITY if s in counts or (s == FitStatus.INCONSISTENT and excluded)]
    status = present[0] if present else FitStatus.UNIDENTIFIABLE
    if status == FitStatus.CONVERGED:
        return status, f"every window converged to its least-squares minimum ({len(rows)} window(s))"
    return status, "; ".join(parts) + " (left out of the combined estimate)"
