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
cdef bint auto_registered(const void* ptr, size_t nbytes) noexcept nogil
cdef size_t window_bytes(size_t total, size_t chunk) noexcept nogil
cdef size_t readback_window_bytes(size_t total, size_t chunk) noexcept nogil
cdef bint next_upload_window(Cursor* c, const Source* sources, size_t n_sources, const char* direct,
                             size_t window, const char** input_ptrs, const char* params,
                             vector[Piece]& pieces, vector[CopyTask]& tasks) noexcept nogil
cdef bint next_readback_window(Cursor* c, const Piece* pieces, size_t n_pieces, const char* direct,
                               size_t window, vector[Piece]& dmas, vector[CopyTask]& tasks) noexcept nogil
