"""Several GPUs: DeviceGroup and vyre_cuda.dask against one GPU and the host-memory ceiling.

Every figure is a median over ``--reps`` timed passes after a warm-up pass; every target is a
ratio of two figures measured in this run:

- compute-bound: ``DeviceGroup.map`` of 64 independent dispatches of an FMA-loop kernel on every
  device vs one device (target >= 1.8x with two GPUs);
- transfer-bound: 64 dispatches of 64 MiB in and 64 MiB out (``out = 2 * x``), bytes moved per
  second vs the host-memory ceiling (a multi-threaded numpy copy, bytes copied per second, the
  best of 1..32 threads): pageable arrays into the caller's arrays and into new arrays, and
  page-locked arrays (``vyre_cuda.pinned_empty``, where the package has it) (target >= 0.8x);
- Dask: ``vyre_cuda.dask.map_blocks`` over a 16 GiB dask array of 64 MiB chunks, persisted on a
  LocalCluster with one worker per GPU, vs ``DeviceGroup.map`` over the same chunks in one process
  (target >= 0.7x); per-task overhead from 4 KiB chunks, Dask vs the group;
- one GPU through ``DeviceGroup([0])`` vs a plain ``CudaBackend(0)`` loop on the same work
  (target <= 1.05x), and the group's per-item overhead on 4 KiB dispatches.

On a machine with two GPUs and the extensions built::

    python benchmarks/bench_multi_gpu.py --out multi_gpu.json          # ~2 minutes
    python benchmarks/bench_multi_gpu.py --quick                       # small sizes, a smoke run
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import pathlib
import platform
import statistics
import sys
import threading
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
try:
    import vyre_cuda as vc
except ImportError:  # run from a checkout built in place, not installed
    sys.path.insert(0, str(HERE.parent))
    import vyre_cuda as vc
from vyre_cuda import BufferDecl, Kernel, Program  # noqa: E402

DEFAULT_OUT = HERE / "results" / "multi_gpu.json"
MIB = 1 << 20

_COMPUTE_SRC = r"""
#include "vyre_cuda.cuh"
// Two independent FMA chains per element: compute-bound for ITERS in the tens of thousands.
VYRE_KERNEL vyre_main(const float* x, float* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) {
    float a = x[i], b = a * 0.5f + 1.0f;
    for (int k = 0; k < ITERS; ++k) { a = fmaf(a, 0.9999f, 0.0001f); b = fmaf(b, 1.0001f, -0.0001f); }
    out[i] = a + b;
  }
}
"""

_SCALE_SRC = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* x, float* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) out[i] = 2.0f * x[i];
}
"""


def compute_program(iters: int) -> Program:
    return Program(
        Kernel.cuda(f"#define ITERS {iters}\n" + _COMPUTE_SRC),
        [BufferDecl.read("x", 0, "f32"), BufferDecl.output("out", 1, "f32")],
        name="bench_compute",
    )


def scale_program() -> Program:
    return Program(
        Kernel.cuda(_SCALE_SRC),
        [BufferDecl.read("x", 0, "f32"), BufferDecl.output("out", 1, "f32")],
        name="bench_scale",
    )


# ---------------------------------------------------------------------------------- helpers
class Env:
    """What the benchmark runs on: the real CudaBackend, or a stand-in for a smoke test."""

    def __init__(self, backend_factory=None, device_count=None):
        self.factory = backend_factory
        self._count = device_count

    def backend(self, ordinal):
        return self.factory(ordinal) if self.factory else vc.CudaBackend(ordinal)

    def group(self, devices, threads=1):
        if self.factory:
            return vc.DeviceGroup(devices, backend_factory=self.factory, threads_per_device=threads)
        return vc.DeviceGroup(devices, threads_per_device=threads)

    def device_count(self) -> int:
        if self._count is not None:
            return self._count
        from benchmarks.harness import hooks

        return hooks.device_count()


def timed(fn, reps: int) -> dict:
    """Warm up once, then ``reps`` timed calls: median, min, max seconds."""
    fn()
    times = []
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "reps": reps}


