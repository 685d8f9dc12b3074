"""DeviceGroup and vyre_cuda.dask on real GPUs: map, dispatch_split and map_blocks against numpy on
every visible device, the device ordinal in errors, and a kernel fault on one device while the
others finish (in a child process: a fault poisons the process's context on that device for good).

Everything runs on one GPU too (with a group of one). The assertions that need two devices (both
used, a survivor after a fault) are checked when two or more are visible; the tests that only make
sense with two skip on one, with the reason, unless VYRE_CUDA_REQUIRE_MULTI_GPU=1 (then they fail).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program, ValidationError, _driver
from vyre_cuda import builtin_programs as bp
from vyre_cuda.planning.split import plan_split

SAXPY = Program(
    Kernel.cuda(r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* x, const float* y, const float* coef, float* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) out[i] = coef[0] * x[i] + y[i];
}
"""),
    [
        BufferDecl.read("x", 0, "f32"),
        BufferDecl.read("y", 1, "f32"),
        BufferDecl.read("coef", 2, "f32", 1),
        BufferDecl.output("out", 3, "f32"),
    ],
    name="saxpy_static_coef",
)


def _count() -> int:
    return _driver.device_count()


def _need_two() -> int:
    n = _count()
    if n < 2:
        if os.environ.get("VYRE_CUDA_REQUIRE_MULTI_GPU") == "1":
            pytest.fail(f"VYRE_CUDA_REQUIRE_MULTI_GPU=1 but only {n} CUDA device is visible")
        pytest.skip(f"needs 2 CUDA devices, {n} visible")
    return n


def _pair(rng, n):
    return [rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)]


# ---------------------------------------------------------------------------------- map
def test_map_matches_numpy_on_every_device(rng):
    prog = bp.vecadd("f32")
    sizes = rng.integers(1 << 18, 1 << 20, 32)
    batches = [_pair(rng, int(n)) for n in sizes]
    with vc.DeviceGroup() as group:
        assert group.devices == tuple(range(_count()))
        outs = group.map(prog, batches)
        assert len(outs) == 32
        for (a, b), (out,) in zip(batches, outs):
            np.testing.assert_array_equal(out, a + b)
        per = group.telemetry.per_device()
        assert sum(p["group_items"] for p in per.values()) == 32
        assert sum(p["dispatches"] for p in per.values()) == 32
        assert all(not p["lost"] and p["group_failed_items"] == 0 for p in per.values())
        if len(per) >= 2:
            assert all(p["group_items"] >= 1 for p in per.values()), per  # every GPU took work
        total = group.telemetry.snapshot()
        assert total["dispatches"] == 32 and total["devices"] == _count()
        assert total["h2d_bytes"] >= sum(a.nbytes + b.nbytes for a, b in batches)
        assert total["d2h_bytes"] >= sum(a.nbytes for a, _ in batches)


def test_map_on_one_device_with_two_threads_and_streaming(rng):
    prog = bp.vecadd("f32")
    batches = [_pair(rng, int(n)) for n in rng.integers(1, 300_000, 24)]
    with vc.DeviceGroup([0], threads_per_device=2) as group:
        outs = group.map(prog, batches)
        for (a, b), (out,) in zip(batches, outs):
            np.testing.assert_array_equal(out, a + b)
        seen = set()
        for index, (out,) in group.imap_unordered(prog, iter(batches), window=4):
            a, b = batches[index]
            np.testing.assert_array_equal(out, a + b)
            seen.add(index)
        assert seen == set(range(24))
        handle = group.map_async(prog, batches[:5])
        assert [o[0].tolist() for o in handle.result(timeout=60)] == [(a + b).tolist() for a, b in batches[:5]]
        assert group.telemetry.snapshot()["dispatches"] == 24 + 24 + 5


