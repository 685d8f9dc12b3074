# cython: language_level=3
"""Launch: the one enqueue routine of every entry point, kernel launches, graph replay.

``issue`` runs every host copy and driver call of one dispatch up to its completion event without
the GIL; ``collect`` brings the outputs to their targets after the wait. Launches are issued or
replayed as one CUDA graph launch (notes/graphs.md) where the plan's trial kept the graph.
"""

cimport cython
from libc.stdint cimport uintptr_t
from libc.string cimport memcpy, memset
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, now_ns, capture_try_open, capture_closed
from ._pools cimport lock_with_gil
from ._transfer cimport TransferEngine, CoopOrder
from ._windows cimport Source, Piece, SRC_INPUT, SRC_PARAMS
from ._prepared cimport Prepared, DevArg, ROUTE_COOPERATIVE, MAX_ARGS
from ._resources cimport InFlight
from ._waits cimport PendingDispatch
from ._streamed cimport issue_streamed, drain_streamed
from ._tracing cimport mark, M_STAGING, M_PARAMS, M_H2D, M_CLEAR, M_LAUNCH, M_READBACK, M_EVENT


@cython.final
cdef class CoopGate:
    """Orders the cooperative launches of one module on the GPU (they share its grid-barrier
    counter): each waits for the previous one's event, so no host thread blocks."""

    def __init__(self, uintptr_t ctx=0):
        self.order.last = NULL
        self.order.recorded = False

    cdef int ensure(self) except -1:
        # made once under the gate's lock: a second event would replace one the next launch
        # must wait on, letting two launches that share the grid barrier overlap
        cdef cydriver.CUevent ev = NULL
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        with nogil:
            self.order.lock()
            if self.order.last == NULL:
                st = cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING)
                if st == cydriver.CUDA_SUCCESS:
                    self.order.last = <void*>ev
            self.order.unlock()
            check_cu(st, b"cuEventCreate")
        return 0

    def close(self):
        """Destroy the ordering event (the module is being unloaded; nothing is in flight)."""
        cdef cydriver.CUevent ev
        with nogil:
            # destroyed without the GIL: a destroy may wait on work that needs the GIL
            self.order.lock()
            ev = <cydriver.CUevent>self.order.last
            self.order.last = NULL
            self.order.recorded = False
            self.order.unlock()
            if ev != NULL:
                cydriver.cuEventDestroy(ev)


cdef int stream_waits(PendingDispatch d, list streams) except -1:
    """Order the dispatch stream after each producer stream of its device arrays, through an
    event. An idle producer (``cuStreamQuery`` succeeds) needs no wait, which saves most of a
    small device-array dispatch's cost. The event goes back at once: a wait binds to the record
    made before it."""
    cdef cydriver.CUstream other
    cdef Py_ssize_t i, j, n = len(streams)
    for i in range(n):
        other = <cydriver.CUstream><uintptr_t>streams[i]
        if other == d.f.stream:
            continue
        for j in range(i):  # each stream once (a few arrays, often of one producer stream)
            if <cydriver.CUstream><uintptr_t>streams[j] == other:
                break
        else:
            _wait_for(d, other)
    return 0


cdef int _wait_for(PendingDispatch d, cydriver.CUstream other) except -1:
    cdef cydriver.CUevent ev
    cdef cydriver.CUresult st
    cdef const char* call = b"cuStreamQuery"
    with nogil:
        st = cydriver.cuStreamQuery(other)
    if st == cydriver.CUDA_SUCCESS:
        return 0  # any other answer (busy, capturing, an error): wait through an event
    d.core.resources.spool.acquire_event(False, &ev)
    with nogil:
        call = b"cuEventRecord"
        st = cydriver.cuEventRecord(ev, other)
        if st == cydriver.CUDA_SUCCESS:
            call = b"cuStreamWaitEvent"
            st = cydriver.cuStreamWaitEvent(d.f.stream, ev, 0)
    d.core.resources.spool.release_event(ev, False)
    if st != cydriver.CUDA_SUCCESS:
        d.core._fail(d, st, call)
    return 0


