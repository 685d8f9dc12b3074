# Tracing of dispatches: stage marks, NVTX ranges (_nvtx.hpp) and the trace log line.
#
# Every NVTX call goes through this module's functions: _nvtx.hpp keeps its counters and the
# thread's open stage in static storage, so one translation unit must own them.

from ._prepared cimport Prepared
from ._dispatch cimport Core
from ._waits cimport PendingDispatch


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


cdef bint nvtx_stage_open() noexcept nogil
cdef void nvtx_stage(int stage) noexcept nogil
cdef void nvtx_push(const char* message, int slot) noexcept nogil
cdef void nvtx_pop() noexcept nogil
cdef void nvtx_end(unsigned long long rid) noexcept nogil
cdef void mark_stage(unsigned long long* marks, int k) noexcept nogil
cdef tuple stage_durations(unsigned long long* m)
cdef void trace_line(logger, Prepared p, unsigned long long* marks) noexcept
cdef object nvtx_blocking(Core core, PendingDispatch d, program, config, list into, unsigned long long* marks)
cdef PendingDispatch nvtx_async(Core core, PendingDispatch d, program, config, bint timed, unsigned long long t0,
                                list into)
cdef void nvtx_refused(program, config, bint blocking) noexcept
cdef void count_enqueued(unsigned long long* tel, PendingDispatch d) noexcept


cdef inline void mark(unsigned long long* marks, int k) noexcept nogil:
    # a stage mark of a profiled or traced dispatch; untraced ones pass NULL and pay this test only
    if marks != NULL:
        mark_stage(marks, k)
