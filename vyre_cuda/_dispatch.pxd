from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._pools cimport DevicePool, PinnedPool, StreamPool

cdef enum:
    N_COUNTERS = 19


cdef struct InputCopy:
    int index
    size_t offset
    size_t nbytes
    size_t zero_end
    Py_ssize_t itemsize
    char kind  # 'f', 'i', 'u' or 0 (any)


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
    unsigned long long t_start
    unsigned long long t_enqueued


cdef class Prepared:
    cdef vector[InputCopy] inputs
    cdef vector[Segment] readbacks
    cdef vector[Segment] outputs
    cdef vector[size_t] arg_offsets
    cdef vector[size_t] params_offsets
    cdef bytes params_blob
    cdef const char* params_ptr
    cdef size_t params_len
    cdef size_t params_offset0
    cdef size_t slab_bytes
    cdef size_t bucket
    cdef size_t staging_bucket
    cdef size_t audit_offset
    cdef size_t upload_end
    cdef size_t clear_begin
    cdef size_t clear_end
    cdef size_t host_clear_begin
    cdef size_t host_clear_end
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
    cdef public object gate
    cdef public object route_name
    cdef public object route_reason
    cdef public object label
    cdef public object timeout
    cdef public object plan
    cdef unsigned long long tel_h2d_bytes, tel_h2d_ops, tel_d2h_bytes, tel_d2h_ops
    cdef unsigned long long tel_param_bytes, tel_launches, tel_memsets


cdef class Core:
    cdef cydriver.CUcontext ctx
    cdef public DevicePool dpool
    cdef public PinnedPool ppool
    cdef public StreamPool spool
    cdef dict prepared
    cdef object planner
    cdef unsigned long long tel[N_COUNTERS]
    cdef public object lost
    cdef public bint closed
    cdef public int outstanding
    cdef public bint trace
    cdef object logger

    cdef int _check_usable(self) except -1
    cdef Prepared _lookup(self, program, inputs, config, vector[Py_buffer]& views)
    cdef void _release_views(self, vector[Py_buffer]& views, Py_ssize_t n) noexcept
    cdef int _acquire(self, Prepared p, InFlight* f, bint want_done, bint timed) except -1
    cdef void _recycle(self, Prepared p, InFlight* f) noexcept
    cdef void _leak(self, Prepared p, InFlight* f) noexcept
    cdef int _fail(self, Prepared p, InFlight* f, cydriver.CUresult status, const char* call) except -1
    cdef int _enqueue(self, Prepared p, vector[Py_buffer]& views, InFlight* f, unsigned long long* marks) except -1
    cdef void _count(self, Prepared p) noexcept
    cdef object _run_sync(self, Prepared p, vector[Py_buffer]& views, list into, unsigned long long* marks)
    cdef int _wait(self, Prepared p, InFlight* f) except -1
    cdef int _wait_timeout(self, Prepared p, InFlight* f) except -1
    cdef int _audit(self, Prepared p, InFlight* f) except -1
    cdef list _new_outputs(self, Prepared p)
    cdef int _copy_out(self, Prepared p, InFlight* f, list outs) except -1
    cdef object _dispatch_sync(self, program, inputs, config, list into, unsigned long long* marks)


cdef class PendingDispatch:
    cdef Core core
    cdef Prepared prep
    cdef InFlight f
    cdef bint consumed
    cdef bint completed
    cdef object gate  # a cooperative dispatch that timed out keeps its module's gate until done

    @staticmethod
    cdef PendingDispatch _adopt(Core core, Prepared p, InFlight* f)
    cdef int _wait(self) except -1
    cdef int _take(self) except -1
    cdef void _finish(self) noexcept
    cdef void _settle(self) noexcept
