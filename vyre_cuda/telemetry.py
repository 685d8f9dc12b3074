"""Telemetry counters and the timed-dispatch result."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["COUNTERS", "TimedDispatchResult", "Telemetry"]

# Order matches the C counter array in _dispatch.pyx.
COUNTERS = (
    "dispatches",
    "h2d_bytes",
    "h2d_ops",
    "d2h_bytes",
    "d2h_ops",
    "transient_alloc_bytes",
    "param_upload_bytes",
    "launches",
    "cooperative_launches",
    "split_launches",
    "memset_ops",
    "sync_points",
    "timed_dispatches",
    "timed_wall_ns",
    "timed_device_ns",
    "timed_enqueue_ns",
    "timed_wait_ns",
    "failed_dispatches",
    "leaked_allocations",
    "staged_h2d_bytes",  # uploaded through staging (the mirror or the ring)
    "direct_h2d_bytes",  # DMA'd straight from page-locked inputs
    "staged_d2h_bytes",
    "direct_d2h_bytes",
    "ring_chunks",  # windows that went through the staging ring, both directions
    "interrupted_waits",  # waits ended by Ctrl-C (the work stays owned by a PendingDispatch)
    "graph_replays",  # dispatches whose launches ran as one CUDA graph launch
    "graph_captures",  # launch sequences captured and instantiated (a new argument-pointer set)
    "graph_updates",  # cached graph execs updated in place to new argument pointers
    "graph_fallbacks",  # dispatches of a graph plan that issued their launches instead
)


class TimedDispatchResult(NamedTuple):
    """Outputs of a timed dispatch plus where its time went (nanoseconds).

    ``wall_ns`` spans enqueue to copied-out outputs; ``device_ns`` is GPU time of the launches
    (CUDA events after the uploads and clears, and after the last launch); ``enqueue_ns`` is host
    time to enqueue everything; ``wait_ns`` waiting for completion plus copying the outputs out.
    """

    outputs: list[Any]
    wall_ns: int
    device_ns: int
    enqueue_ns: int
    wait_ns: int


class Telemetry:
    """Live view of a backend's counters: ``snapshot()`` returns a dict, ``reset()`` zeroes them."""

    def __init__(self, core):
        self._core = core

    def snapshot(self) -> dict[str, int]:
        """Every counter and pool statistic by name, read now."""
        values = dict(zip(COUNTERS, self._core.counters()))
        values.update(self._core.pool_stats())
        return values

    def reset(self) -> None:
        """Zero the counters (the pools' statistics are live figures and stay)."""
        self._core.reset_counters()

    def __getitem__(self, name: str) -> int:
        return self.snapshot()[name]

    def __repr__(self) -> str:
        snap = self.snapshot()
        body = ", ".join(f"{k}={v}" for k, v in snap.items() if v)
        return f"Telemetry({body})"
