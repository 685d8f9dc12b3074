# DeviceArray's fields, cimported by the device-array reader (_devview) so a dispatch reads them in C.

from libc.stdint cimport uintptr_t
from cuda.bindings cimport cydriver


cdef class DeviceArray:
    cdef readonly uintptr_t ptr
    cdef readonly size_t nbytes
    cdef readonly object dtype
    cdef readonly Py_ssize_t size
    cdef readonly int device
    cdef char kind  # 'f', 'i', 'u' (bool and raw bytes: 'u'), 0 for a type no check knows
    cdef int itemsize
    cdef cydriver.CUcontext ctx
    cdef bint owns
    cdef bint pooled  # from a stream-ordered pool: freed with cuMemFreeAsync, not cuMemFree
    cdef object streams  # consumer streams its free waits for (record_stream, __dlpack__(stream=)), or None

    cdef _describe(self, Py_ssize_t count, dtype, size_t nbytes)
    cdef _record(self, handle)


cdef DeviceArray pooled_array(Py_ssize_t count, dtype, int device, cydriver.CUmemoryPool pool,
                              cydriver.CUstream stream)
