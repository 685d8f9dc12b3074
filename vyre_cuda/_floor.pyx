# cython: language_level=3, embedsignature=True
"""The driver floor: vyre_cuda's driver calls issued by a minimal C loop with no planning.

Every performance figure of :mod:`vyre_cuda.profile` is a ratio to this loop, measured in the
same run. The loop issues, for ``out = a + b`` on float32 buffers, exactly what a borrowed-buffer
dispatch needs and nothing else: memcpy of the caller's ``a`` and ``b`` into pinned staging, two
``cuMemcpyHtoDAsync``, ``cuMemsetD8Async`` of ``out``, ``cuLaunchKernel``, ``cuMemcpyDtoHAsync``,
``cuEventRecord``, ``cuEventSynchronize`` and a memcpy of ``out`` into the caller's array. Device
buffers, pinned staging, the stream and the event are allocated once, outside the timed loop.

Clock: ``clock_gettime(CLOCK_MONOTONIC)``, the clock behind ``time.perf_counter_ns`` on Linux.
"""

from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from cuda.bindings cimport cydriver
from cuda.bindings.cydriver cimport (
    CUDA_SUCCESS,
    CUcontext,
    CUdeviceptr,
    CUevent,
    CUfunction,
    CUmodule,
    CUresult,
    CUstream,
)

import threading

import numpy as np

from .errors import ValidationError, driver_error

__all__ = [
    "BLOCK_SIZE",
    "FLOOR_ENTRY",
    "FLOOR_SOURCE",
    "Floor",
    "FloorKernel",
    "floor_threaded",
    "monotonic_ns",
]

cdef enum:
    _BLOCK = 256  # threads per block, as in the H200 baseline

FLOOR_ENTRY = "vecadd"
BLOCK_SIZE = _BLOCK
# The plain signature the floor launches: no params block, the element count by value.
FLOOR_SOURCE = r"""
extern "C" __global__ void vecadd(const float* a, const float* b, float* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}
"""

# Staging slices start on this boundary so each copy's host side is aligned for the DMA engine.
cdef size_t _STAGING_ALIGN = 256


cdef inline int64_t _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + <int64_t>ts.tv_nsec


def monotonic_ns():
    """``clock_gettime(CLOCK_MONOTONIC)`` in ns, the floor's clock (for cross-checks)."""
    return _now()


cdef int _raise_cu(CUresult status, const char* call) except -1:
    cdef const char* name = NULL
    label = f"CUresult {<int>status}"
    try:
        if cydriver.cuGetErrorName(status, &name) == CUDA_SUCCESS and name != NULL:
            label = name.decode()
    except Exception:
        pass  # the name is decoration; the failing call and the code are what matter
    raise driver_error(label, call.decode(), int(status), "vyre_cuda driver floor")


cdef inline int _check(CUresult status, const char* call) except -1 nogil:
    # The GIL is taken only on failure, to build and raise the typed error.
    if status != CUDA_SUCCESS:
        with gil:
            _raise_cu(status, call)
    return 0


cdef inline void _note(CUresult status, const char* call, CUresult* first,
                       const char** first_call) noexcept nogil:
    if status != CUDA_SUCCESS and first[0] == CUDA_SUCCESS:
        first[0] = status
        first_call[0] = call


cdef CUcontext _context_of(handle) except? NULL:
    value = int(handle)
    if value <= 0:
        raise ValidationError(
            f"context handle must be a non-null CUcontext address (got {handle!r})",
            "pass backend.context_handle of an open CudaBackend",
        )
    return <CUcontext><uintptr_t>value


