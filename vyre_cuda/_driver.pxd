from cuda.bindings cimport cydriver

cdef int check_cu(cydriver.CUresult status, const char* call) except -1 nogil
cdef int raise_cu(cydriver.CUresult status, const char* call) except -1 with gil
cdef int bind_context(cydriver.CUcontext ctx) except -1 nogil
cdef unsigned long long now_ns() noexcept nogil
cdef void capture_opened() noexcept nogil
cdef void capture_closed() noexcept nogil
cdef int captures_open() noexcept nogil
