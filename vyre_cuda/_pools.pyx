# cython: language_level=3
"""Pools: device memory and pinned host memory, reused (streams and events: ``_streams``).

:class:`BlockPool` caches freed blocks by exact size under a byte cap; subclasses say how a block
is allocated and freed. Large device slabs come from the driver's stream-ordered pool (exact sizes,
no driver allocation once it has grown to the working set). Each pool's bookkeeping is under its
own C++ mutex, never the GIL, and no driver call runs under it.
"""

from cython.operator cimport dereference as deref
from libc.stdint cimport uintptr_t
from libc.stdlib cimport free
from libc.string cimport memset
from libcpp.mutex cimport mutex
from libcpp.pair cimport pair
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cpython.buffer cimport PyBuffer_FillInfo
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, bind_context
from ._pinned_exit cimport pinned_born, pinned_gone, pinned_forget_context
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
    """A cache of freed blocks keyed by exact block size, bounded by ``cap_bytes`` cached.

    Every field is under ``mu``; no driver call or Python object is touched while it is held
    (frees take their list out under it, then run without it and without the GIL).
    """

    def __cinit__(self, size_t cap_bytes=0, uintptr_t ctx=0, *args, **kwargs):
        self.cap_bytes = cap_bytes
        self.ctx = <cydriver.CUcontext>ctx

    cdef bint _pop_free(self, size_t block, uintptr_t* out) noexcept:
        """With ``mu`` held: a cached block of exactly ``block`` bytes, counted as a hit."""
        cdef unordered_map[size_t, vector[uintptr_t]].iterator it = self.free_blocks.find(block)
        if it == self.free_blocks.end() or deref(it).second.empty():
            return False
        out[0] = deref(it).second.back()
        deref(it).second.pop_back()
        self.cached_bytes -= block
        self.live_bytes += block
        self.hits += 1
        return True

    cdef void _count_alloc(self, size_t block) noexcept:
        lock_with_gil(self.mu)
        self.alloc_calls += 1
        self.live_bytes += block
        self.allocated_bytes += block
        self.mu.unlock()

    cdef int acquire(self, size_t block, uintptr_t* out) except -1:
        cdef bint hit
        lock_with_gil(self.mu)
        hit = self._pop_free(block, out)
        if not hit:
            self.misses += 1
        self.mu.unlock()
        if hit:
            return 0
        self._alloc(block, out)  # (no lock held: a driver call, and it may raise)
        self._count_alloc(block)
        return 0

    cdef void release(self, uintptr_t ptr, size_t block) noexcept:
        cdef bint keep, free_now
        cdef cydriver.CUcontext prev
        lock_with_gil(self.mu)
        self.live_bytes -= block
        keep = (not self.closed and self.cached_bytes + block <= self.cap_bytes
                and self.free_blocks[block].size() < MAX_BLOCKS_PER_SIZE)
        if keep:
            self.free_blocks[block].push_back(ptr)
            self.cached_bytes += block
        else:
            self.allocated_bytes -= block
        # a dead context's block: its address may belong to a new context now
        free_now = not keep and not self.forgotten
        self.mu.unlock()
        if free_now:
            # the releasing thread may have no context current: push the pool's
            with nogil:
                if self.ctx == NULL:  # host memory (HostPool): no context involved
                    self._free(ptr)
                elif cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                    self._free(ptr)
                    cydriver.cuCtxPopCurrent(&prev)

    cdef void forget(self, size_t block) noexcept:
        # the block stays in flight on a failed stream: never reuse or free it
        lock_with_gil(self.mu)
        self.live_bytes -= block
        self.allocated_bytes -= block
        self.mu.unlock()

    cdef int _alloc(self, size_t block, uintptr_t* out) except -1:
        raise NotImplementedError

    cdef cydriver.CUresult _free(self, uintptr_t ptr) noexcept nogil:
        return cydriver.CUDA_SUCCESS

    cdef void _free_list(self, vector[uintptr_t]& ptrs, cydriver.CUresult* first) noexcept:
        cdef size_t i
        cdef cydriver.CUresult st
        with nogil:
            for i in range(ptrs.size()):
                st = self._free(ptrs[i])
                if st != cydriver.CUDA_SUCCESS and first[0] == cydriver.CUDA_SUCCESS:
                    first[0] = st

    cdef cydriver.CUresult _free_cached(self) noexcept:
        """Free every cached block; the first failure is returned (the others are still tried).
        The blocks leave the cache under the lock; the frees run after it, without the GIL."""
        cdef vector[uintptr_t] ptrs
        cdef size_t nbytes = 0
        cdef cydriver.CUresult first = cydriver.CUDA_SUCCESS
        lock_with_gil(self.mu)
        for entry in self.free_blocks:
            nbytes += entry.first * entry.second.size()
            ptrs.insert(ptrs.end(), entry.second.begin(), entry.second.end())
        self.free_blocks.clear()
        self.cached_bytes -= nbytes
        self.allocated_bytes -= nbytes
        self.mu.unlock()
        self._free_list(ptrs, &first)
        return first

    def trim(self):
        """Free every cached block (the pool's context is made current first); a failed free
        raises the driver's error after every block was tried. Safe from any thread at any time."""
        if self.free_blocks.empty():  # (a racy read: a block cached meanwhile waits for the next trim)
            return
        if self.ctx != NULL:
            with nogil:
                bind_context(self.ctx)
        check_cu(self._free_cached(), b"trim (free a cached block)")

    def close(self):
        """Cache nothing from now on (later releases free at once), then free the cache."""
        lock_with_gil(self.mu)
        self.closed = True
        self.mu.unlock()
        self.trim()

    def forget_context(self):
        """The context died after a fault, with its allocations: drop every cached handle without a
        driver call, and never call the driver again."""
        lock_with_gil(self.mu)
        self.free_blocks.clear()
        self.allocated_bytes -= self.cached_bytes
        self.cached_bytes = 0
        self.ctx = NULL
        self.closed = True
        self.forgotten = True
        self.mu.unlock()

    def cached_blocks(self):
        cdef size_t n = 0
        lock_with_gil(self.mu)
        for entry in self.free_blocks:
            n += entry.second.size()
        self.mu.unlock()
        return n

    def stats(self):
        """The pool's counters, read together under its lock."""
        lock_with_gil(self.mu)
        out = (self.hits, self.misses, self.alloc_calls, self.cached_bytes, self.live_bytes,
               self.allocated_bytes)
        self.mu.unlock()
        return dict(zip(("hits", "misses", "alloc_calls", "cached_bytes", "live_bytes", "allocated_bytes"), out))

    def reset_counters(self):
        lock_with_gil(self.mu)
        self.hits = self.misses = self.alloc_calls = 0
        self.mu.unlock()

    def __dealloc__(self):
        # dropped without close(): free the cache, never raise (no other thread holds it: no lock)
        cdef cydriver.CUcontext prev
        cdef vector[uintptr_t] ptrs
        cdef cydriver.CUresult first = cydriver.CUDA_SUCCESS
        if self.free_blocks.empty():
            return
        for entry in self.free_blocks:
            ptrs.insert(ptrs.end(), entry.second.begin(), entry.second.end())
        self.free_blocks.clear()
        if self.ctx == NULL:  # host memory (HostPool): no context involved
            self._free_list(ptrs, &first)
        elif cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
            self._free_list(ptrs, &first)
            cydriver.cuCtxPopCurrent(&prev)


