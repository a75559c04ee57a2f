"""The key of an identification problem's compiled program (:func:`rigidjax.identify._program._program`):
the parts that make two problems share one program, in memory (:func:`_structure`) and on disk
(:func:`_stable_key`, a description that holds across processes), and which rollout the
program runs (:func:`_rate_step`: the body rate alone where that suffices, else the whole
state; either way the sub-steps are data, not part of the key)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import types

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ..body import RigidBody
from ..stepper import AbstractStepper, as_stepper
from .observations import rigid_body_signals


def _rate_step(problem, model, uncoupled: bool = False):
    """The stepper's body-rate step on ``model`` (:meth:`rigidjax.stepper.AbstractStepper.rate_step`)
    where the problem needs nothing else: every observation reads ``angular_velocity`` of the
    default signal map and the known inputs (if any) are one array of wrenches ``(..., 6)``;
    else ``None`` (the whole state is rolled out). ``uncoupled``: :func:`_uncoupled` of the
    problem (a fitted resistance that keeps rotation and translation apart)."""
    stepper = as_stepper(problem.stepper)
    if not isinstance(stepper, AbstractStepper) or problem.signals is not rigid_body_signals:
        return None
    if any(o.signal != "angular_velocity" for o in problem.observations):
        return None
    u = problem.segments[0].inputs
    if u is not None and not (isinstance(u, (np.ndarray, jax.Array)) and np.shape(u)[-1:] == (6,)):
        return None
    return stepper.rate_step(model, uncoupled=uncoupled)


def _uncoupled(problem, layout) -> bool:
    """Whether the problem fits a rigid body's resistance (a traced leaf in the program) whose
    translation-rotation blocks ``R[:3, 3:]``, ``R[3:, :3]`` stay zero: zero, with a zero
    derivative in every unknown, at three points drawn in the unknowns' box (seeded, at the
    scales 1, 10 and 100; not the start values, which are not part of the program's key: the
    answer is the same for every problem of one key). A fitted angular drag,
    ``R = blockdiag(0, D(p))``, passes: its rate then evolves alone
    (:meth:`rigidjax.midpoint.Midpoint.rate_step`, which checks the blocks at run time: a
    parametrisation that couples them elsewhere fails its steps there,
    ``INVALID_INPUT``, never runs a wrong model). Evaluated outside any trace. Measured
    (ratios and ``D / Iy`` of a gyroscope window, 200 samples, 4 starts, 2-core VM): first fit
    12.3 -> 8.5 s, warm 0.33 -> 0.18 s against the whole state's rollout."""
    x0 = np.asarray(layout.start(), float)
    traced = []
    jax.eval_shape(
        lambda x: traced.append(
            isinstance(layout.model(x), RigidBody) and isinstance(layout.model(x).resistance, jax.core.Tracer)
        ),
        jnp.asarray(x0),
    )
    if not traced[0]:
        return False

    def coupling(x):
        R = layout.model(x).resistance
        return jnp.concatenate([jnp.ravel(R[..., :3, 3:]), jnp.ravel(R[..., 3:, :3])])

    rng = np.random.default_rng(0)
    # scattered at three scales (a coupling that switches on away from zero, e.g.
    # relu(d - 5), is seen at the wider ones); a point where the model is not finite says nothing
    points = [np.clip(scale * rng.standard_normal(x0.shape), layout.lo, layout.hi) for scale in (1.0, 10.0, 100.0)]
    judged = 0
    for x in points:
        xj = jnp.asarray(x)
        c, dc = np.asarray(coupling(xj)), np.asarray(jax.jacfwd(coupling)(xj))
        if not (np.all(np.isfinite(c)) and np.all(np.isfinite(dc))):
            continue
        if np.any(c != 0) or np.any(dc != 0):
            return False
        judged += 1
    return judged > 0


def _frozen(a):
    """A hashable stand-in of a model leaf: an array by its dtype, shape and bytes."""
    if isinstance(a, (np.ndarray, jax.Array)):
        a = np.asarray(a)
        return ("array", a.dtype.str, a.shape, a.tobytes())
    return a


