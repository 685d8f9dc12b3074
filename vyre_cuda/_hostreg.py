"""Caller host memory registered in place (``cuMemHostRegister``), paid once, under one owner.

A registered buffer moves by direct DMA with no staging copy (the dispatch path asks
``_windows.page_locked``). One process-wide :class:`HostRegistry` owns every range vyre_cuda
registered:

- a range is a buffer's page-aligned span, registered PORTABLE, and refcounted per holder (a
  backend's explicit ``register()`` block, or its automatic policy);
- ranges are disjoint: a buffer inside one is a hit, one overlapping one in part is staged;
- an explicit hold keeps a buffer export of the array (not freed or resized meanwhile); an
  automatic one keeps only a weakref on the owning numpy array, whose callback unregisters before
  numpy frees the data (numpy clears weakrefs first and refuses to resize a weakly referenced
  array). Memory numpy does not own is registered only explicitly;
- a range is unregistered when its last hold goes, with the direct gate closed (``_windows``) and
  after the GPU work of every busy backend has finished (any may DMA from it), or at once when its
  owner dies (a dispatch holds its buffers' exports until done);
- a refusal (budget, overlap, the driver's limits) falls back to staging, counted by reason in
  :func:`registered_stats`.

The lock is held across the driver's register call (ms per hundred MiB): a registration is paid
once per buffer, and every decision about a range stays in one place.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import threading
import time
import weakref
from typing import Any

import numpy as np

from . import _driver
from ._windows import close_direct_gate, is_page_locked_address, open_direct_gate, set_auto_registered
from .config import AutoRegister
from .errors import BackendError, ValidationError

log = logging.getLogger("vyre_cuda")

PAGE = mmap.PAGESIZE
_ALREADY_REGISTERED = 712  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
_SIGHTINGS_MAX = 256  # buffers the automatic policy remembers between registrations


def default_budget() -> int:
    """A quarter of physical memory: registered pages can no longer be swapped out."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError, AttributeError):
        return 8 << 30


class Holder:
    """One backend as the registry sees it: its device, and whether it has GPU work in flight."""

    __slots__ = ("device", "busy", "__weakref__")

    def __init__(self, device: int, busy):
        self.device = device
        self.busy = busy  # () -> bool


class _Range:
    __slots__ = ("start", "end", "device", "auto", "explicit", "owner", "leave_mu", "unregistered", "leaves")

    def __init__(self, start, end, device, owner):
        self.start = start
        self.end = end
        self.device = device  # registered through (portable: any holder's device will do)
        self.auto: dict[Holder, int] = {}  # holder -> 1 (a policy holds a range once)
        self.explicit: dict[Holder, list[memoryview]] = {}  # holder -> one export per open block
        self.owner = owner  # weakref on the owning numpy array, or None
        # one unregister per range, by the last hold's release or the owner's death, whichever
        # comes first (never under the registry's lock: see _unregister)
        self.leave_mu = threading.Lock()
        self.unregistered = False
        # bumped (under leave_mu) at each leave from the table and each revival before its
        # unregister: a release unregisters only the leave it saw
        self.leaves = 0

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    def held(self) -> bool:
        return bool(self.auto or self.explicit)

    def any_device(self) -> int:
        for h in (*self.explicit, *self.auto):
            return h.device
        return self.device


class _Pending:
    """A policy's registration handed to the worker thread, not yet in the table."""

    __slots__ = ("start", "end", "holder", "ref", "mu", "dead", "registered", "done")

    def __init__(self, start, end, holder):
        self.start = start
        self.end = end
        self.holder = holder
        self.ref = None  # weakref on the owning numpy array (callback: _owner_died)
        # held by the worker across the driver's call, and by an owner's death waiting for it
        # (never with the registry's lock taken inside)
        self.mu = threading.Lock()
        self.dead = False  # the owner died (set under the registry's lock): nothing goes in the table
        self.registered = False  # the driver's call succeeded and no unregister has run since
        self.done = threading.Event()  # the worker is finished with it


def page_span(address: int, nbytes: int) -> tuple[int, int]:
    start = address & ~(PAGE - 1)
    return start, (address + nbytes + PAGE - 1) & ~(PAGE - 1)


def owning_array(obj: Any) -> np.ndarray | None:
    """The numpy array owning ``obj``'s memory (its ``.base`` chain's root), or None when numpy
    does not own it (a view of a bytearray, an mmap, foreign memory)."""
    root = obj
    while isinstance(root, np.ndarray) and not root.flags.owndata:
        root = root.base
    if isinstance(root, np.ndarray) and root.flags.owndata:
        return root
    return None


