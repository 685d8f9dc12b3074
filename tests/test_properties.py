"""Property tests over the real planner: ``CudaBackend._plan`` on a faked driver with H200 caps.

A backend is built the normal way (``CudaBackend(0)``) with the Python-level driver entry points
of ``vyre_cuda._driver`` replaced by ``PlanningDriver`` (tests/planning_fakes.py): it reports an H200's attributes
(132 SMs, grid limit (2147483647, 65535, 65535), 1024 threads per block, 48 KiB shared memory or
232448 B opted in, 2048 threads and 32 blocks per SM, cooperative launch), hands out module and
function handles, and answers the occupancy query with a value each example draws. Kernels are
PTX (passed through the real compile step, no NVRTC), with or without the grid-barrier global.

Every outcome of a random program, input lengths and config is either a valid plan or a
BackendError, never another exception; every plan satisfies the invariants below, each checked
against an oracle written here from the documented rules, not from the planner's code:

* bindings: one slot per non-workgroup buffer in binding order, each with its own element count;
* launch: the grid covers the binding that sizes the launch (largest output; largest binding with
  workgroup buffers; grid x block under grid_override), within the device limits;
* params: word 0 is the launch count, word ``binding + 1`` that binding's count, then the phase
  words of each launch;
* layout: every region aligned, inside the slab and disjoint from the others; uploads first,
  cleared outputs after; readbacks cover exactly the output ranges;
* route: cooperative exactly when the grid fits min(occupancy, thread and block bounds) x 132;
* telemetry figures: bytes uploaded = inputs + params words, bytes read back = output ranges.

Each test counts the examples that reach the invariant checks and asserts that a meaningful
share did (and that every route and the shared-memory opt-in were exercised).
"""

from __future__ import annotations

import collections
import itertools
import struct

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from planning_fakes import H200, NO_COOP, plan, planning_backends

import vyre_cuda
from vyre_cuda import builtin_programs
from vyre_cuda._accounting import bucket_size
from vyre_cuda.config import DispatchConfig
from vyre_cuda.errors import (
    BackendError,
    CooperativeResidencyExceeded,
    InvalidProgram,
)
from vyre_cuda.planning.layout import COPY_ALIGN, HOST_CLEAR_MAX, REGION_ALIGN
from vyre_cuda.program import (
    DTYPES,
    BindingRole,
    BufferAccess,
    BufferDecl,
    Kernel,
    Program,
)

U64 = 2**64
U32_MAX = 2**32 - 1
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)

_PTX = """
.version 8.0
.target sm_90
.address_size 64
{barrier}
.visible .entry main(.param .u64 p0)
{{
  ret;
}}
"""
WITH_BARRIER = Kernel.ptx(_PTX.format(barrier=".visible .global .align 4 .u32 _vyre_grid_barrier;"))
NO_BARRIER = Kernel.ptx(_PTX.format(barrier=""))


@pytest.fixture(scope="module")
def planners():
    """{caps name: (backend, driver)}: real CudaBackends whose driver is a PlanningDriver."""
    with planning_backends() as made:
        yield made  # (backends, monkeypatch): what planning_fakes.plan takes


# ---------------------------------------------------------------- strategies
def mostly(common, rare, percent_rare=10):
    """``common``, or ``rare`` about ``percent_rare`` % of the time (keeps most programs plannable).

    Hypothesis draws the bounds of an integer range far more often than other values, so the
    draw is scrambled: its bounds (0, 99) land on the common side, which is also where it shrinks.
    """
    return st.integers(0, 99).flatmap(lambda k: rare if (k * 37 + 11) % 100 < percent_rare else common)


def percent(draw) -> int:
    """A uniform-ish percentile for ``if percent(draw) < p`` decisions (see mostly)."""
    return (draw(st.integers(0, 99)) * 37 + 11) % 100


HUGE = [2**31, 2**32 - 1, 2**32, 2**40, 2**61 - 1, 2**61, 2**63, U64 - 1, U64, U64 + 1]
KINDS = ["read"] * 3 + [
    "uniform",
    "read_write",
    "read_write",
    "output",
    "output",
    "write_only",
    "workgroup",
    "raw",
    "raw",
]


