"""Small internal helpers shared by the steppers (not public API)."""

from __future__ import annotations

import functools
import operator

import jax
import jax.extend.core
import jax.interpreters.ad
import jax.interpreters.batching
import jax.interpreters.mlir
import jax.numpy as jnp
import numpy as np


def where_tree(pred: jax.Array, new, old):
    """Per-member ``new if pred else old`` over matching pytrees; ``pred`` has the batch shape."""
    pred = jnp.asarray(pred)

    def sel(a, b):
        p = jnp.reshape(pred, pred.shape + (1,) * (jnp.ndim(a) - pred.ndim))
        return jnp.where(p, a, b)

    return jax.tree_util.tree_map(sel, new, old)


#: Which stepper takes which model and state (for the messages of :func:`check_kinds`).
_STEPPER_OF = {
    "RigidBody": "midpoint_step (or ep_step through an EPModel of it)",
    "RigidBodyState": "midpoint_step",
    "EPModel": "ep_step",
    "EPState": "ep_step",
    "MechanicalSystem": "vi_step",
    "VIState": "vi_step",
}


def check_kinds(where: str, model, model_cls: type, state=None, state_cls: type | None = None) -> None:
    """``TypeError`` naming the stepper that takes what was passed, where ``model`` (or
    ``state``) is not a ``model_cls`` (``state_cls``)."""
    for what, value, cls in (("model", model, model_cls), ("state", state, state_cls)):
        if cls is None or isinstance(value, cls):
            continue
        got = type(value).__name__
        other = _STEPPER_OF.get(got)
        hint = f": a {got} steps with rigidjax.{other}" if other else ""
        raise TypeError(f"{where}: {what} must be a rigidjax.{cls.__name__}; got a {got}{hint}")


def is_concrete(x) -> bool:
    """True when ``x`` is a concrete value (not a tracer inside jit/grad/vmap)."""
    return not isinstance(x, jax.core.Tracer)


def as_float(x, name: str, dtype=None) -> jax.Array:
    """``x`` as a floating-point array (integers become the default float; ``dtype`` when
    given); ``TypeError`` naming ``name`` when it is not array-like."""
    try:
        a = jnp.asarray(x) if dtype is None else jnp.asarray(x, dtype)
    except Exception as e:
        raise TypeError(f"{name}: cannot convert {type(x).__name__} to an array ({e})") from None
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.result_type(float))
    return a


def check_step_dt(dt, where: str) -> None:
    """``ValueError`` where ``dt`` (s) is concrete and not finite and > 0, ``TypeError`` where it
    is not a number (``None``, a string, a bool): a step's boundary check; a traced ``dt`` out
    of range is the step's ``Status.INVALID_INPUT`` instead."""
    if is_concrete(dt):
        d = np.asarray(dt)
        if d.dtype == bool or not (np.issubdtype(d.dtype, np.integer) or np.issubdtype(d.dtype, np.floating)):
            raise TypeError(f"{where}: dt must be a number of seconds (a float or an array of them); got {dt!r}")
        if not np.all(np.isfinite(d)) or np.any(d <= 0):
            raise ValueError(f"{where}: dt must be finite and > 0 s; got {d}")


def check_finite(a, name: str) -> None:
    """``ValueError`` naming ``name`` where a concrete ``a`` holds NaN or inf (traced: no check)."""
    if is_concrete(a) and not np.all(np.isfinite(np.asarray(a))):
        raise ValueError(f"{name} contains NaN or inf: {np.asarray(a)}")


#: Largest number of arrays :func:`materialize` computes in one loop (see there).
MATERIALIZE_MAX = 32


