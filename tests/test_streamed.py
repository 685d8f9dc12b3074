"""The streamed route on the fake CUDA driver (tests/fakecuda/streamed_child.py): chunk boundaries,
dtypes, static and read-write bindings, page-locked and pageable buffers, device outputs, async
dispatches with inputs clobbered after return, 16 in flight, 8 threads, faults mid-stream and
budgets, each checked against numpy. Every scenario runs twice: with the fake executing stream work
at once, and in its lazy mode, where work runs only when something waits for it, so an ordering
mistake (a staging slot refilled before its DMA ran, a missing event wait or join) gives wrong data.
"""

from __future__ import annotations

import fakecuda
import pytest
from helpers import scenarios

CHILD = scenarios.FAKECUDA / "streamed_child.py"
SCENARIOS = scenarios.declared(CHILD)
MODES = ["eager", "lazy"]


@pytest.fixture(scope="module", params=MODES)
def results(request, fake_libcuda, tmp_path_factory):
    if request.param == "lazy" and not hasattr(fakecuda.FakeDriver, "set_lazy"):
        pytest.skip("the fake driver has no lazy mode in this tree")
    seed = scenarios.seed()
    out = scenarios.run_child([CHILD, seed, request.param], fake_libcuda, tmp_path_factory)
    assert out.pop("_hook_errors") == [], f"emulation errors (seed {seed})"
    assert sorted(out) == sorted(SCENARIOS), f"the child (seed {seed}) ran other scenarios than it declares"
    return out


@pytest.mark.parametrize("name", SCENARIOS)
def test_streamed_scenario(results, name):
    result = results[name]
    scenarios.check(result)
