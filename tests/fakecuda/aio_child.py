"""Child of tests/test_aio.py: awaitable dispatches of a real CudaBackend on the fake driver.

The fake completes work synchronously, so "still running" is made by answering the completion
queries with CUDA_ERROR_NOT_READY (an injected sticky failure) until the scenario clears it.
Prints one JSON object (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import asyncio
import gc
import sys

import numpy as np
from helpers.aio import run, ticking
from helpers.scenarios import LIVE, Scenarios, Skip, live

import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import _aio
from vyre_cuda import builtin_programs as bp
from vyre_cuda._waits import PendingDispatch

VECADD = bp.vecadd_f32()
SCENARIOS = Scenarios()
scenario = SCENARIOS.register
RNG = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
QUERIES = ("cuEventQuery", "cuStreamQuery")


def backend_for(fake):
    backend = vc.CudaBackend(0)
    a, b = pair(64)
    fake.emulate(backend, VECADD, [a, b], vecadd_emulation(np.float32))
    return backend


def pair(n):
    return RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)


def hold(fake):
    """Completion queries answer NOT_READY until release(fake)."""
    for call in QUERIES:
        fake.fail(call, "CUDA_ERROR_NOT_READY", sticky=True)


def release(fake):
    fake.clear_failures()


def awaited(backend, pending):
    return _aio.awaitable(pending, backend._ctx)


@scenario
def gather_of_64_dispatches_matches_numpy(fake):
    backend = backend_for(fake)
    inputs = [pair(int(RNG.integers(1, 5000))) for _ in range(64)]

    async def main():
        hold(fake)
        pendings = [backend.dispatch_async(VECADD, [a, b]) for a, b in inputs]
        tasks = [asyncio.ensure_future(awaited(backend, p)) for p in pendings]
        await asyncio.sleep(0.02)
        assert not any(t.done() for t in tasks), "awaits finished while the GPU was still busy"
        assert _aio.stats()["outstanding"] == 64
        release(fake)
        return await asyncio.gather(*tasks)

    outs = run(main())
    for (a, b), (out,) in zip(inputs, outs):
        assert np.array_equal(out, a + b), "an awaited dispatch gave a wrong result"
    assert _aio.stats()["threads_started"] == 1
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    backend.close()


@scenario
def await_of_finished_work_answers_on_the_loop(fake):
    backend = backend_for(fake)
    a, b = pair(1000)
    before = _aio.stats()["submitted"]

    async def main():
        return await awaited(backend, backend.dispatch_async(VECADD, [a, b]))

    (out,) = run(main())
    assert np.array_equal(out, a + b)
    assert _aio.stats()["submitted"] == before  # done at once: the waiter was not needed
    backend.close()


@scenario
def a_cancelled_await_leaves_the_work_with_the_pending(fake):
    backend = backend_for(fake)
    a, b = pair(3000)
    c, d = pair(3000)
    dropped = _aio.stats()["dropped"]

    async def main():
        hold(fake)
        kept = backend.dispatch_async(VECADD, [a, b])
        lost = backend.dispatch_async(VECADD, [c, d])
        tasks = [asyncio.ensure_future(awaited(backend, p)) for p in (kept, lost)]
        await asyncio.sleep(0.01)
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
            else:
                raise AssertionError("a cancelled await returned")
        await asyncio.sleep(0.01)
        assert _aio.stats()["outstanding"] == 0
        return kept

    kept = run(main())
    assert _aio.stats()["dropped"] == dropped + 2
    release(fake)
    (out,) = kept.result()  # the handle still owns the work: its result works
    assert np.array_equal(out, a + b)
    gc.collect()  # `lost` was dropped un-awaited while its work ran: deferred, never waited for
    snap = backend.telemetry.snapshot()
    assert snap["deferred_drops"] == 1 and backend._core.deferred == 1, snap
    a, b = pair(100)
    (out,) = backend.dispatch(VECADD, [a, b])  # reclaims the dropped work (done now) first
    assert np.array_equal(out, a + b)
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    snap = backend.telemetry.snapshot()
    assert snap["deferred_recycles"] == 1 and backend._core.deferred == 0, snap
    assert snap["leaked_allocations"] == 0 and snap["failed_dispatches"] == 0, snap
    backend.close()


@scenario
def a_failing_dispatch_raises_its_typed_error_through_await(fake):
    backend = backend_for(fake)
    a, b = pair(2000)
    failed = backend.telemetry.snapshot()["failed_dispatches"]

    async def main():
        hold(fake)
        task = asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, [a, b])))
        await asyncio.sleep(0.01)
        assert not task.done()
        # the waiter's next poll fails (replacing the NOT_READY answers of cuEventQuery)
        fake.fail("cuEventQuery", "CUDA_ERROR_UNKNOWN")
        fake.fail("cuStreamQuery", "CUDA_ERROR_UNKNOWN")
        try:
            await task
        except vc.DispatchFailed as exc:
            return exc
        raise AssertionError("the failed dispatch's await did not raise")

    err = run(main())
    release(fake)
    assert type(err) is vc.DispatchFailed and err.status == "CUDA_ERROR_UNKNOWN", (type(err), err)
    assert str(err).splitlines()[-1].startswith("Fix: ")
    assert backend.telemetry.snapshot()["failed_dispatches"] == failed + 1
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    (out,) = backend.dispatch(VECADD, [a, b])  # the backend goes on
    assert np.array_equal(out, a + b)
    backend.close()


@scenario
def the_loop_stays_responsive_while_dispatches_are_awaited(fake):
    backend = backend_for(fake)
    inputs = [pair(500) for _ in range(16)]

    async def main():
        hold(fake)
        async with ticking() as ticks:
            tasks = [asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, list(x)))) for x in inputs]
            await asyncio.sleep(0.1)
            release(fake)
            outs = await asyncio.gather(*tasks)
        return outs, ticks

    outs, ticks = run(main())
    assert len(ticks) >= 30, f"the loop ticked {len(ticks)} times in 100 ms of outstanding work"
    for (a, b), (out,) in zip(inputs, outs):
        assert np.array_equal(out, a + b)
    backend.close()


@scenario
def await_pending_directly(fake):
    if not hasattr(PendingDispatch, "__await__"):
        raise Skip("PendingDispatch has no __await__ yet (vyre_cuda._aio.awaitable is awaited directly meanwhile)")
    backend = backend_for(fake)
    inputs = [pair(int(RNG.integers(1, 3000))) for _ in range(64)]

    async def main():
        hold(fake)
        pendings = [backend.dispatch_async(VECADD, [a, b]) for a, b in inputs]
        tasks = [asyncio.ensure_future(_as_coroutine(p)) for p in pendings]
        waiting = asyncio.ensure_future(pendings[0].wait_async())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        release(fake)
        await waiting
        return await asyncio.gather(*tasks)

    outs = run(main())
    for (a, b), (out,) in zip(inputs, outs):
        assert np.array_equal(out, a + b)
    backend.close()


async def _as_coroutine(pending):
    return await pending


if __name__ == "__main__":
    SCENARIOS.main(FakeDriver())
