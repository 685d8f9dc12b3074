"""GPU tests: marked `gpu`, skipped only when no driver or device is found.

VYRE_CUDA_REQUIRE_GPU=1 (set by scripts/gpu-check) turns those skips into failures.
"""

import os

import pytest

import vyre_cuda


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/gpu/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.gpu)


_STATUS = None


def _require_gpu():
    global _STATUS
    if _STATUS is None:
        _STATUS = vyre_cuda.driver_status()
    ok, why = _STATUS
    if not ok:
        if os.environ.get("VYRE_CUDA_REQUIRE_GPU") == "1":
            pytest.fail(f"VYRE_CUDA_REQUIRE_GPU=1 but no GPU is usable: {why}")
        pytest.skip(f"no CUDA driver/device: {why}")


@pytest.fixture(autouse=True)
def _gpu_required():
    _require_gpu()


@pytest.fixture(scope="session")
def backend():
    _require_gpu()
    b = vyre_cuda.CudaBackend(0)
    yield b
    b.close()


@pytest.fixture
def fresh_backend():
    _require_gpu()
    b = vyre_cuda.CudaBackend(0)
    yield b
    b.close()
