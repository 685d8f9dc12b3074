"""Bad input on a real device: typed refusals, nothing leaked, and the next dispatch is correct.

The dispatch-case table lives in tests/test_bad_input.py (it runs there over the fake driver);
here every case runs on the device, and after each refusal:

* the pools, streams and events are back to their counts before the call (nothing allocated,
  nothing leaked), and the caller's buffers are not left exported;
* a correct dispatch on the same backend still succeeds and matches numpy.

Cases marked as known bugs in the table are NOT xfailed here: they assert the correct behaviour
and fail until the bug is fixed.
"""

from __future__ import annotations

import array
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import vyre_cuda as vc


def _load_cases():
    path = pathlib.Path(__file__).resolve().parents[1] / "test_bad_input.py"
    spec = importlib.util.spec_from_file_location("vyre_cuda_bad_input_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


cases = _load_cases()
N = cases.N
VECADD = cases.VECADD
LIVE_KEYS = ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")


def counts(backend) -> dict:
    return cases.pool_counts(backend)


def live(backend) -> dict:
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in LIVE_KEYS}


def inputs(rng):
    return cases.standard_inputs(rng)


def assert_vecadd_still_works(backend, rng):
    a, b = inputs(rng)
    (out,) = backend.dispatch(VECADD, [a, b])
    np.testing.assert_array_equal(out, a + b)


def _gpu_params():
    # every case, known bugs included (they must fail here until fixed)
    return [pytest.param(c, id=c.id) for c in cases.DISPATCH_CASES]


@pytest.mark.parametrize("case", _gpu_params())
def test_dispatch_refusal_leaves_the_backend_whole(backend, rng, case):
    a, b = inputs(rng)
    a0, b0 = a.copy(), b.copy()
    before = counts(backend)
    live_before = live(backend)
    refs = (sys.getrefcount(a), sys.getrefcount(b))
    err = cases.raised(case.call, backend, a, b)
    cases.assert_refusal(err, case)
    assert counts(backend) == before, "a refused call moved a pool, stream or event counter"
    assert (sys.getrefcount(a), sys.getrefcount(b)) == refs, "an input buffer was left exported"
    assert not backend.lost
    # the inputs are borrowed, never written, refused or not
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    # the backend still works, and the good dispatch gives back everything it took
    (out,) = backend.dispatch(VECADD, [a, b])
    np.testing.assert_array_equal(out, a + b)
    assert live(backend) == live_before


def test_refusal_while_another_dispatch_is_in_flight(backend, rng):
    a, b = inputs(rng)
    big_a = rng.standard_normal(1 << 22).astype(np.float32)
    big_b = rng.standard_normal(1 << 22).astype(np.float32)
    live_before = live(backend)
    pending = backend.dispatch_async(VECADD, [big_a, big_b])
    for case in cases.DISPATCH_CASES:
        if case.bug or not case.offline:
            continue
        err = cases.raised(case.call, backend, a, b)
        cases.assert_refusal(err, case)
    (out,) = pending.result()
    np.testing.assert_array_equal(out, big_a + big_b)
    assert live(backend) == live_before
    assert_vecadd_still_works(backend, rng)


# ------------------------------------------------------------------ inputs that are fine
def _as_read_only(x):
    y = x.copy()
    y.flags.writeable = False
    return y


GOOD_INPUTS = {
    "read_only_array": _as_read_only,
    "bytes": lambda x: x.tobytes(),
    "bytearray": lambda x: bytearray(x.tobytes()),
    "memoryview": lambda x: memoryview(x),
    "read_only_memoryview": lambda x: memoryview(x.tobytes()),
    "uint8_view": lambda x: x.view(np.uint8),  # raw bytes: reinterpretation is deliberate
    "array_module": lambda x: array.array("f", x.tolist()),
    "2d_c_contiguous": lambda x: x.reshape(10, 100),
}


@pytest.mark.parametrize("kind", sorted(GOOD_INPUTS))
def test_borrowed_buffers_of_every_kind_are_inputs(backend, rng, kind):
    a, b = inputs(rng)
    before = live(backend)
    (out,) = backend.dispatch(VECADD, [GOOD_INPUTS[kind](a), GOOD_INPUTS[kind](b)])
    np.testing.assert_array_equal(out, a + b)
    assert live(backend) == before


GOOD_OUTPUTS = {
    "bytearray": lambda: bytearray(4 * N),
    "2d_c_contiguous": lambda: np.empty((10, 100), np.float32),
    "memoryview_of_array": lambda: memoryview(np.empty(N, np.float32)),
}


@pytest.mark.parametrize("kind", sorted(GOOD_OUTPUTS))
def test_writable_buffers_of_every_kind_are_outputs(backend, rng, kind):
    a, b = inputs(rng)
    dst = GOOD_OUTPUTS[kind]()
    got = backend.dispatch_into(VECADD, [a, b], [dst])
    assert got[0] is dst
    np.testing.assert_array_equal(np.frombuffer(dst, np.float32), a + b)


# ------------------------------------------------------------------ PendingDispatch misuse
def test_result_taken_twice(backend, rng):
    a, b = inputs(rng)
    before = counts(backend)
    pending = backend.dispatch_async(VECADD, [a, b], timed=True)
    (out,) = pending.result()
    np.testing.assert_array_equal(out, a + b)
    # every later caller gets the same outputs (as Future.result()), and the same timings
    (again,) = pending.result()
    assert again is out
    timed = pending.timed_result()
    assert timed.outputs[0] is out and timed.device_ns > 0
    # ... but a second set of arrays cannot be filled: refused, with a Fix line
    err = cases.raised(lambda: pending.result_into([np.empty(N, np.float32)]))
    cases.assert_refusal(err, cases.Case("result_into_twice", None, vc.ValidationError, ("already taken",)))
    assert pending.is_ready()
    snap = counts(backend)
    for key in LIVE_KEYS:
        assert snap[key] == before[key], key
    assert_vecadd_still_works(backend, rng)


