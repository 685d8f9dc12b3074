"""Planning without a device: binding plans, launch geometry, params words, capabilities, routing."""

from __future__ import annotations

import dataclasses
import pickle
import warnings

import pytest

from vyre_cuda.config import DispatchConfig
from vyre_cuda.errors import (
    CooperativeResidencyExceeded,
    InvalidProgram,
    UnsupportedFeature,
    ValidationError,
)
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.caps import DeviceCaps, check_capabilities, missing_capabilities
from vyre_cuda.planning.launch import (
    LaunchPlan,
    barrier_ceiling,
    params_words,
    plan_launch,
    resident_limit,
    route_grid_sync,
)
from vyre_cuda.program import BindingRole, BufferDecl, Kernel, LaunchSizeWarning, Program

R = BindingRole
KERNEL = Kernel.cuda('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const vyre_u32* p) {}\n')
# a small hand-built device, so every limit is easy to reach
CAPS = DeviceCaps(
    name="test-device",
    cc=(8, 0),
    sm_count=4,
    max_threads_per_block=1024,
    max_block_dim=(1024, 1024, 64),
    max_grid_dim=(1000, 10, 10),
    max_shared_per_block_optin=100_000,
    max_threads_per_sm=2048,
    max_blocks_per_sm=16,
)


def assert_fix(err: BaseException) -> None:
    last = str(err).splitlines()[-1]
    assert last.startswith("Fix: ") and last[5:].strip(), str(err)


def raises(exc_type, fn, *args, **kwargs):
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    assert_fix(info.value)
    return info.value


def program(*buffers, **kw) -> Program:
    return Program(KERNEL, list(buffers), **kw)


def caps(**kw) -> DeviceCaps:
    return dataclasses.replace(CAPS, **kw)


def launch_of(prog, lengths, config=None, device=CAPS):
    bplan = plan_bindings(prog, lengths)
    return bplan, plan_launch(prog, bplan, config or DispatchConfig(), device)


def vecadd(dtype="u32", **kw) -> Program:
    return program(
        BufferDecl.read("a", 0, dtype), BufferDecl.read("b", 1, dtype), BufferDecl.output("out", 2, dtype), **kw
    )


# ================================================================ binding plan
@pytest.mark.parametrize("lengths", [(), (16,), (16, 16, 16)])
def test_input_count_is_exact(lengths):
    raises(ValidationError, plan_bindings, vecadd(), lengths)


@pytest.mark.parametrize(("dtype", "nbytes"), [("u16", 3), ("u32", 6), ("f64", 12), ("i64", 1)])
def test_input_length_must_be_whole_elements(dtype, nbytes):
    raises(ValidationError, plan_bindings, vecadd(dtype), (nbytes, 8 * 4))


def test_static_input_length_is_exact():
    prog = program(BufferDecl.read("a", 0, "u32", 4), BufferDecl.output("o", 1, "u32", 4))
    assert plan_bindings(prog, (16,)).slots[0].count == 4
    for nbytes in (12, 20, 0):
        raises(ValidationError, plan_bindings, prog, (nbytes,))


def test_runtime_outputs_take_the_runtime_input_count():
    prog = program(
        BufferDecl.read("a", 0, "u32"),
        BufferDecl.read("big_static", 1, "u8", 1000),
        BufferDecl.read("b", 2, "u16"),
        BufferDecl.output("o", 3, "f64"),
    )
    bplan = plan_bindings(prog, (25 * 4, 1000, 25 * 2))
    assert bplan.runtime_count == 25
    assert bplan.runtime_inputs == (("a", 25), ("b", 25))
    assert [(s.decl.name, s.count, s.byte_len) for s in bplan.slots] == [
        ("a", 25, 100),
        ("big_static", 1000, 1000),
        ("b", 25, 50),
        ("o", 25, 200),
    ]


