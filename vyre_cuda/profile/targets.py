"""The performance targets, evaluated as ratios within one run (built-in vecadd only).

Absolute times drift between runs (up to 35% on the small case on the H200), so every target
compares figures of the same run, or, for "no regression", the vyre_cuda / floor ratio of this
run with the same ratio of a stored baseline run.
"""

from __future__ import annotations

from .report import Target
from .specs import KIB, MIB, format_size
from .stats import ratio

__all__ = [
    "BANDWIDTH_MIN",
    "LARGE_MIN",
    "PAGEABLE_LIMITS",
    "SMALL_MAX",
    "evaluate_targets",
]

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
THREAD_GAIN = 0.9


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
        out += _small(s, base.get(s.nbytes), baseline is not None)
        out += _large(s)
        out += _bandwidth(s)
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
        out.append(
            Target(
                "thread_gain_ratio",
                f"{threads.threads} threads, {format_size(threads.nbytes)}: vyre_cuda gain / floor gain",
                threads.gain_ratio,
                THREAD_GAIN,
                ">=",
                threads.nbytes,
                "x",
            )
        )
    return out


def _small(s, base, have_baseline) -> list:
    if s.nbytes > SMALL_MAX:
        return []
    label = format_size(s.nbytes)
    now = s.ratio("vyre.dispatch", "floor.pinned")
    out = [
        Target(
            "vyre_vs_floor",
            f"{label}: vyre_cuda dispatch / floor (pinned staging)",
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
        out.append(
            Target(
                "no_regression",
                f"{label}: (vyre_cuda / floor) now over the baseline's{what}",
                ratio(now, then),
                NO_REGRESSION,
                "<=",
                s.nbytes,
                "x",
            )
        )
    else:
        out.append(
            Target(
                "no_regression",
                f"{label}: (vyre_cuda / floor) now over a baseline's (pass --baseline FILE)",
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
            f"{label}: vyre_cuda dispatch / floor (pinned staging)",
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
