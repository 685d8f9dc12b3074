# cython: language_level=3
"""The hot path: staging, enqueue, kernel-argument packing, waits and PendingDispatch.

A dispatch looks up its prepared plan (one dict lookup keyed on program, config and input byte
lengths), then runs in C: pool acquisitions with the GIL held (a few C operations), every driver
call and every bulk memcpy with the GIL released, no Python object per argument or per buffer.
"""

cimport cython
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uintptr_t, uint32_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector

cimport numpy as cnp
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, bind_context, now_ns
from ._pools cimport DevicePool, PinnedPool, StreamPool
from ._driver import status_name
from .config import DispatchConfig, as_config
from .program import Program
from .errors import DispatchFailed, DeviceLost, ValidationError, driver_error, STICKY_ERRORS
from .telemetry import TimedDispatchResult

cnp.import_array()

STAGES = (
    "plan_lookup", "staging_memcpy", "h2d_enqueue", "clears", "params_upload", "launch",
    "readback_enqueue", "event_record", "wait", "copy_out", "release",
)

# stage marks, in the order the path passes them
cdef enum:
    M_START = 0
    M_LOOKUP
    M_STAGING
    M_PARAMS
    M_H2D
    M_CLEAR
    M_LAUNCH
    M_READBACK
    M_EVENT
    M_WAIT
    M_COPYOUT
    M_RELEASE
    N_MARKS

cdef enum:
    ROUTE_REGULAR = 0
    ROUTE_COOPERATIVE = 1
    ROUTE_SPLIT = 2
    MAX_ARGS = 256
    UPLOAD_CHUNK = 1 << 20  # large uploads alternate host copy and DMA in chunks of this size
    BIG_COPY = 65536  # above this, host copies run with the GIL released

# telemetry counter slots (names in telemetry.COUNTERS)
cdef enum:
    T_DISPATCHES = 0
    T_H2D_BYTES
    T_H2D_OPS
    T_D2H_BYTES
    T_D2H_OPS
    T_TRANSIENT
    T_PARAM_BYTES
    T_LAUNCHES
    T_COOP_LAUNCHES
    T_SPLIT_LAUNCHES
    T_MEMSETS
    T_SYNCS
    T_TIMED
    T_TIMED_WALL
    T_TIMED_DEVICE
    T_TIMED_ENQUEUE
    T_TIMED_WAIT
    T_FAILED
    T_LEAKED  # N_COUNTERS (19) in the .pxd




cdef char _format_kind(const char* fmt) noexcept:
    # struct-module format of a buffer: skip byte-order prefixes, classify the type code
    cdef char c
    if fmt == NULL:
        return b'u'
    if fmt[0] in b'>!':
        return b'x'  # big-endian: the kernel would see swapped bytes
    while fmt[0] in b'@=<':
        fmt += 1
    c = fmt[0]
    if c in b'efdE':
        return b'f'
    if c in b'bhilqn':
        return b'i'
    if c in b'BHILQNc?':
        return b'u'
    return 0


@cython.final
cdef class Prepared:
    """A dispatch planned once: slab layout, launch geometry and params, as C data."""

    def __init__(self, layout, launch, route, int iterations, uintptr_t function, uintptr_t barrier,
                 list input_specs, list output_specs, gate=None, label=None, timeout=None, plan=None):
        """Build from planning objects.

        input_specs: (itemsize, kind) per caller input; output_specs: (numpy dtype, count).
        """
        cdef InputCopy ic
        cdef Segment seg
        if len(layout.arg_offsets) + 1 > MAX_ARGS:
            from .errors import UnsupportedFeature
            raise UnsupportedFeature(
                f"the kernel would take {len(layout.arg_offsets) + 1} arguments; at most {MAX_ARGS} are supported",
                "pack buffers together so the program has fewer bindings",
            )
        for (index, offset, nbytes, zero_end), (itemsize, kind) in zip(layout.inputs, input_specs):
            ic.index = index
            ic.offset = offset
            ic.nbytes = nbytes
            ic.zero_end = zero_end
            ic.itemsize = itemsize
            ic.kind = ord(kind) if kind else 0
            self.inputs.push_back(ic)
        for offset, nbytes in layout.readbacks:
            seg.offset = offset
            seg.nbytes = nbytes
            self.readbacks.push_back(seg)
        for offset, nbytes in layout.outputs:
            seg.offset = offset
            seg.nbytes = nbytes
            self.outputs.push_back(seg)
        for off in layout.arg_offsets:
            self.arg_offsets.push_back(off)
        for off in layout.params_offsets:
            self.params_offsets.push_back(off)
        self.params_blob = layout.params_blob
        self.params_ptr = <const char*>self.params_blob
        self.params_len = len(self.params_blob)
        self.params_offset0 = layout.params_offsets[0]
        self.slab_bytes = layout.slab_bytes
        self.bucket = layout.bucket_bytes
        # cooperative dispatches read the barrier counter back into 16 bytes past the slab image
        self.audit_offset = layout.slab_bytes
        from ._accounting import bucket_size
        self.staging_bucket = bucket_size(layout.slab_bytes + 16)
        self.upload_end = layout.upload_end
        self.clear_begin, self.clear_end = layout.clear
        self.host_clear_begin, self.host_clear_end = layout.host_clear
        for k in range(3):
            self.grid[k] = launch.grid[k]
            self.block[k] = launch.block[k]
        self.shared_bytes = launch.shared_bytes
        self.iterations = iterations
        self.route = {"regular": ROUTE_REGULAR, "cooperative": ROUTE_COOPERATIVE, "split": ROUTE_SPLIT}[route.kind]
        self.route_name = route.kind
        self.route_reason = route.reason
        self.function = <cydriver.CUfunction>function
        self.barrier = <cydriver.CUdeviceptr>barrier
        n_phases = len(layout.params_offsets)
        # a cooperative launch runs phases - 1 grid barriers, each adding one arrival per block
        phases = plan.program.phases if plan is not None else n_phases
        self.barrier_ceiling = max(0, phases - 1) * route.grid_blocks
        self.out_dtypes = [d for d, _ in output_specs]
        self.out_typenums = [d.num for d, _ in output_specs]
        self.out_counts = [c for _, c in output_specs]
        self.gate = gate
        self.label = label
        self.timeout = timeout
        self.plan = plan
        self.tel_h2d_bytes = layout.h2d_bytes
        self.tel_h2d_ops = 1 if layout.upload_end else 0
        self.tel_d2h_bytes = layout.d2h_bytes
        self.tel_d2h_ops = len(layout.readbacks)
        self.tel_param_bytes = len(layout.params_blob)
        per_iter = n_phases if self.route == ROUTE_SPLIT else 1
        self.tel_launches = per_iter * iterations
        self.tel_memsets = (1 if self.clear_end > self.clear_begin else 0) + (
            iterations if self.route == ROUTE_COOPERATIVE and barrier else 0)

    @property
    def slab_bytes_(self):
        """Bytes of the device slab (and its staging mirror)."""
        return self.slab_bytes

    @property
    def route_kind(self):
        return self.route_name

    def launch_geometry(self):
        return (tuple(self.grid[k] for k in range(3)), tuple(self.block[k] for k in range(3)), self.shared_bytes)


