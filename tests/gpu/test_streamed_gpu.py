"""The streamed route on a real GPU: chunk boundaries, dtypes, bindings, page-locked and pageable
buffers, device outputs, async dispatches, threads, budgets and a fault in the middle of the stream,
each checked against numpy on fresh random data."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

import vyre_cuda as vc
from benchmarks.harness import hooks
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp
from vyre_cuda.planning.stream import StreamTuning

STREAMED = DispatchConfig(streamed=True)
MIB = 1 << 20
CTYPES = {
    "f32": "float",
    "f64": "double",
    "i32": "int",
    "u8": "unsigned char",
    "i16": "short",
    "i64": "long long",
    "u32": "unsigned int",
    "f16": "__half",
}
NUMPY = {
    "f32": np.float32,
    "f64": np.float64,
    "i32": np.int32,
    "u8": np.uint8,
    "i16": np.int16,
    "i64": np.int64,
    "u32": np.uint32,
    "f16": np.float16,
}


def add_program(dtype: str = "f32", **kw) -> Program:
    t = CTYPES[dtype]
    header = '#include "vyre_cuda.cuh"\n' + ("#include <cuda_fp16.h>\n" if dtype == "f16" else "")
    src = header + (
        f"VYRE_KERNEL vyre_main(const {t}* a, const {t}* b, {t}* out, const vyre_u32* p) {{\n"
        "  const vyre_u64 i = vyre_global_id();\n"
        f"  if (i < vyre_count(p)) out[i] = ({t})(a[i] + b[i]);\n}}\n"
    )
    decls = [BufferDecl.read("a", 0, dtype), BufferDecl.read("b", 1, dtype), BufferDecl.output("out", 2, dtype)]
    return Program(Kernel.cuda(src), decls, name=f"add_{dtype}", elementwise=True, **kw)


def random(rng, n, dtype=np.float32):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(n).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min // 2, info.max // 2, n, dtype=dtype, endpoint=True)


@pytest.fixture
def rng():
    return np.random.default_rng()


@pytest.fixture
def small_chunks():
    """A backend whose streamed chunks hold 64 Ki rows of 4 bytes (256 KiB), on 3 streams."""
    b = vc.CudaBackend(0)
    hooks.set_stream_tuning(b, StreamTuning(chunk_bytes=256 << 10, streams=3, min_waves=0))
    yield b
    b.close()


def test_the_planner_streams_large_elementwise_dispatches_by_itself(backend, rng):
    plain = bp.vecadd_f32()
    program = Program(plain.kernel, plain.buffers, name="vecadd_elementwise", elementwise=True)
    big = [random(rng, 16 * MIB), random(rng, 16 * MIB)]  # 64 MiB per buffer
    info = backend.plan_info(program, big)
    assert info.route.kind == "streamed" and info.stream.chunk_count >= 2, info.route
    before = backend.telemetry.snapshot()
    (out,) = backend.dispatch(program, big)
    np.testing.assert_array_equal(out, big[0] + big[1])
    after = backend.telemetry.snapshot()
    assert after["streamed_dispatches"] - before["streamed_dispatches"] == 1
    assert after["streamed_chunks"] - before["streamed_chunks"] == info.stream.chunk_count
    small = [random(rng, 1 << 20), random(rng, 1 << 20)]  # 4 MiB: one chunk, the serial route
    assert backend.plan_info(program, small).route.kind != "streamed"
    assert backend.plan_info(plain, big).route.kind != "streamed"  # not declared elementwise


@pytest.mark.parametrize("delta", [-1, 0, 1])
@pytest.mark.parametrize("chunks", [1, 2, 3, 7])
def test_chunk_boundaries(small_chunks, rng, chunks, delta):
    c = 64 << 10
    n = chunks * c + delta
    program = add_program()
    a, b = random(rng, n), random(rng, n)
    info = small_chunks.plan_info(program, [a, b], STREAMED)
    assert info.stream.chunk_rows == min(c, n) and info.stream.chunk_count == -(-n // c)
    (out,) = small_chunks.dispatch(program, [a, b], STREAMED)
    np.testing.assert_array_equal(out, a + b)
    into = np.full(n, np.nan, np.float32)
    small_chunks.dispatch_into(program, [a, b], [into], STREAMED)
    np.testing.assert_array_equal(into, a + b)


def test_one_element_chunks(rng):
    with vc.CudaBackend(0) as b:
        hooks.set_stream_tuning(b, StreamTuning(chunk_bytes=4, streams=3, min_waves=0))
        program = add_program()
        a, b_ = random(rng, 29), random(rng, 29)
        assert b.plan_info(program, [a, b_], STREAMED).stream.chunk_count == 29
        (out,) = b.dispatch(program, [a, b_], STREAMED)
        np.testing.assert_array_equal(out, a + b_)


def test_align(small_chunks, rng):
    program = add_program(align=1000)
    n = 300_001
    a, b = random(rng, n), random(rng, n)
    info = small_chunks.plan_info(program, [a, b], STREAMED)
    assert info.stream.chunk_rows % 1000 == 0 and info.stream.chunk_count > 2
    (out,) = small_chunks.dispatch(program, [a, b], STREAMED)
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize("dtype", sorted(CTYPES))
def test_every_dtype(small_chunks, rng, dtype):
    program = add_program(dtype)
    n = 700_001  # several 256 KiB chunks even of 1-byte elements
    a, b = random(rng, n, NUMPY[dtype]), random(rng, n, NUMPY[dtype])
    assert small_chunks.plan_info(program, [a, b], STREAMED).stream.chunk_count >= 2
    (out,) = small_chunks.dispatch(program, [a, b], STREAMED)
    want = (a + b).astype(NUMPY[dtype])
    if dtype == "f16":
        np.testing.assert_allclose(out.astype(np.float32), want.astype(np.float32), rtol=1e-3)
    else:
        np.testing.assert_array_equal(out, want)


INPLACE = Program(
    Kernel.cuda(
        '#include "vyre_cuda.cuh"\n'
        "VYRE_KERNEL vyre_main(int* x, const int* t, const vyre_u32* p) {\n"
        "  const vyre_u64 i = vyre_global_id();\n"
        "  if (i < vyre_count(p)) x[i] += t[0] * t[1] - t[2];\n}\n"
    ),
    [BufferDecl.read_write("x", 0, "i32"), BufferDecl.read("t", 1, "i32", 3)],
    name="inplace",
    elementwise=True,
)


def test_read_write_bindings_and_static_inputs_broadcast(small_chunks, rng):
    x = rng.integers(-1000, 1000, 700_001, dtype=np.int32)
    t = rng.integers(-50, 50, 3, dtype=np.int32)
    info = small_chunks.plan_info(INPLACE, [x, t], STREAMED)
    assert info.stream.chunk_count > 2 and [b.cut for b in info.stream.bindings] == [True, False]
    (out,) = small_chunks.dispatch(INPLACE, [x, t], STREAMED)
    np.testing.assert_array_equal(out, x + (t[0] * t[1] - t[2]))


@pytest.mark.parametrize("pinned", [(1, 0, 0), (0, 1, 1), (1, 1, 1), (1, 1, 0), (0, 0, 1)])
def test_mixed_page_locked_and_pageable(small_chunks, rng, pinned):
    n = 500_000
    program = add_program()
    a, b, out = (vc.pinned_empty(n, np.float32) if p else np.empty(n, np.float32) for p in pinned)
    a[:], b[:], out[:] = random(rng, n), random(rng, n), np.nan
    before = small_chunks.telemetry.snapshot()
    small_chunks.dispatch_into(program, [a, b], [out], STREAMED)
    np.testing.assert_array_equal(out, a + b)
    after = small_chunks.telemetry.snapshot()
    assert after["direct_h2d_bytes"] - before["direct_h2d_bytes"] == 4 * n * (pinned[0] + pinned[1])
    assert after["direct_d2h_bytes"] - before["direct_d2h_bytes"] == 4 * n * pinned[2]


def test_device_outputs(small_chunks, rng, cupy):
    n = 400_000
    program = add_program()
    a, b = random(rng, n), random(rng, n)
    out = cupy.full(n, cupy.nan, cupy.float32)
    small_chunks.dispatch_into(program, [a, b], [out], STREAMED)
    np.testing.assert_array_equal(cupy.asnumpy(out), a + b)


def test_dispatch_async_with_inputs_clobbered_after_return(small_chunks, rng):
    n = 900_000
    program = add_program()
    pending, want = [], []
    for _ in range(4):
        a, b = random(rng, n), random(rng, n)
        pending.append(small_chunks.dispatch_async(program, [a, b], STREAMED))
        want.append(a + b)
        a[:] = np.nan
        b[:] = np.nan
    np.testing.assert_array_equal(pending[0].result()[0], want[0])
    into = np.full(n, np.nan, np.float32)
    pending[1].result_into([into])
    np.testing.assert_array_equal(into, want[1])
    del pending[2]
    np.testing.assert_array_equal(pending[-1].result()[0], want[3])


def test_sixteen_in_flight_allocate_nothing_after_warm_up(rng):
    n = 16 * MIB // 4
    program = add_program()
    with vc.CudaBackend(0) as b:

        def round_of_16():
            inputs = [(random(rng, n), random(rng, n)) for _ in range(16)]
            pending = [b.dispatch_async(program, list(x), STREAMED) for x in inputs]
            for p, (x, y) in zip(pending, inputs):
                np.testing.assert_array_equal(p.result()[0], x + y)

        round_of_16()
        before = b.telemetry.snapshot()
        round_of_16()
        after = b.telemetry.snapshot()
        for key in ("device_alloc_calls", "pinned_alloc_calls", "streams_created", "events_created"):
            if key in after:
                assert after[key] == before[key], (key, before[key], after[key])


def test_eight_threads(small_chunks):
    program = add_program()
    errors = []

    def work(seed):
        local = np.random.default_rng(seed)
        try:
            for _ in range(5):
                a, b = random(local, 333_333), random(local, 333_333)
                (out,) = small_chunks.dispatch(program, [a, b], STREAMED)
                if not np.array_equal(out, a + b):
                    errors.append("wrong result")
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_budgets(rng):
    program = add_program()
    n = 4 * MIB  # 16 MiB per buffer
    a, b = random(rng, n), random(rng, n)
    with vc.CudaBackend(0) as gpu:
        for budget in (1000, 8 * MIB):  # chunks under 4 MiB moved (8 MiB: 12 chunks of 2.7 MB)
            with pytest.raises(vc.ValidationError) as info:
                gpu.dispatch(program, [a, b], DispatchConfig(streamed=True, device_memory_budget=budget))
            assert f"device_memory_budget={budget:,})" in str(info.value)
            assert "Fix: pass device_memory_budget >= 12,584,960, or None" in str(info.value)
        cfg = DispatchConfig(device_memory_budget=16 * MIB)  # under the 48 MiB serial slab: streams
        plan = gpu.plan_info(program, [a, b], cfg)
        assert plan.route.kind == "streamed" and plan.stream.device_bytes <= 16 * MIB
        (out,) = gpu.dispatch(program, [a, b], cfg)
        np.testing.assert_array_equal(out, a + b)
        (out,) = gpu.dispatch(program, [a, b])  # a failed dispatch broke nothing
        np.testing.assert_array_equal(out, a + b)


FAULT_CHILD = r"""
import json, sys
import numpy as np
import vyre_cuda as vc
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda.planning.stream import StreamTuning
from benchmarks.harness import hooks

