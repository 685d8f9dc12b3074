"""Caller host memory registered in place (``cuMemHostRegister``), paid once, under one owner.

A registered buffer moves by direct DMA, with no staging copy: the dispatch path asks the driver
whether a buffer is page-locked (``_windows.page_locked``), and a range registered here is. One
process-wide :class:`HostRegistry` owns every range vyre_cuda registered:

- a range is the page-aligned span of a buffer, registered PORTABLE (every context sees it), and
  refcounted per holder: a backend's explicit ``register()`` block, or its automatic policy;
- ranges are disjoint: a buffer inside a range is a hit, one that overlaps a range in part falls
  back to staging (the driver would refuse it);
- lifetimes: an explicit hold keeps a buffer export of the array (it can be neither freed nor
  resized while the block lasts); an automatic one keeps only a weakref on the numpy array that owns
  the memory, whose callback unregisters before numpy frees the data (numpy clears weakrefs first,
  and refuses ``resize`` of an array that is weakly referenced). Memory numpy does not own (a
  bytearray, an mmap, a pointer) is registered only explicitly;
- a range is unregistered when its last hold goes, with the direct gate closed (no dispatch marks
  or enqueues a direct copy meanwhile, see ``_windows``) and after the GPU work of every open
  backend that has work in flight has finished (another backend may DMA from it directly), or at
  once when its owner dies (no dispatch can still use it: a dispatch holds its buffers' exports
  until done);
- a refusal (a budget, an overlap, the driver's locked-memory limits) falls back to staging, and
  :func:`registered_stats` counts it by reason.

The registry's lock is held across the driver's register call (milliseconds per hundred MiB): a
registration is paid once per buffer, and it keeps every decision about a range in one place.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _driver
from ._windows import close_direct_gate, is_page_locked_address, open_direct_gate, set_auto_registered
from .errors import BackendError, ValidationError

log = logging.getLogger("vyre_cuda")

PAGE = mmap.PAGESIZE
_ALREADY_REGISTERED = 712  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
_SIGHTINGS_MAX = 256  # buffers the automatic policy remembers between registrations


def default_budget() -> int:
    """A quarter of the host's physical memory: registered pages can no longer be swapped out."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError, AttributeError):
        return 8 << 30


@dataclass(frozen=True)
class AutoRegister:
    """The automatic registration policy of a backend (``CudaBackend(auto_register=...)``).

    A host buffer of at least ``min_bytes`` that dispatches see ``after`` times (the same page
    span and the same owning numpy array) is registered. By default the register call runs on a
    worker thread, off the dispatch's path: the dispatches that come meanwhile stage the buffer
    as before, and once the driver's call has returned they move it by direct DMA. Registering
    costs about what staging the same bytes once does (22-55 GB/s measured on H100 and H200
    hosts), so paid inline it takes many dispatches to pay for itself; paid on a worker it costs
    the dispatches nothing but host CPU time. Unregistering is paid when the array dies (or at
    ``trim()``/``close()``), about 7 ms per 256 MiB on an H200 host.

    Attributes
    ----------
    min_bytes : int
        Smaller buffers are left to the staging ring, where a copy costs less than a register call.
    after : int
        Sightings of a buffer before it is registered: 2 (seen again) by default; 1 registers
        at first sight.
    background : bool
        Register on a worker thread (default). ``False`` registers inside the dispatch that makes
        the ``after``-th sighting, which then moves it directly.
    """

    min_bytes: int = 4 << 20
    after: int = 2
    background: bool = True

    def __post_init__(self):
        if isinstance(self.min_bytes, bool) or not isinstance(self.min_bytes, int) or self.min_bytes < PAGE:
            raise ValidationError(
                f"AutoRegister(min_bytes={self.min_bytes!r}) is below one page ({PAGE} bytes)",
                "pass min_bytes=4 << 20 (the default) or another byte count of at least a page",
            )
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 1:
            raise ValidationError(
                f"AutoRegister(after={self.after!r}) must be a count of sightings of 1 or more",
                "pass after=2 (the default: a buffer seen again) or another whole number of at least 1",
            )
        if not isinstance(self.background, bool):
            raise ValidationError(
                f"AutoRegister(background={self.background!r}) is not a bool",
                "pass background=True (the default: register on a worker thread) or False",
            )


class Holder:
    """One backend as seen by the registry: its context, and how to wait for its work."""

    __slots__ = ("ctx", "device", "busy", "__weakref__")

    def __init__(self, ctx: int, device: int, busy):
        self.ctx = ctx
        self.device = device
        self.busy = busy  # () -> bool: whether the backend has GPU work in flight


