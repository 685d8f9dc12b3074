"""Run under compute-sanitizer by test_exit_leaks_gpu.py: a user's script that exits with things
still held. ``python exit_leak_child.py closed|open``: the backend closed (``with``) or never
closed; both keep a page-locked array in a global, an output of a dispatch, a dropped
``dispatch_async`` handle, and one array held by a reference the interpreter never drops."""

from __future__ import annotations

import ctypes
import sys

import numpy as np

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp

VECADD = bp.vecadd_f32()
rng = np.random.default_rng()


def work(gpu):
    outs = []
    for n in (1024, 1 << 20):
        a = vc.pinned_empty(n, np.float32)
        a[:] = rng.standard_normal(n)
        b = rng.standard_normal(n).astype(np.float32)
        (out,) = gpu.dispatch(VECADD, [a, b])
        assert np.array_equal(out, a + b)
        outs.append((a, out))
    big = rng.standard_normal(16 << 20).astype(np.float32)  # 64 MiB: the staging ring
    (out,) = gpu.dispatch(VECADD, [big, big])
    assert np.array_equal(out, big * 2)
    gpu.dispatch_async(VECADD, [outs[0][0], outs[0][0]])  # dropped at once
    return outs


kept = vc.pinned_empty((64, 64), np.float32)
ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))  # never dropped: alive past finalization
if sys.argv[1] == "closed":
    with vc.CudaBackend(0) as gpu:
        held = work(gpu)
else:
    gpu = vc.CudaBackend(0)
    held = work(gpu)
print("done")
