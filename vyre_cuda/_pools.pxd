from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

cdef enum:
    N_BUCKETS = 64

cdef class DevicePool:
    cdef vector[cydriver.CUdeviceptr] free_list[N_BUCKETS]
    cdef public size_t cap_bytes
    cdef public size_t cached_bytes
    cdef public size_t live_bytes
    cdef public unsigned long long hits
    cdef public unsigned long long misses
    cdef public unsigned long long allocated_bytes
    cdef public bint closed
    cdef int acquire(self, size_t bucket, cydriver.CUdeviceptr* out) except -1
    cdef void release(self, cydriver.CUdeviceptr ptr, size_t bucket) noexcept
    cdef void forget(self, size_t bucket) noexcept

cdef class PinnedPool:
    cdef vector[void*] free_list[N_BUCKETS]
    cdef public size_t cap_bytes
    cdef public size_t cached_bytes
    cdef public size_t live_bytes
    cdef public unsigned long long hits
    cdef public unsigned long long misses
    cdef public bint closed
    cdef int acquire(self, size_t bucket, void** out) except -1
    cdef void release(self, void* ptr, size_t bucket) noexcept
    cdef void forget(self, size_t bucket) noexcept

cdef class StreamPool:
    cdef vector[cydriver.CUstream] streams
    cdef vector[cydriver.CUevent] events
    cdef vector[cydriver.CUevent] timing_events
    cdef public int live_streams
    cdef public int live_events
    cdef public int created_streams
    cdef public int created_events
    cdef public unsigned int cap
    cdef public bint closed
    cdef int acquire_stream(self, cydriver.CUstream* out) except -1
    cdef void release_stream(self, cydriver.CUstream s) noexcept
    cdef int acquire_event(self, bint timing, cydriver.CUevent* out) except -1
    cdef void release_event(self, cydriver.CUevent e, bint timing) noexcept

cdef int bucket_index(size_t nbytes) noexcept nogil
