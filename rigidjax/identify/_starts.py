"""Starting points of the per-window inertia fits (:mod:`rigidjax.identify._windows`).

``run`` is the fit's shared state (``_windows._Run``): ``segs``, ``spec``, and a dict for caches.
"""

from __future__ import annotations

import numpy as np

from ._model import Spec, equation_error_guess, random_chart, theta_chart

__all__ = ["recording_guess", "window_starts"]


def recording_guess(run, i: int):
    """The equation-error estimate of all windows of window ``i``'s recording (one body,
    usually), or ``None`` for a recording of one window. Cached per recording."""
    cache = run.__dict__.setdefault("_recording_guesses", {})
    src = run.segs[i].source
    if src not in cache:
        same = [s for s in run.segs if s.source == src]
        cache[src] = equation_error_guess(same, run.spec) if len(same) > 1 else None
    return cache[src]


def window_starts(run, i: int, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` chart starts (shared part) and ``R_ref`` for window ``i``: the equation-error
    estimates of the full model on this window and on all windows of its recording (a
    short or noisy window's own linear estimate can be far off: on the README demo one
    started at 5e5 times the final cost and took 179 iterations), and of the simplest model
    on this window, then random valid inertias."""
    spec = run.spec
    seg = run.segs[i]
    xs, Rs = [], []
    guesses = [equation_error_guess([seg], spec)]
    if (g := recording_guess(run, i)) is not None:
        guesses.append(g)
    if spec.tensor or spec.drag:
        g = equation_error_guess([seg], Spec(False, None, False))
        if g is not None:
            th = np.zeros(spec.n_theta)
            th[:3] = g[:3]
            th[spec.n_icomp :] = 0.01 * np.trace(np.diag(g[:3]))
            guesses.append(th)
    for g in guesses[:n]:
        if g is not None:
            x, R = theta_chart(g, spec)
            xs.append(x[0])
            Rs.append(R[0])
    if len(xs) < n:
        x, R = random_chart(rng, n - len(xs), spec)
        xs += list(x)
        Rs += list(R)
    return np.array(xs[:n]), np.array(Rs[:n])
