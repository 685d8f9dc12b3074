# cython: language_level=3
"""The streamed route: an elementwise dispatch cut into chunks of rows, pipelined over a few streams.

Planning (:mod:`vyre_cuda.planning.stream`) fixes chunks, streams and layout; this module executes
it without the GIL (design: notes/streamed-dispatch.md). After a shared region uploaded once, chunk
``k`` runs on stream and slot ``k % S``: cut inputs H2D, pure outputs zeroed, its launch(es) (a
smaller dispatch of the same program), outputs D2H, then the slot's event. Before refilling a
staging slot the host waits on that event (recorded by chunk ``k - S``), copying ``k - S``'s outputs
out and chunk ``k``'s inputs in as one job. Side streams fork after the shared upload and join at
the end, so the dispatch's done event covers every chunk. All page-locked: no host wait at all.
"""

from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._resources cimport InFlight
from ._transfer cimport TransferEngine, COPY_BY_RULE, COPY_STREAMING
from ._windows cimport CopyTask
from ._prepared cimport Prepared, StreamCut, ChunkShape, MAX_ARGS
from ._waits cimport PendingDispatch


# How the copy threads write (TransferEngine.streamed_copy_mode): plain stores by default, the
# fastest measured on an H200 host (notes/streamed-dispatch.md): copy-in and copy-out share a job,
# and non-temporal stores of one compete with the loads of the other.


cdef inline size_t _pad16(size_t n) noexcept nogil:
    return (n + 15) & ~(<size_t>15)


cdef inline const ChunkShape* _shape(Prepared p, size_t k) noexcept nogil:
    return &p.s_last if k + 1 == p.s_chunks else &p.s_full


cdef inline cydriver.CUstream _stream(InFlight* f, int j) noexcept nogil:
    return f.stream if j == 0 else f.side[j - 1]


cdef inline bint _staged_output(PendingDispatch d, int output) noexcept nogil:
    return not d.out_direct[output] and d.s_out_dev[output] == 0


cdef bint _staged_outputs(PendingDispatch d, Prepared p) noexcept nogil:
    cdef size_t i
    for i in range(p.s_cut.size()):
        if p.s_cut[i].readback and _staged_output(d, p.s_cut[i].output):
            return True
    return False


cdef bint _staged_inputs(PendingDispatch d, Prepared p) noexcept nogil:
    cdef size_t i
    for i in range(p.s_cut.size()):
        if p.s_cut[i].upload and not d.direct[p.s_cut[i].input]:
            return True
    return False


cdef void _copy_in(PendingDispatch d, Prepared p, size_t k, vector[CopyTask]& tasks) noexcept nogil:
    # chunk k's staged input rows into its upload staging slot
    cdef size_t i, begin = k * p.s_chunk_rows, rows = _shape(p, k).rows
    cdef char* slot = d.f.staging + (k % <size_t>d.s_used) * p.s_up
    cdef const StreamCut* c
    cdef CopyTask t
    for i in range(p.s_cut.size()):
        c = &p.s_cut[i]
        if c.upload and not d.direct[c.input]:
            t.dst = slot + c.up_offset
            t.src = d.input_ptrs[c.input] + begin * c.row_bytes
            t.n = rows * c.row_bytes
            tasks.push_back(t)


cdef void _copy_out(PendingDispatch d, Prepared p, size_t k, vector[CopyTask]& tasks) noexcept nogil:
    # chunk k's staged output rows from its readback staging slot to the caller's outputs
    cdef size_t i, begin = k * p.s_chunk_rows, rows = _shape(p, k).rows
    cdef char* slot = (d.f.staging + <size_t>p.s_streams * p.s_up
                       + (k % <size_t>d.s_used) * p.s_rb)
    cdef const StreamCut* c
    cdef CopyTask t
    for i in range(p.s_cut.size()):
        c = &p.s_cut[i]
        if c.readback and _staged_output(d, c.output):
            t.dst = d.out_pieces[c.output].host + begin * c.row_bytes
            t.src = slot + c.rb_offset
            t.n = rows * c.row_bytes
            tasks.push_back(t)


