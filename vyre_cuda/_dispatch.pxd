from cpython.buffer cimport Py_buffer
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._pools cimport DevicePool, PinnedPool, HostPool, StreamPool
from ._transfer cimport TransferEngine, Source, Piece, CoopOrder


cdef extern from "_graphs.hpp" namespace "vyre" nogil:
    cdef cppclass GraphCache:
        GraphCache(size_t capacity)
        void lock()
        void unlock()
        long find(const unsigned long long* key, size_t n)
        void* exec(long i)
        bint full()
        size_t size()
        long oldest()
        void rekey(long i, const unsigned long long* key, size_t n)
        void insert(const unsigned long long* key, size_t n, void* exec)
        void remove(long i)
        vector[void*] take_all()
        void* capture_stream
        void* take_capture_stream()
        bint disabled
        bint closed


cdef enum:
    N_COUNTERS = 29


cdef struct InputCheck:
    int index
    Py_ssize_t itemsize
    char kind  # 'f', 'i', 'u', 'b' (bf16: raw 2-byte words) or 0 (any)


cdef struct DevArg:
    # a device input: its kernel argument takes the caller's pointer (offset < 0), or a slab region
    # at ``offset`` that a device-to-device copy fills (read-write inputs are private copies)
    size_t arg
    int input
    long long offset
    size_t nbytes


cdef struct DevCopy:
    # a device output: ``n`` slab bytes at ``dev_offset`` copied device-to-device to ``ptr``
    cydriver.CUdeviceptr ptr
    size_t dev_offset
    size_t n


cdef struct Segment:
    size_t offset
    size_t nbytes


cdef struct InFlight:
    cydriver.CUstream stream
    cydriver.CUevent done
    cydriver.CUevent t0
    cydriver.CUevent t1
    cydriver.CUdeviceptr slab
    char* staging
    bint has_done
    bint timed
    bint active
    bint enqueued
    bint async_slab
    bint ext_stream  # the caller's stream: never returned to the pool
    unsigned long long t_start
    unsigned long long t_enqueued


cdef class CoopGate:
    cdef CoopOrder order
    cdef int ensure(self) except -1


cdef class Prepared:
    cdef vector[InputCheck] checks
    cdef vector[Source] sources
    cdef vector[Segment] readbacks
    cdef vector[Segment] outputs
    cdef vector[size_t] arg_offsets
    cdef vector[size_t] params_offsets
    cdef bytes params_blob
    cdef const char* params_ptr
    cdef size_t params_len
    cdef size_t slab_bytes
    cdef size_t bucket
    cdef size_t staging_block
    cdef size_t audit_offset
    cdef size_t upload_end
    cdef size_t clear_begin
    cdef size_t clear_end
    cdef size_t n_inputs
    cdef bint ring
    cdef unsigned int grid[3]
    cdef unsigned int block[3]
    cdef unsigned int shared_bytes
    cdef int iterations
    cdef int route
    cdef cydriver.CUfunction function
    cdef cydriver.CUdeviceptr barrier
    cdef unsigned long long barrier_ceiling
    cdef list out_typenums
    cdef list out_counts
    cdef list out_dtypes
    cdef CoopGate coop
    cdef CoopOrder* coop_order
    cdef GraphCache* graphs  # NULL unless the plan replays its launches as a CUDA graph
    cdef bint graph_off  # a trial found issued launches faster: the graph stays unused
    cdef int trial_left  # blocking dispatches left in the graph-or-issued trial (0: decided)
    cdef int trial_n[2]
    cdef unsigned long long trial_ns[2][16]  # [issued, graph] round-trip samples
    cdef public object graph_choice  # how the trial decided (None before)
    cdef public object route_name
    cdef public object route_reason
    cdef public object label
    cdef public object timeout
    cdef public object plan
    cdef unsigned long long tel_h2d_bytes, tel_h2d_ops, tel_d2h_bytes, tel_d2h_ops
    cdef unsigned long long tel_param_bytes, tel_launches, tel_memsets
    cdef vector[DevArg] dev_args
    cdef bint ext  # DispatchConfig(stream=...): run on the caller's stream
    cdef cydriver.CUstream ext_stream
    cdef bint device_outputs  # DispatchConfig(outputs="device")


