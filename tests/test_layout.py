"""Slab layout of one dispatch, and the Prepared plan built from it (both need no device)."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from vyre_cuda._accounting import bucket_size
from vyre_cuda._prepared import Prepared
from vyre_cuda.config import DispatchConfig
from vyre_cuda.errors import InvalidProgram, UnsupportedFeature
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.caps import DeviceCaps
from vyre_cuda.planning.dispatch import assemble_plan
from vyre_cuda.planning.launch import Route, params_words, plan_launch
from vyre_cuda.planning.layout import COPY_ALIGN, HOST_CLEAR_MAX, MERGE_GAP, REGION_ALIGN, plan_layout
from vyre_cuda.program import BufferDecl, Kernel, Program

KERNEL = Kernel.cuda('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const vyre_u32* p) {}\n')
CAPS = DeviceCaps()


def assert_fix(err: BaseException) -> None:
    last = str(err).splitlines()[-1]
    assert last.startswith("Fix: ") and last[5:].strip(), str(err)


def zeroed(lay) -> tuple:
    """The span of pure outputs zeroed before the launch, by device memset or in staging."""
    assert lay.clear == (0, 0) or lay.host_clear == (0, 0)
    return lay.clear if lay.clear != (0, 0) else lay.host_clear


def params_end(lay) -> int:
    return lay.params_offsets[0] + len(lay.params_blob)


def plan(buffers, lengths, config=None, phase_ranges=(None,), **program_kw):
    """(program, binding plan, launch plan, layout) of one dispatch on the default caps."""
    prog = Program(KERNEL, list(buffers), **program_kw)
    bplan = plan_bindings(prog, lengths)
    launch = plan_launch(prog, bplan, config or DispatchConfig(), CAPS)
    return prog, bplan, launch, plan_layout(bplan, launch, phase_ranges)


# Declared out of binding order on purpose; the expected offsets below are worked by hand.
MIXED = [
    BufferDecl.read("a", 0, "u8"),
    BufferDecl.output("o1", 1, "u32"),
    BufferDecl.read_write("io", 3, "f32", 3),
    BufferDecl.output("o2", 2, "f64", 5),
    BufferDecl.workgroup("s", 4, "u32", 8),
]


def test_mixed_layout_worked_by_hand():
    _, _, launch, lay = plan(MIXED, (10, 12))
    # uploads (binding order): a [0, 10) in a 16-byte region, io at 256; params at 512
    assert lay.inputs == ((0, 0, 10, 256), (1, 256, 12, 512))
    assert lay.params_offsets == (512,)
    words = [10, 10, 10, 5, 3, 8]  # element count (largest binding: workgroup), then per binding
    assert lay.params_blob == struct.pack("<6I", *words) + bytes(8)
    assert params_end(lay) == 512 + 32
    # pure outputs after inputs and params; being small, they are zeroed in staging and the
    # one upload extends over them (no device memset)
    assert lay.arg_offsets == (0, 768, 1024, 256)  # bindings 0, 1, 2, 3
    assert (lay.clear, lay.host_clear, lay.upload_end) == ((0, 0), (768, 1024 + 48), 1024 + 48)
    assert lay.slab_bytes == 1280 and lay.bucket_bytes == 2048
    # outputs in declaration order (o1, io, o2); readbacks padded and merged into one copy
    assert lay.outputs == ((768, 40), (256, 12), (1024, 40))
    assert lay.readbacks == ((256, 1024 + 48 - 256),)
    assert (lay.h2d_bytes, lay.d2h_bytes) == (10 + 12 + 4 * len(words), 40 + 12 + 40)
    assert launch.shared_bytes == 32


def test_regions_are_aligned_and_ordered():
    _, bplan, _, lay = plan(MIXED, (10, 12))
    assert all(off % REGION_ALIGN == 0 for off in lay.arg_offsets + lay.params_offsets)
    uploads = {s.binding for s in bplan.slots if s.input_index >= 0}
    span = zeroed(lay)
    for slot, off in zip(bplan.slots, lay.arg_offsets):
        end = off + max(slot.byte_len, 1)
        if slot.binding in uploads:
            assert end <= lay.params_offsets[0] and end <= lay.upload_end
        else:
            assert params_end(lay) <= span[0] <= off and end <= span[1]
    assert span[1] <= lay.slab_bytes and lay.slab_bytes % REGION_ALIGN == 0


def test_clear_is_empty_without_pure_outputs():
    _, _, _, lay = plan([BufferDecl.read("a", 0, "u32"), BufferDecl.read_write("io", 1, "u32")], (40, 40))
    assert (lay.clear, lay.host_clear) == ((0, 0), (0, 0))
    assert lay.upload_end == params_end(lay) == 512 + 16
    assert lay.readbacks == ((256, 48),) and lay.outputs == ((256, 40),)


@pytest.mark.parametrize(("n", "on_host"), [(1, True), (65296, True), (65297, False), (10**6, False)])
def test_small_outputs_are_zeroed_in_staging(n, on_host):
    # params end at 272; the output region starts at 512: zeroing it in staging costs
    # 512 + pad16(n) - 272 more upload bytes, allowed up to HOST_CLEAR_MAX
    _, _, _, lay = plan([BufferDecl.read("a", 0, "u8", 4), BufferDecl.output("o", 1, "u8", n)], (4,))
    span = (512, 512 + -(-n // 16) * 16)
    assert params_end(lay) == 272 and zeroed(lay) == span
    assert (span[1] - 272 <= HOST_CLEAR_MAX) is on_host
    if on_host:
        assert (lay.host_clear, lay.clear, lay.upload_end) == (span, (0, 0), span[1])
    else:
        assert (lay.clear, lay.host_clear, lay.upload_end) == (span, (0, 0), 272)
    assert lay.h2d_bytes == 4 + 12  # logical bytes only: the input and 3 params words


def test_phase_blocks():
    buffers = [BufferDecl.read("x", 0, "u32"), BufferDecl.output("y", 1, "u32")]
    ranges = [(0, 1), (1, 2), (2, 3)]
    _, bplan, launch, lay = plan(buffers, (400,), phase_ranges=ranges, grid_sync=True, phases=3)
    assert lay.params_offsets == (512, 544, 576)  # 5 words (20 B) -> 32-byte blocks, back to back
    expected = b"".join(struct.pack("<5I", *params_words(bplan, launch, r)) + bytes(12) for r in ranges)
    assert lay.params_blob == expected
    assert params_end(lay) == 608 and lay.upload_end == lay.host_clear[1]
    assert lay.h2d_bytes == 400 + 3 * 20


@pytest.mark.parametrize("n_buffers", [1, 2, 3, 4, 7])
def test_params_blocks_are_16_byte_aligned_and_zero_padded(n_buffers, rng):
    # the device header's vyre_params_head reads words 0-3 in one 16-byte load: every block must
    # start 16-byte aligned and be padded with zeros to 16 bytes (so words past the last binding
    # read as 0, inside the block)
    count = int(rng.integers(1, 5000))
    lengths = (4 * count,) * (n_buffers - 1)
    buffers = [BufferDecl.read(f"x{k}", k, "u32") for k in range(n_buffers - 1)]
    buffers.append(BufferDecl.output("y", n_buffers - 1, "u32", count))
    _, bplan, launch, lay = plan(buffers, lengths)
    words = params_words(bplan, launch, None)
    block = len(lay.params_blob) // len(lay.params_offsets)
    assert all(off % 16 == 0 for off in lay.params_offsets) and block % 16 == 0 and block >= 16
    assert lay.params_blob[: 4 * len(words)] == struct.pack(f"<{len(words)}I", *words)
    assert lay.params_blob[4 * len(words) : block] == bytes(block - 4 * len(words))


def test_alignment_hint():
    buffers = [
        BufferDecl.read("a", 0, "u8"),
        BufferDecl.read("b", 1, "u8", alignment=4096),
        BufferDecl.output("o", 2, "u8", 4, alignment=1024),
    ]
    _, _, _, lay = plan(buffers, (3, 5), launch="a")  # inputs of different lengths: declared
    assert lay.arg_offsets[1] == 4096 and lay.arg_offsets[2] % 1024 == 0


def test_zero_length_buffers_get_distinct_regions():
    buffers = [BufferDecl.read("a", 0, "u32"), BufferDecl.read("b", 1, "u32"), BufferDecl.output("o", 2, "u32")]
    _, _, _, lay = plan(buffers, (0, 0), DispatchConfig(grid_override=1))
    assert len(set(lay.arg_offsets)) == 3
    assert lay.inputs == ((0, 0, 0, 256), (1, 256, 0, 512))
    assert zeroed(lay)[1] - zeroed(lay)[0] >= COPY_ALIGN
    assert lay.outputs == ((lay.arg_offsets[2], 0),) and lay.readbacks == ()
    assert (lay.h2d_bytes, lay.d2h_bytes) == (4 * 4, 0)  # only the params words


def test_input_tail_is_zeroed_up_to_the_next_region():
    _, _, _, lay = plan(
        [BufferDecl.read("a", 0, "u8"), BufferDecl.read("b", 1, "u8"), BufferDecl.output("o", 2, "u8")],
        (300, 7),
        launch="a",
    )
    (_, a_off, a_len, a_zero), (_, b_off, b_len, b_zero) = lay.inputs
    assert (a_off, a_len, a_zero) == (0, 300, b_off) and b_off == 512
    assert b_zero == lay.params_offsets[0] == 768


# ---------------------------------------------------------------- readbacks
def output_range(nbytes, rng):
    buffers = [BufferDecl.read("a", 0, "u8", 4), BufferDecl.output("o", 1, "u8", nbytes, output_byte_range=rng)]
    return plan(buffers, (4,))[3]


@pytest.mark.parametrize(
    ("rng", "copy"),
    [
        ((0, 4096), 4096),
        ((4080, 4096), 16),
        ((100, 101), 16),  # padded: the slab holds 16 bytes from 100
        ((4090, 4096), 6),  # the padded 16 bytes would run past the slab end
        ((4095, 4096), 1),
    ],
)
def test_readback_padded_only_when_the_slab_holds_it(rng, copy):
    lay = output_range(4096, rng)
    base = lay.arg_offsets[1]
    assert base + 4096 == lay.slab_bytes  # the output ends the slab
    assert lay.outputs == ((base + rng[0], rng[1] - rng[0]),)
    assert lay.readbacks == ((base + rng[0], copy),)
    assert lay.d2h_bytes == rng[1] - rng[0]


def test_empty_range_reads_nothing():
    lay = output_range(64, (64, 64))
    assert lay.outputs == ((lay.arg_offsets[1] + 64, 0),) and lay.readbacks == () and lay.d2h_bytes == 0


@pytest.mark.parametrize("rng", [(0, 65), (64, 65), (100, 200)])
def test_range_past_the_buffer(rng):
    with pytest.raises(InvalidProgram) as info:
        output_range(64, rng)
    assert_fix(info.value)


def test_range_past_a_runtime_sized_buffer_is_checked_per_dispatch():
    buffers = [BufferDecl.read("a", 0, "u32"), BufferDecl.output("o", 1, "u32", output_byte_range=(0, 40))]
    assert plan(buffers, (40,))[3].d2h_bytes == 40
    with pytest.raises(InvalidProgram) as info:
        plan(buffers, (36,))
    assert_fix(info.value)


def test_far_outputs_are_not_merged():
    big = MERGE_GAP + 4096
    buffers = [
        BufferDecl.read("a", 0, "u8", 4),
        BufferDecl.output("o1", 1, "u8", big, output_byte_range=(0, 16)),
        BufferDecl.output("o2", 2, "u8", 16),
        BufferDecl.output("o3", 3, "u8", 16),
    ]
    _, _, _, lay = plan(buffers, (4,))
    o1, o2, o3 = lay.arg_offsets[1:]
    # o1's 16 bytes are more than MERGE_GAP before o2; o2 and o3 are adjacent and merge
    assert lay.readbacks == ((o1, 16), (o2, o3 + 16 - o2))


# ---------------------------------------------------------------- Prepared (the C twin)
def prepared(prog, bplan, launch, lay, route=None):
    route = route or Route("regular", "test", launch.grid_blocks, 0)
    return Prepared.from_plan(assemble_plan(prog, DispatchConfig(), bplan, launch, lay, route))


def test_prepared_launch_geometry():
    prog, bplan, launch, lay = plan(MIXED, (1000, 12), DispatchConfig(workgroup_override=128))
    p = prepared(prog, bplan, launch, lay)
    assert p.launch_geometry() == ((8, 1, 1), (128, 1, 1), 32)
    assert (p.route_kind, p.slab_bytes_) == ("regular", lay.slab_bytes)


def many_outputs(n):
    buffers = [BufferDecl.output(f"o{i}", i, "u8", 1) for i in range(n)]
    return plan(buffers, ())


def test_prepared_takes_255_buffer_arguments():
    prog, bplan, launch, lay = many_outputs(255)
    assert len(lay.arg_offsets) == 255
    p = prepared(prog, bplan, launch, lay)
    assert p.launch_geometry() == ((1, 1, 1), (256, 1, 1), 0)


def test_prepared_refuses_256_buffer_arguments():
    prog, bplan, launch, lay = many_outputs(256)
    with pytest.raises(UnsupportedFeature) as info:
        prepared(prog, bplan, launch, lay)
    assert_fix(info.value)


def test_bucket_is_the_pool_bucket_of_the_slab():
    for n in (1, 1000, 300_000):
        lay = plan([BufferDecl.read("a", 0, "f64"), BufferDecl.output("o", 1, "f64")], (8 * n,))[3]
        assert lay.bucket_bytes == bucket_size(lay.slab_bytes) >= lay.slab_bytes >= 2 * 8 * n
        assert np.log2(lay.bucket_bytes).is_integer()  # small slabs: power-of-two buckets


# ---------------------------------------------------------------- params-only slab
def on_device(buffers, lengths, device_inputs, config=None):
    prog = Program(KERNEL, list(buffers))
    bplan = plan_bindings(prog, lengths)
    launch = plan_launch(prog, bplan, config or DispatchConfig(grid_override=1), CAPS)
    return plan_layout(bplan, launch, (None,), frozenset(device_inputs))


VEC = [BufferDecl.read("a", 0, "f32"), BufferDecl.read("b", 1, "f32"), BufferDecl.output("o", 2, "f32")]


@pytest.mark.parametrize("n", [1, 1000, 1 << 24])
def test_device_inputs_and_whole_outputs_need_only_the_params_blocks(n):
    lay = on_device(VEC, (4 * n, 4 * n), {0, 1})
    assert lay.params_offsets[0] == 0 and lay.params_only_bytes == params_end(lay)
    assert lay.params_only_bytes < lay.arg_offsets[2] <= lay.slab_bytes  # the output's region lies past them


@pytest.mark.parametrize(
    ("buffers", "lengths", "device_inputs", "why"),
    [
        (VEC, (4000, 4000), {1}, "a host input is uploaded"),
        (VEC, (4000, 4000), set(), "host inputs"),
        (
            [BufferDecl.read("a", 0, "f32"), BufferDecl.read_write("io", 1, "f32"), BufferDecl.output("o", 2, "f32")],
            (4000, 4000),
            {0, 1},
            "a read-write device input is copied into the slab",
        ),
        (
            [BufferDecl.read("a", 0, "f32"), BufferDecl.output("o", 1, "f32", 1000, output_byte_range=(0, 16))],
            (4000,),
            {0},
            "a byte range reads part of the slab's output",
        ),
        (VEC, (0, 0), {0, 1}, "an empty output"),
    ],
)
def test_no_params_only_slab_when_a_dispatch_needs_more(buffers, lengths, device_inputs, why):
    assert on_device(buffers, lengths, device_inputs).params_only_bytes == 0, why


def test_prepared_keeps_the_params_only_slab_for_the_plain_route_only():
    prog = Program(KERNEL, list(VEC))
    bplan = plan_bindings(prog, (4000, 4000))
    launch = plan_launch(prog, bplan, DispatchConfig(), CAPS)
    lay = plan_layout(bplan, launch, (None,), frozenset({0, 1}))
    assert prepared(prog, bplan, launch, lay).params_only_bucket == bucket_size(256)
    split = Route("split", "test", launch.grid_blocks, 0)
    assert prepared(prog, bplan, launch, lay, split).params_only_bucket == 0
    host = plan_layout(bplan, launch, (None,), frozenset({0}))
    assert prepared(prog, bplan, launch, host).params_only_bucket == 0


# ---------------------------------------------------------------- zeroed=False outputs
@pytest.mark.parametrize("n", [1000, 1 << 22])  # zeros in the upload, and a device memset
def test_outputs_declared_zeroed_false_lie_past_the_cleared_span(n):
    buffers = [
        BufferDecl.read("a", 0, "f32"),
        BufferDecl.output("full", 1, "f32", zeroed=False),
        BufferDecl.output("sparse", 2, "f32"),
    ]
    _, _, _, lay = plan(buffers, (4 * n,))
    full, sparse = lay.arg_offsets[1], lay.arg_offsets[2]
    begin, end = zeroed(lay)
    assert begin <= sparse and sparse + 4 * n <= end  # the zeroed output is cleared
    assert full >= end  # the other lies past the span, never cleared
    _, _, _, both = plan([buffers[0], dataclasses.replace(buffers[1], zeroed=True), buffers[2]], (4 * n,))
    assert zeroed(both)[1] - zeroed(both)[0] > end - begin
