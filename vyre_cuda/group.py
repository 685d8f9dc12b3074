"""DeviceGroup: every GPU of a host, one backend and one driving thread per device.

A blocking dispatch releases the GIL for its whole duration, so one Python thread per device keeps
every GPU busy. The threads are created once, with the group, and pull work items from one shared
queue: a device that finishes early takes the next item (work stealing), and a device that is lost
stops pulling, so the items it has not started go to the others.

Why one module of this size: the queue, the per-device threads, the job records they complete and
the error annotation share one lock and one state object; the pure split planning (plan_split) is
the part that could stand alone, and is kept here beside dispatch_split, its only user.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import as_config
from .errors import BackendError, DeviceLost, DispatchFailed, ValidationError
from .program import BindingRole, Program

log = logging.getLogger("vyre_cuda")

__all__ = ["DeviceGroup", "MapHandle", "GroupTelemetry", "SplitPlan", "plan_split"]

# A chunk smaller than this costs more in dispatch overhead than another device saves.
MIN_CHUNK_BYTES = 1 << 20
# Chunks per device in dispatch_split: more than one lets a slower (or busier) device take fewer
# chunks through work stealing; few, so each chunk stays large and the plans stay cached.
CHUNKS_PER_DEVICE = 2


# ---------------------------------------------------------------------------------- errors
def _on_device(exc: BaseException, ordinal: int, index: int | None = None) -> BaseException:
    """``exc`` as raised on device ``ordinal`` (by item ``index``): the same type, the ordinal in
    the message and in ``.device``, the item's index in ``.item``."""
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


def _cancelled(index: int) -> _Cancelled:
    return _Cancelled(
        f"item {index} was cancelled before it ran (an earlier item failed, or cancel() was called)",
        "look at the error of the item that failed; submit the cancelled items again if needed",
    )


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


# ---------------------------------------------------------------------------------- jobs
class _Job:
    """The items of one submission: their results, errors and completion."""

    __slots__ = (
        "program",
        "config",
        "results",
        "errors",
        "unfinished",
        "cond",
        "cancelled",
        "fail_fast",
        "streaming",
        "completed",
        "first_failure",
    )

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


# ---------------------------------------------------------------------------------- threads
class _ThreadStats:
    __slots__ = ("items", "failed", "busy_ns")

    def __init__(self):
        self.items = 0
        self.failed = 0
        self.busy_ns = 0


class _Device:
    __slots__ = ("ordinal", "backend", "telemetry", "stats", "lost", "ready", "error")

    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.backend: Any = None
        self.telemetry: Any = None
        self.stats: list = []  # one _ThreadStats per thread: no shared counter to race on
        self.lost: BaseException | None = None  # the error that retired the device
        self.ready = threading.Event()
        self.error: BaseException | None = None  # why its backend could not be created


class _State:
    """What the threads share. It holds no reference to the DeviceGroup, so a group dropped
    without close() is still collected, and its finalizer shuts the threads down."""

    def __init__(self, devices):
        self.devices = devices
        self.queue = collections.deque()  # (job, index, inputs, outputs or None)
        self.work = threading.Condition(threading.Lock())
        self.closing = False
        self.live_threads = 0
        self.threads: list = []
        self.lost: dict = {}  # ordinal -> the error that lost it

    def submit(self, items: list) -> None:
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


def _start(state: _State, dev: _Device, factory) -> bool:
    try:
        dev.backend = factory(dev.ordinal)
        dev.telemetry = getattr(dev.backend, "telemetry", None)
    except BaseException as exc:  # noqa: BLE001 (the constructor reports it)
        dev.error = exc
    dev.ready.set()
    return dev.error is None


def _worker(state: _State, dev: _Device, stats: _ThreadStats, factory) -> None:
    ok = _start(state, dev, factory) if factory is not None else (dev.ready.wait() and dev.error is None)
    if not ok:
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
            job.finish(index, None, _cancelled(index))
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


def _config(config):
    """The config items carry: None stays None (the backends' fastest path, as a plain dispatch),
    anything else is checked once here rather than once per item."""
    return None if config is None else as_config(config)


