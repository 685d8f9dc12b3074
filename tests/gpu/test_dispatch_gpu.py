"""Core dispatch on the GPU, checked against numpy on fresh random data."""

import importlib.util
import json
import threading

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp

SIZES = [1, 3, 255, 1000, 4097, 1 << 20, 3 * (1 << 20) + 5]


def _random(rng, dtype, n):
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return (rng.standard_normal(n) * 100).astype(dt)
    info = np.iinfo(dt)
    lo, hi = max(info.min, -(2**20)), min(info.max, 2**20)
    return rng.integers(lo, hi, n, dtype=dt, endpoint=False)


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "u32", "i64", "u8", "i16", "u16", "f16"])
def test_vecadd_dtypes(backend, rng, dtype):
    prog = bp.vecadd(dtype)
    npd = prog.buffers[0].dtype.numpy
    for n in (1, 17, 4099, 100_003):
        a, b = _random(rng, npd, n), _random(rng, npd, n)
        (out,) = backend.dispatch(prog, [a, b])
        assert out.dtype == npd and out.shape == (n,)
        if dtype == "f16":  # __hadd rounds once; numpy may round through float32
            np.testing.assert_allclose(out.astype(np.float32), (a + b).astype(np.float32), rtol=2e-3)
        else:
            np.testing.assert_array_equal(out, (a + b).astype(npd))


@pytest.mark.parametrize("dtype", ["f32", "u8", "f16", "bf16"])
def test_vecadd_overwrites_every_output_element_with_no_clearing_pass(fresh_backend, rng, cupy, dtype):
    # the built-in vecadd declares its output zeroed=False: nothing clears it before the launch,
    # so the kernel itself must write every element. The second round's host dispatch reuses the
    # slab holding the first round's sums, and each device output starts as 0xFF bytes: an
    # element the kernel skipped would keep the old value, not the new sum of fresh inputs.
    prog = bp.vecadd(dtype)
    assert not prog.buffers[2].zeroed
    npd = prog.buffers[0].dtype.numpy
    for n in (5, 4099, (1 << 20) + 3):  # sizes whose zeroed outputs ride the upload, or get a memset
        for _ in range(2):
            if dtype == "bf16":  # raw bits of finite values in [1, 4)
                a, b = (rng.integers(0x3F80, 0x4080, n, dtype=np.uint16) for _ in range(2))
            else:
                a, b = _random(rng, npd, n), _random(rng, npd, n)
            d_out = cupy.full(n * npd.itemsize, 0xFF, cupy.uint8).view(npd)
            before = fresh_backend.telemetry.snapshot()["memset_ops"]
            (out,) = fresh_backend.dispatch(prog, [a, b])
            fresh_backend.dispatch_into(prog, [cupy.asarray(a), cupy.asarray(b)], [d_out])
            assert fresh_backend.telemetry.snapshot()["memset_ops"] == before, "an output was cleared"
            on_device = d_out.get()
            if dtype == "f16":  # __hadd rounds once; numpy may round through float32
                np.testing.assert_allclose(out.astype(np.float32), (a + b).astype(np.float32), rtol=2e-3)
            elif dtype == "bf16":  # sums of values in [1, 4) lie in [2, 8): bits 0x4000..0x4100
                bits = out.view(np.uint16)  # (a bfloat16 array where ml_dtypes is installed)
                assert ((bits >= 0x4000) & (bits <= 0x4100)).all()
            else:
                np.testing.assert_array_equal(out, (a + b).astype(npd))
            # the same kernel on both paths, byte for byte
            np.testing.assert_array_equal(on_device.view(np.uint8), out.view(np.uint8))


@pytest.mark.parametrize("n", SIZES)
def test_vecadd_sizes(backend, rng, n):
    prog = bp.vecadd_f32()
    a, b = _random(rng, np.float32, n), _random(rng, np.float32, n)
    (out,) = backend.dispatch(prog, [a, b])
    np.testing.assert_array_equal(out, a + b)


