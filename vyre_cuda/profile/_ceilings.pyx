# cython: language_level=3, embedsignature=True
"""The transfer ceilings: what the DMA engines and the host's memcpy can do with a dispatch's bytes.

:class:`Ceilings` holds the bytes of one ``out = a + b`` on float32 buffers, allocated once: three
device buffers (the two inputs next to each other in one allocation), pinned staging for them
(likewise), two non-blocking streams with an event each. Its **ceilings** move the same bytes: DMA
from and to pinned memory (each direction alone, both at once on two streams), and host memcpy
between pageable and pinned memory on 1 or N threads through the core's own copy pool
(``vyre_cuda/_transfer.hpp``, threads started once per measurement). The driver floors
(:class:`vyre_cuda.profile._floor.Floor`) extend it, so that a floor and its ceilings run on the same
memory. Every loop runs with the GIL released and is timed with the core's clock
(``vyre_cuda._driver.now_ns``). The runtime API never imports this module.
"""

from libc.stdint cimport int64_t, uintptr_t

from cuda.bindings cimport cydriver
from cuda.bindings.cydriver cimport CUDA_SUCCESS, CUcontext, CUresult

from vyre_cuda._driver cimport check_cu, now_ns, raise_cu
from vyre_cuda._transfer cimport CopyPool
from vyre_cuda._windows cimport CopyTask

import numpy as np

from vyre_cuda.errors import ValidationError

__all__ = ["Ceilings"]


# Staging slices start on this boundary so each copy's host side is aligned for the DMA engine.
cdef size_t _STAGING_ALIGN = 256
cdef int _MAX_THREADS = 256  # of a host memcpy ceiling

cdef enum:  # the DMA ceilings' variants of Ceilings._dma_loop
    _H2D = 0
    _D2H = 1
    _BOTH = 2


cdef int check_counts(Py_ssize_t iterations, Py_ssize_t warmup) except -1:
    if iterations < 0 or warmup < 0:
        raise ValidationError(f"iterations and warmup must be >= 0 (got {iterations}, {warmup})",
                              "pass non-negative counts")
    return 0


cdef int64_t* i64_data(arr) except? NULL:
    # The loops write results through a raw pointer: no bounds check inside the timed region.
    cdef int64_t[::1] view = arr
    if view.shape[0] == 0:
        return NULL
    return &view[0]


cdef void note(CUresult status, const char* call, CUresult* first, const char** first_call) noexcept nogil:
    if status != CUDA_SUCCESS and first[0] == CUDA_SUCCESS:
        first[0] = status
        first_call[0] = call


cdef CUcontext context_of(handle) except? NULL:
    value = int(handle)
    if value <= 0:
        raise ValidationError(f"context handle must be a non-null CUcontext address (got {handle!r})",
                              "pass backend.context_handle of an open CudaBackend")
    return <CUcontext><uintptr_t>value


cdef object as_f32(x, str name, Py_ssize_t n, bint writable):
    if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 1:
        raise ValidationError(
            f"floor buffer {name!r} must be a 1-D float32 numpy array "
            f"(got {type(x).__name__} {getattr(x, 'dtype', '')} ndim={getattr(x, 'ndim', '?')})",
            "pass np.ascontiguousarray(x, dtype=np.float32).ravel()",
        )
    if not x.flags.c_contiguous:
        raise ValidationError(f"floor buffer {name!r} must be C-contiguous", "pass np.ascontiguousarray(x)")
    if x.shape[0] < n:
        raise ValidationError(f"floor buffer {name!r} holds {x.shape[0]:,} elements, the floor needs {n:,}",
                              f"pass at least {n:,} float32 elements")
    if writable and not x.flags.writeable:
        raise ValidationError(f"floor buffer {name!r} is read-only",
                              "pass a writable array, e.g. np.empty(n, np.float32)")
    return x


cdef object copy_passes(CopyTask* tasks, int count, int threads, Py_ssize_t iterations, Py_ssize_t warmup):
    # warmup + iterations passes of the copies, each split over `threads` threads of the core's copy
    # pool (the caller and threads - 1 workers, started by an untimed pass); ns of each timed pass.
    if threads < 1 or threads > _MAX_THREADS:
        raise ValidationError(f"copy threads must be in 1..{_MAX_THREADS} (got {threads})",
                              "pass threads=1 for one thread, or the number of cores to use")
    check_counts(iterations, warmup)
    times = np.empty(iterations, dtype=np.int64)
    cdef int64_t* tv = i64_data(times)
    cdef CopyPool pool
    cdef Py_ssize_t i
    cdef unsigned long long t0
    with nogil:
        pool.configure(threads - 1, 1)  # split every pass, however small
        if threads > 1:
            pool.run(tasks, count, False)  # starts the workers: never inside a timed pass
        for i in range(warmup + iterations):
            t0 = now_ns()
            pool.run(tasks, count, False)
            if i >= warmup:
                tv[i - warmup] = <int64_t>(now_ns() - t0)
        pool.stop()
    return times


