"""Awaitable dispatches: one waiter thread per process resolves asyncio futures as the GPU finishes.

``await pending`` (a :class:`~vyre_cuda.PendingDispatch`) suspends the coroutine, never the event
loop: the handle goes to the process's waiter thread, which polls ``pending.is_ready()`` (one
``cuEventQuery``, the GIL released inside) and, once the GPU is done, wakes the awaiting task
through ``loop.call_soon_threadsafe``. The task then takes the outputs with ``pending.result()``,
which no longer waits. A dispatch that is already done when awaited is answered at once, on the
loop's thread, without the waiter.

One thread for the whole process, not one per dispatch or per backend: it only polls, every
handle costs it the same whichever backend made it (it makes each handle's context current
before polling it), and one thread is one place to settle fork and exit. While handles are
outstanding it polls them all, yielding between rounds for ``SPIN_S`` after the last activity,
then sleeping ``MIN_NAP_S`` doubling to ``MAX_NAP_S``, so a finished dispatch is noticed within
about ``MAX_NAP_S`` plus the kernel timer's slack (~50 us on Linux): under 100 us. With nothing
outstanding it blocks on a condition variable and costs nothing.

Cancellation (``task.cancel()``, ``asyncio.wait_for`` expiring) leaves the work where a timeout
leaves it: owned by the PendingDispatch. The waiter forgets the handle (under the entry's lock, so
it is never polled again once the cancel returns); ``result()`` on it still works, and dropping it
waits for the GPU and recycles, as for any dropped handle. A dispatch that fails raises its own
typed error (``DispatchFailed``, ``DeviceLost``...) from the ``await``.

Threads and processes: each awaiting task carries its own loop, so several event loops in several
threads share the one waiter correctly. The thread is a daemon and is stopped and joined at
interpreter exit (``atexit``), so it never keeps the interpreter alive. In a forked child the
waiter is forgotten (``os.register_at_fork``) and a fresh one starts at the child's first await;
the parent's lock is never taken in the child (CUDA contexts do not survive fork, so the parent's
handles cannot be awaited there anyway).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
import time
from typing import Any

__all__ = ["awaitable", "ready", "stats", "SPIN_S", "MIN_NAP_S", "MAX_NAP_S"]

SPIN_S = 50e-6  # after activity: poll rounds separated only by a yield of the GIL
MIN_NAP_S = 10e-6  # then sleep between rounds, doubling...
MAX_NAP_S = 40e-6  # ...up to this (plus the timer slack of the kernel)
JOIN_AT_EXIT_S = 1.0
_DROPPED = object()  # a poll's outcome: the await was cancelled
_COUNTS = ("threads_started", "submitted", "resolved", "failed", "dropped", "polls")


class _Entry:
    """One awaited handle: what the waiter polls, where it reports, and the lock a cancel takes."""

    __slots__ = ("pending", "ctx", "loop", "future", "lock", "pid")

    def __init__(self, pending, ctx: int, loop: asyncio.AbstractEventLoop, future: asyncio.Future) -> None:
        self.pending = pending
        self.ctx = ctx
        self.loop = loop
        self.future = future
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def drop(self) -> None:
        """Forget the handle: once this returns the waiter never touches it again (a poll in
        progress finishes first: one ``cuEventQuery``)."""
        if self.pid != os.getpid():
            # a forked child: the parent's waiter may have held the lock at the fork, and no
            # waiter of this process ever polls this entry
            self.pending = None
            return
        with self.lock:
            self.pending = None


def _settle(future: asyncio.Future, error: BaseException | None) -> None:
    # on the loop's thread; a cancelled task's future is done already
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


class _Waiter:
    """The process's waiter thread and the handles it polls."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._entries: list[_Entry] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._fresh = False  # a handle arrived since the last round: poll without napping
        self.counts = dict.fromkeys(_COUNTS, 0)

    def submit(self, entry: _Entry) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the interpreter is exiting; no dispatch can be awaited now")
            self._entries.append(entry)
            self.counts["submitted"] += 1
            self._fresh = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="vyre-cuda-aio-waiter", daemon=True)
                self.counts["threads_started"] += 1
                self._thread.start()
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            thread = self._thread
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_AT_EXIT_S)

    def outstanding(self) -> int:
        with self._cond:
            return len(self._entries)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 (never leave an await hanging)
            # an unexpected failure of this thread: every await it serves raises it, and the next
            # await starts a new waiter
            with self._cond:
                entries, self._entries = self._entries, []
                self._thread = None
            for entry in entries:
                entry.drop()
                self._report(entry, exc)

    def _serve(self) -> None:
        from . import _driver  # noqa: PLC0415 (the compiled driver module: loaded by then)

        nap = 0.0
        spin_until = 0.0
        while True:
            with self._cond:
                while not self._entries and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                batch = list(self._entries)
                fresh, self._fresh = self._fresh, False
            done = []
            for entry in batch:
                outcome = self._poll(entry, _driver)
                if outcome is not None:
                    done.append((entry, outcome))
            now = time.perf_counter()
            if done or fresh:
                with self._cond:
                    gone = {id(e) for e, _ in done}
                    self._entries = [e for e in self._entries if id(e) not in gone]
                for entry, outcome in done:
                    self._report(entry, outcome)
                nap, spin_until = 0.0, now + SPIN_S
                continue
            if now < spin_until:
                time.sleep(0)  # yield the GIL to the loops, then poll again
                continue
            nap = MIN_NAP_S if nap == 0.0 else min(nap * 2, MAX_NAP_S)
            time.sleep(nap)

    def _poll(self, entry: _Entry, driver):
        """None while the GPU works, ``_DROPPED`` for a cancelled await, True when done, or the
        exception that polling raised."""
        with entry.lock:
            pending = entry.pending
            if pending is None:
                return _DROPPED
            self.counts["polls"] += 1
            try:
                if entry.ctx:
                    # every time: a cheap check (cuCtxGetCurrent) that stays right when a context
                    # is released and another one made at its address
                    driver.make_current(entry.ctx)
                if not pending.is_ready():
                    return None
            except BaseException as exc:  # noqa: BLE001 (the awaiting task raises it)
                entry.pending = None
                return exc
            entry.pending = None  # the task holds the handle; the waiter keeps no reference
            return True

    def _report(self, entry: _Entry, outcome) -> None:
        if outcome is _DROPPED:
            self.counts["dropped"] += 1
            return
        error = None if outcome is True else outcome
        self.counts["resolved" if error is None else "failed"] += 1
        with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: nobody awaits any more
            entry.loop.call_soon_threadsafe(_settle, entry.future, error)


