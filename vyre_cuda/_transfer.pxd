from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._windows cimport CopyTask, Cursor, Piece, Source


cdef extern from "_transfer.hpp" namespace "vyre" nogil:
    char* load_acquire(char** p)
    void store_release(char** p, char* v)

    cdef cppclass CopyPool:
        void configure(int threads, size_t min_split)
        int threads()
        int live_threads()
        unsigned long long parallel_jobs()
        int run(const CopyTask* tasks, size_t n_tasks, bint streaming)
        int start(const CopyTask* tasks, size_t n_tasks, bint streaming)
        void finish(int started)
        void wake()
        void stop()

    cdef cppclass SlotTable:
        void reset(int n)
        int size()
        int try_acquire()
        int acquire()
        void release(int k)
        int free_count()

    cdef cppclass CoopOrder:
        void lock()
        void unlock()
        void* last
        bint recorded


# how the streamed route's copy jobs store (TransferEngine.streamed_copy_mode; _streamed.pyx says
# why plain stores are the default)
cdef enum:
    COPY_BY_RULE = 0    # by the engine's rule: non-temporal stores for jobs up to stream_upload_max
    COPY_PLAIN = 1      # plain stores
    COPY_STREAMING = 2  # non-temporal stores


cdef class TransferEngine:
    cdef cydriver.CUcontext ctx
    cdef mutex ring_mu  # creation and freeing of the ring (read without it once set: release/acquire)
    cdef CopyPool pool
    cdef SlotTable slots
    cdef char* ring
    cdef vector[cydriver.CUevent] events
    cdef public size_t chunk_bytes
    cdef public int n_chunks
    cdef public int copy_threads
    cdef public size_t min_split
    cdef size_t _ring_bytes  # written and read under ring_mu (the ring_bytes property)
    cdef unsigned long long _pinned_alloc_calls  # relaxed atomics: counted under ring_mu, read and reset by any thread
    cdef public bint closed
    # This backend's measurement settings (vyre_cuda._knobs; defaults set in __init__), read per
    # transfer. Staged transfers up to this many bytes copy with non-temporal stores (see
    # _transfer.hpp):
    cdef public size_t stream_upload_max
    cdef public size_t stream_readback_max
    # ... the smallest windows a staged upload and a staged readback are cut into (_windows):
    cdef public size_t min_window
    cdef public size_t min_readback_window
    # ... and how the streamed route's copy jobs store (COPY_*):
    cdef public int streamed_copy_mode

    cdef int ensure_ring(self) except -1
    cdef void wake(self) noexcept nogil
    cdef cydriver.CUresult upload(self, cydriver.CUstream s, cydriver.CUdeviceptr slab,
                                  const Source* sources, size_t n_sources, const char** input_ptrs,
                                  const char* direct, const char* params,
                                  unsigned long long* copy_ns, unsigned long long* ops,
                                  const char** call) noexcept nogil
    cdef cydriver.CUresult _claim(self, int k, vector[CopyTask]& tasks, const char** call) noexcept nogil
    cdef cydriver.CUresult _send(self, int k, vector[Piece]& pieces, cydriver.CUdeviceptr slab,
                                 cydriver.CUstream s, unsigned long long* ops, const char** call) noexcept nogil
    cdef cydriver.CUresult _queue_readback(self, Cursor* cur, const Piece* pieces, size_t n_pieces,
                                           const char* direct, size_t window, bint may_block,
                                           cydriver.CUstream s, cydriver.CUdeviceptr slab,
                                           int* held_slot, vector[CopyTask]* held_tasks, int head,
                                           int* nheld, unsigned long long* ops, const char** call) noexcept nogil
    cdef cydriver.CUresult readback(self, cydriver.CUstream s, cydriver.CUdeviceptr slab,
                                    const Piece* pieces, size_t n_pieces, const char* direct,
                                    unsigned long long* ops, const char** call) noexcept nogil
