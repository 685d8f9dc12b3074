# cython: language_level=3
"""Device arrays read in C: vyre_cuda's ``DeviceArray``, the DLPack C exchange API (torch,
cuda.core), CuPy's own array fields, or a CUDA Array Interface v3 mapping (numba, others), with no
Python call per array beyond the producer's own.

CuPy builds a new CAI dict per access (0.7-0.9 us on the H200) and names no device in it, so its
fields are read instead; the stream its CAI would name (CuPy's current stream of the thread) is
read once per dispatch and carried along by ``CupyStream``, checked once per process against a
real CAI (else every first array's CAI is read). notes/device-arrays.md has the measurements.

A type's protocol is decided once, from its first array, and kept (written under a lock); a type
left to the Python reader is asked again next time, and a kept type whose array is refused is
forgotten. This reader takes only what it can prove well-formed; anything else returns None for
the Python reader (:mod:`vyre_cuda._device_io`), so only that one raises errors.
"""

cimport cython
cimport numpy as cnp
from cpython.exc cimport PyErr_Clear
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.pycapsule cimport PyCapsule_IsValid, PyCapsule_GetPointer
from libc.stdint cimport int64_t, uintptr_t
from libcpp.mutex cimport mutex
from cuda.bindings cimport cydriver

import sys
import threading

import numpy as np

from ._dlpack cimport (
    DLTensor, DLManagedTensorVersioned, DLPackExchangeAPI, KDL_CUDA, DL_FLAG_READ_ONLY,
)
from ._devarray cimport DeviceArray
from ._pools cimport lock_with_gil
from ._dtypes import is_little_endian

__all__ = ["DevView", "device_view", "fallback_reason", "protocol_of"]

cdef enum:
    P_SLOW = 0  # the Python reader
    P_DEVARRAY = 1
    P_EXCHANGE = 2
    P_CAI = 3
    P_CUPY = 4  # CuPy's ndarray: its fields, and CuPy's current stream (or its CAI) for the stream

cdef unsigned long long LEGACY_STREAM = 1  # CU_STREAM_LEGACY
cdef unsigned int CU_MEMORYTYPE_HOST = 1
cdef Py_ssize_t TYPESTR_CACHE_MAX = 256
_PROTOCOL_NAMES = {P_SLOW: "python", P_DEVARRAY: "DeviceArray", P_EXCHANGE: "dlpack-exchange", P_CAI: "cai",
                   P_CUPY: "cupy"}
# the CuPy class whose fields are read, and the fields a subclass must leave as they are
_CUPY_BASE = ("cupy._core.core", "_ndarray_base")
_CUPY_POINTER = ("cupy.cuda.memory", "MemoryPointer")
_CUPY_FIELDS = ("__cuda_array_interface__", "data", "size", "dtype", "_c_contiguous")
cdef bint _LITTLE_HOST = sys.byteorder == "little"
_EXCHANGE_ATTRS = ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__")  # newer name first


@cython.final
@cython.no_gc  # (a dispatch's own record: nothing it holds refers back to it)
cdef class DevView:
    """One device array as a dispatch uses it: the same fields as the Python reader's view."""

    def __repr__(self):
        return (f"DevView(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, readonly={self.read_only}, "
                f"wait={self.wait!r}, kind={chr(self.kind_code) if self.kind_code else ''!r}, "
                f"itemsize={self.itemsize})")

    @property
    def readonly(self):
        return self.read_only

    @property
    def kind(self):
        return chr(self.kind_code) if self.kind_code else ""


@cython.final
cdef class _Held:
    """A tensor taken through the exchange API: the producer's reference, given back (its
    deleter) when the dispatch lets go of it, and the producer's object."""

    cdef DLManagedTensorVersioned* mt
    cdef object owner

    def __dealloc__(self):
        if self.mt != NULL and self.mt.deleter != NULL:
            self.mt.deleter(self.mt)
        self.mt = NULL


