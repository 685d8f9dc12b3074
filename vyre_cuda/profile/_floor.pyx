# cython: language_level=3, embedsignature=True
"""The driver floors: what a minimal C loop of driver calls can do.

Every figure of ``vyre-cuda profile`` is a ratio to these loops or a fraction of the transfer
ceilings (:mod:`._ceilings`, on the same buffers: :class:`Floor` extends its ``Ceilings``), measured
in the same run. For ``out = a + b`` on float32 buffers, the **per-buffer floor**
(:meth:`Floor.full_pinned`) issues what a borrowed-buffer dispatch needs and nothing else: memcpy
of ``a`` and ``b`` into pinned staging, two ``cuMemcpyHtoDAsync``, ``cuMemsetD8Async``,
``cuLaunchKernel``, ``cuMemcpyDtoHAsync``, ``cuEventRecord``, ``cuEventSynchronize`` and a memcpy of
``out`` back; :meth:`Floor.full_pinned_direct` issues the same from page-locked arrays with no host
copy. The **tight floor** (:meth:`Floor.tight`) is the fewest calls a round trip can take: one
``cuMemcpyHtoDAsync`` of both inputs (adjacent in staging and on the device), the launch, one
``cuMemcpyDtoHAsync`` and one of :data:`WAITS`, issued or captured once as a graph and replayed.

The kernel is loaded once and the buffers allocated once, outside the timed loops, which run as
the ceilings' do. The runtime API never imports this module.
"""

from libc.stdint cimport int64_t
from libc.string cimport memcpy, memset

from cuda.bindings cimport cydriver
from cuda.bindings.cydriver cimport (CUDA_ERROR_NOT_READY, CUDA_SUCCESS, CUcontext, CUfunction, CUgraph,
                                     CUgraphExec, CUmodule, CUresult)

from vyre_cuda._driver cimport capture_closed, capture_open_wait, check_cu, now_ns
from vyre_cuda.profile._ceilings cimport Ceilings, as_f32, check_counts, context_of, i64_data, note

import numpy as np

from vyre_cuda import _windows
from vyre_cuda.errors import ValidationError

__all__ = ["BLOCK_SIZE", "FLOOR_ENTRY", "FLOOR_SOURCE", "WAITS", "Floor", "FloorKernel"]


cdef enum:
    _BLOCK = 256  # threads per block, as in the H200 baseline

cdef enum:  # the tight floor's waits, in the order of WAITS
    _WAIT_SPIN = 0
    _WAIT_EVENT = 1
    _WAIT_STREAM = 2

