# cython: language_level=3
"""The native half of ``await pending``: completion signalled from C, no thread polling.

A :class:`Notifier` is one event loop's eventfd. :meth:`Notifier.arm` queues, behind a
dispatch's completion event, a host function that the driver runs on its own thread once the GPU
is done: it records the await's token and writes the eventfd (C only: no Python, no GIL). The
loop watches the eventfd (``loop.add_reader``) and :meth:`Notifier.drain` gives it the tokens of
the awaits to wake. :func:`spin` is the short back-to-back query of an await's first moments.

The host function waits on a private stream (``cuStreamWaitEvent`` there, then
``cuLaunchHostFunc``): no work of the dispatch's stream ever waits on it, and the wait captures
the event as recorded at the arm, so the handle may recycle its event at once. The stream is
destroyed right after (the driver runs what it holds first). Once :meth:`Notifier.arm` returns,
nothing here touches the handle again: a cancelled await leaves its host function to fire into a
token nobody waits for.
"""

from libc.stdint cimport uint64_t
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._driver cimport bind_context, now_ns
from ._dispatch cimport a_load, D_ENQUEUED, D_TAKING, arm_done
from ._pools cimport lock_with_gil
from ._waits cimport PendingDispatch


cdef extern from "_notify.hpp" namespace "vyre_notify" nogil:
    cppclass Notifier_t "vyre_notify::Notifier":
        int fd
    cppclass Arm:
        pass
    Notifier_t* create(int* err)
    void fire(Notifier_t* n, uint64_t token)
    void host_fn "vyre_notify::vyre_notify_host_fn"(void* data)
    Arm* new_arm(Notifier_t* n, uint64_t token)
    void cancel_arm(Arm* a)
    bint drain(Notifier_t* n, vector[uint64_t]* out)
    void release(Notifier_t* n)
    long long live_count "vyre_notify::live_notifiers.load"()
    long long armed_count "vyre_notify::armed_now.load"()
    unsigned long long fired_count "vyre_notify::fired_total.load"()
    unsigned long long spin_queries_count "vyre_notify::spin_queries.load"()
    void add_spin_queries "vyre_notify::spin_queries.fetch_add"(unsigned long long n)


cdef extern from "_relax.h":
    void relax "vyre_cpu_relax"() noexcept nogil  # the core's one spin pause


# Notifier.arm's outcomes besides a driver status (> 0)
ARMED = 0
SETTLED = -1  # the handle no longer has GPU work in flight: is_ready() says how it ended


