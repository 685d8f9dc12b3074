# cython: language_level=3
"""The transfer engine: large borrowed buffers cross PCIe through a fixed page-locked ring.

Pageable memory cannot be DMA'd; the driver's own path for it copies through small staging
buffers on one thread (7-8 GB/s on the H200's host), and page-locking a buffer per call costs more
than the copy (cuMemHostRegister of 256 MiB: 16 ms). So a backend keeps a small ring of
page-locked chunks, allocated once. An upload is cut into windows: persistent copy threads fill
window k+1 while the DMA of window k runs; a readback DMAs window k+1 while the threads copy window
k out. Inputs and outputs that are already page-locked (``vyre_cuda.pinned_empty`` arrays, or
memory the caller registered) skip the ring and DMA directly.

Everything here runs without the GIL. A ring slot is held only while one dispatch fills or drains
it; a dispatch waits for a free slot only when it holds none, so every holder makes progress.

Why one module of this size (about 600 lines): the ring, the direct-DMA decision and the upload and
readback loops share the engine's C state in ``nogil`` code; the copy threads themselves live in
_transfer.hpp.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE
from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, bind_context, now_ns
from ._pools cimport lock_with_gil

cdef enum:
    WINDOW_ALIGN = 64 << 10
    READBACK_DEPTH = 3          # readback windows in flight per dispatch (DMA ahead of copy-out)


cdef bint page_locked(const void* ptr, size_t nbytes) noexcept nogil:
    """Whether [ptr, ptr + nbytes) lies in one page-locked allocation the driver knows (allocated
    with cuMemHostAlloc or registered with cuMemHostRegister). Asked per dispatch, never cached:
    memory can be freed and reallocated between dispatches."""
    cdef cydriver.CUpointer_attribute attrs[4]
    cdef void* data[4]
    cdef unsigned int memtype = 0
    cdef cydriver.CUdeviceptr start = 0
    cdef size_t size = 0
    cdef unsigned long long buffer_id = 0, last_id = 0
    cdef uintptr_t p = <uintptr_t>ptr
    if nbytes == 0 or ptr == NULL:
        return False
    attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
    attrs[2] = cydriver.CU_POINTER_ATTRIBUTE_RANGE_SIZE
    attrs[3] = cydriver.CU_POINTER_ATTRIBUTE_BUFFER_ID
    data[0] = &memtype
    data[1] = &start
    data[2] = &size
    data[3] = &buffer_id
    # unknown (pageable) pointers succeed with zeroed attributes
    if cydriver.cuPointerGetAttributes(4, attrs, data, <cydriver.CUdeviceptr>p) != cydriver.CUDA_SUCCESS:
        return False
    if memtype != cydriver.CU_MEMORYTYPE_HOST:
        return False
    if size:
        return <uintptr_t>start <= p and p + nbytes <= <uintptr_t>start + size
    # no range reported: the last byte must belong to the same allocation
    memtype = 0
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_BUFFER_ID
    data[1] = &last_id
    if cydriver.cuPointerGetAttributes(2, attrs, data, <cydriver.CUdeviceptr>(p + nbytes - 1)) != cydriver.CUDA_SUCCESS:
        return False
    return memtype == cydriver.CU_MEMORYTYPE_HOST and buffer_id != 0 and buffer_id == last_id


def buffer_span(obj, bint writable=True):
    """(address, nbytes) of a C-contiguous buffer."""
    cdef Py_buffer view
    flags = PyBUF_C_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0)
    PyObject_GetBuffer(obj, &view, flags)
    try:
        return <uintptr_t>view.buf, <size_t>view.len
    finally:
        PyBuffer_Release(&view)


def _stream_copy(dst, src, size_t dst_offset, size_t src_offset, size_t nbytes):
    """For tests: ``stream_copy`` of ``nbytes`` from ``src[src_offset:]`` (zeros when ``src`` is
    None) to ``dst[dst_offset:]``, bounds checked."""
    cdef Py_buffer d, s
    cdef const char* sp = NULL
    PyObject_GetBuffer(dst, &d, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        if dst_offset + nbytes > <size_t>d.len:
            raise ValueError("destination range out of bounds")
        if src is not None:
            PyObject_GetBuffer(src, &s, PyBUF_C_CONTIGUOUS)
            try:
                if src_offset + nbytes > <size_t>s.len:
                    raise ValueError("source range out of bounds")
                stream_copy(<char*>d.buf + dst_offset, <const char*>s.buf + src_offset, nbytes)
            finally:
                PyBuffer_Release(&s)
        else:
            stream_copy(<char*>d.buf + dst_offset, sp, nbytes)
    finally:
        PyBuffer_Release(&d)


def is_page_locked_address(uintptr_t address, size_t nbytes):
    """Python view of :func:`page_locked` (for tests and ``vyre_cuda.is_page_locked``)."""
    cdef bint r
    with nogil:
        r = page_locked(<const void*>address, nbytes)
    return r


# below this a window's driver calls cost more than its overlap buys
cdef size_t _min_window = 512 << 10
cdef size_t _min_readback_window = 1 << 20  # 4 MiB readbacks: 140 -> 104 us against 512 KiB


def _set_min_window(size_t nbytes, size_t readback=0):
    """For measurements only: the smallest window an upload (and a readback, when ``readback``
    is given) is cut into."""
    global _min_window, _min_readback_window
    _min_window = nbytes
    if readback:
        _min_readback_window = readback


cdef size_t window_bytes(size_t total, size_t chunk) noexcept nogil:
    """The window an upload of ``total`` staged bytes is cut into: about an eighth of it, so even
    a 4 MiB buffer overlaps copy and DMA with a short tail, between 512 KiB and the ring's chunk."""
    return _window(total, chunk, _min_window)