def _make_cuda_backend(options: dict, ordinal: int):
    from .backend import CudaBackend  # noqa: PLC0415 (the compiled core loads at first use)

    return CudaBackend(ordinal, **options)


def _resolve_devices(devices, counted: bool) -> tuple:
    if devices is None:
        if not counted:
            raise ValidationError(
                "devices=None means every visible CUDA device, which a custom backend_factory cannot count",
                "pass the ordinals explicitly, e.g. DeviceGroup([0, 1], backend_factory=...)",
            )
        from . import _driver  # noqa: PLC0415

        return tuple(range(_driver.device_count()))
    if isinstance(devices, (int, np.integer, str, bytes)):
        raise ValidationError(
            f"devices must be a sequence of device ordinals or None (got {devices!r})",
            "pass devices=[0] for one device, devices=[0, 1] for two, or devices=None for every visible device",
        )
    try:
        ordinals = list(devices)
    except TypeError:
        raise ValidationError(
            f"devices must be a sequence of device ordinals or None (got {type(devices).__name__})",
            "pass devices=[0, 1] or devices=None for every visible device",
        ) from None
    for d in ordinals:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise ValidationError(
                f"every device must be a non-negative int ordinal (got {d!r} in {ordinals!r})",
                "pass ordinals such as devices=[0, 1]",
            )
    ordinals = [int(d) for d in ordinals]
    if not ordinals:
        raise ValidationError("devices is empty", "pass at least one ordinal, or devices=None for all")
    if len(set(ordinals)) != len(ordinals):
        raise ValidationError(
            f"devices lists an ordinal more than once ({ordinals})",
            "list each device once; use threads_per_device=2 for more concurrency on one device",
        )
    if counted:
        from . import _driver  # noqa: PLC0415

        n = _driver.device_count()
        missing = [d for d in ordinals if d >= n]
        if missing:
            raise ValidationError(
                f"device(s) {missing} do not exist: {n} device(s) are visible (ordinals 0 to {n - 1})",
                "pass ordinals below the visible count, or devices=None for all; "
                "CUDA_VISIBLE_DEVICES chooses which GPUs are visible and in what order",
            )
    return tuple(ordinals)


# ---------------------------------------------------------------------------------- handles
class MapHandle:
    """The items of one :meth:`DeviceGroup.map_async` submission, in flight.

    ``result()`` waits and returns the outputs in input order; ``done()``/``wait()`` poll and
    wait; ``cancel()`` skips the items no device has started; ``exceptions()`` maps the index of
    each failed item to its error.
    """

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
        """The outputs of every item, in input order (each a list, as ``dispatch`` returns).

        Raises the error of the lowest-indexed item that failed, unless ``return_exceptions``,
        which puts each failed item's error in its place instead.
        """
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

    Each device's entry holds its backend's telemetry plus ``group_items`` (items it ran),
    ``group_failed_items``, ``group_busy_ns`` (time inside dispatch calls) and ``lost``.
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
                if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
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


