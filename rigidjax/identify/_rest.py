"""A fitted gyroscope bias against the rate the gyroscope reads at rest, and the bias taken
from it (``fit_inertia(..., bias="rest")``).

A constant bias is a cheap nuisance parameter, and a flexible one: on the racquet's rounds 2
and 3 (``../shared/data/racquet-flips``, 62 windows) the windows fitted alone with a bias give
a median ``|bias|`` over windows and axes of 0.13 rad/s (up to 0.74), and a joint fit (principal moments, one
bias per recording) gives 0.42 rad/s about x for one recording, while the same phone lying
still between the tosses reads below 3e-4 rad/s on every axis (:mod:`rigidjax.io.rest`). Such
a bias absorbs model error (air drag, a flexible racquet, a slightly wrong model) and can pull
the inertia with it: the first nine tosses of recording 09-35-02 give ``Ix/Iy`` 23.7 with a
bias and 14.9 without. Neither the statistical error nor the cluster sandwich sees it (a pull
shared by all windows is no scatter between them). The reading at rest is an independent
measurement of the same bias, so:

* :func:`judge_windows` (per-window fits with ``bias=True``): a pooled window whose own bias
  lies more than :func:`z_limit` combined errors (its statistical error and the reading's
  ``sd``; 3.3 for one window, 4.3 for 60) from its recording's reading at rest on some axis
  makes the whole fit :attr:`~rigidjax.identify.FitStatus.POOR_FIT`; it stays in the combined
  estimate (leaving such windows out would change which recordings are pooled: on the 69
  flips 71 % of the racquet's judged windows are contradicted (principal moments; 78 % of
  round 3's with a tensor), and without them the pooling left out a racquet recording and
  pooled round 1's phone, which has no reading at rest), and the message names the count and
  the worst.
* :func:`judge_recordings` (joint fits with ``bias=True``): each recording's bias against its
  reading at rest (its total error, else its statistical one, with the reading's ``sd``); a
  contradicted recording makes the whole fit ``POOR_FIT`` (it stays in the joint estimate,
  which the message says is not to be trusted) and ``combined["bias"][recording]`` carries
  ``rest`` (the reading: value, sd, duration, blocks), ``rest_z`` (per axis), ``rest_agrees``
  and ``rest_limit``.
* :func:`subtract` (``bias="rest"``): the reading at rest is subtracted from every window's
  rates and the model fitted without a bias; ``combined["bias"]`` reports the readings
  (``measured="at rest"``). Their uncertainty (``sd``, 2.4e-4 to 5.9e-4 rad/s on the racquet
  rounds) is not propagated: shifting every reading by its ``sd`` moves the joint ``Ix/Iy``
  and ``Iz/Iy`` of rounds 2 and 3 by at most 0.05 (principal moments) and :data:`REST_SHIFT_SE`
  (tensor + diagonal drag) of their statistical errors, a few per cent of their total errors.

Recordings without a still stretch (``Segment.rest`` ``None``: round 1, held in the hand
throughout) are not judged; ``bias="rest"`` refuses them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import special

from ._combine import Z_AGREE
from ._derived import FitError
from ._result import FitStatus
from ._windows import _SEVERITY

#: A fitted bias contradicts the reading at rest where an axis differs by more than
#: :func:`z_limit` combined errors: this level for one comparison (the level at which
#: recordings disagree, :data:`~._combine.Z_AGREE`), raised for many (Bonferroni).
Z_REST = Z_AGREE


def z_limit(m: int) -> float:
    """The limit on ``|z|`` over ``m`` comparisons (3 axes per window or recording) at the
    family-wise level of one two-sided :data:`Z_REST` test (0.27 %): 3.0 for one axis, 3.3
    for one window or recording, 4.3 for 60 windows. On 30 synthetic recordings with a true
    bias and a reading at rest (``rigidjax.synthetic``, joint tensor + drag + bias fits) the
    largest ``|z|`` was 1.7 and none was flagged (the reading's ``sd`` is the scatter of
    its blocks, not the error of their mean: ``|z|`` runs below N(0, 1), RMS 0.68); per-window
    tensor + drag + bias fits of 15 such recordings (82 windows judged): largest 2.96, none
    flagged."""
    alpha = 2.0 * special.ndtr(-Z_REST)
    return float(-special.ndtri(alpha / (2.0 * max(int(m), 1))))


#: Measured (module docstring): the largest shift of a joint ratio, in statistical errors,
#: when every reading at rest moves by its ``sd``.
REST_SHIFT_SE = 0.11


def rest_z(value, err, rest) -> np.ndarray:
    """``(3,)`` ``|value - rest.value| / sqrt(err^2 + rest.sd^2)`` per axis (``err``: the
    fitted bias's 1-sigma, rad/s)."""
    value, err = np.asarray(value, float), np.asarray(err, float)
    diff, den = np.abs(value - rest.value), np.sqrt(err**2 + rest.sd**2)
    with np.errstate(divide="ignore", invalid="ignore"):  # no error at all: any difference is infinite
        z = np.where(den > 0, diff / den, np.where(diff > 0, np.inf, 0.0))
    return np.where(np.isnan(den) | np.isnan(diff), np.nan, z)


def _judged(z) -> bool:
    """Whether ``z`` can judge (a bias whose error is NaN, singular, is not judged)."""
    return bool(np.all(np.isfinite(z) | np.isinf(z)))


def _says(value, rest, z) -> str:
    a = int(np.argmax(z))  # z holds no NaN (_judged)
    return (
        f"its fitted gyroscope bias {value[a]:+.3g} rad/s about {'xyz'[a]} lies {z[a]:.1f} errors from the "
        f"{rest.value[a]:+.2g} ± {rest.sd[a]:.1g} rad/s the gyroscope reads at rest ({rest.duration:.3g} s still "
        "in its recording): the bias absorbs model error; fit with bias='rest' (--bias rest) or without a bias"
    )


def judge_windows(result, segs) -> None:
    """Per-window fits with a bias: each pooled window's own bias against its recording's
    reading at rest (``result`` updated in place: the window's row gains ``rest_z``,
    ``rest_agrees`` and ``rest_limit``; contradicted windows (beyond :func:`z_limit` over the judged windows' axes)
    make the status ``POOR_FIT`` at least and are named in the message; they stay in the
    combined estimate, so that a bias model that the data reject does not also change which
    recordings are pooled)."""
    judged = [
        (i, rest_z(result.segments[i]["bias"], result.segments[i]["bias_se"], segs[i].rest))
        for i in result.combined.get("windows", [])
        if segs[i].rest is not None and "bias" in result.segments[i]
    ]
    judged = [(i, z) for i, z in judged if _judged(z)]
    _readings(result, segs)
    limit = z_limit(3 * len(judged))
    bad = []
    for i, z in judged:
        r = result.segments[i]
        r["rest_z"] = z.tolist()
        r["rest_agrees"], r["rest_limit"] = bool(np.max(z) <= limit), limit
        if not r["rest_agrees"]:
            bad.append((float(np.max(z)), f"{r['name']}: " + _says(np.asarray(r["bias"]), segs[i].rest, z)))
    if bad:
        worst = max(bad)[1]
        _flag(
            result,
            f"{len(bad)} of the {len(judged)} judged pooled window(s) fit a gyroscope bias that the gyroscope at "
            f"rest contradicts (beyond {limit:.2g} errors; kept in the combined estimate, which they may pull: "
            f"not to be trusted); the worst: {worst}",
        )


def judge_recordings(result, segs, labels) -> None:
    """Joint fits with a bias: each recording's bias against its reading at rest
    (``result`` updated in place: ``combined["bias"][recording]`` gains ``rest``, ``rest_z``,
    ``rest_agrees`` and ``rest_limit``; a contradiction (beyond :func:`z_limit` over the judged recordings'
    axes) makes the status ``POOR_FIT`` at least and adds to the message)."""
    rests = {}
    for s, lab in zip(segs, labels):
        if s.rest is not None:
            rests.setdefault(lab, s.rest)
    judged = []
    for rec, b in (result.combined.get("bias") or {}).items():
        if rests.get(rec) is not None:
            err = [t if t is not None else e for t, e in zip(b.get("total_se") or [None] * 3, b["se"])]
            z = rest_z(b["value"], err, rests[rec])
            if _judged(z):
                judged.append((rec, b, z))
    limit = z_limit(3 * len(judged))
    bad = []
    for rec, b, z in judged:
        b["rest"] = rests[rec].to_dict()
        b["rest_z"] = z.tolist()
        b["rest_agrees"], b["rest_limit"] = bool(np.max(z) <= limit), limit
        if not b["rest_agrees"]:
            bad.append(f"{rec}: " + _says(np.asarray(b["value"]), rests[rec], z))
    if bad:
        _flag(
            result,
            f"the bias of {len(bad)} recording(s) contradicts the gyroscope at rest (beyond {limit:.2g} errors; kept "
            "in the joint estimate, which it may pull: not to be trusted): " + "; ".join(bad),
        )


def _readings(result, segs) -> None:
    """``combined["rest"]``: recording -> its reading at rest (``Rest.to_dict``), for the
    per-window table and the JSON."""
    out = {}
    for r, s in zip(result.segments, segs):
        if s.rest is not None:
            out.setdefault(r["recording"], s.rest.to_dict())
    if out:
        result.combined["rest"] = out


def _flag(result, said: str) -> None:
    """Status ``POOR_FIT`` at least, and ``said`` in the message."""
    converged = result.status == FitStatus.CONVERGED
    if converged or _SEVERITY.index(FitStatus.POOR_FIT) < _SEVERITY.index(result.status):
        result.status = FitStatus.POOR_FIT
    result.message = said if converged else f"{result.message}; {said}"


def subtract(segs, labels) -> tuple[list, dict]:
    """``bias="rest"``: the windows with their recording's reading at rest subtracted, and
    ``combined["bias"]`` (recording -> value, se = total_se = the reading's ``sd``,
    ``measured="at rest"``, ``rest``).

    Raises:
        FitError: a window whose recording has no still stretch (``Segment.rest`` ``None``).
    """
    missing = sorted({lab for s, lab in zip(segs, labels) if s.rest is None})
    if missing:
        raise FitError(
            f"bias='rest': {len(missing)} recording(s) have no reading at rest (Segment.rest is None): "
            + "; ".join(missing)
            + ". The loaders find none where the body never lies still (no 0.5 s block within 3x the gyroscope "
            "noise and below 0.1 rad/s: rigidjax.io.rest); for segments built by hand, measure it from the whole "
            "recording: dataclasses.replace(segment, rest=rigidjax.io.rest_reading(t, omega)). Else fit a bias "
            "(bias=True, --bias) or none"
        )
    out = [dataclasses.replace(s, omega=s.omega - s.rest.value) for s in segs]
    bias = {}
    for s, lab in zip(segs, labels):
        if lab not in bias:
            sd = s.rest.sd.tolist()
            bias[lab] = {
                "value": s.rest.value.tolist(),
                "se": sd,
                "total_se": sd,
                "measured": "at rest",
                "rest": s.rest.to_dict(),
            }
    return out, bias
