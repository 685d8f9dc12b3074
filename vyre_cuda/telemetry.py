"""Telemetry counters and the timed-dispatch result."""

from __future__ import annotations

from typing import Any, NamedTuple

from ._counters import counter_names

__all__ = ["COUNTERS", "TimedDispatchResult", "Telemetry"]

# The counter names in the core's slot order, read from the one list of slots (_counters.pxd):
# each slot T_X is counter "x". What each counts is said there.
COUNTERS = counter_names()


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
        """Every counter now, as ``{name: int}``.

        The names of :data:`COUNTERS` (bytes and operations each way, launches, waits, failures,
        graph replays, ...) and the backend's pool statistics (``device_alloc_calls``,
        ``pinned_alloc_calls``, ``ring_bytes``, ``output_cache_hits``, ...). A snapshot is a copy:
        it does not change as the backend works. ``telemetry["h2d_bytes"]`` reads one counter.
        """
        values = dict(zip(COUNTERS, self._core.counters()))
        values.update(self._core.pool_stats())
        return values

    def reset(self) -> None:
        """Zero the counters of :data:`COUNTERS` and the pools' hit, miss and allocation counts
        (between the phases of a measurement, say); sizes of what is cached or live are kept."""
        self._core.reset_counters()

    def __getitem__(self, name: str) -> int:
        return self.snapshot()[name]

    def __repr__(self) -> str:
        snap = self.snapshot()
        body = ", ".join(f"{k}={v}" for k, v in snap.items() if v)
        return f"Telemetry({body})"
