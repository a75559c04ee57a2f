"""Build the documentation site in strict mode (what CI runs): ``python docs/build.py``.

Strict: a warning fails the build. Warnings are: a cross-reference that resolves nowhere (in a
page or a docstring), a public name without a docstring or without an entry in the API
reference, a broken link or snippet, a notebook cell that raises or a notebook without a figure
(``docs/_hooks.py``). The notebooks are executed for the site unless the test run left executed
copies (``RIGIDJAX_NOTEBOOK_OUTPUTS=DIR``, see ``notebooks/conftest.py``) or they are cached
unchanged in ``.cache/rigidjax-docs``.

Options: ``--no-execute`` renders the notebooks without outputs (a quick look at the pages; the
figure check is skipped, and the home page has no figure); ``--site-dir DIR`` (default
``site/``). Serve while writing: ``mkdocs serve``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-execute", action="store_true", help="render the notebooks without executing them")
    ap.add_argument("--site-dir", default="site", help="output folder (default: site/)")
    args = ap.parse_args(argv)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    if args.no_execute:
        env["RIGIDJAX_DOCS_EXECUTE"] = "0"
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", args.site_dir]
    status = subprocess.call(cmd, cwd=ROOT, env=env)
    outcome = "passed" if status == 0 else "FAILED"
    print(f"docs/build.py: mkdocs build --strict {outcome} in {time.perf_counter() - t0:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
