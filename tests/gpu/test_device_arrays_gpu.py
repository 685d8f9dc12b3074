"""Device arrays in and out on the GPU: CuPy and torch arrays as inputs and outputs against numpy,
mixed host/device inputs, DeviceArray outputs wrapped by CuPy and torch without copies, the
refusals (strided, wrong dtype, wrong device, read-only output), and lifetimes."""

import gc
import sys

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
from vyre_cuda._devview import device_input

SIZES = [1, 1000, 4097, 300_000, (1 << 20) + 3]  # the mirror and the ring
DEV = vc.DispatchConfig(outputs="device")

TWICE = r"""
#include "vyre_cuda.cuh"
extern "C" __global__ void vyre_main(float* x, const unsigned* params) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < params[0]) x[i] *= 2.0f;
}
"""


class CAIOnly:
    """A foreign device array that speaks only the CUDA Array Interface (as numba's)."""

    def __init__(self, base_cai, owner, readonly=None, stream="keep"):
        cai = dict(base_cai)
        if readonly is not None:
            cai["data"] = (cai["data"][0], readonly)
        if stream != "keep":
            cai["stream"] = stream
        cai["version"] = 3
        self.__cuda_array_interface__ = cai
        self.owner = owner


def _pair(rng, n):
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


@pytest.mark.parametrize("n", SIZES)
def test_cupy_inputs_and_outputs(backend, rng, cupy, n):
    prog = bp.vecadd_f32()
    a, b = _pair(rng, n)
    d_a, d_b = cupy.asarray(a), cupy.asarray(b)
    (out,) = backend.dispatch(prog, [d_a, d_b])
    np.testing.assert_array_equal(out, a + b)
    d_out = cupy.full(n, cupy.nan, cupy.float32)
    backend.dispatch_into(prog, [d_a, d_b], [d_out])
    np.testing.assert_array_equal(d_out.get(), a + b)
    np.testing.assert_array_equal(d_a.get(), a)  # inputs untouched
    (late,) = backend.dispatch_async(prog, [d_b, d_a], DEV).result()
    np.testing.assert_array_equal(late.copy_to_host(), b + a)


@pytest.mark.parametrize("n", SIZES)
def test_torch_inputs_and_outputs(backend, rng, torch, n):
    prog = bp.vecadd_f32()
    a, b = _pair(rng, n)
    t_a, t_b = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    (out,) = backend.dispatch(prog, [t_a, t_b])
    np.testing.assert_array_equal(out, a + b)
    t_out = torch.full((n,), float("nan"), device="cuda")
    backend.dispatch_into(prog, [t_a, t_b], [t_out])
    np.testing.assert_array_equal(t_out.cpu().numpy(), a + b)
    pending = backend.dispatch_async(prog, [t_a, t_b])
    t_out.zero_()
    pending.result_into([t_out])  # a device output named after the enqueue
    np.testing.assert_array_equal(t_out.cpu().numpy(), a + b)


def test_mixed_host_and_device_inputs(backend, rng, cupy, torch):
    prog = bp.vecadd_f32()
    for n in (7, 200_000):
        a, b = _pair(rng, n)
        for first, second in (
            (cupy.asarray(a), b),
            (a, torch.from_numpy(b).cuda()),
            (cupy.asarray(a), torch.from_numpy(b)),
        ):
            (out,) = backend.dispatch(prog, [first, second])
            np.testing.assert_array_equal(out, a + b)


def test_device_outputs_wrap_without_copies(backend, rng, cupy, torch):
    prog = bp.vecadd_f32()
    a, b = _pair(rng, 5000)
    (x,) = backend.dispatch(prog, [a, b], DEV)
    assert isinstance(x, vc.DeviceArray) and x.shape == (5000,) and x.dtype == np.float32
    ptr = x.__cuda_array_interface__["data"][0]
    c = cupy.asarray(x)
    assert c.data.ptr == ptr
    t = torch.from_dlpack(x)
    assert t.data_ptr() == ptr and t.device.type == "cuda"
    np.testing.assert_array_equal(c.get(), a + b)
    np.testing.assert_array_equal(t.cpu().numpy(), a + b)
    del x
    gc.collect()
    np.testing.assert_array_equal(t.cpu().numpy(), a + b)  # torch's DLPack reference keeps it alive
    # a DeviceArray feeds the next dispatch in place
    (y,) = backend.dispatch(prog, [cupy.asarray(a), a], DEV)
    (z,) = backend.dispatch(prog, [y, t])
    np.testing.assert_array_equal(z, (a + a) + (a + b))


