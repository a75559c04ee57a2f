r"""Levenberg-Marquardt for a batch of bound-constrained nonlinear least-squares problems.

Each problem minimises ``f(x) = 1/2 |r(x)|^2`` over a box ``lo <= x <= hi`` (bounds may be
infinite, or equal: a fixed parameter). The caller's ``evaluate(x, rows)`` returns, for a
batch of points, the cost, the Gauss-Newton matrix ``A = J^T J`` and the gradient ``g = J^T r``.

Iteration (projected Levenberg-Marquardt with an active set, after Bertsekas' projected
Newton method and Kanzow, Yamashita & Fukushima, J. Comput. Appl. Math. 172, 2004):

* active set: a variable at a bound whose gradient points out of the box (``x_i = lo_i``,
  ``g_i > 0``, or ``x_i = hi_i``, ``g_i < 0``) is held there for this iteration;
* step on the free variables: ``(A_FF + lambda D_FF) h_F = -g_F`` with Marquardt's scaling
  ``D = diag(A)``, or with ``running_scale`` its largest value over the iterates so far
  (Moré, "The Levenberg-Marquardt algorithm: implementation and theory", 1978; MINPACK's
  ``mode=1``), so that a coordinate whose column shrinks keeps its damping;
  a free variable at a bound whose step ``h_i`` points out of the box is held too and the step
  solved again (clipping it would leave a step the model does not predict),
  trial point ``P(x + h)`` (``P`` the projection onto the box, so a bound is reached
  EXACTLY: a thin plate is ``I_z = I_x + I_y`` to the last bit, not ``s^2 -> 0``);
* acceptance by the ratio of the actual decrease to the Gauss-Newton model's decrease
  along the projected step, Nielsen's damping update;
* where the step and the last accepted one are nearly parallel (the linear convergence of
  Gauss-Newton on a large residual, or a crawl towards a bound), a second trial at the sum of
  the geometric series of steps (Aitken), evaluated in the same call and kept only where it
  ends lower than both the current point and the plain trial (:func:`_extrapolated`);
* with ``groups`` (the starts of one problem), a start stops once it cannot reach the cost
  of a converged start of its problem (:attr:`LMStatus.OUTRUN`, :func:`_outrun`).

Convergence means first-order optimality, checked at every accepted point: the
Gauss-Newton decrement of the projected gradient ``pg`` (the gradient with the components
of active bounds removed),

.. math:: \delta = \tfrac12\, pg_F^T A_{FF}^{+}\, pg_F \,/\, f \le \text{opt\_tol},

the relative cost decrease the local quadratic model still promises (``A^+``: the
pseudo-inverse on the directions the data determine, eigenvalues below ``1e-12`` of the
largest treated as flat). It is scale-free and, unlike a small step or a small decrease,
not fooled by a flat valley: along a nearly flat direction with a gradient, ``delta`` is
large. At a bound, the multiplier (``g_i`` there) has the right sign by construction of the
active set; a wrong-signed one frees the variable and enters ``pg``. ``opt_tol = max(1e-10,
100 eps)`` of the evaluation dtype: on the racquet flips every point that a dense
multi-start confirms as the minimum has ``delta < 3e-14`` (float64).

Why NumPy and not optimistix: the problems are tiny (2 to a few hundred unknowns), many
(hundreds of starts and windows at once) and structured (joint fits are block-sparse, see
:mod:`rigidjax.identify._problems`); the expensive part, ``evaluate``, is one jitted,
vmapped call per iteration for the whole batch, and optimistix' LM has no bounds.
Side by side on the same residuals and starts (``benchmarks/bench_lm.py``, float64, 2-core
VM): both reach the same cost (to 5e-11 relative) on a known-torque body (9 unknowns), four
such segments (18) and a variational pendulum (6); this solver in 6, 8 and 17 iterations,
``optx.LevenbergMarquardt(rtol=atol=1e-10)`` in 30, 33 and 32; warm wall time 0.035, 0.066
and 0.047 s against 0.074, 0.22 and 0.13 s (first calls, compilation included, 2-3 s both;
``tests/test_identify_core.py`` checks the first problem's costs agree).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import functools
import threading

import numpy as np
from threadpoolctl import threadpool_limits

__all__ = ["LMStatus", "solve", "decrement", "opt_tol"]


class LMStatus(enum.IntEnum):
    """Outcome of :func:`solve` per problem."""

    CONVERGED = 0  #: first-order optimality (decrement below ``opt_tol``)
    MAX_STEPS = 1  #: iteration cap reached before optimality
    NONFINITE = 2  #: the start could not be evaluated (NaN/inf)
    STALLED = 3  #: no step lowers the cost any more, yet the point is not first-order optimal
    OUTRUN = 4  #: stopped: a start of the same problem converged lower than this one can reach


def opt_tol(eps: float) -> float:
    """Optimality tolerance for an evaluation with machine epsilon ``eps`` (see module)."""
    return max(1e-10, 100.0 * eps)


def _free(x, g, lo, hi):
    """Free-variable mask: not held at a bound by an outward gradient, not fixed."""
    held = ((x <= lo) & (g > 0)) | ((x >= hi) & (g < 0)) | (lo == hi)
    return ~held


_BLAS_LOCK = threading.Lock()
_BLAS_USERS = 0
_BLAS_LIMITS = None


def one_blas_thread(fit):
    """``fit`` with NumPy's BLAS and LAPACK on one thread while it runs (``threadpoolctl``;
    the caller's setting restored afterwards: after the last of concurrent fits in other
    threads, which share the process's BLAS): the fits' host linear algebra is many small and
    mid-sized products, solves and eigendecompositions (a few to a few hundred unknowns)
    between compiled calls, and a multithreaded OpenBLAS beside XLA's own thread pool spends
    its time waiting. Measured on the 2-core VM (OpenBLAS 0.3.31, a helper process busy beside
    it): a 188 x 188 ``eigh`` 98 ms with two threads, 3.7 ms with one; a joint fit of 62
    racquet windows through the layer (188 unknowns) 6.6 -> 0.5 s warm,
    ``fit_inertia(joint=True)`` 6.9 -> 3.1 s."""

    @functools.wraps(fit)
    def wrapped(*args, **kwargs):
        global _BLAS_USERS, _BLAS_LIMITS
        with _BLAS_LOCK:
            if _BLAS_USERS == 0:
                _BLAS_LIMITS = threadpool_limits(limits=1, user_api="blas")
            _BLAS_USERS += 1
        try:
            return fit(*args, **kwargs)
        finally:
            with _BLAS_LOCK:
                _BLAS_USERS -= 1
                if _BLAS_USERS == 0:
                    _BLAS_LIMITS.restore_original_limits()
                    _BLAS_LIMITS = None

    return wrapped


def decrement(A, g, cost, x, lo, hi, cost_floor):
    """Relative Gauss-Newton decrement ``(na,)`` of the projected gradient (see module)."""
    F = _free(x, g, lo, hi)
    pg = np.where(F, g, 0.0)
    P = A.shape[-1]
    eye = np.eye(P)
    Af = np.where(F[:, :, None] & F[:, None, :], A, eye)
    d = np.sqrt(np.maximum(np.diagonal(Af, axis1=1, axis2=2), 1e-300))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        An = Af / d[:, :, None] / d[:, None, :]
        w, V = np.linalg.eigh(np.nan_to_num(An, nan=0.0, posinf=0.0, neginf=0.0))
        z = np.einsum("aji,aj->ai", V, pg / d)
        wmax = np.maximum(w.max(axis=1, keepdims=True), 1e-300)
        dec = 0.5 * np.sum(z * z / np.maximum(w, 1e-12 * wmax), axis=1)
    out = dec / np.maximum(cost, cost_floor)
    return np.where(np.isfinite(out), out, np.inf)


#: Extrapolated trial (see :func:`_extrapolated`): least cosine between the step and the last
#: accepted one, and the largest factor.
EXTRAPOLATE_COS, EXTRAPOLATE_MAX = 0.995, 10.0


def _extrapolated(x, d, last, scale, lo, hi, tried):
    """An extrapolated trial beside the plain one, ``(xe (na, P), ext (na,) bool)``.

    Where the projected step ``d`` and the last accepted step are nearly parallel (cosine
    above :data:`EXTRAPOLATE_COS` in Marquardt's scaling) the iteration converges linearly
    along one direction (Gauss-Newton on a large-residual problem, or a crawl towards a
    bound or a valley's end): with ``r = |d| / |last|`` the steps form a geometric series
    whose sum is ``d / (1 - r)`` (Aitken's extrapolation), so the trial is
    ``P(x + d / (1 - r))``, the factor at most :data:`EXTRAPOLATE_MAX` (also where the steps
    grow, ``r >= 1 - 1 / EXTRAPOLATE_MAX``). It is evaluated in the same call as the plain
    trial and kept only where its cost is below both the current point's and the plain
    trial's, so the iteration stays monotone and converges to the same kind of point (the
    decrement test is unchanged). Where the steps shrink faster (``r`` below 1/3: factor under
    1.5) there is no second trial. Measured: a large-residual test problem whose Gauss-Newton
    rates are 0.9 and 0.3 (``tests/test_identify_core.py``) converges in 18 iterations instead
    of 60; on the 69 shared racquet flips (``fit_inertia`` per window) a round-1 window that
    ends at a chart bound with a residual hundreds of times its noise (its decrement falling by a
    constant 0.69 per iteration) in 29 instead of 53; the other windows' results the same to
    round-off with the default model, within the stopping tolerance with the full tensor, drag
    and bias (up to 7e-6 relative, 6e-6 standard errors)."""
    w = np.sqrt(scale)
    dn, ln = d * w, last * w
    nd, nl = np.linalg.norm(dn, axis=1), np.linalg.norm(ln, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.einsum("ai,ai->a", dn, ln) / (nd * nl)
        r = nd / nl
        f = np.where(r < 1 - 1 / EXTRAPOLATE_MAX, 1 / (1 - r), EXTRAPOLATE_MAX)
    ext = tried & (nl > 0) & (cos > EXTRAPOLATE_COS) & (f >= 1.5)
    f = np.where(ext, f, 1.0)
    xe = np.clip(x + f[:, None] * d, lo, hi)
    return xe, ext & np.any(xe != x + d, axis=1)


#: A start stops once its cost, less this many times the decrease its Gauss-Newton model
#: still promises, is above a converged start of its own problem (:func:`_outrun`).
OUTRUN_FACTOR = 100.0


def _outrun(st: dict, a: np.ndarray) -> np.ndarray:
    """The rows among ``a`` (still iterating) that stop as :attr:`LMStatus.OUTRUN`: their cost
    ``f`` less :data:`OUTRUN_FACTOR` times the decrease the local model promises (``delta f``,
    the decrement of the module) is above the lowest converged cost of their group.

    Such a start can end at its group's best only by descending a hundred times further than
    its own quadratic model says (a linear crawl with a rate of 0.99 per iteration covers that
    factor); it cannot change which point is best, nor be among the starts at the best. On the
    racquet flips the refit of a round-1 window (20 starts): one start converges at cost
    3.8e5 while three others crawl for ~40 more iterations towards a chart bound at 1.4e7.
    They stop; the best point is unchanged."""
    g = st["groups"]
    conv = st["status"] == LMStatus.CONVERGED
    if a.size == 0 or not conv.any():
        return a[:0]
    best = np.full(int(g.max()) + 1, np.inf)
    np.minimum.at(best, g[conv], st["cost"][conv])
    with np.errstate(invalid="ignore", over="ignore"):
        reach = st["cost"][a] * (1.0 - OUTRUN_FACTOR * st["opt"][a])
    return a[reach > best[g[a]]]


def _solve_batch(M, rhs):
    try:
        return np.linalg.solve(M, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        out = np.empty_like(rhs)
        for i in range(M.shape[0]):
            out[i] = np.linalg.lstsq(M[i], rhs[i], rcond=None)[0]
        return out


def solve(
    evaluate: Callable,
    x0: np.ndarray,
    rows: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    *,
    eps: float,
    max_steps: int,
    state: dict | None = None,
    progress: Callable | None = None,
    running_scale: bool = False,
    groups: np.ndarray | None = None,
) -> dict:
    """Run the bounded Levenberg-Marquardt iteration on a batch of problems.

    Args:
        evaluate: ``evaluate(x (na, P), rows (na,)) -> (cost (na,), A (na, P, P), g (na, P),
            ok (na,), aux)``: ``aux`` an array with leading axis ``na`` (kept for the caller).
        x0: ``(nb, P)`` starting points (projected onto the box first).
        rows: ``(nb,)`` the problem of each start (passed to ``evaluate``).
        lo, hi: ``(nb, P)`` bounds (``-inf``/``inf`` for none; equal for a fixed value).
        eps: machine epsilon of the evaluation (sets :func:`opt_tol`).
        max_steps: iterations in this call.
        state: a previous call's result to continue from (``x0`` is then ignored).
        progress: optional ``progress(n_active)`` after every iteration.
        running_scale: damp with the largest ``diag(A)`` seen so far (see module) instead of
            the current one. :func:`rigidjax.identify.fit` uses it: a ``Positive`` value's
            column shrinks with the value (``exp(u)``), and with the current diagonal one
            undamped step could send it 10 orders of magnitude down, where its gradient
            vanishes (a fitted drag, started at the truth, ended ``stalled`` at 2e-14 with
            4 % more cost; with the running scale: ``converged`` in 9 iterations; the 69
            racquet windows through ``fit_many``: the same statuses, 490 iterations instead of
            530). :func:`rigidjax.identify.fit_inertia` keeps the current diagonal: its
            chart's columns shrink only on the way to a degenerate, rod-like minimum, which
            it names (with the running scale that descent stops short of the rod).
        groups: ``(nb,)`` non-negative integers, the starts of one problem sharing a value
            (``None``: every start alone): a start stops as :attr:`LMStatus.OUTRUN` once it
            cannot reach a converged start of its group (see :func:`_outrun`). Read with a
            new start; a continued ``state`` keeps the groups it was started with.

    Returns:
        The state: ``x, cost, A, g, aux, ok, lam, nu, it`` (iterations, all calls),
        ``status`` (:class:`LMStatus` codes), ``opt`` (the decrement at ``x``), ``lo``,
        ``hi``, ``rows``, ``floor``.
    """
    tol = opt_tol(eps)
    if state is None:
        x = np.clip(np.asarray(x0, float), lo, hi)
        cost, A, g, ok, aux = evaluate(x, rows)
        floor = np.maximum(eps * np.abs(cost), 1e-300)
        state = dict(
            x=x,
            cost=cost,
            A=A,
            g=g,
            aux=aux,
            ok=ok,
            rows=np.asarray(rows),
            lo=np.array(lo, float),
            hi=np.array(hi, float),
            floor=floor,
            lam=np.full(x.shape[0], 1e-3),
            nu=np.full(x.shape[0], 2.0),
            it=np.zeros(x.shape[0], int),
            status=np.where(ok, int(LMStatus.MAX_STEPS), int(LMStatus.NONFINITE)),
            opt=np.where(ok, decrement(A, g, cost, x, lo, hi, floor), np.inf),
            dscale=np.diagonal(A, axis1=1, axis2=2).copy(),
            last=np.zeros_like(x),
            groups=None if groups is None else np.asarray(groups, int),
        )
        conv = ok & (state["opt"] <= tol)
        state["status"] = np.where(conv, int(LMStatus.CONVERGED), state["status"])
    st = state
    active = st["ok"] & (st["status"] != LMStatus.CONVERGED) & (st["status"] != LMStatus.OUTRUN)
    steps = np.zeros(st["x"].shape[0], int)
    P = st["x"].shape[1]
    eye = np.eye(P)
    while active.any():
        a = np.flatnonzero(active)
        x, cost, A, g, lam, nu, lo, hi = (st[k][a] for k in ("x", "cost", "A", "g", "lam", "nu", "lo", "hi"))
        F = _free(x, g, lo, hi)
        dA = np.diagonal(A, axis1=1, axis2=2)
        if running_scale:
            dA = np.maximum(dA, st["dscale"][a])
            st["dscale"][a] = dA
        scale = np.maximum(dA, 1e-12 * np.maximum(dA.max(1, keepdims=True), 1e-300))
        M_all = A + lam[:, None, None] * (scale[:, :, None] * eye)
        for _ in range(P):
            M = np.where(F[:, :, None] & F[:, None, :], M_all, eye * scale[:, :, None])
            h = _solve_batch(M, np.where(F, -g, 0.0))
            # a variable freed by its gradient whose step still points out of the box (the
            # coupling to the others outweighs it) is held too, and the step solved again:
            # clipping it instead leaves a projected step the model does not predict, and
            # near a bound the damping then climbs and falls for dozens of iterations
            out = F & (((x >= hi) & (h > 0)) | ((x <= lo) & (h < 0)))
            if not out.any():
                break
            F = F & ~out
        finite = np.all(np.isfinite(h), axis=1)
        h = np.where(finite[:, None], h, 0.0)
        xt = np.clip(x + h, lo, hi)
        d = xt - x
        pred = -(np.einsum("ai,ai->a", g, d) + 0.5 * np.einsum("ai,aij,aj->a", d, A, d))
        try_ = finite & (pred > 0) & np.any(d != 0, axis=1)
        xe, ext = _extrapolated(x, d, st["last"][a], scale, lo, hi, try_)
        accept = np.zeros(a.size, bool)
        rho = np.zeros(a.size)
        if try_.any():
            t, e = np.flatnonzero(try_), np.flatnonzero(ext)
            cost_t, A_t, g_t, ok_t, aux_t = evaluate(
                np.concatenate([xt[t], xe[e]]), st["rows"][a[np.concatenate([t, e])]]
            )
            actual = cost[t] - cost_t[: t.size]
            acc = ok_t[: t.size] & (actual > 0)
            accept[t] = acc
            rho[t] = np.where(acc, actual / pred[t], 0.0)
            # the point kept: the extrapolated trial where it ends below both the current
            # point and the plain trial, else the plain trial where accepted
            pick = np.full(a.size, -1)
            pick[t[acc]] = np.flatnonzero(acc)
            best = cost.copy()
            best[t[acc]] = cost_t[: t.size][acc]
            lower = ok_t[t.size :] & (cost_t[t.size :] < best[e])
            pick[e[lower]] = t.size + np.flatnonzero(lower)
            accept[e[lower]] = True
            keep = np.flatnonzero(pick >= 0)
            ia, src = a[keep], pick[keep]
            xnew = np.concatenate([xt[t], xe[e]])[src]
            st["last"][a] = 0.0
            st["last"][ia] = xnew - x[keep]
            st["x"][ia], st["cost"][ia], st["A"][ia], st["g"][ia] = xnew, cost_t[src], A_t[src], g_t[src]
            st["aux"][ia] = aux_t[src]
        else:
            st["last"][a] = 0.0
        lam = np.where(accept, lam * np.maximum(1 / 3, 1 - (2 * rho - 1) ** 3), lam * nu)
        nu = np.where(accept, 2.0, 2.0 * nu)
        st["lam"][a], st["nu"][a] = lam, nu
        st["it"][a] += 1
        steps[a] += 1
        if accept.any():
            ia = a[accept]
            st["opt"][ia] = decrement(
                st["A"][ia], st["g"][ia], st["cost"][ia], st["x"][ia], st["lo"][ia], st["hi"][ia], st["floor"][ia]
            )
        conv = st["opt"][a] <= tol
        stalled = ~conv & ((lam > 1e16) | ~np.isfinite(lam))
        st["status"][a] = np.where(
            conv, int(LMStatus.CONVERGED), np.where(stalled, int(LMStatus.STALLED), int(LMStatus.MAX_STEPS))
        )
        active[a] = ~(conv | stalled | (steps[a] >= max_steps))
        if st["groups"] is not None:
            out = _outrun(st, np.flatnonzero(active))
            st["status"][out] = int(LMStatus.OUTRUN)
            active[out] = False
        if progress is not None:
            progress(int(active.sum()))
    return st


def select(state: dict, idx) -> dict:
    """A copy of ``state`` restricted to the problems ``idx``."""
    return {k: (v[idx].copy() if isinstance(v, np.ndarray) and v.ndim >= 1 else v) for k, v in state.items()}
