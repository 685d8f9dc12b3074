"""Graph replay on the GPU: replayed launch sequences give the issued path's results and numpy's,
after inputs change size class, with many dispatches in flight from several threads, on the
regular, cooperative and host-split routes; telemetry counts the replays.

Run with ``-s`` to see the ``[graphs]`` lines (whether cooperative launches were captured on this
driver or fell back to issuing).
"""

import threading

import numpy as np
import pytest
from helpers.bfs import bfs_program, make_graph

from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program

# x[i] = 3 x[i] + 1 per launch (u32, wrapping): N launches give a value only exactly N launches
# with the right pointers give
_STEP = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(vyre_u32* x, const vyre_u32* params) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(params) && vyre_in_bounds(params, 0, i)) x[i] = x[i] * 3u + 1u;
}
"""
STEP = Program(Kernel.cuda(_STEP), [BufferDecl.read_write("x", 0, "u32")], workgroup_size=(256, 1, 1), name="step")
GRAPH_COUNTERS = ("graph_replays", "graph_captures", "graph_updates", "graph_fallbacks")


def _report(capsys, line):
    with capsys.disabled():
        print(f"\n[graphs] {line}", flush=True)


def step_reference(x, iterations):
    y = x.astype(np.uint64)
    for _ in range(iterations):
        y = (y * 3 + 1) % 2**32
    return y.astype(np.uint32)


def _u32(rng, n):
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


def _counters(backend):
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in GRAPH_COUNTERS}


def _delta(before, after):
    return {k: after[k] - before[k] for k in before}


@pytest.mark.parametrize("iterations", [1, 2, 100])
def test_fixpoint_graph_equals_issued_and_numpy(backend, rng, iterations):
    for _ in range(3):  # fresh data each time: a stale graph would replay old pointers
        x = _u32(rng, 10_000)
        want = step_reference(x, iterations)
        before = _counters(backend)
        (forced,) = backend.dispatch(STEP, [x], DispatchConfig(fixpoint_iterations=iterations, graph=True))
        d = _delta(before, _counters(backend))
        (issued,) = backend.dispatch(STEP, [x], DispatchConfig(fixpoint_iterations=iterations, graph=False))
        (auto,) = backend.dispatch(STEP, [x], DispatchConfig(fixpoint_iterations=iterations))
        np.testing.assert_array_equal(forced, want)
        np.testing.assert_array_equal(issued, want)
        np.testing.assert_array_equal(auto, want)
        assert d["graph_replays"] == 1 and d["graph_fallbacks"] == 0, d


def test_replay_after_input_size_class_changes(backend, rng):
    # new plans, new slab size classes, the ring path (above 512 KiB) and back to a cached plan
    sizes = [1000, 100_000, 300_000, 999, 1000, 300_000]
    before = _counters(backend)
    for n in sizes * 2:
        x = _u32(rng, n)
        (got,) = backend.dispatch(STEP, [x], DispatchConfig(fixpoint_iterations=9))
        np.testing.assert_array_equal(got, step_reference(x, 9), err_msg=f"n={n}")
    d = _delta(before, _counters(backend))
    assert d["graph_replays"] == 2 * len(sizes) and d["graph_fallbacks"] == 0, d


def test_pipelined_dispatches_update_graph_pointers(backend, rng):
    # more dispatches in flight than execs cached per plan: replays go through exec updates
    cfg = DispatchConfig(fixpoint_iterations=20)
    before = _counters(backend)
    for _ in range(3):
        xs = [_u32(rng, 4096) for _ in range(12)]
        pending = [backend.dispatch_async(STEP, [x], cfg) for x in xs]
        for x, p in zip(xs, pending):
            np.testing.assert_array_equal(p.result()[0], step_reference(x, 20))
    d = _delta(before, _counters(backend))
    assert d["graph_replays"] == 36 and d["graph_fallbacks"] == 0, d
    assert d["graph_updates"] > 0, d


def test_threads_with_dispatches_in_flight(backend, rng):
    errors = []
    seeds = rng.integers(0, 2**31, 8)

    def worker(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(10):
                xs = [_u32(r, int(r.choice([2000, 50_000]))) for _ in range(3)]
                its = [int(r.choice([4, 30])) for _ in xs]
                pending = [
                    backend.dispatch_async(STEP, [x], DispatchConfig(fixpoint_iterations=k)) for x, k in zip(xs, its)
                ]
                for x, k, p in zip(xs, its, pending):
                    if not np.array_equal(p.result()[0], step_reference(x, k)):
                        errors.append(f"wrong result n={x.size} iterations={k}")
        except Exception as exc:  # noqa: BLE001 (collected and asserted below)
            errors.append(repr(exc))

    before = _counters(backend)
    threads = [threading.Thread(target=worker, args=(int(s),)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    d = _delta(before, _counters(backend))
    assert d["graph_replays"] == 8 * 10 * 3 and d["graph_fallbacks"] == 0, d


def test_bfs_split_and_cooperative_replay_equal_issued_and_reference(backend, rng, capsys):
    g = make_graph(rng, n=4000, tail=40, unreachable=4)
    prog = bfs_program(g.n)
    k = g.depth + 1
    limit = backend.plan_info(prog, g.inputs, DispatchConfig(fixpoint_iterations=k)).route.resident_limit
    for grid, kind in ((None, "cooperative"), ((limit + 1,), "split")):
        issued = backend.dispatch(
            prog, g.inputs, DispatchConfig(fixpoint_iterations=k, grid_override=grid, graph=False)
        )
        cfg = DispatchConfig(fixpoint_iterations=k, grid_override=grid)
        assert backend.plan_info(prog, g.inputs, cfg).route.kind == kind
        for _ in range(3):
            before = _counters(backend)
            outs = backend.dispatch(prog, g.inputs, cfg)
            d = _delta(before, _counters(backend))
            for j, (got, want, ref) in enumerate(zip(outs, issued, g.expected(k))):
                np.testing.assert_array_equal(got, ref, err_msg=f"{kind} output {j}")
                np.testing.assert_array_equal(got, want, err_msg=f"{kind} output {j} vs issued")
            assert d["graph_replays"] + d["graph_fallbacks"] == 1, d
            if kind == "split":
                assert d["graph_replays"] == 1, d  # plain launches are always capturable
        _report(capsys, f"{kind}: {2 * k if kind == 'split' else k} launches; last dispatch {d}")


def test_dropped_plans_destroy_their_execs(fresh_backend, rng):
    x = _u32(rng, 5000)
    for n_its in (5, 6):
        (got,) = fresh_backend.dispatch(STEP, [x], DispatchConfig(fixpoint_iterations=n_its))
        np.testing.assert_array_equal(got, step_reference(x, n_its))
    assert fresh_backend.telemetry.snapshot()["graph_execs_live"] >= 2
    fresh_backend._core.clear_prepared()  # what a module eviction does
    assert fresh_backend.telemetry.snapshot()["graph_execs_live"] == 0
    (got,) = fresh_backend.dispatch(STEP, [x], DispatchConfig(fixpoint_iterations=5))
    np.testing.assert_array_equal(got, step_reference(x, 5))
    assert fresh_backend.telemetry.snapshot()["graph_execs_live"] == 1


def test_replay_on_a_callers_blocking_stream(backend, rng, cupy):
    # a caller's stream may be a blocking one: the launches are captured on the plan's own
    # non-blocking stream and the exec is launched on the caller's, ordered after its work
    s = cupy.cuda.Stream(non_blocking=False)
    cfg = DispatchConfig(fixpoint_iterations=12, stream=s)
    before = _counters(backend)
    for _ in range(3):
        x = _u32(rng, 50_000)
        with s:
            d_x = cupy.asarray(x)
        (got,) = backend.dispatch(STEP, [d_x], cfg)
        np.testing.assert_array_equal(got, step_reference(x, 12))
        np.testing.assert_array_equal(d_x.get(), x)  # a read-write device input is not modified
    d = _delta(before, _counters(backend))
    assert d["graph_replays"] == 3 and d["graph_captures"] >= 1 and d["graph_fallbacks"] == 0, d
    assert backend.telemetry.snapshot()["streams_live"] == 0


class _ForeignCapture:
    """A thread-local capture of a stream of the device's primary context on another thread, as
    CuPy's or torch's graph capture would make; ``steps`` gets each driver call's status."""

    def __init__(self, seconds):
        from cuda.bindings import driver as cu

        self.cu, self.seconds, self.steps, self.begun = cu, seconds, [], threading.Event()
        err, self.dev = cu.cuDeviceGet(0)
        err, self.ctx = cu.cuDevicePrimaryCtxRetain(self.dev)  # the capturing library's own reference
        assert int(err) == 0, err
        self.thread = threading.Thread(target=self._capture)

    def _capture(self):
        import time

        cu = self.cu
        cu.cuCtxSetCurrent(self.ctx)
        err, stream = cu.cuStreamCreate(1)
        self.steps.append(int(err))
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self.steps.append(int(cu.cuStreamBeginCapture(stream, mode)[0]))
        self.begun.set()
        time.sleep(self.seconds)
        err, graph = cu.cuStreamEndCapture(stream)
        self.steps.append(int(err))
        if int(err) == 0:
            cu.cuGraphDestroy(graph)
        self.steps.append(int(cu.cuStreamDestroy(stream)[0]))

    def __enter__(self):
        self.thread.start()
        assert self.begun.wait(10), self.steps
        return self

    def __exit__(self, *exc):
        self.thread.join()
        self.cu.cuDevicePrimaryCtxRelease(self.dev)


