"""The gyroscope's reading at rest (rigidjax.io.rest) and what fit_inertia does with it
(rigidjax.identify._rest): judging a fitted bias, and ``bias="rest"``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rigidjax
from rigidjax.identify import FitError, FitStatus, fit_inertia
from rigidjax.io import Rest, Segment, load, rest_reading
from rigidjax.reference import euler_omega
from rigidjax.report import report_html

#: a racquet-like body (x intermediate, y minor, z major; physically valid, unlike the
#: racquet's measured moments, which break the triangle inequality within their errors)
INERTIA = np.array([1.88e-2, 1.39e-3, 1.95e-2])


def _still_and_held(seed=0, bias=(0.02, -0.015, 0.01), sigma=0.003, dt=0.01):
    """``t, omega``: 5 s lying still (rate = bias + white noise sigma), 5 s hand-held (a slow
    wander of ~0.3 rad/s on top), 5 s still again; sample times jittered like a phone's."""
    rng = np.random.default_rng(seed)
    n = 500
    t = dt * np.arange(3 * n) + rng.uniform(-1e-3, 1e-3, 3 * n)
    omega = np.asarray(bias) + sigma * rng.standard_normal((3 * n, 3))
    omega[n : 2 * n] += 0.3 * np.tanh(np.cumsum(rng.standard_normal((n, 3)), axis=0) * 0.1)
    return t, omega


def test_reading_at_rest_recovers_the_bias_and_ignores_the_hand():
    bias = np.array([0.02, -0.015, 0.01])
    t, omega = _still_and_held(bias=bias)
    r = rest_reading(t, omega)
    assert isinstance(r, Rest)
    # 10 s still (0.5 s blocks): every still block lies in the two still stretches or straddles
    # their ends (where the hand's wander starts from zero, below the noise), none inside the held one
    assert 16 <= len(r.spans) <= 21 and all(b <= 5.5 or a >= 9.5 for a, b in r.spans)
    assert r.duration == pytest.approx(len(r.spans) * 0.5, rel=0.02)
    # the block means scatter by sigma / sqrt(50) = 4.2e-4 (the sd, estimated to ~20 % from 20
    # blocks); their median lies within sd / sqrt(20) * 1.25 = 1.2e-4 (1-sigma) of the bias
    np.testing.assert_allclose(r.sd, 4.2e-4, rtol=0.4)
    np.testing.assert_array_less(np.abs(r.value - bias), 4 * 1.25 * r.sd / np.sqrt(len(r.spans)))
    assert "Rest(" in repr(r) and r.to_dict()["blocks"] == len(r.spans)


def test_no_reading_where_the_body_never_rests():
    t, omega = _still_and_held()
    held = slice(500, 1000)
    assert rest_reading(t[held], omega[held]) is None  # held throughout
    assert rest_reading(t[:40], omega[:40]) is None  # shorter than a block (0.5 s)
    spinning = omega[:500] + np.array([0.5, 0.0, 0.0])  # steady 0.5 rad/s: above max_bias, not rest
    assert rest_reading(t[:500], spinning) is None
    assert rest_reading(t[:500], spinning, max_bias=1.0) is not None


def test_pauses_gaps_and_non_finite_samples():
    t, omega = _still_and_held()
    full = rest_reading(t, omega)
    # a pause inside every still block leaves none
    pauses = [0.5 * (a + b) for a, b in full.spans]
    assert rest_reading(t, omega, pauses=pauses) is None
    # non-finite samples (outside phyphox windows) are skipped, not propagated
    bad = omega.copy()
    bad[::7] = np.nan
    r = rest_reading(t, bad)
    assert r is not None and np.all(np.isfinite(r.value))
    # a gap of 1 s (samples 250-349 missing) breaks the block it falls in
    keep = np.r_[0:250, 350:1500]
    r2 = rest_reading(t[keep], omega[keep])
    assert r2 is not None and len(r2.spans) >= 14
    assert not any(a <= t[249] and b >= t[350] for a, b in r2.spans)


def test_segment_rest_field_is_checked():
    t, omega = _still_and_held()
    with pytest.raises(rigidjax.io.DataError, match="rest must be"):
        Segment(t, omega, rest={"value": 0})


def test_csv_loader_attaches_the_reading(tmp_path):
    t, omega = _still_and_held()
    p = tmp_path / "still.csv"
    np.savetxt(p, np.column_stack([t, omega]), delimiter=",", header="t,wx,wy,wz", comments="")
    (seg,) = load(p, windows="file")
    assert seg.rest is not None and np.allclose(seg.rest.value, rest_reading(t, omega).value)


