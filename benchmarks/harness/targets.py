"""The performance targets, evaluated as ratios within one run (built-in vecadd only).

Absolute times drift between runs (up to 35% on the small case on the H200), so every target
compares figures of the same run, or, for "no regression", the vyre_cuda / floor ratio of this
run with the same ratio of a stored baseline run. A streamed target that misses carries a
``note`` with what the run measured that explains it (the DMA, host memcpy or compute time the
hardware needs for those bytes).
"""

from __future__ import annotations

from vyre_cuda.profile import systems, tight
from vyre_cuda.profile.specs import KIB, MIB, format_size
from vyre_cuda.profile.stats import ratio

from .records import Target, budget_name, pattern_label
from .standalone import GROUP as STANDALONE_GROUP
from .standalone import SERIES_FAMILIES

STANDALONE, STANDALONE_GRAPH = SERIES_FAMILIES

__all__ = [
    "BANDWIDTH_MIN",
    "DEVICE_LARGE_MIN",
    "DEVICE_LIMITS",
    "LARGE_MIN",
    "OVERLAP_VS_MAX",
    "PAGEABLE_LIMITS",
    "SMALL_MAX",
    "SMALL_VS_FLOOR_ISSUED",
    "STREAMED_NUMPY_VS_DUPLEX",
    "STREAMED_PINNED_VS_DUPLEX",
    "STREAMED_VS_SERIAL",
    "STREAMED_VS_SERIAL_SIZE",
    "evaluate_pattern_targets",
    "evaluate_targets",
]
__all__ += [
    "FLOOR_VS_STANDALONE",
    "SMALL_VS_GRAPH_FLOOR",
    "SMALL_VS_TIGHT",
    "THREAD_RATE_VS_TIGHT",
]  # the tight floor's

# Sizes up to this are "small" (3 x 4 KiB vecadd), from LARGE_MIN on "large".
SMALL_MAX = 64 * KIB
LARGE_MIN = 1 * MIB
# From this size on, transfers must run near the host's memcpy and the DMA engines' bandwidth.
BANDWIDTH_MIN = 256 * MIB
# vyre_cuda dispatch / the driver's pageable path, at the sizes that have a limit.
PAGEABLE_LIMITS = {4 * MIB: 0.5, 64 * MIB: 0.35}

SMALL_VS_FLOOR = 1.15
PEER_ADVANTAGE = 2.5
LARGE_VS_FLOOR = 1.0
NUMPY_GBPS = 25.0
PAGE_LOCKED_GBPS = 45.0
ASYNC_ENQUEUE = 1.2
NO_REGRESSION = 1.05
# The streamed route (the elementwise vecadd, DispatchConfig(streamed=True)): against the DMA of
# both directions at once from BANDWIDTH_MIN on, page-locked and from numpy; the heavy kernel's
# round trip against the longer of its compute and its transfers; against the serial
# dispatch_into at STREAMED_VS_SERIAL_SIZE.
STREAMED_PINNED_VS_DUPLEX = 1.1
STREAMED_NUMPY_VS_DUPLEX = 1.3
OVERLAP_VS_MAX = 1.15
STREAMED_VS_SERIAL = 0.8
STREAMED_VS_SERIAL_SIZE = 4 * MIB
# Data already on the device, and the launch floor: key -> (series, reference series, limit) at
# the small sizes; the large one from DEVICE_LARGE_MIN on. Every one is evaluated only where the
# run measured both of its series (a peer not installed gives no target).
DEVICE_LIMITS = {
    "device_vs_cupy": ("vyre.device", "peer.cupy.device", 1.1),
    "device_vs_cuda_core": ("vyre.device", "peer.cuda_core.device", 1.15),
    "device_torch_vs_torch": ("vyre.device.torch", "peer.torch.device", 1.1),
    "device_out_vs_into": ("vyre.device.out", "vyre.device", 1.2),
    "enqueue_vs_cuda_core": ("vyre.device.enqueue", "peer.cuda_core.enqueue", 1.2),
    "rebuilt_vs_same": ("vyre.rebuilt", "vyre.dispatch", 1.1),
}
DEVICE_LARGE_MIN = 64 * MIB
DEVICE_LARGE_VS_CUPY = 1.1
# vyre_cuda's numpy round trip must beat the same driver calls issued one by one from page-locked
# arrays (no host copy at all): only fewer driver calls per dispatch (a graph replay) get there.
SMALL_VS_FLOOR_ISSUED = 0.9


