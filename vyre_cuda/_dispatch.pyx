# cython: language_level=3
"""The hot path: one owner per dispatch, one enqueue routine, waits and PendingDispatch.

A dispatch looks up its prepared plan (one dict lookup keyed on program, config and input byte
lengths), then runs in C: pool acquisitions with the GIL held (a few C operations), every driver
call, bulk copy and wait with the GIL released, no Python object per argument or per buffer.

Device arrays (DLPack / CUDA Array Interface) are found only where the buffer protocol fails, so
host buffers pay nothing for them; a device input's kernel argument is its own pointer (or a
device-to-device copy for a read-write one), a device output is filled device-to-device. A
``DispatchConfig(stream=...)`` dispatch runs on the caller's stream, never returned to the pool.

Every dispatch, blocking or not, is owned by ONE :class:`PendingDispatch` from the moment it holds
resources: success, driver error, timeout, Ctrl-C and a dropped handle all end in that object, which
returns its stream, events, device slab and staging to the pools (or writes them off when the GPU
cannot be proven done with them).

Why one module of this size: the enqueue routine, the waits, the owner and the core's bookkeeping
pass C structs and typed objects to each other in ``nogil`` code; split across modules they would
need cross-module cdef calls on the hot path and one more indirection per call. What is not hot
lives elsewhere: the transfer engine (_transfer), pools (_pools), the cold input/output checks
(_io_checks.py) and every planning decision (planning/).
"""

cimport cython
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_WRITABLE
from cpython.exc cimport PyErr_CheckSignals
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport uintptr_t, uint32_t
from libc.string cimport memcpy, memset
from libcpp.vector cimport vector
from posix.time cimport nanosleep, timespec

cimport numpy as cnp
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, bind_context, now_ns
from ._pools cimport DevicePool, PinnedPool, HostPool, StreamPool, lend_block
from ._transfer cimport TransferEngine, Source, Piece, page_locked, SRC_ZERO, SRC_INPUT, SRC_PARAMS
from ._driver import status_name
from .config import DispatchConfig, as_config, _timeout as _check_timeout
from .program import Program
from .errors import DispatchFailed, DeviceLost, ValidationError, driver_error, STICKY_ERRORS
from .telemetry import TimedDispatchResult
from ._io_checks import as_input_list, as_output_list, check_outputs, dtype_error, input_error, raw_bits
from ._device_io import device_input, device_output
from ._devarray import DeviceArray

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

from numpy import frombuffer as _frombuffer

# NVTX ranges of traced dispatches: see _nvtx.hpp (why the C header, what each range covers)
cdef extern from "_nvtx.hpp" nogil:
    enum:
        VYRE_NVTX_STAGES
        VYRE_NVTX_SLOTS
    int vyre_nvtx_available() noexcept
    int vyre_nvtx_stage_open() noexcept
    void vyre_nvtx_push(const char* message, int slot) noexcept
    void vyre_nvtx_pop() noexcept
    void vyre_nvtx_stage(int stage) noexcept
    unsigned long long vyre_nvtx_start(const char* message) noexcept
    void vyre_nvtx_end(unsigned long long id) noexcept
    unsigned long long vyre_nvtx_counter(int slot) noexcept
    void vyre_nvtx_reset() noexcept

# Core.trace bits (0: untraced; the hot path tests only that)
cdef enum:
    TRACE_LOG = 1  # one log line per blocking dispatch with its stage microseconds
    TRACE_NVTX = 2  # NVTX ranges per dispatch and per stage

# NVTX stage ranges, in _nvtx.hpp's name order
cdef enum:
    S_LOOKUP = 0
    S_UPLOAD
    S_LAUNCH
    S_READBACK
    S_EVENT
    S_WAIT
    S_COPYOUT
    S_RELEASE
    S_ENQUEUE
    S_RESULT

NVTX_STAGES = (
    "plan_lookup", "upload", "launch", "readback_enqueue", "event_record", "wait", "copy_out",
    "release", "enqueue", "result",
)

cdef enum:
    OUTPUT_CACHE_MIN = 1 << 20  # outputs from this size up come from the recycled host pool
    ROUTE_REGULAR = 0
    ROUTE_COOPERATIVE = 1
    ROUTE_SPLIT = 2
    MAX_ARGS = 256

# how a blocking dispatch with no timeout waits (WAIT_POLL unless a measurement says otherwise)
cdef int _wait_mode = 0

# plans made for callers' streams kept at most (each new stream is a new plan key)
cdef int MAX_STREAM_PLANS = 64

# waits: spin this long (as cuStreamSynchronize would), then sleep-poll so Ctrl-C and timeouts work
cdef enum:
    SPIN_NS = 2000000
    SIGNAL_CHECK_NS = 20000000
    W_DONE = 0
    W_TIMEOUT = 1
    W_INTERRUPTED = 2

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
    T_LEAKED
    T_STAGED_H2D
    T_DIRECT_H2D
    T_STAGED_D2H
    T_DIRECT_D2H
    T_RING_CHUNKS
    T_INTERRUPTED
    T_GRAPH_REPLAYS
    T_GRAPH_CAPTURES
    T_GRAPH_UPDATES
    T_GRAPH_FALLBACKS  # N_COUNTERS (29) in the .pxd

# what the graph path did in one dispatch (PendingDispatch.graph_events)
cdef enum:
    G_REPLAY = 1
    G_CAPTURE = 2
    G_UPDATE = 4
    G_FALLBACK = 8
    # instantiated execs kept per prepared plan: a blocking loop reuses one slab (the device pool
    # is LIFO), a pipeline of k dispatches in flight rotates k slabs; beyond this, execs are updated
    GRAPH_EXECS = 8
    TRIAL_WARMUP = 4  # the first dispatches of each path (capture, cold caches) are not counted
    TRIAL_SAMPLES = 16  # per path


def _set_wait_mode(int mode):
    """For measurements only: 0 polls (interruptible), 1 polls without pausing between queries,
    2 calls cuStreamSynchronize (not interruptible) when there is no timeout."""
    global _wait_mode
    _wait_mode = mode


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


cdef inline bint _kind_ok(char want, Py_ssize_t want_size, const char* fmt, Py_ssize_t itemsize) noexcept:
    # want: 'f', 'i' or 'u' (bf16 is declared 'u': its raw bits as uint16), 0 for any
    if want == 0 or itemsize == 1:
        return True  # untyped declaration, or raw bytes reinterpreted on purpose
    return itemsize == want_size and _format_kind(fmt) == want


@cython.final
cdef class CoopGate:
    """Orders the cooperative launches of one module on the GPU.

    They share the module's grid-barrier counter, so they must not overlap. Each one's stream waits
    for the previous one's event: no host thread blocks, and a launch that times out or is
    interrupted keeps the next one waiting on the GPU until it really ends.
    """

    def __init__(self, uintptr_t ctx=0):
        self.order.last = NULL
        self.order.recorded = False

    cdef int ensure(self) except -1:
        # the event is made at the first cooperative dispatch (the backend's context is current)
        cdef cydriver.CUevent ev
        if self.order.last == NULL:
            with nogil:
                check_cu(cydriver.cuEventCreate(&ev, cydriver.CU_EVENT_DISABLE_TIMING), b"cuEventCreate")
            self.order.last = <void*>ev
        return 0

    def close(self):
        """Destroy the ordering event (the module is being unloaded; nothing is in flight)."""
        if self.order.last != NULL:
            cydriver.cuEventDestroy(<cydriver.CUevent>self.order.last)
            self.order.last = NULL
            self.order.recorded = False


