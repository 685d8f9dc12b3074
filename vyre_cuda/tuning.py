"""Opt-in launch-width autotune: measure a few block widths once, keep the fastest on disk.

:func:`tune` runs the program at each candidate width the device and kernel allow, keeps only the
widths whose output bytes match the declared width's, times them with device events (median of a
few runs) and caches the winner; ``DispatchConfig(autotune=True)`` then plans with it (without the
flag nothing changes). With no entry, an ``autotune=True`` dispatch tunes on its own inputs, never
on made-up data: zeros make every width of a width-assuming kernel agree. The output check is why
a kernel that assumes its width (a ``__shared__ float s[256]`` reduction) or is not bit-reproducible
(float atomics) keeps its declared width. Never tuned: ``workgroup_override``, ``grid_override``, a
multi-dimensional block, grid-sync / cooperative launches (their route depends on the width).

Entries are ``<kernel cache>/tuning/<key>.json``, written atomically, keyed on what changes the
winner (:func:`tune_key`); a corrupt entry, or one whose width no tune on this device could pick,
is ignored with a warning: nothing here raises on a bad cache. Measuring on the caller's inputs is
safe: a dispatch never writes them. See docs/guides/autotune.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass

from ._validate import check_int, is_int
from .compile import cache as _cache
from .config import DispatchConfig, as_config
from .errors import BackendError, DeviceLost, ValidationError

__all__ = [
    "CANDIDATES",
    "REPEATS",
    "TuneResult",
    "candidate_widths",
    "load",
    "size_class",
    "stats",
    "store",
    "tune",
    "tune_dir",
    "tune_key",
    "untunable",
]

CANDIDATES = (64, 128, 256, 512, 1024)
REPEATS = 5  # timed runs per candidate after one warm-up; the median is kept
FORMAT = 1  # the cache entry layout; a change makes older entries miss
_MAX_ENTRY_BYTES = 1 << 20

_log = logging.getLogger("vyre_cuda")
_lock = threading.Lock()
_memory: dict = {}  # key -> entry, so planning reads each file at most once per process
_stats = {"tunes_measured": 0, "timed_dispatches": 0, "cache_hits": 0, "corrupt_entries": 0, "invalid_entries": 0}


@dataclass(frozen=True)
class TuneResult:
    """The outcome of :func:`tune`: the winning ``block``, median device ``timings_ns`` per measured
    width, why each other candidate was ``rejected``, the declared width (``baseline``), and
    whether it was read from the cache (``cached``: nothing was measured)."""

    block: int
    key: str
    size_class: int
    baseline: int
    timings_ns: dict
    rejected: dict
    cached: bool

    @property
    def speedup(self) -> float:
        """Baseline median time over the winner's (1.0 when either was not measured)."""
        base, best = self.timings_ns.get(self.baseline), self.timings_ns.get(self.block)
        return base / best if base and best else 1.0


def stats() -> dict:
    """This process's counters: tunes measured, timed dispatches, cache hits (tunes and plans),
    corrupt entries and invalid entries (a width no tune on this device picks) ignored."""
    with _lock:
        return dict(_stats)


def _count(name: str, n: int = 1) -> None:
    with _lock:
        _stats[name] += n


def size_class(elements: int) -> int:
    """The launch element count rounded up to a power of two: one tuning entry per class.

    >>> size_class(1000), size_class(1024), size_class(1025), size_class(0)
    (1024, 1024, 2048, 1)
    """
    return 1 << max(0, int(elements) - 1).bit_length()


def untunable(program, config: DispatchConfig) -> str | None:
    """Why a dispatch's width is not tuned, or None when it may be."""
    if config.workgroup_override is not None:
        return f"workgroup_override={config.workgroup_override} is explicit"
    if config.grid_override is not None:
        return f"grid_override={config.grid_override} fixes the grid"
    if program.grid_sync or config.cooperative:
        return "grid-sync and cooperative launches keep their width (co-residency depends on it)"
    if tuple(program.workgroup_size[1:]) != (1, 1):
        return f"workgroup_size {program.workgroup_size} is multi-dimensional"
    return None


def candidate_widths(candidates, caps, kernel_max: int, baseline: int) -> tuple:
    """``(widths, rejected)``: the candidates (plus the baseline, always kept: it is the reference)
    the device and kernel allow, ascending, and ``{width: reason}`` for the others."""
    if isinstance(candidates, (int, str)) or not candidates:
        raise ValidationError(
            f"candidates must be a non-empty sequence of block widths (got {candidates!r})",
            "pass candidates=(64, 128, 256, 512, 1024) or a subset",
        )
    widths, rejected = [], {}
    for width in (*candidates, baseline):
        if not is_int(width, numpy=False) or width <= 0:
            raise ValidationError(
                f"block width candidates must be positive ints (got {width!r} in {tuple(candidates)!r})",
                "pass candidates=(64, 128, 256, 512, 1024) or a subset",
            )
        limits = (
            (caps.max_threads_per_block, "threads per block on this device"),
            (caps.max_block_dim[0], "block x dimension on this device"),
            (kernel_max, "threads per block for this kernel (its registers and shared memory)"),
        )
        over = [f"over the {limit} {what}" for limit, what in limits if width > limit]
        if over:
            rejected[width] = "; ".join(over)
        elif width % caps.warp_size:
            rejected[width] = f"not a multiple of the warp size {caps.warp_size}"
        elif width not in widths:
            widths.append(width)
    if baseline not in widths:
        rejected.pop(baseline, None)
        widths.append(baseline)
    return tuple(sorted(widths)), rejected


