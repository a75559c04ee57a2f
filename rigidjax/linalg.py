r"""Small dense linear solves without LAPACK: the Newton systems of the implicit steps.

:func:`solve_small` and :func:`solve_small_pivots` solve ``A x = b`` for ``A (..., n, n)``
with ``n`` static and small by Gaussian elimination WITH partial pivoting (LAPACK
``getf2``'s choice: the pivot of column ``k`` is the first entry of largest magnitude on or
below the diagonal), unrolled over the static ``n``. Each elimination stage holds the
active ``(n-k, n-k)`` block as one array; the pivot row is picked by ``argmax`` and selects
on the batch, so a ``vmap``-ed ensemble runs elementwise ops and small reductions only: no
LAPACK custom call, no gather.

Why not LAPACK (``jnp.linalg.solve``, ``jax.scipy.linalg.lu_factor``) on XLA:CPU: a batched
LAPACK custom call splits its batch into tasks on XLA's intra-op thread pool and blocks
until they finish; two such calls in flight at once (independent thunks of one scan body)
can take every pool thread and deadlock at ensemble sizes in the thousands (diagnosed with
gdb on MuJoCo MJX, ``benchmarks/README.md``, "XLA:CPU deadlock"). The Newton loops of the
implicit steps must not depend on how XLA schedules them.

Why not lineax: ``lineax.LU``/``QR``/``Cholesky`` factor through ``jax.scipy.linalg`` /
``jnp.linalg``, i.e. the same LAPACK custom calls, and its LAPACK-free solvers are
iterative (GMRES, BiCGStab, CG: tolerance-driven, no pivot information for a singularity
test), so it does not serve here.

Cost: below :data:`SMALL_MAX` unknowns the unrolled elimination runs about as fast as batched
LAPACK under ``vmap`` and compiles into a few dozen XLA kernels; above it the same ``getf2``/
``getrs`` run as rolled ``fori_loop``s over the columns (masked full-size updates: a few times
LAPACK's time for one large system), again with no custom call. The elimination buys
robustness, not speed: batched LAPACK custom calls inside a vmapped scan can deadlock
XLA:CPU's shared thread pool when the host is split into several devices on a 2-core machine
(``benchmarks/README.md``; ``tests/test_linalg.py``, slow marker). ``method="lapack"`` on every
solve here chooses LAPACK instead; the steppers expose it as their ``linear_solver`` option.

Singularity: as LAPACK, a column with no nonzero pivot candidate is skipped (multipliers 0)
and the zero pivot appears in ``U``; :func:`solve_small_pivots` returns ``|U_ii|`` and
:func:`singular` applies the steppers' test ``min|U_ii| <= n eps max|U_ii|``. A zero pivot
makes ``x`` non-finite (as ``jnp.linalg.solve``): test the pivots where that matters.

Derivatives: :func:`solve_small` has a custom JVP, ``dx = A^{-1} (db - dA x)`` (no
differentiation through the pivot search); the elimination is linear in ``b`` with ``A``
fixed, so reverse mode (transposition) works, e.g. in ``jax.lax.custom_root``'s tangent
solve.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .numerics import full_precision, materialize, static_zero

#: Largest ``n`` solved by the unrolled elimination; larger systems by the rolled one. Chosen by
#: measurement (module docstring): break-even with batched LAPACK near n = 10-12; one
#: Euler-parameter body has 10 unknowns, one variational rigid body 8.
SMALL_MAX = 12
#: The linear-solver choices of every solve here (``method=``): ``"elimination"`` (default;
#: the unrolled elimination up to :data:`SMALL_MAX`, the rolled one above, no custom call) or
#: ``"lapack"`` (XLA's LAPACK ``getrf``/``getrs`` at every size: faster for one large system,
#: but exposed to the batched-call deadlock of the module docstring).
METHODS = ("elimination", "lapack")


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"linear solver method must be one of {METHODS}; got {method!r}")


def _check(A, b, where):
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"{where}: A must have shape (..., n, n); got {A.shape}")
    vector = b.ndim == A.ndim - 1
    if (not vector and b.ndim != A.ndim) or b.ndim < 1 or b.shape[-1 if vector else -2] != A.shape[-1]:
        raise ValueError(f"{where}: b must have shape (..., n) or (..., n, k) for A {A.shape}; got {b.shape}")
    return vector


class _LapackLU(NamedTuple):
    lu: jax.Array
    piv: jax.Array


class _RolledLU(NamedTuple):
    lu: jax.Array
    piv: jax.Array


def _rolled_lu_factor(A):
    """LAPACK ``getf2`` on one ``A (n, n)`` as a ``fori_loop`` over the columns: ``(lu, piv)``
    in ``jax.scipy.linalg.lu_factor``'s format, no custom call (the fallback above
    :data:`SMALL_MAX`: O(n) compiled size, masked full-size updates, ~n^3 flops)."""
    n = A.shape[-1]
    idx = jnp.arange(n)

    def stage(k, carry):
        a, piv = carry
        p = jnp.argmax(jnp.where(idx >= k, jnp.abs(a[:, k]), -1))  # first largest (idamax)
        rk, rp = a[k], a[p]
        a = jnp.where((idx == k)[:, None], rp[None], jnp.where((idx == p)[:, None], rk[None], a))
        below = idx > k
        # an all-zero column: multipliers 0 (LAPACK skips it); the zero pivot stays in U
        l = jnp.where(below, a[:, k] / jnp.where(rp[k] == 0, jnp.ones_like(rp[k]), rp[k]), 0)
        a = jnp.where(below[:, None] & (idx == k)[None, :], l[:, None], a)
        a = jnp.where(below[:, None] & below[None, :], a - l[:, None] * rp[None, :], a)
        return a, piv.at[k].set(p.astype(jnp.int32))

    return jax.lax.fori_loop(0, n, stage, (A, jnp.zeros((n,), jnp.int32)))


def _rolled_lu_solve(lu, piv, B):
    """LAPACK ``getrs`` with :func:`_rolled_lu_factor`'s factors, ``B (n, k)``: rolled loops."""
    n = lu.shape[-1]
    if n == 0:
        return B
    idx = jnp.arange(n)[:, None]

    def permute(k, R):
        rk, rp = R[k], R[piv[k]]
        return jnp.where(idx == k, rp[None], jnp.where(idx == piv[k], rk[None], R))

    def forward(k, R):
        return jnp.where(idx > k, R - lu[:, k][:, None] * R[k][None], R)

    def backward(j, R):
        k = n - 1 - j
        xk = R[k] / lu[k, k]
        R = jnp.where(idx == k, xk[None], R)
        return jnp.where(idx < k, R - lu[:, k][:, None] * xk[None], R)

    R = jax.lax.fori_loop(0, n, permute, B)
    R = jax.lax.fori_loop(0, n, forward, R)
    return jax.lax.fori_loop(0, n, backward, R)


