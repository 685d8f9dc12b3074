"""The benchmark record's harness: ``vyre_cuda.profile`` plus everything only the record needs.

:func:`run_bench` is one ``vyre_cuda.profile.run_profile`` run (vyre_cuda's rows, the floors, the
ceilings, interleaved at each size) with the record's rows added to the same rounds, then the
patterns users are taught and the thread scaling on the same backend, and the targets:

* **peers** (:mod:`.peers`): cuda.bindings, CuPy, PyTorch and cuda.core, each skipped by name when
  not installed, and vyre_cuda on their device arrays;
* **the standalone C floor** (:mod:`.standalone`): the tight floor in a process of its own;
* **the streamed route** (:mod:`.streamed`): the elementwise vecadd streamed, the heavy kernel at
  256 MiB, the route the planner picks; the Program rebuilt per dispatch at the small sizes;
* **the patterns** (:mod:`.patterns`), **thread scaling** (:mod:`.threads`) and **targets**
  (:mod:`.targets`), ratios within the run.

It returns a :class:`~.records.BenchReport`, written as ``benchmarks/results/latest.json`` by
``benchmarks/bench_dispatch.py`` (the same schema as ``vyre-cuda profile --json``).
"""

from __future__ import annotations

import os

import numpy as np

from vyre_cuda import builtin_programs
from vyre_cuda.errors import ValidationError
from vyre_cuda.profile import engine, run, tight
from vyre_cuda.profile.report import ProfileReport
from vyre_cuda.profile.runners import page_locked_copies
from vyre_cuda.profile.session import import_floor, load_floor_kernel, open_backend

from . import standalone, streamed
from .peers import PEERS, VYRE_HOOKS, missing_reason, open_peer, peer_available, peer_version
from .records import BenchReport, PatternResult, ThreadScaling
from .standalone import GROUP as STANDALONE_GROUP
from .standalone import SERIES_FAMILIES
from .targets import SMALL_MAX, evaluate_pattern_targets, evaluate_targets
from .threads import measure_threads

__all__ = ["BenchReport", "PatternResult", "ThreadScaling", "rebuilt_runner", "run_bench"]


