"""A batch of inertia least-squares problems sharing one layout, evaluated in one compiled call:
the search of :func:`rigidjax.identify.multistart_check` (an :class:`~rigidjax.identify.InertiaFit`'s
windows refitted from many starts by a fitter independent of the identification layer the fit
itself ran on: its own chart, evaluator and Levenberg-Marquardt).

Problem ``a`` fits the windows ``seg_ids[a]`` (indices into the padded data) with the unknowns
``x = [shared (n_sh) | bias per group (3 each) | omega0 per window (3 each)]``; the shared
part is the optimiser's chart (bounded, :func:`rigidjax.identify._model.chart_theta`).

Every (problem, window) pair is one lane of :func:`rigidjax.identify._model.evaluator`
(``J^T J``, ``J^T r`` and the RSS in model values, at most 15 forward-mode tangents); the
shared coordinates enter by the chain rule and the blocks are scattered into dense normal
equations (NumPy: a joint fit of a few hundred unknowns is a millisecond solve). A dense
solver that materialised ``J`` would push ``3 S + n_sh`` tangents through every window.
"""

from __future__ import annotations

import numpy as np

from ._model import Spec, chart_theta, evaluator, lane_chunks, lanes


class Batch:
    """See module. ``data = (omega (Ns, N, 3), weight (Ns, N), dt (Ns, N-1))`` (evaluation
    dtype), ``k (Ns,)`` sub-steps per window, ``seg_ids (nb, S)``, ``groups (S,)`` the bias
    group of each window slot, ``R_ref (nb, 3, 3)`` (optimiser chart of a full tensor)."""

    def __init__(self, spec: Spec, data, k, seg_ids, groups, *, R_ref=None):
        self.spec = spec
        self.data = data
        self.k = np.asarray(k, np.int32)
        self.seg_ids = np.atleast_2d(np.asarray(seg_ids, int))
        self.S = self.seg_ids.shape[1]
        self.groups = np.asarray(groups, int)
        self.G = int(self.groups.max()) + 1
        self.R_ref = None if R_ref is None else np.asarray(R_ref, float)
        self.n_sh = spec.n_chart
        self.n_b = spec.n_bias
        self.P = self.n_sh + self.G * self.n_b + 3 * self.S
        self.dtype = data[0].dtype
        self.eps = float(np.finfo(self.dtype).eps)
        idx = []
        off_w = self.n_sh + self.G * self.n_b
        for s, g in enumerate(self.groups):
            idx.append(
                list(range(self.n_sh))
                + list(range(self.n_sh + g * self.n_b, self.n_sh + (g + 1) * self.n_b))
                + list(range(off_w + 3 * s, off_w + 3 * s + 3))
            )
        self.idx = np.asarray(idx, dtype=np.intp)  # (S, n_loc)
        self.n_loc = self.idx.shape[1]
        self.ev = evaluator(spec)
        self.Q = lanes(data[0].shape[1])

    def bounds(self, nb: int) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)`` ``(nb, P)``: the chart's box on the shared part, free elsewhere."""
        lo = np.full((nb, self.P), -np.inf)
        hi = np.full((nb, self.P), np.inf)
        lo[:, : self.n_sh], hi[:, : self.n_sh] = self.spec.chart_bounds()
        return lo, hi

    def theta(self, x, rows):
        """Model values ``(na, n_theta)`` and ``d theta / d shared`` of the points ``x``."""
        return chart_theta(x[:, : self.n_sh], None if self.R_ref is None else self.R_ref[rows], self.spec)

    def lanes_of(self, x, rows):
        """Per (problem, window) lane: ``theta, w0, bias, window index``, flattened ``(na*S, …)``."""
        na = x.shape[0]
        theta, T_sh = self.theta(x, rows)
        loc = x[:, self.idx]  # (na, S, n_loc)
        w0 = loc[:, :, self.n_sh + self.n_b :]
        bias = loc[:, :, self.n_sh : self.n_sh + self.n_b] if self.n_b else np.zeros((na, self.S, 3))
        th = np.broadcast_to(theta[:, None, :], (na, self.S, theta.shape[1]))
        segs = self.seg_ids[rows]
        return th.reshape(na * self.S, -1), w0.reshape(-1, 3), bias.reshape(-1, 3), segs.reshape(-1), T_sh

    def _local(self, x, rows):
        """Per (problem, window): ``J^T J`` and ``J^T r`` in the window's local unknowns
        ``[shared | bias of its group | omega0]``, the RSS and the finiteness flag."""
        x = np.asarray(x, float)
        rows = np.asarray(rows)
        na = x.shape[0]
        th, w0, bias, segs, T_sh = self.lanes_of(x, rows)
        nq = th.shape[0]
        order = np.argsort(self.k[segs], kind="stable")  # lanes of equal k together: a vmapped
        A_m = g_m = rss = ok = None  # fori_loop runs the largest k of its call
        for c0, Q in lane_chunks(nq, self.Q):
            sl = order[c0 : c0 + Q]
            n_real = sl.size
            sl = np.concatenate([sl, np.full(Q - n_real, sl[-1])])
            si = segs[sl]
            o = self.ev(  # NumPy arguments: jit's own transfer (jnp.asarray costs ~0.4 ms each)
                th[sl].astype(self.dtype),
                w0[sl].astype(self.dtype),
                bias[sl].astype(self.dtype),
                self.data[0][si],
                self.data[1][si],
                self.data[2][si],
                self.k[si],
            )
            o = [np.asarray(v)[:n_real] for v in o]
            if A_m is None:
                nm = o[0].shape[-1]
                A_m, g_m = np.empty((nq, nm, nm)), np.empty((nq, nm))
                rss, ok = np.empty(nq), np.empty(nq, bool)
            tgt = order[c0 : c0 + n_real]
            A_m[tgt], g_m[tgt], rss[tgt], ok[tgt] = o
        nm = A_m.shape[-1]
        A_m = A_m.reshape(na, self.S, nm, nm)
        g_m = g_m.reshape(na, self.S, nm)
        # chain rule: m = [theta(shared) | w0 | bias] as a function of the local vector
        nt = self.spec.n_theta
        T = np.zeros((na, nm, self.n_loc))
        T[:, :nt, : self.n_sh] = T_sh
        T[:, nt : nt + 3, self.n_sh + self.n_b :] = np.eye(3)
        if self.n_b:
            T[:, nt + 3 :, self.n_sh : self.n_sh + self.n_b] = np.eye(3)
        # batched matmul, not a three-operand np.einsum (which contracts in its own loops,
        # unoptimised): fit_inertia of the 69 shared flips (warm, median of 8, 2-core VM)
        # 2.8 -> 2.4 s wall, 4.3 -> 3.7 s CPU
        Tt = T.transpose(0, 2, 1)[:, None]
        A_loc = Tt @ A_m @ T[:, None]
        g_loc = (Tt @ g_m[..., None])[..., 0]
        return A_loc, g_loc, rss.reshape(na, self.S), ok.reshape(na, self.S).all(1)

    def evaluate(self, x, rows):
        """``x (na, P)`` of problems ``rows (na,)`` -> cost (na,), A (na, P, P), g (na, P), ok (na,),
        rss (na, S)."""
        A_loc, g_loc, rss, ok = self._local(x, rows)
        na = A_loc.shape[0]
        A = np.zeros((na, self.P, self.P))
        g = np.zeros((na, self.P))
        for s in range(self.S):
            ix = self.idx[s]
            A[:, ix[:, None], ix[None, :]] += A_loc[:, s]
            g[:, ix] += g_loc[:, s]
        cost = 0.5 * rss.sum(1)
        ok = ok & np.isfinite(cost) & np.all(np.isfinite(A), axis=(1, 2))
        return cost, A, g, ok, rss
