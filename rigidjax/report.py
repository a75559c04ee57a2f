"""A self-contained HTML report of an inertia fit (``rigidjax fit --report DIR``).

:func:`write_report` writes one ``index.html``: no scripts, no network, every figure an
inline SVG drawn by matplotlib. It holds

* the overall status, its message and the warnings;
* the combined estimate (value ± statistical 1-sigma, the 95 % interval covering the
  between-window scatter, optional references and the distance to them);
* the inertia tensor, principal moments and principal axes in sensor axes
  (:meth:`rigidjax.identify.InertiaFit.inertia`);
* a table of the windows (status, reason, residual, own estimates);
* a figure of the per-window estimates with their 1-sigma bars against the combined
  estimate, its interval and the references;
* per window: measured (dots) against fitted (lines) body angular velocity, rad/s, sensor
  axes, with the residual (measured - fitted) in a panel below. ``max_windows`` limits these
  figures (the command line draws 12 by default, ``--report-windows``): the windows with the
  worst status, then the largest residual, are drawn; the table lists every window and a note
  says how many figures were left out. The traces are rasterised (a PNG inside the SVG; axes
  and text stay vector), which keeps a report of many windows small and quick to write.

Figures carry ``id`` attributes (``fig-estimates``, ``fig-window-<i>``) and the class
``figure`` so that a test, or a reader's script, can find them. :func:`figures` returns the
same figures as matplotlib ``Figure`` objects (notebooks).
"""

from __future__ import annotations

import datetime
import html
import io
import math
import re
from pathlib import Path

import numpy as np

from .identify import FitStatus, InertiaFit
from .io import replacing

__all__ = [
    "ESTIMATE_NAMES",
    "ReportError",
    "parse_reference",
    "estimates_figure",
    "window_figure",
    "worst_windows",
    "figures",
    "report_html",
    "write_report",
]

_NUM = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_REF = re.compile(rf"^\s*([^=\s]+)\s*=\s*({_NUM})\s*(?:(?:\+-|±|\+/-)\s*({_NUM}))?\s*$")


#: every name an inertia fit can report (:attr:`InertiaFit.estimates`), for checking a
#: reference before fitting
ESTIMATE_NAMES = (
    "Ix/Iy Iz/Iy Ixy/Iy Ixz/Iy Iyz/Iy Imid/Imin Imax/Imin misalignment_deg drag/Iy drag_x/Iy drag_y/Iy drag_z/Iy "
    "Ix Iy Iz Ixy Ixz Iyz drag drag_x drag_y drag_z"
).split()


class ReportError(ValueError):
    """Bad input to the report (a malformed ``--reference``)."""


def parse_reference(text: str) -> tuple[str, float, float]:
    """``"Ix/Iy=13.5+-4"`` -> ``("Ix/Iy", 13.5, 4.0)`` (name, value, 1-sigma; ``±`` and
    ``+/-`` also read; without an error the 1-sigma is 0). The name is an estimate's name as
    in :attr:`InertiaFit.estimates` (checked by :func:`report_html`). Raises
    :class:`ReportError` on anything else."""
    m = _REF.match(text or "")
    if not m:
        raise ReportError(f"reference: expected NAME=VALUE[+-SIGMA], e.g. 'Ix/Iy=13.5+-4'; got {text!r}")
    try:
        v, e = float(m.group(2)), float(m.group(3) or 0.0)
    except ValueError:
        raise ReportError(f"reference: expected numbers in NAME=VALUE[+-SIGMA]; got {text!r}") from None
    if not (math.isfinite(v) and math.isfinite(e) and e >= 0):
        raise ReportError(f"reference: value must be finite and sigma >= 0; got {text!r}")
    if m.group(1) not in ESTIMATE_NAMES:
        raise ReportError(f"reference {m.group(1)!r}: not an estimate's name (one of {', '.join(ESTIMATE_NAMES)})")
    return m.group(1), v, e


