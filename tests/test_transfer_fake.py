"""The transfer engine's real code (ring windows, copy threads, pipelined upload and readback) on
the fake CUDA driver: large dispatches at window and ring boundaries, from several threads, must
give exactly numpy's answer. The GPU suite (tests/gpu/test_transfer_gpu.py) repeats this on a
device; this runs in CI."""

from __future__ import annotations

import json

import fakecuda
import pytest

CHILD = r"""
import json, sys, threading
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp

MIB = 1 << 20
fake = FakeDriver()
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
results = {"checked": 0, "errors": []}
# a small ring (1 MiB chunks, 2 of them) so every size below crosses windows and reuses slots
g = vc.CudaBackend(0, staging_chunk_bytes=MIB, staging_chunks=2, copy_threads=3)
# both copy kinds: plain memcpy, and non-temporal stores (odd sizes exercise their head and tail)
g._core.xfer.stream_upload_max = g._core.xfer.stream_readback_max = (1 << 40) if sys.argv[2] == "1" else 0
sizes = [MIB // 4 - 1, MIB // 4, MIB // 4 + 1, 2 * MIB // 4 + 7, 3 * MIB // 4 - 5, 5 * MIB // 4 + 3]
for n in sizes:
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
    assert not g.plan_info(prog, [a, b]).mirror, n
    (out,) = g.dispatch(prog, [a, b])
    dst = np.full(n, np.nan, np.float32)
    g.dispatch_into(prog, [a, b], [dst])
    (late,) = g.dispatch_async(prog, [b, a]).result()
    for got in (out, dst, late):
        if not np.array_equal(got, a + b):
            results["errors"].append(f"n={n}: wrong result")
    results["checked"] += 3

def worker(seed):
    r = np.random.default_rng(seed)
    try:
        for _ in range(6):
            n = int(r.choice(sizes))
            a = r.standard_normal(n).astype(np.float32)
            b = r.standard_normal(n).astype(np.float32)
            (out,) = g.dispatch(prog, [a, b])
            if not np.array_equal(out, a + b):
                results["errors"].append(f"thread n={n}: wrong result")
    except Exception as exc:
        results["errors"].append(repr(exc))

threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
snap = g.telemetry.snapshot()
results["ring_chunks"] = snap["ring_chunks"]
results["live"] = [snap[k] for k in ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")]
results["free_slots"] = g._core.xfer.free_slots()
results["parallel_jobs"] = g._core.xfer.parallel_jobs
results["hook_errors"] = fake.hook_errors
g.close()
print(json.dumps(results))
"""


@pytest.mark.parametrize("streaming", [False, True], ids=["memcpy", "streaming-stores"])
def test_ring_transfers_are_exact_on_the_fake_driver(fake_libcuda, rng, streaming):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed), "1" if streaming else "0"], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [] and res["hook_errors"] == [], res
    assert res["checked"] == 18
    assert res["ring_chunks"] > 50  # every dispatch streamed through the ring, both ways
    assert res["live"] == [0, 0, 0, 0] and res["free_slots"] == 2
    assert res["parallel_jobs"] > 0  # the copy threads took part
