"""The buffers the driver floors share with the ceilings (``_floor.Floor`` extends
:class:`Ceilings`), and the checks of both modules' timed methods."""

from libc.stdint cimport int64_t

from cuda.bindings.cydriver cimport CUcontext, CUdeviceptr, CUevent, CUresult, CUstream


cdef int check_counts(Py_ssize_t iterations, Py_ssize_t warmup) except -1
cdef int64_t* i64_data(arr) except? NULL
cdef object as_f32(x, str name, Py_ssize_t n, bint writable)
cdef void note(CUresult status, const char* call, CUresult* first, const char** first_call) noexcept nogil
cdef CUcontext context_of(handle) except? NULL


cdef class Ceilings:
    cdef CUcontext _ctx
    cdef CUdeviceptr _d_a  # the inputs' allocation: a, then b at _d_a + stride
    cdef CUdeviceptr _d_b
    cdef CUdeviceptr _d_out
    cdef size_t _in_span  # bytes from the start of a to the end of b (staging and device alike)
    cdef char* _pinned
    cdef char* _h_a
    cdef char* _h_b
    cdef char* _h_out
    cdef CUstream _stream
    cdef CUevent _event
    cdef CUstream _stream2  # the both-directions ceiling's readback runs here
    cdef CUevent _event2
    cdef size_t _nbytes
    cdef readonly Py_ssize_t n

    cdef int _allocate(self, CUcontext ctx, Py_ssize_t n) except -1
    cdef void _drain(self) noexcept
    cdef int _ready(self) except -1
    cdef int _dma_loop(self, int variant, Py_ssize_t iterations, Py_ssize_t warmup, int64_t* tv) except -1 nogil
    cdef void _release(self, CUresult* first, const char** first_call) noexcept nogil
    cdef void _release_quiet(self) noexcept