@cython.final
cdef class Prepared:
    """A dispatch planned once, as C data: the core's only conversion of a DispatchPlan."""

    def __init__(self):
        raise TypeError("Prepared is made by Prepared.from_plan(plan) from a planning DispatchPlan")

    @staticmethod
    def from_plan(plan):
        """Convert a :class:`vyre_cuda.planning.dispatch.DispatchPlan` (every decision is the
        plan's; nothing is decided here)."""
        cdef Prepared self = Prepared.__new__(Prepared)
        cdef InputCheck ic
        cdef Segment seg
        cdef Source src
        cdef DevArg da
        layout, launch, route, config = plan.layout, plan.launch, plan.route, plan.config
        if plan.arg_count > MAX_ARGS:  # planning refuses these; the arrays below hold MAX_ARGS
            raise ValueError(f"{plan.arg_count} kernel arguments exceed {MAX_ARGS}")
        self.n_inputs = len(layout.inputs)
        for (index, offset, nbytes, zero_end), (itemsize, kind) in zip(layout.inputs, plan.input_specs):
            ic.index = index
            ic.itemsize = itemsize
            ic.kind = ord(kind) if kind else 0
            self.checks.push_back(ic)
        self.params_blob = layout.params_blob
        self.params_ptr = <const char*>self.params_blob
        self.params_len = len(self.params_blob)
        self.upload_end = layout.upload_end
        # the upload region as sorted runs covering [0, upload_end) exactly: inputs, their zeroed
        # tails, the params blocks, zeroed small outputs; any gap is zeroed too
        runs = []
        for index, offset, nbytes, zero_end in layout.inputs:
            runs.append((offset, nbytes, SRC_INPUT, index, 0))
            runs.append((offset + nbytes, zero_end - offset - nbytes, SRC_ZERO, -1, 0))
        runs.append((layout.params_offsets[0], self.params_len, SRC_PARAMS, -1, 0))
        cursor = 0
        for offset, nbytes, kind, index, src_offset in sorted(runs):
            if nbytes <= 0 or offset >= self.upload_end:
                continue
            if offset > cursor:
                src.offset, src.n, src.kind, src.index, src.src_offset = cursor, offset - cursor, SRC_ZERO, -1, 0
                self.sources.push_back(src)
            nbytes = min(nbytes, self.upload_end - offset)
            src.offset, src.n, src.kind, src.index, src.src_offset = offset, nbytes, kind, index, src_offset
            self.sources.push_back(src)
            cursor = offset + nbytes
        if cursor < self.upload_end:
            src.offset, src.n, src.kind, src.index, src.src_offset = cursor, self.upload_end - cursor, SRC_ZERO, -1, 0
            self.sources.push_back(src)
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
        self.slab_bytes = layout.slab_bytes
        self.ring = not plan.mirror
        self.bucket = plan.device_block
        self.staging_block = plan.staging_block
        self.audit_offset = plan.audit_offset
        self.clear_begin, self.clear_end = layout.clear
        for k in range(3):
            self.grid[k] = launch.grid[k]
            self.block[k] = launch.block[k]
        self.shared_bytes = launch.shared_bytes
        self.iterations = config.iterations
        self.route = {"regular": ROUTE_REGULAR, "cooperative": ROUTE_COOPERATIVE, "split": ROUTE_SPLIT}[route.kind]
        self.route_name = route.kind
        self.route_reason = route.reason
        self.function = <cydriver.CUfunction><uintptr_t>plan.function
        self.barrier = <cydriver.CUdeviceptr>plan.barrier
        self.barrier_ceiling = plan.barrier_ceiling
        self.out_dtypes = [d for d, _ in plan.output_specs]
        self.out_typenums = [d.num for d, _ in plan.output_specs]
        self.out_counts = [c for _, c in plan.output_specs]
        self.coop = plan.gate
        self.coop_order = &self.coop.order if self.coop is not None else NULL
        if getattr(plan, "graph", False) or getattr(plan, "graph_trial", False):
            self.graphs = new GraphCache(GRAPH_EXECS)
        if getattr(plan, "graph_trial", False):
            self.trial_left = TRIAL_WARMUP + 2 * TRIAL_SAMPLES
        self.label = config.label
        self.timeout = config.timeout
        self.plan = plan
        n_phases = len(layout.params_offsets)
        self.tel_h2d_bytes = layout.h2d_bytes
        self.tel_h2d_ops = 1 if layout.upload_end else 0
        self.tel_d2h_bytes = layout.d2h_bytes
        self.tel_d2h_ops = len(layout.readbacks)
        self.tel_param_bytes = len(layout.params_blob)
        per_iter = n_phases if self.route == ROUTE_SPLIT else 1
        self.tel_launches = per_iter * self.iterations
        self.tel_memsets = (1 if self.clear_end > self.clear_begin else 0) + (
            self.iterations if self.route == ROUTE_COOPERATIVE and self.barrier else 0)
        for arg, index, offset, nbytes in layout.device_args:
            da.arg, da.input, da.offset, da.nbytes = arg, index, offset, nbytes
            self.dev_args.push_back(da)
        stream = getattr(config, "stream", None)
        self.ext = stream is not None
        self.ext_stream = <cydriver.CUstream><uintptr_t>(stream or 0)
        self.device_outputs = getattr(config, "outputs", "host") == "device"
        return self

    def __dealloc__(self):
        # Core.clear_prepared / forget_context released every exec of a plan the core dispatched
        # (with or without driver calls); a plan never registered there never captured. So no
        # driver call here: this may run after the context is gone.
        if self.graphs != NULL:
            self.graphs.take_all()
            del self.graphs
            self.graphs = NULL

    def release_graphs(self, bint destroy=True):
        """Destroy (or, when the context is gone, forget) every graph exec of this plan and stop
        capturing new ones; returns how many there were. Waits for a dispatch using them."""
        cdef vector[void*] execs
        cdef void* capture_stream
        cdef size_t i
        if self.graphs == NULL:
            return 0
        with nogil:  # a dispatch may hold the lock while a launch hook needs the GIL (fake driver)
            self.graphs.lock()
            execs = self.graphs.take_all()
            capture_stream = self.graphs.take_capture_stream()
            self.graphs.unlock()
            if destroy:
                # an exec still running is freed when it completes (cuGraphExecDestroy)
                for i in range(execs.size()):
                    cydriver.cuGraphExecDestroy(<cydriver.CUgraphExec>execs[i])
                if capture_stream != NULL:  # only captures ran on it, all ended
                    cydriver.cuStreamDestroy(<cydriver.CUstream>capture_stream)
        return execs.size()

    @property
    def graph_trial_left(self):
        """Blocking dispatches left before this plan's graph-or-issued trial decides (0: decided
        or no trial); ``graph_choice`` then says what was kept and why."""
        return self.trial_left

    @property
    def graph_execs(self):
        """Instantiated graph execs this plan holds now (0 without graph replay)."""
        if self.graphs == NULL:
            return 0
        return self.graphs.size()

    @property
    def graphed(self):
        """True when this plan replays its launches as a CUDA graph (capture has not failed, and a
        trial, if any, kept the graph)."""
        return (self.graphs != NULL and not self.graphs.disabled and not self.graphs.closed
                and not self.graph_off and self.trial_left == 0)

    @property
    def slab_bytes_(self):
        """Bytes of the device slab."""
        return self.slab_bytes

    @property
    def route_kind(self):
        return self.route_name

    @property
    def staged_through_ring(self):
        """True when the dispatch streams through the transfer engine's ring (large slabs)."""
        return self.ring

    @property
    def gate(self):
        return self.coop

    def launch_geometry(self):
        return (tuple(self.grid[k] for k in range(3)), tuple(self.block[k] for k in range(3)), self.shared_bytes)

    def upload_runs(self):
        """(offset, bytes, kind, input index) runs of the upload region, for tests."""
        return [(s.offset, s.n, ("zero", "input", "params")[s.kind], s.index) for s in self.sources]


