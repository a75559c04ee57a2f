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
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..info import FAILURES, Status
from ..rollout import rollout
from ..numerics import zeros_like_batch
from ._model import lane_chunks
from ._program_key import _rate_step, _sigma_as_data, _stable_key, _structure, _uncoupled, _unit_sigma
from ._stored import stored
from .observations import data_of, reads


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


def _stack_many(problems, dtype, N: int, stacked=None):
    """``(stacked per problem, arrays)``: each problem's :class:`_Stacked` at length ``N`` (or
    ``stacked``, already made by the caller), and their :meth:`_Stacked.arrays` stacked along
    a new leading axis (one row per problem)."""
    if stacked is None:
        once = {}  # a problem repeated (the step refinement fills every row with one) stacked once
        for p in problems:
            if id(p) not in once:
                once[id(p)] = _stack_segments(p, dtype, N)
        stacked = [once[id(p)] for p in problems]
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


def _rate_rollout(rate, omega0, dts, inputs, k, trip):
    """``(omega (n + 1, 3), status (n,))``: :func:`_rate_step`'s step over the first ``trip``
    of the sample intervals ``dts (n,)`` (a traced integer; later entries stay 0), each in
    ``k`` equal sub-steps (traced too) under the torques ``inputs[:, 3:]`` (or none) held
    over the interval, with :func:`rigidjax.rollout`'s rule after a failure (the rate held,
    the failure's code repeated); a sample interval's status is the largest code of its
    sub-steps. ``trip`` is the longest segment among a call's rows (:func:`_program`): the
    segments are padded to the longest of the fit, so a loop over all ``n`` intervals
    stepped the shorter ones' padding too (the 69 shared racquet flips, 51 to 119 samples,
    ordered by sub-steps and length in :func:`rigidjax.identify.fit_many`: warm
    ``fit_inertia`` per window 1.08-1.10 -> 1.01-1.07 s CPU pinned to one core; its default
    model's results bit for bit the same, the full tensor's at round-off, 2e-13 relative,
    the statuses the same: XLA compiles the loop body differently)."""
    codes = jnp.asarray([int(c) for c in FAILURES], jnp.int32)

    def sub(_, carry):
        w, fail, worst, h, tau = carry
        w1, status = rate(w, tau, h)
        failed = fail != 0
        w1 = jnp.where(failed, w, w1)
        status = jnp.where(failed, fail, status).astype(jnp.int32)
        fail = jnp.where(jnp.isin(status, codes), status, 0).astype(jnp.int32)
        return w1, fail, jnp.maximum(worst, status), h, tau

    def interval(carry):
        i, w, fail, ws, status = carry
        tau = None if inputs is None else inputs[i, 3:]
        h = dts[i]
        w1, fail, worst, _, _ = jax.lax.fori_loop(0, k, sub, (w, fail, zeros_like_batch(w), h / k.astype(h.dtype), tau))
        return i + 1, w1, fail, ws.at[i + 1].set(w1), status.at[i].set(worst)

    n = dts.shape[0]
    ws = jnp.zeros((n + 1,) + omega0.shape, omega0.dtype).at[0].set(omega0)
    carry = (jnp.zeros((), jnp.int32), omega0, zeros_like_batch(omega0), ws, jnp.zeros((n,), jnp.int32))
    _, _, _, ws, status = jax.lax.while_loop(lambda c: c[0] < trip, interval, carry)
    return ws, status


