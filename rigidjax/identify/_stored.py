"""Traced programs kept on disk, so that a repeated command neither traces nor compiles.

JAX's persistent compilation cache skips XLA's compilation on a repeated run, but every run
still traces and lowers each jitted function (Python: ~0.3 s per evaluator of
:func:`rigidjax.identify._model.evaluator`, measured on the 2-core VM). :func:`stored` wraps a
jitted function so that, once a folder is set with :func:`keep_programs` (the command line does
it, next to the compilation cache), every call signature is exported once with
:mod:`jax.export`, serialised into the folder, and on later runs deserialised instead of traced
(~3 ms); its compiled executable then comes from the compilation cache. Measured on the
tensor + drag + bias evaluator (32 lanes, 128 samples): trace, lower and load from the
compilation cache 0.48 s; deserialise and load 0.15 s.

What is stored: the evaluators and simulator of :func:`rigidjax.identify.fit_inertia`, and the
programs of :func:`rigidjax.identify.fit` (residuals and Jacobian, the values' Jacobian) for a
problem whose parts all have a description that holds across processes
(:func:`rigidjax.identify._program_key._stable`: functions and classes of rigidjax or JAX, named
by module, name and line under the source fingerprint below; data by a digest of their
bytes), e.g. every problem the command line builds (:mod:`rigidjax.identify.recipes`). A
problem holding a function or class of the user's own (a ``where`` selector written in a
notebook, an observation or model subclass) is never stored: its code is not in the
fingerprint. Measured (2-core VM, a 300-sample torque CSV): a repeated
``rigidjax fit`` spent ~3.7 s in the fit with the compilation cache alone, 1.6 s with the
store.

Without a folder (the library's default: it never writes into the user's folders on its own)
the jitted function is called as it is. A file is named by a fingerprint of everything the
trace depends on: the source of the installed ``rigidjax`` package, the JAX, jaxlib, equinox
and NumPy versions, the default backend, ``jax_enable_x64`` and the default matmul precision, the
program's key and the arguments' shapes and dtypes; it holds a checksum over that name and its
bytes. A file is used only where the checksum holds, its arguments are the call's and it
compiles; else the program is traced again and the file replaced (one warning names it), so the
store can only save time, never change a result. Files unused for :data:`MAX_AGE_S` (an
upgrade's leftovers, other checkouts sharing the folder) are removed when a new one is written.
A folder that cannot be written gives one warning per process; the fit goes on.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import jax
import numpy as np

__all__ = ["keep_programs", "folder", "stored"]

_FOLDER: Path | None = None
_SUFFIX = ".jaxexport"


def keep_programs(path) -> None:
    """Keep the traced programs of :func:`rigidjax.identify.fit_inertia` and
    :func:`rigidjax.identify.fit` (problems built from rigidjax's own functions) in the folder ``path``
    (created when first written; ``None``: off, the default), so that a later process with the
    same rigidjax, JAX and arguments' shapes loads them instead of tracing them. The command
    line sets ``<user cache>/rigidjax/programs`` (off with ``--no-cache``). Pair it with JAX's
    persistent compilation cache (``jax_compilation_cache_dir``), which skips the compiling;
    what is stored, when files are replaced and the measured gain: :mod:`rigidjax.identify._stored`."""
    global _FOLDER
    _FOLDER = None if path is None else Path(path)


def folder() -> Path | None:
    """The folder set by :func:`keep_programs`, or ``None``."""
    return _FOLDER


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _fingerprint() -> str:
    import equinox
    import jaxlib

    parts = (
        _source_digest(),
        jax.__version__,
        jaxlib.__version__,
        equinox.__version__,
        np.__version__,
        jax.default_backend(),
        bool(jax.config.jax_enable_x64),
        str(jax.config.jax_default_matmul_precision),
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _signature(args) -> tuple:
    """``(tree structure, ((shape, dtype) per leaf))`` of the call's arguments (pytrees of arrays)."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    shapes = tuple(
        (tuple(np.shape(a)), str(np.asarray(a).dtype if not hasattr(a, "dtype") else a.dtype)) for a in leaves
    )
    return str(tree), shapes, tree


class _Stored:
    def __init__(self, jitted, key):
        self.jitted = jitted
        self.key = key
        self._calls = {}

    def __call__(self, *args):
        d = _FOLDER
        if d is None:
            return self.jitted(*args)
        tree_str, shapes, tree = _signature(args)
        sig = (str(d), tree_str, shapes)
        f = self._calls.get(sig)
        if f is None:
            f = self._calls[sig] = _load_or_export(d, self.jitted, self.key, (tree_str, shapes), tree)
        return f(*jax.tree_util.tree_leaves(args))

    def lower(self, *args):  # the jitted function's AOT interface (compile-time tests)
        return self.jitted.lower(*args)


