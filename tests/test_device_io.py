"""Device-array protocols, stream normalisation and the device-input layout, without a driver.

The refusals tested here happen before any driver call (the stride check, the DLPack dtype and
device checks, the stream type); the dispatches themselves run on the fake driver in
tests/test_device_arrays_fake.py and on a GPU in tests/gpu/test_device_arrays_gpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from planning_fakes import H200

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
from vyre_cuda._device_io import device_input, dlpack_stream, is_device_array
from vyre_cuda._io_checks import dtype_error
from vyre_cuda.config import stream_handle
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.launch import plan_launch
from vyre_cuda.planning.layout import plan_layout


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


def test_dlpack_stream_argument():
    assert dlpack_stream(None) == (1, 1)  # pooled stream: producer orders before legacy, we wait on it
    assert dlpack_stream(0) == (1, None)  # the legacy stream itself
    assert dlpack_stream(0x1234) == (0x1234, None)


def test_device_protocol_detection_is_attribute_only():
    assert is_device_array(_CAI((4,))) and is_device_array(_CudaDL(np.zeros(2)))
    assert not is_device_array(b"bytes")


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
