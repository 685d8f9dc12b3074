"""Checked u64 byte arithmetic (C), and overflow from huge counts reaching it through planning."""

from __future__ import annotations

import pytest

from vyre_cuda._accounting import U64_MAX, align_up, bucket_size, checked_add, checked_mul, checked_sum
from vyre_cuda.config import DispatchConfig
from vyre_cuda.errors import InvalidProgram
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.caps import DeviceCaps
from vyre_cuda.planning.launch import plan_launch
from vyre_cuda.planning.layout import plan_layout
from vyre_cuda.program import BufferDecl, Kernel, Program

FIX = "Fix: split the dispatch into bounded chunks"
KERNEL = Kernel.cuda('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const vyre_u32* p) {}\n')


def overflows(fn, *args):
    """``fn(*args)`` raises InvalidProgram whose last line is the chunking Fix."""
    with pytest.raises(InvalidProgram) as info:
        fn(*args)
    assert str(info.value).splitlines()[-1] == FIX
    return info.value


def test_u64_max():
    assert U64_MAX == 2**64 - 1


@pytest.mark.parametrize(
    ("a", "b"), [(0, 0), (1, 2), (2**64 - 2, 1), (2**64 - 1, 0), (0, 2**64 - 1), (2**63, 2**63 - 1)]
)
def test_checked_add_exact(a, b):
    assert checked_add(a, b) == a + b


@pytest.mark.parametrize(("a", "b"), [(2**64 - 1, 1), (1, 2**64 - 1), (2**63, 2**63), (2**64 - 1, 2**64 - 1)])
def test_checked_add_overflow(a, b):
    err = overflows(checked_add, a, b, "my total")
    assert str(a) in err.message and str(b) in err.message and "my total" in err.message


