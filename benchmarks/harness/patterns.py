"""The patterns users are taught, each measured beside its peers in the same run.

The README and the guides teach a few ways of calling vyre_cuda; these rows time exactly those
shapes, at 3 x 4 KiB (:attr:`Settings.nbytes`) unless said otherwise, every time a median of
repetitions taken in interleaved rounds (:func:`vyre_cuda.profile.engine.run_rounds`):

* **the enqueue chain** of the README (``pattern.chain.*``): ``x + y + y + ...`` on a CuPy
  ``Stream`` passed as the object (``DispatchConfig(stream=stream)``, inside ``with stream:``),
  a new CuPy output per step, 1,000 steps, the pending handles kept in a list or dropped; per
  step, the enqueue loop plus the final ``stream.synchronize()`` over the steps. Beside it, the
  same chain as cuda.core ``launch`` with a new ``Device.allocate`` buffer per step, CuPy
  ``RawKernel`` with a new ``cp.empty_like`` per step and PyTorch ``torch.add`` (its own new
  output), each on its own stream and synchronized once.
* **fire and forget** (``pattern.dropped.*``): 1,000 ``dispatch_async`` whose handles are dropped
  at once, from numpy arrays and on vyre_cuda's own device arrays (the outputs named), per call;
  the context is synchronized after the loop, outside the timing (``host_drained`` adds it).
  The reference (``pattern.enqueue.single``) is the enqueue alone of a kept ``dispatch_async``
  with one in flight (each taken with ``result()`` before the next), per call over 1,000.
* **1,000 in flight** (``pattern.inflight``): 1,000 ``dispatch_async`` kept in a list, then
  every result taken; per enqueue. The warm-up round grows the pools; the timed rounds follow.
* **asyncio**: ``await backend.dispatch_async(...)`` timed one by one on one event loop
  (``pattern.await``) against the blocking ``dispatch`` (``pattern.blocking``), and
  ``asyncio.gather`` of 64 dispatches per dispatch (``pattern.gather``).
* **idle CPU** (``values``): the process CPU time (``time.process_time``, every thread) over the
  wall time while one kernel that spins :attr:`Settings.spin_s` seconds on the GPU's nanosecond
  timer is awaited (``await_idle_cpu``), and while ``result()`` waits for it
  (``blocking_idle_cpu``).
* **device memory budgets** (``budgets``): the built-in vecadd declared elementwise, 3 x 256 MiB
  from numpy, ``dispatch_into`` with ``DispatchConfig(streamed=True, device_memory_budget=B)``
  from 64 MiB halving until a budget is refused (``ValidationError``; the smallest budget the
  refusal names is measured too) or a dispatch takes over :attr:`Settings.budget_stop_s`, and
  unbudgeted. Rate: the bytes moved (two inputs in, one output out) over the median time.

A peer that is not installed gives no row (and its target none); the chain itself runs on CuPy
arrays, so without CuPy it is skipped with the reason. Every output is checked against numpy.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import sys
import time
import warnings

import numpy as np

from vyre_cuda.errors import ValidationError, driver_error
from vyre_cuda.profile import engine
from vyre_cuda.profile.session import import_floor, meta, open_backend
from vyre_cuda.profile.specs import KIB, MIB
from vyre_cuda.profile.stats import median, summarize

from .peers import missing_reason, open_peer, peer_available
from .records import PatternResult

__all__ = [
    "DEFAULTS",
    "SPIN_NAME",
    "SPIN_SOURCE",
    "Settings",
    "chain_reference",
    "context_synchronize",
    "measure_budgets",
    "measure_idle_cpu",
    "measure_patterns",
    "run_patterns",
    "spin_program",
]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How much each pattern measures (the defaults keep a run on an H200 under a minute)."""

    nbytes: int = 4 * KIB  # bytes per buffer of the small patterns
    steps: int = 1000  # chain steps, calls per repetition, dispatches in flight
    repeats: int = 20  # timed repetitions of each batch of ``steps`` (chains, dropped, single, in flight)
    awaits: int = 2000  # awaits and blocking dispatches timed one by one
    gather: int = 64  # dispatches per asyncio.gather
    gathers: int = 100  # gathers timed
    spin_s: float = 2.0  # seconds the long kernel spins
    spin_repeats: int = 1  # long kernels awaited (and as many waited for)
    budget_bytes: int = 256 * MIB  # bytes per buffer of the budget sweep
    budget_start: int = 64 * MIB  # the first budget; each next one is half
    budget_stop_s: float = 2.0  # no budget below one whose dispatch took longer than this
    budget_repeats: int = 5  # timed dispatches per budget
    budget_min: int = 4 * KIB  # never a budget below this (the sweep's bound when nothing is refused)


