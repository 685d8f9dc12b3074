from cuda.bindings cimport cydriver

cdef int check_cu(cydriver.CUresult status, const char* call) except -1 nogil
cdef int raise_cu(cydriver.CUresult status, const char* call) except -1 with gil
cdef int bind_context(cydriver.CUcontext ctx) except -1 nogil
cdef unsigned long long now_ns() noexcept nogil
cdef bint capture_try_open() noexcept nogil
cdef void capture_open_wait() noexcept nogil
cdef void capture_closed() noexcept nogil
cdef cydriver.CUresult synchronize_current(double capture_wait_s) noexcept nogil