def test_vecadd_64mib(backend, rng):
    n = (64 << 20) // 4
    prog = bp.vecadd_f32()
    a, b = _random(rng, np.float32, n), _random(rng, np.float32, n)
    (out,) = backend.dispatch(prog, [a, b])
    np.testing.assert_array_equal(out, a + b)


def test_u8_64mib_odd(backend, rng):
    n = (64 << 20) + 7  # not a multiple of 16 bytes
    prog = bp.vecadd("u8")
    a = rng.integers(0, 100, n, dtype=np.uint8)
    b = rng.integers(0, 100, n, dtype=np.uint8)
    (out,) = backend.dispatch(prog, [a, b])
    np.testing.assert_array_equal(out, a + b)


def test_bytes_and_bytearray_inputs(backend, rng):
    a = _random(rng, np.float32, 1001)
    b = _random(rng, np.float32, 1001)
    (out,) = backend.dispatch(bp.vecadd_f32(), [a.tobytes(), bytearray(b.tobytes())])
    np.testing.assert_array_equal(out, a + b)


_AXPY_INPLACE = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* x, float* y, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_binding_count(p, 1)) y[i] = 2.0f * x[i] + y[i];
}
"""


def test_input_output_in_place(backend, rng):
    prog = Program(Kernel.cuda(_AXPY_INPLACE), [BufferDecl.read("x", 0, "f32"), BufferDecl.read_write("y", 1, "f32")])
    x, y = _random(rng, np.float32, 5003), _random(rng, np.float32, 5003)
    y0 = y.copy()
    (out,) = backend.dispatch(prog, [x, y])
    np.testing.assert_allclose(out, 2.0 * x + y0, rtol=1e-6)
    np.testing.assert_array_equal(y, y0)  # the caller's buffer is borrowed, never written


_WRITE_HALF = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const vyre_u32* a, vyre_u32* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_binding_count(p, 1) / 2) out[i] = a[i] + 1u;
}
"""