def run_bench(
    sizes=run.DEFAULT_SIZES,
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
) -> BenchReport:
    """The whole record in one run: ``run_profile``'s sizes with the peers, the standalone floor,
    the streamed rows and the rebuilt Program; then the patterns (``patterns``, built-in vecadd
    only), the thread scaling at the smallest size (``threads``) and the targets (``baseline``: a
    stored report or its path, for the no-regression target)."""
    if thread_count < 2 or thread_repeats < 1:
        raise ValidationError(
            f"thread_repeats must be >= 1 and thread_count >= 2 (got {thread_repeats}, {thread_count})",
            "keep the defaults (thread_count=4, thread_repeats=3)",
        )
    sizes = run.check_options(sizes, iterations, warmup, host_threads, rounds, backend, backend_options)
    base, base_path = (baseline, None) if baseline is None or isinstance(baseline, ProfileReport) else (None, baseline)
    if base_path is not None:
        base = ProfileReport.load(base_path)
    builtin = program is None
    floor_module = import_floor()
    owned = backend is None
    if owned:
        backend = open_backend(device, backend_options)
    weights = len(sizes) + (1 if threads else 0) + (1 if patterns and builtin else 0)
    extra = _Extra(peers, builtin)
    thread_result: ThreadScaling | None = None
    pattern_result: PatternResult | None = None
    kernel = None
    try:
        report = run.run_profile(
            sizes,
            iterations,
            warmup,
            program,
            run.scaled_progress(progress, 0.0, len(sizes) / weights),
            backend=backend,
            rounds=rounds,
            host_threads=host_threads,
            seed=seed,
            extra_rows=extra,
        )
        rng = np.random.default_rng(seed + 1)  # (the sizes drew from run_profile's own)
        if patterns and builtin:
            from .patterns import measure_patterns

            at = len(sizes) / weights
            pattern_result = measure_patterns(
                backend,
                floor_module.FLOOR_SOURCE,
                floor_module.FLOOR_ENTRY,
                peers=peers,
                rounds=rounds,
                rng=rng,
                progress=run.scaled_progress(progress, at, at + 1 / weights),
            )
        if threads:
            if program is None:
                program = builtin_programs.vecadd_f32()
            kernel, _image = load_floor_kernel(backend)
            nbytes = min(sizes)
            count = thread_iterations or iterations or engine.auto_iterations(nbytes)
            warm = warmup if warmup is not None else engine.auto_warmup(count)
            with engine.gc_paused():
                thread_result = measure_threads(
                    backend,
                    program,
                    floor_module,
                    kernel,
                    nbytes,
                    thread_count,
                    count,
                    warm,
                    thread_repeats,
                    rng,
                    run.scaled_progress(progress, (weights - 1) / weights, 1.0),
                )
    finally:
        try:
            if kernel is not None:
                kernel.close()
        finally:
            if owned:
                backend.close()
    report.meta["backend_options"] = dict(backend_options or {})
    report.meta["peers"] = {name: peer_version(name) for name in PEERS if peers and builtin}
    if base is not None:
        report.meta["baseline"] = {
            "path": _shown_path(base_path),
            "commit": base.meta.get("commit"),
            "date": base.meta.get("date"),
        }
    targets = evaluate_targets(report.sizes, thread_result, builtin, base) + evaluate_pattern_targets(pattern_result)
    return BenchReport(
        meta=report.meta,
        sizes=report.sizes,
        targets=targets,
        stage_names=report.stage_names,
        threads=thread_result,
        patterns=pattern_result,
    )


