"""Concurrency stress: several backends on one device, several threads each, while other threads
close and replace backends, trim them, churn page-locked arrays and drop the plan caches.

Every output is checked against numpy on fresh random data. The run counts wrong results,
unexpected errors and what is left behind (pool bytes, streams, events, threads); a crash is the
process dying, so callers run this file as a child process:

    python tests/stress.py --seed 7 --backends 2 --threads 2 --dispatches 400 [--fake]

``--fake``: the child runs on the fake CUDA driver (tests/fakecuda), which also counts the driver
objects and primary-context references left at the end. Prints one JSON object.

Seeded: the same seed replays the same sizes, operations and chaos schedule per thread (thread
interleaving itself is the machine's).
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import gc
import json
import os
import sys
import threading
import time
import traceback

import numpy as np

import vyre_cuda as vc
from vyre_cuda import _devarray, _pools, hostmem
from vyre_cuda import builtin_programs as bp
from vyre_cuda.telemetry import COUNTERS

VECADD = bp.vecadd_f32()
OPS = (
    "dispatch",
    "dispatch_into",
    "dispatch_async",
    "device_input",
    "device_in_place",
    "late_readback",
    "pinned_input",
    "shared_handle",
    "dropped",
    "stream_chain",
)
DEV = vc.DispatchConfig(outputs="device")
CHAOS = ("trim", "close", "pinned", "clear_prepared")
LIVE = ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")


class CallerStream:
    """A caller's stream object (cuda.core's ``__cuda_stream__`` protocol), destroyed with the
    object as CuPy's are: a dispatch's config keeps it alive while the GPU may use it."""

    def __init__(self):
        from cuda.bindings import driver

        err, self._s = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuStreamCreate: {err}")
        self._destroy = driver.cuStreamDestroy

    def __cuda_stream__(self):
        return (0, int(self._s))

    def __del__(self):
        self._destroy(self._s)


class Stress:
    def __init__(self, args):
        self.args = args
        self.fake = None
        if args.fake:
            from fakecuda import FakeDriver, set_lazy, vecadd_emulation

            self.fake = FakeDriver()
            self._emulation = vecadd_emulation(np.float32)
            if args.lazy:  # stream work deferred until something forces it: misordered work reads wrong
                set_lazy(self.fake.lib, True)
        self.lock = threading.Lock()  # guards the backend slots and the counts
        # the first values of recent dispatches' inputs and outputs (under the lock): a wrong
        # output that starts like one of them names where its data came from
        self.heads: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self.base = self.fake.stats() if self.fake is not None else None
        self.pinned_pool_before = 0 in hostmem._pools  # (it keeps a context reference for the process)
        self.array_pool_before = 0 in _devarray._array_pools  # (so does the DeviceArray pool)
        self.parked_pools_before = _pools.parked_pools()
        self.registered_before = vc.registered_stats()
        self.slots = [self._new_backend(k) for k in range(args.backends)]
        self.retired = []  # closed backends: checked for leaks at the end
        self.counts = dict.fromkeys(
            ("dispatches", "checked", "wrong", "errors", "refused", "closes", "trims", "pinned_arrays", "clears"), 0
        )
        self.ops = tuple(op for op in OPS if op in args.ops.split(","))
        if not self.ops:
            raise SystemExit(f"--ops {args.ops!r} names none of {', '.join(OPS)}")
        self.by_op = dict.fromkeys(self.ops, 0)
        self.failures = []  # the first few wrong results and unexpected errors, described
        self.stop = threading.Event()
        self.local = threading.local()  # each worker's caller stream (stream_chain)

    # ---------------------------------------------------------------- setup
    def _new_backend(self, slot):
        # every other backend registers the buffers it sees (at once, from 256 KiB; half of them
        # on the worker thread, half inside the dispatch): the threads' inputs are overlapping
        # slices of one array, so ranges are hit, refused as overlapping, held by two backends,
        # trimmed, and unregistered when the array dies
        kind = _policy_kind(slot)
        policy = (
            vc.AutoRegister(min_bytes=256 << 10, after=1, background=kind == "background") if kind != "none" else False
        )
        backend = vc.CudaBackend(
            0, staging_chunk_bytes=self.args.chunk_mib << 20, staging_chunks=self.args.chunks, auto_register=policy
        )
        if self.args.share_streams is not None or self.args.fence_on_demand:
            from vyre_cuda._knobs import DEFAULT  # (private: the measurement settings)

            knobs = DEFAULT.replace(fence_on_demand=self.args.fence_on_demand)
            if self.args.share_streams is not None:
                knobs = knobs.replace(stream_share_after=self.args.share_streams)
            backend._use_knobs(knobs)
        if self.args.no_stream_ordered:  # staged dispatches' slabs from cuMemAlloc blocks instead
            backend._core.resources.dpool.stream_ordered = False
        if self.fake is not None:
            x = np.zeros(1024, np.float32)
            self.fake.emulate(backend, VECADD, [x, x], self._emulation)
        return backend

    def _count(self, name, n=1):
        with self.lock:
            self.counts[name] += n

    def _fail(self, what):
        with self.lock:
            if len(self.failures) < 10:
                self.failures.append(what)

    # ---------------------------------------------------------------- workers
    def _size(self, rng) -> int:
        """Elements per buffer: log-uniform from 1 KiB to the profile's largest buffer, so both
        sides of the small-path / staging-ring boundary are hit often."""
        lo, hi = np.log2(1 << 10), np.log2(self.args.max_mib << 20)
        return max(1, int(2 ** rng.uniform(lo, hi)) // 4)

    def worker(self, index: int, seed: int):
        rng = np.random.default_rng(seed)
        # random data made once per thread; each dispatch takes its inputs at random offsets
        # (drawing 16 M normals per dispatch would cost more than the dispatch)
        most = (self.args.max_mib << 20) // 4
        data = rng.standard_normal(3 * most + 1024).astype(np.float32)

        def fresh(n):
            at = int(rng.integers(0, data.size - n))
            return data[at : at + n]

        slot = index % len(self.slots)
        done = 0
        while done < self.args.dispatches:
            if self.stop.is_set():
                return
            done += 1
            n = self._size(rng)
            op = self.ops[rng.integers(len(self.ops))]
            a, b = fresh(n), fresh(n)
            with self.lock:
                backend = self.slots[slot]
            try:
                got, want = self._run(op, backend, a, b, rng, fresh)
            except vc.BackendError as exc:
                if _is_closed_error(exc):
                    self._count("refused")  # the backend was closed under us: expected; retry
                    done -= 1  # on its replacement (not counted as one of this thread's dispatches)
                    time.sleep(0.001)
                    continue
                self._count("errors")
                self._fail(f"{op} n={n}: {type(exc).__name__}: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 (counted and reported, never hidden)
                self._count("errors")
                self._fail(f"{op} n={n}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
                continue
            self._count("dispatches")
            with self.lock:
                self.by_op[op] += 1
            if got is None:
                continue
            self._count("checked")
            if not np.array_equal(got, want):
                bad = np.flatnonzero(got != want)
                self._count("wrong")
                what = _what_was_read(got, want, a, b)
                # read again a moment later: right then means the result was handed back before
                # its readback landed (a missing wait); still wrong means the data itself was lost
                time.sleep(0.05)
                late = np.flatnonzero(got != want).size
                self._fail(
                    f"{op} n={n}: {bad.size} wrong elements, first {bad[0]}, last {bad[-1]}; "
                    f"{what}; route {getattr(self.local, 'route', None)}; 50 ms later {late} wrong; "
                    f"starts like {self._origin(got)}; {_registration(slot, a, b)}; {_driver_range(got)}"
                )
            self._remember(op, n, a, b, want)

    def _remember(self, op, n, a, b, want):
        with self.lock:
            for name, arr in (("input a", a), ("input b", b), ("output", want)):
                key = np.ascontiguousarray(arr[:4]).tobytes()
                if len(key) == 16:
                    self.heads[key] = f"the {name} of another {op} (n={n})"
            while len(self.heads) > 6000:
                self.heads.popitem(last=False)

    def _origin(self, got) -> str:
        with self.lock:
            return self.heads.get(np.ascontiguousarray(np.asarray(got)[:4]).tobytes(), "no recent dispatch's data")

    def _run(self, op, backend, a, b, rng, fresh):
        self.local.route = None  # (set by the operations that hold a handle: the report names it)
        if op == "dispatch":
            return backend.dispatch(VECADD, [a, b])[0], a + b
        if op == "dispatch_into":
            out = np.empty_like(a)
            backend.dispatch_into(VECADD, [a, b], [out])
            return out, a + b
        if op == "dispatch_async":
            pending = backend.dispatch_async(VECADD, [a, b])
            self.local.route = pending.route
            if rng.random() < 0.1:
                del pending  # dropped un-taken: deferred, never waited for
                return None, None
            return pending.result()[0], a + b
        if op == "device_input":
            # an output kept on the device feeds the next dispatch as a device input
            (dev,) = backend.dispatch(VECADD, [a, b], vc.DispatchConfig(outputs="device"))
            c = fresh(a.size)
            return backend.dispatch(VECADD, [dev, c])[0], (a + b) + c
        if op == "device_in_place":
            # device arrays in and a named device output: written in place, a params-only slab
            (s,) = backend.dispatch(VECADD, [a, b], DEV)
            (out,) = backend.dispatch(VECADD, [b, b], DEV)  # a device array of the right size
            (got,) = backend.dispatch_async(VECADD, [s, s], outputs=[out]).result()
            assert got is out
            return out.copy_to_host(), (a + b) + (a + b)
        if op == "late_readback":
            # an outputs="device" dispatch_async taken into a host array after all: read back late
            host = np.empty_like(a)
            backend.dispatch_async(VECADD, [a, b], DEV).result_into([host])
            return host, a + b
        if op == "shared_handle":
            # one handle, two threads taking its result at once: both get the same outputs
            pending = backend.dispatch_async(VECADD, [a, b])
            self.local.route = pending.route
            other = []

            def take():
                try:
                    other.append(pending.result()[0])
                except BaseException as exc:  # noqa: BLE001 (re-raised on this thread)
                    other.append(exc)

            t = threading.Thread(target=take)
            t.start()
            mine = pending.result()[0]
            t.join()
            if isinstance(other[0], BaseException):
                raise other[0]
            if not np.array_equal(other[0], a + b):
                return other[0], a + b
            return mine, a + b
        if op == "dropped":
            # fire and forget: the handle is dropped at once, its work deferred, never waited for
            backend.dispatch_async(VECADD, [a, b])
            return None, None
        if op == "stream_chain":
            return self._stream_chain(backend, a, b, rng)
        # pinned_input: page-locked inputs DMA directly (no staging copy)
        pa = vc.pinned_empty(a.size, np.float32)
        pa[:] = a
        return backend.dispatch(VECADD, [pa, b])[0], a + b

    def _stream_chain(self, backend, a, b, rng):
        # a + b + b + b + b: three dispatch_async steps on this worker's stream object, each
        # writing a device array named at enqueue (with Knobs.fence_on_demand their completion
        # events are recorded when a result is first asked for); one step's result is taken
        # first, then the others in a random order, or the others are dropped untaken
        (x,) = backend.dispatch(VECADD, [a, b], DEV)
        outs = [backend.dispatch(VECADD, [b, b], DEV)[0] for _ in range(3)]
        if getattr(self.local, "stream", None) is None:
            self.local.stream = CallerStream()  # (made once the backend's context is current here)
        cfg = vc.DispatchConfig(stream=self.local.stream)
        cur, handles = x, []
        for nxt in outs:
            handles.append(backend.dispatch_async(VECADD, [cur, b], cfg, outputs=[nxt]))
            cur = nxt
        want = [a + b]
        for _ in range(3):
            want.append(want[-1] + b)  # (float32, step by step, as the chain adds)
        first = int(rng.integers(3))
        (got,) = handles[first].result()
        if got is not outs[first]:
            raise AssertionError("result() did not return the array named at dispatch_async")
        if rng.random() < 0.3:
            del handles  # the others dropped untaken: deferred, never waited for
        else:
            for k in rng.permutation(3):
                host = handles[k].result()[0].copy_to_host()
                if not np.array_equal(host, want[k + 1]):
                    return host, want[k + 1]
        return got.copy_to_host(), want[first + 1]

    # ---------------------------------------------------------------- chaos
    def chaos(self, seed: int, kinds):
        rng = np.random.default_rng(seed)
        while not self.stop.is_set():
            kind = kinds[rng.integers(len(kinds))]
            slot = int(rng.integers(len(self.slots)))
            try:
                if kind == "trim":
                    with self.lock:
                        backend = self.slots[slot]
                    backend.trim()
                    self._count("trims")
                elif kind == "close":
                    if rng.random() < 0.2:  # closes are rarer: each one makes a new backend
                        with self.lock:
                            old = self.slots[slot]
                        old.close()  # other threads are dispatching on it now
                        new = self._new_backend(slot)
                        with self.lock:
                            self.slots[slot] = new
                            self.retired.append(old)
                        self._count("closes")
                elif kind == "pinned":
                    n = int(rng.integers(1, 1 << 18))
                    x = vc.pinned_empty(n, np.uint8)
                    x[:] = 7
                    if not (x == 7).all():
                        self._count("wrong")
                        self._fail("a page-locked array did not hold what was written")
                    del x
                    if rng.random() < 0.3:
                        hostmem.trim_pinned_pool()
                    self._count("pinned_arrays")
                else:
                    with self.lock:
                        backend = self.slots[slot]
                    backend._core.clear_prepared()
                    self._count("clears")
            except vc.BackendError as exc:
                if not _is_closed_error(exc):
                    self._count("errors")
                    self._fail(f"chaos {kind}: {type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001
                self._count("errors")
                self._fail(f"chaos {kind}: {type(exc).__name__}: {exc}")
            time.sleep(float(rng.uniform(0, self.args.chaos_ms)) / 1000)

    # ---------------------------------------------------------------- run and account
    def run(self) -> dict:
        args = self.args
        before_threads = threading.active_count()
        base = self.base
        seeds = np.random.SeedSequence(args.seed).spawn(args.backends * args.threads + 1)
        workers = [
            threading.Thread(target=self.worker, args=(i, seeds[i]), name=f"stress-{i}")
            for i in range(args.backends * args.threads)
        ]
        kinds = tuple(k for k in CHAOS if k in args.chaos.split(",")) if args.chaos else ()
        chaos = threading.Thread(target=self.chaos, args=(seeds[-1], kinds)) if kinds else None
        t0 = time.perf_counter()
        for t in workers:
            t.start()
        if chaos:
            chaos.start()
        for t in workers:
            t.join()
        self.stop.set()
        if chaos:
            chaos.join()
        seconds = time.perf_counter() - t0
        # graph launches (the graph-or-issued trial of each new plan replays some): the counters
        # of closed backends are still readable
        replays = sum(dict(zip(COUNTERS, b._core.counters()))["graph_replays"] for b in self.slots + self.retired)
        leaks = {}
        gc.collect()
        for k, backend in enumerate(self.slots):
            backend.trim()  # dropped handles' finished work waits on the deferred list until now
            snap = backend.telemetry.snapshot()
            for name in LIVE:
                if snap[name]:
                    leaks[f"backend {k} {name}"] = snap[name]
            if backend._core.outstanding:
                leaks[f"backend {k} outstanding"] = backend._core.outstanding
        closed = self.slots + self.retired
        for backend in closed:
            backend.close()
            if backend._core.xfer.live_threads:
                leaks["copy threads after close"] = backend._core.xfer.live_threads
        self.slots = self.retired = []
        gc.collect()
        # every closed backend freed its pools and streams, those closed during the work too (on
        # the GPU, where the driver's counters cannot be read, this is what shows a close() that
        # left them allocated)
        for k, backend in enumerate(closed):
            s = backend._core.resources.stats()
            held = {
                "device": s.device.allocated_bytes,
                "pinned": s.pinned.allocated_bytes,
                "output cache": s.output_cache.allocated_bytes,
                "streams": s.streams.streams_live,
                "events": s.streams.events_live,
            }
            if any(held.values()):
                leaks[f"closed backend {k}"] = held
        del closed
        hostmem.trim_pinned_pool()
        pinned = hostmem.pinned_pool_stats()
        if pinned["live_bytes"] or pinned["cached_bytes"]:
            leaks["pinned array pool"] = pinned
        _devarray.trim_array_pool(0)
        arrays = _devarray.array_pool_stats(0)
        if arrays["live_bytes"] or arrays["cached_bytes"]:
            leaks["DeviceArray pool"] = arrays
        registered = vc.registered_stats()  # (the threads' arrays died with them: nothing is left)
        if registered["registered_ranges"]:
            leaks["registered ranges"] = registered["registered_ranges"]
        regs = registered["registrations"] - self.registered_before["registrations"]
        self.counts["registrations"] = regs
        unregs = registered["unregistrations"] - self.registered_before["unregistrations"]
        if unregs != regs:
            leaks["registrations not undone"] = regs - unregs
        refused = registered["failed_unregistrations"] - self.registered_before["failed_unregistrations"]
        if refused:  # (memory the driver kept page-locked under its address: a later array there is misread)
            leaks["unregistrations the driver refused"] = refused
        time.sleep(0.05)  # joined threads leave the interpreter's count a moment later
        if threading.active_count() > before_threads:
            leaks["threads"] = threading.active_count() - before_threads
        if self.fake is not None:
            after = self.fake.stats()
            if not self.pinned_pool_before and 0 in hostmem._pools:
                after["context_refs"] -= 1  # the page-locked array pool's, held for the process
            if not self.array_pool_before and 0 in _devarray._array_pools:
                after["context_refs"] -= 1  # the DeviceArray pool's, held for the process
            # closed backends' stream-ordered pools, kept for the next backend (never destroyed)
            parked = _pools.parked_pools() - self.parked_pools_before
            after["mempools"] -= parked
            after["context_refs"] -= parked  # (each holds its device's primary context)
            for name in (
                "device_allocs",
                "host_allocs",
                "streams",
                "events",
                "modules",
                "context_refs",
                "mempools",
                "registered",
            ):
                if after[name] != base[name]:
                    leaks[f"driver {name}"] = after[name] - base[name]
            if after["no_context"] != base["no_context"]:
                # a driver call with no context current fails (a free that leaks, say)
                leaks["driver calls without a context"] = after["no_context"] - base["no_context"]
            if after["violations"] != base["violations"]:
                leaks["driver violations"] = self.fake.last_violation()
            if after["bad_handles"] != base["bad_handles"]:
                # a stream, event or graph used after it was destroyed (a crash on a real driver)
                leaks["driver calls on handles not live"] = after["bad_handles"] - base["bad_handles"]
            if after["unsafe_syncs"] != base["unsafe_syncs"]:
                # a context synchronize beside a thread-local capture (a crash on a real driver)
                leaks["context synchronizes during a capture"] = after["unsafe_syncs"] - base["unsafe_syncs"]
            if self.fake.hook_errors:
                self.failures.extend(self.fake.hook_errors[:3])
        return dict(
            self.counts,
            by_op=self.by_op,
            graph_replays=replays,
            leaks=leaks,
            failures=self.failures,
            seconds=round(seconds, 2),
            backends=args.backends,
            threads=args.threads,
        )


def _what_was_read(got, want, a, b) -> str:
    """What a wrong output holds instead (for the report): an input, zeros, the fake's or the
    pool's fill, or data of unknown origin, with its first values beside the expected ones."""
    got = np.asarray(got)
    kinds = [name for name, ref in (("a", a), ("b", b)) if ref.shape == got.shape and np.array_equal(got, ref)]
    if not kinds:
        if not got.any():
            kinds = ["zeros"]
        elif np.isnan(got).all():
            kinds = ["NaN"]
        else:
            raw = got.view(np.uint8)
            kinds = [f"the byte 0x{raw[0]:02x} repeated"] if (raw == raw[0]).all() else ["other data"]
    # where the output lives: page-locked (read back by direct DMA), a recycled host block (large
    # outputs), or plain numpy memory
    home = "page-locked" if vc.is_page_locked(got) else type(got.base).__name__ if got.base is not None else "numpy"
    return f"holds {kinds[0]}: got {got[:3].tolist()} want {np.asarray(want)[:3].tolist()}; memory {home}"


