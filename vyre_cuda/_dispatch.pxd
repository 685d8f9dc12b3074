# The hot path's entry points, the plan lookup, and the ONE owner of a dispatch's life (its state
# machine below, the deferred list, the counts of calls and handles in flight).

from cpython.buffer cimport Py_buffer
from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._counters cimport N_COUNTERS
from ._resources cimport Resources, InFlight
from ._prepared cimport Prepared, ResidentBlocks
from ._waits cimport PendingDispatch
from ._deferred cimport DeferredWork
from ._plans cimport PlanTable


cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    int a_load "vyre::load"(const int* p)
    void a_store "vyre::store"(int* p, int v)
    bint a_cas "vyre::cas"(int* p, int expected, int desired)
    long long a_add "vyre::add"(long long* p, long long v)
    long long a_loadll "vyre::loadll"(const long long* p)
    void tel_add "vyre::count"(unsigned long long* p, unsigned long long v)
    unsigned long long tel_read "vyre::read"(const unsigned long long* p)
    void tel_clear "vyre::clear"(unsigned long long* p)


# A dispatch's life (PendingDispatch.state), written only by this module. Each transition happens
# once, by compare-and-swap or under the handle's lock:
#   D_ENQUEUED -> D_TAKING   one caller claims the handle to wait and take the outputs (the others
#                            wait for it: they never touch its resources)
#   D_TAKING -> D_ENQUEUED   that caller's wait ended without the GPU being done (timeout, Ctrl-C, a
#                            refused argument): the handle still owns the work
#   D_TAKING -> D_TAKEN      settled (the GPU done), outputs collected and published, resources
#                            recycled: every later caller gets the same outputs
#   D_TAKING -> D_FAILED     settled with an error, published: every later caller gets it
#   D_ENQUEUED -> D_DROPPED  the last reference went un-taken: its resources move to the backend's
#                            deferred list (recycled there once its completion event has fired)
cdef enum:
    D_ENQUEUED = 0
    D_TAKING = 1
    D_TAKEN = 2
    D_FAILED = 3
    D_DROPPED = 4
    # take forms
    TAKE_RESULT = 0
    TAKE_INTO = 1
    TAKE_TIMED = 2

cdef class Core:
    cdef cydriver.CUcontext ctx
    cdef readonly Resources resources  # the one owner of this backend's pools
    cdef readonly ResidentBlocks resident_blocks  # the plans' resident params blocks
    cdef PlanTable plans  # the prepared plans and the last-hit memo (one lock of its own)
    cdef unsigned long long tel[N_COUNTERS]  # added to with tel_add (atomic), read with tel_read
    cdef public object lost
    cdef int closed_flag  # atomic: set once by refuse_new(); every later call is refused
    cdef long long n_busy  # atomic: calls running inside the core (close waits for them)
    cdef long long n_outstanding  # atomic: dispatches holding resources (handles and deferred work)
    cdef mutex settle_mu  # guards on_settled (the hand-off between close() and the last settle)
    cdef object on_settled  # called once the last owner settles after close (releases the context)
    cdef DeferredWork defer  # dropped handles' work until it has finished (one lock of its own)
    cdef public int trace  # TRACE_LOG | TRACE_NVTX bits; 0: untraced (the hot path's one test)
    cdef object logger
    cdef public int device
    cdef public object auto_hook  # the automatic registration policy's (obj, address, nbytes) hook; None: off
    cdef public int wait_mode  # how its blocking dispatches wait (_waits.WAIT_*; set by set_knobs)
    cdef public int fence_on_demand  # Knobs.fence_on_demand (set by set_knobs)

    cdef int _check_usable(self) except -1
    cdef int _enter(self) except -1
    cdef void _hold(self) noexcept
    cdef void _leave(self) noexcept
    cdef Prepared _lookup(self, program, inputs, config, vector[Py_buffer]& views, PendingDispatch d,
                          Prepared given)
    cdef object _miss(self, key, config, inputs, PendingDispatch d)
    cdef PendingDispatch _open(self, program, inputs, config, Prepared given)
    cdef object _converted(self, program, config, bint blocking)
    cdef PendingDispatch _open_traced(self, program, inputs, config, Prepared given, bint blocking)
    cdef int _begin(self, PendingDispatch d, config, list into, bint want_done, bint timed,
                    unsigned long long* marks) except -1
    cdef void _settled(self) noexcept
    cdef void _run_on_settled(self) noexcept
    cdef int _reclaim(self, bint every, bint wait) except -1
    cdef int _fail(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1
    cdef int _after_enqueue(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1
    cdef object _blocking(self, program, inputs, config, list into, unsigned long long* marks, Prepared given)
    cdef object _run_blocking(self, PendingDispatch d, config, list into, unsigned long long* marks)
    cdef PendingDispatch _async(self, program, inputs, config, bint timed, Prepared given, list into)
    cdef PendingDispatch _run_async(self, PendingDispatch d, config, bint timed, unsigned long long t0, list into)


# the state machine's transitions and the handle's resources (called by _waits, _launch, _tracing)
cdef void release_resources(PendingDispatch d, bint recycle) noexcept
cdef object take(PendingDispatch d, int form, outputs, timeout)
cdef int poll_ready(PendingDispatch d) except -1
cdef void drop(PendingDispatch d) noexcept
cdef bint is_taken(PendingDispatch d) noexcept
cdef void mark_completed(PendingDispatch d) noexcept
cdef cydriver.CUresult arm_done(PendingDispatch d) noexcept nogil
