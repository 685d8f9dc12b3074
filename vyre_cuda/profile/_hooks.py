"""The measuring tools' one door into the core's private parts: stage clocks, transfer knobs, plan state.

The profiling harness (``vyre_cuda.profile``) and the scripts in ``benchmarks/`` measure things the
public API does not show on purpose: where the time of one dispatch goes (the core's stage clocks),
how the transfer engine behaves under other window sizes or copy routines, and which path a
prepared plan chose. Everything they need from the compiled core or the planner's tunables goes
through the functions below, and no other file of the harness or of ``benchmarks/`` imports a
private core module, so that when the core's modules move only this file follows them.

These are measuring aids, not API: they change process-wide or per-backend state the dispatch
path reads, with no validation, and may change or vanish with any release. Nothing here is
imported before it is called (``import vyre_cuda.profile`` needs no compiled core).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "device_count",
    "is_page_locked_address",
    "mirror_max",
    "prepared_plan",
    "profiled_dispatch",
    "set_min_window",
    "set_stream_tuning",
    "set_streamed_copy_mode",
    "set_streaming_copies",
    "set_wait_mode",
    "stage_names",
]


# ---------------------------------------------------------------- stage clocks
def stage_names() -> tuple[str, ...]:
    """The core's dispatch stages, in the order of the ``stage_ns`` that
    :func:`profiled_dispatch` returns (``plan_lookup``, ``staging_memcpy``, ...)."""
    from .. import _tracing

    return tuple(_tracing.STAGES)


def profiled_dispatch(backend) -> Callable[..., tuple[list, tuple[int, ...]]]:
    """``backend``'s dispatch with the stage clocks on: a callable
    ``(program, inputs, config=None, start_ns=0) -> (outputs, stage_ns)``, one nanosecond count
    per :func:`stage_names` entry, measured from ``start_ns`` (a ``time.perf_counter_ns()``
    taken by the caller just before the call). Bound once, so a timed loop pays no lookup."""
    return backend._dispatch_profiled


# ---------------------------------------------------------------- transfer knobs
def set_min_window(upload: int, readback: int = 0) -> None:
    """Process-wide: the smallest window (bytes) a staged upload, and a readback when
    ``readback`` is given, is cut into. The defaults are 512 KiB and 1 MiB."""
    from .. import _windows

    _windows._set_min_window(upload, readback)


def set_stream_tuning(backend, tuning) -> None:
    """``backend``'s streamed-route constants: a :class:`~vyre_cuda.planning.stream.StreamTuning`
    (chunk bytes, streams, the smallest chunk count, waves per chunk), or None for the measured
    defaults. Cached plans are dropped, so the next dispatch plans with it."""
    backend._stream_tuning = tuning
    backend._core.clear_prepared()


def set_streamed_copy_mode(mode: int) -> None:
    """Process-wide: how the streamed route's copy threads store (0: the transfer engine's rule,
    1: plain stores, 2: non-temporal stores)."""
    from .. import _streamed

    _streamed._set_copy_mode(mode)


def set_streaming_copies(backend, upload_max: int, readback_max: int) -> None:
    """``backend``'s transfer engine: staging copies up to these many bytes use non-temporal
    (streaming) stores instead of plain memcpy (0: never, ``1 << 40``: always)."""
    xfer = backend._core.xfer
    xfer.stream_upload_max = upload_max
    xfer.stream_readback_max = readback_max


def set_wait_mode(mode: int) -> None:
    """Process-wide: how a blocking dispatch waits for its event. 0 polls (interruptible,
    the default), 1 polls without pausing between queries, 2 calls ``cuStreamSynchronize`` when
    there is no timeout (not interruptible)."""
    from .. import _waits

    _waits._set_wait_mode(int(mode))


@contextlib.contextmanager
def mirror_max(limit: int) -> Iterator[None]:
    """Within the block, plans made for dispatches whose device slab is at most ``limit`` bytes
    upload through the pinned mirror, larger ones through the staging ring (the default
    boundary is ``vyre_cuda.planning.dispatch.MIRROR_MAX``). Backends created inside the block
    plan with it; the old boundary comes back on exit."""
    from ..planning import dispatch as planning_dispatch

    old = planning_dispatch.MIRROR_MAX
    planning_dispatch.MIRROR_MAX = limit
    try:
        yield
    finally:
        planning_dispatch.MIRROR_MAX = old


# ---------------------------------------------------------------- driver and plan state
def is_page_locked_address(address: int, nbytes: int) -> bool:
    """What the transfer engine's detection says of ``nbytes`` at ``address``: page-locked
    (pinned or registered) over the whole range, or not."""
    from .. import _windows

    return bool(_windows.is_page_locked_address(address, nbytes))


def device_count() -> int:
    """The CUDA devices the driver reports (it initialises the driver first)."""
    from .. import _driver

    return int(_driver.device_count())


def prepared_plan(backend, key: tuple) -> Any:
    """The core's prepared plan cached under ``key`` = ``(program, config, *input byte
    lengths)``, or None. Its ``graph_trial_left`` and ``graph_choice`` tell where the
    graph-or-issued trial of a one-launch plan stands and what it kept."""
    return backend._core.prepared_for(key)
