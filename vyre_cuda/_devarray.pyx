# cython: language_level=3
"""Device memory that outlives a dispatch: :class:`DeviceArray`, DLPack capsules both ways, and
the pointer query behind the device checks of inputs and outputs.

A ``DeviceArray`` is what ``DispatchConfig(outputs="device")`` returns: a 1-D C-contiguous array
in device memory that CuPy, torch, numba and cuda.core wrap without a copy, through
``__cuda_array_interface__`` (v3) or ``__dlpack__`` / ``__dlpack_device__``. It holds a reference
on the device's primary context, so its memory stays valid after the backend is closed, and it
frees the memory when the last reference (its own, or a DLPack consumer's) goes away.

DLPack structures come from _dlpack.h (the ABI of dlpack.h v1.x, which is stable): the
legacy ``DLManagedTensor`` (capsule ``"dltensor"``) and the versioned ``DLManagedTensorVersioned``
(capsule ``"dltensor_versioned"``, given to consumers that pass ``max_version >= (1, 0)``).
"""

from cpython.pycapsule cimport (PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer)
from cpython.ref cimport Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport malloc, free

import numpy as np
from cuda.bindings cimport cydriver

from ._driver cimport check_cu
from ._dlpack cimport DLDataType, DLTensor, DLManagedTensor, DLManagedTensorVersioned

__all__ = ["DeviceArray", "pointer_device", "dlpack_info", "KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST",
           "KDL_CUDA_MANAGED"]

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13
DLPACK_MAJOR = 1
DLPACK_MINOR = 0
FLAG_READ_ONLY = 1


# one allocation per exported tensor: the managed tensor (either kind) plus its shape and strides
cdef struct Export:
    DLManagedTensor legacy
    DLManagedTensorVersioned versioned
    int64_t shape[1]
    int64_t strides[1]


cdef void _release_export(void* ctx, Export* e) noexcept with gil:
    Py_DECREF(<object>ctx)  # the DeviceArray the consumer held
    free(e)


cdef void _legacy_deleter(DLManagedTensor* t) noexcept with gil:
    _release_export(t.manager_ctx, <Export*>t)


cdef void _versioned_deleter(DLManagedTensorVersioned* t) noexcept with gil:
    # versioned is the second member: step back to the start of the Export
    cdef Export* e = <Export*>(<char*>t - <size_t>&(<Export*>0).versioned)
    _release_export(t.manager_ctx, e)


cdef void _legacy_capsule_destructor(object capsule) noexcept:
    # a capsule never consumed (still named "dltensor") owns its tensor
    cdef DLManagedTensor* t
    if PyCapsule_IsValid(capsule, b"dltensor"):
        t = <DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        if t != NULL and t.deleter != NULL:
            t.deleter(t)


cdef void _versioned_capsule_destructor(object capsule) noexcept:
    cdef DLManagedTensorVersioned* t
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        t = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if t != NULL and t.deleter != NULL:
            t.deleter(t)


cdef DLDataType _dl_dtype(dtype) except *:
    cdef DLDataType t
    codes = {"i": 0, "u": 1, "f": 2, "b": 6}
    if dtype.kind not in codes:
        raise BufferError(f"dtype {dtype} has no DLPack type code here")
    t.code = codes[dtype.kind]
    t.bits = dtype.itemsize * 8
    t.lanes = 1
    return t


def pointer_device(uintptr_t ptr):
    """(memory type, device ordinal) of a pointer as the driver knows it; memory type 0 for a
    pointer the driver does not know (pageable host memory). The driver must be initialised."""
    cdef cydriver.CUpointer_attribute attrs[2]
    cdef void* data[2]
    cdef unsigned int memtype = 0
    cdef int ordinal = -1
    cdef cydriver.CUresult st
    attrs[0] = cydriver.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    attrs[1] = cydriver.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    data[0] = &memtype
    data[1] = &ordinal
    with nogil:
        st = cydriver.cuPointerGetAttributes(2, attrs, data, <cydriver.CUdeviceptr>ptr)
    if st != cydriver.CUDA_SUCCESS:
        return 0, -1
    return int(memtype), int(ordinal)


