import os

import numpy as np
import pytest


@pytest.fixture
def rng():
    # fresh random data every run; the seed is printed on failure through the repr
    seed = int.from_bytes(os.urandom(4), "little")
    return np.random.default_rng(seed)


@pytest.fixture(autouse=True)
def _isolated_kernel_cache(tmp_path_factory, monkeypatch):
    # every test session compiles into its own cache folder, never the user's
    folder = tmp_path_factory.getbasetemp() / "kernel-cache"
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(folder))
