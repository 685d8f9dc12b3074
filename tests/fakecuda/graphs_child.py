"""Child of tests/test_graphs.py: graph replay on a real CudaBackend over the fake driver.

The fake records launches made while a stream captures and replays them, with the captured
argument values, at cuGraphLaunch, so a wrong pointer baked into a graph gives a wrong result
here. Prints one JSON object: scenario name -> {"ok": bool, "error": text, "skipped": None}
(tests/helpers/scenarios.py).
"""

from __future__ import annotations

import sys
import threading

import numpy as np
from helpers.bfs import INF, bfs_program, csr, python_bfs
from helpers.programs import cleared
from helpers.scenarios import Scenarios

import vyre_cuda as vc
from fakecuda import FakeDriver, array_at
from vyre_cuda import DispatchConfig
from vyre_cuda import builtin_programs as bp

RNG = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
ACC = cleared(bp.vecadd("u32"))  # the emulation accumulates: out starts at zero
SCENARIOS = Scenarios()
scenario = SCENARIOS.register


def accumulate(launch):
    """The emulated kernel adds a + b into out on every launch: after N launches out = N(a + b),
    so a launch replayed with a stale pointer, a lost launch or an extra one shows."""
    n = int(launch.words(launch.arg(3), 1)[0])
    a, b, out = (array_at(launch.arg(k), np.uint32, n) for k in range(3))
    out += a + b


def pair(n):
    return (RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32) for _ in range(2))


def expect(a, b, iterations):
    return (a.astype(np.uint64) + b) * iterations % 2**32


def acc_backend(fake, sizes=(1000,)):
    backend = vc.CudaBackend(0)
    for n in sizes:
        a, b = pair(n)
        fake.emulate(backend, ACC, [a, b], accumulate)
    return backend


def counters(backend):
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in ("graph_replays", "graph_captures", "graph_updates", "graph_fallbacks")}


def delta(before, after):
    return {k: after[k] - before[k] for k in before}


def check(backend, n, iterations, graph=None, via="dispatch"):
    a, b = pair(n)
    cfg = DispatchConfig(fixpoint_iterations=iterations, graph=graph)
    if via == "async":
        (out,) = backend.dispatch_async(ACC, [a, b], cfg).result()
    elif via == "timed":
        (out,) = backend.dispatch_timed(ACC, [a, b], cfg).outputs
    else:
        (out,) = backend.dispatch(ACC, [a, b], cfg)
    assert np.array_equal(out, expect(a, b, iterations)), f"n={n} iterations={iterations} graph={graph} {via}"


def prepared(backend, n, iterations, graph=None):
    a, b = pair(n)
    key = (ACC, DispatchConfig(fixpoint_iterations=iterations, graph=graph), a.nbytes, b.nbytes)
    return backend._core.prepared_for(key)


# ------------------------------------------------------------------ replay
@scenario
def fixpoint_replays_one_graph_with_the_right_result(fake):
    backend = acc_backend(fake)
    info = backend.plan_info(ACC, list(pair(1000)), DispatchConfig(fixpoint_iterations=100))
    assert info.graph and "100 launches" in info.graph_reason, info.graph_reason
    assert not backend.plan_info(ACC, list(pair(1000))).graph  # one launch: issued by default
    before, fb = counters(backend), fake.stats()
    for via in ("dispatch", "dispatch", "async", "timed", "dispatch"):
        check(backend, 1000, 100, via=via)
    d, fd = delta(before, counters(backend)), delta(fb, fake.stats())
    assert d["graph_replays"] == 5 and d["graph_fallbacks"] == 0, d
    # the pool is LIFO: a blocking loop gets its slab back, so captures stay at the slab count
    assert 1 <= d["graph_captures"] <= 2 and d["graph_updates"] == 0, d
    assert fd["graph_launches"] == 5 and fd["launches"] == 500, fd
    assert prepared(backend, 1000, 100).graph_execs == d["graph_captures"]
    backend.close()
    assert fake.stats()["graph_execs"] == 0 and fake.stats()["graphs"] == 0, fake.stats()


