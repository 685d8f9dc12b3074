# A dispatch's outputs: new arrays, their targets, the in-place fit, a streamed async's copy-out.

from ._prepared cimport Prepared
from ._dispatch cimport Core
from ._waits cimport PendingDispatch


cdef list new_outputs(Core core, Prepared p, bint may_wait)
cdef int find_targets(PendingDispatch d, list outs) except -1
cdef int fits_in_place(PendingDispatch d, tuple views) except -1
cdef int check_into(Core core, PendingDispatch d, list into) except -1
cdef void mark_out_direct(PendingDispatch d) noexcept
cdef int copy_streamed(PendingDispatch d, list outs) except -1
