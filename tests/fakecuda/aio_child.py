"""Child of tests/test_aio.py: awaitable dispatches of a real CudaBackend on the fake driver.

The fake completes work synchronously, so "still running" is made by holding its GPU busy
(``fake_cuda_hold``): completion queries answer CUDA_ERROR_NOT_READY and host functions wait
until the scenario releases it. The fake counts completion queries and host functions, which
shows what a parked await costs. Prints one JSON object (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import sys
import threading
import time

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
GPU_COUNTS = ("queries", "host_launched", "host_ran", "host_dropped", "host_waiting")


def backend_for(fake):
    backend = vc.CudaBackend(0)
    a, b = pair(64)
    fake.emulate(backend, VECADD, [a, b], vecadd_emulation(np.float32))
    return backend


def pair(n):
    return RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)


def gpu(fake) -> dict:
    """The fake's completion queries and host functions so far."""
    values = (ctypes.c_longlong * len(GPU_COUNTS))()
    fake.lib.fake_cuda_gpu_counts(values, len(GPU_COUNTS))
    return dict(zip(GPU_COUNTS, values, strict=True))


@contextlib.contextmanager
def busy(fake):
    """The fake GPU is busy inside the block (and released however the block ends)."""
    fake.lib.fake_cuda_hold(1)
    try:
        yield
    finally:
        fake.lib.fake_cuda_hold(0)


def release(fake):
    fake.lib.fake_cuda_hold(0)


def host_functions_done(fake, within_s=10.0):
    """Wait until the fake's callback thread has run (or dropped) every host function."""
    deadline = time.monotonic() + within_s
    while gpu(fake)["host_waiting"] and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.01)  # (the last one may still be inside its function)
    # a dropped host function (as after a fault) never runs: its arm stays counted
    assert gpu(fake)["host_waiting"] == 0 and armed(fake) == 0, (gpu(fake), _aio.stats())


def armed(fake):
    """Host functions of ours armed and neither run nor dropped by the fake."""
    return _aio.stats()["armed"] - gpu(fake)["host_dropped"]


def awaited(backend, pending):
    return _aio.awaitable(pending, backend._ctx)


def delta(before):
    after = _aio.stats()
    return {k: after[k] - before[k] for k in after}


@scenario
def gather_of_64_parked_dispatches_matches_numpy(fake):
    backend = backend_for(fake)
    inputs = [pair(int(RNG.integers(1, 5000))) for _ in range(64)]
    before, counts = _aio.stats(), gpu(fake)

    async def main():
        with busy(fake):
            pendings = [backend.dispatch_async(VECADD, [a, b]) for a, b in inputs]
            tasks = [asyncio.ensure_future(awaited(backend, p)) for p in pendings]
            await asyncio.sleep(0.02)
            assert not any(t.done() for t in tasks), "awaits finished while the GPU was still busy"
            assert _aio.stats()["outstanding"] == 64
            assert gpu(fake)["host_waiting"] == 64
        return await asyncio.gather(*tasks)

    outs = run(main())
    for (a, b), (out,) in zip(inputs, outs):
        assert np.array_equal(out, a + b), "an awaited dispatch gave a wrong result"
    d = delta(before)
    assert d["parked"] == d["notified"] == d["resolved"] == 64 and d["arm_failures"] == 0, d
    assert gpu(fake)["host_launched"] - counts["host_launched"] == 64
    host_functions_done(fake)
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    assert fake.stats()["violations"] == 0, fake.last_violation()
    backend.close()


@scenario
def a_parked_await_makes_no_completion_queries(fake):
    # the polling waiter this replaced queried every 10-90 us: thousands of queries in 0.5 s
    backend = backend_for(fake)
    a, b = pair(3000)

    async def main():
        with busy(fake):
            task = asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, [a, b])))
            await asyncio.sleep(0.02)  # past the spin: parked
            assert _aio.stats()["outstanding"] == 1
            queries = gpu(fake)["queries"]
            await asyncio.sleep(0.5)
            idle = gpu(fake)["queries"] - queries
        return await task, idle

    (out,), idle = run(main())
    assert np.array_equal(out, a + b)
    # only the backstop's checks (at BACKSTOP_S = 0.1 s, doubling): 2 or 3 in 0.5 s
    assert idle <= 5, f"{idle} completion queries while one await was parked for 0.5 s"
    host_functions_done(fake)
    backend.close()


@scenario
def await_of_finished_work_answers_at_once(fake):
    backend = backend_for(fake)
    a, b = pair(1000)
    before = _aio.stats()

    async def main():
        return await awaited(backend, backend.dispatch_async(VECADD, [a, b]))

    (out,) = run(main())
    assert np.array_equal(out, a + b)
    d = delta(before)
    assert d["submitted"] == 0 and d["parked"] == 0, d  # done at the first query
    backend.close()


