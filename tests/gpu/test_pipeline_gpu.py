"""Enqueue-only dispatches on a caller's stream, and the slab of a dispatch whose outputs are all
written in place.

The pipeline test holds the stream with a slow kernel (tests/helpers/spin.py) and records an event
after it: while the 100 dependent dispatches are enqueued that event must still be pending, so no
enqueue waited for the stream on the host (it cannot have finished waiting before the spin ended).
Every step's output is then checked against numpy.
"""

import numpy as np
import pytest
from helpers.spin import spin_copy

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp

STEPS = 100


@pytest.mark.parametrize("n", [1000, 1 << 20])
def test_a_pipeline_of_dependent_dispatches_only_enqueues(backend, rng, cupy, n):
    prog = bp.vecadd_f32()
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    s = cupy.cuda.Stream(non_blocking=True)
    cfg = vc.DispatchConfig(stream=s)
    with s:
        src, d_b = cupy.asarray(a), cupy.asarray(b)
        x0 = cupy.full(n, cupy.nan, cupy.float32)
        outs = [cupy.full(n, cupy.nan, cupy.float32) for _ in range(STEPS)]
        warm = cupy.empty(n, cupy.float32)
        backend.dispatch_async(prog, [src, d_b], cfg, outputs=[warm]).result()  # the plan, compiled
        before = backend.telemetry.snapshot()
        spin_copy(cupy, x0, src)  # x0 = a, ~50 ms from now, on s
        spun = cupy.cuda.Event()
        spun.record(s)
        pending, cur = [], x0
        for nxt in outs:
            pending.append(backend.dispatch_async(prog, [cur, d_b], cfg, outputs=[nxt]))
            cur = nxt
        assert not spun.done, "the spin ended while dispatches were enqueued: one waited for the stream"
        (last,) = pending[-1].result()
    assert last is outs[-1]
    want = a.copy()
    for k, p in enumerate(pending):
        want = want + b
        got = p.result()[0] if k < STEPS - 1 else last
        assert got is outs[k]
        np.testing.assert_array_equal(cupy.asnumpy(got), want, err_msg=f"step {k}")
    snap = backend.telemetry.snapshot()
    assert snap["in_place_outputs"] - before["in_place_outputs"] == STEPS
    assert snap["d2h_ops"] == before["d2h_ops"], "device outputs were read back to the host"


@pytest.mark.parametrize("n", [1000, 1 << 24])
def test_outputs_written_in_place_take_a_params_only_slab(backend, rng, cupy, n):
    prog = bp.vecadd_f32()
    a, b = (cupy.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
    out = cupy.full(n, cupy.nan, cupy.float32)
    full = backend.plan_info(prog, [a, b]).layout.bucket_bytes
    before = backend.telemetry.snapshot()
    backend.dispatch_into(prog, [a, b], [out])
    cupy.cuda.Device().synchronize()
    after = backend.telemetry.snapshot()
    np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(a + b))
    assert after["transient_alloc_bytes"] - before["transient_alloc_bytes"] <= 4096 < full
    assert after["memset_ops"] == before["memset_ops"]  # the output is declared zeroed=False
    assert after["d2h_ops"] == before["d2h_ops"]
    backend.dispatch_into(prog, [out, b], [out])  # aliases input 0: the full slab and a copy
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(a + b) + cupy.asnumpy(b))
