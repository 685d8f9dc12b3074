"""Child of tests/test_fake_lazy.py: the fake driver's lazy mode (stream work deferred as late as
CUDA allows), first through raw driver calls (ctypes), then under the real CudaBackend's routes.

The raw scenarios show that work is really deferred (device and page-locked memory unchanged
until something forces the stream; a page-locked source overwritten before the sync is what
lands), that event marks and cross-stream waits order exactly what CUDA orders, and that a
driver-call sequence missing a wait gives wrong data in lazy mode while eager mode passes it by
luck. The backend scenarios check every route against numpy with each stream op deferred.
Prints one JSON object: scenario name -> {"ok", "error", "skipped"} (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys

import numpy as np
from helpers.programs import cleared
from helpers.scenarios import Scenarios

import vyre_cuda as vc
from fakecuda import FakeDriver, Launch, array_at, vecadd_emulation
from vyre_cuda import DispatchConfig
from vyre_cuda import builtin_programs as bp

RNG = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
SCENARIOS = Scenarios()
scenario = SCENARIOS.register
VECADD = bp.vecadd_f32()
ACC = cleared(bp.vecadd("u32"))  # the emulation accumulates: out starts at zero
FRESH_DEVICE = 0xCD  # what the fake fills new device memory with
LARGE = 3 << 20  # f32 elements per buffer (12 MiB): the ring route, several windows each way
VP = ctypes.c_void_p
U64 = ctypes.c_uint64


# ------------------------------------------------------------------ raw driver calls
class Raw:
    """The fake's entry points called directly, on a retained primary context of device 0."""

    def __init__(self, fake: FakeDriver):
        self.fake = fake
        self.lib = fake.lib
        self.ctx = VP()
        self.check(self.lib.cuInit(0))
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), 0))
        self.check(self.lib.cuCtxSetCurrent(self.ctx))
        self.owned: list = []

    def check(self, status: int) -> None:
        assert status == 0, f"driver call failed with CUresult {status}"

    def device(self, nbytes: int) -> int:
        ptr = U64()
        self.check(self.lib.cuMemAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)))
        self.owned.append(("cuMemFree", U64(ptr.value)))
        return ptr.value

    def pinned(self, count: int, dtype=np.uint32) -> np.ndarray:
        ptr = VP()
        nbytes = count * np.dtype(dtype).itemsize
        self.check(self.lib.cuMemHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), 0))
        self.owned.append(("cuMemFreeHost", VP(ptr.value)))
        return array_at(ptr.value, dtype, count)

    def stream(self) -> VP:
        s = VP()
        self.check(self.lib.cuStreamCreate(ctypes.byref(s), 1))
        self.owned.append(("cuStreamDestroy", VP(s.value)))
        return VP(s.value)

    def event(self) -> VP:
        e = VP()
        self.check(self.lib.cuEventCreate(ctypes.byref(e), 2))
        self.owned.append(("cuEventDestroy", VP(e.value)))
        return VP(e.value)

    def htod(self, dst: int, src: np.ndarray, s: VP) -> None:
        self.check(self.lib.cuMemcpyHtoDAsync(U64(dst), VP(src.ctypes.data), ctypes.c_size_t(src.nbytes), s))

    def dtoh(self, dst: np.ndarray, src: int, s: VP) -> None:
        self.check(self.lib.cuMemcpyDtoHAsync(VP(dst.ctypes.data), U64(src), ctypes.c_size_t(dst.nbytes), s))

    def dtod(self, dst: int, src: int, nbytes: int, s: VP) -> None:
        self.check(self.lib.cuMemcpyDtoDAsync(U64(dst), U64(src), ctypes.c_size_t(nbytes), s))

    def close(self) -> None:
        for call, handle in reversed(self.owned):
            getattr(self.lib, call)(handle)
        self.lib.cuDevicePrimaryCtxRelease(0)


