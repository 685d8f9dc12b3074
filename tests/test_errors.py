"""The error hierarchy: Fix lines, pickling, and the typed errors of failed driver calls."""

from __future__ import annotations

import copy
import pickle
import threading

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


def _unpicklables():
    from vyre_cuda._waits import PendingDispatch

    return [PendingDispatch.__new__(PendingDispatch), threading.Lock()]


def _every_error_class():
    import vyre_cuda.group  # noqa: F401 (defines a subclass of its own)

    found, todo = [], [E.BackendError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return [c for c in found if c.__module__.startswith("vyre_cuda")]


def test_the_unpicklable_samples_are():
    for obj in _unpicklables():
        with pytest.raises(TypeError):
            pickle.dumps(obj)


@pytest.mark.parametrize("cls", _every_error_class(), ids=lambda c: c.__name__)
@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_every_error_pickles_without_what_cannot_travel(cls, protocol):
    # a timeout DispatchFailed carries its PendingDispatch: through Dask the caller must still
    # get the class (to catch it), the message, the Fix and the plain attributes
    pending, lock = _unpicklables()
    sample = next((e for e in SAMPLES if type(e) is cls), None)
    err = sample if sample is not None else cls(f"{cls.__name__} went wrong (got 1)", "do better")
    err = copy.copy(err)
    err.pending, err.device, err.item = pending, 3, 7
    err.handle, err.detail = lock, {"bytes": 123}
    back = pickle.loads(pickle.dumps(err, protocol=protocol))
    assert type(back) is cls and str(back) == str(err) and back.args == err.args
    assert attrs(back) == attrs(err)
    assert (back.device, back.item, back.detail) == (3, 7, {"bytes": 123})
    assert back.pending is None and not hasattr(back, "handle")
    assert err.pending is pending and err.handle is lock  # the original keeps what it owns
    # copies stay in the process: they keep the pending handle itself
    for clone in (copy.copy(err), copy.deepcopy(err)):
        assert type(clone) is cls and clone.pending is pending and attrs(clone) == attrs(err)


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
    [
        "CUDA_ERROR_INVALID_VALUE",
        "CUDA_ERROR_NOT_FOUND",
        "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        "CUDA_ERROR_SOMETHING_NEW",
    ],
)
def test_other_errors_map_to_dispatch_failed(status):
    err = driver_error(status, "cuLaunchKernel")
    assert type(err) is E.DispatchFailed
    assert (err.status, err.call) == (status, "cuLaunchKernel")
    assert err.message.startswith(f"{status}: {cu_explanation(status)}")
    assert_fix(err)


def test_the_core_sticky_faults_are_sticky():
    for status in (
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    ):
        assert status in STICKY_ERRORS
    assert "CUDA_ERROR_OUT_OF_MEMORY" not in STICKY_ERRORS


def test_driver_error_round_trips_through_pickle():
    err = driver_error("CUDA_ERROR_ILLEGAL_ADDRESS", "cuEventSynchronize", code=700)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is E.DeviceLost and attrs(back) == attrs(err)


def test_explanations():
    assert cu_explanation("CUDA_ERROR_OUT_OF_MEMORY") != cu_explanation("CUDA_ERROR_UNKNOWN_TO_US")
    assert cu_explanation("CUDA_ERROR_UNKNOWN_TO_US")  # a generic line, never empty


# ---------------------------------------------------------------- the driver's own text
@pytest.fixture
def fake_driver(monkeypatch):
    """cuda.bindings' cuGetErrorString/cuGetErrorName answering like a loaded driver would."""
    from cuda.bindings import driver

    def error_string(result):
        return driver.CUresult.CUDA_SUCCESS, f"driver text for {result.name}".encode()

    def error_name(result):
        return driver.CUresult.CUDA_SUCCESS, f"{result.name}".encode()

    monkeypatch.setattr(driver, "cuGetErrorString", error_string)
    monkeypatch.setattr(driver, "cuGetErrorName", error_name)
    E._driver_text.cache_clear()
    yield driver
    E._driver_text.cache_clear()


