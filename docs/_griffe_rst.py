"""Griffe extension for the site: rigidjax's docstrings use Sphinx roles and ``.. math::`` inside
Google-style sections; mkdocstrings renders Markdown. This rewrites, before rendering:

* ``:class:`X```, ``:func:``, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``, ``:obj:``
  into autorefs links to the object's entry (``~`` shows the last component only), the name
  resolved as Sphinx would (in the docstring's scope, then absolutely); a name that resolves
  to no object of rigidjax (nor of a library it imports) is logged as a warning, so
  ``mkdocs build --strict`` fails on it;
* ``.. math::`` blocks (and one-line ``.. math:: formula``) into ``$$ ... $$`` (arithmatex);
* a paragraph ending in ``::`` before an indented literal block into ``:`` (Markdown's indented
  code block then shows the block).
"""

from __future__ import annotations

import logging
import re
import textwrap

import griffe

log = logging.getLogger("mkdocs.plugins.rigidjax_docs")

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|exc|obj):`(~?)([\w.]+)(?:\(\))?`")
MATH = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<inline>.*)$")


def _lookup(collection, path: str):
    try:
        return collection.get_member(path)
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def resolve(obj: griffe.Object, name: str) -> str | None:
    """Full path of ``name`` as seen from ``obj``'s docstring, or None."""
    collection = obj.modules_collection
    head, _, rest = name.partition(".")
    candidates = []
    if name.startswith("rigidjax"):
        candidates.append(name)
    try:
        base = obj.resolve(head)
        candidates.append(base + ("." + rest if rest else ""))
    except griffe.NameResolutionError:
        pass
    # Sphinx also looks in the enclosing class and module of a method or attribute
    scope = obj
    while scope is not None:
        candidates.append(f"{scope.path}.{name}")
        scope = scope.parent
    for path in candidates:
        target = _lookup(collection, path)
        if target is not None:
            try:
                return target.path if not target.is_alias else target.final_target.path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return EXTERNAL_TARGET  # an import of another library (``subprocess``, ``jax.lax``)
    return None


EXTERNAL_TARGET = "<external>"


EXTERNAL = ("jax", "jaxlib", "jaxlie", "equinox", "optimistix", "numpy", "scipy", "pandas", "matplotlib")


def _index(obj: griffe.Object) -> dict[str, list[str]]:
    """Last name -> full paths of every object of the package (built once per package)."""
    pkg = obj.package
    cached = getattr(pkg, "_rigidjax_docs_index", None)
    if cached is None:
        cached = {}

        def walk(o):
            for m in o.members.values():
                if not m.is_alias:
                    cached.setdefault(m.name, []).append(m.path)
                    walk(m)

        walk(pkg)
        pkg._rigidjax_docs_index = cached
    return cached


def _rendered(path: str) -> bool:
    """Whether the site documents ``path``: none of its components is private or special."""
    return not any(part.startswith("_") for part in path.split("."))


def on_site(obj: griffe.Object) -> bool:
    """Whether the site shows ``obj``'s docstring (under its own path or a public alias)."""
    return _rendered(obj.path) or any(_rendered(a) for a in obj.aliases)


def convert_roles(obj: griffe.Object, text: str) -> str:
    def repl(m: re.Match) -> str:
        role, tilde, name = m.groups()
        shown = name.rsplit(".", 1)[-1] if tilde else name
        if role in ("func", "meth"):
            shown += "()"
        path = resolve(obj, name)
        if path == EXTERNAL_TARGET or path is None and name.split(".")[0] in EXTERNAL:
            return f"`{shown}`"  # another library's name: shown, not linked
        if path is None:
            found = _index(obj).get(name.rsplit(".", 1)[-1], [])
            if len(found) == 1 and found[0].endswith(name):
                path = found[0]
        if path is None:
            if on_site(obj):  # a docstring the site shows: its broken reference fails --strict
                log.warning("%s: :%s:`%s` resolves to no object", obj.path, role, name)
            return f"`{shown}`"
        if not _rendered(path):
            return f"`{shown}`"  # a private helper's name: real, but not on the site
        # the object exists; linked where the site shows it (a public constant missing from its
        # module's __all__, or a member of a submodule shown without members, stays plain code)
        return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'

    return ROLE.sub(repl, text)


def convert_math(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = MATH.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent = m.group("indent")
        body = [m.group("inline")] if m.group("inline").strip() else []
        i += 1
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            block.append(lines[i])
            i += 1
        while block and not block[-1].strip():
            block.pop()
        trailing_blank = i < len(lines)
        body += textwrap.dedent("\n".join(block)).strip("\n").split("\n") if block else []
        if out and out[-1].strip():
            out.append("")
        out.append(f"{indent}$$")
        out.extend(f"{indent}{b}" if b.strip() else "" for b in body)
        out.append(f"{indent}$$")
        if trailing_blank:
            out.append("")
    return "\n".join(out)


LITERAL = re.compile(r"(?<=\S)::\n(\s*\n)")


def convert(obj: griffe.Object, text: str) -> str:
    text = convert_math(text)
    text = LITERAL.sub(r":\n\1", text)
    return convert_roles(obj, text)


class RstToMarkdown(griffe.Extension):
    """Rewrite every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        seen: set[int] = set()

        def visit(obj: griffe.Object) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = convert(obj, obj.docstring.value)
            for member in obj.members.values():
                if not member.is_alias:
                    visit(member)

        visit(pkg)