def _residual_fn(problem, layout):
    """``residuals(arrays, x, trip) -> (r (S, N, c) weighted, status (S,))`` for one unknown
    vector (``arrays``: :meth:`_Stacked.arrays`): the rollouts' first failure per segment within
    its real steps (``Status.SUCCESS`` where every step succeeded). Padded samples give 0
    (the body-rate rollout steps the first ``trip`` sample intervals only, see
    :func:`_rate_rollout`; ``trip`` at least every segment's real intervals).
    Where the observations read only the body rate and the stepper can advance it alone
    (:func:`_rate_step`), only the rate is rolled out (free-body gyroscope problems: measured
    at ~2x faster residuals and Jacobians than rolling out the whole state). Either way the
    sub-steps are data (a loop of traced length per sample interval), so one program serves
    every count. Measured against a program per count (a 301-sample motion-capture CSV:
    rate, orientation, position; 4 starts; 2-core VM): ``rigidjax fit`` with its refinement
    1 -> 2 -> 4 cold 33.0 -> 12.7 s (6 -> 1 compilations); a warm fit at 1 sub-step 0.96 ->
    1.39 s, at 4 sub-steps 2.63 -> 2.24 s. Taking the first sub-step outside the loop gave
    1.02 s warm at 1 sub-step but 7.0 s instead of 4.7 s of compilation: not kept."""
    nz, ng, S = layout.nz, layout.n_global, layout.S
    uncoupled = _uncoupled(problem, layout)

    def residuals(arrays, x, trip):
        t, dt, data, weights, state0, inputs, steps, ks = arrays
        model = layout.model(x)
        _, sensor = layout.values(x)
        Z = x[ng:].reshape(S, nz)

        rate = _rate_step(problem, model, uncoupled)
        observations = _unit_sigma(problem.observations)

        def one(z, s0, ts, dts, u, d, w, real, ki):
            st0 = problem.initial.build(model, z, s0)
            if rate is None:  # the whole state, ki sub-steps per sample interval (data)
                traj = rollout(problem.stepper, model, st0, dts, dts.shape[0], u, substeps=ki)
                sig, step_status = problem.signals(model, traj.states), traj.info.status
            else:
                omega, step_status = _rate_rollout(rate, st0.angular_velocity, dts, u, ki, trip)
                sig = {"angular_velocity": omega}
            rs = []
            for o, p, wi in zip(observations, sensor, w):
                pred = sig[o.signal]
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


def _program(problem, layout, dtype, jacobian: bool | str = True):
    """``jac_all(arrays, X, which) -> (r, status, J)`` per row of ``X`` (``jacobian=False``:
    ``(r, status)``; ``jacobian="normal"``: ``(cost, J^T J, J^T r, status, finite)``, the
    Gauss-Newton quantities formed inside the program, zero where a residual or derivative
    is not finite), jitted: row ``i`` evaluates the problem whose data are row ``which[i]``
    of ``arrays`` (:func:`_stack_many`). Shared by every problem of the same structure (model
    values, stepper, parameters with the shapes of their start values, observations, initial
    state, signals, segment count: equal or the same objects), whose data (the sub-steps
    too) enter as arguments: one compilation per structure, padded length, problem count and row count.
    The start values enter the program only through their shapes (a transform's ``like``).
    Its outputs are replicated on every device (see :func:`_devices`)."""
    key = _structure(problem, layout, dtype, jacobian)
    if key is not None and key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    residuals = _residual_fn(problem, layout)
    mesh = _devices()
    tangents = _segment_tangents(layout.n_global, layout.nz, layout.S)

    def jac_all(arrays, X, which):
        # the sample intervals of the longest segment among the call's rows (the rest are
        # padding; arrays: _Stacked.arrays(), steps (problems, S, N - 1) True at real ones)
        trip = jnp.max(jnp.sum(arrays[6][which], axis=-1))

        def one(x, i):
            mine = jax.tree_util.tree_map(lambda a: a[i], arrays)
            if not jacobian:
                r, status = residuals(mine, x, trip)
                return r.reshape(-1), status
            r, status, Jg, Jz = _jacobian_blocks(lambda y: residuals(mine, y, trip), x, tangents, layout.n_global)
            if jacobian != "normal":
                return r.reshape(-1), status, _dense(Jg, Jz)
            finite = jnp.all(jnp.isfinite(r)) & jnp.all(jnp.isfinite(Jg)) & jnp.all(jnp.isfinite(Jz))
            r0, Jg, Jz = (jnp.where(finite, a, 0.0) for a in (r, Jg, Jz))
            A, g = _normal(r0, Jg, Jz)
            return 0.5 * jnp.sum(r0 * r0), A, g, status, finite

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


