"""The driver and a device as the process sees them, outside any CudaBackend: driver_status (is a
driver and device usable) and reset_device (the recovery after a kernel fault).

Both are public as ``vyre_cuda.driver_status`` / ``vyre_cuda.reset_device`` and, as before, from
``vyre_cuda.backend``; they live apart from the backend class because neither needs one.
"""

from __future__ import annotations

import sys

from . import _driver, _hostreg
from .errors import BackendError, DeviceLost

__all__ = ["driver_status", "reset_device"]


def driver_status() -> tuple[bool, str]:
    """(True, description) when a driver and device are usable, else (False, reason)."""
    try:
        _driver.init_driver()
        n = _driver.device_count()
        v = _driver.driver_version()
        return True, f"{n} device(s), driver CUDA {v // 1000}.{v % 1000 // 10}"
    except BackendError as exc:
        return False, exc.message


def reset_device(device: int = 0) -> None:
    """Destroy this process's primary context on ``device``, the recovery after a kernel fault.

    Every CudaBackend (and CuPy/PyTorch state) on that device becomes invalid, and so does the
    memory of its ``outputs="device"`` arrays and of page-locked arrays (:func:`pinned_empty`)
    made with it: close and drop them first, then create a new CudaBackend. Some faults (an
    illegal address, a trap) are kept by the NVIDIA driver for the life of the process; then this
    raises DeviceLost saying to restart the process.
    """
    # the array pools' cached memory dies with the context (a module never loaded made no array)
    devarray = sys.modules.get("vyre_cuda._devarray")
    if devarray is not None:
        devarray.forget_array_pool(device)
    hostmem = sys.modules.get("vyre_cuda.hostmem")
    if hostmem is not None:
        hostmem._forget_pinned_pool(device)
    _hostreg.REGISTRY.forget_device(device)  # (registrations die with the context)
    pools = sys.modules.get("vyre_cuda._pools")
    if pools is not None:
        pools.forget_parked_pools(device)  # closed backends' stream-ordered pools, kept for reuse
    try:
        _driver.reset_primary_context(device)
        # prove a fresh context can be made, so the caller learns now, not at the next dispatch
        _driver.retain_primary_context(device)
        _driver.release_primary_context(device)
    except DeviceLost as exc:
        raise DeviceLost(
            f"{exc.message}; the driver keeps this fault for the life of the process, so no new "
            "context can be made on the device",
            "restart the process (run work that may fault in a subprocess to keep the parent usable)",
            status=exc.status,
            call=exc.call,
            code=exc.code,
        ) from None
