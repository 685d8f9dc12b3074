from libc.stdint cimport int64_t

cdef int check_counts(Py_ssize_t iterations, Py_ssize_t warmup) except -1
cdef int64_t* i64_data(arr) except? NULL
cdef object copy_passes(char** dst, const char** src, const size_t* lengths, int count,
                        int threads, Py_ssize_t iterations, Py_ssize_t warmup)
