"""numpy memory registered in place (vyre_cuda._hostreg): explicit blocks, the automatic policy,
lifetimes (freed, resized, views, memory numpy does not own), budgets and driver refusals falling
back to staging, two backends and threads. The scenarios run in one child interpreter on the fake
driver (tests/fakecuda/hostreg_child.py); each is reported here as its own test. The policy's rule
and the span arithmetic are tested here directly."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import scenarios

from vyre_cuda import _hostreg
from vyre_cuda.errors import ValidationError

CHILD = scenarios.FAKECUDA / "hostreg_child.py"


@pytest.fixture(scope="module")
def results(fake_libcuda, tmp_path_factory):
    return scenarios.run_scenarios(CHILD, fake_libcuda, tmp_path_factory)


@pytest.mark.parametrize("name", scenarios.declared(CHILD))
def test_scenario(results, name):
    scenarios.check(results[name])


def test_the_span_covers_every_byte_in_whole_pages():
    page = _hostreg.PAGE
    for address, nbytes in ((0, 1), (page - 1, 2), (3 * page + 17, 5 * page), (8 * page, page)):
        start, end = _hostreg.page_span(address, nbytes)
        assert start % page == 0 and end % page == 0
        assert start <= address and address + nbytes <= end and end - start < nbytes + 2 * page


def test_the_policy_refuses_settings_that_cannot_work():
    assert _hostreg.AutoRegister() == _hostreg.AutoRegister(min_bytes=4 << 20, after=2, background=True)
    for kwargs, name in (
        ({"after": 0}, "after"),
        ({"after": True}, "after"),
        ({"after": 1.5}, "after"),
        ({"background": 1}, "background"),
        ({"min_bytes": _hostreg.PAGE - 1}, "min_bytes"),
    ):
        with pytest.raises(ValidationError) as err:
            _hostreg.AutoRegister(**kwargs)
        assert name in err.value.message and repr(kwargs[name]) in err.value.message and err.value.fix


def test_the_owner_is_the_numpy_array_that_owns_the_memory():
    a = np.zeros(100)
    assert _hostreg.owning_array(a[10:].reshape(10, 9)[1:]) is a
    assert _hostreg.owning_array(np.frombuffer(bytearray(80), np.float64)) is None
    assert _hostreg.owning_array(b"xx") is None


FREE_CHECK_CHILD = r"""
import json

import numpy as np
from fakecuda import FakeDriver

import vyre_cuda as vc
from vyre_cuda import _driver, _hostreg

fake = FakeDriver()
gpu = vc.CudaBackend(0, auto_register=vc.AutoRegister(min_bytes=1 << 16, after=1, background=False))


def freed(unregister_first):
    # 4 MiB of numpy memory registered by hand, then freed with or without its unregister
    x = np.ones(1 << 20, np.float32)
    start, end = _hostreg.page_span(x.ctypes.data, x.nbytes)
    assert _driver.host_register(0, start, end - start) == 0
    if unregister_first:
        assert _driver.host_unregister(0, start) == 0
    before = fake.stats()["violations"]
    del x
    found = fake.stats()["violations"] - before, fake.last_violation()
    if not unregister_first:
        assert _driver.host_unregister(0, start) == 0  # (late: a stale registration would catch the next array)
    return found


def policy():
    # the automatic policy registers an input at its first sighting; the array then dies
    before = fake.stats()["violations"]
    x = np.random.default_rng(3).random(1 << 20).astype(np.float32)
    gpu.dispatch(vc.builtin_programs.vecadd_f32(), [x, x])  # (the fake runs no kernel: bytes unchecked)
    registered = vc.registered_stats()["registered_ranges"]
    del x
    return fake.stats()["violations"] - before, registered, vc.registered_stats()["registered_ranges"]


print(json.dumps({"leaked": freed(False), "clean": freed(True), "policy": policy()}))
"""


def test_memory_freed_while_registered_is_caught_by_the_free_checker(fake_libcuda, tmp_path_factory):
    """The fake-driver stress runs with tests/fakecuda/free_check.c preloaded: a free() of memory a
    registration still covers is a driver violation there (on a GPU, the next allocation at that
    address would be moved by DMA through the stale registration's pages). The checker catches a
    registration left behind, passes one undone first, and passes the policy's own lifetime."""
    import json

    import fakecuda

    checker = fakecuda.build_free_check(tmp_path_factory.getbasetemp() / "free-check")
    proc = fakecuda.run_python(["-c", FREE_CHECK_CHILD], fake_libcuda, LD_PRELOAD=str(checker))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    count, message = res["leaked"]
    assert count == 1 and "freed while registered" in message, res
    assert res["clean"][0] == 0, res
    violations, registered, after = res["policy"]
    assert registered == 1 and after == 0 and violations == 0, res