cdef void memset_props(cydriver.CUmemPoolProps* props, int device) noexcept:
    memset(props, 0, sizeof(cydriver.CUmemPoolProps))
    props.allocType = cydriver.CU_MEM_ALLOCATION_TYPE_PINNED
    props.handleTypes = cydriver.CU_MEM_HANDLE_TYPE_NONE
    props.location.type = cydriver.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = device


# Stream-ordered pools of closed backends, kept for the next backend on the same device rather
# than destroyed: three GPU stress crashes in five were inside cuMemPoolDestroy beside other
# threads' driver work (notes/safe-to-share.md), and a pool that is never destroyed while the
# process runs cannot crash there (CuPy and cuda.core allocate from the device's pool, which lives
# as long as the process). A parked pool holds no slab and no memory (trimmed to nothing); its
# release threshold stays set. At most one pool per backend open at once is ever made. Each
# parked pool holds a retain of its device's primary context, so the context (whose teardown
# would take the pool with it) outlives the last backend while a pool waits, as it does for
# CuPy's and PyTorch's pools; the backend that takes the pool over gives that retain back.
cdef mutex _parked_mu
cdef vector[pair[int, uintptr_t]] _parked  # (device, pool)


cdef cydriver.CUmemoryPool _unpark(int device) noexcept nogil:
    """A parked pool of ``device`` for a backend that holds the device's primary context."""
    cdef cydriver.CUmemoryPool pool = NULL
    cdef cydriver.CUdevice dev
    cdef size_t i
    _parked_mu.lock()
    for i in range(_parked.size()):
        if _parked[i].first == device:
            pool = <cydriver.CUmemoryPool>_parked[i].second
            _parked[i] = _parked.back()
            _parked.pop_back()
            break
    _parked_mu.unlock()
    if pool != NULL and cydriver.cuDeviceGet(&dev, device) == cydriver.CUDA_SUCCESS:
        cydriver.cuDevicePrimaryCtxRelease(dev)  # the park's retain (the caller holds its own)
    return pool