cdef class Core:
    cdef cydriver.CUcontext ctx
    cdef public DevicePool dpool
    cdef public PinnedPool ppool
    cdef public HostPool opool
    cdef public StreamPool spool
    cdef public TransferEngine xfer
    cdef dict prepared
    cdef public int stream_plans  # cached plans keyed on a caller's stream
    cdef list graphed  # prepared plans that may hold graph execs (released with the plans)
    cdef object planner
    cdef unsigned long long tel[N_COUNTERS]
    cdef public object lost
    cdef public bint closed
    cdef public int outstanding  # PendingDispatch owners not yet settled
    cdef public int busy  # calls running inside the core now (dispatch, result, trim): close waits for them
    cdef public object on_settled  # called once the last owner settles after close (releases the context)
    cdef public int trace  # TRACE_LOG | TRACE_NVTX bits; 0: untraced (the hot path's one test)
    cdef object logger
    cdef public int device

    cdef int _check_usable(self) except -1
    cdef int _enter(self) except -1
    cdef Prepared _lookup(self, program, inputs, config, vector[Py_buffer]& views, PendingDispatch d)
    cdef object _cold_input(self, program, obj, Py_ssize_t i, Py_ssize_t n, config, Py_buffer* view,
                            PendingDispatch d, exc)
    cdef int _stream_waits(self, PendingDispatch d, list streams) except -1
    cdef int _late_device_outputs(self, PendingDispatch d) except -1
    cdef list _device_array_outputs(self, Prepared p)
    cdef PendingDispatch _begin(self, program, inputs, config, list into, bint want_done, bint timed,
                                unsigned long long* marks)
    cdef int _acquire(self, Prepared p, InFlight* f, bint want_done, bint timed) except -1
    cdef void _release_stream(self, InFlight* f) noexcept
    cdef void _release_slab(self, Prepared p, InFlight* f) noexcept
    cdef void _recycle(self, Prepared p, InFlight* f) noexcept
    cdef void _leak(self, Prepared p, InFlight* f) noexcept
    cdef int _fail(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1
    cdef int _after_enqueue(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1
    cdef int _after_wait(self, PendingDispatch d, int outcome, cydriver.CUresult status, const char* call) except -1
    cdef int _after_collect(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1
    cdef int _audit(self, PendingDispatch d) except -1
    cdef list _new_outputs(self, Prepared p)
    cdef int _targets(self, PendingDispatch d, list outs) except -1
    cdef object _blocking(self, program, inputs, config, list into, unsigned long long* marks)
    cdef PendingDispatch _async(self, program, inputs, config, bint timed)


cdef class PendingDispatch:
    cdef Core core
    cdef Prepared prep
    cdef InFlight f
    cdef vector[Py_buffer] views
    cdef vector[const char*] input_ptrs
    cdef vector[char] direct
    cdef bint any_direct
    cdef vector[Py_buffer] out_views
    cdef vector[Piece] out_pieces
    cdef vector[char] out_direct
    cdef bint completed
    cdef bint consumed
    cdef bint settled
    cdef object interrupt
    cdef unsigned long long deadline
    cdef unsigned long long ops[2]  # DMA operations and ring windows of the current phase
    cdef bint traced  # enqueued with NVTX tracing: result() opens a range
    cdef bint nvtx_started  # its NVTX start/end range is open (ended when it settles)
    cdef unsigned long long nvtx_range
    cdef vector[cydriver.CUdeviceptr] dev_ptrs  # per input: its device pointer (empty: no device input)
    cdef vector[DevCopy] out_dev
    cdef bint out_dev_issued
    cdef list keep  # device arrays (and DLPack capsules) the GPU uses, held until completion
    cdef list waits  # streams the dispatch stream waits on before its first copy
    cdef list out_checked  # per output: its checked device view (None: host), from check_outputs
    cdef int graph_events  # G_* bits of what the graph path did (counted in _after_enqueue)
    cdef bint no_graph  # issue this dispatch's launches even though its plan has a graph
    cdef object wait_timeout  # seconds the current wait was bounded by (None: unbounded)
    cdef bint timed_out  # a wait has expired once: later default waits are unbounded

    cdef void _release_views(self) noexcept
    cdef void _release_out_views(self) noexcept
    cdef int _take(self) except -1
    cdef int _wait(self, timeout) except -1
    cdef int _collect(self, list outs) except -1
    cdef void _finish(self) noexcept
    cdef void _settle(self) noexcept
    cdef object _result(self, timeout)
    cdef object _result_into(self, outputs, timeout)
    cdef object _timed_result(self, timeout)