def test_dropped_wrappers_release_the_device_output(backend, rng, cupy, torch):
    # CuPy (through the CUDA Array Interface) and torch (through DLPack) each hold a reference to
    # the DeviceArray while they wrap it; once they are gone, so is the reference (its memory goes
    # back to the array pool with the DeviceArray, not kept until the process ends)
    prog = bp.vecadd_f32()
    a, b = _pair(rng, 5000)
    (x,) = backend.dispatch(prog, [a, b], DEV)
    alone = sys.getrefcount(x)
    c, t, t2 = cupy.asarray(x), torch.from_dlpack(x), torch.utils.dlpack.from_dlpack(x.__dlpack__())
    assert sys.getrefcount(x) > alone
    np.testing.assert_array_equal(c.get() + t.cpu().numpy() - t2.cpu().numpy(), a + b)
    del c, t, t2
    gc.collect()
    assert sys.getrefcount(x) == alone


SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
"""


def test_dropped_device_output_is_not_reused_while_a_consumer_still_reads_it(backend, rng, cupy):
    # a consumer's copy, queued on a CuPy stream of its own behind a ~50 ms kernel, reads a
    # DeviceArray that is then dropped; new outputs follow until one reuses its memory. The copy
    # must still read the first result: the pool reuses memory only after a context synchronize
    from vyre_cuda import _devarray

    prog = bp.vecadd_f32()
    n = 4096
    a, b = _pair(rng, n)
    (x,) = backend.dispatch(prog, [a, b], DEV)
    ptr = x.ptr
    spin = cupy.RawKernel(SPIN, "spin")
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        dst = cupy.empty(n, cupy.float32)
        spin((1,), (1,), (np.int64(100_000_000),))
        dst[...] = cupy.asarray(x)  # (CuPy's view of x is gone after this statement)
    del x
    gc.collect()
    flushes = _devarray.array_pool_stats(backend.device)["flushes"]
    reuser = None
    for _ in range(200):
        c, d = _pair(rng, n)
        (y,) = backend.dispatch(prog, [c, d], DEV)
        if y.ptr == ptr:
            reuser, want = y, c + d
            break
        del y
    stream.synchronize()
    assert reuser is not None, "the dropped array's memory was never reused"
    assert _devarray.array_pool_stats(backend.device)["flushes"] > flushes
    np.testing.assert_array_equal(dst.get(), a + b)
    np.testing.assert_array_equal(reuser.copy_to_host(), want)


def test_read_write_device_input_is_not_modified(backend, rng, cupy):
    prog = vc.Program(vc.Kernel.cuda(TWICE), [vc.BufferDecl.read_write("x", 0, "f32")])
    a = rng.standard_normal(70_000).astype(np.float32)
    d = cupy.asarray(a)
    (out,) = backend.dispatch(prog, [d])
    np.testing.assert_array_equal(out, a * 2)
    np.testing.assert_array_equal(d.get(), a)


def test_cai_only_inputs_with_and_without_stream(backend, rng, cupy):
    prog = bp.vecadd_f32()
    a, b = _pair(rng, 100_000)
    d_a, d_b = cupy.asarray(a), cupy.asarray(b)
    cupy.cuda.get_current_stream().synchronize()
    plain = CAIOnly(d_a.__cuda_array_interface__, d_a, stream=None)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        d_c = d_b * 3  # queued on s; the CAI stream entry tells the dispatch to wait for it
    streamed = CAIOnly(d_c.__cuda_array_interface__, d_c, stream=s.ptr)
    (out,) = backend.dispatch(prog, [plain, streamed])
    np.testing.assert_array_equal(out, a + b * 3)


def test_dropped_device_input_stays_alive_until_done(backend, rng, cupy):
    prog = bp.vecadd_f32()
    a, b = _pair(rng, 1 << 20)
    d_a = cupy.asarray(a)
    pending = backend.dispatch_async(prog, [d_a, cupy.asarray(b)])
    del d_a
    gc.collect()
    cupy.full(1 << 20, 7, cupy.float32)  # would reuse the freed memory if it were released
    (out,) = pending.result()
    np.testing.assert_array_equal(out, a + b)


def test_device_refusals(backend, rng, cupy, torch):
    prog = bp.vecadd_f32()
    a, b = _pair(rng, 1000)
    d_a = cupy.asarray(a)
    with pytest.raises(vc.ValidationError, match=r"strided[\s\S]*Fix:"):
        backend.dispatch(prog, [cupy.asarray(np.concatenate([a, a]))[::2], b])
    with pytest.raises(vc.ValidationError, match=r"strided[\s\S]*Fix:"):
        backend.dispatch(prog, [torch.from_numpy(np.concatenate([a, a])).cuda()[::2], b])
    with pytest.raises(vc.ValidationError, match=r"int32 but the buffer is declared f32[\s\S]*Fix:"):
        backend.dispatch(prog, [d_a.view(cupy.int32), b])
    with pytest.raises(vc.ValidationError, match=r"float64[\s\S]*Fix:"):
        backend.dispatch_into(prog, [a, b], [cupy.zeros(1000, cupy.float64)])
    with pytest.raises(vc.ValidationError, match=r"read-only[\s\S]*Fix:"):
        backend.dispatch_into(
            prog, [a, b], [CAIOnly(cupy.zeros(1000, cupy.float32).__cuda_array_interface__, None, True)]
        )
    with pytest.raises(vc.ValidationError, match=r"holds 4000 bytes; the dispatch reads back 400[\s\S]*Fix:"):
        backend.dispatch_into(prog, [a[:100], b[:100]], [cupy.zeros(1000, cupy.float32)])
    # the device ordinal comes from the driver (cuPointerGetAttributes): device-0 memory for a
    # device-1 backend is refused (asked directly: the machine may have one GPU)
    cai = CAIOnly(d_a.__cuda_array_interface__, d_a, stream=None)
    with pytest.raises(vc.ValidationError, match=r"lives on CUDA device 0, but this backend runs on device 1"):
        device_input(prog, 0, cai, 1, None)
    with pytest.raises(vc.ValidationError, match=r"lives on CUDA device 0, but this backend runs on device 1"):
        device_input(prog, 0, torch.from_numpy(a).cuda(), 1, None)
    # a refused dispatch leaves the backend usable and nothing held
    (out,) = backend.dispatch(prog, [d_a, b])
    np.testing.assert_array_equal(out, a + b)
    snap = backend.telemetry.snapshot()
    assert snap["streams_live"] == 0 and snap["device_pool_live_bytes"] == 0


@pytest.mark.parametrize("n", [1000, 1 << 22])
def test_device_outputs_are_written_in_place_unless_they_alias_an_input(backend, rng, cupy, n):
    prog = bp.vecadd_f32()
    a = cupy.asarray(rng.standard_normal(n).astype(np.float32))
    b = cupy.asarray(rng.standard_normal(n).astype(np.float32))
    out = cupy.full(n, cupy.nan, cupy.float32)
    before = backend.telemetry.snapshot()["in_place_outputs"]
    backend.dispatch_into(prog, [a, b], [out])
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(out), cupy.asnumpy(a + b))
    assert backend.telemetry.snapshot()["in_place_outputs"] == before + 1
    want = cupy.asnumpy(a + b) + cupy.asnumpy(b)
    backend.dispatch_into(prog, [out, b], [out])  # aliases input 0: read whole, then written
    cupy.cuda.Device().synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(out), want)
    assert backend.telemetry.snapshot()["in_place_outputs"] == before + 1
    (dev,) = backend.dispatch(prog, [a, b], vc.DispatchConfig(outputs="device"))  # a new array: in place
    np.testing.assert_array_equal(dev.copy_to_host(), cupy.asnumpy(a + b))
    assert backend.telemetry.snapshot()["in_place_outputs"] == before + 2
