"""The work of a DeviceGroup: its queue and per-device threads (one lock, in :class:`_State`), job
records, handles and telemetry; an item's error is annotated with its device and item here."""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ._validate import is_int
from .errors import BackendError, DeviceLost, DispatchFailed, ValidationError

log = logging.getLogger("vyre_cuda")

__all__ = ["MapHandle", "GroupTelemetry"]


def _on_device(exc: BaseException, ordinal: int, index: int | None = None) -> BaseException:
    """``exc`` of device ``ordinal`` (item ``index``): same type, ``.device``, ``.item``, the place
    in the message."""
    where = f"device {ordinal}" if index is None else f"device {ordinal}, item {index}"
    if isinstance(exc, BackendError):
        cls = type(exc)
        err = cls.__new__(cls)
        message = f"{where}: {exc.message}"
        BackendError.__init__(err, message, exc.fix)
        err.__dict__.update(exc.__dict__)
        err.message = message
        err.device = ordinal
        err.item = index
        err.__cause__ = exc
        return err
    # not a vyre_cuda error (a bug in a custom backend, MemoryError, ...): annotate it in place
    try:
        setattr(exc, "device", ordinal)  # noqa: B010 (any exception type: no declared attribute)
        setattr(exc, "item", index)  # noqa: B010
    except AttributeError:
        pass
    if hasattr(exc, "add_note"):
        exc.add_note(f"raised on {where}")
    return exc


class _Cancelled(ValidationError):
    """An item skipped because its submission was cancelled (or an earlier item failed)."""


def _all_lost(lost: dict) -> DeviceLost:
    listing = (
        ", ".join(f"device {d} ({getattr(e, 'status', '') or type(e).__name__})" for d, e in sorted(lost.items()))
        or "none reported"
    )
    return DeviceLost(
        f"every device of the group is lost: {listing}; no device is left to run the item",
        "close the group and run the work in a new process (a kernel fault keeps a device "
        "unusable for the life of the process); fix the kernel that faulted first",
        status="group_lost",
        call="DeviceGroup",
    )


class _Job:
    """The items of one submission: their results, errors and completion."""

    def __init__(self, program, config, results, fail_fast: bool, streaming: bool = False):
        self.program = program
        self.config = config
        self.results = results  # a list (map) or a dict (streaming): index -> outputs
        self.errors: dict = {}
        self.unfinished = 0
        self.cond = threading.Condition(threading.Lock())
        self.cancelled = False
        self.fail_fast = fail_fast
        self.streaming = streaming
        self.completed: collections.deque[int] = collections.deque()  # completion order (streaming only)
        self.first_failure: int | None = None  # lowest index whose item failed (cancellations excluded)

    def finish(self, index: int, outputs, error) -> None:
        with self.cond:
            if error is None:
                self.results[index] = outputs
            else:
                self.errors[index] = error
                if not isinstance(error, _Cancelled):
                    if self.first_failure is None or index < self.first_failure:
                        self.first_failure = index
                    if self.fail_fast:
                        self.cancelled = True
            self.unfinished -= 1
            if self.streaming:
                self.completed.append(index)
                self.cond.notify_all()
            elif self.unfinished == 0:
                self.cond.notify_all()

    def wait(self, timeout=None) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.unfinished == 0, timeout)


@dataclass(slots=True)
class _ThreadStats:
    items: int = 0
    failed: int = 0
    busy_ns: int = 0


@dataclass(slots=True, eq=False)
class _Device:
    ordinal: int
    backend: Any = None
    telemetry: Any = None
    stats: list = field(default_factory=list)  # one _ThreadStats per thread: no shared counter to race on
    lost: BaseException | None = None  # the error that retired the device
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None  # why its backend could not be created


class _State:
    """What the threads share; no reference to the DeviceGroup, so a group dropped unclosed is
    still collected (its finalizer shuts the threads down)."""

    def __init__(self, devices):
        self.devices = devices
        self.queue: collections.deque[tuple] = collections.deque()  # (job, index, inputs, outputs or None)
        self.work = threading.Condition(threading.Lock())
        self.closing = False
        self.live_threads = 0
        self.threads: list = []
        self.lost: dict = {}  # ordinal -> the error that lost it

    def submit(self, job: _Job, items: list) -> None:
        """Queue ``job``'s ``items`` ((job, index, inputs, outputs or None)), counted as unfinished."""
        with job.cond:
            job.unfinished += len(items)
        try:
            with self.work:
                if self.closing:
                    raise ValidationError(
                        "this DeviceGroup is closed",
                        "create a new DeviceGroup (or submit work inside its `with` block)",
                    )
                if self.live_threads == 0:
                    raise _all_lost(self.lost)
                self.queue.extend(items)
                self.work.notify(len(items))
        except BaseException:
            with job.cond:
                job.unfinished -= len(items)
            raise

    def retire(self) -> None:
        """A thread stops (``work`` held): the last one fails whatever is still queued."""
        self.live_threads -= 1
        if self.live_threads == 0:
            while self.queue:
                job, index, _, _ = self.queue.popleft()
                job.finish(index, None, _all_lost(self.lost))
        elif self.queue:
            self.work.notify()  # hand on a wake-up this thread may have consumed

    def shutdown(self) -> None:
        with self.work:
            self.closing = True
            self.work.notify_all()
        current = threading.current_thread()
        for t in self.threads:
            if t is not current:
                t.join()
        for dev in self.devices:
            backend, dev.backend = dev.backend, None
            if backend is not None:
                try:
                    backend.close()
                except Exception as exc:  # noqa: BLE001 (closing must reach every backend)
                    log.warning("DeviceGroup.close: device %s: %s", dev.ordinal, exc)