def _lu_factor(A, method="elimination"):
    """One unbatched ``A (n, n)``: the factors of ``P A = L U`` and ``|U_ii| (n,)``.

    Small ``n``: per stage ``k`` the pivot's index in the active block, the multipliers
    (``m - 1``) and the pivot row of ``U`` (``m``); above :data:`SMALL_MAX` the rolled
    ``getf2``; with ``method="lapack"`` LAPACK's ``getrf``."""
    n = A.shape[-1]
    if method == "lapack":
        lu, piv = jax.scipy.linalg.lu_factor(A)
        return _LapackLU(lu, piv), jnp.abs(jnp.diagonal(lu))
    if n > SMALL_MAX:
        lu, piv = _rolled_lu_factor(A)
        return _RolledLU(lu, piv), jnp.abs(jnp.diagonal(lu))
    S = A  # active block (m, m), m = n - k
    stages = []
    for k in range(n):
        m = n - k
        p = jnp.argmax(jnp.abs(S[:, 0]))  # first largest |a_ik| (LAPACK idamax)
        # the pivot row by selects (no gather): materialised once per stage
        prow = S[0]
        for i in range(1, m):
            prow = jnp.where(p == i, S[i], prow)
        if m == 1:
            stages.append((p, jnp.zeros((0,), A.dtype), prow))
            break
        swap = (jnp.arange(m) == p)[:, None]
        S1 = jnp.where(swap, S[0][None], S)[1:]
        piv = prow[0]
        # an all-zero column: multipliers 0 (LAPACK skips it); the zero pivot stays in U
        l = S1[:, 0] / jnp.where(piv == 0, jnp.ones_like(piv), piv)
        S = S1[:, 1:] - l[:, None] * prow[None, 1:]
        stages.append((p, l, prow))
    return tuple(stages), jnp.abs(jnp.stack([u[0] for _, _, u in stages])) if n else jnp.zeros((0,), A.dtype)


