"""The vyre_cuda error hierarchy.

Every error a caller can cause is a :class:`BackendError` subclass whose message states what was
wrong, with the numbers involved, and ends with a ``Fix: ...`` line telling the caller what to do.
"""

from __future__ import annotations

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
]


class BackendError(Exception):
    """Base class of every error vyre_cuda raises on purpose.

    ``message`` says what went wrong; ``fix`` says what to do and becomes the final
    ``Fix: ...`` line of ``str(error)``.
    """

    def __init__(self, message: str, fix: str):
        self.message = message
        self.fix = fix
        super().__init__(f"{message}\nFix: {fix}")

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.fix, dict(self.__dict__)))


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


# Explanations for the CUresults a user is likely to meet; the name is always shown too.
_CU_EXPLANATIONS = {
    "CUDA_ERROR_INVALID_VALUE": "a driver call received an argument outside its valid range",
    "CUDA_ERROR_OUT_OF_MEMORY": "the device could not allocate the requested memory",
    "CUDA_ERROR_NOT_INITIALIZED": "the CUDA driver has not been initialised",
    "CUDA_ERROR_DEINITIALIZED": "the CUDA driver is shutting down",
    "CUDA_ERROR_NO_DEVICE": "no CUDA-capable device was found",
    "CUDA_ERROR_INVALID_DEVICE": "the device ordinal does not name a CUDA device",
    "CUDA_ERROR_INVALID_IMAGE": "the module image (PTX or cubin) is not valid for this device",
    "CUDA_ERROR_INVALID_PTX": "the driver's PTX JIT compiler rejected the PTX",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": "the PTX was produced by a toolkit newer than this driver",
    "CUDA_ERROR_NO_BINARY_FOR_GPU": "the module holds no code for this GPU's architecture",
    "CUDA_ERROR_NOT_FOUND": "a named symbol (kernel entry or global) is not in the module",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "a kernel accessed memory outside any allocation; the context is lost",
    "CUDA_ERROR_LAUNCH_FAILED": "a kernel faulted while running; the context is lost",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION": "a kernel executed an illegal instruction; the context is lost",
    "CUDA_ERROR_MISALIGNED_ADDRESS": "a kernel accessed misaligned memory; the context is lost",
    "CUDA_ERROR_HARDWARE_STACK_ERROR": "a kernel overflowed its call stack; the context is lost",
    "CUDA_ERROR_ASSERT": "a kernel's device-side assert (or __trap) fired; the context is lost",
    "CUDA_ERROR_LAUNCH_TIMEOUT": "a kernel ran longer than the watchdog allows",
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": "the launch needs more registers or shared memory than a block can have",
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE": "the cooperative grid is larger than the device can keep resident",
    "CUDA_ERROR_NOT_SUPPORTED": "the device or driver does not support this operation",
    "CUDA_ERROR_INVALID_CONTEXT": "no valid CUDA context is current",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED": "the CUDA context was destroyed",
    "CUDA_ERROR_INVALID_HANDLE": "a stream, event, module or function handle is invalid",
}

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


def cu_explanation(status: str) -> str:
    """Human explanation of a CUresult name, or a generic line for unlisted codes."""
    return _CU_EXPLANATIONS.get(status, "see the CUDA driver API documentation for this result")


def driver_error(status: str, call: str, code: int = 0, detail: str = "") -> DispatchFailed:
    """Build the typed error for a failed driver call (``status`` is the CUresult name)."""
    where = f" ({detail})" if detail else ""
    message = f"{status}: {cu_explanation(status)}; raised by {call}{where}"
    if status == "CUDA_ERROR_OUT_OF_MEMORY":
        return DeviceOutOfMemory(
            message,
            "free device memory (other processes, CudaBackend.trim()), or split the dispatch "
            "into bounded chunks",
            status=status, call=call, code=code,
        )
    if status in STICKY_ERRORS:
        return DeviceLost(
            message,
            "the CUDA context is unusable for this process; close this backend, call "
            "vyre_cuda.reset_device(device) and create a new CudaBackend (or restart the process); "
            "if a kernel faulted, fix its indexing (run it under compute-sanitizer to find the access)",
            status=status, call=call, code=code,
        )
    return DispatchFailed(
        message,
        "check the arguments of the failing call; if the error persists, run with "
        "VYRE_CUDA_TRACE=1 and report the log",
        status=status, call=call, code=code,
    )