def test_unwritten_outputs_are_zero_with_dirty_pool(fresh_backend, rng):
    # fill the pool with a slab full of non-zero garbage, then reuse it
    n = 10_000
    dirty = bp.vecadd("u32")
    a = rng.integers(1, 2**31, n, dtype=np.uint32)
    fresh_backend.dispatch(dirty, [a, a])
    prog = Program(Kernel.cuda(_WRITE_HALF), [BufferDecl.read("a", 0, "u32"), BufferDecl.output("out", 1, "u32")])
    before = fresh_backend.telemetry.snapshot()["device_pool_hits"]
    (out,) = fresh_backend.dispatch(prog, [a])
    assert fresh_backend.telemetry.snapshot()["device_pool_hits"] > before  # a recycled slab
    np.testing.assert_array_equal(out[: n // 2], a[: n // 2] + 1)
    assert not out[n // 2 :].any()


def test_output_byte_range(backend, rng):
    decls = [
        BufferDecl.read("a", 0, "f32"),
        BufferDecl.read("b", 1, "f32"),
        BufferDecl.output("out", 2, "f32", output_byte_range=(400, 4000)),
    ]
    prog = Program(bp.vecadd_f32().kernel, decls)
    a, b = _random(rng, np.float32, 2000), _random(rng, np.float32, 2000)
    (out,) = backend.dispatch(prog, [a, b])
    np.testing.assert_array_equal(out, (a + b)[100:1000])


def test_params_block_as_kernel_sees_it(backend, rng):
    prog = bp.params_echo(a_count=0, words=7)
    a = rng.integers(0, 10, 123, dtype=np.uint32)
    (words,) = backend.dispatch(prog, [a])
    # word 0: launch count (largest output: 7); word b+1: binding b's count; unbound words 0
    np.testing.assert_array_equal(words, [7, 123, 0, 0, 0, 0, 7])


def test_workgroup_reduction_over_48k_shared(backend, rng):
    blocks, wg = 64, 1024
    scratch = 20_000  # u32 -> 80,000 bytes of dynamic shared memory, above the 48 KiB default
    prog = bp.block_sum_u32(blocks, workgroup=wg, scratch_elems=scratch)
    x = rng.integers(0, 1000, blocks * wg, dtype=np.uint32)
    (sums,) = backend.dispatch(prog, [x])
    assert backend.plan_info(prog, [x]).launch.shared_bytes == scratch * 4
    np.testing.assert_array_equal(sums, x.reshape(blocks, wg).sum(axis=1, dtype=np.uint32))


_INCREMENT = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(vyre_u32* acc, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) acc[i] += (vyre_u32)i + 1u;
}
"""


def test_fixpoint_iterations(backend, rng):
    prog = Program(Kernel.cuda(_INCREMENT), [BufferDecl.read_write("acc", 0, "u32")])
    acc = rng.integers(0, 1000, 3001, dtype=np.uint32)
    for iters in (1, 5):
        (out,) = backend.dispatch(prog, [acc], DispatchConfig(fixpoint_iterations=iters))
        np.testing.assert_array_equal(out, acc + iters * (np.arange(3001, dtype=np.uint32) + 1))


def test_async_into_timed(backend, rng):
    prog = bp.vecadd_f32()
    a, b = _random(rng, np.float32, 50_000), _random(rng, np.float32, 50_000)
    pending = backend.dispatch_async(prog, [a, b])
    (out,) = pending.result()
    np.testing.assert_array_equal(out, a + b)
    assert pending.is_ready()
    (again,) = pending.result()  # every caller gets the outputs, as Future.result()
    assert again is out
    with pytest.raises(vc.ValidationError) as refused:  # ... but cannot fill a second set of arrays
        pending.result_into([np.empty_like(out)])
    assert str(refused.value).splitlines()[-1].startswith("Fix: ")
    dst = np.empty(50_000, np.float32)
    got = backend.dispatch_into(prog, [a, b], [dst])
    assert got[0] is dst
    np.testing.assert_array_equal(dst, a + b)
    dst2 = np.full(50_000, np.nan, np.float32)
    backend.dispatch_async(prog, [a, b]).result_into([dst2])
    np.testing.assert_array_equal(dst2, a + b)
    timed = backend.dispatch_timed(prog, [a, b])
    np.testing.assert_array_equal(timed.outputs[0], a + b)
    assert timed.wall_ns >= timed.enqueue_ns > 0 and timed.device_ns > 0 and timed.wait_ns > 0
    t2 = backend.dispatch_async(prog, [a, b], timed=True).timed_result()
    np.testing.assert_array_equal(t2.outputs[0], a + b)


def test_dropped_pending_is_safe(fresh_backend, rng):
    prog = bp.vecadd_f32()
    a = _random(rng, np.float32, 1 << 18)
    for _ in range(20):
        fresh_backend.dispatch_async(prog, [a, a])  # dropped un-awaited: deferred, never waited for
    (out,) = fresh_backend.dispatch(prog, [a, a])
    np.testing.assert_array_equal(out, a + a)
    for _ in range(10000):  # the dropped work finishes; trim() takes its resources back
        fresh_backend.trim()
        if fresh_backend._core.deferred == 0:
            break
    snap = fresh_backend.telemetry.snapshot()
    assert snap["streams_live"] == 0 and snap["device_pool_live_bytes"] == 0 and snap["pinned_pool_live_bytes"] == 0
    assert snap["deferred_recycles"] == snap["deferred_drops"] and snap["leaked_allocations"] == 0, snap


def test_exact_telemetry(fresh_backend, rng):
    prog = bp.vecadd_f32()
    n = 1000
    a, b = _random(rng, np.float32, n), _random(rng, np.float32, n)
    fresh_backend.dispatch(prog, [a, b])  # warm: plan, compile, pools
    fresh_backend.telemetry.reset()
    for _ in range(3):
        fresh_backend.dispatch(prog, [a, b])
    t = fresh_backend.telemetry.snapshot()
    params_words = 4  # word 0 + bindings 0..2
    assert t["dispatches"] == 3
    assert t["h2d_bytes"] == 3 * (2 * n * 4 + params_words * 4)
    assert t["h2d_ops"] == 3  # inputs and params go up in one copy
    assert t["d2h_bytes"] == 3 * n * 4 and t["d2h_ops"] == 3
    # the 4 KB output is zeroed in staging and rides the upload: no device memset
    assert fresh_backend.plan_info(prog, [a, b]).layout.clear == (0, 0)
    assert t["launches"] == 3 and t["memset_ops"] == 0 and t["sync_points"] == 3
    assert t["param_upload_bytes"] == 3 * 16
    assert t["device_pool_hits"] == 3 and t["device_pool_misses"] == 0
    assert t["pinned_pool_hits"] == 3 and t["pinned_pool_misses"] == 0


def test_repeated_dispatch_no_pool_growth(fresh_backend, rng):
    prog = bp.vecadd_f32()
    a, b = _random(rng, np.float32, 4096), _random(rng, np.float32, 4096)
    fresh_backend.dispatch(prog, [a, b])
    before = fresh_backend.telemetry.snapshot()
    for _ in range(10_000):
        (out,) = fresh_backend.dispatch(prog, [a, b])
    after = fresh_backend.telemetry.snapshot()
    np.testing.assert_array_equal(out, a + b)
    for key in ("device_pool_allocated_bytes", "pinned_pool_cached_bytes", "streams_created", "events_created"):
        assert after[key] == before[key], key
    assert after["device_pool_misses"] == before["device_pool_misses"]


_INTEROP = r"""
import json, sys
import numpy as np
import cupy, torch
import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp

rng = np.random.default_rng()
prog = bp.vecadd_f32()
a = rng.standard_normal(70_001).astype(np.float32)
b = rng.standard_normal(70_001).astype(np.float32)
ok = {}
with vc.CudaBackend(0) as one, vc.CudaBackend(0) as two:
    c = cupy.asarray(a) * 2
    t = torch.from_numpy(b).cuda() * 3
    (o1,) = one.dispatch(prog, [a, b])
    (o2,) = two.dispatch_async(prog, [b, a]).result()
    ok["one"] = bool(np.array_equal(o1, a + b))
    ok["two"] = bool(np.array_equal(o2, b + a))
    ok["cupy"] = bool(np.array_equal(cupy.asnumpy(c), a * 2))
    ok["torch"] = bool(np.array_equal(t.cpu().numpy(), b * 3))
# after both backends close, CuPy and torch still work on the shared primary context
ok["cupy_after"] = bool(np.array_equal(cupy.asnumpy(cupy.asarray(a) + 1), a + 1))
ok["torch_after"] = bool(np.array_equal((torch.from_numpy(a).cuda() + 1).cpu().numpy(), a + 1))
with vc.CudaBackend(0) as three:
    (o3,) = three.dispatch(prog, [a, a])
    ok["three"] = bool(np.array_equal(o3, a + a))
print(json.dumps(ok))
"""


def test_two_backends_with_cupy_and_torch(run_python):
    # a plain interpreter: torch's import is not robust under pytest's plugins
    for mod in ("cupy", "torch"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed")
    proc = run_python(["-c", _INTEROP], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results == dict.fromkeys(results, True) and len(results) == 7, results


def test_threads_share_a_backend(backend, rng):
    progs = [bp.vecadd("f32"), bp.vecadd("i32"), bp.vecadd("f64"), bp.vecadd("u16")]
    errors = []

    def worker(k):
        local = np.random.default_rng(k)
        prog = progs[k % len(progs)]
        npd = prog.buffers[0].dtype.numpy
        try:
            for _ in range(200):
                n = int(local.integers(1, 20_000))
                a, b = _random(local, npd, n), _random(local, npd, n)
                (out,) = backend.dispatch(prog, [a, b])
                np.testing.assert_array_equal(out, (a + b).astype(npd))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_selftest_cli(capsys):
    from vyre_cuda.cli import main

    assert main(["selftest"]) == 0
    assert "selftest passed" in capsys.readouterr().out
