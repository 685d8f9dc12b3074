"""Transfer-engine experiments: the measurements behind the ring's defaults (notes/transfer-engine.md).

Run on a GPU machine after building in place::

    python benchmarks/transfer_sweep.py --out sweep.json

1. what the driver reports for page-locked, registered and pageable pointers (the detection the
   engine relies on);
2. device slabs: a cached bucket (a vector pop) against the stream-ordered pool
   (cuMemAllocFromPoolAsync + cuMemFreeAsync) per size;
3. vecadd (2 in + 1 out, numpy in and out) through the ring for several ring shapes and copy-thread
   counts, beside the driver's own pageable path measured in the same run;
4. the mirror/ring boundary: dispatch time at 256 KiB - 4 MiB per buffer on each path.
Medians; every figure is compared only within this run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import vyre_cuda as vc  # noqa: E402
from benchmarks.harness import hooks as _hooks  # noqa: E402
from vyre_cuda import builtin_programs as bp  # noqa: E402
from vyre_cuda.profile import session as profile_hooks  # noqa: E402

MIB = 1 << 20


def median_time(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check(cu_result):
    err = cu_result[0]
    if int(err) != 0:
        raise RuntimeError(f"driver call failed: {err}")
    return cu_result[1:] if len(cu_result) > 2 else (cu_result[1] if len(cu_result) == 2 else None)


def probe_pointers(report):
    from cuda.bindings import driver as cu

    out = {}
    pinned = vc.pinned_empty(1 << 20, np.uint8)
    out["pinned_empty whole"] = vc.is_page_locked(pinned)
    out["pinned_empty interior slice"] = vc.is_page_locked(pinned[4096:8192])
    pageable = np.ones(1 << 20, np.uint8)
    out["numpy pageable"] = vc.is_page_locked(pageable)
    reg = np.ones(4 << 20, np.uint8)
    addr = reg.ctypes.data
    check(cu.cuMemHostRegister(addr, 2 << 20, cu.CU_MEMHOSTREGISTER_PORTABLE))
    out["registered first half"] = _hooks.is_page_locked_address(addr, 2 << 20)
    out["straddles registered end"] = _hooks.is_page_locked_address(addr + (1 << 20), 2 << 20)
    out["unregistered second half"] = _hooks.is_page_locked_address(addr + (2 << 20), 1 << 20)
    attrs = [
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_BUFFER_ID,
    ]
    for name, ptr in (("pinned", pinned.ctypes.data + 4096), ("registered", addr + 4096)):
        res = cu.cuPointerGetAttributes(len(attrs), attrs, ptr)
        out[f"raw attributes {name}"] = repr(res)
    check(cu.cuMemHostUnregister(addr))
    out["after unregister"] = _hooks.is_page_locked_address(addr, 2 << 20)
    report["pointers"] = out
    print("pointer detection:", json.dumps(out, indent=1))


def probe_allocators(report, backend):
    from cuda.bindings import driver as cu

    rows = []
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = check(cu.cuMemPoolCreate(props))
    check(
        cu.cuMemPoolSetAttribute(
            pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(2**64 - 1)
        )
    )
    stream = check(cu.cuStreamCreate(1))
    for size in (4 << 10, 4 << 20, 64 << 20, 256 << 20, 1 << 30):
        ptr = check(cu.cuMemAlloc(size))
        check(cu.cuMemFree(ptr))

        def plain():
            p = check(cu.cuMemAlloc(size))
            check(cu.cuMemFree(p))

        def stream_ordered():
            p = check(cu.cuMemAllocFromPoolAsync(size, pool, stream))
            check(cu.cuMemFreeAsync(p, stream))

        def nothing():
            pass

        n = 200 if size <= (64 << 20) else 50
        row = dict(
            bytes=size,
            python_call_floor_us=median_time(nothing, n) * 1e6,
            cuMemAlloc_free_us=median_time(plain, min(n, 20)) * 1e6,
            stream_ordered_us=median_time(stream_ordered, n) * 1e6,
        )
        rows.append(row)
        print(
            f"alloc {size >> 10:>8} KiB: cuMemAlloc+Free {row['cuMemAlloc_free_us']:9.1f} us, "
            f"pool async alloc+free {row['stream_ordered_us']:7.1f} us"
        )
    check(cu.cuStreamSynchronize(stream))
    check(cu.cuStreamDestroy(stream))
    check(cu.cuMemPoolDestroy(pool))
    report["allocators"] = rows


def pageable_floor(a, b, out):
    """The driver's own pageable path from Python: H2D a, b; D2H out (no kernel): the copy cost."""
    from cuda.bindings import driver as cu

    n = a.nbytes
    da = check(cu.cuMemAlloc(n))
    db = check(cu.cuMemAlloc(n))
    stream = check(cu.cuStreamCreate(1))

    def run():
        check(cu.cuMemcpyHtoDAsync(da, a.ctypes.data, n, stream))
        check(cu.cuMemcpyHtoDAsync(db, b.ctypes.data, n, stream))
        check(cu.cuMemcpyDtoHAsync(out.ctypes.data, da, n, stream))
        check(cu.cuStreamSynchronize(stream))

    try:
        return median_time(run, 5 if n >= (256 << 20) else 15)
    finally:
        check(cu.cuMemFree(da))
        check(cu.cuMemFree(db))
        check(cu.cuStreamDestroy(stream))


