"""Load a benchmark script as a module, leaving ``sys.path`` as it was."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_benchmark(name: str) -> types.ModuleType:
    """``benchmarks/<name>.py`` as a module. The scripts put the checkout first on ``sys.path`` so
    they run from a checkout without installing; a test run against an installed wheel must not
    keep that (processes it spawns, Dask workers, would then import the checkout's unbuilt
    ``vyre_cuda``), so the path is restored after the import."""
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    saved = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module