def stored(jitted, key):
    """``jitted`` (a :func:`jax.jit` function of pytrees of arrays), kept on disk under ``key``
    (a value whose ``repr`` names everything the trace depends on beyond the arguments' tree
    structure, shapes and dtypes) when a folder is set. Calls with the same signature as
    before neither trace nor compile."""
    return _Stored(jitted, key)


#: Stored programs not used for this long are removed when a new one is written (s).
MAX_AGE_S = 30 * 86400
_MAGIC = b"RJXP1"
_WARNED: set = set()


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warn_at_caller(msg: str) -> None:
    """``warnings.warn`` at the caller's line: the first frame outside rigidjax (programs are
    compiled at a depth that depends on the entry point: ``fit``, ``fit_many``,
    ``fit_inertia``)."""
    f, level = sys._getframe(0), 1
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE + os.sep):
        f, level = f.f_back, level + 1
    warnings.warn(msg, stacklevel=level)


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warn_at_caller(msg)


def _reason(e: Exception) -> str:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return first if len(first) <= 200 else first[:200] + "..."


def _load_or_export(d: Path, jitted, key, sig, tree):
    """The compiled program for ``sig = (tree structure, leaf shapes and dtypes)``: loaded from
    ``d`` where a valid file is there, else exported, written and compiled. A file is used only
    if its checksum (over the program's name and its bytes) holds, its arguments are ``sig``
    and it compiles; else it is replaced."""
    from jax import export

    fp = _fingerprint()
    name = hashlib.sha256(repr((key, sig)).encode()).hexdigest()[:24]
    path = d / f"{fp}-{name}{_SUFFIX}"
    shapes = sig[1]
    # the program of the arguments' leaves: a serialised program cannot hold custom pytree
    # nodes (e.g. a RigidBodyState argument); its outputs must be tuples, lists or dicts of arrays
    avals = [jax.ShapeDtypeStruct(s, np.dtype(t)) for s, t in shapes]

    def flat(*leaves):
        return jitted(*jax.tree_util.tree_unflatten(tree, leaves))

    if path.exists():
        try:
            exp = export.deserialize(bytearray(_read(path, name)))
            if [(tuple(a.shape), str(a.dtype)) for a in exp.in_avals] != [(tuple(s), t) for s, t in shapes]:
                raise ValueError("it takes other arguments than this call")
            compiled = jax.jit(exp.call).lower(*avals).compile()
        except Exception as e:  # damaged, foreign or stale: trace again and replace it
            msg = f"rigidjax: traced again: the stored program {path} cannot be used ({_reason(e)}); replacing it"
            warn_at_caller(msg)
        else:
            try:
                os.utime(path)  # in use: kept by the age rule of _write
            except OSError:
                pass
            return compiled
    try:
        exp = export.export(jax.jit(flat))(*avals)
        data = exp.serialize()
    except Exception as e:  # e.g. flatbuffers missing
        _warn_once(f"rigidjax: programs are not stored ({_reason(e)})")
        return flat
    try:
        _write(d, path, name, data)
    except OSError as e:
        _warn_once(f"rigidjax: programs are not stored in {d}: {_reason(e)}")
    return jax.jit(exp.call).lower(*avals).compile()


def _read(path: Path, name: str) -> bytes:
    raw = path.read_bytes()
    head = len(_MAGIC) + 32
    if raw[: len(_MAGIC)] != _MAGIC or len(raw) <= head:
        raise ValueError("not a stored program")
    data = raw[head:]
    if hashlib.sha256(name.encode() + data).digest() != raw[len(_MAGIC) : head]:
        raise ValueError("checksum mismatch (damaged, or another program's file)")
    return data


def _write(d: Path, path: Path, name: str, data: bytes) -> None:
    if d.exists() and not d.is_dir():
        raise OSError(f"{d} is not a folder")
    d.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in d.glob(f"*{_SUFFIX}"):  # unused for MAX_AGE_S (an upgrade's leftovers, old checkouts)
        try:
            if now - old.stat().st_mtime > MAX_AGE_S:
                old.unlink()
        except OSError:
            pass
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(_MAGIC + hashlib.sha256(name.encode() + data).digest() + data)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise
