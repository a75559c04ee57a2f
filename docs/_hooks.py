"""MkDocs hooks of the rigidjax site (``hooks:`` in ``mkdocs.yml``).

* The notebooks (``notebooks/*.ipynb``, stored without outputs) become pages with their outputs:
  each is taken executed from ``$RIGIDJAX_NOTEBOOK_OUTPUTS`` when the test run wrote it there
  (``notebooks/conftest.py``: ``.ci/run`` executes the notebooks once, for the tests and the site)
  and its cells match the source, else from the cache ``.cache/rigidjax-docs`` when the notebook
  and the package are unchanged, else executed here (two kernels at a time, as nbmake would:
  working directory ``notebooks/``). A cell that raised, or a notebook without a figure, is a
  warning (an error under ``mkdocs build --strict``).
* MathJax 3 is served from the ``django-static-mathjax`` package (the ``docs`` extra), so
  equations render without a network: its SVG output (``tex-svg-full.js``), which needs no fonts.
* Checks (warnings, so ``--strict`` fails): every public name of every documented module has a
  docstring, and the built API reference has an anchor for every name in ``rigidjax.__all__``
  and in the ``__all__`` (or public namespace) of every module it documents.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib
import inspect
import json
import logging
import os
import re
import shutil
import types
from pathlib import Path

import mkdocs.plugins
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.plugins.rigidjax_docs")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CACHE = ROOT / ".cache" / "rigidjax-docs"
OUTPUTS_ENV = "RIGIDJAX_NOTEBOOK_OUTPUTS"
EXECUTE_ENV = "RIGIDJAX_DOCS_EXECUTE"  # "0": render the notebooks without outputs (a quick look)
TIMEOUT_S = 1800


# ---------------------------------------------------------------- notebooks


def _sources(nb: dict) -> list[tuple[str, str]]:
    return [
        (c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"]) for c in nb["cells"]
    ]


def _package_digest() -> str:
    h = hashlib.sha256()
    for p in sorted((ROOT / "rigidjax").rglob("*.py")):
        h.update(p.relative_to(ROOT).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def execute_notebook(src: Path, dest: Path) -> float:
    """Run ``src`` top to bottom (working directory ``notebooks/``, as nbmake) in a fresh kernel
    and write it with its outputs to ``dest``; a cell that raises stays in the outputs."""
    import subprocess
    import sys
    import time

    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", "--allow-errors"]
    cmd += [f"--ExecutePreprocessor.timeout={TIMEOUT_S}", "--output", dest.name, "--output-dir", str(dest.parent)]
    proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True)
    if proc.returncode:
        log.warning("notebook %s: nbconvert failed:\n%s", src.name, proc.stderr[-3000:])
    return time.perf_counter() - t0


def _problems(nb: dict) -> list[str]:
    out = []
    images = 0
    for i, cell in enumerate(nb["cells"]):
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error":
                out.append(f"cell {i} raised {o.get('ename')}: {o.get('evalue')}")
            images += any(k.startswith("image/") for k in o.get("data", {}))
    if not images:
        out.append("no figure in its outputs")
    return out


def executed_notebooks(config) -> dict[str, Path]:
    """Name -> executed copy of every notebook (see the module docstring)."""
    sources = sorted(NOTEBOOKS.glob("*.ipynb"))
    executed = CACHE / "notebooks"
    executed.mkdir(parents=True, exist_ok=True)
    if os.environ.get(EXECUTE_ENV, "1") == "0":
        log.info("rigidjax docs: notebooks rendered without executing them (%s=0)", EXECUTE_ENV)
        return {p.name: p for p in sources}
    digest = _package_digest()
    result, todo = {}, []
    given = os.environ.get(OUTPUTS_ENV)
    for src in sources:
        nb_src = json.loads(src.read_text())
        key = hashlib.sha256((digest + json.dumps(_sources(nb_src))).encode()).hexdigest()[:16]
        cached = executed / f"{src.stem}.{key}.ipynb"
        if given and (Path(given) / src.name).exists():
            candidate = Path(given) / src.name
            if _sources(json.loads(candidate.read_text())) == _sources(nb_src):
                shutil.copyfile(candidate, cached)
                log.info("rigidjax docs: %s executed by the test run (%s)", src.name, given)
            else:
                log.info("rigidjax docs: %s in %s is not of the current source; executing", src.name, given)
        if not cached.exists():
            todo.append((src, cached))
        result[src.name] = cached
    if todo:
        log.info("rigidjax docs: executing %s", ", ".join(s.name for s, _ in todo))
        # two kernels at a time (two cores; compilation is single-threaded)
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(2, len(todo))) as pool:
            futures = {pool.submit(execute_notebook, s, d.with_suffix(".tmp.ipynb")): (s, d) for s, d in todo}
            for fut in concurrent.futures.as_completed(futures):
                s, d = futures[fut]
                seconds = fut.result()
                tmp = d.with_suffix(".tmp.ipynb")
                if tmp.exists():
                    os.replace(tmp, d)
                    log.info("rigidjax docs: executed %s in %.0f s", s.name, seconds)
                else:
                    result[s.name] = s  # rendered without outputs; the warning above fails --strict
    for name, path in result.items():
        for problem in _problems(json.loads(path.read_text())):
            log.warning("notebook %s: %s", name, problem)
    for stale in executed.glob("*.ipynb"):  # older versions (and interrupted runs)
        if stale not in result.values():
            stale.unlink()
    return result


# ---------------------------------------------------------------- files


def _mathjax_files(config) -> list[File]:
    try:
        import mathjax  # django-static-mathjax: MathJax 3 as package data
    except ImportError:
        log.warning("django-static-mathjax is not installed (pip install -e '.[docs]'): equations will not render")
        return []
    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    # the SVG output draws its glyphs as paths: one file, no web fonts (the CHTML output needs its woff
    # files beside it); "full": every TeX extension built in, nothing loaded on demand
    return [File.generated(config, "assets/mathjax/tex-svg-full.js", abs_src_path=str(es5 / "tex-svg-full.js"))]


@mkdocs.plugins.event_priority(100)  # before mkdocs-jupyter's on_files turns .ipynb files into pages
def on_files(files: Files, config) -> Files:
    pages = CACHE / "pages"  # a real source folder: mkdocs-jupyter reads src_dir/src_path
    (pages / "notebooks").mkdir(parents=True, exist_ok=True)
    for name, path in executed_notebooks(config).items():
        shutil.copyfile(path, pages / "notebooks" / name)
        files.append(File(f"notebooks/{name}", str(pages), config["site_dir"], config["use_directory_urls"]))
    home = pages / "assets" / "home-figure.png"
    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_bytes(home_figure(pages / "notebooks" / HOME_NOTEBOOK))
    files.append(File("assets/home-figure.png", str(pages), config["site_dir"], config["use_directory_urls"]))
    for f in _mathjax_files(config):
        files.append(f)
    return files


HOME_NOTEBOOK = "01_quickstart.ipynb"
HOME_CELL = "cos_y_L"  # the cell of notebook 01 that draws a flip (else its first figure)


def _placeholder_png() -> bytes:
    """A 1x1 grey PNG: the home page's figure where the notebooks were not executed."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00\xc0")) + chunk(b"IEND", b"")
    )