cdef void _park(int device, cydriver.CUmemoryPool pool) noexcept nogil:
    """A pool no slab of which is lent (the caller took it from its DevicePool under the lock; its
    context is current)."""
    cdef cydriver.CUdevice dev
    cdef cydriver.CUcontext ctx
    if (cydriver.cuDeviceGet(&dev, device) != cydriver.CUDA_SUCCESS
            or cydriver.cuDevicePrimaryCtxRetain(&ctx, dev) != cydriver.CUDA_SUCCESS):
        cydriver.cuMemPoolDestroy(pool)  # (a context that cannot be retained: nothing to keep it for)
        return
    cydriver.cuMemPoolTrimTo(pool, 0)  # its memory back to the driver; the handle stays valid
    _parked_mu.lock()
    _parked.push_back(pair[int, uintptr_t](device, <uintptr_t>pool))
    _parked_mu.unlock()


def parked_pools(int device=-1):
    """How many stream-ordered pools wait for a backend (on ``device``, or on any: -1)."""
    cdef size_t i, n = 0
    with nogil:
        _parked_mu.lock()
        for i in range(_parked.size()):
            if device < 0 or _parked[i].first == device:
                n += 1
        _parked_mu.unlock()
    return n


def forget_parked_pools(int device):
    """Before reset_device() resets ``device``'s primary context: drop its parked pools (the reset
    takes them) and give back their retains of the context."""
    cdef size_t i = 0, n = 0
    cdef cydriver.CUdevice dev
    with nogil:
        _parked_mu.lock()
        while i < _parked.size():
            if _parked[i].first == device:
                _parked[i] = _parked.back()
                _parked.pop_back()
                n += 1
            else:
                i += 1
        _parked_mu.unlock()
        if n and cydriver.cuDeviceGet(&dev, device) == cydriver.CUDA_SUCCESS:
            while n:
                cydriver.cuDevicePrimaryCtxRelease(dev)
                n -= 1


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

    cdef int _ensure_mempool(self) except -1:
        # created once, under the lock (two first dispatches must not both create one)
        cdef cydriver.CUmemPoolProps props
        cdef cydriver.cuuint64_t threshold = <cydriver.cuuint64_t>-1
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef const char* call = b"cuMemPoolCreate"
        cdef cydriver.CUmemoryPool pool = NULL
        lock_with_gil(self.mu)
        if self.mempool == NULL:
            pool = _unpark(self.device)  # a closed backend's, if one waits (threshold already set)
            if pool != NULL:
                self.mempool = pool
                self.mu.unlock()
                return 0
            memset_props(&props, self.device)
            with nogil:
                st = cydriver.cuMemPoolCreate(&pool, &props)
                if st == cydriver.CUDA_SUCCESS:
                    # keep freed memory in the pool: a steady workload then never reaches the driver
                    call = b"cuMemPoolSetAttribute"
                    st = cydriver.cuMemPoolSetAttribute(pool, cydriver.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                                        &threshold)
                    if st != cydriver.CUDA_SUCCESS:
                        cydriver.cuMemPoolDestroy(pool)
                    else:
                        self.mempool = pool
        self.mu.unlock()
        check_cu(st, call)
        return 0

    cdef int acquire_async(self, size_t nbytes, cydriver.CUstream stream, cydriver.CUdeviceptr* out) except -1:
        """A stream-ordered slab of exactly ``nbytes``, usable in ``stream`` order."""
        cdef cydriver.CUresult status
        cdef cydriver.cuuint64_t reserved = 0
        cdef cydriver.cuuint64_t before = 0
        cdef size_t in_use
        cdef bint may_grow
        cdef cydriver.CUmemoryPool pool
        if self.mempool == NULL:  # (a hint only: _ensure_mempool checks again under the lock)
            self._ensure_mempool()
        lock_with_gil(self.mu)
        pool = self.mempool  # (read under the lock that publishes it; a dispatch runs before close)
        in_use = self.async_live_bytes
        may_grow = in_use + nbytes > self.async_high_water
        self.mu.unlock()
        if may_grow:
            with nogil:
                check_cu(cydriver.cuMemPoolGetAttribute(
                    pool, cydriver.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &before),
                    b"cuMemPoolGetAttribute")
            if in_use + nbytes > before:
                self._budget(nbytes, b"a stream-ordered slab")
        with nogil:
            status = cydriver.cuMemAllocFromPoolAsync(out, nbytes, pool, stream)
        if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
            self._free_cached()
            lock_with_gil(self.mu)
            in_use = self.async_live_bytes
            self.mu.unlock()
            with nogil:
                cydriver.cuMemPoolTrimTo(pool, in_use)
                status = cydriver.cuMemAllocFromPoolAsync(out, nbytes, pool, stream)
            if status == cydriver.CUDA_ERROR_OUT_OF_MEMORY:
                raise DeviceOutOfMemory(
                    f"the driver could not allocate {_fmt(nbytes)} bytes of device memory for the "
                    f"dispatch ({_fmt(in_use)} bytes are in use by dispatches in flight)",
                    "free device memory held elsewhere, wait for dispatches in flight, or split the "
                    "dispatch into bounded chunks",
                    status="CUDA_ERROR_OUT_OF_MEMORY", call="cuMemAllocFromPoolAsync",
                )
        check_cu(status, b"cuMemAllocFromPoolAsync")
        if may_grow:
            with nogil:  # (statistics only: a failed query counts the slab as a hit)
                status = cydriver.cuMemPoolGetAttribute(
                    pool, cydriver.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved)
        lock_with_gil(self.mu)
        self.async_live_bytes += nbytes
        self.live_bytes += nbytes
        self.async_allocs += 1
        if may_grow and status == cydriver.CUDA_SUCCESS and reserved > before:
            # the pool had to ask the driver for more memory: that is an allocation
            self.misses += 1
            self.alloc_calls += 1
        else:
            self.hits += 1
        if self.async_live_bytes > self.async_high_water:
            self.async_high_water = self.async_live_bytes
        self.mu.unlock()
        return 0

    cdef void release_async(self, cydriver.CUdeviceptr ptr, size_t nbytes, cydriver.CUstream stream) noexcept:
        cdef cydriver.CUcontext prev
        with nogil:
            if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:  # (see release)
                cydriver.cuMemFreeAsync(ptr, stream)
                cydriver.cuCtxPopCurrent(&prev)
        # counted out only once the free has returned: close() parks the pool when it sees no
        # live bytes (another backend may then take it), and must not while this free still runs
        self.forget_async(nbytes)

    cdef void forget_async(self, size_t nbytes) noexcept:
        lock_with_gil(self.mu)
        self.async_live_bytes -= nbytes
        self.live_bytes -= nbytes
        self.mu.unlock()

    def async_stats(self):
        """The stream-ordered pool's counters, read together under the lock: ``live_bytes``,
        ``high_water`` and ``allocs``."""
        lock_with_gil(self.mu)
        out = (self.async_live_bytes, self.async_high_water, self.async_allocs)
        self.mu.unlock()
        return dict(zip(("live_bytes", "high_water", "allocs"), out))

    def reserved_bytes(self):
        """Bytes the stream-ordered pool holds (in use or cached)."""
        cdef cydriver.cuuint64_t reserved = 0
        cdef cydriver.CUmemoryPool pool
        lock_with_gil(self.mu)
        pool = self.mempool
        self.mu.unlock()
        if pool == NULL:
            return 0
        with nogil:
            bind_context(self.ctx)
            check_cu(cydriver.cuMemPoolGetAttribute(
                pool, cydriver.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved),
                b"cuMemPoolGetAttribute")
        return reserved

    def trim(self):
        """Free every cached block and give the stream-ordered pool's unused memory back (the
        driver's pool is thread-safe; slabs in use by dispatches in flight stay)."""
        cdef cydriver.CUmemoryPool pool
        BlockPool.trim(self)
        lock_with_gil(self.mu)
        pool = self.mempool  # (trim() runs counted: close() cannot park it meanwhile)
        self.mu.unlock()
        if pool != NULL:
            with nogil:
                check_cu(cydriver.cuMemPoolTrimTo(pool, 0), b"cuMemPoolTrimTo")
            lock_with_gil(self.mu)
            self.async_high_water = self.async_live_bytes
            self.mu.unlock()

    def close(self):
        cdef cydriver.CUmemoryPool pool = NULL
        BlockPool.close(self)
        lock_with_gil(self.mu)
        # taken under the lock: close() (with handles held) and close_late() (at the last one's
        # drop) may run on two threads; one parks it, the other finds no pool. With slabs still
        # lent the pool stays, untouched, until close_late() (no trim: the other may park it
        # meanwhile). Parked, not destroyed (see _park).
        if self.mempool != NULL and self.async_live_bytes == 0:
            pool = self.mempool
            self.mempool = NULL
        self.mu.unlock()
        if pool != NULL:
            with nogil:
                _park(self.device, pool)

    def forget_context(self):
        BlockPool.forget_context(self)
        lock_with_gil(self.mu)
        self.mempool = NULL  # (it died with the context: neither parked nor destroyed)
        self.mu.unlock()

    def __dealloc__(self):
        # destroyed without the GIL: a driver free may wait on work that needs the GIL
        cdef cydriver.CUcontext prev
        cdef cydriver.CUmemoryPool pool = self.mempool
        cdef cydriver.CUcontext ctx = self.ctx
        self.mempool = NULL
        if pool != NULL and self.async_live_bytes == 0 and ctx != NULL:
            with nogil:
                if cydriver.cuCtxPushCurrent(ctx) == cydriver.CUDA_SUCCESS:
                    _park(self.device, pool)
                    cydriver.cuCtxPopCurrent(&prev)


cdef class PinnedPool(BlockPool):
    """Page-locked (portable) host memory: staging mirrors of small dispatches, host arrays."""

    def __init__(self, size_t cap_bytes=128 << 20, uintptr_t ctx=0):
        pass

    def forget_context(self):
        """As BlockPool's; the process-wide table of page-locked blocks forgets the context's
        blocks too (the exit hook must never free them)."""
        if self.ctx != NULL:
            pinned_forget_context(self.ctx)
        BlockPool.forget_context(self)

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
        pinned_born(<uintptr_t>ptr, self.ctx)
        out[0] = <uintptr_t>ptr
        return 0

    cdef cydriver.CUresult _free(self, uintptr_t ptr) noexcept nogil:
        pinned_gone(ptr)
        return cydriver.cuMemFreeHost(<void*>ptr)


cdef class HostPool(BlockPool):
    """Pageable host memory for large dispatch outputs, recycled.

    Fresh pages are zeroed by the kernel on first touch, slower than the copy into them (about
    10 GB/s against 45), so large outputs reuse blocks already faulted in (2 MiB aligned, huge pages).
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
