"""The benchmarks' door into the core's private parts: process-wide transfer and wait knobs and
plan state, which the product's profile (``vyre_cuda.profile``) never touches.

The scripts of ``benchmarks/`` measure things the public API does not show on purpose: how the
transfer engine behaves under other window sizes or copy routines, how a blocking dispatch waits,
which path a prepared plan chose. Everything they need of that goes through the functions below
(and the stage clocks and the per-backend tuning through ``vyre_cuda.profile._hooks``), and no
other file of ``benchmarks/`` imports a private core module, so that when the core's modules move
only these two files follow them.

These are measuring aids, not API: they change process-wide or per-backend state the dispatch
path reads, with no validation. Nothing here is imported before it is called.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "device_count",
    "is_page_locked_address",
    "mirror_max",
    "prepared_plan",
    "set_min_window",
    "set_streamed_copy_mode",
    "set_streaming_copies",
    "set_wait_mode",
]


def set_min_window(upload: int, readback: int = 0) -> None:
    """Process-wide: the smallest window (bytes) a staged upload, and a readback when
    ``readback`` is given, is cut into. The defaults are 512 KiB and 1 MiB."""
    from vyre_cuda import _windows

    _windows._set_min_window(upload, readback)


def set_streamed_copy_mode(mode: int) -> None:
    """Process-wide: how the streamed route's copy threads store (0: the transfer engine's rule,
    1: plain stores, 2: non-temporal stores)."""
    from vyre_cuda import _streamed

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
    from vyre_cuda import _waits

    _waits._set_wait_mode(int(mode))


@contextlib.contextmanager
def mirror_max(limit: int) -> Iterator[None]:
    """Within the block, plans made for dispatches whose device slab is at most ``limit`` bytes
    upload through the pinned mirror, larger ones through the staging ring (the default
    boundary is ``vyre_cuda.planning.dispatch.MIRROR_MAX``). Backends created inside the block
    plan with it; the old boundary comes back on exit."""
    from vyre_cuda.planning import dispatch as planning_dispatch

    old = planning_dispatch.MIRROR_MAX
    planning_dispatch.MIRROR_MAX = limit
    try:
        yield
    finally:
        planning_dispatch.MIRROR_MAX = old


def is_page_locked_address(address: int, nbytes: int) -> bool:
    """What the transfer engine's detection says of ``nbytes`` at ``address``: page-locked
    (pinned or registered) over the whole range, or not."""
    from vyre_cuda import _windows

    return bool(_windows.is_page_locked_address(address, nbytes))


def device_count() -> int:
    """The CUDA devices the driver reports (it initialises the driver first)."""
    from vyre_cuda import _driver

    return int(_driver.device_count())


def prepared_plan(backend, key: tuple) -> Any:
    """The core's prepared plan cached under ``key`` = ``(program, config, *input byte
    lengths)``, or None. Its ``graph_trial_left`` and ``graph_choice`` tell where the
    graph-or-issued trial of a one-launch plan stands and what it kept."""
    return backend._core.prepared_for(key)
