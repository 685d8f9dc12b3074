"""Device arrays as dispatch inputs and outputs: the DLPack and CUDA Array Interface protocols,
and every check on them, as typed errors with a Fix. Only objects refusing the buffer protocol
come here; a device array gives a :class:`DeviceView`.

``__dlpack__`` goes first when an object has both (CuPy, torch): its ``stream`` argument makes the
producer order its pending work before ours, which torch needs (its CAI is v2 and names no
stream). CAI v3 objects (numba, others) name a stream that is waited on through an event unless
it is the dispatch's own. A CPU DLPack tensor is viewed as numpy (no copy) and takes the host path.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ._dtypes import byte_order_error, is_little_endian
from ._validate import is_int
from .errors import ValidationError

__all__ = ["DeviceView", "device_input", "device_output", "is_device_array", "dlpack_stream"]

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
CU_MEMORYTYPE_HOST = 1
LEGACY_STREAM = 1  # CU_STREAM_LEGACY: what DLPack's stream=1 (and CAI's stream=1) mean
_DL_KINDS = {0: "i", 1: "u", 2: "f", 4: "u", 6: "u"}  # bfloat16 (4) and bool (6) travel as raw bits
_DL_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


class DeviceView(NamedTuple):
    ptr: int
    nbytes: int
    readonly: bool
    wait: int | None  # a CUstream handle the dispatch stream must wait on first, or None
    keep: object  # held until the dispatch completes (the array, its DLPack capsule)
    kind: str  # "f", "i", "u" ("" when the protocol gave a type vyre_cuda cannot check)
    itemsize: int
    described: object  # the element type as the user knows it (formatted only in messages)


class _Lazy:
    """Error-message text made only when formatted (the checks run on the device-array hot path)."""

    __slots__ = ("_make",)

    def __init__(self, make):
        self._make = make

    def __format__(self, spec) -> str:
        return format(self._make(), spec)

    def __str__(self) -> str:
        return str(self._make())

    __repr__ = __str__


_DeviceArray = None


def _devarray_type():
    global _DeviceArray
    if _DeviceArray is None:
        from ._devarray import DeviceArray  # noqa: PLC0415 (compiled; loaded only for device arrays)

        _DeviceArray = DeviceArray
    return _DeviceArray


def is_device_array(obj) -> bool:
    """Whether ``obj`` speaks a device-array protocol (cheap attribute tests, no calls)."""
    return hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack_device__")


def dlpack_stream(stream):
    """``(stream for __dlpack__, stream to wait on after)``: the caller's stream (0, the legacy
    default, is spelled 1 in DLPack), else the legacy default, which our stream then waits on."""
    if stream is None:
        return LEGACY_STREAM, LEGACY_STREAM
    return (stream or LEGACY_STREAM), None


def _name(decls, i):
    return repr(decls[i].name) if i < len(decls) else "(extra)"


def _contiguous(shape, strides, itemsize) -> bool:
    if strides is None or 0 in shape:
        return True
    expected = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def _from_devarray(obj):
    dtype = obj.dtype
    return DeviceView(obj.ptr, obj.nbytes, False, None, obj, dtype.kind, dtype.itemsize, dtype)


def _from_dlpack(obj, what, device, stream):
    from ._devarray import dlpack_info  # noqa: PLC0415 (compiled; loaded only for device arrays)

    dev_type, dev_id = (int(v) for v in obj.__dlpack_device__())
    if dev_type == KDL_CPU:
        try:
            return np.from_dlpack(obj)  # host memory: the host path takes it
        except (BufferError, TypeError, ValueError, RuntimeError):
            return None  # not something numpy can view: the host path's own error applies
    if dev_type not in (KDL_CUDA, KDL_CUDA_MANAGED, KDL_CUDA_HOST):
        raise ValidationError(
            f"{what} is a DLPack tensor on device type {dev_type} (not CUDA); vyre_cuda runs on CUDA devices",
            "copy it to a CUDA device (or to host memory) before dispatch",
        )
    if dev_type != KDL_CUDA_HOST:  # page-locked host memory is reachable from any device
        _check_ordinal(what, dev_id, device)
    arg, wait = dlpack_stream(stream)
    try:
        try:
            capsule = obj.__dlpack__(stream=arg)
        except TypeError:  # a producer predating the stream keyword: its data is taken as ready
            capsule, wait = obj.__dlpack__(), None
    except (BufferError, RuntimeError, ValueError, TypeError) as exc:
        raise ValidationError(
            f"{what} could not be exported through DLPack ({type(exc).__name__}: {exc})",
            "pass a plain, C-contiguous device array (torch: x.detach().contiguous())",
        ) from None
    ptr, shape, strides, (code, bits, lanes), _, readonly = dlpack_info(capsule)
    # (DLPack has no byte-order field: a tensor is in the device's own order, little-endian on CUDA)
    itemsize = max(bits // 8, 1) * lanes
    elements_strides = None if strides is None else tuple(s * itemsize for s in strides)
    _check_contiguous(what, shape, elements_strides, itemsize)
    kind = _DL_KINDS.get(code, "") if lanes == 1 else ""
    described = _Lazy(lambda: f"{_DL_NAMES.get(code, f'type code {code}')}{bits}" + (f"x{lanes}" if lanes != 1 else ""))
    return DeviceView(ptr, math.prod(shape) * itemsize, readonly, wait, (obj, capsule),
                      kind, itemsize, described)  # fmt: skip


def _from_cai(obj, cai, what, device, stream, output=False):
    from ._devarray import pointer_device  # noqa: PLC0415

    try:
        shape = tuple(int(x) for x in cai["shape"])
        ptr, readonly = cai["data"]
        dtype = np.dtype(cai["typestr"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValidationError(
            f"{what} has a malformed __cuda_array_interface__ ({exc!r})",
            "pass an array whose __cuda_array_interface__ follows version 3 (shape, typestr, data)",
        ) from None
    if not is_little_endian(dtype):  # (the typestr says how the device memory is laid out)
        raise byte_order_error(what, f"typestr {cai['typestr']!r}", output)
    if cai.get("mask") is not None:
        raise ValidationError(f"{what} is a masked device array", "pass an unmasked array (fill the masked values)")
    strides = cai.get("strides")
    _check_contiguous(what, shape, None if strides is None else tuple(strides), dtype.itemsize)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes:
        memtype, ordinal = pointer_device(int(ptr))
        if memtype == 0:
            raise ValidationError(
                f"{what}'s __cuda_array_interface__ pointer 0x{int(ptr):x} is not memory the CUDA driver knows",
                "pass a device array (CuPy, torch, numba) or a host buffer (numpy) instead",
            )
        if memtype != CU_MEMORYTYPE_HOST:  # page-locked host memory is reachable from any device
            _check_ordinal(what, ordinal, device)
    wait = cai.get("stream") if cai.get("version", 0) >= 3 else None
    if wait is not None:
        if not is_int(wait, numpy=False) or wait == 0:
            raise ValidationError(
                f"{what}'s __cuda_array_interface__ names stream {wait!r}; version 3 forbids 0 and needs an int",
                "fix the producer's interface: None (no sync needed), 1 (legacy default), 2 (per-thread) or a handle",
            )
        if wait == stream:
            wait = None  # the same stream orders it already
    return DeviceView(int(ptr), nbytes, bool(readonly), wait, obj, _kind(dtype), dtype.itemsize, dtype)


def _kind(dtype) -> str:
    return {"b": "u", "V": "u"}.get(dtype.kind, dtype.kind) if dtype.kind in "biufV" else ""


def _check_contiguous(what, shape, strides, itemsize):
    if not _contiguous(shape, strides, itemsize):
        raise ValidationError(
            f"{what} is a strided device array (shape {shape}, strides {strides} bytes, {itemsize}-byte items)",
            "pass a C-contiguous array: cupy.ascontiguousarray(x), or x.contiguous() in torch",
        )


def _check_ordinal(what, got, device):
    if got != device:
        raise ValidationError(
            f"{what} lives on CUDA device {got}, but this backend runs on device {device}",
            f"copy it to device {device} first (cupy: with cupy.cuda.Device({device}): cupy.asarray(x); torch: "
            f"x.to('cuda:{device}')), or dispatch on CudaBackend({got})",
        )


def _view(obj, what, device, stream, output=False):
    if isinstance(obj, np.ndarray):
        return None  # host memory that the buffer protocol refused (datetime64, objects...)
    if type(obj) is _devarray_type():
        _check_ordinal(what, obj.device, device)
        return _from_devarray(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, what, device, stream)
    try:
        cai = obj.__cuda_array_interface__
    except Exception:  # noqa: BLE001 (torch raises RuntimeError on a CPU tensor: not a device array)
        cai = None
    if cai is not None:
        return _from_cai(obj, cai, what, device, stream, output)
    if all(hasattr(obj, a) for a in ("ptr", "shape", "dtype", "device_id", "is_device_accessible")):
        return _from_strided_view(obj, what, device, output)
    return None


def _from_strided_view(view, what, device, output=False):
    # cuda.core's StridedMemoryView: already ordered (made with our stream); strides in elements
    dtype = np.dtype(view.dtype)
    shape = tuple(int(x) for x in view.shape)
    if not view.is_device_accessible or view.device_id < 0:
        return None  # host memory: its exporting object takes the host path, or is refused there
    _check_ordinal(what, int(view.device_id), device)
    if not is_little_endian(dtype):
        raise byte_order_error(what, f"dtype {dtype.str!r}", output)
    strides = None if view.strides is None else tuple(int(x) * dtype.itemsize for x in view.strides)
    _check_contiguous(what, shape, strides, dtype.itemsize)
    nbytes = math.prod(shape) * dtype.itemsize
    readonly = bool(getattr(view, "readonly", False))
    return DeviceView(int(view.ptr), nbytes, readonly, None, view, _kind(dtype), dtype.itemsize, dtype)


def device_input(program, i, obj, device, stream):
    """A device input's checked :class:`DeviceView`, a numpy view of a CPU DLPack tensor, or None
    when ``obj`` speaks no device protocol."""
    decls = getattr(program, "inputs", ())
    what = _Lazy(lambda: f"input {i} ({_name(decls, i)})")
    view = _view(obj, what, device, stream)
    if view is None or isinstance(view, np.ndarray) or i >= len(decls):
        return view  # an extra input is refused by planning, as for host buffers
    decl = decls[i]
    want_size, want_kind = decl.dtype.itemsize, decl.dtype.kind
    if view.itemsize != 1 and (view.itemsize != want_size or view.kind != want_kind):
        raise ValidationError(
            f"{what} holds {view.described} but the buffer is declared {decl.dtype.name}",
            f"convert it on the device, e.g. x.astype('{decl.dtype.numpy.name}'), or pass a uint8 view to "
            "reinterpret its bytes deliberately",
        )
    return view


def device_output(plan, k, obj, device, stream):
    """A device output's :class:`DeviceView` after ``dispatch_into``'s checks, or None when ``obj``
    speaks no device protocol."""
    slot = plan.bindings.outputs[k]
    want, _ = plan.output_specs[k]
    need = plan.layout.outputs[k][1]
    what = _Lazy(lambda: f"output {k} ({slot.decl.name!r})")
    if getattr(obj, "requires_grad", False) is True:
        raise ValidationError(
            f"{what} is a tensor that requires grad: written in place by a kernel, autograd's gradients "
            "would be wrong (torch refuses an in-place write into it too)",
            "pass out.detach() (the same memory, outside autograd), or compute it with a torch op",
        )
    view = _view(obj, what, device, stream, output=True)
    if view is None or isinstance(view, np.ndarray):
        return None  # (a CPU tensor: the host checks apply to its numpy view)
    want_kind = {"b": "u", "V": "u"}.get(want.kind, want.kind)
    if view.itemsize != want.itemsize or view.kind != want_kind:
        raise ValidationError(
            f"{what} holds {view.described} but the buffer is {want}",
            f"pass a device array of dtype {want.name} ({need // want.itemsize} elements)",
        )
    if view.readonly:
        raise ValidationError(f"{what} is a read-only device array", "pass a writable device array")
    if view.nbytes != need:
        raise ValidationError(
            f"{what} holds {view.nbytes} bytes; the dispatch reads back {need}",
            f"pass an output of exactly {need} bytes ({need // want.itemsize} {want.name} elements)",
        )
    return view