def materialize(*xs):
    """Identity on arrays of one shape, computed as ONE multi-output XLA loop.

    Why: XLA:CPU fuses elementwise chains into every consumer, so a step whose outputs share
    intermediates (the Schur complement, the rotation factors, the finiteness flag) is
    recomputed once per output component. A variadic ``reduce``
    over a padded axis of length 2 (``x + (-0.0)``, exact for every value incl. ``-0.0``,
    inf, NaN) is emitted as a single loop with one output per array, sharing every
    intermediate. ``optimization_barrier`` does not help: XLA:CPU expands it before fusion.

    It is a primitive of its own (``rigidjax_materialize``) whose JVP passes tangents
    straight through (symbolic zeros stay symbolic), so derivatives of every order and mode
    and ``vmap`` see an identity. Why not a ``custom_jvp``: inside ``lax.scan``, reverse
    mode inlines a custom JVP's primal before an outer derivative sees it, and the raw
    ``reduce``'s own JVP rule fails when only some of its operands carry tangents (any
    Hessian of a midpoint rollout did).

    At most :data:`MATERIALIZE_MAX` arrays go into one loop (more are split into several
    loops): LLVM stops vectorising such a loop above 32 outputs (float64, AVX2: it compiles
    to scalar code, several times slower per element).
    """
    shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in xs))
    xs = [jnp.broadcast_to(jnp.asarray(x), shape) for x in xs]
    floats = [x.dtype for x in xs if jnp.issubdtype(x.dtype, jnp.inexact)]
    if len(set(floats)) > 1:  # XLA's variadic reduce takes one float width: a loop per width
        group = [x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else floats[0] for x in xs]
        out = [None] * len(xs)
        for dt in set(floats):
            idx = [i for i, g in enumerate(group) if g == dt]
            for i, y in zip(idx, materialize(*(xs[i] for i in idx))):
                out[i] = y
        return tuple(out)
    if len(xs) > MATERIALIZE_MAX:
        k = -(-len(xs) // -(-len(xs) // MATERIALIZE_MAX))  # equal chunks of <= MATERIALIZE_MAX
        return sum((tuple(_materialize_p.bind(*xs[i : i + k])) for i in range(0, len(xs), k)), ())
    return tuple(_materialize_p.bind(*xs))


def _materialize_loop(*xs):
    """The one-loop identity (a variadic ``reduce`` over a padded axis of length 2)."""
    shape = jnp.shape(xs[0])
    nz = [jnp.full((), -0.0, x.dtype) for x in xs]
    ops = [jnp.stack([x, jnp.broadcast_to(z, shape)], -1) for x, z in zip(xs, nz)]
    return tuple(jax.lax.reduce(ops, nz, lambda a, b: tuple(u + v for u, v in zip(a, b)), (len(shape),)))


def _materialize_batch(args, dims):
    size = next(jnp.shape(a)[d] for a, d in zip(args, dims) if d is not None)
    args = [
        jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size, *jnp.shape(a)))
        for a, d in zip(args, dims)
    ]
    return _materialize_p.bind(*args), [0] * len(args)


def _materialize_jvp(primals, tangents):
    return _materialize_p.bind(*primals), list(tangents)


_materialize_p = jax.extend.core.Primitive("rigidjax_materialize")
_materialize_p.multiple_results = True
_materialize_p.def_impl(lambda *xs: jax.jit(_materialize_loop)(*xs))
_materialize_p.def_abstract_eval(lambda *avals: list(avals))
jax.interpreters.mlir.register_lowering(
    _materialize_p, jax.interpreters.mlir.lower_fun(_materialize_loop, multiple_results=True)
)
jax.interpreters.batching.primitive_batchers[_materialize_p] = _materialize_batch
jax.interpreters.ad.primitive_jvps[_materialize_p] = _materialize_jvp
jax.interpreters.ad.primitive_transposes[_materialize_p] = lambda cts, *xs: list(cts)  # the identity


def zeros_like_batch(tree, shape=(), dtype=jnp.int32) -> jax.Array:
    """Exact zeros of ``shape`` and ``dtype`` computed from the array leaves of ``tree``, so
    that under ``vmap`` they carry the batch axis of any batched leaf (``jnp.zeros`` would not).

    Why: a loop carry that starts unbatched and turns batched in the body makes JAX's ``scan``
    and ``while_loop`` batching rules trace the body again per round of their fixpoint, and
    nested loops multiply the rounds. Starting the status carries of a rollout from these
    zeros keeps every loop at its fewest traces: the layer's gyroscope program (a scan over
    samples, a loop over sub-steps, under three ``vmap`` s) traces in 1.3 s instead of 1.8 s.
    No derivative flows through them."""
    z = jnp.zeros(shape, dtype)
    for leaf in jax.tree_util.tree_leaves(tree):
        if hasattr(leaf, "dtype") and jnp.size(leaf):
            first = jax.lax.stop_gradient(jnp.ravel(leaf)[0])
            z = z + jnp.where(first == first, 0, 0).astype(dtype)
    return z


