"""The verdict on a window whose optimiser has ended, beyond its optimiser's own status: an
estimate on an edge of the physically valid set that the data push beyond (a poor fit), and a
degenerate minimum that the optimiser heads for without reaching it (unidentifiable).

Part of :func:`rigidjax.identify.fit_inertia` (module docstring of :mod:`rigidjax.identify._fit`);
``st`` is a state of :func:`rigidjax.identify._lm.solve` in the optimiser's chart
(:mod:`rigidjax.identify._model`: ``u, v`` (+ ``phi``) + drag, then bias and initial rate).
"""

from __future__ import annotations

import math

import numpy as np

from . import _lm
from ._model import V_MAX, Spec
from .transforms import REL_SE_MAX

__all__ = ["REL_SE_MAX", "EDGE_PUSH", "CHI2_1_95", "edge_push", "degenerate", "flat"]

#: A window whose estimate sits on an edge of the physically valid set while the data ask
#: for an inertia beyond it (the unconstrained Gauss-Newton step would remove more than this
#: fraction of its cost) is a poor fit: not free flight, wrong axes or units, not rigid. On
#: the 69 racquet windows, those on an edge would gain at most 24 % (principal moments) and
#: 37 % (full tensor + drag). The same rule judges any fit of :func:`rigidjax.identify.fit`
#: held at a bound of a transform's box.
EDGE_PUSH = 0.6
#: A window whose optimiser ended without first-order optimality (``max_steps``,
#: ``stalled``) at an inertia that is not rod-like heads for a degenerate minimum
#: (:func:`degenerate`) only where the decrease of the residual sum of squares its
#: Gauss-Newton model still promises is below this many residual variances: the 95 % quantile
#: of chi^2 with one degree of freedom (statistically insignificant).
CHI2_1_95 = 3.841

_EDGES = {  # (chart coordinate, bound) -> what lies beyond it
    (0, "hi"): "I3 > I1 + I2",
    (0, "lo"): "I1 > I2 + I3",
    (1, "lo"): "I2 > I1 + I3",
}


def edge_push(spec: Spec, st: dict, j: int):
    """``(what, fraction)`` where window ``j``'s estimate sits on an edge of the valid set and
    the unconstrained Gauss-Newton step would remove more than :data:`EDGE_PUSH` of its cost,
    else ``None``. ``I1, I2, I3``: the principal moments (along sensor x, y, z without
    ``tensor``)."""
    x, g, lo, hi = st["x"][j], st["g"][j], st["lo"][j], st["hi"][j]
    held = [
        (c, b)
        for c in range(spec.n_chart)
        for b, at in (("lo", x[c] <= lo[c] and g[c] > 0), ("hi", x[c] >= hi[c] and g[c] < 0))
        if at
    ]
    if not held:
        return None
    inf = np.full((1, x.size), np.inf)
    free = _lm.decrement(
        st["A"][j : j + 1], g[None], st["cost"][j : j + 1], x[None], -inf, inf, st["floor"][j : j + 1]
    )[0]
    if not free > EDGE_PUSH:
        return None
    c, b = held[0]
    what = _EDGES.get(
        (c, b), "a negative drag (a body that speeds up)" if c >= 2 + 3 * spec.tensor else "a degenerate inertia"
    )
    return what, min(float(free), 1.0)


def degenerate(st: dict, j: int, s2: float, singular: bool, rel) -> str | None:
    """Why window ``j``, whose optimiser ended without first-order optimality (``max_steps``
    or ``stalled``), heads for a degenerate minimum, in words; ``None`` where it may not.

    * Rod-like: at the last point the largest principal moment is :data:`V_MAX` times the
      smallest or more (``v`` at the edge of the search, or near a corner ``(u, v) = (0, 0)``
      or ``(1, 0)`` of the chart, where a moment goes to zero and the other two become equal),
      the degenerate inertia that a fit ending at ``v = V_MAX`` reports.
    * Flat: the decrease of the residual sum of squares that the Gauss-Newton model at the
      last point still promises, ``2 delta f``, is below :data:`CHI2_1_95` residual variances
      ``s^2`` (statistically insignificant: the minimum lies within the noise of this point),
      and the data determine ``Ix/Iy`` or ``Iz/Iy`` no better than :data:`REL_SE_MAX` even at
      the minimum: singular normal equations at the last point, or a relative standard error
      there above ``2 kappa REL_SE_MAX``, ``kappa = sqrt(1 + 2 delta f / s^2)``. (The points
      within one standard error of the last point cost at most ``s^2 / 2`` more and the
      minimum is at most ``delta f`` lower, so they lie in its ``kappa``-sigma region, which
      spans ``2 kappa`` of the minimum's standard errors.)
    """
    x = st["x"][j]
    u, v = float(x[0]), float(x[1])
    moments = np.array([v + 1 - u, 1.0, u + v])
    if moments.max() >= V_MAX * moments.min():
        ratio = moments.max() / max(moments.min(), 1e-300)
        return f"its principal moments are already {ratio:.3g} : 1, a rod (a ratio beyond {V_MAX:g})"
    dec = 2.0 * float(st["opt"][j]) * max(float(st["cost"][j]), float(st["floor"][j]))
    return flat(dec, s2, singular, {"Ix/Iy": rel[0], "Iz/Iy": rel[1]}, REL_SE_MAX)


def flat(dec: float, s2: float, singular: bool, rel: dict, limit: float) -> str | None:
    """Why a fit whose optimiser ended without first-order optimality heads for a minimum the
    data do not determine (the flat part of :func:`degenerate`, for any problem), in words;
    ``None`` where it may not. ``dec``: the decrease of the residual sum of squares its
    Gauss-Newton model still promises; ``s2``: the residual variance; ``rel``: name ->
    relative standard error of the values judged against ``limit``."""
    if not (np.isfinite(dec) and np.isfinite(s2) and s2 > 0 and dec < CHI2_1_95 * s2):
        return None
    rest = f"the rest of the descent would lower the residual sum of squares by {dec / s2:.2g} residual variances"
    if singular:
        return f"{rest} (insignificant), and there the normal equations are singular"
    kappa = math.sqrt(1.0 + dec / s2)
    if rel and max(rel.values()) > 2 * kappa * limit:
        return (
            f"{rest} (insignificant), and there "
            + " and ".join(rel)
            + " are known only to "
            + " and ".join(f"±{100 * v:.0f} %" for v in rel.values())
        )
    return None
