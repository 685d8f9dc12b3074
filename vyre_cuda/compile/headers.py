"""Headers a kernel compiles against: vyre_cuda's own, and the CUDA headers found at runtime.

NVRTC ships no headers. ``cuda_fp16.h`` and the rest of the runtime headers come from the
``nvidia-cuda-runtime`` wheel (or a CUDA toolkit), ``<cuda/std/...>`` and ``<nv/target>`` from
``nvidia-cuda-cccl``; ``cuda.pathfinder`` finds them wherever they are installed. A header that is
still missing is named in the compile error with its fix: the package that provides it when that
package is not found, the libcu++ header that replaces a C/C++ standard one (or what device code
does instead where there is none), and the host-only CCCL headers that NVRTC cannot compile.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import pathlib
import re
import sys

# cuda.pathfinder library names whose include folders kernels may need, in search order.
_PATHFINDER_LIBS = ("cudart", "cccl")

# Headers of the CUDA runtime wheel that kernels include (the rest is reached through these).
_RUNTIME_HEADERS = frozenset().union(
    ("builtin_types.h", "channel_descriptor.h", "cooperative_groups.h", "cuComplex.h", "cuda_awbarrier.h"),
    ("cuda_awbarrier_primitives.h", "cuda_bf16.h", "cuda_bf16.hpp", "cuda_device_runtime_api.h", "cuda_fp16.h"),
    ("cuda_fp16.hpp", "cuda_fp4.h", "cuda_fp4.hpp", "cuda_fp6.h", "cuda_fp6.hpp", "cuda_fp8.h", "cuda_fp8.hpp"),
    ("cuda_occupancy.h", "cuda_pipeline.h", "cuda_pipeline_primitives.h", "cuda_runtime.h", "cuda_runtime_api.h"),
    ("cuda_tf32.h", "device_atomic_functions.h", "device_functions.h", "device_launch_parameters.h"),
    ("device_types.h", "driver_types.h", "host_defines.h", "library_types.h", "math_constants.h", "math_functions.h"),
    ("mma.h", "sm_20_atomic_functions.h", "sm_20_intrinsics.h", "sm_30_intrinsics.h", "sm_32_atomic_functions.h"),
    ("sm_32_intrinsics.h", "sm_35_atomic_functions.h", "sm_35_intrinsics.h", "sm_60_atomic_functions.h"),
    ("sm_61_intrinsics.h", "surface_types.h", "texture_types.h", "vector_functions.h", "vector_types.h"),
)
# The C and C++ standard headers a kernel may reach for. NVRTC has no standard library; libcu++
# (part of CCCL) gives most of them a device twin under cuda/std/, named after the C++ header
# (<stdint.h> and <cstdint> both become <cuda/std/cstdint>).
_C_TO_CXX = {
    f"{n}.h": f"c{n}"
    for n in ("assert", "complex", "float", "limits", "math", "stddef", "stdint", "stdlib", "string", "time")
}
# cuda/std/ headers of the oldest CCCL a CUDA 13 NVRTC comes with (3.0); newer ones add more.
# Used to name a replacement where no CCCL is found to look into.
_LIBCUXX_HEADERS = frozenset().union(
    ("array", "atomic", "barrier", "bit", "bitset", "cassert", "ccomplex", "cfloat", "chrono", "climits", "cmath"),
    ("complex", "concepts", "cstddef", "cstdint", "cstdlib", "cstring", "ctime", "expected", "functional"),
    ("initializer_list", "inplace_vector", "iterator", "latch", "limits", "mdspan", "memory", "numbers", "numeric"),
    ("optional", "ranges", "ratio", "semaphore", "source_location", "span", "tuple", "type_traits", "utility"),
    ("variant", "version"),
)
_PRINTF = "printf is built into device code: remove the include and call printf(...)"
_NO_CONTAINERS = (
    "device code has no growing containers: use a fixed-capacity cuda::std::inplace_vector<T, N> "
    "from <cuda/std/inplace_vector>, a fixed array (T a[N]), or a buffer the dispatch passes in"
)
# Standard headers with no libcu++ twin (in the CCCL found, or in any): what to do instead.
_INSTEAD = {
    "stdio.h": _PRINTF,
    "cstdio": _PRINTF,
    "iostream": "device code has no streams; " + _PRINTF,
    "fstream": "device code has no files or streams; " + _PRINTF,
    "sstream": "device code has no streams; " + _PRINTF,
    "vector": _NO_CONTAINERS.replace("growing containers", "std::vector"),
    "deque": _NO_CONTAINERS,
    "list": _NO_CONTAINERS,
    "map": _NO_CONTAINERS,
    "set": _NO_CONTAINERS,
    "unordered_map": _NO_CONTAINERS,
    "unordered_set": _NO_CONTAINERS,
    "string": "device code has no std::string: use a char array",
    "stdbool.h": "bool is built into C++: remove the include",
    "algorithm": (
        "min() and max() are built into device code; to sort the values of a block use "
        "cub::BlockRadixSort from <cub/block/block_radix_sort.cuh>"
    ),
}
# CCCL libraries whose top-level headers pull in host code, which NVRTC (device code only) refuses.
_HOST_CODE = {
    "cub": (
        "cub/cub.cuh and CUB's device-wide algorithms (cub/device/...) are host code, which NVRTC "
        "cannot compile: include only the block-, warp- or thread-level headers the kernel uses, "
        "e.g. <cub/block/block_reduce.cuh> or <cub/warp/warp_reduce.cuh>"
    ),
    "thrust": (
        "Thrust's containers and algorithms are host code, which NVRTC cannot compile: in a kernel "
        "use libcu++ (the cuda/std/ headers, e.g. <cuda/std/array>) and CUB's block- and warp-level "
        "headers (e.g. <cub/block/block_reduce.cuh>)"
    ),
}
# A file of each header package, to tell whether the package is among the folders searched.
_SENTINELS = {
    "nvidia-cuda-runtime": "cuda_runtime_api.h",
    "nvidia-cuda-cccl": "cuda/std/version",
    "nvidia-cuda-crt": "crt/host_defines.h",
}
# Where these appear, a compile may read a header outside vyre_cuda's own folder. ``include``
# covers ``#include``, ``# include``, ``%:include``, ``__has_include`` and the include options;
# backslash-newlines are spliced first, since NVRTC splices them before it reads directives.
_OWN_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"vyre_cuda\.cuh"[ \t]*$', re.MULTILINE)
_HEADER_OPTIONS = (
    *("-I", "-include", "-isystem", "--include-path", "--pre-include"),
    *("-pch", "--pch", "--create-pch", "--use-pch"),  # precompiled headers
)
_MISSING = re.compile(r'(?:could not|cannot) open source file "([^"]+)"')
# "<file>(<line>): catastrophic error: cannot open source file "<header>"": who included it
_MISSING_FROM = re.compile(
    r'^(.+?)\((\d+)\): (?:catastrophic )?error: (?:could not|cannot) open source file "([^"]+)"', re.M
)
_HOST_IN_JIT = re.compile(
    r"^(.+?)\((\d+)\): error: A function explicitly marked as a __host__ function is not allowed in JIT mode", re.M
)
_CUDA_STD = "cuda/std/"


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

    Only then are the CUDA include folders searched (a subprocess where no header wheel is
    installed) and made part of the compile and its cache key. The test is on the text: any
    ``include`` besides ``#include "vyre_cuda.cuh"``, in a comment too, counts.

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


def missing_header_fix(header: str, nvrtc_major: int | None, searched=()) -> str:
    """The Fix line for a header NVRTC could not open: what to include instead, or what provides it.

    ``searched``: the compile's include folders. A package found there is never suggested for
    installation; a header it lacks is named as absent, with the nearest one that exists.

    >>> missing_header_fix("cuda_fp16.h", 13).split(" (")[0]
    "pip install 'nvidia-cuda-runtime==13.*'"
    >>> missing_header_fix("stdint.h", 13).split(" (")[0]
    'NVRTC has no C/C++ standard library: include <cuda/std/cstdint> instead'
    """
    series = f"=={nvrtc_major}.*" if nvrtc_major else ""
    name = header.replace("\\", "/")
    top = name.split("/", 1)[0]

    def package(wheel, extra):
        return (
            f"pip install '{wheel}{series}' (it provides {name}; or cuda-toolkit[{extra}]), or install a CUDA toolkit"
        )

    if name in _RUNTIME_HEADERS or name.startswith("cooperative_groups/"):
        runtime = _found(searched, "nvidia-cuda-runtime")
        if runtime:
            return (
                f"the CUDA runtime headers found in {runtime} have no {name}: upgrade them "
                f"(pip install -U 'nvidia-cuda-runtime{series}') or install a newer CUDA toolkit"
            )
        return package("nvidia-cuda-runtime", "cudart")
    if _is_standard(name):
        cccl = _found(searched, "nvidia-cuda-cccl")
        return _standard_fix(name, series, cccl) or package("nvidia-cuda-cccl", "cccl")
    if top in ("cuda", "cub", "thrust", "nv") and "/" in name:
        cccl = _found(searched, "nvidia-cuda-cccl")
        if cccl:
            return f"the CCCL headers found in {cccl} have no {name}: {_closest(name, cccl)}"
        return package("nvidia-cuda-cccl", "cccl")
    if top == "crt":
        return package("nvidia-cuda-crt", "crt")
    if name.startswith("curand"):
        return package("nvidia-curand", "curand")
    return (
        f"add the folder holding {name} with Kernel.cuda(..., options=('--include-path=/path',)) "
        f"(searched: {', '.join(searched) or 'no CUDA header folder'})"
    )


def compile_error_fix(log: str, nvrtc_major: int | None, searched=(), source_name: str = "") -> str | None:
    """The Fix line for a compile that failed on a header, from NVRTC's log; None for other errors.

    ``nvrtc_major`` picks the release series of a package to install; ``searched`` are the
    compile's include folders; ``source_name`` is the kernel's file (``<entry>.cu``): a header
    missing from another file was included by a header, and the fix names that file.

    >>> log = 'k.cu(1): catastrophic error: cannot open source file "vector"'
    >>> compile_error_fix(log, 13, (), "k.cu").split("; ")[1].split(": ")[0]
    'device code has no std::vector'
    """
    match = _MISSING_FROM.search(log)
    if match:
        where, header = match.group(1), match.group(3)
        fix = _host_code_fix(where)
        if fix:
            return fix
        fix = missing_header_fix(header, nvrtc_major, searched)
        if source_name and os.path.basename(where) != source_name:
            return f"{header} is included by {where}; {fix}"
        return fix
    missing = _MISSING.search(log)
    if missing:
        return missing_header_fix(missing.group(1), nvrtc_major, searched)
    host = _HOST_IN_JIT.search(log)
    if host:
        return _host_code_fix(host.group(1)) or (
            f"NVRTC compiles device code only: mark the function at {host.group(1)}({host.group(2)}) "
            "__device__ (or __host__ __device__), or remove it"
        )
    return None


def _found(searched, wheel: str) -> str | None:
    # the searched folder holding the package's sentinel file, if any
    return next((f for f in searched if os.path.isfile(os.path.join(f, _SENTINELS[wheel]))), None)


def _is_standard(name: str) -> bool:
    base = name.removeprefix(_CUDA_STD)
    return (
        name.startswith(_CUDA_STD)
        or base in _C_TO_CXX
        or base in _INSTEAD
        or base in _LIBCUXX_HEADERS
        or base in _C_TO_CXX.values()
    )


def _libcuxx(cccl: str | None) -> frozenset:
    # the cuda/std/ headers of the CCCL found, or those every CUDA 13 CCCL has
    if not cccl:
        return _LIBCUXX_HEADERS
    return frozenset(n for n in _public_headers(os.path.join(cccl, "cuda", "std")) if "." not in n)


def _public_headers(folder: str) -> list:
    # the header files of a folder, less the implementation ones (_ or . first)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [n for n in names if not n.startswith(("_", ".")) and os.path.isfile(os.path.join(folder, n))]


def _standard_fix(name: str, series: str, cccl: str | None) -> str | None:
    # None: a header every CCCL has, and none is installed
    base = name.removeprefix(_CUDA_STD)
    cxx = _C_TO_CXX.get(base, base)  # stdint.h: cstdint
    if base not in _LIBCUXX_HEADERS and base not in _INSTEAD:
        cxx = _C_TO_CXX.get(base + ".h", cxx)  # cuda/std/stdint: cstdint
    available = _libcuxx(cccl)
    get_cccl = "" if cccl else f" (pip install 'nvidia-cuda-cccl{series}', or cuda-toolkit[cccl])"
    if name.startswith(_CUDA_STD):
        if base in available:
            return None
        where = f"the CCCL headers found in {cccl} have" if cccl else "libcu++ (CCCL 3.0) has"
        lead = f"{where} no {name}"
    else:
        lead = "NVRTC has no C/C++ standard library"
    if cxx in available:
        fix = f"{lead}: include <{_CUDA_STD}{cxx}> instead{get_cccl}"
        if cxx == "cstdint":
            fix += ", or use vyre_u32/vyre_u64 from vyre_cuda.cuh"
        return fix
    if base in _INSTEAD or cxx in _INSTEAD:
        advice = _INSTEAD.get(base) or _INSTEAD[cxx]
        if get_cccl:  # after the first CCCL header it names
            advice = re.sub(r"(<[\w./]+>)", lambda m: m.group(1) + get_cccl, advice, count=1)
        return f"{lead}; {advice}"
    if cccl:
        return f"{lead}: {_closest(name, cccl)}"
    return f"{lead}: pip install 'nvidia-cuda-cccl{series}' and include one of the headers in its cuda/std/ folder"


def _closest(name: str, cccl: str) -> str:
    # the existing header nearest in spelling to a missing CCCL header, from the CCCL found
    folder = os.path.join(cccl, os.path.dirname(name))
    close = difflib.get_close_matches(os.path.basename(name), _public_headers(folder), n=1, cutoff=0.6)
    if close:
        return f"include <{os.path.dirname(name)}/{close[0]}> if that is the one meant"
    return f"include one of the headers in {folder}"


def _host_code_fix(path: str) -> str | None:
    # CUB's fix for .../include/cccl/cub/device/x.cuh (or .../include/cub/...), Thrust's likewise
    parts = path.replace("\\", "/").split("/")
    for before, part in zip(parts, parts[1:]):
        if part in _HOST_CODE and before in ("cccl", "include"):
            return _HOST_CODE[part]
    return None
