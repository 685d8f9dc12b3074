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

    A host buffer of at least ``min_bytes`` that a dispatch sees again (the same page span and the
    same owning numpy array) is registered once ``sightings x saving >= cost``: the staging time the
    dispatches so far would have saved has paid for registering and unregistering it. The register
    rate is measured on this host (vyre_cuda's own calls, averaged); the rest starts from figures
    measured on an H200 host and can be set here.

    Attributes
    ----------
    min_bytes : int
        Smaller buffers are left to the staging ring, where a copy costs less than a register call.
    saving_gbps : float
        Bytes per second of staging time a registered buffer saves per dispatch (the staged route
        overlaps its host copies with the DMA, so this is far above the copy rate).
    unregister_gbps : float
        The unregister rate, counted in the cost.
    register_gbps : float
        The register rate assumed until one has been measured here.
    """

    min_bytes: int = 4 << 20
    saving_gbps: float = 420.0
    unregister_gbps: float = 37.0
    register_gbps: float = 22.0

    def __post_init__(self):
        if not isinstance(self.min_bytes, int) or self.min_bytes < PAGE:
            raise ValidationError(
                f"AutoRegister(min_bytes={self.min_bytes!r}) is below one page ({PAGE} bytes)",
                "pass min_bytes=4 << 20 (the default) or another byte count of at least a page",
            )
        for name in ("saving_gbps", "unregister_gbps", "register_gbps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValidationError(
                    f"AutoRegister({name}={value!r}) must be a positive rate in GB/s",
                    f"pass {name}={getattr(AutoRegister, name)} (the default) or another positive number",
                )

    def pays(self, sightings: int, nbytes: int, register_gbps: float | None) -> bool:
        """Whether ``sightings`` dispatches of ``nbytes`` have saved what registering costs."""
        reg = register_gbps or self.register_gbps
        cost = nbytes / (reg * 1e9) + nbytes / (self.unregister_gbps * 1e9)
        return sightings * nbytes / (self.saving_gbps * 1e9) >= cost


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
        and register once it pays. Called before the dispatch asks whether it is page-locked."""
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
            if not policy.pays(seen[1], end - start, self._register_gbps):
                return
            del self._sightings[(start, end)]
            r = self._acquire(h, obj, address, nbytes, auto=True)
            if r is not None:
                r.auto[h] = 1
                self._publish()

    # -------------------------------------------------------------- a backend's trim and close
    def release(self, h: Holder, *, explicit: bool) -> None:
        """Drop ``h``'s automatic holds (trim), and its explicit ones too (close; a block still
        open then ends with no effect)."""
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
        return any(r.start < end and start < r.end for r in list(self._ranges.values()))

    def _publish(self) -> None:
        """Tell the dispatch path which ranges only the automatic policy holds: an async dispatch
        copies those before it returns, as it would pageable memory (``_windows.auto_registered``)."""
        set_auto_registered([(r.start, r.end) for r in list(self._ranges.values()) if r.auto and not r.explicit])

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
        if r is not None or self._overlaps(start, end):
            self._refuse("overlaps a registered range")
            return None
        if is_page_locked_address(address, nbytes):
            return None  # page-locked already (pinned_empty, or registered by the caller): direct
        if sum(x.nbytes for x in list(self._ranges.values())) + (end - start) > self._budget:
            self._refuse("budget")
            return None
        if auto and owner is None:
            self._refuse("not owned by numpy")
            return None
        t0 = time.perf_counter_ns()
        status = _driver.host_register(h.ctx, start, end - start)
        if status != 0:
            reason = "already registered" if status == _ALREADY_REGISTERED else _driver.status_name(status)
            self._refuse(reason)
            log.info(
                "vyre_cuda: registering %d bytes at 0x%x was refused (%s): staged instead", end - start, start, reason
            )
            return None
        gbps = (end - start) / max(time.perf_counter_ns() - t0, 1)
        self._register_gbps = gbps if self._register_gbps is None else 0.75 * self._register_gbps + 0.25 * gbps
        ref = None
        if owner is not None:

            def died(dead: weakref.ref, s: int = start) -> None:
                self._owner_died(s, dead)

            ref = weakref.ref(owner, died)
        r = _Range(start, end, h.ctx, ref)
        self._ranges[start] = r
        self._counts["registrations"] += 1
        return r

    # -------------------------------------------------------------- unregistering
    def _owner_died(self, start: int, ref) -> None:
        """The owning array is being freed (numpy clears weakrefs before it frees the data): no
        dispatch can still use its memory, so it is unregistered at once, with no wait; also when
        a release took the range out of the table and waits for the direct gate (it must not
        return before the unregister: numpy unmaps the memory next, and a range the driver still
        counts as registered would catch the next allocation at that address)."""
        with self._lock:
            r = self._ranges.get(start)
            if r is not None and r.owner is ref:
                del self._ranges[start]
                self._publish()
            else:
                r = self._leaving.get(start)
                if r is None or r.owner is not ref:
                    return
        self._unregister(r)

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
    ``budget_bytes``, and ``register_gbps`` (the register rate measured here, None before the
    first)."""
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
