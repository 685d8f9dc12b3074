"""Device arrays and caller streams: the protocols, stream normalisation and the device-input
layout without a driver, then dispatches through the real dispatch core on the fake CUDA driver.

The refusals of the first part happen before any driver call (the stride check, the DLPack dtype
and device checks, the stream type). In the second, the fake's device memory is host memory it
tracks, so a :class:`vyre_cuda.DeviceArray` (allocated with the fake's cuMemAlloc) and objects
describing it through ``__cuda_array_interface__`` or ``__dlpack__`` are device arrays the fake
accepts; a pointer it does not track (a numpy array's data) is refused by its copies as it would
be by the real driver. The GPU suite (tests/gpu/test_device_arrays_gpu.py,
tests/gpu/test_streams_gpu.py) repeats this with CuPy and torch on a device.
"""

from __future__ import annotations

import json

import fakecuda
import numpy as np
import pytest
from planning_fakes import H200

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
from vyre_cuda._devview import device_input, protocol_of
from vyre_cuda._io_checks import dtype_error
from vyre_cuda.config import stream_handle
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.launch import plan_launch
from vyre_cuda.planning.layout import plan_layout


# -- without a driver -----------------------------------------------------------------------------
class _CudaDL:
    """A numpy array presented as a DLPack tensor on CUDA device ``device`` (only the protocol is
    read before the dispatch; these tests never run one)."""

    def __init__(self, array, device=(2, 0)):
        self.array, self.device, self.streams = array, device, []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None):
        self.streams.append(stream)
        return self.array.__dlpack__()


class _CpuDL:
    """A CPU tensor without the buffer protocol (as torch's CPU tensors)."""

    def __init__(self, array):
        self.array = array

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()

    def __dlpack__(self, stream=None, max_version=None, **kw):
        return self.array.__dlpack__(**kw)


class _CAI:
    def __init__(self, shape, typestr="<f4", strides=None, stream=None, mask=None):
        self.__cuda_array_interface__ = dict(
            shape=shape, typestr=typestr, data=(4096, False), version=3, strides=strides, stream=stream, mask=mask
        )


class _Stream:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def test_stream_handles_from_each_protocol():
    class CudaCore:
        def __cuda_stream__(self):
            return (0, 0xABC)

    assert stream_handle(7) == 7
    assert stream_handle(np.uint64(9)) == 9
    assert stream_handle(CudaCore()) == 0xABC
    assert stream_handle(_Stream(ptr=0x123)) == 0x123  # CuPy
    assert stream_handle(_Stream(cuda_stream=0x456)) == 0x456  # torch
    cfg = vc.DispatchConfig(stream=CudaCore())
    assert cfg.stream == 0xABC and cfg == vc.DispatchConfig(stream=0xABC)
    assert hash(cfg) == hash(vc.DispatchConfig(stream=0xABC))
    assert cfg != vc.DispatchConfig(stream=0xABD) and cfg != vc.DispatchConfig()
    assert vc.DispatchConfig().stream is None and vc.DispatchConfig().outputs == "host"


@pytest.mark.parametrize(
    "bad, words",
    [
        ("stream", ["str", "Fix:"]),
        (1.5, ["float", "Fix:"]),
        (-1, ["-1", "Fix:"]),
        (True, ["bool", "Fix:"]),
        (_Stream(ptr="x"), ["_Stream", "Fix:"]),
    ],
)
def test_bad_streams_are_refused(bad, words):
    with pytest.raises(vc.ValidationError) as info:
        vc.DispatchConfig(stream=bad)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_cuda_stream_protocol_giving_garbage_is_refused():
    class Bad:
        def __cuda_stream__(self):
            return "nope"

    with pytest.raises(vc.ValidationError, match="version, handle"):
        vc.DispatchConfig(stream=Bad())


def test_outputs_option_is_checked():
    assert vc.DispatchConfig(outputs="device").outputs == "device"
    with pytest.raises(vc.ValidationError, match="'gpu'"):
        vc.DispatchConfig(outputs="gpu")