cdef class FloorKernel:
    """The floor's ``vecadd`` loaded into a context from a compiled image (PTX or cubin).

    Parameters
    ----------
    context_handle : int
        The CUcontext (as an int) to load into, e.g. ``CudaBackend.context_handle``.
    image : bytes
        What ``cuModuleLoadData`` accepts: cubin, fatbin or PTX text (NUL-terminated here).
    entry : str
        The kernel's name; it must have the signature of :data:`FLOOR_SOURCE`.
    """

    cdef CUcontext _ctx
    cdef CUmodule _module
    cdef CUfunction _func
    cdef readonly str entry

    def __cinit__(self):
        self._ctx = NULL
        self._module = NULL
        self._func = NULL

    def __init__(self, context_handle, image, str entry=FLOOR_ENTRY):
        cdef bytes data = bytes(image)
        cdef bytes name = entry.encode()
        cdef const char* data_p
        cdef const char* name_p = name
        if not data:
            raise ValidationError(
                "the floor kernel image is empty (got 0 bytes)",
                "pass the .image of vyre_cuda.compile.compile_kernel(...)",
            )
        if not data.endswith(b"\0"):
            data += b"\0"  # PTX must be NUL-terminated; a trailing byte is harmless to ELF images
        data_p = data
        self._ctx = _context_of(context_handle)
        self.entry = entry
        try:
            with nogil:
                _check(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
                _check(cydriver.cuModuleLoadData(&self._module, data_p), "cuModuleLoadData")
                _check(cydriver.cuModuleGetFunction(&self._func, self._module, name_p),
                       "cuModuleGetFunction")
        except BaseException:
            self._unload(False)
            raise

    @property
    def closed(self):
        return self._module == NULL

    cdef int _unload(self, bint check) except -1:
        cdef CUresult r1 = CUDA_SUCCESS
        cdef CUresult r2 = CUDA_SUCCESS
        if self._module == NULL:
            return 0
        with nogil:
            r1 = cydriver.cuCtxSetCurrent(self._ctx)
            r2 = cydriver.cuModuleUnload(self._module)
        self._module = NULL
        self._func = NULL
        if check:
            _check(r1, "cuCtxSetCurrent")
            _check(r2, "cuModuleUnload")
        return 0

    def close(self):
        """Unload the module. Close the :class:`Floor` objects using it first."""
        self._unload(True)

    def __dealloc__(self):
        # Never raise from a finaliser: a failed unload at teardown only leaks the module.
        cdef CUresult r
        if self._module != NULL:
            r = cydriver.cuCtxSetCurrent(self._ctx)
            r = cydriver.cuModuleUnload(self._module)
            self._module = NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


cdef class Floor:
    """One floor loop's resources: three device buffers of ``n`` float32, pinned staging for
    them, a non-blocking stream and an event, all allocated once.

    Each ``run``/``full``/``launch`` method makes the context current in the calling thread,
    then runs its whole loop with the GIL released. Use one Floor per thread.

    >>> floor = Floor(kernel, 1024)                         # doctest: +SKIP
    >>> total_ns, enqueue_ns = floor.full_pinned(a, b, out, 1000, warmup=100)  # doctest: +SKIP
    >>> floor.close()                                        # doctest: +SKIP
    """

    cdef FloorKernel _kernel
    cdef CUcontext _ctx
    cdef CUfunction _func
    cdef CUdeviceptr _d_a
    cdef CUdeviceptr _d_b
    cdef CUdeviceptr _d_out
    cdef char* _pinned
    cdef char* _h_a
    cdef char* _h_b
    cdef char* _h_out
    cdef CUstream _stream
    cdef CUevent _event
    cdef size_t _nbytes
    cdef unsigned int _n
    cdef unsigned int _grid
    cdef void* _args[4]
    cdef readonly Py_ssize_t n

    def __cinit__(self):
        self._ctx = NULL
        self._pinned = NULL
        self._stream = NULL
        self._event = NULL
        self._d_a = 0
        self._d_b = 0
        self._d_out = 0

    def __init__(self, FloorKernel kernel not None, Py_ssize_t n):
        cdef size_t stride
        if kernel.closed:
            raise ValidationError(
                "the FloorKernel is closed (its module was unloaded)",
                "create the Floor before closing its FloorKernel",
            )
        if n <= 0 or n > 0x7FFFFFFF:
            raise ValidationError(
                f"floor element count must be in 1..2,147,483,647 (got {n:,})",
                "pass a buffer size of at least 4 bytes and below 8 GiB",
            )
        self._kernel = kernel
        self._ctx = kernel._ctx
        self._func = kernel._func
        self.n = n
        self._n = <unsigned int>n
        self._nbytes = <size_t>n * sizeof(float)
        self._grid = <unsigned int>((n + _BLOCK - 1) // _BLOCK)
        stride = (self._nbytes + _STAGING_ALIGN - 1) // _STAGING_ALIGN * _STAGING_ALIGN
        self._args[0] = &self._d_a
        self._args[1] = &self._d_b
        self._args[2] = &self._d_out
        self._args[3] = &self._n
        try:
            with nogil:
                _check(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
                _check(cydriver.cuMemAlloc(&self._d_a, self._nbytes), "cuMemAlloc")
                _check(cydriver.cuMemAlloc(&self._d_b, self._nbytes), "cuMemAlloc")
                _check(cydriver.cuMemAlloc(&self._d_out, self._nbytes), "cuMemAlloc")
                _check(cydriver.cuMemHostAlloc(<void**>&self._pinned, 3 * stride, 0),
                       "cuMemHostAlloc")
                _check(cydriver.cuStreamCreate(&self._stream, cydriver.CU_STREAM_NON_BLOCKING),
                       "cuStreamCreate")
                _check(cydriver.cuEventCreate(&self._event, cydriver.CU_EVENT_DISABLE_TIMING),
                       "cuEventCreate")
        except BaseException:
            self._release_quiet()
            raise
        self._h_a = self._pinned
        self._h_b = self._pinned + stride
        self._h_out = self._pinned + 2 * stride

    @property
    def nbytes(self):
        """Bytes per buffer."""
        return self._nbytes

    @property
    def closed(self):
        return self._stream == NULL

    # -- one iteration, split where the timings split -------------------------------------
    cdef int _enqueue_pinned(self, const char* a, const char* b) except -1 nogil:
        memcpy(self._h_a, a, self._nbytes)
        memcpy(self._h_b, b, self._nbytes)
        _check(cydriver.cuMemcpyHtoDAsync(self._d_a, self._h_a, self._nbytes, self._stream),
               "cuMemcpyHtoDAsync")
        _check(cydriver.cuMemcpyHtoDAsync(self._d_b, self._h_b, self._nbytes, self._stream),
               "cuMemcpyHtoDAsync")
        _check(cydriver.cuMemsetD8Async(self._d_out, 0, self._nbytes, self._stream),
               "cuMemsetD8Async")
        _check(cydriver.cuLaunchKernel(self._func, self._grid, 1, 1, _BLOCK, 1, 1, 0,
                                       self._stream, self._args, NULL), "cuLaunchKernel")
        _check(cydriver.cuMemcpyDtoHAsync(self._h_out, self._d_out, self._nbytes, self._stream),
               "cuMemcpyDtoHAsync")
        _check(cydriver.cuEventRecord(self._event, self._stream), "cuEventRecord")
        return 0

    cdef int _finish_pinned(self, char* out) except -1 nogil:
        _check(cydriver.cuEventSynchronize(self._event), "cuEventSynchronize")
        memcpy(out, self._h_out, self._nbytes)
        return 0

    cdef int _enqueue_pageable(self, const char* a, const char* b, char* out) except -1 nogil:
        # The driver stages pageable memory itself (and may block in the copies).
        _check(cydriver.cuMemcpyHtoDAsync(self._d_a, a, self._nbytes, self._stream),
               "cuMemcpyHtoDAsync")
        _check(cydriver.cuMemcpyHtoDAsync(self._d_b, b, self._nbytes, self._stream),
               "cuMemcpyHtoDAsync")
        _check(cydriver.cuMemsetD8Async(self._d_out, 0, self._nbytes, self._stream),
               "cuMemsetD8Async")
        _check(cydriver.cuLaunchKernel(self._func, self._grid, 1, 1, _BLOCK, 1, 1, 0,
                                       self._stream, self._args, NULL), "cuLaunchKernel")
        _check(cydriver.cuMemcpyDtoHAsync(out, self._d_out, self._nbytes, self._stream),
               "cuMemcpyDtoHAsync")
        _check(cydriver.cuEventRecord(self._event, self._stream), "cuEventRecord")
        return 0

    cdef void _drain(self) noexcept:
        # After a failure mid-loop, wait for what was enqueued (copies may target the caller's
        # memory); the result is ignored, the original error is the one reported.
        cdef CUresult r
        if self._stream != NULL:
            with nogil:
                r = cydriver.cuStreamSynchronize(self._stream)

    cdef int _ready(self) except -1:
        if self._stream == NULL:
            raise ValidationError("this Floor is closed", "create a new Floor")
        return 0

    cdef int _check_counts(self, Py_ssize_t iterations, Py_ssize_t warmup) except -1:
        if iterations < 0 or warmup < 0:
            raise ValidationError(
                f"iterations and warmup must be >= 0 (got {iterations}, {warmup})",
                "pass non-negative counts",
            )
        return 0

    def _views(self, a, b, out):
        return (
            _as_f32(a, "a", self.n, False),
            _as_f32(b, "b", self.n, False),
            _as_f32(out, "out", self.n, True),
        )

    # -- the variants -------------------------------------------------------------------
    def full_pinned(self, a, b, out, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """Full dispatch through pinned staging, timed per iteration.

        Returns ``(total_ns, enqueue_ns)``, int64 arrays of length ``iterations``: the whole
        iteration (memcpy in ... memcpy out), and its enqueue part (up to and including
        ``cuEventRecord``). ``out`` holds ``a + b`` afterwards.
        """
        self._ready()
        self._check_counts(iterations, warmup)
        a, b, out = self._views(a, b, out)
        cdef const float[::1] av = a
        cdef const float[::1] bv = b
        cdef float[::1] ov = out
        cdef const char* pa = <const char*>&av[0]
        cdef const char* pb = <const char*>&bv[0]
        cdef char* po = <char*>&ov[0]
        total = np.empty(iterations, dtype=np.int64)
        enqueue = np.empty(iterations, dtype=np.int64)
        cdef int64_t* tv = _i64_data(total)
        cdef int64_t* ev = _i64_data(enqueue)
        cdef Py_ssize_t i
        cdef int64_t t0, t1, t2
        try:
            with nogil:
                _check(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
                for i in range(warmup):
                    self._enqueue_pinned(pa, pb)
                    self._finish_pinned(po)
                for i in range(iterations):
                    t0 = _now()
                    self._enqueue_pinned(pa, pb)
                    t1 = _now()
                    self._finish_pinned(po)
                    t2 = _now()
                    tv[i] = t2 - t0
                    ev[i] = t1 - t0
        except BaseException:
            self._drain()
            raise
        return total, enqueue

    def full_pageable(self, a, b, out, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """Full dispatch with H2D straight from ``a``/``b`` and D2H straight into ``out``
        (the driver's own pageable path). Returns ``(total_ns, enqueue_ns)`` like
        :meth:`full_pinned`."""
        self._ready()
        self._check_counts(iterations, warmup)
        a, b, out = self._views(a, b, out)
        cdef const float[::1] av = a
        cdef const float[::1] bv = b
        cdef float[::1] ov = out
        cdef const char* pa = <const char*>&av[0]
        cdef const char* pb = <const char*>&bv[0]
        cdef char* po = <char*>&ov[0]
        total = np.empty(iterations, dtype=np.int64)
        enqueue = np.empty(iterations, dtype=np.int64)
        cdef int64_t* tv = _i64_data(total)
        cdef int64_t* ev = _i64_data(enqueue)
        cdef Py_ssize_t i
        cdef int64_t t0, t1, t2
        try:
            with nogil:
                _check(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
                for i in range(warmup):
                    self._enqueue_pageable(pa, pb, po)
                    _check(cydriver.cuEventSynchronize(self._event), "cuEventSynchronize")
                for i in range(iterations):
                    t0 = _now()
                    self._enqueue_pageable(pa, pb, po)
                    t1 = _now()
                    _check(cydriver.cuEventSynchronize(self._event), "cuEventSynchronize")
                    t2 = _now()
                    tv[i] = t2 - t0
                    ev[i] = t1 - t0
        except BaseException:
            self._drain()
            raise
        return total, enqueue

    def launch_only(self, Py_ssize_t batches, Py_ssize_t batch_size=256,
                    Py_ssize_t warmup_batches=1):
        """Host time per ``cuLaunchKernel`` on the preallocated buffers: ``batches`` batches of
        ``batch_size`` launches, stream synchronized between batches (outside the timing).
        Returns an int64 array of ns per launch, one entry per batch."""
        self._ready()
        self._check_counts(batches, warmup_batches)
        if batch_size <= 0:
            raise ValidationError(
                f"batch_size must be >= 1 (got {batch_size})", "pass batch_size=256"
            )
        per_launch = np.empty(batches, dtype=np.int64)
        cdef int64_t* pv = _i64_data(per_launch)
        cdef Py_ssize_t i, j
        cdef int64_t t0, t1
        try:
            with nogil:
                _check(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
                for i in range(warmup_batches + batches):
                    t0 = _now()
                    for j in range(batch_size):
                        _check(cydriver.cuLaunchKernel(self._func, self._grid, 1, 1, _BLOCK,
                                                       1, 1, 0, self._stream, self._args, NULL),
                               "cuLaunchKernel")
                    t1 = _now()
                    _check(cydriver.cuStreamSynchronize(self._stream), "cuStreamSynchronize")
                    if i >= warmup_batches:
                        pv[i - warmup_batches] = (t1 - t0 + batch_size // 2) // batch_size
        except BaseException:
            self._drain()
            raise
        return per_launch

    def run_fixed(self, a, b, out, Py_ssize_t iterations):
        """``iterations`` full pinned dispatches back to back, the GIL released for the whole
        loop, no per-iteration clock. Returns ``(start_ns, end_ns)`` of the loop."""
        self._ready()
        self._check_counts(iterations, 0)
        a, b, out = self._views(a, b, out)
        cdef const float[::1] av = a
        cdef const float[::1] bv = b
        cdef float[::1] ov = out
        cdef const char* pa = <const char*>&av[0]
        cdef const char* pb = <const char*>&bv[0]
        cdef char* po = <char*>&ov[0]
        cdef Py_ssize_t i
        cdef int64_t t0, t1
        try:
            with nogil:
                _check(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
                t0 = _now()
                for i in range(iterations):
                    self._enqueue_pinned(pa, pb)
                    self._finish_pinned(po)
                t1 = _now()
        except BaseException:
            self._drain()
            raise
        return t0, t1

    # -- teardown ---------------------------------------------------------------------
    cdef void _release(self, CUresult* first, const char** first_call) noexcept nogil:
        # Wait for in-flight work (it reads the staging) before freeing anything; keep going
        # after a failure so that everything else is still freed, and remember the first one.
        if self._ctx == NULL:
            return
        _note(cydriver.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent", first, first_call)
        if self._stream != NULL:
            _note(cydriver.cuStreamSynchronize(self._stream), "cuStreamSynchronize",
                  first, first_call)
        if self._event != NULL:
            _note(cydriver.cuEventDestroy(self._event), "cuEventDestroy", first, first_call)
            self._event = NULL
        if self._stream != NULL:
            _note(cydriver.cuStreamDestroy(self._stream), "cuStreamDestroy", first, first_call)
            self._stream = NULL
        if self._d_a != 0:
            _note(cydriver.cuMemFree(self._d_a), "cuMemFree", first, first_call)
            self._d_a = 0
        if self._d_b != 0:
            _note(cydriver.cuMemFree(self._d_b), "cuMemFree", first, first_call)
            self._d_b = 0
        if self._d_out != 0:
            _note(cydriver.cuMemFree(self._d_out), "cuMemFree", first, first_call)
            self._d_out = 0
        if self._pinned != NULL:
            _note(cydriver.cuMemFreeHost(self._pinned), "cuMemFreeHost", first, first_call)
            self._pinned = NULL
            self._h_a = NULL
            self._h_b = NULL
            self._h_out = NULL

    cdef void _release_quiet(self) noexcept:
        cdef CUresult first = CUDA_SUCCESS
        cdef const char* first_call = NULL
        self._release(&first, &first_call)

    def close(self):
        """Synchronize the stream, then free the event, stream, device buffers and staging.
        Safe to call twice; raises the first driver failure after freeing everything."""
        cdef CUresult first = CUDA_SUCCESS
        cdef const char* first_call = NULL
        with nogil:
            self._release(&first, &first_call)
        if first != CUDA_SUCCESS:
            _raise_cu(first, first_call)

    def __dealloc__(self):
        # A finaliser never raises; freeing here is the fallback for a Floor never closed.
        self._release_quiet()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


cdef int64_t* _i64_data(arr) except? NULL:
    # The loops write results through a raw pointer: no bounds check inside the timed region.
    cdef int64_t[::1] view = arr
    if view.shape[0] == 0:
        return NULL
    return &view[0]


def _as_f32(x, str name, Py_ssize_t n, bint writable):
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
        raise ValidationError(
            f"floor buffer {name!r} must be a 1-D float32 numpy array "
            f"(got {type(x).__name__} {getattr(x, 'dtype', '')} ndim={getattr(x, 'ndim', '?')})",
            "pass np.ascontiguousarray(x, dtype=np.float32).ravel()",
        )
    if not x.flags.c_contiguous:
        raise ValidationError(
            f"floor buffer {name!r} must be C-contiguous", "pass np.ascontiguousarray(x)"
        )
    if x.shape[0] < n:
        raise ValidationError(
            f"floor buffer {name!r} holds {x.shape[0]:,} elements, the floor needs {n:,}",
            f"pass at least {n:,} float32 elements",
        )
    if writable and not x.flags.writeable:
        raise ValidationError(
            f"floor buffer {name!r} is read-only",
            "pass a writable array, e.g. np.empty(n, np.float32)",
        )
    return x


def floor_threaded(FloorKernel kernel not None, Py_ssize_t n, int threads,
                   Py_ssize_t iterations, Py_ssize_t warmup=0, seed=0):
    """``threads`` Python threads, each running its own :class:`Floor` (own stream, buffers,
    staging) for ``iterations`` full pinned dispatches with the GIL released for the loop.

    Setup and warm-up happen before a barrier; the timed window runs from the earliest loop
    start to the latest loop end. Returns a dict with ``threads``, ``iterations`` (per
    thread), ``start_ns``/``end_ns`` (per thread), ``elapsed_ns``, ``dispatches_per_s`` and
    ``outputs_ok`` (every thread's ``out`` equals ``a + b``).
    """
    if threads < 1 or iterations < 1:
        raise ValidationError(
            f"threads and iterations must be >= 1 (got {threads}, {iterations})",
            "pass threads=1 or 2 and a positive iteration count",
        )
    rng = np.random.default_rng(seed)
    floors = []
    data = []
    spans = [None] * threads
    errors = []
    completed = False
    try:
        for _ in range(threads):
            floors.append(Floor(kernel, n))
            data.append((
                rng.standard_normal(n, dtype=np.float32),
                rng.standard_normal(n, dtype=np.float32),
                np.zeros(n, dtype=np.float32),
            ))
        barrier = threading.Barrier(threads)

        def worker(int index):
            floor = floors[index]
            a, b, out = data[index]
            try:
                if warmup:
                    floor.run_fixed(a, b, out, warmup)
                barrier.wait()
                spans[index] = floor.run_fixed(a, b, out, iterations)
            except threading.BrokenBarrierError:
                pass  # another thread failed; its error is reported
            except BaseException as exc:  # noqa: BLE001 (re-raised in the caller's thread)
                errors.append(exc)
                barrier.abort()

        pool = [threading.Thread(target=worker, args=(i,), name=f"vyre-floor-{i}")
                for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if errors:
            raise errors[0]
        outputs_ok = all(np.array_equal(out, a + b) for a, b, out in data)
        completed = True
    finally:
        close_error = None
        for floor in floors:
            try:
                floor.close()
            except BaseException as exc:  # noqa: BLE001 (close the rest first)
                close_error = close_error or exc
        # A close failure is reported only when it is the first failure.
        if close_error is not None and completed:
            raise close_error
    start = min(s[0] for s in spans)
    end = max(s[1] for s in spans)
    elapsed = max(end - start, 1)
    return {
        "threads": threads,
        "iterations": int(iterations),
        "start_ns": [int(s[0]) for s in spans],
        "end_ns": [int(s[1]) for s in spans],
        "elapsed_ns": int(elapsed),
        "dispatches_per_s": threads * iterations * 1e9 / elapsed,
        "outputs_ok": bool(outputs_ok),
    }