def _refs(result: InertiaFit, references) -> dict:
    out = {}
    for r in references or ():
        name, v, e = parse_reference(r) if isinstance(r, str) else r
        known = set(result.estimates) | {k for s in result.segments for k in _own(s).get("estimates") or {}}
        if known and name not in known:
            raise ReportError(f"reference {name!r}: not an estimate of this fit (known: {', '.join(sorted(known))})")
        out[name] = (float(v), float(e))
    return out


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("rigidjax")
    except metadata.PackageNotFoundError:
        return "unknown"


def _own(seg: dict) -> dict:
    """A window's own fit (joint mode keeps it under ``own``)."""
    return seg.get("own") or seg


def _fig(w, h):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), constrained_layout=True)
    FigureCanvasAgg(fig)
    return fig


def _keys(result: InertiaFit, refs: dict) -> list:
    keys = [
        k
        for k in ("Ix/Iy", "Iz/Iy")
        if k in result.estimates or any(k in (_own(s).get("estimates") or {}) for s in result.segments)
    ]
    return keys + [k for k in refs if k not in keys]


def estimates_figure(result: InertiaFit, references=()):
    """Per-window estimates (own fits, 1-sigma bars; grey: not pooled or not converged) against
    the combined estimate (line), its 95 % interval (band) and the references (hatched, 1-sigma)."""
    refs = _refs(result, references)
    keys = _keys(result, refs) or ["Ix/Iy"]
    fig = _fig(8, 2.6 * len(keys))
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    pooled = set(result.combined.get("windows") or [])
    for ax, key in zip(axes, keys):
        for i, s in enumerate(result.segments):
            own = _own(s)
            v, e = (own.get("estimates") or {}).get(key), (own.get("se") or {}).get(key)
            if v is None or own.get("status") == FitStatus.UNIDENTIFIABLE:
                continue
            ok = i in pooled and own.get("status") == FitStatus.CONVERGED
            ax.errorbar(
                i, v, e if e is not None and np.isfinite(e) else None, fmt="o", ms=4, lw=1, color="C0" if ok else "0.6"
            )
        if key in result.estimates:
            est = result.estimates[key]
            lo, hi = result.intervals.get(key, (np.nan, np.nan))
            ax.axhline(est, color="C1", lw=1.5, label=f"combined {est:.4g}")
            if lo is not None and np.isfinite(lo) and np.isfinite(hi):
                ax.axhspan(lo, hi, color="C1", alpha=0.2, label=f"95 % interval [{lo:.4g}, {hi:.4g}]")
        if key in refs:
            v, e = refs[key]
            ax.axhline(v, color="C2", ls="--", lw=1.2, label=f"reference {v:.4g} ± {e:.2g}")
            if e > 0:
                ax.axhspan(v - e, v + e, color="C2", alpha=0.08)
        ax.set_ylabel(key)
        ax.legend(fontsize=7, loc="best")
    axes[-1].set_xlabel("window (row of the table; grey: not pooled or not converged)")
    axes[-1].xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle("per-window estimates (own fits, ± 1σ statistical)", fontsize=10)
    return fig


def window_figure(result: InertiaFit, i: int):
    """Window ``i``: measured vs fitted body rates (rad/s, sensor axes) and the residual.
    ``None`` where the window has no fit (not identifiable, not free flight)."""
    s = result.segments[i]
    if s.get("rms") is None:
        return None
    t, measured, fitted = result.predict(i)
    if not np.all(np.isfinite(fitted)):
        return None
    fig = _fig(8, 4.2)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2.2, 1])
    tt = t - t[0]
    for k in range(3):  # rasterised traces: a PNG in the SVG (axes and text stay vector)
        top.plot(tt, measured[:, k], ".", ms=2.5, color=f"C{k}", alpha=0.6, rasterized=True)
        top.plot(tt, fitted[:, k], "-", lw=1.2, color=f"C{k}", label=f"ω{'xyz'[k]}", rasterized=True)
        bottom.plot(tt, measured[:, k] - fitted[:, k], "-", lw=0.8, color=f"C{k}", rasterized=True)
    top.set_ylabel("body rate (rad/s)")
    top.legend(fontsize=7, loc="upper right", ncol=3, title="dots measured, lines fitted", title_fontsize=7)
    bottom.axhline(0, color="0.5", lw=0.6)
    bottom.set_ylabel("residual (rad/s)")
    bottom.set_xlabel("time in window (s)")
    rms = f"rms {s['rms']:.3g} rad/s" if s.get("rms") is not None else ""
    which = "joint fit" if result.mode == "joint" and i in (result.combined.get("windows") or ()) else "own fit"
    top.set_title(f"#{i} {s['name'][-50:]} {s.get('comment', '')} — {which}, {rms}, {s['status']}", fontsize=8)
    return fig


