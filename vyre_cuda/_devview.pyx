# cython: language_level=3
"""The one reader of device arrays: it decides the protocol an array speaks, reads the array
through it (the readers are :mod:`vyre_cuda._devproto`'s), and raises a typed error with its Fix
for what a dispatch cannot use; None is no device array (host memory, a CPU DLPack tensor too:
:func:`host_view` views that as numpy).

The protocols, in order: ``DeviceArray``; DLPack's C exchange API (torch 2.10+, cuda.core: no
Python call); a CUDA Array Interface v3 (CuPy, numba: it names its stream); ``__dlpack__`` (DLPack
goes first when an object has both and its interface names no stream: torch's CAI is v2, and the
``stream`` argument makes the producer order its pending work before ours); an older interface;
a StridedMemoryView.

CuPy builds a new CAI dict per access (0.7-0.9 us on the H200) and names no device in it, so its
fields are read instead; the stream its CAI would name (CuPy's current stream of the thread) is
read once per dispatch and carried along by ``CupyStream``, checked once per process against a
real CAI (else every first array's CAI is read). notes/device-arrays.md has the measurements.

A type of the first three protocols (CuPy's fields too) is decided from its first array and kept
(written under a lock); any other is decided again at each array, and a kept type whose array no
longer speaks its protocol is forgotten and read as it is now.
"""

cimport numpy as cnp
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM
from cpython.pycapsule cimport PyCapsule_IsValid, PyCapsule_GetPointer
from libc.stdint cimport uintptr_t
from libcpp.mutex cimport mutex
from cuda.bindings cimport cydriver

import sys

import numpy as np

from ._dlpack cimport DLPackExchangeAPI, KDL_CPU
from ._devarray cimport DeviceArray
from ._devproto cimport (
    Who, who, CupyStream, DevView, is_v3, np_kind, waited, what, check_device, grad_error, element_name,
    requires_grad, cai_of, from_devarray, from_exchange, from_dlpack, from_cai, from_view,
)
from ._pools cimport lock_with_gil
from .errors import ValidationError

__all__ = ["device_view", "device_input", "device_output", "host_view", "protocol_of"]

cdef enum:
    P_DEVARRAY = 1  # kept per type: read in C
    P_EXCHANGE = 2
    P_CAI = 3
    P_CUPY = 4  # CuPy's ndarray: its fields, and CuPy's current stream (or its CAI) for the stream
    P_DLPACK = 5  # decided again at each array: __dlpack__(stream=...)
    P_CAI_ANY = 6  # ... an interface that is no v3 mapping
    P_VIEW = 7  # ... a StridedMemoryView
    P_NONE = 8  # no device array

_PROTOCOL_NAMES = {P_DEVARRAY: "DeviceArray", P_EXCHANGE: "dlpack-exchange", P_CAI: "cai", P_CUPY: "cupy",
                   P_DLPACK: "dlpack", P_CAI_ANY: "cai-before-v3", P_VIEW: "strided-view", P_NONE: "none"}
# the CuPy class whose fields are read, and the fields a subclass must leave as they are
_CUPY_BASE = ("cupy._core.core", "_ndarray_base")
_CUPY_POINTER = ("cupy.cuda.memory", "MemoryPointer")
_CUPY_FIELDS = ("__cuda_array_interface__", "data", "size", "dtype", "_c_contiguous")
_VIEW_FIELDS = ("ptr", "shape", "dtype", "device_id", "is_device_accessible")  # cuda.core's StridedMemoryView
cdef bint _LITTLE_HOST = sys.byteorder == "little"
_EXCHANGE_ATTRS = ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__")  # newer name first


cdef CupyStream _cupy_stream(object stream):
    cdef CupyStream m = CupyStream.__new__(CupyStream)
    m.stream = stream
    return m


# -- the per-type protocol table

