"""What a profile run and a pattern run share: the backend a run owns, the compiled floor and its
kernel, and the run's metadata (device, driver, versions) stored with the report."""

from __future__ import annotations

import os
import pathlib
import platform
import re

import numpy as np

from ..errors import UnsupportedFeature, ValidationError

__all__ = ["FLOOR_LABEL", "import_floor", "load_floor_kernel", "meta", "open_backend"]

FLOOR_LABEL = "vecadd(a, b, out, n) C loop, 256 threads per block"


def open_backend(device: int, backend_options=None):
    """A CudaBackend on ``device`` made with ``backend_options`` for a run that owns it; options
    this vyre_cuda's CudaBackend does not take are a ValidationError."""
    import vyre_cuda  # (lazily: the package does not import the profile)

    try:
        return vyre_cuda.CudaBackend(device, **(backend_options or {}))
    except TypeError as exc:
        raise ValidationError(
            f"this vyre_cuda's CudaBackend does not take the options {sorted(backend_options or {})} ({exc})",
            "drop those options, or use a vyre_cuda whose CudaBackend has them",
        ) from None


def import_floor():
    """The compiled floor (``vyre_cuda.profile._floor``), or UnsupportedFeature with a Fix."""
    try:
        from . import _floor
    except ImportError as exc:
        raise UnsupportedFeature(
            f"the driver floor extension vyre_cuda.profile._floor is not built ({exc})",
            "build the extensions (python setup.py build_ext --inplace, or pip install .)",
        ) from None
    return _floor


def load_floor_kernel(backend):
    """The floor's vecadd compiled for ``backend``'s device and loaded into its context:
    ``(FloorKernel, image)``."""
    from ..compile import compile_kernel
    from ..program import Kernel

    floor = import_floor()
    compiled = compile_kernel(Kernel.cuda(floor.FLOOR_SOURCE, entry=floor.FLOOR_ENTRY), arch=tuple(backend.caps.cc))
    kernel = floor.FloorKernel(backend.context_handle, compiled.image, floor.FLOOR_ENTRY)
    return kernel, compiled.image


def _driver_release():
    try:
        text = pathlib.Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
    return m.group(1) if m else None


def meta(backend, settings, started):
    from .. import __version__

    caps = backend.caps
    try:
        import cuda.bindings as cb

        cb_version = getattr(cb, "__version__", None)
    except ImportError:
        cb_version = None
    return {
        "date": started.isoformat(timespec="seconds"),
        "device": int(backend.device),
        "device_name": str(getattr(caps, "name", "?")),
        "cc": [int(v) for v in caps.cc],
        "driver_version": getattr(caps, "driver_version", None),
        "driver_release": _driver_release(),
        "vyre_cuda_version": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cuda_bindings": cb_version,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "floor": FLOOR_LABEL,
        **settings,
    }
