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


def _library(name):
    # cupy and torch are part of the GPU machine's environment: missing there is a failure under
    # VYRE_CUDA_REQUIRE_GPU=1, like a missing GPU, not a skip
    import importlib
    import warnings

    _require_gpu()
    try:
        # the suite turns warnings into errors (pyproject filterwarnings); a third-party import
        # must not fail on its own deprecation warnings (torch's custom-op registration does)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except ImportError as exc:
        if os.environ.get("VYRE_CUDA_REQUIRE_GPU") == "1":
            pytest.fail(f"VYRE_CUDA_REQUIRE_GPU=1 but {name} is not importable: {exc}")
        pytest.skip(f"{name} is not installed: {exc}")


@pytest.fixture(scope="session")
def cupy():
    """The cupy module (device arrays and streams from a user's point of view)."""
    return _library("cupy")


@pytest.fixture(scope="session")
def torch():
    """The torch module, with CUDA available."""
    mod = _library("torch")
    if not mod.cuda.is_available():
        pytest.fail("torch is installed but torch.cuda.is_available() is False on a GPU machine")
    return mod


@pytest.fixture
def run_python():
    """``run_python(args, timeout)``: see _run_python."""
    return _run_python


def _run_python(args, timeout):
    """A fresh interpreter on the vyre_cuda under test (in place or installed), from a folder that
    cannot shadow it with an unbuilt checkout."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(vyre_cuda.__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args], cwd=root.parent, env=env, capture_output=True, text=True, timeout=timeout
    )