cdef dict _protocols = {}  # type -> its record (type, (protocol, payload: exchange API capsule, CuPy pointer type))
cdef mutex _protocols_mu  # held to write _protocols (a read is one dict lookup)


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
    cai = cai_of(obj)
    if is_v3(cai):
        try:
            pointer_type = _cupy_pointer_type(obj, t)
        except Exception:  # noqa: BLE001 (not the CuPy it looks like: its CAI is still good)
            pointer_type = None
        if pointer_type is not None and _LITTLE_HOST:
            return (P_CUPY, pointer_type)
        return (P_CAI, None)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return (P_DLPACK, None)
    if cai is not None:
        return (P_CAI_ANY, cai)
    for name in _VIEW_FIELDS:
        if not hasattr(obj, name):
            return (P_NONE, None)
    return (P_VIEW, None)


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
    if (<tuple>entry)[0] <= P_CUPY:  # read in C: kept
        lock_with_gil(_protocols_mu)
        try:
            record = _record(t, <tuple>entry)
            _protocols[t] = record
        finally:
            _protocols_mu.unlock()
        recent_store(<PyObject*>record)
    return <tuple>entry


cdef void _forget(t) noexcept:
    """A kept type whose array no longer speaks its protocol: decided again at its next array."""
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
    return _current_entry(type(obj)) is not None


def protocol_of(obj):
    """The name of the protocol a dispatch reads ``obj`` through ("none": no device array)."""
    return _PROTOCOL_NAMES[(<tuple>_protocol(obj))[0]]


cdef DevView _cai_kept(obj, int device, own, Who w):
    """The interface of a type kept as a v3 one: when its array's is not, the type changed since
    it was kept, so it is forgotten and the array read as it is classified now."""
    cai = cai_of(obj)
    if is_v3(cai):
        return from_cai(obj, cai, device, own, w)
    _forget(type(obj))
    return _read(obj, _classify(obj, type(obj)), device, own, None, w, False)


cdef CupyStream _cupy_memo_from_cai(obj):
    """The stream ``obj``'s CAI names, or None when not v3 with a usable stream (from_cai says why)."""
    cai = cai_of(obj)
    if not is_v3(cai):
        return None
    stream = (<dict>cai).get("stream")
    if stream is not None and (type(stream) is not int or stream <= 0):
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


cdef DevView _from_cupy(obj, pointer_type, int device, own, CupyStream memo, Who w):
    """A CuPy array from its fields, with ``memo``'s stream (read here for the first one); its
    interface reads (and words the refusal of) anything the fields do not settle."""
    cdef Py_ssize_t size
    cdef cnp.dtype dt
    cdef char kind
    if memo is None:
        memo = _cupy_memo(obj)
        if memo is None:
            return _cai_kept(obj, device, own, w)
    data = obj.data
    if type(data) is not pointer_type:
        return _cai_kept(obj, device, own, w)
    check_device(w, data.device_id, device)
    size = obj.size
    dtype = obj.dtype
    if (size and not obj._c_contiguous) or not cnp.PyArray_DescrCheck(dtype):
        return _cai_kept(obj, device, own, w)
    dt = <cnp.dtype>dtype
    kind = dt.kind
    if kind == b'b':
        kind = b'u'
    elif dt.byteorder == b'>' or (kind != b'i' and kind != b'u' and kind != b'f'):
        return _cai_kept(obj, device, own, w)  # void and the rest: as the CAI's typestr says
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = <cydriver.CUdeviceptr><uintptr_t>data.ptr if size else 0
    v.itemsize = <int>dt.itemsize
    v.nbytes = <size_t>size * v.itemsize
    v.read_only = False  # CuPy exports every array writable
    stream = memo.stream
    v.wait = None if stream is None else waited(<unsigned long long>stream, own)
    v.keep = obj
    v.kind_code = kind
    v.described = dt
    v.memo = memo
    return v