class _Range:
    __slots__ = ("start", "end", "ctx", "auto", "explicit", "owner", "leave_mu", "unregistered", "leaves")

    def __init__(self, start, end, ctx, owner):
        self.start = start
        self.end = end
        self.ctx = ctx  # the context it was registered with (portable: any holder's will do)
        self.auto: dict[Holder, int] = {}  # holder -> 1 (a policy holds a range once)
        # holder -> one buffer export per open register() block (the memory stays put meanwhile)
        self.explicit: dict[Holder, list[memoryview]] = {}
        self.owner = owner  # weakref on the owning numpy array, or None
        # one unregister per range, by whoever comes first: the last hold's release, or the
        # owner's death while that release waits for the gate (never the registry's lock: see
        # _unregister)
        self.leave_mu = threading.Lock()
        self.unregistered = False
        # bumped (under leave_mu) each time it leaves the table and each time a hold takes it back
        # before its unregister: a release unregisters only the leave it saw
        self.leaves = 0

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    def held(self) -> bool:
        return bool(self.auto or self.explicit)

    def any_ctx(self) -> int:
        for h in (*self.explicit, *self.auto):
            return h.ctx
        return self.ctx


class _Pending:
    """A registration the policy handed to the worker thread, not yet in the table."""

    __slots__ = ("start", "end", "holder", "ref", "mu", "dead", "registered", "done")

    def __init__(self, start, end, holder):
        self.start = start
        self.end = end
        self.holder = holder
        self.ref = None  # weakref on the owning numpy array (its callback: _owner_died)
        # held by the worker across the driver's register call, and by an owner's death that
        # waits for that call to return (never with the registry's lock held inside it)
        self.mu = threading.Lock()
        self.dead = False  # the owner died (set under the registry's lock): nothing goes in the table
        self.registered = False  # the driver's call succeeded and no unregister has run since
        self.done = threading.Event()  # set once the worker is finished with it


def page_span(address: int, nbytes: int) -> tuple[int, int]:
    start = address & ~(PAGE - 1)
    return start, (address + nbytes + PAGE - 1) & ~(PAGE - 1)


def owning_array(obj: Any) -> np.ndarray | None:
    """The numpy array that owns ``obj``'s memory (the root of its ``.base`` chain), or None when
    numpy does not own it (a view of a bytearray, an mmap, foreign memory)."""
    root = obj
    while isinstance(root, np.ndarray) and not root.flags.owndata:
        root = root.base
    if isinstance(root, np.ndarray) and root.flags.owndata:
        return root
    return None