def evaluate_targets(sizes, threads, builtin: bool = True, baseline=None) -> list:
    """The targets over measured results: a list of :class:`~vyre_cuda.profile.Target`.

    ``baseline`` is a stored :class:`~vyre_cuda.profile.ProfileReport` for the no-regression
    target at small sizes; without one that target is reported without a value.
    """
    if not builtin:
        return []
    base = {s.nbytes: s for s in baseline.sizes} if baseline is not None else {}
    out = []
    for s in sizes:
        out += _tight_targets(s)  # the headline: vyre_cuda against the fewest calls a round trip takes
        out += _small(s, base.get(s.nbytes), baseline is not None)
        out += _large(s)
        out += _bandwidth(s)
        out += _streamed(s)
        out += _device(s)
        label = format_size(s.nbytes)
        out.append(
            Target(
                "async_enqueue_vs_floor_enqueue",
                f"{label}: vyre_cuda dispatch_async enqueue / floor enqueue part",
                s.ratio("vyre.async_enqueue", "floor.pinned_enqueue"),
                ASYNC_ENQUEUE,
                "<=",
                s.nbytes,
                "x",
            )
        )
        if s.telemetry.get("dispatches"):
            for kind in ("pinned", "device"):
                out.append(
                    Target(
                        f"{kind}_allocations_per_dispatch",
                        f"{label}: {kind} allocations per timed vyre_cuda dispatch",
                        s.allocations_per_dispatch(kind),
                        0.0,
                        "<=",
                        s.nbytes,
                    )
                )
    if threads is not None:
        out += _thread_targets(threads)
    return out


def _small(s, base, have_baseline) -> list:
    if s.nbytes > SMALL_MAX:
        return []
    label = format_size(s.nbytes)
    now = s.ratio("vyre.dispatch", "floor.pinned")
    out = [
        Target(
            "vyre_vs_floor",
            f"{label}: vyre_cuda dispatch / per-buffer floor (pinned staging)",
            now,
            SMALL_VS_FLOOR,
            "<=",
            s.nbytes,
            "x",
        )
    ]
    then = None if base is None else base.ratio("vyre.dispatch", "floor.pinned")
    if have_baseline:
        what = "" if base is not None else " (the baseline has no such size)"
        target = Target(
            "no_regression",
            f"{label}: (vyre_cuda / per-buffer floor) now over the baseline's{what}",
            ratio(now, then),
            NO_REGRESSION,
            "<=",
            s.nbytes,
            "x",
        )
        if target.met is False and base is not None:
            # a ratio of ratios from two runs: the two hosts' medians say how far they differ
            target.note = (
                f"vyre_cuda / floor is {now:.3f} in this run ({_us(s.median('vyre.dispatch'))} over "
                f"{_us(s.median('floor.pinned'))}) against {then:.3f} in the baseline's "
                f"({_us(base.median('vyre.dispatch'))} over {_us(base.median('floor.pinned'))})"
            )
        out.append(target)
    else:
        out.append(
            Target(
                "no_regression",
                f"{label}: (vyre_cuda / per-buffer floor) now over a baseline's (pass --baseline FILE)",
                None,
                None,
                "report",
                s.nbytes,
                "x",
            )
        )
    for peer, name in (("cupy", "CuPy"), ("torch", "PyTorch")):
        value = ratio(s.median(f"peer.{peer}"), s.median("vyre.dispatch"))
        if value is not None:
            out.append(
                Target(
                    f"{peer}_vs_vyre",
                    f"{label}: {name} / vyre_cuda dispatch",
                    value,
                    PEER_ADVANTAGE,
                    ">=",
                    s.nbytes,
                    "x",
                )
            )
    return out


def _large(s) -> list:
    if s.nbytes < LARGE_MIN:
        return []
    label = format_size(s.nbytes)
    limit = PAGEABLE_LIMITS.get(s.nbytes)
    return [
        Target(
            "vyre_vs_floor",
            f"{label}: vyre_cuda dispatch / per-buffer floor (pinned staging)",
            s.ratio("vyre.dispatch", "floor.pinned"),
            LARGE_VS_FLOOR,
            "<=",
            s.nbytes,
            "x",
        ),
        Target(
            "vyre_vs_pageable",
            f"{label}: vyre_cuda dispatch / the driver's pageable path",
            s.ratio("vyre.dispatch", "floor.pageable"),
            limit,
            "report" if limit is None else "<=",
            s.nbytes,
            "x",
        ),
    ]


