"""The kernel caches: a bounded in-memory LRU and an on-disk cache, with single-flight compiles.

Disk entries live in :func:`cache_dir` as ``<key[:2]>/<key>.json`` (metadata and checksums,
written last), ``<key>.ptx`` and ``<key>.cubin``, each written atomically (temporary file, then
``os.replace``). Only files of exactly that shape are read, counted or deleted.

Single flight: within a process one compile runs per key (a lock per key; the other threads wait
and take its result). Across processes a ``<key>.lock`` file held with ``fcntl.flock`` makes a
second process wait and then read the first one's entry. Where file locks are unavailable (no
``fcntl``, a read-only folder) compiles may be duplicated, which is harmless: the entries are
identical and every write is atomic.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import re
import threading
import time
from collections import OrderedDict

from .headers import header_digest, headers_fingerprint, needs_cuda_headers
from .nvrtc import FORMAT, CompiledKernel

_log = logging.getLogger("vyre_cuda")

MEMORY_CAP = 512
# a .json larger than this is not one this cache wrote (NVRTC logs are kilobytes)
_META_MAX_BYTES = 16 << 20
# how long a process waits for another one's compile of the same kernel before compiling itself
LOCK_WAIT_S = 300.0

_FOLDER = re.compile(r"[0-9a-f]{2}\Z")
_ENTRY = re.compile(r"([0-9a-f]{64})\.(json|ptx|cubin|lock)\Z")
_TEMP = re.compile(r"\.([0-9a-f]{64})\.(json|ptx|cubin)\.[A-Za-z0-9_]+\.tmp\Z")

_lock = threading.Lock()
_memory: OrderedDict = OrderedDict()
_stats = {"memory_hits": 0, "disk_hits": 0, "compiles": 0}
_key_locks: dict = {}  # memory key -> [lock, holders + waiters]


def memory_get(key):
    """The cached kernel (counted as a memory hit), or None."""
    with _lock:
        hit = _memory.get(key)
        if hit is not None:
            _memory.move_to_end(key)
            _stats["memory_hits"] += 1
        return hit


def memory_put(key, compiled) -> None:
    """Keep ``compiled`` in the LRU, evicting the oldest past ``MEMORY_CAP``."""
    with _lock:
        _memory[key] = compiled
        _memory.move_to_end(key)
        while len(_memory) > MEMORY_CAP:
            _memory.popitem(last=False)


def count(stat: str) -> None:
    """Add one to the counter ``stat`` (:func:`cache_info` reports them)."""
    with _lock:
        _stats[stat] += 1


@contextlib.contextmanager
def key_lock(key):
    """Hold the per-key lock of ``key`` (one compile per key per process)."""
    with _lock:
        entry = _key_locks.get(key)
        if entry is None:
            entry = _key_locks[key] = [threading.Lock(), 0]
        entry[1] += 1
    try:
        with entry[0]:
            yield
    finally:
        with _lock:
            entry[1] -= 1
            if entry[1] == 0:
                del _key_locks[key]


def _package_version() -> str:
    from .. import __version__  # noqa: PLC0415 (the package imports this module's siblings)

    return __version__


def cache_key(version, options, kernel) -> str:
    """Hex SHA-256 of everything that changes a compile's output."""
    material = {
        "format": FORMAT,
        "package": _package_version(),
        "nvrtc": list(version),
        "options": list(options),
        "entry": kernel.entry,
        "digest": kernel.digest,
        "header": header_digest(),
        # a kernel that reads no CUDA header is not recompiled when those headers change
        "cuda_headers": [list(mark) for mark in headers_fingerprint()] if needs_cuda_headers(kernel) else [],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def cache_dir() -> pathlib.Path:
    """Folder of the disk cache, read from the environment on every call: ``VYRE_CUDA_CACHE_DIR``
    if set, else ``$XDG_CACHE_HOME/vyre_cuda``, else ``~/.cache/vyre_cuda``.

    >>> cache_dir()  # doctest: +SKIP
    PosixPath('/home/me/.cache/vyre_cuda')
    """
    override = os.environ.get("VYRE_CUDA_CACHE_DIR")
    if override:
        return pathlib.Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return base / "vyre_cuda"


def disk_enabled() -> bool:
    """False when ``VYRE_CUDA_DISK_CACHE`` is 0/false/no/off; read at each compile."""
    return os.environ.get("VYRE_CUDA_DISK_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def _entry_path(key: str, suffix: str) -> pathlib.Path:
    return cache_dir() / key[:2] / f"{key}{suffix}"


class _Unusable(ValueError):
    """A disk entry that exists but is not one this cache wrote whole."""


def disk_load(key: str, entry: str) -> CompiledKernel | None:
    """The cached kernel, or None when absent or unusable (it is then recompiled and rewritten)."""
    meta_path = _entry_path(key, ".json")
    try:
        if meta_path.stat().st_size > _META_MAX_BYTES:
            raise _Unusable("metadata too large")
        meta = json.loads(meta_path.read_bytes())
        kind, sums = _checked_meta(meta, key, entry)
        blobs = {}
        for suffix, digest in sums.items():
            data = _entry_path(key, suffix).read_bytes()
            if hashlib.sha256(data).hexdigest() != digest:
                raise _Unusable(f"{suffix} content does not match its checksum")
            blobs[suffix] = data
        ptx = blobs[".ptx"].decode()
        image = blobs[".cubin"] if kind == "cubin" else ptx.encode() + b"\0"
        arch = tuple(meta["arch"]) if meta["arch"] is not None else None
        return CompiledKernel(kind, image, ptx, entry, key, arch, tuple(meta["nvrtc_version"]), meta["log"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        # RecursionError: json of a deeply nested document; ValueError covers bad JSON/UTF-8
        _log.debug("ignoring unusable kernel cache entry %s: %s", meta_path, type(exc).__name__)
        return None


def _checked_meta(meta, key: str, entry: str):
    """``(kind, {suffix: sha256})`` of a metadata document, every field type-checked."""
    if not isinstance(meta, dict):
        raise _Unusable("metadata is not an object")
    if meta.get("format") != FORMAT or meta.get("key") != key or meta.get("entry") != entry:
        raise _Unusable("entry does not match its key")
    kind, sums = meta.get("kind"), meta.get("sha256")
    if kind not in ("cubin", "ptx") or not isinstance(sums, dict):
        raise _Unusable("unknown kind or checksums")
    wanted = {".ptx", ".cubin"} if kind == "cubin" else {".ptx"}
    if set(sums) != wanted or not all(isinstance(v, str) for v in sums.values()):
        raise _Unusable("checksums name other files")  # never read a path the entry names
    for field in ("arch", "nvrtc_version"):
        value = meta.get(field)
        if value is not None and not (
            isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value)
        ):
            raise _Unusable(f"{field} is not a (major, minor) pair")
    if meta.get("nvrtc_version") is None or not isinstance(meta.get("log"), str):
        raise _Unusable("missing compiler version or log")
    return kind, sums


def disk_store(compiled: CompiledKernel) -> None:
    """Write the entry (blobs first, the .json that validates them last); never raises."""
    blobs = {".ptx": (compiled.ptx or "").encode()}
    if compiled.kind == "cubin":
        blobs[".cubin"] = compiled.image
    meta = {
        "format": FORMAT,
        "key": compiled.key,
        "kind": compiled.kind,
        "entry": compiled.entry,
        "arch": compiled.arch,
        "nvrtc_version": compiled.nvrtc_version,
        "log": compiled.log,
        "sha256": {s: hashlib.sha256(b).hexdigest() for s, b in blobs.items()},
    }
    blobs[".json"] = json.dumps(meta).encode()
    folder = cache_dir() / compiled.key[:2]
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
        why = "the kernel is compiled but will be recompiled in the next process"
        _log.warning("vyre_cuda: could not write kernel cache entry %s in %s (%s); %s", compiled.key, folder, exc, why)


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
    import tempfile  # noqa: PLC0415 (with shutil, bz2, lzma: ~10 ms; only a write needs it)

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def file_lock(key: str):
    """Hold ``<key>.lock`` exclusively if possible (other processes compiling ``key`` wait); yields
    whether it is held. The holder deletes the file before releasing it, and a process that locked
    a deleted file (its inode no longer at the path) starts over: no lock file outlives its
    compile and two holders never coexist."""
    try:
        import fcntl  # noqa: PLC0415 (POSIX only)
    except ImportError:
        yield False
        return
    path = _entry_path(key, ".lock")
    fd = _lock_file(fcntl, path, key)
    if fd is None:
        yield False  # a read-only folder, no flock, or a very slow other process
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)  # releases the flock


def _lock_file(fcntl, path: pathlib.Path, key: str):
    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.002
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() >= deadline:
                _log.warning(
                    "vyre_cuda: another process has compiled kernel %s for over %.0f s; compiling it here too",
                    key,
                    LOCK_WAIT_S,
                )
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            continue
        except OSError:
            os.close(fd)
            return None  # a file system without flock: duplicates are harmless
        try:
            held, now = os.fstat(fd), os.stat(path)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                return fd
        except OSError:
            pass  # deleted by the holder that just finished: lock the next file
        os.close(fd)


def _own_files(root: pathlib.Path):
    """Every file this cache writes under ``root``, recognised by exact name; nothing else."""
    try:
        folders = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False) and _FOLDER.match(e.name)]
    except OSError:
        return
    for folder in folders:
        try:
            entries = list(os.scandir(folder.path))
        except OSError:
            continue
        for item in entries:
            match = _ENTRY.match(item.name) or _TEMP.match(item.name)
            if match and match.group(1)[:2] == folder.name and item.is_file(follow_symlinks=False):
                yield pathlib.Path(item.path)


