"""Awaitable dispatches (vyre_cuda._aio): one waiter thread, futures resolved on their own loops.

The first half drives the waiter with stand-in handles whose ``is_ready`` the test controls (no
driver): one thread for everything, cancellation, errors, several loops in several threads, a
responsive loop, latency while work is outstanding. The second half runs real PendingDispatch
handles on the fake driver (tests/fakecuda/aio_child.py), checked against numpy.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import pytest
from helpers import scenarios
from helpers.aio import run, ticking

import vyre_cuda
from vyre_cuda import _aio
from vyre_cuda.errors import DispatchFailed

CHILD = scenarios.FAKECUDA / "aio_child.py"


def waiters() -> int:
    """Waiter threads alive in this process."""
    return sum(t.name == "vyre-cuda-aio-waiter" for t in threading.enumerate())


class Handle:
    """Stands in for a PendingDispatch: ready once ``finish()`` is called (or at once)."""

    def __init__(self, value=None, ready=False, error=None):
        self.value = value
        self._ready = threading.Event()
        if ready:
            self._ready.set()
        self.error = error
        self.polls = 0
        self.taken = 0
        self.lock = threading.Lock()

    def finish(self):
        self._ready.set()

    def is_ready(self):
        with self.lock:
            self.polls += 1
        if self.error is not None and self._ready.is_set():
            raise self.error
        return self._ready.is_set()

    def result(self):
        assert self._ready.is_set(), "result() before the work was done would block the loop"
        self.taken += 1
        return [self.value]


def test_many_awaits_share_one_waiter_thread():
    handles = [Handle(k) for k in range(64)]
    before = _aio.stats()

    async def main():
        tasks = [asyncio.ensure_future(_aio.awaitable(h)) for h in handles]
        await asyncio.sleep(0.01)
        alive = waiters()
        for h in reversed(handles):  # finished in another order than awaited
            h.finish()
        return await asyncio.gather(*tasks), alive

    out, alive = run(main())
    assert out == [[k] for k in range(64)]
    after = _aio.stats()
    assert alive == 1 and after["threads_started"] - before["threads_started"] <= 1
    assert after["submitted"] - before["submitted"] == 64 and after["resolved"] - before["resolved"] == 64
    assert after["outstanding"] == 0
    assert all(h.taken == 1 for h in handles)


def test_a_finished_handle_is_answered_without_the_waiter():
    before = _aio.stats()["submitted"]
    assert run(_aio.awaitable(Handle("x", ready=True))) == ["x"]
    assert _aio.stats()["submitted"] == before


def test_cancelling_an_await_leaves_the_handle_and_the_waiter_forgets_it():
    h = Handle("kept")

    async def main():
        task = asyncio.ensure_future(_aio.awaitable(h))
        await asyncio.sleep(0.005)
        assert _aio.stats()["outstanding"] >= 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        polls = h.polls
        await asyncio.sleep(0.01)  # the waiter drops the entry and never polls the handle again
        assert h.polls == polls
        assert _aio.stats()["outstanding"] == 0

    before = _aio.stats()["dropped"]
    run(main())
    assert _aio.stats()["dropped"] == before + 1
    h.finish()
    assert h.result() == ["kept"]  # the work still belongs to the handle


def test_wait_for_expiring_is_a_cancellation():
    h = Handle(1)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(_aio.awaitable(h), 0.01)

    run(main())
    h.finish()
    assert run(_aio.awaitable(h)) == [1]


def test_a_failing_handle_raises_its_own_error_through_await():
    err = DispatchFailed("CUDA_ERROR_LAUNCH_FAILED: the launch failed (test)", "fix it", status="x", call="y")
    h = Handle(error=err)

    async def main():
        task = asyncio.ensure_future(_aio.awaitable(h))
        await asyncio.sleep(0.005)
        h.finish()
        with pytest.raises(DispatchFailed) as caught:
            await task
        return caught.value

    assert run(main()) is err
    assert h.taken == 0


def test_the_loop_keeps_ticking_while_dispatches_are_awaited():
    handles = [Handle(k) for k in range(16)]

    async def main():
        async with ticking() as ticks:
            waits = asyncio.ensure_future(asyncio.gather(*(_aio.awaitable(h) for h in handles)))
            await asyncio.sleep(0.1)
            for h in handles:
                h.finish()
            out = await waits
        return out, ticks

    out, ticks = run(main())
    assert out == [[k] for k in range(16)]
    # 100 ms of outstanding work: a blocked loop would tick once or twice
    assert len(ticks) >= 30, len(ticks)


def test_several_loops_in_several_threads():
    results, errors = {}, []

    def worker(k):
        try:
            hs = [Handle((k, j)) for j in range(8)]

            async def main():
                tasks = [asyncio.ensure_future(_aio.awaitable(h)) for h in hs]
                await asyncio.sleep(0.002)
                for h in hs:
                    h.finish()
                return await asyncio.gather(*tasks)

            results[k] = run(main())
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors
    assert results == {k: [[(k, j)] for j in range(8)] for k in range(4)}
    assert waiters() == 1


def test_a_finished_dispatch_is_noticed_within_a_bound():
    # the waiter naps at most MAX_NAP_S between polls: the wake-up is well under a millisecond
    # (the bound asserted is loose: this machine is shared)
    lat = []

    async def one():
        h = Handle(0)
        task = asyncio.ensure_future(_aio.ready(h))
        await asyncio.sleep(0.003)  # the waiter has gone to its longest nap
        t0 = time.perf_counter()
        h.finish()
        await task
        lat.append(time.perf_counter() - t0)

    async def main():
        for _ in range(20):
            await one()

    run(main())
    lat.sort()
    assert lat[len(lat) // 2] < 0.005, lat


def test_a_failure_of_the_waiter_itself_reaches_the_awaits_and_a_new_waiter_serves_the_next(monkeypatch):
    def broken(self, entry, driver):
        raise MemoryError("the waiter failed (test)")

    monkeypatch.setattr(_aio._Waiter, "_poll", broken)
    h = Handle(1)
    with pytest.raises(MemoryError, match="the waiter failed"):
        run(_aio.awaitable(h))
    monkeypatch.undo()
    deadline = time.monotonic() + 2
    while waiters() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert waiters() == 0
    g = Handle(2)

    async def main():
        task = asyncio.ensure_future(_aio.awaitable(g))
        await asyncio.sleep(0.002)
        g.finish()
        return await task

    assert run(main()) == [2] and waiters() == 1


def test_a_closed_loop_does_not_break_the_waiter():
    h = Handle(1)
    loop = asyncio.new_event_loop()
    task = loop.create_task(_aio.awaitable(h))
    loop.run_until_complete(asyncio.sleep(0.002))
    task._log_destroy_pending = False  # (it is abandoned on purpose)
    loop.close()  # the task never finishes; the waiter reports into a closed loop
    h.finish()
    deadline = time.monotonic() + 2
    while _aio.stats()["outstanding"] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert _aio.stats()["outstanding"] == 0
    assert run(_aio.awaitable(Handle(2, ready=True))) == [2]
    del task


def test_the_waiter_neither_blocks_exit_nor_a_forked_child():
    # a child that awaits (starting the waiter), forks while it runs, awaits again in the fork,
    # and exits with work outstanding: both processes end promptly
    code = r"""
