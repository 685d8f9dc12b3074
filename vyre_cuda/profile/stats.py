"""Statistics of timing samples: medians, percentiles, ratios, throughput and bandwidth.

Durations are nanoseconds. Bandwidth is in GB/s with GB = 10**9 bytes (as the DMA engines and
``nvidia-smi`` count), so ``gbps(bytes, ns) == bytes / ns``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "Summary",
    "gain",
    "gbps",
    "median",
    "percentile",
    "ratio",
    "summarize",
    "throughput",
]


def _sorted_floats(values) -> list:
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("statistics of an empty sample")
    if any(math.isnan(x) for x in xs):
        raise ValueError("statistics of a sample containing NaN")
    return xs


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in 0..100 (got {q})")
    xs = _sorted_floats(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values) -> float:
    """The median: the middle value, or the mean of the two middle values of an even count."""
    xs = _sorted_floats(values)
    mid = len(xs) // 2
    if len(xs) % 2:
        return xs[mid]
    return (xs[mid - 1] + xs[mid]) / 2.0


@dataclass(frozen=True)
class Summary:
    """Median, p10 and p90 of ``n`` samples, in nanoseconds."""

    n: int
    median: float
    p10: float
    p90: float

    def to_dict(self) -> dict:
        return {"n": self.n, "median_ns": self.median, "p10_ns": self.p10, "p90_ns": self.p90}

    @classmethod
    def from_dict(cls, d: dict) -> Summary:
        return cls(int(d["n"]), float(d["median_ns"]), float(d["p10_ns"]), float(d["p90_ns"]))


def summarize(values) -> Summary:
    """:class:`Summary` of a sample of durations (ns)."""
    xs = _sorted_floats(values)
    return Summary(len(xs), median(xs), percentile(xs, 10), percentile(xs, 90))


def ratio(value, reference):
    """``value / reference``, or None when either is missing or the reference is not > 0."""
    if value is None or reference is None or not reference > 0:
        return None
    return float(value) / float(reference)


def throughput(dispatches: int, elapsed_ns: int) -> float:
    """Dispatches per second."""
    if elapsed_ns <= 0:
        raise ValueError(f"elapsed time must be > 0 ns (got {elapsed_ns})")
    return dispatches * 1e9 / elapsed_ns


def gain(one_thread, two_threads):
    """Throughput gain from 1 to 2 threads (2.0 is perfect scaling); None if unmeasured."""
    return ratio(two_threads, one_thread)


def gbps(nbytes, ns):
    """Bandwidth in GB/s (10**9 bytes per second) of ``nbytes`` moved in ``ns`` nanoseconds;
    None when either is missing or ``ns`` is not > 0."""
    if nbytes is None or ns is None or not ns > 0:
        return None
    return float(nbytes) / float(ns)
