"""Typed statistics of a backend's pools (one frozen record per owner), and today's flat dict.

Modelled on RMM's ``statistics.py``: each pool reports its own counters as one immutable record,
read together under that pool's lock; :func:`flat_pool_stats` turns a :class:`BackendPoolStats`
into the flat ``pool_stats()`` dict that telemetry snapshots carry.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BackendPoolStats", "BlockPoolStats", "StreamPoolStats", "TransferStats", "flat_pool_stats"]


@dataclass(frozen=True)
class BlockPoolStats:
    """A block pool: cache hits and misses, driver allocations, bytes cached / lent / allocated."""

    hits: int
    misses: int
    alloc_calls: int
    cached_bytes: int
    live_bytes: int
    allocated_bytes: int


@dataclass(frozen=True)
class StreamPoolStats:
    """Streams and events made and in use (the launch-resource pool)."""

    streams_created: int
    streams_live: int
    events_created: int
    events_live: int


@dataclass(frozen=True)
class TransferStats:
    """The transfer engine: its staging ring's bytes, its page-locked allocations, live copy threads."""

    ring_bytes: int
    pinned_alloc_calls: int
    copy_threads_live: int


@dataclass(frozen=True)
class BackendPoolStats:
    """Every pool one backend owns: device blocks (and the stream-ordered pool's live bytes), the
    pinned mirrors, the output cache, streams and events, the transfer engine."""

    device: BlockPoolStats
    device_stream_ordered_live_bytes: int
    pinned: BlockPoolStats
    output_cache: BlockPoolStats
    streams: StreamPoolStats
    transfer: TransferStats


def flat_pool_stats(s: BackendPoolStats) -> dict[str, int]:
    """The flat dict of ``Core.pool_stats()`` (telemetry keys), without the plan counts."""
    dp, pp, op, sp, xf = s.device, s.pinned, s.output_cache, s.streams, s.transfer
    return dict(
        pool_hits=dp.hits + pp.hits,
        pool_misses=dp.misses + pp.misses,
        device_pool_hits=dp.hits,
        device_pool_misses=dp.misses,
        device_pool_cached_bytes=dp.cached_bytes,
        device_pool_live_bytes=dp.live_bytes,
        device_pool_allocated_bytes=dp.allocated_bytes,
        device_pool_stream_ordered_live_bytes=s.device_stream_ordered_live_bytes,
        device_alloc_calls=dp.alloc_calls,
        pinned_pool_hits=pp.hits,
        pinned_pool_misses=pp.misses,
        pinned_pool_cached_bytes=pp.cached_bytes,
        pinned_pool_live_bytes=pp.live_bytes,
        pinned_alloc_calls=pp.alloc_calls + xf.pinned_alloc_calls,
        ring_bytes=xf.ring_bytes,
        output_cache_hits=op.hits,
        output_cache_misses=op.misses,
        output_cache_cached_bytes=op.cached_bytes,
        output_cache_live_bytes=op.live_bytes,
        copy_threads_live=xf.copy_threads_live,
        streams_created=sp.streams_created,
        streams_live=sp.streams_live,
        events_created=sp.events_created,
        events_live=sp.events_live,
    )
