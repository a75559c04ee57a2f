"""Statuses and the result of an inertia fit (table, JSON, prediction)."""

from __future__ import annotations

import dataclasses
import enum

import jax.numpy as jnp
import numpy as np

from ._model import Spec, pad_length, simulator
from ._principal import combined_covariance, tensor_summary


class FitStatus(str, enum.Enum):
    """Outcome of a fit: one vocabulary for windows, joint fits, pendulum swings and the whole.

    A ``str`` enum: ``FitStatus.CONVERGED == "converged"``; JSON holds the value.
    """

    #: The least-squares minimum was reached (first-order optimality at the physically valid
    #: set, bounds included), the residual is plausible and the data determine the estimate.
    CONVERGED = "converged"
    #: The optimiser's iteration cap came first (raise ``max_steps``).
    MAX_STEPS = "max_steps"
    #: The optimiser could not lower the cost further, yet first-order optimality does not hold.
    STALLED = "stalled"
    #: The simulation or the data gave NaN/inf.
    NONFINITE = "nonfinite"
    #: A stationary point with an implausible residual (far above the other windows' and
    #: the noise): a wrong basin, or a window that is not free flight. Excluded from combining.
    #: Also, for a whole fit, a fitted gyroscope bias that the gyroscope's own reading at rest
    #: contradicts (it absorbs model error, :mod:`rigidjax.identify._rest`): the windows stay
    #: in the combined estimate and the message says so.
    POOR_FIT = "poor_fit"
    #: The data cannot determine the fitted parameters (noise only, too few samples, a spin
    #: about one principal axis, a ratio known only to more than ±50 %, a degenerate, rod-like
    #: minimum, also one the optimiser heads for without reaching it within ``max_steps``):
    #: no estimate is presented.
    UNIDENTIFIABLE = "unidentifiable"
    #: The optimum was reached, but the stepper's own error shapes the estimate (raise
    #: ``substeps``): for :func:`~rigidjax.identify.fit_inertia`, the fitted window re-simulated
    #: by a tight independent integrator has a residual more than 10 % different; for
    #: :func:`~rigidjax.identify.fit`, the step-error check moves a value by more than 0.3
    #: standard errors.
    STEP_ERROR = "step_error"
    #: Windows of recordings whose estimates disagree with the others' beyond their spread
    #: (a different body?): not pooled.
    INCONSISTENT = "inconsistent"
    #: A pendulum window that does not swing freely from its start (held, pushed).
    NOT_FREE = "not_free"

    def __str__(self) -> str:
        return self.value


#: Exit codes of the command line: 0 converged, 1 a result that is not (or not fully)
#: trustworthy (see the status), 2 bad input, 3 recordings not pooled (inconsistent).
EXIT_CODES = {FitStatus.CONVERGED: 0, FitStatus.INCONSISTENT: 3}


def exit_code(status: FitStatus, not_pooled: bool = False) -> int:
    """The command line's exit code for a fit's status (:data:`EXIT_CODES`; 1 for any other).

    ``not_pooled``: some recording was left out of the combined estimate because it disagrees
    with the pooled ones (the fit's ``combined["excluded"]``). Then the code is 3 whatever the
    status: a window that did not converge ranks above ``inconsistent`` in the status (its
    line names both), but the combined estimate then leaves out a body that may be another,
    which a script reading only the exit code must learn. (Windows left out for their own
    status, e.g. every window of a recording ``unidentifiable``, give 1; the status line
    counts them.)"""
    return 3 if not_pooled else EXIT_CODES.get(FitStatus(status), 1)


def pm(v, e) -> str:
    """``value ± error`` for tables."""
    if v is None or not np.isfinite(v):
        return "—"
    if e is None or np.isnan(e):
        return f"{v:.5g}"
    if not np.isfinite(e):
        return f"{v:.5g} ± inf"
    if e == 0:
        return f"{v:.5g} (fixed)"
    return f"{v:.5g} ± {e:.2g}"


def _xyz(values, errors) -> str:
    """``x v ± e, y v ± e, z v ± e`` for the table."""
    return ", ".join(f"{a} {pm(v, e)}" for a, v, e in zip("xyz", values, errors))


