"""``rigidjax fit --json`` (covariance, inertia tensor, principal moments and axes) and
``--report DIR`` (the HTML report), on one run of the embedded demo (3 tosses, known truth)."""

import contextlib
import html.parser
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rigidjax.cli import main
from rigidjax.cli_fit import NO_CACHE_ENV
from rigidjax.identify._combine import median_se_stat
from rigidjax.identify import FitStatus, InertiaFit
from rigidjax.identify._model import Spec
from rigidjax.identify._principal import combined_covariance
from rigidjax.report import report_html, write_report
from rigidjax.report import ReportError, parse_reference

REFS = ["Ix/Iy=13.5+-4", "Iz/Iy=14.9+-3"]


def _run_demo(d):
    old = os.environ.get(NO_CACHE_ENV)
    os.environ[NO_CACHE_ENV] = "1"  # the persistent cache is checked in test_cli_fit.py
    try:
        argv = ["fit", "--tosses", "3", "--starts", "2", "--quiet", "--json", str(d / "fit.json")]
        argv += ["--report", str(d / "report")] + [a for r in REFS for a in ("--reference", r)]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(argv)
    finally:
        if old is None:
            os.environ.pop(NO_CACHE_ENV)
        else:
            os.environ[NO_CACHE_ENV] = old
    (d / "run.json").write_text(json.dumps({"code": code, "printed": out.getvalue()}))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One demo fit (joint, full tensor, drag, bias, scale Iy) with --json and --report (~15 s):
    ``(exit code, printed, JSON, report path)``. Run once per test session: pytest-xdist's
    workers share it through a folder under a file lock (POSIX; elsewhere each worker runs it)."""
    base = tmp_path_factory.getbasetemp()  # under xdist, its parent is this session's, shared by the workers
    d = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "rigidjax-report-demo"
    d.mkdir(exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover (Windows)
        fcntl = None
    with open(d / "lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if not (d / "run.json").exists():
            _run_demo(d)
    run = json.loads((d / "run.json").read_text())
    return run["code"], run["printed"], json.loads((d / "fit.json").read_text()), d / "report" / "index.html"


def test_embedded_default_recovers_truth(demo):
    code, printed, d, _ = demo
    assert code == 0, printed
    assert "No PATH given: synthesised 3 tosses" in printed and "truth (synthetic)" in printed
    assert d["mode"] == "joint" and d["status"] == "converged" and len(d["segments"]) == 3
    assert d["options"]["tensor"] and d["options"]["drag"] == "isotropic" and d["options"]["bias"]
    for key in ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "drag/Iy", "Ix", "Iz"):
        est, se, truth = d["estimates"][key], d["uncertainties"][key], d["truth"][key]
        assert abs(est - truth) < 4 * se, (key, est, se, truth)  # noise-implied uncertainty
        lo, hi = d["intervals"][key]
        assert lo <= truth <= hi
    assert d["uncertainties"]["Ix/Iy"] < 0.01 * d["truth"]["Ix/Iy"]
    # every estimated quantity with a truth is compared, bias and drag included
    z_line = next(line for line in printed.splitlines() if line.startswith("estimate - truth in standard errors"))
    for key in ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "drag/Iy", "drag", "misalignment_deg", "bias_x", "bias_y", "bias_z"):
        assert f" {key} " in z_line, (key, z_line)
    assert "± ?" not in printed


def test_json_covariance(demo):
    _, _, d, _ = demo
    c = d["covariance"]
    assert c["parameters"] == ["Ix/Iy", "Iz/Iy", "Ixy/Iy", "Ixz/Iy", "Iyz/Iy", "drag/Iy", "bias_x", "bias_y", "bias_z"]
    C = np.array(c["matrix"])
    assert C.shape == (9, 9)
    np.testing.assert_allclose(C, C.T, rtol=1e-10, atol=1e-18)
    w = np.linalg.eigvalsh(C)
    assert w.min() > 0, w  # a determined fit: positive definite
    # the reported statistical errors are this matrix's diagonal (the derived map is the
    # identity on these coordinates; central differences: ~1e-9 relative)
    for j, name in enumerate(c["parameters"][:6]):
        assert np.sqrt(C[j, j]) == pytest.approx(d["uncertainties"][name], rel=1e-6), name
    # the joint fit's cluster-robust covariance over windows, and each window's own
    assert np.array(c["matrix_total"]).shape == (9, 9)
    # one total error per quantity: the total covariance's diagonal is the total uncertainty
    # the intervals use, and so is the tensor's propagated se_total (I_xx = Iy x Ix/Iy here)
    T = np.array(c["matrix_total"])
    for j, name in enumerate(c["parameters"][:6]):
        assert np.sqrt(T[j, j]) == pytest.approx(d["total_uncertainties"][name], rel=1e-9), name
    tensor = d["inertia"]["tensor"]
    assert tensor["se_total"][0][0] == pytest.approx(d["total_uncertainties"]["Ix"], rel=1e-9)
    assert tensor["se_total"][2][2] == pytest.approx(d["total_uncertainties"]["Iz"], rel=1e-9)
    # the biases' total errors are combined["bias"]'s, printed in the report's bias table
    (b,) = d["combined"]["bias"].values()
    for j in range(3):
        assert np.sqrt(T[6 + j, 6 + j]) == pytest.approx(b["total_se"][j], rel=1e-9)
    page = demo[3].read_text()
    assert "gyroscope bias (rad/s) ± statistical 1σ" in page and f"{b['total_se'][0]:.2g}" in page
    own = d["segments"][0]["own"]["covariance"]
    assert own["parameters"][:6] == c["parameters"][:6] and np.array(own["matrix"]).shape == (9, 9)


def test_json_principal_axes_against_truth(demo):
    _, _, d, _ = demo
    inr = d["inertia"]
    assert inr["frame"].startswith("sensor (phone) axes") and inr["unit"] == "kg m^2"
    T_true = np.array(d["truth"]["inertia"])  # the generating tensor, sensor axes (kg m^2)
    m_true, V_true = np.linalg.eigh(T_true)
    T = np.array(inr["tensor"]["value"])
    m, se = np.array(inr["principal_moments"]["value"]), np.array(inr["principal_moments"]["se"])
    R = np.array(inr["principal_axes"]["rotation"])
    np.testing.assert_allclose(R.T @ R, np.eye(3), atol=1e-12)
    assert np.linalg.det(R) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(R @ np.diag(m) @ R.T, T, rtol=1e-10, atol=1e-14)
    # noise-only errors on noisy synthetic data: within 4 standard errors
    assert np.all(np.abs(m - m_true) < 4 * se), (m, m_true, se)
    # each axis's tilt is two-dimensional: se_deg is its RMS angle; 3x RMS is exceeded with
    # probability exp(-9) for a normal tilt
    for k in range(3):
        angle = np.degrees(np.arccos(min(1.0, abs(R[:, k] @ V_true[:, k]))))
        assert angle < 3 * inr["principal_axes"]["se_deg"][k], (k, angle)
    # the axes are tilted from the phone's by the demo's sensor misalignment (2.9 deg)
    assert 1 < np.degrees(np.arccos(np.max(np.abs(R), 0).min())) < 5


def test_delta_method_against_sampling(demo):
    """The delta-method errors of the moments and axes against sampling the parameters from
    their covariance (4000 draws: the sampled spreads carry ~1-2 % sampling error; the map is
    nearly linear at these errors, so 10 % is ample and still catches a factor-2 slip)."""
    _, _, d, _ = demo
    names = d["covariance"]["parameters"][:5]  # the tensor's coordinates (Ix/Iy, Iz/Iy, Ixy/Iy, Ixz/Iy, Iyz/Iy)
    C = np.array(d["covariance"]["matrix"])[:5, :5]
    x = np.array([d["estimates"][n] for n in names])
    iy = d["options"]["scale"][1]
    rng = np.random.default_rng(0)
    draws = rng.multivariate_normal(x, C, size=4000)
    ixx, izz, ixy, ixz, iyz = draws.T  # written out: the tensor over I_yy, times the given I_yy
    T = iy * np.stack([np.stack([ixx, ixy, ixz], -1), np.stack([ixy, np.ones_like(ixx), iyz], -1),
                       np.stack([ixz, iyz, izz], -1)], -2)  # fmt: skip
    m, V = np.linalg.eigh(T)
    inr = d["inertia"]
    np.testing.assert_allclose(m.std(0), inr["principal_moments"]["se"], rtol=0.1)
    R = np.array(inr["principal_axes"]["rotation"])
    for k in range(3):
        ang = np.degrees(np.arccos(np.minimum(1.0, np.abs(V[:, :, k] @ R[:, k]))))
        assert np.sqrt(np.mean(ang**2)) == pytest.approx(inr["principal_axes"]["se_deg"][k], rel=0.1), k
    se_T = np.array(inr["tensor"]["se"])
    np.testing.assert_allclose(T.std(0)[se_T > 0], se_T[se_T > 0], rtol=0.1)
    assert se_T[1, 1] == 0  # I_yy is fixed by the scale


def test_combined_covariance_diagonal_is_the_median_error():
    """Per-window mode: for uncorrelated parameters the diagonal of (pi/2)(sum C_i^-1)^-1 is the
    square of the reported 1.2533 / sqrt(sum 1/se^2) (rigidjax.identify._combine)."""
    se = np.array([[0.1, 0.3], [0.2, 0.1], [0.4, 0.2]])
    stat, total = combined_covariance([np.diag(s**2) for s in se], np.array([[1.0, 2.0], [1.1, 2.2], [0.9, 2.1]]))
    for j in range(2):
        assert np.sqrt(stat[j, j]) == pytest.approx(median_se_stat(se[:, j]), rel=1e-4)  # 1.2533 vs sqrt(pi/2)
    assert total[0, 0] == pytest.approx(np.pi / 2 * np.var([1.0, 1.1, 0.9], ddof=1) / 3)


def _per_window_result(n=5, bad=(3,)):
    """A per-window result of ``n`` windows without fitting (predict drawn from a sine)."""
    rng = np.random.default_rng(0)
    vals = np.array([13.8, 14.8]) + 0.5 * rng.standard_normal((n, 2))
    segs = [
        dict(
            name=f"rec #{i}",
            comment="",
            n=50,
            rms=0.1 + 0.01 * i,
            status=FitStatus.POOR_FIT if i in bad else FitStatus.CONVERGED,
            reason="",
            estimates={"Ix/Iy": v[0], "Iz/Iy": v[1]},
            se={"Ix/Iy": 0.2, "Iz/Iy": 0.2},
        )
        for i, v in enumerate(vals)
    ]
    pooled = [i for i in range(n) if i not in bad]
    res = InertiaFit(
        mode="per-window",
        options={},
        status=FitStatus.POOR_FIT,
        message="test",
        estimates={"Ix/Iy": 13.85, "Iz/Iy": 14.78},
        uncertainties={"Ix/Iy": 0.1, "Iz/Iy": 0.1},
        total_uncertainties={"Ix/Iy": 0.4054, "Iz/Iy": 0.39},
        intervals={"Ix/Iy": (13.0, 14.6), "Iz/Iy": (14.0, 15.5)},
        segments=segs,
        combined={"windows": pooled, "n": len(pooled), "sources": ["rec"]},
        rms=0.1,
        _model={"spec": Spec(tensor=False, drag=None, bias=False), "cov": [np.diag([0.04, 0.04])] * n},
    )
    t = np.linspace(0, 1, 50)
    w = np.stack([np.sin(5 * t), np.cos(5 * t), t], 1)
    res.predict = lambda i: (t, w + 0.01, w)
    return res


def test_per_window_total_covariance_is_the_total_uncertainty():
    """Per-window mode: matrix_total keeps the windows' correlations, its diagonal (and the
    tensor's se_total of I_xx/I_yy, I_zz/I_yy) is total_uncertainties squared: one total error."""
    res = _per_window_result()
    c = res.covariance()
    T = c["matrix_total"]
    vals = np.array([[res.segments[i]["estimates"][k] for k in ("Ix/Iy", "Iz/Iy")] for i in (0, 1, 2, 4)])
    raw = combined_covariance([np.diag([0.04, 0.04])] * 4, vals)[1]
    corr = lambda m: m[0, 1] / np.sqrt(m[0, 0] * m[1, 1])  # noqa: E731
    assert corr(T) == pytest.approx(corr(raw), rel=1e-9)
    tensor = res.inertia()["tensor"]
    for j, name in enumerate(("Ix/Iy", "Iz/Iy")):
        assert np.sqrt(T[j, j]) == pytest.approx(res.total_uncertainties[name], rel=1e-9)
        assert tensor["se_total"][2 * j][2 * j] == pytest.approx(res.total_uncertainties[name], rel=1e-9)