def test_ragged_runtime_inputs_are_refused_by_default():
    # vecadd with a of 1000 and b of 10 elements used to launch 1000 threads reading b[10..999]
    err = raises(ValidationError, plan_bindings, vecadd("f32"), (1000 * 4, 10 * 4))
    assert "'a' (1000 elements)" in err.message and "'b' (10 elements)" in err.message
    assert "launch=" in err.fix
    # a static input of another length is no runtime-sized input: no refusal
    prog = program(BufferDecl.read("a", 0, "u32"), BufferDecl.read("t", 1, "u32", 7), BufferDecl.output("o", 2, "u32"))
    assert plan_bindings(prog, (40, 28)).runtime_count == 10


def test_a_declared_launch_binding_allows_ragged_inputs():
    gather = [BufferDecl.read("idx", 0, "u32"), BufferDecl.read("table", 1, "f32"), BufferDecl.output("out", 2, "f32")]
    bplan = plan_bindings(program(*gather, launch="idx"), (4 * 10, 4 * 1000))
    assert bplan.runtime_count == 10  # runtime outputs take the launch binding's count
    assert {s.decl.name: s.count for s in bplan.slots} == {"idx": 10, "table": 1000, "out": 10}
    # the launch binding is the output: its length cannot be chosen between 10 and 1000
    err = raises(ValidationError, plan_bindings, program(*gather, launch="out"), (4 * 10, 4 * 1000))
    assert "'out'" in err.message and "'idx': 10" in err.message and "'table': 1000" in err.message
    # a static output under a callable rule needs no runtime count
    static = [BufferDecl.read("x", 0, "u8"), BufferDecl.read("y", 1, "u8"), BufferDecl.output("h", 2, "u32", 256)]
    bplan = plan_bindings(program(*static, launch=lambda n: n["x"] + n["y"]), (5, 9))
    assert [s.count for s in bplan.slots] == [5, 9, 256]


def test_runtime_output_without_runtime_input():
    prog = program(BufferDecl.read("a", 0, "u32", 4), BufferDecl.output("o", 1, "u32"))
    raises(InvalidProgram, plan_bindings, prog, (16,))
    raises(InvalidProgram, plan_bindings, program(BufferDecl.output("o", 0, "u32")), ())


def test_persistent_buffer_is_refused():
    prog = program(BufferDecl.read("a", 0, "u32"), BufferDecl("p", 1, "read_write", "u32", 4, persistent=True))
    raises(UnsupportedFeature, plan_bindings, prog, (16,))


def test_slots_in_binding_order_outputs_in_declaration_order():
    prog = program(
        BufferDecl.output("o_b9", 9, "u32", 2),
        BufferDecl.read("in_b4", 4, "u32"),
        BufferDecl.workgroup("s_b1", 1, "u32", 8),
        BufferDecl.read_write("io_b2", 2, "u8"),
        BufferDecl.workgroup("s_b0", 0, "u8", 8),
        BufferDecl.write_only("o_b3", 3, "u32", 1),
    )
    bplan = plan_bindings(prog, (20, 5))
    got = [(s.decl.name, s.binding, s.role, s.input_index, s.output_index, s.count) for s in bplan.slots]
    assert got == [
        ("io_b2", 2, R.INPUT_OUTPUT, 1, 1, 5),
        ("o_b3", 3, R.OUTPUT, -1, 2, 1),
        ("in_b4", 4, R.INPUT, 0, -1, 5),
        ("o_b9", 9, R.OUTPUT, -1, 0, 2),
    ]
    assert [s.decl.name for s in bplan.outputs] == ["o_b9", "io_b2", "o_b3"]
    assert [d.name for d in bplan.workgroup] == ["s_b0", "s_b1"]
    assert bplan.max_binding == 9


# ================================================================ launch plan
def test_grid_from_element_count():
    for n, grid in [(1, 1), (256, 1), (257, 2), (1000, 4)]:
        _, launch = launch_of(vecadd(), (4 * n, 4 * n))
        assert (launch.grid, launch.block, launch.element_count) == ((grid, 1, 1), (256, 1, 1), n)
        assert launch.threads_per_block == 256 and launch.grid_blocks == grid


