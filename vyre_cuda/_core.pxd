# Core: the per-backend entry points of the hot path (dispatch, dispatch_async, ...), the plan
# lookup and the core's bookkeeping (counters, calls in progress, lost context).

from cpython.buffer cimport Py_buffer
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._counters cimport N_COUNTERS
from ._resources cimport Resources, InFlight
from ._prepared cimport Prepared, ResidentBlocks
from ._waits cimport PendingDispatch


cdef class Core:
    cdef cydriver.CUcontext ctx
    cdef readonly Resources resources  # the one owner of this backend's pools
    cdef readonly ResidentBlocks resident_blocks  # the plans' resident params blocks
    cdef dict prepared
    cdef object last_hit  # the last plan found (a _LastHit); None once plans are cleared
    cdef unsigned long long cleared  # how many times the plans were cleared (last_hit's guard)
    cdef public int stream_plans  # cached plans keyed on a caller's stream
    cdef list graphed  # prepared plans that may hold graph execs (released with the plans)
    cdef unsigned long long tel[N_COUNTERS]
    cdef public object lost
    cdef public bint closed
    cdef public int outstanding  # PendingDispatch owners not yet settled
    cdef public int busy  # calls running inside the core now (dispatch, result, trim): close waits for them
    cdef public object on_settled  # called once the last owner settles after close (releases the context)
    cdef public int trace  # TRACE_LOG | TRACE_NVTX bits; 0: untraced (the hot path's one test)
    cdef object logger
    cdef public int device

    cdef int _ensure_resident(self, Prepared p) except -1
    cdef int _check_usable(self) except -1
    cdef int _enter(self) except -1
    cdef Prepared _lookup(self, program, inputs, config, vector[Py_buffer]& views, PendingDispatch d,
                          Prepared given)
    cdef object _miss(self, key, config, inputs, PendingDispatch d)
    cdef long long _device_input(self, obj, Py_ssize_t i, Py_ssize_t n, own, Py_buffer* view,
                                 PendingDispatch d) except -2
    cdef int _check_device_inputs(self, program, inputs, config, Prepared p, vector[Py_buffer]& views,
                                  PendingDispatch d) except -1
    cdef tuple _device_outputs(self, Prepared p, list into, PendingDispatch d)
    cdef long long _cold_input(self, program, obj, Py_ssize_t i, Py_ssize_t n, config, Py_buffer* view,
                               PendingDispatch d, exc) except? -2
    cdef PendingDispatch _open(self, program, inputs, config, Prepared given)
    cdef object _converted(self, program, config, bint blocking)
    cdef PendingDispatch _open_traced(self, program, inputs, config, Prepared given, bint blocking)
    cdef int _begin(self, PendingDispatch d, config, list into, bint want_done, bint timed,
                    unsigned long long* marks) except -1
    cdef void _recycle(self, Prepared p, InFlight* f) noexcept
    cdef void _leak(self, Prepared p, InFlight* f) noexcept
    cdef int _fail(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1
    cdef int _after_enqueue(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1
    cdef object _blocking(self, program, inputs, config, list into, unsigned long long* marks, Prepared given)
    cdef object _run_blocking(self, PendingDispatch d, config, list into, unsigned long long* marks)
    cdef PendingDispatch _async(self, program, inputs, config, bint timed, Prepared given, list into)
    cdef PendingDispatch _run_async(self, PendingDispatch d, config, bint timed, unsigned long long t0, list into)