def _lu_solve(factors, B):
    """``x (n, k)`` from :func:`_lu_factor`'s factors of one ``A`` and ``B (n, k)``. Linear in ``B``."""
    if isinstance(factors, _LapackLU):
        return jax.scipy.linalg.lu_solve(tuple(factors), B)
    if isinstance(factors, _RolledLU):
        return _rolled_lu_solve(*factors, B)
    stages = factors
    if not stages:
        return B
    R = B
    urows, rrows = [], []
    for p, l, prow in stages:
        m = R.shape[0]
        rrow = R[0]
        for i in range(1, m):
            rrow = jnp.where(p == i, R[i], rrow)
        urows.append(prow)
        rrows.append(rrow)
        if m == 1:
            break
        swap = (jnp.arange(m) == p)[:, None]
        R = jnp.where(swap, R[0][None], R)[1:] - l[:, None] * rrow[None, :]
    return jnp.stack(_back_substitute(urows, rrows))


def _eliminate(A, B, method="elimination"):
    """One unbatched system ``A (n, n)``, ``B (n, k)``: ``(x (n, k), |U_ii| (n,))``. Linear in ``B``."""
    factors, pivots = _lu_factor(A, method)
    return _lu_solve(factors, B), pivots


def _back_substitute(urows, rrows, inverse_pivots=None):
    """``x`` (list of ``n``) from the rows of ``U`` (row ``i`` holds ``U_ii, U_i,i+1, ...``) and
    the eliminated right-hand sides; entries may be arrays or per-entry lists. With
    ``inverse_pivots`` (``1 / U_ii``) it multiplies instead of dividing."""
    n = len(rrows)
    x = [None] * n
    for i in reversed(range(n)):
        s = rrows[i]
        for j in range(i + 1, n):
            u = urows[i][j - i]
            if not (isinstance(u, (int, float)) and u == 0):  # a structural zero
                s = s - u * x[j]
        x[i] = s / urows[i][0] if inverse_pivots is None else s * inverse_pivots[i]
    return x


def _batched(fn, A, B):
    """Apply the unbatched ``fn`` over the (broadcast) leading axes of ``A (..., n, n)``, ``B (..., n, k)``."""
    batch = jnp.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A = jnp.broadcast_to(A, (*batch, *A.shape[-2:]))
    B = jnp.broadcast_to(B, (*batch, *B.shape[-2:]))
    for _ in batch:
        fn = jax.vmap(fn)
    return fn(A, B)


