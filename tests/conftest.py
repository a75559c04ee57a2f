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