def _policy_kind(slot) -> str:
    """The registration policy of the backend in ``slot``: none, inline or background."""
    return ("background" if slot % 4 == 1 else "inline") if slot % 2 else "none"


def _registration(slot, a, b) -> str:
    """The failing backend's registration policy and whether the inputs are page-locked now: a
    stale or early-dropped registration shows as direct DMA from them."""
    policy = _policy_kind(slot)
    locked = "".join("L" if vc.is_page_locked(x) else "-" for x in (a, b))
    stats = vc.registered_stats()
    return (
        f"backend slot {slot}, auto-register {policy}, inputs page-locked now {locked}, "
        f"{stats['registered_ranges']} ranges registered, {stats['failed_unregistrations']} unregistrations "
        f"refused, fallbacks {stats['fallback_reasons']}"
    )


def _driver_range(got) -> str:
    """The page-locked range the driver finds under the wrong output's first and last byte, if any:
    an output the driver counts as registered is read back by DMA into that registration's pages
    (matched against the registry's debug record, VYRE_CUDA_STRESS_REGLOG)."""
    from cuda.bindings import driver as cu

    got = np.asarray(got)
    where = []
    for addr in (got.ctypes.data, got.ctypes.data + max(got.nbytes - 1, 0)):
        try:
            err, start = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, addr)
        except Exception as exc:  # noqa: BLE001 (a driver without the call: the fake)
            return f"driver: no range query ({type(exc).__name__})"
        _, size = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr)
        where.append(
            f"0x{addr:x} in 0x{int(start):x} +{int(size)}"
            if err == cu.CUresult.CUDA_SUCCESS
            else f"0x{addr:x} pageable"
        )
    return "driver: " + ", ".join(where)