class _Extra:
    """The record's rows of one size (``run_profile``'s ``extra_rows``)."""

    def __init__(self, peers, builtin):
        self.peers, self.builtin = peers, builtin
        self.twin = None

    def __call__(self, size):
        backend, program = size.backend, size.program
        if self.builtin and self.twin is None:  # the built-in vecadd declared elementwise: the streamed rows'
            self.twin = streamed.elementwise_twin(program)
        rows = []
        if self.builtin and size.nbytes <= SMALL_MAX:
            rows.append(rebuilt_runner(backend, builtin_programs.vecadd_f32, size.inputs, size.check))
        if self.builtin:
            rows += streamed.streamed_runners(backend, self.twin, size.inputs, size.check, size.into, size.pinned)
            if size.pinned is None:
                size.skipped["streamed page-locked"] = size.skipped["page-locked"]
            planner = streamed.planner_route(backend, self.twin, size.inputs)
            size.on_result.append(lambda result: setattr(result, "planner", planner))
            if size.nbytes == streamed.HEAVY_SIZE:
                rows += self._heavy_rows(size)
        else:
            size.skipped["streamed"] = "the streamed rows run the built-in vecadd (declared elementwise) only"
        rows += self._standalone_rows(size)
        rows += self._peer_rows(size)
        size.on_result.append(lambda result: tight.add_fastest(result, SERIES_FAMILIES))
        return rows

    def _heavy_rows(self, size):
        import vyre_cuda

        device = size.backend.device
        if getattr(vyre_cuda, "pinned_empty", None) is None:
            size.skipped["heavy"] = "this vyre_cuda has no vyre_cuda.pinned_empty (the heavy rows are page-locked)"
            return []
        locked = lambda arrays: page_locked_copies(arrays, device)  # noqa: E731
        return streamed.heavy_runners(size.backend, size.program, self.twin, size.a, size.b, size.run.rng, locked)

    def _standalone_rows(self, size):
        """The standalone C floor process at the small sizes (closed with the peers)."""
        if size.nbytes > SMALL_MAX:
            return []
        process = standalone.open_standalone(size.run.image, size.nbytes, size.backend.device, size.skipped)
        if process is None:
            return []
        size.opened.append(process)
        return [engine.Runner("standalone C floor", lambda count: process.run(count), group=STANDALONE_GROUP)]

    def _peer_rows(self, size):
        if not self.peers:
            return []
        if not self.builtin:
            size.skipped.update(dict.fromkeys(PEERS, "peers run the built-in vecadd only"))
            return []
        fm, scale = size.run.floor_module, size.launch_scale
        rows = []
        for name in PEERS:
            if not peer_available(name):
                size.skipped[name] = missing_reason(name)
                continue
            try:
                peer = open_peer(
                    name, size.backend, size.run.image, fm.FLOOR_ENTRY, fm.FLOOR_SOURCE, size.a, size.b, size.expected
                )
            except Exception as exc:  # noqa: BLE001 (a broken peer must not stop the run)
                size.skipped[name] = f"failed to start: {type(exc).__name__}: {exc}".splitlines()[0]
                continue
            size.opened.append(peer)
            if hasattr(peer, "full"):
                rows.append(engine.Runner(f"peer {name}", peer.full, peer.verify, group=name))
            if hasattr(peer, "device_resident"):  # data already on the device, beside vyre_cuda's own
                rows.append(
                    engine.Runner(f"peer {name} device-resident", peer.device_resident, peer.verify, group=name)
                )
            rows += self._vyre_hook_rows(name, peer, size)
            if scale is not None and hasattr(peer, "launch_only"):
                rows.append(engine.Runner(f"peer {name} launch only", peer.launch_only, unit_scale=scale, group=name))
        return rows

    def _vyre_hook_rows(self, name, peer, size):
        """vyre_cuda on the peer's device arrays (the peer's VYRE_HOOKS). Each row is its own
        group: a failing one is skipped alone, the peer's own rows stay."""
        rows = []
        for hook, title, batched in VYRE_HOOKS:
            if not hasattr(peer, hook):
                continue
            group = f"{name} {hook}"
            # enqueue-only rows keep LAUNCH_BATCH dispatches in flight: small sizes only
            if batched and (size.launch_scale is None or size.nbytes > SMALL_MAX):
                continue
            try:
                run_fn, verify = getattr(peer, hook)(size.backend, size.program)
            except Exception as exc:  # noqa: BLE001 (a peer's arrays vyre_cuda refuses must not stop the run)
                size.skipped[group] = f"failed to start: {type(exc).__name__}: {exc}".splitlines()[0]
                continue
            scale = size.launch_scale if batched else 1
            rows.append(engine.Runner(title.format(name=name), run_fn, verify, unit_scale=scale, group=group))
        return rows


def rebuilt_runner(backend, program_factory, inputs, check):
    """``dispatch(program_factory(), inputs)``: the Program built again per dispatch
    (``vyre.rebuilt``) from its parts, as a function building its program does, so each one pays
    for building it (equal builds return the first build's object) and finding its plan."""
    import time

    pc, dispatch = time.perf_counter_ns, backend.dispatch
    last = {}

    def run_fn(count):
        walls = []
        for _ in range(count):
            t0 = pc()
            outs = dispatch(program_factory(), inputs)
            walls.append(pc() - t0)
            last["outs"] = outs  # freed outside the timed window
        return {"vyre.rebuilt": walls}

    verify = None if check is None else (lambda: check(last["outs"]))
    return engine.Runner("vyre_cuda dispatch, Program rebuilt", run_fn, verify)


def _shown_path(path) -> str | None:
    """A path as a report shows it: relative to the working folder when inside it (a stored report
    must not name the folders of the machine that made it), else its file name."""
    if path is None:  # a report object given as the baseline, not a file
        return None
    rel = os.path.relpath(os.path.abspath(path))
    return os.path.basename(path) if rel.startswith("..") else rel
