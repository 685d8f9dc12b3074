"""Load, leaks and concurrency: a 200,000-dispatch soak with flat pools and RSS, and eight threads
dispatching different programs on one backend and on two, every result checked against numpy.

The soak prints its figures (dispatches/s, RSS, pool bytes, streams, events) and, when $OUT is
set, writes them to $OUT/soak.json.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp

SOAK_DISPATCHES = 200_000
CHECKPOINT = 50_000
# RSS bound, measured between the first checkpoint (50,000 dispatches after a 2,000-dispatch
# warm-up) and the end (150,000 dispatches later), so allocator warm-up (pymalloc arenas, glibc
# heaps, numpy's small-array cache) is behind it: 4 MiB over 150,000 dispatches is 28 bytes per
# dispatch, less than the smallest object a dispatch could leak (a Python int or float is 24-32
# bytes, a pooled 4 KiB buffer far more), while a steady process moves by at most a few
# allocator arenas (1 MiB each). Gross growth from the warm-up to the end is bounded at 16 MiB.
SOAK_RSS_STEADY_LIMIT = 4 << 20
SOAK_RSS_TOTAL_LIMIT = 16 << 20
# Python objects tracked by the collector: a leak of one per dispatch would add 150,000
SOAK_OBJECTS_LIMIT = 1_000
FLAT_KEYS = (
    "device_pool_live_bytes",
    "device_pool_allocated_bytes",
    "device_pool_cached_bytes",
    "pinned_pool_live_bytes",
    "pinned_pool_cached_bytes",
    "streams_live",
    "streams_created",
    "events_live",
    "events_created",
    "leaked_allocations",
    "failed_dispatches",
    "device_pool_misses",
    "pinned_pool_misses",
    "prepared_plans",
)
LIVE_KEYS = ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pick(snap: dict, keys) -> dict:
    return {k: snap[k] for k in keys}


def process_resources(backend) -> dict:
    """Things a leak would grow besides memory: file descriptors, threads, loaded modules."""
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "modules": len(backend._modules),
    }


@pytest.mark.slow
def test_soak_200k_dispatches_flat_pools_and_rss(fresh_backend, rng, capsys):
    backend = fresh_backend
    prog = bp.vecadd_f32()
    n = 1024
    # a few different input pairs, rotated, so a stale readback could not pass for a fresh one
    pairs = []
    for _ in range(8):
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        pairs.append((a, b, a + b))
    dst = np.empty(n, np.float32)
    bad = pairs[0][1].astype(np.float64)

    def one(k):
        a, b, ref = pairs[k & 7]
        mode = k % 4
        if mode == 0:
            (out,) = backend.dispatch(prog, [a, b])
        elif mode == 1:
            out = backend.dispatch_into(prog, [a, b], [dst])[0]
        elif mode == 2:
            (out,) = backend.dispatch_async(prog, [a, b]).result()
        else:
            (out,) = backend.dispatch(prog, [a, b])
            if k % 1000 == 3:  # the error path is soaked too
                with pytest.raises(vc.ValidationError):
                    backend.dispatch(prog, [a, bad])
        if not np.array_equal(out, ref):
            raise AssertionError(f"dispatch {k}: wrong result")

    warm = 2_000  # pools, plan cache, allocator arenas settle
    for k in range(warm):
        one(k)
    per = backend.plan_info(prog, list(pairs[0][:2])).layout
    gc.collect()
    snap0 = backend.telemetry.snapshot()
    res0 = process_resources(backend)
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    checkpoints = []
    for k in range(warm, warm + SOAK_DISPATCHES):
        one(k)
        done = k - warm + 1
        if done % CHECKPOINT == 0:
            gc.collect()
            checkpoints.append(
                {
                    "after": done,
                    "rss_bytes": rss_bytes(),
                    "objects": len(gc.get_objects()),
                    **pick(backend.telemetry.snapshot(), FLAT_KEYS),
                    **process_resources(backend),
                }
            )
    elapsed = time.perf_counter() - t0
    snap1 = backend.telemetry.snapshot()
    rss1 = rss_bytes()
    first, last = checkpoints[0], checkpoints[-1]
    grew = {key: snap1[key] - snap0[key] for key in snap1 if isinstance(snap1[key], int)}

    figures = {
        "dispatches": SOAK_DISPATCHES,
        "seconds": round(elapsed, 3),
        "dispatches_per_s": round(SOAK_DISPATCHES / elapsed),
        "rss_before_bytes": rss0,
        "rss_after_bytes": rss1,
        "rss_growth_bytes": rss1 - rss0,
        "rss_steady_growth_bytes": last["rss_bytes"] - first["rss_bytes"],
        "objects_steady_growth": last["objects"] - first["objects"],
        "before": pick(snap0, FLAT_KEYS),
        "after": pick(snap1, FLAT_KEYS),
        "counter_growth": grew,
        "resources_before": res0,
        "checkpoints": checkpoints,
    }
    with capsys.disabled():
        print(
            f"\nsoak: {SOAK_DISPATCHES:,} vecadd dispatches of {n} f32 in {elapsed:.2f} s "
            f"= {SOAK_DISPATCHES / elapsed:,.0f} dispatches/s; RSS {rss0 / 2**20:.1f} MiB -> "
            f"{rss1 / 2**20:.1f} MiB ({(rss1 - rss0) / 2**20:+.2f} MiB; "
            f"{figures['rss_steady_growth_bytes'] / 2**20:+.2f} MiB over the last {SOAK_DISPATCHES - CHECKPOINT:,}); "
            f"objects {figures['objects_steady_growth']:+d}; device pool "
            f"allocated {snap1['device_pool_allocated_bytes']:,} B (live {snap1['device_pool_live_bytes']}), "
            f"pinned cached {snap1['pinned_pool_cached_bytes']:,} B (live {snap1['pinned_pool_live_bytes']}), "
            f"streams {snap1['streams_created']} created / {snap1['streams_live']} live, "
            f"events {snap1['events_created']} created / {snap1['events_live']} live"
        )
    out_dir = os.environ.get("OUT")
    if out_dir and os.path.isdir(out_dir):
        with open(os.path.join(out_dir, "soak.json"), "w") as f:
            json.dump(figures, f, indent=1)

    # zero growth: pools, streams, events, misses, failures, leaks, plans, modules, fds, threads
    assert pick(snap1, FLAT_KEYS) == pick(snap0, FLAT_KEYS), figures
    for c in checkpoints:
        assert pick(c, FLAT_KEYS) == pick(snap0, FLAT_KEYS), figures
        assert {k: c[k] for k in res0} == res0, figures
    assert snap1["device_pool_live_bytes"] == 0 and snap1["streams_live"] == 0 and snap1["events_live"] == 0
    # the work counters grew by exactly the work done: one upload, one readback, one launch and
    # one wait per dispatch (the refused calls on the error path moved nothing)
    exact = {
        "dispatches": SOAK_DISPATCHES,
        "launches": SOAK_DISPATCHES,
        "sync_points": SOAK_DISPATCHES,
        "h2d_bytes": SOAK_DISPATCHES * per.h2d_bytes,
        "d2h_bytes": SOAK_DISPATCHES * per.d2h_bytes,
        "cooperative_launches": 0,
        "split_launches": 0,
    }
    assert {k: grew[k] for k in exact} == exact, figures
    # bounded memory: see SOAK_RSS_* and SOAK_OBJECTS_LIMIT for the bounds and why
    assert figures["rss_steady_growth_bytes"] < SOAK_RSS_STEADY_LIMIT, figures
    assert rss1 - rss0 < SOAK_RSS_TOTAL_LIMIT, figures
    assert figures["objects_steady_growth"] < SOAK_OBJECTS_LIMIT, figures


# ------------------------------------------------------------------ concurrency
_AXPY_INPLACE = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* x, float* y, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_binding_count(p, 1)) y[i] = 2.0f * x[i] + y[i];
}
"""
AXPY = Program(Kernel.cuda(_AXPY_INPLACE), [BufferDecl.read("x", 0, "f32"), BufferDecl.read_write("y", 1, "f32")])
BLOCK_SUM = bp.block_sum_u32(64, workgroup=256)
SCAN = bp.inclusive_scan_u32()
VECADDS = {d: bp.vecadd(d) for d in ("f32", "i32", "f64", "u16")}
# grid-sync dispatches in the concurrent tests use a small grid-stride grid: two cooperative
# kernels from two backends (two modules, no shared gate) must both fit on the device at once
SCAN_CFG = DispatchConfig(grid_override=(8, 1, 1))


