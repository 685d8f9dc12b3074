"""The benchmarks' door into the core's private parts: a backend's measurement settings (its
knobs) and plan state, which the product's profile (``vyre_cuda.profile``) never touches.

The scripts of ``benchmarks/`` measure things the public API does not show on purpose: how the
transfer engine behaves under other window sizes or copy routines, how a blocking dispatch waits,
which path a prepared plan chose. Everything they need of that goes through the functions below
(and the stage clocks through ``vyre_cuda.profile.session``), and no other file of ``benchmarks/``
imports a private core module, so that when the core's modules move only these two files follow
them.

These are measuring aids, not API: they change one backend's settings (``vyre_cuda._knobs.Knobs``,
read by its dispatch path), never another's, with only the knobs' own checks. Nothing here is
imported before it is called.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "device_count",
    "is_page_locked_address",
    "prepared_plan",
    "set_knobs",
    "set_stream_tuning",
]


def set_knobs(backend, base=None, **changes) -> Any:
    """Change ``backend``'s measurement settings and return the ones it had. ``base``: knobs to
    start from (a ``vyre_cuda._knobs.Knobs``; None: the backend's own), ``changes``: fields to
    change (the others stay as ``base`` has them), so ``set_knobs(backend, old)`` gives back what
    an earlier call returned. Its cached plans are dropped, so the next dispatch plans with them;
    call it while no other thread dispatches on the backend. The fields:

    - ``wait_mode``: how a blocking dispatch waits for its event. 0 polls (interruptible, the
      default), 1 polls without pausing between queries, 2 calls ``cuStreamSynchronize`` when
      there is no timeout (not interruptible).
    - ``streamed_copy_mode``: how the streamed route's copy threads store (0: the transfer
      engine's rule, 1: plain stores, the default, 2: non-temporal stores).
    - ``min_window``, ``min_readback_window``: the smallest window (bytes) a staged upload and a
      staged readback are cut into (defaults 512 KiB and 1 MiB).
    - ``stream_upload_max``, ``stream_readback_max``: staging copies up to these many bytes use
      non-temporal (streaming) stores instead of plain memcpy (0: never, ``1 << 40``: always).
    - ``mirror_max``: dispatches whose device slab is at most this many bytes upload through the
      pinned mirror, larger ones through the staging ring (default
      ``vyre_cuda.planning.dispatch.MIRROR_MAX``).
    - ``stream_tuning``: the streamed route's constants (:func:`set_stream_tuning`).
    """
    old = backend._knobs
    backend._use_knobs((old if base is None else base).replace(**changes))
    return old


def set_stream_tuning(backend, tuning) -> None:
    """``backend``'s streamed-route constants: a :class:`~vyre_cuda.planning.stream.StreamTuning`
    (chunk bytes, streams, the smallest chunk count, waves per chunk), or None for the measured
    defaults. Cached plans are dropped, so the next dispatch plans with it. The backend's other
    measurement settings (``vyre_cuda._knobs.Knobs``) stay as they are."""
    set_knobs(backend, stream_tuning=tuning)


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