cdef size_t readback_window_bytes(size_t total, size_t chunk) noexcept nogil:
    """The window a readback of ``total`` staged bytes is cut into (its own minimum)."""
    return _window(total, chunk, _min_readback_window)


cdef inline size_t _window(size_t total, size_t chunk, size_t minimum) noexcept nogil:
    cdef size_t w = total // 8
    if w < minimum:
        w = minimum
    w = (w + WINDOW_ALIGN - 1) & ~(<size_t>WINDOW_ALIGN - 1)
    return w if w < chunk else chunk


cdef bint next_upload_window(Cursor* c, const Source* sources, size_t n_sources, const char* direct,
                             size_t window, const char** input_ptrs, const char* params,
                             vector[Piece]& pieces, vector[CopyTask]& tasks) noexcept nogil:
    """The next ring window of an upload. Fills ``pieces`` (device range <- slot offset, stored in
    ``host`` as an offset from NULL) and ``tasks`` (slot offset <- source bytes; a NULL source
    zeroes). Direct inputs are skipped. Returns False when nothing is left. Pure: no driver."""
    cdef size_t used = 0, take, dev_end = <size_t>-1
    cdef const Source* src
    cdef Piece piece
    cdef CopyTask t
    pieces.clear()
    tasks.clear()
    while used < window and c.i < n_sources:
        src = &sources[c.i]
        if src.n == 0 or (src.kind == SRC_INPUT and direct != NULL and direct[src.index]):
            c.i += 1
            c.pos = 0
            continue
        take = src.n - c.pos
        if take > window - used:
            take = window - used
        if src.offset + c.pos != dev_end:
            piece.dev_offset = src.offset + c.pos
            piece.host = <char*>used
            piece.n = 0
            pieces.push_back(piece)
        t.dst = <char*>used
        t.n = take
        if src.kind == SRC_INPUT:
            t.src = input_ptrs[src.index] + src.src_offset + c.pos
        elif src.kind == SRC_PARAMS:
            t.src = params + src.src_offset + c.pos
        else:
            t.src = NULL
        tasks.push_back(t)
        pieces[pieces.size() - 1].n += take  # (indexing yields a reference; back() would copy)
        used += take
        c.pos += take
        dev_end = src.offset + c.pos
        if c.pos == src.n:
            c.i += 1
            c.pos = 0
    return used != 0


cdef bint next_readback_window(Cursor* c, const Piece* pieces, size_t n_pieces, const char* direct,
                               size_t window, vector[Piece]& dmas, vector[CopyTask]& tasks) noexcept nogil:
    """The next ring window of a readback: ``dmas`` (device range -> slot offset, in ``host``) and
    ``tasks`` (slot offset, in ``src`` -> caller memory). Direct pieces are skipped. Pure."""
    cdef size_t used = 0, take
    cdef Piece dma
    cdef CopyTask t
    dmas.clear()
    tasks.clear()
    while used < window and c.i < n_pieces:
        if pieces[c.i].n == 0 or (direct != NULL and direct[c.i]):
            c.i += 1
            c.pos = 0
            continue
        take = pieces[c.i].n - c.pos
        if take > window - used:
            take = window - used
        dma.dev_offset = pieces[c.i].dev_offset + c.pos
        dma.host = <char*>used
        dma.n = take
        dmas.push_back(dma)
        t.dst = pieces[c.i].host + c.pos
        t.src = <const char*>used
        t.n = take
        tasks.push_back(t)
        used += take
        c.pos += take
        if c.pos == pieces[c.i].n:
            c.i += 1
            c.pos = 0
    return used != 0


cdef inline bint _more(Cursor* c, const Piece* pieces, size_t n_pieces, const char* direct) noexcept nogil:
    # skip empty and direct pieces; True when staged bytes remain
    while c.i < n_pieces and (pieces[c.i].n == 0 or (direct != NULL and direct[c.i])):
        c.i += 1
        c.pos = 0
    return c.i < n_pieces


