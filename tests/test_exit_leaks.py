"""Nothing the driver allocated outlives the process's exit: compute-sanitizer's leak check,
which users run over their own programs, must list nothing of vyre_cuda's. Each shape of script
(backend closed or not, a page-locked array kept in a global, in a cycle, or by a reference
never dropped) runs in a child on the fake driver, which writes what is still allocated once the
interpreter has finalized (tests/gpu/test_exit_leaks_gpu.py runs the real leak check)."""

from __future__ import annotations

import pathlib

import pytest
from helpers import scenarios

CHILD = scenarios.FAKECUDA / "exit_child.py"


@pytest.mark.parametrize("shape", ["closed", "open", "open_dropped", "cycle", "leaked_ref"])
def test_nothing_allocated_after_exit(shape, fake_libcuda, tmp_path_factory):
    report = pathlib.Path(tmp_path_factory.mktemp("exit")) / "left.txt"
    result = scenarios.run_child([CHILD, shape], fake_libcuda, tmp_path_factory, env={"FAKE_CUDA_EXIT_REPORT": report})
    assert result["ok"]
    host_allocs, host_bytes, device_allocs, device_bytes = map(int, report.read_text().split())
    assert (host_allocs, host_bytes) == (0, 0), f"{host_allocs} page-locked blocks ({host_bytes} bytes) left at exit"
    assert (device_allocs, device_bytes) == (0, 0), f"{device_allocs} device blocks ({device_bytes} bytes) left at exit"