@pytest.mark.parametrize(
    "own, passed, wait",
    [
        (None, 1, 1),  # pooled stream: the producer orders before legacy, and we wait on that
        (0, 1, None),  # the legacy stream itself (spelled 1 in DLPack)
        (0x1234, 0x1234, None),  # the caller's stream: the producer orders before it
    ],
)
def test_dlpack_stream_argument(own, passed, wait):
    obj = _CudaDL(np.zeros(4, np.float32))
    view = device_input(bp.vecadd_f32(), 0, obj, 0, own)
    assert obj.streams == [passed] and view.wait == wait


def test_device_protocol_detection():
    assert protocol_of(_CAI((4,))) == "cai" and protocol_of(_CudaDL(np.zeros(2))) == "dlpack"
    assert protocol_of(b"bytes") == "none"


def test_cpu_dlpack_tensor_goes_to_the_host_path(rng):
    prog = bp.vecadd_f32()
    a = rng.standard_normal(10).astype(np.float32)
    view = device_input(prog, 0, _CpuDL(a), 0, None)
    assert isinstance(view, np.ndarray) and view.ctypes.data == a.ctypes.data  # no copy


def test_dlpack_device_input_view(rng):
    prog = bp.vecadd_f32()
    a = rng.standard_normal(33).astype(np.float32)
    obj = _CudaDL(a)
    view = device_input(prog, 1, obj, 0, None)
    assert view.ptr == a.ctypes.data and view.nbytes == a.nbytes and view.wait == 1
    assert obj.streams == [1]
    assert view.keep[0] is obj  # the array and its capsule stay referenced
    on_stream = device_input(prog, 1, _CudaDL(a), 0, 0x77)
    assert on_stream.wait is None


def test_dlpack_refusals(rng):
    prog = bp.vecadd_f32()
    a = rng.standard_normal(8).astype(np.float32)
    with pytest.raises(vc.ValidationError, match=r"device 1, but this backend runs on device 0[\s\S]*Fix:"):
        device_input(prog, 0, _CudaDL(a, (2, 1)), 0, None)
    with pytest.raises(vc.ValidationError, match=r"device type 10[\s\S]*Fix:"):
        device_input(prog, 0, _CudaDL(a, (10, 0)), 0, None)
    with pytest.raises(vc.ValidationError, match=r"int32 but the buffer is declared f32[\s\S]*Fix:"):
        device_input(prog, 0, _CudaDL(a.view(np.int32)), 0, None)
    with pytest.raises(vc.ValidationError, match=r"strided[\s\S]*Fix:"):
        device_input(prog, 0, _CudaDL(a[::2]), 0, None)
    # a uint8 view is accepted as deliberate raw bytes, as on the host path
    assert device_input(prog, 0, _CudaDL(a.view(np.uint8)), 0, None).nbytes == a.nbytes


def test_cai_refusals_before_any_driver_call():
    prog = bp.vecadd_f32()
    with pytest.raises(vc.ValidationError, match=r"strided device array \(shape \(4, 4\)[\s\S]*Fix:"):
        device_input(prog, 0, _CAI((4, 4), strides=(32, 4)), 0, None)
    with pytest.raises(vc.ValidationError, match=r"masked[\s\S]*Fix:"):
        device_input(prog, 0, _CAI((4,), mask=object()), 0, None)
    bad = _CAI((4,))
    del bad.__cuda_array_interface__["typestr"]
    with pytest.raises(vc.ValidationError, match=r"malformed[\s\S]*Fix:"):
        device_input(prog, 0, bad, 0, None)


