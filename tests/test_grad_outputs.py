"""A tensor that requires grad is never an output: written in place by a kernel, autograd's
gradients would be wrong (torch refuses such a write itself). Checked on the device-array reader with
a stand-in tensor; tests/gpu/test_devview_gpu.py checks torch itself."""

from __future__ import annotations

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
from vyre_cuda._devview import device_output


class _GradTensor:
    """Speaks the CUDA Array Interface v3 and says it requires grad (as a torch leaf would)."""

    requires_grad = True

    @property
    def __cuda_array_interface__(self):  # never read: the refusal comes first
        raise AssertionError("the output's memory was read before it was refused")


def test_an_output_that_requires_grad_is_refused_with_a_fix():
    plan = vc.plan(bp.vecadd_f32(), [np.zeros(16, np.float32)] * 2)
    with pytest.raises(vc.ValidationError) as refused:
        device_output(plan, 0, _GradTensor(), 0, None)
    assert "requires grad" in refused.value.message
    assert str(refused.value).splitlines()[-1].startswith("Fix: ") and "detach()" in str(refused.value)


def test_an_output_that_does_not_require_grad_is_not_refused_for_it():
    class NoGrad(_GradTensor):
        requires_grad = False

    plan = vc.plan(bp.vecadd_f32(), [np.zeros(16, np.float32)] * 2)
    try:
        device_output(plan, 0, NoGrad(), 0, None)  # (its interface raises: left to the other checks)
    except vc.ValidationError as exc:
        assert "requires grad" not in exc.message, exc.message
