from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver


cdef extern from "_transfer.hpp" namespace "vyre" nogil:
    cdef struct CopyTask:
        char* dst
        const char* src
        size_t n

    void stream_copy(char* dst, const char* src, size_t n)
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


cdef enum:
    SRC_ZERO = 0    # bytes to zero (tails, gaps, small output clears)
    SRC_INPUT = 1   # bytes of caller input `index`, from byte `src_offset`
    SRC_PARAMS = 2  # bytes of the params blob, from byte `src_offset`


cdef struct Source:
    # one run of the upload region [0, upload_end); the runs are sorted and cover it exactly
    size_t offset
    size_t n
    int kind
    int index
    size_t src_offset


cdef struct Cursor:
    # progress through a list of sources or pieces: element index, bytes done within it
    size_t i
    size_t pos


cdef struct Piece:
    # one contiguous device range of a readback and where its bytes go
    size_t dev_offset
    char* host
    size_t n


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
    cdef public size_t ring_bytes
    cdef public unsigned long long pinned_alloc_calls
    cdef public bint closed
    # staged transfers up to this many bytes copy with non-temporal stores (see _transfer.hpp)
    cdef public size_t stream_upload_max
    cdef public size_t stream_readback_max

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


cdef bint page_locked(const void* ptr, size_t nbytes) noexcept nogil
cdef size_t window_bytes(size_t total, size_t chunk) noexcept nogil
cdef size_t readback_window_bytes(size_t total, size_t chunk) noexcept nogil
cdef bint next_upload_window(Cursor* c, const Source* sources, size_t n_sources, const char* direct,
                             size_t window, const char** input_ptrs, const char* params,
                             vector[Piece]& pieces, vector[CopyTask]& tasks) noexcept nogil
cdef bint next_readback_window(Cursor* c, const Piece* pieces, size_t n_pieces, const char* direct,
                               size_t window, vector[Piece]& dmas, vector[CopyTask]& tasks) noexcept nogil
