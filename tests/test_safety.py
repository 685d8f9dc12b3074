"""Safe to share: several backends and threads on one device, close() and trim() during work,
the page-locked array pool under threads, caller streams, handles that outlive close(), and
timeouts. Each case runs in its own child on the fake CUDA driver (tests/fakecuda/safety_child.py),
so a crash is that case's failure; the stress matrix runs tests/stress.py the same way.
"""

from __future__ import annotations

import json
import os
import pathlib

import fakecuda
import pytest

TESTS = pathlib.Path(__file__).resolve().parent
CASES = [
    "first_large_dispatches_on_many_threads_make_one_ring",
    "trim_in_a_loop_while_three_threads_dispatch",
    "page_locked_arrays_churn_while_another_thread_trims",
    "close_while_threads_dispatch_through_the_ring",
    "dropped_caller_streams_are_not_kept_alive",
    "close_with_a_pending_handle_gives_the_context_back_when_it_is_dropped",
    "pinned_arrays_on_a_missing_device_are_a_validation_error",
    "result_after_a_timeout_waits_for_the_end",
]


def _seed() -> int:
    fixed = os.environ.get("VYRE_CUDA_TEST_SEED", "").strip()
    return int(fixed, 0) if fixed else int.from_bytes(os.urandom(4), "little")


def _child(args, fake_libcuda, tmp_path_factory, timeout=300):
    proc = fakecuda.run_python(
        [str(a) for a in args],
        fake_libcuda,
        timeout=timeout,
        VYRE_CUDA_CACHE_DIR=tmp_path_factory.getbasetemp() / "kernel-cache",
    )
    # a crash (a signal: negative return code) or an exception is the case's failure
    assert proc.returncode == 0, f"child {args} exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", CASES)
def test_case(name, fake_libcuda, tmp_path_factory):
    seed = _seed()
    result = _child([TESTS / "fakecuda" / "safety_child.py", name, seed], fake_libcuda, tmp_path_factory)
    assert result["ok"], f"seed {seed}:\n{result['detail']}"


# (backends, threads per backend): 1-3 backends on one device, 1-4 threads each
MATRIX = [(1, 1), (1, 4), (2, 2), (3, 3)]


@pytest.mark.parametrize(("backends", "threads"), MATRIX, ids=[f"{b}x{t}" for b, t in MATRIX])
def test_stress(backends, threads, fake_libcuda, tmp_path_factory):
    """The short profile of the stress: every operation, every chaos action, outputs checked
    against numpy, nothing left behind (tests/stress.py runs the long one on a GPU)."""
    seed = _seed()
    res = _child(
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
        ],
        fake_libcuda,
        tmp_path_factory,
        timeout=600,
    )
    where = f"seed {seed}: {res}"
    assert res["wrong"] == 0 and res["errors"] == 0, where
    assert res["leaks"] == {}, where
    assert res["dispatches"] >= 100 and all(res["by_op"].values()), where
    assert res["trims"] and res["clears"] and res["pinned_arrays"], where
