"""The measured series: their keys, labels, what each is compared with, and the bytes it moves.

A series key names one measured system at one size (``vyre.dispatch``, ``floor.pageable``,
``ceiling.copy_in.8``...). Reports store keys; labels and references come from here, so a
stored report formats without the compiled core.
"""

from __future__ import annotations

import re

from .peers import PEER_MODULES, PEERS  # the registry of the optional peers (imports no peer)

__all__ = [
    "FULL",
    "IN",
    "OUT",
    "PATTERN_LABELS",
    "PEERS",
    "PEER_MODULES",
    "READBACK_STAGES",
    "STAGE_NAMES",
    "UNATTRIBUTED",
    "UPLOAD_STAGES",
    "budget_name",
    "copy_key",
    "label",
    "order",
    "pattern_label",
    "pattern_order",
    "reference",
    "traffic_kind",
]

# The core's stage order (vyre_cuda.profile._hooks.stage_names()); a report carries the names it measured.
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
    ("floor.standalone", "standalone C process: tight floor, fastest", "floor.pinned", FULL),
    ("floor.standalone.spin", "standalone C process: tight, spin", "floor.pinned", FULL),
    ("floor.standalone.event", "standalone C process: tight, event sync", "floor.pinned", FULL),
    ("floor.standalone.stream", "standalone C process: tight, stream sync", "floor.pinned", FULL),
    ("floor.standalone_graph", "standalone C process: graph replay, fastest", "floor.pinned", FULL),
    ("floor.standalone_graph.spin", "standalone C process: graph, spin", "floor.pinned", FULL),
    ("floor.standalone_graph.event", "standalone C process: graph, event sync", "floor.pinned", FULL),
    ("floor.standalone_graph.stream", "standalone C process: graph, stream sync", "floor.pinned", FULL),
    ("floor.launch_only", "floor: launch only, per launch", "floor.launch_only", None),
    ("ceiling.dma_h2d", "DMA ceiling: pinned -> device (inputs)", None, IN),
    ("ceiling.dma_d2h", "DMA ceiling: device -> pinned (output)", None, OUT),
    ("ceiling.dma_both", "DMA ceiling: both directions at once", None, FULL),
    ("vyre.dispatch", "vyre_cuda dispatch, numpy", "floor.pinned", FULL),
    # a new (equal) Program object built for every dispatch: what a plan lookup by value costs
    ("vyre.rebuilt", "vyre_cuda dispatch, Program rebuilt per call", "floor.pinned", FULL),
    ("vyre.dispatch_profiled", "vyre_cuda dispatch, stage clocks on", "floor.pinned", FULL),
    ("vyre.dispatch_into", "vyre_cuda dispatch_into, numpy", "floor.pinned", FULL),
    ("vyre.pinned", "vyre_cuda dispatch_into, page-locked", "floor.pinned", FULL),
    ("vyre.async_enqueue", "vyre_cuda dispatch_async enqueue", "floor.pinned_enqueue", None),
    ("vyre.async_total", "vyre_cuda dispatch_async + result()", "floor.pinned", FULL),
    # the elementwise vecadd on the streamed route (DispatchConfig(streamed=True)), dispatch_into
    ("vyre.streamed", "vyre_cuda streamed, numpy", "floor.pinned", FULL),
    ("vyre.streamed_pinned", "vyre_cuda streamed, page-locked", "floor.pinned", FULL),
    # the compute-heavy elementwise kernel (its own kernel: no floor of this harness runs it)
    ("vyre.heavy", "heavy kernel streamed, page-locked", None, FULL),
    ("vyre.heavy_transfer", "heavy's bytes through vecadd, streamed", None, FULL),
    ("vyre.heavy_compute", "heavy kernel on device arrays (compute)", None, None),
    ("peer.cuda_bindings", "cuda.bindings Python calls, full", "floor.pinned", FULL),
    ("peer.cuda_bindings.launch_only", "cuda.bindings launch only", "floor.launch_only", None),
    ("peer.cupy", "CuPy RawKernel, full", "floor.pinned", FULL),
    ("peer.cupy.launch_only", "CuPy RawKernel launch only", "floor.launch_only", None),
    ("peer.torch", "PyTorch eager add, full", "floor.pinned", FULL),
    ("peer.torch.launch_only", "PyTorch add launch only", "floor.launch_only", None),
    # data already on the device: no transfers, so no floor of this harness to divide by
    ("vyre.device", "vyre_cuda dispatch_into, CuPy device arrays", None, None),
    ("vyre.device.zeroed", "vyre_cuda dispatch_into, CuPy arrays, output declared zeroed", None, None),
    ("vyre.device.out", "vyre_cuda dispatch, outputs='device' (CuPy in)", None, None),
    ("vyre.device.torch", "vyre_cuda dispatch_into, torch CUDA tensors", None, None),
    ("vyre.device.enqueue", "vyre_cuda dispatch_async enqueue, caller stream", "floor.launch_only", None),
    (
        "vyre.device.enqueue.foreign",
        "vyre_cuda dispatch_async enqueue, arrays of another stream",
        "floor.launch_only",
        None,
    ),
    (
        "vyre.device.enqueue.devarray",
        "vyre_cuda dispatch_async enqueue, vyre_cuda DeviceArrays",
        "floor.launch_only",
        None,
    ),
    ("peer.cupy.device", "CuPy RawKernel on device arrays + sync", None, None),
    ("peer.torch.device", "PyTorch add on device tensors + sync", None, None),
    ("peer.cuda_core.device", "cuda.core launch on device buffers + sync", None, None),
    ("peer.cuda_core.enqueue", "cuda.core launch enqueue, per launch", "floor.launch_only", None),
)
_BY_KEY = {key: (i, lab, ref, kind) for i, (key, lab, ref, kind) in enumerate(_SYSTEMS)}
# Host memcpy ceilings carry their thread count: ceiling.copy_in.8, ceiling.copy_out.1, ...
_LAST_DMA = "ceiling.dma_both"
_COPY_RE = re.compile(r"ceiling\.copy_(in|out)\.(\d+)\Z")