class HostRegistry:
    """The process-wide owner of registered ranges (one lock for all of its state)."""

    def __init__(self):
        # reentrant: an owner's weakref callback may run on a thread holding the lock (a collection
        # triggered by an allocation under it) and must unregister before numpy frees the memory;
        # so every walk over the ranges is over a snapshot
        self._lock = threading.RLock()
        self._ranges: dict[int, _Range] = {}  # start -> range; disjoint
        # start -> range out of the table, not unregistered yet (a release waits for the gate
        # outside the lock meanwhile, and the owner may die then: _owner_died)
        self._leaving: dict[int, _Range] = {}
        self._pending: dict[int, _Pending] = {}  # start -> registration on the worker
        # the worker's queue; its thread runs while there are jobs (none outlives them)
        self._jobs: collections.deque[_Pending] = collections.deque()
        self._working = False
        self._sightings: dict[tuple[int, int], list] = {}  # span -> [weakref owner, count]
        self._holders: weakref.WeakSet[Holder] = weakref.WeakSet()
        self._budget = default_budget()
        self._register_gbps: float | None = None
        self._counts = dict.fromkeys(
            ("registrations", "unregistrations", "failed_unregistrations", "hits", "fallbacks"), 0
        )
        self._reasons: dict[str, int] = {}

    def holder(self, device: int, busy) -> Holder:
        h = Holder(device, busy)
        with self._lock:
            self._holders.add(h)
        return h

    # -------------------------------------------------------------- explicit holds
    def hold(self, h: Holder, obj: Any, address: int, nbytes: int) -> bool:
        """An explicit hold on ``obj``'s span, registered now if need be. False: it stays pageable
        (a counted refusal) or is page-locked memory vyre_cuda does not own."""
        keep = memoryview(obj)  # the memory stays put while the block lasts
        start, end = page_span(address, nbytes)
        self._settle(lambda p: p.start < end and start < p.end)  # (a policy's registration: found below)
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
        """A dispatch of the policy's backend uses ``obj`` (before it asks whether it is
        page-locked): hold its range, or count the sighting and register it at the ``after``-th."""
        start, end = page_span(address, nbytes)
        with self._lock:
            owner = owning_array(obj)
            r = self._containing(start, end)
            if r is not None:
                # (the policy never holds memory numpy does not own: it could outlive that memory)
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
        """Drop ``h``'s automatic holds (trim), and its explicit ones too (close: a block still
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

    def _spans(self) -> list[_Range | _Pending]:
        # (a leaving range is still registered with the driver until its unregister has run: a
        # span overlapping it waits, as one overlapping a range in the table does)
        return [*self._ranges.values(), *self._pending.values(), *self._leaving.values()]

    def _publish(self) -> None:
        """Tell the dispatch path which ranges only the policy holds (``_windows.auto_registered``):
        an async dispatch copies those before it returns, as it would pageable memory."""
        spans = [(r.start, r.end) for r in list(self._ranges.values()) if r.auto and not r.explicit]
        # (one in flight too: the driver may call it page-locked before it is in the table)
        spans.extend((p.start, p.end) for p in list(self._pending.values()))
        set_auto_registered(spans)

    def _detach(self, r: _Range) -> int | None:
        """Take ``r`` out of the table, to be unregistered outside the lock (_unregister_live);
        meanwhile it is among the leaving ranges, so its owner's death still unregisters it first
        and a new hold takes it back (_revive). Returns the leave's number (None: not in the table)."""
        if self._ranges.pop(r.start, None) is not r:
            return None
        self._leaving[r.start] = r
        with r.leave_mu:
            r.leaves += 1
            return r.leaves

    def _revive(self, start: int, end: int, owner) -> _Range | None:
        """A leaving range holding [start, end) of the same owner, back in the table before its
        unregister; None when there is none or its unregister has run (waited for if running)."""
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
        status = _driver.host_register(h.device, start, end - start)
        log.debug("vyre_cuda: register 0x%x +%d (inline): status %d", start, end - start, status)  # (all logged)
        if status != 0:
            self._refused_by_driver(status, start, end - start)
            return None
        self._measured(end - start, time.perf_counter_ns() - t0)
        return self._install(start, end, h.device, None if owner is None else self._owner_ref(owner, start))

    def _admit(self, start: int, end: int, address: int, nbytes: int, owner, *, auto: bool) -> bool:
        """Whether [start, end) may be registered now (refusals counted; page-locked memory is
        refused uncounted: it moves directly as it is)."""
        if any(r.start < end and start < r.end for r in self._spans()):
            self._refuse("overlaps a registered range")
            return False
        if is_page_locked_address(address, nbytes):
            return False
        if sum(r.end - r.start for r in self._spans()) + (end - start) > self._budget:
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

    def _install(self, start: int, end: int, device: int, ref) -> _Range:
        r = _Range(start, end, device, ref)
        self._ranges[start] = r
        self._counts["registrations"] += 1
        return r

    # -------------------------------------------------------------- registering on the worker
    def _submit(self, h: Holder, owner: np.ndarray, address: int, nbytes: int) -> None:
        """Hand the policy's registration to the worker (under the lock); a leaving range is
        taken back instead, with no driver call."""
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
        """The driver's call outside the registry's lock (dispatches stage meanwhile), then into
        the table unless the owner has died."""
        nbytes = p.end - p.start
        t0 = time.perf_counter_ns()
        with p.mu:
            # nothing in here allocates a container, so no collection can run an owner's weakref
            # callback on this thread while it holds p.mu (that callback waits for p.mu)
            status = -1 if p.dead else _driver.host_register(p.holder.device, p.start, nbytes)
            if status == 0:
                p.registered = True
        ns = time.perf_counter_ns() - t0
        log.debug("vyre_cuda: register 0x%x +%d (worker): status %d", p.start, nbytes, status)  # (after p.mu)
        with self._lock:
            if self._pending.get(p.start) is p:
                del self._pending[p.start]
            if not p.dead:  # (else its owner's death unregisters it, or has)
                if status == 0:
                    self._measured(nbytes, ns)
                    self._install(p.start, p.end, p.holder.device, p.ref).auto[p.holder] = 1
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
        """The owning array is being freed (weakrefs are cleared before the data): no dispatch can
        still use its memory, so it is unregistered at once, also when a release took the range
        out and waits for the gate (numpy unmaps the memory next, and a range the driver still
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
            status = _driver.host_unregister(p.holder.device, p.start)
            p.registered = False
        log.debug("vyre_cuda: unregister 0x%x (owner died while registering): status %d", p.start, status)
        if status:
            log.warning("vyre_cuda: cuMemHostUnregister of 0x%x failed: %s", p.start, _driver.status_name(status))
        with self._lock:
            self._counts["registrations"] += 1
            self._counts["unregistrations"] += 1
            self._counts["failed_unregistrations"] += bool(status)

    def _unregister_live(self, ranges: list[tuple[_Range, int]]) -> None:
        """Unregister ranges whose memory lives on (out of the table already): close the direct
        gate, so every dispatch that marked a direct copy has enqueued it and none marks another;
        wait for every busy backend's GPU work (the driver's unregister does not wait for DMA on
        the range: a copy still running faults the context); then unregister. Not under the
        registry's lock: a dispatch holding the gate may need it before it lets go."""
        if not ranges:
            return
        if not close_direct_gate():
            # a collection inside this thread's own dispatch: left for the next unregister
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
                # per device, in its primary context retained for the call: a backend may
                # close meanwhile and its last release end the context
                for device in sorted({h.device for h in holders if h.busy()}):
                    _driver.device_synchronize(device)
            except BackendError as exc:
                # unregistered under a DMA, the buffer could be read wrong: kept registered
                # (among the leaving ranges, so its owner's death still unregisters it)
                log.warning("vyre_cuda: %d registered range(s) kept registered: %s", len(ranges), exc.message)
                return
            for r, leave in ranges:
                self._unregister(r, leave)
        finally:
            open_direct_gate()

    def _unregister(self, r: _Range, leave: int | None = None) -> None:
        """Unregister ``r`` once; a second caller returns after the first's driver call. Only
        ``r.leave_mu`` is held across it: an owner's weakref callback may run on a thread holding
        the registry's lock and wait here. ``leave``: the release's leave (a range revived since
        stays); None for an owner's death."""
        with r.leave_mu:
            if r.unregistered or (leave is not None and r.leaves != leave):
                return
            status = _driver.host_unregister(r.any_device(), r.start)
            r.unregistered = True
        log.debug(
            "vyre_cuda: unregister 0x%x (%s): status %d", r.start, "owner died" if leave is None else "released", status
        )
        if status:
            log.warning("vyre_cuda: cuMemHostUnregister of 0x%x failed: %s", r.start, _driver.status_name(status))
        with self._lock:
            if self._leaving.get(r.start) is r:
                del self._leaving[r.start]
            self._counts["unregistrations"] += 1
            self._counts["failed_unregistrations"] += bool(status)


REGISTRY = HostRegistry()


def core_hook(holder: Holder, policy: AutoRegister):
    """The core's hook for a backend's policy: called with each host buffer of a dispatch that
    crosses the staging ring (address and size None for an output), before the page-locked test."""
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

    Keys: ``registrations``, ``unregistrations``, ``failed_unregistrations`` (the driver refused
    an unregister: that memory may stay page-locked under its address), ``hits`` (a dispatch or
    ``register()`` found its buffer registered), ``fallbacks`` (a buffer left to staging) and
    ``fallback_reasons`` (by reason: ``budget``, ``overlaps a registered range``, ``not owned by
    numpy``, ``already registered``, or the driver's status), ``registered_ranges``, ``registered_bytes``,
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
