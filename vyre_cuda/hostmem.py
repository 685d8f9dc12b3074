"""Page-locked host arrays, which the GPU DMAs directly (a dispatch skips the staging copy).

As ``cupyx.empty_pinned`` or torch's ``pin_memory()``. Page-locking costs about 0.5 ms per MiB, so
blocks come from a process-wide pool: a block returns to it once its array and every view are gone.

>>> import numpy as np, vyre_cuda as vc
>>> x = vc.pinned_empty((1024, 1024), np.float32)                # doctest: +SKIP
>>> x[:] = np.random.rand(1024, 1024)                              # doctest: +SKIP
>>> vc.is_page_locked(x)                                           # doctest: +SKIP
True
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _driver
from ._pools import PinnedPool, lend_pinned
from ._validate import is_int
from ._windows import buffer_span, is_page_locked_address
from .errors import ValidationError

__all__ = ["pinned_empty", "pinned_zeros", "pinned_like", "is_page_locked", "pinned_pool_stats", "trim_pinned_pool"]

# cached page-locked bytes kept for reuse after arrays die (beyond it, freed blocks are released)
POOL_CACHE_BYTES = 1 << 30

_STAT_KEYS = ("live_bytes", "cached_bytes", "allocated_bytes", "alloc_calls", "hits")
_pools: dict = {}
_lock = threading.Lock()


def _pool(device: int):
    with _lock:
        pool = _pools.get(device)
        if pool is None:
            _driver.init_driver()
            ctx = _driver.retain_primary_context(device)  # kept for the life of the process
            pool = PinnedPool(POOL_CACHE_BYTES, ctx)
            _pools[device] = pool
        return pool


def _forget_pinned_pool(device: int) -> None:
    """Before ``device``'s primary context is reset: its blocks die with the context, so the pool
    is dropped without a driver call; arrays still alive give their blocks back to nothing."""
    with _lock:
        pool = _pools.pop(device, None)
    if pool is not None:
        pool.forget_context()


def _shape_and_dtype(shape: Any, dtype: npt.DTypeLike) -> tuple[tuple[int, ...], np.dtype[Any]]:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ValidationError(f"dtype {dtype!r} is not a numpy dtype ({exc})", "pass e.g. numpy.float32") from None
    if dt.hasobject:
        raise ValidationError(
            f"dtype {dt} holds Python objects, which cannot live in page-locked memory", "use a numeric dtype"
        )
    if is_int(shape):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise ValidationError(
            f"shape must be an int or a tuple of ints (got {shape!r})", "pass e.g. (1024, 1024)"
        ) from None
    if any(s < 0 for s in shape):
        raise ValidationError(f"shape {shape} has a negative dimension", "pass non-negative dimensions")
    return shape, dt


def pinned_empty(shape: int | Sequence[int], dtype: npt.DTypeLike = np.float32, *, device: int = 0) -> npt.NDArray[Any]:
    """An uninitialised C-contiguous numpy array in page-locked host memory, allocated in
    ``device``'s context (the memory is portable: every device DMAs from it directly)."""
    dims, dt = _shape_and_dtype(shape, dtype)
    nbytes = math.prod(dims) * dt.itemsize
    block = lend_pinned(_pool(device), nbytes)
    # the array's base keeps the block alive (numpy's stubs do not know the block exports a buffer)
    return np.frombuffer(block, dtype=dt, count=math.prod(dims)).reshape(dims)  # type: ignore[call-overload]


def pinned_zeros(shape: int | Sequence[int], dtype: npt.DTypeLike = np.float32, *, device: int = 0) -> npt.NDArray[Any]:
    """A zero-filled numpy array in page-locked host memory."""
    out = pinned_empty(shape, dtype, device=device)
    out.fill(0)
    return out


def pinned_like(a: npt.ArrayLike, *, copy: bool = True, device: int = 0) -> npt.NDArray[Any]:
    """A page-locked array shaped like ``a``: a copy of its data (like torch's ``pin_memory()``),
    or uninitialised with ``copy=False`` (like ``numpy.empty_like``)."""
    src = np.asarray(a)
    out = pinned_empty(src.shape, src.dtype, device=device)
    if copy:
        np.copyto(out, src)
    return out


def is_page_locked(a: object) -> bool:
    """Whether all of ``a``'s bytes are page-locked memory the driver knows: from
    :func:`pinned_empty`, ``CudaBackend.register``, CuPy's or torch's pinned buffers."""
    try:
        address, nbytes = buffer_span(a, False)
    except (TypeError, ValueError, BufferError):
        return False
    _driver.init_driver()
    return bool(is_page_locked_address(address, nbytes))


def pinned_pool_stats(device: int = 0) -> dict[str, int]:
    """Bytes in use and cached by the page-locked array pool of ``device``."""
    pool = _pools.get(device)
    if pool is None:
        return dict.fromkeys(_STAT_KEYS, 0)
    s = pool.stats()  # (read together under the pool's lock)
    return {k: s[k] for k in _STAT_KEYS}


def trim_pinned_pool(device: int = 0) -> None:
    """Release the cached (unused) page-locked blocks of ``device``'s pool to the system."""
    pool = _pools.get(device)
    if pool is not None:
        pool.trim()
