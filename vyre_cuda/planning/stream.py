"""The streamed route of an elementwise dispatch, planned: chunks of rows, streams, slots, bytes held.

An elementwise program's rows compute independently, so chunk ``k+1`` can upload while chunk ``k``
computes and chunk ``k-1`` reads back: the dispatch nears the duplex DMA time and holds only the
chunks in flight, so it may exceed device memory. :func:`plan_stream` makes the frozen
:class:`StreamPlan` the core executes (``vyre_cuda._streamed``): one device block holding a shared
region (inputs not cut, uploaded once, and the params blocks) then one slot per stream; chunk ``k``
runs on stream and slot ``k % streams``, so a slot is reused only after its previous readback.
A chunk's kernel sees a smaller dispatch of the same program: word 0 is the launch rule applied to
the chunk's counts, a cut binding's word its chunk count. The byte layout and the chunk size that
fits a limit are :mod:`.stream_budget`'s; the constants were measured on an H200 (README,
"Streamed dispatch").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from .._accounting import U64_MAX, align_up
from .._validate import check_int
from ..errors import ValidationError
from ..program import BindingRole
from .caps import DeviceCaps
from .launch import params_words, plan_launch
from .layout import COPY_ALIGN
from .stream_budget import Geometry, budget_too_small, fit, no_chunk_fits, padded

__all__ = [
    "STREAM_CHUNK_BYTES",
    "STREAM_MIN_CHUNKS",
    "STREAM_COUNT",
    "STREAM_DIRECT_COUNT",
    "STREAM_MIN_WAVES",
    "STREAM_MIN_CHUNK_BYTES",
    "StreamTuning",
    "StreamDevice",
    "StreamBinding",
    "ChunkLaunch",
    "ChunkSpan",
    "Chunk",
    "StreamPlan",
    "plan_stream",
]

# Bytes of the largest cut buffer in one chunk: a CuPy prototype reached 1.04x the duplex DMA
# limit of an H200 with 8 MiB chunks on 3-4 streams.
STREAM_CHUNK_BYTES = 8 << 20
# Fewer chunks than this keep the serial route: one chunk overlaps nothing.
STREAM_MIN_CHUNKS = 2
# Streams (= slots) in flight. H200, 64-256 MiB buffers from numpy: 3 streams 1.23x the duplex DMA
# time, 2 streams 1.47x. From page-locked buffers (nothing staged) 2 are best (1.09x; 3: 1.12x).
STREAM_COUNT = 3
STREAM_DIRECT_COUNT = 2
STREAM_MIN_WAVES = 1  # a chunk's launch covers at least this many waves over the SMs
# The fewest bytes a chunk moves (uploads plus readbacks) when device_memory_budget sizes the
# chunks. A chunk costs a fixed F (~13-39 us measured on an H200) beside its DMA, so chunks of m
# bytes stream at R * m / (m + F * R): half the unbudgeted rate R near 2 MB; 4 MiB gives ~0.65 R.
# For 3 x 256 MiB f32 vecadd the smallest budget is then 12,584,960 bytes.
STREAM_MIN_CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class StreamTuning:
    """The planner's constants (tests and the tuner pass others). ``min_chunk_bytes=0`` drops the
    budget's chunk floor."""

    chunk_bytes: int = STREAM_CHUNK_BYTES
    min_chunks: int = STREAM_MIN_CHUNKS
    streams: int = STREAM_COUNT
    min_waves: int = STREAM_MIN_WAVES
    min_chunk_bytes: int = STREAM_MIN_CHUNK_BYTES

    def __post_init__(self):
        for f in dataclasses.fields(self):
            name, low = f"StreamTuning.{f.name}", 0 if f.name in ("min_waves", "min_chunk_bytes") else 1
            fix = f"pass {name} as an int >= {low}"
            value = check_int(
                name, getattr(self, f.name), minimum=low, maximum=U64_MAX, expected=f"an int >= {low}", fix=fix
            )
            object.__setattr__(self, f.name, value)