cdef DevView _read(obj, tuple entry, int device, own, CupyStream memo, Who w, bint kept):
    cdef int code = entry[0]
    cdef DevView v
    if code == P_DEVARRAY:
        v = from_devarray(<DeviceArray>obj, device, w)
        v.memo = memo  # C only: nothing that could change CuPy's current stream ran
    elif code == P_EXCHANGE:
        v = from_exchange(obj, entry[1], device, own, w)
        if v is not None and not v.by_python:
            v.memo = memo
    elif code == P_CUPY and kept:
        v = _from_cupy(obj, entry[1], device, own, memo, w)
    elif code == P_CAI or code == P_CUPY:
        v = _cai_kept(obj, device, own, w) if kept else from_cai(obj, cai_of(obj), device, own, w)
    elif code == P_DLPACK:
        v = from_dlpack(obj, device, own, w)
    elif code == P_CAI_ANY:
        v = from_cai(obj, entry[1], device, own, w)
        v.by_python = True
    elif code == P_VIEW:
        v = from_view(obj, device, w)
    else:
        v = None
    return v


cdef DevView read_device(obj, int device, own, CupyStream memo, Who w):
    """``obj`` as a :class:`DevView`, or None when it is no device array; a refusal raises.
    ``own``: the caller's stream handle or None; ``memo``: the previous view's (None once a
    producer's Python may have run); ``w``: the array as the dispatch names it in a refusal."""
    return _read(obj, _protocol(obj), device, own, memo, w, True)


# -- Python's doors: the cold paths of the core, planning, tests

def device_view(obj, int device=0, stream=None, DevView after=None):
    """``obj`` as the dispatch reads it (tests and diagnostics): a :class:`DevView`, or None for no
    device array. ``after``: the view read before it in the same dispatch."""
    return read_device(obj, device, stream, None if after is None else after.memo, who(None, 0, False))


def host_view(obj):
    """A CPU DLPack tensor (torch's CPU tensors export no buffer) as numpy, without a copy; else None."""
    if isinstance(obj, np.ndarray) or not (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")):
        return None
    try:
        return np.from_dlpack(obj) if int(obj.__dlpack_device__()[0]) == KDL_CPU else None
    except (BufferError, TypeError, ValueError, RuntimeError):
        return None  # not something numpy can view: the host path's own error applies


def device_input(program, Py_ssize_t i, obj, int device, stream):
    """Input ``i`` of ``program`` as a :class:`DevView` of its declared element type, a CPU DLPack
    tensor's numpy view, or None when ``obj`` is no device array."""
    cdef Who w = who(program, i, False)
    if isinstance(obj, np.ndarray):
        return None  # host memory that the buffer protocol refused (datetime64, objects...)
    cdef DevView v = read_device(obj, device, stream, None, w)
    if v is None:
        return host_view(obj)
    decls = getattr(program, "inputs", ())
    if i >= len(decls):
        return v  # an extra input is refused by planning, as for host buffers
    want = decls[i].dtype
    if v.itemsize != 1 and (v.itemsize != want.itemsize or v.kind != want.kind):
        raise ValidationError(
            f"{what(w)} holds {element_name(v)} but the buffer is declared {want.name}",
            f"convert it on the device, e.g. x.astype('{want.numpy.name}'), or pass a uint8 view to "
            "reinterpret its bytes deliberately",
        )
    return v


def device_output(plan, Py_ssize_t k, obj, int device, stream):
    """Output ``k`` of ``plan`` as a :class:`DevView` after ``dispatch_into``'s checks (dtype,
    writable, exact size), or None when ``obj`` is no device array."""
    cdef Who w = who(plan, k, True)
    if requires_grad(obj):
        raise grad_error(w)
    if isinstance(obj, np.ndarray):
        return None
    cdef DevView v = read_device(obj, device, stream, None, w)
    if v is None:
        return None  # (a CPU tensor: the host checks apply)
    want, _ = plan.output_specs[k]
    need = plan.layout.outputs[k][1]
    if v.itemsize != want.itemsize or v.kind_code != np_kind(want):
        raise ValidationError(
            f"{what(w)} holds {element_name(v)} but the buffer is {want}",
            f"pass a device array of dtype {want.name} ({need // want.itemsize} elements)",
        )
    if v.read_only:
        raise ValidationError(f"{what(w)} is a read-only device array", "pass a writable device array")
    if v.nbytes != need:
        raise ValidationError(
            f"{what(w)} holds {v.nbytes} bytes; the dispatch reads back {need}",
            f"pass an output of exactly {need} bytes ({need // want.itemsize} {want.name} elements)",
        )
    return v
