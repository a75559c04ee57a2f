"""The compiled program of an identification problem: its segments padded and stacked, its
weighted residuals through the rollouts, and one jitted, vmapped residual-and-Jacobian call
per problem structure (see :mod:`rigidjax.identify.problem`)."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..info import Status
from ..rollout import rollout


@dataclasses.dataclass(frozen=True)
class _Stacked:
    """The segments padded to ``N`` samples and stacked (see the module): ``t (S, N)``; ``dt
    (S, (N - 1) k)`` per step; ``data {key: (S, N, k)}``; ``weights`` per observation ``(S, N)``
    (0 at padded samples); ``state0`` and ``inputs`` stacked; ``steps (S, (N - 1) k)`` True
    at the real segment's steps; ``n (S,)`` real samples (NumPy)."""

    t: Any
    dt: Any
    data: dict
    weights: list
    state0: Any
    inputs: Any
    steps: Any
    n: np.ndarray

    def arrays(self):
        """The arrays the compiled program takes."""
        return (self.t, self.dt, self.data, self.weights, self.state0, self.inputs, self.steps)


def _stack_segments(problem, dtype, pad_to: int | None = None) -> _Stacked:
    segs = problem.segments
    k = problem.substeps
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
    dt = np.repeat(np.diff(t, axis=1) / k, k, axis=1)
    data = {o.key: np.stack([pad(s.data[o.key]) for s in segs]) for o in problem.observations}
    weights = [np.stack([pad(o.weight(np.asarray(s.t, float))) for s in segs]) for o in problem.observations]
    steps = np.arange((N - 1) * k)[None, :] // k < (n[:, None] - 1)
    state0 = jax.tree_util.tree_map(lambda *a: jnp.stack([jnp.asarray(x, dtype) for x in a]), *[s.state0 for s in segs])
    if segs[0].inputs is None:
        inputs = None
    else:
        inputs = jax.tree_util.tree_map(
            lambda *a: jnp.stack([jnp.repeat(jnp.asarray(pad(x, N - 1), dtype), k, axis=0) for x in a]),
            *[s.inputs for s in segs],
        )
    cast = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    return _Stacked(
        cast(t),
        cast(dt),
        {kk: cast(v) for kk, v in data.items()},
        [cast(w) for w in weights],
        state0,
        inputs,
        jnp.asarray(steps),
        n,
    )


def _residual_fn(problem, layout):
    """``residuals(arrays, x) -> (r (S, N, c) weighted, status (S,))`` for one unknown
    vector (``arrays``: :meth:`_Stacked.arrays`): the rollouts' first failure per segment within
    its real steps (``Status.SUCCESS`` where every step succeeded). Padded samples give 0."""
    k, nz, ng, S = problem.substeps, layout.nz, layout.n_global, layout.S

    def residuals(arrays, x):
        t, dt, data, weights, state0, inputs, steps = arrays
        n_steps = dt.shape[1]
        model = layout.model(x)
        _, sensor = layout.values(x)
        Z = x[ng:].reshape(S, nz)

        def one(z, s0, ts, dts, u, d, w, real):
            st0 = problem.initial.build(model, z, s0)
            traj = rollout(problem.stepper, model, st0, dts, n_steps, u)
            sig = problem.signals(model, traj.states)
            rs = []
            for o, p, wi in zip(problem.observations, sensor, w):
                pred = sig[o.signal][::k]
                # zero where the weight is: a padded sample's prediction may be anything
                rs.append(jnp.where(wi[:, None] > 0, o.residual(pred, ts, d[o.key], p) * wi[:, None], 0.0))
            # the first failure of the rollout's real steps (SUCCESS = 0 where none)
            status = jnp.max(jnp.where(real, traj.info.status, Status.SUCCESS))
            return jnp.concatenate(rs, -1), status

        return jax.vmap(one)(Z, state0, t, dt, inputs, data, weights, steps)

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


def _shapes(like):
    """The structure and leaf shapes of a start value (all a transform's ``like`` conveys)."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    return treedef, tuple(np.shape(a) for a in leaves)


def _program(problem, layout, dtype, jacobian: bool = True):
    """``jac_all(arrays, X) -> (r, status, J)`` per row of ``X`` (``jacobian=False``: ``(r,
    status)``), jitted; shared by every
    problem of the same structure (model values, stepper, parameters with the shapes of their
    start values, observations, initial state, signals, substeps, segment count: equal or the
    same objects), whose data enter as arguments: one compilation per structure and padded
    length. The start values enter the program only through their shapes (a transform's
    ``like``)."""
    leaves, treedef = jax.tree_util.tree_flatten(problem.model)
    key = (
        treedef,
        tuple(_frozen(a) for a in leaves),
        tuple((name, p.where, p.transform, p.into) for name, p in problem.parameters.items()),
        tuple((kind, name, tr, _shapes(like), off, n) for kind, name, tr, like, off, n in layout.slots),
        tuple(problem.observations),
        problem.initial,
        problem.stepper,
        problem.signals,
        problem.substeps,
        layout.S,
        jnp.dtype(dtype).name,
        jacobian,
    )
    try:
        hash(key)
    except TypeError:  # an unhashable part: a program for this problem alone
        key = None
    if key is not None and key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    residuals = _residual_fn(problem, layout)

    @jax.jit
    def jac_all(arrays, X):
        def one(x):
            r, status = residuals(arrays, x)
            if not jacobian:
                return r.reshape(-1), status
            J = jax.jacfwd(lambda y: residuals(arrays, y)[0].reshape(-1))(x)
            return r.reshape(-1), status, J

        return jax.vmap(one)(X)

    if key is not None:
        _PROGRAMS[key] = jac_all
        while len(_PROGRAMS) > _PROGRAMS_KEPT:
            _PROGRAMS.popitem(last=False)
    return jac_all


def _evaluator(problem, layout, dtype, pad_to, batch: int):
    """``(stacked, run, evaluate)``: the padded segments; ``run(X) -> (r, status, J)`` of up
    to ``batch`` points (padded to ``batch`` rows: one compiled program whatever the number of
    starts still running); ``evaluate`` as :func:`rigidjax.identify._lm.solve` calls it."""
    stacked = _stack_segments(problem, dtype, pad_to)
    jac_all = _program(problem, layout, dtype)
    arrays = stacked.arrays()

    def run(X):
        na = len(X)
        padded = np.concatenate([X, np.repeat(X[:1], batch - na, 0)]) if na < batch else X
        r, status, J = jac_all(arrays, jnp.asarray(padded, dtype))
        return np.asarray(r, float)[:na], np.asarray(status)[:na], np.asarray(J, float)[:na]

    def evaluate(X, rows):
        r, status, J = run(X)
        ok = np.all(status == Status.SUCCESS, axis=1) & np.all(np.isfinite(J), axis=(1, 2)) & np.all(np.isfinite(r), 1)
        r0, J0 = np.where(ok[:, None], r, 0), np.where(ok[:, None, None], J, 0)
        cost = np.where(ok, 0.5 * np.sum(r0 * r0, 1), np.inf)
        return cost, np.einsum("ami,amj->aij", J0, J0), np.einsum("ami,am->ai", J0, r0), ok, np.zeros((len(X), 1))

    return stacked, run, evaluate