@cython.final
cdef class Core:
    """Per-backend driver state: context, pools, transfer engine, prepared plans, counters."""

    def __init__(self, uintptr_t ctx, planner, size_t device_cap, size_t pinned_cap, int trace=0,
                 int device=0, size_t chunk_bytes=8 << 20, int n_chunks=4, int copy_threads=8,
                 size_t output_cache=4294967296):
        self.ctx = <cydriver.CUcontext>ctx
        self.dpool = DevicePool(device_cap, ctx, device)
        self.ppool = PinnedPool(pinned_cap, ctx)
        self.opool = HostPool(output_cache)
        self.spool = StreamPool(128, ctx)
        self.xfer = TransferEngine(ctx, chunk_bytes, n_chunks, copy_threads)
        self.prepared = {}
        self.graphed = []
        self.planner = planner
        self.lost = None
        self.trace = trace
        import logging
        self.logger = logging.getLogger("vyre_cuda")
        self.device = device
        memset(self.tel, 0, sizeof(self.tel))

    # ---------------------------------------------------------------- bookkeeping
    def counters(self):
        return [self.tel[k] for k in range(N_COUNTERS)]

    def reset_counters(self):
        memset(self.tel, 0, sizeof(self.tel))
        self.dpool.reset_counters()
        self.ppool.reset_counters()
        self.opool.reset_counters()
        self.xfer.pinned_alloc_calls = 0

    def pool_stats(self):
        # each pool's counters are read together under its own lock
        dp, pp, op, sp = self.dpool.stats(), self.ppool.stats(), self.opool.stats(), self.spool.stats()
        return dict(
            pool_hits=dp["hits"] + pp["hits"],
            pool_misses=dp["misses"] + pp["misses"],
            device_pool_hits=dp["hits"],
            device_pool_misses=dp["misses"],
            device_pool_cached_bytes=dp["cached_bytes"],
            device_pool_live_bytes=dp["live_bytes"],
            device_pool_allocated_bytes=dp["allocated_bytes"],
            device_pool_stream_ordered_live_bytes=self.dpool.async_live_bytes,
            device_alloc_calls=dp["alloc_calls"],
            pinned_pool_hits=pp["hits"],
            pinned_pool_misses=pp["misses"],
            pinned_pool_cached_bytes=pp["cached_bytes"],
            pinned_pool_live_bytes=pp["live_bytes"],
            pinned_alloc_calls=pp["alloc_calls"] + self.xfer.pinned_alloc_calls,
            ring_bytes=self.xfer.ring_bytes,
            output_cache_hits=op["hits"],
            output_cache_misses=op["misses"],
            output_cache_cached_bytes=op["cached_bytes"],
            output_cache_live_bytes=op["live_bytes"],
            copy_threads_live=self.xfer.live_threads,
            streams_created=sp["streams_created"],
            streams_live=sp["streams_live"],
            events_created=sp["events_created"],
            events_live=sp["events_live"],
            prepared_plans=len(self.prepared),
            graph_execs_live=sum((<Prepared>p).graph_execs for p in list(self.graphed)),
        )

    def clear_prepared(self):
        self._release_graphs(self.ctx != NULL)
        self.prepared.clear()
        self.stream_plans = 0

    def _release_graphs(self, bint destroy):
        # the plans' graph execs go with the plans (module eviction, close, the lookup's bound);
        # a plan still used by a dispatch in flight then issues its launches without a graph
        graphed, self.graphed = self.graphed, []
        if graphed and destroy:
            bind_context(self.ctx)
        for p in graphed:
            (<Prepared>p).release_graphs(destroy)

    def forget_context(self):
        """Called once the backend's context is released after a fault: every pool drops its
        handles without a driver call (they died with the context)."""
        self._release_graphs(False)
        self.dpool.forget_context()
        self.ppool.forget_context()
        self.spool.forget_context()
        self.xfer.forget_context()
        self.ctx = NULL  # handles still pending write their resources off instead

    def prepared_for(self, key):
        return self.prepared.get(key)

    @property
    def context_handle(self):
        return <uintptr_t>self.ctx

    cdef int _enter(self) except -1:
        # one more call running inside the core: close() waits for it before freeing anything.
        # (_check_usable and the increment run with the GIL held and no release between them,
        # so a close() that sets `closed` either refuses this call or sees it counted)
        self._check_usable()
        self.busy += 1
        return 0

    def enter(self):
        """For backend calls outside the core (trim): count as running; pair with leave()."""
        self._enter()

    def leave(self):
        self.busy -= 1

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
    cdef Prepared _lookup(self, program, inputs, config, vector[Py_buffer]& views, PendingDispatch d):
        """Acquire every input buffer and find (or plan) the prepared dispatch. On failure every
        buffer acquired so far is released. A device input (found only where the buffer protocol
        fails, so host buffers pay nothing) marks its key entry ("device", bytes)."""
        cdef Py_ssize_t n, i
        cdef Py_buffer* view
        cdef object length  # an object: PyTuple_SET_ITEM steals this reference
        if type(program) is not Program:
            raise ValidationError(
                f"dispatch needs a vyre_cuda.Program (got {type(program).__name__})",
                "build one with Program(Kernel.cuda(src), [BufferDecl...])",
            )
        if type(inputs) is not list and type(inputs) is not tuple:
            inputs = as_input_list(inputs)
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
                length = view.len
            except Exception as exc:
                try:
                    length = self._cold_input(program, inputs[i], i, n, config, view, d, exc)
                except BaseException:
                    _release(views, i)
                    raise
            Py_INCREF(length)
            PyTuple_SET_ITEM(key, i + 2, length)
        try:
            prep = self.prepared.get(key)
            if prep is None:
                if config is not None and config.stream is not None:
                    # a caller's stream: the cached plan and its key hold the handle, never the
                    # stream object (the dispatch holds that while it runs); and such plans are
                    # bounded, since every new stream is a new key
                    config = config._without_stream_object()
                    key = (program, config) + key[2:]
                    self.stream_plans += 1
                    if self.stream_plans > MAX_STREAM_PLANS:
                        self.clear_prepared()
                        self.stream_plans = 1
                if d.dev_ptrs.size():  # device inputs: their key entries are ("device", nbytes)
                    lengths = tuple(x[1] if type(x) is tuple else x for x in key[2:])
                    on_device = frozenset(k for k, x in enumerate(key[2:]) if type(x) is tuple)
                    prep = self.planner(program, lengths, config, on_device, inputs)
                else:
                    # the inputs themselves go along for autotune, which measures on them
                    prep = self.planner(program, key[2:], config, frozenset(), inputs)
                if len(self.prepared) >= 4096:
                    self.clear_prepared()  # bounded: distinct lengths should not grow memory forever
                self.prepared[key] = prep
                if (<Prepared>prep).graphs != NULL:
                    self.graphed.append(prep)  # its graphs are released with the plans
        except BaseException:  # a planning error, or an unhashable config field
            _release(views, n)
            raise
        cdef Prepared p = <Prepared>prep
        cdef InputCheck* ic
        for i in range(<Py_ssize_t>p.checks.size()):
            ic = &p.checks[i]
            view = &views[ic.index]
            if not _kind_ok(ic.kind, ic.itemsize, view.format, view.itemsize):
                fmt = view.format.decode() if view.format != NULL else "B"
                _release(views, n)
                raise dtype_error(program, ic.index, fmt, view.itemsize, inputs[ic.index])
        return p

    cdef object _cold_input(self, program, obj, Py_ssize_t i, Py_ssize_t n, config, Py_buffer* view,
                            PendingDispatch d, exc):
        """An input the buffer protocol refused: raw bits of a format-less dtype, a CPU DLPack
        tensor (its numpy view), or a device array. Returns its key entry; raises a typed error."""
        bits = raw_bits(obj)  # bfloat16 & co. export no format: take their raw bits
        if bits is None:
            bind_context(self.ctx)  # the pointer queries of the device checks want our context
            dv = device_input(program, i, obj, self.device, getattr(config, "stream", None))
            if dv is None:
                raise input_error(program, i, obj, exc) from None
            if type(dv) is not cnp.ndarray:
                # the GPU reads it where it is; an empty placeholder view keeps the release loops uniform
                PyObject_GetBuffer(b"", view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                if d.dev_ptrs.size() == 0:
                    d.dev_ptrs.assign(n, 0)
                    d.keep = []
                d.dev_ptrs[i] = <cydriver.CUdeviceptr>dv.ptr
                d.keep.append(dv.keep)
                if dv.wait is not None:
                    if d.waits is None:
                        d.waits = []
                    d.waits.append(dv.wait)
                return ("device", dv.nbytes)
            bits = dv  # a CPU DLPack tensor as numpy: the host path
        try:
            PyObject_GetBuffer(bits, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        except Exception:
            raise input_error(program, i, obj, exc) from None
        return view.len

    cdef int _stream_waits(self, PendingDispatch d, list streams) except -1:
        """Order the dispatch stream after each of ``streams`` (the producers of device arrays,
        per DLPack and CUDA Array Interface v3), through an event recorded on each. A producer
        stream with nothing left to run (``cuStreamQuery``: its work so far is complete, so the
        arrays are ready) needs no wait: that skips an event record and, on the GPU, a cross-stream
        dependency, the larger part of a small device-array dispatch's cost when the producer is
        idle. The event goes back to the pool at once: a wait applies to the record made before
        it, whatever is recorded on the event later."""
        cdef cydriver.CUevent ev
        cdef cydriver.CUstream other
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef const char* call = b"cuEventRecord"
        for w in set(streams):
            other = <cydriver.CUstream><uintptr_t>w
            if other == d.f.stream:
                continue
            with nogil:
                st = cydriver.cuStreamQuery(other)
            if st == cydriver.CUDA_SUCCESS:
                continue  # any other answer (busy, capturing, an error): wait through an event
            self.spool.acquire_event(False, &ev)
            with nogil:
                call = b"cuEventRecord"
                st = cydriver.cuEventRecord(ev, other)
                if st == cydriver.CUDA_SUCCESS:
                    call = b"cuStreamWaitEvent"
                    st = cydriver.cuStreamWaitEvent(d.f.stream, ev, 0)
            self.spool.release_event(ev, False)
            if st != cydriver.CUDA_SUCCESS:
                self._fail(d, st, call)
        return 0

    cdef int _late_device_outputs(self, PendingDispatch d) except -1:
        """Device outputs named after the enqueue (result_into of an async dispatch): copy them
        now, on the dispatch stream, and wait for the copies."""
        cdef cydriver.CUresult st
        cdef const char* call = NULL
        with nogil:
            st = _device_copies(d, &call)
            if st == cydriver.CUDA_SUCCESS:
                if d.f.has_done:
                    call = b"cuEventRecord"
                    st = cydriver.cuEventRecord(d.f.done, d.f.stream)
                    if st == cydriver.CUDA_SUCCESS:
                        call = b"cuEventSynchronize"
                        st = cydriver.cuEventSynchronize(d.f.done)
                else:
                    call = b"cuStreamSynchronize"
                    st = cydriver.cuStreamSynchronize(d.f.stream)
        if st != cydriver.CUDA_SUCCESS:
            self._fail(d, st, call)
        return 0

    cdef list _device_array_outputs(self, Prepared p):
        cdef Py_ssize_t k
        cdef size_t nbytes
        outs = []
        for k in range(len(p.out_counts)):
            nbytes = p.outputs[k].nbytes
            outs.append(DeviceArray._empty(nbytes // (<cnp.dtype>p.out_dtypes[k]).itemsize, p.out_dtypes[k],
                                           self.device))
        return outs

    # ---------------------------------------------------------------- one owner per dispatch
    cdef PendingDispatch _begin(self, program, inputs, config, list into, bint want_done, bint timed,
                                unsigned long long* marks):
        """Plan lookup, output checks and resources: from here on the returned owner holds
        everything, and releases it on every path."""
        cdef PendingDispatch d
        cdef Prepared p
        cdef size_t i, n
        self._check_usable()
        if config is not None and type(config) is not DispatchConfig:
            config = as_config(config)
        d = PendingDispatch.__new__(PendingDispatch)
        d.core = self
        p = self._lookup(program, inputs, config, d.views, d)
        d.prep = p
        d.no_graph = p.graph_off or p.trial_left > 0  # undecided plans issue (the trial alternates)
        if into is not None:
            d.out_checked = check_outputs(p.plan, into, self.device,
                                          <uintptr_t>p.ext_stream if p.ext else None)  # before it runs
        if marks != NULL:
            marks[M_LOOKUP] = now_ns()
        self._acquire(p, &d.f, want_done or p.ext, timed)  # a caller's stream: wait on an event, not on it
        self.outstanding += 1
        if p.ext:  # the caller's stream object stays alive while its dispatch runs
            if d.keep is None:
                d.keep = []
            d.keep.append(config)
        if d.waits is not None:
            self._stream_waits(d, d.waits)
        if p.coop is not None:
            p.coop.ensure()
        n = d.views.size()
        d.input_ptrs.resize(n)
        d.direct.assign(n, 0)
        for i in range(n):
            d.input_ptrs[i] = <const char*>d.views[i].buf
        if p.ring:
            self.xfer.ensure_ring()
            self.xfer.wake()  # the copy threads wake while the rest is set up
            with nogil:
                for i in range(n):
                    if page_locked(d.views[i].buf, d.views[i].len):
                        d.direct[i] = 1
                        d.any_direct = True
        if p.timeout is not None:
            d.deadline = now_ns() + _timeout_ns(p.timeout)
            d.wait_timeout = p.timeout
        return d

    cdef int _acquire(self, Prepared p, InFlight* f, bint want_done, bint timed) except -1:
        cdef uintptr_t block = 0
        f.active = False
        f.enqueued = False
        f.has_done = False
        f.timed = False
        f.async_slab = p.ring and self.dpool.stream_ordered
        # any thread may dispatch: make the backend's context current before the first driver
        # call (GIL kept: this is cheaper than a GIL release and re-acquire)
        bind_context(self.ctx)
        f.ext_stream = p.ext
        if p.ext:
            f.stream = p.ext_stream
        else:
            self.spool.acquire_stream(&f.stream)
        try:
            if f.async_slab:
                self.dpool.acquire_async(p.bucket, f.stream, &f.slab)
            else:
                self.dpool.acquire(p.bucket, &block)
                f.slab = <cydriver.CUdeviceptr>block
        except BaseException:
            self._release_stream(f)
            raise
        f.staging = NULL
        try:
            if p.staging_block:
                self.ppool.acquire(p.staging_block, &block)
                f.staging = <char*>block
        except BaseException:
            self._release_slab(p, f)
            self._release_stream(f)
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
            if f.staging != NULL:
                self.ppool.release(<uintptr_t>f.staging, p.staging_block)
            self._release_slab(p, f)
            self._release_stream(f)
            raise
        f.active = True
        return 0

    cdef void _release_stream(self, InFlight* f) noexcept:
        # a caller's stream (DispatchConfig(stream=...)) is theirs: never returned to the pool
        if not f.ext_stream:
            self.spool.release_stream(f.stream)

    cdef void _release_slab(self, Prepared p, InFlight* f) noexcept:
        if f.async_slab:
            self.dpool.release_async(f.slab, p.bucket, f.stream)
        else:
            self.dpool.release(<uintptr_t>f.slab, p.bucket)

    cdef void _recycle(self, Prepared p, InFlight* f) noexcept:
        if not f.active:
            return
        f.active = False
        self._release_slab(p, f)
        if f.staging != NULL:
            self.ppool.release(<uintptr_t>f.staging, p.staging_block)
        self._release_stream(f)
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
        if f.async_slab:
            self.dpool.forget_async(p.bucket)
        else:
            self.dpool.forget(p.bucket)
        if f.staging != NULL:
            self.ppool.forget(p.staging_block)
        self.spool.forget(0 if f.ext_stream else 1, (1 if f.has_done else 0) + (2 if f.timed else 0))
        self.tel[T_LEAKED] += 1

    cdef int _fail(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1:
        """Fail closed: synchronise the stream; recycle on success, leak on failure; raise."""
        cdef cydriver.CUresult sync = cydriver.CUDA_SUCCESS
        cdef InFlight* f = &d.f
        if f.active:
            with nogil:
                sync = cydriver.cuStreamSynchronize(f.stream)
            if sync == cydriver.CUDA_SUCCESS:
                self._recycle(d.prep, f)
            else:
                self._leak(d.prep, f)
        self.tel[T_FAILED] += 1
        d._release_views()
        d._release_out_views()
        d._settle()
        name = status_name(<int>status)
        err = driver_error(name, call.decode() if call != NULL else "?", code=<int>status)
        if name in STICKY_ERRORS:
            self.lost = (name, call.decode() if call != NULL else "?")
        elif sync != cydriver.CUDA_SUCCESS and status_name(<int>sync) in STICKY_ERRORS:
            self.lost = (status_name(<int>sync), "cuStreamSynchronize")
        raise err

    cdef int _after_enqueue(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1:
        cdef Prepared p = d.prep
        cdef size_t i
        cdef unsigned long long direct = 0
        if status != cydriver.CUDA_SUCCESS:
            self._fail(d, status, call)
        d.f.enqueued = True
        self.tel[T_DISPATCHES] += 1
        self.tel[T_H2D_BYTES] += p.tel_h2d_bytes
        self.tel[T_TRANSIENT] += p.bucket
        self.tel[T_PARAM_BYTES] += p.tel_param_bytes
        self.tel[T_LAUNCHES] += p.tel_launches
        if p.route == ROUTE_COOPERATIVE:
            self.tel[T_COOP_LAUNCHES] += p.tel_launches
        elif p.route == ROUTE_SPLIT:
            self.tel[T_SPLIT_LAUNCHES] += p.tel_launches
        self.tel[T_MEMSETS] += p.tel_memsets
        if d.graph_events:
            self.tel[T_GRAPH_REPLAYS] += (d.graph_events & G_REPLAY) != 0
            self.tel[T_GRAPH_CAPTURES] += (d.graph_events & G_CAPTURE) != 0
            self.tel[T_GRAPH_UPDATES] += (d.graph_events & G_UPDATE) != 0
            self.tel[T_GRAPH_FALLBACKS] += (d.graph_events & G_FALLBACK) != 0
            d.graph_events = 0
        if p.ring:
            self.tel[T_H2D_OPS] += d.ops[0]
            self.tel[T_RING_CHUNKS] += d.ops[1]
            if d.any_direct:
                for i in range(p.sources.size()):
                    if p.sources[i].kind == SRC_INPUT and d.direct[p.sources[i].index]:
                        direct += p.sources[i].n
        else:
            self.tel[T_H2D_OPS] += p.tel_h2d_ops
        self.tel[T_DIRECT_H2D] += direct
        self.tel[T_STAGED_H2D] += p.tel_h2d_bytes - direct
        d.ops[0] = d.ops[1] = 0
        return 0

    cdef int _after_wait(self, PendingDispatch d, int outcome, cydriver.CUresult status, const char* call) except -1:
        """Turn a wait's outcome into completion or an exception; the work stays owned by ``d``
        when it is still running (timeout, interrupt)."""
        self.tel[T_SYNCS] += 1
        if outcome == W_DONE:
            if status != cydriver.CUDA_SUCCESS:
                self._fail(d, status, call)
            d.completed = True
            return 0
        d._release_out_views()
        if not d.any_direct:
            d._release_views()
        if outcome == W_TIMEOUT:
            d.timed_out = True
            raise _timeout_error(d.wait_timeout, d)
        self.tel[T_INTERRUPTED] += 1
        exc, d.interrupt = d.interrupt, None
        try:
            exc.pending = d
        except Exception:
            pass
        raise exc

    cdef int _after_collect(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1:
        cdef Prepared p = d.prep
        cdef size_t k
        cdef unsigned long long direct = 0
        d._release_out_views()
        if status != cydriver.CUDA_SUCCESS:
            self._fail(d, status, call)
        if p.ring:
            self.tel[T_D2H_OPS] += d.ops[0]
            self.tel[T_RING_CHUNKS] += d.ops[1]
            for k in range(d.out_direct.size()):
                if d.out_direct[k]:
                    direct += d.out_pieces[k].n
        else:
            self.tel[T_D2H_OPS] += p.tel_d2h_ops
        self.tel[T_D2H_BYTES] += p.tel_d2h_bytes
        self.tel[T_DIRECT_D2H] += direct
        self.tel[T_STAGED_D2H] += p.tel_d2h_bytes - direct
        d.ops[0] = d.ops[1] = 0
        return 0

    cdef int _audit(self, PendingDispatch d) except -1:
        cdef uint32_t counter
        cdef Prepared p = d.prep
        if p.coop is None:
            return 0
        memcpy(&counter, d.f.staging + p.audit_offset, 4)
        if counter > p.barrier_ceiling:
            self.tel[T_FAILED] += 1
            d._finish()
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
        cdef size_t nbytes
        if p.device_outputs:
            return self._device_array_outputs(p)
        for k in range(len(p.out_counts)):
            dim = p.out_counts[k]
            nbytes = p.outputs[k].nbytes
            if nbytes != <size_t>dim * (<cnp.dtype>p.out_dtypes[k]).itemsize:
                # an output_byte_range reads back part of the buffer: return those bytes' elements
                dim = nbytes // (<cnp.dtype>p.out_dtypes[k]).itemsize
            if p.ring and nbytes >= OUTPUT_CACHE_MIN and self.opool.cap_bytes:
                # a large output: recycled host memory, already faulted in (see HostPool)
                outs.append(_frombuffer(lend_block(self.opool, nbytes), dtype=p.out_dtypes[k], count=dim))
            else:
                outs.append(cnp.PyArray_EMPTY(1, &dim, p.out_typenums[k], 0))
        return outs

    cdef int _targets(self, PendingDispatch d, list outs) except -1:
        """Where each output's bytes go: numpy data pointers, or buffers held until collected."""
        cdef Prepared p = d.prep
        cdef Py_ssize_t k, n = len(outs)
        cdef Piece piece
        cdef DevCopy dc
        cdef list waits = None
        d.out_pieces.clear()
        d.out_dev.clear()
        d.out_direct.assign(n, 0)
        for k in range(n):
            piece.dev_offset = p.outputs[k].offset
            piece.n = p.outputs[k].nbytes
            dv = None
            if type(outs[k]) is cnp.ndarray:
                piece.host = <char*>cnp.PyArray_DATA(<cnp.ndarray>outs[k])
            elif d.out_checked is not None and d.out_checked[k] is not None:
                dv = d.out_checked[k]  # a device array check_outputs already checked
            else:
                d.out_views.resize(d.out_views.size() + 1)
                try:
                    PyObject_GetBuffer(outs[k], &d.out_views.back(), PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
                    piece.host = <char*>d.out_views.back().buf
                except BaseException as exc:
                    d.out_views.pop_back()
                    try:
                        dv = device_output(p.plan, k, outs[k], self.device,
                                           <uintptr_t>p.ext_stream if p.ext else None)
                    except BaseException:
                        d._release_out_views()
                        raise
                    if dv is None:
                        d._release_out_views()
                        raise exc
            if dv is not None:  # a device array: copied device-to-device from the slab, not read back
                dc.ptr, dc.dev_offset, dc.n = <cydriver.CUdeviceptr>dv.ptr, piece.dev_offset, piece.n
                d.out_dev.push_back(dc)
                if d.keep is None:
                    d.keep = []
                d.keep.append(dv.keep)
                if dv.wait is not None:
                    waits = [dv.wait] if waits is None else waits + [dv.wait]
                piece.host = NULL
                piece.n = 0
            d.out_pieces.push_back(piece)
        if waits is not None:
            self._stream_waits(d, waits)  # before the copies into them are enqueued
        if p.ring:
            with nogil:
                for k in range(n):
                    if d.out_pieces[k].n and page_locked(d.out_pieces[k].host, d.out_pieces[k].n):
                        d.out_direct[k] = 1
        return 0

    # ---------------------------------------------------------------- entry points
    def dispatch(self, program, inputs, config=None):
        """Run and wait; return the outputs as new numpy arrays."""
        self._enter()
        try:
            return self._blocking(program, inputs, config, None, NULL)
        finally:
            self.busy -= 1

    def dispatch_into(self, program, inputs, outputs, config=None):
        self._enter()
        try:
            return self._blocking(program, inputs, config, as_output_list(outputs), NULL)
        finally:
            self.busy -= 1

    def dispatch_profiled(self, program, inputs, config=None, unsigned long long start_ns=0):
        """Like dispatch, also returning the stage durations (ns) aligned with STAGES.

        ``start_ns`` (CLOCK_MONOTONIC, e.g. ``time.perf_counter_ns()`` on Linux) taken by the
        caller just before the call puts the call's own overhead into ``plan_lookup``.
        """
        cdef unsigned long long marks[N_MARKS]
        memset(marks, 0, sizeof(marks))
        marks[M_START] = start_ns
        self._enter()
        try:
            outs = self._blocking(program, inputs, config, None, marks)
        finally:
            self.busy -= 1
        return outs, _stage_durations(marks)

    cdef object _blocking(self, program, inputs, config, list into, unsigned long long* marks):
        """The blocking dispatch: ONE GIL release covers the enqueue, the wait and the copy out,
        so other Python threads run meanwhile and this one re-takes the GIL once."""
        cdef PendingDispatch d
        cdef Prepared p
        cdef TransferEngine xfer
        cdef unsigned long long trace_marks[N_MARKS]
        cdef cydriver.CUresult st, wst = cydriver.CUDA_SUCCESS, cst = cydriver.CUDA_SUCCESS
        cdef const char* call = NULL
        cdef const char* ccall = NULL
        cdef int outcome = W_DONE
        cdef unsigned long long t_trial = 0
        if self.trace:
            if self.trace & TRACE_NVTX and not vyre_nvtx_stage_open():
                return _nvtx_blocking(self, program, inputs, config, into, marks)
            if marks == NULL:
                marks = trace_marks
                memset(marks, 0, sizeof(trace_marks))
        if marks != NULL and marks[M_START] == 0:
            marks[M_START] = now_ns()
        d = self._begin(program, inputs, config, into, False, False, marks)
        p = d.prep
        if marks != NULL and vyre_nvtx_stage_open():
            vyre_nvtx_stage(S_UPLOAD)
        xfer = self.xfer
        outs = self._new_outputs(p) if into is None else into
        self._targets(d, outs)
        if p.trial_left:
            # graph-or-issued trial: alternate the paths, time the whole round trip
            d.no_graph = (p.trial_left & 1) == 0
            t_trial = now_ns()
        with nogil:
            st = _issue(d, p, xfer, marks, &call)
            if st == cydriver.CUDA_SUCCESS:
                outcome = _wait_nogil(d, &wst)
                _mark(marks, M_WAIT)
                if outcome == W_DONE and wst == cydriver.CUDA_SUCCESS:
                    cst = _collect_nogil(d, p, xfer, &ccall)
                    _mark(marks, M_COPYOUT)
        self._after_enqueue(d, st, call)
        self._after_wait(d, outcome, wst, b"cuStreamQuery")
        self._after_collect(d, cst, ccall)
        self._audit(d)
        if p.trial_left:
            _trial_record(p, d.no_graph, now_ns() - t_trial)
        d._finish()
        if marks != NULL:
            marks[M_RELEASE] = now_ns()
        if self.trace & TRACE_LOG:
            _trace(self.logger, p, marks)
        return outs

    def dispatch_async(self, program, inputs, config=None, bint timed=False):
        """Enqueue and return the PendingDispatch that owns everything the GPU still uses."""
        self._enter()
        try:
            if self.trace & TRACE_NVTX:
                return _nvtx_async(self, program, inputs, config, timed)
            return self._async(program, inputs, config, timed)
        finally:
            self.busy -= 1

    cdef PendingDispatch _async(self, program, inputs, config, bint timed):
        cdef PendingDispatch d
        cdef Prepared p
        cdef TransferEngine xfer = self.xfer
        cdef cydriver.CUresult st
        cdef const char* call = NULL
        cdef unsigned long long t0 = now_ns()
        d = self._begin(program, inputs, config, None, True, timed, NULL)
        p = d.prep
        d.f.t_start = t0
        with nogil:
            st = _issue(d, p, xfer, NULL, &call)
        self._after_enqueue(d, st, call)
        d.f.t_enqueued = now_ns()
        if not d.any_direct:
            d._release_views()  # every input byte is in staging or on the device: the caller may reuse them
        return d

    def dispatch_timed(self, program, inputs, config=None):
        cdef PendingDispatch pending = self.dispatch_async(program, inputs, config, True)
        return pending.timed_result(pending.prep.timeout)  # a blocking call: the config's timeout


def _nvtx_label(program, config):
    # the dispatch range's name: DispatchConfig.label, else the program's name, else its entry
    label = None
    if config is not None:
        label = config.get("label") if type(config) is dict else getattr(config, "label", None)
    if not label:
        label = getattr(program, "name", None) or getattr(getattr(program, "kernel", None), "entry", None)
    return str(label or "dispatch").encode("utf-8", "replace")


cdef object _nvtx_blocking(Core core, program, inputs, config, list into, unsigned long long* marks):
    """A blocking dispatch inside one NVTX range named by its label, with one nested range per
    stage; every range is closed on every path (error, timeout, Ctrl-C)."""
    cdef bytes label = _nvtx_label(program, config)
    vyre_nvtx_push(label, VYRE_NVTX_STAGES)
    vyre_nvtx_stage(S_LOOKUP)
    try:
        return core._blocking(program, inputs, config, into, marks)
    finally:
        vyre_nvtx_stage(-1)
        vyre_nvtx_pop()


cdef PendingDispatch _nvtx_async(Core core, program, inputs, config, bint timed):
    """An async dispatch: a start/end range from here until its result is taken (or it fails or
    is dropped; it may end on another thread), with an "enqueue" range nested here."""
    cdef bytes label = _nvtx_label(program, config)
    cdef PendingDispatch d
    cdef unsigned long long rid = vyre_nvtx_start(label)
    vyre_nvtx_push(b"enqueue", S_ENQUEUE)
    try:
        d = core._async(program, inputs, config, timed)
    except BaseException:
        vyre_nvtx_end(rid)
        raise
    finally:
        vyre_nvtx_pop()
    d.traced = True
    if d.settled:  # cannot happen today (enqueue failures raise); keep the range balanced anyway
        vyre_nvtx_end(rid)
    else:
        d.nvtx_range = rid
        d.nvtx_started = True
    return d


def nvtx_available():
    """True when this build calls NVTX (the header was found); else ranges are only counted."""
    return bool(vyre_nvtx_available())


def nvtx_counts():
    """NVTX calls made by traced dispatches in this process: pushes per stage range name, and
    ``dispatch`` (label ranges of blocking dispatches), ``pops``, ``starts`` and ``ends``."""
    counts = {name: vyre_nvtx_counter(k) for k, name in enumerate(NVTX_STAGES)}
    counts["dispatch"] = vyre_nvtx_counter(VYRE_NVTX_STAGES)
    counts["pops"] = vyre_nvtx_counter(VYRE_NVTX_STAGES + 1)
    counts["starts"] = vyre_nvtx_counter(VYRE_NVTX_STAGES + 2)
    counts["ends"] = vyre_nvtx_counter(VYRE_NVTX_STAGES + 3)
    return counts


def nvtx_reset():
    """Zero the counts of :func:`nvtx_counts` (tests)."""
    vyre_nvtx_reset()


cdef void _trial_record(Prepared p, bint issued, unsigned long long ns) noexcept:
    """One sample of a plan's graph-or-issued trial (GIL held, so samples never race). After the
    warm-up, TRIAL_SAMPLES round trips per path; then the graph stays only when its median is at
    least 3% below the issued one (measured here, so a machine where graphs are slower keeps
    issuing: no regression)."""
    cdef int path = 0 if issued else 1
    cdef unsigned long long med[2]
    cdef int k
    if p.trial_left <= 0:
        return
    if p.graphs == NULL or p.graphs.disabled:  # capture failed: nothing to compare
        p.trial_left = 0
        p.graph_off = True
        p.graph_choice = "issued: the launches could not be captured"
        return
    p.trial_left -= 1
    if p.trial_left < 2 * TRIAL_SAMPLES and p.trial_n[path] < TRIAL_SAMPLES:
        p.trial_ns[path][p.trial_n[path]] = ns
        p.trial_n[path] += 1
    if p.trial_left > 0:
        return
    for k in range(2):
        med[k] = _median(p.trial_ns[k], p.trial_n[k])
    p.graph_off = not (med[1] * 100 < med[0] * 97)
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


class _Timeout(Exception):
    pass


cdef unsigned long long _timeout_ns(timeout) except? 0:
    # the config bounds timeouts; anything beyond ~292 years means "no bound"
    t = float(timeout) * 1e9
    if t >= 9.2e18:
        return 0xFFFFFFFFFFFFFFFF // 2
    return <unsigned long long>t if t > 1 else 1


def _timeout_error(timeout, pending):
    err = DispatchFailed(
        f"the dispatch did not complete within its timeout of {timeout} s",
        "raise DispatchConfig(timeout=...) (or result(timeout=...)), or wait on the PendingDispatch "
        "in this error's .pending attribute (its result() waits without bound by default); its "
        "resources stay owned by it until it completes",
        status="timeout", call="wait",
    )
    err.pending = pending
    return err


cdef void _release(vector[Py_buffer]& views, Py_ssize_t n) noexcept:
    # release the first n (the ones acquired so far) and forget all: the owner must not release
    # them again
    cdef Py_ssize_t i
    for i in range(n):
        PyBuffer_Release(&views[i])
    views.clear()


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
        path = "ring" if p.ring else "mirror"
        logger.info("dispatch %s route=%s (%s) %s %s", p.label or "", p.route_name, p.route_reason, path, body)
    except Exception:
        pass


cdef inline void _mark(unsigned long long* marks, int k) noexcept nogil:
    if marks != NULL:
        marks[k] = now_ns()
        if vyre_nvtx_stage_open():  # an NVTX-traced blocking dispatch: the next stage's range
            vyre_nvtx_stage(_NVTX_AFTER_MARK[k])


# the NVTX stage range each stage mark opens (-1: none); the upload range opens after the lookup
cdef int _NVTX_AFTER_MARK[N_MARKS]
_NVTX_AFTER_MARK[:] = [-1, -1, -1, -1, -1, S_LAUNCH, S_READBACK, S_EVENT, S_WAIT, S_COPYOUT, S_RELEASE, -1]


cdef int _check_signals(PendingDispatch d) noexcept with gil:
    # Ctrl-C while waiting: keep the KeyboardInterrupt (or whatever a handler raised) on the owner
    try:
        PyErr_CheckSignals()
    except BaseException as exc:
        d.interrupt = exc
        return 1
    return 0


cdef int _wait_nogil(PendingDispatch d, cydriver.CUresult* status) noexcept nogil:
    """Wait for the dispatch's GPU work. Spins first (a short dispatch is done within microseconds,
    as cuStreamSynchronize would spin), then sleeps between polls so a timeout or Ctrl-C (checked
    every 20 ms on the main thread) can end the wait. Returns W_DONE (``status`` says how it went),
    W_TIMEOUT or W_INTERRUPTED."""
    cdef InFlight* f = &d.f
    cdef cydriver.CUresult st
    cdef unsigned long long t0 = now_ns(), t, next_signals = 0
    cdef timespec nap
    cdef long interval = 10000
    cdef int _spin
    if _wait_mode == 2 and not d.deadline:
        status[0] = cydriver.cuEventSynchronize(f.done) if f.has_done else cydriver.cuStreamSynchronize(f.stream)
        return W_DONE
    while True:
        if f.has_done:
            st = cydriver.cuEventQuery(f.done)
        else:
            st = cydriver.cuStreamQuery(f.stream)
        if st != cydriver.CUDA_ERROR_NOT_READY:
            status[0] = st
            return W_DONE
        t = now_ns()
        if d.deadline and t >= d.deadline:
            return W_TIMEOUT
        if t - t0 < SPIN_NS:
            if _wait_mode == 0:
                for _spin in range(8):
                    _relax()
            continue
        if t >= next_signals:
            if _check_signals(d):
                return W_INTERRUPTED
            next_signals = t + SIGNAL_CHECK_NS
        nap.tv_sec = 0
        nap.tv_nsec = interval
        nanosleep(&nap, NULL)
        if interval < 200000:
            interval *= 2


cdef extern from *:
    """
    static inline void vyre_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    """
    void _relax "vyre_relax"() noexcept nogil


cdef cydriver.CUresult _collect_nogil(PendingDispatch d, Prepared p, TransferEngine xfer,
                                      const char** call) noexcept nogil:
    """Bring the outputs to their targets once the GPU work is done."""
    cdef size_t k
    cdef Piece* piece
    if p.ring:
        return xfer.readback(d.f.stream, d.f.slab, d.out_pieces.data(), d.out_pieces.size(),
                             d.out_direct.data(), d.ops, call)
    for k in range(d.out_pieces.size()):
        piece = &d.out_pieces[k]
        if piece.n:
            memcpy(piece.host, d.f.staging + piece.dev_offset, piece.n)
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _issue(PendingDispatch d, Prepared p, TransferEngine xfer, unsigned long long* marks,
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
    if marks != NULL:
        t_begin = now_ns()
    if p.upload_end:
        if p.ring:
            st = xfer.upload(s, f.slab, p.sources.data(), p.sources.size(), d.input_ptrs.data(),
                             d.direct.data(), p.params_ptr, &copy_ns, d.ops, call)
            if st != cydriver.CUDA_SUCCESS:
                return st
        else:
            # the mirror: inputs, params and zeros into staging, then ONE upload
            for i in range(p.sources.size()):
                src = &p.sources[i]
                if src.kind == SRC_INPUT:
                    memcpy(staging + src.offset, d.input_ptrs[src.index] + src.src_offset, src.n)
                elif src.kind == SRC_PARAMS:
                    memcpy(staging + src.offset, p.params_ptr + src.src_offset, src.n)
                else:
                    memset(staging + src.offset, 0, src.n)
            if marks != NULL:
                copy_ns = now_ns() - t_begin
            call[0] = b"cuMemcpyHtoDAsync"
            st = cydriver.cuMemcpyHtoDAsync(f.slab, staging, p.upload_end, s)
            if st != cydriver.CUDA_SUCCESS:
                return st
    if marks != NULL:
        # copies and DMA enqueues interleave: report their sums as consecutive stages
        marks[M_STAGING] = t_begin + copy_ns
        marks[M_PARAMS] = marks[M_STAGING]
        marks[M_H2D] = now_ns()
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
    if p.dev_args.size():
        st = _device_args(d, p, argv, call)
        if st != cydriver.CUDA_SUCCESS:
            return st
    if order != NULL:
        order.lock()
        st = _launch_cooperative(d, p, f, order, argv, argp, n_args, call)
        order.unlock()
    elif p.graphs != NULL and not d.no_graph:
        st = _replay(d, p, f, False, argv, argp, n_args, call)
    else:
        st = _launch(p, f, argv, argp, n_args, call)
    if st != cydriver.CUDA_SUCCESS:
        return st
    if f.timed:
        call[0] = b"cuEventRecord"
        st = cydriver.cuEventRecord(f.t1, s)
        if st != cydriver.CUDA_SUCCESS:
            return st
    _mark(marks, M_LAUNCH)
    if not p.ring:
        for i in range(p.readbacks.size()):
            call[0] = b"cuMemcpyDtoHAsync"
            st = cydriver.cuMemcpyDtoHAsync(staging + p.readbacks[i].offset, f.slab + p.readbacks[i].offset,
                                            p.readbacks[i].nbytes, s)
            if st != cydriver.CUDA_SUCCESS:
                return st
    if d.out_dev.size():
        st = _device_copies(d, call)
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
            argv[a.arg] = d.dev_ptrs[a.input]
        elif a.nbytes:
            call[0] = b"cuMemcpyDtoDAsync"
            st = cydriver.cuMemcpyDtoDAsync(d.f.slab + <size_t>a.offset, d.dev_ptrs[a.input], a.nbytes, d.f.stream)
            if st != cydriver.CUDA_SUCCESS:
                return st
    return cydriver.CUDA_SUCCESS


cdef cydriver.CUresult _device_copies(PendingDispatch d, const char** call) noexcept nogil:
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


cdef cydriver.CUresult _launch(Prepared p, InFlight* f, unsigned long long* argv, void** argp,
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
    """Cooperative launches of one module, ordered on the GPU after the previous one's, with the
    barrier reset before and the counter read back after. The caller holds ``order``. With graph
    replay only the resets and launches are the graph; the ordering wait, the counter readback
    and the ordering event stay outside it (they name per-dispatch staging and a shared event)."""
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
    return _launch(p, f, argv, argp, n_args, call)


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
    """The launch sequence as ONE graph launch (see notes/graphs.md).

    The exec is found by the exact argument values (every buffer pointer, then the slab the params
    pointers derive from): a graph bakes its parameters in. A miss captures the sequence (stream
    capture in thread-local mode, so other threads keep dispatching) and instantiates it; with the
    cache full it updates the least recently used exec instead (cuGraphExecUpdate), which is legal
    while a launch of that exec is in flight: an update only affects later launches, and launches
    of one exec run in order. Graph objects are not thread-safe, so lookup, capture, update and
    launch hold the plan's cache lock. When the launches cannot be captured or instantiated (a
    driver without cooperative nodes in graphs, say), the plan issues its launches from then on.
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
        if f.ext_stream:
            # a caller's stream may be a blocking one: capture on the plan's own non-blocking
            # stream instead (the capture records launches, not the stream they will run on)
            if cache.capture_stream == NULL:
                call[0] = b"cuStreamCreate"
                st = cydriver.cuStreamCreate(&cs, cydriver.CU_STREAM_NON_BLOCKING)
                if st == cydriver.CUDA_SUCCESS:
                    cache.capture_stream = <void*>cs
            cs = <cydriver.CUstream>cache.capture_stream
        if st == cydriver.CUDA_SUCCESS:
            call[0] = b"cuStreamBeginCapture"
            st = cydriver.cuStreamBeginCapture(cs, cydriver.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        if st != cydriver.CUDA_SUCCESS:
            # this stream cannot be captured now (it is being captured by someone else): issue
            cache.unlock()
            d.graph_events |= G_FALLBACK
            return _launches(p, f, cooperative, argv, argp, n_args, call)
        # the issuing code launches on f.stream: point it at the capture stream meanwhile
        saved = f.stream
        f.stream = cs
        st = _capture(p, f, cooperative, argv, argp, n_args, &graph, call)
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
            # not capturable here: issue as without graphs, now and for every later dispatch (a
            # real launch error then surfaces from the issued launch, with its own call name)
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


@cython.final
@cython.freelist(16)
cdef class PendingDispatch:
    """A dispatch in flight, and the one owner of everything it uses.

    It holds the stream, events, device slab and staging until ``result()``, ``result_into()`` or
    ``timed_result()`` (or until it is dropped, which waits, then recycles); page-locked inputs that
    the GPU reads directly stay referenced until the dispatch completes. A dispatch that timed out
    or was interrupted (Ctrl-C) reaches the caller as this object, in the exception's ``.pending``.
    """

    def __init__(self):
        raise TypeError("PendingDispatch is made by CudaBackend.dispatch_async(); it has no public constructor")

    cdef void _release_views(self) noexcept:
        cdef size_t i
        for i in range(self.views.size()):
            PyBuffer_Release(&self.views[i])
        self.views.clear()

    cdef void _release_out_views(self) noexcept:
        cdef size_t i
        for i in range(self.out_views.size()):
            PyBuffer_Release(&self.out_views[i])
        self.out_views.clear()

    cdef int _take(self) except -1:
        if self.consumed:
            raise ValidationError(
                "this PendingDispatch's result was already taken",
                "call result(), result_into() or timed_result() once per dispatch",
            )
        if self.core.closed and self.f.active:
            raise ValidationError(
                "this dispatch's backend was closed before its result was taken; the outputs are "
                "gone (its resources are freed when this handle is dropped)",
                "take results before CudaBackend.close() (or leave the `with` block only after them)",
            )
        if not self.f.active:
            self.core._check_usable()
            raise DispatchFailed(
                "this dispatch failed earlier; its outputs do not exist",
                "handle the error raised by the failing call and dispatch again",
                status="failed", call="result",
            )
        with nogil:
            bind_context(self.core.ctx)  # results may be taken on another thread
        return 0

    cdef int _wait(self, timeout) except -1:
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef int outcome
        if self.completed:
            return 0
        if timeout is None and not self.timed_out:
            timeout = self.prep.timeout  # the dispatch's own timeout, until it has expired once
        self.wait_timeout = _check_timeout(timeout)
        self.deadline = 0 if self.wait_timeout is None else now_ns() + _timeout_ns(self.wait_timeout)
        with nogil:
            outcome = _wait_nogil(self, &st)
        self.core._after_wait(self, outcome, st, b"cuEventQuery")
        return 0

    cdef int _collect(self, list outs) except -1:
        cdef cydriver.CUresult st
        cdef const char* call = NULL
        cdef Prepared p = self.prep
        cdef TransferEngine xfer = self.core.xfer
        self.core._targets(self, outs)
        if self.out_dev.size() and not self.out_dev_issued:
            self.core._late_device_outputs(self)
        with nogil:
            st = _collect_nogil(self, p, xfer, &call)
        self.core._after_collect(self, st, call)
        self.core._audit(self)
        return 0

    def is_ready(self):
        """True once the GPU has finished (never blocks)."""
        cdef cydriver.CUresult status
        if self.completed or self.consumed or not self.f.active:
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
        self.core._fail(self, status, b"cuEventQuery")

    def result(self, timeout=None):
        """Wait, then return the outputs as new numpy arrays (declaration order).

        ``timeout`` (seconds) bounds this wait. None (the default) applies the dispatch's
        ``DispatchConfig(timeout=...)`` until that has expired once, and then waits until the GPU
        is done (as ``concurrent.futures.Future.result()`` does): after a timeout error, calling
        ``result()`` on its ``.pending`` waits for the end. On expiry, ``DispatchFailed`` (status
        ``"timeout"``) is raised and this handle still owns the work."""
        cdef Core core = self.core
        core.busy += 1
        try:
            if self.traced:
                vyre_nvtx_push(b"result", S_RESULT)
                try:
                    return self._result(timeout)
                finally:
                    vyre_nvtx_pop()
            return self._result(timeout)
        finally:
            core.busy -= 1

    cdef object _result(self, timeout):
        self._take()
        self._wait(timeout)
        outs = self.core._new_outputs(self.prep)
        self._collect(outs)
        self._finish()
        return outs

    def result_into(self, outputs, timeout=None):
        """Wait, then copy the outputs into the caller's arrays (checked) and return them.
        ``timeout`` as for :meth:`result`."""
        cdef Core core = self.core
        core.busy += 1
        try:
            if self.traced:
                vyre_nvtx_push(b"result", S_RESULT)
                try:
                    return self._result_into(outputs, timeout)
                finally:
                    vyre_nvtx_pop()
            return self._result_into(outputs, timeout)
        finally:
            core.busy -= 1

    cdef object _result_into(self, outputs, timeout):
        outputs = as_output_list(outputs)
        self._take()
        stream = <uintptr_t>self.prep.ext_stream if self.prep.ext else None
        self.out_checked = check_outputs(self.prep.plan, outputs, self.core.device, stream)
        self._wait(timeout)
        self._collect(outputs)
        self._finish()
        return outputs

    def timed_result(self, timeout=None):
        """Wait; return TimedDispatchResult(outputs, wall_ns, device_ns, enqueue_ns, wait_ns).
        ``timeout`` as for :meth:`result`."""
        cdef Core core = self.core
        core.busy += 1
        try:
            if self.traced:
                vyre_nvtx_push(b"result", S_RESULT)
                try:
                    return self._timed_result(timeout)
                finally:
                    vyre_nvtx_pop()
            return self._timed_result(timeout)
        finally:
            core.busy -= 1

    cdef object _timed_result(self, timeout):
        cdef float ms = 0
        cdef unsigned long long t_wait0
        if not self.f.timed and not self.consumed:
            raise ValidationError(
                "this PendingDispatch was enqueued without timing events",
                "use CudaBackend.dispatch_async(program, inputs, timed=True) or dispatch_timed()",
            )
        self._take()
        t_wait0 = now_ns()
        self._wait(timeout)
        check_cu(cydriver.cuEventElapsedTime(&ms, self.f.t0, self.f.t1), b"cuEventElapsedTime")
        outs = self.core._new_outputs(self.prep)
        self._collect(outs)
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
        self._release_views()
        self._release_out_views()
        self.keep = None  # the GPU is done with the caller's device arrays
        self._settle()

    cdef void _settle(self) noexcept:
        if self.nvtx_started:  # a traced async dispatch's range ends with it (any path)
            self.nvtx_started = False
            vyre_nvtx_end(self.nvtx_range)
        # once per owner: the backend stops counting it
        if not self.settled:
            self.settled = True
            self.consumed = True
            self.core.outstanding -= 1
            if self.core.outstanding == 0 and self.core.on_settled is not None:
                # the last owner after close(): the backend's context reference goes back now
                callback, self.core.on_settled = self.core.on_settled, None
                try:
                    callback()
                except BaseException:  # (noexcept: a failed release is logged by the callback)
                    pass

    @property
    def route(self):
        return self.prep.route_name

    @property
    def done(self):
        """True once the outputs were taken (or the dispatch failed)."""
        return self.consumed

    def __dealloc__(self):
        # Dropped un-awaited (or abandoned by an exception): the GPU may still read the slab, the
        # staging and any page-locked input, so wait (GIL released) before recycling; if the wait
        # fails, write the resources off rather than recycle them.
        cdef cydriver.CUresult status = cydriver.CUDA_SUCCESS
        cdef cydriver.CUcontext prev
        cdef bint pushed = False
        if self.core is None:
            self._release_views()
            return
        if self.f.active:
            if self.core.ctx == NULL:
                status = cydriver.CUDA_ERROR_CONTEXT_IS_DESTROYED  # released after a fault
            elif self.f.enqueued:
                with nogil:
                    status = cydriver.cuCtxPushCurrent(self.core.ctx)
                    if status == cydriver.CUDA_SUCCESS:
                        pushed = True
                        # (an event: a caller's stream may hold the caller's later work)
                        if self.f.has_done:
                            status = cydriver.cuEventSynchronize(self.f.done)
                        else:
                            status = cydriver.cuStreamSynchronize(self.f.stream)
            if status == cydriver.CUDA_SUCCESS:
                self.core._recycle(self.prep, &self.f)
            else:
                self.core._leak(self.prep, &self.f)
            if pushed:
                cydriver.cuCtxPopCurrent(&prev)
            self._settle()  # (after the pop: the last settle may release the context)
        if self.nvtx_started:
            self.nvtx_started = False
            vyre_nvtx_end(self.nvtx_range)
        self._release_views()
        self._release_out_views()