cdef void _run_copies(TransferEngine xfer, vector[CopyTask]& tasks) noexcept nogil:
    cdef size_t i, total = 0
    cdef bint streaming
    if tasks.size() == 0:
        return
    for i in range(tasks.size()):
        total += tasks[i].n
    streaming = (xfer.streamed_copy_mode == COPY_STREAMING
                 or (xfer.streamed_copy_mode == COPY_BY_RULE and total <= xfer.stream_upload_max))
    xfer.pool.run(tasks.data(), tasks.size(), streaming)


cdef cydriver.CUresult _enqueue(PendingDispatch d, Prepared p, size_t k, const char** call) noexcept nogil:
    """Chunk ``k``'s uploads, clears, launch(es), readbacks and slot event, on its stream."""
    cdef InFlight* f = &d.f
    cdef int j = <int>(k % <size_t>d.s_used)
    cdef cydriver.CUstream s = _stream(f, j)
    cdef const ChunkShape* shape = _shape(p, k)
    cdef size_t i, n, begin = k * p.s_chunk_rows
    cdef size_t n_args = p.s_cut.size() + p.s_whole.size()
    cdef cydriver.CUdeviceptr base = f.slab + p.s_shared + <size_t>j * p.s_slot
    cdef cydriver.CUdeviceptr dev
    cdef char* up = f.staging + <size_t>j * p.s_up
    cdef char* rb = f.staging + <size_t>p.s_streams * p.s_up + <size_t>j * p.s_rb
    cdef const StreamCut* c
    cdef unsigned long long argv[MAX_ARGS]
    cdef void* argp[MAX_ARGS]
    cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
    cdef int _it
    for i in range(p.s_cut.size()):
        c = &p.s_cut[i]
        dev = base + c.region_offset
        n = shape.rows * c.row_bytes
        argv[c.arg] = dev
        if c.upload:
            call[0] = b"cuMemcpyHtoDAsync"
            if d.direct[c.input]:
                st = cydriver.cuMemcpyHtoDAsync(dev, d.input_ptrs[c.input] + begin * c.row_bytes, n, s)
                d.s_direct_h2d += n
            else:
                st = cydriver.cuMemcpyHtoDAsync(dev, up + c.up_offset, n, s)
            d.ops[0] += 1
            if st == cydriver.CUDA_SUCCESS and n % 16:
                # the tail up to 16 bytes reads as zeros, as on the serial route
                call[0] = b"cuMemsetD8Async"
                st = cydriver.cuMemsetD8Async(dev + n, 0, _pad16(n) - n, s)
        elif c.clear:
            call[0] = b"cuMemsetD8Async"
            st = cydriver.cuMemsetD8Async(dev, 0, _pad16(n), s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    for i in range(p.s_whole.size()):
        argv[p.s_whole[i].arg] = f.slab + p.s_whole[i].offset
    argv[n_args] = f.slab + shape.params_offset
    for i in range(n_args + 1):
        argp[i] = &argv[i]
    for _it in range(p.iterations):
        call[0] = b"cuLaunchKernel"
        st = cydriver.cuLaunchKernel(p.function, shape.grid[0], shape.grid[1], shape.grid[2],
                                     p.block[0], p.block[1], p.block[2], p.shared_bytes, s, argp, NULL)
        if st != cydriver.CUDA_SUCCESS:
            return st
    for i in range(p.s_cut.size()):
        c = &p.s_cut[i]
        if not c.readback:
            continue
        dev = base + c.region_offset
        n = shape.rows * c.row_bytes
        if d.s_out_dev[c.output]:
            call[0] = b"cuMemcpyDtoDAsync"
            st = cydriver.cuMemcpyDtoDAsync(d.s_out_dev[c.output] + begin * c.row_bytes, dev, n, s)
        elif d.out_direct[c.output]:
            call[0] = b"cuMemcpyDtoHAsync"
            st = cydriver.cuMemcpyDtoHAsync(d.out_pieces[c.output].host + begin * c.row_bytes, dev, n, s)
        else:
            call[0] = b"cuMemcpyDtoHAsync"
            st = cydriver.cuMemcpyDtoHAsync(rb + c.rb_offset, dev, n, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    call[0] = b"cuEventRecord"
    return cydriver.cuEventRecord(f.side_events[j], s)


cdef void _quiesce(InFlight* f) noexcept nogil:
    # after a failure: nothing may still run on a side stream when the dispatch's resources go back
    # (the dispatch's own stream is synchronised by the core's failure path)
    cdef int j
    for j in range(f.n_side):
        cydriver.cuStreamSynchronize(f.side[j])


cdef cydriver.CUresult issue_streamed(PendingDispatch d, Prepared p, TransferEngine xfer,
                                      const char** call) noexcept nogil:
    """Every chunk enqueued (the host copies of staged inputs done, the outputs of all but the
    last ``S`` chunks copied out), the side streams joined into the dispatch's stream and its done
    event recorded; with ``d.s_drain`` (a blocking dispatch) the rest copied out as it lands.
    Returns the first failure (then nothing runs on the side streams any more)."""
    cdef InFlight* f = &d.f
    cdef int S, j
    cdef size_t k = 0, C = p.s_chunks
    cdef vector[CopyTask] tasks
    cdef unsigned long long copy_ns = 0
    cdef bint staged = _staged_inputs(d, p) or _staged_outputs(d, p)
    cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
    # nothing staged: every chunk is enqueued at once, on fewer streams (planning.stream says why)
    S = d.s_used = p.s_streams if staged else p.s_direct_streams
    d.s_issued = 0
    d.s_out = 0
    d.s_direct_h2d = 0
    if f.timed:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.t0, f.stream)
    if st == cydriver.CUDA_SUCCESS and p.upload_end:
        st = xfer.upload(f.stream, f.slab, p.sources.data(), p.sources.size(), d.input_ptrs.data(),
                         d.direct.data(), p.params_ptr, &copy_ns, d.ops, call)
    if st == cydriver.CUDA_SUCCESS and S > 1:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.side_events[p.s_streams], f.stream)
        j = 1
        while st == cydriver.CUDA_SUCCESS and j < S:
            call[0] = b"cuStreamWaitEvent"
            st = cydriver.cuStreamWaitEvent(f.side[j - 1], f.side_events[p.s_streams], 0)
            j += 1
    while st == cydriver.CUDA_SUCCESS and k < C:
        j = <int>(k % <size_t>S)
        tasks.clear()
        if k >= <size_t>S and staged:
            # slot j's previous chunk: its DMAs are done before its staging slots are refilled
            call[0] = b"cuEventSynchronize"
            st = cydriver.cuEventSynchronize(f.side_events[j])
            if st != cydriver.CUDA_SUCCESS:
                break
            _copy_out(d, p, k - S, tasks)
            d.s_out = k - S + 1
        _copy_in(d, p, k, tasks)
        _run_copies(xfer, tasks)
        st = _enqueue(d, p, k, call)
        k += 1  # (a failed chunk may be partly enqueued: it counts as issued)
    d.s_issued = k
    if st == cydriver.CUDA_SUCCESS:
        j = 1
        while st == cydriver.CUDA_SUCCESS and j < S and <size_t>j < C:
            call[0] = b"cuStreamWaitEvent"
            st = cydriver.cuStreamWaitEvent(f.stream, f.side_events[j], 0)
            j += 1
    if st == cydriver.CUDA_SUCCESS and f.timed:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.t1, f.stream)
    if st == cydriver.CUDA_SUCCESS and f.has_done:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.done, f.stream)
    if st != cydriver.CUDA_SUCCESS:
        _quiesce(f)
        return st
    if d.s_drain:
        return drain_streamed(d, p, xfer, call)
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult drain_streamed(PendingDispatch d, Prepared p, TransferEngine xfer,
                                      const char** call) noexcept nogil:
    """Copy out the chunks not yet copied out (the last ``S``: each is its slot's last event), each
    as soon as its readback lands."""
    cdef InFlight* f = &d.f
    cdef vector[CopyTask] tasks
    cdef cydriver.CUresult st
    cdef size_t k
    if not _staged_outputs(d, p):
        d.s_out = d.s_issued
        return cydriver.CUDA_SUCCESS
    while d.s_out < d.s_issued:
        k = d.s_out
        call[0] = b"cuEventSynchronize"
        st = cydriver.cuEventSynchronize(f.side_events[k % <size_t>d.s_used])
        if st != cydriver.CUDA_SUCCESS:
            _quiesce(f)
            return st
        tasks.clear()
        _copy_out(d, p, k, tasks)
        _run_copies(xfer, tasks)
        d.s_out = k + 1
    return cydriver.CUDA_SUCCESS
