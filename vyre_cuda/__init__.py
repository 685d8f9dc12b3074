"""vyre_cuda: run CUDA kernel programs on borrowed host buffers, at the driver's floor.

>>> import numpy as np, vyre_cuda as vc
>>> prog = vc.builtin_programs.vecadd_f32()
>>> with vc.CudaBackend() as backend:                          # doctest: +SKIP
...     (out,) = backend.dispatch(prog, [np.ones(4, np.float32), np.ones(4, np.float32)])

Importing never needs a GPU: the driver is resolved at the first backend use, and
:func:`plan` plans a dispatch for a named device (``"H200"``, ``"A100"``, ...) with none at all.
The types of inputs and outputs, for annotating code that calls vyre_cuda, are in
:mod:`vyre_cuda.typing`.
"""

from typing import TYPE_CHECKING, Any

# The compiled module every use of the package needs (driver init and the error check).
_COMPILED_PROBE = "_driver"


def _require_compiled_core() -> None:
    from importlib.machinery import PathFinder  # noqa: PLC0415 (used once, here)

    # A source folder whose Cython modules were never built imports fine and then fails at the
    # first plan or backend with a bare "No module named vyre_cuda._accounting": say so here, once.
    # One spec look-up in this package's own folder (a listing the import system caches), not
    # through sys.meta_path: an editable install's finder would answer from another folder. An
    # installed wheel always has the module.
    if PathFinder.find_spec(f"{__name__}.{_COMPILED_PROBE}", __path__) is None:
        folders = ", ".join(__path__)
        raise ImportError(
            f"vyre_cuda is imported from {folders}, a source folder whose compiled modules are not "
            f"built for this Python (no vyre_cuda.{_COMPILED_PROBE} extension there), so it cannot run.\n"
            "Fix: install it (pip install .) and run Python from another folder, or build it in place "
            "with `python setup.py build_ext --inplace` (or `pip install -e .`)",
            name=f"{__name__}.{_COMPILED_PROBE}",
            path=folders,
        )


_require_compiled_core()
del _require_compiled_core

from .config import DispatchConfig  # noqa: E402 (after the check: a clear error before any other)
from .errors import (  # noqa: E402
    BackendError,
    CooperativeResidencyExceeded,
    DeviceLost,
    DeviceOutOfMemory,
    DispatchFailed,
    DriverUnavailable,
    InvalidProgram,
    KernelCompileFailed,
    UnsupportedFeature,
    ValidationError,
)
from .program import BindingRole, BufferAccess, BufferDecl, DType, Kernel, LaunchSizeWarning, Program  # noqa: E402

if TYPE_CHECKING:
    # the lazy names below, typed for checkers; at run time __getattr__ imports each at first use
    from . import builtin_programs, tracing, tuning
    from ._devarray import DeviceArray
    from ._device import driver_status, reset_device
    from ._hostreg import registered_stats, set_registered_budget
    from ._waits import PendingDispatch
    from .backend import CudaBackend
    from .config import AutoRegister
    from .group import DeviceGroup
    from .hostmem import is_page_locked, pinned_empty, pinned_like, pinned_zeros
    from .offline import ArraySpec, plan
    from .planning.caps import DeviceCaps
    from .telemetry import TimedDispatchResult

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ArraySpec",
    "AutoRegister",
    "BackendError",
    "BindingRole",
    "BufferAccess",
    "BufferDecl",
    "CooperativeResidencyExceeded",
    "CudaBackend",
    "DType",
    "DeviceArray",
    "DeviceCaps",
    "DeviceGroup",
    "DeviceLost",
    "DeviceOutOfMemory",
    "DispatchConfig",
    "DispatchFailed",
    "DriverUnavailable",
    "InvalidProgram",
    "Kernel",
    "KernelCompileFailed",
    "LaunchSizeWarning",
    "PendingDispatch",
    "Program",
    "TimedDispatchResult",
    "UnsupportedFeature",
    "ValidationError",
    "builtin_programs",
    "driver_status",
    "is_page_locked",
    "pinned_empty",
    "pinned_like",
    "pinned_zeros",
    "plan",
    "registered_stats",
    "reset_device",
    "set_registered_budget",
    "tracing",
    "tuning",
]

# The backend pulls in the compiled core; load it on first use so `import vyre_cuda` stays
# light and works even where the extension's driver cannot be found.
_LAZY = {
    "CudaBackend": ("backend", "CudaBackend"),
    "DeviceArray": ("_devarray", "DeviceArray"),
    "DeviceGroup": ("group", "DeviceGroup"),
    "TimedDispatchResult": ("telemetry", "TimedDispatchResult"),
    "PendingDispatch": ("_waits", "PendingDispatch"),
    "driver_status": ("_device", "driver_status"),
    "reset_device": ("_device", "reset_device"),
    "builtin_programs": ("builtin_programs", None),
    "tracing": ("tracing", None),
    "tuning": ("tuning", None),
    "pinned_empty": ("hostmem", "pinned_empty"),
    "pinned_zeros": ("hostmem", "pinned_zeros"),
    "pinned_like": ("hostmem", "pinned_like"),
    "is_page_locked": ("hostmem", "is_page_locked"),
    "plan": ("offline", "plan"),
    "ArraySpec": ("offline", "ArraySpec"),
    "DeviceCaps": ("planning.caps", "DeviceCaps"),
    "AutoRegister": ("config", "AutoRegister"),
    "registered_stats": ("_hostreg", "registered_stats"),
    "set_registered_budget": ("_hostreg", "set_registered_budget"),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'vyre_cuda' has no attribute {name!r}") from None
    import importlib  # noqa: PLC0415 (only a lazy name's first use pays for it)

    module = importlib.import_module(f".{module_name}", __name__)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
