"""Child of tests/test_fake_driver.py: resource-safety scenarios on a real CudaBackend over the
fake driver, with driver failures injected where a GPU cannot be made to fail on demand.

Each scenario makes its own backend, asserts, and closes it; the fake driver's counters are
compared as differences, since a scenario may leave deliberate leaks behind. Prints one JSON
object: scenario name -> {"ok": bool, "error": text, "skipped": reason or None}
(tests/helpers/scenarios.py).
"""

from __future__ import annotations

import ctypes
import gc
import pathlib
import sys
import threading
import time

import numpy as np
from helpers.scenarios import LIVE, Scenarios, Skip, live, raises

import vyre_cuda as vc
from fakecuda import STATUS, FakeDriver, vecadd_emulation
from vyre_cuda import BufferDecl, Program
from vyre_cuda import builtin_programs as bp

VECADD = bp.vecadd_f32()
SCENARIOS = Scenarios()
scenario = SCENARIOS.register
RNG = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)


def vecadd_backend(fake, n=1000):
    backend = vc.CudaBackend(0)
    a, b = pair(n)
    fake.emulate(backend, VECADD, [a, b], vecadd_emulation(np.float32))
    return backend


def pair(n=1000):
    return RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)


def check_vecadd(backend, n=1000):
    a, b = pair(n)
    (out,) = backend.dispatch(VECADD, [a, b])
    assert np.array_equal(out, a + b), "vecadd gave a wrong result"


ENTRIES = {
    "dispatch": lambda be, a, b: be.dispatch(VECADD, [a, b]),
    "dispatch_into": lambda be, a, b: be.dispatch_into(VECADD, [a, b], [np.empty(a.size, np.float32)]),
    "dispatch_async": lambda be, a, b: be.dispatch_async(VECADD, [a, b]).result(),
    "dispatch_timed": lambda be, a, b: be.dispatch_timed(VECADD, [a, b]),
}


# ------------------------------------------------------------------ enqueue failures
@scenario
def upload_failure_is_typed_recycles_and_the_backend_goes_on(fake):
    for name, call in ENTRIES.items():
        backend = vecadd_backend(fake)
        check_vecadd(backend)
        before = backend.telemetry.snapshot()
        fake.fail("cuMemcpyHtoDAsync", "CUDA_ERROR_INVALID_VALUE")
        a, b = pair()
        err = raises(vc.DispatchFailed, call, backend, a, b)
        assert type(err) is vc.DispatchFailed, (name, type(err))
        assert (err.status, err.call) == ("CUDA_ERROR_INVALID_VALUE", "cuMemcpyHtoDAsync"), (name, err)
        assert str(err).splitlines()[-1].startswith("Fix: ")
        snap = backend.telemetry.snapshot()
        assert snap["failed_dispatches"] == before["failed_dispatches"] + 1, (name, snap)
        assert snap["leaked_allocations"] == 0 and live(backend) == dict.fromkeys(LIVE, 0), (name, snap)
        assert not backend.lost, name
        check_vecadd(backend)  # the stream synchronised fine: everything was recycled and works
        backend.close()


@scenario
def sticky_launch_failure_loses_the_backend_and_says_so(fake):
    backend = vecadd_backend(fake)
    check_vecadd(backend)
    refs = fake.stats()["context_refs"]
    fake.fail("cuLaunchKernel", "CUDA_ERROR_ILLEGAL_ADDRESS")
    a, b = pair()
    err = raises(vc.DeviceLost, backend.dispatch, VECADD, [a, b])
    assert err.status == "CUDA_ERROR_ILLEGAL_ADDRESS" and err.call == "cuLaunchKernel", err
    assert backend.lost
    for name, call in ENTRIES.items():
        later = raises(vc.DeviceLost, call, backend, a, b)
        assert "CUDA_ERROR_ILLEGAL_ADDRESS" in later.message, (name, later)
    backend.close()  # a lost backend still gives its context back
    assert fake.stats()["context_refs"] == refs - 1


