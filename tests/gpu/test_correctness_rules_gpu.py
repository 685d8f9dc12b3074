"""No silent wrong results, on the GPU: input lengths, launch sizing, bound checks in the built-in
kernels, bf16 inputs and byte ranges, each checked against numpy on fresh random data.

Tests marked ``xfail(strict=True)`` need a change in the backend or dispatch core (named in the
reason); once it lands they pass, and the strict marker makes that visible so it gets removed.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp
from vyre_cuda.errors import ValidationError
from vyre_cuda.program import DTYPES, LaunchSizeWarning

HIST_SRC = r"""
#include "vyre_cuda.cuh"
// grid-stride, so any grid covers every element of the launch
VYRE_KERNEL vyre_main(const unsigned char* x, vyre_u32* h, const vyre_u32* params) {
  for (vyre_u64 i = vyre_global_id(); i < vyre_count(params); i += vyre_global_threads())
    if (vyre_in_bounds(params, 0, i)) atomicAdd(&h[x[i]], 1u);
}
"""


def histogram(**kw) -> Program:
    """atomicAdd(&h[x[i]], 1) over a runtime-sized u8 input into a 256-bin static output."""
    return Program(
        Kernel.cuda(HIST_SRC),
        [BufferDecl.read("x", 0, "u8"), BufferDecl.output("h", 1, "u32", 256)],
        name="histogram",
        **kw,
    )


HIST_X = histogram(launch="x")


def counts(x) -> np.ndarray:
    return np.bincount(x, minlength=256).astype(np.uint32)


def f32(rng, n):
    return (rng.standard_normal(n) * 100).astype(np.float32)


# ------------------------------------------------------------------------------ input lengths
def test_ragged_vecadd_is_refused_and_the_next_dispatch_is_right(backend, rng):
    # a of 1000 and b of 10 elements gave a[i] + 0 for i >= 10 on the H200, with no error
    prog = bp.vecadd_f32()
    a, b = f32(rng, 1000), f32(rng, 10)
    with pytest.raises(ValidationError) as info:
        backend.dispatch(prog, [a, b])
    assert "'a' (1000 elements)" in info.value.message and "'b' (10 elements)" in info.value.message
    b2 = f32(rng, 1000)
    (out,) = backend.dispatch(prog, [a, b2])
    np.testing.assert_array_equal(out, a + b2)


def test_declared_launch_with_ragged_inputs_checks_each_buffer(backend, rng):
    # the built-in vecadd checks b against its own count: past b's end nothing is written
    prog = Program(bp.vecadd_f32().kernel, bp.vecadd_f32().buffers, launch="a")
    for na, nb in ((1000, 10), (4097, 4096), (5, 300), (1, 1)):
        a, b = f32(rng, na), f32(rng, nb)
        (out,) = backend.dispatch(prog, [a, b])
        assert out.shape == (na,)
        m = min(na, nb)
        np.testing.assert_array_equal(out[:m], a[:m] + b[:m])
        assert not out[m:].any()


# ------------------------------------------------------------------------------ launch sizing
@pytest.mark.parametrize("n", [1, 255, 256, 257, 100_003, 3 << 20])
def test_histogram_sized_by_its_input(backend, rng, n):
    # launched over the 256 bins it counted only the first 256 inputs
    x = rng.integers(0, 256, n, dtype=np.uint8)
    (h,) = backend.dispatch(HIST_X, [x])
    np.testing.assert_array_equal(h, counts(x))
    assert backend.plan_info(HIST_X, [x]).launch.element_count == n


def test_histogram_by_the_default_rule_warns_and_counts_the_documented_256(backend, rng):
    x = rng.integers(0, 256, 10_000, dtype=np.uint8)
    prog = histogram()
    with pytest.warns(LaunchSizeWarning, match="launch='x'"):
        (h,) = backend.dispatch(prog, [x])
    np.testing.assert_array_equal(h, counts(x[:256]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (h,) = backend.dispatch(prog, [x])  # once per program
    np.testing.assert_array_equal(h, counts(x[:256]))


@pytest.mark.parametrize("elements", [1, 1000, 9999])
def test_elements_override_per_dispatch(backend, rng, elements):
    x = rng.integers(0, 256, 10_000, dtype=np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit count never warns
        (h,) = backend.dispatch(histogram(), [x], DispatchConfig(elements=elements))
    np.testing.assert_array_equal(h, counts(x[:elements]))


@pytest.mark.parametrize("grid", [1, 7, 132, 4096])
def test_grid_override_keeps_the_declared_count_in_word0(backend, rng, grid):
    x = rng.integers(0, 256, 300_001, dtype=np.uint8)
    (h,) = backend.dispatch(HIST_X, [x], DispatchConfig(grid_override=grid))
    np.testing.assert_array_equal(h, counts(x))  # a grid-stride kernel sees every element
    (h,) = backend.dispatch(HIST_X, [x], DispatchConfig(grid_override=grid, elements=1234))
    np.testing.assert_array_equal(h, counts(x[:1234]))


def test_params_words_under_the_launch_rules(backend, rng):
    a = rng.integers(0, 10, 123, dtype=np.uint32)
    (words,) = backend.dispatch(bp.params_echo(a_count=0, words=7), [a])
    np.testing.assert_array_equal(words, [7, 123, 0, 0, 0, 0, 7])
    (words,) = backend.dispatch(bp.params_echo(a_count=0, words=7), [a], DispatchConfig(grid_override=3))
    assert words[0] == 7 and words[1] == 123  # a declared launch keeps word 0 under a grid


# ------------------------------------------------------------------------------ bound checks
@pytest.mark.parametrize(("workgroup", "scratch"), [(256, 5), (256, 256), (128, 1000), (64, 63)])
def test_block_sum_with_any_scratch_size(backend, rng, workgroup, scratch):
    blocks = 37
    prog = bp.block_sum_u32(blocks, workgroup=workgroup, scratch_elems=scratch)
    x = rng.integers(0, 1000, blocks * workgroup, dtype=np.uint32)
    (sums,) = backend.dispatch(prog, [x])
    np.testing.assert_array_equal(sums, x.reshape(blocks, workgroup).sum(axis=1, dtype=np.uint32))


def test_block_sum_never_writes_past_its_sums(backend, rng):
    # a smaller block doubles the grid; blocks past the 8 sums must not write
    prog = bp.block_sum_u32(8, workgroup=256)
    x = rng.integers(0, 1000, 8 * 256, dtype=np.uint32)
    (sums,) = backend.dispatch(prog, [x], DispatchConfig(workgroup_override=128))
    np.testing.assert_array_equal(sums, x[: 8 * 128].reshape(8, 128).sum(axis=1, dtype=np.uint32))
    (sums,) = backend.dispatch(prog, [x])
    np.testing.assert_array_equal(sums, x.reshape(8, 256).sum(axis=1, dtype=np.uint32))


# ------------------------------------------------------------------------------ bf16
def bf16_bits(rng, n) -> np.ndarray:
    # finite bf16 values of moderate size, as raw bits (uint16)
    f = (rng.standard_normal(n) * 50).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16)


def bf16_value(bits) -> np.ndarray:
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_round(values) -> np.ndarray:
    """float32 -> bf16 bits, rounded to nearest even (what the device's bf16 add does)."""
    u = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("n", [1, 1000, 65_537])
def test_bf16_vecadd_on_raw_bits(backend, rng, n):
    prog = bp.vecadd("bf16")
    a, b = bf16_bits(rng, n), bf16_bits(rng, n)
    (out,) = backend.dispatch(prog, [a, b])
    assert out.dtype == DTYPES["bf16"].numpy and out.shape == (n,)
    got, va, vb = bf16_value(out), bf16_value(a), bf16_value(b)
    # one bf16 rounding of the sum: within half a bf16 ulp of the operands' scale, and bit-equal
    # to numpy's round-to-nearest-even of the float32 sum (double rounding may differ, rarely)
    assert np.all(np.abs(got - (va + vb)) <= (np.abs(va) + np.abs(vb)) * 2.0**-8)
    assert np.mean(np.asarray(out).view(np.uint16) == bf16_round(va + vb)) >= 0.99


@pytest.mark.parametrize("dtype", [np.int16, np.float16, ">u2"], ids=["int16", "float16", "big-endian"])
def test_bf16_refuses_other_two_byte_arrays(backend, rng, dtype):
    prog = bp.vecadd("bf16")
    good = bf16_bits(rng, 100)
    bad = good.astype(dtype) if dtype != np.float16 else good.view(np.float16)
    with pytest.raises(ValidationError):
        backend.dispatch(prog, [bad, good])
    (out,) = backend.dispatch(prog, [good, good])
    np.testing.assert_allclose(bf16_value(out), 2 * bf16_value(good), rtol=2**-7)


# ------------------------------------------------------------------------------ byte ranges, timeout
def test_whole_element_byte_range_in_dispatch_and_dispatch_into(backend, rng):
    decls = [
        BufferDecl.read("a", 0, "f32"),
        BufferDecl.read("b", 1, "f32"),
        BufferDecl.output("out", 2, "f32", output_byte_range=(8, 40)),
    ]
    prog = Program(bp.vecadd_f32().kernel, decls)
    a, b = f32(rng, 100), f32(rng, 100)
    (out,) = backend.dispatch(prog, [a, b])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, (a + b)[2:10])
    into = np.empty(8, np.float32)
    backend.dispatch_into(prog, [a, b], [into])
    np.testing.assert_array_equal(into, (a + b)[2:10])


def test_infinite_timeout_waits_without_bound(backend, rng):
    a, b = f32(rng, 4097), f32(rng, 4097)
    (out,) = backend.dispatch(bp.vecadd_f32(), [a, b], DispatchConfig(timeout=float("inf")))
    np.testing.assert_array_equal(out, a + b)


def test_non_bool_cooperative_never_launches(backend, rng):
    a = f32(rng, 100)
    before = backend.telemetry.snapshot()["launches"]
    with pytest.raises(ValidationError):
        backend.dispatch(bp.vecadd_f32(), [a, a], {"cooperative": "no"})
    assert backend.telemetry.snapshot()["launches"] == before