def _bandwidth(s) -> list:
    if s.nbytes < BANDWIDTH_MIN:
        return []
    label = format_size(s.nbytes)
    return [
        Target(
            "numpy_h2d_gbps",
            f"{label}: vyre_cuda numpy, H2D (inputs / upload stages)",
            s.direction_gbps("h2d"),
            NUMPY_GBPS,
            ">=",
            s.nbytes,
            "GB/s",
        ),
        Target(
            "numpy_d2h_gbps",
            f"{label}: vyre_cuda numpy, D2H (output / readback stages)",
            s.direction_gbps("d2h"),
            NUMPY_GBPS,
            ">=",
            s.nbytes,
            "GB/s",
        ),
        Target(
            "numpy_effective_gbps",
            f"{label}: vyre_cuda numpy, effective ((in + out) / wall)",
            s.gbps("vyre.dispatch"),
            None,
            "report",
            s.nbytes,
            "GB/s",
        ),
        Target(
            "page_locked_gbps",
            f"{label}: vyre_cuda page-locked, effective ((in + out) / wall)",
            s.gbps("vyre.pinned"),
            PAGE_LOCKED_GBPS,
            ">=",
            s.nbytes,
            "GB/s",
        ),
    ]


def _ms(ns) -> str:
    return f"{ns / 1e6:,.2f} ms"


def _streamed(s) -> list:
    out = []
    label = format_size(s.nbytes)
    if s.nbytes >= BANDWIDTH_MIN:
        both = s.median("ceiling.dma_both")
        for key, row, kind, limit, why in (
            ("streamed_pinned_vs_duplex", "vyre.streamed_pinned", "page-locked", STREAMED_PINNED_VS_DUPLEX, _dma_note),
            ("streamed_numpy_vs_duplex", "vyre.streamed", "numpy", STREAMED_NUMPY_VS_DUPLEX, _host_copy_note),
        ):
            value = s.ratio(row, "ceiling.dma_both")
            target = Target(
                key,
                f"{label}: vyre_cuda streamed, {kind} / DMA of both directions at once",
                value,
                limit,
                "<=",
                s.nbytes,
                "x",
            )
            if target.met is False:
                target.note = why(s, row, both)
            out.append(target)
    if "vyre.heavy" in s.systems:
        out.append(_overlap(s))
    if s.nbytes == STREAMED_VS_SERIAL_SIZE:
        out.append(_versus_serial(s))
    return out


def _dma_note(s, row, both) -> str:
    t = s.median(row)
    apart = (s.median("ceiling.dma_h2d") or 0.0) + (s.median("ceiling.dma_d2h") or 0.0)
    return (
        f"the DMA engines need {_ms(both)} for these bytes with both directions at once "
        f"({apart / both:.2f}x that one direction after the other); the streamed route took {_ms(t)}, "
        f"{_ms(t - both)} more: the pipeline's fill and drain (a chunk up alone, a chunk down alone) "
        "and each chunk's enqueue and waits"
    )


def _host_copy_note(s, row, both) -> str:
    threads = [int(k.rsplit(".", 1)[1]) for k in s.systems if k.startswith("ceiling.copy_in.")]
    t = s.median(row)
    if not threads:
        return f"the streamed route took {_ms(t)} against {_ms(both)} of DMA; no host memcpy ceiling was measured"
    n = max(threads)
    copy_in, copy_out = s.median(f"ceiling.copy_in.{n}"), s.median(f"ceiling.copy_out.{n}")
    host = (copy_in or 0.0) + (copy_out or 0.0)
    text = (
        f"the host copies alone need {_ms(host)} on {n} thread{'s' if n != 1 else ''} (inputs into pinned "
        f"memory {_ms(copy_in or 0.0)}, the output out of it {_ms(copy_out or 0.0)}, one after the other), "
        f"{host / both:.2f}x the {_ms(both)} of the DMA of both directions; the streamed route took {_ms(t)}"
    )
    if host / both > STREAMED_NUMPY_VS_DUPLEX:
        text += ": this host's memcpy rate alone puts the target out of reach"
    return text


def _overlap(s) -> Target:
    heavy, compute, transfer = (s.median(k) for k in ("vyre.heavy", "vyre.heavy_compute", "vyre.heavy_transfer"))
    longer = None if compute is None or transfer is None else max(compute, transfer)
    target = Target(
        "overlap_vs_max",
        f"{format_size(s.nbytes)}: heavy kernel streamed / max(its compute alone, its transfers alone)",
        ratio(heavy, longer),
        OVERLAP_VS_MAX,
        "<=",
        s.nbytes,
        "x",
    )
    if target.met is False:
        shorter = min(compute, transfer)
        hidden = (compute + transfer - heavy) / shorter if shorter else 0.0
        target.note = (
            f"compute alone {_ms(compute)}, transfers alone {_ms(transfer)}: one after the other "
            f"{_ms(compute + transfer)} ({(compute + transfer) / longer:.2f}x the longer); the streamed "
            f"round trip took {_ms(heavy)}, hiding {hidden:.0%} of the shorter"
        )
    return target