@contextlib.contextmanager
def lazy_raw(fake: FakeDriver):
    fake.set_lazy(True)
    raw = Raw(fake)
    try:
        yield raw
    finally:
        raw.close()
        fake.set_lazy(False)
    assert fake.lazy_pending() == 0


def words(n: int) -> np.ndarray:
    return RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)


@scenario
def an_upload_lands_at_the_sync_with_what_the_source_holds_then(fake):
    with lazy_raw(fake) as raw:
        n = 4096
        dev, host, s = raw.device(4 * n), raw.pinned(n), raw.stream()
        first, second = words(n), words(n)
        host[:] = first
        htod = fake.stats()["htod_copies"]
        raw.htod(dev, host, s)
        assert fake.stats()["htod_copies"] == htod + 1  # counted at enqueue, as in eager mode
        assert fake.lazy_pending() == 1
        device = array_at(dev, np.uint32, n)
        assert np.all(device.view(np.uint8) == FRESH_DEVICE), "the upload ran at enqueue"
        host[:] = second  # a host thread reusing the staging buffer too early
        raw.check(raw.lib.cuStreamSynchronize(s))
        assert np.array_equal(device, second), "the DMA did not read the page-locked source when it ran"
        assert fake.lazy_pending() == 0


@scenario
def a_pageable_source_is_read_at_the_call(fake):
    # CUDA stages pageable memory before the async copy returns: reusing it is allowed
    with lazy_raw(fake) as raw:
        n = 1000
        dev, s = raw.device(4 * n), raw.stream()
        first = words(n)
        host = first.copy()
        raw.htod(dev, host, s)
        host[:] = 0
        raw.check(raw.lib.cuStreamSynchronize(s))
        assert np.array_equal(array_at(dev, np.uint32, n), first)


@scenario
def a_readback_fills_the_host_buffer_only_when_forced(fake):
    with lazy_raw(fake) as raw:
        n = 2048
        dev, up, down, s = raw.device(4 * n), raw.pinned(n), raw.pinned(n), raw.stream()
        data = words(n)
        up[:] = data
        down[:] = 0
        raw.htod(dev, up, s)
        raw.dtoh(down, dev, s)
        assert fake.lazy_pending() == 2 and not down.any(), "a copy-out read the staging buffer before its D2H ran"
        assert raw.lib.cuStreamQuery(s) == 0  # a query runs the stream, then reports it done
        assert np.array_equal(down, data) and fake.lazy_pending() == 0


@scenario
def an_event_query_runs_exactly_up_to_the_mark(fake):
    with lazy_raw(fake) as raw:
        n = 512
        dev, one, two, s, e = raw.device(4 * n), raw.pinned(n), raw.pinned(n), raw.stream(), raw.event()
        a, b = words(n), words(n)
        one[:], two[:] = a, b
        raw.htod(dev, one, s)
        raw.check(raw.lib.cuEventRecord(e, s))
        raw.htod(dev, two, s)
        raw.check(raw.lib.cuEventQuery(e))
        assert np.array_equal(array_at(dev, np.uint32, n), a), "the event query did not run up to its mark"
        assert fake.lazy_pending() == 1, "the event query ran past its mark"
        raw.check(raw.lib.cuEventSynchronize(e))  # already reached: nothing more runs
        assert fake.lazy_pending() == 1
        raw.check(raw.lib.cuStreamSynchronize(s))
        assert np.array_equal(array_at(dev, np.uint32, n), b)


def cross_stream_copy(raw: Raw, with_wait: bool) -> tuple:
    """Stream A uploads ``data``; stream B copies it device-to-device and reads it back, after a
    wait on A's event when ``with_wait``. Only B is synchronised. Returns (data, what B read)."""
    n = 1024
    d1, d2 = raw.device(4 * n), raw.device(4 * n)
    up, down = raw.pinned(n), raw.pinned(n)
    a, b, e = raw.stream(), raw.stream(), raw.event()
    data = words(n)
    up[:] = data
    down[:] = 0
    raw.htod(d1, up, a)
    raw.check(raw.lib.cuEventRecord(e, a))
    if with_wait:
        raw.check(raw.lib.cuStreamWaitEvent(b, e, 0))
    raw.dtod(d2, d1, 4 * n, b)
    raw.dtoh(down, d2, b)
    raw.check(raw.lib.cuStreamSynchronize(b))
    return data, down.copy()


