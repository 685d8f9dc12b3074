"""A backend's measurement settings: how it waits, how its copy threads store, how its transfers
are cut into windows, where small dispatches stop using a pinned mirror, the streamed route's
constants. For measurements only (the scripts of ``benchmarks/`` through their hooks, and
tests): private API, not exported from :mod:`vyre_cuda`.

A backend starts with :data:`DEFAULT` (what every user gets); ``CudaBackend._use_knobs(knobs)``
gives one backend others. They are per backend, never process-wide: the core keeps them in C
fields of the backend's own objects (the wait mode on its ``Core``, the copy and window settings on
its ``TransferEngine``), read on the hot path as cheaply as a module global, and planning gets the
mirror boundary and the stream tuning from the backend as arguments. Two backends of one process
can measure different settings at the same time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._validate import check_int
from .errors import ValidationError
from .planning.dispatch import MIRROR_MAX

if TYPE_CHECKING:
    from .planning.stream import StreamTuning

__all__ = ["Knobs", "DEFAULT", "WAIT_POLL", "WAIT_SPIN", "WAIT_SYNC", "COPY_BY_RULE", "COPY_PLAIN", "COPY_STREAMING"]

# wait_mode: how a blocking dispatch waits for its work (the core's values: _waits.pyx)
WAIT_POLL = 0  # spin briefly with a pause per query, then sleep-poll: a timeout or Ctrl-C ends it
WAIT_SPIN = 1  # the same without the pause between queries
WAIT_SYNC = 2  # cuEventSynchronize / cuStreamSynchronize when there is no timeout (not interruptible)
# streamed_copy_mode: how the streamed route's copy threads store (the core's values: _transfer.pxd)
COPY_BY_RULE = 0  # the transfer engine's rule: non-temporal stores for jobs up to stream_upload_max
COPY_PLAIN = 1  # plain stores
COPY_STREAMING = 2  # non-temporal stores

_SIZE_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class Knobs:
    """One backend's measurement settings; the defaults are what every backend runs with (each one
    measured: the comments where the core or planning uses it say how).

    ``wait_mode``: :data:`WAIT_POLL`, :data:`WAIT_SPIN` or :data:`WAIT_SYNC`.
    ``streamed_copy_mode``: :data:`COPY_BY_RULE`, :data:`COPY_PLAIN` or :data:`COPY_STREAMING`.
    ``min_window``, ``min_readback_window``: the smallest window (bytes) a staged upload and a
    staged readback are cut into (about an eighth of the transfer, at least this, at most the
    ring's chunk). ``mirror_max``: slabs up to this many bytes stage through one pinned mirror,
    larger ones through the staging ring. ``stream_tuning``: the streamed route's constants
    (None: the measured defaults of :mod:`vyre_cuda.planning.stream`). ``stream_upload_max``,
    ``stream_readback_max``: staged uploads and readbacks up to these many bytes copy with
    non-temporal stores (0: never, ``1 << 40``: always). ``stream_share_after``: once this many
    dispatches hold pool streams, later ones share those streams round-robin (0: a stream each;
    an experiment for many dispatches in flight, notes/enqueue-chain.md). ``fence_on_demand``: a
    ``dispatch_async`` on a caller's stream object (not timed, not streamed, no staging ring)
    records its completion event when a completion is first needed, not at enqueue; one such
    record covers every earlier one of that stream (an experiment, off).
    """

    wait_mode: int = WAIT_POLL
    streamed_copy_mode: int = COPY_PLAIN
    min_window: int = 512 << 10
    min_readback_window: int = 1 << 20
    mirror_max: int = MIRROR_MAX
    stream_tuning: StreamTuning | None = None
    stream_upload_max: int = 32 << 20
    stream_readback_max: int = 0
    stream_share_after: int = 0
    fence_on_demand: bool = False

    def __post_init__(self):
        # checked here: the core stores them in C fields with no check of its own (a zero window
        # would cut a transfer into nothing)
        for name, low, high in (
            ("wait_mode", WAIT_POLL, WAIT_SYNC),
            ("streamed_copy_mode", COPY_BY_RULE, COPY_STREAMING),
            ("min_window", 1, _SIZE_MAX),
            ("min_readback_window", 1, _SIZE_MAX),
            ("mirror_max", 0, _SIZE_MAX),
            ("stream_upload_max", 0, _SIZE_MAX),
            ("stream_readback_max", 0, _SIZE_MAX),
            ("stream_share_after", 0, (1 << 32) - 1),
        ):
            value = getattr(self, name)
            check_int(f"Knobs.{name}", value, minimum=low, maximum=high, numpy=False, fix=f"pass {name} in that range")
        if not isinstance(self.fence_on_demand, bool):
            raise ValidationError(
                f"Knobs.fence_on_demand must be a bool (got {type(self.fence_on_demand).__name__} "
                f"{self.fence_on_demand!r})",
                "pass fence_on_demand=True or False",
            )

    def replace(self, **changes) -> Knobs:
        """These knobs with ``changes`` (field names) applied."""
        return dataclasses.replace(self, **changes)


DEFAULT = Knobs()