def _versus_serial(s) -> Target:
    route = s.planner.get("route")
    target = Target(
        "streamed_4mib_vs_serial",
        f"{format_size(s.nbytes)}: vyre_cuda streamed, numpy / serial dispatch_into (unforced: {route or '?'})",
        s.ratio("vyre.streamed", "vyre.dispatch_into"),
        STREAMED_VS_SERIAL,
        "<=",
        s.nbytes,
        "x",
    )
    if route is not None and route != "streamed":  # any other route is a serial one
        target.kept = "serial kept"
        reason = s.planner.get("reason")
        target.note = f"the planner keeps the serial route ({route}) for an unforced dispatch at this size" + (
            f": {reason}" if reason else ""
        )
    elif target.met is False:
        both, serial = s.median("ceiling.dma_both"), s.median("vyre.dispatch_into")
        target.note = (
            f"the DMA of both directions at once takes {_ms(both)}, {both / serial:.2f}x the serial "
            f"{_ms(serial)}: no pipeline of these bytes runs faster; streamed took {_ms(s.median('vyre.streamed'))}"
            if both and serial
            else "the DMA ceiling of both directions was not measured"
        )
    return target


def _us(ns) -> str:
    return f"{ns / 1e3:,.2f} us"


def _device(s) -> list:
    """The device-resident and launch-floor targets of one size, where both series were measured."""
    label = format_size(s.nbytes)
    out = []
    if s.nbytes <= SMALL_MAX:
        for key, (row, ref, limit) in DEVICE_LIMITS.items():
            if s.median(row) is None or s.median(ref) is None:
                continue
            target = Target(
                key,
                f"{label}: {systems.label(row)} / {systems.label(ref)}",
                s.ratio(row, ref),
                limit,
                "<=",
                s.nbytes,
                "x",
            )
            if target.met is False:
                target.note = _DEVICE_NOTES[key](s, row, ref)
            out.append(target)
        if s.median("vyre.dispatch") is not None and s.median("floor.pinned_direct") is not None:
            out.append(_versus_issued(s))
    if (
        s.nbytes >= DEVICE_LARGE_MIN
        and s.median("vyre.device") is not None
        and s.median("peer.cupy.device") is not None
    ):
        target = Target(
            "device_large_vs_cupy",
            f"{label}: {systems.label('vyre.device')} / {systems.label('peer.cupy.device')}",
            s.ratio("vyre.device", "peer.cupy.device"),
            DEVICE_LARGE_VS_CUPY,
            "<=",
            s.nbytes,
            "x",
        )
        if target.met is False:
            vyre, cupy = s.median("vyre.device"), s.median("peer.cupy.device")
            zeroed = s.median("vyre.device.zeroed")
            target.note = (
                f"on the same arrays CuPy took {_ms(cupy)} and vyre_cuda {_ms(vyre)}, {_ms(vyre - cupy)} more: "
                "both run the same bytes through one kernel, so the difference is device work vyre_cuda added "
                "or host time that did not overlap it"
            )
            if zeroed is not None:
                target.note += (
                    f"; with the output declared zeroed (a clearing pass before the kernel) vyre_cuda took "
                    f"{_ms(zeroed)}, {zeroed / cupy:.2f}x CuPy's time"
                )
        out.append(target)
    return out


def _launch_floors(s, peer_launch) -> str:
    """``the launch floor alone (...) is X / Y us``, from the launch-only series the run has."""
    c, peer = s.median("floor.launch_only"), s.median(peer_launch)
    if c is None and peer is None:
        return "no launch-only series was measured at this size"
    parts = [f"{_us(v)} ({k})" for k, v in (("floor.launch_only", c), (peer_launch, peer)) if v is not None]
    return "the launch floor alone is " + " and ".join(parts)


def _host_cost_note(peer_name, peer_launch):
    def note(s, row, ref):
        extra = s.median(row) - s.median(ref)
        text = f"{_launch_floors(s, peer_launch)}; vyre_cuda's host cost above {peer_name}'s is {_us(extra)}"
        zeroed = s.median("vyre.device.zeroed") if row == "vyre.device" else None
        if zeroed is not None:
            # the peers' kernels clear nothing first; an output declared zeroed is cleared
            text += (
                f"; with the output declared zeroed (a clearing pass before the kernel) vyre_cuda took "
                f"{_us(zeroed)}, {zeroed / s.median(ref):.2f}x, {_us(zeroed - s.median(row))} more"
            )
        return text

    return note


