"""Dispatches on the caller's stream, and the synchronisation with producers' streams.

Each test queues a slow kernel (it spins ~50 ms, then writes the input) before the dispatch: a
dispatch that is not ordered after that work reads the stale input and the comparison with numpy
fails. Work queued after the dispatch on the same stream must see its outputs.
"""

import numpy as np
import pytest
from helpers.spin import CYCLES, spin_copy

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp


@pytest.mark.parametrize("n", [1000, 400_000])
def test_cupy_stream_orders_before_and_after(backend, rng, cupy, n):
    prog = bp.vecadd_f32()
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        src, d_b = cupy.asarray(a), cupy.asarray(b)
        d_a = cupy.zeros(n, cupy.float32)
        d_out = cupy.zeros(n, cupy.float32)
    # a plan's first dispatches upload its resident params block once, on a pooled stream: warmed
    # here, so the count below sees only what dispatches on the caller's stream take
    backend.dispatch_into(prog, [d_b, d_b], [d_out], vc.DispatchConfig(stream=s))
    backend.dispatch_async(prog, [d_b, d_b], vc.DispatchConfig(stream=s.ptr)).result()
    created = backend.telemetry.snapshot()["streams_created"]
    with s:
        d_out.fill(0)
        spin_copy(cupy, d_a, src)  # d_a is filled only after the spin
    backend.dispatch_into(prog, [d_a, d_b], [d_out], vc.DispatchConfig(stream=s))
    with s:
        after = d_out * 2  # later work on the stream sees the outputs
        got = after.get()  # (read on s: the default stream is not ordered with a non-blocking one)
    np.testing.assert_array_equal(got, (a + b) * 2)
    # the same through dispatch_async on a raw handle, result() as numpy
    with s:
        d_a.fill(0)
        spin_copy(cupy, d_a, src)
    (out,) = backend.dispatch_async(prog, [d_a, d_b], vc.DispatchConfig(stream=s.ptr)).result()
    np.testing.assert_array_equal(out, a + b)
    snap = backend.telemetry.snapshot()
    assert snap["streams_created"] == created  # the caller's stream, not a pooled one
    assert snap["streams_live"] == 0 and snap["events_live"] == 0


def test_torch_stream(backend, rng, torch, cupy):
    prog = bp.vecadd_f32()
    n = 300_000
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        src = torch.from_numpy(a).cuda()
        t_b = torch.from_numpy(b).cuda()
        t_a = torch.zeros(n, device="cuda")
        torch.cuda._sleep(CYCLES)
        t_a.copy_(src)
    (x,) = backend.dispatch(prog, [t_a, t_b], vc.DispatchConfig(stream=s, outputs="device"))
    with torch.cuda.stream(s):
        doubled = torch.from_dlpack(x) * 2
        got = doubled.cpu().numpy()  # (read on s: torch's streams are not ordered with the default one)
    np.testing.assert_array_equal(got, (a + b) * 2)


def test_pooled_stream_waits_for_the_producers_stream(backend, rng, cupy, torch):
    # no stream given: DLPack's stream argument and the CAI stream entry order the dispatch
    prog = bp.vecadd_f32()
    n = 200_000
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        src = cupy.asarray(a)
        d_a = cupy.zeros(n, cupy.float32)
        spin_copy(cupy, d_a, src)
        (out,) = backend.dispatch(prog, [d_a, b])  # DLPack: cupy orders its stream before ours
    np.testing.assert_array_equal(out, a + b)

    class CAIOnly:
        def __init__(self, arr, stream):
            cai = dict(arr.__cuda_array_interface__)
            cai["stream"] = stream
            self.__cuda_array_interface__ = cai
            self.arr = arr

    with s:
        d_a.fill(0)
        spin_copy(cupy, d_a, src)
    (out,) = backend.dispatch(prog, [CAIOnly(d_a, s.ptr), b])  # CAI v3: we wait on its stream
    np.testing.assert_array_equal(out, a + b)
    # torch on its default (legacy) stream
    t_src = torch.from_numpy(a).cuda()
    t_a = torch.zeros(n, device="cuda")
    torch.cuda._sleep(CYCLES)
    t_a.copy_(t_src)
    (out,) = backend.dispatch(prog, [t_a, b])
    np.testing.assert_array_equal(out, a + b)


def test_cuda_core_stream_protocol(backend, rng, cupy):
    # an object with __cuda_stream__ (cuda.core's protocol), wrapping a CuPy stream's handle
    class Proto:
        def __init__(self, handle):
            self.handle = handle

        def __cuda_stream__(self):
            return (0, self.handle)

    prog = bp.vecadd_f32()
    n = 5000
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        src = cupy.asarray(a)
        d_a = cupy.zeros(n, cupy.float32)
        spin_copy(cupy, d_a, src)
    (out,) = backend.dispatch(prog, [d_a, b], vc.DispatchConfig(stream=Proto(s.ptr)))
    np.testing.assert_array_equal(out, a + b)