def _segment_tangents(ng: int, nz: int, S: int) -> np.ndarray:
    """The forward-mode tangents ``(ng + nz, ng + S nz)`` of :func:`_jacobian_blocks`: one per
    global unknown, and one per initial-state coordinate ``j`` that moves coordinate ``j`` of
    every segment at once (a segment's residuals depend on the global unknowns and on its
    own initial state alone, so one tangent gives every segment's column)."""
    T = np.zeros((ng + nz, ng + S * nz))
    T[np.arange(ng), np.arange(ng)] = 1.0
    for j in range(nz):
        T[ng + j, ng + np.arange(S) * nz + j] = 1.0
    return T


def _jacobian_blocks(f, x, tangents, ng: int):
    """``(r, aux, Jg, Jz)``: the values of ``f(x) -> (r (S, N, c), aux)`` (segments ``S``) and
    the Jacobian of ``r`` in blocks: ``Jg (S, N c, ng)`` in the global unknowns, ``Jz (S, N c,
    nz)`` in each segment's own initial state, by ``ng + nz`` forward-mode tangents
    (:func:`_segment_tangents`) instead of the ``ng + S nz`` of ``jax.jacfwd``: a joint fit of
    62 racquet windows (2 + 3 x 62 unknowns) pushes 5 tangents through every window, not 188.
    ``r`` and ``aux`` are the primal of the same forward pass (not batched over the tangents),
    not a rollout of their own: the rollout's loop once, where evaluating ``f`` beside the
    tangents compiled a second loop (XLA:CPU launches each kernel of a loop iteration on its
    own, so a short call's cost is mostly the kernels' count; measured on the 69 shared flips,
    ``fit_inertia`` per window, warm, pinned to one core: a call of one row 1.1 -> 0.9 ms,
    of 32 rows 29 -> 26 ms, the compiled calls 0.50 -> 0.48 s in all)."""

    def push(t):
        r, dr, aux = jax.jvp(f, (x,), (t,), has_aux=True)
        return r, aux, dr

    r, aux, out = jax.vmap(push, out_axes=(None, None, 0))(jnp.asarray(tangents, x.dtype))  # out (ng + nz, S, N, c)
    out = jnp.moveaxis(out.reshape(out.shape[0], out.shape[1], -1), 0, -1)  # (S, N c, ng + nz)
    return r, aux, out[..., :ng], out[..., ng:]


def _dense(Jg, Jz):
    """The Jacobian ``(S N c, ng + S nz)`` of the blocks of :func:`_jacobian_blocks` (the
    unknowns ``[global | segment 0's initial state | segment 1's | ...]``)."""
    S, m, nz = Jz.shape
    own = Jz[:, :, None, :] * jnp.eye(S, dtype=Jz.dtype)[:, None, :, None]  # (S, N c, S, nz)
    return jnp.concatenate([Jg, own.reshape(S, m, S * nz)], -1).reshape(S * m, -1)