def worst_windows(result: InertiaFit) -> list:
    """Rows of the windows with a fit to draw, worst first: not converged before converged,
    then the larger residual RMS first."""
    rows = [i for i, s in enumerate(result.segments) if s.get("rms") is not None and np.isfinite(s["rms"])]
    return sorted(rows, key=lambda i: (str(result.segments[i]["status"]) == "converged", -result.segments[i]["rms"], i))


def figures(result: InertiaFit, references=()) -> dict:
    """``{"estimates": Figure, "window 0": Figure | None, ...}`` (matplotlib, not shown)."""
    out = {"estimates": estimates_figure(result, references)}
    for i in range(len(result.segments)):
        out[f"window {i}"] = window_figure(result, i)
    return out


def _svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "rigidjax"}):
        fig.savefig(buf, format="svg", dpi=120)  # dpi: of the rasterised traces
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _num(v, e=None) -> str:
    if v is None or not np.isfinite(v):
        return "—"
    if e is None or not np.isfinite(e):
        return f"{v:.5g}"
    if e == 0:
        return f"{v:.5g} (fixed)"
    return f"{v:.5g} ± {e:.2g}"


_CSS = """body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}.status{font-weight:bold;padding:1px 6px;
border-radius:3px}.converged{background:#d8f0d8}.bad{background:#f8dcdc}figure{margin:1em 0}
figure svg{max-width:100%;height:auto}figcaption{font-size:12px;color:#555}pre{font-size:12px}"""


def _badge(status) -> str:
    cls = "converged" if str(status) == "converged" else "bad"
    return f'<span class="status {cls}">{html.escape(str(status))}</span>'


def _table(head, rows, cls="") -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def _inertia_html(result: InertiaFit) -> str:
    inert = result.inertia()
    if inert is None:
        return "<p>no estimate, no tensor.</p>"
    T, m, ax = inert["tensor"], inert["principal_moments"], inert["principal_axes"]
    se = T["se"] or [[None] * 3] * 3
    rows = [[f"<b>{'xyz'[r]}</b>"] + [_num(T["value"][r][c], se[r][c]) for c in range(3)] for r in range(3)]
    out = (
        f"<p>Frame: {html.escape(inert['frame'])}; unit: {html.escape(inert['unit'])}; errors: statistical 1σ, "
        f"{html.escape(inert['method'])}.</p>"
    )
    out += _table(["", "x", "y", "z"], rows, "tensor")
    mse = m["se"] or [None] * 3
    tilt = ax["se_deg"] or [None] * 3
    R = np.asarray(ax["rotation"])
    rows = [
        [
            str(k + 1),
            _num(m["value"][k], mse[k]),
            "(" + ", ".join(f"{c:+.4f}" for c in R[:, k]) + ")",
            "fixed by the model" if ax["fixed_by_model"] else _num(tilt[k]),
        ]
        for k in range(3)
    ]
    out += _table(["#", "principal moment", "axis in sensor axes (x, y, z)", "axis tilt 1σ (deg)"], rows, "principal")
    return out


