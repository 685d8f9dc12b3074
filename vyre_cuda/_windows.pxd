from libcpp.vector cimport vector


cdef extern from "_transfer.hpp" namespace "vyre" nogil:
    cdef struct CopyTask:
        char* dst
        const char* src
        size_t n

    void stream_copy(char* dst, const char* src, size_t n)


cdef enum:
    SRC_ZERO = 0    # bytes to zero (tails, gaps, small output clears)
    SRC_INPUT = 1   # bytes of caller input `index`, from byte `src_offset`
    SRC_PARAMS = 2  # bytes of the params blob, from byte `src_offset`


# The smallest windows a transfer engine cuts staged transfers into, unless a measurement sets its
# own (TransferEngine.min_window / min_readback_window, vyre_cuda._knobs): below 512 KiB a window's
# driver calls cost more than its overlap buys; 1 MiB readback windows took 4 MiB readbacks from
# 140 to 104 us against 512 KiB (notes/transfer-engine.md).
cdef enum:
    MIN_WINDOW = 512 << 10
    MIN_READBACK_WINDOW = 1 << 20


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


cdef bint page_locked(const void* ptr, size_t nbytes) noexcept nogil
cdef size_t locked_run(const void* ptr, size_t nbytes) noexcept nogil
cdef bint auto_registered(const void* ptr, size_t nbytes) noexcept nogil
cdef bint direct_enter() noexcept nogil
cdef void direct_leave() noexcept nogil
cdef size_t window_bytes(size_t total, size_t chunk, size_t minimum) noexcept nogil
cdef bint next_upload_window(Cursor* c, const Source* sources, size_t n_sources, const char* direct,
                             size_t window, const char** input_ptrs, const char* params,
                             vector[Piece]& pieces, vector[CopyTask]& tasks) noexcept nogil
cdef bint next_readback_window(Cursor* c, const Piece* pieces, size_t n_pieces, const char* direct,
                               size_t window, vector[Piece]& dmas, vector[CopyTask]& tasks) noexcept nogil