def test_report_draws_the_worst_windows_first():
    """max_windows: the worst status, then the largest residual, are drawn (in table order),
    linked from the table; a note counts the rest and names how to show them all."""
    res = _per_window_result(n=4, bad=(1,))
    said = []
    text = report_html(res, max_windows=2, show_all="--report-windows all", progress=said.append)
    p = _Collect()
    p.feed(text)
    assert set(p.figures) == {"fig-estimates", "fig-window-1", "fig-window-3"}  # poor_fit, then largest rms
    assert "2 of 4 window figures left out" in text and "--report-windows all" in text
    assert "href='#fig-window-3'" in text and "href='#fig-window-0'" not in text
    assert said[-2:] == ["report: window figure 1/2 (window 1)", "report: window figure 2/2 (window 3)"]
    assert "<image" in text  # rasterised traces
    text = report_html(res)  # every window
    p = _Collect()
    p.feed(text)
    assert len(p.figures) == 5 and "left out" not in text


def test_write_report_is_whole_or_absent(tmp_path, monkeypatch):
    """write_report writes index.html whole or not at all: a write interrupted part-way (a
    full disk, Ctrl-C) leaves the previous report as it was and no temporary file; a
    complete rewrite keeps the file's permission bits."""
    res = _per_window_result(n=2, bad=())
    out = write_report(res, tmp_path / "rep", max_windows=0)
    before = out.read_bytes()
    assert before.rstrip().endswith(b"</html>")

    def broken(self, text, encoding=None):
        with open(self, "w", encoding=encoding) as f:
            f.write(text[:100])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", broken)
    with pytest.raises(KeyboardInterrupt):
        write_report(res, tmp_path / "rep", max_windows=0)
    assert out.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["index.html"]
    monkeypatch.undo()
    out.chmod(0o600)  # a replaced report keeps the permissions the user gave it
    write_report(res, tmp_path / "rep", max_windows=0)
    assert out.stat().st_mode & 0o777 == 0o600 and out.read_bytes().rstrip().endswith(b"</html>")


