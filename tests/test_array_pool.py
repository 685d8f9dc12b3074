"""The DeviceArray pool (``outputs="device"``) on the fake driver: memory of dropped arrays is
reused, and only after a context synchronize that began after the drop (work a consumer queued on
a stream vyre_cuda never sees may still read it); the cap, trim, and the capture guard."""

import json

import fakecuda
import pytest

CHILD = r"""
import ctypes, json, sys
import numpy as np
import vyre_cuda as vc
from vyre_cuda import _devarray, _driver
from fakecuda import FakeDriver, vecadd_emulation, array_at
from vyre_cuda import builtin_programs as bp

U64, VP = ctypes.c_uint64, ctypes.c_void_p
fake = FakeDriver()
lib = fake.lib
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
N = 1000
res = {"errors": []}
_devarray.ARRAY_POOL_CACHE_BYTES = 1 << 20  # read when the pool is made (by the first array)
g = vc.CudaBackend(0)
DEV = vc.DispatchConfig(outputs="device")


def fresh():
    return rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)


a, b = fresh()
fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))


def stats():
    return _devarray.array_pool_stats(0)


# 1. churn: a new output per dispatch, the previous one dropped. Allocations stop once the pool
#    holds the working set; every result is right.
allocs0 = fake.stats()["device_alloc_calls"]
for i in range(200):
    a, b = fresh()
    (out,) = g.dispatch(prog, [a, b], DEV)
    if not np.array_equal(out.copy_to_host(), a + b):
        res["errors"].append(f"churn dispatch {i}: wrong result")
    if i == 49:
        mid_allocs = fake.stats()["device_alloc_calls"]
    del out
res["churn_allocs_first_50"] = mid_allocs - allocs0
res["churn_allocs_last_150"] = fake.stats()["device_alloc_calls"] - mid_allocs
res["churn"] = stats()

# 1b. the same churn on a plan that replays a CUDA graph: the few pointers the outputs cycle
#     through each keep their exec (a plan holds 8), so the churn costs no capture and no update
GDEV = vc.DispatchConfig(outputs="device", graph=True)
fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32), GDEV)
for i in range(140):
    if i == 40:
        before = fake.stats()
    a, b = fresh()
    (out,) = g.dispatch(prog, [a, b], GDEV)
    if not np.array_equal(out.copy_to_host(), a + b):
        res["errors"].append(f"graph churn dispatch {i}: wrong result")
    del out
after = fake.stats()
res["graph_churn"] = {k: after[k] - before[k] for k in ("graph_launches", "exec_updates", "device_alloc_calls")}

# 2. a consumer's copy queued (lazy: not run) on a stream of its own reads an array that is then
#    dropped; new arrays follow until the pool has reused every block. The copy must still read
#    the first result: the pool may reuse the block only after a context synchronize.
fake.set_lazy(True)
s = VP()
assert lib.cuStreamCreate(ctypes.byref(s), 1) == 0
dst = U64()
assert lib.cuMemAlloc(ctypes.byref(dst), ctypes.c_size_t(4 * N)) == 0
a, b = fresh()
(x,) = g.dispatch(prog, [a, b], DEV)
first = a + b
x_ptr = x.ptr
assert lib.cuMemcpyDtoDAsync(dst, U64(x_ptr), ctypes.c_size_t(4 * N), s) == 0
del x
# (no copy_to_host in between: a synchronous copy runs every queue of the fake, the consumer's too)
reuser = None
for i in range(60):
    c, d = fresh()
    (y,) = g.dispatch(prog, [c, d], DEV)
    if y.ptr == x_ptr:
        reuser, want = y, c + d
        break
    del y
res["block_reused"] = reuser is not None
assert lib.cuStreamSynchronize(s) == 0
res["consumer_copy_right"] = bool(np.array_equal(array_at(dst.value, np.float32, N), first))
if reuser is not None and not np.array_equal(reuser.copy_to_host(), want):
    res["errors"].append("the array that reused the block: wrong result")
del reuser, y
fake.set_lazy(False)

# 3. while a capture of this process is open, the pool never synchronizes (the driver would
#    refuse, and break the capture): it allocates instead, and results stay right
before = stats()
_driver._count_capture_for_tests(1)
held = []
for i in range(40):
    a, b = fresh()
    (z,) = g.dispatch(prog, [a, b], DEV)
    if not np.array_equal(z.copy_to_host(), a + b):
        res["errors"].append(f"capture-open dispatch {i}: wrong result")
    del z
_driver._count_capture_for_tests(-1)
during = stats()
res["flushes_while_capturing"] = during["flushes"] - before["flushes"]
res["refused_while_capturing"] = during["refused_flushes"] - before["refused_flushes"]
for i in range(40):
    a, b = fresh()
    (z,) = g.dispatch(prog, [a, b], DEV)
    del z
res["flushes_after"] = stats()["flushes"] - during["flushes"]

# 4. the cap (1 MiB here): 8 arrays of 256 KiB dropped together leave at most 1 MiB cached; the
#    rest is freed at once
big = 64 * 1024
ba, bb = (rng.standard_normal(big).astype(np.float32) for _ in range(2))
fake.emulate(g, prog, [ba, bb], vecadd_emulation(np.float32))
held = [g.dispatch(prog, [ba, bb], DEV)[0] for _ in range(8)]
for h in held:
    if not np.array_equal(h.copy_to_host(), ba + bb):
        res["errors"].append("a 256 KiB array: wrong result")
del h, held
res["capped"] = stats()

# 5. trim frees every cached block (after a synchronize); close frees the rest of the backend's
g.trim()
res["trimmed"] = stats()
lib.cuMemFree(dst)
lib.cuStreamDestroy(s)
res["violations"] = fake.stats()["violations"]
res["hook_errors"] = fake.hook_errors
g.close()
res["device_allocs_after"] = fake.stats()["device_allocs"]

# 6. reset_device destroys the primary context, and every cached block with it: the pool is
#    dropped, and the next array comes from a new pool (a new allocation, never a dead block)
g = vc.CudaBackend(0)
fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
for i in range(6):
    (out,) = g.dispatch(prog, [a, b], DEV)
    del out
res["cached_before_reset"] = stats()["cached_bytes"]
g.close()
vc.reset_device(0)
g = vc.CudaBackend(0)
fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
a, b = fresh()
(out,) = g.dispatch(prog, [a, b], DEV)
if not np.array_equal(out.copy_to_host(), a + b):
    res["errors"].append("after reset_device: wrong result")
res["after_reset"] = stats()
del out
g.close()

# 7. the page-locked array pool, the same way: a block cached before a reset is never handed out
#    after it, and an array that outlived the reset frees nothing when it dies (its memory went
#    with the context; a new allocation may have been given the same address since)
kept = vc.pinned_empty(N, np.float32)
dropped = vc.pinned_empty(4 * N, np.float32)
del dropped  # cached by the pool
res["pinned_cached_before_reset"] = vc.hostmem.pinned_pool_stats(0)["cached_bytes"]
vc.reset_device(0)
fresh_pinned = vc.pinned_empty(4 * N, np.float32)
fresh_pinned[:] = 1.5
res["pinned_after_reset"] = vc.hostmem.pinned_pool_stats(0)
host_allocs = fake.stats()["host_allocs"]
del kept
res["host_frees_of_dead_blocks"] = host_allocs - fake.stats()["host_allocs"]
res["fresh_pinned_right"] = bool((fresh_pinned == 1.5).all())
del fresh_pinned
res["violations_end"] = fake.stats()["violations"]
print(json.dumps(res))
"""


