"""vyre_cuda._validate: the shared int, flag, size and Program checks, and the messages they raise."""

import numpy as np
import pytest

from vyre_cuda import InvalidProgram, ValidationError
from vyre_cuda import builtin_programs as bp
from vyre_cuda._validate import SIZE_MAX, check_flag, check_int, check_size, is_flag, is_int
from vyre_cuda.program import require_program


@pytest.mark.parametrize("value", [0, -3, 2**70, np.int8(5), np.uint64(7)])
def test_is_int_takes_python_and_numpy_ints(value):
    assert is_int(value)


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 1.0, "1", None, np.float32(2)])
def test_is_int_refuses_bools_floats_and_text(value):
    assert not is_int(value)


def test_is_int_numpy_false_takes_only_python_ints():
    assert is_int(5, numpy=False) and not is_int(np.int64(5), numpy=False) and not is_int(True, numpy=False)


def test_is_flag():
    assert is_flag(True) and is_flag(np.bool_(False))
    assert not any(is_flag(v) for v in (0, 1, "yes", None))


def test_check_int_returns_a_python_int():
    got = check_int("n", np.int32(7), minimum=1, maximum=9, fix="f")
    assert got == 7 and type(got) is int


@pytest.mark.parametrize(
    ("kw", "value", "expected"),
    [
        ({"minimum": 1, "maximum": 64}, 65, "n must be an int in 1..64 (got 65)"),
        ({"minimum": 1}, 0, "n must be an int >= 1 (got 0)"),
        ({"maximum": 3}, 4, "n must be an int <= 3 (got 4)"),
        ({}, True, "n must be an int (got True)"),
        ({"expected": "an int ordinal"}, "0", "n must be an int ordinal (got '0')"),
    ],
)
def test_check_int_message_names_the_bounds_and_value(kw, value, expected):
    with pytest.raises(ValidationError) as info:
        check_int("n", value, fix="pass n=1", **kw)
    assert info.value.message == expected and info.value.fix == "pass n=1"


def test_check_int_raises_the_callers_error_type():
    with pytest.raises(InvalidProgram):
        check_int("n", -1, minimum=0, fix="f", error=InvalidProgram)


def test_check_size_bounds():
    assert check_size("b", SIZE_MAX, fix="f") == SIZE_MAX
    for bad in (-1, SIZE_MAX + 1, 1.5):
        with pytest.raises(ValidationError, match=r"b must be a non-negative int \(got "):
            check_size("b", bad, fix="f")


def test_check_flag():
    assert check_flag("c", np.bool_(True), fix="f") is True
    with pytest.raises(ValidationError) as info:
        check_flag("c", "no", fix="pass c=True")
    assert info.value.message == "c must be True or False (got str 'no')"


def test_require_program():
    require_program(bp.vecadd_f32(), "dispatch")
    with pytest.raises(ValidationError) as info:
        require_program(object(), "the group", verb="dispatches")
    assert info.value.message == "the group dispatches a vyre_cuda.Program (got object)"
    assert info.value.fix == "build one with Program(Kernel.cuda(src), [BufferDecl...])"
