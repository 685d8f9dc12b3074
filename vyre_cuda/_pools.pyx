# cython: language_level=3
"""Pools: device memory and pinned host staging in power-of-two buckets, streams and events.

Bookkeeping runs with the GIL held (it is a few C operations), so pools need no lock of their
own; the driver calls that allocate or free run with the GIL released.
"""

from cuda.bindings cimport cydriver

from ._driver cimport check_cu
from .errors import DeviceOutOfMemory


cdef inline bint _cacheable(size_t bucket) noexcept nogil:
    # power-of-two buckets are cached; the 64 MiB multiples above 1 GiB are allocated exactly
    return bucket != 0 and (bucket & (bucket - 1)) == 0


cdef int bucket_index(size_t nbytes) noexcept nogil:
    # bucket k holds 2**k bytes
    cdef int k = 0
    while (<size_t>1 << k) < nbytes and k < N_BUCKETS - 1:
        k += 1
    return k


def _fmt(n):
    return f"{n:,}"


cdef class DevicePool:
    """Power-of-two cache of device allocations, bounded by ``cap_bytes`` of cached memory.

    Before a new allocation the request is checked against a budget of 90% of the free device
    memory; over it, the cache is trimmed and the budget rechecked, then the request refused.
    """

    def __cinit__(self, size_t cap_bytes=256 << 20):
        self.cap_bytes = cap_bytes

    cdef int acquire(self, size_t bucket, cydriver.CUdeviceptr* out) except -1:
        cdef int k = bucket_index(bucket)
        cdef cydriver.CUdeviceptr ptr = 0
        cdef cydriver.CUresult status
        cdef size_t free_b = 0, total_b = 0
        if _cacheable(bucket) and not self.free_list[k].empty():
            out[0] = self.free_list[k].back()
            self.free_list[k].pop_back()
            self.cached_bytes -= bucket
            self.live_bytes += bucket
            self.hits += 1
            return 0
        self.misses += 1
        with nogil:
            check_cu(cydriver.cuMemGetInfo(&free_b, &total_b), b"cuMemGetInfo")
        if bucket > free_b - free_b // 10 and self.cached_bytes:
            self.trim()
            with nogil:
                check_cu(cydriver.cuMemGetInfo(&free_b, &total_b), b"cuMemGetInfo")
        if bucket > free_b - free_b // 10:
            raise DeviceOutOfMemory(
                f"the dispatch needs {_fmt(bucket)} bytes of device memory (one pool bucket) but "
                f"the budget is {_fmt(free_b - free_b // 10)} bytes (90% of {_fmt(free_b)} free of "
                f"{_fmt(total_b)} total)",
                "free device memory held elsewhere, or split the dispatch into bounded chunks",
                status="budget", call="DevicePool.acquire",
            )
        with nogil:
            status = cydriver.cuMemAlloc(&ptr, bucket)
        if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            self.trim()
            with nogil:
                status = cydriver.cuMemAlloc(&ptr, bucket)
        check_cu(status, b"cuMemAlloc")
        self.live_bytes += bucket
        self.allocated_bytes += bucket
        out[0] = ptr
        return 0

    cdef void release(self, cydriver.CUdeviceptr ptr, size_t bucket) noexcept:
        cdef int k = bucket_index(bucket)
        self.live_bytes -= bucket
        if (not self.closed and _cacheable(bucket) and self.cached_bytes + bucket <= self.cap_bytes
                and self.free_list[k].size() < 1024):
            self.free_list[k].push_back(ptr)
            self.cached_bytes += bucket
        else:
            with nogil:
                cydriver.cuMemFree(ptr)
            self.allocated_bytes -= bucket

    cdef void forget(self, size_t bucket) noexcept:
        # the allocation stays in flight on a failed stream: never reuse it
        self.live_bytes -= bucket

    def trim(self):
        """Free every cached allocation."""
        cdef int k
        cdef cydriver.CUdeviceptr ptr
        for k in range(N_BUCKETS):
            while not self.free_list[k].empty():
                ptr = self.free_list[k].back()
                self.free_list[k].pop_back()
                with nogil:
                    cydriver.cuMemFree(ptr)
                self.cached_bytes -= (<size_t>1 << k)
                self.allocated_bytes -= (<size_t>1 << k)

    def close(self):
        self.trim()
        self.closed = True

    def cached_blocks(self):
        return sum(self.free_list[k].size() for k in range(N_BUCKETS))


