"""Device arrays and caller streams through the real dispatch core on the fake CUDA driver.

The fake's device memory is host memory it tracks, so a :class:`vyre_cuda.DeviceArray` (allocated
with the fake's cuMemAlloc) and objects describing it through ``__cuda_array_interface__`` or
``__dlpack__`` are device arrays the fake accepts; a pointer it does not track (a numpy array's
data) is refused by its copies as it would be by the real driver. The GPU suite
(tests/gpu/test_device_arrays_gpu.py, tests/gpu/test_streams_gpu.py) repeats this with CuPy and
torch on a device.
"""

from __future__ import annotations

import json

import fakecuda

CHILD = r"""
import json, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation, array_at
from vyre_cuda import builtin_programs as bp

fake = FakeDriver()
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
res = {"checked": 0, "errors": [], "refusals": {}}
g = vc.CudaBackend(0)
DEV = vc.DispatchConfig(outputs="device")


def check(what, got, want):
    res["checked"] += 1
    if not np.array_equal(np.asarray(got), want):
        res["errors"].append(f"{what}: wrong result")


class CAI:
    # a foreign device array: only the CUDA Array Interface (numba-like)
    def __init__(self, base, typestr="<f4", strides=None, readonly=False, stream=None, shape=None):
        self.base = base
        self.__cuda_array_interface__ = {
            "shape": shape or (base.size,), "typestr": typestr, "data": (base.ptr, readonly),
            "version": 3, "strides": strides, "stream": stream,
        }


class DL:
    # a foreign device array: only DLPack (cuda.core-like); records the stream it was asked for
    def __init__(self, base, device=None):
        self.base, self.device, self.streams = base, device, []

    def __dlpack_device__(self):
        return self.device or self.base.__dlpack_device__()

    def __dlpack__(self, stream=None, max_version=None):
        self.streams.append(stream)
        return self.base.__dlpack__(stream=stream, max_version=max_version)


def refused(name, fn):
    try:
        fn()
    except vc.ValidationError as exc:
        res["refusals"][name] = str(exc)
        return
    except Exception as exc:
        res["refusals"][name] = f"WRONG {type(exc).__name__}: {exc}"
        return
    res["refusals"][name] = "NOT REFUSED"


for n in (5, 1000, 200_000):  # the mirror and the ring
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
    (da,) = g.dispatch(prog, [a, b], DEV)  # outputs on the device
    res["checked"] += type(da) is vc.DeviceArray and da.shape == (n,) and da.dtype == np.float32
    check(f"n={n} device output", da.copy_to_host(), a + b)
    h2d = g.telemetry.snapshot()["h2d_bytes"]
    (out,) = g.dispatch(prog, [da, b])  # a DeviceArray input mixed with a host input
    check(f"n={n} mixed", out, (a + b) + b)
    if g.telemetry.snapshot()["h2d_bytes"] - h2d >= 2 * 4 * n:
        res["errors"].append(f"n={n}: the device input was uploaded")
    info = g.plan_info(prog, [da, b])
    if info.layout.device_args != ((0, 0, -1, 4 * n),):
        res["errors"].append(f"plan_info of a device input: {info.layout.device_args}")
    (out,) = g.dispatch(prog, [CAI(da), DL(da)])  # CAI and DLPack inputs
    check(f"n={n} CAI + DLPack", out, (a + b) * 2)
    dst = g.dispatch(prog, [a, a], DEV)[0]
    g.dispatch_into(prog, [b, da], [dst])  # a device output written in place
    check(f"n={n} dispatch_into device", dst.numpy(), b + (a + b))
    g.dispatch_into(prog, [a, b], [CAI(dst)])
    check(f"n={n} dispatch_into CAI", dst.numpy(), a + b)
    g.dispatch_into(prog, [dst, b], [dst])  # the output aliases an input: read first, then written
    check(f"n={n} aliased output", dst.numpy(), (a + b) + b)
    before = sys.getrefcount(da)
    pending = g.dispatch_async(prog, [da, a])
    held = sys.getrefcount(da) > before  # the pending dispatch keeps the device input alive
    res["checked"] += held
    if not held:
        res["errors"].append("the pending dispatch does not hold its device input")
    pending.result_into([dst])  # a device output named after the enqueue
    check(f"n={n} async result_into device", dst.numpy(), (a + b) + a)
    (late,) = g.dispatch_async(prog, [a, b], DEV).result()
    check(f"n={n} async device output", late.numpy(), a + b)
    # a caller's stream (the legacy default stream, handle 1) and a CAI stream to wait on
    on_stream = vc.DispatchConfig(stream=1, outputs="device")
    (s1,) = g.dispatch(prog, [CAI(da, stream=2), b], on_stream)
    check(f"n={n} caller stream", s1.numpy(), (a + b) + b)
    dl = DL(da)
    g.dispatch(prog, [dl, b])
    res["checked"] += dl.streams == [1]  # pooled stream: the producer orders before the legacy stream
    if dl.streams != [1]:
        res["errors"].append(f"DLPack stream argument {dl.streams}")

# a stream of the caller's own (made through the driver, as CuPy or torch would)
import ctypes
handle = ctypes.c_void_p()
assert fake.lib.cuStreamCreate(ctypes.byref(handle), 1) == 0
created = g.telemetry.snapshot()["streams_created"]
for a, cfg in (
    (rng.standard_normal(5000).astype(np.float32), vc.DispatchConfig(stream=handle.value)),
    (rng.standard_normal(200_000).astype(np.float32), vc.DispatchConfig(stream=handle.value, outputs="device")),
):
    (o,) = g.dispatch(prog, [a, a], cfg)
    check(f"own stream {cfg.outputs}", np.asarray(o) if cfg.outputs == "host" else o.numpy(), a + a)
    (o,) = g.dispatch_async(prog, [a, a], cfg).result()
    check(f"own stream async {cfg.outputs}", np.asarray(o) if cfg.outputs == "host" else o.numpy(), a + a)
if g.telemetry.snapshot()["streams_created"] != created:
    res["errors"].append("a pooled stream was made for a dispatch on the caller's stream")
del o
assert fake.lib.cuStreamDestroy(handle) == 0

# a read-write device input is copied: the caller's array is not modified
src = r'''
#include "vyre_cuda.cuh"
extern "C" __global__ void vyre_main(float* x, const unsigned* params) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < params[0]) x[i] *= 2.0f;
}
'''
twice = vc.Program(vc.Kernel.cuda(src), [vc.BufferDecl.read_write("x", 0, "f32")])
a = rng.standard_normal(300).astype(np.float32)
def double(launch):
    n = int(launch.words(launch.arg(1), 1)[0])
    x = array_at(launch.arg(0), np.float32, n)
    x *= 2
fake.emulate(g, twice, [a], double)
(dx,) = g.dispatch(twice, [a], DEV)
check("read-write host", dx.numpy(), a * 2)
(ddx,) = g.dispatch(twice, [dx])
check("read-write device result", ddx, a * 4)
check("read-write device input unchanged", dx.numpy(), a * 2)
res["dtod"] = fake.stats()["dtod_copies"]

x = g.dispatch(prog, [a, a], DEV)[0]
refused("strided", lambda: g.dispatch(prog, [CAI(x, strides=(8,), shape=(150,)), a[:150]]))
refused("dtype", lambda: g.dispatch(prog, [CAI(x, typestr="<i4"), a]))
# big-endian device memory would be read (and written) as little-endian: a wrong answer
refused("big_endian_input", lambda: g.dispatch(prog, [a, CAI(x, typestr=">f4")]))
refused("big_endian_output", lambda: g.dispatch_into(prog, [a, a], [CAI(x, typestr=">f4")]))
refused("wrong_device", lambda: g.dispatch(prog, [DL(x, device=(2, 3)), a]))
refused("rocm", lambda: g.dispatch(prog, [DL(x, device=(10, 0)), a]))
host = np.zeros(300, np.float32)
class Fake:
    __cuda_array_interface__ = {"shape": (300,), "typestr": "<f4", "data": (host.ctypes.data, False), "version": 3}
refused("not_device_memory", lambda: g.dispatch(prog, [Fake(), a]))
refused("readonly_output", lambda: g.dispatch_into(prog, [a, a], [CAI(x, readonly=True)]))
refused("output_size", lambda: g.dispatch_into(prog, [a[:10], a[:10]], [x]))
refused("cai_stream_zero", lambda: g.dispatch(prog, [CAI(x, stream=0), a]))
refused("stream_object", lambda: vc.DispatchConfig(stream="s"))
# the producer's stream: idle (the fake's streams always are), so no cross-stream wait; busy
# (cuStreamQuery answers NOT_READY), so the dispatch stream waits on an event recorded on it
waits = fake.stats()["stream_waits"]
(out,) = g.dispatch(prog, [CAI(x, stream=2), a])
check("idle producer", out, x.numpy() + a)
res["idle_waits"] = fake.stats()["stream_waits"] - waits
fake.fail("cuStreamQuery", "CUDA_ERROR_NOT_READY")
(out,) = g.dispatch(prog, [CAI(x, stream=2), a])
check("busy producer", out, x.numpy() + a)
res["busy_waits"] = fake.stats()["stream_waits"] - waits - res["idle_waits"]
# a driver failure while ordering after the producer's stream: typed error, nothing held, next works
fake.fail("cuStreamQuery", "CUDA_ERROR_NOT_READY")
fake.fail("cuStreamWaitEvent", "CUDA_ERROR_INVALID_VALUE")
try:
    g.dispatch(prog, [DL(x), a])
    res["errors"].append("an injected cuStreamWaitEvent failure was not raised")
except vc.DispatchFailed as exc:
    res["refusals"]["wait_failure"] = str(exc)
fake.clear_failures()
(out,) = g.dispatch(prog, [DL(x), a])
check("after a failed wait", out, x.numpy() + a)
snap = g.telemetry.snapshot()
res["live"] = [snap[k] for k in ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")]
res["violations"] = fake.stats()["violations"]
res["hook_errors"] = fake.hook_errors
del x, dx, ddx, da, dst, late, s1, dl, pending
g.close()
res["device_allocs_after"] = fake.stats()["device_allocs"]
print(json.dumps(res))
"""


