# The prepared plan: a frozen planning DispatchPlan as C structs, converted once (Prepared.from_plan).

from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._transfer cimport CoopOrder
from ._windows cimport Source
from ._launch cimport CoopGate, GraphCache


cdef enum:
    ROUTE_REGULAR = 0
    ROUTE_COOPERATIVE = 1
    ROUTE_SPLIT = 2
    MAX_ARGS = 256  # kernel arguments at most (planning refuses more)


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
