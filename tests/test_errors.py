"""The error hierarchy: Fix lines, pickling, and the typed errors of failed driver calls."""

from __future__ import annotations

import copy
import pickle

import pytest

import vyre_cuda
from vyre_cuda import errors as E
from vyre_cuda.errors import STICKY_ERRORS, cu_explanation, driver_error

# every class, built with its extra attributes set to non-default values
SAMPLES = [
    E.BackendError("base went wrong (got 3)", "do the base thing"),
    E.InvalidProgram("bad program (got 4)", "declare it better"),
    E.ValidationError("bad argument (got 5)", "pass a good one"),
    E.UnsupportedFeature("no f16 (cc 5.0)", "use another device"),
    E.CooperativeResidencyExceeded("too many blocks", "use fewer", grid_blocks=133, resident_limit=132),
    E.KernelCompileFailed("nvrtc said no", "fix the source", log="kernel.cu(3): error: expected ';'"),
    E.DispatchFailed("CUDA_ERROR_X: bad", "retry", status="CUDA_ERROR_X", call="cuLaunchKernel", code=999),
    E.DeviceOutOfMemory("out of memory", "free memory", status="CUDA_ERROR_OUT_OF_MEMORY", call="cuMemAlloc", code=2),
    E.DeviceLost("lost", "reset", status="CUDA_ERROR_ILLEGAL_ADDRESS", call="cuEventSynchronize", code=700),
    E.DriverUnavailable("no libcuda", "install the driver"),
]
ATTRS = ("message", "fix", "grid_blocks", "resident_limit", "log", "status", "call", "code")


def assert_fix(err: BaseException) -> None:
    last = str(err).splitlines()[-1]
    assert last.startswith("Fix: ") and last[5:].strip(), str(err)


def attrs(err) -> dict:
    return {a: getattr(err, a) for a in ATTRS if hasattr(err, a)}


def test_every_public_error_is_sampled():
    assert {type(e).__name__ for e in SAMPLES} == {n for n in E.__all__ if n[0].isupper()}


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
def test_message_then_fix(err):
    assert isinstance(err, E.BackendError)
    assert str(err) == f"{err.message}\nFix: {err.fix}"
    assert_fix(err)


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_pickle_round_trip(err, protocol):
    back = pickle.loads(pickle.dumps(err, protocol=protocol))
    assert type(back) is type(err)
    assert str(back) == str(err) and back.args == err.args
    assert attrs(back) == attrs(err)


@pytest.mark.parametrize("err", SAMPLES, ids=lambda e: type(e).__name__)
def test_copy_keeps_attributes(err):
    for clone in (copy.copy(err), copy.deepcopy(err)):
        assert type(clone) is type(err) and attrs(clone) == attrs(err) and str(clone) == str(err)


def test_pickle_keeps_extra_state():
    err = E.DispatchFailed("m", "f", status="S", call="c", code=1)
    err.detail = {"bytes": 123}
    assert pickle.loads(pickle.dumps(err)).detail == {"bytes": 123}


def test_hierarchy():
    assert issubclass(E.DeviceOutOfMemory, E.DispatchFailed)
    assert issubclass(E.DeviceLost, E.DispatchFailed)
    for name in E.__all__:
        obj = getattr(E, name)
        if isinstance(obj, type):
            assert issubclass(obj, E.BackendError) and getattr(vyre_cuda, name) is obj


# ---------------------------------------------------------------- driver errors
def test_out_of_memory_maps_to_device_out_of_memory():
    err = driver_error("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc", code=2, detail="4,096 bytes")
    assert type(err) is E.DeviceOutOfMemory
    assert (err.status, err.call, err.code) == ("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc", 2)
    assert err.message.startswith("CUDA_ERROR_OUT_OF_MEMORY: ")
    assert_fix(err)


@pytest.mark.parametrize("status", sorted(STICKY_ERRORS))
def test_sticky_errors_map_to_device_lost(status):
    err = driver_error(status, "cuStreamSynchronize", code=700)
    assert type(err) is E.DeviceLost
    assert (err.status, err.call, err.code) == (status, "cuStreamSynchronize", 700)
    assert err.message.startswith(f"{status}: ")
    assert_fix(err)


@pytest.mark.parametrize(
    "status",
    ["CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_NOT_FOUND", "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_SOMETHING_NEW"],
)
def test_other_errors_map_to_dispatch_failed(status):
    err = driver_error(status, "cuLaunchKernel")
    assert type(err) is E.DispatchFailed
    assert (err.status, err.call) == (status, "cuLaunchKernel")
    assert err.message.startswith(f"{status}: {cu_explanation(status)}")
    assert_fix(err)


def test_the_core_sticky_faults_are_sticky():
    for status in ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ASSERT", "CUDA_ERROR_ILLEGAL_INSTRUCTION"):
        assert status in STICKY_ERRORS
    assert "CUDA_ERROR_OUT_OF_MEMORY" not in STICKY_ERRORS


def test_driver_error_round_trips_through_pickle():
    err = driver_error("CUDA_ERROR_ILLEGAL_ADDRESS", "cuEventSynchronize", code=700)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is E.DeviceLost and attrs(back) == attrs(err)


def test_explanations():
    assert cu_explanation("CUDA_ERROR_OUT_OF_MEMORY") != cu_explanation("CUDA_ERROR_UNKNOWN_TO_US")
    assert cu_explanation("CUDA_ERROR_UNKNOWN_TO_US")  # a generic line, never empty
