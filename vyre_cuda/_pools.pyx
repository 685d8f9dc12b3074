# cython: language_level=3
"""Pools: device memory, pinned host memory, streams and events, all reused.

One base, :class:`BlockPool`, caches freed blocks by exact block size under a byte cap; its
subclasses only say how a block is allocated and freed (cuda.core's ``_MemPool`` is the model).
Large device slabs come from the driver's stream-ordered pool instead (``cuMemAllocFromPoolAsync``
with an unbounded release threshold): exact sizes, no power-of-two waste, and no driver allocation
once the pool has grown to the working set.

Bookkeeping runs with the GIL held (a few C operations), so pools need no lock of their own; the
driver calls that allocate or free run with the GIL released. A pool dropped without ``close()``
frees what it caches.
"""

from cython.operator cimport dereference as deref
from libc.stdint cimport uintptr_t
from libc.stdlib cimport free
from libc.string cimport memset
from cpython.buffer cimport PyBuffer_FillInfo
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, bind_context
from .errors import DeviceOutOfMemory

cdef extern from "<stdlib.h>" nogil:
    int posix_memalign(void** memptr, size_t alignment, size_t size)

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_HUGEPAGE

cdef enum:
    MAX_BLOCKS_PER_SIZE = 1024


cdef size_t host_block_size(size_t nbytes) noexcept nogil:
    """Powers of two (at least 256 B) up to 2 MiB, then 2 MiB multiples: small blocks reuse well,
    large ones waste at most 2 MiB of host memory."""
    cdef size_t b = 256
    if nbytes > (2 << 20):
        return (nbytes + (2 << 20) - 1) & ~(<size_t>(2 << 20) - 1)
    while b < nbytes:
        b <<= 1
    return b


def _fmt(n):
    return f"{n:,}"


cdef class BlockPool:
    """A cache of freed blocks keyed by exact block size, bounded by ``cap_bytes`` cached."""

    def __cinit__(self, size_t cap_bytes=0, uintptr_t ctx=0, *args, **kwargs):
        self.cap_bytes = cap_bytes
        self.ctx = <cydriver.CUcontext>ctx

    cdef int acquire(self, size_t block, uintptr_t* out) except -1:
        cdef unordered_map[size_t, vector[uintptr_t]].iterator it = self.free_blocks.find(block)
        cdef vector[uintptr_t]* cached
        if it != self.free_blocks.end() and not deref(it).second.empty():
            cached = &deref(it).second
            out[0] = cached.back()
            cached.pop_back()
            self.cached_bytes -= block
            self.live_bytes += block
            self.hits += 1
            return 0
        self.misses += 1
        self._alloc(block, out)
        self.alloc_calls += 1
        self.live_bytes += block
        self.allocated_bytes += block
        return 0

    cdef void release(self, uintptr_t ptr, size_t block) noexcept:
        self.live_bytes -= block
        if (not self.closed and self.cached_bytes + block <= self.cap_bytes
                and self.free_blocks[block].size() < MAX_BLOCKS_PER_SIZE):
            self.free_blocks[block].push_back(ptr)
            self.cached_bytes += block
        else:
            with nogil:
                self._free(ptr)
            self.allocated_bytes -= block

    cdef void forget(self, size_t block) noexcept:
        # the block stays in flight on a failed stream: never reuse or free it
        self.live_bytes -= block
        self.allocated_bytes -= block

    cdef int _alloc(self, size_t block, uintptr_t* out) except -1:
        raise NotImplementedError

    cdef cydriver.CUresult _free(self, uintptr_t ptr) noexcept nogil:
        return cydriver.CUDA_SUCCESS

    cdef cydriver.CUresult _free_cached(self) noexcept:
        """Free every cached block; the first failure is returned (the others are still tried)."""
        cdef uintptr_t ptr
        cdef size_t block
        cdef cydriver.CUresult st, first = cydriver.CUDA_SUCCESS
        for entry in self.free_blocks:
            block = entry.first
            for ptr in entry.second:
                with nogil:
                    st = self._free(ptr)
                if st != cydriver.CUDA_SUCCESS and first == cydriver.CUDA_SUCCESS:
                    first = st
                self.cached_bytes -= block
                self.allocated_bytes -= block
        self.free_blocks.clear()
        return first

    def trim(self):
        """Free every cached block (the pool's context is made current first); a failed free
        raises the driver's error after every block was tried."""
        if self.free_blocks.empty():
            return
        with nogil:
            bind_context(self.ctx)
        check_cu(self._free_cached(), b"trim (free a cached block)")

    def close(self):
        self.trim()
        self.closed = True

    def forget_context(self):
        """The context is gone (released after a fault): its allocations died with it. Drop every
        cached handle without a driver call, and never call the driver again."""
        self.free_blocks.clear()
        self.cached_bytes = 0
        self.ctx = NULL
        self.closed = True

    def cached_blocks(self):
        cdef size_t n = 0
        for entry in self.free_blocks:
            n += entry.second.size()
        return n

    def __dealloc__(self):
        # dropped without close(): give back what is cached; never raise from here
        cdef cydriver.CUcontext prev
        if self.free_blocks.empty() or self.ctx == NULL:
            return
        if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
            self._free_cached()
            cydriver.cuCtxPopCurrent(&prev)


