import importlib.machinery
import os
import pathlib
import sys

import numpy as np
import pytest

# `python -m pytest` puts the current folder first on sys.path. In a checkout whose compiled core
# is not built in place (setup.py build_ext --inplace), that folder's vyre_cuda cannot run: drop
# it so the tests import the installed package, as plain `pytest` does.
_ROOT = pathlib.Path(__file__).resolve().parents[1]
_BUILT = tuple(importlib.machinery.EXTENSION_SUFFIXES)
if not any(f.name.endswith(_BUILT) for f in (_ROOT / "vyre_cuda").glob("_*")):
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or os.curdir).resolve() != _ROOT]


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
