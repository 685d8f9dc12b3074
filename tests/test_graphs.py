"""Graph replay: the decision to replay (planning.dispatch.plan_graph) and DispatchConfig.graph,
then the real capture, exec cache, update and fallback code of the dispatch path on the fake CUDA
driver (tests/fakecuda), which records captured launches and replays them with their captured
argument values. The fake-driver scenarios run in one child interpreter
(tests/fakecuda/graphs_child.py); each is reported here as its own test. The GPU suite
(tests/gpu/test_graphs_gpu.py) repeats the correctness checks on a device."""

from __future__ import annotations

import pytest
from helpers import scenarios

from vyre_cuda import DispatchConfig, ValidationError
from vyre_cuda.planning import dispatch as pd


# -- the decision and the option ---------------------------------------------------------------
@pytest.mark.parametrize(
    "iterations, route, phases, want",
    [
        (1, "regular", 1, False),  # one launch stays issued
        (3, "regular", 1, False),
        (4, "regular", 1, True),
        (100, "cooperative", 3, True),  # one cooperative launch per iteration
        (2, "split", 2, True),  # 2 iterations x 2 phases = 4 launches
        (1, "split", 3, False),
        (47, "split", 2, True),
        (10_001, "regular", 1, False),  # beyond the node cap
        (5_001, "split", 2, False),
    ],
)
def test_threshold_counts_launches_per_dispatch(monkeypatch, iterations, route, phases, want):
    monkeypatch.delenv("VYRE_CUDA_GRAPH_MIN_LAUNCHES", raising=False)
    graph, reason = pd.plan_graph(DispatchConfig(fixpoint_iterations=iterations), route, phases)
    launches = iterations * (phases if route == "split" else 1)
    assert graph is want and str(launches) in reason


def test_config_forces_on_and_off_within_the_cap(monkeypatch):
    monkeypatch.delenv("VYRE_CUDA_GRAPH_MIN_LAUNCHES", raising=False)
    assert pd.plan_graph(DispatchConfig(graph=True), "regular", 1) == (True, "DispatchConfig(graph=True)")
    off = pd.plan_graph(DispatchConfig(fixpoint_iterations=100, graph=False), "regular", 1)
    assert off == (False, "DispatchConfig(graph=False)")
    assert pd.plan_graph(DispatchConfig(fixpoint_iterations=20_000, graph=True), "regular", 1)[0] is False


@pytest.mark.parametrize(
    "raw, single, four", [("1", True, True), ("8", False, False), ("", False, True), ("x", False, True)]
)
def test_environment_moves_the_threshold(monkeypatch, raw, single, four):
    monkeypatch.setenv("VYRE_CUDA_GRAPH_MIN_LAUNCHES", raw)
    assert pd.plan_graph(DispatchConfig(), "regular", 1)[0] is single
    assert pd.plan_graph(DispatchConfig(fixpoint_iterations=4), "regular", 1)[0] is four


@pytest.mark.parametrize("bad", ["yes", 1, 0, 1.0])
def test_graph_option_must_be_a_bool_or_none(bad):
    with pytest.raises(ValidationError) as info:
        DispatchConfig(graph=bad)
    assert "graph must be True, False or None" in info.value.message and repr(bad) in info.value.message


def test_graph_option_is_part_of_the_plan_key():
    a, b = DispatchConfig(fixpoint_iterations=9), DispatchConfig(fixpoint_iterations=9, graph=False)
    assert a != b and hash(a) != hash(b) and DispatchConfig(graph=None) == DispatchConfig()


# -- replay on the fake driver -----------------------------------------------------------------
CHILD = scenarios.FAKECUDA / "graphs_child.py"
SCENARIOS = scenarios.declared(CHILD)


@pytest.fixture(scope="module")
def graph_results(fake_libcuda, tmp_path_factory):
    return scenarios.run_scenarios(CHILD, fake_libcuda, tmp_path_factory)


@pytest.mark.parametrize("name", SCENARIOS)
def test_graph_scenario(graph_results, name):
    result = graph_results[name]
    assert result["ok"], result["error"]
