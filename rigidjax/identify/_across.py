r"""Rules across the windows of one body: which fits to refit from the others' consensus, and
which residual marks a fit as poor against its recording's other windows.

On real recordings a good fit's residual is model error (on the racquet flips 0.2-0.7 rad/s
against ~0.01 rad/s of gyroscope noise: 20-70x the noise), so a residual alone cannot tell
a good window from a wrong basin or motion the model does not describe. Windows of one body
and one set of conditions (one recording) share their model error, so each residual is
judged against the median over its recording's windows (where the recording has at least
:data:`MIN_GROUP` of them, else over all windows), against the window's own signal (the
RMS of its measured values about their mean) and against its noise:

* **suspect** (refit from other starts): the optimiser did not converge, or the residual is
  above :data:`SUSPECT_MEDIAN` x the median or :data:`SUSPECT_SIGNAL` x the signal;
* **poor fit**: the residual is above :data:`POOR_MEDIAN` x the median (with at least two
  windows to compare) or :data:`POOR_SIGNAL` x the signal, and above :data:`POOR_NOISE` x
  the noise (a window near its noise fits, whatever the others do).

The refit of a suspect starts from the consensus of the other windows (:func:`medoid` of
their estimates: all windows, and its recording's), from its own start and its current
optimum for its other unknowns, and from :data:`RESCUE_RANDOM` random starts; after a first
phase the :data:`RESCUE_KEEP` lowest continue, and the refit replaces the fit where it ends
lower. Used by :func:`rigidjax.identify.fit_inertia` and by
:func:`rigidjax.identify.fit_many` with ``groups`` (one place for the rules and their
thresholds).
"""

from __future__ import annotations

import numpy as np

#: Refit trigger: residual above these multiples of the median / of the window's signal
#: (looser than the poor-fit rule, so the refit sees every candidate).
SUSPECT_MEDIAN, SUSPECT_SIGNAL = 3.0, 0.10
#: Poor fit: residual above these multiples of the median / of the signal, and above
#: ``POOR_NOISE`` x the noise.
POOR_MEDIAN, POOR_SIGNAL, POOR_NOISE = 5.0, 0.25, 10.0
#: Random starts of a refit, and how many of all its starts continue after the first phase.
RESCUE_RANDOM, RESCUE_KEEP = 16, 4
#: Iterations of every refit start before the lowest continue (``fit_many``; ``fit_inertia``
#: uses its ``phase1_steps``), and of every start of ``fit``/``fit_many`` with ``keep``.
RESCUE_FIRST_STEPS = 12
#: Fewest judged windows of a recording for its own median (else the median over all).
MIN_GROUP = 3


def group_medians(rms, groups, fine) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per window: the median residual of the ``fine`` windows of its group (recording) where
    it has at least :data:`MIN_GROUP`, else of all ``fine`` windows; how many windows that
    median is over; and whether it is the group's own (``(n,)`` each; ``inf`` and 0 without a
    fine window)."""
    rms, fine = np.asarray(rms, float), np.asarray(fine, bool)
    groups = np.asarray([str(g) for g in groups], object)
    med = np.full(rms.shape, float(np.median(rms[fine])) if fine.any() else np.inf)
    count = np.full(rms.shape, int(fine.sum()))
    own = np.zeros(rms.shape, bool)
    for g in set(groups):
        m = fine & (groups == g)
        if m.sum() >= MIN_GROUP:
            sel = groups == g
            med[sel], count[sel], own[sel] = float(np.median(rms[m])), int(m.sum()), True
    return med, count, own


def suspects(rms, signal, converged, groups) -> np.ndarray:
    """``(n,)`` bool: the windows to refit (see module); the medians are over the converged
    windows (over every finite one where none converged)."""
    rms, converged = np.asarray(rms, float), np.asarray(converged, bool)
    fine = converged if converged.any() else np.isfinite(rms)
    med, _, _ = group_medians(rms, groups, fine)
    with np.errstate(invalid="ignore"):
        return ~converged | (rms > SUSPECT_MEDIAN * med) | (rms > SUSPECT_SIGNAL * np.asarray(signal, float))


def poor_reasons(rms, signal, noise, groups, *, unit: str, cause: str) -> list[str | None]:
    """Per window (all judged: fitted to their minimum), the poor-fit reason of the rule in the
    module, or ``None``; ``unit`` names the residual's unit (``""``: none named) and ``cause``
    the likely causes."""
    rms, signal, noise = (np.asarray(a, float) for a in (rms, signal, noise))
    med, count, own = group_medians(rms, groups, np.ones(rms.shape, bool))
    u = f" {unit}" if unit else ""
    out = []
    for j in range(rms.size):
        why = []
        if rms[j] > POOR_MEDIAN * med[j] and count[j] > 1:
            scope = "its recording's windows" if own[j] else "the windows"
            why.append(f"{rms[j] / med[j]:.1f}x the median over {scope} ({med[j]:.3g}{u})")
        if rms[j] > POOR_SIGNAL * signal[j]:
            why.append(
                f"{rms[j] / signal[j]:.0%} of the window's own variation ({signal[j]:.3g}{u} RMS; a good fit "
                f"leaves under {POOR_SIGNAL:.0%})"
            )
        out.append(
            f"residual {rms[j]:.3g}{u}: " + " and ".join(why) + f", and {rms[j] / noise[j]:.0f}x its noise "
            f"({noise[j]:.2g}{u}): {cause}"
            if why and rms[j] > POOR_NOISE * noise[j]
            else None
        )
    return out


def medoid(z) -> int:
    """The row of ``z (n, d)`` nearest (L1) the coordinate-wise median: a consensus that is
    one of the estimates (a physical point, where the median of each coordinate need not be)."""
    z = np.asarray(z, float)
    return int(np.argmin(np.abs(z - np.median(z, 0)).sum(1)))