def _worker(state: _State, dev: _Device, stats: _ThreadStats, factory) -> None:
    if factory is not None:  # the device's first thread creates its backend
        try:
            dev.backend = factory(dev.ordinal)
            dev.telemetry = getattr(dev.backend, "telemetry", None)
        except BaseException as exc:  # noqa: BLE001 (the constructor reports it)
            dev.error = exc
        dev.ready.set()
    dev.ready.wait()
    if dev.error is not None:
        with state.work:
            state.retire()
        return
    backend = dev.backend
    queue = state.queue
    work = state.work
    clock = time.perf_counter_ns
    while True:
        with work:
            while not queue and not state.closing and dev.lost is None:
                work.wait()
            if not queue or dev.lost is not None:
                # closing with nothing left, or a sibling thread lost this device: leave the
                # queued items to the other devices
                state.retire()
                return
            job, index, inputs, outputs = queue.popleft()
        if job.cancelled:
            cancelled = _Cancelled(
                f"item {index} was cancelled before it ran (an earlier item failed, or cancel() was called)",
                "look at the error of the item that failed; submit the cancelled items again if needed",
            )
            job.finish(index, None, cancelled)
            continue
        t0 = clock()
        try:
            if outputs is None:
                result = backend.dispatch(job.program, inputs, job.config)
            else:
                result = backend.dispatch_into(job.program, inputs, outputs, job.config)
        except BaseException as exc:  # noqa: BLE001 (every error belongs to its item)
            stats.busy_ns += clock() - t0
            stats.failed += 1
            lost = isinstance(exc, DeviceLost) or getattr(backend, "lost", False) is True
            if lost:
                with work:
                    if dev.lost is None:
                        dev.lost = exc
                        state.lost[dev.ordinal] = exc
                        work.notify_all()  # idle sibling threads of this device retire now
            job.finish(index, None, _on_device(exc, dev.ordinal, index))
            if lost:
                with work:
                    state.retire()
                return
            continue
        stats.busy_ns += clock() - t0
        stats.items += 1
        job.finish(index, result, None)


class MapHandle:
    """The items of one :meth:`DeviceGroup.map_async` submission, in flight."""

    __slots__ = ("_job", "_size")

    def __init__(self, job: _Job, size: int):
        self._job = job
        self._size = size

    def __len__(self) -> int:
        return self._size

    def done(self) -> bool:
        """Whether every item has finished (succeeded, failed or been cancelled)."""
        return self._job.unfinished == 0

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every item has finished; False if ``timeout`` seconds passed first."""
        return self._job.wait(timeout)

    def cancel(self) -> None:
        """Skip the items that no device has started; the running ones finish."""
        self._job.cancelled = True

    def exceptions(self) -> dict:
        """``{index: error}`` of the items that failed or were cancelled so far."""
        with self._job.cond:
            return dict(self._job.errors)

    def result(self, timeout: float | None = None, *, return_exceptions: bool = False) -> list:
        """Every item's outputs in input order (each a list, as ``dispatch`` returns). Raises the
        lowest-indexed failed item's error, unless ``return_exceptions`` puts each in its place."""
        job = self._job
        if not job.wait(timeout):
            raise DispatchFailed(
                f"{job.unfinished} of {self._size} items were still running after {timeout} s",
                "wait longer (result(timeout=None) waits without bound), or cancel() the rest",
                status="timeout",
                call="MapHandle.result",
            )
        if return_exceptions:
            return [job.errors.get(i, job.results[i]) for i in range(self._size)]
        if job.first_failure is not None:
            raise job.errors[job.first_failure]
        if job.errors:  # only cancellations: cancel() was called
            raise job.errors[min(job.errors)]
        return list(job.results)

    def __repr__(self) -> str:
        state = "done" if self.done() else f"{self._job.unfinished} running or queued"
        return f"MapHandle({self._size} items, {state}, {len(self._job.errors)} failed)"


class GroupTelemetry:
    """Counters of every device of a group: ``per_device()`` and their sums, ``snapshot()``.

    A device's entry is its backend's telemetry plus ``group_items``, ``group_failed_items``,
    ``group_busy_ns`` (time inside dispatch calls) and ``lost``.
    """

    def __init__(self, devices):
        self._devices = devices

    def per_device(self) -> dict:
        out = {}
        for dev in self._devices:
            snap = dict(dev.telemetry.snapshot()) if dev.telemetry is not None else {}
            snap["group_items"] = sum(s.items for s in dev.stats)
            snap["group_failed_items"] = sum(s.failed for s in dev.stats)
            snap["group_busy_ns"] = sum(s.busy_ns for s in dev.stats)
            snap["lost"] = dev.lost is not None
            out[dev.ordinal] = snap
        return out

    def snapshot(self) -> dict:
        """Every integer counter summed over the devices, plus ``devices`` and ``lost_devices``."""
        per = self.per_device()
        total: dict = {}
        for snap in per.values():
            for key, value in snap.items():
                if is_int(value):
                    total[key] = total.get(key, 0) + int(value)
        total["devices"] = len(per)
        total["lost_devices"] = sum(1 for snap in per.values() if snap["lost"])
        return total

    def reset(self) -> None:
        for dev in self._devices:
            if dev.telemetry is not None:
                dev.telemetry.reset()
            for s in dev.stats:
                s.items = s.failed = s.busy_ns = 0

    def __getitem__(self, name):
        return self.snapshot()[name]

    def __repr__(self) -> str:
        snap = self.snapshot()
        return f"GroupTelemetry({', '.join(f'{k}={v}' for k, v in snap.items() if v)})"