cdef class Ceilings:
    """The buffers of a vecadd of ``n`` float32 per buffer (see the module) in the CUcontext
    ``context_handle`` (an int, e.g. ``CudaBackend.context_handle``), and the transfer ceilings on
    them. Each timed method makes the context current in the calling thread, then runs its whole
    loop with the GIL released. Use one Ceilings (or Floor) per thread.

    >>> with Ceilings(backend.context_handle, 1024) as ceilings:   # doctest: +SKIP
    ...     up_ns = ceilings.dma_h2d(100, warmup=10)
    """

    def __init__(self, context_handle, Py_ssize_t n):
        self._allocate(context_of(context_handle), n)

    cdef int _allocate(self, CUcontext ctx, Py_ssize_t n) except -1:
        cdef size_t stride
        if n <= 0 or n > 0x7FFFFFFF:
            raise ValidationError(f"floor element count must be in 1..2,147,483,647 (got {n:,})",
                                  "pass a buffer size of at least 4 bytes and below 8 GiB")
        self._ctx = ctx
        self.n = n
        self._nbytes = <size_t>n * sizeof(float)
        stride = (self._nbytes + _STAGING_ALIGN - 1) // _STAGING_ALIGN * _STAGING_ALIGN
        self._in_span = stride + self._nbytes
        try:
            with nogil:
                check_cu(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent")
                check_cu(cydriver.cuMemAlloc(&self._d_a, 2 * stride), b"cuMemAlloc")
                self._d_b = self._d_a + stride
                check_cu(cydriver.cuMemAlloc(&self._d_out, self._nbytes), b"cuMemAlloc")
                check_cu(cydriver.cuMemHostAlloc(<void**>&self._pinned, 3 * stride, 0), b"cuMemHostAlloc")
                check_cu(cydriver.cuStreamCreate(&self._stream, cydriver.CU_STREAM_NON_BLOCKING), b"cuStreamCreate")
                check_cu(cydriver.cuEventCreate(&self._event, cydriver.CU_EVENT_DISABLE_TIMING), b"cuEventCreate")
                check_cu(cydriver.cuStreamCreate(&self._stream2, cydriver.CU_STREAM_NON_BLOCKING), b"cuStreamCreate")
                check_cu(cydriver.cuEventCreate(&self._event2, cydriver.CU_EVENT_DISABLE_TIMING), b"cuEventCreate")
        except BaseException:
            self._release_quiet()
            raise
        self._h_a = self._pinned
        self._h_b = self._pinned + stride
        self._h_out = self._pinned + 2 * stride
        return 0

    @property
    def nbytes(self):
        """Bytes per buffer."""
        return self._nbytes

    @property
    def closed(self):
        return self._stream == NULL

    cdef void _drain(self) noexcept:
        # After a failure mid-loop, wait for what was enqueued (copies may target the caller's
        # memory); the result is ignored, the original error is the one reported.
        with nogil:
            if self._stream != NULL:
                cydriver.cuStreamSynchronize(self._stream)
            if self._stream2 != NULL:
                cydriver.cuStreamSynchronize(self._stream2)

    cdef int _ready(self) except -1:
        if self._stream == NULL:
            raise ValidationError(f"this {type(self).__name__} is closed", f"create a new {type(self).__name__}")
        return 0

    # -- the ceilings ---------------------------------------------------------------------
    cdef int _dma_loop(self, int variant, Py_ssize_t iterations, Py_ssize_t warmup, int64_t* tv) except -1 nogil:
        # _H2D: the upload (both inputs, pinned -> device); _D2H: the readback; _BOTH: both at once,
        # the upload on the stream and the readback on the second stream
        cdef Py_ssize_t i
        cdef unsigned long long t0
        check_cu(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent")
        for i in range(warmup + iterations):
            t0 = now_ns()
            if variant == _D2H:
                check_cu(cydriver.cuMemcpyDtoHAsync(self._h_out, self._d_out, self._nbytes,
                                                    self._stream), b"cuMemcpyDtoHAsync")
            else:
                check_cu(cydriver.cuMemcpyHtoDAsync(self._d_a, self._h_a, self._nbytes, self._stream),
                         b"cuMemcpyHtoDAsync")
                check_cu(cydriver.cuMemcpyHtoDAsync(self._d_b, self._h_b, self._nbytes, self._stream),
                         b"cuMemcpyHtoDAsync")
            check_cu(cydriver.cuEventRecord(self._event, self._stream), b"cuEventRecord")
            if variant == _BOTH:
                check_cu(cydriver.cuMemcpyDtoHAsync(self._h_out, self._d_out, self._nbytes, self._stream2),
                         b"cuMemcpyDtoHAsync")
                check_cu(cydriver.cuEventRecord(self._event2, self._stream2), b"cuEventRecord")
            check_cu(cydriver.cuEventSynchronize(self._event), b"cuEventSynchronize")
            if variant == _BOTH:
                check_cu(cydriver.cuEventSynchronize(self._event2), b"cuEventSynchronize")
            if i >= warmup:
                tv[i - warmup] = <int64_t>(now_ns() - t0)
        return 0

    def _dma(self, int variant, Py_ssize_t iterations, Py_ssize_t warmup):
        self._ready()
        check_counts(iterations, warmup)
        times = np.empty(iterations, dtype=np.int64)
        cdef int64_t* tv = i64_data(times)
        try:
            with nogil:
                self._dma_loop(variant, iterations, warmup, tv)
        except BaseException:
            self._drain()
            raise
        return times

    def dma_h2d(self, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """DMA ceiling, upload: both input buffers from pinned staging to the device (two
        ``cuMemcpyHtoDAsync``, an event, its synchronize). Returns int64 ns per upload."""
        return self._dma(_H2D, iterations, warmup)

    def dma_d2h(self, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """DMA ceiling, readback: the output buffer from the device into pinned staging.
        Returns int64 ns per readback."""
        return self._dma(_D2H, iterations, warmup)

    def dma_both(self, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """DMA ceiling, both directions at once: the upload of both inputs on one stream and
        the readback of the output on another, issued together and both waited for (the
        dispatch's bytes: 2 x n up, n down). Returns int64 ns per pair."""
        return self._dma(_BOTH, iterations, warmup)

    def copy_in(self, a, b, int threads, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """Host memcpy ceiling, pageable -> pinned: ``a`` and ``b`` into the pinned staging
        with ``threads`` threads. Returns int64 ns per pass (both buffers)."""
        self._ready()
        cdef const float[::1] av = as_f32(a, "a", self.n, False)
        cdef const float[::1] bv = as_f32(b, "b", self.n, False)
        cdef CopyTask tasks[2]
        tasks[0].dst, tasks[0].src, tasks[0].n = self._h_a, <const char*>&av[0], self._nbytes
        tasks[1].dst, tasks[1].src, tasks[1].n = self._h_b, <const char*>&bv[0], self._nbytes
        return copy_passes(tasks, 2, threads, iterations, warmup)

    def copy_out(self, out, int threads, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """Host memcpy ceiling, pinned -> pageable: the pinned output staging into ``out``
        with ``threads`` threads. Returns int64 ns per pass."""
        self._ready()
        cdef float[::1] ov = as_f32(out, "out", self.n, True)
        cdef CopyTask task
        task.dst, task.src, task.n = <char*>&ov[0], self._h_out, self._nbytes
        return copy_passes(&task, 1, threads, iterations, warmup)

    # -- teardown ---------------------------------------------------------------------
    cdef void _release(self, CUresult* first, const char** first_call) noexcept nogil:
        # Wait for in-flight work (it reads the staging) before freeing anything; keep going
        # after a failure so that everything else is still freed, and remember the first one.
        if self._ctx == NULL:
            return
        note(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent", first, first_call)
        if self._stream != NULL:
            note(cydriver.cuStreamSynchronize(self._stream), b"cuStreamSynchronize", first, first_call)
        if self._stream2 != NULL:
            note(cydriver.cuStreamSynchronize(self._stream2), b"cuStreamSynchronize", first, first_call)
        if self._event2 != NULL:
            note(cydriver.cuEventDestroy(self._event2), b"cuEventDestroy", first, first_call)
        if self._stream2 != NULL:
            note(cydriver.cuStreamDestroy(self._stream2), b"cuStreamDestroy", first, first_call)
        if self._event != NULL:
            note(cydriver.cuEventDestroy(self._event), b"cuEventDestroy", first, first_call)
        if self._stream != NULL:
            note(cydriver.cuStreamDestroy(self._stream), b"cuStreamDestroy", first, first_call)
        self._event = self._event2 = NULL
        self._stream = self._stream2 = NULL
        if self._d_a != 0:  # b lies in the same allocation
            note(cydriver.cuMemFree(self._d_a), b"cuMemFree", first, first_call)
            self._d_a = self._d_b = 0
        if self._d_out != 0:
            note(cydriver.cuMemFree(self._d_out), b"cuMemFree", first, first_call)
            self._d_out = 0
        if self._pinned != NULL:
            note(cydriver.cuMemFreeHost(self._pinned), b"cuMemFreeHost", first, first_call)
            self._pinned = self._h_a = self._h_b = self._h_out = NULL

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
            raise_cu(first, first_call)

    def __dealloc__(self):
        # A finaliser never raises; freeing here is the fallback for one never closed.
        self._release_quiet()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
