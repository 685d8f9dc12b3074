"""CudaBackend: the public class around the compiled core. Its planning steps live in
_backend_plans.py, close()'s ordered teardown in _backend_close.py."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from . import _backend_close, _backend_plans, _driver, _hostreg, tuning
from ._device import driver_status, reset_device  # (re-exported: the CLI and callers import them from here)
from ._knobs import DEFAULT as DEFAULT_KNOBS
from ._knobs import Knobs
from ._plan_miss import PlanMiss
from ._validate import check_int, check_size
from .compile.modules import ModuleCache
from .compile.nvrtc import preload_nvrtc
from .config import AutoRegister, as_config, auto_register_policy
from .errors import CooperativeResidencyExceeded, ValidationError
from .planning.caps import DeviceCaps
from .planning.dispatch import DispatchPlan, plan_route
from .telemetry import Telemetry, TimedDispatchResult
from .tracing import trace_flags

if TYPE_CHECKING:
    from typing_extensions import Self

    from ._waits import PendingDispatch
    from .config import DispatchConfig
    from .program import Program
    from .tuning import TuneResult
    from .typing import ConfigLike, HostOutput, InputBuffer, OutputBuffer, OutputT

__all__ = ["CudaBackend", "TimedDispatchResult", "driver_status", "reset_device", "PlanInfo"]

log = logging.getLogger("vyre_cuda")

# the staging ring: 4 chunks of 8 MiB, measured on the H200 (notes/transfer-engine.md)
DEFAULT_CHUNK_BYTES = 8 << 20
DEFAULT_CHUNKS = 4


def _transfer_settings(chunk_bytes, chunks, threads):
    def whole(name, value, lo, hi, fix):
        return check_int(name, value, minimum=lo, maximum=hi, expected=f"an int in {lo:,}..{hi:,}", fix=fix)

    chunk_bytes = whole(
        "staging_chunk_bytes", chunk_bytes, 1 << 20, 1 << 30, "pass a chunk size such as 8 << 20 (a multiple of 64 KiB)"
    )
    if chunk_bytes % (64 << 10):
        raise ValidationError(
            f"staging_chunk_bytes must be a multiple of 65,536 (got {chunk_bytes:,})",
            "pass a chunk size such as 8 << 20",
        )
    chunks = whole("staging_chunks", chunks, 2, 64, "pass staging_chunks=4 (at least 2 to overlap copy and DMA)")
    if threads is None:
        threads = default_copy_threads()
    threads = whole("copy_threads", threads, 0, 256, "pass copy_threads=None for the default, or 0..256")
    return chunk_bytes, chunks, threads


def default_copy_threads() -> int:
    """Every core this process may use but the dispatching one, at most 15: on a 16-core H200 host
    staged copies scale to 16 threads (the streamed route: 1.23x the duplex DMA time with 15
    threads, 1.66x with 8)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return min(15, max(0, cores - 1))


PlanInfo = DispatchPlan  # what plan_info() returns (the name of earlier releases)


