"""One profile run: every size, every system, the ceilings and the thread scaling, interleaved."""

from __future__ import annotations

import datetime
import gc
import os
import warnings

import numpy as np

from .._validate import check_int
from ..errors import BackendError, ValidationError
from . import _hooks, engine, runners, streamed, tight
from .peers import PEERS, VYRE_HOOKS, missing_reason, open_peer, peer_available, peer_version
from .report import ProfileReport
from .session import import_floor, load_floor_kernel, meta, open_backend
from .specs import GIB, KIB, MIB, format_size, parse_sizes
from .targets import SMALL_MAX, evaluate_pattern_targets, evaluate_targets
from .threads import measure_threads

__all__ = ["DEFAULT_SIZES", "import_floor", "load_floor_kernel", "run_profile"]

DEFAULT_SIZES = (4 * KIB, 4 * MIB, 64 * MIB, 256 * MIB, 1 * GIB)
# Telemetry counters compared before and after the timed dispatches of a size, and levels read
# after them (names the core may not have yet are skipped).
_COUNTERS = (
    "dispatches",
    "pinned_alloc_calls",
    "device_alloc_calls",
    "pinned_pool_misses",
    "device_pool_misses",
    "staged_h2d_bytes",
    "direct_h2d_bytes",
    "staged_d2h_bytes",
    "direct_d2h_bytes",
    "ring_chunks",
    "graph_replays",  # timed dispatches that replayed a graph (a one-launch plan whose trial kept it)
)
_LEVELS = ("ring_bytes", "copy_threads_live")


def default_host_threads() -> int:
    """Threads of the N-thread memcpy ceiling: the CPUs, at most 16."""
    return max(1, min(16, os.cpu_count() or 1))


def _progress_scaled(progress, lo, hi, prefix=""):
    if progress is None:
        return None

    def inner(label, fraction):
        progress(prefix + label, lo + (hi - lo) * min(max(fraction, 0.0), 1.0))

    return inner


def _snapshot(backend):
    telemetry = getattr(backend, "telemetry", None)
    return None if telemetry is None else dict(telemetry.snapshot())


def _telemetry_delta(before, after) -> dict:
    if not before or not after:
        return {}
    out = {k: int(after[k]) - int(before[k]) for k in _COUNTERS if k in before and k in after}
    out.update({k: int(after[k]) for k in _LEVELS if k in after})
    return out


def _check_count(name, value, minimum):
    if value is None:
        return
    check_int(
        name,
        value,
        minimum=minimum,
        expected=f"an integer >= {minimum}",
        fix=f"pass {name} as a whole number >= {minimum}",
    )


def _baseline_of(baseline):
    if baseline is None or isinstance(baseline, ProfileReport):
        return baseline, None
    return ProfileReport.load(baseline), str(baseline)