def plan_upload_windows(list sources, list direct, size_t staged_total, size_t chunk_bytes):
    """Pure view of the upload windowing, for property tests.

    ``sources``: (offset, n, kind, index, src_offset) runs (kind 0 zero, 1 input, 2 params);
    ``direct``: per input index. Input ``i``'s bytes are addressed as ``(i + 1) << 40`` and the
    params blob as ``1 << 60`` so tests can check where every byte comes from. Returns the window
    size and a list of windows, each ``(pieces, tasks)`` with pieces ``(device offset, slot
    offset, n)`` and tasks ``(slot offset, source address or None, n)``.
    """
    cdef vector[Source] srcs
    cdef vector[char] flags
    cdef vector[const char*] ptrs
    cdef vector[Piece] pieces
    cdef vector[CopyTask] tasks
    cdef Source src
    cdef Cursor cur
    cdef size_t window = window_bytes(staged_total, chunk_bytes)
    for offset, n, kind, index, src_offset in sources:
        src.offset, src.n, src.kind, src.index, src.src_offset = offset, n, kind, index, src_offset
        srcs.push_back(src)
    cdef char flag_c
    for i, flag in enumerate(direct):
        # (through a typed local: Cython 3.3 mistypes a conditional expression passed to push_back)
        flag_c = 1 if flag else 0
        flags.push_back(flag_c)
        ptrs.push_back(<const char*><uintptr_t>((i + 1) << 40))
    out = []
    cur.i = cur.pos = 0
    while next_upload_window(&cur, srcs.data(), srcs.size(), flags.data(), window, ptrs.data(),
                             <const char*><uintptr_t>(1 << 60), pieces, tasks):
        out.append((
            [(p.dev_offset, <uintptr_t>p.host, p.n) for p in pieces],
            [(<uintptr_t>t.dst, None if t.src == NULL else <uintptr_t>t.src, t.n) for t in tasks],
        ))
    return window, out


def plan_readback_windows(list pieces, list direct, size_t chunk_bytes):
    """Pure view of the readback windowing: ``pieces`` are (device offset, host address, n).
    Returns the window size and windows of ``(dmas, tasks)``: dmas ``(device offset, slot offset,
    n)``, tasks ``(host address, slot offset, n)``."""
    cdef vector[Piece] ps
    cdef vector[char] flags
    cdef vector[Piece] dmas
    cdef vector[CopyTask] tasks
    cdef Piece piece
    cdef Cursor cur
    cdef size_t staged = 0
    cdef char flag_c
    for (dev, host, n), flag in zip(pieces, direct):
        piece.dev_offset, piece.host, piece.n = dev, <char*><uintptr_t>host, n
        ps.push_back(piece)
        flag_c = 1 if flag else 0
        flags.push_back(flag_c)
        if not flag:
            staged += n
    cdef size_t window = readback_window_bytes(staged, chunk_bytes)
    out = []
    cur.i = cur.pos = 0
    while next_readback_window(&cur, ps.data(), ps.size(), flags.data(), window, dmas, tasks):
        out.append((
            [(d.dev_offset, <uintptr_t>d.host, d.n) for d in dmas],
            [(<uintptr_t>t.dst, <uintptr_t>t.src, t.n) for t in tasks],
        ))
    return window, out


cdef class TransferEngine:
    """A backend's staging ring (``n_chunks`` page-locked chunks of ``chunk_bytes``) and copy
    threads (``copy_threads`` besides the dispatching thread). Both start at the first large
    transfer; ``close()`` joins the threads and frees the ring."""

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

    cdef int ensure_ring(self) except -1:
        """Allocate the ring and its events once. Two threads' first large dispatches may arrive
        together: the allocation runs under ``ring_mu`` so exactly one ring exists, and the
        pointer is published only after its events (a dispatch that read one ring while another
        replaced it would DMA a window from the wrong ring)."""
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
                        self.pinned_alloc_calls += 1
                        self.ring_bytes = nbytes
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
        """Send the upload region to ``slab`` on stream ``s``: direct inputs straight from the
        caller's page-locked memory, everything else through the ring. While the copy threads
        fill window k+1, this thread enqueues the DMA of window k. Returns the first failure."""
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
        window = window_bytes(staged, self.chunk_bytes)
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
        # record even after a failed enqueue: the next holder must not overwrite a slot that a
        # queued DMA may still read
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
        """Bring ``pieces`` of ``slab`` to host memory once the work queued on ``s`` is done: direct
        pieces DMA straight into page-locked memory, the rest through the ring; while the threads
        copy window k out, this thread queues the DMA of the windows after it. Returns when every
        byte has landed."""
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
        window = readback_window_bytes(staged, self.chunk_bytes)
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
        self.ring = NULL
        self.ring_bytes = 0
        self.ctx = NULL
        self.closed = True

    def stop_threads(self):
        """Join the copy threads (idempotent; never needs the driver)."""
        with nogil:
            self.pool.stop()

    def close(self):
        """Join the copy threads and free the ring (idempotent). The backend calls it once no
        dispatch of its own is running (a ring slot is used only inside a dispatch call)."""
        cdef char* ring
        cdef vector[cydriver.CUevent] events
        cdef size_t i
        lock_with_gil(self.ring_mu)
        self.closed = True
        ring = self.ring
        self.ring = NULL
        events.swap(self.events)
        self.ring_bytes = 0
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