def test_element_count_is_the_largest_output():
    prog = program(
        BufferDecl.read("a", 0, "u32", 5000),
        BufferDecl.output("o", 1, "u32", 300),
        BufferDecl.output("p", 2, "u8", 700),
    )
    assert launch_of(prog, (20000,))[1].element_count == 700


def test_element_count_with_workgroup_buffers_covers_every_binding():
    prog = program(
        BufferDecl.read("a", 0, "u32", 5000),
        BufferDecl.output("o", 1, "u32", 300),
        BufferDecl.workgroup("s", 2, "u32", 64),
    )
    assert launch_of(prog, (20000,))[1].element_count == 5000


def test_element_count_without_outputs_covers_every_binding():
    prog = program(BufferDecl.read("a", 0, "u32", 70), BufferDecl.read("b", 1, "u8"))
    assert launch_of(prog, (280, 30))[1].element_count == 70


def test_workgroup_override():
    _, launch = launch_of(vecadd(), (4000, 4000), DispatchConfig(workgroup_override=64))
    assert (launch.block, launch.grid, launch.element_count) == ((64, 1, 1), (16, 1, 1), 1000)


def test_grid_override_sets_the_element_count():
    _, launch = launch_of(vecadd(), (4000, 4000), DispatchConfig(grid_override=(3, 2)))
    assert (launch.grid, launch.element_count) == ((3, 2, 1), 3 * 256)


def test_grid_override_allows_a_multidimensional_block():
    prog = vecadd(workgroup_size=(16, 16, 1))
    _, launch = launch_of(prog, (40, 40), DispatchConfig(grid_override=(5, 5)))
    assert (launch.block, launch.grid, launch.element_count) == ((16, 16, 1), (5, 5, 1), 80)


# ---------------------------------------------------------------- what sizes the launch
def histogram(**kw) -> Program:
    """atomicAdd(&h[x[i]], 1) over a runtime-sized u8 input into a 256-bin static output."""
    return program(BufferDecl.read("x", 0, "u8"), BufferDecl.output("h", 1, "u32", 256), **kw)


def test_histogram_sized_by_its_input():
    for n, grid in [(1, 1), (256, 1), (257, 2), (100_000, 391)]:
        _, launch = launch_of(histogram(launch="x"), (n,))
        assert (launch.element_count, launch.grid) == (n, (grid, 1, 1))
        assert launch.sized_by == "launch='x'"


def test_histogram_by_the_default_rule_warns_once():
    prog = histogram()
    with pytest.warns(LaunchSizeWarning) as record:
        _, launch = launch_of(prog, (10_000,))
    # the documented default: the largest output, here the 256 bins
    assert launch.element_count == 256 and launch.sized_by == "the largest output, 'h'"
    assert len(record) == 1
    message = str(record[0].message)
    assert "10000" in message and "256" in message and "launch='x'" in message
    assert record[0].filename == __file__  # points at the caller, not into vyre_cuda
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch_of(prog, (20_000,))  # once per program, not once per plan
        launch_of(histogram(), (30_000,))  # an equal program rebuilt is the same program
        launch_of(histogram(launch="x"), (10_000,))  # a declared launch never warns
        launch_of(histogram(), (200,))  # nothing is left out: no warning
        launch_of(histogram(), (10_000,), DispatchConfig(elements=10_000))
        launch_of(histogram(), (10_000,), DispatchConfig(grid_override=40))
    with pytest.warns(LaunchSizeWarning):
        launch_of(histogram(name="another"), (257,))  # another program warns for itself


def test_launch_callable_gets_every_binding_count():
    seen = []

    def rule(counts):
        seen.append(dict(counts))
        return counts["x"] // 4

    _, launch = launch_of(histogram(launch=rule), (1000,))
    assert seen == [{"x": 1000, "h": 256}]
    assert launch.element_count == 250 and launch.grid == (1, 1, 1)
    assert "rule" in launch.sized_by