def test_device_arrays_and_streams_on_the_fake_driver(fake_libcuda, rng):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [] and res["hook_errors"] == [], res
    assert res["checked"] == 3 * 12 + 4 + 4 + 2
    assert res["dtod"] >= 1  # the read-write device input went device-to-device
    assert res["live"] == [0, 0, 0, 0]
    refusals = res["refusals"]
    for name, words in {
        "strided": ["strided", "strides (8,)", "Fix:"],
        "dtype": ["int32", "declared f32", "Fix:"],
        "big_endian_input": ["input 1 ('b') is big-endian (typestr '>f4')", "Fix: convert it"],
        "big_endian_output": ["output 0 ('out') is big-endian (typestr '>f4')", "Fix: pass a little-endian"],
        "wrong_device": ["device 3", "device 0", "Fix:"],
        "rocm": ["device type 10", "Fix:"],
        "not_device_memory": ["not memory the CUDA driver knows", "Fix:"],
        "readonly_output": ["read-only", "Fix:"],
        "output_size": ["1200 bytes", "40", "Fix:"],
        "cai_stream_zero": ["stream 0", "Fix:"],
        "stream_object": ["stream must be a CUDA stream", "Fix:"],
        "wait_failure": ["cuStreamWaitEvent"],
    }.items():
        assert all(w in refusals[name] for w in words), (name, refusals[name])
    assert res["violations"] == 0
    assert res["device_allocs_after"] == 0  # every DeviceArray freed its memory
    assert (res["idle_waits"], res["busy_waits"]) == (0, 1)  # only a busy producer costs a wait