def report_html(
    result: InertiaFit,
    *,
    references=(),
    title: str | None = None,
    command: str | None = None,
    warnings=(),
    max_windows: int | None = None,
    show_all: str = "max_windows=None",
    progress=None,
) -> str:
    """The report as one HTML string (see the module). ``references``: strings
    ``NAME=VALUE+-SIGMA`` or ``(name, value, sigma)`` tuples; ``warnings``: strings shown as
    such; ``max_windows``: draw at most this many window figures, those of
    :func:`worst_windows` (``None``: all; the table lists every window, the figures follow in
    its order); ``show_all``: how to draw them all, named in the note on the figures left out;
    ``progress``: called with a line (``"window figure 3/12"``) before each figure.
    Raises :class:`ReportError` for a malformed reference or one naming no estimate."""
    refs = _refs(result, references)
    say = progress or (lambda text: None)
    candidates = worst_windows(result)
    chosen = candidates if max_windows is None else candidates[: max(int(max_windows), 0)]
    drawn = sorted(chosen)
    title = title or "rigidjax fit report"
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    parts.append(
        f"<p>rigidjax {html.escape(_version())}, {stamp}; {result.mode} fit of {len(result.segments)} "
        f"window(s); options <code>{html.escape(str(result.options))}</code></p>"
    )
    if command:
        parts.append(f"<pre>$ {html.escape(command)}</pre>")
    parts.append(f"<h2>Status</h2><p id='status'>{_badge(result.status)} {html.escape(result.message)}</p>")
    if warnings:
        parts.append("<ul id='warnings'>" + "".join(f"<li>{html.escape(str(w))}</li>" for w in warnings) + "</ul>")
    for src, why in (result.combined.get("excluded") or {}).items():
        parts.append(f"<p class='excluded'>not pooled: {html.escape(str(src))}: {html.escape(str(why))}</p>")

    parts.append("<h2>Combined estimate</h2>")
    rows = []
    for k, v in result.estimates.items():
        lo, hi = result.intervals.get(k, (None, None))
        iv = f"[{lo:.5g}, {hi:.5g}]" if lo is not None and np.isfinite(lo) and np.isfinite(hi) else "—"
        ref, z = "", ""
        if k in refs:
            rv, re_ = refs[k]
            ref = f"{rv:.5g} ± {re_:.2g}"
            tot = result.total_uncertainties.get(k)
            e = math.hypot(re_, tot if tot is not None and np.isfinite(tot) else result.uncertainties.get(k) or 0)
            z = f"{(v - rv) / e:+.2f}" if e > 0 else ""
        rows.append([f"<span class='l'>{html.escape(k)}</span>", _num(v, result.uncertainties.get(k)), iv, ref, z])
    if rows:
        parts.append(
            _table(
                [
                    "quantity",
                    "estimate ± statistical 1σ",
                    "95 % interval (between-window scatter)",
                    "reference ± 1σ",
                    "(estimate − reference) / σ",
                ],
                rows,
                "estimates",
            )
        )
        if result.combined.get("method"):
            parts.append(
                f"<p>Interval: {html.escape(result.combined['method'])}. σ in the last column: the "
                "reference's and the total (between-window) error in quadrature.</p>"
            )
        bias = result.combined.get("bias") or {}  # joint mode or bias="rest": one gyroscope bias per recording
        b_rows = []
        for src, b in bias.items():
            rest = b.get("rest") or {"value": [None] * 3, "sd": [None] * 3}
            z = b.get("rest_z") or [None] * 3
            for i, a in enumerate("xyz"):
                t = (b.get("total_se") or [None] * 3)[i]
                if b.get("measured") == "at rest":
                    judged = "read at rest, subtracted"
                elif z[i] is None:
                    judged = "—"
                else:
                    judged = f"{z[i]:.1f}" + (" (contradicts)" if z[i] > b.get("rest_limit", np.inf) else "")
                b_rows.append(
                    [
                        f"<span class='l'>{html.escape(str(src))}</span>",
                        a,
                        _num(b["value"][i], b["se"][i]),
                        f"{t:.2g}" if t is not None else "—",
                        _num(rest["value"][i], rest["sd"][i]) if rest["value"][i] is not None else "—",
                        judged,
                    ]
                )
        for src, r in (result.combined.get("rest") or {}).items():  # per-window fits with a bias
            mine = [s for s in result.segments if s.get("recording") == src and "rest_agrees" in s]
            off = sum(not s["rest_agrees"] for s in mine)
            said = f"{off} of {len(mine)} window(s) beyond {mine[0]['rest_limit']:.2g}" if mine else "—"
            for i, a in enumerate("xyz"):
                b_rows.append(
                    [f"<span class='l'>{html.escape(str(src))}</span>", a, "per window", "—"]
                    + [_num(r["value"][i], r["sd"][i]), said]
                )
        if b_rows:
            head = [
                "recording",
                "axis",
                "gyroscope bias (rad/s) ± statistical 1σ",
                "total 1σ (between windows)",
                "read at rest ± scatter",
                "fitted - at rest (errors)",
            ]
            parts.append(_table(head, b_rows, "bias"))
    else:
        parts.append("<p>no estimate.</p>")
    rms = f"{result.rms:.4g} rad/s" if np.isfinite(result.rms) else "—"
    parts.append(f"<p>Residual RMS over the pooled windows: {rms}.</p>")
    parts.append("<h2>Inertia tensor and principal axes</h2>" + _inertia_html(result))

    parts.append("<h2>Windows</h2>")
    keys = _keys(result, refs)
    rows = []
    for i, s in enumerate(result.segments):
        own = _own(s)
        est, se = own.get("estimates") or {}, own.get("se") or {}
        shown = own.get("status") != FitStatus.UNIDENTIFIABLE
        rms_w = f"{s['rms']:.4f}" if s.get("rms") is not None and np.isfinite(s["rms"]) else "—"
        rows.append(
            [
                f"<a href='#fig-window-{i}'>{i}</a>" if i in drawn else str(i),
                f"<span class='l'>{html.escape(str(s['name']))}</span>",
                html.escape(str(s.get("comment", ""))),
                str(s["n"]),
                rms_w,
                _badge(s["status"]),
                html.escape(str(s.get("reason") or "")),
            ]
            + [_num(est.get(k), se.get(k)) if shown and k in est else "—" for k in keys]
        )
    parts.append(
        _table(
            ["#", "window", "comment", "n", "rms (rad/s)", "status", "reason"] + [f"own {k}" for k in keys],
            rows,
            "windows",
        )
    )

    parts.append("<h2>Figures</h2>")
    say(f"report: estimates figure, then {len(drawn)} window figure(s)")
    fig = estimates_figure(result, references=[(k, *v) for k, v in refs.items()])
    parts.append(
        f"<figure id='fig-estimates' class='figure'>{_svg(fig)}<figcaption>Per-window estimates (own fits, "
        "± 1σ), the combined estimate and its 95 % interval, and the references.</figcaption></figure>"
    )
    no_fit = sorted(set(range(len(result.segments))) - set(candidates))
    for j, i in enumerate(drawn):
        say(f"report: window figure {j + 1}/{len(drawn)} (window {i})")
        fig = window_figure(result, i)
        if fig is None:
            no_fit = sorted(no_fit + [i])
            continue
        parts.append(
            f"<figure id='fig-window-{i}' class='figure'>{_svg(fig)}<figcaption>Window {i}: measured "
            "(dots) and fitted (lines) body angular velocity in sensor axes, and the residual "
            "measured − fitted.</figcaption></figure>"
        )
    if no_fit:
        parts.append(
            "<p class='no-fit'>no fit to draw: "
            + ", ".join(f"window {i} ({html.escape(str(result.segments[i]['status']))})" for i in no_fit)
            + ".</p>"
        )
    left = len(candidates) - len(chosen)
    if left > 0:
        parts.append(
            f"<p class='left-out' id='figures-left-out'>{left} of {len(candidates)} window figures left out: drawn "
            f"are the {len(chosen)} with the worst status, then the largest residual (linked from the table). "
            f"All: <code>{html.escape(show_all)}</code>.</p>"
        )
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: InertiaFit, out_dir, **kw) -> Path:
    """Write :func:`report_html` to ``out_dir/index.html`` (the folder is created); returns
    its path, written whole or not at all (:func:`rigidjax.io.replacing`). Keywords as
    :func:`report_html`. Raises :class:`ReportError` or ``OSError``."""
    text = report_html(result, **kw)
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / "index.html"
    with replacing(p) as tmp:  # an interrupted write leaves no partial index.html
        tmp.write_text(text, encoding="utf-8")
    return p
