"""Headers a kernel compiles against: vyre_cuda's own, and the CUDA headers found at runtime.

NVRTC ships no headers. ``cuda_fp16.h`` and the rest of the runtime headers come from the
``nvidia-cuda-runtime`` wheel (or a CUDA toolkit), ``<cuda/std/...>`` and ``<nv/target>`` from
``nvidia-cuda-cccl``; ``cuda.pathfinder`` finds them wherever they are installed. A header that is
still missing is named in the compile error together with the package that provides it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import re
import sys

__all__ = [
    "include_dir",
    "cuda_include_dirs",
    "header_digest",
    "headers_fingerprint",
    "needs_cuda_headers",
    "missing_header",
    "missing_header_fix",
]

# cuda.pathfinder library names whose include folders kernels may need, in search order.
_PATHFINDER_LIBS = ("cudart", "cccl")

# Headers of the CUDA runtime wheel that kernels include (the rest is reached through these).
_RUNTIME_HEADERS = frozenset(
    [
        "builtin_types.h",
        "channel_descriptor.h",
        "cooperative_groups.h",
        "cuComplex.h",
        "cuda_awbarrier.h",
        "cuda_awbarrier_primitives.h",
        "cuda_bf16.h",
        "cuda_bf16.hpp",
        "cuda_device_runtime_api.h",
        "cuda_fp16.h",
        "cuda_fp16.hpp",
        "cuda_fp4.h",
        "cuda_fp4.hpp",
        "cuda_fp6.h",
        "cuda_fp6.hpp",
        "cuda_fp8.h",
        "cuda_fp8.hpp",
        "cuda_occupancy.h",
        "cuda_pipeline.h",
        "cuda_pipeline_primitives.h",
        "cuda_runtime.h",
        "cuda_runtime_api.h",
        "cuda_tf32.h",
        "device_atomic_functions.h",
        "device_functions.h",
        "device_launch_parameters.h",
        "device_types.h",
        "driver_types.h",
        "host_defines.h",
        "library_types.h",
        "math_constants.h",
        "math_functions.h",
        "mma.h",
        "sm_20_atomic_functions.h",
        "sm_20_intrinsics.h",
        "sm_30_intrinsics.h",
        "sm_32_atomic_functions.h",
        "sm_32_intrinsics.h",
        "sm_35_atomic_functions.h",
        "sm_35_intrinsics.h",
        "sm_60_atomic_functions.h",
        "sm_61_intrinsics.h",
        "surface_types.h",
        "texture_types.h",
        "vector_functions.h",
        "vector_types.h",
    ]
)
_STD_HEADERS = frozenset(
    [
        "assert.h",
        "float.h",
        "limits.h",
        "math.h",
        "stddef.h",
        "stdint.h",
        "stdio.h",
        "stdlib.h",
        "string.h",
        "algorithm",
        "array",
        "atomic",
        "cassert",
        "cfloat",
        "climits",
        "cmath",
        "cstddef",
        "cstdint",
        "cstdio",
        "cstdlib",
        "cstring",
        "functional",
        "iostream",
        "limits",
        "memory",
        "tuple",
        "type_traits",
        "utility",
        "vector",
    ]
)
# Where these appear, a compile may read a header outside vyre_cuda's own folder. ``include``
# covers ``#include``, ``# include``, ``%:include``, ``__has_include`` and the include options;
# backslash-newlines are spliced first, since NVRTC splices them before it reads directives.
_OWN_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"vyre_cuda\.cuh"[ \t]*$', re.MULTILINE)
_HEADER_OPTIONS = (
    "-I",
    "-include",
    "-isystem",
    "--include-path",
    "--pre-include",
    "-pch",
    "--pch",
    "--create-pch",
    "--use-pch",
)
_MISSING = re.compile(r'(?:could not|cannot) open source file "([^"]+)"')


@functools.lru_cache(maxsize=1)
def include_dir() -> str:
    """Absolute path of the folder holding ``vyre_cuda.cuh``, on NVRTC's include path.

    Examples
    --------
    >>> import os
    >>> os.path.isfile(os.path.join(include_dir(), "vyre_cuda.cuh"))
    True
    """
    return str(pathlib.Path(__file__).resolve().parent.parent / "include")


@functools.lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple:
    """Folders holding the CUDA headers kernels include (cuda_fp16.h, cuda/std/..., ...).

    Found by ``cuda.pathfinder`` (NVIDIA wheels, conda, ``CUDA_PATH``/``CUDA_HOME``, system
    toolkits), once per process; empty when none is installed. NVRTC itself ships no headers.

    Examples
    --------
    >>> all(os.path.isdir(d) for d in cuda_include_dirs())
    True
    """
    found = []
    try:
        from cuda import pathfinder  # noqa: PLC0415 (cold path: the first CUDA compile)

        for lib in _PATHFINDER_LIBS:
            try:
                folder = pathfinder.find_nvidia_header_directory(lib)
            except (RuntimeError, OSError):  # an unknown name in an older pathfinder
                folder = None
            if folder and os.path.isdir(folder) and folder not in found:
                found.append(os.path.abspath(folder))
    except (ImportError, AttributeError):
        found = list(_search_without_pathfinder())
    return tuple(found)


def _search_without_pathfinder():
    # the layout cuda.pathfinder knows, for an environment without it
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    candidates = [os.path.join(r, "include") for r in roots if r]
    candidates += [os.path.join(p, "nvidia", "cu13", "include") for p in sys.path if p]
    candidates.append("/usr/local/cuda/include")
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "cuda_fp16.h")):
            yield os.path.abspath(folder)
            return


def needs_cuda_headers(kernel) -> bool:
    """Whether compiling ``kernel`` may read a header other than vyre_cuda's own.

    Only then are the CUDA include folders searched for and made part of the compile and of its
    disk cache key. A source whose only include is ``#include "vyre_cuda.cuh"`` (which includes
    nothing) and whose options name no header cannot read any other file, so the search (a
    subprocess where no header wheel is installed) stays off its first dispatch. The test is on
    the text: any other ``include`` in the source, in a comment too, counts as a need.

    Examples
    --------
    >>> from vyre_cuda import Kernel
    >>> needs_cuda_headers(Kernel.cuda('#include "vyre_cuda.cuh"\\nVYRE_KERNEL vyre_main() {}'))
    False
    >>> needs_cuda_headers(Kernel.cuda('#include <cuda_fp16.h>\\nVYRE_KERNEL vyre_main() {}'))
    True
    """
    if any(opt.startswith(_HEADER_OPTIONS) for opt in kernel.options):
        return True
    source = kernel.source.replace("\\\r\n", "").replace("\\\n", "")
    return "include" in _OWN_INCLUDE.sub("", source)


@functools.lru_cache(maxsize=1)
def header_digest() -> str:
    """SHA-256 over the files of :func:`include_dir` (they cannot change within a process)."""
    h = hashlib.sha256()
    for path in sorted(pathlib.Path(include_dir()).iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def headers_fingerprint() -> tuple:
    """``(folder, size, mtime)`` of a sentinel header in each CUDA include folder.

    Part of the disk cache key: upgrading the wheel that provides cuda_fp16.h in place keeps its
    folder but changes these, so no kernel compiled against the old headers is reused.
    """
    marks = []
    for folder in cuda_include_dirs():
        for sentinel in ("cuda_runtime_api.h", "cuda/std/version", "cuda_fp16.h"):
            path = os.path.join(folder, sentinel)
            try:
                st = os.stat(path)
            except OSError:
                continue
            marks.append((folder, sentinel, st.st_size, st.st_mtime_ns))
            break
        else:
            marks.append((folder, "", 0, 0))
    return tuple(marks)


def missing_header(log: str) -> str | None:
    """The first header NVRTC could not open, from its log, or None.

    Examples
    --------
    >>> missing_header('k.cu(1): catastrophic error: cannot open source file "cuda_fp16.h"')
    'cuda_fp16.h'
    """
    match = _MISSING.search(log)
    return match.group(1) if match else None


def missing_header_fix(header: str, nvrtc_major: int | None) -> str:
    """The Fix line for a header NVRTC could not open: which package provides it.

    Examples
    --------
    >>> missing_header_fix("cuda_fp16.h", 13).split(" (")[0]
    "pip install 'nvidia-cuda-runtime==13.*'"
    """
    series = f"=={nvrtc_major}.*" if nvrtc_major else ""
    name = header.replace("\\", "/")
    top = name.split("/", 1)[0]

    def package(wheel, extra):
        return (
            f"pip install '{wheel}{series}' (it provides {name}; or cuda-toolkit[{extra}]), or install a CUDA toolkit"
        )

    if name in _RUNTIME_HEADERS or name.startswith("cooperative_groups/"):
        return package("nvidia-cuda-runtime", "cudart")
    if top in ("cuda", "cub", "thrust", "nv") and "/" in name:
        return package("nvidia-cuda-cccl", "cccl")
    if top == "crt":
        return package("nvidia-cuda-crt", "crt")
    if name.startswith("curand"):
        return package("nvidia-curand", "curand")
    if name in _STD_HEADERS:
        return (
            f"NVRTC has no C/C++ standard library: include <cuda/std/{name.removesuffix('.h')}> "
            f"instead (pip install 'nvidia-cuda-cccl{series}'), or use vyre_u32/vyre_u64 from "
            "vyre_cuda.cuh"
        )
    return (
        f"add the folder holding {name} with Kernel.cuda(..., options=('--include-path=/path',)); "
        "the CUDA headers come from pip install 'nvidia-cuda-runtime' and 'nvidia-cuda-cccl'"
    )
