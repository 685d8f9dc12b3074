"""Why the driver refused a compiled kernel, and what to do about it."""

from __future__ import annotations

from ..errors import cu_explanation

__all__ = ["explain_load_failure"]


def _version_text(version) -> str:
    if version is None:
        return "unknown"
    if isinstance(version, int):
        return f"{version // 1000}.{version % 1000 // 10}"
    return ".".join(str(v) for v in version)


def explain_load_failure(status: str, kernel_kind: str, nvrtc_version, driver_version):
    """``(message, fix)`` for ``KernelCompileFailed``: why the driver refused a compiled kernel.

    ``status`` is the CUresult name ``cuModuleLoadData`` returned, ``kernel_kind`` the
    ``CompiledKernel.kind``, ``nvrtc_version`` the ``(major, minor)`` that produced the image (None
    for PTX given by the user) and ``driver_version`` the ``cuDriverGetVersion`` value (13000 for 13.0).

    >>> msg, fix = explain_load_failure("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "ptx", (13, 3), 13000)
    >>> fix.split(", or ")[0]
    "install nvidia-cuda-nvrtc matching your driver: pip install 'nvidia-cuda-nvrtc==13.0.*'"
    """
    driver = _version_text(driver_version)
    compiler = "none (PTX given)" if nvrtc_version is None else _version_text(nvrtc_version)
    message = (
        f"{status}: {cu_explanation(status)}; the driver could not load the {kernel_kind} "
        f"kernel (driver supports CUDA {driver}, NVRTC {compiler})"
    )
    driver_major = driver_version // 1000 if isinstance(driver_version, int) else None
    update = "update the NVIDIA driver"
    if nvrtc_version is not None:
        update += f" to one supporting CUDA {compiler}"
    match = update  # cuda-bindings 13 only loads NVRTC 13, so an older driver major means a driver update
    if nvrtc_version is not None and driver_major == nvrtc_version[0]:
        match = (
            f"install nvidia-cuda-nvrtc matching your driver: pip install 'nvidia-cuda-nvrtc=={driver}.*', or {update}"
        )
    if status in ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_INVALID_PTX"):
        ptx_given = f"regenerate the PTX with a toolkit no newer than CUDA {driver} (or lower its `.version` directive)"
        fix = match if nvrtc_version is not None else f"{ptx_given}, or {update}"
    elif status == "CUDA_ERROR_NO_BINARY_FOR_GPU":
        fix = (
            "compile for this GPU's architecture (pass arch=the device's compute capability to "
            "compile_kernel); for Kernel.ptx, lower its `.target` to the device's sm_XY; "
            f"if the architecture is newer than NVRTC {compiler}, {match}"
        )
    elif status == "CUDA_ERROR_INVALID_IMAGE":
        fix = (
            "clear the kernel cache (vyre_cuda.compile.clear_cache() or `vyre-cuda cache "
            f"clear`) and retry; if it persists, {match}"
        )
    else:
        fix = f"check the kernel's compile options and target; if it persists, {match}"
    return message, fix