def _is_closed_error(exc) -> bool:
    return isinstance(exc, vc.ValidationError) and "closed" in exc.message


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backends", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="per backend")
    ap.add_argument("--dispatches", type=int, default=200, help="per thread")
    ap.add_argument("--max-mib", type=int, default=8, help="largest buffer, MiB")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + ", ".join(OPS))
    ap.add_argument("--chaos", default=",".join(CHAOS), help="comma-separated: " + ", ".join(CHAOS))
    ap.add_argument("--chaos-ms", type=float, default=5.0, help="mean pause between chaos actions")
    ap.add_argument("--chunk-mib", type=int, default=1, help="staging ring chunk (small: many windows)")
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--fake", action="store_true", help="running on the fake CUDA driver")
    ap.add_argument("--lazy", action="store_true", help="with --fake: the fake's lazy mode (fakecuda.set_lazy)")
    ap.add_argument(
        "--no-stream-ordered",
        action="store_true",
        help="ring dispatches take their device slabs from cuMemAlloc blocks, not the stream-ordered pool",
    )
    ap.add_argument(
        "--share-streams",
        type=int,
        default=None,
        help="Knobs.stream_share_after for every backend (0: off; default: the backend's)",
    )
    ap.add_argument(
        "--fence-on-demand",
        action="store_true",
        help="Knobs.fence_on_demand for every backend: caller-stream events recorded when first needed",
    )
    ap.add_argument(
        "--hang-s",
        type=float,
        default=900.0,
        help="a run still going after this many seconds prints every thread's stack and exits (a hang)",
    )
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    # a hang shows where every thread waits (stderr), then the process exits with status 1
    faulthandler.dump_traceback_later(args.hang_s, exit=True)
    sys.setswitchinterval(1e-6)  # widen the windows between threads (the GIL is not a lock)
    reglog = os.environ.get("VYRE_CUDA_STRESS_REGLOG")
    if reglog:  # the registry's every register and unregister, for a wrong result's driver range
        import logging

        handler = logging.FileHandler(reglog)
        handler.setFormatter(logging.Formatter("%(process)d %(relativeCreated).1f %(threadName)s %(message)s"))
        handler.addFilter(lambda record: "register 0x" in record.getMessage())
        logging.getLogger("vyre_cuda").addHandler(handler)
        logging.getLogger("vyre_cuda").setLevel(logging.DEBUG)
    # flushed now: a crash in the interpreter's exit would otherwise lose the buffered result line,
    # and its presence tells a crash at exit from one during the run
    print(json.dumps(Stress(args).run()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
