"""Awaitable dispatches: ``await pending`` suspends the coroutine, never the loop, and polls nothing.

An await of a :class:`~vyre_cuda.PendingDispatch` that is not done yet goes through three phases:

1. **Inline** (``INLINE_SPIN_S``), only when no other await of this thread is in phase 2: the
   completion is queried back to back in C, GIL released. A short dispatch ends here, at about the
   cost of a blocking ``dispatch()``, holding the loop as one short callback would.
2. **Spin** (``SPIN_S``): one query per loop iteration; other tasks run between them.
3. **Parked**: a host function queued behind the completion event (on a private stream) runs on
   the driver's thread when the GPU is done and writes the loop's eventfd (:mod:`._notify`: C, no
   GIL), which the loop watches with ``add_reader``. No thread polls. The driver skips host
   functions after a fault, so a rare backstop (``BACKSTOP_S`` doubling to ``BACKSTOP_MAX_S``)
   asks ``is_ready()``, which raises the dispatch's error.

The task then takes the outputs with ``pending.result()``; a failed dispatch raises its own typed
error from the ``await``. Cancellation leaves the work owned by the PendingDispatch, as a timeout
does: the native side touches the handle only while arming (on the loop's thread, under the
handle's lock), and a host function firing after the cancel finds no await for its token.

Each loop has its own eventfd and waiters; no thread of ours needs stopping at exit; a forked child
forgets the parent's loops. Python state is under locks, native state under a C++ mutex: correct
without a GIL. docs/guides/asyncio.md has the measurements.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import types
import weakref
from typing import Any

from . import _notify
from ._waits import PendingDispatch

__all__ = ["awaitable", "ready", "stats", "INLINE_SPIN_S", "SPIN_S", "BACKSTOP_S", "BACKSTOP_MAX_S"]

INLINE_SPIN_S = 20e-6  # phase 1: back-to-back queries, the loop held (none of the thread in phase 2)
SPIN_S = 100e-6  # phase 2: one query per loop iteration, this long
BACKSTOP_S = 0.1  # phase 3: a parked await checks is_ready() after this...
BACKSTOP_MAX_S = 2.0  # ...doubling up to this (a fault makes the driver skip host functions)
FALLBACK_NAP_S = (50e-6, 5e-3)  # a loop without add_reader, or a refused arm: sleep-poll, doubling
_COUNTS = (
    "submitted",  # awaits not done at their first query
    "inline",  # ... done within the inline spin (submitted = inline + spun + parked + arm_failures)
    "spun",  # ... done within the loop-iteration spin
    "parked",  # ... armed on the loop's eventfd
    "notified",  # parked awaits woken by their host function
    "backstops",  # backstop checks of parked awaits
    "arm_failures",  # arms the driver refused (those awaits sleep-poll)
    "resolved",  # waits that ended with the GPU done
    "failed",  # ... with the dispatch's error
    "dropped",  # ... cancelled
    "polls",  # is_ready() queries of the spin and the backstop
)


class _Local(threading.local):
    waiting = 0  # awaits of this thread in phase 2 (the inline spin is for when there is none)


_tls = _Local()
_stats_lock = threading.Lock()
_counts = dict.fromkeys(_COUNTS, 0)
_lock = threading.Lock()  # guards _watches and _no_reader
# loop -> weak reference to its _Watch. The loop's selector holds the watch (its reader) and the
# watch's futures hold the loop: a cycle the loop owns, collected with it; this map holds neither.
_watches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_no_reader: weakref.WeakSet = weakref.WeakSet()  # loops whose add_reader is not implemented


def _add(name: str, n: int = 1) -> None:
    with _stats_lock:
        _counts[name] += n


def _bind(ctx: int) -> None:
    if ctx:
        from . import _driver  # noqa: PLC0415

        _driver.make_current(ctx)


class _Entry:
    """One parked await: its future, and what the backstop needs."""

    __slots__ = ("future", "pending", "ctx", "timer", "interval")

    def __init__(self, future: asyncio.Future, pending, ctx: int) -> None:
        self.future = future
        self.pending = pending
        self.ctx = ctx
        self.timer: asyncio.TimerHandle | None = None
        self.interval = BACKSTOP_S

    def wake(self, error: BaseException | None) -> None:
        # on the loop's thread; a cancelled task's future is done already
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.future.done():
            return
        if error is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(error)

    def backstop(self, watch: _Watch, token: int) -> None:
        self.timer = None
        with watch.lock:
            if watch.entries.get(token) is not self:
                return
        _add("backstops")
        _add("polls")
        try:
            _bind(self.ctx)
            done = self.pending.is_ready()
        except BaseException as exc:  # noqa: BLE001 (the dispatch's own error: the await raises it)
            watch.forget(token)
            self.wake(exc)
            return
        if done:
            watch.forget(token)
            self.wake(None)
            return
        self.interval = min(self.interval * 2, BACKSTOP_MAX_S)
        self.timer = self.future.get_loop().call_later(self.interval, self.backstop, watch, token)


class _Watch:
    """One event loop's eventfd (a :class:`~vyre_cuda._notify.Notifier`) and its parked awaits."""

    __slots__ = ("notifier", "lock", "entries", "next_token", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.notifier = _notify.Notifier()
        self.lock = threading.Lock()  # guards entries and next_token
        self.entries: dict[int, _Entry] = {}
        self.next_token = 1
        loop.add_reader(self.notifier.fileno(), self._on_readable)  # (NotImplementedError: none)

    def add(self, entry: _Entry) -> int:
        with self.lock:
            token = self.next_token
            self.next_token += 1
            self.entries[token] = entry
        return token

    def forget(self, token: int) -> _Entry | None:
        with self.lock:
            return self.entries.pop(token, None)

    def outstanding(self) -> int:
        with self.lock:
            return len(self.entries)

    def _on_readable(self) -> None:
        tokens, lost = self.notifier.drain()
        with self.lock:
            if lost:  # (a token went missing: every await checks is_ready() and re-parks if needed)
                woken = list(self.entries.values())
                self.entries.clear()
            else:
                woken = [e for e in map(self.entries.pop, tokens, [None] * len(tokens)) if e is not None]
        for entry in woken:
            entry.wake(None)
        if woken:
            _add("notified", len(woken))


def _watch_of(loop: asyncio.AbstractEventLoop) -> _Watch | None:
    """The loop's watch (made at its first parked await), or None for a loop without add_reader."""
    try:
        weakref.ref(loop)
    except TypeError:  # a loop that cannot be weakly referenced: not kept here (sleep-polled)
        return None
    with _lock:
        ref = _watches.get(loop)
        watch = ref() if ref is not None else None
        if watch is None and loop not in _no_reader:
            try:
                watch = _Watch(loop)
            except NotImplementedError:  # (a loop without add_reader)
                _no_reader.add(loop)
                return None
            _watches[loop] = weakref.ref(watch)
    return watch


def _forget_in_child() -> None:
    # a forked child: the parent's loops, eventfds and locks are not its own
    global _lock, _stats_lock, _watches, _no_reader, _tls
    _lock = threading.Lock()
    _stats_lock = threading.Lock()
    _watches = weakref.WeakKeyDictionary()
    _no_reader = weakref.WeakSet()
    _tls = _Local()


os.register_at_fork(after_in_child=_forget_in_child)


def _first_check(pending, ctx: int) -> bool:
    """Done now, or within the inline spin? Raises the dispatch's error."""
    if type(pending) is PendingDispatch:
        finished = _notify.spin(pending, INLINE_SPIN_S if _tls.waiting == 0 else 0.0)
        if finished < 0:
            pending.is_ready()  # raises the dispatch's error (True if another caller settled it)
            return True
        if finished:
            if finished == 2:  # (done at the first query: not counted, as before any wait)
                with _stats_lock:
                    _counts["submitted"] += 1
                    _counts["inline"] += 1
                    _counts["resolved"] += 1
            return True
    else:
        _bind(ctx)
        if pending.is_ready():
            return True
    _add("submitted")
    return False


@types.coroutine
def _one_iteration():
    yield  # a bare yield: the task runs again at the loop's next iteration


async def _wait(pending, ctx: int) -> None:
    """Phases 2 and 3, for a handle not done at its first check."""
    tls = _tls
    polls = 0
    outcome = "failed"
    try:
        tls.waiting += 1  # (while it spins: a parked await leaves the loop idle)
        try:
            deadline = time.perf_counter() + SPIN_S
            while True:
                await _one_iteration()
                _bind(ctx)
                polls += 1
                if pending.is_ready():
                    outcome = "spun"
                    return
                if time.perf_counter() >= deadline:
                    break
        finally:
            tls.waiting -= 1
        while not await _park(pending, ctx):
            pass
        outcome = "resolved"
    except asyncio.CancelledError:
        outcome = "dropped"
        raise
    finally:
        with _stats_lock:
            _counts["polls"] += polls
            _counts[outcome] += 1
            if outcome == "spun":
                _counts["resolved"] += 1


async def _park(pending, ctx: int) -> bool:
    """Phase 3: is_ready() once the loop's eventfd says done (False only when another caller
    re-armed the event meanwhile)."""
    loop = asyncio.get_running_loop()
    watch = _watch_of(loop)
    if watch is None:
        return await _sleep_poll(pending, ctx)
    future = loop.create_future()
    entry = _Entry(future, pending, ctx)
    token = watch.add(entry)
    try:
        if type(pending) is PendingDispatch:
            rc = watch.notifier.arm(pending, token)
        else:  # a handle that is not a dispatch arms itself (tests), or sleep-polls
            arm = getattr(pending, "_aio_arm", None)
            rc = arm(watch.notifier, token) if arm is not None else 1
    except BaseException:
        watch.forget(token)
        raise
    if rc != _notify.ARMED:
        watch.forget(token)
        if rc == _notify.SETTLED:
            _bind(ctx)
            if pending.is_ready():
                return True
        else:
            _add("arm_failures")
        return await _sleep_poll(pending, ctx)
    _add("parked")
    entry.timer = loop.call_later(BACKSTOP_S, entry.backstop, watch, token)
    try:
        await future
    except BaseException:
        # cancelled (or the backstop's error): never woken again; the work stays with the handle
        watch.forget(token)
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        raise
    _bind(ctx)
    return bool(pending.is_ready())


async def _sleep_poll(pending, ctx: int) -> bool:
    # a loop that cannot watch a descriptor, or an arm the driver refused: poll with sleeps
    nap, longest = FALLBACK_NAP_S
    while True:
        await asyncio.sleep(nap)
        _add("polls")
        _bind(ctx)
        if pending.is_ready():
            return True
        nap = min(nap * 2, longest)


async def ready(pending, ctx: int = 0) -> None:
    """Wait, without blocking the event loop, until the GPU has finished ``pending``'s work (then
    ``result()`` and the like return at once). ``ctx``: the handle's CUDA context (0: the thread's
    current one). Raises the dispatch's error; a cancelled wait leaves the work with ``pending``."""
    if not _first_check(pending, ctx):
        await _wait(pending, ctx)


async def awaitable(pending, ctx: int = 0) -> Any:
    """``pending.result()`` once the GPU is done, awaited without blocking the event loop: what
    ``await pending`` runs (see :func:`ready` for ``ctx``, errors and cancellation)."""
    if not _first_check(pending, ctx):
        await _wait(pending, ctx)
    return pending.result()


def stats() -> dict:
    """This process's await counters (``_COUNTS``), ``outstanding`` (parked now, every loop) and the
    native ``notifiers`` (eventfds alive) and ``armed`` (host functions queued, not yet run)."""
    with _stats_lock:
        out = dict(_counts)
    with _lock:
        watches = [w for w in (ref() for ref in _watches.values()) if w is not None]
    out["outstanding"] = sum(w.outstanding() for w in watches)
    native = _notify.counts()
    out["notifiers"] = native["notifiers"]
    out["armed"] = native["armed"]
    return out