@pytest.mark.parametrize("typestr", [">f4", ">i4", ">u2", ">f8"])
def test_big_endian_cai_is_refused_like_a_big_endian_host_array(typestr, rng):
    prog = bp.vecadd_f32()
    n = int(rng.integers(1, 1000))
    host = rng.standard_normal(n).astype(typestr)
    # what the core raises for the same array on the host path
    host_err = dtype_error(prog, 1, memoryview(host).format, host.itemsize, host)
    with pytest.raises(vc.ValidationError) as info:
        device_input(prog, 1, _CAI((n,), typestr=typestr), 0, None)
    err = info.value
    assert type(err) is type(host_err) and err.fix == host_err.fix
    assert "input 1 ('b')" in err.message and repr(typestr) in err.message and "big-endian" in err.message
    assert str(err).splitlines()[-1] == "Fix: convert it with x.astype(x.dtype.newbyteorder('=')) before dispatch"


def test_big_endian_strided_view_is_refused(rng):
    n = int(rng.integers(1, 1000))
    with pytest.raises(vc.ValidationError, match=r"input 0 \('a'\) is big-endian \(dtype '>f4'\)[\s\S]*\nFix: "):
        device_input(bp.vecadd_f32(), 0, _StridedView(0x1000, (n,), ">f4"), 0, None)


@pytest.mark.parametrize("typestr", ["<f4", "|u1", "=f4"])
def test_little_endian_and_byte_cai_are_accepted(typestr):
    # an empty array: accepted without asking the driver where its pointer lives
    view = device_input(bp.vecadd_f32(), 0, _CAI((0,), typestr=typestr), 0, None)
    assert view.nbytes == 0 and view.itemsize == np.dtype(typestr).itemsize


def test_layout_of_device_inputs():
    prog = bp.vecadd_f32()
    bplan = plan_bindings(prog, (400, 400))
    launch = plan_launch(prog, bplan, vc.DispatchConfig(), H200)
    host = plan_layout(bplan, launch)
    dev = plan_layout(bplan, launch, device_inputs=frozenset({1}))
    assert host.device_args == ()
    assert dev.device_args == ((1, 1, -1, 400),)  # read-only: used in place, no slab region
    assert [i for i, *_ in dev.inputs] == [0] and dev.h2d_bytes == host.h2d_bytes - 400
    assert dev.slab_bytes < host.slab_bytes


def test_layout_of_a_read_write_device_input():
    prog = vc.Program(
        vc.Kernel.cuda('extern "C" __global__ void vyre_main(float* x, const unsigned* p) {}'),
        [vc.BufferDecl.read_write("x", 0, "f32")],
    )
    bplan = plan_bindings(prog, (1000,))
    launch = plan_launch(prog, bplan, vc.DispatchConfig(), H200)
    lay = plan_layout(bplan, launch, device_inputs=frozenset({0}))
    ((arg, index, offset, nbytes),) = lay.device_args
    assert (arg, index, nbytes) == (0, 0, 1000) and offset >= lay.upload_end  # a private copy, not uploaded
    assert lay.arg_offsets[0] == offset and lay.outputs[0] == (offset, 1000)


class _StridedView:
    """The attributes of cuda.core's StridedMemoryView (strides in elements)."""

    def __init__(self, ptr, shape, dtype, strides=None, device_id=0, readonly=False):
        self.ptr, self.shape, self.dtype, self.strides = ptr, shape, np.dtype(dtype), strides
        self.device_id, self.is_device_accessible, self.readonly = device_id, device_id >= 0, readonly


def test_cuda_core_strided_memory_view():
    prog = bp.vecadd_f32()
    view = device_input(prog, 0, _StridedView(0x1000, (64,), np.float32), 0, None)
    assert (view.ptr, view.nbytes, view.wait) == (0x1000, 256, None)
    with pytest.raises(vc.ValidationError, match=r"strided[\s\S]*Fix:"):
        device_input(prog, 0, _StridedView(0x1000, (8, 8), np.float32, strides=(16, 1)), 0, None)
    with pytest.raises(vc.ValidationError, match=r"device 2, but this backend runs on device 0"):
        device_input(prog, 0, _StridedView(0x1000, (64,), np.float32, device_id=2), 0, None)
    with pytest.raises(vc.ValidationError, match=r"float64 but the buffer is declared f32"):
        device_input(prog, 0, _StridedView(0x1000, (64,), np.float64), 0, None)
    assert device_input(prog, 0, _StridedView(0x1000, (64,), np.float32, device_id=-1), 0, None) is None


