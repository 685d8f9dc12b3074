# A dispatch's arrays as the hot path sees them: each input as a buffer view or a device pointer
# (with its length code for the plan lookup), the element checks of both kinds, and the views of
# device outputs read in C.

from cpython.buffer cimport Py_buffer
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._prepared cimport Prepared
from ._waits cimport PendingDispatch


cdef void release_views(vector[Py_buffer]& views, Py_ssize_t n) noexcept
cdef int read_inputs(cydriver.CUcontext ctx, int device, unsigned long long* tel, program, inputs,
                     config, vector[Py_buffer]& views, long long* lens, PendingDispatch d) except -1
cdef int check_inputs(int device, program, inputs, config, Prepared p, vector[Py_buffer]& views,
                      PendingDispatch d) except -1
cdef tuple device_outputs(cydriver.CUcontext ctx, int device, Prepared p, list into, PendingDispatch d)
cdef void input_pointers(PendingDispatch d) noexcept
cdef int sight_buffers(hook, PendingDispatch d, list into) except -1
cdef void mark_direct(PendingDispatch d, bint want_done) noexcept nogil