@scenario
def a_cancelled_await_leaves_the_work_with_the_pending(fake):
    backend = backend_for(fake)
    a, b = pair(3000)
    c, d = pair(3000)
    before = _aio.stats()

    async def main():
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
        assert _aio.stats()["outstanding"] == 0
        return kept

    fake.lib.fake_cuda_hold(1)
    try:
        kept = run(main())
        assert armed(fake) == 2  # their host functions wait for the GPU still
    finally:
        release(fake)
    assert delta(before)["dropped"] == 2
    host_functions_done(fake)  # they fire into tokens nobody waits for
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
def a_host_function_after_the_handle_and_backend_are_gone_is_harmless(fake):
    # the native side never touches the handle (or its event) after the arm: cancel, drop the
    # handle, close the backend, then let the GPU finish
    backend = backend_for(fake)
    a, b = pair(2000)

    async def main():
        task = asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, [a, b])))
        await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with busy(fake):
        run(main())
        gc.collect()
        assert armed(fake) == 1
    host_functions_done(fake)
    backend.close()
    assert fake.stats()["violations"] == 0, fake.last_violation()


@scenario
def wait_for_expiring_leaves_the_work_with_the_pending(fake):
    backend = backend_for(fake)
    a, b = pair(500)
    pending = backend.dispatch_async(VECADD, [a, b])

    async def main():
        try:
            await asyncio.wait_for(awaited(backend, pending), 0.05)
        except asyncio.TimeoutError:
            return True
        return False

    with busy(fake):
        assert run(main()), "wait_for did not expire while the GPU was busy"
    (out,) = run(awaited(backend, pending))
    assert np.array_equal(out, a + b)
    host_functions_done(fake)
    backend.close()


@scenario
def a_failing_dispatch_raises_its_typed_error_through_await(fake):
    backend = backend_for(fake)
    a, b = pair(2000)
    failed = backend.telemetry.snapshot()["failed_dispatches"]

    async def main():
        with busy(fake):
            task = asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, [a, b])))
            await asyncio.sleep(0.01)
            assert not task.done()
            # the next completion query fails
            fake.fail("cuEventQuery", "CUDA_ERROR_UNKNOWN")
            fake.fail("cuStreamQuery", "CUDA_ERROR_UNKNOWN")
        try:
            await task
        except vc.DispatchFailed as exc:
            return exc
        raise AssertionError("the failed dispatch's await did not raise")

    err = run(main())
    fake.clear_failures()
    assert type(err) is vc.DispatchFailed and err.status == "CUDA_ERROR_UNKNOWN", (type(err), err)
    assert str(err).splitlines()[-1].startswith("Fix: ")
    assert backend.telemetry.snapshot()["failed_dispatches"] == failed + 1
    host_functions_done(fake)
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    (out,) = backend.dispatch(VECADD, [a, b])  # the backend goes on
    assert np.array_equal(out, a + b)
    backend.close()


@scenario
def a_fault_that_skips_the_host_function_is_found_by_the_backstop(fake):
    # after a fault the driver never runs host functions: the backstop's is_ready() raises
    backend = backend_for(fake)
    a, b = pair(2000)
    before = _aio.stats()

    async def main():
        with busy(fake):
            task = asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, [a, b])))
            await asyncio.sleep(0.01)
            assert fake.lib.fake_cuda_drop_host_funcs() == 1
            fake.fail("cuEventQuery", "CUDA_ERROR_UNKNOWN")
        try:
            await task
        except vc.DispatchFailed as exc:
            return exc
        raise AssertionError("the failed dispatch's await did not raise")

    err = run(main())
    fake.clear_failures()
    assert err.status == "CUDA_ERROR_UNKNOWN", err
    d = delta(before)
    assert d["notified"] == 0 and d["backstops"] >= 1 and d["failed"] == 1, d
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    backend.close()


@scenario
def a_refused_arm_falls_back_to_sleep_polling(fake):
    streams = fake.stats()["streams"]
    backend = backend_for(fake)
    a, b = pair(700)
    before = _aio.stats()

    async def main():
        fake.fail("cuLaunchHostFunc", "CUDA_ERROR_NOT_SUPPORTED")
        with busy(fake):
            task = asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, [a, b])))
            await asyncio.sleep(0.01)
            assert not task.done()
        return await task

    (out,) = run(main())
    assert np.array_equal(out, a + b)
    d = delta(before)
    assert d["arm_failures"] == 1 and d["parked"] == 0, d
    assert armed(fake) == 0
    backend.close()
    assert fake.stats()["streams"] == streams, "the refused arm's private stream was not destroyed"


@scenario
def the_loop_stays_responsive_while_dispatches_are_awaited(fake):
    backend = backend_for(fake)
    inputs = [pair(500) for _ in range(16)]

    async def main():
        async with ticking() as ticks:
            with busy(fake):
                tasks = [
                    asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, list(x)))) for x in inputs
                ]
                await asyncio.sleep(0.1)
            outs = await asyncio.gather(*tasks)
        return outs, ticks

    outs, ticks = run(main())
    assert len(ticks) >= 30, f"the loop ticked {len(ticks)} times in 100 ms of outstanding work"
    for (a, b), (out,) in zip(inputs, outs):
        assert np.array_equal(out, a + b)
    host_functions_done(fake)
    backend.close()