# ---------------------------------------------------------------------------------- split
@dataclass(frozen=True)
class SplitPlan:
    """How :meth:`DeviceGroup.dispatch_split` cuts one dispatch into chunks.

    ``rows`` is the common first dimension of the split inputs; chunk ``k`` covers rows
    ``bounds[k]``. ``inputs`` holds per program input either ``("split", array)`` (cut along its
    first axis) or ``("whole", buffer)`` (passed to every chunk); ``outputs`` holds per program
    output ``(name, numpy dtype, elements per row)``.
    """

    rows: int
    bounds: tuple
    inputs: tuple
    outputs: tuple

    def chunk_inputs(self, k: int) -> list:
        lo, hi = self.bounds[k]
        return [value[lo:hi] if kind == "split" else value for kind, value in self.inputs]

    def chunk_outputs(self, arrays, k: int) -> list:
        lo, hi = self.bounds[k]
        return [arr[lo * per_row : hi * per_row] for arr, (_, _, per_row) in zip(arrays, self.outputs)]

    def allocate(self, outputs=None) -> list:
        """New flat output arrays, or the caller's (checked: dtype, size, contiguity, writability)."""
        if outputs is None:
            return [np.empty(self.rows * per_row, dtype) for _, dtype, per_row in self.outputs]
        if (
            isinstance(outputs, np.ndarray)
            or not isinstance(outputs, (list, tuple))
            or len(outputs) != len(self.outputs)
        ):
            names = ", ".join(repr(n) for n, _, _ in self.outputs)
            raise ValidationError(
                f"outputs must be a list of {len(self.outputs)} array(s) ({names}), got "
                f"{type(outputs).__name__}" + (f" of {len(outputs)}" if isinstance(outputs, (list, tuple)) else ""),
                "pass one numpy array per program output, in declaration order, or outputs=None",
            )
        flat = []
        for (name, dtype, per_row), arr in zip(self.outputs, outputs):
            want = self.rows * per_row
            ok = (
                isinstance(arr, np.ndarray)
                and arr.dtype == dtype
                and arr.size == want
                and arr.flags.c_contiguous
                and arr.flags.writeable
            )
            if not ok:
                got = (
                    f"{arr.dtype} array of {arr.size} elements (contiguous={arr.flags.c_contiguous}, "
                    f"writeable={arr.flags.writeable})"
                    if isinstance(arr, np.ndarray)
                    else type(arr).__name__
                )
                raise ValidationError(
                    f"output {name!r} must be a writeable C-contiguous {dtype} array of {want} elements (got {got})",
                    f"pass np.empty({want}, np.{dtype}) or outputs=None",
                )
            flat.append(arr.reshape(-1))
        return flat


def _split_refusal(program, what: str, fix: str) -> ValidationError:
    label = program.name or program.kernel.entry
    return ValidationError(f"dispatch_split cannot split program {label!r}: {what}", fix)


