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


def test_the_policy_registers_once_the_saving_has_paid():
    policy = _hostreg.AutoRegister(saving_gbps=30.0, register_gbps=20.0, unregister_gbps=20.0)
    n = 256 << 20
    # cost n/20 + n/20 GB/s = saving of 3 sightings at n/30
    assert [policy.pays(k, n, None) for k in (1, 2, 3, 4)] == [False, False, True, True]
    # a faster register rate measured on this host pays sooner
    assert policy.pays(2, n, 60.0)


def test_the_owner_is_the_numpy_array_that_owns_the_memory():
    a = np.zeros(100)
    assert _hostreg.owning_array(a[10:].reshape(10, 9)[1:]) is a
    assert _hostreg.owning_array(np.frombuffer(bytearray(80), np.float64)) is None
    assert _hostreg.owning_array(b"xx") is None