def _launch_rule(rule) -> str:
    if rule is None or isinstance(rule, str):
        return repr(rule)
    return f"{getattr(rule, '__module__', '')}.{getattr(rule, '__qualname__', repr(rule))}"


def tune_key(program, caps, sizes: int) -> str:
    """The tuning cache key of ``program`` on a device of ``caps`` at size class ``sizes``."""
    material = {
        "format": FORMAT,
        "vyre_cuda": _cache._package_version(),
        "kernel": program.kernel.digest,
        "workgroup_size": list(program.workgroup_size),
        "phases": program.phases,
        "launch": _launch_rule(program.launch),
        "buffers": [
            [d.name, d.binding, str(d.access), d.dtype.name, d.count, bool(d.output), repr(d.output_byte_range)]
            for d in program.buffers
        ],
        "device": [caps.name, list(caps.cc)],
        "size_class": sizes,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def tune_dir():
    """Folder of the tuning cache: ``tuning/`` inside the kernel cache folder."""
    return _cache.cache_dir() / "tuning"


def _path(key: str):
    return tune_dir() / f"{key}.json"


def load(key: str) -> dict | None:
    """The cached entry of ``key`` (``block``, ``timings_ns``, ...), or None (also for a corrupt or
    mismatched file, with a warning)."""
    with _lock:
        hit = _memory.get(key)
    if hit is not None or not _cache.disk_enabled():
        return hit
    path = _path(key)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_ENTRY_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _log.warning("tuning cache: cannot read %s (%s); tuning again", path, exc)
        return None
    try:
        if len(data) > _MAX_ENTRY_BYTES:
            raise ValueError(f"{len(data)} bytes is not an entry of this cache")
        entry = json.loads(data)
        _check_entry(entry, key)
    except (ValueError, TypeError, KeyError) as exc:
        _count("corrupt_entries")
        _log.warning("tuning cache: ignoring %s (%s); the next tune rewrites it", path, exc)
        return None
    with _lock:
        _memory[key] = entry
    return entry


def _check_entry(entry, key: str) -> None:
    if not isinstance(entry, dict):
        raise ValueError("not a JSON object")
    if entry.get("format") != FORMAT or entry.get("key") != key:
        raise ValueError("format or key does not match")
    block = entry["block"]
    if not is_int(block, numpy=False) or not 0 < block <= 1 << 16:
        raise ValueError(f"block {block!r} is not a width")
    if not isinstance(entry.get("timings_ns"), dict) or not isinstance(entry.get("rejected"), dict):
        raise ValueError("timings or rejections missing")


def store(key: str, entry: dict) -> None:
    """Keep ``entry`` for ``key`` in memory, and on disk unless VYRE_CUDA_DISK_CACHE=0 (a write
    that fails is logged: the entry lives for this process only)."""
    entry = {**entry, "format": FORMAT, "key": key}
    _check_entry(entry, key)
    with _lock:
        _memory[key] = entry
    if not _cache.disk_enabled():
        return
    path = _path(key)
    try:
        tune_dir().mkdir(parents=True, exist_ok=True)
        _cache._atomic_write(path, json.dumps(entry, sort_keys=True, indent=1).encode())
    except OSError as exc:
        _log.warning("tuning cache: cannot write %s (%s); the winner is kept for this process only", path, exc)


def _kernel_max(backend, function) -> int:
    from . import _driver  # noqa: PLC0415 (the compiled driver module loads at first use)

    _driver.make_current(backend.context_handle)  # planning may have run on another thread
    return _driver.function_max_threads(function)


def _usable(key: str, caps, kernel_max: int, baseline: int) -> tuple:
    """``(entry or None, why it was ignored or None)``: the cached entry (counted as a hit) if a tune
    on this device could have chosen its width (:func:`candidate_widths`' rules)."""
    entry = load(key)
    if entry is None:
        return None, None
    block = entry["block"]  # an int in 1..65536 (load checked it)
    problem = candidate_widths((block,), caps, kernel_max, baseline)[1].get(block)
    if problem is None:
        _count("cache_hits")
        return entry, None
    _count("invalid_entries")
    why = f"block {block} is {problem} (declared width {baseline})"
    _log.warning("tuning cache: ignoring %s: %s; no tune on this device picks it", _path(key), why)
    return None, why


def forget_memory() -> None:
    """Drop the in-process copies (tests; a cleared disk cache is read again)."""
    with _lock:
        _memory.clear()


def _same(outputs, reference) -> bool:
    return len(outputs) == len(reference) and all(
        a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        for a, b in zip(outputs, reference, strict=True)
    )


def _result(entry: dict, key: str, cached: bool) -> TuneResult:
    return TuneResult(
        block=entry["block"],
        key=key,
        size_class=entry.get("size_class", 0),
        baseline=entry.get("baseline", entry["block"]),
        timings_ns={int(w): ns for w, ns in entry["timings_ns"].items()},
        rejected={int(w): why for w, why in entry["rejected"].items()},
        cached=cached,
    )


def tune(backend, program, inputs, config=None, candidates=CANDIDATES, *, repeats: int = REPEATS, force=False):
    """Measure ``program``'s candidate block widths on ``inputs``, cache and return the fastest
    (:class:`TuneResult`); a cached entry is returned unless ``force``. Raises ValidationError for
    a dispatch whose width is never tuned (:func:`untunable`).
    """
    # statistics (with decimal, fractions, random) costs ~20 ms to import: only a tune pays it
    import statistics  # noqa: PLC0415

    # host outputs: the candidates' output bytes are compared
    cfg = dataclasses.replace(as_config(config), autotune=False, outputs="host")
    why = untunable(program, cfg)
    if why is not None:
        raise ValidationError(
            f"this dispatch's block width is not tuned: {why}",
            "tune without workgroup_override / grid_override, and only programs without grid sync "
            "with a 1-D workgroup_size",
        )
    check_int("repeats", repeats, minimum=1, maximum=1000, numpy=False, fix="pass repeats=5")
    plan = backend.plan_info(program, inputs, cfg)
    caps = backend.caps
    sizes = size_class(plan.launch.element_count)
    key = tune_key(program, caps, sizes)
    baseline = plan.launch.block[0]
    kernel_max = _kernel_max(backend, plan.function)
    if not force:
        entry = _usable(key, caps, kernel_max, baseline)[0]  # an unusable entry is measured again
        if entry is not None:
            return _result(entry, key, cached=True)
    widths, rejected = candidate_widths(tuple(candidates), caps, kernel_max, baseline)
    # the backend's measuring step plans per width, uncached and without re-entering dispatch():
    # this may run while a dispatch is planned
    reference = backend._measurer(program, inputs, cfg)().outputs
    timings = {}
    for width in widths:
        wcfg = dataclasses.replace(cfg, workgroup_override=(width, 1, 1))
        try:
            run = backend._measurer(program, inputs, wcfg)
            warm = run()
        except DeviceLost:
            raise
        except BackendError as exc:  # e.g. out of resources at this width: not a candidate
            rejected[width] = f"{type(exc).__name__}: {exc.message}"
            continue
        if not _same(warm.outputs, reference):
            rejected[width] = f"its outputs differ from those of the declared width {baseline}"
            continue
        samples = [run().device_ns for _ in range(repeats)]
        _count("timed_dispatches", repeats + 1)
        timings[width] = int(statistics.median(samples))
    # fastest first; on a tie the declared width, then the narrower one
    winner = min(timings, key=lambda w: (timings[w], w != baseline, w)) if timings else baseline
    entry = {
        "block": winner,
        "baseline": baseline,
        "size_class": sizes,
        "elements": plan.launch.element_count,
        "timings_ns": {str(w): ns for w, ns in timings.items()},
        "rejected": {str(w): why for w, why in rejected.items()},
        "device": caps.name,
        "cc": list(caps.cc),
        "program": program.name or program.kernel.entry,
        "measured_at": time.time(),
    }
    store(key, entry)
    _count("tunes_measured")
    _log.info(
        "tuned %s at %d elements (class %d): block %d (declared %d) %s",
        entry["program"],
        plan.launch.element_count,
        sizes,
        winner,
        baseline,
        " ".join(f"{w}={ns / 1000:.1f}us" for w, ns in sorted(timings.items())),
    )
    return _result(entry, key, cached=False)


def planned_width(backend, program, lengths, config, base_plan, inputs=None) -> tuple:
    """``(block width or None, reason)`` for a plan under ``autotune=True``: the cached winner,
    else :func:`tune`'s on the dispatch's own ``inputs``; with ``inputs`` None (a plan from byte
    ``lengths``) the declared width (None): made-up data cannot show a width's outputs match."""
    why = untunable(program, config)
    if why is not None:
        return None, f"not tuned: {why}"
    caps, baseline = backend.caps, base_plan.launch.block[0]
    key = tune_key(program, caps, size_class(base_plan.launch.element_count))
    entry, ignored = _usable(key, caps, _kernel_max(backend, base_plan.function), baseline)
    if entry is not None:
        return entry["block"], f"block {entry['block']} from the tuning cache (key {key[:12]})"
    note = f"; the cached entry was ignored: {ignored}" if ignored else ""
    if inputs is None:
        return None, (
            f"declared block {baseline}: no usable tuning entry (key {key[:12]}) and no inputs to measure "
            f"on{note}; call CudaBackend.tune(program, inputs) to measure on real data"
        )
    result = tune(backend, program, inputs, config, force=True)
    return result.block, f"block {result.block} measured now on this dispatch's inputs (key {key[:12]}){note}"
