"""Ensembles of independent rollouts, sharded over every available device.

:func:`ensemble_rollout` runs ``jax.vmap(rollout)`` over a leading ensemble axis and splits
that axis over devices with JAX's own sharding (``jax.shard_map`` on a one-axis
:class:`jax.sharding.Mesh`): each device integrates its own members, with no communication
(members are independent), so throughput scales with the device count. The ensemble is
padded to a multiple of the device count (with copies of the last member) and unpadded
before it is returned.

Devices are whatever ``jax.devices()`` lists: the GPUs/TPUs of this host, or CPU "devices"
(``XLA_FLAGS=--xla_force_host_platform_device_count=K`` set before JAX is imported splits
the host's cores into ``K`` devices), or, on several hosts, every device of every process.
On a multi-core CPU one device per core is also the fastest single-host setting: each core
integrates its own members as whole loops, instead of every loop of the step being split
over the cores and joined (midpoint step, N = 4096, float64, 2-core VM: 29-33 M body-steps/s
with ``K = 2`` against 17-22 M with one device; ``benchmarks/README.md``).

Multi-host (several machines, one Python process each)::

    import jax
    jax.distributed.initialize()   # coordinator address/process id from the cluster env
    #                                (SLURM, Kubernetes, Cloud TPU) or passed explicitly
    traj = ensemble_rollout(step, models, states0, dt, n)   # devices=None: all global devices

Every process makes the same call with the same full ensemble (host NumPy arrays or fully
replicated arrays); the members are placed on the global mesh, each host computes the
members on its own devices, and the returned arrays are global ``jax.Array``s sharded along
the ensemble axis. Read a host's part through ``a.addressable_shards``, or gather everything
on every host with ``jax.experimental.multihost_utils.process_allgather``. (The multi-host
path is JAX's standard one; rigidjax's tests exercise the multi-device single-host case.)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .numerics import full_precision, is_concrete
from .info import check
from .stepper import packed_form
from .rollout import Trajectory, check_dt, rollout

__all__ = ["ensemble_rollout", "ensemble_size", "shard_ensemble"]

_AXIS = "ensemble"


def ensemble_size(states0) -> int:
    """Number of members: the common leading axis of every leaf of ``states0``.

    Raises:
        ValueError: a leaf is a scalar, or the leaves disagree on the leading length.
    """
    leaves = jax.tree_util.tree_leaves(states0)
    if not leaves:
        raise ValueError("ensemble_rollout: states0 has no array leaves")
    sizes = {np.shape(a)[0] if np.ndim(a) else None for a in leaves}
    if None in sizes or len(sizes) != 1:
        raise ValueError(
            "ensemble_rollout: every leaf of states0 needs the same leading ensemble axis; got leading "
            f"lengths {sorted(str(s) for s in sizes)} (a single state: add the axis, "
            "e.g. with jax.tree.map(lambda a: a[None], s))"
        )
    return int(sizes.pop())


def _check_axis(tree, n_members: int, name: str, extra: tuple[int, ...] = ()):
    want = (n_members, *extra)
    for leaf in jax.tree_util.tree_leaves(tree):
        if np.shape(leaf)[: len(want)] != want:
            raise ValueError(
                f"ensemble_rollout: every leaf of {name} needs leading axes {want} "
                f"(ensemble{', n_steps' if extra else ''}); got a leaf of shape {np.shape(leaf)}"
                + ("; for one model shared by every member pass model_batched=False" if name == "models" else "")
            )


def _pad(tree, pad: int):
    if pad == 0:
        return tree
    # copies of the last member: valid inputs, so the padding never produces NaN or failures
    return jax.tree_util.tree_map(lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], pad, 0)], 0), tree)


#: Largest shared model (total entries) compiled into the program as a constant.
CONSTANT_MODEL_MAX = 4096


class _ConstantModel:
    """A shared, concrete model as a compile-time constant, hashed by value.

    Why: a model closed over (not a ``jit`` argument) lets the steps see its exact zeros
    (no resistance, diagonal inertia, no gravity) as structural zeros and skip their terms,
    as ``jax.jit(lambda s: rollout(step, model, s, ...))`` does (``rigidjax.numerics.static_zeros``);
    as an argument it is traced and every term is kept (EP step at N = 4096, one device: 1.4
    against 2.0 M body-steps/s). Keyed by value, so equal models share one compiled program."""

    def __init__(self, tree):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        arrays = [np.asarray(a) for a in leaves]
        self.tree = tree
        self.key = (treedef, tuple((a.shape, a.dtype.str, a.tobytes()) for a in arrays))

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _ConstantModel) and self.key == other.key


def _constant_model(models, model_batched: bool):
    """``_ConstantModel(models)`` for a shared model with concrete leaves of modest size, else ``None``."""
    leaves = jax.tree_util.tree_leaves(models)
    if model_batched or not all(is_concrete(a) for a in leaves):
        return None
    if sum(int(np.size(a)) for a in leaves) > CONSTANT_MODEL_MAX:
        return None
    return _ConstantModel(models)


@functools.lru_cache(maxsize=64)
def _compiled(step, n, checkpoint_every, save_every, adjoint, mesh, model_batched, loads_kind, loads_fn, const=None):
    spec = PartitionSpec(_AXIS)
    rep = PartitionSpec()

    def local(models, states0, dt, loads):
        if const is not None:
            models = const.tree
        opts = dict(checkpoint_every=checkpoint_every, save_every=save_every, adjoint=adjoint)
        packed = packed_form(step, models)
        if packed is not None and packed.native_batch and loads_kind != "callable":
            # a packed step that takes the batch natively (the midpoint step): one rollout over the local members
            # keeps every state component contiguous over them (vmap would put the member
            # axis first in the per-member arrays of the reverse sweep); time axis moved second
            member_loads = None if loads is None else jnp.swapaxes(loads, 0, 1)
            tr = rollout(step, models, states0, dt, n, member_loads, **opts)
            return jax.tree_util.tree_map(lambda a: jnp.swapaxes(a, 0, 1), tr)

        def one(model, state0, load):
            member_loads = loads_fn if loads_kind == "callable" else load
            # a constant model is closed over, never a vmap argument (it would be traced)
            return rollout(step, models if const is not None else model, state0, dt, n, member_loads, **opts)

        in_axes = (0 if model_batched else None, 0, 0 if loads_kind == "array" else None)
        return jax.vmap(one, in_axes=in_axes)(models, states0, loads)

    sharded = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec if model_batched else rep, spec, rep, spec if loads_kind == "array" else rep),
        out_specs=spec,
        # members never talk to each other; the replicated dt/model and the per-member carry
        # meet in the scan, which the varying-axes check would reject for no gain
        check_vma=False,
    )
    return jax.jit(sharded)


@full_precision
def ensemble_rollout(
    step: Callable,
    models,
    states0,
    dt,
    n_steps: int | None = None,
    loads: Any = None,
    *,
    devices: Sequence[jax.Device] | None = None,
    checkpoint_every: int | None = None,
    save_every: int | None = None,
    adjoint: str | None = None,
    model_batched: bool = True,
    checked: bool = False,
    allow_rotation_limit: bool = False,
) -> Trajectory:
    """Independent rollouts of ``E`` ensemble members, sharded over ``devices``.

    Equivalent to ``jax.vmap(lambda m, s, l: rollout(step, m, s, dt, n_steps, l))`` over the
    leading axis of ``models``, ``states0`` and per-member ``loads`` (same values, to
    round-off), with the ensemble axis split over the devices.

    Args:
        step: any rigidjax stepper ``step(model, state, inputs, dt) -> (state, info)``
            (options bound with ``functools.partial``); hashable, so the compiled program is
            cached between calls.
        models: model pytree (e.g. :class:`rigidjax.RigidBody`) with a leading ensemble axis
            of length ``E`` on every leaf (``RigidBody(mass=(E,), inertia=(E, 3, 3), ...)``),
            or one shared model with ``model_batched=False``.
        states0: initial states with leading axis ``E`` on every leaf
            (e.g. ``RigidBodyState(angular_velocity=(E, 3), ...)``).
        dt: s, shared by all members: scalar or per-step ``(n_steps,)``; must be > 0.
        n_steps: number of steps (required with a scalar ``dt``).
        loads: ``None``; per-member per-step inputs with leading axes ``(E, n_steps)``; or a
            callable ``loads(t, state) -> inputs`` applied to each member (hashable).
        devices: devices to shard over (default ``jax.devices()``: all devices, all hosts).
        checkpoint_every: passed to :func:`rigidjax.rollout` (bounded-memory gradients).
        save_every: passed to :func:`rigidjax.rollout`: keep every ``s``-th state and the
            last (``save_every=n_steps``: initial and final states only, the fastest and
            smallest output for large ensembles).
        adjoint: passed to :func:`rigidjax.rollout` (``"discrete"``: the midpoint step's
            hand-written reverse sweep for ``jax.grad``).
        model_batched: ``False`` to share one unbatched model among all members. A shared
            model with concrete leaves (not traced by an enclosing ``jit``/``grad``) of at most
            :data:`CONSTANT_MODEL_MAX` entries is compiled into the program as a constant, so
            its exact zeros (no resistance, diagonal inertia, no gravity) cost nothing (N = 4096,
            one device: EP 1.4 -> 2.0 M, VI 1.7 -> 2.9 M body-steps/s). Programs are cached by
            the model's value, so each NEW shared model compiles (seconds; ~1 min for jointed
            EP bodies), as :func:`rigidjax.rollout` called outside ``jit`` does. In a loop over
            model values (a sweep, a SciPy optimiser) wrap the call in ``jax.jit`` with the
            model as an argument (``jax.jit(lambda m, s: ensemble_rollout(step, m, s, dt, n,
            model_batched=False))``): one program for all values, every term kept; or batch
            the models.
        checked: raise :class:`rigidjax.StepFailure` (naming step and member) if a step failed.
        allow_rotation_limit: in checked mode, accept ``Status.ROTATION_LIMIT``.

    Returns:
        :class:`rigidjax.Trajectory` with the ensemble axis FIRST: ``states`` leaves
        ``(E, n_steps + 1, ...)``, ``info`` leaves ``(E, n_steps)`` (fewer with ``save_every``); global arrays, sharded
        over ``devices`` along the ensemble axis when ``E`` is a multiple of the device
        count (otherwise removing the padding lets XLA re-lay them out). Failed members
        stay frozen (as in :func:`rollout`); members never affect each other.

    Raises:
        ValueError: inconsistent ensemble axes, bad ``dt``/``n_steps``/``loads``/``checkpoint_every``.
        StepFailure: ``checked=True`` and a step failed.

    Differentiable (``jax.grad`` through it gives per-member gradients summed as usual);
    jit-able around it as well (the sharding then comes from the inner ``shard_map``).
    """
    dt_arr, n = check_dt(dt, n_steps, states0)
    E = ensemble_size(states0)
    if model_batched:
        _check_axis(models, E, "models")
    if loads is None:
        loads_kind, loads_fn, loads_arr = "none", None, None
    elif callable(loads):
        loads_kind, loads_fn, loads_arr = "callable", loads, None
    else:
        _check_axis(loads, E, "loads", (n,))
        loads_kind, loads_fn, loads_arr = "array", None, loads
    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise ValueError("ensemble_rollout: devices is empty")
    D = len(devs)
    pad = (-E) % D
    mesh = Mesh(np.asarray(devs), (_AXIS,))
    const = _constant_model(models, model_batched)
    models_p = _pad(models, pad) if model_batched else (None if const is not None else models)
    states_p = _pad(states0, pad)
    loads_p = _pad(loads_arr, pad) if loads_kind == "array" else None
    try:
        fn = _compiled(step, n, checkpoint_every, save_every, adjoint, mesh, model_batched, loads_kind, loads_fn, const)
    except (TypeError, ValueError):
        # an unhashable step or loads, or a model whose static fields cannot be compared
        # (e.g. an array): build (and compile) without the cache
        fn = _compiled.__wrapped__(
            step, n, checkpoint_every, save_every, adjoint, mesh, model_batched, loads_kind, loads_fn, const
        )
    traj = fn(models_p, states_p, dt_arr, loads_p)
    if pad:
        traj = jax.tree_util.tree_map(lambda a: a[:E], traj)
    if checked:
        # check() reads a leading time axis, then the member
        check(
            jax.tree_util.tree_map(lambda a: jnp.swapaxes(a, 0, 1), traj.info),
            allow_rotation_limit=allow_rotation_limit,
        )
    return traj


def shard_ensemble(tree, devices: Sequence[jax.Device] | None = None):
    """Place ``tree`` (leading ensemble axis, divisible by the device count) on ``devices``,
    split along the ensemble axis; returns the sharded pytree (``jax.device_put``)."""
    devs = list(jax.devices() if devices is None else devices)
    sharding = NamedSharding(Mesh(np.asarray(devs), (_AXIS,)), PartitionSpec(_AXIS))
    return jax.device_put(tree, sharding)
