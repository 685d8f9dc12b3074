# cython: language_level=3
"""Device memory that outlives a dispatch: :class:`DeviceArray` and the DLPack capsules it exports.

A ``DeviceArray`` (what ``outputs="device"`` returns) is a 1-D C-contiguous device array that
CuPy, torch, numba and cuda.core wrap without a copy (CAI v3 or DLPack). Its memory comes from the
device's array pool (``_array_pool.ArrayPool``), which holds the primary context for the process's
life, so it outlives the backend. DLPack structures: _dlpack.h (dlpack.h v1.x ABI; the versioned
capsule goes to consumers passing ``max_version >= (1, 0)``).
"""

from cpython.pycapsule cimport (PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer)
from cpython.ref cimport Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uintptr_t
from libc.stdlib cimport malloc, free

import threading

import numpy as np
from cuda.bindings cimport cydriver

from ._driver cimport check_cu
from ._windows cimport locked_run
from ._array_pool cimport ArrayPool, array_block_size
from ._dlpack cimport DLDataType, DLTensor, DLManagedTensor, DLManagedTensorVersioned, KDL_CUDA

from .errors import ValidationError

__all__ = ["DeviceArray", "array_pool_stats", "trim_array_pool", "forget_array_pool"]

DLPACK_MAJOR = 1
DLPACK_MINOR = 0


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


# Device memory cached for new DeviceArrays per device, beyond which a dropped array's memory is
# freed at once (see ArrayPool: a dropped block is reused only after a context synchronize).
ARRAY_POOL_CACHE_BYTES = 256 << 20

_array_pools = {}  # device ordinal -> ArrayPool, for the life of the process
_array_pools_lock = threading.Lock()


def _new_array_pool(int device):
    cdef cydriver.CUdevice dev
    cdef cydriver.CUcontext ctx
    with _array_pools_lock:
        pool = _array_pools.get(device)
        if pool is None:
            with nogil:
                check_cu(cydriver.cuDeviceGet(&dev, device), b"cuDeviceGet")
                # kept for the life of the process: arrays outlive the backends that made them
                check_cu(cydriver.cuDevicePrimaryCtxRetain(&ctx, dev), b"cuDevicePrimaryCtxRetain")
            pool = ArrayPool(ARRAY_POOL_CACHE_BYTES, <uintptr_t>ctx, device)
            _array_pools[device] = pool
    return pool


def _block_size(size_t nbytes):
    """The pool block an array of ``nbytes`` bytes takes (tests)."""
    return array_block_size(nbytes)


def array_pool_stats(int device=0):
    """The counters of ``device``'s DeviceArray pool (zeros before its first array)."""
    pool = _array_pools.get(device)
    if pool is None:
        return dict(hits=0, misses=0, alloc_calls=0, cached_bytes=0, live_bytes=0, allocated_bytes=0,
                    quarantined_bytes=0, quarantined_blocks=0, flushes=0, refused_flushes=0)
    return pool.stats()


def forget_array_pool(int device):
    """Before ``device``'s primary context is reset: its pool's blocks die with the context, so
    the pool is dropped (no driver call) and the next array starts a new one."""
    with _array_pools_lock:
        pool = _array_pools.pop(device, None)
    if pool is not None:
        pool.forget_context()


def trim_array_pool(int device=0):
    """Free the cached memory of ``device``'s DeviceArray pool (after a context synchronize)."""
    pool = _array_pools.get(device)
    if pool is not None:
        pool.trim()


cdef cydriver.CUresult _copy_out(uintptr_t host, cydriver.CUdeviceptr src, size_t nbytes) noexcept nogil:
    """cuMemcpyDtoH cut where page-locked memory ends under the destination (_windows.locked_run):
    the driver refuses a copy that starts in a pinned or registered range and runs past its end,
    and a fresh array can start in the last page of a registered heap neighbour."""
    cdef size_t piece
    cdef cydriver.CUresult st
    while nbytes:
        piece = locked_run(<const void*>host, nbytes)
        st = cydriver.cuMemcpyDtoH(<void*>host, src, piece)
        if st != cydriver.CUDA_SUCCESS:
            return st
        host += piece
        src += piece
        nbytes -= piece
    return cydriver.CUDA_SUCCESS


