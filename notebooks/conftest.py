"""pytest settings for the notebooks (run with ``--nbmake``).

With ``RIGIDJAX_NOTEBOOK_OUTPUTS=DIR`` set, every notebook nbmake executes is also written, with
its outputs, to ``DIR/<name>.ipynb``: ``.ci/run`` sets it, and the documentation build
(``docs/build.py``, ``docs/_hooks.py``) renders those copies instead of executing the notebooks a
second time. Unset (the default), nothing is written and nbmake runs as usual.
"""

import os
from pathlib import Path

OUTPUTS = os.environ.get("RIGIDJAX_NOTEBOOK_OUTPUTS")

if OUTPUTS:
    import nbformat
    from nbmake import nb_run

    _execute = nb_run.NotebookRun.execute

    def _execute_and_keep(self):
        result = _execute(self)
        out = Path(OUTPUTS)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{Path(self.filename).name}.{os.getpid()}"
        nbformat.write(result.nb, str(tmp))
        os.replace(tmp, out / Path(self.filename).name)
        return result

    nb_run.NotebookRun.execute = _execute_and_keep
