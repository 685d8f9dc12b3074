"""Awaitable dispatches (vyre_cuda._aio, vyre_cuda._notify): woken from C through each loop's
eventfd, never polled while parked.

The first half drives the machinery with stand-in handles whose readiness the test controls (no
driver): a stand-in arms itself (``_aio_arm``) and is finished by ``Notifier.fire`` from another
thread, the path a host function takes. The second half runs real PendingDispatch handles on the
fake driver (tests/fakecuda/aio_child.py), checked against numpy.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import threading
import time

import pytest
from helpers import scenarios
from helpers.aio import run, ticking

import vyre_cuda
from vyre_cuda import _aio, _notify
from vyre_cuda.errors import DispatchFailed

CHILD = scenarios.FAKECUDA / "aio_child.py"


class Handle:
    """Stands in for a PendingDispatch: ready once ``finish()`` is called (or at once). Armed, it
    is woken through the loop's Notifier, from the thread that calls ``finish()``."""

    def __init__(self, value=None, ready=False, error=None, armable=True):
        self.value = value
        self._ready = threading.Event()
        if ready:
            self._ready.set()
        self.error = error
        self.polls = 0
        self.taken = 0
        self.armed = None
        self.lock = threading.Lock()
        if not armable:
            self._aio_arm = None

    def _aio_arm(self, notifier, token):
        with self.lock:
            if self._ready.is_set():
                return _notify.SETTLED
            self.armed = (notifier, token)
        return _notify.ARMED

    def finish(self, notify=True):
        with self.lock:
            self._ready.set()
            armed, self.armed = self.armed, None
        if armed is not None and notify:
            armed[0].fire(armed[1])

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


def finish_from_thread(handles):
    t = threading.Thread(target=lambda: [h.finish() for h in handles])
    t.start()
    return t


def delta(before):
    after = _aio.stats()
    return {k: after[k] - before[k] for k in after}


def test_many_awaits_park_on_one_eventfd_and_wake_in_any_order():
    handles = [Handle(k) for k in range(64)]
    before = _aio.stats()

    async def main():
        tasks = [asyncio.ensure_future(_aio.awaitable(h)) for h in handles]
        await asyncio.sleep(0.01)
        parked = _aio.stats()["outstanding"]
        finish_from_thread(list(reversed(handles))).join()  # finished in another order than awaited
        return await asyncio.gather(*tasks), parked

    out, parked = run(main())
    assert out == [[k] for k in range(64)]
    assert parked == 64
    d = delta(before)
    assert d["submitted"] == d["parked"] == d["notified"] == d["resolved"] == 64, d
    assert d["backstops"] == 0 and d["arm_failures"] == 0, d
    assert _aio.stats()["outstanding"] == 0
    assert all(h.taken == 1 for h in handles)


def test_a_finished_handle_is_answered_without_waiting():
    before = _aio.stats()
    assert run(_aio.awaitable(Handle("x", ready=True))) == ["x"]
    d = delta(before)
    assert d["submitted"] == 0 and d["parked"] == 0, d


def test_a_parked_await_is_not_polled():
    # the polling waiter this replaced queried every 10-90 us: thousands of polls in 0.3 s
    h = Handle("idle")

    async def main():
        task = asyncio.ensure_future(_aio.awaitable(h))
        await asyncio.sleep(0.01)
        assert _aio.stats()["outstanding"] == 1
        polls = h.polls
        await asyncio.sleep(0.3)
        idle_polls = h.polls - polls
        finish_from_thread([h]).join()
        return await task, idle_polls

    out, idle_polls = run(main())
    assert out == ["idle"]
    # only the backstop's checks (at BACKSTOP_S, doubling): 2 in 0.3 s
    assert idle_polls <= 4, idle_polls