def _freeze(obj, depth: int = 0):
    """A hashable stand-in of a problem's part that compares by what it computes: a Python
    function by its code and the frozen values it closes over (two lambdas written at one
    place, e.g. in a loop building one problem per window, are the same; a different
    captured value makes them differ), a dataclass (observations, ``InitialState``, stepper
    modules) by its type and frozen fields, an array by :func:`_frozen`, containers item by
    item. Anything else stands for itself (its own ``==`` and hash)."""
    if depth > 8:
        return obj
    if isinstance(obj, (np.ndarray, jax.Array)):
        return _frozen(obj)
    if isinstance(obj, types.FunctionType):
        cells = tuple(_freeze(c.cell_contents, depth + 1) for c in obj.__closure__ or ())
        return ("function", obj.__code__, cells, _freeze(obj.__defaults__, depth + 1))
    if isinstance(obj, functools.partial):
        return ("partial", _freeze(obj.func, depth + 1), _freeze(obj.args, depth + 1), _freeze(obj.keywords, depth + 1))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = tuple(_freeze(getattr(obj, f.name), depth + 1) for f in dataclasses.fields(obj))
        return ("dataclass", type(obj), fields)
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__,) + tuple(_freeze(a, depth + 1) for a in obj)
    if isinstance(obj, dict):
        return ("dict",) + tuple((k, _freeze(v, depth + 1)) for k, v in obj.items())
    return obj


