"""Pooling windows: the combination of per-window estimates, the recordings' check by their
own joint fits (:func:`_recordings_agree`), and the joint fit of shared inertia (one problem
of the identification layer, :func:`~rigidjax.identify.recipes._shared_problem`: a segment
per window, a gyroscope bias per recording; its total error the cluster sandwich of the
windows' ``ProblemFit.segment_influence``). The proof by search that a fit reached its
minimum is :func:`rigidjax.identify._search.multistart_check`.

Part of :func:`rigidjax.identify.fit_inertia` (module docstring of :mod:`rigidjax.identify._fit`).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import special

from . import _combine
from ._derived import FitError, lower_bound
from ._model import (
    equation_error_guess,
    phys_theta,
    reference_rms,
)
from ._across import POOR_NOISE
from ._verdict import REL_SE_MAX
from . import recipes
from ._problem_fit import _fit
from ._window_fits import SECOND_ORDER, _in_our_names, _shift_se, start_vector
from .problem import _Layout
from ._problem_result import ProblemFit
from ._result import FitStatus, InertiaFit
from ._windows import (
    JOINT_MEDIAN,
    JOINT_OWN,
    REF_TOL,
    _Run,
    _estimates,
    _medoid,
    _overall,
)


def _combine_windows(run: _Run, rows, pool: str) -> InertiaFit:
    """Per-window mode: consistency, the median and its intervals."""
    spec = run.spec
    conv = [i for i, r in enumerate(rows) if r["status"] == FitStatus.CONVERGED]
    keys = ["Ix/Iy", "Iz/Iy"]
    by_src, err_src = {}, {}
    for i in conv:
        by_src.setdefault(rows[i]["recording"], []).append([rows[i]["estimates"][k_] for k_ in keys])
        err_src.setdefault(rows[i]["recording"], []).append([rows[i]["se"][k_] for k_ in keys])
    main, excluded, summaries = _combine.consistency(
        {s: np.array(v) for s, v in by_src.items()}, keys, {s: np.array(v) for s, v in err_src.items()}
    )
    if pool == "all":
        main, excluded = list(by_src), {}
    for i in conv:
        if rows[i]["recording"] not in main:
            rows[i]["status"] = FitStatus.INCONSISTENT
            rows[i]["reason"] = "recording not pooled: " + excluded.get(rows[i]["recording"], "")
    pooled = [i for i in conv if rows[i]["recording"] in main]
    est, se_stat, se_tot, intervals = {}, {}, {}, {}
    method = ""
    if len(pooled) == 1:
        r = rows[pooled[0]]
        est, se_stat = dict(r["estimates"]), dict(r["se"])
        se_tot = {k_: float("nan") for k_ in est}
        intervals = {k_: (float("nan"), float("nan")) for k_ in est}
    elif pooled:
        for name in run.names:
            v = np.array([rows[i]["estimates"][name] for i in pooled])
            e = np.array([rows[i]["se"][name] for i in pooled])
            est[name] = float(np.median(v))
            se_stat[name] = _combine.median_se_stat(e)
            lo, hi, _, method = _combine.window_interval(v)
            intervals[name] = (max(lo, lower_bound(name)), hi)  # never beyond the physically possible
            se_tot[name] = (hi - lo) / (2 * 1.959964)
    status, message = _overall(rows, excluded)
    m_tot = sum(3 * run.segs[i].n for i in pooled)
    rms = (
        float(np.sqrt(sum(rows[i]["rms"] ** 2 * 3 * run.segs[i].n for i in pooled) / m_tot)) if pooled else float("nan")
    )
    shifts = [r["step_shift_se"] for r in rows if r.get("step_shift_se")]
    worst = {}
    for d in shifts:
        for k_, v_ in d.items():
            if abs(v_) > abs(worst.get(k_, 0.0)):
                worst[k_] = v_
    fitted = [r for r in rows if "step_error_rms" in r]
    m_f = sum(3 * r["n"] for r in fitted)
    step_error = {
        "substeps": [int(r["substeps"]) for r in rows],
        "rms": float(np.sqrt(sum(r["step_error_rms"] ** 2 * 3 * r["n"] for r in fitted) / m_f)) if m_f else 0.0,
        "shift_se": worst,
        "max_shift_se": max((abs(v_) for v_ in worst.values()), default=0.0),
    }
    combined = {
        "n": len(pooled),
        "windows": pooled,
        "sources": list(main) if pooled else [],
        "excluded": excluded,
        "method": method,
        "by_source": summaries,
        "pool": pool,
    }
    model = {
        "spec": spec,
        "theta": [r.get("_theta", np.full(spec.n_theta, np.nan)) for r in rows],
        "omega0": [r.get("_w0", np.full(3, np.nan)) for r in rows],
        "bias": [r.get("_bias", np.zeros(3)) for r in rows],
        "substeps": [int(r["substeps"]) for r in rows],
        # each window's fitted vector in the reported coordinates and its Gauss-Newton
        # covariance (shared, bias, omega0), for InertiaFit.to_dict's covariance and tensor
        "xp": [r.get("_xp") for r in rows],
        "cov": [r.get("_cov") for r in rows],
    }
    res = InertiaFit(
        mode="per-window",
        options={},
        status=status,
        message=message,
        estimates=est,
        uncertainties=se_stat,
        total_uncertainties=se_tot,
        intervals=intervals,
        segments=rows,
        combined=combined,
        rms=rms,
        step_error=step_error,
        _model=model,
    )
    for r in rows:
        for key in [k_ for k_ in r if k_.startswith("_")]:
            r.pop(key)
    return res


#: Rounds of leaving out windows the shared inertia does not explain (each followed by a refit
#: without them).
JOINT_ROUNDS = 3


def _joint_starts(run: _Run, pooled, theta_w, n: int) -> list[np.ndarray]:
    """Shared model values to start a joint fit from: the median of the windows' estimates,
    the medoid window's, the joint equation-error estimate."""
    spec = run.spec
    cands = [np.median(theta_w, 0), _medoid(theta_w)]
    g = equation_error_guess([run.segs[i] for i in pooled], spec)
    if g is not None:
        cands.append(g)
    return cands[: max(1, n)]