@st.composite
def decls(draw, index, fault):
    """One declaration; ``fault`` is the percent chance of each kind of mistake in it."""
    kind = draw(mostly(st.sampled_from(KINDS), st.just("persistent"), fault // 5))
    # unique names and bindings (sparse), unless a fault makes them duplicate, empty or too large
    name = draw(mostly(st.just(f"b{index}"), st.sampled_from(["dup", ""]), fault))
    binding = draw(
        mostly(st.integers(3 * index, 3 * index + 2), st.one_of(st.integers(0, 10), st.integers(65530, 65540)), fault)
    )
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    size = DTYPES[dtype].itemsize
    count = draw(
        mostly(st.one_of(st.just(0), st.integers(1, 300), st.integers(1, 1 << 20)), st.sampled_from(HUGE), fault)
    )
    if kind == "workgroup":
        count = draw(mostly(st.integers(1, 60_000 // size), st.just(count), fault))
    # byte ranges start and end on element boundaries inside the buffer, unless a fault says
    # otherwise (a runtime-sized buffer gets a range of its first elements)
    elements = count if 0 < count <= 1 << 20 else 8
    first = draw(st.integers(0, elements))
    aligned = st.tuples(st.just(first * size), st.integers(first, elements).map(lambda e: e * size))
    byte_range = draw(
        mostly(
            mostly(st.none(), aligned, 15),
            st.one_of(
                st.tuples(st.integers(0, 600), st.integers(0, 600)),  # start > end half the time, unaligned
                st.tuples(st.integers(0, 64), st.sampled_from([2**32, U64 - 1, U64])),
            ),
            fault,
        )
    )
    alignment = draw(mostly(st.sampled_from([None, None, 1, 16, 256, 4096]), st.just(3), fault // 3))
    if kind == "raw":  # any access with the output flag (workgroup with count 0 only as a fault)
        access = draw(
            mostly(
                st.sampled_from([a for a in BufferAccess if a is not BufferAccess.WORKGROUP]),
                st.just(BufferAccess.WORKGROUP),
                fault,
            )
        )
        flag = draw(st.booleans())
        read_back = flag or access in (BufferAccess.READ_WRITE, BufferAccess.WRITE_ONLY)
    else:
        read_back = kind in ("output", "write_only", "read_write", "persistent")
    if not read_back and percent(draw) >= fault:
        byte_range = None  # a byte range on a buffer that is not read back is a mistake (a fault)
    kw = {"output_byte_range": byte_range, "alignment": alignment}
    if kind == "persistent":
        return BufferDecl(name, binding, BufferAccess.READ_WRITE, dtype, count, persistent=True, **kw)
    if kind == "raw":
        return BufferDecl(name, binding, access, dtype, count, output=flag, **kw)
    return getattr(BufferDecl, kind)(name, binding, dtype, count, **kw)


def _launch_kw(draw, buffers):
    """``launch=<binding name>`` on programs that support it (sometimes)."""
    if "launch" not in getattr(Program, "__dataclass_fields__", {}):
        return {}
    names = [b.name for b in buffers if b.access is not BufferAccess.WORKGROUP]
    if not names or percent(draw) >= 20:
        return {}
    return {"launch": draw(st.sampled_from(names))}


@st.composite
def programs(draw):
    """A Program, or the BackendError its construction raised (a quarter of them carry faults)."""
    fault = draw(mostly(st.just(0), st.just(15), 20))
    n = draw(mostly(st.integers(1, 8), st.just(0), fault // 5))
    try:
        buffers = [draw(decls(i, fault)) for i in range(n)]
        runtime_outputs = [b for b in buffers if b.count == 0 and b.role is BindingRole.OUTPUT]
        if (
            runtime_outputs
            and not any(b.count == 0 and b.role in (BindingRole.INPUT, BindingRole.INPUT_OUTPUT) for b in buffers)
            and percent(draw) >= fault
        ):
            # a runtime-sized output takes its length from a runtime-sized input: give it one
            buffers.append(BufferDecl.read("rt", 65000, draw(st.sampled_from(sorted(DTYPES)))))
        grid_sync = draw(mostly(st.just(False), st.just(True), 35))
        return Program(
            draw(mostly(st.just(WITH_BARRIER), st.just(NO_BARRIER), 10)),
            buffers,
            workgroup_size=draw(
                mostly(
                    st.sampled_from([(256, 1, 1), (32, 1, 1), (1, 1, 1), (1024, 1, 1), 64, 96]), st.just((16, 16, 1)), 5
                )
            ),
            grid_sync=grid_sync,
            phases=draw(st.integers(1, 4)) if grid_sync else draw(mostly(st.just(1), st.just(2), fault // 5)),
            requires=draw(mostly(st.just(()), st.sampled_from([("f16",), ("bf16", "subgroup"), ("collectives",)]))),
            **_launch_kw(draw, buffers),
        )
    except BackendError as exc:
        return exc


@st.composite
def input_lengths(draw, program):
    """Byte lengths of the inputs: runtime-sized inputs share one element count (the rule), static
    ones their count; about 10 % of the time anything (ragged, not whole elements, huge)."""
    runtime = draw(mostly(st.integers(0, 5000), st.sampled_from([1, 2**20 + 1, 2**32, 2**61]), 5))
    lengths = []
    for decl in program.inputs:
        size = decl.dtype.itemsize
        if percent(draw) < 90:  # well formed
            lengths.append((decl.count or runtime) * size)
        else:
            lengths.append(draw(st.one_of(st.integers(0, 5000), st.sampled_from(HUGE))))
    if percent(draw) < 3:  # wrong number of inputs
        lengths = lengths[:-1] if lengths and draw(st.booleans()) else lengths + [16]
    return lengths


dims = mostly(
    st.integers(1, 1024),
    st.one_of(st.integers(1025, 2048), st.tuples(st.integers(1, 64), st.integers(1, 8), st.integers(1, 2))),
    15,
)
grids = mostly(
    st.one_of(st.integers(1, 3000), st.tuples(st.integers(1, 64), st.integers(1, 8), st.integers(1, 2))),
    st.sampled_from([(2**24, 1, 1), (2**31 - 1,), (1, 65536), (8, 1, 65535)]),
    10,
)


@st.composite
def configs(draw):
    grid = draw(mostly(st.none(), grids, 30))
    # a multi-dimensional block needs a grid_override; without one it is a (rare) fault
    block = draw(mostly(st.none(), dims if grid else mostly(st.integers(1, 1024), dims, 10), 25))
    return DispatchConfig(
        workgroup_override=block,
        grid_override=grid,
        fixpoint_iterations=draw(st.one_of(st.none(), st.integers(1, 3))),
        cooperative=draw(mostly(st.just(False), st.just(True), 15)),
    )


occupancies = st.one_of(st.integers(0, 8), st.integers(9, 32))


# ---------------------------------------------------------------- the oracles and invariants
def resident(caps, threads, occupancy):
    if not (caps.cooperative_launch and caps.cc >= (6, 0)) or threads > caps.max_threads_per_sm:
        return 0
    return min(occupancy, caps.max_threads_per_sm // threads, caps.max_blocks_per_sm) * caps.sm_count


def launch_binding_count(program, bplan):
    """Element count of the binding that sizes the launch, by the documented rule."""
    name = getattr(program, "launch", None)
    if isinstance(name, str) and name:
        return next(s.count for s in bplan.slots if s.decl.name == name)
    if bplan.outputs and not bplan.workgroup:
        return max(s.count for s in bplan.outputs)
    return max(s.count for s in bplan.slots)


def check_bindings(info, lengths):
    program, bplan = info.program, info.bindings
    slots = bplan.slots
    bindings = [s.binding for s in slots]
    assert bindings == sorted(bindings) and len(set(bindings)) == len(bindings)
    assert {s.decl.name for s in slots} == {d.name for d in program.buffers if d.role is not BindingRole.SHARED}
    assert [s.decl.name for s in bplan.outputs] == [d.name for d in program.outputs]
    assert [d.name for d in bplan.workgroup] == [
        d.name for d in sorted(program.buffers, key=lambda d: d.binding) if d.role is BindingRole.SHARED
    ]
    runtime = {lengths[i] // d.dtype.itemsize for i, d in enumerate(program.inputs) if d.count == 0}
    for slot in slots:
        assert slot.byte_len == slot.count * slot.decl.dtype.itemsize < U64
        if slot.input_index >= 0:
            assert program.inputs[slot.input_index] is slot.decl
            assert slot.byte_len == lengths[slot.input_index]  # each input keeps its own count
        elif slot.decl.count:
            assert slot.count == slot.decl.count
        else:  # a runtime-sized output takes the runtime inputs' count
            assert slot.count == max(runtime)


def check_launch(info, caps):
    launch, cfg, program = info.launch, info.config, info.program
    block = cfg.workgroup_override or program.workgroup_size
    assert launch.block == block
    assert all(b <= m for b, m in zip(launch.block, caps.max_block_dim, strict=True))
    assert all(1 <= g <= m for g, m in zip(launch.grid, caps.max_grid_dim, strict=True))
    assert launch.threads_per_block <= caps.max_threads_per_block
    assert 0 <= launch.element_count <= U32_MAX
    assert launch.element_count > 0 or (cfg.grid_override and getattr(program, "launch", None) is not None)
    declared = getattr(program, "launch", None) is not None
    if cfg.grid_override:
        assert launch.grid == cfg.grid_override
        # a declared launch binding sizes word 0 even under grid_override (it wins); else grid x block
        want = launch_binding_count(program, info.bindings) if declared else launch.grid[0] * launch.block[0]
        assert launch.element_count == want
    else:
        # the grid covers the launch binding, with no whole block to spare
        count = launch_binding_count(program, info.bindings)
        assert launch.element_count == count
        assert launch.grid[1:] == (1, 1)
        assert launch.grid[0] * launch.block[0] >= count > (launch.grid[0] - 1) * launch.block[0]
    # dynamic shared memory: workgroup buffers in binding order, 16-aligned, within the opt-in limit
    end = 0
    for (name, offset, nbytes), decl in zip(launch.shared_offsets, info.bindings.workgroup, strict=True):
        assert name == decl.name and nbytes == decl.count * decl.dtype.itemsize
        assert offset % 16 == 0 and offset >= end and offset - end < 16
        end = offset + nbytes
    assert launch.shared_bytes == end <= caps.max_shared_per_block_optin


def check_route(info, caps, occupancy, driver):
    program, cfg, launch, route = info.program, info.config, info.launch, info.route
    wants = program.grid_sync or cfg.cooperative
    limit = resident(caps, launch.threads_per_block, occupancy)
    assert route.grid_blocks == launch.grid_blocks
    # a device without cooperative launch never plans a grid-sync or cooperative dispatch
    assert not wants or caps.cooperative_launch
    if not wants:
        assert route.kind == "regular" and not driver.occupancy_calls
    else:
        assert driver.occupancy_calls == [(launch.threads_per_block, launch.shared_bytes)]
        assert route.resident_limit == limit
        assert route.kind == ("cooperative" if launch.grid_blocks <= limit else "split")
        assert not (cfg.cooperative and route.kind == "split")
        if route.kind == "split":
            assert program.grid_sync


def expected_phase_ranges(info):
    program, route = info.program, info.route
    if route.kind == "split":
        return [(k, k + 1) for k in range(program.phases)]
    if program.grid_sync:
        return [(0, program.phases)]
    return [None]


def expected_words(info, phase_range):
    bplan = info.bindings
    words = [0] * (bplan.max_binding + 2)
    words[0] = info.launch.element_count
    for slot in bplan.slots:
        words[slot.binding + 1] = slot.count
    for decl in bplan.workgroup:
        words[decl.binding + 1] = decl.count
    return words + (list(phase_range) if phase_range else [])


def pad16(n: int) -> int:
    return -(-max(n, 1) // COPY_ALIGN) * COPY_ALIGN


def check_layout(info, lengths):
    lay, slots = info.layout, info.bindings.slots
    assert len(lay.arg_offsets) == len(slots)
    regions = []
    for slot, off in zip(slots, lay.arg_offsets, strict=True):
        assert off % max(REGION_ALIGN, slot.decl.alignment or 1, slot.decl.dtype.itemsize) == 0
        regions.append((off, off + pad16(slot.byte_len), slot))
    # the params blocks: one per launch, word for word the documented ABI
    words = [expected_words(info, r) for r in expected_phase_ranges(info)]
    assert all(len(w) == len(words[0]) for w in words)
    block_bytes = pad16(4 * len(words[0]))
    assert lay.params_blob == b"".join(struct.pack(f"<{len(w)}I", *w).ljust(block_bytes, b"\0") for w in words)
    assert len(lay.params_offsets) == len(words)
    for off in lay.params_offsets:
        assert off % COPY_ALIGN == 0
    assert lay.params_offsets[0] % REGION_ALIGN == 0
    assert list(lay.params_offsets) == [lay.params_offsets[0] + k * block_bytes for k in range(len(words))]
    regions += [(off, off + block_bytes, None) for off in lay.params_offsets]
    # regions are disjoint and inside the slab
    regions.sort(key=lambda r: r[0])
    for (_, end, _), (start, _, _) in itertools.pairwise(regions):
        assert end <= start
    assert regions[0][0] >= 0 and regions[-1][1] <= lay.slab_bytes and lay.slab_bytes % REGION_ALIGN == 0
    assert lay.slab_bytes <= lay.bucket_bytes == bucket_size(lay.slab_bytes)
    # inputs and params first, uploaded in one copy; pure outputs after, zeroed as one span
    params_end = lay.params_offsets[-1] + block_bytes
    assert lay.clear == (0, 0) or lay.host_clear == (0, 0)
    span = lay.clear if lay.clear != (0, 0) else lay.host_clear
    for start, end, slot in regions:
        if slot is None or slot.role is not BindingRole.OUTPUT:
            assert end <= params_end <= lay.upload_end
        else:
            assert params_end <= span[0] <= start and end <= span[1] <= lay.slab_bytes
    if not any(s.role is BindingRole.OUTPUT for s in slots):
        assert span == (0, 0) and lay.upload_end == params_end
    elif lay.host_clear != (0, 0):
        assert lay.upload_end == span[1] and span[1] - params_end <= HOST_CLEAR_MAX
    else:
        assert lay.upload_end == params_end and span[1] - params_end > HOST_CLEAR_MAX
    assert sorted(i for i, _, _, _ in lay.inputs) == list(range(len(lengths)))
    for index, off, nbytes, zero_end in lay.inputs:
        slot = next(s for s in slots if s.input_index == index)
        assert off == lay.arg_offsets[slots.index(slot)]
        assert nbytes == lengths[index] and off + nbytes <= zero_end <= lay.upload_end
    # readbacks inside the slab, disjoint, covering every output range exactly once
    for off, n in lay.readbacks:
        assert n > 0 and off + n <= lay.slab_bytes
    for (a, n), (b, _) in itertools.pairwise(lay.readbacks):
        assert a + n <= b
    for slot, (dev, n) in zip(info.bindings.outputs, lay.outputs, strict=True):
        start, end = slot.decl.output_byte_range or (0, slot.byte_len)
        assert (dev, n) == (lay.arg_offsets[slots.index(slot)] + start, end - start)
        assert n == 0 or any(off <= dev and dev + n <= off + c for off, c in lay.readbacks)


def check_telemetry(info, lengths, prepared):
    # the figures each dispatch adds to the telemetry: bytes uploaded and read back
    lay = info.layout
    words = [expected_words(info, r) for r in expected_phase_ranges(info)]
    assert lay.h2d_bytes == sum(lengths) + sum(4 * len(w) for w in words)
    out_bytes = []
    for slot in info.bindings.outputs:
        start, end = slot.decl.output_byte_range or (0, slot.byte_len)
        out_bytes.append(end - start)
    assert lay.d2h_bytes == sum(out_bytes)
    assert prepared.slab_bytes_ == lay.slab_bytes
    assert prepared.route_kind == info.route.kind
    assert prepared.launch_geometry() == (info.launch.grid, info.launch.block, info.launch.shared_bytes)


def check_shared_optin(info, driver, caps):
    if info.launch.shared_bytes > caps.max_shared_per_block:
        # the kernel opted in to at least this much before the plan was handed out
        assert max(driver.shared_optin.values(), default=0) >= info.launch.shared_bytes


def check_all(prepared, lengths, caps, occupancy, driver):
    info = prepared.plan
    check_bindings(info, lengths)
    check_launch(info, caps)
    check_route(info, caps, occupancy, driver)
    check_layout(info, lengths)
    check_telemetry(info, lengths, prepared)
    check_shared_optin(info, driver, caps)
    return info


def expect_refusal(exc):
    """A refusal must be a BackendError whose message ends with a Fix line."""
    assert isinstance(exc, BackendError), f"{type(exc).__name__}: {exc}"
    assert str(exc).splitlines()[-1].startswith("Fix: ")


# ---------------------------------------------------------------- the tests
def test_every_outcome_is_a_valid_plan_or_a_backend_error(planners):
    seen = collections.Counter()

    # derandomized: the route coverage asserted below must not depend on one run's luck (a random
    # run drew no host-split plan about once in a few hundred)
    @settings(SETTINGS, derandomize=True)
    @given(data=st.data(), config=configs(), caps=st.sampled_from([H200] * 5 + [NO_COOP]), occupancy=occupancies)
    def run(data, config, caps, occupancy):
        seen["examples"] += 1
        program = data.draw(programs())
        if isinstance(program, BackendError):
            seen["program refused"] += 1
            event("program refused")
            return
        lengths = data.draw(input_lengths(program))
        try:
            prepared, driver = plan(planners, caps, program, lengths, config, occupancy)
        except Exception as exc:  # noqa: BLE001 (checked: only BackendError is allowed)
            expect_refusal(exc)
            seen[f"refused: {type(exc).__name__}"] += 1
            event(f"plan refused: {type(exc).__name__}")
            return
        info = check_all(prepared, lengths, caps, occupancy, driver)
        seen["checked"] += 1
        seen[f"route {info.route.kind}"] += 1
        event(f"planned: {info.route.kind}")

    run()
    # a meaningful share of the examples reached the invariant checks (about half do; the bound
    # leaves room for hypothesis's uneven draws), on the common routes. Host-split plans are rare
    # in the draws (0-10 per run, depending on the machine's hypothesis, NVRTC and dtype
    # libraries): test_every_route_meets_the_invariants checks one of each route deterministically
    assert seen["checked"] >= 0.3 * seen["examples"], seen
    for kind in ("regular", "cooperative"):
        assert seen[f"route {kind}"] >= 2, seen
    assert seen["program refused"] >= 5 and sum(v for k, v in seen.items() if k.startswith("refused")) >= 20, seen


@pytest.mark.parametrize(
    ("elements", "occupancy", "route"),
    [(4096, 8, "cooperative"), (256 * 4096, 1, "split"), (256 * 4096, 0, "split")],
)
def test_every_route_meets_the_invariants(planners, elements, occupancy, route):
    """One plan of each grid-sync route, whatever the property test above happened to draw: a grid
    within the co-resident limit launches cooperatively, one past it (4,096 blocks against 132 SMs
    x ``occupancy``) is split into one launch per phase."""
    program = builtin_programs.inclusive_scan_u32()
    lengths = [4 * elements]
    prepared, driver = plan(planners, H200, program, lengths, DispatchConfig(), occupancy)
    info = check_all(prepared, lengths, H200, occupancy, driver)
    assert info.route.kind == route, info.route


# A narrower generator of programs that always plan, so the invariants see many valid layouts.
@st.composite
def decls_valid(draw, name, binding):
    kind = draw(st.sampled_from(["read", "uniform", "read_write", "output", "write_only", "workgroup"]))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    size = DTYPES[dtype].itemsize
    if kind == "workgroup":
        return BufferDecl.workgroup(name, binding, dtype, draw(st.integers(1, 70_000 // size)))
    count = draw(st.one_of(st.just(0), mostly(st.integers(1, 3000), st.integers(3000, 40_000), 20)))
    rng = None
    if kind in ("output", "write_only", "read_write") and count and draw(st.booleans()):
        start = draw(st.integers(0, count))
        rng = (start * size, draw(st.integers(start, count)) * size)
    alignment = draw(st.sampled_from([None, 16, 512, 4096]))
    return getattr(BufferDecl, kind)(name, binding, dtype, count, output_byte_range=rng, alignment=alignment)


@st.composite
def valid_cases(draw):
    n = draw(st.integers(1, 8))
    bindings = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
    buffers = [draw(decls_valid(f"v{i}", b)) for i, b in enumerate(bindings)]
    buffers.append(BufferDecl.read("rt", 41, draw(st.sampled_from(sorted(DTYPES)))))  # one runtime input
    if percent(draw) < 25:  # more than 48 KiB of shared memory: the kernel must opt in
        buffers.append(BufferDecl.workgroup("big", 42, "u32", draw(st.integers(12_289, 30_000))))
    if sum(b.count * b.dtype.itemsize + 16 for b in buffers if b.access is BufferAccess.WORKGROUP) > 200_000:
        buffers = [b for b in buffers if b.access is not BufferAccess.WORKGROUP or b.name == "big"]
    grid_sync = draw(st.booleans())
    program = Program(
        WITH_BARRIER,
        buffers,
        workgroup_size=draw(st.sampled_from([32, 128, 256, 1024])),
        grid_sync=grid_sync,
        phases=draw(st.integers(1, 4)) if grid_sync else 1,
        **_launch_kw(draw, buffers),
    )
    runtime = draw(st.integers(1, 3000))
    lengths = [(d.count or runtime) * d.dtype.itemsize for d in program.inputs]
    config = DispatchConfig(
        grid_override=draw(st.one_of(st.none(), st.integers(1, 2000), st.integers(2000, 100_000))),
        fixpoint_iterations=draw(st.one_of(st.none(), st.integers(1, 4))),
    )
    return program, lengths, config


def test_valid_programs_plan_and_satisfy_the_invariants(planners):
    seen = collections.Counter()

    @settings(SETTINGS, max_examples=250)
    @given(case=valid_cases(), occupancy=st.integers(1, 16))
    def run(case, occupancy):
        program, lengths, config = case
        seen["examples"] += 1
        prepared, driver = plan(planners, H200, program, lengths, config, occupancy)
        info = check_all(prepared, lengths, H200, occupancy, driver)
        # the same request plans to the same layout (the plan cache relies on it)
        again, _ = plan(planners, H200, program, lengths, config, occupancy)
        assert again.plan.layout == info.layout and again.plan.launch == info.launch
        seen["checked"] += 1
        seen[f"route {info.route.kind}"] += 1
        if info.launch.shared_bytes > H200.max_shared_per_block:
            seen["shared opt-in"] += 1
        event(f"planned: {info.route.kind}")

    run()
    assert seen["checked"] == seen["examples"] > 0, seen
    # each route is reached (typically 20-200 of the 250 examples each; a run has drawn as few as
    # 4 splits, so a count above 1 would fail at random)
    for key in ("route regular", "route cooperative", "route split", "shared opt-in"):
        assert seen[key] >= 1, seen


@pytest.mark.parametrize("blocks", [1, 1055, 1056, 1057, 2**31 - 1])
@pytest.mark.parametrize("forced", [False, True])
def test_h200_residency_boundary_through_the_backend(planners, blocks, forced):
    # 256 threads, occupancy 8: 8 x 132 = 1056 co-resident blocks
    program = Program(
        WITH_BARRIER, [BufferDecl.read("x", 0, "u32"), BufferDecl.output("y", 1, "u32")], grid_sync=True, phases=3
    )
    config = DispatchConfig(grid_override=(blocks,), cooperative=forced)
    if blocks * 256 > U32_MAX:  # the launch count word is u32: refused before routing
        with pytest.raises(InvalidProgram):
            plan(planners, H200, program, [4000], config, 8)
        return
    if blocks > 1056 and forced:
        with pytest.raises(CooperativeResidencyExceeded) as exc_info:
            plan(planners, H200, program, [4000], config, 8)
        assert (exc_info.value.grid_blocks, exc_info.value.resident_limit) == (blocks, 1056)
        return
    prepared, driver = plan(planners, H200, program, [4000], config, 8)
    info = check_all(prepared, [4000], H200, 8, driver)
    assert info.route.kind == ("cooperative" if blocks <= 1056 else "split")


# ---------------------------------------------------------------- rules the planner must enforce
# They landed together with LaunchSizeWarning; in a tree without it they are expected to fail
# (strict: a tree that enforces them without exporting the warning makes these tests fail).
RULES_ENFORCED = hasattr(vyre_cuda, "LaunchSizeWarning")
RULE_PENDING = pytest.mark.xfail(
    not RULES_ENFORCED,
    strict=True,
    reason="planner rule not enforced in this tree (runtime-sized input lengths / byte-range alignment / "
    "barrier ceiling)",
)


@RULE_PENDING
@settings(SETTINGS, max_examples=60)
@given(n=st.integers(1, 5000), m=st.integers(1, 5000), dtype=st.sampled_from(sorted(DTYPES)))
def test_ragged_runtime_inputs_are_refused_naming_both_lengths(planners, n, m, dtype):
    # vecadd's shape: two runtime-sized inputs must hold equal element counts
    if n == m:
        m = n + 1
    program = Program(
        WITH_BARRIER,
        [BufferDecl.read("a", 0, dtype), BufferDecl.read("b", 1, dtype), BufferDecl.output("out", 2, dtype)],
    )
    size = DTYPES[dtype].itemsize
    with pytest.raises(vyre_cuda.ValidationError) as exc_info:
        plan(planners, H200, program, [n * size, m * size], DispatchConfig(), 8)
    assert str(n) in exc_info.value.message and str(m) in exc_info.value.message


@RULE_PENDING
@settings(SETTINGS, max_examples=60)
@given(
    dtype=st.sampled_from([d for d in sorted(DTYPES) if DTYPES[d].itemsize > 1]),
    start=st.integers(0, 64),
    length=st.integers(1, 16),
)
def test_byte_ranges_off_element_boundaries_are_refused(planners, dtype, start, length):
    size = DTYPES[dtype].itemsize
    if start % size == 0 and length % size == 0:
        start += 1
    try:
        out = BufferDecl.output("out", 1, dtype, 64, output_byte_range=(start, start + length))
        program = Program(WITH_BARRIER, [BufferDecl.read("a", 0, dtype, 64), out])
    except BackendError:
        return  # refused when declared: fine
    with pytest.raises(BackendError):
        plan(planners, H200, program, [64 * size], DispatchConfig(), 8)


@RULE_PENDING
def test_largest_grid_with_phases_plans_or_refuses_with_a_backend_error(planners):
    # grid x block fits the u32 launch word, the grid's block count does not fit the barrier audit
    program = Program(
        WITH_BARRIER, [BufferDecl.read("x", 0, "u32"), BufferDecl.output("y", 1, "u32")], grid_sync=True, phases=4
    )
    config = DispatchConfig(grid_override=(2**31 - 1, 65535, 65535), workgroup_override=1)
    try:
        prepared, driver = plan(planners, H200, program, [4000], config, 8)
    except BackendError:
        return
    check_all(prepared, [4000], H200, 8, driver)