def test_dlpack_export_failure_is_typed():
    class Grad:  # as torch refuses a tensor that requires grad
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, stream=None):
            raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")

    with pytest.raises(vc.ValidationError, match=r"require gradient[\s\S]*Fix: .*detach"):
        device_input(bp.vecadd_f32(), 0, Grad(), 0, None)


# -- dispatches on the fake driver ----------------------------------------------------------------
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
    seen = []  # the output pointer each launch got
    def recording(launch, run=vecadd_emulation(np.float32)):
        seen.append(launch.arg(2))
        run(launch)
    fake.emulate(g, prog, [a, b], recording)
    dtod, in_place = fake.stats()["dtod_copies"], g.telemetry.snapshot()["in_place_outputs"]
    g.dispatch_into(prog, [b, da], [dst])  # a device output written in place: no copy
    check(f"n={n} dispatch_into device", dst.numpy(), b + (a + b))
    if seen[-1] != dst.__cuda_array_interface__["data"][0] or fake.stats()["dtod_copies"] != dtod:
        res["errors"].append(f"n={n}: the device output was not written in place")
    if g.telemetry.snapshot()["in_place_outputs"] != in_place + 1:
        res["errors"].append(f"n={n}: in_place_outputs did not count the output written in place")
    g.dispatch_into(prog, [a, b], [CAI(dst)])
    check(f"n={n} dispatch_into CAI", dst.numpy(), a + b)
    dtod = fake.stats()["dtod_copies"]
    g.dispatch_into(prog, [dst, b], [dst])  # the output aliases an input: read first, then written
    check(f"n={n} aliased output", dst.numpy(), (a + b) + b)
    if seen[-1] == dst.__cuda_array_interface__["data"][0] or fake.stats()["dtod_copies"] != dtod + 1:
        res["errors"].append(f"n={n}: an output aliasing an input was written in place")
    fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
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
# the outputs' producer streams too, each stream once per dispatch: an input and an output on one
# busy stream cost one wait, an output on another busy stream one more
# (the k-th next stream query answers NOT_READY: k=1 the first producer stream's, k=2 a second
# stream's, or a second query of the first)
target = g.dispatch(prog, [a, a], DEV)[0]
other = ctypes.c_void_p()
assert fake.lib.cuStreamCreate(ctypes.byref(other), 1) == 0
res["busy_output_waits"] = []
for out_stream, k in ((2, 1), (2, 2), (other.value, 2)):
    fake.fail("cuStreamQuery", "CUDA_ERROR_NOT_READY", countdown=k)
    waits = fake.stats()["stream_waits"]
    g.dispatch_into(prog, [CAI(x, stream=2), a], [CAI(target, stream=out_stream)])
    res["busy_output_waits"].append(fake.stats()["stream_waits"] - waits)
    fake.clear_failures()
    check(f"busy producer of an output ({k})", target.copy_to_host(), x.numpy() + a)
assert fake.lib.cuStreamDestroy(other) == 0
del target
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
res["array_pool_live"] = vc._devarray.array_pool_stats(0)["live_bytes"]
g.trim()  # (also frees the memory dropped DeviceArrays left to the array pool)
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
    assert res["checked"] == 3 * 12 + 4 + 4 + 2 + 3  # (+3: the busy producers of an output)
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
    assert res["array_pool_live"] == 0  # every DeviceArray gave its memory back
    assert res["device_allocs_after"] == 0  # and trim freed it
    assert (res["idle_waits"], res["busy_waits"]) == (0, 1)  # only a busy producer costs a wait
    # an input and an output on one busy stream: one query, one wait; an output on a stream of
    # its own: that stream is queried (and waited on) too
    assert res["busy_output_waits"] == [1, 0, 1]
