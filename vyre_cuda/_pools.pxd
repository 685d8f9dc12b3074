from libc.stdint cimport uintptr_t
from libcpp.mutex cimport mutex
from libcpp.unordered_map cimport unordered_map
from libcpp.utility cimport pair
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver


cdef inline void lock_with_gil(mutex& m) noexcept:
    # Called with the GIL held. Never wait for a pool's mutex while holding the GIL: its holder
    # may be about to release it from code that waits for the GIL (deadlock). Uncontended, this
    # is one try_lock.
    if not m.try_lock():
        with nogil:
            m.lock()


cdef class BlockPool:
    """Caches freed blocks by exact block size; subclasses say how to allocate and free."""
    # mu guards every field below (never the GIL: driver calls release it); the counters are
    # read from Python only through stats(), under it
    cdef mutex mu
    cdef unordered_map[size_t, vector[uintptr_t]] free_blocks
    cdef cydriver.CUcontext ctx
    cdef public size_t cap_bytes
    cdef size_t cached_bytes
    cdef size_t live_bytes
    cdef size_t allocated_bytes
    cdef unsigned long long hits
    cdef unsigned long long misses
    cdef unsigned long long alloc_calls
    cdef public bint closed
    cdef public bint forgotten  # the context died (reset): its blocks are never freed
    cdef bint _pop_free(self, size_t block, uintptr_t* out) noexcept
    cdef void _count_alloc(self, size_t block) noexcept
    cdef int acquire(self, size_t block, uintptr_t* out) except -1
    cdef void release(self, uintptr_t ptr, size_t block) noexcept
    cdef void forget(self, size_t block) noexcept
    cdef int _alloc(self, size_t block, uintptr_t* out) except -1
    cdef cydriver.CUresult _free(self, uintptr_t ptr) noexcept nogil
    cdef cydriver.CUresult _free_cached(self) noexcept
    cdef void _free_list(self, vector[uintptr_t]& ptrs, cydriver.CUresult* first) noexcept


cdef class DevicePool(BlockPool):
    cdef int device
    cdef cydriver.CUmemoryPool mempool
    cdef public bint stream_ordered  # the device supports cuMemAllocFromPoolAsync
    cdef size_t async_live_bytes
    cdef size_t async_high_water
    cdef unsigned long long async_allocs
    cdef int _budget(self, size_t nbytes, const char* what) except -1
    cdef int _ensure_mempool(self) except -1
    cdef int acquire_async(self, size_t nbytes, cydriver.CUstream stream, cydriver.CUdeviceptr* out) except -1
    cdef void release_async(self, cydriver.CUdeviceptr ptr, size_t nbytes, cydriver.CUstream stream) noexcept
    cdef void forget_async(self, size_t nbytes) noexcept


cdef class PinnedPool(BlockPool):
    pass


cdef class HostPool(BlockPool):
    pass


cdef class LentBlock:
    cdef BlockPool pool
    cdef uintptr_t ptr
    cdef size_t block
    cdef size_t nbytes


cdef LentBlock lend_block(BlockPool pool, size_t nbytes)


cdef size_t host_block_size(size_t nbytes) noexcept nogil