@pytest.mark.parametrize("value", [-1, 1.5, None, True, "10"])
def test_launch_callable_must_return_a_count(value):
    err = raises(InvalidProgram, launch_of, histogram(launch=lambda n: value), (10,))
    assert repr(value) in err.message


def test_launch_callable_errors_become_invalid_program():
    err = raises(InvalidProgram, launch_of, histogram(launch=lambda n: n["nope"]), (10,))
    assert "KeyError" in err.message and isinstance(err.__cause__, KeyError)


def test_elements_override_the_program_rule():
    for prog in (vecadd(), histogram(launch="x")):
        lengths = (4000, 4000) if len(prog.inputs) == 2 else (1000,)
        _, launch = launch_of(prog, lengths, DispatchConfig(elements=3000))
        assert (launch.element_count, launch.grid) == (3000, (12, 1, 1))
        assert launch.sized_by == "DispatchConfig(elements=3000)"


def test_word0_under_grid_override():
    # no declared rule: grid x block (x axis), as before
    _, launch = launch_of(histogram(), (10_000,), DispatchConfig(grid_override=(4, 2)))
    assert (launch.grid, launch.element_count) == ((4, 2, 1), 4 * 256)
    # a declared rule or elements keep word 0 the element count; the grid is the override
    _, launch = launch_of(histogram(launch="x"), (10_000,), DispatchConfig(grid_override=4))
    assert (launch.grid, launch.element_count) == ((4, 1, 1), 10_000)
    _, launch = launch_of(histogram(), (10_000,), DispatchConfig(grid_override=4, elements=77))
    assert (launch.grid, launch.element_count) == ((4, 1, 1), 77)


def test_empty_launch_binding():
    err = raises(ValidationError, launch_of, histogram(launch="x"), (0,))
    assert "launch='x'" in err.message


@pytest.mark.parametrize(
    ("launch", "needle"),
    [("nope", "'nope'"), ("s", "workgroup"), (3, "int"), (b"x", "bytes")],
)
def test_launch_must_name_a_sized_binding(launch, needle):
    err = raises(
        InvalidProgram, program, BufferDecl.read("x", 0, "u8"), BufferDecl.workgroup("s", 1, "u8", 4), launch=launch
    )
    assert needle in err.message


def test_programs_with_a_launch_rule_stay_hashable_and_pickle():
    prog = histogram(launch="x")
    assert hash(prog) == hash(prog) and {prog: 1}[prog] == 1
    again = pickle.loads(pickle.dumps(prog))
    assert again.launch == "x" and again.buffers == prog.buffers and again.kernel == prog.kernel
    assert again.kernel.digest == prog.kernel.digest
    with pytest.raises(dataclasses.FrozenInstanceError):
        prog.launch = "h"


# ---------------------------------------------------------------- barrier ceiling
def test_barrier_ceiling():
    assert barrier_ceiling(4, 264, "cooperative") == 3 * 264
    assert barrier_ceiling(1, 264, "cooperative") == 0
    for kind in ("regular", "split"):
        # host-split and regular launches run no device barrier, however large the grid
        assert barrier_ceiling(4, (2**31 - 1) * 65535 * 65535, kind) == 0
    err = raises(InvalidProgram, barrier_ceiling, 65535, 2**20, "cooperative")
    assert "65535" in err.message and str(2**20) in err.message
    raises(InvalidProgram, barrier_ceiling, 4, 2**64, "cooperative")  # checked, never wraps
    assert barrier_ceiling(2, 2**32 - 1, "cooperative") == 2**32 - 1


@pytest.mark.parametrize(("ws", "override"), [((16, 16, 1), None), ((256, 1, 1), (8, 1, 2)), ((4, 1, 1), (2, 2))])
def test_multidimensional_block_needs_a_grid(ws, override):
    config = DispatchConfig(workgroup_override=override)
    raises(ValidationError, launch_of, vecadd(workgroup_size=ws), (40, 40), config)


@pytest.mark.parametrize("block", [(1025, 1, 1), (1, 1025, 1), (1, 1, 65)])
def test_block_axis_limits(block):
    raises(ValidationError, launch_of, vecadd(), (40, 40), DispatchConfig(workgroup_override=block, grid_override=1))


