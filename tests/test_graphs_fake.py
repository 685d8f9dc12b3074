"""Graph replay on the fake CUDA driver (tests/fakecuda): the real capture, exec cache, update and
fallback code of the dispatch path, with the fake recording captured launches and replaying them
with their captured argument values. The scenarios run in one child interpreter
(tests/fakecuda/graphs_child.py); each is reported here as its own test. The GPU suite
(tests/gpu/test_graphs_gpu.py) repeats the correctness checks on a device."""

from __future__ import annotations

import json
import os
import pathlib

import fakecuda
import pytest

SCENARIOS = [
    "fixpoint_replays_one_graph_with_the_right_result",
    "graph_and_issued_paths_agree_for_1_2_and_100_iterations",
    "input_size_class_change_replays_the_right_graph",
    "pointer_changes_capture_then_update_in_place",
    "threads_dispatch_one_graphed_plan_concurrently",
    "one_launch_plans_measure_both_paths_and_keep_the_faster",
    "device_input_plans_replay_and_release_their_graphs",
    "failed_instantiation_falls_back_to_issuing_for_good",
    "failed_capture_ends_it_and_issues",
    "busy_stream_issues_once_and_keeps_the_plan_graphed",
    "failed_graph_launch_is_typed_and_the_backend_goes_on",
    "evicted_plans_destroy_their_execs",
    "bfs_cooperative_and_split_replay_equal_the_reference",
    "uncapturable_cooperative_launches_fall_back_and_stay_ordered",
]


@pytest.fixture(scope="module")
def graph_results(fake_libcuda, tmp_path_factory):
    seed = int.from_bytes(os.urandom(4), "little")
    child = pathlib.Path(fakecuda.__file__).with_name("graphs_child.py")
    proc = fakecuda.run_python(
        [str(child), str(seed)],
        fake_libcuda,
        timeout=600,
        VYRE_CUDA_CACHE_DIR=tmp_path_factory.getbasetemp() / "kernel-cache",
    )
    assert proc.returncode == 0, f"graph child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results.pop("_hook_errors") == []
    assert sorted(results) == sorted(SCENARIOS), "the scenario lists here and in the child differ"
    return results


@pytest.mark.parametrize("name", SCENARIOS)
def test_graph_scenario(graph_results, name):
    result = graph_results[name]
    assert result["ok"], result["error"]
