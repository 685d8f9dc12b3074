"""Safe to share: several backends and threads on one device, close() and trim() during work,
the page-locked array pool under threads, caller streams, handles that outlive close(), and
timeouts. Each case runs in its own child on the fake CUDA driver (tests/fakecuda/safety_child.py),
so a crash is that case's failure; the stress matrix runs tests/stress.py the same way.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
from helpers import scenarios, stress_matrix

TESTS = pathlib.Path(__file__).resolve().parent
CHILD = scenarios.FAKECUDA / "safety_child.py"
CASES = scenarios.declared(CHILD, "case")


@pytest.mark.parametrize("name", CASES)
def test_case(name, fake_libcuda, tmp_path_factory):
    seed = scenarios.seed()
    result = scenarios.run_child([CHILD, name, seed], fake_libcuda, tmp_path_factory, timeout=300)
    assert result["ok"], f"seed {seed}:\n{result['error']}"


# (backends, threads per backend): 1-3 backends on one device, 1-4 threads each
MATRIX = [(1, 1), (1, 4), (2, 2), (3, 3)]


@pytest.mark.parametrize(("backends", "threads"), MATRIX, ids=[f"{b}x{t}" for b, t in MATRIX])
def test_stress(backends, threads, fake_libcuda, tmp_path_factory):
    """The short profile of the stress: every operation, every chaos action, outputs checked
    against numpy, nothing left behind (tests/stress.py runs the long one on a GPU)."""
    _stress(backends, threads, fake_libcuda, tmp_path_factory)


def test_stress_with_graph_replays(fake_libcuda, tmp_path_factory):
    """The same with the graph-or-issued trial on, as on a GPU: each new plan's first dispatches
    capture and replay graphs while other threads close, trim and clear the plans under them."""
    res = _stress(3, 2, fake_libcuda, tmp_path_factory, env={"VYRE_CUDA_GRAPH_TRIAL": "1"})
    assert res["graph_replays"] > 0, res


def test_stress_with_shared_streams_and_graph_replays(fake_libcuda, tmp_path_factory):
    """The same with every backend's pool streams shared after 1 (``Knobs.stream_share_after``:
    any two dispatches in flight share one) and the graph trial on: captures keep off the shared
    streams, results stay right."""
    res = _stress(
        3, 2, fake_libcuda, tmp_path_factory, env={"VYRE_CUDA_GRAPH_TRIAL": "1"}, extra=["--share-streams", 1]
    )
    assert res["graph_replays"] > 0, res


def test_stress_with_completion_events_on_demand(fake_libcuda, tmp_path_factory):
    """The same with ``Knobs.fence_on_demand``: the caller-stream chains record their completion
    events when a result is first asked for (or at a drop), under close, trim and clear."""
    res = _stress(3, 2, fake_libcuda, tmp_path_factory, extra=["--fence-on-demand"])
    assert res["by_op"]["stream_chain"] > 0, res


def test_stress_under_the_free_checker(fake_libcuda, tmp_path_factory):
    """The same with tests/fakecuda/free_check.c preloaded: every free() of two pages or more is
    checked against the fake's registrations, so memory freed while registered (a stale
    registration, which misroutes DMA on a GPU) is a driver violation, reported as a leak."""
    import fakecuda

    checker = fakecuda.build_free_check(tmp_path_factory.getbasetemp() / "free-check")
    res = _stress(2, 3, fake_libcuda, tmp_path_factory, env={"LD_PRELOAD": str(checker)})
    assert res["registrations"] > 0, res


def _stress(backends, threads, fake_libcuda, tmp_path_factory, env=None, extra=()):
    seed = scenarios.seed()
    res = scenarios.run_child(
        [
            TESTS / "stress.py",
            "--fake",
            "--seed",
            seed,
            "--backends",
            backends,
            "--threads",
            threads,
            "--dispatches",
            240 // (backends * threads) + 30,
            "--max-mib",
            6,
            *extra,
        ],
        fake_libcuda,
        tmp_path_factory,
        timeout=600,
        env=env,
    )
    where = f"seed {seed}: {res}"
    assert res["wrong"] == 0 and res["errors"] == 0, where
    assert res["leaks"] == {}, where
    assert res["dispatches"] >= 100 and all(res["by_op"].values()), where
    assert res["trims"] and res["clears"] and res["pinned_arrays"], where
    return res


@pytest.mark.parametrize(("backends", "threads", "share", "fence"), stress_matrix.MATRIX, ids=stress_matrix.IDS)
def test_gpu_stress_configurations_parse_as_meant(backends, threads, share, fence):
    """Each GPU stress configuration's command line (tests/gpu/test_stress_gpu.py) is one the
    stress accepts, with the knobs the configuration names: a malformed one ran nothing there."""
    spec = importlib.util.spec_from_file_location("_stress_script", stress_matrix.STRESS)
    stress = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stress)
    args = stress.parser().parse_args(stress_matrix.child_args(7, backends, threads, 50, share, fence)[1:])
    assert (args.seed, args.backends, args.threads, args.dispatches) == (7, backends, threads, 50)
    assert (args.share_streams, args.fence_on_demand) == (share, fence)


def test_stress_with_stream_ordered_pools(fake_libcuda, tmp_path_factory):
    """The same on a device with stream-ordered pools (as every GPU it runs on): staged dispatches
    take their device slabs from the backend's pool while other threads close backends (each
    parks its pool for the next) and trim; no pool is used after it was destroyed."""
    res = _stress(3, 2, fake_libcuda, tmp_path_factory, env={"FAKE_CUDA_MEMPOOLS": "1"})
    assert res["closes"] > 0, res


def test_stress_in_lazy_mode_with_stream_ordered_pools(fake_libcuda, tmp_path_factory):
    """The same with the fake's lazy mode on (stream work runs only when something forces it, so
    a read or a free not ordered after the work it depends on gives wrong data or a violation):
    the configuration closest to a GPU, where both wrong results of one GPU stress run came from
    the staging-ring route, whose device slabs come from the stream-ordered pool."""
    res = _stress(2, 3, fake_libcuda, tmp_path_factory, env={"FAKE_CUDA_MEMPOOLS": "1"}, extra=["--lazy"])
    assert res["closes"] > 0, res
