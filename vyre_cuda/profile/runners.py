"""The runners of one size: vyre_cuda's entry points, the floor, and the transfer ceilings."""

from __future__ import annotations

import time

import numpy as np

from ..errors import ValidationError
from .engine import LAUNCH_BATCH, Runner
from .session import profiled_dispatch
from .systems import copy_key

__all__ = ["ceiling_runners", "floor_runners", "make_inputs", "page_locked_copies", "vyre_runners"]


def make_inputs(program, nbytes, rng):
    """Fresh random inputs of ``program`` at ``nbytes`` per runtime-sized buffer."""
    arrays = []
    for decl in program.inputs:
        itemsize = decl.dtype.itemsize
        count = decl.count or nbytes // itemsize
        if count <= 0:
            raise ValidationError(
                f"buffer {decl.name!r} ({decl.dtype.name}) holds no element at {nbytes} bytes",
                f"pass sizes of at least {itemsize} bytes",
            )
        npd = decl.dtype.numpy
        if npd.kind == "f":
            draw = np.float32 if npd.itemsize <= 4 else np.float64
            arrays.append(rng.random(count, dtype=draw).astype(npd, copy=False))
        else:
            arrays.append(rng.integers(0, 100, count).astype(npd))
    return arrays


def page_locked_copies(arrays, device=0):
    """Page-locked copies of ``arrays`` (``vyre_cuda.pinned_empty``), or None where this build
    of vyre_cuda has no page-locked arrays."""
    import vyre_cuda

    pinned_empty = getattr(vyre_cuda, "pinned_empty", None)
    if pinned_empty is None:
        return None
    copies = []
    for x in arrays:
        p = pinned_empty(x.shape, x.dtype, device=device)
        p[...] = x
        copies.append(p)
    return copies


def vyre_runners(backend, program, inputs, check, into=None, pinned=None, into_group=None):
    """vyre_cuda's rows: ``dispatch``, the same with stage clocks, ``dispatch_async``
    (enqueue and total), ``dispatch_into`` numpy outputs (``into``; in group ``into_group``
    when given, so that a failure skips it), and ``dispatch_into`` with page-locked inputs and
    outputs (``pinned = (inputs, outputs)``, its own group).

    ``check(outputs)`` says whether a dispatch's outputs are right (None: not checked).
    """
    pc = time.perf_counter_ns
    dispatch = backend.dispatch
    profiled = profiled_dispatch(backend)
    dispatch_async = backend.dispatch_async
    last = {}

    def run_dispatch(count):
        walls = []
        for _ in range(count):
            t0 = pc()
            outs = dispatch(program, inputs)
            walls.append(pc() - t0)
            last["dispatch"] = outs  # freed outside the timed window
        return {"vyre.dispatch": walls}

    def run_profiled(count):
        walls = []
        stages = []
        for _ in range(count):
            t0 = pc()
            outs, stage_ns = profiled(program, inputs, None, t0)
            walls.append(pc() - t0)
            stages.append(tuple(int(v) for v in stage_ns))
            last["profiled"] = outs
        return {"vyre.dispatch_profiled": walls, "_stages": stages}

    def run_async(count):
        enqueue = []
        total = []
        for _ in range(count):
            t0 = pc()
            pending = dispatch_async(program, inputs)
            t1 = pc()
            outs = pending.result()
            t2 = pc()
            enqueue.append(t1 - t0)
            total.append(t2 - t0)
            last["async"] = outs
            del pending
        return {"vyre.async_enqueue": enqueue, "vyre.async_total": total}

    def verifier(name):
        return None if check is None else (lambda: check(last[name]))

    def into_runner(title, key, ins, outs, group):
        dispatch_into = backend.dispatch_into

        def run(count):
            for o in outs:
                o[...] = 0  # a stale right answer must not pass the check
            walls = []
            for _ in range(count):
                t0 = pc()
                dispatch_into(program, ins, outs)
                walls.append(pc() - t0)
            last[key] = outs
            return {key: walls}

        return Runner(title, run, verifier(key), group=group)

    runners = [
        Runner("vyre_cuda dispatch", run_dispatch, verifier("dispatch")),
        Runner("vyre_cuda dispatch (stage clocks)", run_profiled, verifier("profiled")),
        Runner("vyre_cuda dispatch_async", run_async, verifier("async")),
    ]
    if into is not None:
        runners.append(into_runner("vyre_cuda dispatch_into", "vyre.dispatch_into", inputs, into, into_group))
    if pinned is not None:
        runners.append(into_runner("vyre_cuda page-locked", "vyre.pinned", pinned[0], pinned[1], "page-locked"))
    return runners


def floor_runners(floor, a, b, expected, launch_batches_scale=None, locked=None):
    """The floor's rows: full through pinned staging, the driver's pageable path, (with
    ``launch_batches_scale``) one ``cuLaunchKernel``, and (with ``locked``, page-locked copies
    of ``a``, ``b`` and an output) the same calls issued straight from and into page-locked
    arrays, with no host copy."""
    out = np.zeros(floor.n, dtype=np.float32)

    def full(key, method):
        def run(count):
            out[:] = 0
            total, enqueue = method(a, b, out, count)
            return {key: total, f"{key}_enqueue": enqueue}

        return run

    def launch(batches):
        return {"floor.launch_only": floor.launch_only(batches, LAUNCH_BATCH, 0)}

    def ok():
        return np.array_equal(out, expected)

    runners = [
        Runner("floor pinned", full("floor.pinned", floor.full_pinned), ok),
        Runner("driver's pageable path", full("floor.pageable", floor.full_pageable), ok),
    ]
    if launch_batches_scale is not None:
        runners.append(Runner("floor launch only", launch, unit_scale=launch_batches_scale))
    if locked is not None:
        la, lb, lout = locked

        def direct(count):
            lout[:] = 0
            total, _ = floor.full_pinned_direct(la, lb, lout, count)
            return {"floor.pinned_direct": total}

        def direct_ok():
            return np.array_equal(lout, expected)

        runners.append(Runner("floor pinned arrays", direct, direct_ok, group="floor pinned arrays"))
    return runners


def ceiling_runners(floor, a, b, thread_counts):
    """The transfer ceilings on the floor's buffers: DMA each way alone and both ways at once
    from and to pinned memory, and host memcpy pageable -> pinned (the inputs) and pinned ->
    pageable (the output) at each thread count."""
    scratch = np.empty(floor.n, dtype=np.float32)  # copy_out's destination (a numpy array)

    def dma(count):
        return {
            "ceiling.dma_h2d": floor.dma_h2d(count),
            "ceiling.dma_d2h": floor.dma_d2h(count),
            "ceiling.dma_both": floor.dma_both(count),
        }

    def copies(threads):
        def run(count):
            return {
                copy_key("in", threads): floor.copy_in(a, b, threads, count),
                copy_key("out", threads): floor.copy_out(scratch, threads, count),
            }

        return run

    runners = [Runner("DMA ceilings", dma)]
    runners += [Runner(f"memcpy ceilings, {t} thread{'s' if t != 1 else ''}", copies(t)) for t in thread_counts]
    return runners
