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
