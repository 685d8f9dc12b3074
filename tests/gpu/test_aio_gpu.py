"""Awaitable dispatches and structural program keys on the GPU, checked against numpy.

A parked await is woken by a host function the driver runs once the GPU is done (vyre_cuda._notify):
these tests show it on the real driver (``parked`` and ``notified`` counters), and that nothing of
the handle is touched after a cancel.
"""

import asyncio
import gc
import threading
import time

import numpy as np
import pytest
from helpers.aio import run, ticking

from vyre_cuda import BufferDecl, Kernel, Program, _aio
from vyre_cuda import builtin_programs as bp
from vyre_cuda._waits import PendingDispatch

LIVE = ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")

# one block that spins for cycles[0] GPU clock cycles: a dispatch that is still running when awaited
_SPIN = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const unsigned long long* cycles, unsigned int* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) {
    const long long start = clock64();
    while (clock64() - start < (long long)cycles[0]) {
    }
    out[i] = 1u;
  }
}
"""
SPIN = Program(Kernel.cuda(_SPIN), [BufferDecl.read("cycles", 0, "u64", 1), BufferDecl.output("out", 1, "u32", 32)])
SPIN_CYCLES = np.array([400_000_000], np.uint64)  # ~0.2 s at 2 GHz


def awaited(backend, pending):
    if hasattr(PendingDispatch, "__await__"):

        async def direct():
            return await pending

        return direct()
    return _aio.awaitable(pending, backend._ctx)


def live(backend):
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in LIVE}


def test_gather_of_64_dispatches_matches_numpy(backend, rng):
    prog = bp.vecadd_f32()
    inputs = []
    for _ in range(64):
        n = int(rng.integers(1, 1 << 20))
        inputs.append((rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)))

    async def main():
        return await asyncio.gather(*(awaited(backend, backend.dispatch_async(prog, [a, b])) for a, b in inputs))

    outs = run(main())
    for (a, b), (out,) in zip(inputs, outs):
        np.testing.assert_array_equal(out, a + b)
    assert _aio.stats()["outstanding"] == 0


def test_a_long_dispatch_is_parked_and_woken_by_its_host_function(fresh_backend):
    before = _aio.stats()

    async def main():
        return await awaited(fresh_backend, fresh_backend.dispatch_async(SPIN, [SPIN_CYCLES]))

    (out,) = run(main())
    assert np.array_equal(out, np.ones(32, np.uint32))
    d = {k: v - before[k] for k, v in _aio.stats().items()}
    # woken by the host function (not found by the backstop, which checks at 0.1 s, then 0.3 s)
    assert d["parked"] == 1 and d["notified"] == 1 and d["arm_failures"] == 0, d
    assert d["backstops"] <= 2, d
    _host_functions_ran()


def _host_functions_ran(within_s=10.0):
    deadline = time.monotonic() + within_s
    while _aio.stats()["armed"] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert _aio.stats()["armed"] == 0, _aio.stats()


def test_several_loops_in_several_threads_await_long_dispatches(fresh_backend, rng):
    prog = bp.vecadd_f32()
    results, errors = {}, []
    inputs = {
        k: [rng.standard_normal(int(rng.integers(1, 1 << 16))).astype(np.float32) for _ in range(4)] for k in range(3)
    }

    def worker(k):
        try:

            async def main():
                spin = asyncio.ensure_future(awaited(fresh_backend, fresh_backend.dispatch_async(SPIN, [SPIN_CYCLES])))
                adds = [awaited(fresh_backend, fresh_backend.dispatch_async(prog, [x, x])) for x in inputs[k]]
                return await spin, await asyncio.gather(*adds)

            results[k] = run(main())
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for k in range(3):
        (spun,), adds = results[k]
        assert np.array_equal(spun, np.ones(32, np.uint32))
        for x, (out,) in zip(inputs[k], adds):
            np.testing.assert_array_equal(out, x + x)
    _host_functions_ran()


def test_the_loop_ticks_while_a_long_dispatch_is_awaited(fresh_backend):
    async def main():
        async with ticking() as ticks:
            (out,) = await awaited(fresh_backend, fresh_backend.dispatch_async(SPIN, [SPIN_CYCLES]))
        return out, ticks

    out, ticks = run(main())
    assert np.array_equal(out, np.ones(32, np.uint32))
    assert len(ticks) >= 20, f"the loop ticked {len(ticks)} times during a ~0.2 s dispatch"


def test_cancelling_an_await_leaves_the_work_with_the_pending(fresh_backend):
    async def main():
        kept = fresh_backend.dispatch_async(SPIN, [SPIN_CYCLES])
        lost = fresh_backend.dispatch_async(SPIN, [SPIN_CYCLES])
        tasks = [asyncio.ensure_future(awaited(fresh_backend, p)) for p in (kept, lost)]
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with pytest.raises(asyncio.CancelledError):
                await t
        return kept

    kept = run(main())
    assert _aio.stats()["outstanding"] == 0
    (out,) = kept.result()  # still owned by the handle: waits for the GPU, then collects
    assert np.array_equal(out, np.ones(32, np.uint32))
    gc.collect()  # the other handle was dropped un-awaited: deferred, reclaimed once its work is done
    _reclaimed(fresh_backend)
    assert live(fresh_backend) == dict.fromkeys(LIVE, 0), live(fresh_backend)
    snap = fresh_backend.telemetry.snapshot()
    assert snap["leaked_allocations"] == 0 and snap["deferred_recycles"] == snap["deferred_drops"] == 1, snap
    _host_functions_ran()  # both fired after their awaits were cancelled and their handles released


def _reclaimed(backend, within_s=10.0):
    """trim() until the dropped handles' work has finished and their resources are back."""
    deadline = time.monotonic() + within_s
    while backend._core.deferred and time.monotonic() < deadline:
        backend.trim()
        time.sleep(0.001)
    assert backend._core.deferred == 0, backend._core.deferred


def test_a_rebuilt_equal_program_reuses_the_plan(fresh_backend, rng):
    a, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
    (out,) = fresh_backend.dispatch(bp.vecadd_f32(), [a, b])
    np.testing.assert_array_equal(out, a + b)
    plans = fresh_backend.telemetry.snapshot()["prepared_plans"]
    for _ in range(10):
        (out,) = fresh_backend.dispatch(bp.vecadd_f32(), [a, b])  # a new, equal program each time
        np.testing.assert_array_equal(out, a + b)
    assert fresh_backend.telemetry.snapshot()["prepared_plans"] == plans