def _ints(r, dtype, n):
    info = np.iinfo(dtype)
    return r.integers(max(info.min, -(2**20)), min(info.max, 2**20), n, dtype=dtype)


def _vecadd_worker(dtype):
    prog = VECADDS[dtype]
    npd = np.dtype(prog.buffers[0].dtype.numpy)

    def work(backend, r, k):
        n = int(r.integers(1, 50_000))
        if npd.kind == "f":
            a, b = r.standard_normal(n).astype(npd), r.standard_normal(n).astype(npd)
        else:
            a, b = _ints(r, npd, n), _ints(r, npd, n)
        if k % 3 == 1:
            (out,) = backend.dispatch_async(prog, [a, b]).result()
        elif k % 3 == 2:
            out = backend.dispatch_into(prog, [a, b], [np.empty(n, npd)])[0]
        else:
            (out,) = backend.dispatch(prog, [a, b])
        np.testing.assert_array_equal(out, (a + b).astype(npd))

    return work


def _block_sum_worker(backend, r, k):
    x = r.integers(0, 1000, 64 * 256, dtype=np.uint32)
    (sums,) = backend.dispatch(BLOCK_SUM, [x])
    np.testing.assert_array_equal(sums, x.reshape(64, 256).sum(axis=1, dtype=np.uint32))