def sweep(report, sizes, shapes):
    prog = bp.vecadd_f32()
    rng = np.random.default_rng(7)
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        ref = a + b
        out = np.empty_like(a)
        floor = pageable_floor(a, b, out)
        reps = 30 if nbytes <= (64 << 20) else 8
        print(f"-- {nbytes >> 20} MiB per buffer: driver pageable path (copies only) {floor * 1e3:.2f} ms")
        pa, pb = vc.pinned_like(a), vc.pinned_like(b)
        pout = vc.pinned_empty(n, np.float32)
        for chunk, chunks, threads in shapes:
            with vc.CudaBackend(0, staging_chunk_bytes=chunk, staging_chunks=chunks, copy_threads=threads) as g:
                (res,) = g.dispatch(prog, [a, b])
                assert np.array_equal(res, ref)
                t = median_time(lambda: g.dispatch(prog, [a, b]), reps)
                t_into = median_time(lambda: g.dispatch_into(prog, [a, b], [out]), reps)
                t_locked = median_time(lambda: g.dispatch_into(prog, [pa, pb], [pout]), reps)
                assert np.array_equal(pout, ref)
                g.telemetry.reset()
                g.dispatch(prog, [a, b])
                snap = g.telemetry.snapshot()
            gbs = 3 * nbytes / t / 1e9
            row = dict(
                bytes=nbytes,
                chunk=chunk,
                chunks=chunks,
                threads=threads,
                dispatch_s=t,
                dispatch_into_s=t_into,
                page_locked_s=t_locked,
                pageable_floor_s=floor,
                effective_gbs=gbs,
                effective_gbs_into=3 * nbytes / t_into / 1e9,
                effective_gbs_page_locked=3 * nbytes / t_locked / 1e9,
                ratio_to_pageable=t / floor,
                ring_chunks=snap["ring_chunks"],
                pinned_alloc_calls=snap["pinned_alloc_calls"],
                device_alloc_calls=snap["device_alloc_calls"],
            )
            rows.append(row)
            print(
                f"   chunk {chunk >> 20:>2} MiB x{chunks} threads {threads:>2}: dispatch {t * 1e3:8.2f} ms "
                f"({gbs:5.1f} GB/s eff, {t / floor:4.2f}x pageable), into {t_into * 1e3:8.2f} ms, "
                f"page-locked {t_locked * 1e3:8.2f} ms ({3 * nbytes / t_locked / 1e9:5.1f} GB/s)"
            )
    report["sweep"] = rows


def mirror_boundary(report):
    prog = bp.vecadd_f32()
    rng = np.random.default_rng(3)
    rows = []
    for nbytes in (128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20):
        n = nbytes // 4
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        row = dict(bytes=nbytes)
        for name, limit in (("mirror", 1 << 40), ("ring", 0)):
            with vc.CudaBackend(0) as g:
                _hooks.set_knobs(g, mirror_max=limit)
                (res,) = g.dispatch(prog, [a, b])
                assert np.array_equal(res, a + b)
                row[name + "_us"] = median_time(lambda: g.dispatch(prog, [a, b]), 200) * 1e6
        rows.append(row)
        print(
            f"boundary {nbytes >> 10:>5} KiB/buffer: mirror {row['mirror_us']:8.1f} us, ring {row['ring_us']:8.1f} us"
        )
    report["mirror_boundary"] = rows


def window_sweep(report):
    """Smallest window size against mid-size buffers (dispatch_into, pageable in and out)."""
    prog = bp.vecadd_f32()
    rng = np.random.default_rng(5)
    rows = []
    keep = vc.CudaBackend(0)  # initialises the driver and keeps the context for the Python calls
    try:
        for nbytes in (512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20):
            n = nbytes // 4
            a = rng.standard_normal(n).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32)
            out = np.empty_like(a)
            row = dict(bytes=nbytes, pageable_floor_us=pageable_floor(a, b, out) * 1e6)
            for w in (256 << 10, 512 << 10, 1 << 20):
                with vc.CudaBackend(0) as g:
                    _hooks.set_knobs(g, min_window=w)
                    g.dispatch_into(prog, [a, b], [out])
                    assert np.array_equal(out, a + b)
                    row[f"min_window_{w >> 10}k_us"] = (
                        median_time(lambda: g.dispatch_into(prog, [a, b], [out]), 100) * 1e6
                    )
            rows.append(row)
            print("window", {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()})
    finally:
        keep.close()
    report["windows"] = rows