@pytest.mark.parametrize("block", [(1024, 1, 1), (1, 1024, 1), (1, 16, 64)])
def test_block_axis_limits_are_inclusive(block):
    _, launch = launch_of(vecadd(), (40, 40), DispatchConfig(workgroup_override=block, grid_override=1))
    assert launch.block == block


def test_threads_per_block_limit():
    # every axis within its limit, the product over the block limit
    config = DispatchConfig(workgroup_override=(64, 32, 1), grid_override=1)
    raises(ValidationError, launch_of, vecadd(), (40, 40), config)
    config = DispatchConfig(workgroup_override=(32, 32, 1), grid_override=1)
    assert launch_of(vecadd(), (40, 40), config)[1].threads_per_block == 1024


def test_derived_grid_limit():
    n = 1000 * 256
    assert launch_of(vecadd(), (4 * n, 4 * n))[1].grid == (1000, 1, 1)
    raises(ValidationError, launch_of, vecadd(), (4 * (n + 1), 4 * (n + 1)))


@pytest.mark.parametrize(
    ("grid", "ok"), [((1000, 10, 10), True), ((1001, 1, 1), False), ((1, 11, 1), False), ((1, 1, 11), False)]
)
def test_grid_axis_limits(grid, ok):
    config = DispatchConfig(grid_override=grid)
    if ok:
        assert launch_of(vecadd(), (40, 40), config)[1].grid == grid
    else:
        raises(ValidationError, launch_of, vecadd(), (40, 40), config)


def test_zero_element_launch():
    raises(ValidationError, launch_of, vecadd(), (0, 0))
    # with a grid the launch size is explicit
    assert launch_of(vecadd(), (0, 0), DispatchConfig(grid_override=1))[1].element_count == 256


def test_element_count_must_fit_a_u32_word():
    big = caps(max_grid_dim=(2**40, 1, 1))
    raises(InvalidProgram, launch_of, vecadd(), (40, 40), DispatchConfig(grid_override=2**24), big)
    assert launch_of(vecadd(), (40, 40), DispatchConfig(grid_override=2**24 - 1), big)[1].element_count == 2**32 - 256
    raises(InvalidProgram, launch_of, vecadd("u8"), (2**32, 2**32), None, big)


def test_shared_memory_offsets_are_16_byte_aligned():
    prog = program(
        BufferDecl.read("a", 0, "u32"),
        BufferDecl.workgroup("w9", 9, "f64", 1),
        BufferDecl.workgroup("w2", 2, "u32", 5),
        BufferDecl.workgroup("w5", 5, "u8", 3),
    )
    _, launch = launch_of(prog, (64,))
    assert launch.shared_offsets == (("w2", 0, 20), ("w5", 32, 3), ("w9", 48, 8))
    assert launch.shared_bytes == 56


def test_shared_memory_limit_is_the_opt_in_limit():
    def prog(n):
        return program(
            BufferDecl.read("a", 0, "u32"),
            BufferDecl.workgroup("s", 1, "u8", n),
            BufferDecl.workgroup("t", 2, "u8", 600),
        )

    # 608 + 600 bytes; at the limit it plans (above 48 KiB is fine: the backend opts in)
    assert launch_of(prog(600), (64,), device=caps(max_shared_per_block_optin=1208))[1].shared_bytes == 1208
    assert launch_of(prog(60_001), (64,))[1].shared_bytes == 60_016 + 600
    err = raises(ValidationError, launch_of, prog(600), (64,), device=caps(max_shared_per_block_optin=1207))
    # the message names each buffer's bytes
    assert "s=600 B" in str(err) and "t=600 B" in str(err)


def test_no_workgroup_buffers_no_shared_memory():
    _, launch = launch_of(vecadd(), (40, 40))
    assert (launch.shared_bytes, launch.shared_offsets) == (0, ())


