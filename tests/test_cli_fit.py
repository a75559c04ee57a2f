"""``rigidjax fit``: the embedded synthetic default (truth known) and the shared real recordings
(checked against the pendulum moments in their README, measured independently of the flips)."""

import json
import math

import numpy as np
import pytest

from rigidjax.cli import build_parser, main

# README of ../shared/data/racquet-flips: pendulum moments (kg m^2, 1-sigma), phone axes
PENDULUM = {"Ix": (1.8816e-2, 5.68e-3), "Iy": (1.3911e-3, 7.6e-5), "Iz": (2.0703e-2, 3.84e-3)}


def _ratio(num, den="Iy"):
    """Pendulum ratio and its propagated 1-sigma (independent errors): README's ~13.5 +- 4, ~14.9 +- 3."""
    (a, sa), (b, sb) = PENDULUM[num], PENDULUM[den]
    r = a / b
    return r, r * math.hypot(sa / a, sb / b)


def test_pendulum_ratios_as_in_readme():
    # the README quotes Ix/Iy ~ 13.5 +- 4 and Iz/Iy ~ 14.9 +- 3
    assert _ratio("Ix") == pytest.approx((13.5, 4.2), abs=0.1)
    assert _ratio("Iz") == pytest.approx((14.9, 2.9), abs=0.1)


