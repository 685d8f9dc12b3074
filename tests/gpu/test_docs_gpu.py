"""The documentation's GPU examples, each run on its own in a fresh interpreter on the GPU.

These are the ```python blocks of docs/ marked ``# needs a GPU`` (``python tests/docs_blocks.py``
lists them); tests/test_docs.py runs the others without a GPU. An example that imports CuPy or
torch asks for it as the other GPU tests do (missing under VYRE_CUDA_REQUIRE_GPU=1 is a failure).
"""

from __future__ import annotations

import os

import pytest
from docs_blocks import block_id, gpu_blocks, imported_modules

# what an example may import beyond numpy and vyre_cuda, and the fixture (or module) providing it
LIBRARIES = {"cupy": "cupy", "torch": "torch"}
DASK = ("dask", "distributed")


@pytest.mark.parametrize("block", gpu_blocks(), ids=block_id)
def test_gpu_example_runs(block, request, run_python, tmp_path):
    page, start, source = block
    used = imported_modules(source)
    for name in sorted(used & set(LIBRARIES)):
        request.getfixturevalue(LIBRARIES[name])
    if used & set(DASK):
        try:
            import distributed  # noqa: F401
        except ImportError as exc:
            if os.environ.get("VYRE_CUDA_REQUIRE_GPU") == "1":
                pytest.fail(f"VYRE_CUDA_REQUIRE_GPU=1 but the dask extra is not importable: {exc}")
            pytest.skip(f"the dask extra is not installed: {exc}")
    script = tmp_path / "example.py"
    script.write_text(source)
    out = run_python([str(script)], timeout=300)
    assert out.returncode == 0, f"{page} block at line {start} failed:\n{out.stdout[-2000:]}{out.stderr[-4000:]}"