#: Windows a recording needs for its own cluster error in :func:`_recordings_agree`; one
#: with fewer borrows the other recordings' ratio of total to statistical error.
RECORDING_WINDOWS = 3

#: Recordings of one body whose windows are fitted jointly may differ by more than their
#: errors (model error that changes between sessions: a phone re-mounted, another throw
#: style): on the racquet round 3's two recordings differ by 13 % without a bias (tensor
#: model, errors ~3 %), round 2 and round 3 by up to 34 % with tensor + drag + bias (errors
#: 3-9 %). The recordings' check never separates recordings closer than this (relative).
RECORDING_REL_AGREE = 0.25

#: The ratios on which recordings are compared.
_RATIOS = ("Ix/Iy", "Iz/Iy")


def _recordings_agree(run: _Run, rows, model: dict, pooled, k, starts: int, before: dict) -> tuple[dict | None, dict]:
    """Which recordings a joint fit in a model with a gyroscope bias may pool: each
    recording's windows ``pooled`` (those whose own fit converged or was unidentifiable)
    fitted jointly alone (one body, its own bias: :func:`_shared_fit`, no leaving out, no
    step check), its ratios compared with the other recordings' by
    :func:`~rigidjax.identify._combine.agreement_groups` on their total errors: the cluster
    sandwich over its S windows widened by ``t_0.975(S - 1) / z_0.975``, at least the
    statistical error; with fewer than :data:`RECORDING_WINDOWS` windows its statistical
    error times the median ratio of total to statistical error of the recordings that have
    that many (none: the check cannot judge).

    With a bias per window, the window's own bias absorbs much of a wrong inertia: the
    windows' estimates scatter too widely for the per-window check
    (:func:`~rigidjax.identify._combine.consistency`) to separate bodies, and what it pools
    is arbitrary, while a recording's windows share one bias and pin it down. On the racquet
    rounds with a bias the per-window check pooled round 1 (a phone, Ix/Iy ~ 3.8) with the
    racquet (~ 13.7), or, choosing among groups that agree pairwise, round 1 without round
    2; the recordings' joint fits give 3.80 +- 0.07 (round 1) and 13.6-14.1 +- 0.7-1.5 (the
    racquet), so this check replaces the per-window one where it can judge. Without a bias
    the windows separate bodies well, and recordings of one body differ by more than their
    joint fits' errors (round 3's two recordings: 14.35 +- 0.36 and 12.68 +- 0.37 with a
    tensor), so there it does not run (it would cost a joint fit per recording: 12 s of
    compilation on the 69 flips). Two recordings closer than
    :data:`RECORDING_REL_AGREE` always agree; without the widening, round 2's five windows
    (16.8 +- 1.5 in the tensor + drag + bias model) were left out against round 3's 12.5 +-
    0.4 and 11.1 +- 0.6. A recording whose joint fit determines nothing (it did not
    converge, or a ratio's statistical or total error exceeds ``REL_SE_MAX``, 50 %) keeps
    the per-window verdict ``before`` (recording -> why it was left out); else it agrees
    with every other.

    Returns:
        ``(excluded, by_recording)``: ``excluded`` ``{recording: why}``, or ``None`` where
        the check cannot judge (fewer than two recordings, or none with
        :data:`RECORDING_WINDOWS` windows and a determined joint fit); ``by_recording``
        ``{recording: {"n": windows, "status": its joint fit's, "judged": whether it
        determines its ratios, and where they are finite "Ix/Iy" and "Iz/Iy": {"value",
        "total_se"}}}``.
    """
    spec = run.spec
    by_src = {}
    for i in pooled:
        by_src.setdefault(rows[i]["recording"], []).append(i)
    if len(by_src) < 2:
        return None, {}
    theta_all = np.array(model["theta"])
    logs, stat, tot, summary = {}, {}, {}, {}
    for src, idx in by_src.items():
        good = [i for i in idx if rows[i]["status"] == FitStatus.CONVERGED] or idx
        f = _shared_fit(run, model, idx, [0] * len(idx), k, _joint_starts(run, idx, theta_all[good], starts))
        xp = np.concatenate([np.ravel(f.values["ratios"]), np.ravel(f.values.get("drag", []))])
        cov = np.asarray(f.covariance_classical, float)[: spec.n_phys, : spec.n_phys]
        est, se, J = _estimates(run, xp, cov)
        pick = [run.names.index(n_) for n_ in _RATIOS]
        v, s_ = np.array([est[n_] for n_ in _RATIOS]), np.array([se[n_] for n_ in _RATIOS])
        determined = (
            f.status in (FitStatus.CONVERGED, FitStatus.UNIDENTIFIABLE)
            and np.all(np.isfinite(v) & (v > 0) & np.isfinite(s_) & (s_ > 0))
            and np.max(s_ / np.abs(v)) <= REL_SE_MAX
        )
        summary[src] = {"status": f.status.value, "n": len(idx)}
        if not determined:
            continue
        logs[src], stat[src] = np.log(v), s_ / v
        if len(idx) >= RECORDING_WINDOWS:
            # the sandwich over few windows is itself uncertain: widened to Student t's
            # quantile at the windows' number less one
            widen = special.stdtrit(len(idx) - 1.0, 0.975) / special.ndtri(0.975)
            sandwich = _combine.cluster_sandwich(f, J, spec.n_phys, spec.n_phys)[1]
            tot[src] = np.fmax(sandwich[pick] * widen / v, stat[src])
    if not tot:  # no recording can say how far model error moves its estimate
        return None, summary
    inflate = np.median(np.stack([tot[s_] / stat[s_] for s_ in tot]), 0)
    spread = {s_: tot.get(s_, stat[s_] * inflate) for s_ in logs}
    for s_ in logs:
        summary[s_].update(
            {
                n_: {"value": float(np.exp(logs[s_][j])), "total_se": float(np.exp(logs[s_][j]) * spread[s_][j])}
                for j, n_ in enumerate(_RATIOS)
            }
        )
    # a total error above REL_SE_MAX (e.g. borrowed by a recording of two windows from one of
    # three, widened by t_0.975(2)) determines nothing: such a recording would agree with any
    # body (QA: a racquet recording pooled with a phone's, neither named)
    for s_ in [s_ for s_ in logs if np.max(spread[s_]) > REL_SE_MAX]:
        del logs[s_]
    summary.update({s_: dict(summary[s_], judged=s_ in logs) for s_ in summary})
    spread.update({s_: np.full(len(_RATIOS), np.inf) for s_ in by_src if s_ not in logs})
    values = {s_: logs.get(s_, np.zeros(len(_RATIOS))) for s_ in by_src}
    main, apart, ties = _combine.agreement_groups(
        values, spread, {s_: len(idx) for s_, idx in by_src.items()}, rel=RECORDING_REL_AGREE
    )
    ref = np.median(np.stack([logs[s_] for s_ in main if s_ in logs]), 0) if any(s_ in logs for s_ in main) else None
    excluded = {
        s_: f"{before[s_]} (its windows fitted jointly do not determine the ratios: {_undetermined(summary[s_])})"
        for s_ in by_src
        if s_ not in logs and s_ in before
    }
    for s_ in by_src:
        if s_ in main:
            continue
        parts = ", ".join(f"{n_} {summary[s_][n_]['value']:.4g} +- {summary[s_][n_]['total_se']:.2g}" for n_ in _RATIOS)
        there = ", ".join(f"{n_} {np.exp(ref[j]):.4g}" for j, n_ in enumerate(_RATIOS))
        excluded[s_] = (
            f"its {len(by_src[s_])} window(s) fitted jointly give {parts}; the pooled recordings give {there} "
            f"({_combine._apart(apart[s_], main)} by more than {_combine.Z_AGREE:g}x the combined total errors and "
            f"{RECORDING_REL_AGREE:.0%}): a different body or mounting?"
        ) + _combine.tie_note(s_, ties)
    return excluded, summary


