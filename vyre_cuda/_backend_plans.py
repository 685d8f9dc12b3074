"""A CudaBackend's planning, outside the core: a plan miss planned and cached (:func:`insert_plan`),
and the plans of ``plan_info``, ``cooperative_grid_sync_fits``, autotune and ``tune``.

Each function takes the backend (its caps, module cache, knobs, plan lock and core) and keeps no
state. Plans go through ``backend._plan``, so tests that watch or replace it see every plan.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING

import numpy as np

from . import _driver, tuning
from .config import as_config
from .errors import ValidationError
from .planning.dispatch import DispatchPlan, plan_dispatch

if TYPE_CHECKING:
    from .backend import CudaBackend
    from .tuning import TuneResult

log = logging.getLogger("vyre_cuda")


def input_lengths(backend: CudaBackend, program, inputs, cfg):
    """(byte lengths, indices of device inputs) of ``inputs``, as a dispatch would see them."""
    from ._devview import device_input  # noqa: PLC0415

    lengths, on_device = [], set()
    for i, x in enumerate(inputs):
        try:
            lengths.append(_nbytes(x, i))
            continue
        except ValidationError:
            _driver.make_current(backend._ctx)  # (the device checks query pointers)
            view = device_input(program, i, x, backend.device, cfg.stream)
            if view is None:
                raise
        lengths.append(view.nbytes)
        if not isinstance(view, np.ndarray):  # (a CPU DLPack tensor is a host input)
            on_device.add(i)
    return tuple(lengths), frozenset(on_device)


def insert_plan(backend: CudaBackend, miss, program, blocking=True):
    """Plan the core's PlanMiss and cache the plan in the core; returns it, for the call again
    (with ``miss.inputs``: an iterator the caller passed is used up). The dispatch holds nothing
    meanwhile (autotune measures here); a traced dispatch refused here still shows its ranges.

    Planning counts as a call running in the core: close() waits for it, and a plan begun after
    close() is refused with the closed error. (It loads modules and may allocate; uncounted, a
    close() on another thread unloaded the modules under it, and the plan failed with a
    misleading "no kernel entry" error.)"""
    core = backend._core

    def plan_and_insert():
        try:
            prep = backend._plan(program, miss.lengths, miss.config, miss.device_inputs, miss.inputs)
        except BaseException:
            core.trace_refused(program, miss.config, blocking)
            raise
        core.insert(miss, prep)
        return prep

    return core.counted(plan_and_insert)


def measurer(backend: CudaBackend, program, inputs, config):
    """Autotune's measuring step: a function timing one run on ``inputs`` with a plan made now,
    uncached and without graphs (no cached plan would own its graph execs)."""
    backend._check_open()
    cfg = dataclasses.replace(as_config(config), graph=False)
    lengths, on_device = input_lengths(backend, program, inputs, cfg)
    core = backend._core
    prep = core.counted(lambda: backend._plan(program, lengths, cfg, on_device, inputs))  # (see insert_plan)
    return lambda: core.dispatch_timed(program, inputs, cfg, prep)


def prepare(plan):
    from ._prepared import Prepared  # noqa: PLC0415

    return Prepared.from_plan(plan)


def _plan_locked(backend: CudaBackend, program, lengths, cfg, device_inputs) -> DispatchPlan:
    with backend._plan_lock:
        return plan_dispatch(
            program,
            lengths,
            cfg,
            backend._caps,
            backend._modules,
            device_inputs,
            functools.partial(free_device_memory, backend),
            backend._knobs.stream_tuning,
            backend._knobs.mirror_max,
        )


def planned(backend: CudaBackend, program, lengths, config, device_inputs=frozenset(), inputs=None) -> DispatchPlan:
    """The DispatchPlan of one (program, input lengths, config), logged."""
    cfg = as_config(config)
    plan = _plan_locked(backend, program, lengths, cfg, device_inputs)
    if cfg.autotune:
        plan = tuned(backend, program, lengths, cfg, plan, device_inputs, inputs)
    if log.isEnabledFor(logging.INFO):  # (its arguments cost more than the check, per plan miss)
        launch, route = plan.launch, plan.route
        log.info(
            "planned %s: route=%s (%s), grid=%s block=%s shared=%d slab=%d (%s)",
            cfg.label or program.kernel.entry,
            route.kind,
            route.reason,
            launch.grid,
            launch.block,
            launch.shared_bytes,
            plan.layout.slab_bytes,
            "mirror" if plan.mirror else "ring",
        )
    return plan


def free_device_memory(backend: CudaBackend) -> int:
    """Device bytes a dispatch planned now can draw on: the driver's free memory plus what the
    backend's device pool holds unused (it reuses or trims that). Read only on a plan miss of an
    elementwise dispatch, never on the dispatch path."""
    core = backend._core

    def read() -> int:
        _driver.make_current(backend._ctx)
        free, _ = _driver.mem_get_info()
        pool = core.resources.dpool
        cached, in_use = pool.stats()["cached_bytes"], pool.async_stats()["live_bytes"]
        return free + cached + max(0, pool.reserved_bytes() - in_use)

    return core.counted(read)  # (close() waits: the pool stays alive while it is read)


def tuned(backend: CudaBackend, program, lengths, cfg, plan, device_inputs=frozenset(), inputs=None):
    """The plan of an ``autotune=True`` dispatch: at the cached (or now measured) width."""
    base = dataclasses.replace(cfg, autotune=False)
    block, reason = tuning.planned_width(backend, program, lengths, base, plan, inputs)
    if block is not None and block != plan.launch.block[0]:
        wide = dataclasses.replace(base, workgroup_override=(block, 1, 1))
        plan = _plan_locked(backend, program, lengths, wide, device_inputs)
    # the plan keeps the caller's config (label, timeout, iterations are the same)
    return dataclasses.replace(plan, config=cfg, tuned_block=None if block is None else (block, 1, 1), tuning=reason)


def tune(backend: CudaBackend, program, inputs, config, candidates, *, repeats, force) -> TuneResult:
    """``CudaBackend.tune``'s work; a new measurement drops the prepared plans, so autotune plans
    replan at its width."""
    backend._check_open()
    result = tuning.tune(backend, program, inputs, config, candidates, repeats=repeats, force=force)
    if not result.cached:
        backend._core.clear_prepared()
    return result


def _nbytes(obj, index) -> int:
    from ._io_checks import raw_bits  # noqa: PLC0415

    bits = raw_bits(obj)  # a bfloat16 (and the like) array travels as its raw bits
    try:
        return memoryview(obj if bits is None else bits).nbytes
    except (TypeError, ValueError, BufferError):
        raise ValidationError(
            f"input {index} is a {type(obj).__name__}, which does not expose the buffer protocol",
            "pass a numpy array, bytes, bytearray, memoryview or another C-contiguous buffer",
        ) from None