def full_precision(fn):
    """``fn`` traced with every matrix product (``dot_general``: ``@``, ``einsum``, ``dot``) at
    full precision, ``jax.default_matmul_precision("highest")`` for the call alone (no global
    flag; a matmul that names its own ``precision`` keeps it).

    Why: on GPUs whose default float32 matmul rounds its inputs to TF32 (NVIDIA Ampere and
    later), the 3x3 / 4x4 products of the Euler-parameter and variational code (the G matrices,
    a Lagrangian's ``w @ I @ w``, a user's own Lagrangian too) lose about three digits: on one
    H200 (jax 0.11.2) ``ep.initial_state`` put a float32 body rate 4.9e-4 rad/s off at |omega| =
    2 rad/s, where full precision gives 6e-8, the round-off of float32. The products are too
    small for reduced precision to save time. Applied to the public entry points that trace
    the physics (steps, rollouts, state conversions, outputs); the precision is read when a
    function is traced, so it holds under a caller's ``jit``, ``vmap`` and derivatives."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.default_matmul_precision("highest"):
            return fn(*args, **kwargs)

    return wrapped


def derivative_only(x):
    """Zero with the derivative of ``x``: ``x - stop_gradient(x)`` whose value is an exact
    zero XLA knows of, so everything that only feeds it is dead code until it is
    differentiated (see :func:`rigidjax.newton.custom_root`). Same shape, dtype and pytree as ``x``."""
    return jax.tree_util.tree_map(_derivative_only_p.bind, x)


_derivative_only_p = jax.extend.core.Primitive("rigidjax_derivative_only")
_derivative_only_p.def_impl(jnp.zeros_like)
_derivative_only_p.def_abstract_eval(lambda aval: aval)
jax.interpreters.mlir.register_lowering(
    _derivative_only_p, jax.interpreters.mlir.lower_fun(jnp.zeros_like, multiple_results=False)
)
jax.interpreters.batching.primitive_batchers[_derivative_only_p] = lambda a, d: (_derivative_only_p.bind(a[0]), d[0])
jax.interpreters.ad.primitive_jvps[_derivative_only_p] = lambda p, t: (_derivative_only_p.bind(p[0]), t[0])
# as a linear map its value is the zero map, whose transpose is zero
jax.interpreters.ad.primitive_transposes[_derivative_only_p] = lambda ct, x: [jax.interpreters.ad.Zero(x.aval)]


def materialize_chunks(*xs, size: int):
    """:func:`materialize` in loops of at most ``size`` arrays each.

    For wide outputs computed from many inputs (e.g. every entry of a Newton matrix): such
    loops stay vectorised only when small (the Euler-parameter Newton matrix, 90 entries
    each reading ~60 arrays, runs fastest at 8 per loop; LLVM leaves 32 per loop scalar), at
    the price of recomputing shared intermediates once per loop.
    """
    return sum((materialize(*xs[i : i + size]) for i in range(0, len(xs), size)), ())


def static_zero(a) -> bool:
    """True for a structural zero: a Python number equal to 0 (an entry known to vanish when
    the program is traced, not an array). :func:`partial_jvp` returns such entries and
    :func:`rigidjax.linalg.solve_components` skips the work they make vanish."""
    return isinstance(a, (int, float)) and not isinstance(a, bool) and a == 0


def sum_nonzero(products):
    """Sum of ``a * b`` over the ``(a, b)`` pairs with no structural zero; ``0.0`` if none
    (left to right, as ``a0 * b0 + a1 * b1 + ...``)."""
    terms = [a * b for a, b in products if not (static_zero(a) or static_zero(b))]
    return functools.reduce(operator.add, terms) if terms else 0.0


def zadd(*xs):
    """Sum of the terms that are not structural zeros (left to right); ``0.0`` if none."""
    terms = [x for x in xs if not static_zero(x)]
    return functools.reduce(operator.add, terms) if terms else 0.0


def zmul(a, b):
    """``a * b``, a structural zero if either factor is one."""
    return 0.0 if static_zero(a) or static_zero(b) else a * b


def zneg(a):
    """``-a``, a structural zero kept as such."""
    return 0.0 if static_zero(a) else -a


def zero_pattern(*arrays) -> tuple | None:
    """Per-entry flags "known to be 0" of ``(array, k)`` pairs, ``k`` the number of trailing
    entry axes (leading axes are a batch), as a hashable tuple (one flat tuple of bools per
    array, row-major): a static argument for code that drops the terms those entries
    multiply. ``None`` if any array is traced (nothing is known)."""
    import numpy as np

    if not all(is_concrete(a) for a, _ in arrays):
        return None
    out = []
    for a, k in arrays:
        v = np.asarray(a)
        out.append(tuple(bool(z) for z in np.all(v == 0, axis=tuple(range(v.ndim - k))).ravel()))
    return tuple(out)


def static_zeros(a, batch_axes: int = 1):
    """``a`` with its entries that are known zeros when traced replaced by ``0.0``.

    ``a`` is an array ``(*batch, ...)`` with ``batch_axes`` leading axes (e.g. the bodies):
    the result is a nested list over its trailing axes, each entry the array
    ``a[..., i, j]`` or ``0.0`` where ``a`` is concrete (not a tracer) and that entry is 0
    throughout the batch. A model held fixed in a rollout (e.g. zero resistance, or
    resistance without translation-rotation coupling, diagonal inertia) thus drops the terms
    it multiplies; a traced model (a fit of ``a``) keeps every term."""
    import numpy as np

    trailing = jnp.shape(a)[batch_axes:]
    if is_concrete(a):
        zero = np.all(np.asarray(a) == 0, axis=tuple(range(batch_axes)))
    else:
        zero = np.zeros(trailing, bool)

    def build(idx):
        if len(idx) == len(trailing):
            return 0.0 if zero[idx] else a[(Ellipsis, *idx)]
        return [build((*idx, i)) for i in range(trailing[len(idx)])]

    return build(())


def _depends_on_inputs(f, primals):
    """Which outputs of ``f(*primals)`` depend on its inputs (conservatively: through any
    equation of its jaxpr that reads a dependent variable)."""
    from jax.extend.core import Literal

    jaxpr = jax.make_jaxpr(f)(*primals).jaxpr
    dep = set(jaxpr.invars)
    for eqn in jaxpr.eqns:
        if any(not isinstance(v, Literal) and v in dep for v in eqn.invars):
            dep.update(eqn.outvars)
    return [not isinstance(v, Literal) and v in dep for v in jaxpr.outvars]


def partial_jvp(fn, args, slots, tangents, dtype):
    """Forward derivative of ``fn(*args)`` along a few scalar slots of its arguments only.

    ``args`` is a list whose items are lists of per-coordinate arrays (movable) or single
    arrays (held fixed); ``slots`` lists ``(group, index)`` pairs into the lists and
    ``tangents`` the scalar tangent of each.
    Only the listed entries are JAX primals, so JAX traces no zero tangents for the others:
    how the packed steps build their Newton matrices column by column. An output that does
    not depend on the slots at all is returned as the structural zero ``0.0``
    (:func:`static_zero`; its instantiated zero is left for XLA to drop).
    """

    def f(*vals):
        a = [list(x) if isinstance(x, list) else x for x in args]
        for (grp, idx), v in zip(slots, vals):
            a[grp][idx] = v
        return fn(*a)

    primals = tuple(args[grp][idx] for grp, idx in slots)
    tans = tuple(jnp.broadcast_to(jnp.asarray(t, dtype), jnp.shape(p)) for t, p in zip(tangents, primals))
    out = jax.jvp(f, primals, tans)[1]
    dep = _depends_on_inputs(f, primals)
    return tuple(o if d else 0.0 for o, d in zip(out, dep))


# ----------------------------------------------------------------------------- per-component algebra
# Closed-form small algebra on per-component arrays ("structure of arrays"): a 3-vector is a
# tuple of 3 arrays of the batch shape, a 3x3 matrix a tuple of 3 such row tuples. Every
# operation is elementwise, so XLA fuses and vectorises it over the batch; no LAPACK call.


def comps(a, n):
    """The ``n`` components of ``a (..., n)`` as a tuple of arrays of the batch shape."""
    a = jnp.asarray(a)
    return tuple(a[..., i] for i in range(n))


def block(A, rows, cols):
    """Entries ``A[..., i, j]`` for ``i`` in ``rows``, ``j`` in ``cols``, as a tuple of row tuples."""
    A = jnp.asarray(A)
    return tuple(tuple(A[..., i, j] for j in cols) for i in rows)


# Entries may be structural zeros (``0.0``, :func:`static_zero`: a model held fixed with
# diagonal inertia, no resistance, no gravity); the terms they multiply are not traced.


def mv(A, x):
    """``A x`` for a matrix ``A`` (row tuples) and a vector ``x`` (tuple); zeros skipped."""
    return tuple(sum_nonzero(zip(r, x)) for r in A)


def mm(A, B):
    """``A B`` for two 3x3 matrices in tuple form; zeros skipped."""
    return tuple(tuple(sum_nonzero((r[k], B[k][j]) for k in range(3)) for j in range(3)) for r in A)


def cross(a, b):
    """``a x b`` for two 3-vectors in tuple form."""
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


def inv3(A):
    """Inverse of a 3x3 (tuple form) by cofactors of ``A/s``, ``s`` the mean |diagonal|.

    The scaling keeps ``det`` in range in float32 for any units (e.g. ``I/dt ~ 1e-17`` for a
    milligram body); a singular ``A`` gives inf/NaN, caught by the step's finiteness check.
    """
    if all(static_zero(A[i][j]) for i in range(3) for j in range(3) if i != j):
        return tuple(tuple(1 / A[i][i] if i == j else 0.0 for j in range(3)) for i in range(3))
    s = (jnp.abs(A[0][0]) + jnp.abs(A[1][1]) + jnp.abs(A[2][2])) / 3
    r = 1 / s
    zero = jnp.zeros_like(s)
    (a, b, c), (d, e, f), (g, h, i) = ((zero if static_zero(x) else x * r for x in row) for row in A)
    c00, c01, c02 = e * i - f * h, c * h - b * i, b * f - c * e
    c10, c11, c12 = f * g - d * i, a * i - c * g, c * d - a * f
    c20, c21, c22 = d * h - e * g, b * g - a * h, a * e - b * d
    k = r / (a * c00 + b * c10 + c * c20)
    return ((c00 * k, c01 * k, c02 * k), (c10 * k, c11 * k, c12 * k), (c20 * k, c21 * k, c22 * k))


def stack(cs):
    """The components ``cs`` back as one array ``(..., len(cs))`` (broadcast to one shape)."""
    shape = jnp.broadcast_shapes(*(jnp.shape(c) for c in cs))
    return jnp.stack([jnp.broadcast_to(c, shape) for c in cs], -1)


def inv3_array(A):
    """:func:`inv3` of ``A (..., 3, 3)`` in array form: ``(..., 3, 3)``."""
    rows = inv3(block(A, range(3), range(3)))
    return jnp.stack([stack(r) for r in rows], -2)


def safe_sqrt(sq):
    """``sqrt(sq)`` for ``sq >= 0`` whose derivative at ``sq = 0`` is zero, not inf or NaN (the
    double ``where`` keeps both branches finite): every safe norm in rigidjax is this of a sum of
    squares."""
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1)), 0)


def norm3(c):
    """Safe Euclidean norm (:func:`safe_sqrt`) of a 3-vector in per-component form."""
    return safe_sqrt(c[0] * c[0] + c[1] * c[1] + c[2] * c[2])
