# The DeviceArray pool (see _array_pool.pyx).

from libc.stdint cimport uintptr_t
from libcpp.pair cimport pair
from libcpp.vector cimport vector

from ._pools cimport BlockPool


cdef class ArrayPool(BlockPool):
    cdef readonly int device
    cdef vector[pair[uintptr_t, size_t]] quarantine  # dropped blocks waiting for a synchronize
    cdef size_t quarantined_bytes
    cdef unsigned long long flushes
    cdef unsigned long long refused_flushes
    cdef int take(self, size_t block, bint may_wait, uintptr_t* out) except -1
    cdef void give_back(self, uintptr_t ptr, size_t block) noexcept
    cdef int _pop(self, size_t block, uintptr_t* out) noexcept
    cdef bint _flush(self) noexcept


cdef size_t array_block_size(size_t nbytes) noexcept nogil