@scenario
def graph_and_issued_paths_agree_for_1_2_and_100_iterations(fake):
    backend = acc_backend(fake)
    for iterations in (1, 2, 3, 4, 100):
        for graph in (True, False, None):
            check(backend, 1000, iterations, graph)
    snap = backend.telemetry.snapshot()
    assert snap["graph_fallbacks"] == 0 and snap["graph_replays"] >= 5 + 2, snap
    backend.close()
    assert fake.stats()["graph_execs"] == 0


@scenario
def input_size_class_change_replays_the_right_graph(fake):
    sizes = (1000, 5000, 70_000, 999, 1000)  # new plans, new slab classes, and back
    backend = acc_backend(fake, sizes)
    for n in sizes * 2:
        check(backend, n, 7)
    snap = backend.telemetry.snapshot()
    assert snap["graph_replays"] == 2 * len(sizes) and snap["graph_fallbacks"] == 0, snap
    backend.close()
    assert fake.stats()["graph_execs"] == 0


@scenario
def pointer_changes_capture_then_update_in_place(fake):
    # dispatches held in flight each own a slab: every one needs its own pointers in the graph
    backend = acc_backend(fake)
    before = counters(backend)
    for _ in range(3):
        inputs = [tuple(pair(1000)) for _ in range(12)]
        pending = [backend.dispatch_async(ACC, list(ab), DispatchConfig(fixpoint_iterations=5)) for ab in inputs]
        for (a, b), p in zip(inputs, pending):
            (out,) = p.result()
            assert np.array_equal(out, expect(a, b, 5)), "a graph ran with another dispatch's pointers"
    d = delta(before, counters(backend))
    assert d["graph_replays"] == 36 and d["graph_fallbacks"] == 0, d
    assert d["graph_captures"] == 8, d  # the per-plan cache holds 8 execs ...
    assert d["graph_updates"] >= 4 and fake.stats()["exec_updates"] >= 4, d  # ... then updates them
    assert prepared(backend, 1000, 5).graph_execs == 8
    backend.close()
    assert fake.stats()["graph_execs"] == 0


