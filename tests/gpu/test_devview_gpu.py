"""Device arrays read in C on the GPU: CuPy (its fields, and its CUDA Array Interface for the
stream), torch (DLPack's C exchange API) and vyre_cuda's DeviceArray, against numpy, with the
producers' work still queued when the dispatch starts.

A slow kernel (it spins ~50 ms, then writes) stands for the producer's work: a dispatch not
ordered after it reads stale data, and the comparison with numpy fails.
"""

import numpy as np
import pytest
from helpers.spin import spin_copy

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
from vyre_cuda._devview import device_view, protocol_of

DEV = vc.DispatchConfig(outputs="device")


def _read_counts(backend):
    snap = backend.telemetry.snapshot()
    return snap["device_arrays_read_in_c"], snap["device_arrays_read_in_python"]


@pytest.mark.parametrize("n", [1000, 300_000])
def test_cupy_arrays_are_read_in_c_and_ordered_after_their_stream(backend, rng, cupy, n):
    prog = bp.vecadd_f32()
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        src, d_b = cupy.asarray(a), cupy.asarray(b)
        d_a = cupy.zeros(n, cupy.float32)
        assert protocol_of(d_a) == "cupy" and device_view(d_a, backend.device) is not None
        c0, p0 = _read_counts(backend)
        # the first teaches the core the type (CuPy's buffer protocol refuses); the late array is
        # the dispatch's first (its CAI names s), then its second (read from its fields, ordered
        # by the first's CAI stream)
        for order in (0, 0, 1, 1):
            spin_copy(cupy, d_a, src)  # d_a holds a only after the spin, on s
            d_out = cupy.full(n, cupy.nan, cupy.float32)
            ins = [d_a, d_b] if order == 0 else [d_b, d_a]
            backend.dispatch_into(prog, ins, [d_out])  # on the pooled stream: must wait for s
            np.testing.assert_array_equal(d_out.get(), a + b)
            d_a.fill(0)
        c1, p1 = _read_counts(backend)
    assert p1 == p0 and c1 - c0 >= 12, (c1 - c0, p1 - p0)  # (a plan miss reads a dispatch's arrays twice)


@pytest.mark.parametrize("n", [1000, 300_000])
def test_torch_tensors_are_read_in_c_and_ordered_after_torch_s_stream(backend, rng, torch, n):
    prog = bp.vecadd_f32()
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__") and not hasattr(
        torch.Tensor, "__c_dlpack_exchange_api__"
    ):
        pytest.skip(f"torch {torch.__version__} offers no DLPack C exchange API (torch 2.10+ does)")
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    side = torch.cuda.Stream()
    c0, p0 = _read_counts(backend)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps side busy: the work below lands late
        x = ta * 2  # queued on torch's current stream (side)
        out = torch.full((n,), float("nan"), device="cuda")
        backend.dispatch_into(prog, [x, tb], [out])
        np.testing.assert_array_equal(out.cpu().numpy(), a * 2 + b)
    c1, p1 = _read_counts(backend)
    assert protocol_of(ta) == "dlpack-exchange"
    assert p1 == p0 and c1 - c0 >= 3, (c1 - c0, p1 - p0)
    (host,) = backend.dispatch(prog, [ta, tb])
    np.testing.assert_array_equal(host, a + b)


def test_device_array_inputs_and_outputs_read_in_c(backend, rng):
    prog = bp.vecadd_f32()
    n = 4097
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    (x,) = backend.dispatch(prog, [a, np.zeros_like(a)], DEV)
    (y,) = backend.dispatch(prog, [b, np.zeros_like(b)], DEV)
    (z,) = backend.dispatch(prog, [a, b], DEV)
    c0, p0 = _read_counts(backend)
    backend.dispatch_into(prog, [y, x], [z])
    np.testing.assert_array_equal(z.copy_to_host(), b + a)
    c1, p1 = _read_counts(backend)
    assert p1 == p0 and c1 - c0 >= 3, (c1 - c0, p1 - p0)


def test_torch_outputs_that_require_grad_are_refused_and_inputs_read(fresh_backend, torch):
    g = fresh_backend
    prog = bp.vecadd_f32()
    a = torch.randn(4096, device="cuda", requires_grad=True)
    b = torch.randn(4096, device="cuda")
    (out,) = g.dispatch(prog, [a, b], vc.DispatchConfig(outputs="device"))  # inputs with grad are read
    np.testing.assert_array_equal(out.copy_to_host(), (a.detach() + b).cpu().numpy())
    t = torch.zeros(4096, device="cuda", requires_grad=True)
    for call in (lambda: g.dispatch_into(prog, [b, b], [t]), lambda: g.dispatch_async(prog, [b, b]).result_into([t])):
        with pytest.raises(vc.ValidationError) as refused:
            call()
        assert "requires grad" in refused.value.message
        assert str(refused.value).splitlines()[-1].startswith("Fix: ")
    assert torch.count_nonzero(t.detach()).item() == 0  # never written
    d = t.detach()
    g.dispatch_into(prog, [b, b], [d])
    torch.cuda.synchronize()
    np.testing.assert_array_equal(d.cpu().numpy(), (b + b).cpu().numpy())