# ================================================================ params words
def test_params_words_layout():
    prog = program(
        BufferDecl.read("a", 1, "u32"),
        BufferDecl.output("o", 3, "u32", 7),
        BufferDecl.workgroup("s", 5, "u8", 32),
        BufferDecl.read("c", 0, "u16", 2),
    )
    bplan, launch = launch_of(prog, (40, 4))
    words = params_words(bplan, launch)
    # word 0: launch count; word b+1: binding b's count; unbound bindings 0; length max_binding + 2
    assert words == [launch.element_count, 2, 10, 0, 7, 0, 32]
    assert launch.element_count == 10  # workgroup buffers: largest binding


def test_params_words_phase_range_appended():
    prog = program(BufferDecl.read("x", 0, "u32"), BufferDecl.output("y", 2, "u32"), grid_sync=True, phases=3)
    bplan, launch = launch_of(prog, (400,))
    assert params_words(bplan, launch, (0, 3)) == [100, 100, 0, 100, 0, 3]
    assert params_words(bplan, launch, (1, 2))[4:] == [1, 2]
    assert len(params_words(bplan, launch)) == 4


def test_params_words_count_over_u32():
    prog = program(BufferDecl.read("a", 0, "u8", 2**32), BufferDecl.output("o", 1, "u8", 4))
    bplan, launch = launch_of(prog, (2**32,))
    raises(InvalidProgram, params_words, bplan, launch)


def test_runtime_sized_binding_word_is_its_own_count():
    # Deliberate deviation from vyre (documented in the README and vyre_cuda.cuh): a runtime-sized
    # binding's word is its actual element count, so a kernel can bound-check a shorter input
    # instead of reading past it with the launch count.
    prog = program(BufferDecl.read("a", 0, "u32"), BufferDecl.output("words", 5, "u32", 7), launch="words")
    bplan, launch = launch_of(prog, (4 * 123,))
    words = params_words(bplan, launch)
    assert words[0] == launch.element_count == 7
    assert words[1] == 123 and words[6] == 7


# ================================================================ capabilities
def test_every_missing_capability_in_one_message():
    prog = program(
        BufferDecl.read("h", 0, "f16"),
        BufferDecl.read("b", 1, "bf16"),
        BufferDecl.output("o", 2, "f32"),
        requires=("f16", "indirect_dispatch", "collectives", "trap", "subgroup"),
        grid_sync=True,
    )
    old = caps(cc=(5, 0), cooperative_launch=False)
    missing = missing_capabilities(prog, old)
    assert len(missing) == 5  # f16 once, bf16, indirect_dispatch, collectives, cooperative
    err = raises(UnsupportedFeature, check_capabilities, prog, old)
    for item in missing:
        assert item in str(err)
    for name in ("f16", "bf16", "indirect_dispatch", "collectives", "cooperative"):
        assert sum(name in item for item in missing) >= 1


@pytest.mark.parametrize(
    ("dtype", "cc", "ok"),
    [
        ("f16", (5, 0), False),
        ("f16", (5, 3), True),
        ("bf16", (7, 5), False),
        ("bf16", (8, 0), True),
        ("f32", (3, 0), True),
    ],
)
def test_dtype_capability_thresholds(dtype, cc, ok):
    prog = program(BufferDecl.read("a", 0, dtype), BufferDecl.output("o", 1, dtype))
    if ok:
        check_capabilities(prog, caps(cc=cc))
    else:
        assert len(missing_capabilities(prog, caps(cc=cc))) == 1
        raises(UnsupportedFeature, check_capabilities, prog, caps(cc=cc))


@pytest.mark.parametrize("req", ["indirect_dispatch", "collectives"])
def test_unsupported_requirements(req):
    raises(UnsupportedFeature, check_capabilities, vecadd(requires=(req,)), caps(cc=(9, 0)))


@pytest.mark.parametrize(("cc", "coop", "ok"), [((6, 0), True, True), ((5, 3), True, False), ((9, 0), False, False)])
def test_grid_sync_needs_cooperative_launch(cc, coop, ok):
    prog = vecadd(grid_sync=True)
    device = caps(cc=cc, cooperative_launch=coop)
    assert (missing_capabilities(prog, device) == []) is ok
    assert (missing_capabilities(vecadd(requires=("cooperative",)), device) == []) is ok