def test_help_lists_the_exit_codes(capsys):
    for cmd in ("fit", "fit-pendulum"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([cmd, "--help"])
        text = capsys.readouterr().out
        assert "exit status:" in text and "2  bad path, file or option" in text
        # only `fit` pools recordings, so only it can refuse recordings that disagree
        assert ("3  recordings whose estimates disagree" in text) == (cmd == "fit")


def test_embedded_default_recovers_truth(tmp_path, capsys):
    out = tmp_path / "fit.json"
    code = main(["fit", "--tosses", "3", "--starts", "2", "--json", str(out), "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "No PATH given: synthesised 3 tosses" in printed and "truth (synthetic)" in printed
    d = json.loads(out.read_text())
    assert d["mode"] == "joint" and d["status"] == "converged" and len(d["segments"]) == 3
    assert d["options"]["tensor"] and d["options"]["drag"] == "isotropic" and d["options"]["bias"]
    for key in ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "drag/Iy", "Ix", "Iz"):
        est, se, truth = d["estimates"][key], d["uncertainties"][key], d["truth"][key]
        assert abs(est - truth) < 4 * se, (key, est, se, truth)  # noise-implied uncertainty
        lo, hi = d["intervals"][key]
        assert lo <= truth <= hi
    assert d["uncertainties"]["Ix/Iy"] < 0.01 * d["truth"]["Ix/Iy"]
    # every estimated quantity with a truth is compared, bias and drag included
    z_line = next(line for line in printed.splitlines() if line.startswith("estimate - truth in standard errors"))
    for key in ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "drag/Iy", "drag", "misalignment_deg", "bias_x", "bias_y", "bias_z"):
        assert f" {key} " in z_line, (key, z_line)
    assert "± ?" not in printed


def test_demo_pulls_over_seeds(tmp_path):
    """Over fresh noise seeds, (estimate - truth) / standard error of the demo's joint fit must
    look like N(0, 1) (truth: the DOP853 recordings of rigidjax.synthetic). QA history: with 1
    sub-step the midpoint step's own error shifted the gyro bias by 3 standard errors; the
    automatic sub-steps keep every shift below 0.3."""
    import warnings

    from rigidjax.cli_fit import _z_scores
    from rigidjax.identify import fit_inertia
    from rigidjax.io import load_phyphox
    from rigidjax.synthetic import synthesize_recording

    keys = ("Ix/Iy", "Iz/Iy", "Ixy/Iy", "Ixz/Iy", "Iyz/Iy", "drag/Iy", "bias_x", "bias_y", "bias_z")
    pulls = []
    for seed in range(10, 15):  # seeds the other tests do not use; 3 tosses: padded to 128 samples like the demo test
        truth = synthesize_recording(tmp_path / str(seed), n_tosses=3, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # converged, and no warning
            fit = fit_inertia(
                load_phyphox(truth["path"]),
                tensor=True,
                drag="isotropic",
                bias=True,
                joint=True,
                starts=2,
                seed=seed,
                scale=("Iy", truth["Iy"]),
            )
        assert fit.converged
        assert fit.step_error["max_shift_se"] <= 0.3, fit.step_error
        z = _z_scores(fit, truth)
        pulls.append([z[k] for k in keys])
    pulls = np.array(pulls)  # (5 seeds, 9 quantities)
    # N(0,1): |z| < 4 for each of the 45 values (P ~ 6e-5 each)
    assert np.all(np.abs(pulls) < 4), pulls
    # per quantity, the RMS over 5 seeds: chi2(5)/5 exceeds 2.2^2 with P ~ 2e-4
    rms = np.sqrt(np.mean(pulls**2, axis=0))
    assert np.all(rms < 2.2), dict(zip(keys, rms))
    # pooled over all 45 (correlated within a seed, ~15 effective): RMS within [0.5, 1.6]
    assert 0.5 < np.sqrt(np.mean(pulls**2)) < 1.6, pulls


def test_real_flips_quick(racquet_dir, tmp_path, capsys):
    # one recording (round 2: five intermediate-axis tosses), principal moments along the phone axes
    rec = next((racquet_dir / "flips" / "round2").iterdir())
    out, png = tmp_path / "real.json", tmp_path / "fit plot.png"
    code = main(["fit", str(rec), "--json", str(out), "--plot", str(png), "--segment", "1", "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    d = json.loads(out.read_text())
    assert d["mode"] == "per-window" and len(d["segments"]) == 5 and d["status"] == "converged"
    for key in ("Ix", "Iz"):
        ref, sigma = _ratio(key)
        median = d["estimates"][f"{key}/Iy"]
        assert abs(median - ref) < sigma, (key, median, ref, sigma)  # within the pendulum's 1-sigma
        lo, hi = d["intervals"][f"{key}/Iy"]
        assert lo <= median <= hi and hi - lo > 4 * d["uncertainties"][f"{key}/Iy"]  # model error > noise
    # a gyroscope fit, not noise-level: the real residual is a few tenths of a rad/s out of ~10
    assert all(s["rms"] < 0.6 for s in d["segments"])
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_errors_exit_2(tmp_path, capsys):
    assert main(["fit", str(tmp_path / "nope"), "--quiet"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["fit", "--scale", "Iy", "--quiet"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    bad = tmp_path / "rec" / "Gyroscope rotation rate x"
    (bad / "meta").mkdir(parents=True)
    (bad / "Raw Data.csv").write_text('"Time (s)","Gyroscope x (rad/s)"\n0,1\n0.01,2\n')
    assert main(["fit", str(tmp_path / "rec"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "Raw Data.csv, line 1: missing column(s)" in err
    long = tmp_path / "long.csv"  # a 30 s window: not free flight
    long.write_text("t,wx,wy,wz\n" + "\n".join(f"{0.01 * i:.2f},1,2,3" for i in range(3000)))
    assert main(["fit", str(long), "--quiet"]) == 2
    assert "longer than the free-flight bound" in capsys.readouterr().err
    # output folders: created before the fit (like simulate --out), or exit 2 at once
    assert main(["fit", str(tmp_path / "nope"), "--json", str(tmp_path / "new" / "dir" / "f.json"), "--quiet"]) == 2
    assert (tmp_path / "new" / "dir").is_dir()
    capsys.readouterr()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["fit", str(long), "--plot", str(blocker / "x.png"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--plot" in err and "cannot create its folder" in err
    assert main(["fit", str(long), "--json", str(tmp_path), "--quiet"]) == 2  # a folder, not a file
    assert "--json" in capsys.readouterr().err
    deg = tmp_path / "deg.csv"  # a flip in deg/s
    deg.write_text("t,wx,wy,wz\n" + "\n".join(f"{0.01 * i:.2f},{20 * i},1100,30" for i in range(100)))
    assert main(["fit", str(deg), "--quiet"]) == 2
    assert "deg/s" in capsys.readouterr().err
    for argv, msg in (
        (["--starts", "0"], "--starts must be >= 1"),
        (["--max-rate", "-1"], "--max-rate must be > 0"),
        (["--substeps", "two"], "--substeps must be 'auto'"),
    ):
        assert main(["fit", *argv]) == 2
        assert msg in capsys.readouterr().err


@pytest.mark.slow
def test_all_real_flips(racquet_dir, capsys, tmp_path):
    """Every kept flip of the shared recordings (69 windows), per window and jointly, principal
    moments and full tensor + drag (``pytest -m slow tests/test_cli_fit.py``, ~2 min). Round 1
    is a different body (every toss ~3.7 / 4.6; the data README): its two recordings are
    named and not pooled (exit 3); the combined estimates of rounds 2-3 agree with the
    pendulum ratios, and their 95 % intervals cover the scatter (wider than the statistical)."""
    flips = str(racquet_dir / "flips")
    for extra in ([], ["--tensor", "--drag"], ["--joint"], ["--joint", "--tensor", "--drag"]):
        out = tmp_path / "fit.json"
        code = main(["fit", flips, "--quiet", "--json", str(out), *extra])
        printed = capsys.readouterr().out
        assert code == 3, (extra, printed[-2000:])
        assert printed.count("NOT POOLED: round1/") == 2
        d = json.loads(out.read_text())
        assert set(d["combined"]["sources"]) == {s["recording"] for s in d["segments"] if "round1" not in s["source"]}
        for key in ("Ix", "Iz"):
            ref, sigma = _ratio(key)
            est = d["estimates"][f"{key}/Iy"]
            lo, hi = d["intervals"][f"{key}/Iy"]
            assert abs(est - ref) < sigma and lo < est < hi and (hi - lo) > 2 * 1.96 * d["uncertainties"][f"{key}/Iy"]
        # pool anyway: exit 1 or 0, never 3
        assert main(["fit", flips, "--quiet", "--pool-all", *extra]) in (0, 1)
        capsys.readouterr()