class CudaBackend:
    """Runs vyre programs on one CUDA device, on borrowed host buffers.

    Parameters
    ----------
    device : int
        Device ordinal.
    device_pool_bytes, pinned_pool_bytes : int
        How much freed device memory and page-locked staging the pools keep cached: the pinned
        mirrors of small dispatches and the staging slots of streamed ones (a streamed dispatch in
        flight holds one block, about 72 MiB for three float32 buffers; the default keeps enough
        for 16 in flight). Large device slabs come from the driver's stream-ordered pool, which
        keeps what it grew to until :meth:`trim`.
    staging_chunk_bytes, staging_chunks : int
        The staging ring that large serial transfers stream through: ``staging_chunks``
        page-locked chunks of ``staging_chunk_bytes`` each, allocated once at the first large
        dispatch, however large their buffers.
    copy_threads : int or None
        Native threads (besides the dispatching one) that split large host copies; None picks
        one per core this process may use but one, at most 15. 0 copies on the dispatching
        thread only.
    output_cache_bytes : int
        Host memory kept for the outputs of large dispatches once those arrays die, so the next
        large output needs no fresh (page-faulting) memory. 0 turns the cache off.
    trace : bool, str or None
        ``"nvtx"``: NVTX ranges per dispatch and per stage (Nsight Systems); ``"log"``: one log
        line per blocking dispatch with its stage times; ``True``: both; None reads
        ``VYRE_CUDA_TRACE`` (see :mod:`vyre_cuda.tracing`). Off costs nothing.
    auto_register : bool or AutoRegister
        Register ordinary numpy buffers in place (``cuMemHostRegister``) once dispatches see
        them again, on a worker thread, so they then move by direct DMA with no staging copy.
        Off by default; ``True`` uses :class:`AutoRegister`'s defaults. Registered
        bytes are bounded process-wide (:func:`set_registered_budget`); a buffer is unregistered
        before numpy frees it, and at :meth:`trim` and :meth:`close`.

    Examples
    --------
    >>> import numpy as np, vyre_cuda as vc
    >>> prog = vc.builtin_programs.vecadd_f32()
    >>> a = np.random.rand(1000).astype(np.float32); b = np.random.rand(1000).astype(np.float32)
    >>> with vc.CudaBackend() as backend:                       # doctest: +SKIP
    ...     (out,) = backend.dispatch(prog, [a, b])
    ...     assert np.array_equal(out, a + b)
    """

    _knobs: Knobs = DEFAULT_KNOBS

    def __init__(
        self,
        device: int = 0,
        *,
        device_pool_bytes: int = 256 << 20,
        pinned_pool_bytes: int = 2 << 30,
        staging_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        staging_chunks: int = DEFAULT_CHUNKS,
        copy_threads: int | None = None,
        output_cache_bytes: int = 4 << 30,
        trace: bool | str | None = None,
        auto_register: bool | AutoRegister = False,
    ):
        from ._dispatch import Core  # noqa: PLC0415 (the compiled core loads at first use)

        check_int("device", device, expected="an int ordinal", fix="pass device=0 or another ordinal")
        for name, value in (
            ("device_pool_bytes", device_pool_bytes),
            ("pinned_pool_bytes", pinned_pool_bytes),
            ("output_cache_bytes", output_cache_bytes),
        ):
            check_size(name, value, fix=f"pass {name}=0 to cache nothing, or a byte count such as 256 << 20")
        chunk_bytes, chunks, threads = _transfer_settings(staging_chunk_bytes, staging_chunks, copy_threads)
        trace_bits = trace_flags(trace)  # before the context is retained: a bad value leaks nothing
        policy = auto_register_policy(auto_register)
        self.device = int(device)
        preload_nvrtc()  # overlaps the driver's start below; the first dispatch needs NVRTC's version
        _driver.init_driver()
        self._caps = DeviceCaps(**_driver.device_caps(self.device))
        self._ctx = _driver.retain_primary_context(self.device)
        self._owns_context = True  # (the finalizer closes only a backend that retained one)
        self._plan_lock = threading.RLock()
        self._core = Core(
            self._ctx,
            device_pool_bytes,
            pinned_pool_bytes,
            trace_bits,
            self.device,
            chunk_bytes,
            chunks,
            threads,
            output_cache_bytes,
        )
        # an evicted module takes the plans that point into it along
        self._modules = ModuleCache(
            self._ctx, self._caps.cc, self._caps.driver_version, on_evict=self._core.clear_prepared
        )
        self.telemetry = Telemetry(self._core)
        self._holder = _hostreg.REGISTRY.holder(self.device, _busy_probe(self))
        if policy is not None:
            self._core.auto_hook = _hostreg.core_hook(self._holder, policy)
        self._closed = False
        log.debug("CudaBackend(device=%d): %s, cc %s", self.device, self._caps.name, self._caps.cc)

    # ------------------------------------------------------------------ properties
    @property
    def caps(self) -> DeviceCaps:
        """The device's capabilities and limits."""
        return self._caps

    @property
    def limits(self) -> dict[str, Any]:
        return self._caps.as_dict()

    @property
    def context_handle(self) -> int:
        """The CUcontext (as an int) of the device's primary context, which this backend uses."""
        return self._ctx

    @property
    def lost(self) -> bool:
        return self._core.lost is not None

    def _use_knobs(self, knobs: Knobs) -> None:
        """Measure with other settings (:class:`vyre_cuda._knobs.Knobs`), for this backend only:
        set on a live backend so the public constructor stays as it is and a benchmark can change
        them between runs. Call it while no other thread dispatches on this backend."""
        self._check_open()
        if not isinstance(knobs, Knobs):
            raise ValidationError(f"expected a vyre_cuda._knobs.Knobs, got {knobs!r}", "pass Knobs(...)")
        with self._plan_lock:  # (no plan is made with half of them)
            self._knobs = knobs
            self._core.set_knobs(knobs)

    # ------------------------------------------------------------------ dispatch
    @overload
    def dispatch(self, program: Program, inputs: Sequence[InputBuffer], config: None = None) -> list[HostOutput]: ...
    @overload
    def dispatch(
        self, program: Program, inputs: Sequence[InputBuffer], config: DispatchConfig | dict[str, Any]
    ) -> list[Any]: ...
    def dispatch(self, program: Program, inputs: Sequence[InputBuffer], config: ConfigLike = None) -> list[Any]:
        """Run ``program`` on ``inputs`` and wait.

        Parameters
        ----------
        program : Program
            The program; build it once and dispatch it many times (plans are cached per program).
        inputs : sequence of InputBuffer
            One buffer per input binding, in declaration order: numpy arrays (page-locked ones DMA
            directly), ``bytes`` and other C-contiguous buffers, or device arrays
            (``__dlpack__``/``__cuda_array_interface__``, read in place). See
            :mod:`vyre_cuda.typing`.
        config : DispatchConfig, dict or None
            Per-dispatch options; None for the defaults (the fastest path).

        Returns
        -------
        list of numpy.ndarray or DeviceArray
            The outputs, in declaration order: numpy arrays, or :class:`DeviceArray` under
            ``DispatchConfig(outputs="device")`` (typed ``list[Any]`` with a config).

        Raises
        ------
        ValidationError, InvalidProgram, UnsupportedFeature, KernelCompileFailed, DispatchFailed
            Each with the values involved and a ``Fix:`` line.
        """
        try:
            return self._core.dispatch(program, inputs, config)
        except PlanMiss as exc:  # plan, then call again with the plan (the core never plans)
            miss = exc.with_traceback(None)  # (its traceback would hold this frame: a cycle)
        return self._core.dispatch(program, miss.inputs, config, self._insert_plan(miss, program))

    def dispatch_async(
        self,
        program: Program,
        inputs: Sequence[InputBuffer],
        config: ConfigLike = None,
        *,
        timed: bool = False,
        outputs: Sequence[OutputBuffer] | None = None,
    ) -> PendingDispatch:
        """Enqueue the dispatch and return at once.

        Parameters are those of :meth:`dispatch`; ``timed=True`` records device events for
        :meth:`PendingDispatch.timed_result`. The inputs may be reused as soon as this returns.
        ``outputs`` names the arrays to write, as :meth:`dispatch_into` does: device arrays in
        the dispatch's stream order, host arrays when the result is taken. On a caller's stream
        with device arrays in and out, this only enqueues (no host wait until ``result()``).

        Returns
        -------
        PendingDispatch
            ``is_ready()``, ``result()``, ``result_into(outputs)``, ``timed_result()``; dropping it
            un-awaited is safe (it waits, then recycles).
        """
        try:
            return self._core.dispatch_async(program, inputs, config, timed, None, outputs)
        except PlanMiss as exc:
            miss = exc.with_traceback(None)
        outputs = outputs if miss.outputs is None else miss.outputs
        prep = self._insert_plan(miss, program, False)
        return self._core.dispatch_async(program, miss.inputs, config, timed, prep, outputs)

    def dispatch_into(
        self, program: Program, inputs: Sequence[InputBuffer], outputs: Sequence[OutputT], config: ConfigLike = None
    ) -> list[OutputT]:
        """Run and wait, writing the outputs into the caller's arrays.

        Parameters
        ----------
        program, inputs, config
            As for :meth:`dispatch`.
        outputs : sequence of OutputBuffer
            One writable, C-contiguous array per output, of the declared dtype and size (host or
            device memory); checked before anything runs.

        Returns
        -------
        list
            ``outputs`` itself, as a list.
        """
        try:
            return self._core.dispatch_into(program, inputs, outputs, config)
        except PlanMiss as exc:
            miss = exc.with_traceback(None)
        prep = self._insert_plan(miss, program)
        outputs = outputs if miss.outputs is None else miss.outputs
        return self._core.dispatch_into(program, miss.inputs, outputs, config, prep)

    def dispatch_timed(
        self, program: Program, inputs: Sequence[InputBuffer], config: ConfigLike = None
    ) -> TimedDispatchResult:
        """Run and wait, timing the dispatch.

        Parameters are those of :meth:`dispatch`.

        Returns
        -------
        TimedDispatchResult
            ``(outputs, wall_ns, device_ns, enqueue_ns, wait_ns)``.
        """
        try:
            return self._core.dispatch_timed(program, inputs, config)
        except PlanMiss as exc:
            miss = exc.with_traceback(None)
        return self._core.dispatch_timed(program, miss.inputs, config, self._insert_plan(miss, program, False))

    def _dispatch_profiled(
        self, program: Program, inputs: Sequence[InputBuffer], config: ConfigLike = None, start_ns: int = 0
    ) -> tuple[list[Any], tuple[int, ...]]:
        """(outputs, stage_ns) with stage_ns aligned with ``vyre_cuda._tracing.STAGES``."""
        try:
            return self._core.dispatch_profiled(program, inputs, config, start_ns)
        except PlanMiss as exc:
            miss = exc.with_traceback(None)
        return self._core.dispatch_profiled(program, miss.inputs, config, start_ns, self._insert_plan(miss, program))

    def _check_open(self):
        if self._closed or self._core.closed:
            raise ValidationError(
                "this CudaBackend is closed",
                "create a new CudaBackend() (or use it inside its `with` block)",
            )

    def cooperative_grid_sync_fits(
        self, program: Program, inputs: Sequence[InputBuffer], config: ConfigLike = None
    ) -> bool:
        """Whether the dispatch would run as one cooperative launch (the router's own answer).
        Parameters are those of :meth:`dispatch`."""
        self._check_open()
        cfg = as_config(config)
        lengths, _ = _backend_plans.input_lengths(self, program, inputs, cfg)

        def route():  # (counted as running, as planning is: it may load the module)
            with self._plan_lock:
                return plan_route(program, lengths, cfg, self._caps, self._modules)[-1]

        try:
            kind = self._core.counted(route).kind
        except CooperativeResidencyExceeded:
            return False  # forced cooperative over residency: it does not fit
        return kind == "cooperative"

    def plan_info(self, program: Program, inputs: Sequence[InputBuffer], config: ConfigLike = None) -> DispatchPlan:
        """The plan a dispatch of these inputs runs with (planned now if not cached).

        Parameters are those of :meth:`dispatch`; only the inputs' byte lengths (and which are
        device memory) matter. :func:`vyre_cuda.plan` makes the same plan without a GPU.
        """
        self._check_open()
        cfg = None if config is None else as_config(config)
        lengths, on_device = _backend_plans.input_lengths(self, program, inputs, as_config(cfg))

        def plan():  # (counted as running, as a dispatch's planning is: close() waits for it)
            return _backend_plans.prepare(_backend_plans.planned(self, program, lengths, cfg, on_device, inputs)).plan

        return self._core.counted(plan)

    # ------------------------------------------------------------------ planning (_backend_plans.py)
    def _insert_plan(self, miss, program, blocking=True):
        return _backend_plans.insert_plan(self, miss, program, blocking)

    def _measurer(self, program, inputs, config):
        return _backend_plans.measurer(self, program, inputs, config)

    def _plan(self, program, lengths, config, device_inputs=frozenset(), inputs=None):
        """The Prepared plan for the core (tests watch or replace it on one backend)."""
        plan = _backend_plans.planned(self, program, lengths, config, device_inputs, inputs)
        return _backend_plans.prepare(plan)

    def tune(
        self,
        program: Program,
        inputs: Sequence[InputBuffer],
        config: ConfigLike = None,
        candidates: Sequence[int] = tuning.CANDIDATES,
        *,
        repeats: int = tuning.REPEATS,
        force: bool = False,
    ) -> TuneResult:
        """Measure ``program``'s block widths on ``inputs`` and cache the fastest (opt-in autotune).

        Each allowed candidate runs once (its outputs must equal the declared width's), then
        ``repeats`` times timed; the median decides. The winner is cached per program, device and
        size class for ``DispatchConfig(autotune=True)``; a cached entry is returned without
        measuring unless ``force``. See :mod:`vyre_cuda.tuning`.

        >>> result = backend.tune(prog, [a, b])                    # doctest: +SKIP
        >>> backend.dispatch(prog, [a, b], DispatchConfig(autotune=True))  # doctest: +SKIP
        """
        return _backend_plans.tune(self, program, inputs, config, candidates, repeats=repeats, force=force)

    # ------------------------------------------------------------------ lifecycle
    def trim(self) -> None:
        """Free every cached device allocation and pinned staging buffer, the stream-ordered pool's
        unused memory, and what dropped :class:`DeviceArray` objects of this device left cached
        (the staging ring stays). Safe from any thread at any time: memory in use stays in use."""
        self._check_open()
        self._core.trim()  # (counted as a call in progress: close() waits for it)
        _hostreg.REGISTRY.release(self._holder, explicit=False)  # the automatic policy's ranges
        devarray = sys.modules.get("vyre_cuda._devarray")  # (never loaded: no DeviceArray was made)
        if devarray is not None:
            devarray.trim_array_pool(self.device)

    @contextlib.contextmanager
    def register(self, *arrays: OutputT) -> Iterator[Any]:
        """Page-lock caller-owned buffers in place for the ``with`` block, so dispatches DMA
        straight from/to them (no staging copy): ``cudaHostRegister`` with a lifetime.

        Registering costs about one copy of the buffer, so it pays for buffers reused across many
        dispatches. Registrations are shared and counted process-wide; while the block lasts the
        arrays cannot be freed or resized. On exit, once no other hold is left, vyre_cuda waits for
        the GPU work that may use them, then unregisters them. A refused registration leaves that
        buffer to staging (:func:`vyre_cuda.registered_stats` counts it).

        Yields the array (or the tuple of arrays, for several).

        >>> with backend.register(x, out):                         # doctest: +SKIP
        ...     for _ in range(100):
        ...         backend.dispatch_into(prog, [x], [out])
        """
        self._check_open()
        if not arrays:
            raise ValidationError("register() got no array", "pass the arrays to page-lock: backend.register(a, b)")
        spans = [_buffer_span(a) for a in arrays]  # all checked before any is registered
        held = []
        try:
            for a, (address, nbytes) in zip(arrays, spans):
                if nbytes and _hostreg.REGISTRY.hold(self._holder, a, address, nbytes):
                    held.append((address, nbytes))
            yield arrays[0] if len(arrays) == 1 else arrays
        finally:
            for address, nbytes in reversed(held):
                _hostreg.REGISTRY.unhold(self._holder, address, nbytes)

    def close(self) -> None:
        """Refuse new work, wait for the calls other threads are running (Ctrl-C interrupts the
        wait), then free the pools, the staging ring, the streams and the modules and release the
        context. Idempotent. The GPU work of ``dispatch_async`` handles still held is waited for
        too; the context goes back when the last of them is dropped."""
        _backend_close.close(self)

    def __del__(self):
        # (not at interpreter exit: the driver library may be gone)
        if not self.__dict__.get("_owns_context") or getattr(self, "_closed", True) or sys.is_finalizing():
            return
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 (a finalizer must not raise)
            log.warning("CudaBackend finalizer: close() failed: %s", exc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("lost" if self.lost else "open")
        return f"CudaBackend(device={self.device}, {self._caps.name}, {state})"


def _busy_probe(backend):
    """Whether ``backend`` has GPU work in flight, for the registry (weakly: the probe lives in
    the core's policy hook)."""
    ref = weakref.ref(backend)

    def busy() -> bool:
        b = ref()
        return b is not None and b._core.outstanding > 0

    return busy


def _buffer_span(obj):
    from ._windows import buffer_span  # noqa: PLC0415

    try:
        return buffer_span(obj)
    except (TypeError, ValueError, BufferError) as exc:
        raise ValidationError(
            f"register() needs a writable C-contiguous buffer (got {type(obj).__name__}: {exc})",
            "pass a numpy array (numpy.ascontiguousarray(x) for a strided one)",
        ) from None
