"""NVRTC: CUDA C++ to PTX and cubin, straight through cuda.bindings (no CUDA driver needed).

One NVRTC program yields both the PTX (kept for the entry check and the disk cache) and the
cubin; ``notes/compile-cache.md`` measures this against cuda.core's ``Program``.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import re
import threading
from dataclasses import dataclass

from ..errors import KernelCompileFailed, ValidationError
from .headers import compile_error_fix, cuda_include_dirs, include_dir, needs_cuda_headers

# Bump when the disk layout or the key material changes, so old entries are never misread.
FORMAT = 2
# The oldest architecture NVRTC 13 targets; its PTX is JIT-compiled forward on any newer GPU.
_GENERIC_ARCH = 75

_NVRTC_FIX = "pip install 'nvidia-cuda-nvrtc>=13,<14' (or install a CUDA toolkit)"
_SOURCE_FIX = "correct the CUDA source; the full NVRTC log is in the exception's .log attribute"

_PTX_ENTRY = re.compile(r"^[ \t]*(?:\.(?:visible|weak|extern)\s+)*\.entry\s+([A-Za-z_$%][\w$]*)", re.MULTILINE)
_DEFINE_NAME = re.compile(r"[A-Za-z_]\w*\Z")


@dataclass(frozen=True)
class CompiledKernel:
    """A kernel ready for ``cuModuleLoadData``."""

    kind: str  #: ``"cubin"`` (a binary for ``arch``) or ``"ptx"`` (text the driver JIT-compiles).
    image: bytes  #: The cubin, or the PTX text followed by one NUL byte.
    ptx: str | None  #: The PTX text (always present for CUDA kernels and for ``Kernel.ptx``).
    entry: str  #: Name of the ``extern "C" __global__`` entry point.
    key: str  #: Hex cache key; equal keys mean identical images.
    arch: tuple | None  #: ``(major, minor)`` compiled for; None for a generic PTX build or a given PTX.
    nvrtc_version: tuple | None  #: ``(major, minor)`` of the NVRTC that compiled it; None for a given PTX.
    log: str  #: Compiler log (warnings); may be empty.


def _import_nvrtc():
    from cuda.bindings import nvrtc  # noqa: PLC0415 (resolved at first use, never at import)

    return nvrtc


_preload_lock = threading.Lock()
_preload_started = False


def preload_nvrtc() -> None:
    """Start loading NVRTC on a background thread, once per process; return at once.

    ``CudaBackend()`` calls it before it initialises the driver, so loading NVRTC (tens of
    milliseconds; the first dispatch needs its version for the cache key even on a hit) overlaps
    the driver's start. Failures are left for :func:`load_nvrtc` to report where it is called.
    """
    global _preload_started
    with _preload_lock:
        if _preload_started:
            return
        _preload_started = True
    threading.Thread(target=_preload, name="vyre_cuda-nvrtc-preload", daemon=True).start()


def _preload() -> None:
    try:
        importlib.import_module("cuda.bindings.nvrtc").nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 (reported, with its fix, by the load that needs it)
        logging.getLogger("vyre_cuda").debug("NVRTC preload failed (%s: %s)", type(exc).__name__, exc)


def load_nvrtc():
    """Return ``(nvrtc module, (major, minor))`` or raise KernelCompileFailed."""
    try:
        nvrtc = _import_nvrtc()
        err, major, minor = nvrtc.nvrtcVersion()
    except (ImportError, OSError, RuntimeError) as exc:
        # cuda.pathfinder raises a RuntimeError subclass when libnvrtc cannot be found.
        raise KernelCompileFailed(
            f"NVRTC (the CUDA runtime compiler) cannot be loaded: {type(exc).__name__}: {exc}",
            _NVRTC_FIX,
        ) from exc
    _check(nvrtc, err, "nvrtcVersion")
    return nvrtc, (int(major), int(minor))


def _check(nvrtc, err, call: str, log: str = "") -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelCompileFailed(f"{call} failed with {getattr(err, 'name', err)}", _NVRTC_FIX, log=log)


def nvrtc_version() -> tuple | None:
    """``(major, minor)`` of the NVRTC library vyre_cuda compiles with; None when it cannot be loaded.

    >>> nvrtc_version() >= (13, 0)
    True
    """
    try:
        return load_nvrtc()[1]
    except KernelCompileFailed:
        return None


def normalize_arch(arch) -> tuple | None:
    """``arch`` as a ``(major, minor)`` tuple of ints, None for generic PTX, or ValidationError."""
    if arch is None:
        return None
    try:
        major, minor = (int(x) for x in arch)
    except (TypeError, ValueError):
        major = minor = -1
    if not (0 < major < 100 and 0 <= minor < 10):
        raise ValidationError(
            f"arch must be a (major, minor) compute capability (got {arch!r})",
            "pass arch=(major, minor), e.g. (9, 0) for an H100/H200, or None for generic PTX",
        )
    return (major, minor)


def define_options(defines) -> tuple:
    """``{name: value}`` as sorted ``-Dname=value`` options (``-Dname`` for None), names checked."""
    if not defines:
        return ()
    options = []
    for name in sorted(defines):
        if not isinstance(name, str) or not _DEFINE_NAME.match(name):
            raise ValidationError(
                f"define names must be C identifiers (got {name!r})",
                "pass defines as {'NAME': 'value'} with NAME matching [A-Za-z_][A-Za-z0-9_]*",
            )
        value = defines[name]
        options.append(f"-D{name}" if value is None else f"-D{name}={value}")
    return tuple(options)


def _supported_archs(nvrtc) -> list | None:
    try:
        err, archs = nvrtc.nvrtcGetSupportedArchs()
    except (AttributeError, RuntimeError):
        return None
    return sorted(int(a) for a in archs) if err == nvrtc.nvrtcResult.NVRTC_SUCCESS else None


def target(nvrtc, version, arch):
    """Pick ``(NVRTC -arch value, output kind, arch compiled for)``."""
    supported = _supported_archs(nvrtc)
    if arch is None:
        lowest = _GENERIC_ARCH if not supported or _GENERIC_ARCH in supported else supported[0]
        return f"compute_{lowest}", "ptx", None
    number = arch[0] * 10 + arch[1]
    if supported is None or number in supported:
        return f"sm_{number}", "cubin", arch
    older = [a for a in supported if a <= number]
    if older:
        # A GPU newer than this NVRTC: the driver JIT-compiles the newest PTX NVRTC can emit.
        return f"compute_{older[-1]}", "ptx", divmod(older[-1], 10)
    raise KernelCompileFailed(
        f"NVRTC {version[0]}.{version[1]} cannot compile for compute capability "
        f"{arch[0]}.{arch[1]} (sm_{number}); it supports sm_{supported[0]} to sm_{supported[-1]}",
        f"run on a GPU of compute capability {supported[0] // 10}.{supported[0] % 10} or newer, "
        f"or use a CUDA release whose NVRTC still supports sm_{number}",
    )


def compile_options(kernel, arch_option: str, define_opts: tuple) -> tuple:
    """Every NVRTC option of one compile, in order (also the cache key's option material)."""
    cuda_dirs = cuda_include_dirs() if needs_cuda_headers(kernel) else ()
    return (
        "-std=c++17",
        f"--include-path={include_dir()}",
        *(f"--include-path={d}" for d in cuda_dirs),
        f"-arch={arch_option}",
        *define_opts,
        *kernel.options,
    )


def compile_source(nvrtc, version, kernel, options, plan, key) -> CompiledKernel:
    """Compile ``kernel`` with NVRTC; the PTX and (for a cubin plan) the cubin of one program."""
    target_name, kind, arch = plan
    err, prog = nvrtc.nvrtcCreateProgram(kernel.source.encode(), f"{kernel.entry}.cu".encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        raw_log = _read(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        log = raw_log.rstrip(b"\0").decode(errors="replace").strip()
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            fix = compile_error_fix(log, version[0], _include_paths(options), f"{kernel.entry}.cu") or _SOURCE_FIX
            raise KernelCompileFailed(
                f"NVRTC could not compile kernel {kernel.entry!r} for {target_name} "
                f"({getattr(result, 'name', result)}): {_first_error(log)}",
                fix,
                log=log,
            )
        ptx = _read(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX).rstrip(b"\0").decode()
        cubin = _read(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if kind == "cubin" else b""
    finally:
        nvrtc.nvrtcDestroyProgram(prog)

    entries = ptx_entries(ptx)
    if kernel.entry not in entries:
        raise KernelCompileFailed(
            f"kernel entry {kernel.entry!r} is not in the compiled module (entries present: {_listing(entries)})",
            f'declare the entry as `VYRE_KERNEL {kernel.entry}(...)` (extern "C" __global__, '
            f"so its name is not mangled), or pass entry=<one of the entries present> to "
            f"Kernel.cuda",
            log=log,
        )
    image = cubin if kind == "cubin" else ptx.encode() + b"\0"
    return CompiledKernel(kind, image, ptx, kernel.entry, key, arch, version, log)


def pass_through(kernel) -> CompiledKernel:
    """A ``Kernel.ptx``: checked for its entry, returned NUL-terminated for the driver."""
    text = kernel.source
    entries = ptx_entries(text)
    if kernel.entry not in entries:
        raise KernelCompileFailed(
            f"PTX kernel entry {kernel.entry!r} is not defined in the PTX (entries present: {_listing(entries)})",
            f"pass entry=<one of the entries present> to Kernel.ptx, or define "
            f"`.visible .entry {kernel.entry}(...)` in the PTX",
        )
    key = hashlib.sha256(f"ptx\0{FORMAT}\0{kernel.digest}".encode()).hexdigest()
    return CompiledKernel("ptx", text.encode() + b"\0", text, kernel.entry, key, None, None, "")


def _include_paths(options) -> tuple:
    """The folders a compile with these options searches for headers, in order."""
    folders = []
    for i, opt in enumerate(options):
        if opt.startswith("--include-path="):
            folders.append(opt.split("=", 1)[1])
        elif opt == "-I" and i + 1 < len(options):
            folders.append(options[i + 1])
        elif opt.startswith("-I"):
            folders.append(opt[2:])
    return tuple(folders)


def _read(nvrtc, prog, size_call, read_call) -> bytes:
    err, size = size_call(prog)
    _check(nvrtc, err, size_call.__name__)
    # a fresh, mutable buffer: NVRTC writes into it (``b" " * 1`` is CPython's shared ``b" "``, which
    # NVRTC's NUL once turned into ``b"\x00"`` for the whole process)
    buf = bytearray(size)
    (err,) = read_call(prog, buf)
    _check(nvrtc, err, read_call.__name__)
    return bytes(buf)


def _first_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower()), lines[0] if lines else "(empty compiler log)")


def _listing(entries) -> str:
    return ", ".join(entries) if entries else "none"


def ptx_entries(ptx: str) -> list:
    """Names of the kernel entry points (``.entry``) defined in PTX text, in order.

    >>> ptx_entries(".version 8.0\\n.visible .entry add(\\n.param .u64 p)\\n{ ret; }")
    ['add']
    """
    return _PTX_ENTRY.findall(ptx)
