"""Graph replay on the fake CUDA driver (tests/fakecuda): the real capture, exec cache, update and
fallback code of the dispatch path, with the fake recording captured launches and replaying them
with their captured argument values. The scenarios run in one child interpreter
(tests/fakecuda/graphs_child.py); each is reported here as its own test. The GPU suite
(tests/gpu/test_graphs_gpu.py) repeats the correctness checks on a device."""

from __future__ import annotations

import pytest
from helpers import scenarios

CHILD = scenarios.FAKECUDA / "graphs_child.py"
SCENARIOS = scenarios.declared(CHILD)


@pytest.fixture(scope="module")
def graph_results(fake_libcuda, tmp_path_factory):
    seed = scenarios.seed()
    results = scenarios.run_scenarios(CHILD, fake_libcuda, tmp_path_factory, seed)
    assert sorted(results) == sorted(SCENARIOS), f"the child (seed {seed}) ran other scenarios than it declares"
    return results


@pytest.mark.parametrize("name", SCENARIOS)
def test_graph_scenario(graph_results, name):
    result = graph_results[name]
    assert result["ok"], result["error"]
