"""The DeviceArray pool and the page-locked array pool across ``reset_device`` on the GPU: the
reset destroys the primary context and every block the pools cached, so the next array must come
from a new pool, never a dead block, and an array that outlived the reset frees nothing when it
dies.
A reset invalidates every other test's CUDA state (CuPy's, torch's), so it runs in its own
interpreter, which reports JSON."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import vyre_cuda as vc

PACKAGE_ROOT = pathlib.Path(vc.__file__).resolve().parents[1]

CHILD = r"""
import json
import numpy as np
import vyre_cuda as vc
from vyre_cuda import _devarray
from vyre_cuda import builtin_programs as bp

rng = np.random.default_rng()
prog = bp.vecadd_f32()
DEV = vc.DispatchConfig(outputs="device")
res = {"wrong": 0}


def churn(g):
    # 12 new device outputs, each checked against numpy, then dropped
    for _ in range(12):
        a, b = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
        (out,) = g.dispatch(prog, [a, b], DEV)
        res["wrong"] += not np.array_equal(out.copy_to_host(), a + b)
        del out


def pinned_churn(g):
    # page-locked inputs and output (the direct DMA path), fresh data each time, checked
    for _ in range(6):
        a, b, out = (vc.pinned_empty(4096, np.float32) for _ in range(3))
        a[:], b[:] = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
        g.dispatch_into(prog, [a, b], [out])
        res["wrong"] += not np.array_equal(out, a + b)
        del a, b, out


with vc.CudaBackend(0) as g:
    churn(g)
    pinned_churn(g)
res["before_reset"] = _devarray.array_pool_stats(0)
res["pinned_before_reset"] = vc.hostmem.pinned_pool_stats(0)
outlived = vc.pinned_empty(4096, np.float32)  # its memory dies with the context
vc.reset_device(0)
with vc.CudaBackend(0) as g:
    churn(g)
    res["after_reset"] = _devarray.array_pool_stats(0)
    pinned_churn(g)
    res["pinned_after_reset"] = vc.hostmem.pinned_pool_stats(0)
    del outlived  # gives its block back to nothing: no free of an address the new context may own
    pinned_churn(g)
    g.trim()
res["after_trim"] = _devarray.array_pool_stats(0)
print("VYRE_RESULT " + json.dumps(res), flush=True)
"""


def test_reset_device_drops_the_array_pools():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("VYRE_RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    res = json.loads(lines[-1].removeprefix("VYRE_RESULT "))
    assert res["wrong"] == 0, res
    before, after = res["before_reset"], res["after_reset"]
    assert before["cached_bytes"] > 0 and before["hits"] > 0, before  # the pool held blocks
    # a new pool after the reset: its first array was a new allocation, then it reused its own
    assert after["alloc_calls"] >= 1 and after["hits"] + after["alloc_calls"] == 12, after
    assert res["after_trim"]["cached_bytes"] == 0, res["after_trim"]
    # the page-locked pool: cached blocks before the reset, none of them handed out after it
    pinned_before, pinned_after = res["pinned_before_reset"], res["pinned_after_reset"]
    assert pinned_before["cached_bytes"] > 0 and pinned_before["hits"] > 0, pinned_before
    assert pinned_after["alloc_calls"] >= 1 and pinned_after["hits"] + pinned_after["alloc_calls"] == 18, pinned_after