def test_shared_recordings_read_at_rest(racquet_dir):
    """Rounds 2 and 3 lie on the table between tosses (reading below 3e-4 rad/s, the phone's
    calibrated rate); round 1 is held in the hand throughout."""
    segs = rigidjax.io.load_phyphox(racquet_dir / "flips")
    by = {s.source: s.rest for s in segs}
    assert len(by) == 5
    for src, r in by.items():
        if "2025-01-16" in src:
            assert r is None, src
        else:
            assert r is not None and r.duration >= 2.0, src
            np.testing.assert_array_less(np.abs(r.value), 3e-4)
    # every window of a recording carries the same reading
    assert all(s.rest is by[s.source] for s in segs)


# ----------------------------------------------------------------------------- fits


def _tosses(n=4, bias=(0.0, 0.0, 0.0), seed=0, sigma=0.004):
    """Free-flight windows (SciPy-free closed form: rigidjax.reference.euler_omega) of the
    racquet, read with ``bias`` and white noise ``sigma``."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        w0 = np.array([rng.uniform(7, 11), rng.uniform(0.2, 0.5), rng.uniform(0.2, 0.5)])  # about x: flips
        t = 0.01 * np.arange(150)
        w = euler_omega(INERTIA, w0, t) + np.asarray(bias) + sigma * rng.standard_normal((150, 3))
        out.append(Segment(t + 10 * k, w, name=f"toss {k}", source="rec.csv"))
    return out


def _at_rest(segs, value, sd=2e-4):
    r = Rest(np.asarray(value, float), np.full(3, sd), 10.0, ((0.0, 1.0),) * 10)
    return [dataclasses.replace(s, rest=r) for s in segs]


@pytest.mark.parametrize("joint", [False, True])
def test_a_bias_the_reading_at_rest_contradicts_is_a_poor_fit(joint):
    """The gyroscope reads 0.05 rad/s more in flight than at rest: the fitted bias (0.05, known
    to ~0.003) lies ~15 errors from the reading; a reading that agrees leaves the fit converged."""
    bias = np.array([0.05, 0.0, 0.0])
    segs = _tosses(bias=bias)
    with pytest.warns(UserWarning, match="poor_fit"):
        bad = fit_inertia(_at_rest(segs, [0.0, 0.0, 0.0]), bias=True, joint=joint)
    assert bad.status == FitStatus.POOR_FIT
    good = fit_inertia(_at_rest(segs, bias), bias=True, joint=joint)
    assert good.status == FitStatus.CONVERGED, good.message
    if joint:
        assert "gyroscope reads at rest" in bad.message
        (b,) = bad.combined["bias"].values()
        assert not b["rest_agrees"] and max(b["rest_z"]) > 10
        (b,) = good.combined["bias"].values()
        assert b["rest_agrees"] and max(b["rest_z"]) <= 3
        assert "at rest (10 s still)" in good.table()
        html = report_html(bad, max_windows=1)
        assert "read at rest ± scatter" in html and "(contradicts)" in html
    else:  # every window: its own bias (0.05 known to ~0.0004) far from the reading, yet pooled
        assert "4 of the 4 judged pooled window(s) fit a gyroscope bias" in bad.message
        assert bad.combined["n"] == 4 and bad.estimates == good.estimates
        for r in bad.segments:
            assert r["status"] == FitStatus.CONVERGED and not r["rest_agrees"] and max(r["rest_z"]) > 10
        assert all(r["rest_agrees"] for r in good.segments)
        assert "4 of 4 window(s) beyond 3.7" in report_html(bad, max_windows=1)
        assert "at rest 10 s" in repr(_at_rest(segs, bias)[0])


def test_bias_from_rest_is_subtracted_not_fitted():
    """bias="rest" on data read with a 0.05 rad/s bias and a reading at rest of it gives the
    estimate of the bias-free data (the same windows without the bias, no bias fitted) to 1e-9,
    reports the reading as the bias, and draws the model against the raw rates."""
    bias = np.array([0.05, -0.02, 0.01])
    segs = _tosses(bias=bias)
    clean = _tosses()
    f = fit_inertia(_at_rest(segs, bias), bias="rest", joint=True)
    ref = fit_inertia(clean, joint=True)
    assert f.status == FitStatus.CONVERGED and f.options["bias"] == "rest"
    for k in ("Ix/Iy", "Iz/Iy"):
        assert f.estimates[k] == pytest.approx(ref.estimates[k], rel=1e-9)
    (b,) = f.combined["bias"].values()
    assert b["measured"] == "at rest" and np.allclose(b["value"], bias)
    assert "read at rest over 10 s, subtracted" in f.table()
    t, measured, predicted = f.predict(0)
    assert np.allclose(measured, segs[0].omega)  # the raw rates, bias included
    assert np.sqrt(np.mean((measured - predicted) ** 2)) < 0.006  # the noise (0.004), not the bias


def test_bias_from_rest_needs_a_reading():
    with pytest.raises(FitError, match="have no reading at rest"):
        fit_inertia(_tosses(), bias="rest")
    with pytest.raises(FitError, match="bias must be"):
        fit_inertia(_tosses(), bias="at rest")


def test_limit_over_many_comparisons():
    """Bonferroni at the level of one two-sided 3-sigma test: 3.0 for one axis, ~3.3 for the
    three axes of one window, rising slowly with the number of windows."""
    from rigidjax.identify._rest import z_limit

    assert z_limit(1) == pytest.approx(3.0, abs=1e-9)
    limits = [z_limit(m) for m in (1, 3, 9, 30, 180, 3000)]
    assert limits == sorted(limits) and limits[1] == pytest.approx(3.32, abs=0.01)
    assert limits[4] == pytest.approx(4.33, abs=0.01) and z_limit(0) == z_limit(1)


def test_noiseless_and_quantised_gyroscopes_rest_too():
    """QA: with no noise (or noise below one quantisation step) most second differences are 0,
    the noise estimate 0, and a still block at a non-zero bias (float std ~1e-18) was not still.
    The noise is floored at the rounding (step / sqrt(12)) and 1e-9 rad/s."""
    t = 0.01 * np.arange(3000)
    r = rest_reading(t, np.full((3000, 3), 0.004))
    assert r is not None and np.allclose(r.value, 0.004) and len(r.spans) == 60
    rng = np.random.default_rng(1)
    lsb = 0.01  # a coarse gyroscope: noise 0.001 rad/s, well below one step; then a slow turn,
    # whose readings step by one lsb (the rounding is known from the recording's smallest step)
    still = np.array([0.02, -0.01, 0.0]) + 0.001 * rng.standard_normal((3000, 3))
    turn = np.linspace(0.0, 2.0, 1000)[:, None] * np.ones(3)
    q = np.round(np.concatenate([still, turn]) / lsb) * lsb
    t = 0.01 * np.arange(4000)
    r = rest_reading(t, q)
    assert r is not None and np.allclose(r.value, [0.02, -0.01, 0.0], atol=lsb / 2)
    # the rounding, which averaging does not remove, is in the reading's sd (QA: sd was 0)
    np.testing.assert_array_less(lsb / np.sqrt(12) * 0.999, r.sd)
    exact = rest_reading(t[:3000], np.full((3000, 3), 0.004))
    assert np.all(exact.sd >= 1e-9)


def test_rest_reading_refuses_bad_input():
    t = 0.01 * np.arange(100)
    with pytest.raises(ValueError, match=r"omega \(n, 3\)"):
        rest_reading(t, np.zeros(100))
    with pytest.raises(ValueError, match="times must increase"):
        rest_reading(t[::-1], np.zeros((100, 3)))
    for block in (0, "0.5", None, True):
        with pytest.raises(ValueError, match="block must be a positive number"):
            rest_reading(t, np.zeros((100, 3)), block=block)


def test_rest_z_without_errors():
    """A reading and a bias both without error: equal is 0, different is infinitely far; a NaN
    error (singular normal equations) leaves the bias unjudged."""
    from rigidjax.identify._rest import _judged, rest_z

    exact = Rest(np.zeros(3), np.zeros(3), 1.0, ((0.0, 1.0),))
    z = rest_z([1e-12, 0.0, 0.0], [0.0, 0.0, 0.0], exact)
    assert z[0] == np.inf and z[1] == 0.0 and _judged(z)
    assert not _judged(rest_z([0.1, 0.0, 0.0], [np.nan, 0.1, 0.1], exact))


def test_bias_accepts_bool_like_values():
    """bias=None/0/1 worked before bias='rest' existed (bool(bias)); 'fit' is the CLI's name for True."""
    segs = _tosses(n=2)
    assert fit_inertia(segs, bias=None).options["bias"] is False
    assert fit_inertia(segs, bias="fit").options["bias"] is True
    for bad in ([0.004, -0.003, 0.002], 0.5, np.zeros(3), "yes"):  # a known bias vector is not a flag
        with pytest.raises(FitError, match="bias must be"):
            fit_inertia(segs, bias=bad)