def _shapes(like):
    """The structure and leaf shapes of a start value (all a transform's ``like`` conveys)."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    return treedef, tuple(np.shape(a) for a in leaves)


def _sigma_as_data(o) -> bool:
    """Whether observation ``o``'s sigma enters the program as data (its weights): rigidjax's
    own observations, whose residual is their raw residual over ``sigma``; a user's class keeps
    its sigma as a constant of the trace (its residual may use sigma otherwise)."""
    return dataclasses.is_dataclass(o) and type(o).__module__ == _OBSERVATIONS and hasattr(o, "sigma")


_OBSERVATIONS = "rigidjax.identify.observations"


def _unit_sigma(observations) -> tuple:
    """The observations the program is built from: sigma 1 where it enters as data
    (:func:`_sigma_as_data`), so that windows with their own noise levels share one program."""
    return tuple(dataclasses.replace(o, sigma=1.0) if _sigma_as_data(o) else o for o in observations)


def _inputs_kind(problem):
    """The known inputs' tree structure and per-sample shapes (``None`` without inputs): part
    of the key, as the rollout a program runs depends on them (:func:`_rate_step`)."""
    u = problem.segments[0].inputs
    if u is None:
        return None
    leaves, treedef = jax.tree_util.tree_flatten(u)
    return treedef, tuple(np.shape(a)[1:] for a in leaves)


def _keyed_model(problem):
    """``problem.model`` with every fitted leaf (what a parameter's ``where`` selects) zeroed:
    the program overwrites those leaves (``_Layout.model``), so their start values are not part
    of what it computes: problems that differ only there (e.g. start moments taken from each
    recording's data) share one program."""
    m = problem.model
    for p in problem.parameters.values():
        try:
            m = eqx.tree_at(p.where, m, replace_fn=lambda a: np.zeros(np.shape(a), np.asarray(a).dtype))
        except Exception:  # a selector eqx.tree_at cannot follow: key by the model as given
            return problem.model
    return m


def _structure(problem, layout, dtype, jacobian: bool = True):
    """The key of ``problem``'s compiled program (see :func:`_program`): its parts by what
    they compute (:func:`_freeze`; the model without its fitted leaves' values,
    :func:`_keyed_model`; not the sub-steps, which are data); ``None`` where a part is
    unhashable. The key without ``jacobian`` is kept on ``layout`` (made from ``problem``,
    immutable): a fit looks it up several times per problem (its check of one structure, the
    programs of its results), ~0.3 ms each."""
    name = jnp.dtype(dtype).name
    if getattr(layout, "problem", None) is not problem:  # a layout of another problem
        base = _structure_base(problem, layout, name)
    else:
        memo = layout.__dict__.setdefault("_structure_keys", {})
        if name not in memo:
            memo[name] = _structure_base(problem, layout, name)
        base = memo[name]
    return None if base is None else base + (jacobian,)


def _structure_base(problem, layout, dtype_name: str):
    """:func:`_structure`'s key without its last part (``jacobian``), or ``None``."""
    leaves, treedef = jax.tree_util.tree_flatten(_keyed_model(problem))
    key = (
        treedef,
        tuple(_frozen(a) for a in leaves),
        tuple((name, _freeze((p.where, p.transform, p.into))) for name, p in problem.parameters.items()),
        tuple((kind, name, _freeze(tr), _shapes(like), off, n) for kind, name, tr, like, off, n in layout.slots),
        _freeze(_unit_sigma(problem.observations)),
        _freeze(problem.initial),
        _freeze(problem.stepper),
        _freeze(problem.signals),
        _inputs_kind(problem),
        layout.S,
        dtype_name,
    )
    try:
        hash(key)
    except TypeError:  # an unhashable part: a program for this problem alone
        return None
    return key


class _Unstable(Exception):
    """A part of a problem with no description that holds across processes (see :func:`_stable`)."""


#: Modules whose functions a stored program may close over: their code is fingerprinted by
#: :mod:`rigidjax.identify._stored` (rigidjax's source, JAX's version).
_STABLE_MODULES = ("rigidjax", "jax")


def _stable_module(module) -> bool:
    """``module`` is one of :data:`_STABLE_MODULES` or inside one (``jaxlie`` is not ``jax``)."""
    module = module or ""
    return any(module == m or module.startswith(m + ".") for m in _STABLE_MODULES)


def _stable_nodes(tree) -> None:
    """Raises :class:`_Unstable` where a node of ``tree`` is a class of the user's own (its
    methods, e.g. a model's properties, run while tracing and are not fingerprinted)."""
    data = tree.node_data()
    if data is not None and data[0] not in (tuple, list, dict, type(None)):
        _stable(data[0])
    for child in tree.children():
        _stable_nodes(child)


def _stable(obj, depth: int = 0):
    """A description of ``obj`` that is equal across processes exactly where it computes the
    same (:func:`_freeze`'s rules, with functions by module, qualified name and first line
    instead of code objects, and arrays by a digest of their bytes). Raises
    :class:`_Unstable` for a function defined outside rigidjax or JAX (a user's code is not in
    the stored programs' fingerprint) or an object without such a description."""
    if depth > 8:
        raise _Unstable("nested too deep")
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        return obj
    if isinstance(obj, (np.ndarray, jax.Array, np.generic)):
        a = np.asarray(obj)
        return ("array", a.dtype.str, a.shape, hashlib.sha256(a.tobytes()).hexdigest())
    if isinstance(obj, types.FunctionType):
        if not _stable_module(obj.__module__):
            raise _Unstable(f"function {obj.__qualname__} of {obj.__module__}")
        cells = tuple(_stable(c.cell_contents, depth + 1) for c in obj.__closure__ or ())
        return (
            "function",
            obj.__module__,
            obj.__qualname__,
            obj.__code__.co_firstlineno,
            cells,
            _stable(obj.__defaults__, depth + 1),
        )
    if isinstance(obj, functools.partial):
        return ("partial", _stable(obj.func, depth + 1), _stable(obj.args, depth + 1), _stable(obj.keywords, depth + 1))
    if isinstance(obj, type):
        # a class by its name only where its code is fingerprinted: a user's observation,
        # transform or stepper subclass (edited and redefined in a notebook) never is
        if not _stable_module(obj.__module__):
            raise _Unstable(f"class {obj.__qualname__} of {obj.__module__}")
        return ("type", obj.__module__, obj.__qualname__)
    if dataclasses.is_dataclass(obj):
        fields = tuple((f.name, _stable(getattr(obj, f.name), depth + 1)) for f in dataclasses.fields(obj))
        return ("dataclass", _stable(type(obj), depth + 1), fields)
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__,) + tuple(_stable(a, depth + 1) for a in obj)
    if isinstance(obj, dict):
        return ("dict",) + tuple((k, _stable(v, depth + 1)) for k, v in obj.items())
    if isinstance(obj, jax.tree_util.PyTreeDef):
        text = str(obj)
        if "0x" in text:  # an object's address: not a description
            raise _Unstable("tree structure with an object's address")
        _stable_nodes(obj)
        return ("treedef", text)
    module, name = getattr(obj, "__module__", None) or "", getattr(obj, "__qualname__", None)
    if callable(obj) and name and _stable_module(module):  # e.g. jax.numpy's jitted functions
        return ("callable", module, name)
    raise _Unstable(type(obj).__name__)


def _stable_key(problem, layout, dtype, jacobian):
    """A digest naming ``problem``'s compiled program across processes (the parts of
    :func:`_structure` through :func:`_stable`), or ``None`` where a part has none."""
    leaves, treedef = jax.tree_util.tree_flatten(_keyed_model(problem))
    try:
        desc = _stable(
            (
                treedef,
                tuple(leaves),
                tuple((name, (p.where, p.transform, p.into)) for name, p in problem.parameters.items()),
                tuple((kind, name, tr, _shapes(like), off, n) for kind, name, tr, like, off, n in layout.slots),
                _unit_sigma(problem.observations),
                problem.initial,
                problem.stepper,
                problem.signals,
                _inputs_kind(problem),
                layout.S,
                jnp.dtype(dtype).name,
                jacobian,
            )
        )
    except _Unstable:
        return None
    return hashlib.sha256(repr(desc).encode()).hexdigest()