class HostRegistry:
    """The process-wide owner of registered ranges (one lock for all of its state)."""

    def __init__(self):
        # reentrant: an owner's weakref callback can run on a thread that holds the lock (a cyclic
        # collection triggered by an allocation under it) and must unregister before numpy frees
        # the memory; so every walk over the ranges is over a snapshot
        self._lock = threading.RLock()
        self._ranges: dict[int, _Range] = {}  # start -> range; disjoint
        # start -> range out of the table and not unregistered yet: a release waits for the gate
        # outside the lock meanwhile, and the owner may die then (see _owner_died)
        self._leaving: dict[int, _Range] = {}
        # start -> a policy's registration handed to the worker thread, not in the table yet
        self._pending: dict[int, _Pending] = {}
        # the worker's queue; a worker thread runs while it holds jobs (started by the first,
        # gone once it is empty: no thread outlives the registrations it was started for)
        self._jobs: collections.deque[_Pending] = collections.deque()
        self._working = False
        self._sightings: dict[tuple[int, int], list] = {}  # span -> [weakref owner, count]
        self._holders: weakref.WeakSet[Holder] = weakref.WeakSet()
        self._budget = default_budget()
        self._register_gbps: float | None = None
        self._counts = dict.fromkeys(("registrations", "unregistrations", "hits", "fallbacks"), 0)
        self._reasons: dict[str, int] = {}

    # -------------------------------------------------------------- holders
    def holder(self, ctx: int, device: int, busy) -> Holder:
        h = Holder(ctx, device, busy)
        with self._lock:
            self._holders.add(h)
        return h

    # -------------------------------------------------------------- explicit holds
    def hold(self, h: Holder, obj: Any, address: int, nbytes: int) -> bool:
        """An explicit hold on ``obj``'s span (registered now if it is not yet). False: it stays
        pageable (a refusal, counted) or is page-locked memory vyre_cuda does not own."""
        keep = memoryview(obj)  # the memory stays put while the block lasts
        start, end = page_span(address, nbytes)
        self._settle(lambda p: p.start < end and start < p.end)  # (a policy's registration of it: found below)
        with self._lock:
            r = self._acquire(h, obj, address, nbytes, auto=False)
            if r is not None:
                r.explicit.setdefault(h, []).append(keep)
                self._publish()
                return True
        keep.release()  # (outside the lock: it may drop the last reference to the array)
        return False

    def unhold(self, h: Holder, address: int, nbytes: int) -> None:
        """The end of one explicit hold on that span."""
        start, end = page_span(address, nbytes)
        with self._lock:
            r = self._containing(start, end)
            keeps = None if r is None else r.explicit.get(h)
            if r is None or not keeps:
                return  # (released by close() already, or never registered)
            keep = keeps.pop()
            if not keeps:
                del r.explicit[h]
            leave = None if r.held() else self._detach(r)
            gone = [] if leave is None else [(r, leave)]
            self._publish()
        self._unregister_live(gone)
        keep.release()  # after the unregister: the memory stayed put until then

    # -------------------------------------------------------------- the automatic policy
    def sighted(self, h: Holder, policy: AutoRegister, obj: Any, address: int, nbytes: int) -> None:
        """A dispatch of the policy's backend uses ``obj``: hold its range, or count the sighting
        and register it at the policy's ``after``-th (on the worker thread unless the policy says
        otherwise). Called before the dispatch asks whether it is page-locked."""
        start, end = page_span(address, nbytes)
        with self._lock:
            owner = owning_array(obj)
            r = self._containing(start, end)
            if r is not None:
                # (a range of memory numpy does not own lives only while a register() block keeps
                # it: the policy never holds one, or it could outlive that memory)
                if r.owner is not None and r.owner() is owner:
                    if h not in r.auto:
                        r.auto[h] = 1  # held: another backend's trim cannot pull it from under this one
                        self._publish()
                    self._counts["hits"] += 1
                return
            if any(p.start < end and start < p.end for p in list(self._pending.values())):
                return  # being registered on the worker: staged until it is
            if is_page_locked_address(address, nbytes):
                return  # page-locked already (pinned_empty, or registered by the caller)
            if owner is None:
                self._refuse("not owned by numpy")
                return
            seen = self._sightings.get((start, end))
            if seen is None or seen[0]() is not owner:
                if len(self._sightings) >= _SIGHTINGS_MAX:
                    self._sightings.pop(next(iter(self._sightings)))
                seen = self._sightings[(start, end)] = [weakref.ref(owner), 0]
            seen[1] += 1
            if seen[1] < policy.after:
                return
            del self._sightings[(start, end)]
            if policy.background:
                self._submit(h, owner, address, nbytes)
                return
            r = self._acquire(h, obj, address, nbytes, auto=True)
            if r is not None:
                r.auto[h] = 1
                self._publish()

    # -------------------------------------------------------------- a backend's trim and close
    def release(self, h: Holder, *, explicit: bool) -> None:
        """Drop ``h``'s automatic holds (trim), and its explicit ones too (close; a block still
        open then ends with no effect)."""
        self._settle(lambda p: p.holder is h)  # (its registrations in flight go in the table first)
        gone: list[tuple[_Range, int]] = []
        keeps: list[memoryview] = []
        with self._lock:
            for r in list(self._ranges.values()):
                r.auto.pop(h, None)
                if explicit:
                    keeps.extend(r.explicit.pop(h, ()))
                leave = None if r.held() else self._detach(r)
                if leave is not None:
                    gone.append((r, leave))
            if explicit:
                self._holders.discard(h)
            self._publish()
        self._unregister_live(gone)
        for keep in keeps:
            keep.release()

    def forget_device(self, device: int) -> None:
        """The device's primary context is being reset: its registrations die with it."""
        with self._lock:
            for r in list(self._ranges.values()):
                holders = (*r.auto, *r.explicit)
                if holders and all(x.device == device for x in holders):
                    del self._ranges[r.start]
            self._publish()

    # -------------------------------------------------------------- settings and telemetry
    def set_budget(self, nbytes: int) -> None:
        with self._lock:
            self._budget = nbytes

    def stats(self) -> dict:
        with self._lock:
            return {
                **self._counts,
                "fallback_reasons": dict(self._reasons),
                "registered_ranges": len(self._ranges),
                "registered_bytes": sum(r.nbytes for r in list(self._ranges.values())),
                "registering": len(self._pending),
                "budget_bytes": self._budget,
                "register_gbps": self._register_gbps,
            }

    # -------------------------------------------------------------- under the lock
    def _containing(self, start: int, end: int) -> _Range | None:
        for r in list(self._ranges.values()):
            if r.start <= start and end <= r.end:
                return r
        return None

    def _overlaps(self, start: int, end: int) -> bool:
        spans: list[_Range | _Pending] = [*self._ranges.values(), *self._pending.values()]
        return any(r.start < end and start < r.end for r in spans)

    def _held_bytes(self) -> int:
        spans: list[_Range | _Pending] = [*self._ranges.values(), *self._pending.values()]
        return sum(r.end - r.start for r in spans)

    def _publish(self) -> None:
        """Tell the dispatch path which ranges only the automatic policy holds: an async dispatch
        copies those before it returns, as it would pageable memory (``_windows.auto_registered``)."""
        spans = [(r.start, r.end) for r in list(self._ranges.values()) if r.auto and not r.explicit]
        # (a registration in flight too: the driver may call it page-locked before it is in the table)
        spans.extend((p.start, p.end) for p in list(self._pending.values()))
        set_auto_registered(spans)

    def _detach(self, r: _Range) -> int | None:
        """Take ``r`` out of the table, to be unregistered outside the lock (_unregister_live);
        until then it is found among the leaving ranges, so its owner's death still unregisters
        it before numpy frees the memory, and a new hold takes it back (_revive). Returns the
        leave's number (None: not in the table)."""
        if self._ranges.pop(r.start, None) is not r:
            return None
        self._leaving[r.start] = r
        with r.leave_mu:
            r.leaves += 1
            return r.leaves

    def _revive(self, start: int, end: int, owner) -> _Range | None:
        """A leaving range that holds [start, end) of the same owner, back in the table before its
        unregister (the release that took it out then leaves it registered); None when there is
        none, or its unregister has run (waited for, if it is running: a driver call)."""
        for r in list(self._leaving.values()):
            if r.start <= start and end <= r.end and (r.owner is None or r.owner() is owner):
                with r.leave_mu:
                    if r.unregistered:
                        return None
                    r.leaves += 1
                del self._leaving[r.start]
                self._ranges[r.start] = r
                return r
        return None

    def _refuse(self, reason: str) -> None:
        self._counts["fallbacks"] += 1
        self._reasons[reason] = self._reasons.get(reason, 0) + 1

    def _acquire(self, h: Holder, obj, address: int, nbytes: int, *, auto: bool) -> _Range | None:
        start, end = page_span(address, nbytes)
        owner = owning_array(obj)
        r = self._containing(start, end)
        if r is not None and (r.owner is None or r.owner() is owner):
            self._counts["hits"] += 1
            return r
        if r is None:
            r = self._revive(start, end, owner)  # (being unregistered: taken back instead)
            if r is not None:
                self._counts["hits"] += 1
                return r
        if not self._admit(start, end, address, nbytes, owner, auto=auto):
            return None
        t0 = time.perf_counter_ns()
        status = _driver.host_register(h.ctx, start, end - start)
        if status != 0:
            self._refused_by_driver(status, start, end - start)
            return None
        self._measured(end - start, time.perf_counter_ns() - t0)
        return self._install(start, end, h.ctx, None if owner is None else self._owner_ref(owner, start))

    def _admit(self, start: int, end: int, address: int, nbytes: int, owner, *, auto: bool) -> bool:
        """Whether [start, end) may be registered now (a refusal is counted; memory page-locked
        already is refused uncounted: it moves directly as it is)."""
        if self._overlaps(start, end):
            self._refuse("overlaps a registered range")
            return False
        if is_page_locked_address(address, nbytes):
            return False  # page-locked already (pinned_empty, or registered by the caller): direct
        if self._held_bytes() + (end - start) > self._budget:
            self._refuse("budget")
            return False
        if auto and owner is None:
            self._refuse("not owned by numpy")
            return False
        return True

    def _refused_by_driver(self, status: int, start: int, nbytes: int) -> None:
        reason = "already registered" if status == _ALREADY_REGISTERED else _driver.status_name(status)
        self._refuse(reason)
        log.info("vyre_cuda: registering %d bytes at 0x%x was refused (%s): staged instead", nbytes, start, reason)

    def _measured(self, nbytes: int, ns: int) -> None:
        gbps = nbytes / max(ns, 1)
        self._register_gbps = gbps if self._register_gbps is None else 0.75 * self._register_gbps + 0.25 * gbps

    def _owner_ref(self, owner: np.ndarray, start: int) -> weakref.ref:
        def died(dead: weakref.ref, s: int = start) -> None:
            self._owner_died(s, dead)

        return weakref.ref(owner, died)

    def _install(self, start: int, end: int, ctx: int, ref) -> _Range:
        r = _Range(start, end, ctx, ref)
        self._ranges[start] = r
        self._counts["registrations"] += 1
        return r

    # -------------------------------------------------------------- registering on the worker
    def _submit(self, h: Holder, owner: np.ndarray, address: int, nbytes: int) -> None:
        """Hand the policy's registration of ``owner``'s span to the worker thread (under the lock).
        A range being unregistered is taken back instead, with no driver call."""
        start, end = page_span(address, nbytes)
        r = self._revive(start, end, owner)
        if r is not None:
            r.auto[h] = 1
            self._counts["hits"] += 1
            self._publish()
            return
        if not self._admit(start, end, address, nbytes, owner, auto=True):
            return
        p = _Pending(start, end, h)
        p.ref = self._owner_ref(owner, start)
        self._pending[start] = p
        self._publish()
        self._jobs.append(p)
        if not self._working:
            self._working = True
            threading.Thread(target=self._work, name="vyre_cuda-host-register", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._working = False
                    return
                p = self._jobs.popleft()
            try:
                self._register_pending(p)
            except BaseException:  # (a bug: logged, and its waiters are not left waiting)
                log.exception("vyre_cuda: registering 0x%x failed", p.start)
            finally:
                p.done.set()

    def _register_pending(self, p: _Pending) -> None:
        """The worker's part: the driver's register call outside the registry's lock (dispatches
        go on staging meanwhile), then the range goes in the table unless its owner has died."""
        nbytes = p.end - p.start
        t0 = time.perf_counter_ns()
        with p.mu:
            # nothing in here allocates a container, so no collection can run an owner's weakref
            # callback on this thread while it holds p.mu (that callback waits for p.mu)
            status = -1 if p.dead else _driver.host_register(p.holder.ctx, p.start, nbytes)
            if status == 0:
                p.registered = True
        ns = time.perf_counter_ns() - t0
        with self._lock:
            if self._pending.get(p.start) is p:
                del self._pending[p.start]
            if not p.dead:  # (else its owner's death unregisters it, or has: see _owner_died)
                if status == 0:
                    self._measured(nbytes, ns)
                    self._install(p.start, p.end, p.holder.ctx, p.ref).auto[p.holder] = 1
                elif status > 0:
                    self._refused_by_driver(status, p.start, nbytes)
            self._publish()

    def _settle(self, which) -> None:
        """Wait (outside the lock) until the worker is done with the registrations ``which`` picks."""
        with self._lock:
            waits = [p for p in self._pending.values() if which(p)]
        for p in waits:
            p.done.wait()

    # -------------------------------------------------------------- unregistering
    def _owner_died(self, start: int, ref) -> None:
        """The owning array is being freed (numpy clears weakrefs before it frees the data): no
        dispatch can still use its memory, so it is unregistered at once, with no wait; also when
        a release took the range out of the table and waits for the direct gate (it must not
        return before the unregister: numpy unmaps the memory next, and a range the driver still
        counts as registered would catch the next allocation at that address)."""
        p = None
        with self._lock:
            r = self._ranges.get(start)
            if r is not None and r.owner is ref:
                del self._ranges[start]
                self._publish()
            else:
                r = self._leaving.get(start)
                if r is None or r.owner is not ref:
                    r = None
                    p = self._pending.get(start)
                    if p is None or p.ref is not ref:
                        return
                    p.dead = True  # the worker puts nothing in the table now
                    del self._pending[start]
                    self._publish()
        if p is None:
            if r is not None:
                self._unregister(r)
            return
        with p.mu:  # the worker's register call, if running, returns first
            if not p.registered:
                return
            status = _driver.host_unregister(p.holder.ctx, p.start)
            p.registered = False
        if status:
            log.warning("vyre_cuda: cuMemHostUnregister of 0x%x failed: %s", p.start, _driver.status_name(status))
        with self._lock:
            self._counts["registrations"] += 1
            self._counts["unregistrations"] += 1

    def _unregister_live(self, ranges: list[tuple[_Range, int]]) -> None:
        """Unregister ranges whose memory lives on (already out of the table), outside the lock:
        close the direct gate (``_windows``), so no dispatch marks or enqueues a direct copy from
        here on and every one that did has enqueued it; then wait for the GPU work of every backend
        with work in flight (any of them may DMA from these pages); then unregister. The driver's
        unregister does not wait for DMA in flight on the range: a copy still running faults the
        context. Not under the registry's lock: a dispatch holding the gate may need it (its
        policy's hook, a weakref callback of a collection) before it lets go."""
        if not ranges:
            return
        if not close_direct_gate():
            # a collection inside this thread's own dispatch: left for the next unregister to take
            with self._lock:
                for r, leave in ranges:
                    if self._leaving.get(r.start) is r and not r.unregistered and r.leaves == leave:
                        del self._leaving[r.start]
                        self._ranges.setdefault(r.start, r)
                self._publish()
            return
        try:
            with self._lock:
                holders = list(self._holders)
            try:
                for h in holders:
                    if h.busy():
                        _driver.make_current(h.ctx)
                        _driver.context_synchronize()
            except BackendError as exc:
                # unregistered under a DMA, the buffer could be read wrong: left registered instead
                # (among the leaving ranges: its owner's death still unregisters it)
                log.warning("vyre_cuda: %d registered range(s) kept registered: %s", len(ranges), exc.message)
                return
            for r, leave in ranges:
                self._unregister(r, leave)
        finally:
            open_direct_gate()

    def _unregister(self, r: _Range, leave: int | None = None) -> None:
        """Unregister ``r`` once, whoever asks first; a second caller returns after the first's
        driver call. Its own lock, never the registry's, is held across that call: an owner's
        weakref callback may run on a thread that holds the registry's lock, and waits here.
        ``leave``: the release's leave (a range taken back since stays registered); None for an
        owner's death, which unregisters whatever else holds it."""
        with r.leave_mu:
            if r.unregistered or (leave is not None and r.leaves != leave):
                return
            status = _driver.host_unregister(r.any_ctx(), r.start)
            r.unregistered = True
        if status:
            log.warning("vyre_cuda: cuMemHostUnregister of 0x%x failed: %s", r.start, _driver.status_name(status))
        with self._lock:
            if self._leaving.get(r.start) is r:
                del self._leaving[r.start]
            self._counts["unregistrations"] += 1


REGISTRY = HostRegistry()


def policy_of(value) -> AutoRegister | None:
    """``CudaBackend(auto_register=value)``'s policy (None: off)."""
    if value is False or value is None:
        return None
    if value is True:
        return AutoRegister()
    if isinstance(value, AutoRegister):
        return value
    raise ValidationError(
        f"auto_register={value!r} is not a bool or an AutoRegister",
        "pass auto_register=True, or vc.AutoRegister(min_bytes=...) to tune the policy",
    )


def core_hook(holder: Holder, policy: AutoRegister):
    """The core's view of a backend's policy: called with each host buffer of a dispatch that
    crosses the staging ring (address and size None for an output), before the dispatch asks
    whether it is page-locked."""
    min_bytes = policy.min_bytes

    def sighted(obj, address, nbytes):
        if address is None:
            if not isinstance(obj, np.ndarray) or obj.nbytes < min_bytes:
                return
            address, nbytes = obj.__array_interface__["data"][0], obj.nbytes
        elif nbytes < min_bytes:
            return
        REGISTRY.sighted(holder, policy, obj, address, nbytes)

    return sighted


def registered_stats() -> dict:
    """What the registry of caller memory registered in place holds and has done.

    Keys: ``registrations``, ``unregistrations``, ``hits`` (a dispatch or ``register()`` found its
    buffer registered), ``fallbacks`` (a buffer left to staging) and ``fallback_reasons`` (by
    reason: ``budget``, ``overlaps a registered range``, ``not owned by numpy``, ``already
    registered``, or the driver's status), ``registered_ranges``, ``registered_bytes``,
    ``registering`` (registrations running on the worker thread now), ``budget_bytes``, and
    ``register_gbps`` (the register rate measured here, None before the first)."""
    return REGISTRY.stats()


def set_registered_budget(nbytes: int) -> None:
    """Bound the bytes vyre_cuda keeps registered in place (default: a quarter of the host's
    memory). Registrations beyond it fall back to staging; ranges already registered stay."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValidationError(
            f"set_registered_budget({nbytes!r}) needs a byte count of 0 or more",
            "pass 0 to register nothing, or a byte count such as 8 << 30",
        )
    REGISTRY.set_budget(nbytes)