def _axpy_worker(backend, r, k):
    n = int(r.integers(1, 30_000))
    x, y = r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)
    y0 = y.copy()
    (out,) = backend.dispatch(AXPY, [x, y])
    np.testing.assert_array_equal(out, np.float32(2.0) * x + y0)
    np.testing.assert_array_equal(y, y0)  # borrowed, never written


def _scan_worker(backend, r, k):
    n = int(r.integers(1, 100_000))
    x = r.integers(0, 400, n, dtype=np.uint32)
    (y, _) = backend.dispatch(SCAN, [x], SCAN_CFG)
    np.testing.assert_array_equal(y, np.cumsum(x, dtype=np.uint32))


def _async_batch_worker(backend, r, k):
    # several dispatches in flight from one thread, results taken out of order
    prog = VECADDS["f32"]
    batch = []
    for _ in range(4):
        n = int(r.integers(1, 20_000))
        a, b = r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)
        batch.append((backend.dispatch_async(prog, [a, b], timed=bool(k & 1)), a + b))
    for pending, ref in reversed(batch):
        (out,) = pending.result()
        np.testing.assert_array_equal(out, ref)


def _refusal_worker(backend, r, k):
    # good dispatches interleaved with refusals: errors on one thread never disturb the others
    prog = VECADDS["f32"]
    n = int(r.integers(1, 10_000))
    a, b = r.standard_normal(n).astype(np.float32), r.standard_normal(n).astype(np.float32)
    with pytest.raises(vc.ValidationError):
        backend.dispatch(prog, [a, b.astype(np.float64)])
    with pytest.raises(vc.ValidationError):
        backend.dispatch_into(prog, [a, b], [np.empty(n + 1, np.float32)])
    (out,) = backend.dispatch(prog, [a, b])
    np.testing.assert_array_equal(out, a + b)


WORKERS = [
    ("vecadd_f32", _vecadd_worker("f32")),
    ("vecadd_i32", _vecadd_worker("i32")),
    ("vecadd_f64", _vecadd_worker("f64")),
    ("vecadd_u16", _vecadd_worker("u16")),
    ("block_sum", _block_sum_worker),
    ("axpy_in_place", _axpy_worker),
    ("scan_grid_sync", _scan_worker),
    ("async_batches", _async_batch_worker),
]


def _run_threads(backends, rng, iterations, workers=WORKERS, timeout=300):
    assert len(workers) == 8
    seeds = rng.integers(0, 2**32, len(workers))
    start = threading.Barrier(len(workers))
    errors, done = [], []

    def body(index, name, work):
        backend = backends[index % len(backends)]
        r = np.random.default_rng(int(seeds[index]))
        try:
            start.wait()
            for k in range(iterations):
                work(backend, r, k)
                if k % 16 == 15:
                    _refusal_worker(backend, r, k)
            done.append(name)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append((name, exc))

    threads = [
        threading.Thread(target=body, args=(i, name, work), name=f"vyre-{name}", daemon=True)
        for i, (name, work) in enumerate(workers)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a dispatching thread hung"
    assert not errors, errors[0]
    assert sorted(done) == sorted(name for name, _ in workers)


def _warm(backend):
    # compile and load every program once, so the threads contend on dispatch, not on NVRTC
    r = np.random.default_rng(0)
    for _, work in WORKERS:
        work(backend, r, 0)


def test_eight_threads_one_backend(fresh_backend, rng):
    _warm(fresh_backend)
    before = pick(fresh_backend.telemetry.snapshot(), LIVE_KEYS)
    _run_threads([fresh_backend], rng, iterations=150)
    snap = fresh_backend.telemetry.snapshot()
    assert pick(snap, LIVE_KEYS) == before
    assert snap["failed_dispatches"] == 0 and snap["leaked_allocations"] == 0
    assert not fresh_backend.lost


def test_eight_threads_two_backends(rng):
    with vc.CudaBackend(0) as one, vc.CudaBackend(0) as two:
        _warm(one)
        _warm(two)
        _run_threads([one, two], rng, iterations=150)
        for backend in (one, two):
            snap = backend.telemetry.snapshot()
            assert all(snap[k] == 0 for k in LIVE_KEYS), pick(snap, LIVE_KEYS)
            assert snap["failed_dispatches"] == 0 and snap["leaked_allocations"] == 0


def test_threads_share_one_program_object_across_two_backends(rng):
    # the same Program object planned and loaded on two backends at once, from eight threads
    prog = VECADDS["f32"]
    work = _vecadd_worker("f32")
    with vc.CudaBackend(0) as one, vc.CudaBackend(0) as two:
        _run_threads([one, two], rng, iterations=200, workers=[(f"vecadd_{i}", work) for i in range(8)])
        for backend in (one, two):
            assert backend.plan_info(prog, [np.ones(4, np.float32)] * 2).kernel.entry == "vyre_main"
            assert all(backend.telemetry.snapshot()[k] == 0 for k in LIVE_KEYS)