@cython.final
cdef class Core:
    """Per-backend driver state: context, pools, prepared plans, counters."""

    def __init__(self, uintptr_t ctx, planner, size_t device_cap, size_t pinned_cap, bint trace=False):
        self.ctx = <cydriver.CUcontext>ctx
        self.dpool = DevicePool(device_cap)
        self.ppool = PinnedPool(pinned_cap)
        self.spool = StreamPool()
        self.prepared = {}
        self.planner = planner
        self.lost = None
        self.trace = trace
        import logging
        self.logger = logging.getLogger("vyre_cuda")
        memset(self.tel, 0, sizeof(self.tel))

    # ---------------------------------------------------------------- bookkeeping
    def counters(self):
        return [self.tel[k] for k in range(N_COUNTERS)]

    def reset_counters(self):
        memset(self.tel, 0, sizeof(self.tel))
        self.dpool.hits = self.dpool.misses = 0
        self.ppool.hits = self.ppool.misses = 0

    def pool_stats(self):
        return dict(
            pool_hits=self.dpool.hits + self.ppool.hits,
            pool_misses=self.dpool.misses + self.ppool.misses,
            device_pool_hits=self.dpool.hits,
            device_pool_misses=self.dpool.misses,
            device_pool_cached_bytes=self.dpool.cached_bytes,
            device_pool_live_bytes=self.dpool.live_bytes,
            device_pool_allocated_bytes=self.dpool.allocated_bytes,
            pinned_pool_hits=self.ppool.hits,
            pinned_pool_misses=self.ppool.misses,
            pinned_pool_cached_bytes=self.ppool.cached_bytes,
            pinned_pool_live_bytes=self.ppool.live_bytes,
            streams_created=self.spool.created_streams,
            streams_live=self.spool.live_streams,
            events_created=self.spool.created_events,
            events_live=self.spool.live_events,
            prepared_plans=len(self.prepared),
        )

    def clear_prepared(self):
        self.prepared.clear()

    def prepared_for(self, key):
        return self.prepared.get(key)

    @property
    def context_handle(self):
        return <uintptr_t>self.ctx

    cdef int _check_usable(self) except -1:
        if self.closed:
            raise ValidationError(
                "this CudaBackend is closed",
                "create a new CudaBackend() (or dispatch inside its `with` block)",
            )
        if self.lost is not None:
            status, call = self.lost
            raise DeviceLost(
                f"the backend's CUDA context was lost earlier ({status} raised by {call}); no further "
                "dispatch can run on it",
                "close this backend, call vyre_cuda.reset_device(device), then create a new CudaBackend "
                "(or restart the process)",
                status=status, call=call,
            )
        return 0

    # ---------------------------------------------------------------- lookup
    cdef Prepared _lookup(self, program, inputs, config, vector[Py_buffer]& views):
        """Acquire every input buffer and find (or plan) the prepared dispatch."""
        cdef Py_ssize_t n, i
        cdef Py_buffer* view
        cdef object length  # an object: PyTuple_SET_ITEM steals this reference
        if type(program) is not Program:
            raise ValidationError(
                f"dispatch needs a vyre_cuda.Program (got {type(program).__name__})",
                "build one with Program(Kernel.cuda(src), [BufferDecl...])",
            )
        if type(inputs) is not list and type(inputs) is not tuple:
            inputs = _as_input_list(inputs)
        n = len(inputs)
        views.resize(n)
        key = PyTuple_New(n + 2)
        Py_INCREF(program)
        PyTuple_SET_ITEM(key, 0, program)
        Py_INCREF(config)
        PyTuple_SET_ITEM(key, 1, config)
        for i in range(n):
            view = &views[i]
            try:
                PyObject_GetBuffer(inputs[i], view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            except Exception as exc:
                self._release_views(views, i)
                raise _input_error(program, i, inputs[i], exc) from None
            length = view.len
            Py_INCREF(length)
            PyTuple_SET_ITEM(key, i + 2, length)
        try:
            prep = self.prepared.get(key)
        except BaseException:  # an unhashable config field
            self._release_views(views, n)
            raise
        if prep is None:
            try:
                prep = self.planner(program, key[2:], config)
            except BaseException:
                self._release_views(views, n)
                raise
            if len(self.prepared) >= 4096:
                self.prepared.clear()  # bounded: distinct lengths should not grow memory forever
            self.prepared[key] = prep
        cdef Prepared p = <Prepared>prep
        cdef InputCopy* ic
        for i in range(n):
            ic = &p.inputs[i]
            view = &views[ic.index]
            if ic.kind and view.itemsize != 1 and (view.itemsize != ic.itemsize or _format_kind(view.format) != ic.kind):
                fmt = view.format.decode() if view.format != NULL else "B"
                self._release_views(views, n)
                raise _dtype_error(program, ic.index, fmt, view.itemsize, inputs[ic.index])
        return p

    cdef void _release_views(self, vector[Py_buffer]& views, Py_ssize_t n) noexcept:
        cdef Py_ssize_t i
        for i in range(n):
            PyBuffer_Release(&views[i])

    # ---------------------------------------------------------------- enqueue
    cdef int _acquire(self, Prepared p, InFlight* f, bint want_done, bint timed) except -1:
        f.active = False
        f.has_done = False
        f.timed = False
        # any thread may dispatch: make the backend's context current before the first driver
        # call (GIL kept: this is cheaper than a GIL release and re-acquire)
        bind_context(self.ctx)
        self.dpool.acquire(p.bucket, &f.slab)
        try:
            self.ppool.acquire(p.staging_bucket, <void**>&f.staging)
        except BaseException:
            self.dpool.release(f.slab, p.bucket)
            raise
        try:
            self.spool.acquire_stream(&f.stream)
        except BaseException:
            self.dpool.release(f.slab, p.bucket)
            self.ppool.release(f.staging, p.staging_bucket)
            raise
        try:
            if want_done:
                self.spool.acquire_event(False, &f.done)
                f.has_done = True
            if timed:
                self.spool.acquire_event(True, &f.t0)
                try:
                    self.spool.acquire_event(True, &f.t1)
                except BaseException:
                    self.spool.release_event(f.t0, True)
                    raise
                f.timed = True
        except BaseException:
            if f.has_done:
                self.spool.release_event(f.done, False)
            self.spool.release_stream(f.stream)
            self.dpool.release(f.slab, p.bucket)
            self.ppool.release(f.staging, p.staging_bucket)
            raise
        f.active = True
        return 0

    cdef void _recycle(self, Prepared p, InFlight* f) noexcept:
        if not f.active:
            return
        f.active = False
        self.dpool.release(f.slab, p.bucket)
        self.ppool.release(f.staging, p.staging_bucket)
        self.spool.release_stream(f.stream)
        if f.has_done:
            self.spool.release_event(f.done, False)
        if f.timed:
            self.spool.release_event(f.t0, True)
            self.spool.release_event(f.t1, True)

    cdef void _leak(self, Prepared p, InFlight* f) noexcept:
        # The stream could not be synchronised: the GPU may still use these. Never recycle them.
        if not f.active:
            return
        f.active = False
        self.dpool.forget(p.bucket)
        self.ppool.forget(p.staging_bucket)
        self.spool.live_streams -= 1
        self.spool.live_events -= (1 if f.has_done else 0) + (2 if f.timed else 0)
        self.tel[T_LEAKED] += 1

    cdef int _fail(self, Prepared p, InFlight* f, cydriver.CUresult status, const char* call) except -1:
        """Fail closed: synchronise the stream; recycle on success, leak on failure; raise."""
        cdef cydriver.CUresult sync
        with nogil:
            sync = cydriver.cuStreamSynchronize(f.stream)
        self.tel[T_FAILED] += 1
        if sync == cydriver.CUDA_SUCCESS:
            self._recycle(p, f)
        else:
            self._leak(p, f)
        name = status_name(<int>status)
        err = driver_error(name, call.decode(), code=<int>status)
        if name in STICKY_ERRORS:
            self.lost = (name, call.decode())
        elif sync != cydriver.CUDA_SUCCESS and status_name(<int>sync) in STICKY_ERRORS:
            self.lost = (status_name(<int>sync), "cuStreamSynchronize")
        raise err

    cdef int _enqueue(self, Prepared p, vector[Py_buffer]& views, InFlight* f, unsigned long long* marks) except -1:
        cdef cydriver.CUresult status = cydriver.CUDA_SUCCESS
        cdef const char* call = NULL
        # the GIL is released for the whole issue so other threads enqueue meanwhile
        with nogil:
            status = _issue(p, views.data(), f, marks, &call)
        if status != cydriver.CUDA_SUCCESS:
            self._fail(p, f, status, call)
        self._count(p)
        return 0

    cdef void _count(self, Prepared p) noexcept:
        self.tel[T_DISPATCHES] += 1
        self.tel[T_H2D_BYTES] += p.tel_h2d_bytes
        self.tel[T_H2D_OPS] += p.tel_h2d_ops
        self.tel[T_D2H_BYTES] += p.tel_d2h_bytes
        self.tel[T_D2H_OPS] += p.tel_d2h_ops
        self.tel[T_TRANSIENT] += p.bucket
        self.tel[T_PARAM_BYTES] += p.tel_param_bytes
        self.tel[T_LAUNCHES] += p.tel_launches
        if p.route == ROUTE_COOPERATIVE:
            self.tel[T_COOP_LAUNCHES] += p.tel_launches
        elif p.route == ROUTE_SPLIT:
            self.tel[T_SPLIT_LAUNCHES] += p.tel_launches
        self.tel[T_MEMSETS] += p.tel_memsets

    cdef int _wait(self, Prepared p, InFlight* f) except -1:
        """Block until the dispatch is complete (GIL released), honouring the config timeout."""
        cdef cydriver.CUresult status
        cdef const char* call
        self.tel[T_SYNCS] += 1
        if p.timeout is not None:
            return self._wait_timeout(p, f)
        if f.has_done:
            call = b"cuEventSynchronize"
            with nogil:
                status = cydriver.cuEventSynchronize(f.done)
        else:
            call = b"cuStreamSynchronize"
            with nogil:
                status = cydriver.cuStreamSynchronize(f.stream)
        if status != cydriver.CUDA_SUCCESS:
            self._fail(p, f, status, call)
        if p.route == ROUTE_COOPERATIVE and p.barrier:
            self._audit(p, f)
        return 0

    cdef int _wait_timeout(self, Prepared p, InFlight* f) except -1:
        import time
        cdef cydriver.CUresult status
        deadline = time.monotonic() + p.timeout
        delay = 20e-6
        while True:
            with nogil:
                if f.has_done:
                    status = cydriver.cuEventQuery(f.done)
                else:
                    status = cydriver.cuStreamQuery(f.stream)
            if status == cydriver.CUDA_SUCCESS:
                break
            if status != cydriver.CUDA_ERROR_NOT_READY:
                self._fail(p, f, status, b"cuEventQuery")
            if time.monotonic() >= deadline:
                raise _Timeout()
            time.sleep(delay)
            delay = min(delay * 2, 2e-3)
        if p.route == ROUTE_COOPERATIVE and p.barrier:
            self._audit(p, f)
        return 0

    cdef int _audit(self, Prepared p, InFlight* f) except -1:
        cdef uint32_t counter
        memcpy(&counter, f.staging + p.audit_offset, 4)
        if counter > p.barrier_ceiling:
            self.tel[T_FAILED] += 1
            self._recycle(p, f)
            raise DispatchFailed(
                f"grid barrier audit failed: the counter reached {counter} arrivals, more than the "
                f"{p.barrier_ceiling} that {p.grid[0] * p.grid[1] * p.grid[2]} blocks can produce "
                "through the program's phase barriers",
                "call vyre_grid_sync() only between phases (phases - 1 times per launch), never "
                "conditionally or in a loop",
                status="barrier_audit", call="vyre_grid_sync",
            )
        return 0

    cdef list _new_outputs(self, Prepared p):
        cdef list outs = []
        cdef cnp.npy_intp dim
        cdef Py_ssize_t k
        for k in range(len(p.out_counts)):
            dim = p.out_counts[k]
            if p.outputs[k].nbytes != <size_t>dim * (<cnp.dtype>p.out_dtypes[k]).itemsize:
                # an output_byte_range reads back part of the buffer: return those bytes' elements
                dim = p.outputs[k].nbytes // (<cnp.dtype>p.out_dtypes[k]).itemsize
            outs.append(cnp.PyArray_EMPTY(1, &dim, p.out_typenums[k], 0))
        return outs

    cdef int _copy_out(self, Prepared p, InFlight* f, list outs) except -1:
        cdef Py_ssize_t k
        cdef Py_buffer view
        cdef size_t total = 0
        cdef char* dst
        cdef const char* src
        cdef size_t n
        for k in range(len(outs)):
            n = p.outputs[k].nbytes
            if n == 0:
                continue
            src = f.staging + p.outputs[k].offset
            if type(outs[k]) is cnp.ndarray:
                dst = <char*>cnp.PyArray_DATA(<cnp.ndarray>outs[k])
                if n > BIG_COPY:
                    with nogil:
                        memcpy(dst, src, n)
                else:
                    memcpy(dst, src, n)
            else:
                PyObject_GetBuffer(outs[k], &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                try:
                    with nogil:
                        memcpy(view.buf, src, n)
                finally:
                    PyBuffer_Release(&view)
        return 0

    # ---------------------------------------------------------------- entry points
    def dispatch(self, program, inputs, config=None):
        """Run and wait; return the outputs as new numpy arrays."""
        return self._dispatch_sync(program, inputs, config, None, NULL)

    def dispatch_into(self, program, inputs, outputs, config=None):
        return self._dispatch_sync(program, inputs, config, _as_output_list(outputs), NULL)

    def dispatch_profiled(self, program, inputs, config=None, unsigned long long start_ns=0):
        """Like dispatch, also returning the stage durations (ns) aligned with STAGES.

        ``start_ns`` (CLOCK_MONOTONIC, e.g. ``time.perf_counter_ns()`` on Linux) taken by the
        caller just before the call puts the call's own overhead into ``plan_lookup``.
        """
        cdef unsigned long long marks[N_MARKS]
        memset(marks, 0, sizeof(marks))
        marks[M_START] = start_ns
        outs = self._dispatch_sync(program, inputs, config, None, marks)
        return outs, _stage_durations(marks)

    cdef object _dispatch_sync(self, program, inputs, config, list into, unsigned long long* marks):
        cdef vector[Py_buffer] views
        cdef InFlight f
        cdef Prepared p
        cdef unsigned long long trace_marks[N_MARKS]
        if self.trace and marks == NULL:
            marks = trace_marks
            memset(marks, 0, sizeof(trace_marks))
        if marks != NULL and marks[M_START] == 0:
            marks[M_START] = now_ns()
        self._check_usable()
        if config is not None and type(config) is not DispatchConfig:
            config = as_config(config)
        p = self._lookup(program, inputs, config, views)
        if into is not None:
            try:
                _check_outputs(p, into)
            except BaseException:
                self._release_views(views, views.size())
                raise
        if marks != NULL:
            marks[M_LOOKUP] = now_ns()
        if p.timeout is None and not (p.route == ROUTE_COOPERATIVE and p.barrier):
            outs = self._run_sync(p, views, into, marks)
            if self.trace:
                _trace(self.logger, p, marks)
            return outs
        gate = p.gate
        if gate is not None:
            gate.acquire()
        try:
            try:
                self._acquire(p, &f, False, False)
                try:
                    self._enqueue(p, views, &f, marks)
                finally:
                    self._release_views(views, views.size())
            except BaseException:
                raise
            try:
                self._wait(p, &f)
            except _Timeout:
                pending = PendingDispatch._adopt(self, p, &f)
                (<PendingDispatch>pending).gate = gate
                gate = None  # the kernel still runs: its barrier counter stays ours until it ends
                raise _timeout_error(p, pending) from None
            if marks != NULL:
                marks[M_WAIT] = now_ns()
            outs = self._new_outputs(p) if into is None else into
            self._copy_out(p, &f, outs)
            if marks != NULL:
                marks[M_COPYOUT] = now_ns()
            self._recycle(p, &f)
            if marks != NULL:
                marks[M_RELEASE] = now_ns()
        finally:
            if gate is not None:
                gate.release()
        if self.trace:
            _trace(self.logger, p, marks)
        return outs

    cdef object _run_sync(self, Prepared p, vector[Py_buffer]& views, list into, unsigned long long* marks):
        """The common blocking dispatch: ONE GIL release covers the enqueue, the wait and the copy
        out, so other Python threads run meanwhile and this one re-takes the GIL once."""
        cdef InFlight f
        cdef vector[char*] dsts
        cdef vector[Py_buffer] out_views
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef cydriver.CUresult sync = cydriver.CUDA_SUCCESS
        cdef const char* call = NULL
        cdef Py_ssize_t k
        try:
            self._acquire(p, &f, False, False)
        except BaseException:
            self._release_views(views, views.size())
            raise
        try:
            outs = self._new_outputs(p) if into is None else into
            for k in range(len(outs)):
                if type(outs[k]) is cnp.ndarray:
                    dsts.push_back(<char*>cnp.PyArray_DATA(<cnp.ndarray>outs[k]))
                else:
                    out_views.resize(out_views.size() + 1)
                    PyObject_GetBuffer(outs[k], &out_views.back(), PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                    dsts.push_back(<char*>out_views.back().buf)
        except BaseException:
            self._recycle(p, &f)
            self._release_views(views, views.size())
            self._release_views(out_views, out_views.size())
            raise
        with nogil:
            st = _issue(p, views.data(), &f, marks, &call)
            if st == cydriver.CUDA_SUCCESS:
                sync = cydriver.cuStreamSynchronize(f.stream)
                _mark(marks, M_WAIT)
                if sync == cydriver.CUDA_SUCCESS:
                    _copy_to(p, &f, dsts.data())
                    _mark(marks, M_COPYOUT)
        self._release_views(views, views.size())
        self._release_views(out_views, out_views.size())
        if st != cydriver.CUDA_SUCCESS:
            self._fail(p, &f, st, call)
        self._count(p)
        self.tel[T_SYNCS] += 1
        if sync != cydriver.CUDA_SUCCESS:
            self._fail(p, &f, sync, b"cuStreamSynchronize")
        self._recycle(p, &f)
        if marks != NULL:
            marks[M_RELEASE] = now_ns()
        return outs

    def dispatch_async(self, program, inputs, config=None, bint timed=False):
        """Enqueue and return a PendingDispatch owning everything the GPU still uses."""
        cdef vector[Py_buffer] views
        cdef InFlight f
        cdef Prepared p
        cdef unsigned long long t0 = now_ns()
        self._check_usable()
        if config is not None and type(config) is not DispatchConfig:
            config = as_config(config)
        p = self._lookup(program, inputs, config, views)
        gate = p.gate
        if gate is not None:
            gate.acquire()
        try:
            try:
                self._acquire(p, &f, True, timed)
                f.t_start = t0
                try:
                    self._enqueue(p, views, &f, NULL)
                finally:
                    self._release_views(views, views.size())
            except BaseException:
                raise
            f.t_enqueued = now_ns()
            pending = PendingDispatch._adopt(self, p, &f)
            if gate is not None:
                # cooperative launches share the module's barrier counter: finish (and audit)
                # before the next one may reset it
                try:
                    (<PendingDispatch>pending)._wait()
                except _Timeout:
                    (<PendingDispatch>pending).gate = gate
                    gate = None
                    raise _timeout_error(p, pending) from None
        finally:
            if gate is not None:
                gate.release()
        return pending

    def dispatch_timed(self, program, inputs, config=None):
        cdef PendingDispatch pending = self.dispatch_async(program, inputs, config, True)
        return pending.timed_result()


class _Timeout(Exception):
    pass


def _timeout_error(Prepared p, pending):
    err = DispatchFailed(
        f"the dispatch did not complete within its timeout of {p.timeout} s",
        "raise DispatchConfig(timeout=...), or wait on the PendingDispatch in this error's "
        ".pending attribute; its resources stay owned by it until it completes",
        status="timeout", call="wait",
    )
    err.pending = pending
    return err


# STAGES position of each mark after M_START, in the order the path passes them
cdef int _STAGE_OF_MARK[N_MARKS]
_STAGE_OF_MARK[:] = [-1, 0, 1, 4, 2, 3, 5, 6, 7, 8, 9, 10]


cdef tuple _stage_durations(unsigned long long* m):
    """Durations between consecutive marks; a mark never reached counts 0 for its stage."""
    cdef unsigned long long prev = m[M_START]
    cdef unsigned long long d[11]
    cdef int k
    memset(d, 0, sizeof(d))
    for k in range(1, N_MARKS):
        if m[k] != 0:
            d[_STAGE_OF_MARK[k]] = m[k] - prev
            prev = m[k]
    return (d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10])


cdef void _trace(logger, Prepared p, unsigned long long* marks) noexcept:
    # VYRE_CUDA_TRACE=1: one log line per dispatch with each stage's microseconds
    try:
        stages = _stage_durations(marks)
        body = " ".join(f"{name}={ns / 1000:.1f}us" for name, ns in zip(STAGES, stages) if ns)
        logger.info("dispatch %s route=%s (%s) %s", p.label or "", p.route_name, p.route_reason, body)
    except Exception:
        pass


cdef void _copy_to(Prepared p, InFlight* f, char** dsts) noexcept nogil:
    cdef size_t k
    for k in range(p.outputs.size()):
        if p.outputs[k].nbytes:
            memcpy(dsts[k], f.staging + p.outputs[k].offset, p.outputs[k].nbytes)


cdef inline void _mark(unsigned long long* marks, int k) noexcept nogil:
    if marks != NULL:
        marks[k] = now_ns()


cdef cydriver.CUresult _issue(Prepared p, Py_buffer* views, InFlight* f, unsigned long long* marks,
                              const char** call) noexcept nogil:
    """Every host copy and driver call of one dispatch, in stream order. Returns the first failure."""
    cdef cydriver.CUresult st
    cdef size_t i, k, n_args
    cdef int it
    cdef InputCopy* ic
    cdef unsigned long long argv[MAX_ARGS]
    cdef void* argp[MAX_ARGS]
    cdef char* staging = f.staging
    cdef cydriver.CUstream s = f.stream
    cdef size_t cs = 0, ce, chunk, lo, hi
    cdef unsigned long long t_begin = 0, t_copy = 0, t = 0
    # Upload: copy each input into staging (zeroing its tail), the params blocks, and the zeros of
    # small outputs, then send [0, upload_end) up. A large upload goes in chunks so the DMA of one
    # chunk overlaps the host copy of the next.
    chunk = p.upload_end if p.upload_end <= 2 * UPLOAD_CHUNK else UPLOAD_CHUNK
    if marks != NULL:
        t_begin = now_ns()
    while cs < p.upload_end:
        ce = cs + chunk if cs + chunk < p.upload_end else p.upload_end
        if marks != NULL:
            t = now_ns()
        for i in range(p.inputs.size()):
            ic = &p.inputs[i]
            lo = ic.offset if ic.offset > cs else cs
            hi = ic.offset + ic.nbytes if ic.offset + ic.nbytes < ce else ce
            if hi > lo:
                memcpy(staging + lo, <const char*>views[ic.index].buf + (lo - ic.offset), hi - lo)
            lo = ic.offset + ic.nbytes if ic.offset + ic.nbytes > cs else cs
            hi = ic.zero_end if ic.zero_end < ce else ce
            if hi > lo:
                memset(staging + lo, 0, hi - lo)
        lo = p.params_offset0 if p.params_offset0 > cs else cs
        hi = p.params_offset0 + p.params_len if p.params_offset0 + p.params_len < ce else ce
        if hi > lo:
            memcpy(staging + lo, p.params_ptr + (lo - p.params_offset0), hi - lo)
        lo = p.host_clear_begin if p.host_clear_begin > cs else cs
        hi = p.host_clear_end if p.host_clear_end < ce else ce
        if hi > lo:
            memset(staging + lo, 0, hi - lo)
        if marks != NULL:
            t_copy += now_ns() - t
        call[0] = b"cuMemcpyHtoDAsync"
        st = cydriver.cuMemcpyHtoDAsync(f.slab + cs, staging + cs, ce - cs, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
        cs = ce
    if marks != NULL:
        # copies and DMA enqueues interleave: report their sums as consecutive stages
        t = now_ns()
        marks[M_STAGING] = t_begin + t_copy
        marks[M_PARAMS] = marks[M_STAGING]
        marks[M_H2D] = t
    if p.clear_end > p.clear_begin:
        call[0] = b"cuMemsetD8Async"
        st = cydriver.cuMemsetD8Async(f.slab + p.clear_begin, 0, p.clear_end - p.clear_begin, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    _mark(marks, M_CLEAR)
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
    # one params block per launch: a single one, or one per phase when host-split
    for it in range(p.iterations):
        for k in range(p.params_offsets.size()):
            argv[n_args] = f.slab + p.params_offsets[k]
            if p.route == ROUTE_COOPERATIVE:
                if p.barrier:  # the grid barrier counts from zero in every launch
                    call[0] = b"cuMemsetD32Async"
                    st = cydriver.cuMemsetD32Async(p.barrier, 0, 1, s)
                    if st != cydriver.CUDA_SUCCESS:
                        return st
                call[0] = b"cuLaunchCooperativeKernel"
                st = cydriver.cuLaunchCooperativeKernel(p.function, p.grid[0], p.grid[1], p.grid[2],
                                                       p.block[0], p.block[1], p.block[2],
                                                       p.shared_bytes, s, argp)
            else:
                call[0] = b"cuLaunchKernel"
                st = cydriver.cuLaunchKernel(p.function, p.grid[0], p.grid[1], p.grid[2],
                                             p.block[0], p.block[1], p.block[2],
                                             p.shared_bytes, s, argp, NULL)
            if st != cydriver.CUDA_SUCCESS:
                return st
    if f.timed:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.t1, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    _mark(marks, M_LAUNCH)
    for i in range(p.readbacks.size()):
        call[0] = b"cuMemcpyDtoHAsync"
        st = cydriver.cuMemcpyDtoHAsync(staging + p.readbacks[i].offset, f.slab + p.readbacks[i].offset,
                                        p.readbacks[i].nbytes, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    if p.route == ROUTE_COOPERATIVE and p.barrier:
        call[0] = b"cuMemcpyDtoHAsync"
        st = cydriver.cuMemcpyDtoHAsync(staging + p.audit_offset, p.barrier, 4, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    _mark(marks, M_READBACK)
    if f.has_done:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.done, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    _mark(marks, M_EVENT)
    return cydriver.CUDA_SUCCESS


def _input_error(program, Py_ssize_t i, obj, exc):
    names = [d.name for d in getattr(program, "inputs", ())]
    name = repr(names[i]) if i < len(names) else "(extra)"
    try:
        memoryview(obj)
        is_buffer = True
    except (TypeError, ValueError, BufferError):
        is_buffer = False
    if not is_buffer:
        return ValidationError(
            f"input {i} ({name}) is a {type(obj).__name__}, which does not expose the buffer protocol",
            "pass a numpy array, bytes, bytearray, memoryview or another C-contiguous buffer",
        )
    return ValidationError(
        f"input {i} ({name}) is not C-contiguous ({exc})",
        "pass numpy.ascontiguousarray(x) (a strided view must be copied before upload)",
    )


def _dtype_error(program, Py_ssize_t i, fmt, Py_ssize_t itemsize, obj):
    decl = program.inputs[i]
    if fmt[:1] in (">", "!"):
        return ValidationError(
            f"input {i} ({decl.name!r}) is big-endian (format {fmt!r}); the GPU reads little-endian",
            f"convert it with x.astype(x.dtype.newbyteorder('=')) before dispatch",
        )
    got = getattr(getattr(obj, "dtype", None), "name", f"format {fmt!r}, {itemsize}-byte items")
    return ValidationError(
        f"input {i} ({decl.name!r}) holds {got} but the buffer is declared {decl.dtype.name}",
        f"convert it, e.g. x.astype(numpy.{decl.dtype.numpy.name}), or pass raw bytes (a uint8 view) "
        "to reinterpret deliberately",
    )


def _as_input_list(inputs):
    try:
        memoryview(inputs)
        single = True
    except (TypeError, ValueError, BufferError):
        single = False
    if single or inputs is None or isinstance(inputs, (str, dict)):
        raise ValidationError(
            f"inputs must be a list or tuple of buffers (got a single {type(inputs).__name__}"
            f"{' with shape ' + str(inputs.shape) if hasattr(inputs, 'shape') else ''})",
            "pass inputs as [array_a, array_b, ...], one buffer per input, even for one input",
        )
    try:
        return list(inputs)
    except TypeError:
        raise ValidationError(
            f"inputs must be a list or tuple of buffers (got {type(inputs).__name__})",
            "pass inputs as [array_a, array_b, ...]",
        ) from None


def _as_output_list(outputs):
    if isinstance(outputs, list):
        return outputs
    try:
        memoryview(outputs)
        single = True
    except (TypeError, ValueError, BufferError):
        single = False
    if single or outputs is None or isinstance(outputs, (str, dict)):
        raise ValidationError(
            f"outputs must be a list or tuple of arrays (got {type(outputs).__name__})",
            "pass outputs as [out_array, ...], one writable array per output",
        )
    try:
        return list(outputs)
    except TypeError:
        raise ValidationError(
            f"outputs must be a list or tuple of arrays (got {type(outputs).__name__})",
            "pass outputs as [out_array, ...]",
        ) from None


def _check_outputs(Prepared p, list outs):
    cdef Py_buffer view
    cdef Py_ssize_t k
    plan_outputs = p.plan.bindings.outputs if p.plan is not None else None
    if len(outs) != len(p.out_counts):
        raise ValidationError(
            f"dispatch_into got {len(outs)} output buffer(s); the program returns {len(p.out_counts)}",
            f"pass exactly {len(p.out_counts)} output arrays, in declaration order",
        )
    for k in range(len(outs)):
        name = plan_outputs[k].decl.name if plan_outputs is not None else str(k)
        need = p.outputs[k].nbytes
        want = p.out_dtypes[k]
        got_dtype = getattr(outs[k], "dtype", None)
        if got_dtype is not None and got_dtype != want:
            raise ValidationError(
                f"output {k} ({name!r}) has dtype {got_dtype} but the buffer is {want}",
                f"pass numpy.empty({need // want.itemsize}, dtype=numpy.{want.name})",
            )
        try:
            PyObject_GetBuffer(outs[k], &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
        except Exception as exc:
            readonly = False
            try:
                readonly = memoryview(outs[k]).readonly
            except TypeError:
                raise ValidationError(
                    f"output {k} ({name!r}) is a {type(outs[k]).__name__}, not a buffer",
                    "pass a writable numpy array",
                ) from None
            if readonly:
                raise ValidationError(
                    f"output {k} ({name!r}) is read-only",
                    "pass a writable array (numpy.empty(...), or set arr.flags.writeable = True on an owner)",
                ) from None
            raise ValidationError(
                f"output {k} ({name!r}) is not C-contiguous ({exc})",
                "pass a C-contiguous array (numpy.empty(...) or numpy.ascontiguousarray)",
            ) from None
        size = view.len
        PyBuffer_Release(&view)
        if <size_t>size != need:
            raise ValidationError(
                f"output {k} ({name!r}) holds {size} bytes; the dispatch reads back {need}",
                f"pass an output of exactly {need} bytes ({need // want.itemsize} {want.name} elements)",
            )


@cython.final
cdef class PendingDispatch:
    """A dispatch in flight. Owns its stream, event, device slab and pinned staging until
    ``result()``/``result_into()``/``timed_result()`` (or until dropped, which waits, then recycles).
    """

    def __init__(self):
        raise TypeError("PendingDispatch is made by CudaBackend.dispatch_async(); it has no public constructor")

    @staticmethod
    cdef PendingDispatch _adopt(Core core, Prepared p, InFlight* f):
        cdef PendingDispatch self = PendingDispatch.__new__(PendingDispatch)
        self.core = core
        self.prep = p
        self.f = f[0]
        f.active = False  # ownership moves here
        core.outstanding += 1
        return self

    cdef int _wait(self) except -1:
        if self.completed:
            return 0
        self.core._wait(self.prep, &self.f)
        self.completed = True
        return 0

    cdef int _take(self) except -1:
        if self.f.active:
            with nogil:
                bind_context(self.core.ctx)  # results may be taken on another thread
        if self.consumed:
            raise ValidationError(
                "this PendingDispatch's result was already taken",
                "call result(), result_into() or timed_result() once per dispatch",
            )
        if not self.f.active:
            self.core._check_usable()
            raise DispatchFailed(
                "this dispatch failed earlier; its outputs do not exist",
                "handle the error raised by the failing call and dispatch again",
                status="failed", call="result",
            )
        return 0

    def is_ready(self):
        """True once the GPU has finished (never blocks)."""
        cdef cydriver.CUresult status
        if self.completed or self.consumed:
            return True
        if not self.f.active:
            return True
        with nogil:
            if self.f.has_done:
                status = cydriver.cuEventQuery(self.f.done)
            else:
                status = cydriver.cuStreamQuery(self.f.stream)
        if status == cydriver.CUDA_SUCCESS:
            return True
        if status == cydriver.CUDA_ERROR_NOT_READY:
            return False
        self.core._fail(self.prep, &self.f, status, b"cuEventQuery")

    def result(self):
        """Wait, then return the outputs as new numpy arrays (declaration order)."""
        self._take()
        try:
            self._wait()
        except _Timeout:
            raise _timeout_error(self.prep, self) from None
        outs = self.core._new_outputs(self.prep)
        self.core._copy_out(self.prep, &self.f, outs)
        self._finish()
        return outs

    def result_into(self, outputs):
        """Wait, then copy the outputs into the caller's arrays (checked) and return them."""
        outputs = _as_output_list(outputs)
        self._take()
        _check_outputs(self.prep, outputs)
        try:
            self._wait()
        except _Timeout:
            raise _timeout_error(self.prep, self) from None
        self.core._copy_out(self.prep, &self.f, outputs)
        self._finish()
        return outputs

    def timed_result(self):
        """Wait; return TimedDispatchResult(outputs, wall_ns, device_ns, enqueue_ns, wait_ns)."""
        cdef float ms = 0
        cdef unsigned long long t_wait0
        if not self.f.timed and not self.consumed:
            raise ValidationError(
                "this PendingDispatch was enqueued without timing events",
                "use CudaBackend.dispatch_async(program, inputs, timed=True) or dispatch_timed()",
            )
        self._take()
        t_wait0 = now_ns()
        try:
            self._wait()
        except _Timeout:
            raise _timeout_error(self.prep, self) from None
        check_cu(cydriver.cuEventElapsedTime(&ms, self.f.t0, self.f.t1), b"cuEventElapsedTime")
        outs = self.core._new_outputs(self.prep)
        self.core._copy_out(self.prep, &self.f, outs)
        t_end = now_ns()
        wall = t_end - self.f.t_start
        enqueue = self.f.t_enqueued - self.f.t_start
        wait = t_end - t_wait0
        device = <unsigned long long>(ms * 1e6)
        self._finish()
        tel = self.core.tel
        tel[T_TIMED] += 1
        tel[T_TIMED_WALL] += wall
        tel[T_TIMED_DEVICE] += device
        tel[T_TIMED_ENQUEUE] += enqueue
        tel[T_TIMED_WAIT] += wait
        return TimedDispatchResult(outs, wall, device, enqueue, wait)

    cdef void _finish(self) noexcept:
        self.core._recycle(self.prep, &self.f)
        self._settle()

    cdef void _settle(self) noexcept:
        # once per handle: the backend stops counting it, and a held gate opens
        if not self.consumed:
            self.consumed = True
            self.core.outstanding -= 1
        if self.gate is not None:
            gate, self.gate = self.gate, None
            try:
                gate.release()
            except Exception:
                pass

    @property
    def route(self):
        return self.prep.route_name

    def __dealloc__(self):
        # Dropped un-awaited: the GPU may still read the slab and write the staging, so wait
        # (GIL released) before recycling; if the wait fails, leak rather than recycle.
        cdef cydriver.CUresult status
        if self.core is None:
            return
        if self.f.active:
            with nogil:
                status = cydriver.cuCtxSetCurrent(self.core.ctx)
                if status == cydriver.CUDA_SUCCESS:
                    status = cydriver.cuStreamSynchronize(self.f.stream)
            if status == cydriver.CUDA_SUCCESS:
                self.core._recycle(self.prep, &self.f)
            else:
                self.core._leak(self.prep, &self.f)
        self._settle()