def _bias_lines(src: str, b: dict) -> list[str]:
    """A recording's gyroscope bias in :meth:`InertiaFit.table`: fitted (± statistical, total)
    or measured at rest, and the reading at rest beside a fitted one."""
    of = f" of {src}" if src else ""
    if b.get("measured") == "at rest":
        r = b["rest"]
        return [
            f"  gyroscope bias{of} (rad/s), read at rest over {r['duration']:.3g} s, subtracted: "
            + _xyz(b["value"], b["se"])
        ]
    tot = b.get("total_se") or [None] * 3
    parts = [
        f"{a} {pm(v, e)}" + (f" (total {t:.2g})" if t is not None else "")
        for a, v, e, t in zip("xyz", b["value"], b["se"], tot)
    ]
    out = [f"  gyroscope bias{of} (rad/s): " + ", ".join(parts)]
    if "rest" in b:
        r, z = b["rest"], b["rest_z"]
        out.append(
            f"    at rest ({r['duration']:.3g} s still): {_xyz(r['value'], r['sd'])}; "
            f"fitted - at rest: {max(z):.1f} errors at most"
            + ("" if b.get("rest_agrees", True) else " (contradicts: the bias absorbs model error)")
        )
    return out


def _interval(iv) -> str:
    if iv is None or iv[0] is None or not (np.isfinite(iv[0]) and np.isfinite(iv[1])):
        return "—"
    return f"[{iv[0]:.5g}, {iv[1]:.5g}]"


def _clean(v):
    if isinstance(v, FitStatus):
        return v.value
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, np.ndarray):
        return _clean(v.tolist())
    if isinstance(v, (np.floating, float)):
        return float(v) if np.isfinite(v) else None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