# ---------------------------------------------------------------------------------- split
def test_dispatch_split_matches_numpy_on_every_device(rng):
    n = 10_000_019  # odd: the last chunk is shorter
    x, y = _pair(rng, n)
    coef = np.array([rng.standard_normal()], np.float32)
    with vc.DeviceGroup() as group:
        expected_chunks = len(plan_split(SAXPY, [x, y, coef], ["x", "y"], devices=len(group)).bounds)
        (out,) = group.dispatch_split(SAXPY, [x, y, coef], split=["x", "y"])
        np.testing.assert_allclose(out, coef[0] * x + y, rtol=2e-6, atol=1e-6)
        per = group.telemetry.per_device()
        assert sum(p["dispatches"] for p in per.values()) == expected_chunks
        if len(per) >= 2:
            assert expected_chunks >= len(per)
            assert all(p["dispatches"] >= 1 for p in per.values()), per
        # each chunk uploads its share of x and y once (plus the coefficient and params words)
        h2d = sum(p["h2d_bytes"] for p in per.values())
        assert x.nbytes + y.nbytes <= h2d <= x.nbytes + y.nbytes + expected_chunks * 4096

        # rows of a 2-D input, cut at multiples of align rows, into the caller's array
        a, b = rng.standard_normal((3001, 5)).astype(np.float32), rng.standard_normal((3001, 5)).astype(np.float32)
        dst = np.empty(3001 * 5, np.float32)
        outs = group.dispatch_split(bp.vecadd("f32"), [a, b], split=True, align=64, chunks=7, outputs=[dst])
        assert outs[0] is dst
        np.testing.assert_array_equal(dst, (a + b).reshape(-1))


def test_dispatch_split_refuses_what_cannot_be_split():
    u = np.arange(1024, dtype=np.uint32)
    with vc.DeviceGroup() as group:
        cases = [
            (bp.inclusive_scan_u32(), [u], True, "synchronises the whole grid"),
            (bp.block_sum_u32(4), [u], True, "has a static size"),
            (bp.vecadd("u32"), [u, u], None, "not declared elementwise"),
        ]
        for prog, inputs, split, match in cases:
            with pytest.raises(ValidationError, match=match) as info:
                group.dispatch_split(prog, inputs, split=split)
            assert str(info.value).splitlines()[-1].startswith("Fix: ")
        assert group.telemetry.snapshot()["dispatches"] == 0


# ---------------------------------------------------------------------------------- errors
def test_errors_carry_the_device_ordinal(rng):
    prog = bp.vecadd("f32")
    good = _pair(rng, 1000)
    with vc.DeviceGroup() as group:
        batches = [good] * 6 + [good[:1]] + [good] * 6  # item 6 lacks an input
        with pytest.raises(ValidationError, match="takes 2 input") as info:
            group.map(prog, batches)
        err = info.value
        assert err.device in group.devices and err.item == 6
        assert str(err).startswith(f"device {err.device}, item 6: ")
        assert str(err).splitlines()[-1].startswith("Fix: ")
        # a config the device refuses (block over its limit), on whichever device runs it
        results = group.map(prog, [good] * 4, DispatchConfig(workgroup_override=4096), return_exceptions=True)
        assert all(isinstance(r, ValidationError) and r.device in group.devices for r in results)
        assert all(f"device {r.device}, item {i}: " in str(r) for i, r in enumerate(results))
        # the group is still healthy
        (out,) = group.map(prog, [good])[0]
        np.testing.assert_array_equal(out, good[0] + good[1])