def home_figure(notebook: Path) -> bytes:
    """The home page's figure: a flip of the tennis racket, drawn by notebook 01 when executed."""
    import base64

    images = []
    for cell in json.loads(notebook.read_text()).get("cells", []):
        src = "".join(cell.get("source", []))
        for o in cell.get("outputs", []):
            if "image/png" in o.get("data", {}):
                images.append((HOME_CELL in src, o["data"]["image/png"]))
    if not images:
        return _placeholder_png()
    chosen = next((img for hit, img in images if hit), images[0][1])
    return base64.b64decode("".join(chosen) if isinstance(chosen, list) else chosen)


# ---------------------------------------------------------------- checks

API_MODULES_FILE = "api"  # docs/api/*.md: one ``::: module`` block per documented module
BLOCK = re.compile(r"^:::\s+([\w.]+)[ \t]*\n((?:[ \t]+.*\n)*)", re.M)


def documented_modules(config, *, with_members: bool = True) -> list[str]:
    """Modules of the ``::: module`` blocks in docs/api (those with their members, by default;
    a block with ``members: false`` shows a submodule's docstring only, its names being
    documented in its package)."""
    docs = Path(config["docs_dir"]) / API_MODULES_FILE
    found = set()
    for p in docs.glob("*.md"):
        for name, options in BLOCK.findall(p.read_text() + "\n"):
            if not with_members or "members: false" not in options:
                found.add(name)
    return sorted(found)


