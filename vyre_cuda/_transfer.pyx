# cython: language_level=3
"""The transfer engine: large borrowed buffers cross PCIe through a fixed page-locked ring.

The driver's pageable path is slow (7-8 GB/s on the H200's host) and page-locking per call costs
more than the copy, so a backend keeps a ring of page-locked chunks: copy threads fill window k+1
while window k's DMA runs (readbacks the reverse). Page-locked buffers DMA directly. Design and
measurements: notes/transfer-engine.md. Windowing lives in ``_windows``, the threads in
_transfer.hpp. All of it runs without the GIL; a dispatch waits for a ring slot only when it holds
none, so every holder makes progress.
"""

from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, bind_context, now_ns
from ._pools cimport lock_with_gil
from ._windows cimport (CopyTask, Cursor, Piece, Source, SRC_INPUT, MIN_WINDOW, MIN_READBACK_WINDOW,
                        window_bytes, next_upload_window, next_readback_window)

cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    void a_count "vyre::count"(unsigned long long* p, unsigned long long v)
    unsigned long long a_read "vyre::read"(const unsigned long long* p)
    void a_clear "vyre::clear"(unsigned long long* p)

cdef enum:
    READBACK_DEPTH = 3          # readback windows in flight per dispatch (DMA ahead of copy-out)


cdef inline bint _more(Cursor* c, const Piece* pieces, size_t n_pieces, const char* direct) noexcept nogil:
    # skip empty and direct pieces; True when staged bytes remain
    while c.i < n_pieces and (pieces[c.i].n == 0 or (direct != NULL and direct[c.i])):
        c.i += 1
        c.pos = 0
    return c.i < n_pieces


