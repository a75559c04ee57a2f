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

Without a folder (the library's default: it never writes into the user's folders on its own)
the jitted function is called as it is. A file is named by a fingerprint of everything the
trace depends on: the source of the installed ``rigidjax`` package, the JAX and jaxlib
versions, the default backend, ``jax_enable_x64`` and the default matmul precision, the
program's key and the arguments' shapes and dtypes. Files of an older fingerprint (an upgrade)
are removed when the first new one is written. A file that cannot be read or written is traced
as usual (a warning names it): the store can only save time, never change a result; the
program run is the same in both cases (the exported one, when a folder is set).
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import warnings
from pathlib import Path

import jax
import numpy as np

__all__ = ["keep_programs", "folder", "stored"]

_FOLDER: Path | None = None
_SUFFIX = ".jaxexport"


def keep_programs(path) -> None:
    """Keep the traced programs of :func:`rigidjax.identify.fit_inertia` in the folder ``path``
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
    import jaxlib

    parts = (
        _source_digest(),
        jax.__version__,
        jaxlib.__version__,
        jax.default_backend(),
        bool(jax.config.jax_enable_x64),
        str(jax.config.jax_default_matmul_precision),
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _signature(args) -> tuple:
    return tuple((tuple(np.shape(a)), str(np.asarray(a).dtype if not hasattr(a, "dtype") else a.dtype)) for a in args)


class _Stored:
    def __init__(self, jitted, key):
        self.jitted = jitted
        self.key = key
        self._calls = {}

    def __call__(self, *args):
        d = _FOLDER
        if d is None:
            return self.jitted(*args)
        sig = (str(d), _signature(args))
        f = self._calls.get(sig)
        if f is None:
            f = self._calls[sig] = _load_or_export(d, self.jitted, self.key, sig[1])
        return f(*args)

    def lower(self, *args):  # the jitted function's AOT interface (compile-time tests)
        return self.jitted.lower(*args)


def stored(jitted, key):
    """``jitted`` (a :func:`jax.jit` function of arrays only), kept on disk under ``key`` (a
    value whose ``repr`` names everything the trace depends on beyond the arguments' shapes
    and dtypes) when a folder is set. Calls with the same signature as before neither trace
    nor compile."""
    return _Stored(jitted, key)


def _load_or_export(d: Path, jitted, key, sig):
    from jax import export

    fp = _fingerprint()
    name = hashlib.sha256(repr((key, sig)).encode()).hexdigest()[:24]
    path = d / f"{fp}-{name}{_SUFFIX}"
    exp = None
    if path.exists():
        try:
            exp = export.deserialize(bytearray(path.read_bytes()))
        except Exception as e:  # a truncated or foreign file: trace again and replace it
            warnings.warn(f"rigidjax: traced again: cannot read the stored program {path}: {e}", stacklevel=3)
    if exp is None:
        try:
            exp = export.export(jitted)(*[jax.ShapeDtypeStruct(s, np.dtype(t)) for s, t in sig])
            _write(d, path, fp, exp.serialize())
        except Exception as e:  # e.g. flatbuffers missing, or a folder that cannot be written
            warnings.warn(f"rigidjax: program not stored in {d}: {e}", stacklevel=3)
            return jitted
    return jax.jit(exp.call)


def _write(d: Path, path: Path, fp: str, data: bytes) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for old in d.glob(f"*{_SUFFIX}"):
        if not old.name.startswith(fp):
            try:
                old.unlink()
            except OSError:
                pass
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
