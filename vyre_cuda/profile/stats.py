"""Statistics of timing samples: medians, percentiles, ratios and bandwidth.

Durations are nanoseconds. Bandwidth is in GB/s with GB = 10**9 bytes (as the DMA engines and
``nvidia-smi`` count), so ``gbps(bytes, ns) == bytes / ns``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Summary", "gbps", "median", "percentile", "ratio", "summarize"]


def _floats(values) -> np.ndarray:
    xs = np.asarray([float(v) for v in values], dtype=np.float64)
    if not xs.size or np.isnan(xs).any():
        raise ValueError(f"statistics of {'a sample containing NaN' if xs.size else 'an empty sample'}")
    return xs


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in 0..100 (got {q})")
    return float(np.percentile(_floats(values), q))


def median(values) -> float:
    """The median: the middle value, or the mean of the two middle values of an even count."""
    return float(np.median(_floats(values)))


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
    xs = _floats(values)
    return Summary(len(xs), float(np.median(xs)), float(np.percentile(xs, 10)), float(np.percentile(xs, 90)))


def ratio(value, reference):
    """``value / reference``, or None when either is missing or the reference is not > 0."""
    if value is None or reference is None or not reference > 0:
        return None
    return float(value) / float(reference)


def gbps(nbytes, ns):
    """Bandwidth in GB/s (10**9 bytes per second) of ``nbytes`` moved in ``ns`` nanoseconds;
    None when either is missing or ``ns`` is not > 0."""
    if nbytes is None or ns is None or not ns > 0:
        return None
    return float(nbytes) / float(ns)