import asyncio, os, sys, threading
sys.path.insert(0, sys.argv[1])
from test_aio import Handle
from vyre_cuda import _aio
assert asyncio.run(_aio.awaitable(Handle(1, ready=True))) == [1]
h = Handle(2)
async def start():
    asyncio.ensure_future(_aio.awaitable(h)); await asyncio.sleep(0.01)
loop = asyncio.new_event_loop(); loop.run_until_complete(start())
pid = os.fork()
if pid == 0:
    g = Handle(3)
    async def main():
        t = asyncio.ensure_future(_aio.awaitable(g)); await asyncio.sleep(0.005); g.finish(); return await t
    ok = asyncio.run(main()) == [3] and _aio.stats()["threads_started"] == 1
    os._exit(0 if ok else 5)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    # the vyre_cuda under test (a built checkout or an installed wheel), never an unbuilt checkout
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(vyre_cuda.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_root, tests_dir]))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code, tests_dir],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
        cwd=tests_dir,  # (a `-c` child puts its folder first: a checkout's unbuilt package must not shadow)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "child 0", proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 30


# ---------------------------------------------------------------- on the fake driver
SCENARIOS = scenarios.declared(CHILD)


@pytest.fixture(scope="module")
def results(fake_libcuda, tmp_path_factory):
    return scenarios.run_scenarios(CHILD, fake_libcuda, tmp_path_factory)


@pytest.mark.parametrize("name", SCENARIOS)
def test_on_the_fake_driver(results, name):
    result = results[name]
    scenarios.check(result)
