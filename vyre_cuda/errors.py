"""The vyre_cuda error hierarchy.

Every error a caller can cause is a :class:`BackendError` subclass whose message states what was
wrong, with the numbers involved, and ends with a ``Fix: ...`` line telling the caller what to do.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import pickle
from typing import Any

__all__ = [
    "BackendError",
    "InvalidProgram",
    "UnsupportedFeature",
    "CooperativeResidencyExceeded",
    "KernelCompileFailed",
    "DispatchFailed",
    "DeviceOutOfMemory",
    "DeviceLost",
    "ValidationError",
    "DriverUnavailable",
    "cu_explanation",
    "cu_status_name",
    "driver_error",
]


class BackendError(Exception):
    """Base class of every error vyre_cuda raises on purpose.

    ``message`` says what went wrong; ``fix`` says what to do and becomes the final
    ``Fix: ...`` line of ``str(error)``.
    """

    # where they apply: a DeviceGroup failure's device and item, a timed-out dispatch's handle
    device: int | None = None
    item: int | None = None
    pending: Any = None

    def __init__(self, message: str, fix: str):
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\nFix: {fix}")

    def __reduce__(self):
        # to another process (Dask, multiprocessing): every attribute that pickles, never
        # ``pending`` (this process's GPU work), so the caller still gets this type
        return (_rebuild, (type(self), self.message, self.fix, _portable(self.__dict__)))

    def __copy__(self):
        return _rebuild(type(self), self.message, self.fix, dict(self.__dict__))

    def __deepcopy__(self, memo):
        obj = memo[id(self)] = _rebuild(type(self), self.message, self.fix, {})
        for name, value in self.__dict__.items():
            # the pending handle (and anything not copyable) stays shared: it owns GPU work
            if name not in _LOCAL:
                with contextlib.suppress(Exception):  # (not copyable: share it)
                    value = copy.deepcopy(value, memo)
            obj.__dict__[name] = value
        return obj


# attributes that mean something only in the process that raised the error
_LOCAL = frozenset({"pending"})


def _portable(state: dict) -> dict:
    kept = {}
    for name, value in state.items():
        if name in _LOCAL:
            continue
        try:
            pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 (any failure to pickle means: leave it behind)
            continue
        kept[name] = value
    return kept


def _rebuild(cls, message, fix, state):
    obj = cls.__new__(cls)
    BackendError.__init__(obj, message, fix)
    obj.__dict__.update(state)
    return obj


class InvalidProgram(BackendError):
    """The program, its buffers or its sizes cannot be dispatched as declared."""


class ValidationError(BackendError):
    """An argument passed to a dispatch call (inputs, outputs, config) is not acceptable."""


class UnsupportedFeature(BackendError):
    """The program needs something this device or this backend does not offer."""


class CooperativeResidencyExceeded(BackendError):
    """A cooperative launch asks for more blocks than can be co-resident on the device."""

    def __init__(self, message: str, fix: str, grid_blocks: int = 0, resident_limit: int = 0):
        super().__init__(message, fix)
        self.grid_blocks = grid_blocks
        self.resident_limit = resident_limit


class KernelCompileFailed(BackendError):
    """NVRTC rejected the CUDA source, or the driver could not load the module.

    ``log`` holds the full compiler (or JIT) log.
    """

    def __init__(self, message: str, fix: str, log: str = ""):
        super().__init__(message, fix)
        self.log = log


class DispatchFailed(BackendError):
    """A CUDA driver call failed. ``status`` is the CUresult name, ``call`` the driver call."""

    def __init__(self, message: str, fix: str, status: str = "", call: str = "", code: int = 0):
        super().__init__(message, fix)
        self.status = status
        self.call = call
        self.code = code


class DeviceOutOfMemory(DispatchFailed):
    """The device (or pinned host memory) cannot hold what the dispatch needs."""


class DeviceLost(DispatchFailed):
    """The CUDA context is unusable (a kernel faulted, or the device went away)."""


class DriverUnavailable(BackendError):
    """No CUDA driver or no CUDA device could be found. Raised at first use, never at import."""


# The Fix of a DriverUnavailable when no driver can be used at all (core and commands alike).
NO_DRIVER_FIX = (
    "run on a machine with an NVIDIA GPU and its driver installed (nvidia-smi lists a device, "
    "libcuda.so.1 is on the loader path); vyre_cuda imports, compiles and plans without one, but "
    "cannot dispatch"
)


# Only when the driver library cannot be loaded (no GPU, CI); else the driver's cuGetErrorString.
_FALLBACK_EXPLANATIONS = {
    "CUDA_ERROR_INVALID_VALUE": "invalid argument",
    "CUDA_ERROR_OUT_OF_MEMORY": "out of memory",
    "CUDA_ERROR_NOT_INITIALIZED": "the CUDA driver has not been initialised",
    "CUDA_ERROR_NO_DEVICE": "no CUDA-capable device is detected",
    "CUDA_ERROR_INVALID_DEVICE": "invalid device ordinal",
    "CUDA_ERROR_INVALID_PTX": "the driver's PTX JIT compiler rejected the PTX",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the PTX was produced by a toolkit newer than this driver",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "no kernel image is available for execution on the device",
    "CUDA_ERROR_NOT_FOUND": "named symbol not found",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "an illegal memory access was encountered",
    "CUDA_ERROR_LAUNCH_FAILED": "unspecified launch failure",
    "CUDA_ERROR_ASSERT": "device-side assert triggered",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "too many resources requested for launch",
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE": "too many blocks in cooperative launch",
    "CUDA_ERROR_NOT_SUPPORTED": "operation not supported",
}
_GENERIC = "see the CUDA driver API documentation for this result"


# CUresults after which the context cannot be used again (sticky errors).
STICKY_ERRORS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
    }
)


@functools.cache
def _driver_text(status: str) -> str | None:
    """The driver's cuGetErrorString for a CUresult name; None when the driver cannot say."""
    try:
        from cuda.bindings import driver  # noqa: PLC0415 (resolved at first use, never at import)

        result = getattr(driver.CUresult, status)
        err, text = driver.cuGetErrorString(result)
    except (ImportError, AttributeError, RuntimeError):  # no cuda-bindings, unknown name, no libcuda
        return None
    if err != driver.CUresult.CUDA_SUCCESS or not text:
        return None
    return text.decode(errors="replace")