@dataclasses.dataclass
class InertiaFit:
    """Result of :func:`rigidjax.identify.fit_inertia` (NumPy values; JSON via :meth:`to_dict`).

    Attributes:
        mode: ``"joint"`` (one inertia and drag shared by the pooled windows) or
            ``"per-window"`` (each window fitted alone, then combined by the median).
        options: the fit's options.
        status: :class:`FitStatus` of the whole: ``CONVERGED`` only if every window is
            converged, nothing was left out and no fitted gyroscope bias is contradicted by the
            gyroscope at rest (else at least ``POOR_FIT``); otherwise the most serious status present
            (``INCONSISTENT`` > not converged > ``POOR_FIT`` > ``STEP_ERROR`` > ``UNIDENTIFIABLE``).
        message: what the status means here, in words (which windows, which recordings).
        estimates: name -> the combined estimate (per-window: median over the pooled converged
            windows; joint: the joint estimate; one window: its estimate). Empty when nothing
            is identifiable. Names: ``Ix/Iy``, ``Iz/Iy`` (tensor diagonal in sensor axes over
            ``I_yy``), ``Ixy/Iy``, ``Ixz/Iy``, ``Iyz/Iy``, ``Imid/Imin``, ``Imax/Imin``,
            ``misalignment_deg`` (full tensor), ``drag/Iy`` (1/s); with a scale ``Ix``, ``Iy``,
            ``Iz`` (kg m^2), ``drag`` (N m s).
        uncertainties: statistical 1-sigma of each estimate: the Gauss-Newton errors implied
            by the residual (per-window mode: of the median, from the windows' errors); they
            ignore model error.
        total_uncertainties: 1-sigma that covers the scatter between windows (model error
            included): per-window, half the width of :attr:`intervals` over 1.96; joint, the
            cluster-robust (sandwich) error over windows, at least the statistical one.
            ``nan`` with one window.
        intervals: name -> ``(lo, hi)``, the 95 % interval covering the between-window
            scatter (:mod:`rigidjax.identify._combine`): per-window, order statistics of the
            windows (six or more; Student t about the median for two to five); joint,
            ``estimate ± t(0.975, G-1) total``, spanning the windows' own interval too where
            the two disagree. ``combined["method"]`` says which, with the coverage.
        segments: one dict per window: name, comment, source, recording, n, substeps, rms
            (rad/s), rms_reference (the same parameters under a tight ODE solver), status,
            reason, iterations, omega0, (bias, bias_se; rest_z, rest_agrees, rest_limit for a pooled
            window of a per-window fit with a bias and a reading at rest), estimates and se (its own fit), noise
            and signal (rad/s), step_shift_se; in joint mode, rms, status, substeps, omega0 and
            bias are the joint fit's (with ``bias_total_se``, see ``combined``) and ``own``
            holds the window's own fit.
        combined: how the windows were pooled: ``n``, ``windows`` (their rows), ``sources``,
            ``excluded`` (recording -> why), ``by_source`` summaries of the windows' own
            estimates, ``method`` of the intervals; joint mode also ``bias`` (recording ->
            ``value``, ``se`` statistical and ``total_se``, the cluster sandwich over the
            windows, at least ``se``, ``None`` for a recording of one pooled window: not
            measured; rad/s; the table prints them; where the recording lies still somewhere,
            ``rest`` (the gyroscope's reading at rest: value, sd, duration, blocks), ``rest_z``
            (per axis, fitted minus at rest over their errors), ``rest_agrees`` and
            ``rest_limit`` (the limit on ``rest_z``: 3.3 for one recording, more for several));
            with ``bias="rest"``, in either mode, ``bias`` holds the readings at rest
            (``measured="at rest"``); per-window fits with a fitted bias have ``rest``
            (recording -> its reading at rest; the rows hold ``rest_z``)
            and ``by_recording`` (with a bias; recording -> its windows fitted jointly: ``n``,
            ``status``, ``Ix/Iy`` and ``Iz/Iy`` with ``value`` and ``total_se``; the pooling
            check).
        rms: residual RMS over the pooled windows, rad/s.
        truth: the true values where known (synthetic data), else ``None``.
        step_error: the simulation's own step error: ``substeps`` (per window), ``rms``
            (rad/s), ``shift_se`` (name -> largest first-order shift over the windows, in
            standard errors), ``max_shift_se``.
    """

    mode: str
    options: dict
    status: FitStatus
    message: str
    estimates: dict
    uncertainties: dict
    total_uncertainties: dict
    intervals: dict
    segments: list
    combined: dict
    rms: float
    truth: dict | None = None
    step_error: dict | None = None
    _model: dict = dataclasses.field(default=None, repr=False)
    _data: list = dataclasses.field(default=None, repr=False)

    @property
    def converged(self) -> bool:
        """The whole fit reached its minimum and nothing was left out (status ``CONVERGED``)."""
        return self.status == FitStatus.CONVERGED

    def predict(self, i: int, *, t=None):
        """``(t, measured omega, fitted omega)`` of window ``i`` (rad/s, sensor axes)."""
        seg = self._data[i]
        m = self._model
        t = seg.t if t is None else np.asarray(t, float)
        n_pad = pad_length(len(t))
        d = np.diff(t)
        dt = np.concatenate([d, np.full(n_pad - len(t), np.median(d))])
        spec: Spec = m["spec"]
        dtype = jnp.result_type(float)
        w = simulator(spec)(
            jnp.asarray(m["theta"][i][None], dtype),
            jnp.asarray(m["omega0"][i][None], dtype),
            jnp.asarray(dt[None], dtype),
            jnp.asarray([m["substeps"][i]], jnp.int32),
        )
        return t, seg.omega, np.asarray(w[0], float)[: len(t)] + m["bias"][i]

    def covariance(self) -> dict | None:
        """The covariance of the fitted parameters: ``{"parameters": names, "matrix": (P, P),
        "matrix_total": (P, P) or None, "kind": ...}``; ``None`` without an estimate.

        Parameters: the shared reported coordinates (``Ix/Iy``, ``Iz/Iy`` (, ``Ixy/Iy``,
        ``Ixz/Iy``, ``Iyz/Iy``), drag over ``I_yy`` in 1/s); in joint mode then the gyroscope
        bias (rad/s; per recording when there are several). The windows' initial rates are
        nuisance parameters and left out (the matrix is the marginal block). ``matrix`` is
        statistical (Gauss-Newton ``s^2 (J^T J)^-1``, noise only); ``matrix_total`` covers the
        scatter between windows, and its diagonal is :attr:`total_uncertainties` squared (the
        same total error as the intervals: one number per quantity): joint, the correlations of
        the cluster-robust (sandwich) covariance over windows; per-window, the correlations of
        ``(pi/2) S / n`` from the windows' sample covariance ``S``, each scaled to the total
        uncertainty (``None`` with one window). The tensor's and principal moments'
        ``se_total`` (:meth:`inertia`) propagate this matrix, so ``se_total`` of ``I_xx/I_yy``
        equals ``total_uncertainties["Ix/Iy"]``. Per-window mode's ``matrix`` is ``(pi/2) (sum_i C_i^-1)^-1`` over the
        pooled windows' own covariances ``C_i`` (the median's efficiency times the weighted
        mean's covariance). Units: ratios are dimensionless, drag/Iy 1/s, bias rad/s.
        """
        m = self._model or {}
        spec: Spec | None = m.get("spec")
        if spec is None or not self.estimates:
            return None
        names = list(spec.inertia_names) + list(spec.drag_names)
        P = len(names)
        if self.mode == "joint" and m.get("joint") is not None:
            j = m["joint"]
            return {
                "parameters": names + list(j["bias_names"]),
                "matrix": np.asarray(j["cov"], float),
                "matrix_total": self._match_total(
                    j["cov_total"], names + list(j["bias_names"]), self._bias_totals(j["bias_names"])
                ),
                "kind": "joint fit: statistical (Gauss-Newton); total: cluster-robust (sandwich) over windows, "
                "scaled so its diagonal is total_uncertainties squared (at least the statistical variance; the "
                "biases': combined['bias'] total_se, their statistical se where that is not measured)",
                "_xp": np.asarray(j["xp"], float)[:P],
            }
        pooled = list(self.combined.get("windows") or [])
        covs = [np.asarray(m["cov"][i], float)[:P, :P] for i in pooled if m.get("cov") and m["cov"][i] is not None]
        if not covs:
            return None
        xp = np.array([self.estimates[n] for n in names], float)
        if len(covs) == 1:
            stat, total = covs[0], None
            kind = "one window: its Gauss-Newton covariance (statistical)"
        else:
            vals = np.array([[self.segments[i]["estimates"][n] for n in names] for i in pooled], float)
            stat, total = combined_covariance(covs, vals)
            kind = (
                f"median of {len(covs)} windows: statistical (pi/2) (sum C_i^-1)^-1 of the windows' Gauss-Newton "
                "covariances; total: correlations of (pi/2) S / n from their sample covariance S, scaled so its "
                "diagonal is total_uncertainties squared (the intervals' width / (2 x 1.96))"
            )
        return {
            "parameters": names,
            "matrix": stat,
            "matrix_total": self._match_total(total, names),
            "kind": kind,
            "_xp": xp,
        }

    def _bias_totals(self, names) -> dict:
        """Joint mode: each gyroscope bias's total error by its covariance name (``names``, in
        ``combined["bias"]``'s order): its ``total_se``, or where that is not measured (a
        recording of one pooled window) its statistical ``se``: that window's own pull on its
        bias is ~0, so the raw sandwich there would be far below the statistical error."""
        totals = [
            s if t is None else t
            for b in (self.combined.get("bias") or {}).values()
            for t, s in zip(b.get("total_se") or [None] * 3, b["se"])
        ]
        return dict(zip(names, totals)) if len(totals) == len(names) else {}

    def _match_total(self, total, names, extra: dict | None = None):
        """``total`` rescaled (its correlations kept) so that its diagonal is
        :attr:`total_uncertainties` squared (or ``extra``'s value: the biases' ``total_se``)
        for every parameter that has a finite, positive one: one total error per quantity, the
        one the intervals and ``combined["bias"]`` give. Other rows unchanged."""
        if total is None:
            return None
        total = np.array(total, float)
        f = np.ones(len(total))
        for k, n in enumerate(names):
            e, var = self.total_uncertainties.get(n, (extra or {}).get(n)), total[k, k]
            if e is not None and np.isfinite(e) and e > 0 and np.isfinite(var) and var > 0:
                f[k] = e / np.sqrt(var)
        return total * np.outer(f, f)

    def inertia(self) -> dict | None:
        """The inertia tensor, its principal moments and principal axes with 1-sigma errors
        (:func:`rigidjax.identify._principal.tensor_summary`: sensor axes; kg m^2 with a scale,
        else relative to ``I_yy``; errors by the delta method from :meth:`covariance`, both the
        statistical ``se`` and, where there is one, ``se_total``). Per-window mode: the tensor
        of the median parameters. ``None`` without an estimate."""
        c = self.covariance()
        if c is None:
            return None
        spec: Spec = self._model["spec"]
        P = spec.n_phys
        scale = self.options.get("scale")
        scale = tuple(scale) if scale else None
        tot = None if c["matrix_total"] is None else c["matrix_total"][:P, :P]
        return tensor_summary(c["_xp"], spec, scale, c["matrix"][:P, :P], tot)

    def _window_covariance(self, i: int) -> dict | None:
        m = self._model or {}
        spec = m.get("spec")
        cov = (m.get("cov") or [None] * (i + 1))[i]
        if spec is None or cov is None:
            return None
        names = list(spec.inertia_names) + list(spec.drag_names)
        names += ["bias_x", "bias_y", "bias_z"] if spec.bias else []
        return {"parameters": names, "matrix": np.asarray(cov, float)[: len(names), : len(names)]}

    def to_dict(self) -> dict:
        """JSON-ready dict (non-finite numbers become ``None``).

        Besides the attributes: ``covariance`` (:meth:`covariance`: parameter names and the
        matrix), ``inertia`` (:meth:`inertia`: tensor, principal moments and axes in sensor
        axes, with delta-method errors), and per window its own fit's covariance
        (``segments[i]["covariance"]``; joint mode: ``segments[i]["own"]["covariance"]``).
        """
        cov = self.covariance()
        if cov is not None:
            cov = {k: v for k, v in cov.items() if not k.startswith("_")}
        segments = []
        for i, s in enumerate(self.segments):
            s = dict(s)
            wc = self._window_covariance(i)
            if wc is not None and self.mode == "joint" and isinstance(s.get("own"), dict):
                s["own"] = dict(s["own"], covariance=wc)
            elif wc is not None:
                s["covariance"] = wc
            segments.append(s)
        return _clean(
            {
                "mode": self.mode,
                "options": self.options,
                "status": self.status,
                "message": self.message,
                "rms": self.rms,
                "estimates": self.estimates,
                "uncertainties": self.uncertainties,
                "total_uncertainties": self.total_uncertainties,
                "intervals": self.intervals,
                "combined": self.combined,
                "covariance": cov,
                "inertia": self.inertia(),
                "segments": segments,
                "truth": self.truth,
                "step_error": self.step_error,
            }
        )

    def table(self, *, max_name: int = 44) -> str:
        """A plain-text report: one row per window, then the combined or joint estimate."""
        keys = [k for k in self.estimates if k != "misalignment_deg"][:3] or ["Ix/Iy", "Iz/Iy"]
        lines = []
        wc = max([7] + [len(s["comment"]) for s in self.segments])
        wst = max([9] + [len(str(s["status"])) for s in self.segments])
        joint = self.mode == "joint"
        head = f"{'#':>3} {'window':<{max_name}} {'comment':<{wc}} {'n':>4} {'k':>2} {'rms':>7} {'status':<{wst}}"
        head += "".join(f" {('own ' + k) if joint else k:>18}" for k in keys)
        lines += [head, "-" * len(head)]
        for i, s in enumerate(self.segments):
            name = s["name"] if len(s["name"]) <= max_name else "…" + s["name"][-(max_name - 1) :]
            rms = f"{s['rms']:>7.4f}" if s.get("rms") is not None and np.isfinite(s["rms"]) else f"{'—':>7}"
            row = (
                f"{i:>3} {name:<{max_name}} {s['comment']:<{wc}} {s['n']:>4} {s.get('substeps', 0):>2} "
                f"{rms} {str(s['status']):<{wst}}"
            )
            own = s.get("own") or s
            est = own.get("estimates") or {}
            shown = own.get("status") != FitStatus.UNIDENTIFIABLE
            row += "".join(f" {(pm(est.get(k), own['se'].get(k)) if shown and est else '—'):>18}" for k in keys)
            lines.append(row)
        if joint:
            lines.append("(k, rms and status: the joint fit; 'own': each window's own fit, for comparison)")
        lines.append("")
        c = self.combined
        for src, why in c.get("excluded", {}).items():
            lines.append(f"NOT POOLED: {src}: {why}")
        if not self.estimates:
            lines.append("no estimate: " + self.message)
        else:
            if self.mode == "joint":
                lines.append(f"joint estimate over {c['n']} window(s) of {len(c['sources'])} recording(s):")
            elif c["n"] == 1:
                lines.append(
                    "one window: its estimate (± 1-sigma, Gauss-Newton; no between-window scatter to measure):"
                )
            else:
                lines.append(f"median over {c['n']} converged window(s) of {len(c['sources'])} recording(s):")
            lines.append(f"  {'':<18} {'estimate ± statistical 1σ':>28}   95 % interval incl. between-window scatter")
            for k, v in self.estimates.items():
                lines.append(f"  {k:<18} {pm(v, self.uncertainties.get(k)):>28}   {_interval(self.intervals.get(k))}")
            if c.get("method"):
                lines.append(f"  (statistical: noise only, Gauss-Newton; interval: {c['method']})")
            for src, b in (c.get("bias") or {}).items():  # one gyroscope bias per recording
                lines += _bias_lines(src if len(c["bias"]) > 1 else "", b)
            for src, r in (c.get("rest") or {}).items():  # per-window fits with a bias: the readings
                lines.append(
                    f"  gyroscope at rest (rad/s) of {src} ({r['duration']:.3g} s still): {_xyz(r['value'], r['sd'])}"
                )
            off = [str(i) for i, s in enumerate(self.segments) if s.get("rest_agrees") is False]
            if off:
                lines.append(
                    f"  windows whose own bias the gyroscope at rest contradicts (beyond "
                    f"{self.segments[int(off[0])]['rest_limit']:.2g} errors): table rows " + ", ".join(off)
                )
        rms = f"{self.rms:.4g} rad/s" if np.isfinite(self.rms) else "—"
        lines.append(f"residual RMS {rms} over the pooled windows; status: {self.status}")
        lines.append(f"  {self.message}")
        if self.step_error and (self.step_error["shift_se"] or self.step_error["rms"] > 0):  # a window was fitted
            se_ = self.step_error
            worst = max(se_["shift_se"], key=lambda k: abs(se_["shift_se"][k]), default=None)
            ks = sorted(set(se_["substeps"]))
            lines.append(
                f"step error of the simulation (substeps {', '.join(map(str, ks))}): "
                f"RMS {se_['rms']:.2g} rad/s; shifts the "
                f"estimates by up to {se_['max_shift_se']:.2f} standard errors" + (f" ({worst})" if worst else "")
            )
        if self.truth:
            lines.append("truth (synthetic) beside the estimate:")
            for k, v in self.truth.items():
                if isinstance(v, (int, float)) and k in self.estimates:
                    e = self.uncertainties.get(k)
                    z = f"  ({(self.estimates[k] - v) / e:+.2f} sigma)" if e and np.isfinite(e) and e > 0 else ""
                    lines.append(f"  {k:<18} truth {v:<12.6g} estimate {self.estimates[k]:.6g}{z}")
            if "bias" in self.truth and self.segments and "bias" in self.segments[0]:
                lines.append(
                    f"  {'bias (rad/s)':<18} truth {self.truth['bias']}  "
                    f"estimate {np.round(self.segments[0]['bias'], 5).tolist()}"
                )
        return "\n".join(lines)