cdef cydriver.CUresult _wait_late(PendingDispatch d, const char** call) noexcept nogil:
    # copies enqueued after completion: wait on an event (a caller's stream holds its later work)
    cdef cydriver.CUresult st
    if d.f.has_done:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(d.f.done, d.f.stream)
        if st != cydriver.CUDA_SUCCESS:
            return st
        call[0] = b"cuEventSynchronize"
        return cydriver.cuEventSynchronize(d.f.done)
    call[0] = b"cuStreamSynchronize"
    return cydriver.cuStreamSynchronize(d.f.stream)


cdef cydriver.CUresult _readbacks(PendingDispatch d, Prepared p, const char** call) noexcept nogil:
    # the slab's output segments to staging, on the dispatch stream (the small-slab route)
    cdef size_t i
    cdef cydriver.CUresult st
    for i in range(p.readbacks.size()):
        call[0] = b"cuMemcpyDtoHAsync"
        st = cydriver.cuMemcpyDtoHAsync(d.f.staging + p.readbacks[i].offset, d.f.slab + p.readbacks[i].offset,
                                        p.readbacks[i].nbytes, d.f.stream)
        if st != cydriver.CUDA_SUCCESS:
            return st
    return cydriver.CUDA_SUCCESS


cdef int late_device_outputs(PendingDispatch d) except -1:
    """Device outputs named after the enqueue (result_into of an async dispatch): copy them
    now, on the dispatch stream, and wait for the copies."""
    cdef cydriver.CUresult st
    cdef const char* call = NULL
    with nogil:
        st = device_copies(d, &call)
        if st == cydriver.CUDA_SUCCESS:
            st = _wait_late(d, &call)
    if st != cydriver.CUDA_SUCCESS:
        d.core._fail(d, st, call)
    return 0


cdef int late_readbacks(PendingDispatch d) except -1:
    """An ``outputs="device"`` dispatch taken into host arrays (``result_into``): read the
    slab's outputs back now and wait for them."""
    cdef cydriver.CUresult st
    cdef const char* call = NULL
    cdef size_t i
    cdef bint needed = False
    for i in range(d.out_pieces.size()):
        if d.out_pieces[i].n:
            needed = True
    if not needed:
        return 0
    d.readback_skipped = False
    with nogil:
        st = _readbacks(d, d.prep, &call)
        if st == cydriver.CUDA_SUCCESS:
            st = _wait_late(d, &call)
    if st != cydriver.CUDA_SUCCESS:
        d.core._fail(d, st, call)
    return 0


