# A device array's protocols, one reader each, and the view they make (DevView).

from cpython.object cimport PyObject
from cuda.bindings cimport cydriver

from ._devarray cimport DeviceArray

cdef enum:
    LEGACY_STREAM = 1  # CU_STREAM_LEGACY: DLPack's and CAI's stream 1


cdef struct Who:  # an array as a refusal names it
    PyObject* where  # the program (an input) or the plan (an output), borrowed from the caller
    Py_ssize_t index
    bint output


cdef class CupyStream:
    cdef object stream


cdef class DevView:
    cdef readonly cydriver.CUdeviceptr ptr
    cdef readonly size_t nbytes
    cdef readonly bint read_only
    cdef readonly object wait  # the producer's stream handle to wait on, or None
    cdef readonly object keep  # held until the dispatch completes
    cdef readonly char kind_code  # 'f', 'i', 'u' (bf16, bool: their raw bits), 0 for a type no check knows
    cdef readonly int itemsize
    cdef CupyStream memo  # what the dispatch's next read may reuse (the CuPy CAI's stream)
    cdef bint by_python  # read through Python calls (__dlpack__, a CAI before v3, a StridedMemoryView)
    cdef object described  # the element type as a numpy dtype, or None: DLPack's (dl_dtype)
    cdef unsigned int dl_dtype  # DLPack's code | bits << 8 | lanes << 16


cdef inline Who who(where, Py_ssize_t index, bint output) noexcept:
    cdef Who w
    w.where = <PyObject*>where
    w.index = index
    w.output = output
    return w


cdef inline bint is_v3(cai) noexcept:
    # a CUDA Array Interface v3 mapping (it names its stream)
    if type(cai) is not dict:
        return False
    version = (<dict>cai).get("version")
    return type(version) is int and version >= 3


cdef inline char np_kind(dtype):
    # a numpy dtype's element kind as the checks compare it: bool and raw bytes are their bits
    k = dtype.kind
    if k == "b" or k == "V":
        return b'u'
    return ord(k) if k == "i" or k == "u" or k == "f" else 0


cdef inline object waited(unsigned long long producer, object own):
    # the stream to wait on, or None when the dispatch already runs on it
    cdef unsigned long long mine
    if own is not None:
        mine = <unsigned long long>own
        if mine == 0:
            mine = LEGACY_STREAM
        if producer == mine:
            return None
    return producer


cdef str what(Who w)
cdef int check_device(Who w, long long got, int device) except -1
cdef object grad_error(Who w)
cdef str element_name(DevView v)
cdef bint requires_grad(obj) except -1
cdef object cai_of(obj)
cdef DevView from_devarray(DeviceArray da, int device, Who w)
cdef DevView from_exchange(obj, cap, int device, own, Who w)
cdef DevView from_dlpack(obj, int device, own, Who w)
cdef DevView from_cai(obj, cai, int device, own, Who w)
cdef DevView from_view(view, int device, Who w)