def test_array_pool_on_the_fake_driver(fake_libcuda, rng):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [] and res["hook_errors"] == [], res
    # 1. reuse: no allocation once the pool holds the working set (two flush batches at most)
    assert res["churn_allocs_first_50"] <= 2 * 4, res
    assert res["churn_allocs_last_150"] == 0, res
    churn = res["churn"]
    assert churn["live_bytes"] == 0 and churn["hits"] >= 150 and churn["flushes"] >= 150 // 4, churn
    assert res["graph_churn"] == {"graph_launches": 100, "exec_updates": 0, "device_alloc_calls": 0}, res
    # 2. the consumer's queued copy read the first result, though the block was reused meanwhile
    assert res["block_reused"] is True
    assert res["consumer_copy_right"] is True
    # 3. no synchronize while a capture was open; they resume after it
    assert res["flushes_while_capturing"] == 0 and res["refused_while_capturing"] >= 1, res
    assert res["flushes_after"] >= 1, res
    # 4. the cap bounds what is cached
    assert res["capped"]["cached_bytes"] <= 1 << 20 and res["capped"]["live_bytes"] == 0, res["capped"]
    # 5. trim leaves nothing cached; with the backend closed, no device memory is left
    assert res["trimmed"]["cached_bytes"] == 0 and res["trimmed"]["quarantined_blocks"] == 0, res["trimmed"]
    assert res["violations"] == 0
    assert res["device_allocs_after"] == 0
    # 6. after reset_device: a new pool, whose first array is a new allocation
    assert res["cached_before_reset"] > 0
    after = res["after_reset"]
    assert (after["hits"], after["alloc_calls"], after["live_bytes"]) == (0, 1, 4096), after
    # 7. the page-locked pool: a new pool after the reset, and no free of a block of the old context
    assert res["pinned_cached_before_reset"] > 0
    pinned = res["pinned_after_reset"]
    assert (pinned["hits"], pinned["alloc_calls"]) == (0, 1), pinned
    assert res["host_frees_of_dead_blocks"] == 0, res
    assert res["fresh_pinned_right"] is True and res["violations_end"] == 0, res


@pytest.mark.parametrize(
    "nbytes, block",
    [(0, 512), (1, 512), (512, 512), (513, 1024), (4096, 4096), (2 << 20, 2 << 20), ((2 << 20) + 1, 4 << 20)],
)
def test_array_block_sizes(nbytes, block):
    from vyre_cuda import _devarray

    assert _devarray._block_size(nbytes) == block