@cython.final
@cython.no_gc  # (holds an int or None: no cycle can pass through it)
cdef class CupyStream:
    """The stream a dispatch's CuPy arrays name (None: none), read once for its first CuPy array."""


cdef CupyStream _cupy_stream(object stream):
    cdef CupyStream m = CupyStream.__new__(CupyStream)
    m.stream = stream
    return m


# why this thread's last array went to the Python reader (fallback_reason); per thread: no GIL
cdef object _why = threading.local()


cdef inline object _no(str why):
    _why.text = why
    return None


cdef dict _protocols = {}  # type -> its record (type, (protocol, payload: exchange API capsule, CuPy pointer type))
cdef mutex _protocols_mu  # held to write _protocols (a read is one dict lookup)
cdef dict _typestrs = {}  # CAI typestr -> (kind, itemsize), or False for one this reader leaves alone


cdef object _cupy_pointer_type(obj, t):
    """The type of ``obj.data`` when ``t`` is CuPy's ndarray, or a subclass that overrides none of
    the fields read (else None: a subclass may describe its memory differently)."""
    for base in t.__mro__:
        if (base.__module__, base.__name__) == _CUPY_BASE:
            break
    else:
        return None
    for name in _CUPY_FIELDS:
        if getattr(t, name, None) is not base.__dict__.get(name):
            return None
    data = obj.data
    pt = type(data)
    if (pt.__module__, pt.__name__) != _CUPY_POINTER:
        return None
    return pt


cdef tuple _classify(obj, t):
    if t is DeviceArray:
        return (P_DEVARRAY, None)
    for name in _EXCHANGE_ATTRS:
        cap = getattr(t, name, None)
        if cap is not None and PyCapsule_IsValid(cap, b"dlpack_exchange_api"):
            api = <DLPackExchangeAPI*>PyCapsule_GetPointer(cap, b"dlpack_exchange_api")
            if (api != NULL and api.header.version.major == 1
                    and api.managed_tensor_from_py_object_no_sync != NULL and api.current_work_stream != NULL):
                return (P_EXCHANGE, cap)
    try:
        cai = obj.__cuda_array_interface__
    except Exception:  # noqa: BLE001 (torch raises on a CPU tensor; the Python reader decides)
        cai = None
    if type(cai) is dict:
        version = (<dict>cai).get("version")
        if type(version) is int and version >= 3:
            try:
                pointer_type = _cupy_pointer_type(obj, t)
            except Exception:  # noqa: BLE001 (not the CuPy it looks like: its CAI is still good)
                pointer_type = None
            if pointer_type is not None and _LITTLE_HOST:
                return (P_CUPY, pointer_type)
            return (P_CAI, None)
    return (P_SLOW, None)


# The last (type, entry) record looked up, behind one atomic pointer: one compare, no dict lookup.
# Borrowed: every record ever published stays in _records, so no reader holds a freed one; a
# record forgotten a moment before only sends one more array to the reader that forgets it again.
cdef extern from *:
    """
    static PyObject* vyre_recent_record = NULL;
    static inline PyObject* vyre_recent_load(void) { return __atomic_load_n(&vyre_recent_record, __ATOMIC_ACQUIRE); }
    static inline void vyre_recent_store(PyObject* r) { __atomic_store_n(&vyre_recent_record, r, __ATOMIC_RELEASE); }
    """
    PyObject* recent_load "vyre_recent_load"() noexcept nogil
    void recent_store "vyre_recent_store"(PyObject* r) noexcept nogil

cdef dict _records = {}  # type -> [its records]: each (type, entry) ever published; written under _protocols_mu


cdef tuple _record(t, tuple entry):
    """The kept record of (t, entry) (made and kept the first time); under _protocols_mu."""
    kept = _records.setdefault(t, [])
    for rec in kept:
        if (<tuple>rec)[1] == entry:
            return <tuple>rec
    rec = (t, entry)
    kept.append(rec)
    return rec