def _out_note(s, row, ref):
    out, into = s.median(row), s.median(ref)
    return (
        "a new DeviceArray per dispatch (a block of the DeviceArray pool, a context synchronize per 4 "
        "dropped arrays, and the Python object) "
        f"costs {_us(out - into)} above dispatch_into's {_us(into)} into the same CuPy output"
    )


def _enqueue_note(s, row, ref):
    vyre, core = s.median(row), s.median(ref)
    c = s.median("floor.launch_only")
    floor = f"one cuLaunchKernel from C costs {_us(c)}; " if c is not None else ""
    foreign = s.median("vyre.device.enqueue.foreign")
    other = (
        f"; with the arrays exported on another stream it takes {_us(foreign)} (a query of that producer stream)"
        if foreign is not None
        else ""
    )
    own = s.median("vyre.device.enqueue.devarray")
    if own is not None:
        other += (
            f"; on vyre_cuda's own DeviceArrays (no CuPy protocol to read) it takes {_us(own)}, {own / core:.2f}x "
            f"cuda.core's launch: reading the three CuPy arrays and CuPy's current stream costs {_us(vyre - own)}"
        )
    return (
        f"{floor}one cuda.core launch {_us(core)}; vyre_cuda's device-resident dispatch_async on the caller's "
        f"stream enqueued in {_us(vyre)}, {_us(vyre - core)} more (reading its device arrays, the launch issued "
        "rather than replayed, as a plan dispatched only asynchronously never runs the graph trial, the pending "
        f"handle and its completion event, which cuda.core's launch does not record){other}"
    )


def _rebuilt_note(s, row, ref):
    rebuilt, same = s.median(row), s.median(ref)
    return (
        f"building an equal Program and finding its cached plan by value cost {_us(rebuilt - same)} per dispatch "
        f"above the {_us(same)} of the same Program object"
    )


_DEVICE_NOTES = {
    "device_vs_cupy": _host_cost_note("CuPy", "peer.cupy.launch_only"),
    "device_vs_cuda_core": _host_cost_note("cuda.core", "peer.cuda_core.enqueue"),
    "device_torch_vs_torch": _host_cost_note("PyTorch", "peer.torch.launch_only"),
    "device_out_vs_into": _out_note,
    "enqueue_vs_cuda_core": _enqueue_note,
    "rebuilt_vs_same": _rebuilt_note,
}


def _versus_issued(s) -> Target:
    target = Target(
        "small_vs_floor_issued",
        f"{format_size(s.nbytes)}: vyre_cuda dispatch, numpy / {systems.label('floor.pinned_direct')}",
        s.ratio("vyre.dispatch", "floor.pinned_direct"),
        SMALL_VS_FLOOR_ISSUED,
        "<=",
        s.nbytes,
        "x",
    )
    if target.met is False:
        vyre, issued = s.median("vyre.dispatch"), s.median("floor.pinned_direct")
        text = (
            f"the per-buffer issued floor (2 H2D, 1 launch, 1 D2H, a stream synchronize, no host copy) takes "
            f"{_us(issued)}, "
            f"vyre_cuda {_us(vyre)}"
        )
        replays, dispatches = s.telemetry.get("graph_replays"), s.telemetry.get("dispatches")
        if replays:
            text += f"; {replays:,} of the {dispatches:,} timed vyre_cuda dispatches replayed a graph"
        else:
            c = s.median("floor.launch_only")
            launch = f" and one cuLaunchKernel from C costs {_us(c)}" if c is not None else ""
            text += (
                f"; no timed dispatch replayed a graph{launch}: issued one by one, the same driver calls "
                "cannot take less than the floor's"
            )
        target.note = text
    return target


# -- the patterns users are taught (benchmarks/harness/patterns.py) --------------------------------
# key -> (series, reference series, limit): ratios of medians, evaluated where both were measured
# (a peer not installed gives no target).
PATTERN_LIMITS = {
    "chain_vs_cuda_core": ("pattern.chain.kept", "pattern.chain.cuda_core", 1.2),
    "dropped_vs_enqueue": ("pattern.dropped.host", "pattern.enqueue.single", 1.15),
    "await_vs_blocking": ("pattern.await", "pattern.blocking", 1.3),
    "inflight_1000_vs_single": ("pattern.inflight", "pattern.enqueue.single", 1.3),
}
AWAIT_IDLE_CPU = 0.02  # process CPU seconds per wall second while one long kernel is awaited
BUDGET_MIN_RATE = 0.5  # the slowest accepted device_memory_budget's rate over the unbudgeted one's


