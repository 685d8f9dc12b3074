"""Property tests over the planner: random programs, input lengths and configs.

Every outcome of Program -> plan_bindings -> plan_launch -> route -> plan_layout -> Prepared is a
valid plan or a BackendError, never another exception; valid plans satisfy the layout invariants.
"""

from __future__ import annotations

import dataclasses
import struct
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vyre_cuda._accounting import bucket_size
from vyre_cuda._dispatch import Prepared
from vyre_cuda.planning.dispatch import assemble_plan
from vyre_cuda.config import DispatchConfig
from vyre_cuda.errors import BackendError
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.caps import DeviceCaps, check_capabilities
from vyre_cuda.planning.launch import params_words, plan_launch, route_grid_sync
from vyre_cuda.planning.layout import COPY_ALIGN, HOST_CLEAR_MAX, REGION_ALIGN, plan_layout
from vyre_cuda.program import DTYPES, BindingRole, BufferAccess, BufferDecl, Kernel, LaunchSizeWarning, Program

KERNEL = Kernel.cuda('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const vyre_u32* p) {}\n')
SMALL_CAPS = DeviceCaps(
    cc=(7, 0), sm_count=2, max_block_dim=(512, 512, 64), max_threads_per_block=512,
    max_grid_dim=(4096, 64, 64), max_shared_per_block_optin=64 * 1024, max_blocks_per_sm=4,
)
U64 = 2**64
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pad16(n: int) -> int:
    return -(-max(n, 1) // COPY_ALIGN) * COPY_ALIGN


# ---------------------------------------------------------------- strategies
def mostly(common, rare, percent_rare=10):
    """``common``, or ``rare`` about ``percent_rare`` % of the time (keeps most programs plannable)."""
    return st.integers(0, 99).flatmap(lambda k: rare if k < percent_rare else common)


HUGE = [2**31, 2**32 - 1, 2**32, 2**40, 2**61 - 1, 2**61, 2**63, U64 - 1, U64, U64 + 1]
KINDS = ["read"] * 3 + ["uniform", "read_write", "read_write", "output", "output", "write_only", "workgroup", "raw", "raw"]


@st.composite
def decls(draw, index, fault):
    """One declaration; ``fault`` is the percent chance of each kind of mistake in it."""
    kind = draw(mostly(st.sampled_from(KINDS), st.just("persistent"), fault // 3))
    # unique names and bindings (sparse), unless a fault makes them duplicate, empty or too large
    name = draw(mostly(st.just(f"b{index}"), st.sampled_from(["dup", ""]), fault))
    binding = draw(mostly(st.integers(3 * index, 3 * index + 2), st.one_of(st.integers(0, 10), st.integers(65530, 65540)), fault))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    count = draw(mostly(st.one_of(st.just(0), st.integers(1, 300), st.integers(1, 1 << 20)), st.sampled_from(HUGE), fault))
    if kind == "workgroup":
        count = draw(mostly(st.integers(1, 20_000), st.just(count), fault))
    start = draw(st.integers(0, 600))
    byte_range = draw(
        mostly(
            mostly(st.none(), st.tuples(st.just(start), st.integers(start, start + 600)), 15),
            st.one_of(
                st.tuples(st.integers(0, 600), st.integers(0, 600)),  # start > end half the time
                st.tuples(st.integers(0, 64), st.sampled_from([2**32, U64 - 1, U64])),
            ),
            fault,
        )
    )
    kw = {
        "output_byte_range": byte_range,
        "alignment": draw(mostly(st.sampled_from([None, None, 1, 16, 256, 4096]), st.just(3), fault // 3)),
    }
    if kind == "persistent":
        return BufferDecl(name, binding, BufferAccess.READ_WRITE, dtype, count, persistent=True, **kw)
    if kind == "raw":  # any access with the output flag
        access = draw(st.sampled_from(list(BufferAccess)))
        return BufferDecl(name, binding, access, dtype, count, output=draw(st.booleans()), **kw)
    return getattr(BufferDecl, kind)(name, binding, dtype, count, **kw)


@st.composite
def programs(draw):
    """A Program, or the BackendError its construction raised (a quarter of them carry faults)."""
    fault = draw(mostly(st.just(0), st.just(15), 25))
    n = draw(mostly(st.integers(1, 8), st.just(0), fault // 5))
    try:
        buffers = [draw(decls(i, fault)) for i in range(n)]
        grid_sync = draw(mostly(st.just(False), st.just(True), 30))
        return Program(
            KERNEL,
            buffers,
            workgroup_size=draw(st.sampled_from([(256, 1, 1), (32, 1, 1), (1, 1, 1), (1024, 1, 1), (16, 16, 1), 64])),
            grid_sync=grid_sync,
            phases=draw(st.integers(1, 4)) if grid_sync else draw(mostly(st.just(1), st.just(2), fault // 5)),
            requires=draw(mostly(st.just(()), st.sampled_from([("f16",), ("bf16", "subgroup"), ("collectives",)]))),
        )
    except BackendError as exc:
        return exc


@st.composite
def input_lengths(draw, program):
    lengths = []
    # runtime-sized inputs of one program hold equal element counts (mostly: ragged is refused)
    runtime = draw(mostly(st.integers(0, 5000), st.sampled_from([2**32, 2**61]), 5))
    for decl in program.inputs:
        size = decl.dtype.itemsize
        if draw(st.integers(0, 99)) < 90:  # well formed
            elements = decl.count or draw(mostly(st.just(runtime), st.integers(0, 5000), 5))
            lengths.append(elements * size)
        else:  # anything, often not whole elements
            lengths.append(draw(st.one_of(st.integers(0, 5000), st.sampled_from(HUGE))))
    if draw(st.integers(0, 99)) < 3:  # wrong number of inputs
        lengths = lengths[:-1] if lengths and draw(st.booleans()) else lengths + [16]
    return lengths


dims = st.one_of(st.integers(1, 2048), st.tuples(st.integers(1, 64), st.integers(1, 8), st.integers(1, 2)))
configs = st.builds(
    DispatchConfig,
    workgroup_override=mostly(st.none(), dims, 25),
    grid_override=mostly(st.none(), st.one_of(dims, st.just((2**24, 1, 1))), 25),
    fixpoint_iterations=st.one_of(st.none(), st.integers(1, 3)),
    cooperative=mostly(st.just(False), st.just(True), 15),
)


# ---------------------------------------------------------------- the pipeline and its invariants
@dataclasses.dataclass
class Plan:
    program: Program
    config: DispatchConfig
    caps: DeviceCaps
    lengths: list
    bplan: object
    launch: object
    route: object
    phase_ranges: list
    layout: object
    prepared: Prepared


def build(program, lengths, config, caps, occupancy) -> Plan:
    """The backend's planning sequence (CudaBackend._plan) without the kernel and the device."""
    check_capabilities(program, caps)
    bplan = plan_bindings(program, lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LaunchSizeWarning)  # a static output under a longer input
        launch = plan_launch(program, bplan, config, caps)
    route = route_grid_sync(program, config, launch, caps, occupancy)
    if route.kind == "split":
        ranges = [(k, k + 1) for k in range(program.phases)]
    elif program.grid_sync:
        ranges = [(0, program.phases)]
    else:
        ranges = [None]
    layout = plan_layout(bplan, launch, ranges)
    inputs = program.inputs
    input_specs = [(inputs[i].dtype.itemsize, "u") for i, _, _, _ in layout.inputs]
    output_specs = [(s.decl.dtype.numpy, n // s.decl.dtype.itemsize) for s, (_, n) in zip(bplan.outputs, layout.outputs)]
    prepared = Prepared.from_plan(assemble_plan(program, config, bplan, launch, layout, route))
    return Plan(program, config, caps, lengths, bplan, launch, route, ranges, layout, prepared)


def check_bindings(p: Plan) -> None:
    slots = p.bplan.slots
    bindings = [s.binding for s in slots]
    assert bindings == sorted(bindings) and len(set(bindings)) == len(bindings)
    assert {s.decl.name for s in slots} == {d.name for d in p.program.buffers if d.role is not BindingRole.SHARED}
    assert [s.decl.name for s in p.bplan.outputs] == [d.name for d in p.program.outputs]
    for slot in slots:
        assert slot.byte_len == slot.count * slot.decl.dtype.itemsize < U64
        if slot.input_index >= 0:
            assert p.program.inputs[slot.input_index] is slot.decl
            assert slot.byte_len == p.lengths[slot.input_index]
        elif slot.decl.count:
            assert slot.count == slot.decl.count
        else:
            assert slot.count == p.bplan.runtime_count


def check_launch(p: Plan) -> None:
    launch, caps = p.launch, p.caps
    assert all(b <= m for b, m in zip(launch.block, caps.max_block_dim))
    assert all(g <= m for g, m in zip(launch.grid, caps.max_grid_dim))
    assert launch.threads_per_block <= caps.max_threads_per_block
    assert 0 < launch.element_count < 2**32
    if p.config.grid_override:
        assert launch.element_count == launch.grid[0] * launch.block[0]
    else:
        assert launch.grid[0] * launch.block[0] >= launch.element_count > (launch.grid[0] - 1) * launch.block[0]
    assert launch.shared_bytes <= caps.max_shared_per_block_optin
    for _, offset, _ in launch.shared_offsets:
        assert offset % 16 == 0
    assert p.prepared.launch_geometry() == (launch.grid, launch.block, launch.shared_bytes)


def check_layout(p: Plan) -> None:
    lay, slots = p.layout, p.bplan.slots
    # argument offsets in binding order, one per slot, each aligned as declared
    assert len(lay.arg_offsets) == len(slots)
    regions = []
    for slot, off in zip(slots, lay.arg_offsets):
        assert off % max(REGION_ALIGN, slot.decl.alignment or 1, slot.decl.dtype.itemsize) == 0
        regions.append((off, off + pad16(slot.byte_len), slot))
    words = [params_words(p.bplan, p.launch, r) for r in p.phase_ranges]
    block_bytes = pad16(4 * len(words[0]))
    assert lay.params_blob == b"".join(struct.pack(f"<{len(w)}I", *w).ljust(block_bytes, b"\0") for w in words)
    regions += [(off, off + block_bytes, None) for off in lay.params_offsets]
    # regions are disjoint and inside the slab
    regions.sort(key=lambda r: r[0])
    for (_, end, _), (start, _, _) in zip(regions, regions[1:]):
        assert end <= start
    assert regions[-1][1] <= lay.slab_bytes and lay.slab_bytes % REGION_ALIGN == 0
    assert lay.slab_bytes <= lay.bucket_bytes == bucket_size(lay.slab_bytes)
    # inputs and params first, uploaded in one copy; pure outputs after, zeroed as one span:
    # in staging (riding the upload) when that adds at most HOST_CLEAR_MAX bytes, else by memset
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
    for index, off, nbytes, zero_end in lay.inputs:
        assert nbytes == p.lengths[index] and off + nbytes <= zero_end <= lay.upload_end
    # byte totals
    uploaded = sum(p.lengths[i] for i, _, _, _ in lay.inputs)
    assert lay.h2d_bytes == uploaded + sum(4 * len(w) for w in words)
    assert lay.d2h_bytes == sum(n for _, n in lay.outputs)
    # readbacks inside the slab, disjoint, covering every output range
    for off, n in lay.readbacks:
        assert 0 < n and off + n <= lay.slab_bytes
    for (a, n), (b, _) in zip(lay.readbacks, lay.readbacks[1:]):
        assert a + n <= b
    for slot, (dev, n) in zip(p.bplan.outputs, lay.outputs):
        start, end = slot.decl.output_byte_range or (0, slot.byte_len)
        assert (dev, n) == (lay.arg_offsets[slots.index(slot)] + start, end - start)
        assert n == 0 or any(off <= dev and dev + n <= off + c for off, c in lay.readbacks)


@SETTINGS
@given(
    data=st.data(),
    config=configs,
    caps=st.sampled_from([DeviceCaps(), SMALL_CAPS, DeviceCaps(), SMALL_CAPS, DeviceCaps(cc=(5, 0), cooperative_launch=False)]),
    occupancy=st.integers(0, 8),
)
def test_every_outcome_is_a_valid_plan_or_a_backend_error(data, config, caps, occupancy):
    program = data.draw(programs())
    if isinstance(program, BackendError):
        return
    lengths = data.draw(input_lengths(program))
    try:
        plan = build(program, lengths, config, caps, occupancy)
    except BackendError:
        return
    check_bindings(plan)
    check_launch(plan)
    check_layout(plan)


# A narrower generator of programs that always plan, so the invariants see many valid layouts.
@st.composite
def valid_cases(draw):
    n = draw(st.integers(1, 10))
    bindings = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n, unique=True))
    buffers = [draw(decls_valid(f"v{i}", b)) for i, b in enumerate(bindings)]
    buffers.append(BufferDecl.read("rt", 41, draw(st.sampled_from(sorted(DTYPES)))))  # one runtime input
    program = Program(KERNEL, buffers, workgroup_size=draw(st.sampled_from([32, 128, 256])))
    runtime = draw(st.integers(1, 3000))  # runtime-sized inputs of one program: equal lengths
    lengths = []
    for decl in program.inputs:
        lengths.append((decl.count or runtime) * decl.dtype.itemsize)
    return program, lengths


@st.composite
def decls_valid(draw, name, binding):
    kind = draw(st.sampled_from(["read", "uniform", "read_write", "output", "write_only"]))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    count = draw(st.one_of(st.just(0), mostly(st.integers(1, 3000), st.integers(3000, 40_000), 20)))
    rng = None
    if kind in ("output", "write_only", "read_write") and count and draw(st.booleans()):
        size = DTYPES[dtype].itemsize  # byte ranges cover whole elements
        start = draw(st.integers(0, count))
        rng = (start * size, draw(st.integers(start, count)) * size)
    alignment = draw(st.sampled_from([None, 16, 512, 4096]))
    return getattr(BufferDecl, kind)(name, binding, dtype, count, output_byte_range=rng, alignment=alignment)


@SETTINGS
@given(case=valid_cases())
def test_valid_programs_plan_and_satisfy_the_invariants(case):
    program, lengths = case
    plan = build(program, lengths, DispatchConfig(), DeviceCaps(), 0)
    check_bindings(plan)
    check_launch(plan)
    check_layout(plan)
