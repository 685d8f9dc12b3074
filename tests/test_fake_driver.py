"""Resource safety of the real dispatch path on the fake CUDA driver (tests/fakecuda): driver
failures injected at each step of a dispatch give typed errors, recycle (or, when the stream
cannot be synchronised, write off) what the dispatch held, and leave the backend usable; close
frees everything and gives the context back. The scenarios run in one child interpreter
(tests/fakecuda/scenarios_child.py); each is reported here as its own test.
"""

from __future__ import annotations

import pytest
from helpers import scenarios

import vyre_cuda

# The input-length and launch-sizing rules and the resource fixes of the same change landed
# together; LaunchSizeWarning is exported from then on. Before it, the defects below are expected.
RULES_ENFORCED = hasattr(vyre_cuda, "LaunchSizeWarning")
FIXED_WITH_THE_RULES = {
    "trim_on_another_thread_frees_the_cached_memory",
    "failed_set_current_after_retain_gives_the_retain_back",
    "bf16_arrays_of_the_returned_dtype_are_accepted_as_inputs",
}
KNOWN_DEFECTS = {
    "trim_on_another_thread_frees_the_cached_memory": "CudaBackend.trim() frees without making the backend's "
    "context current and ignores each "
    "cuMemFree result: on a thread with no current context the pool forgets its blocks and the "
    "memory stays allocated (fix: make_current(self._ctx) first, check every free)",
    "failed_set_current_after_retain_gives_the_retain_back": "_driver.retain_primary_context keeps the retain "
    "when cuCtxSetCurrent fails (fix: release "
    "the primary context before raising)",
    "bf16_arrays_of_the_returned_dtype_are_accepted_as_inputs": "with ml_dtypes installed, bf16 outputs are "
    "numpy bfloat16 arrays, which export no buffer "
    "format: passing one back as an input is refused as 'does not expose the buffer protocol' "
    "(Core._lookup asks for PyBUF_FORMAT; backend._nbytes uses memoryview). Fix: for numpy "
    "arrays take the buffer of x.view(numpy.uint8) (or check x.dtype directly) and use x.nbytes",
}
CHILD = scenarios.FAKECUDA / "scenarios_child.py"
SCENARIOS = scenarios.declared(CHILD)


@pytest.fixture(scope="module")
def scenario_results(fake_libcuda, tmp_path_factory):
    return scenarios.run_scenarios(CHILD, fake_libcuda, tmp_path_factory)


def _marks(name):
    if name not in KNOWN_DEFECTS or (RULES_ENFORCED and name in FIXED_WITH_THE_RULES):
        return []
    return [pytest.mark.xfail(strict=True, reason=KNOWN_DEFECTS[name])]


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in SCENARIOS])
def test_scenario(scenario_results, name):
    result = scenario_results[name]
    scenarios.check(result)