def run_profile(
    sizes=DEFAULT_SIZES,
    iterations=None,
    warmup=None,
    program=None,
    peers=True,
    threads=True,
    progress=None,
    *,
    device=0,
    backend=None,
    backend_options=None,
    rounds=5,
    thread_count=4,
    thread_iterations=None,
    thread_repeats=3,
    host_threads=None,
    baseline=None,
    seed=0,
    patterns=True,
) -> ProfileReport:
    """Measure vyre_cuda, the floor, the transfer ceilings and the peers at each size, in one
    run.

    Parameters
    ----------
    sizes : iterable of int or str
        Bytes per buffer (``4096``, ``"4KiB"``, ``"1GiB"``...), each a multiple of 4 (the floor
        moves float32). Default: 4 KiB, 4 MiB, 64 MiB, 256 MiB and 1 GiB.
    iterations : int, optional
        Timed samples per system and size (default: scaled with the size, from 2,000 at 4 KiB
        down to 5 at 1 GiB).
    warmup : int, optional
        Untimed samples per system first (default: a tenth of ``iterations``, at most 200).
    program : vyre_cuda.Program, optional
        A user program instead of the built-in vecadd; peers, the streamed rows and targets are
        vecadd-only and are skipped, and the floor stays the vecadd loop moving the same bytes
        per buffer. The heavy kernel's rows run at 256 MiB (``streamed.HEAVY_SIZE``) only.
    peers, threads : bool
        Measure the peers, and the thread scaling (at the smallest size).
    progress : callable, optional
        ``progress(label, fraction)`` with ``fraction`` in 0..1, called as the run advances.
    device : int
        The CUDA device of the backend created for the run (ignored when ``backend`` is given).
    backend : vyre_cuda.CudaBackend, optional
        Use this open backend (it stays open) instead of creating one.
    backend_options : dict, optional
        Keyword arguments for the ``CudaBackend`` the run creates (e.g. ``copy_threads``).
    rounds : int
        The timed samples of each system are split into this many interleaved rounds.
    host_threads : int, optional
        Threads of the N-thread host memcpy ceiling (default: the CPUs, at most 16); the
        1-thread ceiling is always measured.
    baseline : ProfileReport or path, optional
        A stored result: the small sizes' vyre_cuda / floor ratio must not grow past it.
    patterns : bool
        Also measure the patterns users are taught, beside their peers
        (:mod:`vyre_cuda.profile.patterns`; built-in vecadd only).

    Returns
    -------
    ProfileReport
    """
    size_list = parse_sizes(sizes)
    for nbytes in size_list:
        if nbytes % 4:
            raise ValidationError(
                f"size {nbytes} bytes is not a whole number of float32 elements (4 bytes each)",
                "pass sizes that are multiples of 4 bytes, e.g. 4KiB",
            )
    _check_count("iterations", iterations, 1)
    _check_count("warmup", warmup, 0)
    _check_count("host_threads", host_threads, 1)
    if rounds < 1 or thread_count < 2 or thread_repeats < 1:
        raise ValidationError(
            f"rounds and thread_repeats must be >= 1 and thread_count >= 2 (got {rounds}, "
            f"{thread_repeats}, {thread_count})",
            "keep the defaults (rounds=5, thread_count=4, thread_repeats=3)",
        )
    if backend is not None and backend_options:
        raise ValidationError(
            f"backend_options {sorted(backend_options)} apply to the backend the run creates, but a backend was passed",
            "configure the CudaBackend you pass, or pass no backend",
        )
    base, base_path = _baseline_of(baseline)
    n_threads = host_threads or default_host_threads()
    thread_counts = (1,) if n_threads == 1 else (1, n_threads)
    floor_module = import_floor()
    stages = _hooks.stage_names()

    builtin = program is None
    owned = backend is None
    if owned:
        backend = open_backend(device, backend_options)
    started = datetime.datetime.now(datetime.timezone.utc)
    rng = np.random.default_rng(seed)
    report_sizes = []
    thread_result = None
    pattern_result = None
    kernel = None
    try:
        if builtin:
            from .. import builtin_programs

            program = builtin_programs.vecadd_f32()
        label = (
            "vecadd_f32 (built-in)"
            if builtin
            else (f"{program.name or 'user program'} ({program.kernel.kind}, entry {program.kernel.entry!r})")
        )
        kernel, image = load_floor_kernel(backend)
        run = _SizeRun(
            backend, program, builtin, kernel, image, floor_module, rounds, peers, stages, thread_counts, rng
        )
        weights = len(size_list) + (1 if threads else 0) + (1 if patterns and builtin else 0)
        for index, nbytes in enumerate(size_list):
            count = iterations or engine.auto_iterations(nbytes)
            warm = warmup if warmup is not None else engine.auto_warmup(count)
            sub = _progress_scaled(progress, index / weights, (index + 1) / weights, f"{format_size(nbytes)}: ")
            report_sizes.append(run.measure(nbytes, count, warm, sub))
        if patterns and builtin:  # (before the threads, whose progress ends the run)
            from .patterns import measure_patterns

            at = len(size_list) / weights
            pattern_result = measure_patterns(
                backend,
                floor_module.FLOOR_SOURCE,
                floor_module.FLOOR_ENTRY,
                peers=peers,
                rounds=rounds,
                rng=rng,
                progress=_progress_scaled(progress, at, at + 1 / weights),
            )
        if threads:
            nbytes = min(size_list)
            count = thread_iterations or iterations or engine.auto_iterations(nbytes)
            warm = warmup if warmup is not None else engine.auto_warmup(count)
            sub = _progress_scaled(progress, (weights - 1) / weights, 1.0)
            with engine.gc_paused():
                thread_result = measure_threads(
                    backend, program, floor_module, kernel, nbytes, thread_count, count, warm, thread_repeats, rng, sub
                )
        settings = {
            "iterations": iterations,
            "warmup": warmup,
            "rounds": rounds,
            "program": label,
            "builtin_program": builtin,
            "host_threads": list(thread_counts),
            "backend_options": dict(backend_options or {}),
            "peers": {name: peer_version(name) for name in PEERS if peers and builtin},
        }
        if base is not None:
            settings["baseline"] = {
                "path": _shown_path(base_path),
                "commit": base.meta.get("commit"),
                "date": base.meta.get("date"),
            }
        run_meta = meta(backend, settings, started)
    finally:
        try:
            if kernel is not None:
                kernel.close()
        finally:
            if owned:
                backend.close()
    return ProfileReport(
        meta=run_meta,
        sizes=report_sizes,
        threads=thread_result,
        targets=evaluate_targets(report_sizes, thread_result, builtin, base) + evaluate_pattern_targets(pattern_result),
        stage_names=stages,
        patterns=pattern_result,
    )


