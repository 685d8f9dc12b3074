"""Child of tests/test_safety.py: one thread-safety or lifetime case per process, on the fake CUDA
driver (so a crash before a fix is that case's failure, not the suite's).

    python safety_child.py <case> <seed>

Prints one JSON object: {"ok": bool, "error": text, "skipped": None} (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time
import weakref

import numpy as np
from helpers.scenarios import LIVE, Scenarios, live

import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp
from vyre_cuda import hostmem

VECADD = bp.vecadd_f32()
CASES = Scenarios()
case = CASES.register
FAKE = FakeDriver()
RNG = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 0)


def backend(**kw):
    b = vc.CudaBackend(0, **kw)
    x = np.zeros(16, np.float32)
    FAKE.emulate(b, VECADD, [x, x], vecadd_emulation(np.float32))
    return b


def pair(n):
    return RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)


def on_threads(n, fn):
    """Run fn(i) on n threads started together; re-raise the first exception."""
    errors = []
    barrier = threading.Barrier(n)

    def run(i):
        try:
            barrier.wait()
            fn(i)
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


@case
def first_large_dispatches_on_many_threads_make_one_ring():
    # eight threads' first staged dispatches arrive together: one ring, every window from it
    for _ in range(3):
        g = backend(staging_chunk_bytes=1 << 20, staging_chunks=2)
        data = [pair(1 << 20) for _ in range(8)]
        wrong = []

        def work(i, g=g, data=data, wrong=wrong):
            a, b = data[i]
            (out,) = g.dispatch(VECADD, [a, b])
            if not np.array_equal(out, a + b):
                wrong.append(int(np.count_nonzero(out != a + b)))

        on_threads(8, work)
        rings = g._core.xfer.pinned_alloc_calls
        g.close()
        assert not wrong, f"wrong elements per thread: {wrong}"
        assert rings == 1, f"{rings} staging rings were allocated for one backend"


@case
def trim_in_a_loop_while_three_threads_dispatch():
    g = backend(staging_chunk_bytes=1 << 20, staging_chunks=2)
    stop = threading.Event()
    trims = [0]
    wrong = []

    def trimmer():
        while not stop.is_set():
            g.trim()
            trims[0] += 1

    def work(i):
        rng = np.random.default_rng(i)
        for k in range(150):
            n = int(rng.integers(1, 600_000)) if k % 3 else 1_000
            a, b = pair(n)
            (out,) = g.dispatch(VECADD, [a, b])
            if not np.array_equal(out, a + b):
                wrong.append(n)

    t = threading.Thread(target=trimmer)
    t.start()
    try:
        on_threads(3, work)
    finally:
        stop.set()
        t.join()
    snap = g.telemetry.snapshot()
    g.close()
    assert not wrong, f"wrong results at sizes {wrong[:5]}"
    assert trims[0] > 10, f"only {trims[0]} trims ran"
    assert snap["device_pool_live_bytes"] == 0 and snap["streams_live"] == 0, snap


@case
def page_locked_arrays_churn_while_another_thread_trims():
    base = FAKE.stats()
    stop = threading.Event()
    bad = []

    def trimmer():
        while not stop.is_set():
            hostmem.trim_pinned_pool()

    def churn(i):
        rng = np.random.default_rng(100 + i)
        for _ in range(1500):
            n = int(rng.integers(1, 1 << 20))
            x = vc.pinned_empty(n, np.uint8)
            x[:] = i + 1
            if not (x == i + 1).all():
                bad.append(n)
            del x

    t = threading.Thread(target=trimmer)
    t.start()
    try:
        on_threads(2, churn)
    finally:
        stop.set()
        t.join()
    gc.collect()
    stats = hostmem.pinned_pool_stats()
    assert not bad, f"arrays that lost their bytes: {bad[:5]}"
    assert stats["live_bytes"] == 0, stats
    hostmem.trim_pinned_pool()
    stats = hostmem.pinned_pool_stats()
    assert stats["cached_bytes"] == 0 and stats["allocated_bytes"] == 0, stats
    after = FAKE.stats()
    assert after["violations"] == base["violations"], FAKE.last_violation()
    assert after["host_allocs"] == base["host_allocs"], (
        f"{after['host_allocs'] - base['host_allocs']} page-locked allocations never freed"
    )


@case
def close_while_threads_dispatch_through_the_ring():
    base = FAKE.stats()
    g = backend(staging_chunk_bytes=1 << 20, staging_chunks=2)
    wrong, refused, other = [], [0], []

    inputs = [pair(1 << 20) for _ in range(4)]  # 4 MiB per buffer: through the staging ring

    def work(i):
        a, b = inputs[i]
        for _ in range(400):
            try:
                (out,) = g.dispatch(VECADD, [a, b])
            except vc.ValidationError as exc:
                if "closed" not in exc.message:
                    raise
                refused[0] += 1
                return
            except vc.BackendError as exc:
                other.append(f"{type(exc).__name__}: {exc}")
                return
            if not np.array_equal(out, a + b):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    g.close()  # the three threads are mid-dispatch
    for t in threads:
        t.join()
    gc.collect()
    after = FAKE.stats()
    assert not wrong and not other, (wrong, other)
    assert refused[0] == 4, f"{refused[0]} of 4 threads were refused after close"
    for name in ("device_allocs", "host_allocs", "streams", "events", "context_refs", "modules"):
        assert after[name] == base[name], f"{name}: {after[name] - base[name]} left after close"


class CallerStream:
    """A caller's stream object (cuda.core's protocol) that owns a driver stream."""

    def __init__(self):
        handle = ctypes.c_void_p()
        assert FAKE.lib.cuStreamCreate(ctypes.byref(handle), 1) == 0
        self.handle = handle.value

    def __cuda_stream__(self):
        return (0, self.handle)

    def __del__(self):
        FAKE.lib.cuStreamDestroy(ctypes.c_void_p(self.handle))


@case
def dropped_caller_streams_are_not_kept_alive():
    g = backend()
    a, b = pair(1000)
    g.dispatch(VECADD, [a, b])  # the context is current on this thread now
    base = FAKE.stats()["streams"]
    refs = []
    for _ in range(50):
        s = CallerStream()
        refs.append(weakref.ref(s))
        (out,) = g.dispatch(VECADD, [a, b], vc.DispatchConfig(stream=s))
        assert np.array_equal(out, a + b)
        p = g.dispatch_async(VECADD, [a, b], vc.DispatchConfig(stream=s))
        del s  # the pending dispatch keeps it alive until it completes
        assert np.array_equal(p.result()[0], a + b)
        del p
    gc.collect()
    alive = sum(r() is not None for r in refs)
    streams = FAKE.stats()["streams"] - base
    for _ in range(100):  # many more streams: the plans made for them stay bounded
        s = CallerStream()
        g.dispatch(VECADD, [a, b], vc.DispatchConfig(stream=s))
        del s
    plans = g.telemetry.snapshot()["prepared_plans"]
    g.close()
    assert alive == 0, f"{alive} of 50 dropped caller streams are still alive"
    assert streams == 0, f"{streams} driver streams of dropped caller streams still exist"
    assert plans <= 66, f"{plans} plans cached after 150 caller streams"


@case
def a_reused_config_with_a_stream_object_keeps_nothing_alive_once_dropped():
    """The README's chain keeps one config holding a stream object and dispatches with it at
    every step (the last plan found is remembered by a weak reference to that config): once the
    caller drops the config and the stream, the stream dies."""
    g = backend()
    a, b = pair(1000)
    refs = []
    for _ in range(20):
        s = CallerStream()
        refs.append(weakref.ref(s))
        cfg = vc.DispatchConfig(stream=s)
        kept = [g.dispatch_async(VECADD, [a, b], cfg) for _ in range(5)]
        for p in kept:
            assert np.array_equal(p.result()[0], a + b)
        del kept, p, cfg, s
    gc.collect()
    alive = sum(r() is not None for r in refs)
    g.close()
    assert alive == 0, f"{alive} of 20 dropped caller streams are still alive"


@case
def a_thousand_in_flight_allocate_nothing_after_a_warm_up_round():
    """1,000 host dispatch_async kept in flight, twice: the second round creates no stream or
    event and allocates no device or page-locked memory (every one is back in its pool), every
    output is right, and trim() gives the cached streams and events back."""
    g = backend()
    pairs = [pair(1024) for _ in range(8)]
    made = ("stream_creates", "event_creates", "device_alloc_calls", "host_alloc_calls")
    rounds = []
    for _ in range(2):
        before = FAKE.stats()
        hold()  # the GPU stays busy: all 1,000 are in flight at once
        kept = [g.dispatch_async(VECADD, list(pairs[k % 8])) for k in range(1000)]
        assert g._core.outstanding >= 1000, g._core.outstanding
        FAKE.clear_failures()
        for k, p in enumerate(kept):
            a, b = pairs[k % 8]
            assert np.array_equal(p.result()[0], a + b), k
        del kept, p
        after = FAKE.stats()
        rounds.append({k: after[k] - before[k] for k in made})
    streams_cached = FAKE.stats()["streams"]
    g.trim()
    trimmed = streams_cached - FAKE.stats()["streams"]
    g.close()
    assert rounds[1] == dict.fromkeys(made, 0), f"second round made {rounds[1]} (first: {rounds[0]})"
    assert trimmed >= 1000, f"trim() destroyed {trimmed} of {streams_cached} cached streams"


@case
def close_with_a_pending_handle_gives_the_context_back_when_it_is_dropped():
    base = FAKE.stats()
    g = backend()
    a, b = pair(1000)
    p = g.dispatch_async(VECADD, [a, b])
    g.close()
    held = FAKE.stats()["context_refs"] - base["context_refs"]
    del p
    gc.collect()
    after = FAKE.stats()
    assert held >= 1, "close() released the context while a handle still held resources in it"
    for name in ("context_refs", "device_allocs", "streams", "events"):
        assert after[name] == base[name], f"{name}: {after[name] - base[name]} left once the handle was dropped"


@case
def a_handle_dropped_after_close_on_a_thread_with_no_context_frees_everything():
    """close() leaves a held handle's slab, stream and event to it; the thread that drops it
    never dispatched, so no context is current there: the frees must still find the context."""
    base = FAKE.stats()
    g = backend()
    a, b = pair(1000)
    held = [g.dispatch_async(VECADD, [a, b])]
    g.close()
    t = threading.Thread(target=held.clear)  # the handle's last reference goes on that thread
    t.start()
    t.join()
    gc.collect()
    after = FAKE.stats()
    calls = after["no_context"] - base["no_context"]
    assert calls == 0, f"{calls} driver calls with no context current"
    for name in ("context_refs", "device_allocs", "host_allocs", "streams", "events"):
        assert after[name] == base[name], f"{name}: {after[name] - base[name]} left once the handle was dropped"


@case
def pinned_arrays_on_a_missing_device_are_a_validation_error():
    for bad in (5, -1):
        try:
            vc.pinned_empty(16, np.float32, device=bad)
        except vc.ValidationError as exc:
            assert str(bad) in exc.message and "Fix:" in str(exc), str(exc)
        else:
            raise AssertionError(f"pinned_empty(device={bad}) on a one-device machine was not refused")
    x = vc.pinned_empty(16, np.float32, device=0)
    assert vc.is_page_locked(x)


@case
def result_after_a_timeout_waits_for_the_end():
    g = backend()
    a, b = pair(1000)
    FAKE.fail("cuEventQuery", "CUDA_ERROR_NOT_READY", sticky=True)
    p = g.dispatch_async(VECADD, [a, b], vc.DispatchConfig(timeout=0.05))
    try:
        p.result()
        raise AssertionError("the dispatch's own timeout did not apply to its first wait")
    except vc.DispatchFailed as exc:
        assert exc.status == "timeout" and exc.pending is p
    t0 = time.perf_counter()
    try:
        p.result(timeout=0.02)
        raise AssertionError("result(timeout=0.02) did not time out")
    except vc.DispatchFailed as exc:
        assert exc.status == "timeout" and "0.02" in exc.message, exc.message
    threading.Timer(0.3, FAKE.clear_failures).start()
    (out,) = p.result()  # after a timeout: waits for the end, however long
    waited = time.perf_counter() - t0
    g.close()
    assert np.array_equal(out, a + b)
    assert waited >= 0.25, f"returned after {waited:.3f} s, before the work was done"


@case
def close_while_a_thread_plans_waits_for_the_plan():
    # the plan of a new program is made outside the core, but counted as a call running in it:
    # close() waits for it. Uncounted, close() unloaded the modules under the planning thread (on
    # the GPU: "no kernel entry" errors from a plan that had its module before close), or a
    # module loaded after close() was one nobody unloads. The dispatch then gets the closed error.
    from vyre_cuda.compile import modules

    base = FAKE.stats()
    g = backend()
    prog = bp.vecadd("i32")  # not planned on this backend yet
    a = np.arange(64, dtype=np.int32)
    compiling, release, seen = threading.Event(), threading.Event(), []
    real = modules.compile_kernel

    def slow_compile(*args, **kw):
        out = real(*args, **kw)
        compiling.set()
        release.wait(30)  # close() runs now
        return out

    def plan_it():
        try:
            g.dispatch(prog, [a, a])
            seen.append("ran")
        except vc.BackendError as exc:
            seen.append(f"{type(exc).__name__}: {exc.message}")

    modules.compile_kernel = slow_compile
    try:
        t = threading.Thread(target=plan_it)
        t.start()
        assert compiling.wait(30), "the planning thread never reached the compile"
        closer = threading.Thread(target=g.close)
        closer.start()
        deadline = time.monotonic() + 30
        while not g._core.closed and time.monotonic() < deadline:
            time.sleep(0.0005)
        closer.join(0.1)
        assert closer.is_alive(), "close() returned while another thread was still planning"
        release.set()
        t.join(30)
        closer.join(30)
    finally:
        release.set()
        modules.compile_kernel = real
    assert seen == ["ValidationError: this CudaBackend is closed"], seen
    gc.collect()
    after = FAKE.stats()
    for name in ("modules", "context_refs", "streams", "events", "device_allocs"):
        assert after[name] == base[name], f"{name}: {after[name] - base[name]} left after close"


# ------------------------------------------------------------------ one handle, many callers
QUERIES = ("cuEventQuery", "cuStreamQuery")


def hold():
    """Completion queries answer NOT_READY (the GPU still busy) until FAKE.clear_failures()."""
    for call in QUERIES:
        FAKE.fail(call, "CUDA_ERROR_NOT_READY", sticky=True)


def hold_and_refuse_waits():
    """hold(), and a host wait on an event fails: a dropped handle that waited for its work would
    write its resources off (leaked_allocations), one that never waits leaves them deferred."""
    hold()
    FAKE.fail("cuEventSynchronize", "CUDA_ERROR_NOT_SUPPORTED", sticky=True)


def _share_one_handle(n_threads, forms, rounds=12):
    """``n_threads`` threads take one handle's result at once, thread i in ``forms[i % len]``
    ("result", "timed", "into", "await"), for ``rounds`` handles. Every result and timed_result
    caller gets a + b; one result_into caller fills its arrays, and others get the typed error."""
    sys.setswitchinterval(1e-6)
    g = backend()
    import asyncio

    try:
        for _ in range(rounds):
            a, b = pair(int(RNG.integers(1, 5000)))
            hold()
            p = g.dispatch_async(VECADD, [a, b], timed=True)
            got, errors, filled = [], [], []

            def take(i, p=p, a=a, got=got, errors=errors, filled=filled):
                form = forms[i % len(forms)]
                try:
                    if form == "result":
                        got.append(p.result()[0])
                    elif form == "timed":
                        r = p.timed_result()
                        got.append(r.outputs[0])
                        assert r.wall_ns > 0, r
                    elif form == "await":
                        got.append(asyncio.run(_awaited(p))[0])
                    else:
                        dst = np.full_like(a, np.nan)
                        p.result_into([dst])
                        filled.append(dst)
                except vc.ValidationError as exc:  # the documented refusal of a second result_into
                    assert form == "into" and "already taken" in exc.message, exc
                    assert str(exc).splitlines()[-1].startswith("Fix: "), str(exc)
                    errors.append(exc)
                except BaseException as exc:  # noqa: BLE001 (reported below)
                    errors.append(exc)

            threads = [threading.Thread(target=take, args=(i,)) for i in range(n_threads)]
            for t in threads:
                t.start()
            time.sleep(0.002)  # every caller is waiting now
            FAKE.clear_failures()
            for t in threads:
                t.join(30)
            bad = [e for e in errors if not isinstance(e, vc.ValidationError)]
            assert not bad, f"{len(bad)} callers failed: {bad[:2]!r}"
            for out in got + filled:
                assert np.array_equal(out, a + b), "a caller got wrong outputs"
            takers = sum(forms[i % len(forms)] != "into" for i in range(n_threads))
            assert len(got) == takers, (len(got), takers)
            if takers:  # result() took them: every result_into caller is refused
                assert not filled and len(errors) == n_threads - takers, (len(filled), len(errors))
            else:  # one result_into filled its arrays; the others were refused
                assert len(filled) == 1 and len(errors) == n_threads - 1, (len(filled), len(errors))
            assert p.done and p.is_ready()
        g.trim()
        assert live(g) == dict.fromkeys(LIVE, 0), live(g)
        snap = g.telemetry.snapshot()
        assert snap["leaked_allocations"] == 0 and snap["failed_dispatches"] == 0, snap
    finally:
        FAKE.clear_failures()
        g.close()


async def _awaited(p):
    return await p


@case
def two_threads_take_one_handle_s_result():
    _share_one_handle(2, ("result",))


@case
def four_threads_take_one_handle_in_every_form():
    _share_one_handle(4, ("result", "timed", "await", "into"))


@case
def eight_threads_take_one_handle_with_an_await_beside_them():
    _share_one_handle(8, ("await", "result", "timed", "result"))


@case
def eight_threads_fill_their_own_arrays_from_one_handle():
    _share_one_handle(8, ("into",))


# ------------------------------------------------------------------ dropped handles
@case
def dropped_handles_never_wait_and_are_reclaimed_later():
    sys.setswitchinterval(1e-6)
    g = backend()
    a, b = pair(3000)
    g.dispatch(VECADD, [a, b])
    hold_and_refuse_waits()  # the GPU is busy with everything enqueued from here
    syncs = FAKE.stats()["syncs"]
    for _ in range(1000):
        g.dispatch_async(VECADD, list(pair(int(RNG.integers(1, 3000)))))  # dropped at once
    dropped_syncs = FAKE.stats()["syncs"] - syncs
    assert dropped_syncs == 0, f"1,000 dropped handles made {dropped_syncs} synchronize calls"
    leaked = g.telemetry.snapshot()["leaked_allocations"]
    assert leaked == 0, f"{leaked} dropped handles waited for their work (and wrote it off)"
    snap = g.telemetry.snapshot()
    deferred = g._core.deferred
    g.trim()  # nothing has finished: nothing waited for, nothing freed under the GPU
    still = g._core.deferred
    FAKE.clear_failures()
    (out,) = g.dispatch(VECADD, [a, b])  # reclaims what finished
    left = g._core.deferred
    g.trim()
    after = g.telemetry.snapshot()
    leaks = live(g)
    g.close()
    assert dropped_syncs == 0, f"1,000 dropped handles made {dropped_syncs} synchronize calls"
    assert snap["deferred_drops"] == 1000 and deferred == 1000, (snap["deferred_drops"], deferred)
    assert still == 1000, still
    assert np.array_equal(out, a + b)
    assert left == 0 and after["deferred_recycles"] == 1000, (left, after["deferred_recycles"])
    assert after["leaked_allocations"] == 0 and after["failed_dispatches"] == 0, after
    assert leaks == dict.fromkeys(LIVE, 0), leaks


@case
def dropped_device_chain_on_a_caller_stream_is_right_once_synchronised():
    sys.setswitchinterval(1e-6)
    g = backend()
    s = CallerStream()
    cfg = vc.DispatchConfig(stream=s)
    n = 2048
    a, b = pair(n)
    (x,) = g.dispatch(VECADD, [a, np.zeros(n, np.float32)], vc.DispatchConfig(outputs="device"))
    (db,) = g.dispatch(VECADD, [b, np.zeros(n, np.float32)], vc.DispatchConfig(outputs="device"))
    outs = [g.dispatch(VECADD, [a, a], vc.DispatchConfig(outputs="device"))[0] for _ in range(2)]
    g.dispatch_async(VECADD, [x, db], cfg, outputs=[outs[1]]).result()  # planned: its one upload made
    hold_and_refuse_waits()
    syncs = FAKE.stats()["syncs"]
    for k in range(1000):  # x_{k+1} = x_k + b, ping-ponging two named outputs; handles dropped
        src, dst = (x, outs[0]) if k == 0 else (outs[(k - 1) % 2], outs[k % 2])
        g.dispatch_async(VECADD, [src, db], cfg, outputs=[dst])
    dropped_syncs = FAKE.stats()["syncs"] - syncs
    assert dropped_syncs == 0, f"1,000 dropped handles made {dropped_syncs} synchronize calls"
    leaked = g.telemetry.snapshot()["leaked_allocations"]
    assert leaked == 0, f"{leaked} dropped handles waited for their work (and wrote it off)"
    FAKE.clear_failures()
    assert FAKE.lib.cuStreamSynchronize(ctypes.c_void_p(s.handle)) == 0
    final = outs[999 % 2].copy_to_host()
    g.trim()
    snap = g.telemetry.snapshot()
    g.close()
    assert dropped_syncs == 0, f"1,000 dropped handles made {dropped_syncs} synchronize calls"
    expect = a.copy()
    for _ in range(1000):
        expect = expect + b
    assert np.array_equal(final, expect), "the chain's final output is wrong"
    assert snap["deferred_drops"] == 1000 and snap["leaked_allocations"] == 0, snap


@case
def close_and_trim_while_dropped_work_is_deferred():
    base = FAKE.stats()
    for closing_thread in (False, True):
        g = backend()
        a, b = pair(5000)
        hold_and_refuse_waits()
        for _ in range(50):
            g.dispatch_async(VECADD, [a, b])
        trimmer = threading.Thread(target=g.trim)
        trimmer.start()
        trimmer.join()
        leaked = g.telemetry.snapshot()["leaked_allocations"]
        assert leaked == 0, f"{leaked} dropped handles waited for their work (and wrote it off)"
        assert g._core.deferred == 50, g._core.deferred
        FAKE.clear_failures()
        if closing_thread:
            t = threading.Thread(target=g.close)
            t.start()
            t.join()
        else:
            g.close()
        assert g._core.deferred == 0 and g._core.outstanding == 0, (g._core.deferred, g._core.outstanding)
        snap = g.telemetry.snapshot()
        assert snap["deferred_recycles"] == 50 and snap["leaked_allocations"] == 0, snap
    gc.collect()
    after = FAKE.stats()
    for name in ("context_refs", "device_allocs", "host_allocs", "streams", "events"):
        assert after[name] == base[name], f"{name}: {after[name] - base[name]} left after close"


@case
def first_cooperative_dispatches_from_eight_threads_share_one_gate_event():
    sys.setswitchinterval(1e-6)
    base = FAKE.stats()
    scan = bp.inclusive_scan_u32()
    for _ in range(5):
        g = backend()
        ones = np.ones(5000, np.uint32)
        g.plan_info(scan, [ones])  # planned (and its module loaded) before the threads race

        def coop(i, g=g, ones=ones):
            g.dispatch(scan, [ones])

        on_threads(8, coop)
        g.close()
        gc.collect()
        events = FAKE.stats()["events"] - base["events"]
        assert events == 0, f"{events} events left after close: two gate events were made at once"


@case
def a_closed_backend_s_stream_ordered_pool_is_kept_for_the_next_one():
    # the pool is parked at close (trimmed, never destroyed while the process runs: GPU stress
    # crashes were inside cuMemPoolDestroy); the next backend on the device takes it; with a
    # handle still held at close, the pool waits for it; reset_device() forgets parked pools
    import os

    from vyre_cuda import _pools

    os.environ["FAKE_CUDA_MEMPOOLS"] = "1"  # the fake device supports stream-ordered pools
    base, parked, refs = FAKE.stats()["mempools"], _pools.parked_pools(0), FAKE.stats()["context_refs"]
    a, b = pair(1 << 20)
    g = backend(staging_chunk_bytes=1 << 20, staging_chunks=2)
    (out,) = g.dispatch(VECADD, [a, b])  # staged: its device slab comes from the pool
    assert np.array_equal(out, a + b)
    assert FAKE.stats()["mempools"] == base + 1 - min(parked, 1), FAKE.stats()["mempools"]
    held = g.dispatch_async(VECADD, [a, b])  # a slab still lent at close
    g.close()
    assert _pools.parked_pools(0) == parked - min(parked, 1), "parked while a slab was still lent"
    del held  # (its outputs went with the backend; its slab goes back now)
    gc.collect()
    assert _pools.parked_pools(0) == max(parked, 1), _pools.parked_pools(0)
    made = FAKE.stats()["mempools"]
    for _ in range(3):  # backends one after the other: the same pool each time
        h = backend(staging_chunk_bytes=1 << 20, staging_chunks=2)
        (out,) = h.dispatch(VECADD, [b, a])
        assert np.array_equal(out, a + b)
        assert _pools.parked_pools(0) == max(parked, 1) - 1
        h.close()
    assert FAKE.stats()["mempools"] == made, "a backend made a pool while one was parked"
    assert _pools.parked_pools(0) == max(parked, 1)
    # a parked pool keeps its context (whose teardown would take the pool): one retain each
    assert FAKE.stats()["context_refs"] == refs - parked + max(parked, 1), FAKE.stats()["context_refs"]
    vc.reset_device(0)
    assert _pools.parked_pools(0) == 0, "reset_device() kept a parked pool"
    assert FAKE.stats()["context_refs"] == refs - parked, "reset_device() kept a parked pool's retain"
    assert FAKE.stats()["bad_handles"] == 0, "a pool was used after it was destroyed"


@case
def a_plan_s_first_params_only_dispatches_from_eight_threads_upload_one_resident_block():
    # the resident params block is claimed by one thread (the others take the params-only slab
    # meanwhile): one block per plan, whichever thread wins, and every result right
    sys.setswitchinterval(1e-6)
    g = backend()
    n = 1000
    a, b = pair(n)
    dev = vc.DispatchConfig(outputs="device")
    (da,) = g.dispatch(VECADD, [a, np.zeros_like(a)], dev)
    (db,) = g.dispatch(VECADD, [b, np.zeros_like(b)], dev)
    one = None  # the bytes of one plan's block, from a first dispatch made alone
    for threads in (1,) + (8,) * 20:
        g._core.clear_prepared()  # a new plan, cached by a dispatch that is not params-only
        gc.collect()  # (host outputs): its first params-only dispatches race
        assert g._core.resident_blocks.nbytes == 0, "a dropped plan kept its resident block"
        assert np.array_equal(g.dispatch(VECADD, [da, db])[0], a + b)
        targets = [g.dispatch(VECADD, [np.zeros(n, np.float32)] * 2, dev)[0] for _ in range(threads)]

        def into(i, targets=targets):
            g.dispatch_into(VECADD, [da, db], [targets[i]])

        on_threads(threads, into)
        for t in targets:
            assert np.array_equal(t.copy_to_host(), a + b)
        gc.collect()
        held = g._core.resident_blocks.nbytes
        one = held if one is None else one
        assert held == one > 0, f"{held} bytes resident for one plan ({one} for one block): two threads uploaded"
    g.close()


if __name__ == "__main__":
    CASES.main_one(sys.argv[1], FAKE)