def copy_key(direction: str, threads: int) -> str:
    """The key of a host memcpy ceiling: ``direction`` is ``in`` (pageable -> pinned) or
    ``out`` (pinned -> pageable)."""
    return f"ceiling.copy_{direction}.{int(threads)}"


def label(key: str) -> str:
    """The human label of a series key (the key itself when unknown)."""
    if key in _BY_KEY:
        return _BY_KEY[key][1]
    m = _COPY_RE.match(key)
    if m:
        way = "pageable -> pinned" if m.group(1) == "in" else "pinned -> pageable"
        threads = int(m.group(2))
        return f"memcpy ceiling: {way}, {threads} thread{'s' if threads != 1 else ''}"
    return key


def reference(key: str):
    """The key whose median the "x floor" column divides by, or None."""
    return _BY_KEY[key][2] if key in _BY_KEY else None


def traffic_kind(key: str):
    """FULL (inputs in and outputs out), IN, OUT, or None for a series that moves no data
    (enqueue parts, launch only)."""
    if key in _BY_KEY:
        return _BY_KEY[key][3]
    m = _COPY_RE.match(key)
    if m:
        return IN if m.group(1) == "in" else OUT
    return None


def order(key: str) -> tuple:
    """A sort key that lists series in table order: floor, ceilings, vyre_cuda, peers."""
    if key in _BY_KEY:
        index = _BY_KEY[key][0]
        # the memcpy ceilings go right after the DMA ceilings
        return (index if index <= _BY_KEY[_LAST_DMA][0] else index + 1000, (), key)
    m = _COPY_RE.match(key)
    if m:
        return (_BY_KEY[_LAST_DMA][0] + 1, (m.group(1) == "out", int(m.group(2))), key)
    return (10_000, (), key)


# -- the patterns users are taught (vyre_cuda.profile.patterns) --------------------------------
# key -> label, in table order. Times are per chain step, per call, per await, or per dispatch of
# a gather; each series is compared with the one its target names (vyre_cuda.profile.targets).
PATTERN_LABELS = {
    "pattern.chain.kept": "README chain: dispatch_async, new CuPy output, handles kept",
    "pattern.chain.dropped": "README chain: dispatch_async, new CuPy output, handles dropped",
    "pattern.chain.cuda_core": "cuda.core launch chain, new output buffer per step",
    "pattern.chain.cupy": "CuPy RawKernel chain, new output per step",
    "pattern.chain.torch": "PyTorch add chain, new output per step",
    "pattern.enqueue.single": "dispatch_async enqueue, numpy, one in flight",
    "pattern.dropped.host": "dispatch_async dropped, numpy, per call",
    "pattern.dropped.host_drained": "dispatch_async dropped, numpy, per call + drain",
    "pattern.dropped.device": "dispatch_async dropped, device arrays, per call",
    "pattern.inflight": "dispatch_async enqueue, 1,000 kept in flight",
    "pattern.await": "await dispatch_async, numpy",
    "pattern.blocking": "dispatch, numpy (blocking)",
    "pattern.gather": "asyncio.gather of 64 dispatch_async, per dispatch",
}


def pattern_label(key: str) -> str:
    """The human label of a pattern series key (the key itself when unknown)."""
    return PATTERN_LABELS.get(key, key)


def budget_name(nbytes) -> str:
    """A device_memory_budget as the patterns' table names it: ``64 MiB``, ``12,584,960 bytes``
    (not a whole number of KiB), ``unbudgeted`` (None)."""
    if nbytes is None:
        return "unbudgeted"
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {name}"
    return f"{nbytes:,} bytes"


def pattern_order(key: str) -> tuple:
    """A sort key that lists pattern series in :data:`PATTERN_LABELS` order, unknown ones last."""
    keys = list(PATTERN_LABELS)
    return (keys.index(key) if key in keys else len(keys), key)