@scenario
def threads_dispatch_one_graphed_plan_concurrently(fake):
    backend = acc_backend(fake, (1000, 3000))
    errors = []

    def worker(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(15):
                n = int(r.choice([1000, 3000]))
                check(backend, n, int(r.choice([4, 9])))
        except Exception as exc:  # noqa: BLE001 (reported to the parent)
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors
    snap = backend.telemetry.snapshot()
    assert snap["graph_replays"] == 90 and snap["graph_fallbacks"] == 0, snap
    backend.close()
    assert fake.stats()["graph_execs"] == 0


# ------------------------------------------------------------------ the one-launch trial
@scenario
def one_launch_plans_measure_both_paths_and_keep_the_faster(fake):
    import os

    os.environ["VYRE_CUDA_GRAPH_TRIAL"] = "1"  # (the fake runner turns the trial off)
    try:
        for slow_launch, slow_graph, kept in ((300, 0, "graph"), (0, 300, "issued")):
            backend = acc_backend(fake)
            fake.set_launch_delays(slow_launch, slow_graph)
            info = backend.plan_info(ACC, list(pair(1000)))
            assert not info.graph and info.graph_trial and "measured" in info.graph_reason, info
            before = counters(backend)
            check(backend, 1000, 1, via="async")  # undecided: an async dispatch issues
            assert counters(backend)["graph_replays"] == before["graph_replays"]
            p = prepared(backend, 1000, 1)
            trial = p.graph_trial_left
            assert trial > 0 and p.graph_choice is None
            for _ in range(trial):  # every result right on both paths
                check(backend, 1000, 1)
            d = delta(before, counters(backend))
            assert d["graph_replays"] == trial // 2 and d["graph_fallbacks"] == 0, d
            assert p.graph_trial_left == 0 and p.graph_choice.startswith(kept), p.graph_choice
            assert p.graphed == (kept == "graph")
            before = counters(backend)
            for via in ("dispatch", "async", "dispatch"):
                check(backend, 1000, 1, via=via)
            replays = counters(backend)["graph_replays"] - before["graph_replays"]
            assert replays == (3 if kept == "graph" else 0), (kept, replays)
            fake.set_launch_delays(0, 0)
            backend.close()
            assert fake.stats()["graph_execs"] == 0
    finally:
        fake.set_launch_delays(0, 0)
        os.environ["VYRE_CUDA_GRAPH_TRIAL"] = "0"


@scenario
def device_input_plans_replay_and_release_their_graphs(fake):
    # a plan keyed on device inputs replays like any other, and close() destroys its execs
    backend = acc_backend(fake)
    dev = DispatchConfig(outputs="device")
    for _ in range(2):
        a, b = pair(1000)
        (da,) = backend.dispatch(ACC, [a, np.zeros_like(a)], dev)  # a DeviceArray holding a
        before = counters(backend)
        (out,) = backend.dispatch(ACC, [da, b], DispatchConfig(fixpoint_iterations=7))
        assert np.array_equal(out, expect(a, b, 7)), "device-input replay"
        assert delta(before, counters(backend))["graph_replays"] == 1
    assert fake.stats()["graph_execs"] >= 1
    backend.close()
    assert fake.stats()["graph_execs"] == 0 and fake.stats()["graphs"] == 0, fake.stats()


# ------------------------------------------------------------------ fallback and failures
@scenario
def failed_instantiation_falls_back_to_issuing_for_good(fake):
    backend = acc_backend(fake)
    fake.fail("cuGraphInstantiateWithFlags", "CUDA_ERROR_NOT_SUPPORTED")
    before, fb = counters(backend), fake.stats()
    check(backend, 1000, 50)
    check(backend, 1000, 50)
    d, fd = delta(before, counters(backend)), delta(fb, fake.stats())
    assert d == {"graph_replays": 0, "graph_captures": 0, "graph_updates": 0, "graph_fallbacks": 2}, d
    assert fd["graph_launches"] == 0 and fd["launches"] == 100, fd
    p = prepared(backend, 1000, 50)
    assert not p.graphed and p.graph_execs == 0
    assert fake.stats()["graphs"] == 0  # the captured graph was destroyed
    check(backend, 1000, 60)  # another plan still replays
    assert counters(backend)["graph_replays"] == 1
    backend.close()
    assert fake.stats()["graph_execs"] == 0


@scenario
def failed_capture_ends_it_and_issues(fake):
    # a launch that cannot be captured (the fake does not know the function's arguments) ends
    # the capture cleanly; the dispatch issues its launches and gives the right result
    backend = acc_backend(fake)
    a, b = pair(1000)
    info = backend.plan_info(ACC, [a, b])
    fake.lib.fake_cuda_set_arg_count(__import__("ctypes").c_void_p(info.function), 0)
    check(backend, 1000, 20)
    assert counters(backend)["graph_fallbacks"] == 1 and counters(backend)["graph_replays"] == 0
    assert fake.stats()["graphs"] == 0
    check(backend, 1000, 20, via="async")  # the stream left capture mode: it works normally
    backend.close()


@scenario
def busy_stream_issues_once_and_keeps_the_plan_graphed(fake):
    backend = acc_backend(fake)
    fake.fail("cuStreamBeginCapture", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
    check(backend, 1000, 10)
    check(backend, 1000, 10)
    c = counters(backend)
    assert c["graph_fallbacks"] == 1 and c["graph_replays"] == 1 and c["graph_captures"] == 1, c
    assert prepared(backend, 1000, 10).graphed
    backend.close()


@scenario
def failed_graph_launch_is_typed_and_the_backend_goes_on(fake):
    backend = acc_backend(fake)
    check(backend, 1000, 10)
    fake.fail("cuGraphLaunch", "CUDA_ERROR_INVALID_VALUE")
    a, b = pair(1000)
    try:
        backend.dispatch(ACC, [a, b], DispatchConfig(fixpoint_iterations=10))
    except vc.DispatchFailed as exc:
        assert exc.call == "cuGraphLaunch" and exc.status == "CUDA_ERROR_INVALID_VALUE", exc
        assert str(exc).splitlines()[-1].startswith("Fix: ")
    else:
        raise AssertionError("the failed graph launch did not raise")
    snap = backend.telemetry.snapshot()
    assert snap["leaked_allocations"] == 0 and snap["streams_live"] == 0, snap
    check(backend, 1000, 10)
    backend.close()
    assert fake.stats()["graph_execs"] == 0


@scenario
def evicted_plans_destroy_their_execs(fake):
    backend = acc_backend(fake, (1000, 2000))
    check(backend, 1000, 10)
    check(backend, 2000, 10)
    assert fake.stats()["graph_execs"] >= 2
    assert backend.telemetry.snapshot()["graph_execs_live"] == fake.stats()["graph_execs"]
    backend._core.clear_prepared()  # what a module eviction does
    assert fake.stats()["graph_execs"] == 0 and backend.telemetry.snapshot()["graph_execs_live"] == 0
    check(backend, 1000, 10)  # planned again, captured again
    assert fake.stats()["graph_execs"] == 1
    backend.close()
    assert fake.stats()["graph_execs"] == 0 and fake.stats()["graphs"] == 0


# ------------------------------------------------------------------ grid-sync routes
def bfs_emulation(launch):
    """tests/gpu/kernels/bfs.cu in numpy: the phases [begin, end) of the params block's last two
    words (a cooperative launch runs both, a host-split one each)."""
    params = launch.arg(5)
    n = int(launch.words(params, 4)[3])  # word binding + 1: dist's element count
    begin, end = (int(w) for w in launch.words(params, 8)[6:8])
    row_ptr = array_at(launch.arg(0), np.uint32, n + 1)
    col_idx = array_at(launch.arg(1), np.uint32, int(row_ptr[-1]))
    dist, nxt, state = array_at(launch.arg(2), np.uint32, n), array_at(launch.arg(3), np.uint32, n), None
    state = array_at(launch.arg(4), np.uint32, 3)
    for ph in range(begin, end):
        if ph == 0:
            state[1] = 0
            d = dist.astype(np.int64)
            nb = np.where(d[col_idx] == INF, INF, d[col_idx] + 1)
            best = d.copy()
            for v in range(n):
                lo, hi = row_ptr[v], row_ptr[v + 1]
                if hi > lo:
                    best[v] = min(best[v], nb[lo:hi].min())
            nxt[:] = best.astype(np.uint32)
        else:
            commits = int(np.count_nonzero(nxt != dist))
            dist[:] = nxt
            if commits:
                state[2] += commits
                state[1] = 1
            state[0] += 1


def bfs_case(n=300):
    src = RNG.integers(0, n - 20, 3 * n)
    dst = RNG.integers(0, n - 20, 3 * n)
    path = np.arange(n - 20, n)  # a tail path for depth
    src = np.concatenate([src, [0], path[:-1]])
    dst = np.concatenate([dst, [path[0]], path[1:]])
    row_ptr, col_idx = csr(n, np.concatenate([src, dst]), np.concatenate([dst, src]))
    dist0 = np.full(n, INF, np.uint32)
    dist0[0] = 0
    return [row_ptr, col_idx, dist0], python_bfs(row_ptr, col_idx)


def bfs_expected(ref, k):
    dist = np.where(ref <= k, ref, np.uint32(INF)).astype(np.uint32)
    commits = int(np.count_nonzero((ref >= 1) & (ref <= k)))
    return [dist, dist.copy(), np.array([k, int(np.any(ref == k)), commits], np.uint32)]


@scenario
def bfs_cooperative_and_split_replay_equal_the_reference(fake):
    n = 300
    prog = bfs_program(n)
    inputs, ref = bfs_case(n)
    backend = vc.CudaBackend(0)
    info = backend.plan_info(prog, inputs, DispatchConfig(fixpoint_iterations=47))
    fake.emulate(backend, prog, inputs, bfs_emulation, DispatchConfig(fixpoint_iterations=47))
    R = info.route.resident_limit
    assert info.route.kind == "cooperative" and info.graph, info.route
    for grid, kind in ((None, "cooperative"), ((R + 1,), "split")):
        for graph in (None, False, None):
            cfg = DispatchConfig(fixpoint_iterations=47, grid_override=grid, graph=graph)
            assert backend.plan_info(prog, inputs, cfg).route.kind == kind
            before, fb = counters(backend), fake.stats()
            outs = backend.dispatch(prog, inputs, cfg)
            for k, (got, want) in enumerate(zip(outs, bfs_expected(ref, 47))):
                assert np.array_equal(got, want), f"{kind} graph={graph} output {k}"
            d, fd = delta(before, counters(backend)), delta(fb, fake.stats())
            launches = 47 if kind == "cooperative" else 94
            assert fd["launches"] == launches, (kind, fd)
            assert d["graph_replays"] == (graph is None) and d["graph_fallbacks"] == 0, (kind, graph, d)
            assert fd["graph_launches"] == (graph is None), (kind, fd)
            if kind == "cooperative":  # the barrier resets are graph nodes (or issued memsets)
                assert fd["cooperative_launches"] == 47 and fd["memsets"] >= 47, fd
    backend.close()
    assert fake.stats()["graph_execs"] == 0


@scenario
def uncapturable_cooperative_launches_fall_back_and_stay_ordered(fake):
    # a driver that cannot capture cooperative launches: the cooperative plan issues (with its
    # barrier resets, audit and ordering event), the host-split plan of the same program replays
    n = 300
    prog = bfs_program(n)
    inputs, ref = bfs_case(n)
    backend = vc.CudaBackend(0)
    fake.emulate(backend, prog, inputs, bfs_emulation, DispatchConfig(fixpoint_iterations=47))
    R = backend.plan_info(prog, inputs, DispatchConfig(fixpoint_iterations=47)).route.resident_limit
    fake.lib.fake_cuda_set_capture_cooperative(0)
    try:
        for grid, kind in ((None, "cooperative"), ((R + 1,), "split"), (None, "cooperative")):
            cfg = DispatchConfig(fixpoint_iterations=47, grid_override=grid)
            before, fb = counters(backend), fake.stats()
            pending = [backend.dispatch_async(prog, inputs, cfg) for _ in range(2)]
            for p in pending:
                for k, (got, want) in enumerate(zip(p.result(), bfs_expected(ref, 47))):
                    assert np.array_equal(got, want), f"{kind} output {k}"
            d, fd = delta(before, counters(backend)), delta(fb, fake.stats())
            if kind == "cooperative":
                assert d["graph_fallbacks"] == 2 and d["graph_replays"] == 0, d
                assert fd["graph_launches"] == 0 and fd["cooperative_launches"] == 94 and fd["memsets"] >= 94, fd
            else:
                assert d["graph_replays"] == 2 and d["graph_fallbacks"] == 0, d
        info_key = (prog, DispatchConfig(fixpoint_iterations=47), *(x.nbytes for x in inputs))
        assert not backend._core.prepared_for(info_key).graphed
        assert fake.stats()["graphs"] == 0
    finally:
        fake.lib.fake_cuda_set_capture_cooperative(1)
    backend.close()
    assert fake.stats()["graph_execs"] == 0


if __name__ == "__main__":
    SCENARIOS.main(FakeDriver())