def plan_split(
    program, inputs, split, config=None, *, devices: int = 1, align: int = 1, chunks: int | None = None
) -> SplitPlan:
    """Plan a :meth:`DeviceGroup.dispatch_split` (pure: no device needed).

    ``split`` declares the program elementwise along runtime-sized bindings: ``True`` for every
    runtime-sized input, or the names of the inputs to cut (a ``str`` for one). Each split input
    is cut along its first axis (rows: elements for 1-D arrays), at multiples of ``align`` rows;
    the other inputs (statically sized) go whole to every chunk. Every output must be
    runtime-sized: each chunk writes its rows of every output.
    """
    if not isinstance(program, Program):
        raise ValidationError(
            f"dispatch_split needs a vyre_cuda.Program (got {type(program).__name__})",
            "build one with Program(Kernel.cuda(src), [BufferDecl...])",
        )
    cfg = as_config(config)
    if split is None or split is False:
        raise _split_refusal(
            program,
            "it is not declared elementwise",
            "pass split=True when element i of every output depends only on element i (row i) of "
            "the runtime-sized inputs, or split=['x', ...] naming the inputs to cut; otherwise "
            "dispatch it on one device, or give map() independent inputs",
        )
    if program.grid_sync or cfg.cooperative:
        raise _split_refusal(
            program,
            "it synchronises the whole grid (grid_sync=True or cooperative=True), so its chunks are not independent",
            "dispatch it on one device (CudaBackend.dispatch), or run independent inputs with map()",
        )
    for decl in program.outputs:
        if decl.count:
            raise _split_refusal(
                program,
                f"output {decl.name!r} has a static size (count={decl.count}); every chunk "
                "would write the whole buffer, which cannot be joined",
                f"declare {decl.name!r} runtime-sized (count=0), or dispatch on one device",
            )
        if decl.output_byte_range is not None:
            raise _split_refusal(
                program,
                f"output {decl.name!r} reads back a byte range {decl.output_byte_range}, "
                "which cannot be joined across chunks",
                f"drop output_byte_range from {decl.name!r}, or dispatch on one device",
            )
    for name, value in (("align", align), ("devices", devices)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValidationError(f"{name} must be an int >= 1 (got {value!r})", f"pass {name}=1 or more")
    if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks < 1):
        raise ValidationError(
            f"chunks must be an int >= 1 or None (got {chunks!r})",
            "pass chunks=None to let the group choose, or a positive count",
        )
    decls = program.inputs
    if isinstance(inputs, (str, bytes, np.ndarray)) or not hasattr(inputs, "__len__"):
        raise ValidationError(
            f"inputs must be a list of buffers (got {type(inputs).__name__})",
            "pass a list with one buffer per program input, e.g. [x, y]",
        )
    if len(inputs) != len(decls):
        names = ", ".join(repr(d.name) for d in decls) or "none"
        raise ValidationError(
            f"program takes {len(decls)} input(s) ({names}) but {len(inputs)} were passed",
            f"pass exactly {len(decls)} buffer(s), in declaration order",
        )
    runtime = [d for d in decls if d.count == 0]
    if split is True:
        chosen = {d.name for d in runtime}
    else:
        chosen_names: tuple = (split,) if isinstance(split, str) else tuple(split)
        known = {d.name: d for d in program.buffers}
        for name in chosen_names:
            if name not in known:
                raise ValidationError(
                    f"split names {name!r}, which is not a buffer of the program "
                    f"(inputs: {', '.join(repr(d.name) for d in decls) or 'none'})",
                    "name runtime-sized inputs of the program, or pass split=True for all of them",
                )
            if known[name].count:
                raise _split_refusal(
                    program,
                    f"split names {name!r}, which has a static size (count={known[name].count})",
                    f"leave {name!r} out of split (a static input goes whole to every chunk), or "
                    "declare it runtime-sized (count=0)",
                )
        chosen = {n for n in chosen_names if n in {d.name for d in decls}}
    if not chosen:
        raise _split_refusal(
            program,
            "split names no runtime-sized input to cut",
            "pass split=True, or name at least one runtime-sized input",
        )
    pure_outputs = [d for d in program.outputs if d.role is BindingRole.OUTPUT]
    for d in runtime:
        if d.name in chosen:
            continue
        if d.role is BindingRole.INPUT_OUTPUT:
            raise _split_refusal(
                program,
                f"input {d.name!r} is read back (read-write) but is not in split",
                f"add {d.name!r} to split",
            )
        if pure_outputs:
            raise _split_refusal(
                program,
                f"runtime-sized input {d.name!r} is not in split, but it would size the "
                f"runtime-sized output(s) {', '.join(repr(o.name) for o in pure_outputs)} of every chunk",
                f"add {d.name!r} to split, or declare it with a static count to pass it whole to every chunk",
            )

    views = []
    rows: int | None = None
    per_row: dict = {}
    for i, (decl, value) in enumerate(zip(decls, inputs)):
        if decl.name not in chosen:
            views.append(("whole", value))
            continue
        arr = _as_rows(value, decl, i)
        row_bytes = arr.nbytes // arr.shape[0] if arr.shape[0] else arr.itemsize * math.prod(arr.shape[1:])
        if row_bytes % decl.dtype.itemsize:
            raise ValidationError(
                f"input {i} ({decl.name!r}): a row of shape {arr.shape[1:]} holds {row_bytes} bytes, "
                f"not a whole number of {decl.dtype.itemsize}-byte {decl.dtype.name} elements",
                f"pass {decl.name!r} as an array of {decl.dtype.name} (numpy {decl.dtype.numpy})",
            )
        if rows is not None and arr.shape[0] != rows:
            raise ValidationError(
                f"split inputs must have the same number of rows (first dimension): input {i} "
                f"({decl.name!r}) has {arr.shape[0]}, an earlier split input has {rows}",
                "pass split inputs with the same first dimension; reshape flat buffers to "
                "(rows, elements_per_row) where a row of one input matches a row of another",
            )
        rows = arr.shape[0]
        per_row[decl.name] = row_bytes // decl.dtype.itemsize
        views.append(("split", arr))
    assert rows is not None  # chosen is not empty: at least one input was cut
    if rows == 0:
        raise ValidationError(
            "the split inputs are empty (0 rows)",
            "skip the dispatch for empty inputs",
        )
    out_specs = []
    widest = max(per_row.values())
    for decl in program.outputs:
        width = per_row[decl.name] if decl.role is BindingRole.INPUT_OUTPUT else widest
        out_specs.append((decl.name, decl.dtype.numpy, width))

    row_bytes_total = sum(views[i][1].nbytes for i in range(len(views)) if views[i][0] == "split") // rows
    row_bytes_total += sum(np.dtype(dt).itemsize * w for _, dt, w in out_specs)
    if chunks is None:
        if devices == 1:
            chunks = 1
        else:
            by_size = max(1, (rows * row_bytes_total) // MIN_CHUNK_BYTES)
            chunks = min(devices * CHUNKS_PER_DEVICE, by_size)
    size = -(-rows // int(chunks))
    size = -(-size // int(align)) * int(align)
    bounds = tuple((lo, min(lo + size, rows)) for lo in range(0, rows, size))
    return SplitPlan(rows=rows, bounds=bounds, inputs=tuple(views), outputs=tuple(out_specs))


def _as_rows(value, decl, index: int) -> np.ndarray:
    """An input as an array whose first axis is the split axis (bytes-like: 1-D of its dtype)."""
    if isinstance(value, np.ndarray):
        arr = value
    else:
        try:
            view = memoryview(value).cast("B")
        except (TypeError, ValueError, BufferError):
            raise ValidationError(
                f"input {index} ({decl.name!r}) is a {type(value).__name__}, which is not a C-contiguous buffer",
                "pass a numpy array, bytes, bytearray, memoryview or another C-contiguous buffer",
            ) from None
        if view.nbytes % decl.dtype.itemsize:
            raise ValidationError(
                f"input {index} ({decl.name!r}) holds {view.nbytes} bytes, not a multiple of the "
                f"{decl.dtype.itemsize}-byte {decl.dtype.name} element",
                f"pass a buffer of whole {decl.dtype.name} elements",
            )
        arr = np.frombuffer(view, dtype=decl.dtype.numpy)
    if arr.ndim == 0:
        raise ValidationError(
            f"input {index} ({decl.name!r}) is a 0-d array; there is no axis to split",
            f"pass {decl.name!r} as a 1-D array, or leave it out of split",
        )
    if not arr.flags.c_contiguous:
        raise ValidationError(
            f"input {index} ({decl.name!r}) of shape {arr.shape} is not C-contiguous",
            "pass np.ascontiguousarray(x)",
        )
    return arr


# ---------------------------------------------------------------------------------- group
class DeviceGroup:
    """Several CUDA devices of this host, one backend and one driving thread per device.

    Parameters
    ----------
    devices : sequence of int, optional
        Device ordinals; None (default) for every visible device.
    backend_factory : callable, optional
        ``backend_factory(ordinal)`` returns the backend of one device (default:
        ``CudaBackend(ordinal, **backend_options)``); anything with ``dispatch``,
        ``dispatch_into``, ``telemetry`` and ``close`` works.
    backend_options : dict, optional
        Keyword arguments of each default ``CudaBackend`` (``device_pool_bytes``,
        ``pinned_pool_bytes``).
    threads_per_device : int
        Threads driving each device (1: one dispatch in flight per device; 2 lets one item's
        uploads overlap another's readback).

    Examples
    --------
    >>> import numpy as np, vyre_cuda as vc
    >>> prog = vc.builtin_programs.vecadd_f32()
    >>> batches = [[np.random.rand(1 << 20).astype(np.float32)] * 2 for _ in range(8)]
    >>> with vc.DeviceGroup() as group:                          # doctest: +SKIP
    ...     outs = group.map(prog, batches)                      # input order
    ...     (total,) = group.dispatch_split(prog, batches[0], split=True)
    """

    def __init__(self, devices=None, *, backend_factory=None, backend_options=None, threads_per_device: int = 1):
        if (
            isinstance(threads_per_device, bool)
            or not isinstance(threads_per_device, (int, np.integer))
            or not 1 <= threads_per_device <= 64
        ):
            raise ValidationError(
                f"threads_per_device must be an int in 1..64 (got {threads_per_device!r})",
                "pass threads_per_device=1 (or 2 to overlap transfers of consecutive items)",
            )
        if backend_factory is not None and backend_options:
            raise ValidationError(
                "backend_options apply to the default CudaBackend; a backend_factory makes its own",
                "pass the options to your backend_factory instead",
            )
        if backend_factory is not None and not callable(backend_factory):
            raise ValidationError(
                f"backend_factory must be callable (got {type(backend_factory).__name__})",
                "pass a function taking a device ordinal and returning a backend",
            )
        ordinals = _resolve_devices(devices, counted=backend_factory is None)
        factory = backend_factory
        if factory is None:
            options = dict(backend_options or {})

            def factory(ordinal):
                return _make_cuda_backend(options, ordinal)

        self._devices = [_Device(o) for o in ordinals]
        self._threads_per_device = int(threads_per_device)
        state = self._state = _State(self._devices)
        state.live_threads = len(ordinals) * self._threads_per_device
        # the backends are created by their devices' first threads, in parallel (a context costs
        # ~100 ms per device)
        for dev in self._devices:
            for k in range(self._threads_per_device):
                stats = _ThreadStats()
                dev.stats.append(stats)
                t = threading.Thread(
                    target=_worker,
                    args=(state, dev, stats, factory if k == 0 else None),
                    name=f"vyre-cuda-device{dev.ordinal}-{k}",
                    daemon=True,
                )
                state.threads.append(t)
                t.start()
        for dev in self._devices:
            dev.ready.wait()
        failed = [dev for dev in self._devices if dev.error is not None]
        if failed:
            state.shutdown()
            raise _on_device(failed[0].error, failed[0].ordinal)  # type: ignore[arg-type]  # not None here
        self.telemetry = GroupTelemetry(self._devices)
        self._finalizer = weakref.finalize(self, state.shutdown)

    # ------------------------------------------------------------------ properties
    @property
    def devices(self) -> tuple:
        """The ordinals of the group's devices."""
        return tuple(dev.ordinal for dev in self._devices)

    @property
    def lost_devices(self) -> tuple:
        """Ordinals of the devices lost (a kernel fault, a device gone); they run nothing more."""
        return tuple(dev.ordinal for dev in self._devices if dev.lost is not None)

    @property
    def live_devices(self) -> tuple:
        return tuple(dev.ordinal for dev in self._devices if dev.lost is None)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def backend(self, ordinal: int):
        """The backend driving device ``ordinal`` (for its caps, plan_info, ...)."""
        for dev in self._devices:
            if dev.ordinal == ordinal:
                return dev.backend
        raise ValidationError(
            f"device {ordinal} is not in this group (devices {self.devices})", f"pass one of {self.devices}"
        )

    def __len__(self) -> int:
        return len(self._devices)

    # ------------------------------------------------------------------ map
    def map(self, program, batches, config=None, *, outputs=None, return_exceptions: bool = False) -> list:
        """Dispatch ``program`` once per batch (a list of inputs) across the devices and wait.

        Returns the outputs of each batch (a list, as ``dispatch`` returns) in input order. A
        device that finishes early takes the next batch. ``outputs`` (one list of arrays per
        batch) makes each item write into the caller's arrays, as ``dispatch_into``. If an item
        fails, the items not yet started are skipped and its error (with ``.device`` and
        ``.item``) is raised once the running ones finish; with ``return_exceptions=True`` every
        item runs and a failed item's error takes its place in the list.
        """
        handle = self.map_async(program, batches, config, outputs=outputs, fail_fast=not return_exceptions)
        try:
            return handle.result(return_exceptions=return_exceptions)
        except BaseException:
            # never return while a device still reads the caller's buffers
            handle.cancel()
            handle.wait()
            raise

    def map_async(self, program, batches, config=None, *, outputs=None, fail_fast: bool = False) -> MapHandle:
        """Queue one dispatch per batch and return a :class:`MapHandle` at once.

        The batches' buffers (and ``outputs``) must stay untouched until the handle is done.
        ``fail_fast`` skips the items not yet started once one fails.
        """
        self._check_program(program)
        cfg = _config(config)
        batches = list(batches)
        if outputs is None:
            outs = [None] * len(batches)
        else:
            outs = list(outputs)
            if len(outs) != len(batches):
                raise ValidationError(
                    f"outputs holds {len(outs)} list(s) of arrays for {len(batches)} batch(es)",
                    "pass one list of output arrays per batch, or outputs=None for new arrays",
                )
        job = _Job(program, cfg, [None] * len(batches), fail_fast)
        if batches:
            job.unfinished = len(batches)
            self._state.submit([(job, i, b, o) for i, (b, o) in enumerate(zip(batches, outs))])
        return MapHandle(job, len(batches))

    def imap_unordered(
        self, program, batches, config=None, *, return_exceptions: bool = False, window: int | None = None
    ):
        """Iterate ``(index, outputs)`` over the batches in the order they complete.

        ``batches`` may be a generator: at most ``window`` batches (default twice the group's
        threads) are queued or held as undelivered results at once. A failed item raises its
        error where the iteration reaches it (or yields ``(index, error)`` with
        ``return_exceptions=True``); leaving the loop early skips the batches not yet started
        and waits for the running ones.
        """
        self._check_program(program)
        cfg = _config(config)
        if window is None:
            window = 2 * len(self._devices) * self._threads_per_device
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValidationError(f"window must be an int >= 1 (got {window!r})", "pass window=None or a count")
        job = _Job(program, cfg, {}, fail_fast=not return_exceptions, streaming=True)
        return self._stream(job, iter(batches), int(window), return_exceptions)

    def _stream(self, job: _Job, batches, window: int, return_exceptions: bool):
        exhausted = False
        index = 0
        outstanding = 0
        try:
            while True:
                if not exhausted and not job.cancelled and outstanding < window:
                    new: list = []
                    while outstanding + len(new) < window:
                        try:
                            batch = next(batches)
                        except StopIteration:
                            exhausted = True
                            break
                        new.append((job, index, batch, None))
                        index += 1
                    if new:
                        with job.cond:
                            job.unfinished += len(new)
                        try:
                            self._state.submit(new)
                        except BaseException:
                            with job.cond:
                                job.unfinished -= len(new)
                            raise
                        outstanding += len(new)
                if outstanding == 0:
                    return
                with job.cond:
                    job.cond.wait_for(lambda: job.completed)
                    i = job.completed.popleft()
                    error = job.errors.pop(i, None)
                    outputs = job.results.pop(i, None)
                outstanding -= 1
                if error is None:
                    yield i, outputs
                elif isinstance(error, _Cancelled):
                    continue
                elif return_exceptions:
                    yield i, error
                else:
                    raise error
        finally:
            job.cancelled = True
            job.wait()

    # ------------------------------------------------------------------ split
    def dispatch_split(
        self, program, inputs, config=None, *, split=None, align: int = 1, chunks: int | None = None, outputs=None
    ) -> list:
        """One dispatch cut into chunks that run on every device at once, outputs joined.

        The caller declares the program elementwise with ``split``: ``True`` cuts every
        runtime-sized input, a name or list of names cuts those inputs. Split inputs are cut
        along their first axis (rows; elements for 1-D arrays) at multiples of ``align`` rows;
        statically sized inputs go whole to every chunk. Each chunk writes its rows of each
        output in place (``outputs`` may be the caller's arrays). Refused with a ValidationError:
        undeclared programs, grid-sync or cooperative programs, statically sized outputs.

        ``chunks`` (default: two per device, none below 1 MiB) sets how many pieces the work is
        cut into; devices take the next piece when they finish one.
        """
        cfg = _config(config)
        plan = plan_split(
            program, inputs, split, cfg, devices=max(1, len(self.live_devices)), align=align, chunks=chunks
        )
        outs = plan.allocate(outputs)
        job = _Job(program, cfg, [None] * len(plan.bounds), fail_fast=True)
        items = [(job, k, plan.chunk_inputs(k), plan.chunk_outputs(outs, k)) for k in range(len(plan.bounds))]
        job.unfinished = len(items)
        self._state.submit(items)
        handle = MapHandle(job, len(items))
        try:
            handle.result()
        except BaseException:
            handle.cancel()
            handle.wait()
            raise
        return outs if outputs is None else list(outputs)

    def _check_program(self, program) -> None:
        if not isinstance(program, Program):
            raise ValidationError(
                f"the group dispatches a vyre_cuda.Program (got {type(program).__name__})",
                "build one with Program(Kernel.cuda(src), [BufferDecl...])",
            )

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Finish the work already queued, stop the threads and close every backend. Idempotent."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self) -> str:
        if self.closed:
            state = "closed"
        else:
            lost = self.lost_devices
            state = f"lost {list(lost)}" if lost else "open"
        return f"DeviceGroup(devices={list(self.devices)}, {state})"