def evaluate_pattern_targets(patterns) -> list:
    """The targets of a :class:`~vyre_cuda.profile.report.PatternResult` (None: none)."""
    if patterns is None:
        return []
    label = pattern_label
    nbytes = patterns.settings.get("nbytes")
    out = []
    for key, (row, ref, limit) in PATTERN_LIMITS.items():
        if patterns.median(row) is None or patterns.median(ref) is None:
            continue
        target = Target(key, f"{label(row)} / {label(ref)}", patterns.ratio(row, ref), limit, "<=", nbytes, "x")
        if target.met is False:
            target.note = _PATTERN_NOTES[key](patterns, row, ref)
        out.append(target)
    idle = patterns.values.get("await_idle_cpu")
    if idle is not None:
        spin = patterns.values.get("spin_wall_s")
        target = Target(
            "await_idle_cpu",
            f"process CPU / wall while one {spin or 0:.2f} s kernel is awaited",
            idle,
            AWAIT_IDLE_CPU,
            "<=",
            None,
        )
        if target.met is False:
            target.note = _idle_note(patterns)
        out.append(target)
    rate = _budget_rate(patterns)
    if rate is not None:
        slowest, unbudgeted = rate
        size = patterns.settings.get("budget_bytes")
        target = Target(
            "budget_min_rate",
            f"streamed vecadd from numpy: slowest device_memory_budget's GB/s / unbudgeted GB/s "
            f"(the slowest: {budget_name(slowest['budget'])}, of {len(patterns.budgets) - 1} budgets)",
            slowest["gbps"] / unbudgeted["gbps"],
            BUDGET_MIN_RATE,
            ">=",
            size,
            "x",
        )
        if target.met is False:
            target.note = _budget_note(patterns, slowest, unbudgeted)
        out.append(target)
    return out


def _budget_rate(patterns):
    """``(slowest budgeted entry, unbudgeted entry)`` of the sweep, or None without both."""
    unbudgeted = patterns.budget(None)
    budgeted = [b for b in patterns.budgets if b.get("budget") is not None and b.get("gbps")]
    if unbudgeted is None or not unbudgeted.get("gbps") or not budgeted:
        return None
    return min(budgeted, key=lambda b: b["gbps"]), unbudgeted


def _budget_note(patterns, slowest, unbudgeted) -> str:
    text = (
        f"at device_memory_budget={slowest['budget']:,} a dispatch took {_ms(slowest['median_ns'])} "
        f"({slowest['gbps']:.2f} GB/s) against {_ms(unbudgeted['median_ns'])} unbudgeted "
        f"({unbudgeted['gbps']:.2f} GB/s)"
    )
    chunks, plain = slowest.get("chunks"), unbudgeted.get("chunks")
    if chunks:
        extra = (slowest["median_ns"] - unbudgeted["median_ns"]) / max(1, chunks - (plain or 0))
        text += (
            f"; its plan cuts the rows into {chunks:,} chunks of {slowest.get('chunk_bytes', 0):,} bytes moved"
            f" (unbudgeted: {plain or '?'}), {_us(extra)} more per extra chunk"
        )
    stop = patterns.budget_stop
    if stop.get("reason") == "slow":
        text += f"; the sweep stopped there: one dispatch took {stop['seconds']:.2f} s"
    return text


def _counts_text(counts: dict, unit: str) -> str:
    """``polls 3.10, spun 1.00 per await``: the await counters that moved (vyre_cuda._aio.stats)."""
    return ", ".join(f"{k} {v:,.2f}" for k, v in counts.items()) + f" {unit}"


def _idle_note(patterns) -> str:
    v = patterns.values
    text = f"the process used {v['await_idle_cpu']:.1%} of a CPU while awaiting"
    counts = v.get("idle_await_counts_per_s") or {}
    polls = counts.get("polls")
    if polls:
        text += (
            f"; the await queried the dispatch's completion {polls:,.0f} times a second (one every "
            f"{_us(1e9 / polls)}), {_us(v['await_idle_cpu'] / polls * 1e9)} of CPU per query"
        )
    elif counts:
        text += f"; await counters: {_counts_text(counts, 'a second')}"
    blocking = v.get("blocking_idle_cpu")
    if blocking is not None:
        text += f"; a blocking result() on the same kernel used {blocking:.1%}"
    return text