def interleaved(fns: dict, reps: int) -> dict:
    """Like timed() for several contenders, their passes interleaved so drift hits all alike."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for r in range(reps):
        order = list(fns)
        order = order[r % len(order) :] + order[: r % len(order)]
        for k in order:
            gc.collect()
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    return {
        k: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "reps": reps} for k, v in times.items()
    }


def plain_loop(backend, program, batches, outputs=None):
    if outputs is None:
        dispatch = backend.dispatch
        return [dispatch(program, b) for b in batches]
    dispatch_into = backend.dispatch_into
    return [dispatch_into(program, b, o) for b, o in zip(batches, outputs)]


# ---------------------------------------------------------------------------------- sections
def host_memcpy_ceiling(block_bytes: int, rounds: int, max_threads: int) -> dict:
    """Bytes copied per second by 1, 2, 4, ... threads each copying its own numpy buffers."""
    counts = [t for t in (1, 2, 4, 8, 16, 32) if t <= max_threads] or [1]
    by_threads = {}
    for t in counts:
        srcs = [np.ones(block_bytes // 4, np.float32) for _ in range(t)]
        dsts = [np.zeros_like(s) for s in srcs]
        for s, d in zip(srcs, dsts):
            np.copyto(d, s)  # first touch outside the timing
        start = threading.Barrier(t + 1)

        def work(s, d, start=start):
            start.wait()
            for _ in range(rounds):
                np.copyto(d, s)

        threads = [threading.Thread(target=work, args=(s, d)) for s, d in zip(srcs, dsts)]
        for th in threads:
            th.start()
        start.wait()
        t0 = time.perf_counter()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        by_threads[t] = t * rounds * block_bytes / wall / 1e9
        del srcs, dsts
    best = max(by_threads, key=by_threads.get)
    return {
        "gb_per_s": by_threads[best],
        "threads": best,
        "by_threads_gb_per_s": by_threads,
        "block_bytes": block_bytes,
    }


def bench_compute(env: Env, n_dev: int, items: int, elements: int, iters: int, reps: int) -> dict:
    prog = compute_program(iters)
    rng = np.random.default_rng(1)
    batches = [[rng.random(elements, dtype=np.float32)] for _ in range(items)]
    backend = env.backend(0)
    one = env.group([0])
    every = env.group(list(range(n_dev)))
    try:
        got = every.map(prog, batches[: n_dev * 2])
        same = all(
            np.array_equal(g[0], plain_loop(backend, prog, [b])[0][0]) for g, b in zip(got, batches[: n_dev * 2])
        )
        res = interleaved(
            {
                "plain_one_gpu": lambda: plain_loop(backend, prog, batches),
                "group_one_gpu": lambda: one.map(prog, batches),
                "group_all_gpus": lambda: every.map(prog, batches),
            },
            reps,
        )
        per_device = {k: v["group_items"] for k, v in every.telemetry.per_device().items()}
    finally:
        every.close()
        one.close()
        backend.close()
    for v in res.values():
        v["dispatches_per_s"] = items / v["median_s"]
    return {
        "items": items,
        "elements": elements,
        "iters": iters,
        "devices": n_dev,
        "results_match_one_gpu": bool(same),
        "items_per_device_last_pass": per_device,
        "runs": res,
        "scaling": res["plain_one_gpu"]["median_s"] / res["group_all_gpus"]["median_s"],
        "group_one_gpu_cost": res["group_one_gpu"]["median_s"] / res["plain_one_gpu"]["median_s"],
    }


def bench_transfer(
    env: Env, n_dev: int, items: int, item_bytes: int, distinct: int, reps: int, ceiling_gb_s: float
) -> dict:
    prog = scale_program()
    rng = np.random.default_rng(2)
    n = item_bytes // 4
    sources = [rng.random(n, dtype=np.float32) for _ in range(min(distinct, items))]
    batches = [[sources[i % len(sources)]] for i in range(items)]
    dsts = [[np.empty(n, np.float32)] for _ in range(items)]
    for (d,) in dsts:
        d.fill(0)  # first touch outside the timing
    moved = items * item_bytes * 2
    backend = env.backend(0)
    groups = {
        "group_one_gpu": env.group([0]),
        "group_all_gpus": env.group(list(range(n_dev))),
        "group_all_gpus_2_threads": env.group(list(range(n_dev)), threads=2),
    }
    try:
        check = groups["group_all_gpus"].map(prog, batches[:2])
        correct = all(np.array_equal(c[0], 2 * b[0]) for c, b in zip(check, batches[:2]))
        del check
        fns = {"plain_one_gpu_into": lambda: plain_loop(backend, prog, batches, dsts)}
        for name, g in groups.items():
            fns[name + "_into"] = lambda g=g: g.map(prog, batches, outputs=dsts)
        into = interleaved(fns, reps)
        fns = {"plain_one_gpu_new": lambda: plain_loop(backend, prog, batches)}
        for name, g in groups.items():
            fns[name + "_new"] = lambda g=g: g.map(prog, batches)
        new = interleaved(fns, reps)
        correct = correct and all(np.array_equal(d[0], 2 * b[0]) for d, b in zip(dsts[:3], batches[:3]))
        pinned = {}
        pinned_empty = getattr(vc, "pinned_empty", None) if env.factory is None else None
        if pinned_empty is not None:
            # page-locked inputs and outputs: the devices DMA them directly, no staging copy.
            # 16 outputs reused in turn: at most 4 items are in flight, in queue order.
            p_src = [pinned_empty((n,), np.float32) for _ in sources]
            for dst, src in zip(p_src, sources):
                np.copyto(dst, src)
            p_dst = [[pinned_empty((n,), np.float32)] for _ in range(min(16, items))]
            p_batches = [[p_src[i % len(p_src)]] for i in range(items)]
            p_outs = [p_dst[i % len(p_dst)] for i in range(items)]
            fns = {"plain_one_gpu_pinned": lambda: plain_loop(backend, prog, p_batches, p_outs)}
            for name, g in groups.items():
                fns[name + "_pinned"] = lambda g=g: g.map(prog, p_batches, outputs=p_outs)
            pinned = interleaved(fns, reps)
            correct = correct and bool(np.array_equal(p_dst[-1][0], 2 * p_batches[len(p_dst) - 1][0]))
            del p_src, p_dst, p_batches, p_outs
    finally:
        for g in groups.values():
            g.close()
        backend.close()
    runs = {**into, **new, **pinned}
    for v in runs.values():
        v["gb_per_s"] = moved / v["median_s"] / 1e9
        v["of_ceiling"] = v["gb_per_s"] / ceiling_gb_s
    best_into = max((k for k in into if k.startswith("group_all")), key=lambda k: runs[k]["gb_per_s"])
    best_new = max((k for k in new if k.startswith("group_all")), key=lambda k: runs[k]["gb_per_s"])
    best = max((k for k in runs if k.startswith("group_all")), key=lambda k: runs[k]["gb_per_s"])
    return {
        "items": items,
        "item_bytes": item_bytes,
        "bytes_moved_per_pass": moved,
        "devices": n_dev,
        "correct": bool(correct),
        "runs": runs,
        "best_into": best_into,
        "best_into_of_ceiling": runs[best_into]["of_ceiling"],
        "best_new": best_new,
        "best_new_of_ceiling": runs[best_new]["of_ceiling"],
        "best": best,
        "best_of_ceiling": runs[best]["of_ceiling"],
        "group_one_gpu_cost_into": runs["group_one_gpu_into"]["median_s"] / runs["plain_one_gpu_into"]["median_s"],
        "group_one_gpu_cost_new": runs["group_one_gpu_new"]["median_s"] / runs["plain_one_gpu_new"]["median_s"],
    }


def bench_small(env: Env, items: int, reps: int) -> dict:
    """Per-item overhead of the group on 4 KiB dispatches (the host cost dominates)."""
    prog = scale_program()
    rng = np.random.default_rng(3)
    batches = [[rng.random(1024, dtype=np.float32)] for _ in range(items)]
    backend = env.backend(0)
    one = env.group([0])
    try:
        res = interleaved(
            {
                "plain_one_gpu": lambda: plain_loop(backend, prog, batches),
                "group_one_gpu": lambda: one.map(prog, batches),
            },
            reps,
        )
    finally:
        one.close()
        backend.close()
    per = {k: v["median_s"] / items * 1e6 for k, v in res.items()}
    return {
        "items": items,
        "runs": res,
        "us_per_item": per,
        "group_overhead_us_per_item": per["group_one_gpu"] - per["plain_one_gpu"],
        "group_one_gpu_cost": res["group_one_gpu"]["median_s"] / res["plain_one_gpu"]["median_s"],
    }


def bench_dask(
    env: Env, n_dev: int, total_bytes: int, chunk_bytes: int, threads: int, reps: int, small_tasks: int
) -> dict:
    try:
        import dask.array as da
        import distributed

        import vyre_cuda.dask as vd
    except ImportError as exc:
        return {"skipped": f"dask is not installed ({exc})"}
    prog = scale_program()
    chunk = chunk_bytes // 4
    n = total_bytes // 4 // chunk * chunk
    chunks = n // chunk
    out: dict = {
        "bytes": n * 4,
        "chunk_bytes": chunk * 4,
        "chunks": chunks,
        "workers": n_dev,
        "threads_per_worker": threads,
    }
    t0 = time.perf_counter()
    cluster = distributed.LocalCluster(
        n_workers=n_dev, threads_per_worker=threads, processes=True, dashboard_address=":0", memory_limit=0
    )
    client = distributed.Client(cluster)
    try:
        # one worker per GPU by worker name, whatever CUDA_VISIBLE_DEVICES says
        def by_name(worker, n=n_dev):
            return int(worker.name) % n

        vd.register(client, device=by_name, backend_factory=env.factory)
        out["cluster_start_s"] = time.perf_counter() - t0
        info = client.run(vd.worker_info)
        out["worker_devices"] = sorted(i["device"] for i in info.values())
        t0 = time.perf_counter()
        x = da.arange(n, chunks=chunk, dtype=np.float32).persist()
        distributed.wait(x)
        out["input_persist_s"] = time.perf_counter() - t0

        def dask_pass():
            (y,) = vd.map_blocks(prog, x)
            y = y.persist()
            distributed.wait(y)
            return y

        y = dask_pass()
        k = chunks // 2
        sample, given = client.compute([y.blocks[k], x.blocks[k]], sync=True)
        out["correct"] = bool(np.array_equal(sample, 2 * given))
        del y, sample, given

        def dask_timed_pass():
            dask_pass()  # the persisted output is released when it goes out of scope

        dask_run = timed(dask_timed_pass, reps)

        # the same chunks through DeviceGroup.map in this process (inputs cycled over 16 buffers)
        sources = [np.arange(i * chunk, (i + 1) * chunk, dtype=np.float32) for i in range(min(16, chunks))]
        batches = [[sources[i % len(sources)]] for i in range(chunks)]
        with env.group(list(range(n_dev)), threads=threads) as group:

            def group_pass():
                group.map(prog, batches)

            group_run = timed(group_pass, reps)
            # per-task overhead: 4 KiB chunks, where the fixed cost of a task dominates
            small = da.arange(small_tasks * 1024, chunks=1024, dtype=np.float32).persist()
            distributed.wait(small)

            def small_pass():
                (s,) = vd.map_blocks(prog, small)
                s = s.persist()
                distributed.wait(s)

            small_dask = timed(small_pass, reps)
            tiny = [[np.arange(1024, dtype=np.float32)] for _ in range(small_tasks)]
            small_group = timed(lambda: group.map(prog, tiny), reps)
        out["dask"] = {**dask_run, "gb_per_s": 2 * n * 4 / dask_run["median_s"] / 1e9}
        out["group"] = {**group_run, "gb_per_s": 2 * n * 4 / group_run["median_s"] / 1e9}
        out["dask_vs_group"] = group_run["median_s"] / dask_run["median_s"]
        out["small_tasks"] = small_tasks
        out["dask_us_per_small_task"] = small_dask["median_s"] / small_tasks * 1e6
        out["group_us_per_small_item"] = small_group["median_s"] / small_tasks * 1e6
        out["dask_task_overhead_us"] = out["dask_us_per_small_task"] - out["group_us_per_small_item"]
        out["dask_overhead_per_chunk_task_pct"] = (
            100 * out["dask_task_overhead_us"] * 1e-6 / (group_run["median_s"] / chunks)
        )
    finally:
        client.close()
        cluster.close()
    return out


# ---------------------------------------------------------------------------------- report
def targets(result: dict) -> list:
    rows = []

    def add(name, value, op, bound):
        if value is None:
            return
        met = value >= bound if op == ">=" else value <= bound
        rows.append({"name": name, "value": value, "op": op, "target": bound, "met": bool(met)})

    n = result["devices"]
    comp = result.get("compute", {})
    if n >= 2 and comp:
        add(f"compute-bound map, {n} GPUs / 1 GPU", comp["scaling"], ">=", 0.9 * n)
    tr = result.get("transfer", {})
    if tr:
        add(
            f"{tr['item_bytes'] / MIB:g} MiB transfer-bound map / host memcpy ceiling (best: {tr['best']})",
            tr["best_of_ceiling"],
            ">=",
            0.8,
        )
    dk = result.get("dask", {})
    if dk and "dask_vs_group" in dk:
        add(
            f"Dask map_blocks / DeviceGroup.map ({dk['bytes'] / 2**30:g} GiB of "
            f"{dk['chunk_bytes'] / MIB:g} MiB chunks)",
            dk["dask_vs_group"],
            ">=",
            0.7,
        )
    if comp:
        add("one GPU: DeviceGroup / CudaBackend (compute-bound)", comp["group_one_gpu_cost"], "<=", 1.05)
    if tr:
        size = f"{tr['item_bytes'] / MIB:g} MiB"
        add(f"one GPU: DeviceGroup / CudaBackend ({size}, into)", tr["group_one_gpu_cost_into"], "<=", 1.05)
        add(f"one GPU: DeviceGroup / CudaBackend ({size}, new arrays)", tr["group_one_gpu_cost_new"], "<=", 1.05)
    return rows


def table(result: dict) -> str:
    lines = [
        f"vyre_cuda multi-GPU benchmark: {result['devices']} device(s) "
        f"{result.get('device_names', '')}, {result['timestamp']}"
    ]
    hm = result.get("host_memcpy")
    if hm:
        per = ", ".join(f"{t}: {v:.1f}" for t, v in hm["by_threads_gb_per_s"].items())
        lines.append(f"host memcpy ceiling: {hm['gb_per_s']:.1f} GB/s copied ({hm['threads']} threads; {per})")
    comp = result.get("compute")
    if comp:
        lines.append(f"compute-bound ({comp['items']} x {comp['elements']:,} elements, {comp['iters']} iters):")
        for k, v in comp["runs"].items():
            lines.append(f"  {k:<34} {v['median_s'] * 1e3:9.1f} ms  {v['dispatches_per_s']:8.1f} dispatches/s")
        lines.append(f"  items per device (last pass): {comp['items_per_device_last_pass']}")
    tr = result.get("transfer")
    if tr:
        lines.append(f"transfer-bound ({tr['items']} x {tr['item_bytes'] / MIB:g} MiB in + out):")
        for k, v in tr["runs"].items():
            lines.append(
                f"  {k:<34} {v['median_s'] * 1e3:9.1f} ms  {v['gb_per_s']:7.1f} GB/s  {v['of_ceiling']:5.2f}x ceiling"
            )
    sm = result.get("small")
    if sm:
        lines.append(
            f"4 KiB dispatches: plain {sm['us_per_item']['plain_one_gpu']:.1f} us, group "
            f"{sm['us_per_item']['group_one_gpu']:.1f} us per item "
            f"(+{sm['group_overhead_us_per_item']:.1f} us)"
        )
    dk = result.get("dask")
    if dk:
        if "skipped" in dk:
            lines.append(f"dask: skipped ({dk['skipped']})")
        elif "dask" in dk:
            lines.append(
                f"dask ({dk['bytes'] / 2**30:g} GiB, {dk['chunks']} chunks of {dk['chunk_bytes'] / MIB:g} MiB, "
                f"{dk['workers']} workers x {dk['threads_per_worker']} threads, devices {dk['worker_devices']}):"
            )
            lines.append(f"  map_blocks      {dk['dask']['median_s']:8.2f} s  {dk['dask']['gb_per_s']:7.1f} GB/s")
            lines.append(f"  DeviceGroup.map {dk['group']['median_s']:8.2f} s  {dk['group']['gb_per_s']:7.1f} GB/s")
            lines.append(
                f"  per task: dask {dk['dask_us_per_small_task']:.0f} us vs group "
                f"{dk['group_us_per_small_item']:.0f} us on 4 KiB chunks: "
                f"{dk['dask_task_overhead_us']:.0f} us overhead "
                f"({dk['dask_overhead_per_chunk_task_pct']:.2f}% of a {dk['chunk_bytes'] / MIB:g} MiB task)"
            )
    lines.append("targets:")
    for t in result["targets"]:
        lines.append(
            f"  [{'met' if t['met'] else 'MISSED'}] {t['name']}: {t['value']:.3f} (target {t['op']} {t['target']:.2f})"
        )
    return "\n".join(lines)


def run(args, env: Env) -> dict:
    n_dev = env.device_count()
    result = {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "devices": n_dev,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "vyre_cuda": vc.__version__,
        "cpus": os.cpu_count(),
        "args": vars(args),
    }
    if env.factory is None:
        names = []
        for d in range(n_dev):
            with vc.CudaBackend(d) as b:
                names.append(b.caps.name)
        result["device_names"] = names
    quick = args.quick
    only = set(args.only.split(",")) if args.only else {"memcpy", "compute", "transfer", "small", "dask"}
    item = int((args.item_mib or (16 if quick else 64)) * MIB)
    dask_bytes = int((args.dask_gib or (0.25 if quick else 16.0)) * 2**30)
    t_start = time.perf_counter()

    def stage(name, fn):
        if name in only:
            t0 = time.perf_counter()
            result[name if name != "memcpy" else "host_memcpy"] = fn()
            print(
                f"[{time.perf_counter() - t_start:6.1f} s] {name} done in {time.perf_counter() - t0:.1f} s", flush=True
            )

    stage("memcpy", lambda: host_memcpy_ceiling(item, 4 if quick else 16, os.cpu_count() or 1))
    stage("compute", lambda: bench_compute(env, n_dev, 16 if quick else 64, 1 << 20, args.compute_iters, args.reps))
    ceiling = result.get("host_memcpy", {}).get("gb_per_s") or float("nan")
    stage("transfer", lambda: bench_transfer(env, n_dev, 16 if quick else 64, item, 16, args.reps, ceiling))
    stage("small", lambda: bench_small(env, 200 if quick else 2000, args.reps))
    stage(
        "dask",
        lambda: bench_dask(
            env,
            n_dev,
            dask_bytes,
            item,
            args.dask_threads,
            max(1, args.reps // 2) if not quick else 1,
            64 if quick else 512,
        ),
    )
    result["elapsed_s"] = time.perf_counter() - t_start
    result["targets"] = targets(result)
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="result JSON (default %(default)s)")
    p.add_argument("--reps", type=int, default=5, help="timed passes per figure (median)")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a measurement")
    p.add_argument("--only", default="", help="comma list of memcpy,compute,transfer,small,dask")
    p.add_argument("--compute-iters", type=int, default=65536, help="FMA iterations per element")
    p.add_argument(
        "--item-mib",
        type=float,
        default=None,
        help="bytes per transfer-bound item and per Dask chunk (default 64; 16 with --quick)",
    )
    p.add_argument("--dask-gib", type=float, default=None, help="size of the dask array (default 16)")
    p.add_argument(
        "--dask-threads",
        type=int,
        default=2,
        help="threads per Dask worker (and per device in the DeviceGroup it is compared with)",
    )
    p.add_argument("--strict", action="store_true", help="exit 3 when a target is missed")
    return p


def main(argv=None, backend_factory=None, device_count=None) -> int:
    args = parser().parse_args(argv)
    result = run(args, Env(backend_factory, device_count))
    text = table(result)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    if args.strict and not all(t["met"] for t in result["targets"]):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
