# cython: language_level=3
"""A device array's protocols, one reader each, and the view they make (:class:`DevView`):
``DeviceArray`` (its fields, cimported), DLPack (the C exchange API, else ``__dlpack__``), the CUDA
Array Interface, cuda.core's StridedMemoryView. :mod:`vyre_cuda._devview` picks the reader. Each
refuses what a dispatch cannot use with a typed error and its Fix, naming the array as the
dispatch knows it (``Who``), and returns None for host memory.

``__dlpack__`` is passed the caller's stream (0, the legacy default, spelled 1 in DLPack), else the
legacy default, which the dispatch's stream then waits on. A CAI v3 names the stream to wait on
(through an event, unless it is the dispatch's own); an older interface names none.
"""

cimport cython
from cpython.exc cimport PyErr_Clear
from cpython.pycapsule cimport PyCapsule_IsValid, PyCapsule_GetPointer
from libc.stdint cimport int64_t, uintptr_t
from cuda.bindings cimport cydriver

import math

import numpy as np

from ._dlpack cimport (
    DLTensor, DLManagedTensor, DLManagedTensorVersioned, DLPackExchangeAPI,
    KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED, DL_FLAG_READ_ONLY,
)
from ._devarray cimport DeviceArray
from ._dtypes import byte_order_error, is_little_endian
from .errors import ValidationError

__all__ = ["DevView"]

cdef unsigned int CU_MEMORYTYPE_HOST = 1
cdef Py_ssize_t TYPESTR_CACHE_MAX = 256
_DL_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


@cython.final
@cython.no_gc  # (a dispatch's own record: nothing it holds refers back to it)
cdef class DevView:
    """One device array as a dispatch uses it."""

    def __repr__(self):
        return (f"DevView(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, readonly={self.read_only}, "
                f"wait={self.wait!r}, kind={self.kind!r}, itemsize={self.itemsize})")

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


# -- refusals: cold, each a ValidationError naming the array as the dispatch knows it

cdef str what(Who w):
    # the array as the dispatch names it: "input 1 ('b')", "output 0 ('out')"
    where = <object>w.where
    if w.output:
        return f"output {w.index} ({where.bindings.outputs[w.index].decl.name!r})"
    decls = getattr(where, "inputs", ())
    return f"input {w.index} ({repr(decls[w.index].name) if w.index < len(decls) else '(extra)'})"


cdef int check_device(Who w, long long got, int device) except -1:
    if got != device:
        raise ValidationError(
            f"{what(w)} lives on CUDA device {got}, but this backend runs on device {device}",
            f"copy it to device {device} first (cupy: with cupy.cuda.Device({device}): cupy.asarray(x); torch: "
            f"x.to('cuda:{device}')), or dispatch on CudaBackend({got})",
        )
    return 0


cdef object _strided(Who w, tuple shape, strides, Py_ssize_t itemsize):
    return ValidationError(
        f"{what(w)} is a strided device array (shape {shape}, strides {strides} bytes, {itemsize}-byte items)",
        "pass a C-contiguous array: cupy.ascontiguousarray(x), or x.contiguous() in torch",
    )


cdef object _malformed(Who w, exc):
    return ValidationError(
        f"{what(w)} has a malformed __cuda_array_interface__ ({exc!r})",
        "pass an array whose __cuda_array_interface__ follows version 3 (shape, typestr, data)",
    )


cdef object _export_error(Who w, exc):
    return ValidationError(
        f"{what(w)} could not be exported through DLPack ({type(exc).__name__}: {exc})",
        "pass a plain, C-contiguous device array (torch: x.detach().contiguous())",
    )


cdef object grad_error(Who w):
    return ValidationError(
        f"{what(w)} is a tensor that requires grad: written in place by a kernel, autograd's gradients "
        "would be wrong (torch refuses an in-place write into it too)",
        "pass out.detach() (the same memory, outside autograd), or compute it with a torch op",
    )


cdef str element_name(DevView v):
    """The element type as the user knows it: a numpy dtype, or a DLPack type code."""
    if v.described is not None:
        return str(v.described)
    code, bits, lanes = v.dl_dtype & 0xFF, (v.dl_dtype >> 8) & 0xFF, v.dl_dtype >> 16
    return f"{_DL_NAMES.get(code, f'type code {code}')}{bits}" + (f"x{lanes}" if lanes != 1 else "")