cdef inline object _current_entry(t):
    """The kept entry of type ``t``, or None. The last type looked up is compared first."""
    cdef PyObject* rec = recent_load()
    if rec != NULL and PyTuple_GET_ITEM(<object>rec, 0) == <PyObject*>t:
        return <object>PyTuple_GET_ITEM(<object>rec, 1)
    record = _protocols.get(t)
    if record is None:
        return None
    recent_store(<PyObject*>record)
    return (<tuple>record)[1]


cdef tuple _protocol(obj):
    t = type(obj)
    entry = _current_entry(t)
    if entry is not None:
        return <tuple>entry
    entry = _classify(obj, t)
    if (<tuple>entry)[0] != P_SLOW:  # (a type left to the Python reader is asked again next time)
        lock_with_gil(_protocols_mu)
        try:
            record = _record(t, <tuple>entry)
            _protocols[t] = record
        finally:
            _protocols_mu.unlock()
        recent_store(<PyObject*>record)
    return <tuple>entry


cdef void _forget(t) noexcept:
    """A kept type whose array this reader refused: decided again at its next array."""
    cdef PyObject* rec
    lock_with_gil(_protocols_mu)
    try:
        _protocols.pop(t, None)
    except BaseException:  # (noexcept: a type's own __eq__ raising leaves the entry)
        pass
    _protocols_mu.unlock()
    rec = recent_load()
    if rec != NULL and PyTuple_GET_ITEM(<object>rec, 0) == <PyObject*>t:
        recent_store(NULL)


cdef bint device_type(obj) noexcept:
    """Whether ``obj``'s type is kept as one this reader takes (tried before a buffer protocol
    that would refuse, as CuPy's does)."""
    entry = _current_entry(type(obj))
    return entry is not None and (<tuple>entry)[0] != P_SLOW


def protocol_of(obj):
    """The name of the protocol a dispatch reads ``obj`` through in C ("python": the Python reader)."""
    return _PROTOCOL_NAMES[(<tuple>_protocol(obj))[0]]


cdef bint _c_contiguous(int ndim, const int64_t* shape, const int64_t* strides, Py_ssize_t* count) noexcept:
    # DLPack strides count elements; NULL strides mean C-contiguous
    cdef int k
    cdef Py_ssize_t expected = 1, n = 1
    for k in range(ndim):
        if shape[k] < 0:
            return False
        n *= shape[k]
    count[0] = n
    if strides == NULL or n == 0:
        return True
    for k in range(ndim - 1, -1, -1):
        if shape[k] != 1 and strides[k] != expected:
            return False
        expected *= shape[k]
    return True


cdef inline char _dl_kind(unsigned char code) noexcept:
    if code == 0:
        return b'i'
    if code == 1 or code == 4 or code == 6:  # uint, bfloat16 and bool: raw bits
        return b'u'
    if code == 2:
        return b'f'
    return 0


cdef inline object _waited(unsigned long long producer, object own):
    # the stream to wait on, or None when the dispatch already runs on it
    cdef unsigned long long mine
    if own is not None:
        mine = <unsigned long long>own
        if mine == 0:
            mine = LEGACY_STREAM
        if producer == mine:
            return None
    return producer


cdef DevView _from_devarray(DeviceArray da, int device):
    if da.device != device or da.kind == 0:
        return _no("a DeviceArray of another device, or of an element type no check knows")
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = <cydriver.CUdeviceptr>da.ptr
    v.nbytes = da.nbytes
    v.read_only = False
    v.wait = None  # complete when handed out: no stream of its own
    v.keep = da
    v.kind_code = da.kind
    v.itemsize = da.itemsize
    return v