def test_timed_result_without_timing_events(backend, rng):
    a, b = inputs(rng)
    pending = backend.dispatch_async(VECADD, [a, b])
    err = cases.raised(pending.timed_result)
    cases.assert_refusal(err, cases.Case("timed_result_untimed", None, vc.ValidationError))
    (out,) = pending.result()  # the refusal did not consume the dispatch
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize(
    "outputs",
    [
        pytest.param(lambda: [np.empty(N - 1, np.float32)], id="too_small"),
        pytest.param(lambda: [np.empty(N, np.float64)], id="float64"),
        pytest.param(lambda: [None], id="none"),
        pytest.param(list, id="no_outputs"),
    ],
)
def test_bad_result_into_keeps_the_dispatch(backend, rng, outputs):
    a, b = inputs(rng)
    before = live(backend)
    pending = backend.dispatch_async(VECADD, [a, b])
    err = cases.raised(pending.result_into, outputs())
    cases.assert_refusal(err, cases.Case("bad_result_into", None, vc.ValidationError))
    (out,) = pending.result()
    np.testing.assert_array_equal(out, a + b)
    assert live(backend) == before


def test_result_into_takes_a_tuple_like_dispatch_into(backend, rng):
    # BUG: PendingDispatch.result_into (_waits.pyx) is typed `list outputs`, so a tuple raises
    # a bare TypeError, while CudaBackend.dispatch_into accepts any iterable. Fix: accept any
    # sequence (list(outputs)), or refuse with ValidationError.
    a, b = inputs(rng)
    dst = np.empty(N, np.float32)
    pending = backend.dispatch_async(VECADD, [a, b])
    pending.result_into((dst,))
    np.testing.assert_array_equal(dst, a + b)


# ------------------------------------------------------------------ backend lifecycle
@pytest.mark.parametrize("entry", sorted(cases.ENTRY_POINTS))
def test_use_after_close(rng, entry):
    a, b = inputs(rng)
    one = vc.CudaBackend(0)
    (out,) = one.dispatch(VECADD, [a, b])
    np.testing.assert_array_equal(out, a + b)
    one.close()
    one.close()  # idempotent
    refs = (sys.getrefcount(a), sys.getrefcount(b))
    err = cases.raised(cases.ENTRY_POINTS[entry], one, a, b)
    cases.assert_refusal(err, cases.Case("use_after_close", None, vc.ValidationError, ("closed",)))
    assert (sys.getrefcount(a), sys.getrefcount(b)) == refs
    with vc.CudaBackend(0) as two:  # the device is fine: a new backend works
        assert_vecadd_still_works(two, rng)


@pytest.mark.parametrize("entry", ["plan_info", "cooperative_grid_sync_fits"])
def test_planning_after_close(backend, rng, entry):
    # BUG: plan_info / cooperative_grid_sync_fits (backend.py) do not check `_closed`: on a closed
    # backend they compile and load modules into its (released) context and keep them forever.
    # Fix: call self._core's closed check (or `if self._closed: raise ValidationError`) first.
    a, b = inputs(rng)
    one = vc.CudaBackend(0)  # `backend` keeps the primary context alive, as in a real program
    one.close()
    err = cases.raised(getattr(one, entry), VECADD, [a, b])
    cases.assert_refusal(err, cases.Case("planning_after_close", None, vc.ValidationError, ("closed",)))


@pytest.mark.parametrize("device", [-1, 99])
def test_backend_on_a_device_that_does_not_exist(device):
    err = cases.raised(vc.CudaBackend, device)
    cases.assert_refusal(err, cases.Case("no_such_device", None, vc.ValidationError, (str(device),)))


@pytest.mark.parametrize("kw", [{"device_pool_bytes": -1}, {"pinned_pool_bytes": "big"}], ids=["negative", "a_str"])
def test_backend_pool_sizes(rng, kw):
    # BUG: CudaBackend.__init__ (backend.py) retains the primary context, then Core() raises
    # OverflowError/TypeError on a bad pool size, and the retain is never released.
    # Fix: validate the sizes (ints >= 0) before _driver.retain_primary_context.
    err = cases.raised(lambda: vc.CudaBackend(0, **kw))
    cases.assert_refusal(err, cases.Case("backend_pool_size", None, vc.ValidationError))
    with vc.CudaBackend(0) as one:
        assert_vecadd_still_works(one, rng)


def test_budget_refusal_allocates_nothing(fresh_backend, rng):
    snap0 = fresh_backend.telemetry.snapshot()
    err = cases.raised(lambda: fresh_backend.dispatch(cases.BUDGET, []))
    cases.assert_refusal(
        err, cases.Case("budget", None, vc.DeviceOutOfMemory, (f"{fresh_backend.caps.total_memory:,}",))
    )
    snap1 = fresh_backend.telemetry.snapshot()
    for key in (
        "device_pool_allocated_bytes",
        "device_pool_misses",
        "pinned_pool_misses",
        "pinned_pool_cached_bytes",
        "streams_created",
    ):
        assert snap1[key] == snap0[key] == 0, key
    assert_vecadd_still_works(fresh_backend, rng)
