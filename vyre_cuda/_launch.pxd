# Launch: the one enqueue routine, kernel launches, graph capture and replay (_graphs.hpp), the
# graph-or-issued trial and the cooperative-launch gate.

from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._transfer cimport TransferEngine, CoopOrder
from ._prepared cimport Prepared
from ._waits cimport PendingDispatch


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


cdef class CoopGate:
    cdef CoopOrder order
    cdef int ensure(self) except -1


cdef cydriver.CUresult issue(PendingDispatch d, Prepared p, TransferEngine xfer, unsigned long long* marks,
                             const char** call) noexcept nogil
cdef cydriver.CUresult collect(PendingDispatch d, Prepared p, TransferEngine xfer, const char** call) noexcept nogil
cdef cydriver.CUresult device_copies(PendingDispatch d, const char** call) noexcept nogil
cdef int stream_waits(PendingDispatch d, list streams) except -1
cdef int late_device_outputs(PendingDispatch d) except -1
cdef int late_readbacks(PendingDispatch d) except -1
cdef void trial_record(Prepared p, bint issued, unsigned long long ns) noexcept
