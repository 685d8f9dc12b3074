"""The measured series: their keys, labels, what each is compared with, and the bytes it moves.

A series key names one measured system at one size (``vyre.dispatch``, ``floor.pageable``,
``ceiling.copy_in.8``...). Reports store keys; labels and references come from here, so a
stored report formats without the compiled core.
"""

from __future__ import annotations

import re

__all__ = [
    "FULL",
    "IN",
    "OUT",
    "READBACK_STAGES",
    "STAGE_NAMES",
    "UNATTRIBUTED",
    "UPLOAD_STAGES",
    "copy_key",
    "label",
    "order",
    "reference",
    "register",
    "traffic_kind",
]

# The core's stage order (vyre_cuda.profile.session.stage_names()); a report carries the names it measured.
STAGE_NAMES = (
    "plan_lookup",
    "staging_memcpy",
    "h2d_enqueue",
    "clears",
    "params_upload",
    "launch",
    "readback_enqueue",
    "event_record",
    "wait",
    "copy_out",
    "release",
)
UNATTRIBUTED = "unattributed"
# The stages that make up the upload and the readback of a dispatch (for GB/s per direction).
UPLOAD_STAGES = ("staging_memcpy", "h2d_enqueue")
READBACK_STAGES = ("readback_enqueue", "copy_out")

# What a series moves per sample: the dispatch's inputs and outputs (FULL), or one direction.
FULL, IN, OUT = "full", "in", "out"

# key, label, reference key (for the "x floor" column), traffic kind
_SYSTEMS = (
    # the per-buffer floor: one cuMemcpyHtoDAsync per input
    ("floor.pinned", "per-buffer floor: pinned staging, full", "floor.pinned", FULL),
    ("floor.pinned_enqueue", "per-buffer floor: pinned, enqueue part", "floor.pinned_enqueue", None),
    ("floor.pageable", "driver's pageable path, full", "floor.pinned", FULL),
    ("floor.pageable_enqueue", "driver's pageable path, enqueue part", "floor.pinned_enqueue", None),
    ("floor.pinned_direct", "per-buffer issued floor: pinned arrays", "floor.pinned", FULL),
    # the tight floor: both inputs in one H2D, the launch, one D2H, a wait (vyre_cuda.profile.tight);
    # the family's key holds its fastest wait's samples
    ("floor.tight", "tight floor: 1 H2D + launch + 1 D2H, fastest", "floor.pinned", FULL),
    ("floor.tight.spin", "tight floor, cuEventQuery spin", "floor.pinned", FULL),
    ("floor.tight.event", "tight floor, cuEventSynchronize", "floor.pinned", FULL),
    ("floor.tight.stream", "tight floor, cuStreamSynchronize", "floor.pinned", FULL),
    ("floor.tight_graph", "tight floor as a graph replay, fastest wait", "floor.pinned", FULL),
    ("floor.tight_graph.spin", "tight graph floor, cuEventQuery spin", "floor.pinned", FULL),
    ("floor.tight_graph.event", "tight graph floor, cuEventSynchronize", "floor.pinned", FULL),
    ("floor.tight_graph.stream", "tight graph floor, cuStreamSynchronize", "floor.pinned", FULL),
    ("floor.launch_only", "floor: launch only, per launch", "floor.launch_only", None),
    ("ceiling.dma_h2d", "DMA ceiling: pinned -> device (inputs)", None, IN),
    ("ceiling.dma_d2h", "DMA ceiling: device -> pinned (output)", None, OUT),
    ("ceiling.dma_both", "DMA ceiling: both directions at once", None, FULL),
    ("vyre.dispatch", "vyre_cuda dispatch, numpy", "floor.pinned", FULL),
    ("vyre.dispatch_profiled", "vyre_cuda dispatch, stage clocks on", "floor.pinned", FULL),
    ("vyre.dispatch_into", "vyre_cuda dispatch_into, numpy", "floor.pinned", FULL),
    ("vyre.pinned", "vyre_cuda dispatch_into, page-locked", "floor.pinned", FULL),
    ("vyre.async_enqueue", "vyre_cuda dispatch_async enqueue", "floor.pinned_enqueue", None),
    ("vyre.async_total", "vyre_cuda dispatch_async + result()", "floor.pinned", FULL),
)
_BY_KEY = {key: (i, lab, ref, kind) for i, (key, lab, ref, kind) in enumerate(_SYSTEMS)}


def register(rows, after: str | None = None) -> None:
    """Add series ``(key, label, reference key, traffic kind)`` to the table, listed after the
    series ``after`` (default: last). A benchmark registers the rows it adds to a run."""
    global _SYSTEMS, _BY_KEY
    known = [r for r in _SYSTEMS if r[0] not in {row[0] for row in rows}]
    at = len(known) if after is None else [r[0] for r in known].index(after) + 1
    _SYSTEMS = (*known[:at], *rows, *known[at:])
    _BY_KEY = {key: (i, lab, ref, kind) for i, (key, lab, ref, kind) in enumerate(_SYSTEMS)}


# Host memcpy ceilings carry their thread count: ceiling.copy_in.8, ceiling.copy_out.1, ...
_LAST_DMA = "ceiling.dma_both"
_COPY_RE = re.compile(r"ceiling\.copy_(in|out)\.(\d+)\Z")


def copy_key(direction: str, threads: int) -> str:
    """The key of a host memcpy ceiling: ``direction`` is ``in`` (pageable -> pinned) or
    ``out`` (pinned -> pageable)."""
    return f"ceiling.copy_{direction}.{int(threads)}"


def _row(key: str) -> tuple:
    """``(sort key, label, reference, traffic kind)`` of a series key: one of the table, a host
    memcpy ceiling, or unknown (its own label, listed last)."""
    last_dma = _BY_KEY[_LAST_DMA][0]
    if key in _BY_KEY:  # the memcpy ceilings go right after the DMA ceilings
        index, lab, ref, kind = _BY_KEY[key]
        return (index if index <= last_dma else index + 1000, ()), lab, ref, kind
    m = _COPY_RE.match(key)
    if m is None:
        return (10_000, ()), key, None, None
    way, threads = m.group(1), int(m.group(2))
    lab = f"memcpy ceiling: {'pageable -> pinned' if way == 'in' else 'pinned -> pageable'}, {threads} thread"
    return (last_dma + 1, (way == "out", threads)), lab + "s" * (threads != 1), None, IN if way == "in" else OUT


def label(key: str) -> str:
    """The human label of a series key (the key itself when unknown)."""
    return _row(key)[1]


def reference(key: str):
    """The key whose median the "x floor" column divides by, or None."""
    return _row(key)[2]


def traffic_kind(key: str):
    """FULL (inputs in and outputs out), IN, OUT, or None for a series that moves no data
    (enqueue parts, launch only)."""
    return _row(key)[3]


def order(key: str) -> tuple:
    """A sort key that lists series in table order: floor, ceilings, vyre_cuda, peers."""
    return (*_row(key)[0], key)
