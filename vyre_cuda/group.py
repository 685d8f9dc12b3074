"""DeviceGroup: every GPU of a host, one backend and one driving thread per device.

A blocking dispatch releases the GIL throughout, so one Python thread per device keeps every GPU
busy. The threads pull items from one shared queue: a device that finishes early takes the next
item, and a lost device stops pulling, leaving its items to the others. The queue, threads, jobs,
handles and telemetry live in :mod:`._group_work`, split planning in :mod:`.planning.split`.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from ._group_work import (
    GroupTelemetry,
    MapHandle,
    _Cancelled,
    _Device,
    _Job,
    _on_device,
    _State,
    _ThreadStats,
    _worker,
)
from ._validate import check_int, is_int
from .config import as_config
from .errors import ValidationError
from .planning.split import SplitPlan, plan_split
from .program import require_program

if TYPE_CHECKING:
    from typing_extensions import Self

    from .config import DispatchConfig
    from .program import Program
    from .typing import ConfigLike, HostOutput, InputBuffer, OutputBuffer

__all__ = ["DeviceGroup", "MapHandle", "GroupTelemetry", "SplitPlan", "plan_split"]


def _config(config: ConfigLike) -> DispatchConfig | None:
    # checked once here, not once per item; None stays None (the backends' fastest path)
    return None if config is None else as_config(config)


def _settle(handle: MapHandle, return_exceptions: bool = False) -> list:
    try:
        return handle.result(return_exceptions=return_exceptions)
    except BaseException:
        # never return while a device still reads the caller's buffers
        handle.cancel()
        handle.wait()
        raise


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
        if not is_int(d) or d < 0:
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


class DeviceGroup:
    """Several CUDA devices of this host, one backend and one driving thread per device.

    Parameters
    ----------
    devices : sequence of int, optional
        Device ordinals; None (default) for every visible device.
    backend_factory : callable, optional
        ``backend_factory(ordinal)`` returns one device's backend (default ``CudaBackend(ordinal,
        **backend_options)``); anything with ``dispatch``, ``dispatch_into``, ``telemetry`` and
        ``close`` works.
    backend_options : dict, optional
        Keyword arguments of each default ``CudaBackend``.
    threads_per_device : int
        Threads per device (2 lets one item's uploads overlap another's readback).

    Examples
    --------
    >>> import numpy as np, vyre_cuda as vc
    >>> prog = vc.builtin_programs.vecadd_f32()
    >>> batches = [[np.random.rand(1 << 20).astype(np.float32)] * 2 for _ in range(8)]
    >>> with vc.DeviceGroup() as group:                          # doctest: +SKIP
    ...     outs = group.map(prog, batches)                      # input order
    ...     (total,) = group.dispatch_split(prog, batches[0], split=True)
    """

    def __init__(
        self,
        devices: Iterable[int] | None = None,
        *,
        backend_factory: Callable[[int], Any] | None = None,
        backend_options: dict[str, Any] | None = None,
        threads_per_device: int = 1,
    ) -> None:
        threads_per_device = check_int(
            "threads_per_device",
            threads_per_device,
            minimum=1,
            maximum=64,
            fix="pass threads_per_device=1 (or 2 to overlap transfers of consecutive items)",
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
                from .backend import CudaBackend  # noqa: PLC0415 (the compiled core loads at first use)

                return CudaBackend(ordinal, **options)

        self._devices = [_Device(o) for o in ordinals]
        self._threads_per_device = threads_per_device
        state = self._state = _State(self._devices)
        state.live_threads = len(ordinals) * threads_per_device
        # each device's first thread creates its backend: in parallel (a context costs ~100 ms)
        for dev in self._devices:
            for k in range(threads_per_device):
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

    @property
    def devices(self) -> tuple[int, ...]:
        """The ordinals of the group's devices."""
        return tuple(dev.ordinal for dev in self._devices)

    @property
    def lost_devices(self) -> tuple[int, ...]:
        """Ordinals of the devices lost (a kernel fault, a device gone); they run nothing more."""
        return tuple(dev.ordinal for dev in self._devices if dev.lost is not None)

    @property
    def live_devices(self) -> tuple[int, ...]:
        """Ordinals of the devices still running work (not lost)."""
        return tuple(dev.ordinal for dev in self._devices if dev.lost is None)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run (or the group was collected)."""
        return not self._finalizer.alive

    def backend(self, ordinal: int) -> Any:
        """The backend driving device ``ordinal``: a :class:`~vyre_cuda.CudaBackend`, or what
        ``backend_factory`` made."""
        for dev in self._devices:
            if dev.ordinal == ordinal:
                return dev.backend
        raise ValidationError(
            f"device {ordinal} is not in this group (devices {self.devices})", f"pass one of {self.devices}"
        )

    def __len__(self) -> int:
        return len(self._devices)

    @overload
    def map(
        self,
        program: Program,
        batches: Iterable[Sequence[InputBuffer]],
        config: None = None,
        *,
        outputs: None = None,
        return_exceptions: Literal[False] = False,
    ) -> list[list[HostOutput]]: ...
    @overload
    def map(
        self,
        program: Program,
        batches: Iterable[Sequence[InputBuffer]],
        config: ConfigLike = None,
        *,
        outputs: Iterable[Sequence[OutputBuffer]] | None = None,
        return_exceptions: Literal[False] = False,
    ) -> list[list[Any]]: ...
    @overload
    def map(
        self,
        program: Program,
        batches: Iterable[Sequence[InputBuffer]],
        config: ConfigLike = None,
        *,
        outputs: Iterable[Sequence[OutputBuffer]] | None = None,
        return_exceptions: bool,
    ) -> list[list[Any] | BaseException]: ...
    def map(
        self,
        program: Program,
        batches: Iterable[Sequence[InputBuffer]],
        config: ConfigLike = None,
        *,
        outputs: Iterable[Sequence[OutputBuffer]] | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Dispatch ``program`` once per batch (a list of inputs) across the devices and wait.

        Returns each batch's outputs (a list, as ``dispatch`` returns) in input order; a device
        that finishes early takes the next batch. ``config`` applies to every item; ``outputs``
        (one list of arrays per batch) makes each item write into the caller's arrays, as
        ``dispatch_into``. If an item fails, the items not yet started are skipped and its error
        (with ``.device`` and ``.item``) is raised once the running ones finish; with
        ``return_exceptions=True`` every item runs and a failed item's error takes its place.
        """
        handle = self.map_async(program, batches, config, outputs=outputs, fail_fast=not return_exceptions)
        return _settle(handle, return_exceptions)

    def map_async(
        self,
        program: Program,
        batches: Iterable[Sequence[InputBuffer]],
        config: ConfigLike = None,
        *,
        outputs: Iterable[Sequence[OutputBuffer]] | None = None,
        fail_fast: bool = False,
    ) -> MapHandle:
        """Queue one dispatch per batch and return a :class:`MapHandle` at once; the buffers must stay
        untouched until it is done. ``fail_fast`` skips the items not yet started once one fails."""
        require_program(program, "the group", verb="dispatches")
        cfg = _config(config)
        batches = list(batches)
        outs: list[Any]
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
            self._state.submit(job, [(job, i, b, o) for i, (b, o) in enumerate(zip(batches, outs))])
        return MapHandle(job, len(batches))

    @overload
    def imap_unordered(
        self,
        program: Program,
        batches: Iterable[Sequence[InputBuffer]],
        config: ConfigLike = None,
        *,
        return_exceptions: Literal[False] = False,
        window: int | None = None,
    ) -> Iterator[tuple[int, list[Any]]]: ...
    @overload
    def imap_unordered(
        self,
        program: Program,
        batches: Iterable[Sequence[InputBuffer]],
        config: ConfigLike = None,
        *,
        return_exceptions: bool,
        window: int | None = None,
    ) -> Iterator[tuple[int, list[Any] | BaseException]]: ...
    def imap_unordered(
        self,
        program: Program,
        batches: Iterable[Sequence[InputBuffer]],
        config: ConfigLike = None,
        *,
        return_exceptions: bool = False,
        window: int | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """Iterate ``(index, outputs)`` over the batches in the order they complete.

        At most ``window`` batches (default twice the group's threads) of ``batches`` (a generator
        works) are queued or undelivered at once. A failed item raises where the iteration reaches
        it (or yields ``(index, error)`` with ``return_exceptions``); leaving the loop early skips
        the batches not yet started and waits for the running ones.
        """
        require_program(program, "the group", verb="dispatches")
        cfg = _config(config)
        if window is None:
            window = 2 * len(self._devices) * self._threads_per_device
        window = check_int("window", window, minimum=1, fix="pass window=None or a count")
        job = _Job(program, cfg, {}, fail_fast=not return_exceptions, streaming=True)
        return self._stream(job, iter(batches), window, return_exceptions)

    def _stream(
        self, job: _Job, batches: Iterator[Sequence[InputBuffer]], window: int, return_exceptions: bool
    ) -> Iterator[tuple[int, Any]]:
        exhausted = False
        index = 0
        outstanding = 0
        try:
            while True:
                if not exhausted and not job.cancelled and outstanding < window:
                    wanted = window - outstanding
                    new = [(job, index + k, b, None) for k, b in enumerate(itertools.islice(batches, wanted))]
                    exhausted = len(new) < wanted
                    index += len(new)
                    if new:
                        self._state.submit(job, new)
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

    def dispatch_split(
        self,
        program: Program,
        inputs: Sequence[InputBuffer],
        config: ConfigLike = None,
        *,
        split: bool | str | Sequence[str] | None = None,
        align: int | None = None,
        chunks: int | None = None,
        outputs: Sequence[OutputBuffer] | None = None,
    ) -> list[Any]:
        """One dispatch cut into chunks that run on every device at once, outputs joined.

        The program is elementwise by its declaration (``Program(elementwise=..., align=...)``)
        or by ``split`` for this call, which wins: ``True`` cuts every runtime-sized input, a name
        or list of names those inputs, along their first axis at multiples of ``align`` rows
        (default: the program's). Statically sized inputs go whole to every chunk; each chunk
        writes its rows of each output in place (``outputs`` may be the caller's arrays).
        ``chunks`` (default: two per device, none below 1 MiB) sets how many pieces there are.
        Raises ValidationError for a program declared neither way, grid-sync or cooperative, or
        with statically sized outputs (the rules of ``Program(elementwise=...)``).
        """
        cfg = _config(config)
        plan = plan_split(
            program, inputs, split, cfg, devices=max(1, len(self.live_devices)), align=align, chunks=chunks
        )
        outs = plan.allocate(outputs)
        job = _Job(program, cfg, [None] * len(plan.bounds), fail_fast=True)
        items = [(job, k, plan.chunk_inputs(k), plan.chunk_outputs(outs, k)) for k in range(len(plan.bounds))]
        self._state.submit(job, items)
        _settle(MapHandle(job, len(items)))
        return outs if outputs is None else list(outputs)

    def close(self) -> None:
        """Finish the work already queued, stop the threads and close every backend. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        lost = self.lost_devices
        state = "closed" if self.closed else f"lost {list(lost)}" if lost else "open"
        return f"DeviceGroup(devices={list(self.devices)}, {state})"