class _SizeRun:
    """What stays the same from one size to the next: the backend, the program, the floor."""

    def __init__(
        self, backend, program, builtin, kernel, image, floor_module, rounds, peers, stage_names, thread_counts, rng
    ):
        self.backend = backend
        self.program = program
        self.builtin = builtin
        self.kernel = kernel
        self.image = image
        self.floor_module = floor_module
        self.rounds = rounds
        self.peers = peers
        self.stage_names = stage_names
        self.thread_counts = thread_counts
        self.rng = rng
        # the built-in vecadd declared elementwise: the streamed rows' program
        self.twin = streamed.elementwise_twin(program) if builtin else None

    def measure(self, nbytes, count, warm, progress):
        n = nbytes // 4
        a = self.rng.random(n, dtype=np.float32)
        b = self.rng.random(n, dtype=np.float32)
        expected = a + b
        inputs = [a, b] if self.builtin else runners.make_inputs(self.program, nbytes, self.rng)
        skipped: dict[str, str] = {}  # system -> why it was not measured
        opened: list = []  # the peers started, closed in reverse order
        floor = self.floor_module.Floor(self.kernel, n)
        try:
            rows, moved, planner, floor_inputs = self._vyre_rows(inputs, expected, skipped)
            if self.builtin and nbytes == streamed.HEAVY_SIZE:
                rows += self._heavy_rows(a, b, skipped)
            launch_scale = max(1, count // max(8, count // 64)) if nbytes <= engine.LAUNCH_ONLY_MAX else None
            locked = self._floor_locked(a, b, floor_inputs, skipped)
            rows += runners.floor_runners(floor, a, b, expected, launch_scale, locked)
            rows += tight.tight_runners(floor, a, b, expected)
            rows += self._standalone_rows(nbytes, skipped, opened)
            rows += runners.ceiling_runners(floor, a, b, self.thread_counts)
            rows += self._peer_rows(a, b, expected, launch_scale, skipped, opened)
            marks: dict[str, dict | None] = {}  # "before": the telemetry before the timed rounds
            with engine.gc_paused():
                samples = engine.run_rounds(
                    rows,
                    count,
                    warm,
                    self.rounds,
                    progress,
                    failed=skipped,
                    before_timed=lambda: marks.update(before=_snapshot(self.backend)),
                )
            tight.add_fastest(samples)
            telemetry = _telemetry_delta(marks.get("before"), _snapshot(self.backend))
        finally:
            try:
                for peer in reversed(opened):
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            peer.close()
                    except Exception:  # noqa: BLE001, S110 (measurement is over; leak, not fail)
                        pass
            finally:
                floor.close()
        result = engine.assemble(nbytes, n, count, samples, self.stage_names, skipped)
        result.moved = moved
        result.telemetry = telemetry
        result.planner = planner
        del rows, samples
        gc.collect()  # large arrays (page-locked ones included) go before the next size
        return result

    def _vyre_rows(self, inputs, expected, skipped):
        program, backend = self.program, self.backend
        first = backend.dispatch(program, inputs)  # the outputs' shapes and dtypes
        into = [np.empty_like(o) for o in first]
        moved = {
            "floor": (2 * expected.nbytes, expected.nbytes),
            "vyre": (sum(x.nbytes for x in inputs), sum(o.nbytes for o in first)),
        }
        del first
        check = None
        if self.builtin:

            def check(outs):
                return len(outs) == 1 and np.array_equal(np.asarray(outs[0]), expected)

        pinned = None
        try:
            locked_in = runners.page_locked_copies(inputs, backend.device)
            if locked_in is None:
                skipped["page-locked"] = "this vyre_cuda has no vyre_cuda.pinned_empty"
            else:
                pinned = (locked_in, runners.page_locked_copies(into, backend.device))
        except BackendError as exc:
            skipped["page-locked"] = f"failed to allocate: {type(exc).__name__}: {exc}"
        # a user program's outputs may not suit dispatch_into (read-write buffers): skip, not fail
        group = None if self.builtin else "dispatch_into"
        rows = runners.vyre_runners(backend, program, inputs, check, into, pinned, group)
        planner = {}
        if self.builtin and expected.nbytes <= SMALL_MAX:
            from .. import builtin_programs

            rows.append(runners.rebuilt_runner(backend, builtin_programs.vecadd_f32, inputs, check))
        if self.builtin:
            rows += streamed.streamed_runners(backend, self.twin, inputs, check, into, pinned)
            if pinned is None:
                skipped["streamed page-locked"] = skipped["page-locked"]
            planner = streamed.planner_route(backend, self.twin, inputs)
        else:
            skipped["streamed"] = "the streamed rows run the built-in vecadd (declared elementwise) only"
        # the built-in vecadd's page-locked inputs are copies of a and b: the issued floor reads them too
        floor_inputs = pinned[0] if pinned is not None and self.builtin else None
        return rows, moved, planner, floor_inputs

    def _floor_locked(self, a, b, locked_in, skipped):
        """Page-locked ``a``, ``b`` (``locked_in`` when given: vyre_cuda's page-locked row's copies,
        never written) and a page-locked output for the issued floor (``floor.pinned_direct``),
        or None (then skipped, with the reason)."""
        try:
            arrays = [np.zeros_like(a)] if locked_in is not None else [a, b, np.zeros_like(a)]
            locked = runners.page_locked_copies(arrays, self.backend.device)
        except BackendError as exc:
            skipped["floor pinned arrays"] = f"failed to allocate: {type(exc).__name__}: {exc}"
            return None
        if locked is None:
            skipped["floor pinned arrays"] = "this vyre_cuda has no vyre_cuda.pinned_empty"
            return None
        return (*locked_in, *locked) if locked_in is not None else tuple(locked)

    def _standalone_rows(self, nbytes, skipped, opened):
        """The standalone C floor process at the small sizes (closed with the peers)."""
        if nbytes > SMALL_MAX:
            return []
        process = tight.open_standalone(self.image, nbytes, self.backend.device, skipped)
        if process is None:
            return []
        opened.append(process)
        return [tight.standalone_runner(process)]

    def _heavy_rows(self, a, b, skipped):
        import vyre_cuda

        device = self.backend.device
        if getattr(vyre_cuda, "pinned_empty", None) is None:
            skipped["heavy"] = "this vyre_cuda has no vyre_cuda.pinned_empty (the heavy rows are page-locked)"
            return []
        return streamed.heavy_runners(
            self.backend,
            self.program,
            self.twin,
            a,
            b,
            self.rng,
            lambda arrays: runners.page_locked_copies(arrays, device),
        )

    def _peer_rows(self, a, b, expected, launch_scale, skipped, opened):
        if not self.peers:
            return []
        if not self.builtin:
            skipped.update(dict.fromkeys(PEERS, "peers run the built-in vecadd only"))
            return []
        fm = self.floor_module
        rows = []
        for name in PEERS:
            if not peer_available(name):
                skipped[name] = missing_reason(name)
                continue
            try:
                peer = open_peer(name, self.backend, self.image, fm.FLOOR_ENTRY, fm.FLOOR_SOURCE, a, b, expected)
            except Exception as exc:  # noqa: BLE001 (a broken peer must not stop the run)
                skipped[name] = f"failed to start: {type(exc).__name__}: {exc}".splitlines()[0]
                continue
            opened.append(peer)
            if hasattr(peer, "full"):
                rows.append(engine.Runner(f"peer {name}", peer.full, peer.verify, group=name))
            if hasattr(peer, "device_resident"):  # data already on the device, beside vyre_cuda's own
                resident = engine.Runner(f"peer {name} device-resident", peer.device_resident, peer.verify, group=name)
                rows.append(resident)
            rows += self._vyre_hook_rows(name, peer, a.nbytes, launch_scale, skipped)
            if launch_scale is not None and hasattr(peer, "launch_only"):
                rows.append(
                    engine.Runner(f"peer {name} launch only", peer.launch_only, unit_scale=launch_scale, group=name)
                )
        return rows

    def _vyre_hook_rows(self, name, peer, nbytes, launch_scale, skipped):
        """vyre_cuda on the peer's device arrays (the peer's :data:`~.peers.VYRE_HOOKS`). Each
        row is its own group: a failing one is skipped alone, the peer's own rows stay."""
        rows = []
        for hook, title, batched in VYRE_HOOKS:
            if not hasattr(peer, hook):
                continue
            group = f"{name} {hook}"
            # enqueue-only rows keep LAUNCH_BATCH dispatches in flight: small sizes only
            if batched and (launch_scale is None or nbytes > SMALL_MAX):
                continue
            try:
                run, verify = getattr(peer, hook)(self.backend, self.program)
            except Exception as exc:  # noqa: BLE001 (a peer's arrays vyre_cuda refuses must not stop the run)
                skipped[group] = f"failed to start: {type(exc).__name__}: {exc}".splitlines()[0]
                continue
            scale = launch_scale if batched else 1
            rows.append(engine.Runner(title.format(name=name), run, verify, unit_scale=scale, group=group))
        return rows


def _shown_path(path) -> str | None:
    """A path as a report shows it: relative to the working folder when inside it (a stored report
    must not name the folders of the machine that made it), else its file name."""
    if path is None:  # a report object given as the baseline, not a file
        return None
    rel = os.path.relpath(os.path.abspath(path))
    return os.path.basename(path) if rel.startswith("..") else rel