def _chain_note(patterns, row, ref):
    m = patterns.median
    parts = [f"per step, the README chain {_us(m(row))} against cuda.core's {_us(m(ref))}"]
    for key, name in (
        ("pattern.chain.dropped", "with handles dropped"),
        ("pattern.chain.cupy", "CuPy RawKernel"),
        ("pattern.chain.cupy_alloc", "CuPy's new array alone"),
        ("pattern.chain.torch", "PyTorch add"),
        ("pattern.enqueue.single", "a numpy dispatch_async's enqueue alone"),
    ):
        if m(key) is not None:
            parts.append(f"{name} {_us(m(key))}")
    return "; ".join(parts) + (
        "; a step of the chain also makes a new CuPy array and reads three CuPy arrays and CuPy's stream"
    )


def _dropped_note(patterns, row, ref):
    m = patterns.median
    text = f"a dropped dispatch_async cost {_us(m(row))} per call against {_us(m(ref))} for the enqueue of a kept one"
    drained = m("pattern.dropped.host_drained")
    if drained is not None:
        text += f" ({_us(drained)} per call with the drain after the loop)"
    device = m("pattern.dropped.device")
    if device is not None:
        text += f"; on device arrays {_us(device)} per call"
    shared = m("pattern.dropped.host.shared")
    if shared is not None:
        text += f"; with the pool streams shared after 16 (an experiment knob, off by default) {_us(shared)} per call"
    return text + ": dropping hands what the GPU may still use to the backend's deferred list"


def _await_note(patterns, row, ref):
    m = patterns.median
    text = f"an await took {_us(m(row))} against {_us(m(ref))} for a blocking dispatch, {_us(m(row) - m(ref))} more"
    counts = patterns.values.get("await_counts_per_await")
    if counts:
        text += f"; await counters (vyre_cuda._aio.stats): {_counts_text(counts, 'per await')}"
    gather = m("pattern.gather")
    if gather is not None:
        text += f"; in a gather of {patterns.settings.get('gather', '?')}, {_us(gather)} per dispatch"
    return text


def _inflight_note(patterns, row, ref):
    m = patterns.median
    text = (
        f"with 1,000 in flight an enqueue took {_us(m(row))} against {_us(m(ref))} with one in flight: "
        "each held dispatch keeps its pooled staging and device blocks, so a round of 1,000 needs 1,000 of each"
    )
    shared = m("pattern.inflight.shared")
    if shared is not None:
        text += f"; with the pool streams shared after 16 (an experiment knob, off by default) {_us(shared)}"
    return text


_PATTERN_NOTES = {
    "chain_vs_cuda_core": _chain_note,
    "dropped_vs_enqueue": _dropped_note,
    "await_vs_blocking": _await_note,
    "inflight_1000_vs_single": _inflight_note,
}


# -- the tight floor -------------------------------------------------------------------------
# The fewest driver calls a round trip takes (vyre_cuda.profile.tight): one H2D of both inputs, the
# launch, one D2H and the fastest of three waits; the same captured once as a graph and replayed;
# and the same calls in a standalone C process, which the in-process floor must match.
SMALL_VS_TIGHT = 1.15
SMALL_VS_GRAPH_FLOOR = 1.05
FLOOR_VS_STANDALONE = (0.95, 1.05)
THREAD_RATE_VS_TIGHT = 0.9
_TIGHT_CALLS = "one H2D of both inputs, the launch, one D2H"


def _not_measured(s, key, group) -> str:
    """`` (not measured: why)`` for a description whose series ``key`` the run lacks."""
    if s.median(key) is not None:
        return ""
    return f" (not measured: {s.skipped.get(group) or 'no such series in this run'})"


def _with_wait(s, family) -> str:
    """``12.34 us (spin wait)``: a family's median and its fastest wait."""
    wait = tight.fastest_wait(s, family)
    return f"{_us(s.median(family))} ({wait} wait)" if wait else _us(s.median(family))


def _host_copies(s) -> str:
    """vyre_cuda's host copies (which no tight floor makes: it starts and ends in page-locked memory)."""
    parts = [(n, s.stages[n].median) for n in ("staging_memcpy", "copy_out") if n in s.stages]
    if not parts:
        return ""
    text = ", ".join(f"{n} {_us(v)}" for n, v in parts)
    return f"; vyre_cuda's host copies, which the floor does not make: {text}"