cdef class PinnedPool:
    """Power-of-two cache of pinned (page-locked, portable) host staging buffers."""

    def __cinit__(self, size_t cap_bytes=128 << 20):
        self.cap_bytes = cap_bytes

    cdef int acquire(self, size_t bucket, void** out) except -1:
        cdef int k = bucket_index(bucket)
        cdef void* ptr = NULL
        cdef cydriver.CUresult status
        if _cacheable(bucket) and not self.free_list[k].empty():
            out[0] = self.free_list[k].back()
            self.free_list[k].pop_back()
            self.cached_bytes -= bucket
            self.live_bytes += bucket
            self.hits += 1
            return 0
        self.misses += 1
        with nogil:
            status = cydriver.cuMemHostAlloc(&ptr, bucket, cydriver.CU_MEMHOSTALLOC_PORTABLE)
        if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY and self.cached_bytes:
            self.trim()
            with nogil:
                status = cydriver.cuMemHostAlloc(&ptr, bucket, cydriver.CU_MEMHOSTALLOC_PORTABLE)
        check_cu(status, b"cuMemHostAlloc")
        self.live_bytes += bucket
        out[0] = ptr
        return 0

    cdef void release(self, void* ptr, size_t bucket) noexcept:
        cdef int k = bucket_index(bucket)
        self.live_bytes -= bucket
        if (not self.closed and _cacheable(bucket) and self.cached_bytes + bucket <= self.cap_bytes
                and self.free_list[k].size() < 1024):
            self.free_list[k].push_back(ptr)
            self.cached_bytes += bucket
        else:
            with nogil:
                cydriver.cuMemFreeHost(ptr)

    cdef void forget(self, size_t bucket) noexcept:
        self.live_bytes -= bucket

    def trim(self):
        cdef int k
        cdef void* ptr
        for k in range(N_BUCKETS):
            while not self.free_list[k].empty():
                ptr = self.free_list[k].back()
                self.free_list[k].pop_back()
                with nogil:
                    cydriver.cuMemFreeHost(ptr)
                self.cached_bytes -= (<size_t>1 << k)

    def close(self):
        self.trim()
        self.closed = True

    def cached_blocks(self):
        return sum(self.free_list[k].size() for k in range(N_BUCKETS))


cdef class StreamPool:
    """Non-blocking streams, completion events (no timing) and timing events, reused."""

    def __cinit__(self, unsigned int cap=128):
        self.cap = cap

    cdef int acquire_stream(self, cydriver.CUstream* out) except -1:
        cdef cydriver.CUstream s = NULL
        if not self.streams.empty():
            out[0] = self.streams.back()
            self.streams.pop_back()
        else:
            with nogil:
                # never the null stream: non-blocking streams do not synchronise with it
                check_cu(cydriver.cuStreamCreate(&s, cydriver.CU_STREAM_NON_BLOCKING), b"cuStreamCreate")
            self.created_streams += 1
            out[0] = s
        self.live_streams += 1
        return 0

    cdef void release_stream(self, cydriver.CUstream s) noexcept:
        self.live_streams -= 1
        if not self.closed and self.streams.size() < self.cap:
            self.streams.push_back(s)
        else:
            cydriver.cuStreamDestroy(s)
            self.created_streams -= 1

    cdef int acquire_event(self, bint timing, cydriver.CUevent* out) except -1:
        cdef cydriver.CUevent e = NULL
        cdef unsigned int flags = cydriver.CU_EVENT_DEFAULT if timing else cydriver.CU_EVENT_DISABLE_TIMING
        cdef vector[cydriver.CUevent]* pool = &self.timing_events if timing else &self.events
        if not pool.empty():
            out[0] = pool.back()
            pool.pop_back()
        else:
            with nogil:
                check_cu(cydriver.cuEventCreate(&e, flags), b"cuEventCreate")
            self.created_events += 1
            out[0] = e
        self.live_events += 1
        return 0

    cdef void release_event(self, cydriver.CUevent e, bint timing) noexcept:
        cdef vector[cydriver.CUevent]* pool = &self.timing_events if timing else &self.events
        self.live_events -= 1
        if not self.closed and pool.size() < self.cap:
            pool.push_back(e)
        else:
            cydriver.cuEventDestroy(e)
            self.created_events -= 1

    def close(self):
        self.closed = True
        while not self.streams.empty():
            cydriver.cuStreamDestroy(self.streams.back())
            self.streams.pop_back()
            self.created_streams -= 1
        while not self.events.empty():
            cydriver.cuEventDestroy(self.events.back())
            self.events.pop_back()
            self.created_events -= 1
        while not self.timing_events.empty():
            cydriver.cuEventDestroy(self.timing_events.back())
            self.timing_events.pop_back()
            self.created_events -= 1
