"""The fake CUDA driver's lazy mode (tests/fakecuda/fake_libcuda.c): stream work deferred as late as
CUDA allows, so ordering bugs give wrong data on the CPU. The scenarios run in one child
interpreter on the fake (tests/fakecuda/lazy_child.py): raw driver-call sequences first (deferral,
event marks, waits, a missing wait caught), then the real CudaBackend's routes against numpy.
Each scenario is reported here as its own test."""

from __future__ import annotations

import pytest
from helpers import scenarios

CHILD = scenarios.FAKECUDA / "lazy_child.py"
SCENARIOS = scenarios.declared(CHILD)


@pytest.fixture(scope="module")
def lazy_results(fake_libcuda, tmp_path_factory):
    return scenarios.run_scenarios(CHILD, fake_libcuda, tmp_path_factory)


@pytest.mark.parametrize("name", SCENARIOS)
def test_lazy_scenario(lazy_results, name):
    result = lazy_results[name]
    assert result["ok"], result["error"]