@dataclass(frozen=True)
class StreamDevice:
    """The bytes a dispatch may hold (None: unknown), the copy engines and the SM count."""

    free_memory: int | None
    copy_engines: int = 2
    sm_count: int = 132

    @classmethod
    def from_caps(cls, caps: DeviceCaps, free_memory: int | None = None) -> StreamDevice:
        """The device of ``caps``; a dispatch may hold 90% of ``free_memory`` (the device pool's
        rule) and of total memory (plan_dispatch's budget)."""
        limits = [m - m // 10 for m in (free_memory, caps.total_memory) if m]
        return cls(min(limits) if limits else None, caps.copy_engines, caps.sm_count)


@dataclass(frozen=True)
class StreamBinding:
    """One non-workgroup binding as the streamed route moves it: a cut one has a region in every
    slot (one full chunk, padded), a whole one its buffer in the shared region."""

    name: str
    binding: int
    role: BindingRole
    cut: bool
    itemsize: int
    row_elements: int
    total_bytes: int
    region_offset: int
    region_bytes: int
    input_index: int
    output_index: int
    zeroed: bool = True  # a pure output's BufferDecl.zeroed

    @property
    def upload(self) -> bool:
        return self.role in (BindingRole.INPUT, BindingRole.INPUT_OUTPUT)

    @property
    def readback(self) -> bool:
        return self.role in (BindingRole.OUTPUT, BindingRole.INPUT_OUTPUT)

    @property
    def clear(self) -> bool:
        """Zeroed on the device before each chunk's launch (unless ``zeroed=False``)."""
        return self.role is BindingRole.OUTPUT and self.zeroed


@dataclass(frozen=True)
class ChunkLaunch:
    """A chunk's launch: word 0, grid, params block and its offset in the shared region."""

    rows: int
    element_count: int
    grid: tuple
    params: tuple
    params_offset: int


@dataclass(frozen=True)
class ChunkSpan:
    """One cut binding in one chunk: its bytes in the caller's buffer and the device block."""

    name: str
    host_offset: int
    nbytes: int
    count: int
    device_offset: int


@dataclass(frozen=True)
class Chunk:
    index: int
    row_begin: int
    row_end: int
    stream: int  # the stream and the slot it runs in
    spans: tuple  # ChunkSpan per cut binding, binding order
    launch: ChunkLaunch


@dataclass(frozen=True)
class StreamPlan:
    """The route (``"streamed"`` or ``"serial"``, with ``reason``) and, when it streams, its
    geometry: ``rows`` in ``chunk_count`` chunks of ``chunk_rows`` (the last holds the rest) on
    ``streams`` streams and slots, ``device_bytes = shared_bytes + streams * slot_bytes`` (at most
    ``budget``), and the launches of a full and of the last chunk. :meth:`chunk` computes chunk
    ``k`` from these fields, so a plan of a million chunks stays small."""

    route: str
    reason: str
    rows: int = 0
    align: int = 1
    chunk_rows: int = 0
    chunk_count: int = 0
    streams: int = 0
    direct_streams: int = 0  # streams used when nothing is staged (every buffer page-locked)
    bindings: tuple = ()  # StreamBinding, binding order
    shared_bytes: int = 0
    slot_bytes: int = 0
    device_bytes: int = 0
    budget: int | None = None
    staging_upload_bytes: int = 0
    staging_readback_bytes: int = 0
    full: ChunkLaunch | None = None
    last: ChunkLaunch | None = None
    h2d_bytes: int = 0
    d2h_bytes: int = 0

    @property
    def streamed(self) -> bool:
        return self.route == "streamed"

    @property
    def staging_slots(self) -> int:
        """Pinned staging slots per direction: one per chunk in flight."""
        return self.streams

    def chunk(self, k: int) -> Chunk:
        if not 0 <= k < self.chunk_count:
            raise IndexError(f"chunk {k} of a plan with {self.chunk_count} chunks")
        begin = k * self.chunk_rows
        end = min(begin + self.chunk_rows, self.rows)
        slot = k % self.streams
        base = self.shared_bytes + slot * self.slot_bytes
        spans = tuple(
            ChunkSpan(
                b.name,
                begin * b.row_elements * b.itemsize,
                (end - begin) * b.row_elements * b.itemsize,
                (end - begin) * b.row_elements,
                base + b.region_offset,
            )
            for b in self.bindings
            if b.cut
        )
        launch = self.last if k == self.chunk_count - 1 else self.full
        assert launch is not None
        return Chunk(k, begin, end, slot, spans, launch)

    def chunks(self):
        """Every chunk, in order."""
        return (self.chunk(k) for k in range(self.chunk_count))


MAX_STREAMS = 8  # (the core keeps the stream handles in fixed arrays)


def _stream_count(copy_engines: int, wanted: int) -> int:
    # two copy engines: upload, kernel and readback overlap; one: copies serialise, kernel overlaps
    wanted = min(wanted, MAX_STREAMS)
    if copy_engines >= 2:
        return wanted
    return min(wanted, 2) if copy_engines == 1 else 1


def _chunk_launch(program, bindings, widths, config, caps, rows: int, params_offset: int) -> ChunkLaunch:
    """The launch of a chunk of ``rows`` rows: the program's own launch rule on the chunk's counts."""
    slots = tuple(
        dataclasses.replace(
            s, count=rows * widths[s.decl.name], byte_len=rows * widths[s.decl.name] * s.decl.dtype.itemsize
        )
        if s.decl.name in widths
        else s
        for s in bindings.slots
    )
    by_name = {s.decl.name: s for s in slots}
    # runtime_inputs=(): the undersized-launch warning was decided once, on the whole dispatch
    chunk_plan = dataclasses.replace(
        bindings, slots=slots, outputs=tuple(by_name[s.decl.name] for s in bindings.outputs), runtime_inputs=()
    )
    launch = plan_launch(program, chunk_plan, config, caps)
    words = tuple(params_words(chunk_plan, launch))
    return ChunkLaunch(rows, launch.element_count, launch.grid, words, params_offset)


def serial_blocker(program, config, device_inputs) -> tuple:
    """``(why, fix)`` when this dispatch cannot stream, else ``("", "")``."""
    if not program.elementwise:
        label = program.name or program.kernel.entry
        return (
            f"program {label!r} is not declared elementwise",
            "declare Program(..., elementwise=True) (or the names of the inputs to cut) when row i of "
            "every output depends only on row i of the inputs, or pass streamed=None",
        )
    checks = (
        (config.cooperative, "cooperative=True synchronises the whole grid", "drop cooperative=True"),
        (
            config.grid_override is not None,
            f"grid_override={config.grid_override} fixes the grid of the whole dispatch",
            "drop grid_override (each chunk's grid follows its rows)",
        ),
        (
            config.elements is not None,
            f"elements={config.elements} fixes word 0 of the whole dispatch",
            "drop elements (each chunk's word 0 is its own element count)",
        ),
        (
            config.outputs == "device",
            "outputs='device' keeps every output on the device, so nothing streams back",
            "pass outputs='host'",
        ),
        (config.graph is True, "graph=True replays the launches as one CUDA graph", "drop graph=True"),
        (
            bool(device_inputs),
            f"input(s) {sorted(device_inputs)} are device memory, so there is nothing to upload in chunks",
            "pass host arrays",
        ),
    )
    for hit, why, fix in checks:
        if hit:
            return f"DispatchConfig: {why}", f"{fix}, or pass streamed=None"
    return "", ""


def shared_rows(program, bindings) -> tuple:
    """``(rows, {cut name: elements per row}, why not)``: a row is an element of the smallest cut
    binding; every cut binding holds a whole number of elements per row."""
    counts = {s.decl.name: s.count for s in bindings.slots if s.decl.name in program.elementwise_bindings}
    rows = min(counts.values())
    if rows == 0:
        empty = [n for n, c in counts.items() if c == 0]
        return 0, {}, f"elementwise binding(s) {empty} are empty"
    if any(c % rows for c in counts.values()):
        why = (
            f"the elementwise bindings' element counts {counts} are not whole multiples of the "
            f"smallest ({rows}), so they share no row"
        )
        return 0, {}, why
    return rows, {n: c // rows for n, c in counts.items()}, ""


def plan_stream(
    program,
    bindings,
    launch,
    config,
    caps: DeviceCaps,
    *,
    serial_bytes: int,
    device: StreamDevice | None = None,
    free_memory: Callable[[], int | None] | None = None,
    tuning: StreamTuning | None = None,
    device_inputs=frozenset(),
) -> StreamPlan:
    """The route of one dispatch and, when it can stream, its :class:`StreamPlan` (pure).

    ``serial_bytes``: the serial route's slab; ``device``: by default from ``caps`` and
    ``free_memory()`` (a driver call, made only once a route is being sized). The route streams
    when forced, when the serial slab exceeds the limit (budget or free memory), or at
    ``tuning.min_chunks`` chunks or more. Under ``device_memory_budget`` no chunk moves fewer than
    ``tuning.min_chunk_bytes``: a budget forcing smaller ones is a ValidationError (naming the
    smallest that works) when the dispatch must stream, else the route is serial.
    """
    tuning = tuning or StreamTuning()
    forced = config.streamed is True
    if config.streamed is False:
        return StreamPlan("serial", "DispatchConfig(streamed=False)")
    why, fix = serial_blocker(program, config, device_inputs)
    rows, widths = 0, {}
    if not why:
        rows, widths, why = shared_rows(program, bindings)
        fix = "pass elementwise bindings with a whole number of elements per row, or streamed=None"
    if why:
        if forced:
            raise ValidationError(f"DispatchConfig(streamed=True) cannot stream this dispatch: {why}", fix)
        return StreamPlan("serial", why)
    if device is None:
        device = StreamDevice.from_caps(caps, None if free_memory is None else free_memory())
    limits = [b for b in (config.device_memory_budget, device.free_memory) if b is not None]
    limit = min(limits) if limits else None
    needed = limit is not None and serial_bytes > limit

    align = program.align
    row_bytes = max(widths[s.decl.name] * s.decl.dtype.itemsize for s in bindings.slots if s.decl.name in widths)
    per_row_launch = max(1, launch.element_count // rows)
    fill = -(-device.sm_count * tuning.min_waves * launch.block[0] // per_row_launch)
    target = max(tuning.chunk_bytes // row_bytes, fill, 1)
    target = min(rows, max(align, target // align * align))
    wanted = -(-rows // target) >= tuning.min_chunks
    params_len = len(params_words(bindings, launch))
    geometry = Geometry(bindings, widths, align_up(4 * params_len, COPY_ALIGN, "params block"))
    wanted_streams = _stream_count(device.copy_engines, tuning.streams)
    floor = None
    if config.device_memory_budget is not None and config.device_memory_budget == limit and tuning.min_chunk_bytes:
        least = -(-tuning.min_chunk_bytes // geometry.moved_per_row)  # rows
        floor = min(target, -(-least // align) * align)
    chunk_rows, streams = fit(geometry, target, align, wanted_streams, limit, rows, floor)
    if not chunk_rows:
        assert limit is not None  # (without a limit the target always fits)
        if floor is not None:
            if forced or needed:
                raise budget_too_small(geometry, target, align, wanted_streams, rows, floor, limit, tuning)
            return StreamPlan(
                "serial",
                f"the {limit:,}-byte budget cuts the rows into chunks that move fewer than "
                f"{tuning.min_chunk_bytes:,} bytes each",
            )
        if forced or needed:
            raise no_chunk_fits(geometry, min(align, rows), limit, config.device_memory_budget)
        return StreamPlan("serial", f"one chunk of {min(align, rows)} row(s) does not fit the {limit:,}-byte budget")
    chunk_count = -(-rows // chunk_rows)
    streams = min(streams, chunk_count)
    last_rows = rows - (chunk_count - 1) * chunk_rows
    p_full, p_last = geometry.params_offsets
    full = _chunk_launch(program, bindings, widths, config, caps, chunk_rows, p_full)
    last_offset = p_last if last_rows != chunk_rows else p_full  # (one block when the chunks are equal)
    last = _chunk_launch(program, bindings, widths, config, caps, last_rows, last_offset)
    for view in (full, last):
        largest = view.rows * max(widths.values())
        if view.element_count > largest:
            why = (
                f"the launch rule gives a chunk of {view.rows} row(s) {view.element_count} elements, more than "
                f"its largest cut binding holds ({largest}), so the chunk's threads would run past it"
            )
            if forced:
                raise ValidationError(
                    f"DispatchConfig(streamed=True) cannot stream this dispatch: {why}",
                    "size the launch by a binding that is cut (Program(launch=...)), or pass streamed=None",
                )
            return StreamPlan("serial", why)

    slot_bytes, offsets, sizes = geometry.slot(chunk_rows)
    stream_bindings = tuple(
        StreamBinding(
            name=s.decl.name,
            binding=s.binding,
            role=s.role,
            cut=s.decl.name in widths,
            itemsize=s.decl.dtype.itemsize,
            row_elements=widths.get(s.decl.name, s.count),
            total_bytes=s.byte_len,
            region_offset=offsets[s.decl.name] if s.decl.name in widths else geometry.whole_offsets[s.decl.name],
            region_bytes=sizes[s.decl.name] if s.decl.name in widths else padded(s.byte_len),
            input_index=s.input_index,
            output_index=s.output_index,
            zeroed=s.decl.zeroed,
        )
        for s in bindings.slots
    )
    cut = [b for b in stream_bindings if b.cut]
    held = geometry.held(chunk_rows, streams)
    params_h2d = 4 * params_len * (1 if last_rows == chunk_rows else 2)
    if forced:
        route, reason = "streamed", "DispatchConfig(streamed=True)"
    elif needed:
        route = "streamed"
        reason = f"the serial route needs {serial_bytes:,} device bytes, over the {limit:,}-byte budget"
    elif wanted:
        route, reason = "streamed", f"{chunk_count} chunks of {chunk_rows} rows >= {tuning.min_chunks}"
    else:
        route, reason = "serial", f"{chunk_count} chunk(s) of {chunk_rows} rows < {tuning.min_chunks}"
    if route == "streamed":
        reason += f"; {streams} stream(s), {held:,} device bytes held"
    return StreamPlan(
        route=route,
        reason=reason,
        rows=rows,
        align=align,
        chunk_rows=chunk_rows,
        chunk_count=chunk_count,
        streams=streams,
        direct_streams=min(streams, STREAM_DIRECT_COUNT),
        bindings=stream_bindings,
        shared_bytes=geometry.shared_bytes,
        slot_bytes=slot_bytes,
        device_bytes=held,
        budget=limit,
        staging_upload_bytes=sum(b.region_bytes for b in cut if b.upload),
        staging_readback_bytes=sum(b.region_bytes for b in cut if b.readback),
        full=full,
        last=last,
        h2d_bytes=sum(b.total_bytes for b in stream_bindings if b.upload) + params_h2d,
        d2h_bytes=sum(b.total_bytes for b in stream_bindings if b.readback),
    )
