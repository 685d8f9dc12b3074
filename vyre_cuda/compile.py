"""Kernel compilation: CUDA C++ through NVRTC to a cubin or PTX, with a memory and a disk cache.

The memory cache is a bounded LRU shared by every backend of the process. The disk cache lives in
:func:`cache_dir` (``VYRE_CUDA_CACHE_DIR`` overrides it, ``VYRE_CUDA_DISK_CACHE=0`` turns it off)
and is keyed on everything that changes the output: package version, NVRTC version, target
architecture, every option and define, the kernel's digest and the device header's contents.
Entries are written atomically, so a crash or a full disk never leaves a half-written kernel.

>>> from vyre_cuda import Kernel
>>> from vyre_cuda.compile import compile_kernel
>>> src = '#include "vyre_cuda.cuh"\\nVYRE_KERNEL vyre_main(unsigned int* p) { p[0] = 1u; }'
>>> compiled = compile_kernel(Kernel.cuda(src), arch=(9, 0))
>>> compiled.kind, compiled.entry
('cubin', 'vyre_main')
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import pathlib
import sys
import re
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass

from .errors import KernelCompileFailed, ValidationError, cu_explanation

__all__ = [
    "CompiledKernel",
    "compile_kernel",
    "nvrtc_version",
    "include_dir",
    "cache_dir",
    "cache_info",
    "clear_cache",
    "ptx_entries",
    "explain_load_failure",
]

_log = logging.getLogger("vyre_cuda")

_MEMORY_CAP = 512
# Bump when the disk layout or the key material changes, so old entries are never misread.
_FORMAT = 1
# The oldest architecture NVRTC 13 targets; its PTX is JIT-compiled forward on any newer GPU.
_GENERIC_ARCH = 75
_SUFFIXES = (".json", ".ptx", ".cubin")

_NVRTC_FIX = "pip install 'nvidia-cuda-nvrtc>=13,<14' (or install a CUDA toolkit)"
_SOURCE_FIX = "correct the CUDA source; the full NVRTC log is in the exception's .log attribute"

_PTX_ENTRY = re.compile(
    r"^[ \t]*(?:\.(?:visible|weak|extern)\s+)*\.entry\s+([A-Za-z_$%][\w$]*)", re.MULTILINE
)
_DEFINE_NAME = re.compile(r"[A-Za-z_]\w*\Z")


@dataclass(frozen=True)
class CompiledKernel:
    """A kernel ready for ``cuModuleLoadData``.

    Attributes
    ----------
    kind : str
        ``"cubin"`` (a binary for ``arch``) or ``"ptx"`` (text the driver JIT-compiles).
    image : bytes
        The cubin, or the PTX text followed by one NUL byte.
    ptx : str or None
        The PTX text (always present for CUDA kernels and for ``Kernel.ptx``).
    entry : str
        Name of the ``extern "C" __global__`` entry point.
    key : str
        Hex cache key; equal keys mean identical images.
    arch : tuple or None
        ``(major, minor)`` compiled for; None for a generic PTX build or a given PTX.
    nvrtc_version : tuple or None
        ``(major, minor)`` of the NVRTC that compiled it; None for a given PTX.
    log : str
        Compiler log (warnings); may be empty.
    """

    kind: str
    image: bytes
    ptx: str | None
    entry: str
    key: str
    arch: tuple | None
    nvrtc_version: tuple | None
    log: str


_lock = threading.Lock()
_memory: OrderedDict = OrderedDict()
_stats = {"memory_hits": 0, "disk_hits": 0, "compiles": 0}


# NVRTC ----------------------------------------------------------------------------------------
def _import_nvrtc():
    from cuda.bindings import nvrtc  # noqa: PLC0415 (resolved at first use, never at import)

    return nvrtc


def _load_nvrtc():
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
        raise KernelCompileFailed(
            f"{call} failed with {_result_name(err)}", _NVRTC_FIX, log=log
        )


def _result_name(err) -> str:
    return getattr(err, "name", str(err))


def nvrtc_version() -> tuple | None:
    """Version of the NVRTC library vyre_cuda compiles with.

    Returns
    -------
    tuple or None
        ``(major, minor)``, or None when NVRTC cannot be loaded.

    Examples
    --------
    >>> nvrtc_version() >= (13, 0)
    True
    """
    try:
        return _load_nvrtc()[1]
    except KernelCompileFailed:
        return None


@functools.lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple:
    """Folders holding the CUDA headers kernels include (cuda_fp16.h, cuda_bf16.h, ...).

    NVRTC does not ship them; they come from the nvidia-cuda-runtime wheel or a toolkit.
    """
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    candidates = [os.path.join(c, "include") for c in candidates if c]
    candidates += [os.path.join(p, "nvidia", "cu13", "include") for p in sys.path if p]
    candidates.append("/usr/local/cuda/include")
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "cuda_fp16.h")):
            return (os.path.abspath(folder),)
    return ()


def include_dir() -> str:
    """Absolute path of the folder holding ``vyre_cuda.cuh``, on NVRTC's include path.

    Examples
    --------
    >>> import os
    >>> os.path.isfile(os.path.join(include_dir(), "vyre_cuda.cuh"))
    True
    """
    return str(pathlib.Path(__file__).resolve().parent / "include")


def _header_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(pathlib.Path(include_dir()).iterdir()):
        if path.is_file():
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _package_version() -> str:
    from . import __version__  # noqa: PLC0415 (the package imports this module's siblings)

    return __version__


# Compilation ----------------------------------------------------------------------------------
def compile_kernel(kernel, arch=None, defines=None) -> CompiledKernel:
    """Compile a kernel for a device, or pass a PTX kernel through.

    Parameters
    ----------
    kernel : vyre_cuda.program.Kernel
        ``Kernel.cuda`` sources are compiled by NVRTC; ``Kernel.ptx`` text is checked for its
        entry and returned NUL-terminated.
    arch : tuple of int, optional
        ``(major, minor)`` compute capability of the target device. With it, the result is a
        cubin for exactly that architecture (so a driver older than NVRTC can still load it);
        without it, PTX for the lowest architecture NVRTC supports. An architecture newer than
        NVRTC knows gets PTX for the newest one it does know.
    defines : dict, optional
        ``name -> value`` passed as ``-Dname=value`` (``-Dname`` when the value is None).

    Returns
    -------
    CompiledKernel

    Raises
    ------
    KernelCompileFailed
        The source does not compile (``.log`` holds the NVRTC log), the entry is missing, the
        architecture is too old for NVRTC, or NVRTC cannot be loaded.

    Examples
    --------
    >>> from vyre_cuda import Kernel
    >>> k = Kernel.cuda('#include "vyre_cuda.cuh"\\nVYRE_KERNEL vyre_main(unsigned int* p) {}')
    >>> compile_kernel(k).kind
    'ptx'
    >>> compile_kernel(k, arch=(9, 0), defines={"VYRE_PHASE_WORD": "3"}).kind
    'cubin'
    """
    if kernel.kind == "ptx":
        return _pass_through(kernel)
    arch = _normalize_arch(arch)
    define_options = _define_options(defines)
    # Within a process the NVRTC library, package and header cannot change, so the memory
    # cache needs only what varies per call; a hit touches neither NVRTC nor the disk.
    memory_key = (kernel.digest, arch, define_options)
    with _lock:
        hit = _memory.get(memory_key)
        if hit is not None:
            _memory.move_to_end(memory_key)
            _stats["memory_hits"] += 1
            return hit

    nvrtc, version = _load_nvrtc()
    plan = _target(nvrtc, version, arch)
    options = (
        "-std=c++17",
        f"--include-path={include_dir()}",
        *(f"--include-path={d}" for d in cuda_include_dirs()),
        f"-arch={plan[0]}",
        *define_options,
        *kernel.options,
    )
    key = _cache_key(version, options, kernel)
    disk = _disk_enabled()
    compiled = _disk_load(key, kernel.entry) if disk else None
    if compiled is not None:
        with _lock:
            _stats["disk_hits"] += 1
    else:
        compiled = _compile(nvrtc, version, kernel, options, plan, key)
        with _lock:
            _stats["compiles"] += 1
        if disk:
            _disk_store(compiled)
    with _lock:
        _memory[memory_key] = compiled
        _memory.move_to_end(memory_key)
        while len(_memory) > _MEMORY_CAP:
            _memory.popitem(last=False)
    return compiled


def _pass_through(kernel) -> CompiledKernel:
    text = kernel.source.rstrip("\0")
    entries = ptx_entries(text)
    if kernel.entry not in entries:
        raise KernelCompileFailed(
            f"PTX kernel entry {kernel.entry!r} is not defined in the PTX "
            f"(entries present: {_listing(entries)})",
            f"pass entry=<one of the entries present> to Kernel.ptx, or define "
            f"`.visible .entry {kernel.entry}(...)` in the PTX",
        )
    key = hashlib.sha256(f"ptx\0{_FORMAT}\0{kernel.digest}".encode()).hexdigest()
    return CompiledKernel("ptx", text.encode() + b"\0", text, kernel.entry, key, None, None, "")


def _normalize_arch(arch) -> tuple | None:
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


def _define_options(defines) -> tuple:
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


def _target(nvrtc, version, arch):
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


def _cache_key(version, options, kernel) -> str:
    material = {
        "format": _FORMAT,
        "package": _package_version(),
        "nvrtc": list(version),
        "options": list(options),
        "entry": kernel.entry,
        "digest": kernel.digest,
        "header": _header_digest(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _compile(nvrtc, version, kernel, options, plan, key) -> CompiledKernel:
    target, kind, arch = plan
    err, prog = nvrtc.nvrtcCreateProgram(
        kernel.source.encode(), f"{kernel.entry}.cu".encode(), 0, [], []
    )
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        log = _read(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        log = log.rstrip(b"\0").decode(errors="replace").strip()
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise KernelCompileFailed(
                f"NVRTC could not compile kernel {kernel.entry!r} for {target} "
                f"({_result_name(result)}): {_first_error(log)}",
                _SOURCE_FIX,
                log=log,
            )
        ptx = _read(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        ptx = ptx.rstrip(b"\0").decode()
        cubin = None
        if kind == "cubin":
            cubin = _read(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)

    entries = ptx_entries(ptx)
    if kernel.entry not in entries:
        raise KernelCompileFailed(
            f"kernel entry {kernel.entry!r} is not in the compiled module "
            f"(entries present: {_listing(entries)})",
            f"declare the entry as `VYRE_KERNEL {kernel.entry}(...)` (extern \"C\" __global__, "
            f"so its name is not mangled), or pass entry=<one of the entries present> to "
            f"Kernel.cuda",
            log=log,
        )
    image = cubin if kind == "cubin" else ptx.encode() + b"\0"
    return CompiledKernel(kind, image, ptx, kernel.entry, key, arch, version, log)


def _read(nvrtc, prog, size_call, read_call) -> bytes:
    err, size = size_call(prog)
    _check(nvrtc, err, size_call.__name__)
    buf = b" " * size
    (err,) = read_call(prog, buf)
    _check(nvrtc, err, read_call.__name__)
    return buf


def _first_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[0] if lines else "(empty compiler log)"


def _listing(entries) -> str:
    return ", ".join(entries) if entries else "none"


def ptx_entries(ptx: str) -> list:
    """Names of the kernel entry points (``.entry``) defined in PTX text, in order.

    Examples
    --------
    >>> ptx_entries(".version 8.0\\n.visible .entry add(\\n.param .u64 p)\\n{ ret; }")
    ['add']
    """
    return _PTX_ENTRY.findall(ptx)


# Disk cache -----------------------------------------------------------------------------------
def cache_dir() -> pathlib.Path:
    """Folder of the disk cache, read from the environment on every call.

    ``VYRE_CUDA_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/vyre_cuda``, else
    ``~/.cache/vyre_cuda``.

    Examples
    --------
    >>> cache_dir()  # doctest: +SKIP
    PosixPath('/home/me/.cache/vyre_cuda')
    """
    override = os.environ.get("VYRE_CUDA_CACHE_DIR")
    if override:
        return pathlib.Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return base / "vyre_cuda"


def _disk_enabled() -> bool:
    return os.environ.get("VYRE_CUDA_DISK_CACHE", "1").strip().lower() not in (
        "0", "false", "no", "off",
    )


def _entry_path(key: str, suffix: str) -> pathlib.Path:
    return cache_dir() / key[:2] / f"{key}{suffix}"


def _disk_load(key: str, entry: str) -> CompiledKernel | None:
    """The cached kernel, or None when absent or unusable (it is then recompiled)."""
    meta_path = _entry_path(key, ".json")
    try:
        meta = json.loads(meta_path.read_text())
        if meta["format"] != _FORMAT or meta["key"] != key or meta["entry"] != entry:
            raise ValueError("entry does not match its key")
        blobs = {}
        for suffix, digest in meta["sha256"].items():
            data = _entry_path(key, suffix).read_bytes()
            if hashlib.sha256(data).hexdigest() != digest:
                raise ValueError(f"{suffix} content does not match its checksum")
            blobs[suffix] = data
        ptx = blobs[".ptx"].decode()
        kind = meta["kind"]
        image = blobs[".cubin"] if kind == "cubin" else ptx.encode() + b"\0"
        arch = tuple(meta["arch"]) if meta["arch"] is not None else None
        return CompiledKernel(
            kind, image, ptx, entry, key, arch, tuple(meta["nvrtc_version"]), meta["log"]
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        _log.debug("ignoring unusable kernel cache entry %s: %s", meta_path, exc)
        return None


def _disk_store(compiled: CompiledKernel) -> None:
    """Write the entry (blobs first, the .json that validates them last); never raises."""
    blobs = {".ptx": compiled.ptx.encode()}
    if compiled.kind == "cubin":
        blobs[".cubin"] = compiled.image
    meta = {
        "format": _FORMAT,
        "key": compiled.key,
        "kind": compiled.kind,
        "entry": compiled.entry,
        "arch": compiled.arch,
        "nvrtc_version": compiled.nvrtc_version,
        "log": compiled.log,
        "sha256": {s: hashlib.sha256(b).hexdigest() for s, b in blobs.items()},
    }
    blobs[".json"] = json.dumps(meta).encode()
    folder = _entry_path(compiled.key, "").parent
    written = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for suffix, data in blobs.items():
            path = _entry_path(compiled.key, suffix)
            _atomic_write(path, data)
            written.append(path)
    except OSError as exc:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()
        _log.warning(
            "vyre_cuda: could not write kernel cache entry %s in %s (%s); the kernel is "
            "compiled but will be recompiled in the next process",
            compiled.key, folder, exc,
        )


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _cache_files():
    root = cache_dir()
    if not root.is_dir():
        return
    for sub in root.iterdir():
        if len(sub.name) == 2 and sub.is_dir():
            for path in sub.iterdir():
                if path.is_file() and (path.suffix in _SUFFIXES or path.name.endswith(".tmp")):
                    yield path


def cache_info() -> dict:
    """Counters and sizes of the kernel caches.

    Returns
    -------
    dict
        ``memory_entries``, ``memory_hits``, ``disk_hits``, ``compiles`` (NVRTC compilations
        since the process started), ``dir`` (str), ``disk_enabled``, ``disk_entries`` and
        ``disk_bytes``.

    Examples
    --------
    >>> sorted(cache_info())[:3]
    ['compiles', 'dir', 'disk_bytes']
    """
    entries = size = 0
    try:
        for path in _cache_files():
            entries += path.suffix == ".json"
            size += path.stat().st_size
    except OSError:
        pass
    with _lock:
        info = {"memory_entries": len(_memory), **_stats}
    info.update(
        dir=str(cache_dir()), disk_enabled=_disk_enabled(), disk_entries=entries, disk_bytes=size
    )
    return info


def clear_cache(memory: bool = True, disk: bool = True) -> int:
    """Empty the memory cache and/or delete the disk cache's entries.

    Only files of the cache's own layout are removed, so a ``VYRE_CUDA_CACHE_DIR`` pointing at
    a shared folder loses nothing else. Hit and compile counters are not reset.

    Parameters
    ----------
    memory, disk : bool
        Which caches to clear.

    Returns
    -------
    int
        Number of disk entries removed.

    Examples
    --------
    >>> clear_cache(disk=False)
    0
    """
    if memory:
        with _lock:
            _memory.clear()
    removed = 0
    if disk:
        folders = set()
        for path in list(_cache_files()):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += path.suffix == ".json"
            folders.add(path.parent)
        for folder in folders:
            with contextlib.suppress(OSError):
                folder.rmdir()
    return removed


# Load failures --------------------------------------------------------------------------------
def _version_text(version) -> str:
    if version is None:
        return "unknown"
    if isinstance(version, int):
        return f"{version // 1000}.{version % 1000 // 10}"
    return ".".join(str(v) for v in version)


def explain_load_failure(status: str, kernel_kind: str, nvrtc_version, driver_version):
    """Explain why the driver refused a compiled kernel, and what to do about it.

    Parameters
    ----------
    status : str
        CUresult name returned by ``cuModuleLoadData`` (e.g. ``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``).
    kernel_kind : str
        ``CompiledKernel.kind``: ``"cubin"`` or ``"ptx"``.
    nvrtc_version : tuple or None
        NVRTC ``(major, minor)`` that produced the image; None for PTX given by the user.
    driver_version : int or None
        ``cuDriverGetVersion`` value, e.g. 13000 for CUDA 13.0.

    Returns
    -------
    tuple of str
        ``(message, fix)``, ready for ``KernelCompileFailed(message, fix)``.

    Examples
    --------
    >>> msg, fix = explain_load_failure("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "ptx", (13, 3), 13000)
    >>> fix
    "install nvidia-cuda-nvrtc matching your driver: pip install 'nvidia-cuda-nvrtc==13.0.*', or update the NVIDIA driver to one supporting CUDA 13.3"
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
    if nvrtc_version is not None and driver_major == nvrtc_version[0]:
        match = (
            f"install nvidia-cuda-nvrtc matching your driver: "
            f"pip install 'nvidia-cuda-nvrtc=={driver}.*', or {update}"
        )
    else:
        # cuda-bindings 13 only loads NVRTC 13, so an older driver major means a driver update.
        match = update
    if status in ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_INVALID_PTX"):
        if nvrtc_version is None:
            fix = (
                f"regenerate the PTX with a toolkit no newer than CUDA {driver} (or lower its "
                f"`.version` directive), or {update}"
            )
        else:
            fix = match
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