def _warm(backend, rng):
    from vyre_cuda import builtin_programs as bp

    prog = bp.vecadd_f32()
    a, b = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
    for _ in range(3):
        (out,) = backend.dispatch(prog, [a, b])
    assert np.array_equal(out, a + b)
    held = backend._core.resources.stats()
    assert held.device.allocated_bytes > 0 and held.pinned.allocated_bytes > 0, held
    return prog, a, b


def _freed(backend):
    after = backend._core.resources.stats()
    assert after.device.allocated_bytes == 0 and after.pinned.allocated_bytes == 0, after
    assert after.streams.streams_live == 0, after


def test_close_with_no_handle_held_leaves_a_graph_capture_elsewhere_alone(fresh_backend, rng, caplog):
    """The driver refuses a context synchronize while any stream of the context is being captured
    and breaks that capture. With no dispatch handle held nothing of the backend's runs, so close()
    frees everything without one: the capture ends intact (close() once logged the refusal and left
    its pools allocated, then retried it and broke the capture)."""
    import logging

    backend = fresh_backend
    _warm(backend, rng)
    with _ForeignCapture(0.5) as capture, caplog.at_level(logging.INFO, logger="vyre_cuda"):
        backend.close()
        during = list(capture.steps)
    assert capture.steps == [0, 0, 0, 0], capture.steps  # the capture was not broken
    assert during == [0, 0], during  # close() returned while it lasted
    _freed(backend)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_close_with_a_handle_held_waits_for_a_graph_capture_elsewhere(fresh_backend, rng, caplog):
    """A held handle's work may still run: close() waits for it with a context synchronize, which
    the driver refuses while the capture lasts (and breaks the capture with: the driver's rule); it
    retries until the capture ends, then frees; the handle's memory goes as it is dropped."""
    import logging
    import time

    from cuda.bindings import driver as cu

    backend = fresh_backend
    prog, a, b = _warm(backend, rng)
    pending = backend.dispatch_async(prog, [a, b])
    with _ForeignCapture(0.05) as capture, caplog.at_level(logging.INFO, logger="vyre_cuda"):
        t0 = time.monotonic()
        backend.close()
        waited = time.monotonic() - t0
    invalidated = int(cu.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
    assert capture.steps == [0, 0, invalidated, 0], capture.steps
    assert waited >= 0.03, waited  # close() returned only after the capture ended
    del pending
    _freed(backend)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_an_evicted_module_stays_loaded_for_a_plan_held_across_the_eviction(fresh_backend, rng):
    """Past the module cache's capacity the least recently planned module is evicted while a plan
    made from it may still be about to launch (another thread looked it up just before): the module
    stays loaded until that plan goes, and the eviction waits for nothing, so a graph capture on
    another thread ends intact (the eviction used to synchronise the context, breaking it)."""
    import gc

    from vyre_cuda import builtin_programs as bp
    from vyre_cuda._plan_miss import PlanMiss

    backend = fresh_backend
    backend._modules._capacity = 1
    prog, other = bp.vecadd_f32(), bp.vecadd("u32")
    a, b = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
    with pytest.raises(PlanMiss) as miss:
        backend._core.dispatch(prog, [a, b])
    (out,) = backend.dispatch(prog, [a, b])
    assert np.array_equal(out, a + b)
    held = backend._core.prepared_for(miss.value.key)
    assert held is not None
    x, y = (rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    with _ForeignCapture(0.3) as capture:
        (w,) = backend.dispatch(other, [x, y])  # loads a second module: the first is evicted
    assert capture.steps == [0, 0, 0, 0], capture.steps  # the capture was not broken
    assert np.array_equal(w, x + y)
    assert backend._core.prepared_for(miss.value.key) is None and backend._modules.evicted_held == 1
    a, b = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
    (out,) = backend._core.dispatch(prog, [a, b], None, held)  # launches from the evicted module
    assert np.array_equal(out, a + b)
    del held
    gc.collect()
    assert backend._modules.evicted_held == 0  # unloaded with its last plan
    (out,) = backend.dispatch(prog, [a, b])
    assert np.array_equal(out, a + b)