cdef dict _typestrs = {}  # CAI typestr -> (kind, itemsize, dtype) of a little-endian (or byte) type


cdef object cai_of(obj):
    try:
        return obj.__cuda_array_interface__
    except Exception:  # noqa: BLE001 (torch raises on a CPU tensor: no interface)
        return None


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


cdef bint _contiguous(tuple shape, strides, Py_ssize_t itemsize) except -1:
    # a CAI's or a view's shape and strides (in bytes; None: C-contiguous)
    if strides is None or 0 in shape:
        return True
    if len(strides) != len(shape):
        return False
    expected = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


cdef inline char _dl_kind(unsigned char code) noexcept:
    if code == 0:
        return b'i'
    if code == 1 or code == 4 or code == 6:  # uint, bfloat16 and bool: raw bits
        return b'u'
    if code == 2:
        return b'f'
    return 0


cdef bint requires_grad(obj) except -1:
    try:
        return obj.requires_grad is True
    except AttributeError:
        return False


cdef DevView from_devarray(DeviceArray da, int device, Who w):
    check_device(w, da.device, device)
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = <cydriver.CUdeviceptr>da.ptr
    v.nbytes = da.nbytes
    v.read_only = False
    v.wait = None  # complete when handed out: no stream of its own
    v.keep = da
    v.kind_code = da.kind
    v.itemsize = da.itemsize
    v.described = da.dtype
    return v


cdef bint _dl_device(long long dev_type, long long dev_id, int device, Who w) except -1:
    """Whether a DLPack tensor is device memory this device reaches (False: host memory)."""
    if dev_type == KDL_CPU:
        return False
    if dev_type != KDL_CUDA and dev_type != KDL_CUDA_MANAGED and dev_type != KDL_CUDA_HOST:
        raise ValidationError(
            f"{what(w)} is a DLPack tensor on device type {dev_type} (not CUDA); vyre_cuda runs on CUDA devices",
            "copy it to a CUDA device (or to host memory) before dispatch",
        )
    if dev_type != KDL_CUDA_HOST:  # page-locked host memory is reachable from any device
        check_device(w, dev_id, device)
    return True


