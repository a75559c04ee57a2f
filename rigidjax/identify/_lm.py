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
  along the projected step, Nielsen's damping update.

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
such segments (18) and a variational pendulum (6); this solver in 6, 8 and 16 iterations,
``optx.LevenbergMarquardt(rtol=atol=1e-10)`` in 31, 32 and 35; warm wall time 0.10, 0.25 and
0.13 s against 0.27, 0.82 and 0.14 s (first calls, compilation included, 4-6 s both).
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
        )
        conv = ok & (state["opt"] <= tol)
        state["status"] = np.where(conv, int(LMStatus.CONVERGED), state["status"])
    st = state
    active = st["ok"] & (st["status"] != LMStatus.CONVERGED)
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
        accept = np.zeros(a.size, bool)
        rho = np.zeros(a.size)
        if try_.any():
            t = np.flatnonzero(try_)
            cost_t, A_t, g_t, ok_t, aux_t = evaluate(xt[t], st["rows"][a[t]])
            actual = cost[t] - cost_t
            acc = ok_t & (actual > 0)
            accept[t] = acc
            rho[t] = np.where(acc, actual / pred[t], 0.0)
            ia = a[t[acc]]
            st["x"][ia], st["cost"][ia], st["A"][ia], st["g"][ia] = xt[t[acc]], cost_t[acc], A_t[acc], g_t[acc]
            st["aux"][ia] = aux_t[acc]
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
        if progress is not None:
            progress(int(active.sum()))
    return st


def select(state: dict, idx) -> dict:
    """A copy of ``state`` restricted to the problems ``idx``."""
    return {k: (v[idx].copy() if isinstance(v, np.ndarray) and v.ndim >= 1 else v) for k, v in state.items()}