def _undetermined(summary: dict) -> str:
    """Why a recording's joint fit (its ``by_recording`` entry) determines nothing, in words."""
    if summary["status"] != FitStatus.CONVERGED.value:
        return f"its fit ended {summary['status']}"
    if _RATIOS[0] not in summary:
        return f"a statistical error above {REL_SE_MAX:.0%} of the value"
    worst = max(summary[n_]["total_se"] / summary[n_]["value"] for n_ in _RATIOS)
    return f"total error {worst:.0%} of the value, above {REL_SE_MAX:.0%}"


def _joint(run: _Run, rows, per: InertiaFit, k, pool, *, reference_check: bool, starts: int) -> InertiaFit:
    """Joint mode: the pooled windows with one shared inertia (see the module and
    :mod:`rigidjax.identify._fit`), at most :data:`JOINT_ROUNDS` rounds of leaving out windows
    the shared body does not explain, the last fit with the layer's step-error check.

    Pooled: the windows whose own fit reached its minimum, including those that alone could
    not determine the ratios (a joint fit may), of the recordings that agree: in a model with
    a gyroscope bias as the recordings' check (:func:`_recordings_agree`) judges where it
    can, else as the per-window check (:func:`_combine_windows`) does; ``pool="all"``: every
    recording (with a bias the recordings' check is reported in ``combined["by_recording"]``,
    not applied).
    Each row keeps its own fit under ``own`` (status, rms, estimates, se) and reports the
    joint fit's residual, status and bias."""
    spec = run.spec
    before = dict(per.combined.get("excluded") or {})  # the per-window check's verdict
    for r in rows:
        if r["status"] == FitStatus.INCONSISTENT:  # its own fit converged; its recording was not pooled
            r["status"], r["reason"] = FitStatus.CONVERGED, ""
        r["own"] = {key: r.get(key) for key in ("status", "reason", "rms", "estimates", "se", "substeps")}
    determined = FitStatus.CONVERGED, FitStatus.UNIDENTIFIABLE
    pooled = [i for i, r in enumerate(rows) if r["status"] in determined and r.get("estimates")]
    verdict, by_recording = None, {}
    if spec.bias:  # without a bias the windows separate bodies (see _recordings_agree)
        verdict, by_recording = _recordings_agree(run, rows, per._model, pooled, k, starts, before)
    excluded = verdict if pool != "all" and verdict is not None else before
    for i in pooled:
        if rows[i]["recording"] in excluded:
            rows[i]["status"] = FitStatus.INCONSISTENT
            rows[i]["reason"] = "recording not pooled: " + excluded[rows[i]["recording"]]
    pooled = [i for i in pooled if rows[i]["recording"] not in excluded]
    base = dict(
        mode="joint",
        options={},
        estimates={},
        uncertainties={},
        total_uncertainties={},
        intervals={},
        segments=rows,
        rms=float("nan"),
        step_error=per.step_error,
        _model=per._model,
    )
    if not pooled:
        status, message = _overall(rows, excluded, ["no window left to pool"])
        return InertiaFit(
            status=status,
            message=message,
            combined=dict(per.combined, n=0, excluded=excluded, by_recording=by_recording),
            **base,
        )
    theta_all = np.array(per._model["theta"])
    excluded_joint = []
    for attempt in range(JOINT_ROUNDS + 1):
        S = len(pooled)
        sources = sorted({rows[i]["recording"] for i in pooled})
        groups = [sources.index(rows[i]["recording"]) for i in pooled] if spec.bias else [0] * S
        G = max(groups) + 1
        m = 3 * sum(run.segs[i].n for i in pooled)
        p = spec.n_phys + G * spec.n_bias + 3 * S
        if m <= p:
            raise FitError(f"joint fit: {m} measured values cannot determine its {p} parameters")
        good = [i for i in pooled if rows[i]["status"] == FitStatus.CONVERGED] or pooled
        f = _shared_fit(run, per._model, pooled, groups, k, _joint_starts(run, pooled, theta_all[good], starts))
        rms_w = np.sqrt(2 * f.segment_cost / np.array([3.0 * run.segs[i].n for i in pooled]))
        med = float(np.median(rms_w))
        # far above the window's own fit and the other windows' (a wrong basin, or a body the
        # others do not share); a window the shared body explains up to model error stays:
        # leaving such windows out would bias the estimate
        bad = [
            j
            for j, i in enumerate(pooled)
            if rms_w[j] > JOINT_OWN * rows[i]["own"]["rms"]
            and (rms_w[j] > JOINT_MEDIAN * med or S == 1)
            and rms_w[j] > POOR_NOISE * run.noise[i]
        ]
        # the last round refits without the windows the previous one left out and keeps
        # its windows (QA: leaving windows out after the last fit crashed the report, whose
        # fit no longer matched the pooled windows)
        if not bad or attempt == JOINT_ROUNDS:
            # the step-error check (refine or report) on the fit that is reported
            searched = f.iterations
            if np.all(np.isfinite(rms_w)):  # a fit that could not be evaluated is reported as it is
                f = _checked(run, f, pooled, groups, k)
            break
        for j in bad:
            i = pooled[j]
            rows[i]["status"] = FitStatus.POOR_FIT
            rows[i]["reason"] = (
                f"under the shared inertia its residual is {rms_w[j]:.3g} rad/s, above {JOINT_OWN:g}x its own fit's "
                f"({rows[i]['own']['rms']:.3g}) and {JOINT_MEDIAN:g}x the median over the pooled windows "
                f"({med:.3g}): not "
                "explained by the body the others share (a wrong basin?); left out of the joint fit"
            )
            excluded_joint.append(i)
        pooled = [i for j, i in enumerate(pooled) if j not in bad]
        if not pooled:
            status, message = _overall(rows, excluded, ["no window left to pool"])
            return InertiaFit(
                status=status,
                message=message,
                combined=dict(per.combined, n=0, excluded=excluded, by_recording=by_recording),
                **base,
            )
    # ---- report in the reported coordinates: [shared | bias per recording | omega0 per window]
    n_sh = spec.n_phys + G * spec.n_bias
    bias_names = []
    if spec.bias:
        for g_ in range(G):
            src = f" ({sources[g_]})" if G > 1 else ""
            bias_names += [(f"bias_{c}{src}", spec.n_phys + 3 * g_ + a) for a, c in enumerate("xyz")]
    ks = f.substeps if isinstance(f.substeps, tuple) else (f.substeps,) * S
    k[pooled] = np.asarray(ks, k.dtype)
    cov = np.asarray(f.covariance_classical, float)
    w0s = np.asarray(f.initial, float)
    biases = np.array([np.asarray(f.sensor[g_]["bias"], float) for g_ in range(G)]) if spec.bias else np.zeros((G, 3))
    xp = np.concatenate(
        [np.ravel(f.values["ratios"]), np.ravel(f.values.get("drag", [])), biases[:, : spec.n_bias].ravel()]
    )
    est, se, J = _estimates(run, xp[: spec.n_phys], cov[: spec.n_phys, : spec.n_phys])
    shifts = _shift_se(run, f, J, se, cov, bias_names)
    singular = not np.all(np.isfinite(cov[:n_sh, :n_sh]))
    # total: the sandwich over windows (never below the statistical), Student t; where it
    # misses the windows' own interval, the model error pulls the joint estimate: span both
    se_tot = {name: float("nan") for name in run.names}
    intervals = {name: (float("nan"), float("nan")) for name in run.names}
    widened, dof = [], np.full(len(run.names), float(S - 1))
    sw = None
    if not singular and S > 1:
        sw, se_sw, dof = _combine.cluster_sandwich(f, J, spec.n_phys, n_sh)
        for j_, n_ in enumerate(run.names):
            se_tot[n_] = float(np.fmax(se_sw[j_], se[n_]))
            lo, hi = _combine.t_interval(est[n_], se_tot[n_], dof[j_] if np.isfinite(dof[j_]) else S - 1)
            own = [rows[i]["own"]["estimates"][n_] for i in pooled if rows[i]["own"]["status"] == FitStatus.CONVERGED]
            w_lo, w_hi, _, _ = _combine.window_interval(own)
            if np.isfinite(w_lo) and (w_hi < lo or w_lo > hi):
                lo, hi = min(lo, w_lo), max(hi, w_hi)
                widened.append(n_)
            intervals[n_] = (max(lo, lower_bound(n_)), hi)  # never beyond the physically possible
    theta, _ = phys_theta(xp[None, : spec.n_phys], spec)
    bias_w = biases[groups]
    bias_se = np.sqrt(np.maximum(np.diag(cov), 0.0)) if np.all(np.isfinite(cov)) else np.full(cov.shape[0], np.inf)
    # each bias's total error: the sandwich's, at least the statistical; None where not measured
    # (no sandwich, or a recording of one pooled window: no scatter of its own between windows)
    one = np.repeat(np.bincount(np.asarray(groups, int), minlength=G) < 2, spec.n_bias)
    b_sw = np.sqrt(np.maximum(np.diag(sw), 0.0))[spec.n_phys :] if sw is not None else np.full(one.size, np.nan)
    bias_tot = [None if o or np.isnan(v) else float(max(v, e)) for v, e, o in zip(b_sw, bias_se[spec.n_phys :], one)]
    off_w = n_sh  # the windows' initial rates follow the shared and bias values
    ref = np.full(S, np.nan)
    if reference_check:
        ref = reference_rms([run.segs[i] for i in pooled], np.repeat(theta, S, 0), w0s, bias_w, spec)
    rel = [se[key] / abs(est[key]) if est[key] else np.inf for key in ("Ix/Iy", "Iz/Iy")]
    lm_status, joint_reason = f.status, ""
    if lm_status in (FitStatus.CONVERGED, FitStatus.UNIDENTIFIABLE) and (singular or max(rel) > REL_SE_MAX):
        lm_status = FitStatus.UNIDENTIFIABLE
        joint_reason = "the joint fit: the pooled windows do not determine the inertia ratios"
    elif lm_status != FitStatus.CONVERGED:
        windows = [rows[i]["name"] for i in pooled]
        joint_reason = f"the joint fit: {lm_status.value} ({_in_our_names(spec, f.message, sources, windows)})"
    rss_w = 2 * np.asarray(f.segment_cost, float)
    model = per._model
    model["joint"] = {
        "xp": xp[:n_sh],
        "cov": cov[:n_sh, :n_sh],
        "cov_total": None if sw is None else sw,
        "bias_names": [name for name, _ in bias_names],
    }
    for j, i in enumerate(pooled):
        r = rows[i]
        r["rms"] = float(np.sqrt(rss_w[j] / (3 * run.segs[i].n)))
        r["rms_reference"] = float(ref[j])
        r["omega0"] = w0s[j].tolist()
        r["omega0_se"] = bias_se[off_w + 3 * j : off_w + 3 * j + 3].tolist()
        r.pop("step_error_rms", None)  # the window's own fit's; the joint fit's is step_error["rms"]
        r["status"], r["reason"] = lm_status, joint_reason
        if spec.bias:
            ob = spec.n_phys + 3 * groups[j]
            r["bias"] = bias_w[j].tolist()
            r["bias_se"] = bias_se[ob : ob + 3].tolist()
            r["bias_total_se"] = bias_tot[ob - spec.n_phys : ob - spec.n_phys + 3]
        if lm_status == FitStatus.CONVERGED and reference_check and not (abs(ref[j] - r["rms"]) <= REF_TOL * r["rms"]):
            r["status"] = FitStatus.STEP_ERROR
            r["reason"] = (
                f"re-simulated by DOP853 the residual is {ref[j]:.3g} rad/s against the joint fit's {r['rms']:.3g}"
            )
        model["theta"][i] = theta[0]
        model["omega0"][i] = w0s[j]
        model["bias"][i] = bias_w[j]
        model["substeps"][i] = r["substeps"] = int(k[i])
    for r in rows if spec.bias else ():  # left-out windows: their own fit's bias, no total error
        r.setdefault("bias_total_se", [None] * 3)
    status, message = _overall(rows, excluded)
    bias = {}
    for g_ in range(G if spec.bias else 0):
        ob = spec.n_phys + 3 * g_
        b_ = {"value": biases[g_].tolist(), "se": bias_se[ob : ob + 3].tolist()}
        bias[sources[g_]] = dict(b_, total_se=bias_tot[3 * g_ : 3 * g_ + 3])
    method = (
        f"cluster-robust (sandwich) error over the {S} windows, at least the statistical one; Student t with "
        f"the windows' effective degrees of freedom ({np.nanmin(dof):.1f}-{np.nanmax(dof):.1f} of at most {S - 1})"
        if S > 1
        else "one window: no scatter between windows to measure (no total error, no interval)"
    )
    if widened:
        method += (
            f"; for {', '.join(widened)} that interval misses the windows' own fits' interval (model error pulls the "
            "joint estimate): the interval spans both"
        )
    m_tot = sum(3 * run.segs[i].n for i in pooled)
    s2 = 2 * f.cost / (f.measured - np.size(f.x)) if f.measured and f.measured > np.size(f.x) else float("nan")
    combined = dict(
        per.combined,
        excluded=excluded,
        by_recording=by_recording,
        n=len(pooled),
        windows=pooled,
        sources=sources,
        excluded_windows=[rows[i]["name"] for i in excluded_joint],
        method=method,
        widened=widened,
        dof={n_: (float(d_) if np.isfinite(d_) else None) for n_, d_ in zip(run.names, dof)},
        sigma=math.sqrt(s2) if math.isfinite(s2) else None,
        iterations=int(searched + f.iterations),
        bias=bias,
    )
    step_rms = float(SECOND_ORDER * f.step_rms) if np.isfinite(f.step_rms) else 0.0
    step_error = {
        "substeps": [int(kk) for kk in k],
        "rms": step_rms,
        "shift_se": shifts,
        "max_shift_se": max((abs(v_) for v_ in shifts.values()), default=0.0),
    }
    base.update(
        estimates=est,
        uncertainties=se,
        total_uncertainties=se_tot,
        intervals=intervals,
        rms=float(np.sqrt(rss_w.sum() / m_tot)),
        step_error=step_error,
        _model=model,
    )
    return InertiaFit(status=status, message=message, combined=combined, **base)