@scenario
def failed_synchronise_leaks_rather_than_recycles(fake):
    backend = vecadd_backend(fake)
    check_vecadd(backend)
    device0 = fake.stats()["device_allocs"]
    # the wait fails (however the backend waits: synchronise or poll), and so does the synchronise
    # of the failure path: the slab may still be in use by the device, so it must be written off
    # (leaked), never handed to the next dispatch
    for call in ("cuStreamSynchronize", "cuEventSynchronize", "cuStreamQuery", "cuEventQuery"):
        fake.fail(call, "CUDA_ERROR_UNKNOWN", sticky=True)
    a, b = pair()
    err = raises(vc.DispatchFailed, backend.dispatch, VECADD, [a, b])
    fake.clear_failures()
    assert err.status == "CUDA_ERROR_UNKNOWN", err
    snap = backend.telemetry.snapshot()
    assert snap["leaked_allocations"] == 1 and live(backend) == dict.fromkeys(LIVE, 0), snap
    misses = backend._core.resources.dpool.stats()["misses"]
    check_vecadd(backend)  # a fresh slab: the leaked one is not reused
    assert backend._core.resources.dpool.stats()["misses"] == misses + 1
    assert fake.stats()["device_allocs"] == device0 + 1
    backend.close()


@scenario
def out_of_memory_is_device_out_of_memory_and_allocates_nothing(fake):
    backend = vc.CudaBackend(0)
    fake.fail("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", sticky=True)
    a, b = pair()
    err = raises(vc.DeviceOutOfMemory, backend.dispatch, VECADD, [a, b])
    fake.clear_failures()
    assert err.status == "CUDA_ERROR_OUT_OF_MEMORY", err
    assert live(backend) == dict.fromkeys(LIVE, 0) and not backend.lost
    fake.emulate(backend, VECADD, [a, b], vecadd_emulation(np.float32))
    check_vecadd(backend)
    backend.close()


@scenario
def stream_and_event_creation_failures_release_what_was_taken(fake):
    for call, entry in (
        ("cuStreamCreate", "dispatch"),
        ("cuEventCreate", "dispatch_async"),
        ("cuEventCreate", "dispatch_timed"),
        ("cuMemHostAlloc", "dispatch"),
    ):
        backend = vecadd_backend(fake)
        fake.fail(call, "CUDA_ERROR_INVALID_VALUE")
        a, b = pair()
        err = raises(vc.DispatchFailed, ENTRIES[entry], backend, a, b)
        assert err.call == call, (call, entry, err)
        assert live(backend) == dict.fromkeys(LIVE, 0), (call, entry, live(backend))
        check_vecadd(backend)
        backend.close()


@scenario
def dropped_pending_dispatch_recycles(fake):
    backend = vecadd_backend(fake)
    a, b = pair()
    pending = backend.dispatch_async(VECADD, [a, b])
    assert backend._core.outstanding == 1
    del pending  # dropped with its work not seen finished: deferred, no driver call
    gc.collect()
    assert backend._core.deferred == 1 and backend._core.outstanding == 1
    backend.trim()  # (as the next dispatch or close() would) recycles it once finished
    assert backend._core.deferred == 0 and backend._core.outstanding == 0
    assert live(backend) == dict.fromkeys(LIVE, 0)
    pending = backend.dispatch_async(VECADD, [a, b])
    assert pending.is_ready()  # seen finished: its drop recycles at once
    del pending
    gc.collect()
    assert backend._core.deferred == 0 and backend._core.outstanding == 0
    assert live(backend) == dict.fromkeys(LIVE, 0)
    check_vecadd(backend)
    backend.close()


@scenario
def eight_threads_dispatch_correctly(fake):
    backend = vecadd_backend(fake)
    errors = []

    def work(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(40):
                n = int(r.integers(1, 5000))
                a, b = r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)
                (out,) = backend.dispatch(VECADD, [a, b])
                assert np.array_equal(out, a + b)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert live(backend) == dict.fromkeys(LIVE, 0)
    backend.close()


