"""Rollouts of any stepper with ``lax.scan``: compile time does not grow with step count.

Every stepper in rigidjax has the shape ``step(model, state, inputs, dt) -> (state, info)``
(:func:`rigidjax.midpoint_step`, the Euler-parameter and variational steps, or your own);
:func:`rollout` runs it over ``n`` steps. Ensembles: ``jax.vmap(rollout-closure)`` over
models, states and loads. Gradients: ``jax.grad`` through it (reverse mode through the scan).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .numerics import full_precision, is_concrete, where_tree, zeros_like_batch
from .info import FAILURES, Status, StepInfo, check, failure_mask
from .stepper import packed_form

__all__ = ["Trajectory", "rollout", "check_dt"]


class Trajectory(eqx.Module):
    """Result of :func:`rollout`.

    Attributes:
        states: the state pytree with a leading time axis of length ``n_steps + 1``
            (the initial state first); under ``vmap`` the ensemble axis comes first.
        info: :class:`rigidjax.StepInfo` with a leading time axis of length ``n_steps``.
    """

    states: Any
    info: StepInfo

    @property
    def converged(self) -> jax.Array:
        """``bool``: every step of this (un-vmapped) rollout advanced the state.

        Reduces over the leading time axis, so it holds one flag per member of a batched
        state. For an ensemble made with ``jax.vmap(rollout)`` the time axis is axis 1: use
        ``traj.info.converged.all(axis=1)``.
        """
        return jnp.all(self.info.converged, axis=0)


def check_dt(dt, n_steps: int | None, state=None):
    """Validate ``dt`` (scalar or per-step ``(n_steps,)``) where it is concrete; returns (dt, n).

    With ``state``, ``dt`` takes the dtype of its ``time`` (what every stepper casts it to) as
    a strongly typed array: ``0.01``, ``np.float64(0.01)`` and a float64 array then give the
    same compiled program (JAX's cache key includes the weak type of a Python float).
    """
    dt_arr = jnp.asarray(dt)
    t = getattr(state, "time", None)
    if t is not None and jnp.issubdtype(jnp.result_type(t), jnp.floating) and jnp.issubdtype(dt_arr.dtype, jnp.number):
        dt_arr = jnp.asarray(dt_arr, dtype=jnp.result_type(t))
    if n_steps is not None:
        try:
            if isinstance(n_steps, bool):
                raise TypeError
            n_steps = operator.index(n_steps)  # ints, NumPy ints, concrete integer arrays; not 3.5
        except TypeError:
            raise ValueError(f"rollout: n_steps must be an integer; got {n_steps!r}") from None
    if dt_arr.ndim == 0:
        if n_steps is None:
            raise ValueError("rollout: n_steps is required when dt is a scalar")
        n = int(n_steps)
    elif dt_arr.ndim == 1:
        n = dt_arr.shape[0]
        if n_steps is not None and int(n_steps) != n:
            raise ValueError(f"rollout: dt has {n} per-step values but n_steps={n_steps}")
    else:
        raise ValueError(f"rollout: dt must be a scalar or a (n_steps,) array of steps; got shape {dt_arr.shape}")
    if n < 0:
        raise ValueError(f"rollout: n_steps must be >= 0; got {n}")
    if is_concrete(dt_arr):
        d = np.asarray(dt_arr)
        if not np.all(np.isfinite(d)):
            raise ValueError(f"rollout: dt contains NaN or inf: {d}")
        if np.any(d <= 0):
            raise ValueError(f"rollout: dt must be > 0 s; got min(dt) = {d.min()}")
    return dt_arr, n


@full_precision
def rollout(
    step: Callable,
    model,
    state0,
    dt,
    n_steps: int | None = None,
    loads: Any = None,
    *,
    checked: bool = False,
    allow_rotation_limit: bool = False,
    checkpoint_every: int | None = None,
    save_every: int | None = None,
    adjoint: str | None = None,
    substeps=None,
) -> Trajectory:
    """Run ``step`` for ``n_steps`` with ``lax.scan``.

    Args:
        step: ``step(model, state, inputs, dt) -> (state, info)``: a stepper object (e.g.
            ``rigidjax.Midpoint(attitude="midpoint")``) or a step function with its options
            bound by ``functools.partial`` (e.g. ``partial(midpoint_step, attitude="midpoint")``).
        model: the model pytree (e.g. :class:`rigidjax.RigidBody`); closed over, differentiable.
        state0: initial state pytree (e.g. :class:`rigidjax.RigidBodyState`).
        dt: step in s: a scalar, or an array ``(n_steps,)`` of per-step sizes (non-uniform
            sample times, e.g. ``jnp.diff(t_measured)``). Must be > 0.
        n_steps: number of steps (required with a scalar ``dt``).
        loads: the step's ``inputs``: ``None`` (zero), a pytree whose leaves have a leading
            axis of length ``n_steps`` (one input per step, held over the step), or a callable
            ``loads(t, state) -> inputs`` evaluated at the start of each step.
        checked: after the run, raise :class:`rigidjax.StepFailure` if any step failed
            (outside ``jit`` with the step and member named; inside via ``equinox.error_if``).
        allow_rotation_limit: in checked mode, accept ``Status.ROTATION_LIMIT``.
        checkpoint_every: ``None`` (default) or a chunk length ``k >= 1`` for reverse-mode
            gradients of long rollouts with bounded memory: the scan runs as an outer scan
            over chunks of ``k`` steps, each chunk under ``jax.checkpoint``, so the backward
            pass stores the carry at chunk boundaries only and recomputes one chunk at a
            time (about one extra forward pass). The step intermediates kept for the backward
            pass fall from ``O(n_steps)`` to ``O(n_steps / k + k)``; ``k ~ sqrt(n_steps)``
            minimises it. ``n_steps`` need not be a multiple of ``k`` (the remainder runs as
            a last, shorter chunk). Results and gradients are those of the plain scan (same
            operations, to round-off); the returned trajectory itself is still
            ``O(n_steps)`` (see ``save_every``). Measured costs: ``benchmarks/README.md``.
            With ``save_every = s``, chunks are whole save intervals: ``max(1, k // s)`` of them.
        save_every: ``None`` (default: every state) or ``s >= 1``: store the state every ``s``
            steps only, and always the final one. ``states`` then holds steps
            ``0, s, 2s, …`` and ``n_steps`` (``1 + ceil(n_steps / s)`` states) and ``info``
            one entry per save interval, reduced over its steps: ``status`` the failure code
            if a step failed, else ``ROTATION_LIMIT`` if any step exceeded it, else
            ``SUCCESS``; ``iterations``, ``residual`` and ``rotation`` the maxima (diagnostics:
            the reduced ``info`` carries no derivative, which saves a trace of the loop
            body per derivative; 2.8 -> 2.3 s for the identification layer's motion-capture
            Jacobian). The trajectory memory falls by ``s`` (e.g. ``save_every=n_steps``: initial and final
            state only, for large ensembles); the dynamics are unchanged.

        adjoint: how ``jax.grad``/``vjp`` differentiate the rollout. ``None`` (default):
            autodiff through the scan (forward and reverse mode, any stepper, composes with
            everything). ``"discrete"``: for the midpoint stepper only, the exact
            gradient of the discrete trajectory by a hand-written reverse sweep
            (:mod:`rigidjax.midpoint.adjoint`) that reads only the stored states: reverse mode several
            times cheaper than autodiff on CPU (``benchmarks/README.md``), memory the
            trajectory itself. Reverse mode only (``jax.jvp``/``jacfwd`` raise, as for any
            ``jax.custom_vjp``); needs per-step or no ``loads`` (not a callable) and no
            ``save_every``/``checkpoint_every``/``substeps``.
        substeps: ``None`` (default) or a count ``m``: each entry of ``dt`` (each of the
            ``n_steps`` intervals, e.g. between two measured samples) is taken in ``m`` equal
            steps of ``dt / m``, the interval's loads held over them (a callable ``loads`` is
            evaluated before every step). ``states`` and ``info`` are per interval (``info``
            reduced over its steps as for ``save_every``; ``save_every`` and
            ``checkpoint_every`` then count intervals). ``m``: an integer ``>= 1`` known
            outside any trace (Python or NumPy/JAX integer scalar: any mode of
            differentiation), or a traced integer scalar (one program for every count, e.g.
            under ``jit``; forward mode only: JAX cannot reverse-differentiate a loop of traced
            length, so pass the count as a static argument for ``jax.grad`` under ``jit``).
            Under ``vmap`` over counts every member runs the largest count's loop, its own
            steps alone advancing it. A traced ``m < 1`` runs no step: every interval gets
            ``Status.INVALID_INPUT`` and the state is held.

    Returns:
        :class:`Trajectory` with ``states`` (``n_steps + 1`` along the leading axis, or as
        ``save_every`` says) and per-step (per save interval) ``info``. A member whose step
        fails keeps its last good state for the rest of the rollout and every later
        ``info.status`` repeats the failure code.

    Speed: the midpoint stepper, the Euler-parameter stepper on a model of free bodies (no
    constraints besides the Euler-parameter one) and the variational stepper on a free
    :func:`rigidjax.systems.rigid_body`, as stepper objects or as step functions (also bound
    with ``functools.partial``), are run in structure-of-arrays form (the stepper's
    ``packed(model)``, asked for through :func:`rigidjax.stepper.packed_form`):
    each state component a contiguous array over the ensemble inside the scan, stacked back
    to the public layout once at the end. Results are those of the step itself (same
    iterates, round-off apart).

    Raises:
        ValueError: ``dt <= 0``, NaN ``dt``, inconsistent ``n_steps``/``dt``/``loads`` lengths,
            ``checkpoint_every`` or ``save_every`` not a positive integer, ``substeps`` not an
            integer scalar ``>= 1`` (traced: not an integer scalar); ``adjoint`` not
            ``None``/``"discrete"`` or ``"discrete"`` with an unsupported step or option.
    """
    dt_arr, n = check_dt(dt, n_steps, state0)
    checkpoint_every = _positive_int_or_none(checkpoint_every, "checkpoint_every")
    save_every = _positive_int_or_none(save_every, "save_every")
    per_step_dt = dt_arr.ndim == 1
    if loads is not None and not callable(loads):
        for leaf in jax.tree_util.tree_leaves(loads):
            if jnp.shape(leaf)[:1] != (n,):
                raise ValueError(
                    f"rollout: per-step loads must have a leading axis of length n_steps={n}; "
                    f"got a leaf of shape {jnp.shape(leaf)}"
                )

    failure_codes = np.asarray([int(c) for c in FAILURES], np.int32)
    packed = packed_form(step, model)
    template = jax.eval_shape(lambda: state0)
    if adjoint not in (None, "discrete"):
        raise ValueError(f"rollout: adjoint must be None or 'discrete'; got {adjoint!r}")
    if adjoint == "discrete":
        problems = [
            msg
            for bad, msg in (
                (
                    packed is None or packed.discrete_adjoint is None,
                    "the step has no discrete adjoint (rigidjax.Midpoint has)",
                ),
                (callable(loads), "loads is a callable"),
                (save_every not in (None, 1), "save_every is set"),
                (checkpoint_every is not None, "checkpoint_every is set (the discrete adjoint needs no checkpoints)"),
                (substeps is not None, "substeps is set"),
            )
            if bad
        ]
        if problems:
            raise ValueError("rollout: adjoint='discrete' is not available here: " + "; ".join(problems))

    def body(carry, xs, model=model, dt_arr=dt_arr):
        state, fail_code, comp = carry
        dt_k, load_k = xs
        if dt_k is None:  # scalar dt: a constant of the loop, so XLA hoists what depends on it
            dt_k = dt_arr
        failed_before = fail_code != 0
        if packed is not None:
            # the public view only feeds shape checks and callable loads; unused, XLA drops it
            # (built on a shape-only template: no closed-over tracers in custom_vjp's forward)
            public = packed.unpack(state, template)
            if callable(loads):
                load_k = loads(state.time, public)
            packed.check(model, public, load_k, dt_k)
            new_state, info = packed.step(model, state, load_k, dt_k, ~failed_before)
        else:
            if callable(loads):
                load_k = loads(state.time if hasattr(state, "time") else None, state)
            new_state, info = step(model, state, load_k, dt_k)
            new_state = where_tree(failed_before, state, new_state)
        new_state, comp = _compensated_time(state, new_state, dt_k, comp)
        status = jnp.where(failed_before, fail_code, info.status)
        info = eqx.tree_at(lambda i: i.status, info, status)
        fail_code = jnp.where(jnp.isin(status, failure_codes), status, 0).astype(jnp.int32)
        return (new_state, fail_code, comp), (new_state, info)

    xs_dt = dt_arr if per_step_dt else None
    xs_load = None if (loads is None or callable(loads)) else loads
    xs = (xs_dt, xs_load)
    fail0 = zeros_like_batch(state0, _batch_shape(state0))  # batched with the state: fewer loop traces
    t0 = getattr(state0, "time", None)
    comp0 = (
        zeros_like_batch(state0, jnp.shape(t0), jnp.result_type(t0))
        if t0 is not None and jnp.issubdtype(jnp.result_type(t0), jnp.floating)
        else None
    )
    carry0 = (packed.pack(state0) if packed is not None else state0, fail0, comp0)
    k_sub = None if substeps is None else _substeps(substeps)
    if k_sub is not None and n > 0:
        body = _in_substeps(body, carry0, xs, k_sub, dt_arr)
    if adjoint == "discrete" and n > 0:
        states, info = packed.discrete_adjoint(body, model, carry0, dt_arr, xs_load, n)
    elif save_every is None or save_every == 1 or n == 0:
        _, (states, info) = _scan(body, carry0, xs, n, checkpoint_every)
    else:
        states, info = _saved_scan(body, carry0, xs, n, save_every, checkpoint_every)
    if packed is not None:
        states = packed.unpack(states, state0)
    states = jax.tree_util.tree_map(lambda a0, a: jnp.concatenate([a0[None], a], 0), state0, states)
    if checked:
        if is_concrete(info.status):
            check(info, allow_rotation_limit=allow_rotation_limit, leading=_leading(k_sub, save_every))  # raises
        else:
            # inside jit: guard every output leaf, so the runtime check cannot be pruned
            bad = jnp.any(failure_mask(info.status, allow_rotation_limit))
            msg = "rigidjax: a step failed in a checked rollout (see StepInfo.status; Status codes in rigidjax.info)"
            states = jax.tree_util.tree_map(lambda a: eqx.error_if(a, bad, msg), states)
            info = jax.tree_util.tree_map(lambda a: eqx.error_if(a, bad, msg), info)
    return Trajectory(states=states, info=info)


def _leading(k_sub, save_every) -> str:
    """What an entry of a rollout's ``info`` is, for :func:`rigidjax.info.check`'s message."""
    if save_every not in (None, 1):
        return f"save interval ({save_every} {'steps' if k_sub is None else 'sample intervals'} each)"
    if k_sub is not None:
        return f"sample interval ({k_sub} step{'' if k_sub == 1 else 's'} each)"
    return "step"


def _compensated_time(state, new_state, dt, comp):
    """The rollout's clock as a compensated (Kahan) sum of the steps: ``new_state.time`` within
    a few ulps of ``t0 + sum(dt)`` however many steps (every stepper's own ``t + dt`` drifts by
    ~``k eps t``: 10^5 float32 steps of 1e-3 s end 0.043 s early). Members whose time did
    not move (a failed or frozen step) keep it. Returns ``(new_state, comp)``; ``comp`` is
    ``None`` for a state without a float ``time``. The compensation carries no derivative
    (``d comp = 0`` exactly), so gradients with respect to ``dt`` are those of ``t + dt``."""
    if comp is None:
        return new_state, comp
    t = state.time
    y = jnp.asarray(dt, t.dtype) - comp
    t_sum = t + y
    moved = new_state.time != t
    comp = jnp.where(moved, (t_sum - t) - y, comp)
    return eqx.tree_at(lambda s: s.time, new_state, jnp.where(moved, t_sum, t)), comp


def _positive_int_or_none(k, name: str):
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"rollout: {name} must be None or an integer >= 1; got {k!r}")
    return int(k)


def _substeps(k):
    """``rollout``'s ``substeps``: a Python integer ``>= 1`` (returned as an int) or a traced
    integer scalar; else ``ValueError``."""
    if isinstance(k, (jax.Array, np.ndarray)) and not is_concrete(k):
        if jnp.shape(k) != () or not jnp.issubdtype(jnp.result_type(k), jnp.integer):
            got = f"shape {jnp.shape(k)}, dtype {jnp.result_type(k)}"
            raise ValueError(f"rollout: a traced substeps must be an integer scalar; got {got}")
        return k
    integer = isinstance(k, (jax.Array, np.ndarray)) and jnp.issubdtype(jnp.result_type(k), jnp.integer)
    if integer and jnp.shape(k) == ():
        k = int(k)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"rollout: substeps must be None, an integer >= 1 or a traced integer scalar; got {k!r}")
    return int(k)


def _in_substeps(body, carry0, xs, k, dt_arr):
    """The rollout's ``body`` over one interval in ``k`` equal steps (``rollout``'s
    ``substeps``): ``lax.fori_loop`` (a scan for a Python ``k``, a while loop for a traced
    one), info reduced over the steps by :func:`_merge_info`."""
    x0 = jax.tree_util.tree_map(lambda a: a[0], xs)
    info_shape = jax.eval_shape(body, carry0, (dt_arr if x0[0] is None else x0[0], x0[1]))[1][1]

    def interval(carry, x):
        dt_k, load_k = x
        h = (dt_arr if dt_k is None else dt_k) / jnp.asarray(k, jnp.result_type(dt_arr))
        acc0 = jax.tree_util.tree_map(lambda a: zeros_like_batch(carry[0], a.shape, a.dtype), info_shape)

        def one(_, c):
            cc, acc = c
            cc, (_, info) = body(cc, (h, load_k))
            return cc, _merge_info(acc, info)

        carry, acc = jax.lax.fori_loop(0, k, one, (carry, acc0))
        if not isinstance(k, int):  # a traced count below 1 runs no step: the interval fails
            bad = jnp.asarray(k) < 1
            code = jnp.where(bad, int(Status.INVALID_INPUT), carry[1]).astype(jnp.int32)
            carry = (carry[0], code, carry[2])
            acc = eqx.tree_at(lambda i: i.status, acc, jnp.where(bad, code, acc.status).astype(jnp.int32))
        return carry, (carry[0], acc)

    return interval


def _split(tree, lo, hi, shape):
    return jax.tree_util.tree_map(lambda a: a[lo:hi].reshape(shape + a.shape[1:]), tree)


def _scan(body, carry0, xs, n: int, k: int | None):
    """``lax.scan(body, carry0, xs, length=n)``, as checkpointed chunks of ``k`` steps if ``k < n``.

    Chunked: an outer scan over ``n // k`` chunks (each an inner scan under
    ``jax.checkpoint``), then the ``n % k`` remaining steps as one more checkpointed scan;
    the stacked outputs are joined back into one leading axis of length ``n``.
    """
    if k is None or k >= n:
        return jax.lax.scan(body, carry0, xs, length=n)
    n_chunks, rem = divmod(n, k)

    def inner(length):
        def run(carry, xs_chunk):
            return jax.lax.scan(body, carry, xs_chunk, length=length)

        return jax.checkpoint(run, prevent_cse=False)

    carry, ys = jax.lax.scan(inner(k), carry0, _split(xs, 0, n_chunks * k, (n_chunks, k)), length=n_chunks)
    ys = jax.tree_util.tree_map(lambda a: a.reshape((n_chunks * k,) + a.shape[2:]), ys)
    if rem:
        carry, ys_rem = inner(rem)(carry, _split(xs, n_chunks * k, n, (rem,)))
        ys = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], 0), ys, ys_rem)
    return carry, ys


def _merge_info(acc: StepInfo, info: StepInfo) -> StepInfo:
    """Reduce step infos over a save interval: failure code, else ROTATION_LIMIT, else SUCCESS;
    maxima of iterations, residual, rotation. A diagnostic: it carries no derivative (a loop
    carry with a derivative would make JAX trace the loop's body again for its tangent)."""
    info = jax.lax.stop_gradient(info)
    failed = jnp.isin(info.status, jnp.asarray([int(c) for c in FAILURES], jnp.int32))
    limit = (acc.status == Status.ROTATION_LIMIT) | (info.status == Status.ROTATION_LIMIT)
    status = jnp.where(failed, info.status, jnp.where(limit, int(Status.ROTATION_LIMIT), int(Status.SUCCESS)))
    return StepInfo(
        status=status.astype(jnp.int32),
        iterations=jnp.maximum(acc.iterations, info.iterations),
        residual=jnp.maximum(acc.residual, info.residual),
        rotation=jnp.maximum(acc.rotation, info.rotation),
    )


def _saved_scan(body, carry0, xs, n: int, s: int, k: int | None):
    """Run ``n`` steps keeping the state every ``s`` steps and the last one; info reduced per interval."""
    n_saves, rem = divmod(n, s)
    x0 = jax.tree_util.tree_map(lambda a: a[0], xs) if n else None
    info_shape = jax.eval_shape(body, carry0, x0)[1][1] if n else None

    def interval(length):
        def run(carry, xs_chunk):
            acc0 = jax.tree_util.tree_map(lambda a: zeros_like_batch(carry[0], a.shape, a.dtype), info_shape)

            def one(c, x):
                cc, acc = c
                cc, (_, info) = body(cc, x)
                return (cc, _merge_info(acc, info)), None

            (carry, acc), _ = jax.lax.scan(one, (carry, acc0), xs_chunk, length=length)
            return carry, (carry[0], acc)

        return run

    k_int = None if k is None else max(1, k // s)
    carry, ys = _scan(interval(s), carry0, _split(xs, 0, n_saves * s, (n_saves, s)), n_saves, k_int)
    if rem:
        carry, ys_rem = interval(rem)(carry, _split(xs, n_saves * s, n, (rem,)))
        ys = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b[None]], 0), ys, ys_rem)
    return ys


def _batch_shape(state) -> tuple[int, ...]:
    t = getattr(state, "time", None)
    return jnp.shape(t) if t is not None else ()