DEFAULTS = Settings()
CHAIN_KEYS = ("pattern.chain.kept", "pattern.chain.dropped")
# the kept chain timed up to its last result() taken, with each completion event recorded at
# enqueue (the default) and on demand (Knobs.fence_on_demand): that knob moves the record from the
# enqueue loop to the first result(), so only a row that takes the results compares the two
TAKEN_KEYS = ("pattern.chain.taken", "pattern.chain.taken.fence")
# the long kernel: one warp spins on %globaltimer (nanoseconds) for ns[0], so it lasts the time
# asked whatever the SM clock, then writes 1 to each of its 32 outputs
SPIN_NAME = "pattern_spin"
SPIN_SOURCE = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const unsigned long long* ns, unsigned int* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns[0]);
    out[i] = 1u;
  }
}
"""
SPIN_OUTPUTS = 32
_SMALLEST = re.compile(r"device_memory_budget\s*>=\s*([0-9][0-9,_]*)")


def spin_program():
    """The long kernel: spins ``inputs[0][0]`` nanoseconds on the GPU, then writes 32 ones."""
    from vyre_cuda.program import BufferDecl, Kernel, Program

    decls = (BufferDecl.read("ns", 0, "u64", 1), BufferDecl.output("out", 1, "u32", SPIN_OUTPUTS))
    return Program(Kernel.cuda(SPIN_SOURCE), decls, name=SPIN_NAME)


def chain_reference(x, y, steps: int):
    """numpy's ``x + y + y + ...`` (``steps`` float32 additions in order): the chain's result."""
    cur = np.array(x, dtype=np.float32, copy=True)
    y = np.asarray(y, dtype=np.float32)
    for _ in range(steps):
        cur = cur + y
    return cur


def context_synchronize(backend) -> None:
    """Wait for all the work of ``backend``'s context (``cuCtxSynchronize``): what dropped
    dispatches left running drains here, outside the timing."""
    from cuda.bindings import driver as cu

    ok = cu.CUresult.CUDA_SUCCESS
    (status,) = cu.cuCtxSetCurrent(cu.CUcontext(int(backend.context_handle)))
    if status == ok:
        (status,) = cu.cuCtxSynchronize()
    if status != ok:
        raise driver_error(getattr(status, "name", str(status)), "cuCtxSynchronize", int(status), "profile patterns")


def _aio_counts() -> dict:
    """The counters of this process's awaits (``vyre_cuda._aio.stats()``: completion queries,
    awaits that ended at each phase...), or ``{}`` where this vyre_cuda has none. Read only to
    explain a measured figure; levels (``outstanding``...) are counters too here, their deltas
    are left out by the caller when they do not move."""
    aio = sys.modules.get("vyre_cuda._aio")
    stats = getattr(aio, "stats", None)
    if stats is None:
        return {}
    try:
        return {k: int(v) for k, v in stats().items() if isinstance(v, int) and not isinstance(v, bool)}
    except Exception:  # noqa: BLE001 (an explanation, never a reason to fail)
        return {}


def _per(before: dict, after: dict, count) -> dict:
    """The counters that moved from ``before`` to ``after``, per ``count`` (awaits, seconds)."""
    return {k: (after[k] - before[k]) / count for k in after if k in before and after[k] != before[k]} if count else {}


def _equal(got, expected) -> bool:
    return got is not None and bool(np.array_equal(np.asarray(got), expected))


def _host(x):
    """A host copy of an output: a DeviceArray's ``copy_to_host``, a CuPy array's ``get``."""
    for name in ("copy_to_host", "get"):
        copy = getattr(x, name, None)
        if copy is not None:
            return np.asarray(copy())
    return np.asarray(x)


# -- the small patterns: numpy in, numpy out, and the peers' chains ----------------------------
# the in-flight row's twin: pool streams shared once this many are lent (Knobs.stream_share_after;
# the CuPy probe of notes/enqueue-chain.md: 1,000 distinct streams cost 2.6-5 us more per launch
# than 128 or fewer)
SHARE_STREAMS_AFTER = 16


def _alloc_like(a, x) -> bool:
    """The allocation row's check: its last array has ``x``'s shape and element type."""
    return a is not None and a.shape == x.shape and a.dtype == x.dtype


class _Small:
    """The runners of the 4 KiB patterns, and what they share: the backend, the inputs, the loop."""

    def __init__(self, backend, program, settings, rng, loop):
        self.backend = backend
        self.program = program
        self.settings = settings
        self.loop = loop
        n = settings.nbytes // 4
        self.n = n
        self.a = rng.random(n, dtype=np.float32)
        self.b = rng.random(n, dtype=np.float32)
        self.expected = self.a + self.b
        self.chained = chain_reference(self.a, self.b, settings.steps)
        self.last: dict = {}  # runner -> its last output, for its check
        self.aio: dict = {"awaits": 0}  # the await counters that moved in the await row, summed

    def runner(self, name, fn, key, scale=1, group=None):
        expected = self.chained if key.startswith("pattern.chain.") else self.expected
        return engine.Runner(name, fn, lambda: _equal(self.last.get(key), expected), scale, group)

    def _common(self):
        return self.backend.dispatch_async, self.program, [self.a, self.b], self.settings.steps

    # -- numpy in, numpy out
    def single(self, count):
        """The enqueue of a kept dispatch_async with one in flight: each taken before the next."""
        dispatch_async, program, inputs, steps = self._common()
        pc = time.perf_counter_ns
        per = []
        outs = None
        for _ in range(count):
            total = 0
            for _ in range(steps):
                t0 = pc()
                pending = dispatch_async(program, inputs)
                t1 = pc()
                outs = pending.result()
                del pending
                total += t1 - t0
            per.append(total / steps)
        self.last["pattern.enqueue.single"] = outs[0] if outs else None
        return {"pattern.enqueue.single": per}

    def dropped_host(self, count):
        """dispatch_async from numpy, the handle dropped at once; the context drained after."""
        backend, program, inputs, steps = self.backend, self.program, [self.a, self.b], self.settings.steps
        dispatch_async = backend.dispatch_async
        pc = time.perf_counter_ns
        per, drained = [], []
        for _ in range(count):
            t0 = pc()
            for _ in range(steps):
                dispatch_async(program, inputs)
            t1 = pc()
            context_synchronize(backend)
            t2 = pc()
            per.append((t1 - t0) / steps)
            drained.append((t2 - t0) / steps)
        # the dropped outputs are never read: one kept dispatch shows the backend still right
        self.last["pattern.dropped.host"] = dispatch_async(program, inputs).result()[0]
        return {"pattern.dropped.host": per, "pattern.dropped.host_drained": drained}

    def inflight(self, count):
        """``steps`` dispatch_async kept in a list, then every result taken; per enqueue."""
        dispatch_async, program, inputs, steps = self._common()
        pc = time.perf_counter_ns
        per = []
        outs = None
        for _ in range(count):
            handles: list = []
            append = handles.append
            t0 = pc()
            for _ in range(steps):
                append(dispatch_async(program, inputs))
            t1 = pc()
            per.append((t1 - t0) / steps)
            for pending in handles:
                outs = pending.result()
                if not _equal(outs[0], self.expected):
                    outs = [None]
                    break
            del handles
        self.last["pattern.inflight"] = outs[0] if outs else None
        return {"pattern.inflight": per}

    def _shared(self, measure, key, count):
        """``measure`` again with the backend's pool streams shared once ``SHARE_STREAMS_AFTER``
        are lent (an experiment knob, off by default): the knob is set and the plan warmed before
        the clock starts, and put back (and warmed) after it stops."""
        from . import hooks

        dispatch_async, program, inputs = self.backend.dispatch_async, self.program, [self.a, self.b]
        old = hooks.set_knobs(self.backend, stream_share_after=SHARE_STREAMS_AFTER)
        own = self.last.get(key)
        try:
            dispatch_async(program, inputs).result()
            out = measure(count)[key]
            self.last[key + ".shared"] = self.last[key]
        finally:
            self.last[key] = own
            hooks.set_knobs(self.backend, old)
            dispatch_async(program, inputs).result()
        return {key + ".shared": out}

    def inflight_shared(self, count):
        return self._shared(self.inflight, "pattern.inflight", count)

    def dropped_shared(self, count):
        return self._shared(self.dropped_host, "pattern.dropped.host", count)

    def blocking(self, count):
        dispatch, program, inputs = self.backend.dispatch, self.program, [self.a, self.b]
        pc = time.perf_counter_ns
        walls = []
        outs = None
        for _ in range(count):
            t0 = pc()
            outs = dispatch(program, inputs)
            walls.append(pc() - t0)
        self.last["pattern.blocking"] = outs[0] if outs else None
        return {"pattern.blocking": walls}

    def awaited(self, count):
        """``await backend.dispatch_async(...)`` one at a time on the one event loop."""
        dispatch_async, program, inputs = self.backend.dispatch_async, self.program, [self.a, self.b]
        pc = time.perf_counter_ns

        async def awaits():
            walls = []
            outs = None
            for _ in range(count):
                t0 = pc()
                outs = await dispatch_async(program, inputs)
                walls.append(pc() - t0)
            return walls, outs

        before = _aio_counts()
        walls, outs = self.loop.run_until_complete(awaits())
        for k, v in _per(before, _aio_counts(), 1).items():
            self.aio[k] = self.aio.get(k, 0) + v
        self.aio["awaits"] += count
        self.last["pattern.await"] = outs[0] if outs else None
        return {"pattern.await": walls}

    def gathered(self, count):
        """``asyncio.gather`` of ``gather`` dispatch_async; per dispatch."""
        dispatch_async, program, inputs, _ = self._common()
        k = self.settings.gather
        pc = time.perf_counter_ns

        async def gathers():
            per = []
            outs = []
            for _ in range(count):
                t0 = pc()
                outs = await asyncio.gather(*[dispatch_async(program, inputs) for _ in range(k)])
                per.append((pc() - t0) / k)
            return per, outs

        per, outs = self.loop.run_until_complete(gathers())
        good = len(outs) == k and all(_equal(o[0], self.expected) for o in outs)
        self.last["pattern.gather"] = outs[0][0] if good else None
        return {"pattern.gather": per}

    def dropped_device(self):
        """dispatch_async on vyre_cuda DeviceArrays, the output named, the handle dropped at once."""
        from vyre_cuda.config import DispatchConfig

        backend, program, steps = self.backend, self.program, self.settings.steps
        made = DispatchConfig(outputs="device")
        zeros = np.zeros_like(self.a)
        # (the vecadd: x + 0 is x, bit for bit)
        d_a = backend.dispatch(program, [self.a, zeros], made)[0]
        d_b = backend.dispatch(program, [self.b, zeros], made)[0]
        d_out = backend.dispatch(program, [zeros, zeros], made)[0]
        ins, outs = [d_a, d_b], [d_out]

        def run(count):
            dispatch_async = backend.dispatch_async
            pc = time.perf_counter_ns
            per = []
            for _ in range(count):
                t0 = pc()
                for _ in range(steps):
                    dispatch_async(program, ins, outputs=outs)
                t1 = pc()
                context_synchronize(backend)
                per.append((t1 - t0) / steps)
            self.last["pattern.dropped.device"] = _host(d_out)
            return {"pattern.dropped.device": per}

        return run

    # -- the README's chain and the peers' chains
    def vyre_chain(self, cp, stream, x, y, kept, key=None):
        """The README's chain on ``stream`` (a CuPy Stream object in the config); ``key`` one of
        TAKEN_KEYS: kept, and timed up to the last result() taken."""
        from vyre_cuda.config import DispatchConfig

        taken_too = key is not None
        key = key or (CHAIN_KEYS[0] if kept else CHAIN_KEYS[1])
        program, steps, dispatch_async = self.program, self.settings.steps, self.backend.dispatch_async
        empty_like = cp.empty_like

        def run(count):
            pc = time.perf_counter_ns
            per = []
            cur = x
            with stream:
                cfg = DispatchConfig(stream=stream)
                for _ in range(count):
                    chain: list = []
                    append = chain.append
                    cur = x
                    t0 = pc()
                    if kept:
                        for _ in range(steps):
                            nxt = empty_like(x)
                            append(dispatch_async(program, [cur, y], cfg, outputs=[nxt]))
                            cur = nxt
                    else:
                        for _ in range(steps):
                            nxt = empty_like(x)
                            dispatch_async(program, [cur, y], cfg, outputs=[nxt])
                            cur = nxt
                    stream.synchronize()
                    if taken_too:
                        taken = [p.result()[0] for p in chain]
                        per.append((pc() - t0) / steps)
                    else:
                        per.append((pc() - t0) / steps)
                        taken = [p.result()[0] for p in chain]  # done: no wait (as the README takes them)
                    del chain
                    if taken and taken[-1] is not cur:  # result() returns the named arrays
                        cur = None
                        break
            self.last[key] = None if cur is None else _host(cur)
            return {key: per}

        return run

    def vyre_chain_fence(self, cp, stream, x, y):
        """The taken chain with ``Knobs.fence_on_demand`` on (set and warmed before the clock
        starts, put back after)."""
        from . import hooks

        inner = self.vyre_chain(cp, stream, x, y, True, TAKEN_KEYS[1])

        def run(count):
            old = hooks.set_knobs(self.backend, fence_on_demand=True)
            try:
                inner(1)  # (plans again with the knob)
                return inner(count)
            finally:
                hooks.set_knobs(self.backend, old)

        return run

    def cupy_alloc(self, cp, stream, x):
        """``cp.empty_like(x)`` alone, kept as the README chain keeps its outputs (through its
        handles): the part of a chain step that is CuPy's array, whoever launches into it."""
        empty_like, steps = cp.empty_like, self.settings.steps

        def run(count):
            pc = time.perf_counter_ns
            per = []
            with stream:
                for _ in range(count):
                    kept: list = []
                    append = kept.append
                    t0 = pc()
                    for _ in range(steps):
                        append(empty_like(x))
                    per.append((pc() - t0) / steps)
                    self.last["pattern.chain.cupy_alloc"] = kept[-1]
                    del kept
            return {"pattern.chain.cupy_alloc": per}

        return run

    def cupy_chain(self, peer, stream, x, y):
        """CuPy ``RawKernel`` (the floor's vecadd source), a new ``cp.empty_like`` per step."""
        kernel, grid, block, n, steps = peer.kernel, peer.grid, peer.block, peer.n, self.settings.steps
        empty_like = peer.cp.empty_like

        def run(count):
            pc = time.perf_counter_ns
            per = []
            cur = x
            with stream:
                for _ in range(count):
                    cur = x
                    t0 = pc()
                    for _ in range(steps):
                        nxt = empty_like(x)
                        kernel(grid, block, (cur, y, nxt, n))
                        cur = nxt
                    stream.synchronize()
                    per.append((pc() - t0) / steps)
            self.last["pattern.chain.cupy"] = _host(cur)
            return {"pattern.chain.cupy": per}

        return run

    def cuda_core_chain(self, peer):
        """cuda.core ``launch`` (the floor's vecadd source), a new ``Device.allocate`` buffer per
        step on the launch's stream (kept until the chain is done), one ``stream.sync()``."""
        steps, nbytes = self.settings.steps, peer.nbytes
        stream, enqueue, allocate = peer.stream, peer.enqueue, peer.dev.allocate
        x, y = peer.ptrs[0], peer.ptrs[1]
        n = np.uint32(peer.n)

        def run(count):
            peer.dev.set_current()
            pc = time.perf_counter_ns
            per = []
            out = None
            for _ in range(count):
                buffers: list = []
                keep = buffers.append
                cur = x
                t0 = pc()
                for _ in range(steps):
                    buf = allocate(nbytes, stream=stream)
                    keep(buf)
                    enqueue((cur, y, int(buf.handle), n))
                    cur = int(buf.handle)
                stream.sync()
                per.append((pc() - t0) / steps)
                out = np.empty(peer.n, np.float32)
                peer._copy(peer.cu.cuMemcpyDtoH(out.ctypes.data, cur, nbytes), "cuMemcpyDtoH")
                for buf in buffers:
                    buf.close(stream)
                del buffers
            stream.sync()
            self.last["pattern.chain.cuda_core"] = out
            return {"pattern.chain.cuda_core": per}

        return run

    def torch_chain(self, peer):
        """PyTorch ``torch.add(cur, y)`` (a new output per step), one synchronize."""
        torch, dev, steps = peer.torch, peer.dev, self.settings.steps
        x, y = peer.d_a, peer.d_b

        def run(count):
            add, sync = torch.add, torch.cuda.synchronize
            pc = time.perf_counter_ns
            per = []
            cur = x
            for _ in range(count):
                cur = x
                t0 = pc()
                for _ in range(steps):
                    cur = add(cur, y)
                sync(dev)
                per.append((pc() - t0) / steps)
            self.last["pattern.chain.torch"] = np.asarray(cur.cpu().numpy())
            return {"pattern.chain.torch": per}

        return run


