"""The compiled program of an identification problem: its segments padded and stacked, its
weighted residuals through the rollouts, and one jitted, vmapped residual-and-Jacobian call
per problem structure (see :mod:`rigidjax.identify.problem`)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import types
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..info import FAILURES, Status
from ..rollout import rollout
from ..stepper import AbstractStepper, as_stepper
from ._stored import stored
from .observations import data_of, reads, rigid_body_signals


@dataclasses.dataclass(frozen=True)
class _Stacked:
    """The segments padded to ``N`` samples and stacked (see the module): ``t (S, N)``; ``dt
    (S, N - 1)`` per sample interval (the program takes ``k`` equal sub-steps in each); ``data
    {key: (S, N, c)}``; ``weights`` per observation ``(S, N)`` (0 at padded samples);
    ``state0`` and ``inputs`` (per sample interval) stacked; ``steps (S, N - 1)`` True at the
    real segment's sample intervals; ``k (S,)`` the sub-steps; ``n (S,)`` real samples. All
    NumPy (:func:`_stack_many` moves the stacked arrays to the device)."""

    t: Any
    dt: Any
    data: dict
    weights: list
    state0: Any
    inputs: Any
    steps: Any
    k: Any
    n: np.ndarray

    def arrays(self):
        """The arrays the compiled program takes."""
        return (self.t, self.dt, self.data, self.weights, self.state0, self.inputs, self.steps, self.k)


def per_segment(substeps, n: int) -> np.ndarray:
    """``Problem.substeps`` as one count per segment ``(n,)`` (int32)."""
    return np.broadcast_to(np.asarray(substeps, np.int32), (n,)).copy()


def doubled(substeps):
    """``Problem.substeps`` with every count doubled (the step check's finer steps)."""
    return tuple(2 * k for k in substeps) if isinstance(substeps, tuple) else 2 * substeps


def _common_length(problems, pad_to: int | None) -> int:
    """The padded length of every segment of ``problems``: the longest, or ``pad_to``."""
    longest = max(len(np.asarray(s.t)) for p in problems for s in p.segments)
    if pad_to is not None and pad_to < longest:
        raise ValueError(f"fit: pad_to={pad_to} is shorter than the longest segment ({longest} samples)")
    return longest if pad_to is None else int(pad_to)


def _stack_many(problems, dtype, N: int):
    """``(stacked per problem, arrays)``: each problem's :class:`_Stacked` at length ``N``, and
    their :meth:`_Stacked.arrays` stacked along a new leading axis (one row per problem)."""
    stacked = [_stack_segments(p, dtype, N) for p in problems]
    # stacked in NumPy, moved once per array: jnp.stack, jnp.repeat and even jnp.asarray bind
    # an operation that is compiled once per shape in every process (~0.7 s of a repeated
    # command's fit of a torque CSV)
    arrays = jax.tree_util.tree_map(lambda *a: jax.device_put(np.stack(a)), *[s.arrays() for s in stacked])
    return stacked, arrays


def _stack_segments(problem, dtype, pad_to: int | None = None) -> _Stacked:
    segs = problem.segments
    n = np.array([len(np.asarray(s.t)) for s in segs])
    N = int(n.max()) if pad_to is None else int(pad_to)
    if N < n.max():
        raise ValueError(f"fit: pad_to={pad_to} is shorter than the longest segment ({int(n.max())} samples)")

    def pad(a, length=N):
        a = np.asarray(a, float)
        return np.concatenate([a, np.zeros((length - len(a),) + a.shape[1:])])

    ts = []
    for s in segs:
        ti = np.asarray(s.t, float)
        ts.append(np.concatenate([ti, ti[-1] + float(np.median(np.diff(ti))) * np.arange(1, N - len(ti) + 1)]))
    t = np.stack(ts)
    dt = np.diff(t, axis=1)
    # per key, each segment's data where an observation of that key reads it (several
    # observations may share a key over different segments), zeros elsewhere
    data = {}
    for o in problem.observations:
        readers = [r for r in problem.observations if r.key == o.key]
        data[o.key] = np.stack(
            [pad(data_of(problem, next((r for r in readers if reads(r, i)), o), i)) for i in range(len(segs))]
        )
    # each observation's 1/sigma in its weights (the program's observations have sigma 1:
    # _unit_sigma); weight 0 in the segments it does not read
    weights = [
        np.stack([pad(o.weight(np.asarray(s.t, float))) if reads(o, i) else np.zeros(N) for i, s in enumerate(segs)])
        / (o.sigma if _sigma_as_data(o) else 1.0)
        for o in problem.observations
    ]
    steps = np.arange(N - 1)[None, :] < (n[:, None] - 1)
    np_dtype = np.dtype(jnp.dtype(dtype).name)
    state0 = jax.tree_util.tree_map(
        lambda *a: np.stack([np.asarray(x, np_dtype) for x in a]), *[s.state0 for s in segs]
    )
    if segs[0].inputs is None:
        inputs = None
    else:
        inputs = jax.tree_util.tree_map(
            lambda *a: np.stack([pad(x, N - 1).astype(np_dtype) for x in a]), *[s.inputs for s in segs]
        )
    cast = lambda a: np.asarray(a, np_dtype)  # noqa: E731
    return _Stacked(
        cast(t),
        cast(dt),
        {kk: cast(v) for kk, v in data.items()},
        [cast(w) for w in weights],
        state0,
        inputs,
        steps,
        per_segment(problem.substeps, len(segs)),
        n,
    )


def _rate_step(problem, model):
    """The stepper's body-rate step on ``model`` (:meth:`rigidjax.stepper.AbstractStepper.rate_step`)
    where the problem needs nothing else: every observation reads ``angular_velocity`` of the
    default signal map and the known inputs (if any) are one array of wrenches ``(..., 6)``;
    else ``None`` (the whole state is rolled out)."""
    stepper = as_stepper(problem.stepper)
    if not isinstance(stepper, AbstractStepper) or problem.signals is not rigid_body_signals:
        return None
    if any(o.signal != "angular_velocity" for o in problem.observations):
        return None
    u = problem.segments[0].inputs
    if u is not None and not (isinstance(u, (np.ndarray, jax.Array)) and np.shape(u)[-1:] == (6,)):
        return None
    return stepper.rate_step(model)


def _rate_rollout(rate, omega0, dts, inputs, k):
    """``(omega (n + 1, 3), status (n,))``: :func:`_rate_step`'s step over the sample intervals
    ``dts (n,)``, each in ``k`` equal sub-steps (``k`` a traced integer) under the torques
    ``inputs[:, 3:]`` (or none) held over the interval, with :func:`rigidjax.rollout`'s rule
    after a failure (the rate held, the failure's code repeated); a sample interval's status
    is the largest code of its sub-steps."""
    codes = jnp.asarray([int(c) for c in FAILURES], jnp.int32)

    def sub(_, carry):
        w, fail, worst, h, tau = carry
        w1, status = rate(w, tau, h)
        failed = fail != 0
        w1 = jnp.where(failed, w, w1)
        status = jnp.where(failed, fail, status).astype(jnp.int32)
        fail = jnp.where(jnp.isin(status, codes), status, 0).astype(jnp.int32)
        return w1, fail, jnp.maximum(worst, status), h, tau

    def body(carry, xs):
        w, fail = carry
        h, u = xs
        tau = None if u is None else u[3:]
        w1, fail, worst, _, _ = jax.lax.fori_loop(
            0, k, sub, (w, fail, jnp.zeros((), jnp.int32), h / k.astype(h.dtype), tau)
        )
        return (w1, fail), (w1, worst)

    _, (ws, status) = jax.lax.scan(body, (omega0, jnp.zeros((), jnp.int32)), (dts, inputs))
    return jnp.concatenate([omega0[None], ws]), status


def _residual_fn(problem, layout):
    """``residuals(arrays, x) -> (r (S, N, c) weighted, status (S,))`` for one unknown
    vector (``arrays``: :meth:`_Stacked.arrays`): the rollouts' first failure per segment within
    its real steps (``Status.SUCCESS`` where every step succeeded). Padded samples give 0.
    Where the observations read only the body rate and the stepper can advance it alone
    (:func:`_rate_step`), only the rate is rolled out (free-body gyroscope problems: measured
    at ~2x faster residuals and Jacobians than rolling out the whole state)."""
    k, nz, ng, S = problem.substeps, layout.nz, layout.n_global, layout.S
    sub = lambda a: jnp.repeat(a, k, axis=0)  # noqa: E731 (per sample interval -> per step)

    def residuals(arrays, x):
        t, dt, data, weights, state0, inputs, steps, ks = arrays
        n_steps = dt.shape[1] * k
        model = layout.model(x)
        _, sensor = layout.values(x)
        Z = x[ng:].reshape(S, nz)

        rate = _rate_step(problem, model)
        observations = _unit_sigma(problem.observations)

        def one(z, s0, ts, dts, u, d, w, real, ki):
            st0 = problem.initial.build(model, z, s0)
            if rate is None:  # k (the key's) steps per sample interval
                traj = rollout(problem.stepper, model, st0, sub(dts) / k, n_steps, jax.tree_util.tree_map(sub, u))
                sig, step_status = problem.signals(model, traj.states), traj.info.status
                every, real = k, sub(real)
            else:  # per sample already (ki sub-steps per interval, data)
                omega, step_status = _rate_rollout(rate, st0.angular_velocity, dts, u, ki)
                sig, every = {"angular_velocity": omega}, 1
            rs = []
            for o, p, wi in zip(observations, sensor, w):
                pred = sig[o.signal][::every]
                # zero where the weight is: a padded sample's prediction may be anything
                rs.append(jnp.where(wi[:, None] > 0, o.residual(pred, ts, d[o.key], p) * wi[:, None], 0.0))
            # the first failure of the rollout's real steps (SUCCESS = 0 where none)
            status = jnp.max(jnp.where(real, step_status, Status.SUCCESS))
            return jnp.concatenate(rs, -1), status

        return jax.vmap(one)(Z, state0, t, dt, inputs, data, weights, steps, ks)

    return residuals


#: Compiled programs of recent problem structures (see :func:`_program`), most recent last.
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_PROGRAMS_KEPT = 8


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
    :func:`_keyed_model`) and its sub-steps where they are not data (:func:`_steps_key`);
    ``None`` where a part is unhashable."""
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
        layout.S,
        jnp.dtype(dtype).name,
        jacobian,
    )
    try:
        hash(key)
    except TypeError:  # an unhashable part: a program for this problem alone
        return None
    return key + (_steps_key(problem, layout, key),)


def _steps_part(problem, layout, dtype):
    """:func:`_steps_key` of ``problem`` (remembered by its structure where it has one)."""
    key = _structure(problem, layout, dtype)
    return key[-1] if key is not None else _steps_key(problem, layout)


#: Per program key without its sub-steps (:func:`_structure`): whether the rate is rolled out
#: alone (:func:`_steps_key`), so that deciding it traces the model once per structure.
_RATE_ALONE: dict = {}


def _steps_key(problem, layout, base=None):
    """The sub-steps' part of a program's key: ``None`` where the program rolls out the body
    rate alone (:func:`_rate_step` on the model as the program sees it, fitted leaves traced),
    whose sub-steps are data (one program for every count: windows that need different
    steps, and the step check's doubled steps, share it); else ``problem.substeps`` (the
    whole state's rollout has ``(N - 1) k`` steps). ``base``: the rest of the key, to
    remember the answer by (hashable), or ``None``."""
    rate = _RATE_ALONE.get(base) if base is not None else None
    if rate is None:
        found = []
        start = jnp.asarray(layout.start())
        jax.eval_shape(lambda x: found.append(_rate_step(problem, layout.model(x)) is not None), start)
        rate = found[0]
        if base is not None:
            if len(_RATE_ALONE) >= 256:
                _RATE_ALONE.clear()
            _RATE_ALONE[base] = rate
    if not rate and isinstance(problem.substeps, tuple):
        raise ValueError(
            f"Problem: substeps per segment {problem.substeps} need a program that rolls out the body rate alone "
            "(every observation reading angular_velocity, a stepper with rate_step, a model whose rate evolves "
            "alone); this one rolls out the whole state, one step count for all segments"
        )
    return None if rate else problem.substeps


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
                _steps_part(problem, layout, dtype),
                layout.S,
                jnp.dtype(dtype).name,
                jacobian,
            )
        )
    except _Unstable:
        return None
    return hashlib.sha256(repr(desc).encode()).hexdigest()


def _program(problem, layout, dtype, jacobian: bool | str = True):
    """``jac_all(arrays, X, which) -> (r, status, J)`` per row of ``X`` (``jacobian=False``:
    ``(r, status)``; ``jacobian="normal"``: ``(cost, J^T J, J^T r, status, finite)``, the
    Gauss-Newton quantities formed inside the program, zero where a residual or derivative
    is not finite), jitted: row ``i`` evaluates the problem whose data are row ``which[i]``
    of ``arrays`` (:func:`_stack_many`). Shared by every problem of the same structure (model
    values, stepper, parameters with the shapes of their start values, observations, initial
    state, signals, substeps unless the rate is rolled out alone (:func:`_steps_key`), segment
    count: equal or the same objects), whose data enter as
    arguments: one compilation per structure, padded length, problem count and row count.
    The start values enter the program only through their shapes (a transform's ``like``).
    Its outputs are replicated on every device (see :func:`_devices`)."""
    key = _structure(problem, layout, dtype, jacobian)
    if key is not None and key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    residuals = _residual_fn(problem, layout)
    mesh = _devices()

    def jac_all(arrays, X, which):
        def one(x, i):
            mine = jax.tree_util.tree_map(lambda a: a[i], arrays)
            r, status = residuals(mine, x)
            if not jacobian:
                return r.reshape(-1), status
            J = jax.jacfwd(lambda y: residuals(mine, y)[0].reshape(-1))(x)
            r = r.reshape(-1)
            if jacobian != "normal":
                return r, status, J
            finite = jnp.all(jnp.isfinite(r)) & jnp.all(jnp.isfinite(J))
            r0, J0 = jnp.where(finite, r, 0.0), jnp.where(finite, J, 0.0)
            return 0.5 * r0 @ r0, J0.T @ J0, J0.T @ r0, status, finite

        return jax.vmap(one)(X, which)

    if mesh is None:
        # kept on disk between processes where a folder is set (rigidjax.identify.keep_programs)
        # and every part of the problem has a description that holds across processes
        stable = _stable_key(problem, layout, dtype, jacobian)
        jac_all = jax.jit(jac_all) if stable is None else stored(jax.jit(jac_all), ("identify.fit", stable))
    else:  # rows split over the devices; every process receives every row's result
        jac_all = jax.jit(jac_all, out_shardings=NamedSharding(mesh, PartitionSpec()))
    if key is not None:
        _PROGRAMS[key] = jac_all
        while len(_PROGRAMS) > _PROGRAMS_KEPT:
            _PROGRAMS.popitem(last=False)
    return jac_all


def _devices():
    """The mesh the fits' rows are split over: every device of every process
    (``jax.devices()``, e.g. host devices from ``--xla_force_host_platform_device_count``,
    GPUs, or the processes joined by :func:`rigidjax.launch.initialize`), one axis ``rows``;
    ``None`` with a single device (no sharding). The optimiser runs on the host, the same in
    every process: each evaluation splits the rows (starts x problems, padded to a multiple
    of the device count), each device rolls out its share, and the residuals and Jacobians
    are gathered to every process."""
    devices = jax.devices()
    return None if len(devices) == 1 else Mesh(np.array(devices), ("rows",))


def _put(a, mesh, rows: bool):
    """``a`` (NumPy or JAX; the same in every process) as a global array on ``mesh``: split
    along its first axis (``rows``) or replicated."""
    a = np.asarray(a)
    sharding = NamedSharding(mesh, PartitionSpec("rows") if rows else PartitionSpec())
    return jax.make_array_from_callback(a.shape, sharding, lambda index: a[index])


#: Rows (points x problems) per call of a compiled program. A fit of many problems
#: (:func:`rigidjax.identify.fit_many`) runs its evaluations in calls of this many rows, not
#: padded to all of them: most of its iterations have only the few problems still iterating.
#: Measured on the 69 shared racquet flips (one problem each, 4 starts, 128 samples, bias and
#: initial rate; 2-core VM): 105 evaluations, 83 of them of under 64 of the 276 rows; padded to
#: 276 rows they took 6.7 s, in calls of 32 rows 2.0 s. One call shape also compiles one program
#: where padding compiled one per row count (all rows, and one problem's starts).
CHUNK_ROWS = 32


def _chunked(fn, X, which, rows: int):
    """``fn(X, which)`` in calls of ``rows`` rows (the last padded with copies of its first
    row), dispatched before any result is read; the outputs concatenated (NumPy)."""
    pending = []
    for c0 in range(0, len(X), rows):
        Xc, wc = X[c0 : c0 + rows], which[c0 : c0 + rows]
        n = len(Xc)
        if n < rows:
            Xc = np.concatenate([Xc, np.repeat(Xc[:1], rows - n, 0)])
            wc = np.concatenate([wc, np.repeat(wc[:1], rows - n)])
        pending.append((n, fn(Xc, wc)))
    parts = [[np.asarray(a)[:n] for a in out] for n, out in pending]
    return [np.concatenate(p) for p in zip(*parts)]


def _evaluator(problems, layout, dtype, N: int, starts: int):
    """``(stacked, run, evaluate, run_one)`` of ``problems`` (one structure, see
    :func:`_program`; ``layout`` of the first), padded to ``N`` samples: ``stacked`` per
    problem; ``run(X, which) -> (r, status, J)`` of points ``X`` of problems ``which``;
    ``evaluate(X, rows)`` as :func:`rigidjax.identify._lm.solve` calls it (row ``i`` of the
    batch is problem ``i // starts``); ``run_one(w)(X)``: ``run`` of problem ``w`` alone. Every
    call runs in calls of one shape (:data:`CHUNK_ROWS` rows, at least ``starts``, at most
    every start of every problem): one compiled program whatever the number of points."""
    stacked, arrays = _stack_many(problems, dtype, N)
    jac_all = _program(problems[0], layout, dtype)
    batch = len(problems) * starts
    rows = min(batch, max(starts, CHUNK_ROWS))
    call = _caller(jac_all, arrays, dtype)
    # float64 with several problems or a large Jacobian: J^T J and J^T r formed in the program
    # (what the optimiser needs: (P, P) per row instead of the (m, P) Jacobian, m = samples x
    # components); otherwise from the Jacobian on the host, in float64 (float32: J^T J squares
    # the condition number): one program fewer to trace and compile (test (d), the EP pendulum:
    # ~70 s of a ~165 s fit), for a transfer of at most ~32 MB per iteration (3 components
    # per sample taken as the estimate of m)
    normal = None
    big = rows * N * 3 * len(layout.lo) > 4e6
    if jnp.dtype(dtype) == jnp.float64 and (len(problems) > 1 or big):
        normal = _caller(_program(problems[0], layout, dtype, jacobian="normal"), arrays, dtype)

    def run(X, which):
        r, status, J = _chunked(call, np.asarray(X), np.asarray(which), rows)
        return np.asarray(r, float), status, np.asarray(J, float)

    def run_one(w):
        return lambda X: run(X, np.full(len(X), w))

    def evaluate(X, rows_):
        which = np.asarray(rows_) // starts
        na = len(X)
        if normal is not None:
            cost, A, g, status, finite = _chunked(normal, np.asarray(X), which, rows)
            ok = np.all(status == Status.SUCCESS, axis=1) & finite
            cost = np.where(ok, np.asarray(cost, float), np.inf)
            A = np.where(ok[:, None, None], np.asarray(A, float), 0.0)
            return cost, A, np.where(ok[:, None], np.asarray(g, float), 0.0), ok, np.zeros((na, 1))
        r, status, J = run(X, which)
        ok = np.all(status == Status.SUCCESS, axis=1) & np.all(np.isfinite(J), axis=(1, 2)) & np.all(np.isfinite(r), 1)
        r0, J0 = np.where(ok[:, None], r, 0), np.where(ok[:, None, None], J, 0)
        cost = np.where(ok, 0.5 * np.sum(r0 * r0, 1), np.inf)
        return cost, np.einsum("ami,amj->aij", J0, J0), np.einsum("ami,am->ai", J0, r0), ok, np.zeros((na, 1))

    return stacked, run, evaluate, run_one


def _caller(program, arrays, dtype):
    """``call(X, which)``: ``program(arrays, X, which)`` on the devices of :func:`_devices`
    (rows padded to a multiple of their count and split; the data replicated once)."""
    mesh = _devices()
    if mesh is None:
        np_dtype = np.dtype(jnp.dtype(dtype).name)
        # NumPy arguments: jit's own transfer (jnp.asarray binds an operation compiled once per
        # shape in every process)
        return lambda X, which: program(arrays, np.asarray(X, np_dtype), np.asarray(which))
    n_dev = mesh.size
    arrays = jax.tree_util.tree_map(lambda a: _put(a, mesh, rows=False), arrays)

    def call(X, which):
        na = len(X)
        extra = -na % n_dev
        if extra:
            X = np.concatenate([X, np.repeat(X[:1], extra, 0)])
            which = np.concatenate([which, np.repeat(which[:1], extra)])
        out = program(arrays, _put(np.asarray(X, dtype), mesh, True), _put(np.asarray(which), mesh, True))
        return jax.tree_util.tree_map(lambda a: np.asarray(a.addressable_data(0))[:na], out)

    return call
