# The prepared plan: a frozen planning DispatchPlan as C structs, converted once (Prepared.from_plan).

from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._transfer cimport CoopOrder
from ._windows cimport Source
from ._launch cimport CoopGate, GraphCache
from ._streams cimport StreamPool


cdef enum:
    ROUTE_REGULAR = 0
    ROUTE_COOPERATIVE = 1
    ROUTE_SPLIT = 2
    ROUTE_STREAMED = 3
    MAX_ARGS = 256  # kernel arguments at most (planning refuses more)


cdef struct InputCheck:
    int index
    Py_ssize_t itemsize
    char kind  # 'f', 'i', 'u', 'b' (bf16: raw 2-byte words) or 0 (any)


cdef struct OutCheck:
    # what a device output must be: its element kind ('f', 'i', 'u'), item size and exact bytes
    char kind
    Py_ssize_t itemsize
    size_t nbytes


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


cdef struct InPlace:
    # a device output the kernel writes directly: argument ``arg`` takes ``ptr`` (``n`` bytes,
    # zeroed first unless declared zeroed=False: outputs start at zero)
    size_t arg
    cydriver.CUdeviceptr ptr
    size_t n
    bint zero


cdef struct Segment:
    size_t offset
    size_t nbytes


cdef struct StreamCut:
    # a binding the streamed route cuts into rows: its region in every device slot and in the
    # staging slots of its directions
    size_t arg  # kernel argument index
    int input  # caller input index (-1: a pure output)
    int output  # output index (-1: an input only)
    bint upload
    bint readback
    bint clear  # a pure output: zeroed in its slot before each chunk's launch
    size_t row_bytes
    size_t region_offset  # within a device slot
    size_t up_offset  # within an upload staging slot
    size_t rb_offset  # within a readback staging slot


cdef struct StreamWhole:
    # a binding that goes whole to every chunk: its argument points into the shared region
    size_t arg
    size_t offset


cdef struct ChunkShape:
    # the launch of a full chunk, or of the last one
    size_t rows
    unsigned int grid[3]
    size_t params_offset  # in the shared region


cdef class Prepared  # (declared below)


cdef class ResidentBlocks:
    # one backend's resident params blocks (see ResidentBlocks in _prepared.pyx)
    cdef mutex mu  # guards alive and live; never held across a driver call
    cdef cydriver.CUcontext ctx
    cdef bint alive
    cdef dict live  # pointer -> bytes
    cdef int upload(self, Prepared p, StreamPool spool) except -1
    cdef void free_block(self, cydriver.CUdeviceptr ptr) noexcept


cdef class Prepared:
    cdef vector[InputCheck] checks
    cdef vector[InputCheck] dev_checks  # the same for the inputs in device memory (read in C)
    cdef vector[OutCheck] out_checks  # per output (device outputs read in C are checked on these)
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
    cdef mutex trial_mu  # guards trial_left, trial_n, trial_ns and graph_off while the trial runs
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
    cdef vector[long] out_args  # per output: its kernel argument when it may be written in place, else -1
    cdef vector[char] out_zero  # per output: zeroed before the launch (BufferDecl.zeroed)
    # a dispatch whose every output is written in place uses only the slab's params blocks: this
    # device block (0: the plan cannot: host or read-write inputs, byte ranges, another route)
    cdef size_t compact_bucket
    cdef size_t compact_upload_end  # the params blocks' end: what such a dispatch uploads
    # its page-locked staging: the params go up in one copy, never through the ring (a ring slot's
    # reuse waits on the host for its copy, on a caller's stream behind the caller's work)
    cdef size_t compact_staging
    # the params blocks kept on the device for the plan's life (ResidentBlocks.upload): no upload
    # and no slab then. ``compact_image``: their bytes (None: the plan cannot)
    cdef bytes compact_image
    # 0 untried, 1 claimed by the one thread that uploads (or failed), 2 ``resident`` and its
    # owner set: read and written with vyre::cas/load/store only (no GIL relied on)
    cdef int resident_state
    cdef cydriver.CUdeviceptr resident  # 0: none (yet)
    cdef ResidentBlocks resident_owner
    # the streamed route (planning.stream.StreamPlan); the slab is its device block, ``sources``
    # its shared region, ``staging_block`` its staging slots (uploads first, then readbacks)
    cdef bint streamed
    cdef int s_streams
    cdef int s_direct_streams  # streams used when nothing is staged
    cdef size_t s_chunks
    cdef size_t s_chunk_rows
    cdef size_t s_shared
    cdef size_t s_slot
    cdef size_t s_up  # bytes of one upload staging slot
    cdef size_t s_rb  # bytes of one readback staging slot
    cdef vector[StreamCut] s_cut
    cdef vector[StreamWhole] s_whole
    cdef ChunkShape s_full
    cdef ChunkShape s_last

    cdef int _compact_from(self, layout) except -1
    cdef bytes _params_image(self, size_t end)