@scenario
def a_stream_wait_runs_the_other_stream_up_to_the_event_first(fake):
    with lazy_raw(fake) as raw:
        data, seen = cross_stream_copy(raw, with_wait=True)
        assert np.array_equal(seen, data), "stream B ran before the work of A that it waits for"


@scenario
def a_missing_wait_gives_wrong_data_in_lazy_mode_only(fake):
    # the same driver-call sequence, missing B's wait on A: eager mode passes it by luck
    raw = Raw(fake)
    try:
        data, seen = cross_stream_copy(raw, with_wait=False)
        assert np.array_equal(seen, data), "eager mode should run A's upload at its call"
    finally:
        raw.close()
    with lazy_raw(fake) as raw:
        data, seen = cross_stream_copy(raw, with_wait=False)
        assert np.all(seen.view(np.uint8) == FRESH_DEVICE), "lazy mode ran A's upload although nothing forced it"


@scenario
def a_never_recorded_event_is_no_wait(fake):
    with lazy_raw(fake) as raw:
        n = 64
        dev, host, a, b, e = raw.device(4 * n), raw.pinned(n), raw.stream(), raw.stream(), raw.event()
        host[:] = words(n)
        raw.htod(dev, host, a)
        raw.check(raw.lib.cuStreamWaitEvent(b, e, 0))
        raw.check(raw.lib.cuStreamSynchronize(b))
        assert fake.lazy_pending() == 1  # A's upload: B did not wait for it


@scenario
def launch_arguments_are_copied_at_enqueue(fake):
    with lazy_raw(fake) as raw:
        module, function = VP(), VP()
        image = b".version 8.0\n.target sm_90\n.entry lazy_probe()\n{\n}\n\0"
        raw.check(raw.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(image)))
        raw.check(raw.lib.cuModuleGetFunction(ctypes.byref(function), module, b"lazy_probe"))
        n = 256
        dev, host, s = raw.device(4 * n), raw.pinned(n), raw.stream()
        seen = []

        def probe(launch):  # the arguments, and whether the upload queued before it had landed
            landed = np.array_equal(array_at(dev, np.uint32, n), host)
            seen.append((launch.arg(0), launch.arg(1), landed))

        fake.emulators[function.value] = probe
        values = (U64 * 2)(11, 22)
        argp = (VP * 2)(ctypes.addressof(values), ctypes.addressof(values) + 8)

        def launch_kernel():
            raw.check(raw.lib.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, s, argp, None))

        try:
            host[:] = words(n)
            raw.htod(dev, host, s)
            launch_kernel()  # argument count unknown: it cannot be copied, so it runs now, in order
            assert seen == [(11, 22, True)] and fake.lazy_pending() == 0, seen
            raw.lib.fake_cuda_set_arg_count(function, 2)
            host[:] = words(n)
            raw.htod(dev, host, s)
            launches = fake.stats()["launches"]
            launch_kernel()
            assert fake.stats()["launches"] == launches + 1 and len(seen) == 1  # counted, not run
            values[0], values[1] = 33, 44  # the caller's argument memory changes after the enqueue
            raw.check(raw.lib.cuStreamSynchronize(s))
            assert seen[1] == (11, 22, True), seen
        finally:
            del fake.emulators[function.value]
            raw.lib.cuModuleUnload(module)


