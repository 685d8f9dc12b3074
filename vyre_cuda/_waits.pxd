# Waits and PendingDispatch's face. Its life is _dispatch's: no method here writes the fields
# marked "(_dispatch)".

from cpython.buffer cimport Py_buffer
from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._windows cimport Piece
from ._resources cimport InFlight
from ._prepared cimport Prepared, DevCopy, InPlace
from ._dispatch cimport Core
from ._devproto cimport CupyStream


cdef struct DevInput:  # one input of a dispatch that is device memory
    cydriver.CUdeviceptr ptr
    char kind  # its element kind as read, checked once the plan is found (0: a type no check knows)
    int size  # ... and its item size


# outcomes of a wait
cdef enum:
    W_DONE = 0
    W_TIMEOUT = 1
    W_INTERRUPTED = 2


# how a blocking dispatch with no timeout waits: its backend's Core.wait_mode (a measurement may
# set another: vyre_cuda._knobs)
cdef enum:
    WAIT_POLL = 0  # spin with a pause per query, then sleep-poll (interruptible): the default
    WAIT_SPIN = 1  # the same without the pause between queries
    WAIT_SYNC = 2  # cuEventSynchronize / cuStreamSynchronize (not interruptible)


cdef class PendingDispatch:
    cdef Core core
    cdef Prepared prep
    cdef InFlight f
    cdef vector[Py_buffer] views
    cdef vector[const char*] input_ptrs
    cdef vector[char] direct
    cdef bint any_direct
    cdef bint gate  # holds the direct gate (_windows): may mark and enqueue direct DMA now
    cdef vector[Py_buffer] out_views
    cdef vector[Piece] out_pieces
    cdef vector[char] out_direct
    cdef int state  # (_dispatch) D_ENQUEUED, D_TAKING, D_TAKEN, D_FAILED, D_DROPPED: atomic
    cdef mutex mu  # (_dispatch) orders is_ready()'s event query against the resources' release
    cdef bint completed  # (_dispatch) the taking caller's wait saw the GPU done
    cdef object outs  # (_dispatch) the published outputs (D_TAKEN): every caller gets them
    cdef object error  # (_dispatch) the published error (D_FAILED): every caller gets it
    cdef tuple timing  # (_dispatch) (wall, device, enqueue, wait) ns of a timed dispatch, once taken
    cdef object interrupt
    cdef unsigned long long deadline
    cdef unsigned long long ops[2]  # DMA operations and ring windows of the current phase
    cdef bint traced  # enqueued with NVTX tracing: result() opens a range
    cdef bint nvtx_started  # its NVTX start/end range is open (ended when it settles)
    cdef unsigned long long nvtx_range
    cdef vector[DevInput] dev_in  # per input: its device memory (empty: no device input; one vector, one allocation)
    cdef vector[DevCopy] out_dev
    cdef vector[InPlace] out_inplace  # device outputs the kernel writes directly (no copy)
    cdef bint out_dev_issued
    cdef bint compact  # every output written in place: the slab holds the params blocks only
    cdef bint resident  # ... and that slab is the plan's resident params block (nothing uploaded)
    cdef bint readback_skipped  # no output was read back to staging at the enqueue (all device)
    cdef list keep  # device arrays (and DLPack capsules) the GPU uses, held until completion
    cdef list waits  # streams the dispatch stream waits on before its first copy
    cdef tuple out_checked  # per output: its checked device view (None: host), from check_outputs
    cdef CupyStream cupy_stream  # the memo of its last device array read (_devview.read_device)
    cdef int graph_events  # G_* bits of what the graph path did (counted in Core._after_enqueue)
    cdef bint no_graph  # issue this dispatch's launches even though its plan has a graph
    cdef object wait_timeout  # seconds the current wait was bounded by (None: unbounded)
    cdef bint timed_out  # a wait has expired once: later default waits are unbounded
    # the streamed route: chunks enqueued and copied out so far, whether the caller's call drains
    # the readbacks itself (blocking), the direct H2D bytes, each output's device pointer (0: a
    # host output), and the outputs a dispatch_async reads back into (result() returns them)
    cdef size_t s_issued
    cdef int s_used  # streams (and slots) this run uses: all of the plan's, or its direct count
    cdef size_t s_out
    cdef bint s_drain
    cdef unsigned long long s_direct_h2d
    cdef vector[cydriver.CUdeviceptr] s_out_dev
    cdef list s_outs
    cdef bint named_outputs  # s_outs are the caller's: dispatch_async(outputs=...)

    cdef void _release_views(self) noexcept
    cdef void _release_out_views(self) noexcept
    cdef int _check_takeable(self) except -1
    cdef int _wait(self, timeout) except -1
    cdef int _after_wait(self, int outcome, cydriver.CUresult status, const char* call) except -1
    cdef int _collect(self, list outs) except -1
    cdef int _after_collect(self, cydriver.CUresult status, const char* call) except -1
    cdef int _audit(self) except -1
    cdef void _finish(self) noexcept
    cdef void _end_range(self) noexcept
    cdef object _result(self, timeout)
    cdef object _result_into(self, outputs, timeout)
    cdef object _timed_result(self, timeout)
    cdef list _new_outputs(self)


cdef int wait_nogil(PendingDispatch d, cydriver.CUresult* status) noexcept nogil
cdef void leave_gate(PendingDispatch d, bint keep_direct) noexcept nogil
cdef int wait_for_taker(PendingDispatch d, unsigned long long deadline, limit) except -1
cdef unsigned long long timeout_ns(timeout) except? 0