@pytest.fixture
def no_driver(monkeypatch):
    """cuda.bindings as on a machine where libcuda.so.1 cannot be loaded."""
    from cuda.bindings import driver

    def unloadable(result):
        raise RuntimeError("Failed to dlopen libcuda.so.1")

    monkeypatch.setattr(driver, "cuGetErrorString", unloadable)
    monkeypatch.setattr(driver, "cuGetErrorName", unloadable)
    E._driver_text.cache_clear()
    yield
    E._driver_text.cache_clear()


def test_explanation_is_the_drivers_text_with_our_fix(fake_driver):
    assert cu_explanation("CUDA_ERROR_ILLEGAL_ADDRESS") == "driver text for CUDA_ERROR_ILLEGAL_ADDRESS"
    err = driver_error("CUDA_ERROR_ILLEGAL_ADDRESS", "cuStreamSynchronize", code=700)
    assert (
        err.message
        == "CUDA_ERROR_ILLEGAL_ADDRESS: driver text for CUDA_ERROR_ILLEGAL_ADDRESS; raised by cuStreamSynchronize"
    )
    assert "reset_device" in err.fix  # the Fix line is vyre_cuda's, not the driver's
    # a name the bindings do not know never reaches the driver
    assert cu_explanation("CUDA_ERROR_UNKNOWN_TO_US") == cu_explanation("CUDA_ERROR_UNKNOWN_TO_US_2")


def test_driver_refusing_a_code_falls_back(fake_driver, monkeypatch):
    monkeypatch.setattr(
        fake_driver, "cuGetErrorString", lambda r: (fake_driver.CUresult.CUDA_ERROR_INVALID_VALUE, None)
    )
    assert cu_explanation("CUDA_ERROR_OUT_OF_MEMORY") == E._FALLBACK_EXPLANATIONS["CUDA_ERROR_OUT_OF_MEMORY"]


def test_without_the_driver_library_the_builtin_table_answers(no_driver):
    for status, text in E._FALLBACK_EXPLANATIONS.items():
        assert cu_explanation(status) == text
    generic = cu_explanation("CUDA_ERROR_PEER_ACCESS_UNSUPPORTED")  # a real result outside the table
    assert generic and generic == cu_explanation("CUDA_ERROR_UNKNOWN_TO_US")
    err = driver_error("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc", code=2)
    assert err.message == "CUDA_ERROR_OUT_OF_MEMORY: out of memory; raised by cuMemAlloc"


@pytest.mark.parametrize("driver_state", ["fake_driver", "no_driver"])
def test_a_bare_code_is_named(driver_state, request):
    request.getfixturevalue(driver_state)
    assert E.cu_status_name(2) == "CUDA_ERROR_OUT_OF_MEMORY"
    assert E.cu_status_name(700) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert E.cu_status_name(123_456) == "CUresult(123456)"
    err = driver_error("CUresult(700)", "cuEventSynchronize", code=700)
    assert type(err) is E.DeviceLost and err.status == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert err.message.startswith("CUDA_ERROR_ILLEGAL_ADDRESS: ")
    err = driver_error("", "cuMemAlloc", code=2)
    assert type(err) is E.DeviceOutOfMemory and err.status == "CUDA_ERROR_OUT_OF_MEMORY"


def _driver_library_loads() -> bool:
    from cuda.bindings import driver

    try:
        driver.cuGetErrorString(driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    except RuntimeError:
        return False
    return True


@pytest.mark.gpu
def test_explanations_come_from_the_real_driver():
    """On a machine with the NVIDIA driver: the text is exactly cuGetErrorString's."""
    import os

    from cuda.bindings import driver

    if not _driver_library_loads():
        if os.environ.get("VYRE_CUDA_REQUIRE_GPU") == "1":
            pytest.fail("VYRE_CUDA_REQUIRE_GPU=1 but libcuda.so.1 cannot be loaded")
        pytest.skip("no CUDA driver library (libcuda.so.1) to ask")
    E._driver_text.cache_clear()
    for status in (
        "CUDA_ERROR_OUT_OF_MEMORY",
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_INVALID_VALUE",
        "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
    ):
        result = getattr(driver.CUresult, status)
        err, text = driver.cuGetErrorString(result)
        assert err == driver.CUresult.CUDA_SUCCESS and text
        assert cu_explanation(status) == text.decode()
        assert E.cu_status_name(int(result)) == status
        assert driver_error(status, "cuTest", code=int(result)).message.startswith(f"{status}: {text.decode()}; ")