@scenario
def work_on_freed_memory_is_an_asynchronous_error_of_its_stream(fake):
    with lazy_raw(fake) as raw:
        n = 256
        host, a, b = raw.pinned(n), raw.stream(), raw.stream()
        dev = U64()
        raw.check(raw.lib.cuMemAlloc(ctypes.byref(dev), ctypes.c_size_t(4 * n)))
        raw.htod(dev.value, host, a)
        violations = fake.stats()["violations"]
        raw.check(raw.lib.cuMemFreeAsync(dev, b))  # ordered on B only: A still reads the memory
        assert fake.lazy_pending() == 1
        assert raw.lib.cuStreamSynchronize(a) == 700  # CUDA_ERROR_ILLEGAL_ADDRESS, from the sync
        assert fake.stats()["violations"] == violations + 1
        assert "run after its memory was freed" in fake.last_violation()
        assert raw.lib.cuStreamSynchronize(a) == 0  # reported once


@scenario
def destroying_a_stream_runs_its_queue(fake):
    with lazy_raw(fake) as raw:
        n = 128
        dev, host = raw.device(4 * n), raw.pinned(n)
        s = VP()
        raw.check(raw.lib.cuStreamCreate(ctypes.byref(s), 1))
        data = words(n)
        host[:] = data
        raw.htod(dev, host, s)
        raw.check(raw.lib.cuStreamDestroy(s))
        assert fake.lazy_pending() == 0 and np.array_equal(array_at(dev, np.uint32, n), data)


@scenario
def eager_mode_is_unchanged(fake):
    assert fake.set_lazy(False) is False  # the default
    raw = Raw(fake)
    try:
        n = 100
        dev, host, s = raw.device(4 * n), raw.pinned(n), raw.stream()
        data = words(n)
        host[:] = data
        raw.htod(dev, host, s)
        assert fake.lazy_pending() == 0 and np.array_equal(array_at(dev, np.uint32, n), data)
    finally:
        raw.close()


# ------------------------------------------------------------------ the real backend, lazily
@contextlib.contextmanager
def lazy_backend(fake: FakeDriver, sizes=(1000,), program=VECADD, emulation=None):
    """A CudaBackend whose every stream op is deferred; its plans for ``sizes`` emulated."""
    violations = fake.stats()["violations"]
    fake.set_lazy(True)
    backend = vc.CudaBackend(0)
    try:
        for n in sizes:
            fake.emulate(backend, program, inputs(n, program), emulation or vecadd_emulation(np.float32))
        yield backend
        assert fake.stats()["violations"] == violations, fake.last_violation()
    finally:
        backend.close()
        fake.set_lazy(False)
    assert fake.lazy_pending() == 0


def inputs(n: int, program=VECADD, pinned: bool = False) -> list:
    if program is ACC:
        return [words(n), words(n)]
    out = []
    for _ in range(2):
        x = RNG.standard_normal(n).astype(np.float32)
        if pinned:
            p = vc.pinned_empty(n, np.float32)
            p[:] = x
            x = p
        out.append(x)
    return out


@scenario
def small_mirror_dispatches_are_right(fake):
    with lazy_backend(fake, (1000, 1)) as backend:
        assert backend.plan_info(VECADD, inputs(1000)).mirror
        for n in (1000, 1, 1000):
            a, b = inputs(n)
            (out,) = backend.dispatch(VECADD, [a, b])
            assert np.array_equal(out, a + b), n


@scenario
def large_ring_dispatches_are_right_both_ways(fake):
    with lazy_backend(fake, (LARGE,)) as backend:
        assert not backend.plan_info(VECADD, inputs(LARGE)).mirror
        for pinned in (False, True, False):
            a, b = inputs(LARGE, pinned=pinned)
            (out,) = backend.dispatch(VECADD, [a, b])
            assert np.array_equal(out, a + b), f"pinned inputs: {pinned}"
            target = vc.pinned_empty(LARGE, np.float32) if pinned else np.empty(LARGE, np.float32)
            backend.dispatch_into(VECADD, [a, b], [target])
            assert np.array_equal(target, a + b), f"pinned inputs and output: {pinned}"