def public_names(mod: types.ModuleType) -> list[str]:
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    return [
        n
        for n, v in vars(mod).items()
        if not n.startswith("_")
        and (inspect.isclass(v) or inspect.isfunction(v))
        and getattr(v, "__module__", None) == mod.__name__
    ]


def _needs_doc(v) -> bool:
    return inspect.isclass(v) or inspect.isfunction(v) or isinstance(v, types.ModuleType)


def check_docstrings(config) -> None:
    for modname in documented_modules(config):
        mod = importlib.import_module(modname)
        if not (mod.__doc__ or "").strip():
            log.warning("API: module %s has no docstring", modname)
        for name in public_names(mod):
            v = getattr(mod, name, None)
            if v is None and not hasattr(mod, name):
                log.warning("API: %s.__all__ names %r, which it does not define", modname, name)
            elif _needs_doc(v) and not (inspect.getdoc(v) or "").strip():
                log.warning("API: public name %s.%s has no docstring", modname, name)


def on_pre_build(config) -> None:
    check_docstrings(config)


ANCHOR = re.compile(r'\bid="(rigidjax[\w.]*)"')


def _objects(path: str) -> list:
    """The Python objects a dotted ``path`` can name: ``rigidjax.rollout`` is a module and, as an
    attribute of the package, a function; both readings are kept."""
    parts = path.split(".")
    if parts[0] != "rigidjax":
        return []  # e.g. a heading's slug "rigidjaxio"
    found = [importlib.import_module("rigidjax")]
    for i, part in enumerate(parts[1:], 2):
        nxt = [getattr(o, part) for o in found if hasattr(o, part)]
        try:
            nxt.append(importlib.import_module(".".join(parts[:i])))
        except ImportError:
            pass
        found = nxt
    return found


def on_post_build(config) -> None:
    site = Path(config["site_dir"])
    anchors = set()
    for page in (site / API_MODULES_FILE).rglob("*.html"):
        anchors |= set(ANCHOR.findall(page.read_text(encoding="utf-8")))
    # classes, functions and modules count wherever they are shown (under a package that
    # re-exports them, say); constants by their path
    shown = {id(o) for a in anchors for o in _objects(a) if _needs_doc(o)}
    import rigidjax

    wanted = {f"rigidjax.{n}" for n in rigidjax.__all__}
    for modname in documented_modules(config):
        wanted.add(modname)
        wanted |= {f"{modname}.{n}" for n in public_names(importlib.import_module(modname))}
    missing = []
    for path in sorted(wanted):
        if path not in anchors and not any(_needs_doc(o) and id(o) in shown for o in _objects(path)):
            missing.append(path)
    if missing:
        log.warning("API reference: no entry for %d public names: %s", len(missing), ", ".join(missing))
    else:
        log.info("rigidjax docs: the API reference has an entry for all %d public names", len(wanted))


# ---------------------------------------------------------------- generated tables

TABLE_MARK = "<!-- rigidjax.__all__ -->"


def _summary(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    first = re.sub(r":(?:py:)?\w+:`~?([\w.]+)`", r"`\1`", first)  # roles: shown as code here
    return first.replace("|", "\\|")


def all_table() -> str:
    """Markdown table of ``rigidjax.__all__``: each name linked to its reference entry."""
    import rigidjax

    rows = ["| name | what | summary |", "|---|---|---|"]
    for name in rigidjax.__all__:
        obj = getattr(rigidjax, name)
        kind = "module" if isinstance(obj, types.ModuleType) else "class" if inspect.isclass(obj) else "function"
        rows.append(f"| [`rigidjax.{name}`][rigidjax.{name}] | {kind} | {_summary(obj)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if TABLE_MARK in markdown:
        markdown = markdown.replace(TABLE_MARK, all_table())
    return markdown
