# cython: language_level=3
"""What crosses the staging ring in which window, and which caller memory is page-locked.

Pure C (no driver call but the pointer-attribute query), asked per window by the
:class:`~vyre_cuda._transfer.TransferEngine`; tests call the ``plan_*_windows`` views.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE
from libc.stdint cimport uintptr_t
from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from posix.time cimport nanosleep, timespec
from cuda.bindings cimport cydriver

cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    int a_load "vyre::load"(const int* p)
    void a_store "vyre::store"(int* p, int v)
    long long a_add "vyre::add"(long long* p, long long v)
    long long a_loadll "vyre::loadll"(const long long* p)

cdef extern from *:
    """
    static thread_local int vyre_gate_mine = 0;  /* this thread's holds of the direct gate */
    """
    int gate_mine "vyre_gate_mine"

cdef enum:
    WINDOW_ALIGN = 64 << 10


cdef bint page_locked(const void* ptr, size_t nbytes) noexcept nogil:
    """Whether [ptr, ptr + nbytes) lies in one page-locked allocation the driver knows. Never
    cached: memory can be freed and reallocated between dispatches."""
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


cdef size_t locked_run(const void* ptr, size_t nbytes) noexcept nogil:
    """How many of [ptr, ptr + nbytes)'s first bytes one driver copy may take: up to the end of
    the page-locked allocation ptr lies in, if any (the driver refuses a copy that starts in one
    and runs past its end, and a heap neighbour can start in a registered array's last page)."""
    cdef cydriver.CUpointer_attribute attrs[3]
    cdef void* data[3]
    cdef unsigned int memtype = 0
    cdef cydriver.CUdeviceptr start = 0
    cdef size_t size = 0
    cdef uintptr_t p = <uintptr_t>ptr
    attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
    attrs[2] = cydriver.CU_POINTER_ATTRIBUTE_RANGE_SIZE
    data[0] = &memtype
    data[1] = &start
    data[2] = &size
    if nbytes == 0 or cydriver.cuPointerGetAttributes(3, attrs, data, <cydriver.CUdeviceptr>p) != cydriver.CUDA_SUCCESS:
        return nbytes
    if memtype != cydriver.CU_MEMORYTYPE_HOST or size == 0 or p < <uintptr_t>start:
        return nbytes
    if p + nbytes <= <uintptr_t>start + size:
        return nbytes
    return <uintptr_t>start + size - p


# Ranges registered only by the automatic policy (_hostreg's list): the caller may reuse such an
# input at once, so an async dispatch still copies it before returning instead of a late DMA.
cdef mutex _auto_mu
cdef vector[uintptr_t] _auto_spans  # start, end, start, end, ...
cdef int _auto_count = 0  # atomic: the fast test when the policy registered nothing


cdef bint auto_registered(const void* ptr, size_t nbytes) noexcept nogil:
    """Whether [ptr, ptr + nbytes) overlaps a range registered only by the automatic policy."""
    cdef uintptr_t p = <uintptr_t>ptr
    cdef size_t k
    cdef bint hit = False
    if a_load(&_auto_count) == 0 or nbytes == 0:
        return False
    _auto_mu.lock()
    k = 0
    while k < _auto_spans.size():
        if _auto_spans[k] < p + nbytes and p < _auto_spans[k + 1]:
            hit = True
            break
        k += 2
    _auto_mu.unlock()
    return hit


def set_auto_registered(spans):
    """Publish the ranges registered only by the automatic policy: (start, end) pairs."""
    cdef vector[uintptr_t] flat
    for start, end in spans:
        flat.push_back(start)
        flat.push_back(end)
    with nogil:
        _auto_mu.lock()
        _auto_spans.swap(flat)
        a_store(&_auto_count, <int>(_auto_spans.size() // 2))
        _auto_mu.unlock()


def is_auto_registered(uintptr_t address, size_t nbytes):
    """Python view of :func:`auto_registered` (for tests)."""
    cdef bint r
    with nogil:
        r = auto_registered(<const void*>address, nbytes)
    return r


# The direct gate (notes/registered-numpy.md): direct DMA to or from caller memory only while
# holding it, so _hostreg unregisters a range (which does not wait for DMA in flight) only with the
# gate closed and no holder left. A dispatch finding it closing stages instead, never waits. Dekker
# style, seq-cst: a holder counts itself then reads `closing`; the registry the reverse.
cdef long long _gate_holders = 0
cdef long long _gate_closing = 0


cdef bint direct_enter() noexcept nogil:
    """Hold the gate (True), or find it closing (False: no direct DMA for this dispatch now)."""
    global gate_mine
    a_add(&_gate_holders, 1)
    if a_loadll(&_gate_closing):
        a_add(&_gate_holders, -1)
        return False
    gate_mine += 1
    return True


cdef void direct_leave() noexcept nogil:
    global gate_mine
    gate_mine -= 1
    a_add(&_gate_holders, -1)


def close_direct_gate():
    """Close the gate and wait, without the GIL, until no dispatch holds it. False (gate left
    open) on a thread that holds the gate itself: it cannot wait for itself."""
    cdef timespec nap
    cdef long interval = 1000
    if gate_mine > 0:
        return False
    a_add(&_gate_closing, 1)
    with nogil:
        while a_loadll(&_gate_holders) != 0:
            nap.tv_sec = 0
            nap.tv_nsec = interval
            nanosleep(&nap, NULL)
            if interval < 200000:
                interval *= 2
    return True


def open_direct_gate():
    a_add(&_gate_closing, -1)


def direct_gate_state():
    """(holders, closing): for tests."""
    return a_loadll(&_gate_holders), a_loadll(&_gate_closing)


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


cdef size_t window_bytes(size_t total, size_t chunk, size_t minimum) noexcept nogil:
    """The window ``total`` staged bytes are cut into: about an eighth (so even 4 MiB overlaps
    copy and DMA), clamped to [``minimum``, chunk]."""
    return _window(total, chunk, minimum)


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


def plan_upload_windows(list sources, list direct, size_t staged_total, size_t chunk_bytes,
                        size_t min_window=MIN_WINDOW):
    """Pure view of the upload windowing, for property tests.

    ``sources``: (offset, n, kind, index, src_offset) runs (kind 0 zero, 1 input, 2 params);
    ``direct``: per input index. Input ``i``'s bytes are addressed as ``(i + 1) << 40`` and the
    params blob as ``1 << 60`` so tests can check where every byte comes from; ``min_window``: the
    smallest window (a transfer engine's default unless given). Returns the window size and a list
    of windows, each ``(pieces, tasks)`` with pieces ``(device offset, slot offset, n)`` and tasks
    ``(slot offset, source address or None, n)``.
    """
    cdef vector[Source] srcs
    cdef vector[char] flags
    cdef vector[const char*] ptrs
    cdef vector[Piece] pieces
    cdef vector[CopyTask] tasks
    cdef Source src
    cdef Cursor cur
    cdef size_t window = window_bytes(staged_total, chunk_bytes, min_window)
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


def plan_readback_windows(list pieces, list direct, size_t chunk_bytes,
                          size_t min_window=MIN_READBACK_WINDOW):
    """Pure view of the readback windowing: ``pieces`` are (device offset, host address, n);
    ``min_window``: the smallest window (a transfer engine's default unless given). Returns the
    window size and windows of ``(dmas, tasks)``: dmas ``(device offset, slot offset,
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
    cdef size_t window = window_bytes(staged, chunk_bytes, min_window)
    out = []
    cur.i = cur.pos = 0
    while next_readback_window(&cur, ps.data(), ps.size(), flags.data(), window, dmas, tasks):
        out.append((
            [(d.dev_offset, <uintptr_t>d.host, d.n) for d in dmas],
            [(<uintptr_t>t.dst, <uintptr_t>t.src, t.n) for t in tasks],
        ))
    return window, out
