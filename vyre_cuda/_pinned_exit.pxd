# Every page-locked block this process holds, with its context: freed at interpreter exit.

from libc.stdint cimport uintptr_t
from cuda.bindings cimport cydriver


cdef void pinned_born(uintptr_t ptr, cydriver.CUcontext ctx) noexcept  # with the GIL held
cdef void pinned_gone(uintptr_t ptr) noexcept nogil
cdef void pinned_forget_context(cydriver.CUcontext ctx) noexcept nogil