cdef class Notifier:
    """One event loop's eventfd and the tokens of its finished awaits (see the module doc)."""

    cdef Notifier_t* n

    def __cinit__(self):
        cdef int err = 0
        self.n = create(&err)
        if self.n == NULL:
            raise OSError(err, "vyre_cuda: eventfd() for awaiting dispatches failed")

    def __dealloc__(self):
        # host functions still armed keep the native half (and its eventfd) until they have run
        if self.n != NULL:
            release(self.n)
            self.n = NULL

    def fileno(self):
        """The eventfd the loop watches: readable once some armed await has finished."""
        return self.n.fd

    def drain(self):
        """(tokens, lost): the tokens of the awaits finished since the last drain; ``lost`` is
        True when one could not be stored (out of memory): then every await is to be checked."""
        cdef vector[uint64_t] out
        cdef bint lost
        with nogil:
            lost = drain(self.n, &out)
        return [t for t in out], lost

    def arm(self, PendingDispatch d, unsigned long long token):
        """Queue ``token``'s wake-up behind ``d``'s completion. Returns ARMED, SETTLED (nothing
        in flight: ask ``d.is_ready()``), or the driver's status when it refused (the await then
        waits another way). Called on the loop's thread, which may not be the dispatch's."""
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef cydriver.CUstream s = NULL
        cdef bint own_stream = False
        cdef Arm* a
        cdef int state = a_load(&d.state)
        if state != D_ENQUEUED and state != D_TAKING:
            return SETTLED
        if d.core is None or d.core.ctx == NULL:  # (the context went with a fault)
            return SETTLED
        bind_context(d.core.ctx)
        a = new_arm(self.n, token)
        if a == NULL:
            raise MemoryError("vyre_cuda: no memory to arm an awaited dispatch")
        lock_with_gil(d.mu)  # the handle's resources cannot be released meanwhile
        with nogil:
            if d.f.active and not d.completed:
                st = arm_done(d)  # (an event left to record is recorded now)
        if not d.f.active or d.completed:
            d.mu.unlock()
            cancel_arm(a)
            return SETTLED
        with nogil:
            if st != cydriver.CUDA_SUCCESS:
                s = NULL  # (the record failed: reported below)
            elif d.f.has_done:
                st = cydriver.cuStreamCreate(&s, cydriver.CU_STREAM_NON_BLOCKING)
                if st == cydriver.CUDA_SUCCESS:
                    own_stream = True
                    st = cydriver.cuStreamWaitEvent(s, d.f.done, 0)
            else:
                s = d.f.stream  # (no completion event: behind the stream's own work)
            if st == cydriver.CUDA_SUCCESS:
                st = cydriver.cuLaunchHostFunc(s, <cydriver.CUhostFn>host_fn, <void*>a)
            if own_stream:
                cydriver.cuStreamDestroy(s)  # returns at once; the wait and the host function still run
        d.mu.unlock()
        if st != cydriver.CUDA_SUCCESS:
            cancel_arm(a)
            return <int>st
        return ARMED

    def fire(self, unsigned long long token):
        """Wake ``token``'s await now, through the path a host function takes (any thread; for
        handles that are not dispatches, and for tests)."""
        cdef Arm* a
        with nogil:
            a = new_arm(self.n, token)
            if a != NULL:
                host_fn(<void*>a)
        if a == NULL:
            raise MemoryError("vyre_cuda: no memory to wake an awaited dispatch")


def spin(PendingDispatch d, double seconds):
    """Query ``d``'s completion back to back without the GIL for up to ``seconds`` (0: once): 0
    timed out, 1 done at once (or settled elsewhere), 2 done later, -1 a driver error (then
    ``d.is_ready()`` raises it)."""
    cdef cydriver.CUresult st
    cdef unsigned long long t0, limit = <unsigned long long>(seconds * 1e9) if seconds > 0 else 0
    cdef unsigned long long queries = 0
    cdef int state, _k
    cdef int finished = 0
    if d.core is None or d.core.ctx == NULL:
        return 1
    bind_context(d.core.ctx)
    with nogil:
        t0 = now_ns()
        while True:
            state = a_load(&d.state)
            if state != D_ENQUEUED and state != D_TAKING:
                finished = 1 if queries == 0 else 2
                break
            d.mu.lock()  # (its holders never wait for the GIL)
            st = cydriver.CUDA_SUCCESS
            if d.f.active and not d.completed:
                st = arm_done(d)  # (an event left to record is recorded now, or seen covered)
                if st == cydriver.CUDA_SUCCESS and not d.completed:
                    st = cydriver.cuEventQuery(d.f.done) if d.f.has_done else cydriver.cuStreamQuery(d.f.stream)
                    queries += 1
            d.mu.unlock()
            if st == cydriver.CUDA_SUCCESS:
                finished = 1 if queries <= 1 else 2
                break
            if st != cydriver.CUDA_ERROR_NOT_READY:
                finished = -1
                break
            if now_ns() - t0 >= limit:
                break
            for _k in range(8):
                relax()
        add_spin_queries(queries)
    return finished


def counts():
    """Process-wide: ``notifiers`` alive, host functions ``armed`` and not yet run, ``fired``
    (host functions run, and fire() calls), ``spin_queries`` (completion queries of spin())."""
    return {
        "notifiers": live_count(),
        "armed": armed_count(),
        "fired": fired_count(),
        "spin_queries": spin_queries_count(),
    }