def _shared_fit(run: _Run, model: dict, pooled, groups, k, cands) -> ProblemFit:
    """The joint fit of the windows ``pooled`` on the layer: one problem
    (:func:`~rigidjax.identify.recipes._shared_problem`) started from each model value of
    ``cands`` (the first its own start, with bias 0; the others with each recording's median
    of its windows' biases), the windows' initial rates from their own fits (``model``);
    fit_inertia's phases (every start ``phase1_steps`` iterations, the best continued); no
    step-error check (:func:`_checked` runs it on the fit that is reported) and no sigma rule
    (sigma 1: the noise is estimated from the residuals)."""
    spec = run.spec
    segs = [run.segs[i] for i in pooled]
    w0 = np.array([model["omega0"][i] for i in pooled])
    problem = recipes._shared_problem(segs, spec, k[pooled], groups, cands[0], w0)
    lay = _Layout(problem)
    biases = [
        np.median([model["bias"][i] for i, gg in zip(pooled, groups) if gg == g_], 0)
        for g_ in range(len(problem.observations))
    ]
    xs = [start_vector(lay, problem, recipes._window_starts(segs[0], spec, theta), biases) for theta in cands[1:]]
    return _layer_fit(
        run,
        problem,
        len(cands),
        step_check="off",
        keep=1,
        first_steps=run.phase1_steps,
        given={0: np.array(xs)} if xs else None,
    )


