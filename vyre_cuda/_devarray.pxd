# DeviceArray's fields, cimported by the device-array reader (_devview) so a dispatch reads them in C.

from libc.stdint cimport uintptr_t
from cuda.bindings cimport cydriver

from ._array_pool cimport ArrayPool


cdef class DeviceArray:
    cdef readonly uintptr_t ptr
    cdef readonly size_t nbytes
    cdef readonly object dtype
    cdef readonly Py_ssize_t size
    cdef readonly int device
    cdef char kind  # 'f', 'i', 'u' (bool and raw bytes: 'u'), 0 for a type no check knows
    cdef int itemsize
    cdef cydriver.CUcontext ctx
    cdef ArrayPool pool  # where the memory goes back when the array dies (None until it has some)
    cdef size_t block