def _prepare(A, b, where):
    A, b = jnp.asarray(A), jnp.asarray(b)
    vector = _check(A, b, where)
    dtype = jnp.result_type(A.dtype, b.dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.result_type(dtype, jnp.float32)
    A, b = A.astype(dtype), b.astype(dtype)
    return A, (b[..., None] if vector else b), vector


def solve_small_pivots(A: jax.Array, b: jax.Array, *, method: str = "elimination") -> tuple[jax.Array, jax.Array]:
    """Solve ``A x = b`` and return the pivot magnitudes: ``(x, |U_ii|)``.

    Args:
        A: ``(..., n, n)``.
        b: ``(..., n)`` (one right-hand side: ``b.ndim == A.ndim - 1``) or ``(..., n, k)``
            (``b.ndim == A.ndim``); batch axes broadcast against ``A``'s.
        method: one of :data:`METHODS` (default ``"elimination"``: no LAPACK call).

    Returns:
        ``x`` (shape of ``b``, batch axes broadcast) and ``(..., n)`` the magnitudes of the
        pivots ``|U_ii|`` of ``P A = L U`` (for :func:`singular`); dtype of ``A`` and ``b``
        promoted. Not differentiated w.r.t. ``A``
        by a rule of its own (use :func:`solve_small` for derivatives); linear in ``b``.

    Raises:
        ValueError: non-square ``A`` or ``b`` of the wrong shape.
    """
    _check_method(method)
    A, B, vector = _prepare(A, b, "solve_small_pivots")
    X, piv = _batched(lambda a, r: _eliminate(a, r, method), A, B)
    return (X[..., 0] if vector else X), piv


class SmallLU(NamedTuple):
    """The factors of ``P A = L U`` from :func:`lu_factor_small` (a pytree; batch axes lead)."""

    factors: tuple

    @property
    def batch(self) -> tuple:
        return _lu_last(self.factors).shape[:-1]


def lu_factor_small(A: jax.Array, *, method: str = "elimination") -> tuple[SmallLU, jax.Array]:
    """Factor ``P A = L U`` once for several solves (e.g. a simplified-Newton update).

    Args:
        A: ``(..., n, n)``, floating point.
        method: one of :data:`METHODS` (default ``"elimination"``: no LAPACK call).

    Returns:
        ``(lu, pivots)``: the factors for :func:`lu_solve_small` and ``(..., n)`` the pivot
        magnitudes ``|U_ii|`` (for :func:`singular`). The same elimination as
        :func:`solve_small_pivots` (equal results). Not
        differentiated by a rule of its own.

    Raises:
        ValueError: non-square ``A``.
    """
    _check_method(method)
    A = jnp.asarray(A)
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f"lu_factor_small: A must have shape (..., n, n); got {A.shape}")
    if not jnp.issubdtype(A.dtype, jnp.inexact):
        A = A.astype(jnp.result_type(A.dtype, jnp.float32))
    fn = functools.partial(_lu_factor, method=method)
    for _ in A.shape[:-2]:
        fn = jax.vmap(fn)
    if A.shape[-1] == 0:
        # no elimination stages: the pivots (…, 0) carry the batch axes
        return SmallLU(_LapackLU(jnp.zeros(A.shape, A.dtype), jnp.zeros(A.shape[:-1], jnp.int32))), jnp.zeros(
            A.shape[:-1], A.dtype
        )
    factors, pivots = fn(A)
    return SmallLU(factors), pivots


def lu_solve_small(lu: SmallLU, b: jax.Array) -> jax.Array:
    """Solve ``A x = b`` with ``lu`` from :func:`lu_factor_small`; ``b`` ``(..., n)`` or
    ``(..., n, k)`` with the factored batch axes. Linear in ``b``.

    Raises:
        ValueError: ``b`` of the wrong shape.
    """
    b = jnp.asarray(b)
    nb = len(lu.batch)
    n = _lu_last(lu.factors).shape[-1]
    vector = b.ndim == nb + 1
    if b.shape[:nb] != tuple(lu.batch) or b.ndim not in (nb + 1, nb + 2) or b.shape[nb] != n:
        raise ValueError(f"lu_solve_small: b must have shape {(*lu.batch, n)} or {(*lu.batch, n, 'k')}; got {b.shape}")
    B = b[..., None] if vector else b
    fn = _lu_solve
    for _ in lu.batch:
        fn = jax.vmap(fn)
    X = fn(lu.factors, B)
    return X[..., 0] if vector else X


def _lu_last(factors):
    """An array of shape ``(..., n)`` among the factors: the batch axes and ``n``."""
    if isinstance(factors, (_LapackLU, _RolledLU)):
        return factors.piv
    return factors[0][2] if factors else jnp.zeros((0,))


def singular(pivots: jax.Array) -> jax.Array:
    """``(...,)`` bool from :func:`solve_small_pivots`' ``(..., n)`` pivot magnitudes.

    A pivot vanishes relative to the largest: ``min|U_ii| <= n eps max|U_ii|`` (``eps`` of
    the dtype); the Newton loops' ``Status.SINGULAR`` test. ``n = 0`` is never singular.
    A NaN pivot is NOT flagged (comparisons with NaN are false): test finiteness apart, as
    the steppers do (``Status.NONFINITE``).
    """
    n = pivots.shape[-1]
    eps = jnp.finfo(pivots.dtype).eps
    return jnp.min(pivots, -1, initial=jnp.inf) <= n * eps * jnp.max(pivots, -1, initial=0.0)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _solve(A, B, method):
    return _batched(lambda a, r: _eliminate(a, r, method), A, B)[0]


@_solve.defjvp
@full_precision  # traced when a caller differentiates an already traced program
def _solve_jvp(method, primals, tangents):
    A, B = primals
    dA, dB = tangents
    X = _solve(A, B, method)
    # dX = A^{-1} (dB - dA X): linear in the tangents (transposable for reverse mode)
    return X, _batched(lambda a, r: _eliminate(a, r, method)[0], A, dB - dA @ X)