def _checked(run: _Run, f: ProblemFit, pooled, groups, k) -> ProblemFit:
    """The joint fit ``f`` again from its optimum (one start: its model values, moved 1e-4
    inside a face of the valid set as every start, its initial rates; the biases from 0) with
    the layer's step-error check: ``refine`` (doubling the
    sub-steps of every window while an estimate moves more than 0.3 classical standard errors)
    where fit_inertia adapts the sub-steps, else ``report``."""
    spec = run.spec
    segs = [run.segs[i] for i in pooled]
    xp = np.concatenate([np.ravel(f.values["ratios"]), np.ravel(f.values.get("drag", []))])
    theta = phys_theta(xp[None], spec)[0][0]
    problem = recipes._shared_problem(segs, spec, k[pooled], groups, theta, np.asarray(f.initial, float))
    return _layer_fit(run, problem, 1, step_check="refine" if run.adapt else "report")


def _layer_fit(run: _Run, problem, starts: int, **options) -> ProblemFit:
    """:func:`~rigidjax.identify._problem_fit._fit` of one joint problem with fit_inertia's
    options (sigma 1, no sigma rule; shifts in classical errors; its iteration caps)."""
    with warnings.catch_warnings():  # fit_inertia warns of float32 itself
        warnings.filterwarnings("ignore", message="fit_inertia: fitting in float32")
        (f,) = _fit(
            [problem],
            starts,
            spread=0.5,
            seed=run.seed,
            max_steps=run.phase1_steps + run.max_steps,
            dtype=run.dtype,
            pad_to=None,
            raise_on_failure=False,
            name="fit_inertia",
            sigma_rule=False,
            progress=run.progress,
            classical=True,
            **options,
        )
    return f
