"""Test configuration: float64 is enabled here, explicitly (the library never flips it)."""

import os
from pathlib import Path

import jax
import pytest

from rigidjax.cli_fit import NO_CACHE_ENV

jax.config.update("jax_enable_x64", True)

#: The shared measured data (not redistributed with rigidjax): ../shared/data beside the clone.
SHARED_DATA = Path(os.environ.get("RIGIDJAX_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
RACQUET = SHARED_DATA / "racquet-flips"


@pytest.fixture
def racquet_path():
    """Where the shared racquet recordings are looked for (present or not): for tests whose
    expectation depends on them without skipping."""
    return RACQUET


@pytest.fixture
def racquet_dir():
    """Path of the shared racquet recordings; skips with a clear message where absent."""
    if not RACQUET.is_dir():
        pytest.skip(
            f"shared racquet recordings not found at {RACQUET} (they are not redistributed with "
            "rigidjax; put the shared data beside the clone or set RIGIDJAX_SHARED_DATA)"
        )
    return RACQUET


@pytest.fixture(autouse=True)
def _no_compilation_cache(monkeypatch):
    """Every test: ``rigidjax.cli.main`` would point JAX's persistent compilation cache and the
    program store (rigidjax.identify.keep_programs) at the user's cache folder for the rest of
    the test process; off (tests/test_cli_fit.py checks the cache in a subprocess)."""
    monkeypatch.setenv(NO_CACHE_ENV, "1")


@pytest.fixture
def symlinks(tmp_path):
    """Skips the test where symbolic links cannot be made (Windows without the privilege)."""
    probe = tmp_path / ".symlink-probe"
    try:
        probe.symlink_to(tmp_path, target_is_directory=True)
    except (OSError, NotImplementedError) as e:
        pytest.skip(f"cannot create symbolic links here: {e}")
    probe.unlink()


#: Moments (kg m^2) of the calibration box of the slow interval-coverage tests.
CALIBRATION_MOMENTS = (2e-3, 3e-3, 4e-3)


@pytest.fixture
def calibration_recording(tmp_path):
    """``make(seed, **overrides) -> (segments, truth)``: a synthetic phyphox recording of 10
    tosses of a box (moments :data:`CALIBRATION_MOMENTS`, spun about its intermediate axis at
    6-9 rad/s), each toss seen through its own sensor misalignment (1-sigma 0.02 rad, not in
    any model: per-window model error, as on the racquet), loaded back; ``truth`` the
    ratios ``Ix/Iy``, ``Iz/Iy``. ``overrides``: more :func:`rigidjax.synthetic.synthesize_recording`
    arguments (e.g. the drag)."""
    from rigidjax.io import load_phyphox
    from rigidjax.synthetic import synthesize_recording

    M = CALIBRATION_MOMENTS

    def make(seed: int, **overrides):
        kw = dict(
            moments=M,
            misalignment=(0, 0, 0),
            window_misalignment=0.02,
            bias=(0, 0, 0),
            n_tosses=10,
            seed=seed,
            spin_axis=1,
            spin=(6.0, 9.0),
            toss_duration=1.1,
            rest=0.3,
        )
        rec = synthesize_recording(tmp_path / str(seed), **{**kw, **overrides})
        return load_phyphox(rec["path"]), {"Ix/Iy": M[0] / M[1], "Iz/Iy": M[2] / M[1]}

    return make