def solve_small(A: jax.Array, b: jax.Array, *, method: str = "elimination") -> jax.Array:
    """Solve ``A x = b``: ``A (..., n, n)``, ``b (..., n)`` or ``(..., n, k)`` (as :func:`solve_small_pivots`).

    Gaussian elimination with partial pivoting, no LAPACK call (``method``: one of
    :data:`METHODS`, default ``"elimination"``);
    jit/vmap/grad-safe (custom JVP ``dx = A^{-1}(db - dA x)``); dtype of ``A`` and ``b``
    promoted. A singular ``A`` gives a non-finite ``x``: use :func:`solve_small_pivots` and
    :func:`singular` where that must be detected.

    Raises:
        ValueError: non-square ``A`` or ``b`` of the wrong shape.
    """
    _check_method(method)
    A, B, vector = _prepare(A, b, "solve_small")
    batch = jnp.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A = jnp.broadcast_to(A, (*batch, *A.shape[-2:]))
    B = jnp.broadcast_to(B, (*batch, *B.shape[-2:]))
    X = _solve(A, B, method)
    return X[..., 0] if vector else X


class ComponentsLU(eqx.Module):
    """The factors of ``P A = L U`` from :func:`solve_components` (``factors=True``), entry by
    entry: per stage ``k`` the pivot's index in the active block, the ``n - k - 1``
    multipliers, the pivot row of ``U`` and the reciprocal pivot; ``selects`` (static): per
    stage the rows of the active block besides the first that may hold the pivot. Entries
    may be structural zeros (``0.0``, :func:`rigidjax.numerics.static_zero`)."""

    pivot_index: tuple
    multipliers: tuple
    urows: tuple
    inverse_pivots: tuple
    selects: tuple = eqx.field(static=True, default=())


def _candidates(n: int, k: int, leading: int) -> int:
    """Rows of the active block (stage ``k``) that may hold the pivot: those of the leading
    block while it is being eliminated, else all ``n - k``."""
    return leading - k if k < leading else n - k


