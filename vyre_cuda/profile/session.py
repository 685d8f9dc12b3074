"""What a profile run and a pattern run share: the backend a run owns, the compiled floor and its
kernel, the run's metadata (device, driver, versions) stored with the report, and the stage clocks.

This is the profile's one door into the core's private parts (the stage clocks; the benchmarks'
per-backend knobs go through ``benchmarks/harness/hooks.py``): no other file of the profile
imports a private core module, so when the core's modules move only this file follows.
"""

from __future__ import annotations

import os
import pathlib
import platform
import re

import numpy as np

from ..errors import UnsupportedFeature, ValidationError

__all__ = ["import_floor", "load_floor_kernel", "meta", "open_backend", "profiled_dispatch", "stage_names"]

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


def stage_names() -> tuple[str, ...]:
    """The core's dispatch stages, in the order of the ``stage_ns`` that
    :func:`profiled_dispatch` returns (``plan_lookup``, ``staging_memcpy``, ...)."""
    from .. import _tracing

    return tuple(_tracing.STAGES)


def profiled_dispatch(backend):
    """``backend``'s dispatch with the stage clocks on: a callable
    ``(program, inputs, config=None, start_ns=0) -> (outputs, stage_ns)``, one nanosecond count
    per :func:`stage_names` entry, measured from ``start_ns`` (a ``time.perf_counter_ns()``
    taken by the caller just before the call). Bound once, so a timed loop pays no lookup."""
    return backend._dispatch_profiled


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