SRC = '''#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* a, const float* b, float* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i >= vyre_count(p)) return;
  if (a[i] == -12345.0f) *reinterpret_cast<volatile float*>(0x10ull) = 1.0f;
  out[i] = a[i] + b[i];
}
'''
decls = [BufferDecl.read("a", 0, "f32"), BufferDecl.read("b", 1, "f32"), BufferDecl.output("out", 2, "f32")]
prog = Program(Kernel.cuda(SRC), decls, name="faulty", elementwise=True)
rng = np.random.default_rng()
n = 1 << 20
a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
gpu = vc.CudaBackend(0)
hooks.set_stream_tuning(gpu, StreamTuning(chunk_bytes=256 << 10, streams=3, min_waves=0))
res = {}
(out,) = gpu.dispatch(prog, [a, b], DispatchConfig(streamed=True))
res["warm_ok"] = bool(np.array_equal(out, a + b))
a[n // 2 + 7] = -12345.0  # in the middle chunk
try:
    gpu.dispatch(prog, [a, b], DispatchConfig(streamed=True))
    res["error"] = None
except Exception as exc:
    res["error"] = {"type": type(exc).__name__, "status": getattr(exc, "status", None),
                    "last_line": str(exc).splitlines()[-1]}
snap = gpu.telemetry.snapshot()
res["live"] = {k: snap[k] for k in ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")}
res["lost"] = gpu.lost
gpu.close()
print("VYRE_RESULT " + json.dumps(res), flush=True)
"""


@pytest.mark.faults
def test_a_fault_in_the_middle_of_the_stream():
    root = pathlib.Path(vc.__file__).resolve().parents[1]
    checkout = pathlib.Path(__file__).resolve().parents[2]  # benchmarks/harness (not in the wheel), after the package
    path = [str(root), str(checkout), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
    proc = subprocess.run(
        [sys.executable, "-c", FAULT_CHILD], capture_output=True, text=True, timeout=120, env=env, cwd=root.parent
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("VYRE_RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    res = json.loads(lines[-1][len("VYRE_RESULT ") :])
    assert res["warm_ok"]
    err = res["error"]
    assert err is not None and err["type"] == "DeviceLost", res
    assert err["status"] == "CUDA_ERROR_ILLEGAL_ADDRESS" and err["last_line"].startswith("Fix: "), err
    assert res["lost"] is True
    assert all(v == 0 for v in res["live"].values()), res["live"]


def test_dispatch_split_streams_on_each_device(rng):
    program = add_program()
    n = 32 * MIB  # 128 MiB per buffer: one device's part is the whole, streamed
    a, b = random(rng, n), random(rng, n)
    with vc.DeviceGroup([0]) as group:
        assert group.backend(0).plan_info(program, [a, b]).route.kind == "streamed"
        before = group.backend(0).telemetry.snapshot()["streamed_dispatches"]
        (out,) = group.dispatch_split(program, [a, b])
        np.testing.assert_array_equal(out, a + b)
        assert group.backend(0).telemetry.snapshot()["streamed_dispatches"] - before == 1