cdef DevView _from_dltensor(DLTensor* t, Who w):
    """A DLPack tensor's fields (its device already checked), C-contiguous or refused."""
    cdef Py_ssize_t count, k
    cdef Py_ssize_t itemsize = max(t.dtype.bits // 8, 1) * t.dtype.lanes
    if not _c_contiguous(t.ndim, t.shape, t.strides, &count):
        raise _strided(w, tuple([t.shape[k] for k in range(t.ndim)]),
                       None if t.strides == NULL else tuple([t.strides[k] * itemsize for k in range(t.ndim)]), itemsize)
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = <cydriver.CUdeviceptr>(<uintptr_t>t.data + t.byte_offset)
    v.itemsize = <int>itemsize
    v.nbytes = <size_t>count * itemsize
    v.kind_code = _dl_kind(t.dtype.code) if t.dtype.lanes == 1 else 0
    v.dl_dtype = t.dtype.code | (t.dtype.bits << 8) | (<unsigned int>t.dtype.lanes << 16)
    return v


cdef DevView from_exchange(obj, cap, int device, own, Who w):
    cdef DLPackExchangeAPI* api = <DLPackExchangeAPI*>PyCapsule_GetPointer(cap, b"dlpack_exchange_api")
    cdef DLManagedTensorVersioned* mt = NULL
    cdef void* stream = NULL
    if api.managed_tensor_from_py_object_no_sync(<void*>obj, &mt) != 0 or mt == NULL:
        PyErr_Clear()  # its __dlpack__ exports it again, and words a refusal
        return from_dlpack(obj, device, own, w)
    cdef _Held held = _Held.__new__(_Held)
    held.mt = mt  # from here on the producer's reference is given back whatever happens
    held.owner = obj
    if mt.version.major != 1:
        return from_dlpack(obj, device, own, w)
    if not _dl_device(mt.dl_tensor.device.device_type, mt.dl_tensor.device.device_id, device, w):
        return None  # a CPU tensor: host memory
    grad = requires_grad(obj)
    if grad and w.output:
        raise grad_error(w)
    if api.current_work_stream(KDL_CUDA, device, &stream) != 0:
        PyErr_Clear()
        return from_dlpack(obj, device, own, w)  # its __dlpack__(stream=...) orders it instead
    cdef DevView v = _from_dltensor(&mt.dl_tensor, w)
    # a requires_grad tensor is read-only (torch refuses such a write itself)
    v.read_only = (mt.flags & DL_FLAG_READ_ONLY) != 0 or grad
    # the producer's current stream (NULL: its legacy default stream) orders its pending writes
    v.wait = waited(<uintptr_t>stream if stream != NULL else LEGACY_STREAM, own)
    v.keep = held
    return v


cdef DevView from_dlpack(obj, int device, own, Who w):
    """``__dlpack__(stream=...)``: the producer orders its pending work before the stream passed."""
    cdef DLTensor* t
    cdef DLManagedTensorVersioned* mv
    dev_type, dev_id = [int(x) for x in obj.__dlpack_device__()]
    if not _dl_device(dev_type, dev_id, device, w):
        return None  # host memory: the host path takes it (host_view)
    if w.output and requires_grad(obj):
        raise grad_error(w)
    arg, wait = (LEGACY_STREAM, LEGACY_STREAM) if own is None else ((own or LEGACY_STREAM), None)
    try:
        try:
            capsule = obj.__dlpack__(stream=arg)
        except TypeError:  # a producer predating the stream keyword: its data is taken as ready
            capsule, wait = obj.__dlpack__(), None
    except (BufferError, RuntimeError, ValueError, TypeError) as exc:
        raise _export_error(w, exc) from None
    read_only = False
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        mv = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if mv.version.major > 1:
            newer = BufferError(f"DLPack version {mv.version.major}.{mv.version.minor} is newer than 1.x")
            raise _export_error(w, newer)
        t = &mv.dl_tensor
        read_only = (mv.flags & DL_FLAG_READ_ONLY) != 0
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        t = &(<DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    else:
        raise _export_error(w, BufferError("not a live DLPack capsule (already consumed, or not named dltensor)"))
    cdef DevView v = _from_dltensor(t, w)  # (the capsule, held in keep, owns the tensor)
    v.read_only = read_only
    v.wait = wait
    v.keep = (obj, capsule)
    v.by_python = True
    return v


cdef object _typestr_spec(ts):
    """(kind, itemsize, dtype) of a CAI typestr of a little-endian (or byte) type; else None."""
    spec = _typestrs.get(ts) if type(ts) is str else None
    if spec is not None or type(ts) is not str:
        return spec
    try:
        dt = np.dtype(ts)
    except (TypeError, ValueError):
        return None
    if not is_little_endian(dt):
        return None
    spec = (np_kind(dt), dt.itemsize, dt)
    if len(_typestrs) < TYPESTR_CACHE_MAX:
        _typestrs[ts] = spec
    return spec


cdef dict _normalized(cai, Who w):
    """Cold: a copy of ``cai`` with its shape, data and typestr converted (or the refusal)."""
    try:
        shape = tuple([int(x) for x in cai["shape"]])
        ptr, readonly = cai["data"]
        dtype = np.dtype(cai["typestr"])
        ptr = int(ptr)
        if ptr < 0 or min(shape, default=0) < 0:
            raise ValueError(f"a negative pointer or extent: data {cai['data']!r}, shape {shape}")
        normal = dict(cai)
    except (KeyError, TypeError, ValueError) as exc:
        raise _malformed(w, exc) from None
    if not is_little_endian(dtype):  # (the typestr says how the device memory is laid out)
        raise byte_order_error(what(w), f"typestr {cai['typestr']!r}", w.output)
    normal.update(shape=shape, data=(ptr, readonly), typestr=dtype.str)
    return normal


cdef unsigned int _pointer_kind(cydriver.CUdeviceptr ptr, int* ordinal) except? 0:
    # the driver's memory type of ptr (0: memory it does not know) and its device
    cdef cydriver.CUpointer_attribute attrs[2]
    cdef void* data[2]
    cdef unsigned int memtype = 0
    attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    data[0] = &memtype
    data[1] = ordinal
    with nogil:
        if cydriver.cuPointerGetAttributes(2, attrs, data, ptr) != cydriver.CUDA_SUCCESS:
            return 0
    return memtype


cdef DevView from_cai(obj, cai, int device, own, Who w):
    """A CUDA Array Interface mapping, of any version (a v3 one names its stream)."""
    cdef Py_ssize_t count = 1
    cdef int ordinal = -1
    cdef unsigned int memtype
    if type(cai) is not dict:
        return from_cai(obj, _normalized(cai, w), device, own, w)
    shape, data, spec = (<dict>cai).get("shape"), (<dict>cai).get("data"), _typestr_spec((<dict>cai).get("typestr"))
    if (spec is None or type(shape) is not tuple or type(data) is not tuple or len(<tuple>data) != 2
            or type((<tuple>data)[0]) is not int or (<tuple>data)[0] < 0):
        return from_cai(obj, _normalized(cai, w), device, own, w)  # (converted: read once more, as it is)
    for x in <tuple>shape:
        if type(x) is not int or x < 0:
            return from_cai(obj, _normalized(cai, w), device, own, w)
        count *= <Py_ssize_t>x
    if (<dict>cai).get("mask") is not None:
        raise ValidationError(f"{what(w)} is a masked device array", "pass an unmasked array (fill the masked values)")
    strides = (<dict>cai).get("strides")
    cdef Py_ssize_t itemsize = (<tuple>spec)[1]
    if strides is not None and type(strides) is not tuple:
        try:
            strides = tuple(strides)
        except TypeError as exc:
            raise _malformed(w, exc) from None
    if not _contiguous(<tuple>shape, strides, itemsize):
        raise _strided(w, <tuple>shape, strides, itemsize)
    ptr, readonly = <tuple>data
    cdef cydriver.CUdeviceptr p = <cydriver.CUdeviceptr><unsigned long long>ptr
    if count:
        memtype = _pointer_kind(p, &ordinal)
        if memtype == 0:
            raise ValidationError(
                f"{what(w)}'s __cuda_array_interface__ pointer 0x{ptr:x} is not memory the CUDA driver knows",
                "pass a device array (CuPy, torch, numba) or a host buffer (numpy) instead",
            )
        if memtype != CU_MEMORYTYPE_HOST:  # page-locked host memory is reachable from any device
            check_device(w, ordinal, device)
    stream = (<dict>cai).get("stream") if is_v3(cai) else None
    if stream is not None and (type(stream) is not int or stream <= 0):
        raise ValidationError(
            f"{what(w)}'s __cuda_array_interface__ names stream {stream!r}; version 3 forbids 0 and needs an int",
            "fix the producer's interface: None (no sync needed), 1 (legacy default), 2 (per-thread) or a handle",
        )
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = p
    v.nbytes = <size_t>count * itemsize
    v.read_only = bool(readonly)
    v.wait = None if stream is None else waited(<unsigned long long>stream, own)
    v.keep = obj
    v.kind_code = <char>(<tuple>spec)[0]
    v.itemsize = <int>itemsize
    v.described = (<tuple>spec)[2]
    return v


cdef DevView from_view(view, int device, Who w):
    """cuda.core's StridedMemoryView: already ordered (made with our stream); strides in elements."""
    dtype = np.dtype(view.dtype)
    shape = tuple([int(x) for x in view.shape])
    if not view.is_device_accessible or view.device_id < 0:
        return None  # host memory: its exporting object takes the host path, or is refused there
    check_device(w, int(view.device_id), device)
    if not is_little_endian(dtype):
        raise byte_order_error(what(w), f"dtype {dtype.str!r}", w.output)
    strides = None if view.strides is None else tuple([int(x) * dtype.itemsize for x in view.strides])
    if not _contiguous(shape, strides, dtype.itemsize):
        raise _strided(w, shape, strides, dtype.itemsize)
    cdef DevView v = DevView.__new__(DevView)
    v.ptr = <cydriver.CUdeviceptr><unsigned long long>int(view.ptr)
    v.itemsize = dtype.itemsize
    v.nbytes = <size_t>v.itemsize * math.prod(shape)
    v.read_only = bool(getattr(view, "readonly", False))
    v.wait = None
    v.keep = view
    v.kind_code = np_kind(dtype)
    v.described = dtype
    v.by_python = True
    return v