@scenario
def async_dispatches_in_flight_are_right(fake):
    with lazy_backend(fake, (1000, LARGE)) as backend:
        for n in (1000, LARGE):
            work = [inputs(n, pinned=k % 2 == 1) for k in range(3)]
            pending = [backend.dispatch_async(VECADD, ab) for ab in work]
            assert fake.lazy_pending() > 0, "the dispatches ran at enqueue"
            for k, (p, (a, b)) in enumerate(zip(pending, work)):
                if k == 1:
                    target = np.empty(n, np.float32)
                    p.result_into([target])
                    (out,) = [target]
                else:
                    (out,) = p.result()
                assert np.array_equal(out, a + b), (n, k)


@scenario
def device_outputs_are_right_without_a_readback(fake):
    # outputs that are device arrays are never read back to staging at the enqueue; an
    # outputs="device" dispatch_async taken into host arrays after all reads back late
    dev = DispatchConfig(outputs="device")
    with lazy_backend(fake, (1000,)) as backend:

        def d2h_ops() -> int:
            return backend.telemetry.snapshot()["d2h_ops"]

        def on_device(x):
            (arr,) = backend.dispatch(VECADD, [x, np.zeros_like(x)], dev)
            return arr

        for _ in range(2):
            a, b = inputs(1000)
            before = d2h_ops()
            (out,) = backend.dispatch(VECADD, [a, b], dev)
            assert d2h_ops() == before, "a blocking outputs='device' dispatch read its output back"
            assert np.array_equal(out.copy_to_host(), a + b)
            da, db = on_device(a), on_device(b)
            target = on_device(np.zeros_like(a))
            before = d2h_ops()
            backend.dispatch_into(VECADD, [da, db], [target])
            assert d2h_ops() == before, "dispatch_into a device array read its output back"
            assert np.array_equal(target.copy_to_host(), a + b)
            pending = [backend.dispatch_async(VECADD, [da, db], dev) for _ in range(3)]
            assert fake.lazy_pending() > 0, "the dispatches ran at enqueue"
            assert np.array_equal(pending[0].result()[0].copy_to_host(), a + b)
            host = np.full(1000, -1.0, np.float32)
            before = d2h_ops()
            pending[1].result_into([host])
            assert np.array_equal(host, a + b), "result_into a host array after outputs='device'"
            assert d2h_ops() == before + 1, "the late readback was not counted once"
            into_dev = on_device(np.zeros_like(a))
            pending[2].result_into([into_dev])
            assert np.array_equal(into_dev.copy_to_host(), a + b)
            (host_out,) = backend.dispatch(VECADD, [da, db])  # host outputs still read back
            assert np.array_equal(host_out, a + b)