def _normal(r, Jg, Jz):
    """``(J^T J, J^T r)`` of the blocks (:func:`_jacobian_blocks`; ``r (S, N, c)``), formed
    block by block: the initial states' part is block diagonal, so the cost is ``S N c (ng +
    nz)^2``, not ``S N c P^2``."""
    S, m, nz = Jz.shape
    ng = Jg.shape[-1]
    r = r.reshape(S, m)
    gg = jnp.einsum("smi,smj->ij", Jg, Jg)
    gz = jnp.einsum("smi,smk->isk", Jg, Jz).reshape(ng, S * nz)
    zz = jnp.einsum("smk,sml->skl", Jz, Jz)
    zz = (zz[:, :, None, :] * jnp.eye(S, dtype=Jz.dtype)[:, None, :, None]).reshape(S * nz, S * nz)
    A = jnp.concatenate([jnp.concatenate([gg, gz], 1), jnp.concatenate([gz.T, zz], 1)], 0)
    g = jnp.concatenate([jnp.einsum("smi,sm->i", Jg, r), jnp.einsum("smk,sm->sk", Jz, r).reshape(-1)])
    return A, g


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
#: Rows per call where at most this many remain of a call of :data:`CHUNK_ROWS` rows (the
#: tail of a fit, a refit's kept starts, one window's step check): a second shape of the same
#: program, compiled once. A fit's last iterations are often one window's: on the 69 shared
#: racquet flips (``fit_inertia``, per window) a poor-fit window of round 1 (a large residual,
#: so Gauss-Newton converges linearly) iterated ~50 times alone in the main fit and again in
#: its refit, 123 of 151 calls with at most 4 rows, 42 % of the warm fit's CPU. In calls of 4
#: (2-core VM, warm, least of three): 1.9 -> 1.2 s wall, 2.9 -> 1.8 s CPU (pinned to one core
#: 2.0 -> 1.2 s); the first call 5.8 -> 6.3 s wall, 8.0 -> 8.5 s CPU (pinned 5.7 -> 7.3 s: the
#: extra compilation; the command line's compilation cache keeps it); ``joint=True`` warm 3.6
#: -> 2.7 s CPU. Programs called with fewer rows (a joint fit's few starts) keep their shape:
#: a second compilation of a program of many segments costs seconds.
SMALL_ROWS = 4


#: Jacobian entries per call (rows x segments x samples x 3 x unknowns) above which a float64 fit on one
#: device forms ``J^T J`` in a program of its own (see :func:`_evaluator`). Below it the
#: Jacobian program serves the optimiser too. Measured on the 69 shared racquet flips
#: (``fit_many`` with ``groups``, 32 rows x 128 samples x 3 x 5 unknowns = 61k entries per
#: call; 2-core VM, two runs each): first call 14.5-16.0 -> 10.5-11.1 s wall, 19.5-20.2 ->
#: 14.5-14.7 s CPU (the normal-equation program's tracing and compilation gone); warm fit
#: within the VM's noise (2.8-3.6 against 3.1-3.8 s wall).
NORMAL_ENTRIES = 4e6
#: Multiply-adds of ``J^T J`` per call (entries x unknowns) above which the normal-equation
#: program serves a float64 fit on one device too: there it is formed block by block
#: (:func:`_normal`: a segment's rows touch the global unknowns and its own initial state
#: only), on the host densely. A joint fit of 62 racquet windows (1 row x 62 x 128 x 3 x 188
#: unknowns: 3.5M entries, 0.8G products) spent 1.2 s of its 6 s in the host's products.
NORMAL_PRODUCTS = 1e8


def heavy(layout, N: int) -> bool:
    """Whether one row (one point of one problem) of ``layout``'s problems padded to ``N``
    samples is a large evaluation: a Jacobian of more than :data:`NORMAL_ENTRIES` entries
    (a joint fit of the 69 racquet flips: 69 x 119 x 3 x 228 = 5.6M, ~0.12 s per row on the
    2-core VM). Such a fit's second phase, with one kept start of three, ran in calls of
    three rows, 0.32 s each; in calls of one, 0.12 s."""
    return layout.S * N * 3 * len(layout.lo) > NORMAL_ENTRIES


def _chunked(fn, X, which, rows: int):
    """``fn(X, which)`` in calls of ``rows`` rows (the last padded with copies of its first
    row), dispatched before any result is read; the outputs concatenated (NumPy). With
    ``rows >= CHUNK_ROWS`` the rest after the full calls goes in calls of
    :data:`SMALL_ROWS` where at most two hold it (:func:`~rigidjax.identify._model.lane_chunks`):
    a fit's last few points, and the few extrapolated trials of :func:`_lm.solve` beside them."""
    if rows >= CHUNK_ROWS:
        chunks = lane_chunks(len(X), rows, SMALL_ROWS)
    else:
        chunks = [(c0, rows) for c0 in range(0, len(X), rows)]
    pending = []
    for c0, q in chunks:
        Xc, wc = X[c0 : c0 + q], which[c0 : c0 + q]
        n = len(Xc)
        if n < q:
            Xc = np.concatenate([Xc, np.repeat(Xc[:1], q - n, 0)])
            wc = np.concatenate([wc, np.repeat(wc[:1], q - n)])
        pending.append((n, fn(Xc, wc)))
    parts = [[np.asarray(a)[:n] for a in out] for n, out in pending]
    return [np.concatenate(p) for p in zip(*parts)]