_lock = threading.Lock()
_waiter: _Waiter | None = None


def _the_waiter() -> _Waiter:
    global _waiter
    with _lock:
        if _waiter is None:
            _waiter = _Waiter()
        return _waiter


def _forget_in_child() -> None:
    # a forked child has no waiter thread, and the parent's locks may have been held at the fork
    global _waiter, _lock
    _waiter = None
    _lock = threading.Lock()


def _stop_at_exit() -> None:
    w = _waiter
    if w is not None:
        w.stop()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_stop_at_exit)


def _bind(ctx: int) -> None:
    if ctx:
        from . import _driver  # noqa: PLC0415

        _driver.make_current(ctx)


async def ready(pending, ctx: int = 0) -> None:
    """Wait, without blocking the event loop, until the GPU has finished ``pending``'s work.

    ``ctx`` is the handle's CUDA context (0: the calling thread's current one). Then
    ``pending.result()``, ``result_into(...)`` or ``timed_result()`` return without waiting.
    Raises the dispatch's own error if it failed; a cancelled wait leaves the work owned by
    ``pending``."""
    _bind(ctx)  # the loop's thread: as the dispatch itself did on the thread that issued it
    if pending.is_ready():
        return
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    entry = _Entry(pending, ctx, loop, future)
    _the_waiter().submit(entry)
    try:
        await future
    except asyncio.CancelledError:
        entry.drop()
        raise


async def awaitable(pending, ctx: int = 0) -> Any:
    """``pending.result()`` once the GPU is done, awaited without blocking the event loop: what
    ``await pending`` runs (see :func:`ready` for ``ctx``, errors and cancellation)."""
    await ready(pending, ctx)
    return pending.result()


def stats() -> dict:
    """Counters of this process's waiter: ``threads_started`` (1 once anything was awaited),
    ``submitted``, ``resolved``, ``failed``, ``dropped`` (cancelled awaits), ``polls`` and
    ``outstanding`` (handles it polls now)."""
    w = _waiter
    if w is None:
        return dict.fromkeys((*_COUNTS, "outstanding"), 0)
    with w._cond:
        out = dict(w.counts)
        out["outstanding"] = len(w._entries)
    return out
