# DeviceArray's fields, cimported by the device-array reader (_devview) so a dispatch reads them in C.

from libc.stdint cimport uintptr_t
from cuda.bindings cimport cydriver


cdef class ContextHold:
    # one reference on a device's primary context, shared by the DeviceArrays a backend makes
    cdef cydriver.CUcontext ctx
    cdef int device
    cdef bint retained


cdef class DeviceArray:
    cdef readonly uintptr_t ptr
    cdef readonly size_t nbytes
    cdef readonly object dtype
    cdef readonly Py_ssize_t size
    cdef readonly int device
    cdef char kind  # 'f', 'i', 'u' (bool and raw bytes: 'u'), 0 for a type no check knows
    cdef int itemsize
    cdef cydriver.CUcontext ctx
    cdef bint owns  # the memory is this array's to free
    cdef ContextHold hold  # keeps ctx alive until the memory is freed (released after __dealloc__)


cdef ContextHold hold_context(int device)
cdef DeviceArray new_device_array(Py_ssize_t count, dtype, ContextHold hold)
