import os

import numpy as np
import pytest

# Serial CPU kernels compile ~3x faster; tests that check parallel loops opt back in.
os.environ.setdefault("FUSETREE_CPU_PARALLEL", "0")
# the IR verifier checks every node built during the tests (and in their subprocesses)
os.environ.setdefault("FUSETREE_VERIFY", "1")

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, max_examples=60, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
settings.register_profile("long", max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def _has_gpu() -> bool:
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if any("gpu" in item.keywords for item in items) and not _has_gpu():
        skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh random generator per test; its seed is printed (shown with a failure's captured
    output) and FUSETREE_TEST_SEED=<seed> replays it."""
    seed = int(os.environ.get("FUSETREE_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"rng seed: {seed} (replay: FUSETREE_TEST_SEED={seed})")
    return np.random.default_rng(seed)
