"""The streamed route's planning (no device): the elementwise declaration, the config, the chunk
schedule, and the route decision in the frozen dispatch plan.

Plans are checked by executing them on the host: numpy memory stands in for the device block, the
schedule is replayed as the core will issue it (upload, clear, launch, readback per chunk, as many
chunks in flight as the plan has streams, each in its own slot), the kernels are numpy functions
reading their arguments and params words exactly as a CUDA kernel would, and the outputs must
equal numpy's on random data.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planning_fakes import stub_backend

import vyre_cuda as vc
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp
from vyre_cuda.config import as_config
from vyre_cuda.dask import program_key
from vyre_cuda.errors import DeviceOutOfMemory, InvalidProgram, ValidationError
from vyre_cuda.planning import stream
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.caps import DeviceCaps
from vyre_cuda.planning.launch import plan_launch
from vyre_cuda.planning.layout import plan_layout
from vyre_cuda.planning.stream import StreamDevice, StreamTuning, plan_stream

try:  # (split planning is moving out of group.py)
    from vyre_cuda.planning.split import plan_split
except ImportError:
    from vyre_cuda.group import plan_split

CAPS = DeviceCaps(name="faked H200", sm_count=132, total_memory=150_754_820_096, driver_version=13000)
KERNEL = Kernel.cuda('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main() {}\n')
NO_FILL = StreamDevice(free_memory=None, copy_engines=2, sm_count=1)  # chunks may be one block


def assert_fix(err: BaseException) -> None:
    last = str(err).splitlines()[-1]
    assert last.startswith("Fix: ") and last[5:].strip(), str(err)


def refused(kind, fn, *args, **kw):
    with pytest.raises(kind) as info:
        fn(*args, **kw)
    assert_fix(info.value)
    return info.value


# ------------------------------------------------------------------------------- programs
def axpb(**kw) -> Program:
    """out = coef[0] * x + y: two cut inputs, a static input broadcast to every chunk."""
    return Program(
        KERNEL,
        [
            BufferDecl.read("x", 0, "f32"),
            BufferDecl.read("y", 1, "f32"),
            BufferDecl.read("coef", 2, "f32", 1),
            BufferDecl.output("out", 3, "f32"),
        ],
        name="axpb",
        **{"elementwise": True, "workgroup_size": 1, **kw},
    )


def axpb_kernel(arg, words):
    n = words[0]
    arg("out")[:n] += arg("coef")[0] * arg("x")[:n] + arg("y")[:n]  # (+=: outputs start at zero)


def inplace(**kw) -> Program:
    """x += t (read-write, cut) with a runtime-sized table t passed whole (no pure outputs)."""
    return Program(
        KERNEL,
        [BufferDecl.read_write("x", 0, "i32"), BufferDecl.read("t", 1, "i32")],
        name="inplace",
        **{"elementwise": ["x"], "launch": "x", "workgroup_size": 1, **kw},
    )


def inplace_kernel(arg, words):
    n, t = words[0], arg("t")
    arg("x")[:n] += t.sum(dtype=np.int32)


def pairs(**kw) -> Program:
    """out[i] = x[2i] + x[2i+1] + y[i]: a cut binding of two elements per row (u16 -> u32)."""
    return Program(
        KERNEL,
        [BufferDecl.read("x", 0, "u16"), BufferDecl.read("y", 1, "u32"), BufferDecl.output("out", 2, "u32")],
        name="pairs",
        **{"elementwise": True, "launch": "y", "workgroup_size": 1, **kw},
    )


def pairs_kernel(arg, words):
    n = words[0]
    x = arg("x").astype(np.uint32)
    arg("out")[:n] = x[0 : 2 * n : 2] + x[1 : 2 * n : 2] + arg("y")[:n]


CASES = {
    "axpb": (axpb, axpb_kernel),
    "inplace": (inplace, inplace_kernel),
    "pairs": (pairs, pairs_kernel),
}


def case_inputs(name, rows, rng):
    if name == "axpb":
        return [rng.standard_normal(rows).astype(np.float32) for _ in range(2)] + [np.float32([rng.standard_normal()])]
    if name == "inplace":
        return [rng.integers(-1000, 1000, rows, dtype=np.int32), rng.integers(-9, 9, 5, dtype=np.int32)]
    return [rng.integers(0, 60000, 2 * rows, dtype=np.uint16), rng.integers(0, 1 << 30, rows, dtype=np.uint32)]


def numpy_outputs(name, inputs):
    if name == "axpb":
        x, y, coef = inputs
        return [coef[0] * x + y]
    if name == "inplace":
        x, t = inputs
        return [x + t.sum(dtype=np.int32)]
    x, y = inputs
    return [x[0::2].astype(np.uint32) + x[1::2] + y]


def planned(prog, inputs, config=None, *, device=NO_FILL, tuning=None, device_inputs=frozenset()):
    """plan_stream of a dispatch of ``prog`` on ``inputs`` (arrays, or byte lengths)."""
    cfg = as_config(config)
    lengths = [x if isinstance(x, int) else x.nbytes for x in inputs]
    bindings = plan_bindings(prog, lengths)
    launch = plan_launch(prog, bindings, cfg, CAPS)
    serial = plan_layout(bindings, launch).slab_bytes
    return plan_stream(
        prog,
        bindings,
        launch,
        cfg,
        CAPS,
        serial_bytes=serial,
        device=device,
        tuning=tuning,
        device_inputs=device_inputs,
    )


# ------------------------------------------------------------------------------- host executor
def run_on_host(plan, prog, inputs, kernel):
    """Execute ``plan`` as the core will, on numpy memory; return the outputs in declaration order."""
    assert plan.chunk_count >= 1 and 1 <= plan.streams <= plan.chunk_count
    dev = np.full(plan.device_bytes, 0xA5, np.uint8)  # garbage: a missed upload or clear shows
    host = [np.frombuffer(np.ascontiguousarray(x).tobytes(), np.uint8) for x in inputs]
    by_name = {b.name: b for b in plan.bindings}
    decls = {d.name: d for d in prog.buffers}
    outputs = {b.name: np.zeros(b.total_bytes, np.uint8) for b in plan.bindings if b.readback}
    for b in plan.bindings:  # the shared region, once: inputs that are not cut
        if not b.cut:
            assert b.upload and not b.readback, b
            dev[b.region_offset : b.region_offset + b.total_bytes] = host[b.input_index]
    for view in (plan.full, plan.last):
        raw = struct.pack(f"<{len(view.params)}I", *view.params)
        dev[view.params_offset : view.params_offset + len(raw)] = np.frombuffer(raw, np.uint8)

    def upload(chunk):
        for span in chunk.spans:
            b = by_name[span.name]
            region = dev[span.device_offset : span.device_offset + span.nbytes]
            if b.upload:
                region[:] = host[b.input_index][span.host_offset : span.host_offset + span.nbytes]
            if b.clear:
                region[:] = 0

    def launch(chunk):
        words = np.frombuffer(dev, np.uint32, len(chunk.launch.params), chunk.launch.params_offset)
        assert tuple(words) == chunk.launch.params
        pointer = {s.name: s.device_offset for s in chunk.spans}

        def arg(name):
            b, decl = by_name[name], decls[name]
            offset = pointer.get(name, b.region_offset)
            count = int(words[b.binding + 1])
            return np.frombuffer(dev, decl.dtype.numpy, count, offset)

        kernel(arg, words)

    def readback(chunk):
        for span in chunk.spans:
            if by_name[span.name].readback:
                outputs[span.name][span.host_offset : span.host_offset + span.nbytes] = dev[
                    span.device_offset : span.device_offset + span.nbytes
                ]

    # the pipeline: at most `streams` chunks in flight, the oldest advanced first, each in its slot
    waiting = collections.deque(plan.chunks())
    in_flight: collections.deque = collections.deque()
    while waiting or in_flight:
        for entry in list(in_flight):
            chunk, stage = entry
            (launch if stage == "uploaded" else readback)(chunk)
            entry[1] = "launched" if stage == "uploaded" else "done"
        while in_flight and in_flight[0][1] == "done":
            in_flight.popleft()
        if waiting and len(in_flight) < plan.streams:
            chunk = waiting.popleft()
            assert chunk.stream not in {c.stream for c, _ in in_flight}, "a slot reused while in flight"
            upload(chunk)
            in_flight.append([chunk, "uploaded"])
    return [outputs[d.name].view(d.dtype.numpy) for d in prog.outputs]


def check_invariants(plan, align):
    chunks = list(plan.chunks())
    assert len(chunks) == plan.chunk_count >= 1
    assert chunks[0].row_begin == 0 and chunks[-1].row_end == plan.rows
    for before, after in zip(chunks, chunks[1:]):
        assert before.row_end == after.row_begin  # in order, no gap, no overlap
    for c in chunks[:-1]:
        assert (c.row_end - c.row_begin) % align == 0 and c.row_end - c.row_begin == plan.chunk_rows
    assert 0 < chunks[-1].row_end - chunks[-1].row_begin <= plan.chunk_rows
    assert plan.device_bytes == plan.shared_bytes + plan.streams * plan.slot_bytes
    if plan.budget is not None:
        assert plan.device_bytes <= plan.budget
    cut = [b for b in plan.bindings if b.cut]
    for c in chunks:
        assert c.stream == c.index % plan.streams
        assert c.launch is (plan.last if c.index == plan.chunk_count - 1 else plan.full)
        rows = c.row_end - c.row_begin
        assert c.launch.rows == rows
        slot_base = plan.shared_bytes + c.stream * plan.slot_bytes
        regions = []
        for span, b in zip(c.spans, cut):
            assert span.name == b.name and span.count == rows * b.row_elements
            assert span.nbytes == span.count * b.itemsize <= b.region_bytes
            assert span.host_offset == c.row_begin * b.row_elements * b.itemsize
            assert span.device_offset == slot_base + b.region_offset and span.device_offset % 256 == 0
            assert c.launch.params[b.binding + 1] == span.count  # the kernel sees the chunk's count
            regions.append((span.device_offset, span.device_offset + b.region_bytes))
        for (_, end), (start, _) in zip(sorted(regions), sorted(regions)[1:]):
            assert end <= start
        assert all(slot_base <= lo and hi <= slot_base + plan.slot_bytes for lo, hi in regions)
    for b in plan.bindings:
        if not b.cut:  # whole, in the shared region, its whole count in every chunk's params
            assert b.region_offset + b.total_bytes <= plan.shared_bytes
            assert plan.full.params[b.binding + 1] == plan.last.params[b.binding + 1] == b.row_elements


# ------------------------------------------------------------------------------- declaration
def test_elementwise_true_cuts_every_runtime_sized_binding():
    p = axpb(align=4)
    assert (p.elementwise, p.align, p.elementwise_bindings) == (True, 4, ("x", "y", "out"))
    q = axpb(elementwise=["y", "x", "y"])  # names: given order and repeats do not matter
    assert q.elementwise == ("y", "x") and q.elementwise_bindings == ("x", "y", "out")
    r = inplace(elementwise="x")
    assert r.elementwise == ("x",) and r.elementwise_bindings == ("x",)  # t goes whole
    plain = bp.vecadd_f32()
    assert (plain.elementwise, plain.align, plain.elementwise_bindings) == (False, 1, ())
    assert Program(KERNEL, plain.buffers, elementwise=np.bool_(True)).elementwise is True


X, OUT = BufferDecl.read("x", 0, "f32"), BufferDecl.output("o", 1, "f32")


@pytest.mark.parametrize(
    ("buffers", "kw", "needle"),
    [
        ([X, OUT], {"grid_sync": True}, "grid_sync=True"),
        ([X, OUT], {"grid_sync": True, "phases": 3}, "phases=3"),
        ([X, BufferDecl.output("o", 1, "f32", 16)], {}, "count=16"),
        ([X, BufferDecl.output("o", 1, "f32", output_byte_range=(0, 8))], {}, "(0, 8)"),
        ([X, OUT], {"elementwise": ["x", "q"]}, "'q'"),
        ([X, BufferDecl.read("c", 2, "f32", 4), OUT], {"elementwise": ["x", "c"]}, "count=4"),
        ([BufferDecl.read("c", 0, "f32", 4), BufferDecl.read_write("w", 1, "f32", 4)], {}, "count=4"),
        ([BufferDecl.read("c", 0, "f32", 4), BufferDecl.output("o", 1, "f32")], {"elementwise": ["o"]}, "no runtime"),
        ([BufferDecl.read_write("x", 0, "f32"), BufferDecl.read("y", 1, "f32")], {"elementwise": ["y"]}, "'x'"),
        ([X, BufferDecl.read("y", 2, "f32"), OUT], {"elementwise": ["x"]}, "'y'"),
        ([X, BufferDecl.read("c", 2, "f32", 4), OUT], {"launch": "c"}, "launch='c'"),
        ([X, OUT], {"align": 0}, "align"),
        ([X, OUT], {"align": True}, "align"),
        ([X, OUT], {"align": 2.0}, "align"),
        ([X, OUT], {"elementwise": False, "align": 8}, "align=8"),
        ([X, OUT], {"elementwise": 1}, "int"),
        ([X, OUT], {"elementwise": ["x", 2]}, "list"),
    ],
)
def test_what_cannot_be_elementwise_is_refused_at_construction(buffers, kw, needle):
    kw = {"elementwise": True, **kw}
    err = refused(InvalidProgram, Program, KERNEL, buffers, **kw)
    assert needle in err.message, err.message


@pytest.mark.parametrize(
    ("buffers", "split"),
    [
        ([X, OUT], True),
        ([X, BufferDecl.read("c", 2, "f32", 4), OUT], True),
        ([X, BufferDecl.read("y", 2, "f32"), OUT], ["x", "y"]),
        ([X, BufferDecl.read("y", 2, "f32"), OUT], ["x"]),
        ([BufferDecl.read_write("x", 0, "f32"), BufferDecl.read("y", 1, "f32")], ["x"]),
        ([BufferDecl.read_write("x", 0, "f32"), BufferDecl.read("y", 1, "f32")], ["y"]),
        ([X, BufferDecl.output("o", 1, "f32", 16)], True),
        ([X, BufferDecl.output("o", 1, "f32", output_byte_range=(0, 8))], True),
        ([X, OUT], ["x", "nope"]),
        ([X, BufferDecl.read("c", 2, "f32", 4), OUT], ["c"]),
        ([X, OUT], ["o"]),
    ],
)
def test_the_declaration_means_what_dispatch_split_means(buffers, split):
    # the same declaration is accepted by both or refused by both, and cuts the same inputs
    plain = Program(KERNEL, buffers)
    arrays = [np.zeros(d.count or 8, d.dtype.numpy) for d in plain.inputs]
    try:
        split_plan = plan_split(plain, arrays, split)
    except ValidationError:
        split_plan = None
    try:
        declared = Program(KERNEL, buffers, elementwise=split)
    except InvalidProgram:
        declared = None
    assert (split_plan is None) == (declared is None), (split_plan, declared)
    if declared is not None:
        cut_inputs = [d.name for d, (kind, _) in zip(plain.inputs, split_plan.inputs) if kind == "split"]
        assert [n for n in declared.elementwise_bindings if n in cut_inputs] == sorted(
            cut_inputs, key=lambda n: next(d.binding for d in buffers if d.name == n)
        )
        assert {d.name for d in declared.outputs} <= set(declared.elementwise_bindings)


def test_the_declaration_is_part_of_the_program_identity():
    base = Program(KERNEL, [X, OUT])
    variants = [base, Program(KERNEL, [X, OUT], elementwise=True), Program(KERNEL, [X, OUT], elementwise=["x"])]
    variants.append(Program(KERNEL, [X, OUT], elementwise=True, align=4))
    identities = [p._identity() for p in variants]
    assert len(set(identities)) == len(identities)
    assert len({program_key(p) for p in variants}) == len(variants)
    again = Program(KERNEL, [X, OUT], elementwise=True, align=4)
    assert again._identity() == variants[-1]._identity() and program_key(again) == program_key(variants[-1])
    assert again == variants[-1] and len({again, variants[-1]}) == 1  # structural equality
    assert len(set(variants)) == len(variants)
    back = pickle.loads(pickle.dumps(again))
    assert (back.elementwise, back.align, back.elementwise_bindings) == (True, 4, ("x", "o"))
    assert dataclasses.replace(again, align=2).align == 2
    assert dataclasses.replace(again, elementwise=False, align=1).elementwise_bindings == ()


# ------------------------------------------------------------------------------- config
@pytest.mark.parametrize("value", ["yes", 1, 0, 1.0, [True]])
def test_streamed_must_be_a_bool_or_none(value):
    err = refused(ValidationError, DispatchConfig, streamed=value)
    assert repr(value) in err.message


@pytest.mark.parametrize("value", [0, -1, True, False, 1.5, "4096", 2**64, np.float32(8)])
def test_device_memory_budget_must_be_a_positive_int(value):
    err = refused(ValidationError, DispatchConfig, device_memory_budget=value)
    assert "device_memory_budget" in err.message


def test_config_values_are_stored_plainly():
    cfg = DispatchConfig(streamed=np.bool_(False), device_memory_budget=np.int64(1 << 20))
    assert cfg.streamed is False and type(cfg.device_memory_budget) is int
    assert cfg == DispatchConfig(streamed=False, device_memory_budget=1 << 20)
    assert as_config({"streamed": None, "device_memory_budget": 4096}).device_memory_budget == 4096
    assert DispatchConfig().streamed is None and DispatchConfig().device_memory_budget is None


def test_streamed_true_is_accepted():
    assert DispatchConfig(streamed=True).streamed is True


# ------------------------------------------------------------------------------- the schedule
def tuning_for(rows_per_chunk, itemsize, **kw):
    return StreamTuning(chunk_bytes=rows_per_chunk * itemsize, **kw)


@pytest.mark.parametrize(("rows", "chunks", "last"), [(1000, 1, 1000), (999, 1, 999), (1001, 2, 1), (3000, 3, 1000)])
def test_chunk_boundaries_one_short_of_and_one_past_a_chunk(rows, chunks, last, rng):
    prog = axpb()
    inputs = case_inputs("axpb", rows, rng)
    plan = planned(prog, inputs, DispatchConfig(streamed=True), tuning=tuning_for(1000, 4))
    assert plan.streamed and (plan.chunk_rows, plan.chunk_count) == (min(rows, 1000), chunks)
    assert plan.last.rows == last and plan.last.element_count == last and plan.full.element_count == plan.chunk_rows
    check_invariants(plan, 1)
    for got, want in zip(run_on_host(plan, prog, inputs, axpb_kernel), numpy_outputs("axpb", inputs)):
        np.testing.assert_array_equal(got, want)


def test_one_element_chunks(rng):
    prog = axpb()  # (a chunk covers at least one block; these programs' blocks are one thread)
    inputs = case_inputs("axpb", 7, rng)
    plan = planned(prog, inputs, DispatchConfig(streamed=True), tuning=tuning_for(1, 4))
    assert (plan.chunk_rows, plan.chunk_count, plan.streams) == (1, 7, 3)
    assert plan.full.grid == (1, 1, 1) and plan.full.params[:5] == (1, 1, 1, 1, 1)
    check_invariants(plan, 1)
    np.testing.assert_array_equal(run_on_host(plan, prog, inputs, axpb_kernel)[0], numpy_outputs("axpb", inputs)[0])


@pytest.mark.parametrize(("align", "want"), [(1, 100), (3, 99), (64, 64), (128, 128), (5000, 4321)])
def test_align_rounds_chunks_down_to_whole_multiples(align, want, rng):
    prog = axpb(align=align)
    inputs = case_inputs("axpb", 4321, rng)
    plan = planned(prog, inputs, DispatchConfig(streamed=True), tuning=tuning_for(100, 4))
    assert plan.chunk_rows == want and plan.align == align
    check_invariants(plan, align)
    np.testing.assert_array_equal(run_on_host(plan, prog, inputs, axpb_kernel)[0], numpy_outputs("axpb", inputs)[0])


def test_static_inputs_go_whole_to_every_chunk_uploaded_once(rng):
    prog = axpb()
    inputs = case_inputs("axpb", 5000, rng)
    plan = planned(prog, inputs, DispatchConfig(streamed=True), tuning=tuning_for(512, 4))
    coef = next(b for b in plan.bindings if b.name == "coef")
    assert not coef.cut and coef.region_offset < plan.shared_bytes and coef.total_bytes == 4
    assert all("coef" not in {s.name for s in c.spans} for c in plan.chunks())
    assert {c.launch.params[coef.binding + 1] for c in plan.chunks()} == {1}
    # uploaded: the cut inputs once in total, the static input and the params blocks once
    assert plan.h2d_bytes == 2 * 5000 * 4 + 4 + 4 * len(plan.full.params) * 2
    assert plan.d2h_bytes == 5000 * 4
    np.testing.assert_array_equal(run_on_host(plan, prog, inputs, axpb_kernel)[0], numpy_outputs("axpb", inputs)[0])


def test_read_write_bindings_go_in_and_out_of_the_same_chunk(rng):
    prog = inplace()
    inputs = case_inputs("inplace", 3333, rng)
    plan = planned(prog, inputs, DispatchConfig(streamed=True), tuning=tuning_for(256, 4))
    x = next(b for b in plan.bindings if b.name == "x")
    t = next(b for b in plan.bindings if b.name == "t")
    assert x.cut and x.upload and x.readback and not x.clear
    assert not t.cut and t.row_elements == 5  # runtime-sized, not named: whole, its whole count
    assert plan.staging_upload_bytes == plan.staging_readback_bytes == x.region_bytes
    got = run_on_host(plan, prog, inputs, inplace_kernel)
    np.testing.assert_array_equal(got[0], numpy_outputs("inplace", inputs)[0])


def test_rows_of_several_elements(rng):
    prog = pairs()
    inputs = case_inputs("pairs", 2049, rng)
    plan = planned(prog, inputs, DispatchConfig(streamed=True), tuning=tuning_for(300, 4))
    widths = {b.name: b.row_elements for b in plan.bindings}
    assert widths == {"x": 2, "y": 1, "out": 1} and plan.rows == 2049
    assert plan.full.element_count == plan.chunk_rows  # launch='y': the chunk's y count
    check_invariants(plan, 1)
    np.testing.assert_array_equal(run_on_host(plan, prog, inputs, pairs_kernel)[0], numpy_outputs("pairs", inputs)[0])


NO_FLOOR = StreamTuning(min_chunk_bytes=0)  # the budget may cut chunks down to `align` rows


def test_a_budget_below_one_chunk_names_the_bytes_needed(rng):
    prog = axpb(align=16)
    inputs = case_inputs("axpb", 10_000, rng)
    cfg = DispatchConfig(streamed=True, device_memory_budget=1000)
    err = refused(ValidationError, planned, prog, inputs, cfg, tuning=NO_FLOOR)
    needed = int(err.message.split(" device bytes are needed")[0].rsplit(" ", 1)[-1].replace(",", ""))
    assert "16 row(s)" in err.message and "device_memory_budget >=" in err.fix and "align" in err.fix
    plan = planned(prog, inputs, DispatchConfig(streamed=True, device_memory_budget=needed), tuning=NO_FLOOR)
    # (regions are 256-byte aligned: the largest multiple of 16 rows in the same bytes is taken)
    assert plan.device_bytes == needed and plan.chunk_rows % 16 == 0 and plan.streams == 1
    assert plan.slot_bytes == 3 * 256 and plan.chunk_rows == 64
    cfg = DispatchConfig(streamed=True, device_memory_budget=needed - 1)
    refused(ValidationError, planned, prog, inputs, cfg, tuning=NO_FLOOR)


def smallest_budget(err) -> int:
    """The smallest working budget a refusal names (its Fix: line)."""
    assert err.fix.startswith("pass device_memory_budget >= ") and err.fix.endswith(", or None"), err.fix
    return int(err.fix.split(">= ")[1].removesuffix(", or None").replace(",", ""))


def moved_per_row(plan) -> int:
    return sum(b.row_elements * b.itemsize * (b.upload + b.readback) for b in plan.bindings if b.cut)


VECADD_256 = [256 << 20, 256 << 20]  # 3 x 256 MiB f32: 512 MiB up, 256 MiB back


@pytest.mark.parametrize(("budget", "chunks"), [(4 << 20, 577), (256 << 10, 9280), (4096, 1 << 20)])
def test_a_budget_that_forces_chunks_below_the_minimum_is_refused(budget, chunks):
    prog = vecadd(elementwise=True)
    for streamed in (None, True):  # (over the 768 MiB serial slab: the dispatch must stream)
        err = refused(
            ValidationError, planned, prog, VECADD_256, {"streamed": streamed, "device_memory_budget": budget}
        )
        assert f"device_memory_budget={budget:,})" in err.message and f"into {chunks:,} chunks" in err.message
        smallest = smallest_budget(err)
        assert f"smallest budget that works for this dispatch is {smallest:,} bytes" in err.message
        # each chunk of the smallest budget moves at least STREAM_MIN_CHUNK_BYTES, on every stream
        plan = planned(prog, VECADD_256, {"streamed": streamed, "device_memory_budget": smallest})
        assert plan.streamed and plan.device_bytes <= smallest and plan.streams == stream.STREAM_COUNT
        assert plan.chunk_rows * moved_per_row(plan) >= stream.STREAM_MIN_CHUNK_BYTES
        assert f"{plan.chunk_count:,} chunk(s) of {plan.chunk_rows:,} row(s)" in err.message
        check_invariants(plan, 1)
        below = refused(
            ValidationError, planned, prog, VECADD_256, {"streamed": streamed, "device_memory_budget": smallest - 1}
        )
        assert smallest_budget(below) == smallest
    # the smallest budget is the model's, and a budget of 64 MiB streams as before
    assert smallest == 12_584_960 and plan.chunk_count == 192
    big = planned(prog, VECADD_256, DispatchConfig(device_memory_budget=64 << 20))
    assert big.streamed and big.device_bytes <= 64 << 20 and big.chunk_count == 37


def test_the_minimum_chunk_is_a_tuning_constant(rng):
    prog = axpb()
    inputs = case_inputs("axpb", 10_000, rng)  # 120,000 bytes moved in all
    cfg = DispatchConfig(streamed=True, device_memory_budget=40_000)
    small = planned(prog, inputs, cfg, tuning=StreamTuning(min_chunk_bytes=1000))
    assert small.chunk_rows * 12 >= 1000 and small.device_bytes <= 40_000 and small.streams == 3
    check_invariants(small, 1)
    np.testing.assert_array_equal(run_on_host(small, prog, inputs, axpb_kernel)[0], numpy_outputs("axpb", inputs)[0])
    err = refused(ValidationError, planned, prog, inputs, cfg, tuning=StreamTuning(min_chunk_bytes=20_000))
    assert "move at least 20,000 bytes" in err.message and smallest_budget(err) > 40_000
    for bad in (-1, True, 2.0):
        refused(ValidationError, StreamTuning, min_chunk_bytes=bad)
    assert StreamTuning().min_chunk_bytes == stream.STREAM_MIN_CHUNK_BYTES == 4 << 20


def test_a_dispatch_smaller_than_the_minimum_chunk_goes_in_one_chunk(rng):
    prog = axpb()
    inputs = case_inputs("axpb", 10_000, rng)  # 120,000 bytes moved: under the minimum chunk
    plan = planned(prog, inputs, DispatchConfig(streamed=True, device_memory_budget=1 << 20))
    assert plan.streamed and (plan.chunk_count, plan.streams) == (1, 1)  # no budget pressure: as before
    serial = planned(prog, inputs, DispatchConfig(device_memory_budget=1 << 20))
    assert serial.route == "serial" and serial.chunk_count == 1
    # a budget that would cut it into chunks is refused when it must stream, with the one chunk's bytes
    err = refused(ValidationError, planned, prog, inputs, DispatchConfig(streamed=True, device_memory_budget=50_000))
    assert "in all must go in one chunk" in err.message
    smallest = smallest_budget(err)
    one = planned(prog, inputs, DispatchConfig(streamed=True, device_memory_budget=smallest))
    assert (one.chunk_count, one.streams, one.chunk_rows, one.device_bytes) == (1, 1, 10_000, smallest)
    np.testing.assert_array_equal(run_on_host(one, prog, inputs, axpb_kernel)[0], numpy_outputs("axpb", inputs)[0])
    refused(ValidationError, planned, prog, inputs, DispatchConfig(streamed=True, device_memory_budget=smallest - 1))
    # not forced and the serial slab fits the budget: the serial route, not a refusal
    keeps = planned(prog, inputs, DispatchConfig(device_memory_budget=smallest - 1))
    assert keeps.route == "serial" and "fewer than" in keeps.reason


def test_a_dispatch_of_a_few_minimum_chunks_takes_the_cheaper_of_one_chunk_and_full_slots():
    # 1.5 minimum chunks of rows: one chunk on one stream holds less than three minimum slots
    prog = vecadd(elementwise=True)
    least = -(-stream.STREAM_MIN_CHUNK_BYTES // 12)
    for rows, one in ((least * 3 // 2, True), (least * 4, False)):
        lengths = [4 * rows] * 2
        err = refused(ValidationError, planned, prog, lengths, {"streamed": True, "device_memory_budget": 1 << 20})
        smallest = smallest_budget(err)
        plan = planned(prog, lengths, {"streamed": True, "device_memory_budget": smallest})
        if one:
            assert (plan.chunk_count, plan.streams, plan.chunk_rows) == (1, 1, rows) and smallest < 3 * least * 12
        else:
            assert plan.streams == 3 and plan.chunk_count == 4 and plan.chunk_rows >= least
        check_invariants(plan, 1)
        refused(ValidationError, planned, prog, lengths, {"streamed": True, "device_memory_budget": smallest - 1})


def test_free_device_memory_too_small_for_one_chunk_is_out_of_memory(rng):
    prog = axpb()
    inputs = case_inputs("axpb", 10_000, rng)
    err = refused(DeviceOutOfMemory, planned, prog, inputs, device=StreamDevice(free_memory=600, sm_count=1))
    assert err.status == "budget" and "600" in err.message


def test_a_dispatch_over_free_memory_streams_instead_of_failing(rng):
    prog = axpb()
    inputs = [1 << 30, 1 << 30, 4]  # byte lengths: 2 GiB in, 1 GiB out
    plan = planned(prog, inputs, device=StreamDevice(free_memory=100 << 20))
    assert plan.streamed and "over the" in plan.reason and plan.device_bytes <= 100 << 20
    assert plan.rows == 1 << 28 and plan.chunk_rows == 2 << 20 and plan.streams == 3  # 8 MiB chunks
    check_invariants(plan, 1)


def test_small_dispatches_keep_the_serial_route(rng):
    prog = axpb(workgroup_size=256)
    small = planned(prog, [4 << 20, 4 << 20, 4], device=CAPS_DEVICE)
    assert small.route == "serial" and "< 2" in small.reason and small.chunk_count == 1
    big = planned(prog, [64 << 20, 64 << 20, 4], device=CAPS_DEVICE)
    assert big.streamed and big.chunk_count == 8 and big.full.grid == (8192, 1, 1)
    assert big.staging_slots == big.streams == 3
    assert big.staging_upload_bytes == 2 * (8 << 20) and big.staging_readback_bytes == 8 << 20
    forbidden = planned(prog, [64 << 20, 64 << 20, 4], DispatchConfig(streamed=False), device=CAPS_DEVICE)
    assert forbidden.route == "serial" and forbidden.reason == "DispatchConfig(streamed=False)"
    forced = planned(prog, [4 << 20, 4 << 20, 4], DispatchConfig(streamed=True), device=CAPS_DEVICE)
    assert forced.streamed and forced.chunk_count == 1 and forced.streams == 1


CAPS_DEVICE = StreamDevice.from_caps(CAPS)


def test_the_device_shapes_streams_and_chunks(rng):
    prog = axpb(workgroup_size=256)
    lengths = [64 << 20, 64 << 20, 4]
    one_engine = planned(prog, lengths, device=StreamDevice(None, copy_engines=1, sm_count=132))
    no_engine = planned(prog, lengths, device=StreamDevice(None, copy_engines=0, sm_count=132))
    assert (one_engine.streams, no_engine.streams) == (2, 1)
    # a chunk covers at least one wave of blocks over the SMs: 132 SMs x 256 threads
    tiny = planned(prog, lengths, device=StreamDevice(None, sm_count=132), tuning=StreamTuning(chunk_bytes=1024))
    assert tiny.chunk_rows == 132 * 256


@pytest.mark.parametrize(
    ("config", "device_inputs", "needle"),
    [
        ({"cooperative": True}, (), "cooperative"),
        ({"grid_override": 64}, (), "grid_override"),
        ({"elements": 100}, (), "elements"),
        ({"outputs": "device"}, (), "outputs='device'"),
        ({"graph": True}, (), "graph=True"),
        ({}, (0,), "device memory"),
    ],
)
def test_what_keeps_an_elementwise_dispatch_serial(config, device_inputs, needle):
    prog = axpb()
    lengths = [64 << 20, 64 << 20, 4]
    plan = planned(prog, lengths, config, device=CAPS_DEVICE, device_inputs=frozenset(device_inputs))
    assert plan.route == "serial" and needle in plan.reason
    err = refused(
        ValidationError,
        planned,
        prog,
        lengths,
        {**config, "streamed": True},
        device=CAPS_DEVICE,
        device_inputs=frozenset(device_inputs),
    )
    assert needle in err.message


def test_streamed_true_needs_an_elementwise_program():
    err = refused(ValidationError, planned, bp.vecadd_f32(), [4096, 4096], DispatchConfig(streamed=True))
    assert "not declared elementwise" in err.message and "elementwise=True" in err.fix
    assert planned(bp.vecadd_f32(), [4096, 4096]).reason.endswith("not declared elementwise")


def test_a_launch_larger_than_the_chunk_is_not_streamed():
    # the default rule with workgroup buffers sizes the launch by the largest binding: here a
    # static table larger than a chunk, so a chunk's threads would run past the chunk's rows
    prog = Program(
        KERNEL,
        [
            BufferDecl.read("x", 0, "f32"),
            BufferDecl.read("table", 1, "f32", 5000),
            BufferDecl.output("o", 2, "f32"),
            BufferDecl.workgroup("s", 3, "f32", 64),
        ],
        elementwise=True,
    )
    lengths = [40_000, 20_000]
    plan = planned(prog, lengths, tuning=tuning_for(1000, 4))
    assert plan.route == "serial" and "run past" in plan.reason
    refused(ValidationError, planned, prog, lengths, DispatchConfig(streamed=True), tuning=tuning_for(1000, 4))
    assert planned(prog, lengths, tuning=tuning_for(5000, 4)).streamed  # chunks as large as the table


def test_rows_need_whole_elements_per_row():
    prog = pairs()
    plan = planned(prog, [2 * 7, 4 * 3])  # x: 7 u16, y: 3 u32 -> out 3: 7 is no multiple of 3
    assert plan.route == "serial" and "share no row" in plan.reason


def test_tuning_constants_are_validated():
    for bad in (0, -1, True, 2.0):
        refused(ValidationError, StreamTuning, chunk_bytes=bad)
    assert StreamTuning() == StreamTuning(stream.STREAM_CHUNK_BYTES, stream.STREAM_MIN_CHUNKS, stream.STREAM_COUNT)


# ------------------------------------------------------------------------------- properties
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    case=st.sampled_from(sorted(CASES)),
    rows=st.integers(1, 3000),
    align=st.integers(1, 40),
    chunk_rows=st.integers(1, 700),
    streams=st.integers(1, 4),
    engines=st.integers(0, 3),
    budget=st.one_of(st.none(), st.integers(256, 200_000)),
    min_chunk=st.sampled_from([0, 1, 100, 2_000, 30_000, 1 << 22]),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_plan_tiles_the_rows_fits_the_budget_and_computes_what_numpy_does(
    case, rows, align, chunk_rows, streams, engines, budget, min_chunk, seed
):
    make, kernel = CASES[case]
    prog = make(align=align)
    inputs = case_inputs(case, rows, np.random.default_rng(seed))
    cfg = DispatchConfig(streamed=True, device_memory_budget=budget)
    tuning = StreamTuning(chunk_bytes=chunk_rows * 4, streams=streams, min_chunk_bytes=min_chunk)
    device = StreamDevice(None, copy_engines=engines, sm_count=1)
    try:
        plan = planned(prog, inputs, cfg, tuning=tuning, device=device)
    except ValidationError as err:
        assert budget is not None and "too small" in err.message
        if not min_chunk:  # only a budget below one chunk of `align` rows on one stream, exactly
            needed = int(err.message.split(" device bytes are needed")[0].rsplit(" ", 1)[-1].replace(",", ""))
            assert needed > budget
            enough = dataclasses.replace(cfg, device_memory_budget=needed)
            assert planned(prog, inputs, enough, tuning=tuning, device=device).device_bytes <= needed
            return
        # a budget below the chunk floor: the smallest budget it names works, one byte less does not
        smallest = smallest_budget(err)
        assert smallest > budget
        enough = planned(
            prog, inputs, dataclasses.replace(cfg, device_memory_budget=smallest), tuning=tuning, device=device
        )
        assert enough.device_bytes <= smallest
        short = dataclasses.replace(cfg, device_memory_budget=smallest - 1)
        assert (
            smallest_budget(refused(ValidationError, planned, prog, inputs, short, tuning=tuning, device=device))
            == smallest
        )
        return
    assert plan.streamed and plan.streams <= min(streams, plan.chunk_count)
    if budget is not None and min_chunk:
        # the floor: each chunk moves min_chunk bytes, or is the largest chunk the tuning asks for
        # (all rows at most), and the streams are not cut below the chunks that could be in flight
        target = min(rows, max(align, chunk_rows // align * align))
        assert plan.chunk_rows * moved_per_row(plan) >= min_chunk or plan.chunk_rows == target, plan
        assert plan.streams == min({0: 1, 1: min(streams, 2)}.get(engines, streams), plan.chunk_count), plan
    check_invariants(plan, align)
    for got, want in zip(run_on_host(plan, prog, inputs, kernel), numpy_outputs(case, inputs)):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------- the dispatch plan
@pytest.fixture
def backend(monkeypatch):
    """A CudaBackend on fakes of the driver calls planning makes, on a device of 64 MiB."""
    caps = dataclasses.replace(CAPS, total_memory=64 << 20)
    free_reads = []  # each cuMemGetInfo the planner makes (its answer: 48 MiB free unless changed)

    def mem_get_info():
        free_reads.append(free_reads[-1] if free_reads else 48 << 20)
        return free_reads[-1], 64 << 20

    b = stub_backend(
        monkeypatch, caps, mem_get_info=mem_get_info, load_module=lambda image, entry, want_barrier: (0, 0, 0, 4)
    )
    b.free_reads = free_reads
    yield b
    b.close()


def vecadd(**kw) -> Program:
    plain = bp.vecadd_f32()
    return Program(plain.kernel, plain.buffers, name="vecadd", **kw)


def test_plan_info_routes_a_dispatch_over_device_memory_streamed(backend):
    a = np.zeros(12 << 20, np.float32)  # 3 x 48 MiB: over 90% of the 64 MiB device
    info = backend.plan_info(vecadd(elementwise=True), [a, a])
    assert info.route.kind == "streamed" and info.stream.streamed and info.route.reason == info.stream.reason
    budget = (48 << 20) - (48 << 20) // 10  # 90% of free memory (under 90% of the 64 MiB total)
    assert info.stream.budget == budget and info.stream.device_bytes <= budget
    assert info.stream.streams == 3 and info.stream.chunk_rows < 2 << 20 < 12 << 20  # shrunk to fit
    assert info.graph is False and info.graph_trial is False
    # the core's prepared plan runs it chunk by chunk
    prep = backend._plan(info.program, (a.nbytes, a.nbytes), None)
    assert prep.route_kind == "streamed" and prep.chunk_count == info.stream.chunk_count > 1
    small = backend.plan_info(vecadd(elementwise=True), [a[:1000], a[:1000]])
    assert small.route.kind == "regular" and small.stream.route == "serial"


def test_free_memory_is_read_when_an_elementwise_plan_is_made(backend):
    a = np.zeros(1 << 20, np.float32)  # 12 MiB in all: serial while 12 MiB fit the budget
    assert backend.plan_info(vecadd(), [a, a]).stream is None
    assert backend.plan_info(vecadd(elementwise=True), [a, a], DispatchConfig(streamed=False)).stream.route == "serial"
    assert backend.free_reads == []  # neither plan needed it
    info = backend.plan_info(vecadd(elementwise=True), [a, a])
    assert backend.free_reads == [48 << 20] and info.route.kind == "regular"
    assert info.stream.budget == (48 << 20) - (48 << 20) // 10
    backend.free_reads.append(8 << 20)  # another process took memory: the next plan sees it
    info = backend.plan_info(vecadd(elementwise=True), [a, a])
    assert info.stream.budget == (8 << 20) - (8 << 20) // 10 and info.route.kind == "streamed"
    assert info.stream.device_bytes <= info.stream.budget < 12 << 20


def test_the_device_facts_shape_the_planner_device():
    engines = StreamDevice.from_caps(dataclasses.replace(CAPS, copy_engines=1))
    assert (engines.copy_engines, engines.sm_count) == (1, 132)
    total = CAPS.total_memory
    assert StreamDevice.from_caps(CAPS).free_memory == total - total // 10  # free memory unknown
    assert StreamDevice.from_caps(CAPS, free_memory=10_000).free_memory == 9_000
    assert StreamDevice.from_caps(CAPS, free_memory=total).free_memory == total - total // 10
    assert StreamDevice.from_caps(dataclasses.replace(CAPS, total_memory=0)).free_memory is None


def test_device_memory_budget_bounds_a_serial_dispatch(backend):
    a = np.zeros(1 << 16, np.float32)
    err = refused(DeviceOutOfMemory, backend.plan_info, vecadd(), [a, a], DispatchConfig(device_memory_budget=1 << 16))
    assert "device_memory_budget=65,536" in err.message and err.status == "budget"
    assert backend.plan_info(vecadd(), [a, a], DispatchConfig(device_memory_budget=1 << 20)).route.kind == "regular"


def test_device_memory_budget_streams_an_elementwise_dispatch(backend):
    a = np.zeros(1 << 22, np.float32)  # 3 x 16 MiB
    info = backend.plan_info(vecadd(elementwise=True), [a, a], DispatchConfig(device_memory_budget=16 << 20))
    assert info.route.kind == "streamed" and info.stream.device_bytes <= 16 << 20
    assert info.stream.chunk_rows * 12 * info.stream.streams <= 16 << 20
    assert info.stream.chunk_rows * 12 >= stream.STREAM_MIN_CHUNK_BYTES and info.stream.streams == 3


def test_the_budget_refusal_is_the_same_offline_and_in_a_dispatch(backend):
    prog = vecadd(elementwise=True)
    a = np.zeros(1 << 26, np.float32)  # 3 x 256 MiB (zero pages: nothing is touched)
    specs = [vc.ArraySpec(1 << 26, "f4")] * 2
    for budget in (4 << 20, 12_584_959):
        cfg = DispatchConfig(device_memory_budget=budget)
        online = refused(ValidationError, backend.plan_info, prog, [a, a], cfg)
        offline = refused(ValidationError, vc.plan, prog, specs, cfg, device="H200")
        assert str(online) == str(offline) == str(refused(ValidationError, planned, prog, VECADD_256, cfg))
        assert smallest_budget(online) == 12_584_960
    cfg = DispatchConfig(device_memory_budget=12_584_960)
    online, offline = backend.plan_info(prog, [a, a], cfg), vc.plan(prog, specs, cfg, device="H200")
    assert online.stream == offline.stream and online.route.kind == offline.route.kind == "streamed"
    assert online.stream.device_bytes <= 12_584_960 and online.stream.chunk_count == 192


def test_an_output_declared_zeroed_false_is_not_cleared_per_chunk(rng):
    prog = axpb()
    x, y, coef, out = prog.buffers
    full = dataclasses.replace(prog, buffers=(x, y, coef, dataclasses.replace(out, zeroed=False)))
    inputs = case_inputs("axpb", 3000, rng)
    for program, clear in ((prog, True), (full, False)):
        plan = planned(program, inputs, DispatchConfig(streamed=True), tuning=tuning_for(1000, 4))
        (o,) = (b for b in plan.bindings if b.name == "out")
        assert plan.streamed and o.cut and o.readback and o.clear is clear
        # the kernel writes every row: right either way (run_on_host fills memory with garbage)
        np.testing.assert_array_equal(
            run_on_host(plan, program, inputs, axpb_kernel)[0], numpy_outputs("axpb", inputs)[0]
        )
