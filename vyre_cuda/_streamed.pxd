# The streamed route: an elementwise dispatch cut into chunks pipelined over a few streams.

from cuda.bindings cimport cydriver

from ._transfer cimport TransferEngine
from ._prepared cimport Prepared
from ._waits cimport PendingDispatch


cdef cydriver.CUresult issue_streamed(PendingDispatch d, Prepared p, TransferEngine xfer,
                                      const char** call) noexcept nogil
cdef cydriver.CUresult drain_streamed(PendingDispatch d, Prepared p, TransferEngine xfer,
                                      const char** call) noexcept nogil
