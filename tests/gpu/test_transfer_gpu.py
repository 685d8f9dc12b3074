"""The transfer engine on the GPU: large borrowed buffers through the staging ring, page-locked
buffers by direct DMA, steady state without allocations, and one owner for every in-flight path.

Most tests use a backend with a small ring (1 MiB chunks, 2 of them) so every window and ring
boundary is crossed by buffers of a few MiB; the default ring is covered by the allocation and
concurrency tests.
"""

from __future__ import annotations

import _thread
import gc
import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp

MIB = 1 << 20
LIVE_KEYS = ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")
HEAD = '#include "vyre_cuda.cuh"\n'

# out[i] = a[i] ^ 0x5A: every byte transformed, so a misplaced or stale byte shows
XOR_U8 = Program(
    Kernel.cuda(
        HEAD
        + r"""
VYRE_KERNEL vyre_main(const unsigned char* a, unsigned char* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_binding_count(p, 0)) out[i] = a[i] ^ 0x5Au;
}"""
    ),
    [BufferDecl.read("a", 0, "u8"), BufferDecl.output("out", 1, "u8")],
)

# x[i] = 3 * x[i] + y[i] in place (an in-out buffer beside a plain input)
AXPY_RW = Program(
    Kernel.cuda(
        HEAD
        + r"""
VYRE_KERNEL vyre_main(unsigned int* x, const unsigned int* y, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_binding_count(p, 0)) x[i] = 3u * x[i] + y[i];
}"""
    ),
    [BufferDecl.read_write("x", 0, "u32"), BufferDecl.read("y", 1, "u32")],
)


def _ranged(n_out: int, start: int, end: int) -> Program:
    # out = a * 2 + 1 over a static-size output; only out[start:end) (bytes) comes back
    return Program(
        Kernel.cuda(
            HEAD
            + r"""
VYRE_KERNEL vyre_main(const unsigned int* a, unsigned int* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_binding_count(p, 1)) out[i] = 2u * a[i] + 1u;
}"""
        ),
        [
            BufferDecl.read("a", 0, "u32", count=n_out),
            BufferDecl.output("out", 1, "u32", count=n_out, output_byte_range=(start, end)),
        ],
    )


def live(backend) -> dict:
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in LIVE_KEYS}


def threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def small_ring():
    b = vc.CudaBackend(0, staging_chunk_bytes=MIB, staging_chunks=2, copy_threads=3)
    yield b
    b.close()


# sizes straddling the 1 MiB windows: a byte short, exact, a byte past, several windows
BOUNDARY_SIZES = [MIB - 1, MIB, MIB + 1, 2 * MIB - 300, 2 * MIB, 2 * MIB + 17, 3 * MIB + 1, 5 * MIB + 3]


@pytest.mark.parametrize("nbytes", BOUNDARY_SIZES)
def test_ring_boundaries_input_and_output(small_ring, rng, nbytes):
    a = rng.integers(0, 256, nbytes, dtype=np.uint8)
    assert not small_ring.plan_info(XOR_U8, [a]).mirror  # through the ring
    (out,) = small_ring.dispatch(XOR_U8, [a])
    np.testing.assert_array_equal(out, a ^ 0x5A)
    # again into a poisoned caller array (a stale byte would survive)
    dst = np.full(nbytes, 0xA5, np.uint8)
    small_ring.dispatch_into(XOR_U8, [a], [dst])
    np.testing.assert_array_equal(dst, a ^ 0x5A)
    snap = small_ring.telemetry.snapshot()
    assert snap["ring_chunks"] >= 2 and snap["staged_h2d_bytes"] > 0 and snap["direct_h2d_bytes"] == 0


