"""The package's layering (docs/architecture.md), read from the source with ``ast``.

No import cycle; no import of rigidjax inside a function; a module imports only from its own
layer or below; a private name (``_x``) is imported only within one package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rigidjax"

#: docs/architecture.md's table: top-level module or package -> layer
LAYERS = {
    "__main__": 7,
    "__init__": 7,
    "cli": 6,
    "cli_fit": 6,
    "report": 6,
    "launch": 6,
    "identify": 5,
    "scenarios": 5,
    "synthetic": 5,
    "systems": 4,
    "lqr": 4,
    "midpoint": 3,
    "euler_parameters": 3,
    "variational": 3,
    "rollout": 2,
    "ensemble": 2,
    "newton": 2,
    "inertia": 2,
    "stepper": 1,
    "info": 1,
    "body": 1,
    "linalg": 1,
    "numerics": 0,
    "so3": 0,
    "io": 0,
    "reference": 0,
}


def _modules():
    """``{dotted name: path}`` of every module of the package."""
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _unit(module: str) -> str:
    """The top-level module or package a dotted name belongs to (``__init__`` for the root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> list[tuple[str, str]]:
    """``(imported rigidjax module, imported name)`` pairs of one ``from ... import``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if node.level:
        base = package.split(".")
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("rigidjax"):
        return []
    pairs = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        pairs.append((sub, alias.name) if sub in MODULES else (target, alias.name))
    return pairs


def _imports():
    """Per module: ``[(imported module, name, inside a function)]``."""
    out = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        found = []

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, ast.ImportFrom):
                    found.extend((m, n, in_function) for m, n in _resolve(module, path, child))
                elif isinstance(child, ast.Import):
                    found.extend((a.name, None, in_function) for a in child.names if a.name.startswith("rigidjax"))
                visit(child, inside)

        visit(tree, False)
        out[module] = found
    return out


IMPORTS = _imports()


def test_every_unit_has_a_layer():
    units = {_unit(m) for m in MODULES}
    assert units <= set(LAYERS), f"give these a layer in docs/architecture.md and here: {units - set(LAYERS)}"


def test_no_rigidjax_import_inside_a_function():
    bad = [(m, t) for m, found in IMPORTS.items() for t, _, inside in found if inside]
    assert not bad, f"imports inside functions (an import cycle dodged?): {bad}"


def test_imports_go_down_the_layers():
    bad = []
    for module, found in IMPORTS.items():
        for target, _, _ in found:
            if target == "rigidjax" or _unit(target) == _unit(module):
                continue
            if LAYERS[_unit(target)] > LAYERS[_unit(module)]:
                bad.append(f"{module} (layer {LAYERS[_unit(module)]}) imports {target} (layer {LAYERS[_unit(target)]})")
    assert not bad, "\n".join(bad)


def _packages_initialised(module: str, target: str) -> set[str]:
    """The packages Python initialises to import ``target`` from ``module``: every package
    above it (its ``__init__``) that ``module`` is not inside, the root aside (initialised
    first by any import)."""
    parts = target.split(".")
    above = {".".join(parts[:k]) for k in range(2, len(parts))}
    return {p for p in above if p in MODULES and not module.startswith(p + ".")}


def test_no_import_cycle():
    """No cycle, counting that importing ``a.b.c`` runs ``a.b``'s ``__init__`` first: a
    module that imported ``cli_fit._common`` while ``cli_fit`` imported it could not be
    imported first on its own (a partially initialised module)."""
    graph = {
        m: {t for t, _, _ in found if t in MODULES and t != m}
        | {p for t, _, _ in found for p in _packages_initialised(m, t) if p != m}
        for m, found in IMPORTS.items()
    }
    # a package's __init__ re-exports its modules: edges into it stand for its modules, so
    # only cycles among plain modules and between distinct units count
    state = {}

    def dfs(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if MODULES[nxt].name == "__init__.py" and node.startswith(nxt + "."):
                continue  # a module importing its own package's __init__ sibling re-export
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt) :] + [nxt]
                if len({_unit(c) for c in cycle}) > 1 or all(MODULES[c].name != "__init__.py" for c in cycle):
                    pytest.fail("import cycle: " + " -> ".join(cycle))
            elif not state.get(nxt):
                dfs(nxt, stack)
        stack.pop()
        state[node] = 2

    for m in graph:
        if not state.get(m):
            dfs(m, [])


def test_private_names_stay_inside_one_package():
    bad = []
    for module, found in IMPORTS.items():
        for target, name, _ in found:
            if name and name.startswith("_") and not name.startswith("__"):
                same_package = "." in module[len("rigidjax.") :] and _unit(target) == _unit(module)
                if not same_package:
                    bad.append(f"{module} imports {name} from {target}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_above_600_lines(module):
    n = len(MODULES[module].read_text().splitlines())
    assert n <= 620, f"{module}: {n} lines (split it by job)"