# ================================================================ grid-sync routing
def launch_plan(blocks, threads=256, shared=0) -> LaunchPlan:
    return LaunchPlan((threads, 1, 1), (blocks, 1, 1), blocks * threads, shared, ())


@pytest.mark.parametrize(
    ("threads", "occupancy", "limit"),
    [(256, 6, 24), (256, 10, 32), (64, 20, 64), (1024, 4, 8), (2048, 4, 4), (4096, 4, 0), (256, 0, 0)],
)
def test_resident_limit(threads, occupancy, limit):
    # min(occupancy, max_threads_per_sm // threads, max_blocks_per_sm) x sm_count
    assert resident_limit(CAPS, threads, occupancy) == limit


def test_resident_limit_without_cooperative_launch():
    assert resident_limit(caps(cooperative_launch=False), 256, 8) == 0
    assert resident_limit(caps(cc=(5, 2)), 256, 8) == 0
    assert resident_limit(CAPS, 0, 8) == 0


def test_no_grid_sync_is_regular_everywhere():
    route = route_grid_sync(vecadd(), DispatchConfig(), launch_plan(10**5), caps(cooperative_launch=False), 0)
    assert (route.kind, route.grid_blocks) == ("regular", 10**5)


@pytest.mark.parametrize(("config", "limit"), [(DispatchConfig(), 24), (DispatchConfig(cooperative=True), 24)])
def test_route_boundary(config, limit):
    prog = vecadd(grid_sync=True, phases=3)
    at = route_grid_sync(prog, config, launch_plan(limit), CAPS, 6)
    assert (at.kind, at.grid_blocks, at.resident_limit) == ("cooperative", limit, limit)
    if config.cooperative:
        err = raises(CooperativeResidencyExceeded, route_grid_sync, prog, config, launch_plan(limit + 1), CAPS, 6)
        assert (err.grid_blocks, err.resident_limit) == (limit + 1, limit)
    else:
        over = route_grid_sync(prog, config, launch_plan(limit + 1), CAPS, 6)
        assert (over.kind, over.grid_blocks, over.resident_limit) == ("split", limit + 1, limit)


def test_cooperative_config_without_grid_sync():
    route = route_grid_sync(vecadd(), DispatchConfig(cooperative=True), launch_plan(8), CAPS, 2)
    assert route.kind == "cooperative"
    raises(
        CooperativeResidencyExceeded,
        route_grid_sync,
        vecadd(),
        DispatchConfig(cooperative=True),
        launch_plan(9),
        CAPS,
        2,
    )


def test_zero_occupancy_splits():
    route = route_grid_sync(vecadd(grid_sync=True), DispatchConfig(), launch_plan(1), CAPS, 0)
    assert (route.kind, route.resident_limit) == ("split", 0)


@pytest.mark.parametrize("device", [caps(cooperative_launch=False), caps(cc=(5, 3))])
@pytest.mark.parametrize(("grid_sync", "cooperative"), [(True, False), (False, True), (True, True)])
def test_no_cooperative_device_refuses(device, grid_sync, cooperative):
    prog = vecadd(grid_sync=grid_sync)
    raises(
        UnsupportedFeature, route_grid_sync, prog, DispatchConfig(cooperative=cooperative), launch_plan(1), device, 8
    )


def test_end_to_end_grid_sync_plan():
    prog = program(BufferDecl.read("x", 0, "u32"), BufferDecl.output("y", 1, "u32"), grid_sync=True, phases=3)
    bplan, launch = launch_of(prog, (4 * 256 * 40,))
    assert launch.grid_blocks == 40
    assert route_grid_sync(prog, DispatchConfig(), launch, CAPS, 8).kind == "split"  # limit 32
    assert route_grid_sync(prog, DispatchConfig(), launch, caps(sm_count=5), 8).kind == "cooperative"  # limit 40