@pytest.mark.parametrize("n", [MIB // 4 - 1, MIB // 4 + 1, 3 * MIB // 4 + 5])
def test_ring_read_write_buffer_and_second_input(small_ring, rng, n):
    x = rng.integers(0, 2**31, n, dtype=np.uint32)
    y = rng.integers(0, 2**31, n, dtype=np.uint32)
    (out,) = small_ring.dispatch(AXPY_RW, [x, y])
    np.testing.assert_array_equal(out, (3 * x.astype(np.uint64) + y).astype(np.uint32))


@pytest.mark.parametrize(
    "start,end", [(0, 4 * (MIB // 4)), (4 * 1000, 4 * (MIB // 2 + 3)), (4 * (MIB // 4), 4 * (3 * MIB // 4))]
)
def test_output_byte_range_through_the_ring(small_ring, rng, start, end):
    n = 3 * MIB // 4 + 7  # 3 MiB of u32: the slab streams through the 1 MiB ring
    prog = _ranged(n, start, end)
    a = rng.integers(0, 2**31, n, dtype=np.uint32)
    (out,) = small_ring.dispatch(prog, [a])
    full = (2 * a.astype(np.uint64) + 1).astype(np.uint32)
    np.testing.assert_array_equal(out, full[start // 4 : end // 4])
    dst = np.full((end - start) // 4, 0xDEADBEEF, np.uint32)
    small_ring.dispatch_into(prog, [a], [dst])
    np.testing.assert_array_equal(dst, full[start // 4 : end // 4])


def test_large_outputs_are_recycled_host_memory(small_ring, rng):
    n = 2 * MIB
    a = rng.integers(0, 256, n, dtype=np.uint8)
    (out,) = small_ring.dispatch(XOR_U8, [a])
    np.testing.assert_array_equal(out, a ^ 0x5A)
    first = out.__array_interface__["data"][0]
    kept = out  # an output still alive is never handed out again
    (out2,) = small_ring.dispatch(XOR_U8, [a])
    assert out2.__array_interface__["data"][0] != first
    np.testing.assert_array_equal(kept, a ^ 0x5A)
    del out, kept
    b = rng.integers(0, 256, n, dtype=np.uint8)
    (out3,) = small_ring.dispatch(XOR_U8, [b])  # reuses the first block, every byte rewritten
    assert out3.__array_interface__["data"][0] == first
    np.testing.assert_array_equal(out3, b ^ 0x5A)
    assert small_ring.telemetry.snapshot()["output_cache_hits"] >= 1


def test_page_locked_helpers():
    x = vc.pinned_empty((3, 5), np.float64)
    assert x.shape == (3, 5) and x.dtype == np.float64 and x.flags.c_contiguous and x.flags.writeable
    assert vc.is_page_locked(x)
    z = vc.pinned_zeros(1000, np.int32)
    assert vc.is_page_locked(z) and not z.any()
    src = np.arange(12, dtype=np.int16).reshape(3, 4)
    c = vc.pinned_like(src)
    np.testing.assert_array_equal(c, src)
    assert vc.is_page_locked(c) and not vc.is_page_locked(src)
    e = vc.pinned_like(src, copy=False)
    assert e.shape == src.shape and e.dtype == src.dtype and vc.is_page_locked(e)
    assert vc.is_page_locked(x[1:])  # a view inside the block
    with pytest.raises(vc.ValidationError, match="Fix:"):
        vc.pinned_empty((-1, 2))


def test_mixed_page_locked_and_pageable_inputs(small_ring, rng):
    n = 3 * MIB // 4 + 11
    prog = bp.vecadd_f32()
    a = vc.pinned_like(rng.standard_normal(n).astype(np.float32))
    b = rng.standard_normal(n).astype(np.float32)
    small_ring.dispatch(prog, [a, b])
    small_ring.telemetry.reset()
    (out,) = small_ring.dispatch(prog, [a, b])
    np.testing.assert_array_equal(out, a + b)
    snap = small_ring.telemetry.snapshot()
    assert snap["direct_h2d_bytes"] == a.nbytes
    assert snap["staged_h2d_bytes"] == snap["h2d_bytes"] - a.nbytes
    # the page-locked output of dispatch_into is DMA'd straight into
    dst = vc.pinned_empty(n, np.float32)
    dst.fill(np.nan)
    small_ring.telemetry.reset()
    small_ring.dispatch_into(prog, [b, a], [dst])
    np.testing.assert_array_equal(dst, a + b)
    snap = small_ring.telemetry.snapshot()
    assert snap["direct_d2h_bytes"] == dst.nbytes and snap["staged_d2h_bytes"] == 0


def test_register_makes_a_caller_buffer_direct(small_ring, rng):
    n = 2 * MIB // 4
    prog = bp.vecadd_f32()
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    assert not vc.is_page_locked(a)
    with small_ring.register(a):
        assert vc.is_page_locked(a)
        small_ring.telemetry.reset()
        (out,) = small_ring.dispatch(prog, [a, b])
        np.testing.assert_array_equal(out, a + b)
        assert small_ring.telemetry.snapshot()["direct_h2d_bytes"] == a.nbytes
        with small_ring.register(a[10:]):  # a view inside a's range: the same registration
            pass
        assert vc.is_page_locked(a)
    assert not vc.is_page_locked(a)
    (out,) = small_ring.dispatch(prog, [a, b])
    np.testing.assert_array_equal(out, a + b)


def test_page_locked_input_freed_while_in_flight(rng):
    """A page-locked input dropped by the caller right after dispatch_async must stay alive (and
    unchanged) until the GPU has read it, even if its block is handed out again meanwhile."""
    prog = bp.vecadd_f32()
    n = 16 * MIB // 4
    with vc.CudaBackend(0) as g:
        a = vc.pinned_like(rng.standard_normal(n).astype(np.float32))
        b = rng.standard_normal(n).astype(np.float32)
        expected = a + b
        pending = g.dispatch_async(prog, [a, b])
        del a
        gc.collect()
        # an allocation of the same size would reuse a's block if it had gone back to the pool
        thief = vc.pinned_empty(n, np.float32)
        thief.fill(-1.0)
        (out,) = pending.result()
        np.testing.assert_array_equal(out, expected)
        del thief


def test_more_dispatches_in_flight_than_ring_chunks(small_ring, rng):
    prog = bp.vecadd_f32()
    n = 2 * MIB // 4 + 3
    batches = [
        (rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)) for _ in range(12)
    ]
    before = live(small_ring)
    pending = [small_ring.dispatch_async(prog, [a, b]) for a, b in batches]
    for (a, b), p in zip(batches, pending):
        (out,) = p.result()
        np.testing.assert_array_equal(out, a + b)
    # a second round in flight needs no new allocation
    small_ring.telemetry.reset()
    pending = [small_ring.dispatch_async(prog, [a, b]) for a, b in batches]
    outs = [p.result_into([np.empty(n, np.float32)])[0] for p in pending]
    for (a, b), out in zip(batches, outs):
        np.testing.assert_array_equal(out, a + b)
    snap = small_ring.telemetry.snapshot()
    assert snap["pinned_alloc_calls"] == 0 and snap["device_alloc_calls"] == 0, snap
    assert live(small_ring) == before


@pytest.mark.parametrize("per_buffer", [4 << 10, 4 * MIB, 64 * MIB, 256 * MIB])
def test_zero_allocations_over_200_repeats(rng, per_buffer):
    prog = bp.vecadd_f32()
    n = per_buffer // 4
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    with vc.CudaBackend(0) as g:
        for _ in range(2):
            g.dispatch(prog, [a, b])
        g.telemetry.reset()
        for _ in range(200):
            (out,) = g.dispatch(prog, [a, b])
        np.testing.assert_array_equal(out, a + b)
        snap = g.telemetry.snapshot()
        assert snap["pinned_alloc_calls"] == 0 and snap["device_alloc_calls"] == 0, snap
        assert snap["pinned_pool_misses"] == 0 and snap["device_pool_misses"] == 0, snap
        assert snap["ring_bytes"] <= 8 * MIB * 4
        assert snap["dispatches"] == 200
        if per_buffer >= MIB:
            # large outputs reuse the host blocks earlier outputs gave back
            assert snap["output_cache_hits"] >= 199 and snap["output_cache_misses"] <= 1, snap


def test_one_gib_per_buffer(rng):
    prog = bp.vecadd_f32()
    n = (1 << 30) // 4
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    with vc.CudaBackend(0) as g:
        g.telemetry.reset()
        (out,) = g.dispatch(prog, [a, b])
        np.testing.assert_array_equal(out, a + b)
        (out2,) = g.dispatch(prog, [b, a])
        np.testing.assert_array_equal(out2, a + b)
        snap = g.telemetry.snapshot()
        # the only page-locked allocation is the ring itself (once), however large the buffers
        assert snap["pinned_alloc_calls"] <= 1 and snap["ring_bytes"] == 32 * MIB, snap
        assert snap["staged_h2d_bytes"] >= 2 * 2 * (1 << 30)


def test_sixteen_async_64mib_no_allocation_after_warmup(rng):
    prog = bp.vecadd_f32()
    n = 64 * MIB // 4
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    with vc.CudaBackend(0) as g:
        for _ in range(2):
            for p in [g.dispatch_async(prog, [a, b]) for _ in range(16)]:
                p.result()
        g.telemetry.reset()
        pending = [g.dispatch_async(prog, [a, b]) for _ in range(16)]
        outs = [p.result() for p in pending]
        snap = g.telemetry.snapshot()
        assert snap["pinned_alloc_calls"] == 0 and snap["device_alloc_calls"] == 0, snap
        for (out,) in outs:
            np.testing.assert_array_equal(out, a + b)


def test_eight_threads_large_dispatches(rng):
    prog = bp.vecadd_f32()
    seeds = rng.integers(0, 2**32, 8)
    errors = []
    with vc.CudaBackend(0) as g:
        start = threading.Barrier(8)

        def worker(t):
            try:
                r = np.random.default_rng(int(seeds[t]))
                start.wait()
                for _ in range(4):
                    n = int(r.integers(MIB, 24 * MIB // 4))
                    a = r.standard_normal(n).astype(np.float32)
                    b = r.standard_normal(n).astype(np.float32)
                    if r.integers(0, 2):
                        (out,) = g.dispatch(prog, [a, b])
                    else:
                        out = np.empty(n, np.float32)
                        g.dispatch_async(prog, [a, b]).result_into([out])
                    np.testing.assert_array_equal(out, a + b)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(repr(exc))

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        snap = g.telemetry.snapshot()
        assert snap["streams_live"] == 0 and snap["device_pool_live_bytes"] == 0
        assert g._core.xfer.free_slots() == 4


def test_copy_threads_start_lazily_and_join_on_close(rng):
    base = threads_now()
    g = vc.CudaBackend(0, copy_threads=5)
    (out,) = g.dispatch(bp.vecadd_f32(), [np.ones(8, np.float32), np.ones(8, np.float32)])
    assert threads_now() == base  # small dispatches never start copy threads
    a = rng.standard_normal(8 * MIB).astype(np.float32)
    (out,) = g.dispatch(bp.vecadd_f32(), [a, a])
    np.testing.assert_array_equal(out, a + a)
    assert g.telemetry.snapshot()["copy_threads_live"] == 5
    assert threads_now() == base + 5
    g.close()
    assert threads_now() == base


def test_backend_dropped_without_close_joins_threads(rng):
    base = threads_now()
    g = vc.CudaBackend(0, copy_threads=4)
    a = rng.standard_normal(4 * MIB).astype(np.float32)
    g.dispatch(bp.vecadd_f32(), [a, a])
    assert threads_now() == base + 4
    del g
    gc.collect()
    assert threads_now() == base


_FAULT_JOIN = r"""
import json, os
import numpy as np
import vyre_cuda as vc
from vyre_cuda import BufferDecl, Kernel, Program
from vyre_cuda import builtin_programs as bp

def threads():
    return len(os.listdir("/proc/self/task"))

g = vc.CudaBackend(0, copy_threads=4)
g.dispatch(bp.vecadd_f32(), [np.ones(8, np.float32), np.ones(8, np.float32)])
base = threads()  # the driver's own threads exist by now
a = np.random.default_rng().standard_normal(4 << 20).astype(np.float32)
(out,) = g.dispatch(bp.vecadd_f32(), [a, a])
ok = bool(np.array_equal(out, a + a))
started = threads() - base
bad = Program(Kernel.cuda('#include "vyre_cuda.cuh"\n'
                          'VYRE_KERNEL vyre_main(const float* a, float* out, const vyre_u32* p) {\n'
                          '  const vyre_u64 i = vyre_global_id(); if (i == 0) __trap();\n'
                          '  if (i < vyre_count(p)) out[i] = a[i];\n}'),
              [BufferDecl.read("a", 0, "f32"), BufferDecl.output("out", 1, "f32")])
try:
    g.dispatch(bad, [a])
    err = None
except Exception as exc:
    err = type(exc).__name__
g.close()
print(json.dumps({"ok": ok, "started": started, "error": err, "after_close": min(0, threads() - base)}))
"""


@pytest.mark.faults
def test_copy_threads_joined_after_a_fault(run_python):
    proc = run_python(["-c", _FAULT_JOIN], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # the copy threads are gone after close (the driver may retire threads of its own too)
    assert result["ok"] and result["started"] == 4 and result["error"] == "DeviceLost", result
    assert result["after_close"] <= 0, result


SPIN = Program(
    Kernel.cuda(
        HEAD
        + r"""
VYRE_KERNEL vyre_main(const float* a, float* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) {
    const long long start = clock64();
    while (clock64() - start < 2500000000ll) { }  // about 1.3-1.8 s at H200 clocks
    out[i] = 2.0f * a[i];
  }
}"""
    ),
    [BufferDecl.read("a", 0, "f32"), BufferDecl.output("out", 1, "f32")],
)


@pytest.fixture
def python_sigint():
    """Python's own Ctrl-C handler for the test, whatever the launcher left: a shell starts a
    background job with SIGINT ignored, and interrupt_main() then does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.faults  # spins for seconds on purpose
@pytest.mark.parametrize("entry", ["dispatch", "result"])
def test_ctrl_c_while_waiting_leaves_the_work_owned(fresh_backend, rng, entry, python_sigint):
    a = rng.standard_normal(1024).astype(np.float32)
    fresh_backend.dispatch(bp.vecadd_f32(), [a, a])  # warm pools
    before = live(fresh_backend)
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt) as info:
        if entry == "dispatch":
            fresh_backend.dispatch(SPIN, [a])
        else:
            fresh_backend.dispatch_async(SPIN, [a]).result()
    timer.join()
    assert time.monotonic() - t0 < 1.0, "the interrupt was not seen while waiting"
    pending = info.value.pending
    assert isinstance(pending, vc.PendingDispatch) and not pending.is_ready()
    assert fresh_backend.telemetry.snapshot()["interrupted_waits"] == 1
    (out,) = pending.result()
    np.testing.assert_array_equal(out, 2.0 * a)
    del info, pending
    gc.collect()
    assert live(fresh_backend) == before
    (out,) = fresh_backend.dispatch(bp.vecadd_f32(), [a, a])
    np.testing.assert_array_equal(out, a + a)


@pytest.mark.faults  # spins past its timeout on purpose
def test_timeout_on_the_ring_path_keeps_the_work_owned(small_ring, rng):
    n = 3 * MIB // 4
    a = rng.standard_normal(n).astype(np.float32)
    before = live(small_ring)
    cfg = DispatchConfig(timeout=0.05)
    with pytest.raises(vc.DispatchFailed) as info:
        small_ring.dispatch(SPIN, [a], cfg)
    assert info.value.status == "timeout"
    pending = info.value.pending
    deadline = time.monotonic() + 60
    while True:
        try:
            (out,) = pending.result()
            break
        except vc.DispatchFailed as again:
            assert again.status == "timeout" and time.monotonic() < deadline
    np.testing.assert_array_equal(out, 2.0 * a)
    del info, pending
    gc.collect()
    assert live(small_ring) == before


def test_cooperative_async_returns_before_completion(backend, rng):
    """Cooperative launches of one module are ordered on the GPU, so dispatch_async returns at
    once and several can be in flight; each result is still right."""
    prog = bp.inclusive_scan_u32()
    xs = [rng.integers(0, 1000, 200_000 + 31 * k, dtype=np.uint32) for k in range(6)]
    info = backend.plan_info(prog, [xs[0]])
    if info.route.kind != "cooperative":
        pytest.skip(f"the scan routes {info.route.kind} here")
    pending = [backend.dispatch_async(prog, [x]) for x in xs]
    for x, p in zip(xs, pending):
        out = p.result()[0]
        np.testing.assert_array_equal(out, np.cumsum(x, dtype=np.uint64).astype(np.uint32))


def test_failed_acquire_releases_the_input_exports(fresh_backend):
    """A refusal while acquiring device memory must release every buffer export it took: a
    bytearray input can be resized afterwards, and nothing stays counted as live."""
    from cuda.bindings import driver as cu

    g = fresh_backend
    small = bytearray(np.arange(1024, dtype=np.uint32).tobytes())
    n_out = (4 << 30) // 4  # a 4 GiB static output
    prog = Program(
        Kernel.cuda(
            HEAD
            + r"""
VYRE_KERNEL vyre_main(const unsigned int* a, unsigned int* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_binding_count(p, 0)) out[i] = a[i];
}"""
        ),
        [BufferDecl.read("a", 0, "u32"), BufferDecl.output("out", 1, "u32", count=n_out)],
    )
    before = live(g)
    err, free_b, _ = cu.cuMemGetInfo()
    hog = []
    try:
        # leave less free memory than the dispatch needs (within 90% of what is free)
        want = free_b - (2 << 30)
        err, ptr = cu.cuMemAlloc(want)
        assert int(err) == 0, err
        hog.append(ptr)
        with pytest.raises(vc.DeviceOutOfMemory, match="Fix:"):
            g.dispatch(prog, [small])
        small.extend(b"\0" * 16)  # raises BufferError if an export were still held
        assert live(g) == before
    finally:
        for ptr in hog:
            cu.cuMemFree(ptr)
    a = np.arange(1024, dtype=np.uint32)
    (out,) = g.dispatch(prog, [a])
    np.testing.assert_array_equal(out[:1024], a)


def test_pending_after_close_is_refused_cleanly(rng):
    g = vc.CudaBackend(0)
    a = rng.standard_normal(2 * MIB).astype(np.float32)
    pending = g.dispatch_async(bp.vecadd_f32(), [a, a])
    g.close()
    with pytest.raises(vc.ValidationError, match="closed"):
        pending.result()
    del pending
    gc.collect()