def _chain_rows(small, source, entry, peers, skipped, opened):
    """The README's chain (CuPy needed) and the peers' chains beside it."""
    s = small.settings
    stream = x = y = None
    if not peers:
        skipped["chain"] = "peers are off (the README's chain runs on CuPy arrays)"
        return []
    rows = []
    if not peer_available("cupy"):
        skipped["chain"] = f"the README's chain runs on CuPy arrays and a CuPy stream: {missing_reason('cupy')}"
    else:
        try:
            import cupy as cp

            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                x, y = cp.asarray(small.a), cp.asarray(small.b)
            stream.synchronize()
            scale = max(1, s.awaits // s.repeats)
            for kept, name in ((True, "handles kept"), (False, "handles dropped")):
                run = small.vyre_chain(cp, stream, x, y, kept)
                key = CHAIN_KEYS[0] if kept else CHAIN_KEYS[1]
                rows.append(small.runner(f"README chain, {name}", run, key, scale, "chain"))
            run = small.vyre_chain(cp, stream, x, y, True, TAKEN_KEYS[0])
            rows.append(small.runner("README chain, results taken", run, TAKEN_KEYS[0], scale, "chain taken"))
            run = small.vyre_chain_fence(cp, stream, x, y)
            rows.append(
                small.runner("README chain, results taken, events on demand", run, TAKEN_KEYS[1], scale, "chain fence")
            )
            alloc = small.cupy_alloc(cp, stream, x)
            rows.append(
                engine.Runner(
                    "CuPy empty_like alone",
                    alloc,
                    lambda: _alloc_like(small.last.get("pattern.chain.cupy_alloc"), x),
                    scale,
                    "chain",
                )
            )
        except Exception as exc:  # noqa: BLE001 (a broken CuPy must not stop the run)
            skipped["chain"] = f"failed to start: {type(exc).__name__}: {exc}".splitlines()[0]
    scale = max(1, s.awaits // s.repeats)
    for name in ("cuda_core", "cupy", "torch"):
        group = f"{name} chain"
        if not peer_available(name):
            skipped[group] = missing_reason(name)
            continue
        if name == "cupy" and "chain" in skipped:
            skipped[group] = "runs beside the README's chain, which was not measured"
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                peer = open_peer(name, small.backend, None, entry, source, small.a, small.b, small.expected)
        except Exception as exc:  # noqa: BLE001 (a broken peer must not stop the run)
            skipped[group] = f"failed to start: {type(exc).__name__}: {exc}".splitlines()[0]
            continue
        opened.append(peer)
        if name == "cupy":
            run = small.cupy_chain(peer, stream, x, y)
        elif name == "cuda_core":
            run = small.cuda_core_chain(peer)
        else:
            run = small.torch_chain(peer)
        rows.append(small.runner(f"{name} chain", run, f"pattern.chain.{name}", scale, group))
    return rows


def _small_rows(small, source, entry, peers, skipped, opened):
    s = small.settings
    batch = max(1, s.awaits // s.repeats)
    rows = _chain_rows(small, source, entry, peers, skipped, opened)
    rows += [
        small.runner("dispatch_async, one in flight", small.single, "pattern.enqueue.single", batch, "enqueue"),
        small.runner("dispatch_async dropped", small.dropped_host, "pattern.dropped.host", batch, "dropped host"),
        small.runner("dispatch_async, 1,000 in flight", small.inflight, "pattern.inflight", batch, "in flight"),
        small.runner(
            "dispatch_async, 1,000 in flight, shared streams",
            small.inflight_shared,
            "pattern.inflight.shared",
            batch,
            "in flight, shared streams",
        ),
        small.runner(
            "dispatch_async dropped, shared streams",
            small.dropped_shared,
            "pattern.dropped.host.shared",
            batch,
            "dropped host, shared streams",
        ),
        small.runner("await dispatch_async", small.awaited, "pattern.await", 1, "await"),
        small.runner("dispatch (blocking)", small.blocking, "pattern.blocking", 1, "blocking"),
        small.runner("asyncio.gather", small.gathered, "pattern.gather", max(1, s.awaits // s.gathers), "gather"),
    ]
    try:
        run = small.dropped_device()
    except Exception as exc:  # noqa: BLE001 (a core without device outputs: skipped, not fatal)
        skipped["dropped device"] = f"failed to start: {type(exc).__name__}: {exc}".splitlines()[0]
    else:
        rows.append(
            small.runner("dispatch_async dropped, device", run, "pattern.dropped.device", batch, "dropped device")
        )
    return rows


# -- the long kernel: the process's CPU while it is awaited -------------------------------------
def measure_idle_cpu(backend, loop, spin_s: float, repeats: int = 1) -> dict:
    """The process CPU time over the wall time while one kernel spinning ``spin_s`` seconds is
    awaited on ``loop``, and while ``result()`` waits for it: ``{"await_idle_cpu": fraction,
    "blocking_idle_cpu": fraction, "spin_wall_s": seconds, ...}`` (medians over ``repeats``).
    Raises :class:`~vyre_cuda.profile.WrongResult` when the kernel's output is wrong."""
    program = spin_program()
    ones = np.ones(SPIN_OUTPUTS, np.uint32)
    first = backend.dispatch(program, [np.array([1000], np.uint64)])  # compiled, planned, pools warm
    if not _equal(first[0], ones):
        raise engine.WrongResult(
            f"the spin kernel wrote {np.asarray(first[0])[:4]}..., not ones",
            "this is a bug in vyre_cuda or in the harness; report it with the output of `vyre-cuda info`",
        )
    ns = np.array([round(spin_s * 1e9)], np.uint64)

    async def awaited(pending):
        return await pending

    fractions: dict[str, list] = {"await": [], "blocking": []}
    walls, rates = [], []
    for _ in range(repeats):
        for kind in ("await", "blocking"):
            before = _aio_counts()
            w0, c0 = time.perf_counter(), time.process_time()
            pending = backend.dispatch_async(program, [ns])
            outs = loop.run_until_complete(awaited(pending)) if kind == "await" else pending.result()
            c1, w1 = time.process_time(), time.perf_counter()
            after = _aio_counts()
            del pending
            if not _equal(outs[0], ones):
                raise engine.WrongResult(
                    f"the spin kernel's output was wrong after {'an await' if kind == 'await' else 'result()'}",
                    "this is a bug in vyre_cuda or in the harness; report it with the output of `vyre-cuda info`",
                )
            fractions[kind].append((c1 - c0) / (w1 - w0))
            if kind == "await":
                walls.append(w1 - w0)
                rates.append(_per(before, after, w1 - w0))
    values: dict = {
        "await_idle_cpu": median(fractions["await"]),
        "blocking_idle_cpu": median(fractions["blocking"]),
        "spin_wall_s": median(walls),
    }
    if rates and rates[-1]:
        values["idle_await_counts_per_s"] = rates[-1]  # (the last long await's)
    return values


# -- device memory budgets -------------------------------------------------------------------
def _plan_figures(backend, program, inputs, config) -> dict:
    """The streamed plan's chunks of a budget (none where plan_info or its stream plan is absent)."""
    try:
        plan = backend.plan_info(program, inputs, config)
    except Exception:  # noqa: BLE001 (a figure of the report, not a reason to stop the run)
        return {}
    stream = getattr(plan, "stream", None)
    if stream is None:
        return {}
    out = {}
    for name, key in (("chunk_count", "chunks"), ("streams", "streams"), ("device_bytes", "held_bytes")):
        value = getattr(stream, name, None)
        if value is not None:
            out[key] = int(value)
    rows = getattr(stream, "chunk_rows", None)
    if rows is not None:
        out["chunk_bytes"] = int(rows) * 4 * 3  # vecadd f32: two inputs up and one output down per row
    return out


def _smallest_named(exc) -> int | None:
    """The smallest budget a refusal names (``device_memory_budget >= N`` in its text), or None."""
    m = _SMALLEST.search(str(exc))
    return int(m.group(1).replace(",", "").replace("_", "")) if m else None


def measure_budgets(backend, program, settings, rng, progress=None) -> tuple:
    """The budget sweep of ``program`` (the built-in vecadd) declared elementwise: ``(budgets,
    stop)``, ``budgets`` a list of dicts (unbudgeted first, then each budget measured, largest
    first) and ``stop`` why the sweep stopped. See the module's description."""
    from vyre_cuda.config import DispatchConfig

    from .streamed import elementwise_twin

    twin = elementwise_twin(program)
    n = settings.budget_bytes // 4
    a = rng.random(n, dtype=np.float32)
    b = rng.random(n, dtype=np.float32)
    expected = a + b
    out = np.empty_like(a)
    moved = a.nbytes + b.nbytes + out.nbytes
    configs = {None: DispatchConfig(streamed=True)}
    dispatch_into = backend.dispatch_into
    pc = time.perf_counter_ns

    def config(budget):
        if budget not in configs:
            configs[budget] = DispatchConfig(streamed=True, device_memory_budget=budget)
        return configs[budget]

    def probe(budget):
        out.fill(0)  # a stale right answer must not pass the check
        t0 = pc()
        dispatch_into(twin, [a, b], [out], config(budget))
        t = pc() - t0
        if not np.array_equal(out, expected):
            what = "unbudgeted" if budget is None else f"device_memory_budget={budget:,}"
            raise engine.WrongResult(
                f"the streamed vecadd ({what}) produced a wrong result",
                "this is a bug in vyre_cuda or in the harness; report it with the output of `vyre-cuda info`",
            )
        return t

    stop_ns = settings.budget_stop_s * 1e9
    samples: dict = {}
    accepted: list = []
    stop: dict = {}

    def accept(budget, t):
        accepted.append(budget)
        if t > stop_ns:  # measured once: no repetitions of a dispatch this long
            samples[budget] = [t]
            stop.update(reason="slow", budget=budget, seconds=t / 1e9)
            return False
        return True

    probe(None)  # planned, pools warm
    budget = settings.budget_start
    while True:
        if progress:
            progress(f"device_memory_budget={budget:,}", 0.5 - 0.5 ** (len(accepted) + 2))
        try:
            t = probe(budget)
        except ValidationError as exc:
            stop.update(reason="refused", budget=budget, message=exc.message, fix=exc.fix)
            named = _smallest_named(exc)
            if named is not None:
                stop["smallest"] = named
            break
        if not accept(budget, t):
            break
        if budget // 2 < settings.budget_min:
            stop.update(reason="bound", budget=budget)
            break
        budget //= 2
    named = stop.get("smallest")
    if named is not None and named > stop["budget"] and (not accepted or named < accepted[-1]):
        try:  # the smallest budget the refusal named: the least one accepted
            accept(named, probe(named))
        except ValidationError as exc:
            stop["named_refused"] = exc.message
    timed = [None] + [x for x in accepted if x not in samples]
    for r in range(settings.budget_repeats):
        for x in timed:
            t0 = pc()
            dispatch_into(twin, [a, b], [out], config(x))
            samples.setdefault(x, []).append(pc() - t0)
        if progress:
            progress("budget rounds", 0.5 + 0.5 * (r + 1) / settings.budget_repeats)
    if not np.array_equal(out, expected):
        raise engine.WrongResult(
            "the streamed vecadd's timed dispatches produced a wrong result",
            "this is a bug in vyre_cuda or in the harness; report it with the output of `vyre-cuda info`",
        )
    budgets = []
    for x in [None, *sorted(accepted, reverse=True)]:
        s = summarize(samples[x])
        entry = {"budget": x, **s.to_dict(), "gbps": moved / s.median, "bytes_moved": moved}
        entry.update(_plan_figures(backend, twin, [a, b], config(x)))
        budgets.append(entry)
    return budgets, stop


# -- one measurement of every pattern -------------------------------------------------------
def _scaled(progress, lo, hi, prefix):
    if progress is None:
        return None
    return lambda label, f: progress(prefix + label, lo + (hi - lo) * min(max(f, 0.0), 1.0))


def measure_patterns(
    backend, source, entry, *, peers=True, rounds=5, rng=None, progress=None, settings=None
) -> PatternResult:
    """Every pattern on ``backend`` (open; it stays open), the peers' chains compiled from
    ``source`` (the floor's vecadd, entry ``entry``) when ``peers``: a
    :class:`~vyre_cuda.profile.report.PatternResult`. ``settings`` (:class:`Settings`, default
    :data:`DEFAULTS`) sizes each measurement. A pattern that fails is skipped with its reason."""
    from vyre_cuda import builtin_programs

    s = DEFAULTS if settings is None else settings
    rng = np.random.default_rng(0) if rng is None else rng
    program = builtin_programs.vecadd_f32()
    result = PatternResult(settings=dataclasses.asdict(s))
    loop = asyncio.new_event_loop()
    opened: list = []
    small = _Small(backend, program, s, rng, loop)
    try:
        rows = _small_rows(small, source, entry, peers, result.skipped, opened)
        with engine.gc_paused():
            samples = engine.run_rounds(
                rows,
                s.awaits,
                s.awaits // 10,
                rounds,
                _scaled(progress, 0.0, 0.4, "patterns: "),
                failed=result.skipped,
            )
        result.systems = {k: summarize(v) for k, v in samples.items() if len(v)}
        awaits = small.aio.pop("awaits")
        if awaits and small.aio:
            result.values["await_counts_per_await"] = {k: v / awaits for k, v in sorted(small.aio.items())}
        if progress:
            progress("patterns: idle CPU while a long kernel is awaited", 0.4)
        try:
            result.values.update(measure_idle_cpu(backend, loop, s.spin_s, s.spin_repeats))
        except Exception as exc:  # noqa: BLE001 (reported by name; the other patterns stand)
            result.skipped["idle CPU"] = f"failed: {type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        for peer in reversed(opened):
            with contextlib.suppress(Exception), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                peer.close()
        loop.close()
    del small
    try:
        result.budgets, result.budget_stop = measure_budgets(
            backend, program, s, rng, _scaled(progress, 0.5, 1.0, "patterns: ")
        )
    except Exception as exc:  # noqa: BLE001
        result.skipped["budgets"] = f"failed: {type(exc).__name__}: {exc}".splitlines()[0]
    return result


def run_patterns(
    *, device=0, backend=None, backend_options=None, peers=True, rounds=5, progress=None, seed=0, settings=None
):
    """Only the patterns, as a :class:`~vyre_cuda.profile.ProfileReport` with no sizes (their
    targets included): ``bench_dispatch.py --only patterns``."""
    import datetime

    from .peers import PEERS, peer_version
    from .records import BenchReport
    from .targets import evaluate_pattern_targets

    if backend is not None and backend_options:
        raise ValidationError(
            f"backend_options {sorted(backend_options)} apply to the backend the run creates, but a backend was passed",
            "configure the CudaBackend you pass, or pass no backend",
        )
    floor = import_floor()  # (the peers' chains compile its vecadd source)
    owned = backend is None
    if owned:
        backend = open_backend(device, backend_options)
    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        result = measure_patterns(
            backend,
            floor.FLOOR_SOURCE,
            floor.FLOOR_ENTRY,
            peers=peers,
            rounds=rounds,
            rng=np.random.default_rng(seed),
            progress=progress,
            settings=settings,
        )
        run_meta = meta(
            backend,
            {
                "rounds": rounds,
                "program": "vecadd_f32 (built-in)",
                "builtin_program": True,
                "patterns_only": True,
                "backend_options": dict(backend_options or {}),
                "peers": {name: peer_version(name) for name in PEERS if peers},
            },
            started,
        )
    finally:
        if owned:
            backend.close()
    return BenchReport(meta=run_meta, sizes=[], targets=evaluate_pattern_targets(result), patterns=result)