@scenario
def outputs_all_written_in_place_take_a_params_only_slab(fake):
    # every input on the device and every output written in place: the slab holds the params
    # blocks only (no output region, no clear), at both sizes (mirror and ring plans)
    dev = DispatchConfig(outputs="device")
    with lazy_backend(fake, (1000, LARGE)) as backend:

        def counters() -> dict:
            return backend.telemetry.snapshot()

        def on_device(x):
            (arr,) = backend.dispatch(VECADD, [x, np.zeros_like(x)], dev)
            return arr

        for n in (1000, LARGE, 1000):
            a, b = inputs(n)
            da, db = on_device(a), on_device(b)
            target = on_device(np.full(n, -1.0, np.float32))
            full = backend.plan_info(VECADD, [da, db]).layout.bucket_bytes
            before = counters()
            backend.dispatch_into(VECADD, [da, db], [target])
            after = counters()
            assert np.array_equal(target.copy_to_host(), a + b), n
            # the plan's params blocks stay on the device (uploaded once, by its first such
            # dispatch): no slab, no upload
            slab = after["transient_alloc_bytes"] - before["transient_alloc_bytes"]
            assert slab == 0 < full, (n, slab, full)
            assert after["h2d_ops"] == before["h2d_ops"] and after["h2d_bytes"] == before["h2d_bytes"], n
            # the built-in vecadd's output is declared zeroed=False: nothing is cleared
            assert after["memset_ops"] == before["memset_ops"], "an output declared zeroed=False was cleared"
            assert after["in_place_outputs"] - before["in_place_outputs"] == 1
            # the plans dropped while a dispatch of one is queued (lazy: its launch runs at the
            # result): the resident block lives as long as that dispatch; a violation otherwise
            later = on_device(np.full(n, -1.0, np.float32))
            pending = backend.dispatch_async(VECADD, [db, da], outputs=[later])
            backend._core.clear_prepared()  # what a module eviction or the lookup's bound does
            gc.collect()
            assert pending.result()[0] is later and np.array_equal(later.copy_to_host(), a + b), n
            del pending
            gc.collect()
            before = counters()
            (out,) = backend.dispatch(VECADD, [da, db], dev)  # new arrays: in place too
            assert np.array_equal(out.copy_to_host(), a + b), n
            assert counters()["transient_alloc_bytes"] - before["transient_alloc_bytes"] <= 4096
            # an output that is also an input is copied from a full slab, and right
            backend.dispatch_into(VECADD, [da, db], [da])
            assert np.array_equal(da.copy_to_host(), a + b), n
            # a host input: the full slab, and right
            before = counters()
            backend.dispatch_into(VECADD, [a, db], [target])
            assert np.array_equal(target.copy_to_host(), a + b), n
            assert counters()["transient_alloc_bytes"] - before["transient_alloc_bytes"] > 4096


@scenario
def a_pipeline_of_dispatches_on_a_callers_stream_only_enqueues(fake):
    # 100 dependent steps x <- x + b on device arrays, each dispatch_async writing the next
    # array: nothing runs until the result is taken (lazy mode runs stream work only when the
    # host waits for it), and every step's array holds its partial sum after
    for n in (1000, 1 << 20):  # 4 MiB per buffer as well: a size past every small-dispatch path
        pipeline_only_enqueues(fake, n)


def pipeline_only_enqueues(fake, n: int) -> None:
    dev = DispatchConfig(outputs="device")
    steps = 100
    with lazy_backend(fake, (n,)) as backend:
        a, b = inputs(n)
        x0, db = (backend.dispatch(VECADD, [v, np.zeros_like(v)], dev)[0] for v in (a, b))
        arrays = [backend.dispatch(VECADD, [np.zeros_like(a), np.zeros_like(a)], dev)[0] for _ in range(steps)]
        stream = VP()
        assert fake.lib.cuStreamCreate(ctypes.byref(stream), 1) == 0
        try:
            cfg = DispatchConfig(stream=stream.value)
            queued = fake.lazy_pending()
            pending, cur = [], x0
            for nxt in arrays:
                pending.append(backend.dispatch_async(VECADD, [cur, db], cfg, outputs=[nxt]))
                cur = nxt
            assert fake.lazy_pending() - queued >= steps, "a dispatch waited for the stream"
            first = array_at(arrays[0].__cuda_array_interface__["data"][0], np.float32, n)  # (reads, forces nothing)
            assert not np.array_equal(first, a + b), "step 0 ran before its result was taken"
            (last,) = pending[-1].result()
            assert last is arrays[-1]
            want = a.copy()
            for k, p in enumerate(pending):
                want = want + b
                (got,) = p.result() if k < steps - 1 else (last,)
                assert got is arrays[k] and np.array_equal(got.copy_to_host(), want), k
            if n != 1000:
                return
            host = np.empty_like(a)
            (same,) = backend.dispatch_async(VECADD, [x0, db], cfg, outputs=[host]).result()
            assert same is host and np.array_equal(host, a + b), "a host output named at dispatch_async"
            named = backend.dispatch_async(VECADD, [x0, db], cfg, outputs=[arrays[0]])
            try:
                named.result_into([host])
                raise AssertionError("result_into of a dispatch with named outputs was taken")
            except vc.ValidationError as err:
                assert "outputs=" in err.message and str(err).splitlines()[-1].startswith("Fix: ")
            assert named.result()[0] is arrays[0]
            for bad in ([np.empty(1000, np.float64)], [np.empty(999, np.float32)], [arrays[0], host]):
                try:
                    backend.dispatch_async(VECADD, [x0, db], cfg, outputs=bad)
                    raise AssertionError(f"outputs {[(o.dtype, o.size) for o in bad]} were taken")
                except vc.ValidationError as err:
                    assert str(err).splitlines()[-1].startswith("Fix: "), err
            (again,) = backend.dispatch_async(VECADD, [x0, db], cfg, outputs=[host]).result()
            assert np.array_equal(again, a + b), "a dispatch after the refusals"
        finally:
            assert fake.lib.cuStreamDestroy(stream) == 0


