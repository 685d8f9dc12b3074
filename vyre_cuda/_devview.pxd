# Device arrays read in C (DeviceArray, DLPack exchange API, CUDA Array Interface v3).

from cuda.bindings cimport cydriver


cdef class CupyStream:
    cdef object stream


cdef class DevView:
    cdef readonly cydriver.CUdeviceptr ptr
    cdef readonly size_t nbytes
    cdef readonly bint read_only
    cdef readonly object wait  # the producer's stream handle to wait on, or None
    cdef readonly object keep  # held until the dispatch completes
    cdef readonly char kind_code  # 'f', 'i', 'u' (bf16, bool: their raw bits)
    cdef readonly int itemsize
    cdef CupyStream memo  # what the dispatch's next read may reuse (the CuPy CAI's stream)


cdef DevView read_device(obj, int device, own, CupyStream memo)
cdef bint device_type(obj) noexcept
