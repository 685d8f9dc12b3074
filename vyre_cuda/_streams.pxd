from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver


cdef class StreamPool:
    cdef mutex mu  # guards the vectors and counters
    cdef cydriver.CUcontext ctx
    cdef vector[cydriver.CUstream] streams
    cdef vector[cydriver.CUevent] events
    cdef vector[cydriver.CUevent] timing_events
    cdef int live_streams
    cdef int live_events
    cdef int created_streams
    cdef int created_events
    cdef public unsigned int cap
    cdef public unsigned int event_cap
    cdef public bint closed
    cdef int acquire_stream(self, cydriver.CUstream* out) except -1
    cdef void release_stream(self, cydriver.CUstream s) noexcept
    cdef int acquire_event(self, bint timing, cydriver.CUevent* out) except -1
    cdef void release_event(self, cydriver.CUevent e, bint timing) noexcept
    cdef void forget(self, int streams, int events) noexcept
    cdef void _destroy_cached(self) noexcept