cdef cydriver.CUresult collect(PendingDispatch d, Prepared p, TransferEngine xfer,
                               const char** call) noexcept nogil:
    """Bring the outputs to their targets once the GPU work is done."""
    cdef size_t k
    cdef Piece* piece
    if p.streamed:
        return drain_streamed(d, p, xfer, call)
    if p.ring:
        return xfer.readback(d.f.stream, d.f.slab, d.out_pieces.data(), d.out_pieces.size(),
                             d.out_direct.data(), d.ops, call)
    for k in range(d.out_pieces.size()):
        piece = &d.out_pieces[k]
        if piece.n:
            memcpy(piece.host, d.f.staging + piece.dev_offset, piece.n)
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult issue(PendingDispatch d, Prepared p, TransferEngine xfer, unsigned long long* marks,
                             const char** call) noexcept nogil:
    """Every host copy and driver call of one dispatch up to its completion event, in stream order.
    The one enqueue routine of every entry point. Returns the first failure."""
    cdef InFlight* f = &d.f
    cdef cydriver.CUresult st
    cdef size_t i, k, n_args
    cdef const Source* src
    cdef unsigned long long argv[MAX_ARGS]
    cdef void* argp[MAX_ARGS]
    cdef char* staging = f.staging
    cdef cydriver.CUstream s = f.stream
    cdef unsigned long long t_begin = 0, copy_ns = 0
    cdef CoopOrder* order = p.coop_order
    # a dispatch writing every output in place has a slab of params blocks only (Prepared)
    cdef size_t upload_end = 0 if d.resident else (p.compact_upload_end if d.compact else p.upload_end)
    if p.streamed:
        st = issue_streamed(d, p, xfer, call)
        mark(marks, M_EVENT)
        return st
    if marks != NULL:
        t_begin = now_ns()
    if upload_end:
        if p.ring and not d.compact:
            st = xfer.upload(s, f.slab, p.sources.data(), p.sources.size(), d.input_ptrs.data(),
                             d.direct.data(), p.params_ptr, &copy_ns, d.ops, call)
            if st != cydriver.CUDA_SUCCESS:
                return st
        else:
            # the mirror: inputs, params and zeros into staging, then ONE upload
            for i in range(p.sources.size()):
                src = &p.sources[i]
                if src.offset >= upload_end:
                    break  # (sorted: what follows are the outputs' zeros, which a compact slab lacks)
                if src.kind == SRC_INPUT:
                    memcpy(staging + src.offset, d.input_ptrs[src.index] + src.src_offset, src.n)
                elif src.kind == SRC_PARAMS:
                    memcpy(staging + src.offset, p.params_ptr + src.src_offset, src.n)
                else:
                    memset(staging + src.offset, 0, src.n)
            if marks != NULL:
                copy_ns = now_ns() - t_begin
            call[0] = b"cuMemcpyHtoDAsync"
            st = cydriver.cuMemcpyHtoDAsync(f.slab, staging, upload_end, s)
            if st != cydriver.CUDA_SUCCESS:
                return st
    if marks != NULL:
        # copies and DMA enqueues interleave: report their sums as consecutive stages
        marks[M_STAGING] = t_begin + copy_ns
        marks[M_PARAMS] = marks[M_STAGING]
        marks[M_H2D] = now_ns()
    if p.clear_end > p.clear_begin and not d.compact:
        call[0] = b"cuMemsetD8Async"
        st = cydriver.cuMemsetD8Async(f.slab + p.clear_begin, 0, p.clear_end - p.clear_begin, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    mark(marks, M_CLEAR)
    if f.timed:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.t0, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    # kernel arguments: one u64 device pointer per buffer binding, then the params pointer
    n_args = p.arg_offsets.size()
    for k in range(n_args):
        argv[k] = f.slab + p.arg_offsets[k]
        argp[k] = &argv[k]
    argp[n_args] = &argv[n_args]
    if p.dev_args.size():
        st = _device_args(d, p, argv, call)
        if st != cydriver.CUDA_SUCCESS:
            return st
    for i in range(d.out_inplace.size()):
        # a device output written in place: zeroed first (outputs start at zero), then its pointer
        argv[d.out_inplace[i].arg] = d.out_inplace[i].ptr
        if not d.out_inplace[i].zero:
            continue  # declared zeroed=False: the kernel writes it in full
        call[0] = b"cuMemsetD8Async"
        st = cydriver.cuMemsetD8Async(d.out_inplace[i].ptr, 0, d.out_inplace[i].n, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    if order != NULL:
        order.lock()
        st = _launch_cooperative(d, p, f, order, argv, argp, n_args, call)
        order.unlock()
    elif p.graphs != NULL and not d.no_graph:
        st = _replay(d, p, f, False, argv, argp, n_args, call)
    else:
        st = _regular_launches(p, f, argv, argp, n_args, call)
    if st != cydriver.CUDA_SUCCESS:
        return st
    if f.timed:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.t1, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    mark(marks, M_LAUNCH)
    if not p.ring and not d.readback_skipped and not d.compact:
        st = _readbacks(d, p, call)
        if st != cydriver.CUDA_SUCCESS:
            return st
    if d.out_dev.size():
        st = device_copies(d, call)
        if st != cydriver.CUDA_SUCCESS:
            return st
    mark(marks, M_READBACK)
    if f.has_done:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.done, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    mark(marks, M_EVENT)
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _device_args(PendingDispatch d, Prepared p, unsigned long long* argv,
                                    const char** call) noexcept nogil:
    """Device inputs: a read-only one's argument is the caller's pointer; a read-write one is
    copied device-to-device into its slab region (the caller's array is never modified)."""
    cdef size_t i
    cdef const DevArg* a
    cdef cydriver.CUresult st
    for i in range(p.dev_args.size()):
        a = &p.dev_args[i]
        if a.offset < 0:
            argv[a.arg] = d.dev_in[a.input].ptr
        elif a.nbytes:
            call[0] = b"cuMemcpyDtoDAsync"
            st = cydriver.cuMemcpyDtoDAsync(d.f.slab + <size_t>a.offset, d.dev_in[a.input].ptr, a.nbytes, d.f.stream)
            if st != cydriver.CUDA_SUCCESS:
                return st
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult device_copies(PendingDispatch d, const char** call) noexcept nogil:
    """Device outputs: the slab's output bytes copied device-to-device into the caller's arrays."""
    cdef size_t i
    cdef cydriver.CUresult st
    d.out_dev_issued = True
    for i in range(d.out_dev.size()):
        if d.out_dev[i].n:
            call[0] = b"cuMemcpyDtoDAsync"
            st = cydriver.cuMemcpyDtoDAsync(d.out_dev[i].ptr, d.f.slab + d.out_dev[i].dev_offset, d.out_dev[i].n,
                                            d.f.stream)
            if st != cydriver.CUDA_SUCCESS:
                return st
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _regular_launches(Prepared p, InFlight* f, unsigned long long* argv, void** argp,
                                         size_t n_args, const char** call) noexcept nogil:
    # one params block per launch: a single one, or one per phase when host-split
    cdef cydriver.CUresult st
    cdef int _it
    cdef size_t k
    for _it in range(p.iterations):
        for k in range(p.params_offsets.size()):
            argv[n_args] = f.slab + p.params_offsets[k]
            if p.route == ROUTE_COOPERATIVE:
                # forced cooperative launch of a program without a grid barrier
                call[0] = b"cuLaunchCooperativeKernel"
                st = cydriver.cuLaunchCooperativeKernel(p.function, p.grid[0], p.grid[1], p.grid[2],
                                                        p.block[0], p.block[1], p.block[2],
                                                        p.shared_bytes, f.stream, argp)
            else:
                call[0] = b"cuLaunchKernel"
                st = cydriver.cuLaunchKernel(p.function, p.grid[0], p.grid[1], p.grid[2],
                                             p.block[0], p.block[1], p.block[2],
                                             p.shared_bytes, f.stream, argp, NULL)
            if st != cydriver.CUDA_SUCCESS:
                return st
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _launch_cooperative(PendingDispatch d, Prepared p, InFlight* f, CoopOrder* order,
                                           unsigned long long* argv, void** argp, size_t n_args,
                                           const char** call) noexcept nogil:
    """Cooperative launches, ordered after the module's previous one (the caller holds ``order``),
    barrier reset before, counter read back after. Only the resets and launches go in a graph."""
    cdef cydriver.CUresult st
    cdef cydriver.CUstream s = f.stream
    if order.recorded:
        call[0] = b"cuStreamWaitEvent"
        st = cydriver.cuStreamWaitEvent(s, <cydriver.CUevent>order.last, 0)
        if st != cydriver.CUDA_SUCCESS:
            return st
    if p.graphs != NULL and not d.no_graph:
        st = _replay(d, p, f, True, argv, argp, n_args, call)
    else:
        st = _cooperative_launches(p, f, argv, argp, n_args, call)
    if st != cydriver.CUDA_SUCCESS:
        return st
    call[0] = b"cuMemcpyDtoHAsync"
    st = cydriver.cuMemcpyDtoHAsync(f.staging + p.audit_offset, p.barrier, 4, s)
    if st != cydriver.CUDA_SUCCESS:
        return st
    call[0] = b"cuEventRecord"
    st = cydriver.cuEventRecord(<cydriver.CUevent>order.last, s)
    if st != cydriver.CUDA_SUCCESS:
        return st
    order.recorded = True
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _cooperative_launches(Prepared p, InFlight* f, unsigned long long* argv, void** argp,
                                             size_t n_args, const char** call) noexcept nogil:
    # per iteration: reset the grid barrier, then one cooperative launch
    cdef cydriver.CUresult st
    cdef int _it
    cdef cydriver.CUstream s = f.stream
    argv[n_args] = f.slab + p.params_offsets[0]
    for _it in range(p.iterations):
        call[0] = b"cuMemsetD32Async"  # the grid barrier counts from zero in every launch
        st = cydriver.cuMemsetD32Async(p.barrier, 0, 1, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
        call[0] = b"cuLaunchCooperativeKernel"
        st = cydriver.cuLaunchCooperativeKernel(p.function, p.grid[0], p.grid[1], p.grid[2],
                                                p.block[0], p.block[1], p.block[2],
                                                p.shared_bytes, s, argp)
        if st != cydriver.CUDA_SUCCESS:
            return st
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _launches(Prepared p, InFlight* f, bint cooperative, unsigned long long* argv, void** argp,
                                 size_t n_args, const char** call) noexcept nogil:
    # the launch sequence of one dispatch, issued on its stream (or recorded, while capturing)
    if cooperative:
        return _cooperative_launches(p, f, argv, argp, n_args, call)
    return _regular_launches(p, f, argv, argp, n_args, call)


cdef cydriver.CUresult _capture(Prepared p, InFlight* f, bint cooperative, unsigned long long* argv, void** argp,
                                size_t n_args, cydriver.CUgraph* graph, const char** call) noexcept nogil:
    """Record the launch sequence into ``graph`` on the dispatch's stream, which is capturing
    (nothing runs). The capture is ended on every path; on failure ``graph`` is NULL."""
    cdef cydriver.CUresult st, end
    graph[0] = NULL
    st = _launches(p, f, cooperative, argv, argp, n_args, call)
    end = cydriver.cuStreamEndCapture(f.stream, graph)
    if st == cydriver.CUDA_SUCCESS:
        st = end
        call[0] = b"cuStreamEndCapture"
    if st != cydriver.CUDA_SUCCESS and graph[0] != NULL:
        cydriver.cuGraphDestroy(graph[0])
        graph[0] = NULL
    return st


cdef cydriver.CUresult _replay(PendingDispatch d, Prepared p, InFlight* f, bint cooperative,
                               unsigned long long* argv, void** argp, size_t n_args,
                               const char** call) noexcept nogil:
    """The launch sequence as ONE graph launch (notes/graphs.md has the rules relied on).

    Execs are keyed by the exact argument values (a graph bakes them in); a miss captures and
    instantiates, or with the cache full updates the least recently used exec. Graph objects are
    not thread-safe: everything holds the plan's cache lock. Not capturable: the plan issues from
    then on.
    """
    cdef GraphCache* cache = p.graphs
    cdef unsigned long long key[MAX_ARGS + 1]
    cdef cydriver.CUstream cs = f.stream, saved
    cdef cydriver.CUgraph graph = NULL
    cdef cydriver.CUgraphExec ex = NULL
    cdef cydriver.CUgraphExecUpdateResultInfo info
    cdef cydriver.CUresult st
    cdef long i
    cdef size_t n = n_args + 1
    memcpy(key, argv, n_args * sizeof(unsigned long long))
    key[n_args] = f.slab
    cache.lock()
    if cache.disabled or cache.closed:
        cache.unlock()
        d.graph_events |= G_FALLBACK
        return _launches(p, f, cooperative, argv, argp, n_args, call)
    i = cache.find(key, n)
    if i >= 0:
        ex = <cydriver.CUgraphExec>cache.exec(i)
    else:
        st = cydriver.CUDA_SUCCESS
        if f.ext_stream or f.shared_stream:
            # a caller's stream may be blocking, and a shared pool stream may take another
            # dispatch's work mid-capture: capture on the plan's own non-blocking stream
            if cache.capture_stream == NULL:
                call[0] = b"cuStreamCreate"
                st = cydriver.cuStreamCreate(&cs, cydriver.CU_STREAM_NON_BLOCKING)
                if st == cydriver.CUDA_SUCCESS:
                    cache.capture_stream = <void*>cs
            cs = <cydriver.CUstream>cache.capture_stream
        if st == cydriver.CUDA_SUCCESS and not capture_try_open():
            # a context synchronize of vyre_cuda's runs (the driver crashes in one that runs
            # beside a capture: _driver's capture gate): issue this time, capture a later one
            st = cydriver.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        elif st == cydriver.CUDA_SUCCESS:
            call[0] = b"cuStreamBeginCapture"
            st = cydriver.cuStreamBeginCapture(cs, cydriver.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            if st != cydriver.CUDA_SUCCESS:
                capture_closed()
        if st != cydriver.CUDA_SUCCESS:
            # this stream cannot be captured now (a synchronize runs, or someone else captures it): issue
            cache.unlock()
            d.graph_events |= G_FALLBACK
            return _launches(p, f, cooperative, argv, argp, n_args, call)
        # the issuing code launches on f.stream: point it at the capture stream meanwhile
        saved = f.stream
        f.stream = cs
        st = _capture(p, f, cooperative, argv, argp, n_args, &graph, call)
        capture_closed()
        f.stream = saved
        if st == cydriver.CUDA_SUCCESS and cache.full():
            i = cache.oldest()
            ex = <cydriver.CUgraphExec>cache.exec(i)
            if cydriver.cuGraphExecUpdate(ex, graph, &info) == cydriver.CUDA_SUCCESS:
                cache.rekey(i, key, n)
                d.graph_events |= G_UPDATE
            else:
                cydriver.cuGraphExecDestroy(ex)  # a launch in flight finishes first
                cache.remove(i)
                ex = NULL
        if st == cydriver.CUDA_SUCCESS and ex == NULL:
            call[0] = b"cuGraphInstantiateWithFlags"
            st = cydriver.cuGraphInstantiate(&ex, graph, 0)
            if st == cydriver.CUDA_SUCCESS:
                cache.insert(key, n, <void*>ex)
                d.graph_events |= G_CAPTURE
        if graph != NULL:
            cydriver.cuGraphDestroy(graph)  # the exec holds its own copy
        if st != cydriver.CUDA_SUCCESS:
            # not capturable: issue, now and from then on (a real error surfaces from the launch)
            cache.disabled = True
            cache.unlock()
            d.graph_events |= G_FALLBACK
            return _launches(p, f, cooperative, argv, argp, n_args, call)
    call[0] = b"cuGraphLaunch"
    st = cydriver.cuGraphLaunch(ex, f.stream)
    cache.unlock()
    if st == cydriver.CUDA_SUCCESS:
        d.graph_events |= G_REPLAY
    return st


cdef void trial_record(Prepared p, bint issued, unsigned long long ns) noexcept:
    """One sample of a plan's graph-or-issued trial (under its trial lock): after TRIAL_SAMPLES
    per path the graph stays only if its median is at least 3% below the issued one."""
    cdef int path = 0 if issued else 1
    cdef unsigned long long med[2]
    cdef int k
    cdef bint decided = False
    lock_with_gil(p.trial_mu)
    if p.trial_left <= 0:
        p.trial_mu.unlock()
        return
    if p.graphs == NULL or p.graphs.disabled:  # capture failed: nothing to compare
        p.trial_left = 0
        p.graph_off = True
        p.trial_mu.unlock()
        p.graph_choice = "issued: the launches could not be captured"
        return
    p.trial_left -= 1
    if p.trial_left < 2 * TRIAL_SAMPLES and p.trial_n[path] < TRIAL_SAMPLES:
        p.trial_ns[path][p.trial_n[path]] = ns  # (the index checked and used under the lock)
        p.trial_n[path] += 1
    if p.trial_left == 0:
        for k in range(2):
            med[k] = _median(p.trial_ns[k], p.trial_n[k])
        p.graph_off = not (med[1] * 100 < med[0] * 97)
        decided = True
    p.trial_mu.unlock()
    if not decided:
        return
    p.graph_choice = (f"{'issued' if p.graph_off else 'graph'}: median round trip {med[1] / 1000:.1f} us "
                      f"replayed vs {med[0] / 1000:.1f} us issued over {p.trial_n[0]} dispatches each")


cdef unsigned long long _median(unsigned long long* xs, int n) noexcept:
    # insertion sort of at most TRIAL_SAMPLES values, in place (the samples are not used again)
    cdef int i, j
    cdef unsigned long long x
    if n <= 0:
        return 0
    for i in range(1, n):
        x = xs[i]
        j = i - 1
        while j >= 0 and xs[j] > x:
            xs[j + 1] = xs[j]
            j -= 1
        xs[j + 1] = x
    return xs[n // 2]