FAULT_SCRIPT = r'''
import json
import numpy as np
import vyre_cuda as vc
from vyre_cuda import BufferDecl, Kernel, Program, _driver

# out = 2 * x; with flag[0] != 0, thread 0 also writes to address 0x10: an illegal address
prog = Program(Kernel.cuda(r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* x, const unsigned* flag, float* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) {
    if (flag[0] != 0u && i == 0) { volatile float* wild = reinterpret_cast<volatile float*>(0x10ull); *wild = x[0]; }
    out[i] = 2.0f * x[i];
  }
}
"""), [BufferDecl.read("x", 0, "f32"), BufferDecl.read("flag", 1, "u32", 1), BufferDecl.output("out", 2, "f32")])

rng = np.random.default_rng()
FAULTY = 9
xs = [rng.standard_normal(4 << 20).astype(np.float32) for _ in range(24)]
batches = [[x, np.array([1 if i == FAULTY else 0], np.uint32)] for i, x in enumerate(xs)]

def describe(r, x):
    if isinstance(r, BaseException):
        return {"error": type(r).__name__, "status": getattr(r, "status", None),
                "device": getattr(r, "device", None), "last_line": str(r).splitlines()[-1]}
    return {"ok": bool(np.array_equal(r[0], 2 * x))}

res = {"devices": _driver.device_count()}
group = vc.DeviceGroup()
results = group.map(prog, batches, return_exceptions=True)
res["items"] = [describe(r, x) for r, x in zip(results, xs)]
res["lost"] = list(group.lost_devices)
res["per_device"] = {str(k): {"items": v["group_items"], "failed": v["group_failed_items"], "lost": v["lost"]}
                     for k, v in group.telemetry.per_device().items()}

def probe(ordinal):
    """What the driver itself says about a device after the fault, bypassing vyre_cuda: retain
    its primary context, allocate, set and synchronise."""
    from cuda.bindings import driver as cu
    err, dev = cu.cuDeviceGet(ordinal)
    err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
    if int(err):
        return cu.cuGetErrorName(err)[1].decode()
    cu.cuCtxPushCurrent(ctx)
    try:
        err, ptr = cu.cuMemAlloc(1 << 20)
        if not int(err):
            err = cu.cuMemsetD8(ptr, 7, 1 << 20)
            if not int(err):
                err = cu.cuCtxSynchronize()[0]
            cu.cuMemFree(ptr)
        return cu.cuGetErrorName(err)[1].decode()
    finally:
        cu.cuCtxPopCurrent()
        cu.cuDevicePrimaryCtxRelease(dev)

import time
time.sleep(0.5)  # let the fault's recovery settle before asking the driver
res["probe"] = {str(d): probe(d) for d in range(res["devices"])}
try:
    again = group.map(prog, batches[:FAULTY] + batches[FAULTY + 1:])
    res["again"] = all(np.array_equal(r[0], 2 * x) for r, x in zip(again, xs[:FAULTY] + xs[FAULTY + 1:]))
except Exception as exc:
    res["again"] = {"error": type(exc).__name__, "status": getattr(exc, "status", None)}
group.close()
res["closed"] = group.closed
print("VYRE_RESULT " + json.dumps(res), flush=True)
'''


