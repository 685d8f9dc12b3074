"""Kernel compilation: CUDA C++ through NVRTC to a cubin or PTX, with a memory and a disk cache.

The memory cache is a bounded LRU shared by every backend of the process. The disk cache lives in
:func:`cache_dir` (``VYRE_CUDA_CACHE_DIR`` overrides it, ``VYRE_CUDA_DISK_CACHE=0`` turns it off)
and is keyed on everything that changes the output: package version, NVRTC version, target
architecture, every option and define, the kernel's digest, the device header's contents and the
CUDA headers found at runtime. Entries are written atomically, so a crash or a full disk never
leaves a half-written kernel. Each kernel is compiled once per process and, through a file lock
in the cache folder, once across the processes sharing that folder.

Modules: :mod:`.nvrtc` (the compiler), :mod:`.cache` (both caches, single flight),
:mod:`.headers` (include folders, missing-header fixes), :mod:`.loading` (load failures).

>>> from vyre_cuda import Kernel
>>> from vyre_cuda.compile import compile_kernel
>>> src = '#include "vyre_cuda.cuh"\\nVYRE_KERNEL vyre_main(unsigned int* p) { p[0] = 1u; }'
>>> compiled = compile_kernel(Kernel.cuda(src), arch=(9, 0))
>>> compiled.kind, compiled.entry
('cubin', 'vyre_main')
"""

from __future__ import annotations

import contextlib

from . import cache as _cache
from . import nvrtc as _nvrtc
from .cache import cache_dir, cache_info, clear_cache
from .headers import cuda_include_dirs, include_dir
from .loading import explain_load_failure
from .nvrtc import CompiledKernel, nvrtc_version, ptx_entries

__all__ = [
    "CompiledKernel",
    "compile_kernel",
    "nvrtc_version",
    "include_dir",
    "cuda_include_dirs",
    "cache_dir",
    "cache_info",
    "clear_cache",
    "ptx_entries",
    "explain_load_failure",
]


def compile_kernel(kernel, arch=None, defines=None) -> CompiledKernel:
    """Compile a :class:`~vyre_cuda.Kernel` for a device (``Kernel.ptx`` text is checked for its
    entry and passed through NUL-terminated).

    ``arch``, the ``(major, minor)`` compute capability of the target, gives a cubin for exactly
    that architecture (so a driver older than NVRTC can still load it); None gives PTX for the
    lowest architecture NVRTC supports, and an architecture newer than NVRTC knows gets PTX for
    the newest it does. ``defines`` maps names to ``-Dname=value`` (``-Dname`` for None).

    Raises :class:`~vyre_cuda.KernelCompileFailed` when the source does not compile (``.log``
    holds NVRTC's log; a header NVRTC cannot open is named with its package), the entry is
    missing, the architecture is too old for NVRTC, or NVRTC cannot be loaded.

    >>> from vyre_cuda import Kernel
    >>> k = Kernel.cuda('#include "vyre_cuda.cuh"\\nVYRE_KERNEL vyre_main(unsigned int* p) {}')
    >>> compile_kernel(k).kind
    'ptx'
    >>> compile_kernel(k, arch=(9, 0), defines={"VYRE_PHASE_WORD": "3"}).kind
    'cubin'
    """
    if kernel.kind == "ptx":
        return _nvrtc.pass_through(kernel)
    arch = _nvrtc.normalize_arch(arch)
    define_opts = _nvrtc.define_options(defines)
    # Within a process the NVRTC library, package and headers cannot change, so the memory
    # cache needs only what varies per call; a hit touches neither NVRTC nor the disk.
    memory_key = (kernel.digest, arch, define_opts)
    hit = _cache.memory_get(memory_key)
    if hit is not None:
        return hit
    with _cache.key_lock(memory_key):
        hit = _cache.memory_get(memory_key)  # compiled by the thread this one waited for
        if hit is not None:
            return hit
        compiled = _compile_or_load(kernel, arch, define_opts)
        _cache.memory_put(memory_key, compiled)
    return compiled


def _compile_or_load(kernel, arch, define_opts) -> CompiledKernel:
    nvrtc, version = _nvrtc.load_nvrtc()
    plan = _nvrtc.target(nvrtc, version, arch)
    options = _nvrtc.compile_options(kernel, plan[0], define_opts)
    key = _cache.cache_key(version, options, kernel)
    disk = _cache.disk_enabled()
    compiled = _cache.disk_load(key, kernel.entry) if disk else None
    if compiled is None:
        with _cache.file_lock(key) if disk else contextlib.nullcontext(False):
            # another process may have written the entry while this one waited for the lock
            compiled = _cache.disk_load(key, kernel.entry) if disk else None
            if compiled is None:
                compiled = _nvrtc.compile_source(nvrtc, version, kernel, options, plan, key)
                _cache.count("compiles")
                if disk:
                    _cache.disk_store(compiled)
                return compiled
    _cache.count("disk_hits")
    return compiled


def program_defines(program) -> dict | None:
    """The defines a dispatch compiles ``program``'s kernel with: ``VYRE_PHASE_WORD``, the params
    word phase programs read their range from (after the highest binding's slot)."""
    if program.kernel.kind != "cuda":
        return None
    return {"VYRE_PHASE_WORD": str(max(decl.binding for decl in program.buffers) + 2)}