def test_cancelling_an_await_leaves_the_handle_and_a_late_wake_is_harmless():
    h = Handle("kept")

    async def main():
        task = asyncio.ensure_future(_aio.awaitable(h))
        await asyncio.sleep(0.005)
        assert _aio.stats()["outstanding"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _aio.stats()["outstanding"] == 0
        polls = h.polls
        finish_from_thread([h]).join()  # its wake-up fires into a token nobody waits for
        await asyncio.sleep(0.01)
        assert h.polls == polls  # never polled again after the cancel
        return polls

    before = _aio.stats()
    run(main())
    d = delta(before)
    assert d["dropped"] == 1 and d["notified"] == 0, d
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
        finish_from_thread([h]).join()
        with pytest.raises(DispatchFailed) as caught:
            await task
        return caught.value

    before = _aio.stats()
    assert run(main()) is err
    assert h.taken == 0
    assert delta(before)["failed"] == 1


def test_the_backstop_finds_work_whose_wake_up_never_comes(monkeypatch):
    # after a fault the driver skips host functions: the rare is_ready() check ends the await
    monkeypatch.setattr(_aio, "BACKSTOP_S", 0.005)
    err = DispatchFailed("CUDA_ERROR_ILLEGAL_ADDRESS: a fault (test)", "fix it", status="x", call="y")
    quiet, failing = Handle("quiet"), Handle(error=err)

    async def main():
        tasks = [asyncio.ensure_future(_aio.awaitable(h)) for h in (quiet, failing)]
        await asyncio.sleep(0.01)
        for h in (quiet, failing):
            h.finish(notify=False)
        return await asyncio.gather(*tasks, return_exceptions=True)

    before = _aio.stats()
    out = run(main())
    assert out[0] == ["quiet"] and out[1] is err
    d = delta(before)
    assert d["notified"] == 0 and d["backstops"] >= 2 and d["outstanding"] == 0, d


def test_a_handle_that_cannot_arm_is_sleep_polled():
    h = Handle(3, armable=False)

    async def main():
        task = asyncio.ensure_future(_aio.awaitable(h))
        await asyncio.sleep(0.01)
        h.finish()
        return await task

    before = _aio.stats()
    assert run(main()) == [3]
    assert delta(before)["arm_failures"] == 1


def test_a_loop_without_add_reader_is_sleep_polled():
    class NoReader(asyncio.SelectorEventLoop):
        def add_reader(self, *args):
            raise NotImplementedError("no readers here (test)")

    h = Handle(4)

    async def main():
        task = asyncio.ensure_future(_aio.awaitable(h))
        await asyncio.sleep(0.01)
        finish_from_thread([h]).join()
        return await task

    before = _aio.stats()
    loop = NoReader()
    try:
        assert loop.run_until_complete(asyncio.wait_for(main(), 30)) == [4]
    finally:
        loop.close()
    d = delta(before)
    assert d["parked"] == 0 and d["resolved"] == 1 and d["polls"] >= 1, d


def test_an_arm_that_raises_reaches_the_await_and_the_next_await_works():
    class Broken(Handle):
        def _aio_arm(self, notifier, token):
            raise MemoryError("the arm failed (test)")

    with pytest.raises(MemoryError, match="the arm failed"):
        run(_aio.awaitable(Broken(1)))
    assert _aio.stats()["outstanding"] == 0
    g = Handle(2)

    async def main():
        task = asyncio.ensure_future(_aio.awaitable(g))
        await asyncio.sleep(0.002)
        finish_from_thread([g]).join()
        return await task

    assert run(main()) == [2]


def test_the_loop_keeps_ticking_while_dispatches_are_awaited():
    handles = [Handle(k) for k in range(16)]

    async def main():
        async with ticking() as ticks:
            waits = asyncio.ensure_future(asyncio.gather(*(_aio.awaitable(h) for h in handles)))
            await asyncio.sleep(0.1)
            finish_from_thread(handles).join()
            out = await waits
        return out, ticks

    out, ticks = run(main())
    assert out == [[k] for k in range(16)]
    # 100 ms of outstanding work: a blocked loop would tick once or twice
    assert len(ticks) >= 30, len(ticks)


def test_several_loops_in_several_threads_each_watch_their_own_eventfd():
    results, errors, notifiers = {}, [], []
    started, counted = threading.Barrier(4), threading.Barrier(4)

    def parked(loop):
        ref = _aio._watches.get(loop)
        watch = ref() if ref is not None else None
        return watch.outstanding() if watch is not None else 0

    def worker(k):
        try:
            hs = [Handle((k, j)) for j in range(8)]

            async def main():
                tasks = [asyncio.ensure_future(_aio.awaitable(h)) for h in hs]
                # this loop's 8 awaits park after their short spin (later under load): 5 s at most
                deadline = time.monotonic() + 5
                while parked(asyncio.get_running_loop()) < 8 and time.monotonic() < deadline:
                    await asyncio.sleep(0.002)
                started.wait(5)  # every loop has parked its awaits, and none has finished
                notifiers.append(_aio.stats()["notifiers"])
                counted.wait(5)  # (no loop finishes, freeing its eventfd, before all have counted)
                finish_from_thread(hs).join()  # finished from yet another thread
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
    assert min(notifiers) >= 4  # one eventfd per loop


def test_a_closed_loop_does_not_break_later_awaits():
    h = Handle(1)
    loop = asyncio.new_event_loop()
    task = loop.create_task(_aio.awaitable(h))
    loop.run_until_complete(asyncio.sleep(0.005))
    task._log_destroy_pending = False  # (it is abandoned on purpose)
    loop.close()  # the task never finishes; its wake-up goes to a loop that is gone
    h.finish()
    del task, loop
    gc.collect()
    assert _aio.stats()["outstanding"] == 0
    assert run(_aio.awaitable(Handle(2, ready=True))) == [2]
    g = Handle(3)

    async def main():
        t = asyncio.ensure_future(_aio.awaitable(g))
        await asyncio.sleep(0.002)
        finish_from_thread([g]).join()
        return await t

    assert run(main()) == [3]


def test_a_collected_loop_releases_its_eventfd():
    gc.collect()
    base = _aio.stats()["notifiers"]
    for k in range(5):
        g = Handle(k)

        async def main(g=g):
            t = asyncio.ensure_future(_aio.awaitable(g))
            await asyncio.sleep(0.002)
            finish_from_thread([g]).join()
            return await t

        assert run(main()) == [k]
    gc.collect()
    assert _aio.stats()["notifiers"] <= base
    assert _notify.counts()["armed"] == 0


def test_neither_exit_nor_a_forked_child_is_blocked():
    # a child that parks an await, forks while it is parked, awaits again in the fork (a fresh
    # eventfd there), and exits with the await still parked: both processes end promptly
    code = r"""
import asyncio, os, sys
sys.path.insert(0, sys.argv[1])
from test_aio import Handle, finish_from_thread
from vyre_cuda import _aio
assert asyncio.run(_aio.awaitable(Handle(1, ready=True))) == [1]
h = Handle(2)
async def start():
    asyncio.ensure_future(_aio.awaitable(h)); await asyncio.sleep(0.01)
loop = asyncio.new_event_loop(); loop.run_until_complete(start())
assert _aio.stats()["outstanding"] == 1
pid = os.fork()
if pid == 0:
    g = Handle(3)
    async def main():
        t = asyncio.ensure_future(_aio.awaitable(g)); await asyncio.sleep(0.005)
        finish_from_thread([g]).join(); return await t
    fresh = _aio.stats()["outstanding"] == 0
    ok = fresh and asyncio.run(main()) == [3] and _aio.stats()["notified"] >= 1
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


@pytest.mark.parametrize("late", [False, True])
def test_exit_with_a_parked_await_on_the_fake_driver(fake_libcuda, late):
    # the interpreter exits while an await is parked: its host function never runs (dropped, as
    # after a fault) or runs during the exit (the GPU released just before); either way the
    # process ends cleanly
    import fakecuda

    code = r"""
import asyncio, ctypes, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import _aio, builtin_programs as bp
fake = FakeDriver()
backend = vc.CudaBackend(0)
a = np.arange(64, dtype=np.float32)
fake.emulate(backend, bp.vecadd_f32(), [a, a], vecadd_emulation(np.float32))
fake.lib.fake_cuda_hold(1)
pending = backend.dispatch_async(bp.vecadd_f32(), [a, a])
loop = asyncio.new_event_loop()
task = loop.create_task(_aio.awaitable(pending, backend._ctx))
loop.run_until_complete(asyncio.sleep(0.01))
assert _aio.stats()["parked"] == 1 and _aio.stats()["armed"] == 1
if sys.argv[1] == "0":
    fake.lib.fake_cuda_drop_host_funcs()  # (as after a fault: it never runs)
fake.lib.fake_cuda_hold(0)
print("exiting")
"""
    proc = fakecuda.run_python(["-c", code, "1" if late else "0"], fake_libcuda, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "exiting"