cdef void memset_props(cydriver.CUmemPoolProps* props, int device) noexcept:
    memset(props, 0, sizeof(cydriver.CUmemPoolProps))
    props.allocType = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
    props.handleTypes = cydriver.CU_MEM_HANDLE_TYPE_NONE
    props.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = device


cdef class DevicePool(BlockPool):
    """Device memory: small slabs in cached power-of-two blocks, large ones stream-ordered.

    Before a new block the request is checked against a budget of 90% of the free device memory;
    over it, the cache is trimmed and the budget rechecked, then the request refused.
    """

    def __init__(self, size_t cap_bytes=256 << 20, uintptr_t ctx=0, int device=0):
        cdef int supported = 0
        cdef cydriver.CUdevice dev
        self.device = device
        if ctx:
            with nogil:
                check_cu(cydriver.cuDeviceGet(&dev, device), b"cuDeviceGet")
                check_cu(cydriver.cuDeviceGetAttribute(
                    &supported, cydriver.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev),
                    b"cuDeviceGetAttribute")
        self.stream_ordered = supported != 0

    cdef int _budget(self, size_t nbytes, const char* what) except -1:
        cdef size_t free_b = 0, total_b = 0
        with nogil:
            check_cu(cydriver.cuMemGetInfo(&free_b, &total_b), b"cuMemGetInfo")
        if nbytes > free_b - free_b // 10 and self.cached_bytes:
            self._free_cached()
            with nogil:
                check_cu(cydriver.cuMemGetInfo(&free_b, &total_b), b"cuMemGetInfo")
        if nbytes > free_b - free_b // 10:
            raise DeviceOutOfMemory(
                f"the dispatch needs {_fmt(nbytes)} bytes of device memory ({what.decode()}) but "
                f"the budget is {_fmt(free_b - free_b // 10)} bytes (90% of {_fmt(free_b)} free of "
                f"{_fmt(total_b)} total)",
                "free device memory held elsewhere (CudaBackend.trim() returns this backend's "
                "cache), or split the dispatch into bounded chunks",
                status="budget", call="DevicePool.acquire",
            )
        return 0

    cdef int _alloc(self, size_t block, uintptr_t* out) except -1:
        cdef cydriver.CUdeviceptr ptr = 0
        cdef cydriver.CUresult status
        self._budget(block, b"one pool block")
        with nogil:
            status = cydriver.cuMemAlloc(&ptr, block)
        if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY and self.cached_bytes:
            self._free_cached()
            with nogil:
                status = cydriver.cuMemAlloc(&ptr, block)
        check_cu(status, b"cuMemAlloc")
        out[0] = <uintptr_t>ptr
        return 0

    cdef cydriver.CUresult _free(self, uintptr_t ptr) noexcept nogil:
        return cydriver.cuMemFree(<cydriver.CUdeviceptr>ptr)

    cdef int acquire_async(self, size_t nbytes, cydriver.CUstream stream, cydriver.CUdeviceptr* out) except -1:
        """A stream-ordered slab of exactly ``nbytes``, usable in ``stream`` order."""
        cdef cydriver.CUresult status
        cdef cydriver.CUmemPoolProps props
        cdef cydriver.cuuint64_t threshold = <cydriver.cuuint64_t>-1
        cdef cydriver.cuuint64_t reserved = 0
        cdef cydriver.cuuint64_t before = 0
        cdef bint may_grow
        if self.mempool == NULL:
            memset_props(&props, self.device)
            with nogil:
                check_cu(cydriver.cuMemPoolCreate(&self.mempool, &props), b"cuMemPoolCreate")
                # keep freed memory in the pool: a steady workload then never reaches the driver
                check_cu(cydriver.cuMemPoolSetAttribute(
                    self.mempool, cydriver.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
                    b"cuMemPoolSetAttribute")
        may_grow = self.async_live_bytes + nbytes > self.async_high_water
        if may_grow:
            with nogil:
                check_cu(cydriver.cuMemPoolGetAttribute(
                    self.mempool, cydriver.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &before),
                    b"cuMemPoolGetAttribute")
            if self.async_live_bytes + nbytes > before:
                self._budget(nbytes, b"a stream-ordered slab")
        with nogil:
            status = cydriver.cuMemAllocFromPoolAsync(out, nbytes, self.mempool, stream)
        if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            self._free_cached()
            with nogil:
                cydriver.cuMemPoolTrimTo(self.mempool, self.async_live_bytes)
                status = cydriver.cuMemAllocFromPoolAsync(out, nbytes, self.mempool, stream)
            if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
                raise DeviceOutOfMemory(
                    f"the driver could not allocate {_fmt(nbytes)} bytes of device memory for the "
                    f"dispatch ({_fmt(self.async_live_bytes)} bytes are in use by dispatches in flight)",
                    "free device memory held elsewhere, wait for dispatches in flight, or split the "
                    "dispatch into bounded chunks",
                    status="CUDA_ERROR_OUT_OF_MEMORY", call="cuMemAllocFromPoolAsync",
                )
        check_cu(status, b"cuMemAllocFromPoolAsync")
        self.async_live_bytes += nbytes
        self.live_bytes += nbytes
        self.async_allocs += 1
        if may_grow:
            with nogil:
                check_cu(cydriver.cuMemPoolGetAttribute(
                    self.mempool, cydriver.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
                    b"cuMemPoolGetAttribute")
            if reserved > before:
                # the pool had to ask the driver for more memory: that is an allocation
                self.misses += 1
                self.alloc_calls += 1
            else:
                self.hits += 1
            self.async_high_water = self.async_live_bytes
        else:
            self.hits += 1
        return 0

    cdef void release_async(self, cydriver.CUdeviceptr ptr, size_t nbytes, cydriver.CUstream stream) noexcept:
        self.async_live_bytes -= nbytes
        self.live_bytes -= nbytes
        with nogil:
            cydriver.cuMemFreeAsync(ptr, stream)

    cdef void forget_async(self, size_t nbytes) noexcept:
        self.async_live_bytes -= nbytes
        self.live_bytes -= nbytes

    def reserved_bytes(self):
        """Bytes the stream-ordered pool holds (in use or cached)."""
        cdef cydriver.cuuint64_t reserved = 0
        if self.mempool == NULL:
            return 0
        with nogil:
            bind_context(self.ctx)
            check_cu(cydriver.cuMemPoolGetAttribute(
                self.mempool, cydriver.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
                b"cuMemPoolGetAttribute")
        return reserved

    def trim(self):
        """Free every cached block and give the stream-ordered pool's unused memory back."""
        if self.free_blocks.empty() and self.mempool == NULL:
            return
        with nogil:
            bind_context(self.ctx)
        check_cu(self._free_cached(), b"trim (free a cached block)")
        if self.mempool != NULL:
            with nogil:
                check_cu(cydriver.cuMemPoolTrimTo(self.mempool, 0), b"cuMemPoolTrimTo")
            self.async_high_water = self.async_live_bytes

    def close(self):
        self.trim()
        self.closed = True
        if self.mempool != NULL and self.async_live_bytes == 0:
            with nogil:
                cydriver.cuMemPoolDestroy(self.mempool)
            self.mempool = NULL

    def forget_context(self):
        BlockPool.forget_context(self)
        self.mempool = NULL

    def __dealloc__(self):
        cdef cydriver.CUcontext prev
        if self.mempool != NULL and self.async_live_bytes == 0 and self.ctx != NULL:
            if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                cydriver.cuMemPoolDestroy(self.mempool)
                cydriver.cuCtxPopCurrent(&prev)


cdef class PinnedPool(BlockPool):
    """Page-locked (portable) host memory: staging mirrors of small dispatches, host arrays."""

    def __init__(self, size_t cap_bytes=128 << 20, uintptr_t ctx=0):
        pass

    cdef int _alloc(self, size_t block, uintptr_t* out) except -1:
        cdef void* ptr = NULL
        cdef cydriver.CUresult status
        with nogil:
            status = cydriver.cuMemHostAlloc(&ptr, block, cydriver.CU_MEMHOSTALLOC_PORTABLE)
        if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY and self.cached_bytes:
            self._free_cached()
            with nogil:
                status = cydriver.cuMemHostAlloc(&ptr, block, cydriver.CU_MEMHOSTALLOC_PORTABLE)
        if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            raise DeviceOutOfMemory(
                f"the driver could not page-lock {_fmt(block)} bytes of host memory "
                f"({_fmt(self.live_bytes)} bytes of this pool are in use)",
                "free page-locked arrays you no longer need, or use smaller ones",
                status="CUDA_ERROR_OUT_OF_MEMORY", call="cuMemHostAlloc",
            )
        check_cu(status, b"cuMemHostAlloc")
        out[0] = <uintptr_t>ptr
        return 0

    cdef cydriver.CUresult _free(self, uintptr_t ptr) noexcept nogil:
        return cydriver.cuMemFreeHost(<void*>ptr)


cdef class HostPool(BlockPool):
    """Pageable host memory for large dispatch outputs, recycled.

    A fresh numpy array of 256 MiB is fresh pages: the kernel zeroes every one on first touch,
    which costs more than copying the output into it (about 10 GB/s against 45). Outputs of large
    dispatches therefore come from blocks that earlier outputs gave back when they died, already
    faulted in. Blocks are 2 MiB aligned and advised as transparent huge pages.
    """

    def __init__(self, size_t cap_bytes=1 << 30, uintptr_t ctx=0):
        pass

    cdef int _alloc(self, size_t block, uintptr_t* out) except -1:
        cdef void* ptr = NULL
        if posix_memalign(&ptr, 2 << 20, block) != 0:
            raise MemoryError(f"could not allocate {_fmt(block)} bytes of host memory for dispatch outputs")
        madvise(ptr, block, MADV_HUGEPAGE)  # advice only: ignored where huge pages are off
        out[0] = <uintptr_t>ptr
        return 0

    cdef cydriver.CUresult _free(self, uintptr_t ptr) noexcept nogil:
        free(<void*>ptr)
        return cydriver.CUDA_SUCCESS


cdef class LentBlock:
    """One pooled block lent to a numpy array; it goes back to its pool when the array (and every
    view of it) is gone."""

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, <void*>self.ptr, self.nbytes, 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass

    @property
    def address(self):
        return self.ptr

    def __dealloc__(self):
        cdef cydriver.CUcontext prev
        cdef bint pushed = False
        if self.pool is not None and self.ptr:
            # push/pop, not set: the caller's current context (CuPy's, torch's) stays as it was
            if self.pool.ctx != NULL:
                pushed = cydriver.cuCtxPushCurrent(self.pool.ctx) == cydriver.CUDA_SUCCESS
            self.pool.release(self.ptr, self.block)
            if pushed:
                cydriver.cuCtxPopCurrent(&prev)
            self.ptr = 0


cdef LentBlock lend_block(BlockPool pool, size_t nbytes):
    """A :class:`LentBlock` of at least ``nbytes`` from ``pool`` (the pool's context is current)."""
    cdef LentBlock b = LentBlock.__new__(LentBlock)
    cdef uintptr_t ptr = 0
    cdef size_t block = host_block_size(nbytes if nbytes else 1)
    pool.acquire(block, &ptr)
    b.pool = pool
    b.ptr = ptr
    b.block = block
    b.nbytes = nbytes
    return b


def lend_pinned(PinnedPool pool not None, size_t nbytes):
    """A :class:`LentBlock` of at least ``nbytes`` page-locked bytes from ``pool``."""
    with nogil:
        bind_context(pool.ctx)
    return lend_block(pool, nbytes)


cdef class StreamPool:
    """Non-blocking streams, completion events (no timing) and timing events, reused."""

    def __cinit__(self, unsigned int cap=128, uintptr_t ctx=0):
        self.cap = cap
        self.ctx = <cydriver.CUcontext>ctx

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

    cdef void _destroy_cached(self) noexcept:
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

    def close(self):
        self.closed = True
        if self.ctx != NULL:
            with nogil:
                bind_context(self.ctx)
        self._destroy_cached()

    def forget_context(self):
        """The context is gone: its streams and events died with it; never touch them again."""
        self.streams.clear()
        self.events.clear()
        self.timing_events.clear()
        self.ctx = NULL
        self.closed = True

    def __dealloc__(self):
        cdef cydriver.CUcontext prev
        if self.ctx != NULL and (not self.streams.empty() or not self.events.empty()
                                 or not self.timing_events.empty()):
            if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                self._destroy_cached()
                cydriver.cuCtxPopCurrent(&prev)