def dlpack_info(capsule):
    """(data pointer, shape, strides in elements or None, (code, bits, lanes), (device type, id),
    read-only) of a DLPack capsule, legacy or versioned. The capsule is not consumed: whoever
    holds it keeps the tensor alive, and its destructor frees it."""
    cdef DLTensor* t
    cdef DLManagedTensorVersioned* v
    cdef bint readonly = False
    cdef int k
    if PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        v = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if v.version.major > DLPACK_MAJOR:
            raise BufferError(f"DLPack version {v.version.major}.{v.version.minor} is newer than 1.x")
        t = &v.dl_tensor
        readonly = (v.flags & FLAG_READ_ONLY) != 0
    elif PyCapsule_IsValid(capsule, b"dltensor"):
        t = &(<DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    else:
        raise BufferError("not a live DLPack capsule (already consumed, or not named dltensor)")
    shape = tuple(t.shape[k] for k in range(t.ndim))
    strides = None if t.strides == NULL else tuple(t.strides[k] for k in range(t.ndim))
    ptr = <uintptr_t>t.data + t.byte_offset
    return (ptr, shape, strides, (t.dtype.code, t.dtype.bits, t.dtype.lanes),
            (t.device.device_type, t.device.device_id), readonly)


cdef class DeviceArray:
    """A 1-D C-contiguous array in device memory, owned by vyre_cuda.

    Made by a dispatch with ``DispatchConfig(outputs="device")``. Zero-copy views:
    ``cupy.asarray(x)``, ``torch.from_dlpack(x)``, ``numba.cuda.as_cuda_array(x)``; host copy:
    ``x.copy_to_host()`` (or ``x.numpy()``). Its contents are complete when it is handed out, so
    consumers need no stream synchronisation (``__cuda_array_interface__["stream"]`` is None).
    """

    def __init__(self):
        raise TypeError("DeviceArray is made by a dispatch with DispatchConfig(outputs='device')")

    @staticmethod
    def _empty(Py_ssize_t count, dtype, int device):
        """Allocate ``count`` elements of ``dtype`` on ``device`` (contents undefined)."""
        cdef DeviceArray self = DeviceArray.__new__(DeviceArray)
        cdef cydriver.CUcontext ctx, prev
        cdef cydriver.CUdeviceptr p = 0
        cdef cydriver.CUdevice dev
        cdef cydriver.CUresult st
        cdef size_t nbytes
        dtype = np.dtype(dtype)
        nbytes = <size_t>count * dtype.itemsize
        with nogil:
            check_cu(cydriver.cuDeviceGet(&dev, device), b"cuDeviceGet")
            check_cu(cydriver.cuDevicePrimaryCtxRetain(&ctx, dev), b"cuDevicePrimaryCtxRetain")
        self.ctx = ctx
        self.device = device
        self.owns = True  # from here on __dealloc__ releases the context reference
        with nogil:
            check_cu(cydriver.cuCtxPushCurrent(ctx), b"cuCtxPushCurrent")
            # a zero-size array still gets a real (16-byte) allocation: consumers want a non-null pointer
            st = cydriver.cuMemAlloc(&p, nbytes if nbytes > 16 else 16)
            cydriver.cuCtxPopCurrent(&prev)
            check_cu(st, b"cuMemAlloc")
        self.ptr = <uintptr_t>p
        self.nbytes = nbytes
        self.dtype = dtype
        self.size = count
        # what a dispatch's input check compares, without a Python attribute per dispatch
        self.kind = ord({"b": "u", "V": "u"}.get(dtype.kind, dtype.kind)) if dtype.kind in "biufV" else 0
        self.itemsize = dtype.itemsize
        return self

    def __dealloc__(self):
        cdef cydriver.CUcontext prev
        cdef cydriver.CUdevice dev
        if not self.owns:
            return
        with nogil:
            if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                if self.ptr:
                    cydriver.cuMemFree(<cydriver.CUdeviceptr>self.ptr)
                cydriver.cuCtxPopCurrent(&prev)
            if cydriver.cuDeviceGet(&dev, self.device) == cydriver.CUDA_SUCCESS:
                cydriver.cuDevicePrimaryCtxRelease(dev)

    @property
    def shape(self):
        return (self.size,)

    @property
    def ndim(self):
        return 1

    @property
    def __cuda_array_interface__(self):
        # v3; stream None: the data is complete, a consumer needs no synchronisation
        return {
            "shape": (self.size,),
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def __dlpack_device__(self):
        return (KDL_CUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule viewing this memory. ``stream`` needs no wait (the data is complete);
        ``max_version >= (1, 0)`` gets a versioned capsule, else a legacy one."""
        cdef Export* e
        cdef DLTensor* t
        # any stream is fine: the contents are complete (no work of ours is pending on them)
        if stream is not None and not isinstance(stream, int):
            raise BufferError(f"stream must be None or an int CUDA stream (got {stream!r})")
        if dl_device is not None and tuple(dl_device) != (KDL_CUDA, self.device):
            raise BufferError(f"DeviceArray lives on CUDA device {self.device}; cannot export to {dl_device}")
        if copy:
            raise BufferError("DeviceArray exports without copies only (copy=True is not supported)")
        dl_type = _dl_dtype(self.dtype)
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        e = <Export*>malloc(sizeof(Export))
        if e == NULL:
            raise MemoryError()
        e.shape[0] = self.size
        e.strides[0] = 1
        t = &e.versioned.dl_tensor if versioned else &e.legacy.dl_tensor
        t.data = <void*>self.ptr
        t.device.device_type = KDL_CUDA
        t.device.device_id = self.device
        t.ndim = 1
        t.dtype = dl_type
        t.shape = e.shape
        t.strides = e.strides
        t.byte_offset = 0
        Py_INCREF(self)  # the consumer's reference, dropped by the deleter
        if versioned:
            e.versioned.version.major = DLPACK_MAJOR
            e.versioned.version.minor = DLPACK_MINOR
            e.versioned.manager_ctx = <void*>self
            e.versioned.deleter = _versioned_deleter
            e.versioned.flags = 0
            return PyCapsule_New(&e.versioned, b"dltensor_versioned", _versioned_capsule_destructor)
        e.legacy.manager_ctx = <void*>self
        e.legacy.deleter = _legacy_deleter
        return PyCapsule_New(&e.legacy, b"dltensor", _legacy_capsule_destructor)

    def copy_to_host(self):
        """A new numpy array holding this array's contents."""
        cdef cydriver.CUcontext prev
        cdef cydriver.CUresult st
        out = np.empty(self.size, dtype=self.dtype)
        cdef uintptr_t host = out.ctypes.data
        if self.nbytes:
            with nogil:
                check_cu(cydriver.cuCtxPushCurrent(self.ctx), b"cuCtxPushCurrent")
                st = cydriver.cuMemcpyDtoH(<void*>host, <cydriver.CUdeviceptr>self.ptr, self.nbytes)
                cydriver.cuCtxPopCurrent(&prev)
                check_cu(st, b"cuMemcpyDtoH")
        return out

    def numpy(self):
        """Same as :meth:`copy_to_host`."""
        return self.copy_to_host()

    def __len__(self):
        return self.size

    def __repr__(self):
        return f"DeviceArray(size={self.size}, dtype={self.dtype}, device={self.device}, ptr=0x{self.ptr:x})"
