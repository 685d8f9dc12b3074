# cython: language_level=3
"""The device memory of :class:`~vyre_cuda.DeviceArray` objects, reused (one pool per device, for
the life of the process): a :class:`~vyre_cuda._pools.BlockPool` with a quarantine, since a
dropped array's block may still be read by work its consumers queued on streams vyre_cuda never
sees."""

from libc.stdint cimport uintptr_t
from libcpp.pair cimport pair
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, synchronize_current
from ._pools cimport BlockPool, lock_with_gil

cdef enum:
    # the pool synchronizes once this many dropped blocks (or ARRAY_FLUSH_BYTES) wait. Few, so a
    # loop that drops each output cycles through a few pointers: a plan keeps a CUDA graph per
    # pointer set (GRAPH_EXECS, 8), and a new set costs a capture and an exec update
    ARRAY_FLUSH_BLOCKS = 4

cdef size_t ARRAY_FLUSH_BYTES = 32 << 20


cdef size_t array_block_size(size_t nbytes) noexcept nogil:
    """512-byte multiples up to 2 MiB, then 2 MiB multiples (the page size the driver maps large
    device allocations in). At least one 512-byte block: a zero-size array still gets a real
    pointer, which consumers expect."""
    if nbytes > (2 << 20):
        return (nbytes + (2 << 20) - 1) & ~(<size_t>(2 << 20) - 1)
    if nbytes == 0:
        nbytes = 1
    return (nbytes + 511) & ~(<size_t>511)


