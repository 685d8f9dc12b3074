"""A child that exits with page-locked and device memory still held, in the shapes a user's
script leaves behind: ``python exit_child.py SHAPE``. The fake driver writes what is still
allocated after the process has finalized (FAKE_CUDA_EXIT_REPORT); the test reads it.

Shapes: ``closed`` (``with CudaBackend(0)``, a page-locked array kept in a global),
``open`` (the backend never closed), ``open_dropped`` (never closed, its last dispatch_async
handle dropped at once), ``cycle`` (the array held by a reference cycle with a
finalizer-free object that the last collection runs after module teardown), ``leaked_ref``
(an extra reference the interpreter never drops, as a C library's cache would keep)."""

from __future__ import annotations

import ctypes
import sys

import numpy as np

import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp

FAKE = FakeDriver()
VECADD = bp.vecadd_f32()
RNG = np.random.default_rng(7)


def dispatch_once(gpu, a, b):
    x = np.zeros(16, np.float32)
    FAKE.emulate(gpu, VECADD, [x, x], vecadd_emulation(np.float32))
    (out,) = gpu.dispatch(VECADD, [a, b])
    assert np.array_equal(out, a + b)


shape = sys.argv[1]
a = vc.pinned_empty(4096, np.float32)
a[:] = RNG.standard_normal(4096)
b = RNG.standard_normal(4096).astype(np.float32)
if shape == "closed":
    with vc.CudaBackend(0) as gpu:
        dispatch_once(gpu, a, b)
elif shape == "open":
    gpu = vc.CudaBackend(0)
    dispatch_once(gpu, a, b)
elif shape == "open_dropped":
    gpu = vc.CudaBackend(0)
    dispatch_once(gpu, a, b)
    gpu.dispatch_async(VECADD, [a, b])  # dropped at once: its work waits on the deferred list
elif shape == "cycle":
    with vc.CudaBackend(0) as gpu:
        dispatch_once(gpu, a, b)
    node: list = [vc.pinned_empty(1000, np.float64)]
    node.append(node)
    del node
elif shape == "leaked_ref":
    with vc.CudaBackend(0) as gpu:
        dispatch_once(gpu, a, b)
    kept = vc.pinned_empty((64, 64), np.float32)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))  # never dropped: alive past finalization
else:
    raise SystemExit(f"unknown shape {shape}")
print('{"ok": true}')