def _tight_targets(s) -> list:
    if s.nbytes > SMALL_MAX:
        return []
    label = format_size(s.nbytes)
    vyre, issued, graph = (s.median(k) for k in ("vyre.dispatch", tight.TIGHT, tight.TIGHT_GRAPH))
    headline = Target(
        "vyre_vs_tight_floor",
        f"{label}: vyre_cuda dispatch / tight floor ({_TIGHT_CALLS}, fastest wait)"
        + _not_measured(s, tight.TIGHT, tight.TIGHT_GROUP),
        s.ratio("vyre.dispatch", tight.TIGHT),
        SMALL_VS_TIGHT,
        "<=",
        s.nbytes,
        "x",
    )
    if headline.met is False:
        headline.note = (
            f"the tight floor takes {_with_wait(s, tight.TIGHT)}, vyre_cuda {_us(vyre)}, {_us(vyre - issued)} more"
            + _host_copies(s)
        )
    replayed = Target(
        "small_vs_graph_floor",
        f"{label}: vyre_cuda dispatch / tight floor as a graph replay (cuGraphLaunch + fastest wait)"
        + _not_measured(s, tight.TIGHT_GRAPH, tight.TIGHT_GRAPH_GROUP),
        s.ratio("vyre.dispatch", tight.TIGHT_GRAPH),
        SMALL_VS_GRAPH_FLOOR,
        "<=",
        s.nbytes,
        "x",
    )
    if replayed.met is False:
        replays, dispatches = s.telemetry.get("graph_replays"), s.telemetry.get("dispatches")
        replay_text = (
            f"; {replays:,} of the {dispatches:,} timed vyre_cuda dispatches replayed a graph"
            if replays is not None and dispatches
            else ""
        )
        replayed.note = (
            f"the graph floor takes {_with_wait(s, tight.TIGHT_GRAPH)} (issued: {_with_wait(s, tight.TIGHT)}), "
            f"vyre_cuda {_us(vyre)}, {_us(vyre - graph)} more" + _host_copies(s) + replay_text
        )
    low, high = FLOOR_VS_STANDALONE
    matched = Target(
        "floor_vs_standalone",
        f"{label}: tight floor in this process / the same calls in a standalone C process"
        + _not_measured(s, STANDALONE, STANDALONE_GROUP),
        s.ratio(tight.TIGHT, STANDALONE),
        high,
        "<=",
        s.nbytes,
        "x",
        low=low,
    )
    if matched.met is False:
        matched.note = (
            f"the tight floor took {_with_wait(s, tight.TIGHT)} in this process and "
            f"{_with_wait(s, STANDALONE)} in the standalone process"
        )
        if graph is not None and s.median(STANDALONE_GRAPH) is not None:
            matched.note += (
                f"; as a graph replay {_with_wait(s, tight.TIGHT_GRAPH)} and {_with_wait(s, STANDALONE_GRAPH)}"
            )
    out = [headline, replayed, matched]
    if s.median(tight.TIGHT_GRAPH) is not None and s.median(STANDALONE_GRAPH) is not None:
        out.append(
            Target(
                "floor_graph_vs_standalone",
                f"{label}: tight graph floor in this process / the same replay in a standalone C process",
                s.ratio(tight.TIGHT_GRAPH, STANDALONE_GRAPH),
                None,
                "report",
                s.nbytes,
                "x",
            )
        )
    return out


def _thread_targets(threads) -> list:
    """vyre_cuda's dispatches per second from N Python threads over the tight floor's from N C
    threads (each its own stream, buffers and event), one target per thread count from 2 on."""
    out = []
    size = format_size(threads.nbytes)
    for count in sorted(c for c in threads.vyre if c >= 2):
        value = threads.rate_ratio(count)
        target = Target(
            "threads_rate_vs_floor",
            f"{count} threads, {size}: vyre_cuda dispatches/s / tight floor's from {count} C threads"
            + ("" if threads.tight.get(count) else " (not measured: no tight floor rate in this run)"),
            value,
            THREAD_RATE_VS_TIGHT,
            ">=",
            threads.nbytes,
            "x",
        )
        if target.met is False:
            v1, t1, per_buffer = threads.vyre.get(1), threads.tight.get(1), threads.floor.get(count)
            one = f"; from 1 thread: vyre_cuda {v1:,.0f}/s, the tight floor {t1:,.0f}/s ({v1 / t1:.2f}x)"
            target.note = (
                f"from {count} threads: vyre_cuda {threads.vyre[count]:,.0f}/s, the tight floor "
                f"{threads.tight[count]:,.0f}/s"
                + (f", the per-buffer floor {per_buffer:,.0f}/s" if per_buffer else "")
                + (one if v1 and t1 else "")
            )
        out.append(target)
    return out
