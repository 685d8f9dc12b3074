# The work of dropped handles: what each left (its pools' resources, the buffers the GPU may still
# use), kept until its completion event has fired, then recycled. One per backend, one lock.

from cpython.buffer cimport Py_buffer
from cpython.ref cimport PyObject
from libcpp.deque cimport deque
from libcpp.mutex cimport mutex
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._resources cimport Resources, InFlight


cdef enum:
    # dropped work the list holds before the next dispatch waits for the oldest
    DEFER_MAX_COUNT = 4096
    DEFER_MAX_BYTES = 1 << 30  # ... and bytes of device memory and staging it holds


cdef struct Deferred:
    # what a dropped handle leaves: the pools' resources and every object the GPU may still use
    InFlight f
    vector[Py_buffer]* views  # its input and output buffer exports (released once reclaimed)
    PyObject* held  # a tuple of the device arrays, outputs and plan it kept alive (owned)
    size_t nbytes


cdef class DeferredWork:
    cdef mutex mu  # guards entries and nbytes; never held across a driver call or Python code
    cdef deque[Deferred] entries  # oldest first
    cdef size_t nbytes
    cdef long long count  # atomic: len(entries) (the hot path's one test)
    cdef void push(self, Deferred e) noexcept
    cdef size_t reclaim(self, cydriver.CUcontext ctx, Resources res, unsigned long long* tel, bint every,
                        bint wait) noexcept