class _Collect(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.figures, self.tables, self.stack, self.tags = {}, {}, [], set()
        self._fig = self._table = self._row = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        if tag == "figure":
            self._fig = a.get("id")
            self.figures[self._fig] = 0
        elif tag == "svg" and self._fig:
            self.figures[self._fig] += 1
        elif tag == "table":
            self._table = a.get("class")
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
        for k in ("src", "href"):
            assert not str(a.get(k, "")).startswith(("http:", "https:", "//")), (tag, a)

    def handle_endtag(self, tag):
        if tag == "figure":
            self._fig = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._row is not None and data.strip():
            self._row.append(data.strip())


def test_report_html_parses(demo):
    _, _, d, path = demo
    p = _Collect()
    p.feed(path.read_text(encoding="utf-8"))
    # the estimates figure and one figure per window (measured vs fitted, residual), inline SVG
    assert p.figures == {"fig-estimates": 1, "fig-window-0": 1, "fig-window-1": 1, "fig-window-2": 1}
    assert "script" not in p.tags and "img" not in p.tags  # nothing to fetch, nothing to run
    windows = p.tables["windows"][1:]
    assert len(windows) == 3 and all("converged" in row for row in windows)
    est = {row[0]: row for row in p.tables["estimates"][1:]}
    assert set(d["estimates"]) == set(est)
    assert "13.5 ± 4" in est["Ix/Iy"] and "14.9 ± 3" in est["Iz/Iy"]
    assert len(p.tables["principal"]) == 4 and len(p.tables["tensor"]) == 4
    text = path.read_text(encoding="utf-8")
    assert re.search(r"id='status'><span class=\"status converged\">converged</span>", text)


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_report_renders_in_chromium(demo, tmp_path):
    """Headless Chromium lays the report out: every figure's SVG has a drawn size and text."""
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium or Chrome on PATH (chromium, chromium-browser, google-chrome): render check skipped")
    _, _, _, path = demo
    probe = (
        "<script>addEventListener('load',()=>{const r=[...document.querySelectorAll('figure svg')].map(s=>{"
        "const b=s.getBoundingClientRect();return [s.closest('figure').id,b.width,b.height,"
        "s.querySelectorAll('path,use').length]});const p=document.createElement('pre');p.id='probe';"
        "p.textContent=JSON.stringify(r);document.body.appendChild(p)})</script></body>"
    )
    page = tmp_path / "probe.html"
    page.write_text(path.read_text(encoding="utf-8").replace("</body>", probe), encoding="utf-8")
    out = subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1200,900",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
    )
    m = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout)
    assert m, out.stderr[-2000:]
    figs = json.loads(m.group(1).replace("&quot;", '"'))
    assert [f[0] for f in figs] == ["fig-estimates", "fig-window-0", "fig-window-1", "fig-window-2"]
    for fid, w, h, n in figs:
        assert w > 300 and h > 150 and n > 10, (fid, w, h, n)


def test_reference_and_report_errors_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(NO_CACHE_ENV, "1")
    assert main(["fit", "--report", str(tmp_path / "r"), "--reference", "Ix/Iy=13.5+-x"]) == 2
    assert "NAME=VALUE[+-SIGMA]" in capsys.readouterr().err
    assert main(["fit", "--report", str(tmp_path / "r"), "--reference", "Iq=1"]) == 2
    assert "not an estimate's name" in capsys.readouterr().err
    assert main(["fit", "--reference", "Ix/Iy=13.5+-4"]) == 2
    assert "give --report DIR too" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("")
    assert main(["fit", "--report", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before anything was fitted or written
    assert parse_reference("Iz/Iy = 14.9 ± 3") == ("Iz/Iy", 14.9, 3.0)
    with pytest.raises(ReportError, match="sigma >= 0"):
        parse_reference("Ix/Iy=1+--2")