@pytest.mark.parametrize(
    ("a", "b"), [(0, 2**64 - 1), (1, 2**64 - 1), (2**32, 2**32 - 1), (2**32 - 1, 2**32 + 1), (3, (2**64 - 1) // 3)]
)
def test_checked_mul_exact(a, b):
    assert checked_mul(a, b) == a * b <= U64_MAX


@pytest.mark.parametrize(("a", "b"), [(2**32, 2**32), (2, 2**63), (2**61, 8), (3, (2**64 - 1) // 3 + 1)])
def test_checked_mul_overflow(a, b):
    err = overflows(checked_mul, a, b)
    assert str(a) in err.message and str(b) in err.message


@pytest.mark.parametrize("fn", [checked_add, checked_mul])
@pytest.mark.parametrize(("a", "b"), [(-1, 0), (0, -1), (2**64, 0), (0, 2**64), (2**70, 1)])
def test_operands_outside_u64(fn, a, b):
    overflows(fn, a, b)


@pytest.mark.parametrize(
    ("value", "alignment", "result"),
    [
        (0, 16, 0),
        (1, 16, 16),
        (16, 16, 16),
        (17, 256, 256),
        (255, 1, 255),
        (2**64 - 1, 1, 2**64 - 1),
        (2**64 - 16, 16, 2**64 - 16),
        (2**64 - 256, 256, 2**64 - 256),
        (2**63 + 1, 2**63, None),  # rounds up to 2**64: overflow
    ],
)
def test_align_up(value, alignment, result):
    if result is None:
        overflows(align_up, value, alignment)
    else:
        assert align_up(value, alignment) == result


@pytest.mark.parametrize(("value", "alignment"), [(2**64 - 15, 16), (2**64 - 1, 16), (2**64 - 255, 256)])
def test_align_up_overflow(value, alignment):
    overflows(align_up, value, alignment)


@pytest.mark.parametrize("alignment", [0, 3, 24, 2**64])
def test_align_up_bad_alignment(alignment):
    with pytest.raises(InvalidProgram) as info:
        align_up(64, alignment)
    assert str(info.value).splitlines()[-1].startswith("Fix: ")


@pytest.mark.parametrize(
    ("nbytes", "bucket"),
    [(0, 256), (1, 256), (256, 256), (257, 512), (1 << 20, 1 << 20), ((1 << 20) + 1, 1 << 21), (1 << 30, 1 << 30)],
)
def test_bucket_size(nbytes, bucket):
    assert bucket_size(nbytes) == bucket


@pytest.mark.parametrize("nbytes", [(1 << 30) + 1, 2**40 + 3, 2**62])
def test_huge_buckets_hold_the_bytes(nbytes):
    # above 1 GiB the bucket policy may round more finely than a power of two; it still holds
    assert nbytes <= bucket_size(nbytes) <= U64_MAX and bucket_size(nbytes) % 256 == 0


@pytest.mark.parametrize("nbytes", [2**63, 2**64 - 2**32])
def test_absurd_buckets_hold_the_bytes_or_are_refused(nbytes):
    try:
        bucket = bucket_size(nbytes)
    except InvalidProgram as err:
        assert str(err).splitlines()[-1] == FIX
    else:
        assert nbytes <= bucket <= U64_MAX


@pytest.mark.parametrize("nbytes", [2**64 - 1, 2**64, -1])
def test_bucket_size_overflow(nbytes):
    overflows(bucket_size, nbytes)


@pytest.mark.parametrize("fn", [checked_add, checked_mul, align_up, bucket_size])
def test_non_integer_operands_are_refused(fn):
    args = (1.5,) if fn is bucket_size else (1.5, 1) if fn is not align_up else (17.5, 16)
    with pytest.raises((TypeError, InvalidProgram)):
        fn(*args)


def test_checked_sum():
    assert checked_sum([]) == 0
    assert checked_sum([2**63, 2**63 - 1]) == 2**64 - 1
    overflows(checked_sum, [2**63, 2**63])


# ---------------------------------------------------------------- huge counts through planning
def plan_all(buffers, lengths, config=None):
    prog = Program(KERNEL, buffers)
    bplan = plan_bindings(prog, lengths)
    launch = plan_launch(prog, bplan, config or DispatchConfig(), DeviceCaps())
    return plan_layout(bplan, launch)


@pytest.mark.parametrize(
    "buffers",
    [
        [BufferDecl.read("a", 0, "u32", 4), BufferDecl.output("huge", 1, "f64", 2**61)],  # 2**64 bytes
        [BufferDecl.read("a", 0, "u32", 4), BufferDecl.output("huge", 1, "u8", 2**64)],  # count past u64
        [BufferDecl.read("a", 0, "u32", 4), BufferDecl.output("huge", 1, "u64", 2**63)],
    ],
)
def test_huge_static_count(buffers):
    overflows(plan_bindings, Program(KERNEL, buffers), (16,))


def test_huge_runtime_input():
    prog = Program(KERNEL, [BufferDecl.read("a", 0, "u8"), BufferDecl.output("o", 1, "f64")])
    overflows(plan_bindings, prog, (2**61,))  # the f64 output takes 2**61 elements: 2**64 bytes


def test_large_but_representable_sizes_reach_the_launch_limits():
    # 2**61 - 1 f64 is representable in u64 bytes; the launch's u32 element count refuses it
    buffers = [BufferDecl.read("a", 0, "u32", 4), BufferDecl.output("o", 1, "f64", 2**61 - 1)]
    assert plan_bindings(Program(KERNEL, buffers), (16,)).slots[1].byte_len == (2**61 - 1) * 8
    overflows(plan_all, buffers, (16,))


def test_count_over_u32_with_a_small_launch():
    # grid_override keeps the launch small; the buffer's u32 params word still refuses the count
    buffers = [BufferDecl.read("a", 0, "u8", 4), BufferDecl.output("big", 1, "u64", 2**32)]
    err = overflows(plan_all, buffers, (4,), DispatchConfig(grid_override=1))
    assert "'big'" in err.message and str(2**32) in err.message
    buffers[1] = BufferDecl.output("big", 1, "u64", 2**32 - 1)  # the largest count a word holds
    assert plan_all(buffers, (4,), DispatchConfig(grid_override=1)).slab_bytes > (2**32 - 1) * 8