def solve_components(A, b, *, materialize_b: bool = False, factors: bool = False, leading: int = 0):
    """:func:`solve_small_pivots` on a matrix given entry by entry (structure of arrays).

    Args:
        A: a sequence of ``n`` rows, each a sequence of ``n`` arrays ``A[i][j]`` of one common
            (broadcastable) shape, e.g. ``(N,)`` over an ensemble, or scalars inside ``jax.vmap``.
        b: a sequence of ``n`` arrays of that shape.

    Returns:
        ``(x, pivots)``, two tuples of ``n`` arrays: the solution of ``A x = b`` and the pivot
        magnitudes ``|U_ii|`` of ``P A = L U`` (``jnp.stack(pivots, -1)`` feeds :func:`singular`);
        dtype of the entries promoted. The elimination is unrolled (O(n^3) traced operations,
        no LAPACK fallback): for small ``n``.

    The same elimination as :func:`solve_small_pivots` (partial pivoting with LAPACK's pivot
    choice, the same operations in the same order: equal results to round-off) on separate
    arrays per entry: every operation is elementwise over the batch, so an ensemble runs
    contiguous loops that XLA:CPU fuses and vectorises, instead of slices and selects on the
    inner axes of ``(N, n, n)`` arrays. Each elimination stage of ``A`` is materialised
    (:func:`rigidjax.numerics.materialize`) so later stages do not recompute it (the right-hand
    side is not: the solve stays linear, hence transposable, in ``b``). The pivot row is
    chosen by selects (no gather); a NaN entry is chosen as pivot as ``argmax`` would. Linear
    in ``b``; not differentiated w.r.t. ``A`` by a rule of its own.

    ``materialize_b=True`` materialises the right-hand side with each stage too (faster: the
    back substitution then reads stored stages instead of recomputing the whole elimination of
    ``b``), for a solve that is never transposed (e.g. a Newton increment; not in
    ``custom_root``'s tangent solve, which reverse mode transposes).

    ``factors=True`` also returns the factors (a :class:`ComponentsLU`, multipliers
    materialised with their stage) as a third output, for further right-hand sides with
    :func:`lu_solve_components` (e.g. a simplified-Newton update).

    Structural zeros: an entry of ``A`` given as the Python number ``0.0`` (not an array; see
    :func:`rigidjax.numerics.static_zero`) is known to vanish when traced. The elimination
    carries such zeros through its stages and skips what they make trivial: a zero below the
    pivot is never a pivot candidate and needs no multiplier, a zero in the pivot row leaves
    its column untouched, and entries a stage does not change are not stored again. A block
    diagonal matrix thus costs its blocks' eliminations. The pivots chosen are LAPACK's (a
    structural zero is never strictly the largest candidate).

    ``leading = k > 0`` restricts the pivot search of the first ``k`` stages to the leading
    ``k x k`` block: block elimination, i.e. the leading block factored with partial pivoting
    and the rest eliminated through its Schur complement ``A22 - A21 A11^{-1} A12``, which
    is then factored with partial pivoting. For a leading block known to be well conditioned
    (a mass block ``m I``, plus damping): the same flops, but stage ``j < k`` chooses among
    ``k - j`` rows instead of ``n - j``, which saves most of the row selects (a dense 9 x 9
    system, N = 4096: ``leading=3`` factors and solves twice in ~20 % less time, measured).
    The pivots (and ``U``) then differ from LAPACK's; the solution agrees to round-off while
    ``A11`` is well conditioned (a singular ``A11`` shows as a zero pivot).

    Raises:
        ValueError: ``A`` not ``n`` rows of ``n`` entries, ``b`` not of length ``n``, or
            ``leading`` not in ``[0, n]``.
    """

    n = len(A)
    if any(len(row) != n for row in A) or len(b) != n:
        raise ValueError(
            f"solve_components: A must be n rows of n entries and b of length n; got rows of "
            f"lengths {[len(r) for r in A]} and b of length {len(b)}"
        )
    if not 0 <= leading <= n:
        raise ValueError(f"solve_components: leading must be in [0, {n}]; got {leading}")
    if n == 0:
        return ((), (), ComponentsLU((), (), (), ())) if factors else ((), ())
    nz = [a for row in A for a in row if not static_zero(a)]
    dtype = jnp.result_type(*nz, *b)
    if not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.result_type(dtype, jnp.float32)
    shape = jnp.broadcast_shapes(*(jnp.shape(a) for a in (*nz, *b)))
    full = lambda a: jnp.zeros(shape, dtype) if static_zero(a) else a  # noqa: E731
    S = [[a if static_zero(a) else jnp.asarray(a, dtype) for a in row] for row in A]  # active block
    R = [jnp.asarray(v, dtype) for v in b]
    urows, rrows, invs, pidx, mults, selects = [], [], [], [], [], []
    for k in range(n):
        m = n - k
        # rows that may hold the pivot: not a structural zero (never strictly the largest)
        cand = tuple(i for i in range(1, _candidates(n, k, leading)) if not static_zero(S[i][0]))
        # first entry of largest magnitude (LAPACK idamax; argmax's NaN rule)
        p = 0
        if cand:
            p = jnp.zeros(shape, dtype)
            best = jnp.abs(full(S[0][0]))
            for i in cand:
                a = jnp.abs(S[i][0])
                better = (a > best) | (jnp.isnan(a) & ~jnp.isnan(best))
                p = jnp.where(better, jnp.asarray(i, dtype), p)
                best = jnp.where(better, a, best)
        prow, rrow = list(S[0]), R[0]
        for i in cand:
            sel = p == i
            prow = [_select(sel, s, t) for s, t in zip(S[i], prow)]
            rrow = jnp.where(sel, R[i], rrow)
        prow[0] = full(prow[0])
        # the reciprocal pivot, stored with the pivot row: the multipliers and the back
        # substitution multiply by it (a division XLA would not duplicate into the stage loops
        # compiles to one extra small loop per row); an all-zero column: multipliers 0, as LAPACK
        inv = 1 / jnp.where(prow[0] == 0, jnp.ones_like(prow[0]), prow[0])
        # by default only what depends on A is materialised: the solve stays linear
        # (transposable) in b; entries this stage leaves unchanged are not copied
        moved = [j for j in range(m) if cand and not static_zero(prow[j])]
        head = ([p] if cand else []) + [inv] + ([rrow] if materialize_b else [])
        flat = materialize(*head, *(prow[j] for j in moved))
        head, flat = flat[: len(head)], flat[len(head) :]
        if cand:
            p, *head = head
        inv = head[0]
        if materialize_b:
            rrow = head[1]
        for j, v in zip(moved, flat):
            prow[j] = v
        urows.append(list(prow))
        rrows.append(rrow)
        invs.append(inv)
        pidx.append(p)
        selects.append(cand)
        if m == 1:
            mults.append(())
            break
        S_new, R_new, ls, new = [], [], [], []
        for i in range(1, m):
            if i in cand:
                sel = p == i  # row i moves to the pivot's place, row 0 to row i's
                row = [_select(sel, s0, s) for s0, s in zip(S[0], S[i])]
                r = jnp.where(sel, R[0], R[i])
            else:  # never the pivot row
                row, r = S[i], R[i]
            l = 0.0 if static_zero(row[0]) else row[0] * inv
            ls.append(l)
            out = []
            for j in range(1, m):
                if static_zero(l) or static_zero(prow[j]):
                    out.append(row[j])
                    if i in cand and not static_zero(row[j]):
                        new.append((i - 1, j - 1))
                else:
                    out.append(full(row[j]) - l * prow[j])
                    new.append((i - 1, j - 1))
            S_new.append(out)
            R_new.append(r if static_zero(l) else r - l * rrow)
        lnew = [i for i, l in enumerate(ls) if not static_zero(l)] if factors else []
        rnew = [i for i in range(m - 1) if i + 1 in cand or not static_zero(ls[i])] if materialize_b else []
        out = [*(S_new[i][j] for i, j in new), *(ls[i] for i in lnew), *(R_new[i] for i in rnew)]
        flat = materialize(*out) if out else ()
        for (i, j), v in zip(new, flat):
            S_new[i][j] = v
        flat = flat[len(new) :]
        for i, v in zip(lnew, flat):
            ls[i] = v
        for i, v in zip(rnew, flat[len(lnew) :]):
            R_new[i] = v
        mults.append(tuple(ls))
        S, R = S_new, R_new
    # a zero pivot divides (inf/NaN, as the array form), the reciprocal of 1 would hide it
    invs = [jnp.where(u[0] == 0, 1 / u[0], v) for u, v in zip(urows, invs)]
    x = _back_substitute(urows, rrows, invs)
    pivots = tuple(jnp.abs(u[0]) for u in urows)
    if factors:
        lu = ComponentsLU(tuple(pidx), tuple(mults), tuple(tuple(u) for u in urows), tuple(invs), tuple(selects))
        return tuple(x), pivots, lu
    return tuple(x), pivots


