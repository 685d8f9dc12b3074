"""One profile run: every size, vyre_cuda's rows, the floors and the ceilings, interleaved."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import types
import warnings

import numpy as np

from .._validate import check_int
from ..errors import BackendError, ValidationError
from . import engine, runners, session, tight
from .report import ProfileReport
from .session import import_floor, load_floor_kernel, meta, open_backend
from .specs import GIB, KIB, MIB, format_size, parse_sizes

__all__ = ["DEFAULT_SIZES", "check_options", "run_profile", "scaled_progress"]

DEFAULT_SIZES = (4 * KIB, 4 * MIB, 64 * MIB, 256 * MIB, 1 * GIB)
# Telemetry counters compared before and after the timed dispatches of a size, and levels read
# after them (names the core may not have yet are skipped).
# graph_replays: timed dispatches that replayed a graph (a one-launch plan whose trial kept it)
_COUNTERS: tuple[str, ...] = ("dispatches", "pinned_alloc_calls", "device_alloc_calls", "pinned_pool_misses")
_COUNTERS += ("device_pool_misses", "staged_h2d_bytes", "direct_h2d_bytes", "staged_d2h_bytes", "direct_d2h_bytes")
_COUNTERS += ("ring_chunks", "graph_replays")
_LEVELS = ("ring_bytes", "copy_threads_live")


def scaled_progress(progress, lo, hi, prefix=""):
    """``progress`` with its fractions mapped into ``lo..hi`` and its labels prefixed (or None)."""
    if progress is None:
        return None
    return lambda label, f: progress(prefix + label, lo + (hi - lo) * min(max(f, 0.0), 1.0))


def check_options(sizes, iterations=None, warmup=None, host_threads=None, rounds=5, backend=None, backend_options=None):
    """The parsed sizes of a run, once every option is checked (a ValidationError before any
    device work)."""
    size_list = parse_sizes(sizes)
    for nbytes in size_list:
        if nbytes % 4:
            raise ValidationError(
                f"size {nbytes} bytes is not a whole number of float32 elements (4 bytes each)",
                "pass sizes that are multiples of 4 bytes, e.g. 4KiB",
            )
    for name, value, minimum in (
        ("iterations", iterations, 1),
        ("warmup", warmup, 0),
        ("host_threads", host_threads, 1),
    ):
        if value is not None:
            fix = f"pass {name} as a whole number >= {minimum}"
            check_int(name, value, minimum=minimum, expected=f"an integer >= {minimum}", fix=fix)
    if rounds < 1:
        raise ValidationError(f"rounds must be >= 1 (got {rounds})", "keep the default (rounds=5)")
    if backend is not None and backend_options:
        raise ValidationError(
            f"backend_options {sorted(backend_options)} apply to the backend the run creates, but a backend was passed",
            "configure the CudaBackend you pass, or pass no backend",
        )
    return size_list


def _snapshot(backend):
    telemetry = getattr(backend, "telemetry", None)
    return None if telemetry is None else dict(telemetry.snapshot())


def _telemetry_delta(before, after) -> dict:
    if not before or not after:
        return {}
    out = {k: int(after[k]) - int(before[k]) for k in _COUNTERS if k in before and k in after}
    out.update({k: int(after[k]) for k in _LEVELS if k in after})
    return out


def run_profile(
    sizes=DEFAULT_SIZES,
    iterations=None,
    warmup=None,
    program=None,
    progress=None,
    *,
    device=0,
    backend=None,
    backend_options=None,
    rounds=5,
    host_threads=None,
    seed=0,
    extra_rows=None,
) -> ProfileReport:
    """Measure vyre_cuda, the floors and the transfer ceilings at each size, in one run.

    Parameters
    ----------
    sizes : iterable of int or str
        Bytes per buffer (``4096``, ``"4KiB"``, ``"1GiB"``...), each a multiple of 4 (the floor
        moves float32). Default: 4 KiB, 4 MiB, 64 MiB, 256 MiB and 1 GiB.
    iterations : int, optional
        Timed samples per system and size (default: from 2,000 at 4 KiB down to 5 at 1 GiB).
    warmup : int, optional
        Untimed samples per system first (default: a tenth of ``iterations``, at most 200).
    program : vyre_cuda.Program, optional
        A user program instead of the built-in vecadd; the floor stays the vecadd loop moving the
        same bytes per buffer.
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
    extra_rows : callable, optional
        ``extra_rows(size)`` returns more :class:`~vyre_cuda.profile.engine.Runner` rows for one
        size, interleaved with the run's own (``size`` holds the backend, the arrays, ``skipped``,
        ``opened``: objects closed after the size, ``on_result``: callables given the
        :class:`SizeResult`). A benchmark adds its rows so.

    Returns
    -------
    ProfileReport
    """
    size_list = check_options(sizes, iterations, warmup, host_threads, rounds, backend, backend_options)
    n_threads = host_threads or max(1, min(16, os.cpu_count() or 1))  # default: the CPUs, at most 16
    thread_counts = (1,) if n_threads == 1 else (1, n_threads)
    floor_module = import_floor()
    stages = session.stage_names()
    builtin = program is None
    report_sizes = []
    with contextlib.ExitStack() as stack:  # closes the floor kernel, then a backend the run opened
        if backend is None:
            backend = open_backend(device, backend_options)
            stack.callback(backend.close)
        started = datetime.datetime.now(datetime.timezone.utc)
        rng = np.random.default_rng(seed)
        if builtin:
            from .. import builtin_programs

            program, label = builtin_programs.vecadd_f32(), "vecadd_f32 (built-in)"
        else:
            label = f"{program.name or 'user program'} ({program.kernel.kind}, entry {program.kernel.entry!r})"
        kernel, image = load_floor_kernel(backend)
        stack.callback(kernel.close)
        run = _SizeRun(backend, program, builtin, kernel, image, floor_module, rounds, stages, thread_counts, rng)
        for index, nbytes in enumerate(size_list):
            count = iterations or engine.auto_iterations(nbytes)
            warm = warmup if warmup is not None else engine.auto_warmup(count)
            at = index / len(size_list)
            sub = scaled_progress(progress, at, at + 1 / len(size_list), f"{format_size(nbytes)}: ")
            report_sizes.append(run.measure(nbytes, count, warm, sub, extra_rows))
        settings = {
            "iterations": iterations,
            "warmup": warmup,
            "rounds": rounds,
            "program": label,
            "builtin_program": builtin,
            "host_threads": list(thread_counts),
            "backend_options": dict(backend_options or {}),
        }
        run_meta = meta(backend, settings, started)
    return ProfileReport(meta=run_meta, sizes=report_sizes, stage_names=stages)


class _SizeRun:
    """What stays the same from one size to the next: the backend, the program, the floor."""

    def __init__(self, backend, program, builtin, kernel, image, floor_module, rounds, stage_names, thread_counts, rng):
        self.backend, self.program, self.builtin = backend, program, builtin
        self.kernel, self.image, self.floor_module = kernel, image, floor_module
        self.rounds, self.stage_names, self.thread_counts, self.rng = rounds, stage_names, thread_counts, rng

    def measure(self, nbytes, count, warm, progress, extra_rows=None):
        n = nbytes // 4
        a, b = (self.rng.random(n, dtype=np.float32) for _ in range(2))
        expected = a + b
        inputs = [a, b] if self.builtin else runners.make_inputs(self.program, nbytes, self.rng)
        skipped: dict[str, str] = {}  # system -> why it was not measured
        size = types.SimpleNamespace(
            run=self, backend=self.backend, program=self.program, builtin=self.builtin, nbytes=nbytes, a=a, b=b,
            expected=expected, inputs=inputs, skipped=skipped, opened=[], on_result=[],
            launch_scale=max(1, count // max(8, count // 64)) if nbytes <= engine.LAUNCH_ONLY_MAX else None,
        )  # fmt: skip
        floor = self.floor_module.Floor(self.kernel, n)
        try:
            rows, moved = self._vyre_rows(size)
            rows += runners.floor_runners(floor, a, b, expected, size.launch_scale, self._floor_locked(size))
            rows += tight.tight_runners(floor, a, b, expected)
            rows += runners.ceiling_runners(floor, a, b, self.thread_counts)
            if extra_rows is not None:
                rows += extra_rows(size)
            marks: dict[str, dict | None] = {}  # "before": the telemetry before the timed rounds
            mark = lambda: marks.update(before=_snapshot(self.backend))  # noqa: E731
            with engine.gc_paused():
                samples = engine.run_rounds(rows, count, warm, self.rounds, progress, failed=skipped, before_timed=mark)
            telemetry = _telemetry_delta(marks.get("before"), _snapshot(self.backend))
        finally:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    for thing in reversed(size.opened):
                        with contextlib.suppress(Exception):  # measurement is over: leak, not fail
                            thing.close()
            finally:
                floor.close()
        result = engine.assemble(nbytes, n, count, samples, self.stage_names, skipped)
        result.moved = moved
        result.telemetry = telemetry
        tight.add_fastest(result)
        for hook in size.on_result:
            hook(result)
        del rows, samples, size
        gc.collect()  # large arrays (page-locked ones included) go before the next size
        return result

    def _vyre_rows(self, size):
        program, backend, inputs, expected = self.program, self.backend, size.inputs, size.expected
        first = backend.dispatch(program, inputs)  # the outputs' shapes and dtypes
        size.into = [np.empty_like(o) for o in first]
        moved = {
            "floor": (2 * expected.nbytes, expected.nbytes),
            "vyre": (sum(x.nbytes for x in inputs), sum(o.nbytes for o in first)),
        }
        del first
        size.check = None
        if self.builtin:
            size.check = lambda outs: len(outs) == 1 and np.array_equal(np.asarray(outs[0]), expected)
        locked = self._locked([*inputs, *size.into], size.skipped, "page-locked")
        size.pinned = None if locked is None else (locked[: len(inputs)], locked[len(inputs) :])
        # a user program's outputs may not suit dispatch_into (read-write buffers): skip, not fail
        group = None if self.builtin else "dispatch_into"
        rows = runners.vyre_runners(backend, program, inputs, size.check, size.into, size.pinned, group)
        return rows, moved

    def _floor_locked(self, size):
        """Page-locked ``a``, ``b`` and output for the issued floor (``floor.pinned_direct``), or
        None (then skipped, with the reason). The built-in vecadd's page-locked inputs are copies
        of ``a`` and ``b``, never written: the floor reads them too."""
        reuse = size.pinned is not None and self.builtin
        arrays = [np.zeros_like(size.a)] if reuse else [size.a, size.b, np.zeros_like(size.a)]
        locked = self._locked(arrays, size.skipped, "floor pinned arrays")
        if locked is None:
            return None
        return (*size.pinned[0], *locked) if reuse else tuple(locked)

    def _locked(self, arrays, skipped, system):
        """Page-locked copies of ``arrays``, or None with the reason in ``skipped[system]``."""
        try:
            locked = runners.page_locked_copies(arrays, self.backend.device)
        except BackendError as exc:
            skipped[system] = f"failed to allocate: {type(exc).__name__}: {exc}"
            return None
        if locked is None:
            skipped[system] = "this vyre_cuda has no vyre_cuda.pinned_empty"
        return locked