@pytest.mark.faults
def test_a_fault_on_one_device_fails_its_item_and_the_others_finish(run_python):
    proc = run_python(["-c", FAULT_SCRIPT], timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("VYRE_RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    res = json.loads(lines[-1][len("VYRE_RESULT ") :])
    print(json.dumps(res, indent=1))
    n, items = res["devices"], res["items"]
    faulty = items[9]
    assert faulty.get("error") == "DeviceLost" and faulty["status"] == "CUDA_ERROR_ILLEGAL_ADDRESS", faulty
    assert faulty["last_line"].startswith("Fix: ")
    lost = faulty["device"]
    assert res["lost"] == [lost]
    assert res["per_device"][str(lost)]["lost"] and res["per_device"][str(lost)]["failed"] == 1
    assert res["closed"] is True
    others = [it for i, it in enumerate(items) if i != 9]
    if n >= 2:
        # one thread per device: only the item running on the lost device failed; the other
        # devices ran everything else, correctly, and keep serving the group
        assert all(it.get("ok") is True for it in others), items
        assert sum(v["items"] for k, v in res["per_device"].items() if k != str(lost)) >= 23 - 9
        survivors = [d for d in res["probe"] if d != str(lost)]
        if all(res["probe"][d] == "CUDA_SUCCESS" for d in survivors):
            # the driver still serves the other devices: so must the group
            assert res["again"] is True, res
        else:
            # the driver poisoned the whole process (CUDA documents an illegal address as fatal to
            # the process): the group must say so with the driver's status, never hang or return
            # wrong results
            statuses = {res["probe"][d] for d in survivors}
            assert res["again"]["error"] == "DeviceLost" and res["again"]["status"] in statuses | {"group_lost"}, res
    else:
        # one device: the items before the fault are right, the ones after fail (none is left)
        assert all(it.get("ok") is True for it in items[:9]), items
        assert all(it.get("error") == "DeviceLost" and it["status"] == "group_lost" for it in items[10:]), items
        assert res["again"] == {"error": "DeviceLost", "status": "group_lost"}


def test_the_default_group_holds_every_visible_device():
    n = _count()  # one on a one-GPU machine, both on a two-GPU one: nothing to skip
    with vc.DeviceGroup() as group:
        assert len(group) == n and list(group.devices) == list(range(n))
        names = {group.backend(d).caps.name for d in group.devices}
        assert names and all(names)


# ---------------------------------------------------------------------------------- dask
@pytest.fixture
def dask_cluster(_gpu_required):
    pytest.importorskip("dask.array", reason="dask is not installed (pip install 'vyre-cuda[dask]')")
    distributed = pytest.importorskip("distributed", reason="distributed is not installed")
    n = _count()
    cluster = distributed.LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0", memory_limit=0
    )
    client = distributed.Client(cluster)
    yield client, n
    client.close()
    cluster.close()


def _check_map_blocks(client, n, rng):
    import dask.array as da

    import vyre_cuda.dask as vd

    info = client.run(vd.worker_info)
    # LocalCluster names its workers 0..n-1: one per GPU, unless CUDA_VISIBLE_DEVICES is set for
    # every worker (then each takes the first GPU it lists, as documented)
    expected = [0] * n if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() else list(range(n))
    assert sorted(i["device"] for i in info.values()) == expected
    x_np, y_np = _pair(rng, 8 << 20)
    x, y = da.from_array(x_np, chunks=1 << 20), da.from_array(y_np, chunks=1 << 20)
    (out,) = vd.map_blocks(bp.vecadd("f32"), x, y)
    assert out.shape == x.shape and out.dtype == np.float32 and out.numblocks == (8,)
    np.testing.assert_array_equal(out.compute(), x_np + y_np)
    coef = np.array([1.5], np.float32)
    (s,) = vd.map_blocks(SAXPY, x, y, coef)
    np.testing.assert_allclose(s.compute(), 1.5 * x_np + y_np, rtol=2e-6, atol=1e-6)
    info = client.run(vd.worker_info)
    assert sum(i["telemetry"]["dispatches"] for i in info.values()) == 16
    for i in info.values():
        # equal chunks and one program copy per digest: each program planned (and loaded) once
        if i["telemetry"]["dispatches"]:
            assert i["programs"] == i["telemetry"]["prepared_plans"] <= 2, i
    (one,) = vd.submit(client, bp.vecadd("f32"), [x_np[:1000], y_np[:1000]]).result(timeout=120)
    np.testing.assert_array_equal(one, x_np[:1000] + y_np[:1000])
    return info


@pytest.mark.filterwarnings("ignore:Sending large graph")  # the test data travels in the graph on purpose
def test_dask_map_blocks_on_a_local_cluster(dask_cluster, rng):
    import vyre_cuda.dask as vd

    client, n = dask_cluster
    vd.register(client)
    info = _check_map_blocks(client, n, rng)
    if n >= 2:
        assert all(i["telemetry"]["dispatches"] >= 1 for i in info.values()), info


@pytest.mark.filterwarnings("ignore:Sending large graph")  # the test data travels in the graph on purpose
def test_dask_map_blocks_on_dask_cuda(rng):
    pytest.importorskip("dask.array", reason="dask is not installed (pip install 'vyre-cuda[dask]')")
    dask_cuda = pytest.importorskip("dask_cuda", reason="dask-cuda is not installed")
    import distributed

    import vyre_cuda.dask as vd

    n = _count()
    with (
        dask_cuda.LocalCUDACluster(n_workers=n, dashboard_address=":0", memory_limit=0) as cluster,
        distributed.Client(cluster) as client,
    ):
        vd.register(client)
        info = client.run(vd.worker_info)
        # dask-cuda lists each worker's own GPU first in CUDA_VISIBLE_DEVICES: device 0 there
        assert all(i["device"] == 0 for i in info.values()), info
        firsts = sorted(i["cuda_visible_devices"].split(",")[0] for i in info.values())
        assert len(set(firsts)) == n, info  # a different GPU per worker
        x_np, y_np = _pair(rng, 4 << 20)
        import dask.array as da

        (out,) = vd.map_blocks(
            bp.vecadd("f32"), da.from_array(x_np, chunks=1 << 20), da.from_array(y_np, chunks=1 << 20)
        )
        np.testing.assert_array_equal(out.compute(), x_np + y_np)