@scenario
def plans_stay_bounded_while_threads_plan_and_clear(fake):
    # the plan table (one lock, published whole): threads planning new lengths on the backend's
    # streams and on callers' streams while another thread clears the table; every result right,
    # and plans for callers' streams bounded (each new stream is a new key)
    backend = vecadd_backend(fake)
    streams = []
    for _ in range(100):
        s = ctypes.c_void_p()
        assert fake.lib.cuStreamCreate(ctypes.byref(s), 1) == 0
        streams.append(s.value)
    errors, stop = [], threading.Event()

    def plan(seed):
        r = np.random.default_rng(seed)
        try:
            for k in range(60):
                n = int(r.integers(1, 3000))
                a, b = r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)
                cfg = vc.DispatchConfig(stream=streams[int(r.integers(len(streams)))]) if k % 2 else None
                (out,) = backend.dispatch(VECADD, [a, b], cfg)
                assert np.array_equal(out, a + b), "a wrong result"
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(repr(exc))

    def clear():
        while not stop.is_set():
            backend._core.clear_prepared()
            time.sleep(0.001)

    sys.setswitchinterval(1e-6)
    try:
        clearer = threading.Thread(target=clear)
        clearer.start()
        threads = [threading.Thread(target=plan, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stop.set()
        clearer.join(30)
    finally:
        sys.setswitchinterval(0.005)
    assert not errors, errors[:3]
    backend._core.clear_prepared()
    a, b = pair(1000)
    for s in streams:  # one plan per stream: the table keeps at most 64 of them
        (out,) = backend.dispatch(VECADD, [a, b], vc.DispatchConfig(stream=s))
        assert np.array_equal(out, a + b)
        assert backend._core.pool_stats()["prepared_plans"] <= 64
    assert backend._core.pool_stats()["prepared_plans"] == len(streams) % 64
    for s in streams:
        assert fake.lib.cuStreamDestroy(ctypes.c_void_p(s)) == 0
    backend.close()


@scenario
def close_frees_every_allocation_module_and_the_context(fake):
    before = fake.stats()
    backend = vecadd_backend(fake)
    check_vecadd(backend)
    backend.dispatch(bp.inclusive_scan_u32(), [np.ones(5000, np.uint32)])  # cooperative, no emulation
    backend.dispatch_async(VECADD, list(pair())).result()
    backend.close()
    after = fake.stats()
    for key in ("device_allocs", "host_allocs", "streams", "events", "modules", "context_refs"):
        assert after[key] == before[key], (key, before[key], after[key])
    assert after["violations"] == before["violations"] and after["no_context"] == before["no_context"]


def begin_foreign_capture(fake):
    """A stream of the device's primary context being captured into a graph, as a CuPy or torch
    capture on another thread would be (that library holds its own reference on the context)."""
    ctx, stream = ctypes.c_void_p(), ctypes.c_void_p()
    assert fake.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert fake.lib.cuCtxSetCurrent(ctx) == 0
    assert fake.lib.cuStreamCreate(ctypes.byref(stream), 1) == 0
    assert fake.lib.cuStreamBeginCapture(stream, 1) == 0  # (thread-local mode, as vyre_cuda's own)
    return ctx, stream


def end_foreign_capture(fake, ctx, stream, ended):
    fake.lib.cuCtxSetCurrent(ctx)
    graph = ctypes.c_void_p()
    ended.append(fake.lib.cuStreamEndCapture(stream, ctypes.byref(graph)))
    if ended[-1] == 0:
        fake.lib.cuGraphDestroy(graph)
    ended.append(fake.lib.cuStreamDestroy(stream))
    ended.append(fake.lib.cuDevicePrimaryCtxRelease(0))


INVALIDATED = STATUS["CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"]


def close_frees_everything(fake, before):
    after = fake.stats()
    for key in ("device_allocs", "host_allocs", "streams", "events", "modules", "context_refs", "graphs"):
        assert after[key] == before[key], (key, before[key], after[key])


def handle_held_during_a_capture(fake):
    """A backend with a dispatch_async handle held while a foreign capture begins: (the fake's
    counts before the backend, the backend, the handle, its inputs, the capture's ctx and stream)."""
    before = fake.stats()
    backend = vecadd_backend(fake)
    check_vecadd(backend)
    inputs = list(pair())
    pending = backend.dispatch_async(VECADD, inputs)
    ctx, stream = begin_foreign_capture(fake)
    return before, backend, pending, inputs, ctx, stream


@scenario
def close_with_no_handle_held_leaves_a_capture_elsewhere_alone(fake):
    # the driver refuses a context synchronize while any stream of the context captures, and the
    # refusal breaks that capture. With no dispatch handle held nothing of the backend's runs, so
    # close() frees everything without one (it once logged the refusal and left its pools,
    # streams and modules allocated; then it retried, breaking the capture)
    before = fake.stats()
    backend = vecadd_backend(fake)
    check_vecadd(backend)
    backend.dispatch_async(VECADD, list(pair())).result()
    ctx, stream = begin_foreign_capture(fake)
    ended = []
    try:
        backend.close()
        during = fake.stats()
    finally:
        end_foreign_capture(fake, ctx, stream, ended)
    assert ended == [0, 0, 0], ended  # the capture was not broken
    for key in ("device_allocs", "host_allocs", "events", "modules"):
        assert during[key] == before[key], (key, before[key], during[key])  # freed at once
    assert during["context_refs"] == before["context_refs"] + 1, during  # (the capturer's own)
    close_frees_everything(fake, before)


@scenario
def an_evicted_module_stays_loaded_while_a_plan_made_from_it_can_launch(fake):
    # past the module cache's capacity the least recently planned module is evicted and the cached
    # plans are dropped, while another thread may have looked its plan up just before and be about
    # to launch from it (here: a plan held, then dispatched with). The module stays loaded until the
    # last plan made from it goes (it used to be unloaded at once, under that launch), and the
    # eviction waits for nothing: a graph capture elsewhere on the device stays intact (it used to
    # synchronize the context, which the driver refuses, breaking the capture)
    from vyre_cuda._plan_miss import PlanMiss

    before = fake.stats()
    backend = vecadd_backend(fake)
    backend._modules._capacity = 1
    a, b = pair()
    try:
        backend._core.dispatch(VECADD, [a, b])
        raise AssertionError("a new backend's core held a plan")
    except PlanMiss as miss:
        key = miss.key
    check_vecadd(backend)
    held = backend._core.prepared_for(key)
    assert held is not None
    loaded = fake.stats()["modules"]
    ctx, stream = begin_foreign_capture(fake)
    ended = []
    ender = threading.Timer(0.05, end_foreign_capture, (fake, ctx, stream, ended))
    ender.start()
    other = bp.vecadd("u32")
    words = [RNG.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32) for _ in range(2)]
    backend.plan_info(other, words)  # loads a second module: the first is evicted
    ender.join()
    assert ended == [0, 0, 0], ended  # the capture was not broken
    assert backend._core.prepared_for(key) is None, "the evicted module's plans stayed cached"
    assert fake.stats()["modules"] == loaded + 1 and backend._modules.evicted_held == 1, fake.stats()
    (out,) = backend._core.dispatch(VECADD, [a, b], None, held)
    assert np.array_equal(out, a + b) and fake.stats()["violations"] == 0, fake.last_violation()
    del held
    gc.collect()
    assert fake.stats()["modules"] == loaded and backend._modules.evicted_held == 0, "not unloaded"
    # planned and loaded again (a new function: the emulation is registered for it); the second
    # module goes at once, as no plan holds it
    fake.emulate(backend, VECADD, [a, b], vecadd_emulation(np.float32))
    check_vecadd(backend)
    assert fake.stats()["modules"] == loaded and fake.stats()["violations"] == 0, fake.stats()
    backend.close()
    close_frees_everything(fake, before)


@scenario
def close_with_a_handle_held_waits_for_a_graph_capture_elsewhere_to_end(fake):
    # a held handle's work may still run: close() waits for it with a context synchronize, which
    # the driver refuses (and breaks the capture with) until the capture ends; it retries
    before, backend, pending, _, ctx, stream = handle_held_during_a_capture(fake)
    ended = []
    ender = threading.Timer(0.05, end_foreign_capture, (fake, ctx, stream, ended))
    t0 = time.monotonic()
    ender.start()
    backend.close()
    waited = time.monotonic() - t0
    ender.join()
    assert ended == [INVALIDATED, 0, 0], ended  # (the refused synchronize broke it, as on the driver)
    assert waited >= 0.04, waited
    del pending  # its slab and stream go back as it is dropped, then the context reference
    close_frees_everything(fake, before)


@scenario
def close_frees_everything_after_the_last_handle_when_a_capture_outlasts_its_wait(fake):
    from vyre_cuda import _backend_close as close_module

    before, backend, pending, inputs, ctx, stream = handle_held_during_a_capture(fake)
    wait, close_module.CLOSE_CAPTURE_WAIT_S = close_module.CLOSE_CAPTURE_WAIT_S, 0.02
    ended = []
    try:
        backend.close()  # the wait is refused throughout: the handle's work may still run
    finally:
        close_module.CLOSE_CAPTURE_WAIT_S = wait
        end_foreign_capture(fake, ctx, stream, ended)
    assert ended == [INVALIDATED, 0, 0], ended
    held = fake.stats()
    # nothing was freed under the handle: the modules, the pools and the context stay
    assert held["modules"] > before["modules"] and held["context_refs"] > before["context_refs"], held
    assert "closed" in raises(vc.ValidationError, backend.dispatch, VECADD, inputs).message  # all the same
    del pending  # the last handle: it waits for its own work, then everything goes
    close_frees_everything(fake, before)


@scenario
def register_waits_for_a_graph_capture_elsewhere_only_with_a_handle_held(fake):
    # leaving the with block waits for the work that may still use the buffer (a held handle's
    # DMA) before unregistering it: a context synchronize, refused while a capture lasts, so it
    # retries. With no handle held nothing can still use it, and the capture is left alone.
    backend = vecadd_backend(fake)
    a, b = pair()
    with backend.register(a):
        (out,) = backend.dispatch(VECADD, [a, b])
        ctx, stream = begin_foreign_capture(fake)
    ended = []
    end_foreign_capture(fake, ctx, stream, ended)
    assert ended == [0, 0, 0], ended
    assert np.array_equal(out, a + b) and fake.stats()["registered"] == 0
    with backend.register(a):
        assert vc.is_page_locked(a), vc.registered_stats()
        pending = backend.dispatch_async(VECADD, [a, b])
        ctx, stream = begin_foreign_capture(fake)
        ended = []
        ender = threading.Timer(0.05, end_foreign_capture, (fake, ctx, stream, ended))
        ender.start()
    ender.join()
    assert ended == [INVALIDATED, 0, 0], ended  # (the refused synchronize broke it, as on the driver)
    (out,) = pending.result()
    assert np.array_equal(out, a + b) and fake.stats()["registered"] == 0
    backend.close()


@scenario
def soak_keeps_pools_counters_and_memory_flat(fake):
    # the GPU soak (tests/gpu/test_load_gpu.py), shortened, on the host path of the fake driver
    import contextlib

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gpu"))
    import test_load_gpu as load

    class Capsys:
        @contextlib.contextmanager
        def disabled(self):
            yield

    backend = vecadd_backend(fake)
    load.SOAK_DISPATCHES, load.CHECKPOINT = 20_000, 5_000
    load.test_soak_200k_dispatches_flat_pools_and_rss(backend, np.random.default_rng(5), Capsys())
    backend.close()


# ------------------------------------------------------------------ known defects (xfail in the parent)
@scenario
def trim_on_another_thread_frees_the_cached_memory(fake):
    backend = vecadd_backend(fake)
    check_vecadd(backend)
    assert backend._core.resources.dpool.stats()["cached_bytes"] > 0
    before = fake.stats()["device_allocs"]
    cached = backend._core.resources.dpool.cached_blocks() + 0
    worker = threading.Thread(target=backend.trim)  # a thread with no current context
    worker.start()
    worker.join()
    assert backend._core.resources.dpool.stats()["cached_bytes"] == 0
    # every block the pool forgot was really freed (the context must be current for cuMemFree)
    assert fake.stats()["device_allocs"] == before - cached, (before, cached, fake.stats()["device_allocs"])
    backend.close()


@scenario
def failed_set_current_after_retain_gives_the_retain_back(fake):
    refs = fake.stats()["context_refs"]
    fake.fail("cuCtxSetCurrent", "CUDA_ERROR_UNKNOWN")
    err = raises(vc.BackendError, vc.CudaBackend, 0)
    fake.clear_failures()
    assert str(err).splitlines()[-1].startswith("Fix: ")
    assert fake.stats()["context_refs"] == refs, (refs, fake.stats()["context_refs"])


@scenario
def bf16_arrays_of_the_returned_dtype_are_accepted_as_inputs(fake):
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        raise Skip("ml_dtypes is not installed: bf16 arrays are uint16 here") from None
    program = Program(
        bp.vecadd("u16").kernel,
        [BufferDecl.read("a", 0, "bf16"), BufferDecl.read("b", 1, "bf16"), BufferDecl.output("out", 2, "bf16")],
    )
    bits = RNG.integers(0, 0x7F00, 64, dtype=np.uint16)
    backend = vc.CudaBackend(0)
    fake.emulate(backend, program, [bits, bits], vecadd_emulation(np.uint16))
    (out,) = backend.dispatch(program, [bits, bits])  # bits in: works today
    assert out.dtype == vc.program.DTYPES["bf16"].numpy
    # the dtype vyre_cuda returns for bf16 must be accepted back as an input (round trip)
    (again,) = backend.dispatch(program, [out, out])
    assert np.array_equal(again.view(np.uint16), (out.view(np.uint16) * 2).astype(np.uint16))
    backend.plan_info(program, [out, out])
    backend.close()


@scenario
def device_facts_come_from_the_driver_at_plan_time(fake):
    # copy engines are a device attribute; free memory is read when an elementwise dispatch is
    # planned (a plan miss), never on the dispatch path of a planned one
    from vyre_cuda import _driver

    backend = vc.CudaBackend(0)
    assert backend.caps.copy_engines == 3, backend.caps  # the fake's ASYNC_ENGINE_COUNT
    elementwise = Program(VECADD.kernel, VECADD.buffers, name="vecadd_elementwise", elementwise=True)
    a, b = pair(1 << 14)
    fake.emulate(backend, elementwise, [a, b], vecadd_emulation(np.float32))
    info = backend.plan_info(elementwise, [a, b])
    _driver.make_current(backend.context_handle)
    free, total = _driver.mem_get_info()
    pool = backend._core.resources.dpool
    reachable = free + pool.stats()["cached_bytes"] + max(0, pool.reserved_bytes() - pool.async_stats()["live_bytes"])
    assert info.stream.budget == reachable - reachable // 10 < total - total // 10, (info.stream, free, total)
    (out,) = backend.dispatch(elementwise, [a, b])
    assert np.array_equal(out, a + b), "elementwise vecadd gave a wrong result"
    fake.fail("cuMemGetInfo", "CUDA_ERROR_INVALID_VALUE", sticky=True)
    try:
        for _ in range(3):  # planned: no cuMemGetInfo (it would fail)
            a, b = pair(1 << 14)
            (out,) = backend.dispatch(elementwise, [a, b])
            assert np.array_equal(out, a + b), "elementwise vecadd gave a wrong result"
        # a plan miss of a program that is not elementwise reads nothing either (same slab: the
        # pool reuses its cached block, so the pool's own budget check is not reached)
        (out,) = backend.dispatch(VECADD, [a, b])
        assert np.array_equal(out, a + b), "vecadd gave a wrong result"
        err = raises(vc.BackendError, backend.plan_info, elementwise, [a, b])  # planning it again does
        assert "cuMemGetInfo" in str(err), err
    finally:
        fake.clear_failures()
    backend.close()


# ------------------------------------------------------------------ planning outside the core
@scenario
def a_plan_miss_is_planned_outside_the_core_for_every_entry_point(fake):
    # the core raises PlanMiss with nothing held; the backend plans (counted once, as a call of
    # its own, so that close() waits for it: the dispatch's call has left the core, with its
    # input views) and calls again; inputs given as an iterator survive the retry
    backend = vecadd_backend(fake)
    inside = []
    plan = backend._plan

    def watched(*args, **kw):
        inside.append(backend._core.busy)
        return plan(*args, **kw)

    backend._plan = watched
    for k, (name, entry) in enumerate(ENTRIES.items()):
        a, b = pair(1000 + 16 * k)  # a new length: a plan miss
        got = entry(backend, a, b)
        out = got.outputs[0] if name == "dispatch_timed" else got[0]
        assert np.array_equal(out, a + b), f"{name}: wrong result after a plan miss"
    a, b = pair(2000)
    (out,) = backend.dispatch(VECADD, iter([a, b]))
    assert np.array_equal(out, a + b), "inputs given as an iterator: wrong result after a plan miss"
    out = np.empty(a.size, np.float32)
    backend.dispatch_into(VECADD, (x for x in (a, b)), iter([out]))
    assert np.array_equal(out, a + b), "dispatch_into with iterators: wrong result after a plan miss"
    assert len(inside) == len(ENTRIES) + 1, inside  # one plan per miss; the second call hits
    assert inside == [1] * len(inside), f"planned with the dispatch's own call still in the core: {inside}"
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    backend.close()


@scenario
def autotune_measures_without_reentering_dispatch(fake):
    # autotune=True on a plan miss measures through the core's measuring step, never through
    # the public entry points (they are refused here while the miss is planned)
    import os
    import tempfile

    from vyre_cuda import tuning

    backend = vecadd_backend(fake, 5000)
    a, b = pair(5000)
    entries = {name: getattr(backend, name) for name in ("dispatch", "dispatch_timed", "dispatch_async")}

    def refused(*args, **kw):
        raise AssertionError("autotune re-entered a dispatch entry point")

    old = os.environ.get("VYRE_CUDA_CACHE_DIR")
    with tempfile.TemporaryDirectory() as folder:
        os.environ["VYRE_CUDA_CACHE_DIR"] = folder
        tuning.forget_memory()
        before = tuning.stats()["tunes_measured"]
        plan = backend._plan

        depth = [0]  # (the tune's own plans come through here too: refused until the outermost returns)

        def planning(*args, **kw):
            depth[0] += 1
            for name in entries:
                setattr(backend, name, refused)
            try:
                return plan(*args, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    for name, fn in entries.items():
                        setattr(backend, name, fn)

        backend._plan = planning
        try:
            (out,) = backend.dispatch(VECADD, [a, b], vc.DispatchConfig(autotune=True))
        finally:
            del backend._plan
            tuning.forget_memory()
            if old is None:
                os.environ.pop("VYRE_CUDA_CACHE_DIR", None)
            else:
                os.environ["VYRE_CUDA_CACHE_DIR"] = old
    assert np.array_equal(out, a + b), "autotuned vecadd gave a wrong result"
    assert tuning.stats()["tunes_measured"] == before + 1, tuning.stats()
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    backend.close()


if __name__ == "__main__":
    SCENARIOS.main(FakeDriver())