cdef DevView _from_exchange(obj, cap, int device, own):
    cdef DLPackExchangeAPI* api = <DLPackExchangeAPI*>PyCapsule_GetPointer(cap, b"dlpack_exchange_api")
    cdef DLManagedTensorVersioned* mt = NULL
    cdef DLTensor* t
    cdef void* stream = NULL
    cdef Py_ssize_t count
    cdef char kind
    if api.managed_tensor_from_py_object_no_sync(<void*>obj, &mt) != 0 or mt == NULL:
        PyErr_Clear()  # the Python reader exports it again and words the refusal
        return _no("the producer's exchange API refused to export it")
    cdef _Held held = _Held.__new__(_Held)
    held.mt = mt  # from here on the producer's reference is given back whatever happens
    held.owner = obj
    t = &mt.dl_tensor
    if mt.version.major != 1 or t.device.device_type != KDL_CUDA or t.device.device_id != device:
        return _no("not a DLPack 1.x tensor on this CUDA device")
    kind = _dl_kind(t.dtype.code)
    if kind == 0 or t.dtype.lanes != 1 or t.dtype.bits == 0 or t.dtype.bits % 8:
        return _no("an element type no check knows")
    if not _c_contiguous(t.ndim, t.shape, t.strides, &count):
        return _no("not C-contiguous")
    if api.current_work_stream(KDL_CUDA, device, &stream) != 0:
        PyErr_Clear()
        return _no("the producer's exchange API gave no current stream")
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = <cydriver.CUdeviceptr>(<uintptr_t>t.data + t.byte_offset)
    v.itemsize = t.dtype.bits // 8
    v.nbytes = <size_t>count * v.itemsize
    # a requires_grad tensor is read-only (torch refuses such a write itself)
    v.read_only = (mt.flags & DL_FLAG_READ_ONLY) != 0 or _requires_grad(obj)
    # the producer's current stream (NULL: its legacy default stream) orders its pending writes
    v.wait = _waited(<uintptr_t>stream if stream != NULL else LEGACY_STREAM, own)
    v.keep = held
    v.kind_code = kind
    return v


cdef bint _requires_grad(obj) except -1:
    try:
        return obj.requires_grad is True
    except AttributeError:
        return False


cdef object _typestr_spec(ts):
    spec = _typestrs.get(ts)
    if spec is not None:
        return spec
    spec = False
    if type(ts) is str:
        try:
            dt = np.dtype(ts)
        except (TypeError, ValueError):
            dt = None
        if dt is not None and is_little_endian(dt) and dt.kind in "biufV":
            spec = (ord({"b": "u", "V": "u"}.get(dt.kind, dt.kind)), dt.itemsize)
        if len(_typestrs) < TYPESTR_CACHE_MAX:
            _typestrs[ts] = spec
    return spec


cdef bint _pointer_on(cydriver.CUdeviceptr ptr, int device) noexcept:
    # device memory of this device, or page-locked host memory (reachable from any device)
    cdef cydriver.CUpointer_attribute attrs[2]
    cdef void* data[2]
    cdef unsigned int memtype = 0
    cdef int ordinal = -1
    attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    data[0] = &memtype
    data[1] = &ordinal
    with nogil:
        if cydriver.cuPointerGetAttributes(2, attrs, data, ptr) != cydriver.CUDA_SUCCESS:
            return False
    return memtype != 0 and (memtype == CU_MEMORYTYPE_HOST or ordinal == device)