def cu_explanation(status: str) -> str:
    """The explanation of a CUresult name, in the driver's words when the driver can be loaded.

    Examples
    --------
    >>> cu_explanation("CUDA_ERROR_NOT_A_RESULT")
    'see the CUDA driver API documentation for this result'
    """
    return _driver_text(status) or _FALLBACK_EXPLANATIONS.get(status, _GENERIC)


def cu_status_name(code: int) -> str:
    """The CUresult name of a status code: the driver's cuGetErrorName, else cuda-bindings' enum.

    Examples
    --------
    >>> cu_status_name(2)
    'CUDA_ERROR_OUT_OF_MEMORY'
    >>> cu_status_name(123456)
    'CUresult(123456)'
    """
    try:
        from cuda.bindings import driver  # noqa: PLC0415 (resolved at first use, never at import)

        result = driver.CUresult(code)
    except (ImportError, ValueError):
        return f"CUresult({code})"
    try:
        err, name = driver.cuGetErrorName(result)
        if err == driver.CUresult.CUDA_SUCCESS and name:
            return name.decode(errors="replace")
    except RuntimeError:  # libcuda.so.1 cannot be loaded
        pass
    return result.name


def driver_error(status: str, call: str, code: int = 0, detail: str = "") -> DispatchFailed:
    """Build the typed error for a failed driver call.

    ``status`` is the CUresult name; when only the number is known (an empty or ``CUresult(N)``
    status), ``code`` names it. The message is ``"<name>: <the driver's explanation>; raised by
    <call>"``; the ``Fix`` line is vyre_cuda's advice for that kind of failure.
    """
    if code and not status.startswith("CUDA_"):
        status = cu_status_name(code)
    where = f" ({detail})" if detail else ""
    message = f"{status}: {cu_explanation(status)}; raised by {call}{where}"
    cls: type[DispatchFailed]
    if status == "CUDA_ERROR_OUT_OF_MEMORY":
        cls = DeviceOutOfMemory
        fix = "free device memory (other processes, CudaBackend.trim()), or split the dispatch into bounded chunks"
    elif status in STICKY_ERRORS:
        cls = DeviceLost
        fix = (
            "the CUDA context is unusable for this process; close this backend, call "
            "vyre_cuda.reset_device(device) and create a new CudaBackend (or restart the process); "
            "if a kernel faulted, fix its indexing (run it under compute-sanitizer to find the access)"
        )
    else:
        cls = DispatchFailed
        fix = (
            "check the arguments of the failing call; if the error persists, run with VYRE_CUDA_TRACE=1 "
            "and report the log"
        )
    return cls(message, fix, status=status, call=call, code=code)