cdef class ArrayPool(BlockPool):
    """Device memory of :class:`~vyre_cuda.DeviceArray` objects, reused; one per device, for the
    life of the process (arrays outlive backends).

    A dead array's block may still be read on streams vyre_cuda never sees, so it waits in
    ``quarantine`` until a context synchronize begun after the drop returns. One synchronize frees
    many: it runs once ARRAY_FLUSH_BLOCKS blocks or ARRAY_FLUSH_BYTES wait, never where the caller
    must not wait (``may_wait`` False) nor while a capture is open (it would break the capture).

    Every driver call pushes the retained primary context. Dropping an array makes no driver call
    unless the cache is over ``cap_bytes``.
    """

    def __init__(self, size_t cap_bytes=256 << 20, uintptr_t ctx=0, int device=0):
        self.device = device

    cdef int _pop(self, size_t block, uintptr_t* out) noexcept:
        """A free (synchronized) block of exactly ``block`` bytes: 1. Else 2 when the quarantine
        is due a synchronize, 0 when not."""
        cdef int found = 0
        lock_with_gil(self.mu)
        if self._pop_free(block, out):
            found = 1
        elif self.quarantine.size() >= ARRAY_FLUSH_BLOCKS or self.quarantined_bytes >= ARRAY_FLUSH_BYTES:
            found = 2
        self.mu.unlock()
        return found

    cdef int take(self, size_t block, bint may_wait, uintptr_t* out) except -1:
        """A block of ``block`` bytes for a new array: a free one, else one the quarantine gives
        after a synchronize (when due and ``may_wait``), else a new allocation."""
        cdef int found = self._pop(block, out)
        if found == 1:
            return 0
        if found == 2 and may_wait and self._flush() and self._pop(block, out) == 1:
            return 0
        self._alloc(block, out)
        lock_with_gil(self.mu)
        self.misses += 1
        self.mu.unlock()
        self._count_alloc(block)
        return 0

    cdef void give_back(self, uintptr_t ptr, size_t block) noexcept:
        """The block of an array that died: quarantined, or freed at once over the cap."""
        cdef bint keep
        cdef cydriver.CUcontext prev
        lock_with_gil(self.mu)
        self.live_bytes -= block
        keep = not self.closed and self.cached_bytes + block <= self.cap_bytes
        if keep:
            self.quarantine.push_back(pair[uintptr_t, size_t](ptr, block))
            self.quarantined_bytes += block
            self.cached_bytes += block
        else:
            self.allocated_bytes -= block
        self.mu.unlock()
        if not keep and self.ctx != NULL:  # (NULL: the context was reset; the memory went with it)
            with nogil:
                if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                    cydriver.cuMemFree(<cydriver.CUdeviceptr>ptr)
                    cydriver.cuCtxPopCurrent(&prev)

    cdef bint _flush(self) noexcept:
        """Synchronize the context, then make every block quarantined before it free. False when
        it did not run or failed (a capture open, a driver error): the blocks stay quarantined.
        The synchronize goes through the capture gate and does not wait there: while a capture is
        open it is refused at once."""
        cdef vector[pair[uintptr_t, size_t]] taken
        cdef cydriver.CUresult st = cydriver.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        cdef cydriver.CUcontext prev
        cdef size_t i
        lock_with_gil(self.mu)
        taken.swap(self.quarantine)  # what is dropped from here on waits for the next one
        self.mu.unlock()
        if taken.empty():
            return True
        with nogil:
            if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                st = synchronize_current(0.0)
                cydriver.cuCtxPopCurrent(&prev)
        lock_with_gil(self.mu)
        if st == cydriver.CUDA_SUCCESS:
            for i in range(taken.size()):
                self.free_blocks[taken[i].second].push_back(taken[i].first)
                self.quarantined_bytes -= taken[i].second
            self.flushes += 1
        else:
            self.quarantine.insert(self.quarantine.end(), taken.begin(), taken.end())
            self.refused_flushes += 1
        self.mu.unlock()
        return st == cydriver.CUDA_SUCCESS

    cdef int _alloc(self, size_t block, uintptr_t* out) except -1:
        cdef cydriver.CUdeviceptr ptr = 0
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS, pushed
        cdef cydriver.CUcontext prev
        cdef int attempt
        for attempt in range(2):
            with nogil:
                pushed = cydriver.cuCtxPushCurrent(self.ctx)
                if pushed == cydriver.CUDA_SUCCESS:
                    st = cydriver.cuMemAlloc(&ptr, block)
                    cydriver.cuCtxPopCurrent(&prev)
            check_cu(pushed, b"cuCtxPushCurrent")
            if st != cydriver.CUDA_ERROR_OUT_OF_MEMORY or attempt or not self.cached_bytes:
                break
            self.trim()  # the cache's own memory first, then once more
        check_cu(st, b"cuMemAlloc")
        out[0] = <uintptr_t>ptr
        return 0

    cdef cydriver.CUresult _free(self, uintptr_t ptr) noexcept nogil:
        return cydriver.cuMemFree(<cydriver.CUdeviceptr>ptr)  # (the caller pushed the context)

    def trim(self):
        """Synchronize (skipped while a capture is open: the quarantined blocks then wait for a
        later trim), then free every free block. Safe from any thread at any time."""
        cdef cydriver.CUcontext prev
        cdef cydriver.CUresult st, pushed
        self._flush()
        if self.free_blocks.empty():  # (a racy read: a block freed meanwhile waits for the next trim)
            return
        with nogil:
            pushed = cydriver.cuCtxPushCurrent(self.ctx)
        check_cu(pushed, b"cuCtxPushCurrent")
        st = self._free_cached()
        with nogil:
            cydriver.cuCtxPopCurrent(&prev)
        check_cu(st, b"trim (free a cached block)")

    def forget_context(self):
        """The device's primary context was reset (``vyre_cuda.reset_device``): every block died
        with it. Drop them all without a driver call; arrays still alive give theirs back to
        nothing."""
        lock_with_gil(self.mu)
        self.quarantine.clear()
        self.cached_bytes -= self.quarantined_bytes
        self.allocated_bytes -= self.quarantined_bytes
        self.quarantined_bytes = 0
        self.mu.unlock()
        BlockPool.forget_context(self)

    def stats(self):
        """The pool's counters, read together under its lock."""
        lock_with_gil(self.mu)
        out = (self.hits, self.misses, self.alloc_calls, self.cached_bytes, self.live_bytes,
               self.allocated_bytes, self.quarantined_bytes, self.quarantine.size(), self.flushes,
               self.refused_flushes)
        self.mu.unlock()
        return dict(zip(("hits", "misses", "alloc_calls", "cached_bytes", "live_bytes", "allocated_bytes",
                         "quarantined_bytes", "quarantined_blocks", "flushes", "refused_flushes"), out))