def _check_host_out(DeviceArray x, out):
    if not isinstance(out, np.ndarray):
        raise ValidationError(
            f"copy_to_host(out=...) got a {type(out).__name__}, not a numpy array",
            f"pass out=np.empty({x.size}, np.{x.dtype.name}), or call copy_to_host() for a new array",
        )
    if out.dtype != x.dtype or out.size != x.size:
        raise ValidationError(
            f"copy_to_host(out=...) got {out.size} x {out.dtype}, the DeviceArray holds {x.size} x {x.dtype}",
            f"pass out=np.empty({x.size}, np.{x.dtype.name})",
        )
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValidationError(
            f"copy_to_host(out=...) needs a writable C-contiguous array of {x.size} x {x.dtype}; this "
            f"one has c_contiguous={out.flags.c_contiguous}, writeable={out.flags.writeable}",
            "pass np.ascontiguousarray(...) of a writable array, or call copy_to_host() for a new array",
        )


cdef class DeviceArray:
    """A 1-D C-contiguous array in device memory, owned by vyre_cuda.

    Made by a dispatch with ``DispatchConfig(outputs="device")``. Zero-copy views:
    ``cupy.asarray(x)``, ``torch.from_dlpack(x)``, ``numba.cuda.as_cuda_array(x)``; host copy:
    ``x.copy_to_host()`` (or ``x.numpy()``). Its contents are complete when it is handed out, so
    consumers need no stream synchronisation (``__cuda_array_interface__["stream"]`` is None).
    When it dies, its memory goes back to the device's array pool, which reuses it only after a
    context synchronize (work a consumer queued before the drop is done by then);
    ``CudaBackend.trim()`` frees what the pool caches.
    """

    def __init__(self):
        raise TypeError("DeviceArray is made by a dispatch with DispatchConfig(outputs='device')")

    @staticmethod
    def _empty(Py_ssize_t count, dtype, int device, bint may_wait=True):
        """Allocate ``count`` elements of ``dtype`` on ``device`` (contents undefined), from the
        device's array pool. ``may_wait=False`` where the caller must not wait for the device: the
        pool then allocates rather than synchronize to reuse dropped memory."""
        cdef DeviceArray self = DeviceArray.__new__(DeviceArray)
        cdef ArrayPool pool = _array_pools.get(device)
        cdef uintptr_t p = 0
        cdef size_t nbytes, block
        if pool is None:
            pool = _new_array_pool(device)
        dtype = np.dtype(dtype)
        nbytes = <size_t>count * dtype.itemsize
        block = array_block_size(nbytes)
        pool.take(block, may_wait, &p)
        self.pool = pool  # from here on __dealloc__ gives the block back
        self.block = block
        self.ctx = pool.ctx
        self.device = device
        self.ptr = p
        self.nbytes = nbytes
        self.dtype = dtype
        self.size = count
        # what a dispatch's input check compares, without a Python attribute per dispatch
        self.kind = ord({"b": "u", "V": "u"}.get(dtype.kind, dtype.kind)) if dtype.kind in "biufV" else 0
        self.itemsize = dtype.itemsize
        return self

    def __dealloc__(self):
        if self.pool is not None:
            self.pool.give_back(self.ptr, self.block)

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

    def copy_to_host(self, out=None):
        """A new numpy array holding this array's contents; or ``out``, a writable C-contiguous
        numpy array of the same size and dtype, filled with them and returned."""
        cdef cydriver.CUcontext prev
        cdef cydriver.CUresult st
        if out is None:
            out = np.empty(self.size, dtype=self.dtype)
        else:
            _check_host_out(self, out)
        cdef uintptr_t host = out.ctypes.data
        if self.nbytes:
            with nogil:
                check_cu(cydriver.cuCtxPushCurrent(self.ctx), b"cuCtxPushCurrent")
                st = _copy_out(host, <cydriver.CUdeviceptr>self.ptr, self.nbytes)
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