cdef DevView _from_cai(obj, int device, own):
    cdef Py_ssize_t count = 1, expected, k, extent
    try:
        cai = obj.__cuda_array_interface__
    except Exception:  # noqa: BLE001
        return _no("reading __cuda_array_interface__ raised")
    if type(cai) is not dict:
        return _no("__cuda_array_interface__ is not a dict")
    version = (<dict>cai).get("version")
    if type(version) is not int or version < 3 or (<dict>cai).get("mask") is not None:
        return _no("not a CUDA Array Interface v3 without a mask")
    shape = (<dict>cai).get("shape")
    data = (<dict>cai).get("data")
    if type(shape) is not tuple or type(data) is not tuple or len(<tuple>data) != 2:
        return _no("shape or data is not a tuple")
    spec = _typestr_spec((<dict>cai).get("typestr"))
    if spec is False:
        return _no("typestr names a big-endian or unknown element type")
    for x in <tuple>shape:
        if type(x) is not int or x < 0:
            return _no("shape holds a value that is not a non-negative int")
        count *= <Py_ssize_t>x
    strides = (<dict>cai).get("strides")
    cdef Py_ssize_t itemsize = (<tuple>spec)[1]
    if strides is not None:
        if type(strides) is not tuple or len(<tuple>strides) != len(<tuple>shape):
            return _no("strides is not a tuple of the shape's length")
        if count:
            expected = itemsize
            for k in range(len(<tuple>shape) - 1, -1, -1):
                extent = (<tuple>shape)[k]
                if extent != 1 and (<tuple>strides)[k] != expected:
                    return _no("not C-contiguous")
                expected *= extent
    ptr, readonly = <tuple>data
    if type(ptr) is not int or ptr < 0:
        return _no(f"the data pointer is a {type(ptr).__name__}, not a non-negative int")
    stream = (<dict>cai).get("stream")
    if stream is not None and (type(stream) is not int or stream <= 0):
        return _no(f"the stream is {stream!r} ({type(stream).__name__}), not a positive int or None")
    cdef cydriver.CUdeviceptr p = <cydriver.CUdeviceptr><unsigned long long>ptr
    if count and not _pointer_on(p, device):
        return _no("the driver does not know the pointer as memory this device can reach")
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = p
    v.nbytes = <size_t>count * itemsize
    v.read_only = bool(readonly)
    v.wait = None if stream is None else _waited(<unsigned long long>stream, own)
    v.keep = obj
    v.kind_code = <char>(<tuple>spec)[0]
    v.itemsize = <int>itemsize
    return v


cdef CupyStream _cupy_memo_from_cai(obj):
    """The stream ``obj``'s CAI names, or None when not v3 with a usable stream (_from_cai says why)."""
    try:
        cai = obj.__cuda_array_interface__
    except Exception:  # noqa: BLE001
        return None
    if type(cai) is not dict:
        return None
    version = (<dict>cai).get("version")
    stream = (<dict>cai).get("stream")
    if type(version) is not int or version < 3 or (stream is not None and (type(stream) is not int or stream <= 0)):
        return None
    return _cupy_stream(stream)


# CuPy's stream functions (None: not looked up yet; False: missing or disagreed with a real CAI)
cdef object _cupy_api = None
cdef object _UNKNOWN = object()


cdef object _cupy_current(tuple api):
    """The stream a CuPy CAI exported now would name, or _UNKNOWN where only the CAI can say."""
    if getattr(api[0], "CUDA_ARRAY_INTERFACE_EXPORT_VERSION", None) != 3:
        return _UNKNOWN  # (version 2 names no stream: the CAI says so itself)
    ptr = api[1]().ptr
    if type(ptr) is not int:
        return _UNKNOWN
    if ptr == 0:  # CuPy's null stream: CAI v3 names the default stream instead
        ptr = api[2]()
    return ptr if type(ptr) is int and ptr > 0 else _UNKNOWN


cdef object _cupy_resolve():
    modules = sys.modules
    try:
        return (modules["cupy._util"], modules["cupy.cuda"].get_current_stream,
                modules["cupy_backends.cuda.stream"].get_default_stream_ptr)
    except Exception:  # noqa: BLE001 (another CuPy layout, or not CuPy at all)
        return False


