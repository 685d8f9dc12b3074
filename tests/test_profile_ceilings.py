"""The transfer ceilings (vyre_cuda.profile._ceilings) on the fake CUDA driver: the real extension,
alone and as the buffers a Floor extends: every ceiling moves the bytes it times, through the
calls it names, and everything it allocated is freed on close."""

import json

CHILD = r"""
import ctypes, json, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, array_at
from vyre_cuda.errors import ValidationError
from vyre_cuda.profile import run

res = {}
fake = FakeDriver()
rng = np.random.default_rng(int(sys.argv[1]))

def floor_vecadd(launch):
    n = ctypes.c_uint32.from_address(launch._params[3]).value
    a, b, out = (array_at(launch.arg(k), np.float32, n) for k in range(3))
    out[:] = a + b

class Fallback(dict):  # the floor's function is not known by handle: every launch is its
    def get(self, key, default=None):
        return super().get(key, floor_vecadd)

LIVE = ("device_allocs", "host_allocs", "streams", "events")
CALLS = ("htod_copies", "dtoh_copies")

def delta(before, keys):
    after = fake.stats()
    return {k: after[k] - before[k] for k in keys}

fake.emulators = Fallback()
backend = vc.CudaBackend(0)
kernel, image = run.load_floor_kernel(backend)
ceilings_module = sys.modules["vyre_cuda.profile._ceilings"]
n = 1000
a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
out = np.zeros(n, np.float32)
start = fake.stats()

floor = run.import_floor().Floor(kernel, n)
res["is_ceilings"] = isinstance(floor, ceilings_module.Ceilings)
res["floor_live"] = delta(start, LIVE)
# numpy -> pinned staging -> device -> the floor's kernel -> pinned staging -> numpy
floor.copy_in(a, b, 2, 3, warmup=1)
before = fake.stats()
res["h2d"] = [len(floor.dma_h2d(3, warmup=1)), delta(before, CALLS)]
floor.launch_only(1, 1, 0)
before = fake.stats()
res["d2h"] = [len(floor.dma_d2h(3, warmup=1)), delta(before, CALLS)]
floor.copy_out(out, 1, 2)
res["carried"] = bool(np.array_equal(out, a + b))
# both at once: new inputs go up while the old result comes down
a2, b2 = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
floor.copy_in(a2, b2, 1, 1)
before = fake.stats()
res["both"] = [len(floor.dma_both(2)), delta(before, CALLS)]
out[:] = 0
floor.copy_out(out, 1, 1)
res["both_readback"] = bool(np.array_equal(out, a + b))
floor.launch_only(1, 1, 0)
floor.dma_d2h(1)
floor.copy_out(out, 1, 1)
res["both_upload"] = bool(np.array_equal(out, a2 + b2))
res["tight_ok"] = bool(floor.tight(a, b, out, 2).min() > 0 and np.array_equal(out, a + b))
floor.close()
res["floor_freed"] = delta(start, LIVE)
try:
    floor.dma_both(1)
except ValidationError as exc:
    res["floor_closed"] = str(exc).splitlines()[0]

alone = ceilings_module.Ceilings(backend.context_handle, n)
res["alone_live"] = delta(start, LIVE)
res["alone_times"] = [len(alone.copy_in(a, b, 1, 2)), len(alone.dma_both(2)), len(alone.copy_out(out, 1, 2))]
for call in (lambda: alone.copy_in(a, b, 0, 1), lambda: alone.dma_h2d(-1), lambda: alone.copy_out(out[:10], 1, 1)):
    try:
        call()
    except ValidationError as exc:
        res.setdefault("refused", []).append(str(exc).splitlines()[0])
alone.close()
alone.close()  # twice is fine
res["alone_freed"] = delta(start, LIVE)
try:
    alone.copy_in(a, b, 1, 1)
except ValidationError as exc:
    res["alone_closed"] = str(exc).splitlines()[0]
for handle in (0, -5):
    try:
        ceilings_module.Ceilings(handle, n)
    except ValidationError as exc:
        res.setdefault("bad_context", []).append(str(exc).splitlines()[0])
try:
    ceilings_module.Ceilings(backend.context_handle, 0)
except ValidationError as exc:
    res["bad_n"] = str(exc).splitlines()[0]
kernel.close()
backend.close()
res["hook_errors"] = fake.hook_errors
print(json.dumps(res))
"""


def test_ceilings_alone_and_under_a_floor_on_the_fake_driver(fake_libcuda, rng):
    import fakecuda

    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["hook_errors"] == []
    # a Floor is the ceilings' buffers with the floor kernel on them: 2 device allocations (the
    # inputs share one), 1 pinned, 2 streams with an event each
    assert res["is_ceilings"]
    assert res["floor_live"] == {"device_allocs": 2, "host_allocs": 1, "streams": 2, "events": 2}
    # each ceiling issues the copies it names, per pass: 4 passes (a warm-up and 3 timed), both: 2
    assert res["h2d"] == [3, {"htod_copies": 8, "dtoh_copies": 0}]
    assert res["d2h"] == [3, {"htod_copies": 0, "dtoh_copies": 4}]
    assert res["both"] == [2, {"htod_copies": 4, "dtoh_copies": 2}]
    # the memcpy and DMA ceilings carry the bytes: through the kernel, and both halves at once
    assert res["carried"] and res["both_readback"] and res["both_upload"] and res["tight_ok"]
    assert res["floor_freed"] == dict.fromkeys(("device_allocs", "host_allocs", "streams", "events"), 0)
    assert res["floor_closed"] == "this Floor is closed"
    # the ceilings alone: the same buffers and streams in a context, no kernel
    assert res["alone_live"] == res["floor_live"] and res["alone_times"] == [2, 2, 2]
    assert res["refused"] == [
        "copy threads must be in 1..256 (got 0)",
        "iterations and warmup must be >= 0 (got -1, 0)",
        "floor buffer 'out' holds 10 elements, the floor needs 1,000",
    ]
    assert res["alone_freed"] == res["floor_freed"] and res["alone_closed"] == "this Ceilings is closed"
    assert all("context handle must be a non-null CUcontext address" in m for m in res["bad_context"])
    assert len(res["bad_context"]) == 2
    assert res["bad_n"] == "floor element count must be in 1..2,147,483,647 (got 0)"