cdef class TransferEngine:
    """A backend's staging ring (``n_chunks`` x ``chunk_bytes``) and ``copy_threads`` copy threads,
    started at the first large transfer; ``close()`` joins and frees them."""

    def __init__(self, uintptr_t ctx, size_t chunk_bytes=8 << 20, int n_chunks=4, int copy_threads=8,
                 size_t min_split=64 << 10):
        self.ctx = <cydriver.CUcontext>ctx
        self.chunk_bytes = chunk_bytes
        self.n_chunks = n_chunks
        self.copy_threads = copy_threads
        self.min_split = min_split
        self.pool.configure(copy_threads, min_split)
        self.slots.reset(n_chunks)
        # Measured on the H200 (notes/transfer-engine.md): non-temporal stores into the ring cut the
        # host copy of an 8 MiB upload by a third (241 -> 154 us) and help up to 32 MiB uploads,
        # but slow 128-512 MiB uploads by 25-50%; on readback they made no measurable difference.
        self.stream_upload_max = 32 << 20
        self.stream_readback_max = 0
        self.min_window = MIN_WINDOW
        self.min_readback_window = MIN_READBACK_WINDOW
        self.streamed_copy_mode = COPY_PLAIN

    cdef int ensure_ring(self) except -1:
        """Allocate the ring and its events once, under ``ring_mu``, publishing the pointer after
        the events (a dispatch must never DMA from a ring being replaced)."""
        cdef void* ptr = NULL
        cdef cydriver.CUevent ev = NULL
        cdef size_t nbytes = self.chunk_bytes * <size_t>self.n_chunks
        cdef int k, _k
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef const char* call = b"cuMemHostAlloc"
        cdef bint closed
        if load_acquire(&self.ring) != NULL:
            return 0
        with nogil:
            bind_context(self.ctx)
        lock_with_gil(self.ring_mu)
        closed = self.closed
        if self.ring == NULL and not closed:
            with nogil:
                st = cydriver.cuMemHostAlloc(&ptr, nbytes, cydriver.CU_MEMHOSTALLOC_PORTABLE)
                if st == cydriver.CUDA_SUCCESS:
                    call = b"cuEventCreate"
                    for _k in range(self.n_chunks):
                        st = cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING)
                        if st != cydriver.CUDA_SUCCESS:
                            break
                        self.events.push_back(ev)
                    if st != cydriver.CUDA_SUCCESS:
                        for k in range(<int>self.events.size()):
                            cydriver.cuEventDestroy(self.events[k])
                        self.events.clear()
                        cydriver.cuMemFreeHost(ptr)
                    else:
                        a_count(&self._pinned_alloc_calls, 1)
                        self._ring_bytes = nbytes
                        store_release(&self.ring, <char*>ptr)
        self.ring_mu.unlock()
        if closed:
            from .errors import ValidationError
            raise ValidationError("this backend's transfer engine is closed", "create a new CudaBackend()")
        check_cu(st, call)
        return 0

    cdef void wake(self) noexcept nogil:
        self.pool.wake()

    cdef cydriver.CUresult upload(self, cydriver.CUstream s, cydriver.CUdeviceptr slab,
                                  const Source* sources, size_t n_sources, const char** input_ptrs,
                                  const char* direct, const char* params,
                                  unsigned long long* copy_ns, unsigned long long* ops,
                                  const char** call) noexcept nogil:
        """Send the upload region to ``slab`` on ``s``: direct inputs straight, the rest through the
        ring. Returns the first failure."""
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef size_t i, staged = 0, window
        cdef const Source* src
        cdef vector[CopyTask] tasks[2]
        cdef vector[Piece] pieces[2]
        cdef Cursor cur
        cdef int k, k_next, started, idx = 0, nxt
        cdef bint more, streaming
        cdef unsigned long long t0
        for i in range(n_sources):
            src = &sources[i]
            if src.kind == SRC_INPUT and direct[src.index]:
                # first on the stream: the DMA engine starts while the threads copy the rest
                ops[0] += 1
                call[0] = b"cuMemcpyHtoDAsync"
                st = cydriver.cuMemcpyHtoDAsync(slab + src.offset, input_ptrs[src.index] + src.src_offset,
                                                src.n, s)
                if st != cydriver.CUDA_SUCCESS:
                    return st
            else:
                staged += src.n
        window = window_bytes(staged, self.chunk_bytes, self.min_window)
        streaming = staged <= self.stream_upload_max
        cur.i = cur.pos = 0
        if not next_upload_window(&cur, sources, n_sources, direct, window, input_ptrs, params,
                                  pieces[0], tasks[0]):
            return cydriver.CUDA_SUCCESS
        k = self.slots.acquire()
        st = self._claim(k, tasks[0], call)
        if st != cydriver.CUDA_SUCCESS:
            self.slots.release(k)
            return st
        t0 = now_ns()
        started = self.pool.start(tasks[0].data(), tasks[0].size(), streaming)
        while True:
            nxt = 1 - idx
            # prepare the next window while the threads copy this one
            more = next_upload_window(&cur, sources, n_sources, direct, window, input_ptrs, params,
                                      pieces[nxt], tasks[nxt])
            k_next = self.slots.try_acquire() if more else -1  # never block while holding a slot
            if k_next >= 0:
                st = self._claim(k_next, tasks[nxt], call)
            self.pool.finish(started)
            copy_ns[0] += now_ns() - t0
            if k_next >= 0 and st == cydriver.CUDA_SUCCESS:
                t0 = now_ns()
                started = self.pool.start(tasks[nxt].data(), tasks[nxt].size(), streaming)
            else:
                started = 1
            if st == cydriver.CUDA_SUCCESS:
                st = self._send(k, pieces[idx], slab, s, ops, call)
            else:
                self._send(k, pieces[idx], slab, s, ops, call)  # (the slot's event is recorded)
            self.slots.release(k)
            if st != cydriver.CUDA_SUCCESS or not more:
                self.pool.finish(started)
                if k_next >= 0:
                    self.slots.release(k_next)
                return st
            if k_next < 0:
                k_next = self.slots.acquire()  # this thread holds no slot now
                st = self._claim(k_next, tasks[nxt], call)
                if st != cydriver.CUDA_SUCCESS:
                    self.slots.release(k_next)
                    return st
                t0 = now_ns()
                started = self.pool.start(tasks[nxt].data(), tasks[nxt].size(), streaming)
            k = k_next
            idx = nxt

    cdef cydriver.CUresult _claim(self, int k, vector[CopyTask]& tasks, const char** call) noexcept nogil:
        """Make slot ``k`` writable by the host (its previous DMA, any dispatch's, is done) and
        point ``tasks`` (slot offsets) at it."""
        cdef size_t i
        cdef char* slot = self.ring + <size_t>k * self.chunk_bytes
        call[0] = b"cuEventSynchronize"
        cdef cydriver.CUresult st = cydriver.cuEventSynchronize(self.events[k])
        for i in range(tasks.size()):
            tasks[i].dst = slot + <size_t>tasks[i].dst
        return st

    cdef cydriver.CUresult _send(self, int k, vector[Piece]& pieces, cydriver.CUdeviceptr slab,
                                 cydriver.CUstream s, unsigned long long* ops, const char** call) noexcept nogil:
        """Enqueue the DMA of slot ``k``'s pieces and record the slot's event after it."""
        cdef size_t i
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS, rec
        cdef char* slot = self.ring + <size_t>k * self.chunk_bytes
        for i in range(pieces.size()):
            call[0] = b"cuMemcpyHtoDAsync"
            st = cydriver.cuMemcpyHtoDAsync(slab + pieces[i].dev_offset, slot + <size_t>pieces[i].host,
                                            pieces[i].n, s)
            if st != cydriver.CUDA_SUCCESS:
                break
        # record even after a failed enqueue: a queued DMA may still read the slot
        rec = cydriver.cuEventRecord(self.events[k], s)
        if rec != cydriver.CUDA_SUCCESS and st == cydriver.CUDA_SUCCESS:
            call[0] = b"cuEventRecord"
            st = rec
        ops[0] += pieces.size()
        ops[1] += 1
        return st

    cdef cydriver.CUresult _queue_readback(self, Cursor* cur, const Piece* pieces, size_t n_pieces,
                                           const char* direct, size_t window, bint may_block,
                                           cydriver.CUstream s, cydriver.CUdeviceptr slab,
                                           int* held_slot, vector[CopyTask]* held_tasks, int head,
                                           int* nheld, unsigned long long* ops, const char** call) noexcept nogil:
        """Queue readback windows (D2H into ring slots) until READBACK_DEPTH are held or nothing
        is left; blocks for a slot only when ``may_block`` and none is held."""
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS, rec
        cdef vector[Piece] dmas
        cdef int k, index
        cdef size_t i
        cdef char* slot
        while nheld[0] < READBACK_DEPTH and _more(cur, pieces, n_pieces, direct):
            k = self.slots.acquire() if (may_block and nheld[0] == 0) else self.slots.try_acquire()
            if k < 0:
                break
            index = (head + nheld[0]) % READBACK_DEPTH
            next_readback_window(cur, pieces, n_pieces, direct, window, dmas, held_tasks[index])
            held_slot[index] = k
            nheld[0] += 1
            slot = self.ring + <size_t>k * self.chunk_bytes
            # the GPU writes this slot: order after its previous DMA on the GPU, not the host
            call[0] = b"cuStreamWaitEvent"
            st = cydriver.cuStreamWaitEvent(s, self.events[k], 0)
            for i in range(dmas.size()):
                if st != cydriver.CUDA_SUCCESS:
                    break
                call[0] = b"cuMemcpyDtoHAsync"
                st = cydriver.cuMemcpyDtoHAsync(slot + <size_t>dmas[i].host, slab + dmas[i].dev_offset,
                                                dmas[i].n, s)
                ops[0] += 1
            for i in range(held_tasks[index].size()):
                held_tasks[index][i].src = slot + <size_t>held_tasks[index][i].src
            rec = cydriver.cuEventRecord(self.events[k], s)
            if rec != cydriver.CUDA_SUCCESS and st == cydriver.CUDA_SUCCESS:
                call[0] = b"cuEventRecord"
                st = rec
            ops[1] += 1
            if st != cydriver.CUDA_SUCCESS:
                break
        return st

    cdef cydriver.CUresult readback(self, cydriver.CUstream s, cydriver.CUdeviceptr slab,
                                    const Piece* pieces, size_t n_pieces, const char* direct,
                                    unsigned long long* ops, const char** call) noexcept nogil:
        """Bring ``pieces`` of ``slab`` to host memory after the work on ``s``: direct pieces DMA
        straight, the rest through the ring. Returns when every byte has landed."""
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef size_t i, staged = 0, window
        cdef bint any_direct = False
        cdef int held_slot[READBACK_DEPTH]
        cdef vector[CopyTask] held_tasks[READBACK_DEPTH]
        cdef int head = 0, nheld = 0, k, started
        cdef bint streaming
        cdef Cursor cur
        for i in range(n_pieces):
            if direct != NULL and direct[i]:
                any_direct = True
                ops[0] += 1
                call[0] = b"cuMemcpyDtoHAsync"
                st = cydriver.cuMemcpyDtoHAsync(pieces[i].host, slab + pieces[i].dev_offset, pieces[i].n, s)
                if st != cydriver.CUDA_SUCCESS:
                    return st
            else:
                staged += pieces[i].n
        if staged:
            self.pool.wake()  # the copy threads wake during the first window's DMA
        window = window_bytes(staged, self.chunk_bytes, self.min_readback_window)
        streaming = staged <= self.stream_readback_max
        cur.i = cur.pos = 0
        while True:
            if st == cydriver.CUDA_SUCCESS:
                st = self._queue_readback(&cur, pieces, n_pieces, direct, window, True, s, slab,
                                          held_slot, held_tasks, head, &nheld, ops, call)
            if nheld == 0:
                break
            k = held_slot[head]
            if st == cydriver.CUDA_SUCCESS:
                call[0] = b"cuEventSynchronize"
                st = cydriver.cuEventSynchronize(self.events[k])
            if st == cydriver.CUDA_SUCCESS:
                started = self.pool.start(held_tasks[head].data(), held_tasks[head].size(), streaming)
                # keep the DMA engine busy with the next windows while this one is copied out
                st = self._queue_readback(&cur, pieces, n_pieces, direct, window, False, s, slab,
                                          held_slot, held_tasks, head, &nheld, ops, call)
                self.pool.finish(started)
            else:
                # a failure: drain what is queued (best effort) before the slot goes back
                cydriver.cuEventSynchronize(self.events[k])
            self.slots.release(k)
            head = (head + 1) % READBACK_DEPTH
            nheld -= 1
        if st == cydriver.CUDA_SUCCESS and any_direct:
            call[0] = b"cuStreamSynchronize"
            st = cydriver.cuStreamSynchronize(s)
        return st

    @property
    def ring_bytes(self):
        """Bytes of the page-locked staging ring (0 before the first large transfer and after close)."""
        lock_with_gil(self.ring_mu)
        n = self._ring_bytes
        self.ring_mu.unlock()
        return n

    @property
    def pinned_alloc_calls(self):
        """Page-locked ring allocations made (telemetry)."""
        return a_read(&self._pinned_alloc_calls)

    def reset_pinned_alloc_calls(self):
        a_clear(&self._pinned_alloc_calls)

    @property
    def live_threads(self):
        """Copy threads running now (0 before the first large transfer and after close)."""
        return self.pool.live_threads()

    @property
    def parallel_jobs(self):
        return self.pool.parallel_jobs()

    def free_slots(self):
        return self.slots.free_count()

    def forget_context(self):
        """The context is gone: join the threads; the ring and its events died with it."""
        with nogil:
            self.pool.stop()
        self.events.clear()
        lock_with_gil(self.ring_mu)
        self.ring = NULL
        self._ring_bytes = 0
        self.ring_mu.unlock()
        self.ctx = NULL
        self.closed = True

    def stop_threads(self):
        """Join the copy threads (idempotent; never needs the driver)."""
        with nogil:
            self.pool.stop()

    def close(self):
        """Join the copy threads and free the ring (idempotent; no dispatch may be running)."""
        cdef char* ring
        cdef vector[cydriver.CUevent] events
        cdef size_t i
        lock_with_gil(self.ring_mu)
        self.closed = True
        ring = self.ring
        self.ring = NULL
        events.swap(self.events)
        self._ring_bytes = 0
        self.ring_mu.unlock()
        with nogil:  # (freed without the GIL: see __dealloc__)
            self.pool.stop()
            if ring != NULL:
                bind_context(self.ctx)
                for i in range(events.size()):
                    cydriver.cuEventDestroy(events[i])
                cydriver.cuMemFreeHost(ring)

    def __dealloc__(self):
        # dropped without close(): join the threads (they never need the GIL), free the ring.
        # The ring and its events are taken out first (no other reference exists: no lock), then
        # freed without the GIL: cuMemFreeHost and cuEventDestroy may wait on the device, and
        # holding the GIL there can deadlock with a thread that needs the GIL to finish work the
        # driver waits for (RMM's device_buffer.pyx frees the same way).
        cdef cydriver.CUcontext prev
        cdef vector[cydriver.CUevent] events
        cdef char* ring = self.ring
        cdef cydriver.CUcontext ctx = self.ctx
        cdef size_t i
        self.ring = NULL
        events.swap(self.events)
        with nogil:
            self.pool.stop()
            if ring != NULL and ctx != NULL:
                if cydriver.cuCtxPushCurrent(ctx) == cydriver.CUDA_SUCCESS:
                    for i in range(events.size()):
                        cydriver.cuEventDestroy(events[i])
                    cydriver.cuMemFreeHost(ring)
                    cydriver.cuCtxPopCurrent(&prev)
