"""Throughput from 1, 2 and N Python threads: vyre_cuda on one backend against the floors.

The floors' loops release the GIL for their whole run, so each thread is a C loop with its own
stream, buffers and event: their rates are what the driver and the machine allow from that many
threads. vyre_cuda's rate from N Python threads is compared with the tight floor's from N threads
(its fastest wait); the per-buffer floor's rates are reported beside them.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

from vyre_cuda.errors import ValidationError
from vyre_cuda.profile.engine import WrongResult
from vyre_cuda.profile.runners import make_inputs
from vyre_cuda.profile.stats import median
from vyre_cuda.profile.tight import WAITS

from .records import ThreadScaling, throughput

__all__ = ["floor_threaded", "measure_threads"]


def _run_together(work, threads, name):
    """Run ``work(index, barrier)`` on ``threads`` threads; re-raise the first failure."""
    barrier = threading.Barrier(threads)
    errors = []

    def worker(index):
        try:
            work(index, barrier)
        except threading.BrokenBarrierError:
            pass  # another thread failed; its error is reported
        except BaseException as exc:  # noqa: BLE001 (re-raised in the caller's thread)
            errors.append(exc)
            barrier.abort()

    pool = [threading.Thread(target=worker, args=(i,), name=f"{name}-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def _finished(spans: list[tuple[int, int] | None]) -> list[tuple[int, int]]:
    """The (start, end) of every thread, in thread order, after :func:`_run_together` returned
    (it raises unless every thread ran to its end and set its span)."""
    done = [s for s in spans if s is not None]
    if len(done) != len(spans):
        raise RuntimeError(f"{len(spans) - len(done)} of {len(spans)} threads set no time span")
    return done


def floor_threaded(floor_module, kernel, n, threads, iterations, warmup=0, seed=0, wait=None):
    """``threads`` Python threads, each running its own ``Floor`` (own stream, buffers,
    staging, event) for ``iterations`` full pinned dispatches with the GIL released for the loop;
    with ``wait`` (one of ``WAITS``), tight round trips with that wait instead (``Floor.tight``).

    Setup and warm-up happen before a barrier; the timed window runs from the earliest loop
    start to the latest loop end. Returns a dict with ``threads``, ``iterations`` (per
    thread), ``start_ns``/``end_ns`` (per thread), ``elapsed_ns``, ``dispatches_per_s`` and
    ``outputs_ok`` (every thread's ``out`` equals ``a + b``).
    """
    if threads < 1 or iterations < 1:
        raise ValidationError(
            f"threads and iterations must be >= 1 (got {threads}, {iterations})",
            "pass threads=1 or 2 and a positive iteration count",
        )
    if wait is not None and wait not in WAITS:
        raise ValidationError(f"wait must be None or one of {', '.join(WAITS)} (got {wait!r})", "pass wait='spin'")
    rng = np.random.default_rng(seed)
    floors = []
    spans: list[tuple[int, int] | None] = [None] * threads
    try:
        for _ in range(threads):
            floors.append(floor_module.Floor(kernel, n))
        data = [
            (rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32), np.zeros(n, dtype=np.float32))
            for _ in range(threads)
        ]

        def work(index, barrier):
            floor = floors[index]
            a, b, out = data[index]

            def run(count):  # each loop releases the GIL for its whole run; its span on the same clock
                t0 = time.perf_counter_ns()
                if wait is None:
                    floor.full_pinned(a, b, out, count)
                else:
                    floor.tight(a, b, out, count, wait=wait)
                return t0, time.perf_counter_ns()

            if warmup:
                run(warmup)
            barrier.wait()
            spans[index] = run(iterations)

        _run_together(work, threads, "vyre-floor")
        outputs_ok = all(np.array_equal(out, a + b) for a, b, out in data)
    except BaseException:
        for floor in floors:
            with contextlib.suppress(Exception):  # the first failure is the one reported
                floor.close()
        raise
    for floor in floors:
        floor.close()
    done = _finished(spans)
    start = min(s[0] for s in done)
    end = max(s[1] for s in done)
    elapsed = max(end - start, 1)
    return {
        "threads": threads,
        "iterations": int(iterations),
        "start_ns": [int(s[0]) for s in done],
        "end_ns": [int(s[1]) for s in done],
        "elapsed_ns": int(elapsed),
        "dispatches_per_s": threads * iterations * 1e9 / elapsed,
        "outputs_ok": bool(outputs_ok),
    }


def _vyre_threaded(backend, program, inputs_per_thread, iterations, warmup):
    threads = len(inputs_per_thread)
    spans: list[tuple[int, int] | None] = [None] * threads

    def work(index, barrier):
        inputs = inputs_per_thread[index]
        dispatch = backend.dispatch
        for _ in range(warmup):
            dispatch(program, inputs)
        barrier.wait()
        t0 = time.perf_counter_ns()
        for _ in range(iterations):
            dispatch(program, inputs)
        spans[index] = (t0, time.perf_counter_ns())

    _run_together(work, threads, "vyre-profile")
    done = _finished(spans)
    elapsed = max(e for _, e in done) - min(s for s, _ in done)
    return throughput(threads * iterations, max(elapsed, 1))


def measure_threads(
    backend, program, floor_module, kernel, nbytes, threads, iterations, warmup, repeats, rng, progress=None
) -> ThreadScaling:
    """Dispatches per second from 1, 2 and ``threads`` threads: the per-buffer floor, the tight
    floor with each wait, and vyre_cuda alternating, ``repeats`` times; the medians (the tight
    floor's: its fastest wait's median at each thread count)."""
    n = nbytes // 4
    counts = sorted({1, min(2, threads), threads})
    vyre: dict[int, list] = {c: [] for c in counts}
    floor: dict[int, list] = {c: [] for c in counts}
    tight: dict[tuple, list] = {(c, w): [] for c in counts for w in WAITS}
    per_thread = [make_inputs(program, nbytes, rng) for _ in range(threads)]
    steps = repeats * len(counts) * (2 + len(WAITS))
    step = 0

    def floor_rate(count, wait):
        result = floor_threaded(floor_module, kernel, n, count, iterations, warmup, wait=wait)
        if not result["outputs_ok"]:
            raise WrongResult(
                f"the threaded {'tight ' if wait else ''}floor produced a wrong result (out != a + b)",
                "this is a bug in vyre_cuda.profile._floor; report it",
            )
        return result["dispatches_per_s"]

    def advance(label):
        nonlocal step
        step += 1
        if progress:
            progress(label, step / steps)

    for _ in range(repeats):
        for count in counts:
            floor[count].append(floor_rate(count, None))
            advance(f"threads: floor x{count}")
            for wait in WAITS:
                tight[count, wait].append(floor_rate(count, wait))
                advance(f"threads: tight floor ({wait}) x{count}")
            vyre[count].append(_vyre_threaded(backend, program, per_thread[:count], iterations, warmup))
            advance(f"threads: vyre_cuda x{count}")
    return ThreadScaling(
        nbytes,
        threads,
        iterations,
        vyre={k: median(v) for k, v in vyre.items()},
        floor={k: median(v) for k, v in floor.items()},
        tight={c: max(median(tight[c, w]) for w in WAITS) for c in counts},
    )