def call_rows(problems: int, starts: int) -> int:
    """Rows per call of a fit's programs (:func:`_evaluator`): :data:`CHUNK_ROWS`, at least
    ``starts`` (one problem's starts in one call), at most every start of every problem."""
    return min(problems * starts, max(starts, CHUNK_ROWS))


def _evaluator(problems, layout, dtype, N: int, starts: int, rows: int | None = None, stacked=None):
    """``(stacked, run, evaluate, run_one)`` of ``problems`` (one structure, see
    :func:`_program`; ``layout`` of the first), padded to ``N`` samples: ``stacked`` per
    problem; ``run(X, which) -> (r, status, J)`` of points ``X`` of problems ``which``;
    ``evaluate(X, rows)`` as :func:`rigidjax.identify._lm.solve` calls it (row ``i`` of the
    batch is problem ``i // starts``); ``run_one(w)(X)``: ``run`` of problem ``w`` alone. Every
    call runs in calls of one shape (:data:`CHUNK_ROWS` rows, at least ``starts``, at most
    every start of every problem; or ``rows``; and :data:`SMALL_ROWS` for the last few points
    of a fit of many): at most two compilations whatever the number of points. ``stacked``:
    the problems' :class:`_Stacked` where the caller has them."""
    stacked, arrays = _stack_many(problems, dtype, N, stacked)
    jac_all = _program(problems[0], layout, dtype)
    rows = call_rows(len(problems), starts) if rows is None else rows
    call = _caller(jac_all, arrays, dtype)
    # float64 with a large Jacobian per call, or rows split over several devices (each
    # process receives every row's result): J^T J and J^T r formed in the program (what the
    # optimiser needs: (P, P) per row instead of the (m, P) Jacobian, m = samples x
    # components); otherwise from the Jacobian on the host, in float64 (float32: J^T J squares
    # the condition number), through the Jacobian program the results need anyway: one program
    # fewer to trace and compile (test (d), the EP pendulum: ~70 s of a ~165 s fit; the 69
    # racquet flips in fit_many: see NORMAL_ENTRIES), for a transfer of at most ~32 MB per call
    # (3 components per sample taken as the estimate of m)
    normal = None
    entries = rows * layout.S * N * 3 * len(layout.lo)
    big = entries > NORMAL_ENTRIES or entries * len(layout.lo) > NORMAL_PRODUCTS
    if jnp.dtype(dtype) == jnp.float64 and (big or _devices() is not None):
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
        # batched matmul, not np.einsum (which contracts in its own loops): J^T J of 32 rows x
        # 384 x 5 in 0.09 ms, not 1.06 ms; fit_many of the 69 shared flips (groups, 4 starts,
        # warm, median of 8 on the 2-core VM) 3.5 -> 2.4 s wall, 5.6 -> 3.9 s CPU
        Jt = J.transpose(0, 2, 1)
        A, g = Jt @ J, (Jt @ r[:, :, None])[:, :, 0]
        cost = 0.5 * np.einsum("ai,ai->a", r, r)
        # a NaN or inf in a row's J or r leaves its cost or the diagonal of its J^T J NaN or
        # inf: the row's check without a pass over J (276 rows x 357 x 5: 1.8 -> 1.0 ms)
        diag = np.diagonal(A, axis1=1, axis2=2)
        ok = np.all(status == Status.SUCCESS, axis=1) & np.isfinite(cost) & np.all(np.isfinite(diag), axis=1)
        if not ok.all():
            cost, A, g = np.where(ok, cost, np.inf), np.where(ok[:, None, None], A, 0.0), np.where(ok[:, None], g, 0.0)
        return cost, A, g, ok, np.zeros((na, 1))

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
