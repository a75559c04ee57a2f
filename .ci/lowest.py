"""Print the package's dependencies pinned to their declared lower bounds (``name>=v`` ->
``name==v``), one per line, for the oldest-versions check in ``.ci/run``."""

import pathlib
import re
import tomllib

project = tomllib.loads((pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
for dep in project["dependencies"]:
    # a lower bound, optionally followed by excluded versions (name>=v,!=w)
    m = re.fullmatch(r"\s*([A-Za-z0-9_.\-\[\]]+)\s*>=\s*([0-9][^,;\s]*)\s*((?:,\s*!=\s*[0-9][^,;\s]*\s*)*)", dep)
    if not m:
        raise SystemExit(f"lowest.py: dependency {dep!r} has no plain lower bound 'name>=version'")
    print(f"{m.group(1)}=={m.group(2)}")
