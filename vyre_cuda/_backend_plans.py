"""A CudaBackend's planning: the plans it makes outside the core, and autotune's.

The core never plans: on a plan miss it raises PlanMiss holding nothing, and the backend's entry
points call :func:`insert_plan`, which plans here and caches the Prepared plan in the core for the
call again. ``plan_info``, ``cooperative_grid_sync_fits``, autotune's measuring step and ``tune``
plan through the same steps: the inputs' byte lengths as a dispatch sees them, the DispatchPlan
under the backend's plan lock (with the autotuned width when asked), the free-memory reader the
streamed route sizes itself by, and the Prepared plan made from it.

Kept apart from backend.py so that the class reads as its public entry points and their
docstrings, while these steps, which only the backend's plan misses and measurements reach, read
together. Each function takes the backend as its first argument (its caps, module cache, knobs,
plan lock and core); nothing here keeps state. ``CudaBackend._plan`` stays on the class and is
called through the backend (:func:`insert_plan` and :func:`measurer` call ``backend._plan``), so
the tests that watch or replace it on one backend see every plan.
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
    from ._device_io import device_input  # noqa: PLC0415

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
    """Plan a dispatch the core found no prepared plan for (its PlanMiss) and cache the plan
    in the core. Runs outside the core: the dispatch holds nothing while it plans (autotune
    measures here). A traced dispatch refused by planning still shows its ranges. Returns the
    plan, for the call again (with ``miss.inputs``: the list the core read, since an iterator
    the caller passed is used up)."""
    try:
        prep = backend._plan(program, miss.lengths, miss.config, miss.device_inputs, miss.inputs)
    except BaseException:
        backend._core.trace_refused(program, miss.config, blocking)
        raise
    backend._core.insert(miss, prep)
    return prep


def measurer(backend: CudaBackend, program, inputs, config):
    """A function that times one run of ``program`` on ``inputs`` (a TimedDispatchResult) with
    a plan made now: autotune's measuring step, never a dispatch() re-entry. The plan is not
    cached and launches without graphs (no cached plan would own its graph execs)."""
    backend._check_open()
    cfg = dataclasses.replace(as_config(config), graph=False)
    lengths, on_device = input_lengths(backend, program, inputs, cfg)
    prep = backend._plan(program, lengths, cfg, on_device, inputs)
    core = backend._core
    return lambda: core.dispatch_timed(program, inputs, cfg, prep)


def prepare(plan):
    from ._prepared import Prepared  # noqa: PLC0415

    return Prepared.from_plan(plan)


def planned(backend: CudaBackend, program, lengths, config, device_inputs=frozenset(), inputs=None) -> DispatchPlan:
    """The DispatchPlan of one (program, input lengths, config), logged."""
    cfg = as_config(config)
    with backend._plan_lock:
        plan = plan_dispatch(
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
    """Device bytes a dispatch planned now can draw on: the driver's free memory plus what this
    backend's device pool holds unused (cached blocks, the stream-ordered pool's idle reserve),
    which the pool reuses or trims for it. Driver calls: the planner makes them on a plan miss
    of an elementwise dispatch only, never on the dispatch path."""
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
        with backend._plan_lock:
            plan = plan_dispatch(
                program,
                lengths,
                dataclasses.replace(base, workgroup_override=(block, 1, 1)),
                backend._caps,
                backend._modules,
                device_inputs,
                functools.partial(free_device_memory, backend),
                backend._knobs.stream_tuning,
                backend._knobs.mirror_max,
            )
    # the plan keeps the caller's config (label, timeout, iterations are the same)
    return dataclasses.replace(plan, config=cfg, tuned_block=None if block is None else (block, 1, 1), tuning=reason)


def tune(backend: CudaBackend, program, inputs, config, candidates, *, repeats, force) -> TuneResult:
    """``CudaBackend.tune``'s work: measure (or read the cached winner), and drop the prepared
    plans once a new measurement was stored, so autotune plans replan at its width."""
    backend._check_open()
    result = tuning.tune(backend, program, inputs, config, candidates, repeats=repeats, force=force)
    if not result.cached:
        backend._core.clear_prepared()  # autotune plans made before this measurement replan
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