@scenario
def outputs_declared_zeroed_false_are_not_zeroed(fake):
    # the built-in vecadd (its output declared zeroed=False) against the same program with the
    # output zeroed: right where the kernel writes, no memset or zeros for it, and what the
    # kernel does not write keeps what the memory held
    full, zeroed = VECADD, cleared(VECADD)
    assert not full.buffers[2].zeroed
    dev = DispatchConfig(outputs="device")
    with lazy_backend(fake, (1000, LARGE)) as backend:
        for n in (1000, LARGE):
            a, b = inputs(n)
            for prog, memsets in ((zeroed, 1), (full, 0)):
                before = backend.telemetry.snapshot()["memset_ops"]
                (out,) = backend.dispatch(prog, [a, b])
                assert np.array_equal(out, a + b), (n, prog is full)
                memset = backend.telemetry.snapshot()["memset_ops"] - before
                assert memset == (memsets if n == LARGE else 0), (n, prog is full, memset)  # small: zeros uploaded
            da, db = (backend.dispatch(VECADD, [v, np.zeros_like(v)], dev)[0] for v in (a, b))
            for prog, memsets in ((zeroed, 1), (full, 0)):
                target = backend.dispatch(VECADD, [np.full(n, 7.0, np.float32), np.zeros(n, np.float32)], dev)[0]
                before = backend.telemetry.snapshot()["memset_ops"]
                backend.dispatch_into(prog, [da, db], [target], DispatchConfig(elements=10))
                assert backend.telemetry.snapshot()["memset_ops"] - before == memsets, (n, prog is full)
                got = target.copy_to_host()
                assert np.array_equal(got[:10], (a + b)[:10])
                rest = 7.0 if prog is full else 0.0  # beyond the 10 elements the kernel wrote
                assert np.all(got[10:] == rest), (n, prog is full, got[10:12])


def accumulate(launch: Launch) -> None:
    """out += a + b per launch (u32): after N launches out = N (a + b)."""
    n = int(launch.words(launch.arg(3), 1)[0])
    a, b, out = (array_at(launch.arg(k), np.uint32, n) for k in range(3))
    out += a + b


@scenario
def graph_replayed_plans_are_right(fake):
    with lazy_backend(fake, (1000, LARGE), program=ACC, emulation=accumulate) as backend:
        for n in (1000, LARGE, 1000):
            for via in ("dispatch", "async"):
                a, b = inputs(n, ACC)
                cfg = DispatchConfig(fixpoint_iterations=6, graph=True)
                replays = backend.telemetry.snapshot()["graph_replays"]
                if via == "async":
                    (out,) = backend.dispatch_async(ACC, [a, b], cfg).result()
                else:
                    (out,) = backend.dispatch(ACC, [a, b], cfg)
                want = (a.astype(np.uint64) + b) * 6 % 2**32
                assert np.array_equal(out, want), (n, via)
                assert backend.telemetry.snapshot()["graph_replays"] >= replays


if __name__ == "__main__":
    SCENARIOS.main(FakeDriver())
