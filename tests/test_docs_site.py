"""The built documentation site in headless Chromium: the home page shows its figure, a stepper's
concept page, an API page and a notebook's Markdown show their equations typeset (and drawn) by
MathJax, and a notebook page its figures.

Needs a built site (``python docs/build.py``; ``site/`` or ``$RIGIDJAX_DOCS_SITE``), Chromium
(``chromium``, ``chromium-browser`` or ``google-chrome`` on the PATH, e.g. Debian's ``chromium``
package) and Playwright (the ``docs`` extra; it drives that Chromium, no browser download).
Skipped with a message where any is absent: ``.ci/run`` runs this file again after building the
site. Screenshots go to ``$RIGIDJAX_DOCS_SCREENSHOTS`` when set (else pytest's tmp_path).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("RIGIDJAX_DOCS_SITE", ROOT / "site"))
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def _missing() -> str | None:
    if not (SITE / "index.html").exists():
        return f"no built site at {SITE} (python docs/build.py builds it)"
    if CHROMIUM is None:
        return "no Chromium on the PATH (Debian: apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[docs]')"
    return None


# collected and skipped one by one (a module-level skip collects nothing: pytest would exit 5
# when .ci/run runs this file alone)
MISSING = _missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture(scope="module")
def server():
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(SITE))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def page(server):
    from playwright import sync_api

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.errors = errors
        yield page
        browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    out = os.environ.get("RIGIDJAX_DOCS_SCREENSHOTS")
    path = Path(out) if out else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _images(page, selector="img"):
    """(src, natural width, natural height) of every image matching ``selector``, once loaded."""
    page.wait_for_load_state("load")
    return page.eval_on_selector_all(
        selector, "els => els.map(e => [e.getAttribute('src'), e.naturalWidth, e.naturalHeight])"
    )


def _equations(page, timeout_ms=20000):
    """(width, height) of every typeset equation (MathJax's containers) and any MathJax error on the page.

    Every container must also hold drawn glyphs: an SVG with paths (the site's output), or CHTML
    characters whose CSS rule is in MathJax's stylesheet; equations without them (blank, the
    containers keeping their boxes) fail here."""
    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=timeout_ms)
    page.evaluate("() => MathJax.startup.promise")
    page.wait_for_selector("mjx-container", timeout=timeout_ms)
    boxes = page.eval_on_selector_all(
        "mjx-container", "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; })"
    )
    errors = page.eval_on_selector_all("mjx-merror, .MathJax_Error", "els => els.map(e => e.textContent)")
    blank = page.evaluate(BLANK_EQUATIONS)
    assert not blank, f"{blank} of {len(boxes)} equations typeset without any drawn glyph (blank)"
    return boxes, errors


# containers with nothing drawn: no SVG path, and no CHTML character whose ::before rule (its glyph)
# is in MathJax's stylesheet
BLANK_EQUATIONS = """() => {
  const css = [...document.querySelectorAll("style")].map(s => s.textContent).join(" ");
  const rule = k => css.includes("." + k + "::before") || css.includes("." + k + ".");  // mjx-c.mjx-c3C9.TEX-I::before
  const drawn = ch => [...ch.classList].some(k => k.startsWith("mjx-c") && rule(k));
  return [...document.querySelectorAll("mjx-container")].filter(
    c => !c.querySelector("svg path, svg use") && ![...c.querySelectorAll("mjx-c")].some(drawn)
  ).length;
}"""


def test_home_page_shows_its_figure(page, server, shots):
    page.goto(f"{server}/")
    images = [i for i in _images(page) if i[0] and "home-figure" in i[0]]
    page.screenshot(path=str(shots / "home.png"), full_page=False)
    assert images, "the home page has no <img> of its figure"
    src, w, h = images[0]
    assert w > 200 and h > 100, f"the home figure did not load as a drawn figure: {w}x{h} px ({src})"
    assert "rigidjax" in page.title()
    assert not page.errors, page.errors


def test_stepper_page_typesets_its_equations(page, server, shots):
    page.goto(f"{server}/steppers/midpoint/")
    boxes, errors = _equations(page)
    page.screenshot(path=str(shots / "midpoint.png"), full_page=False)
    assert not errors, f"MathJax errors: {errors}"
    display = [b for b in boxes if b[0] > 200 and b[1] > 30]
    assert len(display) >= 2, f"expected the step's display equations typeset; boxes {boxes[:6]}"
    assert page.locator("mjx-container").first.is_visible()
    assert not page.errors, page.errors


def test_api_page_typesets_docstring_math(page, server):
    page.goto(f"{server}/api/midpoint/")
    boxes, errors = _equations(page)
    assert not errors, f"MathJax errors: {errors}"
    assert any(w > 200 for w, _ in boxes), "the package docstring's .. math:: block was not typeset"
    # the Sphinx roles of the docstrings became links to their entries
    assert page.locator("a.autorefs-internal").count() > 10


def test_notebook_markdown_math_is_typeset(page, server):
    # notebook 06's Markdown cells: a $$...$$ display in a <p> and inline $...$ in list items
    page.goto(f"{server}/notebooks/06_gradients/")
    boxes, errors = _equations(page)
    assert not errors, f"MathJax errors: {errors}"
    assert len(boxes) >= 3 and any(w > 200 and h > 30 for w, h in boxes), f"boxes {boxes}"


def test_notebook_page_shows_its_figures(page, server, shots):
    page.goto(f"{server}/notebooks/01_quickstart/")
    drawn = [i for i in _images(page) if i[1] > 200 and i[2] > 100]
    page.screenshot(path=str(shots / "notebook01.png"), full_page=False)
    assert len(drawn) >= 2, f"notebook 01's page shows {len(drawn)} figures"