def _select(sel, a, b):
    """``where(sel, a, b)`` for entries that may be structural zeros."""

    if static_zero(a) and static_zero(b):
        return 0.0
    if static_zero(a):
        a = jnp.zeros_like(b)
    elif static_zero(b):
        b = jnp.zeros_like(a)
    return jnp.where(sel, a, b)


def lu_solve_components(lu: ComponentsLU, b):
    """Solve ``A x = b`` entry by entry with the factors of :func:`solve_components`
    (``factors=True``): the same operations as its elimination of ``b``, in the same order.

    Args:
        lu: :class:`ComponentsLU` of an ``n x n`` matrix.
        b: a sequence of ``n`` arrays (shapes broadcastable with the factors').

    Returns:
        ``x``, a tuple of ``n`` arrays. Linear in ``b``. Nothing is materialised: a caller
        that reads ``x`` in several places materialises it once.

    Raises:
        ValueError: ``b`` not of length ``n``.
    """
    n = len(lu.urows)
    if len(b) != n:
        raise ValueError(f"lu_solve_components: b must have length {n}; got {len(b)}")

    R = list(b)
    rrows = []
    for p, ls, cand in zip(lu.pivot_index, lu.multipliers, lu.selects):
        m = len(R)
        rrow = R[0]
        for i in cand:
            rrow = jnp.where(p == i, R[i], rrow)
        rrows.append(rrow)
        R = [jnp.where(p == i, R[0], R[i]) if i in cand else R[i] for i in range(1, m)]
        R = [r if static_zero(l) else r - l * rrow for r, l in zip(R, ls)]
    return tuple(_back_substitute(lu.urows, rrows, lu.inverse_pivots))