def cache_info() -> dict:
    """Counters and sizes of the kernel caches, as a dict.

    ``memory_entries``, ``memory_hits``, ``disk_hits``, ``compiles`` (NVRTC compilations; these
    four count this process only), ``dir`` (str), ``disk_enabled``, ``disk_entries``, ``disk_bytes``.

    >>> sorted(cache_info())[:3]
    ['compiles', 'dir', 'disk_bytes']
    """
    entries = size = 0
    for path in _own_files(cache_dir()):
        try:
            size += path.stat().st_size
        except OSError:
            continue
        entries += path.suffix == ".json"
    info: dict[str, object]
    with _lock:
        info = {"memory_entries": len(_memory), **_stats}
    info.update(dir=str(cache_dir()), disk_enabled=disk_enabled(), disk_entries=entries, disk_bytes=size)
    return info


def clear_cache(memory: bool = True, disk: bool = True) -> int:
    """Empty the memory cache and/or delete the disk cache's entries; return how many were deleted.

    Only files this cache writes are removed (``<2 hex>/<64 hex>.json|ptx|cubin|lock`` and its
    own temporary files), never a symlink, so a ``VYRE_CUDA_CACHE_DIR`` pointing at a shared
    folder loses nothing else. Hit and compile counters are not reset.

    >>> clear_cache(disk=False)
    0
    """
    if memory:
        with _lock:
            _memory.clear()
    removed = 0
    if disk:
        folders = set()
        for path in list(_own_files(cache_dir())):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += path.suffix == ".json"
            folders.add(path.parent)
        for folder in folders:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: anything else in it stays
    return removed
