from libcpp.mutex cimport mutex
from libcpp.unordered_map cimport unordered_map
from libcpp.unordered_set cimport unordered_set
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
    # streams shared once this many are lent (0: every dispatch has a stream of its own)
    cdef public unsigned int share_after
    cdef vector[cydriver.CUstream] ring  # the shareable streams lent now, in lending order
    cdef unordered_map[cydriver.CUstream, int] holders  # a ring stream's holders
    cdef unordered_set[cydriver.CUstream] written_off  # shared streams a holder could not prove idle
    cdef size_t next_share
    cdef int acquire_stream(self, cydriver.CUstream* out, bint shareable=*) except -1
    cdef void _lend(self, cydriver.CUstream s, bint shareable) noexcept
    cdef void _unring(self, cydriver.CUstream s) noexcept
    cdef bint _release_share(self, cydriver.CUstream s) noexcept
    cdef void forget_stream(self, cydriver.CUstream s) noexcept
    cdef void release_stream(self, cydriver.CUstream s) noexcept
    cdef int acquire_event(self, bint timing, cydriver.CUevent* out) except -1
    cdef void release_event(self, cydriver.CUevent e, bint timing) noexcept
    cdef void forget(self, int streams, int events) noexcept
    cdef void _destroy_cached(self) noexcept