cdef CupyStream _cupy_memo(obj):
    """The stream ``obj``'s CAI names now: from CuPy's current stream where shown to agree, else the CAI."""
    global _cupy_api
    cdef CupyStream memo
    if _cupy_api is None:
        _cupy_api = _cupy_resolve()
        if _cupy_api is not False:
            memo = _cupy_memo_from_cai(obj)
            try:
                agrees = memo is not None and _cupy_current(<tuple>_cupy_api) == memo.stream
            except Exception:  # noqa: BLE001
                agrees = False
            if not agrees:
                _cupy_api = False
            return memo
    if _cupy_api is not False:
        try:
            stream = _cupy_current(<tuple>_cupy_api)
        except Exception:  # noqa: BLE001 (the CAI read below words any real problem)
            stream = _UNKNOWN
        if stream is not _UNKNOWN:
            return _cupy_stream(stream)
    return _cupy_memo_from_cai(obj)


def _forget_cupy_api():
    """Tests: resolve CuPy's stream functions again at the next CuPy array."""
    global _cupy_api
    _cupy_api = None


cdef DevView _from_cupy(obj, pointer_type, int device, own, CupyStream memo):
    """A CuPy array from its fields, with ``memo``'s stream (read here for the first one)."""
    cdef Py_ssize_t size
    cdef cnp.dtype dt
    cdef char kind
    if memo is None:
        memo = _cupy_memo(obj)
        if memo is None:
            return _from_cai(obj, device, own)
    data = obj.data
    if type(data) is not pointer_type:
        return _from_cai(obj, device, own)
    if <int>data.device_id != device:
        return _no("a CuPy array of another device")
    size = obj.size
    if size and not obj._c_contiguous:
        return _no("not C-contiguous")
    dtype = obj.dtype
    if not cnp.PyArray_DescrCheck(dtype):
        return _from_cai(obj, device, own)
    dt = <cnp.dtype>dtype
    kind = dt.kind
    if dt.byteorder == b'>':
        return _no("typestr names a big-endian or unknown element type")
    if kind == b'b':
        kind = b'u'
    elif kind != b'i' and kind != b'u' and kind != b'f':
        return _from_cai(obj, device, own)  # void and the rest: as the CAI's typestr says
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = <cydriver.CUdeviceptr><uintptr_t>data.ptr if size else 0
    v.itemsize = <int>dt.itemsize
    v.nbytes = <size_t>size * v.itemsize
    v.read_only = False  # CuPy exports every array writable
    stream = memo.stream
    v.wait = None if stream is None else _waited(<unsigned long long>stream, own)
    v.keep = obj
    v.kind_code = kind
    v.memo = memo
    return v


cdef DevView read_device(obj, int device, own, CupyStream memo):
    """``obj`` as a :class:`DevView`, or None for the Python reader. ``own``: the caller's stream
    handle or None; ``memo``: the previous view's (None once a producer's Python may have run)."""
    cdef tuple proto = _protocol(obj)
    cdef int code = proto[0]
    cdef DevView v
    if code == P_DEVARRAY or code == P_EXCHANGE:
        if code == P_DEVARRAY:
            v = _from_devarray(<DeviceArray>obj, device)
        else:
            v = _from_exchange(obj, proto[1], device, own)
        if v is not None:
            v.memo = memo  # C only: nothing that could change CuPy's current stream ran
    elif code == P_CUPY:
        v = _from_cupy(obj, proto[1], device, own, memo)
    elif code == P_CAI:
        v = _from_cai(obj, device, own)
    else:
        return _no("its type speaks no protocol this reader takes (DLPack without the exchange API, "
                   "or not a CUDA Array Interface v3)")
    if v is None:
        _forget(type(obj))
    return v


def device_view(obj, int device=0, stream=None, DevView after=None):
    """Python access to the C reader (tests and diagnostics): a :class:`DevView` or None.
    ``after``: the view read before it in the same dispatch."""
    return read_device(obj, device, stream, None if after is None else after.memo)


def fallback_reason(obj, int device=0, stream=None):
    """Why a dispatch leaves ``obj`` to the Python reader ("" when the C reader takes it)."""
    _why.text = ""
    return "" if read_device(obj, device, stream, None) is not None else _why.text