# How the tight floor waits for its round trip: record an event and spin on cuEventQuery, record an
# event and cuEventSynchronize it, or cuStreamSynchronize.
WAITS = ("spin", "event", "stream")

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

    def __init__(self, context_handle, image, str entry=FLOOR_ENTRY):
        cdef bytes data = bytes(image)
        cdef bytes name = entry.encode()
        cdef const char* data_p
        cdef const char* name_p = name
        if not data:
            raise ValidationError("the floor kernel image is empty (got 0 bytes)",
                                  "pass the .image of vyre_cuda.compile.compile_kernel(...)")
        if not data.endswith(b"\0"):
            data += b"\0"  # PTX must be NUL-terminated; a trailing byte is harmless to ELF images
        data_p = data
        self._ctx = context_of(context_handle)
        self.entry = entry
        try:
            with nogil:
                check_cu(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent")
                check_cu(cydriver.cuModuleLoadData(&self._module, data_p), b"cuModuleLoadData")
                check_cu(cydriver.cuModuleGetFunction(&self._func, self._module, name_p), b"cuModuleGetFunction")
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
            check_cu(r1, b"cuCtxSetCurrent")
            check_cu(r2, b"cuModuleUnload")
        return 0

    def close(self):
        """Unload the module. Close the :class:`Floor` objects using it first."""
        self._unload(True)

    def __dealloc__(self):
        self._unload(False)  # a finaliser never raises: a failed unload at teardown only leaks the module

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


cdef class Floor(Ceilings):
    """The floor loops on the buffers of :class:`~vyre_cuda.profile._ceilings.Ceilings`, allocated
    in the kernel's context, whose transfer ceilings it also measures (its timed methods run as a
    Ceilings' do: one Floor per thread); the tight floor's graph is captured at its first use.

    >>> floor = Floor(kernel, 1024)                         # doctest: +SKIP
    >>> total_ns, enqueue_ns = floor.full_pinned(a, b, out, 1000, warmup=100)  # doctest: +SKIP
    >>> floor.close()                                        # doctest: +SKIP
    """

    cdef FloorKernel _kernel
    cdef CUfunction _func
    cdef CUgraphExec _exec  # the tight floor's round trip as a graph (NULL until first used)
    cdef unsigned int _n
    cdef unsigned int _grid
    cdef void* _args[4]

    def __init__(self, FloorKernel kernel not None, Py_ssize_t n):
        if kernel.closed:
            raise ValidationError("the FloorKernel is closed (its module was unloaded)",
                                  "create the Floor before closing its FloorKernel")
        self._allocate(kernel._ctx, n)
        self._kernel = kernel
        self._func = kernel._func
        self._n = <unsigned int>n
        self._grid = <unsigned int>((n + _BLOCK - 1) // _BLOCK)
        self._args[0] = &self._d_a
        self._args[1] = &self._d_b
        self._args[2] = &self._d_out
        self._args[3] = &self._n

    # -- one iteration, split where the timings split -------------------------------------
    cdef int _enqueue(self, const char* a, const char* b, char* out, bint pageable) except -1 nogil:
        # Straight from and into the host memory given (the pinned staging, or the caller's arrays).
        # Pageable: the driver stages them itself (and may block in the copies), out is cleared and
        # an event recorded, as a dispatch does. Page-locked arrays: they are the DMA's host side,
        # nothing is copied on the host, and the kernel writes every element of out, so nothing is
        # cleared either.
        check_cu(cydriver.cuMemcpyHtoDAsync(self._d_a, a, self._nbytes, self._stream), b"cuMemcpyHtoDAsync")
        check_cu(cydriver.cuMemcpyHtoDAsync(self._d_b, b, self._nbytes, self._stream), b"cuMemcpyHtoDAsync")
        if pageable:
            check_cu(cydriver.cuMemsetD8Async(self._d_out, 0, self._nbytes, self._stream), b"cuMemsetD8Async")
        self._launch()
        check_cu(cydriver.cuMemcpyDtoHAsync(out, self._d_out, self._nbytes, self._stream), b"cuMemcpyDtoHAsync")
        if pageable:
            check_cu(cydriver.cuEventRecord(self._event, self._stream), b"cuEventRecord")
        return 0

    cdef inline int _launch(self) except -1 nogil:
        check_cu(cydriver.cuLaunchKernel(self._func, self._grid, 1, 1, _BLOCK, 1, 1, 0,
                                         self._stream, self._args, NULL), b"cuLaunchKernel")
        return 0

    cdef int _loop(self, int variant, const char* pa, const char* pb, char* po,
                   Py_ssize_t iterations, Py_ssize_t warmup, int64_t* tv,
                   int64_t* ev) except -1 nogil:
        # variant 0: full through pinned staging (a and b copied into it, out copied back after
        # the event); 1: the driver's pageable path; 2: issued from page-locked arrays (DMA
        # straight from and into them, then a stream synchronize).
        cdef Py_ssize_t i
        cdef unsigned long long t0, t1
        check_cu(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent")
        for i in range(warmup + iterations):
            t0 = now_ns()
            if variant == 0:
                memcpy(self._h_a, pa, self._nbytes)
                memcpy(self._h_b, pb, self._nbytes)
                self._enqueue(self._h_a, self._h_b, self._h_out, True)
            else:
                self._enqueue(pa, pb, po, variant == 1)
            t1 = now_ns()
            if variant == 2:
                check_cu(cydriver.cuStreamSynchronize(self._stream), b"cuStreamSynchronize")
            else:
                check_cu(cydriver.cuEventSynchronize(self._event), b"cuEventSynchronize")
            if variant == 0:
                memcpy(po, self._h_out, self._nbytes)
            if i >= warmup:
                tv[i - warmup] = <int64_t>(now_ns() - t0)
                ev[i - warmup] = <int64_t>(t1 - t0)
        return 0

    def _timed(self, int variant, a, b, out, Py_ssize_t iterations, Py_ssize_t warmup):
        # (total_ns, enqueue_ns) of one of _loop's variants
        self._ready()
        check_counts(iterations, warmup)
        a, b, out = self._views(a, b, out)
        cdef const float[::1] av = a
        cdef const float[::1] bv = b
        cdef float[::1] ov = out
        cdef const char* pa = <const char*>&av[0]
        cdef const char* pb = <const char*>&bv[0]
        cdef char* po = <char*>&ov[0]
        total = np.empty(iterations, dtype=np.int64)
        enqueue = np.empty(iterations, dtype=np.int64)
        cdef int64_t* tv = i64_data(total)
        cdef int64_t* ev = i64_data(enqueue)
        try:
            with nogil:
                self._loop(variant, pa, pb, po, iterations, warmup, tv, ev)
        except BaseException:
            self._drain()
            raise
        return total, enqueue

    def _views(self, a, b, out):
        return (as_f32(a, "a", self.n, False), as_f32(b, "b", self.n, False), as_f32(out, "out", self.n, True))

    # -- the floor ------------------------------------------------------------------------
    def full_pinned(self, a, b, out, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """Full dispatch through pinned staging, timed per iteration.

        Returns ``(total_ns, enqueue_ns)``, int64 arrays of length ``iterations``: the whole
        iteration (memcpy in ... memcpy out), and its enqueue part (up to and including
        ``cuEventRecord``). ``out`` holds ``a + b`` afterwards.
        """
        return self._timed(0, a, b, out, iterations, warmup)

    def full_pageable(self, a, b, out, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """Full dispatch with H2D straight from ``a``/``b`` and D2H straight into ``out``
        (the driver's own pageable path). Returns ``(total_ns, enqueue_ns)`` like
        :meth:`full_pinned`."""
        return self._timed(1, a, b, out, iterations, warmup)

    def full_pinned_direct(self, a, b, out, Py_ssize_t iterations, Py_ssize_t warmup=0):
        """Full dispatch from page-locked ``a`` and ``b`` into page-locked ``out`` (e.g.
        ``vyre_cuda.pinned_empty`` arrays): two ``cuMemcpyHtoDAsync`` straight from them,
        ``cuLaunchKernel``, ``cuMemcpyDtoHAsync`` straight into ``out`` and
        ``cuStreamSynchronize``, issued one by one with no host memcpy.

        Returns ``(total_ns, enqueue_ns)`` like :meth:`full_pinned`. Raises ValidationError when
        an array is not page-locked (the driver would stage it: not this floor).
        """
        for name, x in (("a", a), ("b", b), ("out", out)):
            as_f32(x, name, self.n, name == "out")
            if not _windows.is_page_locked_address(x.ctypes.data, self._nbytes):
                raise ValidationError(
                    f"floor buffer {name!r} is not page-locked memory ({self._nbytes:,} bytes at "
                    f"0x{x.ctypes.data:x})",
                    "pass arrays from vyre_cuda.pinned_empty (or registered with CudaBackend.register)",
                )
        return self._timed(2, a, b, out, iterations, warmup)

    def launch_only(self, Py_ssize_t batches, Py_ssize_t batch_size=256, Py_ssize_t warmup_batches=1):
        """Host time per ``cuLaunchKernel`` on the preallocated buffers: ``batches`` batches of
        ``batch_size`` launches, stream synchronized between batches (outside the timing).
        Returns an int64 array of ns per launch, one entry per batch."""
        self._ready()
        check_counts(batches, warmup_batches)
        if batch_size <= 0:
            raise ValidationError(f"batch_size must be >= 1 (got {batch_size})", "pass batch_size=256")
        per_launch = np.empty(batches, dtype=np.int64)
        cdef int64_t* pv = i64_data(per_launch)
        cdef Py_ssize_t i, _j
        cdef unsigned long long t0, t1
        try:
            with nogil:
                check_cu(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent")
                for i in range(warmup_batches + batches):
                    t0 = now_ns()
                    for _j in range(batch_size):
                        self._launch()
                    t1 = now_ns()
                    check_cu(cydriver.cuStreamSynchronize(self._stream), b"cuStreamSynchronize")
                    if i >= warmup_batches:
                        pv[i - warmup_batches] = <int64_t>((t1 - t0 + batch_size // 2)
                                                           // batch_size)
        except BaseException:
            self._drain()
            raise
        return per_launch

    # -- the tight floor ------------------------------------------------------------------
    cdef inline int _tight_issue(self) except -1 nogil:
        # both inputs in one copy (staging and device hold them at the same offsets), the launch,
        # the output back
        check_cu(cydriver.cuMemcpyHtoDAsync(self._d_a, self._h_a, self._in_span, self._stream), b"cuMemcpyHtoDAsync")
        self._launch()
        check_cu(cydriver.cuMemcpyDtoHAsync(self._h_out, self._d_out, self._nbytes, self._stream), b"cuMemcpyDtoHAsync")
        return 0

    cdef inline int _tight_wait(self, int wait) except -1 nogil:
        cdef CUresult st
        if wait == _WAIT_STREAM:
            check_cu(cydriver.cuStreamSynchronize(self._stream), b"cuStreamSynchronize")
            return 0
        check_cu(cydriver.cuEventRecord(self._event, self._stream), b"cuEventRecord")
        if wait == _WAIT_EVENT:
            check_cu(cydriver.cuEventSynchronize(self._event), b"cuEventSynchronize")
            return 0
        st = cydriver.cuEventQuery(self._event)
        while st == CUDA_ERROR_NOT_READY:
            st = cydriver.cuEventQuery(self._event)
        check_cu(st, b"cuEventQuery")
        return 0

    cdef int _capture(self) except -1:
        # The tight round trip captured once on the floor's stream (thread-local mode: other
        # threads' floors go on issuing meanwhile), instantiated, the graph itself dropped.
        cdef CUresult ended
        cdef CUgraph graph = NULL
        cdef CUgraphExec ex = NULL
        if self._exec != NULL:
            return 0
        with nogil:
            check_cu(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent")
            capture_open_wait()  # through the core's capture gate: no synchronize of its runs meanwhile
            try:
                check_cu(cydriver.cuStreamBeginCapture(self._stream, cydriver.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                         b"cuStreamBeginCapture")
                try:
                    self._tight_issue()
                finally:  # always ended, so that the stream leaves capture mode whatever failed
                    ended = cydriver.cuStreamEndCapture(self._stream, &graph)
                check_cu(ended, b"cuStreamEndCapture")
                check_cu(cydriver.cuGraphInstantiate(&ex, graph, 0), b"cuGraphInstantiateWithFlags")
            finally:
                if graph != NULL:
                    cydriver.cuGraphDestroy(graph)  # the exec holds its own copy
                capture_closed()
        self._exec = ex
        return 0

    cdef int _tight_loop(self, int wait, bint graph, Py_ssize_t iterations, Py_ssize_t warmup,
                         int64_t* tv) except -1 nogil:
        cdef Py_ssize_t i
        cdef unsigned long long t0
        check_cu(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent")
        for i in range(warmup + iterations):
            t0 = now_ns()
            if graph:
                check_cu(cydriver.cuGraphLaunch(self._exec, self._stream), b"cuGraphLaunch")
            else:
                self._tight_issue()
            self._tight_wait(wait)
            if i >= warmup:
                tv[i - warmup] = <int64_t>(now_ns() - t0)
        return 0

    def tight(self, a, b, out, Py_ssize_t iterations, Py_ssize_t warmup=0, str wait="spin", bint graph=False):
        """The tight floor, timed per round trip: one ``cuMemcpyHtoDAsync`` of both inputs,
        ``cuLaunchKernel``, one ``cuMemcpyDtoHAsync``, then ``wait`` (one of :data:`WAITS`);
        with ``graph=True`` those three calls captured once as a CUDA graph and replayed
        (``cuGraphLaunch``) before the wait.

        ``a`` and ``b`` are copied into the page-locked staging before the loop and the output
        copied into ``out`` after it (neither timed). Returns int64 ns per round trip.
        """
        self._ready()
        check_counts(iterations, warmup)
        if wait not in WAITS:
            raise ValidationError(f"the tight floor's wait must be one of {', '.join(WAITS)} (got {wait!r})",
                                  "pass wait='spin', 'event' or 'stream'")
        cdef int w = WAITS.index(wait)
        a, b, out = self._views(a, b, out)
        cdef const float[::1] av = a
        cdef const float[::1] bv = b
        cdef float[::1] ov = out
        total = np.empty(iterations, dtype=np.int64)
        cdef int64_t* tv = i64_data(total)
        if graph:
            self._capture()
        # the inputs into the page-locked staging and the output cleared there, untimed: the
        # timed round trips start from page-locked memory
        memcpy(self._h_a, &av[0], self._nbytes)
        memcpy(self._h_b, &bv[0], self._nbytes)
        memset(self._h_out, 0, self._nbytes)
        try:
            with nogil:
                self._tight_loop(w, graph, iterations, warmup, tv)
        except BaseException:
            self._drain()
            raise
        memcpy(&ov[0], self._h_out, self._nbytes)
        return total

    # -- teardown ---------------------------------------------------------------------
    cdef void _release(self, CUresult* first, const char** first_call) noexcept nogil:
        # the graph after the stream's work (a replay reads the staging), then the ceilings' buffers
        if self._exec != NULL:
            note(cydriver.cuCtxSetCurrent(self._ctx), b"cuCtxSetCurrent", first, first_call)
            note(cydriver.cuStreamSynchronize(self._stream), b"cuStreamSynchronize", first, first_call)
            note(cydriver.cuGraphExecDestroy(self._exec), b"cuGraphExecDestroy", first, first_call)
            self._exec = NULL
        Ceilings._release(self, first, first_call)
