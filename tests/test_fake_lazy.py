"""The fake CUDA driver's lazy mode (tests/fakecuda/fake_libcuda.c): stream work deferred as late as
CUDA allows, so ordering bugs give wrong data on the CPU. The scenarios run in one child
interpreter on the fake (tests/fakecuda/lazy_child.py): raw driver-call sequences first (deferral,
event marks, waits, a missing wait caught), then the real CudaBackend's routes against numpy.
The resource-safety and graph-replay scenarios of tests/test_fake_driver.py and tests/test_graphs.py
run again with lazy mode on from the start (FAKE_CUDA_LAZY=1). Each scenario is its own test."""

from __future__ import annotations

import fakecuda
import pytest
import test_fake_driver
from helpers import scenarios

LAZY = {"FAKE_CUDA_LAZY": "1"}
CHILD = scenarios.FAKECUDA / "lazy_child.py"
AGAIN = {"safety": scenarios.FAKECUDA / "scenarios_child.py", "graphs": scenarios.FAKECUDA / "graphs_child.py"}


@pytest.fixture(scope="module")
def lazy_results(fake_libcuda, tmp_path_factory):
    # eager at load whatever the parent's environment says: the child turns lazy mode on itself
    return scenarios.run_scenarios(CHILD, fake_libcuda, tmp_path_factory, env={"FAKE_CUDA_LAZY": "0"})


@pytest.mark.parametrize("name", scenarios.declared(CHILD))
def test_lazy_scenario(lazy_results, name):
    result = lazy_results[name]
    assert result["ok"], result["error"]


def test_the_environment_turns_lazy_mode_on_at_load(fake_libcuda):
    # the previous setting, twice: what the library loaded with, then off
    code = (
        "import ctypes; lib = ctypes.CDLL('libcuda.so.1'); print(lib.fake_cuda_set_lazy(0), lib.fake_cuda_set_lazy(0))"
    )
    for env, want in (({"FAKE_CUDA_LAZY": ""}, "0 0"), (LAZY, "1 0"), ({"FAKE_CUDA_LAZY": "0"}, "0 0")):
        proc = fakecuda.run_python(["-c", code], fake_libcuda, timeout=60, **env)
        assert proc.returncode == 0 and proc.stdout.split()[-2:] == want.split(), (env, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def again_results(fake_libcuda, tmp_path_factory):
    return {
        key: scenarios.run_scenarios(child, fake_libcuda, tmp_path_factory, env=LAZY) for key, child in AGAIN.items()
    }


def _again(key, name):
    marks = test_fake_driver._marks(name) if key == "safety" else []  # its known defects stay known
    return pytest.param(key, name, marks=marks)


@pytest.mark.parametrize(
    "key, name", [_again(key, name) for key, child in AGAIN.items() for name in scenarios.declared(child)]
)
def test_existing_scenarios_pass_with_every_stream_op_deferred(again_results, key, name):
    result = again_results[key][name]
    scenarios.check(result)