def streaming_sweep(report, sizes=(4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)):
    """Staging copies with plain memcpy or non-temporal stores, copy threads and the readback
    window, against the driver's pageable path measured before and after each size."""
    prog = bp.vecadd_f32()
    rng = np.random.default_rng(11)
    rows = []
    stages = list(profile_hooks.stage_names())
    keep = vc.CudaBackend(0)
    try:
        for nbytes in sizes:
            n = nbytes // 4
            a = rng.standard_normal(n).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32)
            out = np.empty_like(a)
            ref = a + b
            reps = 200 if nbytes <= 4 * MIB else (40 if nbytes <= 64 * MIB else 10)
            floor0 = pageable_floor(a, b, out)
            configs = []
            for threads in (8, 15):
                for up, rb in ((0, 0), (1, 0), (0, 1), (1, 1)):
                    for rbw in (512 << 10, 1 << 20) if nbytes <= 16 * MIB else (512 << 10,):
                        configs.append((threads, up, rb, rbw))
            for threads, up, rb, rbw in configs:
                with vc.CudaBackend(0, copy_threads=threads) as g:
                    _hooks.set_knobs(
                        g,
                        min_readback_window=rbw,
                        stream_upload_max=(1 << 40) if up else 0,
                        stream_readback_max=(1 << 40) if rb else 0,
                    )
                    (res,) = g.dispatch(prog, [a, b])
                    assert np.array_equal(res, ref)
                    t = median_time(lambda: g.dispatch(prog, [a, b]), reps)
                    t_into = median_time(lambda: g.dispatch_into(prog, [a, b], [out]), reps)
                    assert np.array_equal(out, ref)
                    profiled = profile_hooks.profiled_dispatch(g)
                    per = [profiled(prog, [a, b])[1] for _ in range(min(reps, 50))]
                    st_med = {name: statistics.median(p[k] for p in per) / 1e3 for k, name in enumerate(stages)}
                rows.append(
                    dict(
                        bytes=nbytes,
                        threads=threads,
                        stream_upload=up,
                        stream_readback=rb,
                        min_readback_window=rbw,
                        dispatch_us=t * 1e6,
                        dispatch_into_us=t_into * 1e6,
                        stages_us=st_med,
                    )
                )
                print(
                    f"{nbytes >> 20:>4} MiB thr {threads:>2} nt_up {up} nt_rb {rb} rbw {rbw >> 10:>5}K: "
                    f"dispatch {t * 1e6:9.1f} us into {t_into * 1e6:9.1f} us | copy-in "
                    f"{st_med['staging_memcpy']:7.1f} wait {st_med['wait']:6.1f} copy-out {st_med['copy_out']:7.1f}"
                )
            floor1 = pageable_floor(a, b, out)
            floor = statistics.median([floor0, floor1])
            for row in rows:
                if row["bytes"] == nbytes:
                    row["pageable_floor_us"] = floor * 1e6
                    row["ratio_to_pageable"] = row["dispatch_us"] / (floor * 1e6)
            best = min((r for r in rows if r["bytes"] == nbytes), key=lambda r: r["dispatch_us"])
            print(
                f"{nbytes >> 20:>4} MiB driver pageable {floor0 * 1e6:.1f} / {floor1 * 1e6:.1f} us; best "
                f"{best['dispatch_us']:.1f} us = {best['ratio_to_pageable']:.3f}x (thr {best['threads']} "
                f"nt_up {best['stream_upload']} nt_rb {best['stream_readback']} "
                f"rbw {best['min_readback_window'] >> 10}K)"
            )
    finally:
        keep.close()
    report["streaming"] = rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="transfer-sweep.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=["windows", "boundary", "probes", "streaming"], default=None)
    args = ap.parse_args(argv)
    report = {}
    if args.only == "streaming":
        streaming_sweep(report)
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
        return 0
    if args.only == "windows":
        window_sweep(report)
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
        return 0
    backend = vc.CudaBackend(0)
    probe_pointers(report)
    probe_allocators(report, backend)
    mirror_boundary(report)
    window_sweep(report)
    shapes = [(8 * MIB, 4, 8), (16 * MIB, 4, 8), (8 * MIB, 4, 15)]
    sizes = [4 * MIB, 64 * MIB, 256 * MIB]
    if args.quick:
        shapes, sizes = shapes[:2], sizes[:2]
    sweep(report, sizes, shapes)
    backend.close()
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
