"""A slow CuPy kernel for the GPU tests: it spins about 50 ms (on an H200), then copies ``src``
into ``dst``. Queued before a dispatch, it stands for a producer's work that is still running; a
dispatch not ordered after it reads stale data, one that waits for it on the host lasts as long."""

from __future__ import annotations

import numpy as np

SPIN = r"""
extern "C" __global__ void spin_copy(float* dst, const float* src, int n, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}
"""
CYCLES = 100_000_000  # ~50 ms at H200 clocks


def spin_copy(cupy, dst, src, cycles: int = CYCLES) -> None:
    """Queue the spin-then-copy on CuPy's current stream (float32 arrays of equal length)."""
    n = dst.shape[0]
    cupy.RawKernel(SPIN, "spin_copy")(((n + 255) // 256,), (256,), (dst, src, np.int32(n), np.int64(cycles)))