@scenario
def several_loops_in_several_threads(fake):
    backend = backend_for(fake)
    inputs = {k: [pair(int(RNG.integers(1, 2000))) for _ in range(8)] for k in range(4)}
    results, errors = {}, []
    parked = threading.Barrier(5)

    def worker(k):
        try:

            async def main():
                tasks = [
                    asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, [a, b])))
                    for a, b in inputs[k]
                ]
                await asyncio.sleep(0.02)
                parked.wait(10)  # every loop's awaits are parked
                return await asyncio.gather(*tasks)

            results[k] = run(main())
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    with busy(fake):
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        parked.wait(10)
        assert _aio.stats()["outstanding"] == 32
        assert _aio.stats()["notifiers"] >= 4  # one eventfd per loop
    for t in threads:
        t.join(30)
    assert not errors, errors
    for k in range(4):
        for (a, b), (out,) in zip(inputs[k], results[k]):
            assert np.array_equal(out, a + b)
    host_functions_done(fake)
    backend.close()


@scenario
def a_thousand_concurrent_awaits(fake):
    backend = backend_for(fake)
    inputs = [pair(int(RNG.integers(1, 300))) for _ in range(1000)]
    before = _aio.stats()
    backstop, _aio.BACKSTOP_S = _aio.BACKSTOP_S, 60.0  # every await woken by its host function

    async def main():
        with busy(fake):
            tasks = [asyncio.ensure_future(awaited(backend, backend.dispatch_async(VECADD, [a, b]))) for a, b in inputs]
            while _aio.stats()["outstanding"] < 1000:
                await asyncio.sleep(0.005)
        return await asyncio.gather(*tasks)

    try:
        outs = run(main(), timeout=120)
    finally:
        _aio.BACKSTOP_S = backstop
    for (a, b), (out,) in zip(inputs, outs):
        assert np.array_equal(out, a + b)
    d = delta(before)
    assert d["parked"] == d["resolved"] == 1000 and d["notified"] == 1000, d
    host_functions_done(fake)
    gc.collect()
    assert live(backend) == dict.fromkeys(LIVE, 0), live(backend)
    backend.close()


@scenario
def a_loop_collected_while_its_await_is_armed_releases_its_eventfd_later(fake):
    # the host function keeps the native notifier (and its eventfd) until it has run
    backend = backend_for(fake)
    a, b = pair(100)
    gc.collect()
    base = _aio.stats()["notifiers"]
    with busy(fake):
        pending = backend.dispatch_async(VECADD, [a, b])
        loop = asyncio.new_event_loop()
        task = loop.create_task(awaited(backend, pending))
        loop.run_until_complete(asyncio.sleep(0.01))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        loop.close()
        del task, loop
        gc.collect()
        assert _aio.stats()["notifiers"] == base + 1 and armed(fake) == 1, _aio.stats()
    host_functions_done(fake)
    assert _aio.stats()["notifiers"] == base, _aio.stats()
    (out,) = pending.result()
    assert np.array_equal(out, a + b)
    backend.close()


@scenario
def await_pending_directly_and_wait_async(fake):
    if not hasattr(PendingDispatch, "__await__"):
        raise Skip("PendingDispatch has no __await__ yet (vyre_cuda._aio.awaitable is awaited directly meanwhile)")
    backend = backend_for(fake)
    inputs = [pair(int(RNG.integers(1, 3000))) for _ in range(64)]

    async def main():
        with busy(fake):
            pendings = [backend.dispatch_async(VECADD, [a, b]) for a, b in inputs]
            tasks = [asyncio.ensure_future(_as_coroutine(p)) for p in pendings]
            waiting = asyncio.ensure_future(pendings[0].wait_async())
            await asyncio.sleep(0.01)
            assert not waiting.done()
        await waiting
        return await asyncio.gather(*tasks)

    outs = run(main())
    for (a, b), (out,) in zip(inputs, outs):
        assert np.array_equal(out, a + b)
    host_functions_done(fake)
    backend.close()


@scenario
def short_dispatches_are_answered_without_parking(fake):
    # a sequence of awaits of work the GPU has done: no arm, no host function, results right
    backend = backend_for(fake)
    inputs = [pair(int(RNG.integers(1, 4096))) for _ in range(50)]
    before, counts = _aio.stats(), gpu(fake)

    async def main():
        return [await awaited(backend, backend.dispatch_async(VECADD, [a, b])) for a, b in inputs]

    outs = run(main())
    for (a, b), (out,) in zip(inputs, outs):
        assert np.array_equal(out, a + b)
    d = delta(before)
    assert d["parked"] == 0 and gpu(fake)["host_launched"] == counts["host_launched"], d
    backend.close()


async def _as_coroutine(pending):
    return await pending


if __name__ == "__main__":
    SCENARIOS.main(FakeDriver())
