"""One dispatch planned: every decision the hot path needs, in one frozen :class:`DispatchPlan`.

Planning runs once per (program, input byte lengths, config); the core converts the plan into C
data (``Prepared.from_plan``) and replays it. Only the kernel module (compile, load, occupancy)
needs the driver, through the ``modules`` object the backend passes in.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._accounting import bucket_size
from ..config import DispatchConfig
from ..errors import DeviceOutOfMemory, InvalidProgram, UnsupportedFeature
from ..program import Program, require_program
from .binding import BindingPlan, input_spec, plan_bindings
from .caps import DeviceCaps, check_capabilities
from .launch import LaunchPlan, Route, barrier_ceiling, plan_launch, route_grid_sync
from .layout import SlabLayout, plan_layout

if TYPE_CHECKING:
    from .stream import StreamPlan, StreamTuning

__all__ = [
    "DispatchPlan",
    "plan_dispatch",
    "plan_route",
    "assemble_plan",
    "staging_for",
    "plan_graph",
    "plan_graph_trial",
    "MIRROR_MAX",
    "MAX_ARGS",
    "GRAPH_MIN_LAUNCHES",
    "GRAPH_MAX_LAUNCHES",
]

# Slabs up to this size keep one pinned mirror (one upload, one readback); larger ones use the
# staging ring. H200: at 3 x 128 KiB the mirror wins (67 vs 75 us), at 3 x 256 KiB the ring (96 vs
# 111 us). A backend passes its own (vyre_cuda._knobs).
MIRROR_MAX = 512 << 10
MAX_ARGS = 256  # kernel arguments the core packs (one per buffer binding + the params pointer)
AUDIT_BLOCK = 256  # pinned bytes a ring-staged cooperative dispatch reads its barrier counter into
# From this many launches a dispatch replays them as one CUDA graph (graph=None). H200: dependent
# launches cost ~4 us issued, ~1 us as a graph; a single launch was faster either way on different
# machines. The predicted crossover is 2-3 (notes/graphs.md); 4 keeps a margin.
# VYRE_CUDA_GRAPH_MIN_LAUNCHES overrides it.
GRAPH_MIN_LAUNCHES = 4
# ... and at most this many (forced too): a graph's cost grows with its nodes, issuing's does not.
GRAPH_MAX_LAUNCHES = 10_000


@dataclass(frozen=True)
class DispatchPlan:
    """Everything planning decided for one (program, input lengths, config).

    ``bindings``, ``launch``, ``layout``, ``route`` and ``kernel`` are the planning stages'
    results; the rest is what the core executes: function and grid-barrier addresses (0 when
    unused), per-input ``(itemsize, kind)`` checks, per-output ``(numpy dtype, element count)``,
    the cooperative barrier ceiling, the staging decision and the kernel argument count.
    ``tuned_block``/``tuning``: an ``autotune=True`` plan's block and where it came from.
    """

    program: Program
    config: DispatchConfig
    bindings: BindingPlan
    launch: LaunchPlan
    layout: SlabLayout
    route: Route
    kernel: object
    function: int
    barrier: int
    gate: object
    input_specs: tuple
    output_specs: tuple
    barrier_ceiling: int
    mirror: bool
    device_block: int
    staging_block: int
    audit_offset: int
    arg_count: int
    tuned_block: tuple | None = None
    tuning: str = ""
    graph: bool = False
    graph_reason: str = "not planned"
    graph_trial: bool = False  # issued and replayed alternately at first; the faster one stays
    stream: StreamPlan | None = None  # an elementwise dispatch's (route.kind "streamed" if chosen)
    # the LoadedModule of ``function`` (None offline): an evicted module stays loaded while a plan
    # made from it may still launch
    module: object = field(default=None, compare=False, repr=False)

    @property
    def iterations(self) -> int:
        """Launches (or phase sequences) per dispatch: the config's ``fixpoint_iterations``, else 1."""
        return self.config.iterations


def staging_for(layout: SlabLayout, cooperative_audit: bool, mirror_max: int = MIRROR_MAX) -> tuple:
    """(mirror, device block, staging block, audit offset) of a layout: a small slab has one
    pinned mirror and a power-of-two device block (a cooperative launch's barrier counter lands
    past the slab image); a large one is exact-size and streams through the ring."""
    if layout.slab_bytes <= mirror_max:
        return True, layout.bucket_bytes, bucket_size(layout.slab_bytes + 16), layout.slab_bytes
    return False, layout.slab_bytes, AUDIT_BLOCK if cooperative_audit else 0, 0


def _graph_threshold() -> int:
    raw = os.environ.get("VYRE_CUDA_GRAPH_MIN_LAUNCHES", "")
    try:
        return max(1, int(raw)) if raw else GRAPH_MIN_LAUNCHES
    except ValueError:
        return GRAPH_MIN_LAUNCHES


def plan_graph_trial(config: DispatchConfig, route_kind: str, graph: bool) -> bool:
    """Whether a plan below the launch threshold times both paths on its first blocking dispatches
    and keeps the faster (which wins differs between machines of one kind). Never for a forced
    choice, a cooperative launch, or with ``VYRE_CUDA_GRAPH_TRIAL=0``.

    >>> plan_graph_trial(DispatchConfig(), "regular", False)
    True
    >>> plan_graph_trial(DispatchConfig(graph=False), "regular", False)
    False
    """
    if graph or config.graph is not None or route_kind in ("cooperative", "streamed"):
        return False
    return os.environ.get("VYRE_CUDA_GRAPH_TRIAL", "1").strip() not in ("0", "false", "no", "off")


def plan_graph(config: DispatchConfig, route_kind: str, phases: int) -> tuple:
    """(replay as a CUDA graph?, why): the launches per dispatch against the threshold, unless
    ``DispatchConfig(graph=...)`` forces it.

    >>> plan_graph(DispatchConfig(fixpoint_iterations=100), "regular", 1)
    (True, '100 launches per dispatch >= 4')
    >>> plan_graph(DispatchConfig(), "regular", 1)[0], plan_graph(DispatchConfig(graph=True), "regular", 1)[0]
    (False, True)
    """
    if route_kind == "streamed":
        return False, "the streamed route issues each chunk's launch on its own stream"
    launches = config.iterations * (phases if route_kind == "split" else 1)
    if config.graph is not False and launches > GRAPH_MAX_LAUNCHES:
        return False, f"{launches} launches per dispatch > {GRAPH_MAX_LAUNCHES} (too many graph nodes)"
    if config.graph is not None:
        return config.graph, f"DispatchConfig(graph={config.graph})"
    threshold = _graph_threshold()
    if launches >= threshold:
        return True, f"{launches} launches per dispatch >= {threshold}"
    return False, f"{launches} launch(es) per dispatch < {threshold}"


def plan_route(program, lengths, config: DispatchConfig, caps: DeviceCaps, modules):
    """Bindings, launch, kernel module and route; refuses what the device cannot run before any
    compile. ``modules.load(program, bindings)`` returns (compiled kernel, loaded module)."""
    require_program(program, "dispatch")
    check_capabilities(program, caps)
    bindings = plan_bindings(program, lengths)
    launch = plan_launch(program, bindings, config, caps)
    wants_cooperative = program.grid_sync or config.cooperative
    if wants_cooperative and not caps.supports("cooperative"):
        route_grid_sync(program, config, launch, caps, 0)  # refuses before any compile
    compiled, module = modules.load(program, bindings)
    module.ensure_shared(launch.shared_bytes)
    occupancy = module.occupancy(launch.threads_per_block, launch.shared_bytes) if wants_cooperative else 0
    route = route_grid_sync(program, config, launch, caps, occupancy)
    return bindings, launch, compiled, module, route


def check_serial_budget(config, slab_bytes: int) -> None:
    """Refuse a serial dispatch whose device slab exceeds ``DispatchConfig(device_memory_budget)``."""
    budget = config.device_memory_budget
    if budget is not None and slab_bytes > budget:
        raise DeviceOutOfMemory(
            f"the dispatch needs {slab_bytes:,} bytes of device memory but "
            f"DispatchConfig(device_memory_budget={budget:,}) allows {budget:,}",
            f"raise device_memory_budget to at least {slab_bytes:,}, or split the dispatch into bounded chunks",
            status="budget",
            call="plan",
        )


def _phase_ranges(program, route) -> list:
    if route.kind == "split":
        return [(k, k + 1) for k in range(program.phases)]  # one params block per phase
    if program.grid_sync:
        return [(0, program.phases)]
    return [None]


def plan_dispatch(
    program,
    lengths,
    config: DispatchConfig,
    caps: DeviceCaps,
    modules,
    device_inputs=frozenset(),
    free_memory: Callable[[], int | None] | None = None,
    stream_tuning: StreamTuning | None = None,
    mirror_max: int = MIRROR_MAX,
) -> DispatchPlan:
    """Plan one dispatch of ``program`` on inputs of ``lengths`` bytes (see :class:`DispatchPlan`).
    ``device_inputs``: indices of inputs in device memory; ``free_memory``: reads the device's free
    bytes, only when a streamed route is sized; ``stream_tuning``: None for the defaults."""
    bindings, launch, compiled, module, route = plan_route(program, lengths, config, caps, modules)
    cooperative = route.kind == "cooperative"
    if program.grid_sync and cooperative and not module.barrier:
        raise InvalidProgram(
            f"grid_sync program's kernel {program.kernel.entry!r} defines no _vyre_grid_barrier",
            'include "vyre_cuda.cuh" and call vyre_grid_sync() between phases',
        )
    layout = plan_layout(bindings, launch, _phase_ranges(program, route), frozenset(device_inputs))
    stream = None
    if program.elementwise or config.streamed:
        from .stream import plan_stream  # noqa: PLC0415 (elementwise programs only: kept off the first import)

        stream = plan_stream(
            program,
            bindings,
            launch,
            config,
            caps,
            serial_bytes=layout.slab_bytes,
            device_inputs=device_inputs,
            free_memory=free_memory,
            tuning=stream_tuning,
        )
        if stream.streamed:
            assert stream.full is not None
            route = Route("streamed", stream.reason, stream.full.grid[0], 0)
    if not (stream and stream.streamed):
        check_serial_budget(config, layout.slab_bytes)
        budget = caps.total_memory - caps.total_memory // 10
        if caps.total_memory and layout.slab_bytes > budget:
            raise DeviceOutOfMemory(
                f"the dispatch needs {layout.slab_bytes:,} bytes of device memory but the budget is "
                f"{budget:,} bytes (90% of {caps.total_memory:,} total)",
                "split the dispatch into bounded chunks",
                status="budget",
                call="plan",
            )
    barrier = module.barrier if cooperative else 0
    plan = assemble_plan(
        program,
        config,
        bindings,
        launch,
        layout,
        route,
        compiled,
        module.function,
        barrier,
        module.gate if cooperative and barrier else None,
        module,
        mirror_max,
    )
    return plan if stream is None else dataclasses.replace(plan, stream=stream)


def assemble_plan(
    program,
    config,
    bindings,
    launch,
    layout,
    route,
    kernel=None,
    function=0,
    barrier=0,
    gate=None,
    module=None,
    mirror_max: int = MIRROR_MAX,
) -> DispatchPlan:
    """The executable decisions derived from the planning stages' results (pure)."""
    arg_count = len(layout.arg_offsets) + 1
    if arg_count > MAX_ARGS:
        raise UnsupportedFeature(
            f"the kernel would take {arg_count} arguments; at most {MAX_ARGS} are supported",
            "pack buffers together so the program has fewer bindings",
        )
    inputs = program.inputs
    input_specs = tuple(input_spec(inputs[index]) for index, _, _, _ in layout.inputs)
    output_specs = tuple(
        (slot.decl.dtype.numpy, nbytes // slot.decl.dtype.itemsize)  # byte ranges cover whole elements
        for slot, (_, nbytes) in zip(bindings.outputs, layout.outputs)
    )
    mirror, device_block, staging_block, audit_offset = staging_for(
        layout, bool(route.kind == "cooperative" and barrier), mirror_max
    )
    graph, graph_reason = plan_graph(config, route.kind, program.phases)
    graph_trial = plan_graph_trial(config, route.kind, graph)
    if graph_trial:
        graph_reason += "; measured against a graph on the first blocking dispatches (the faster stays)"
    return DispatchPlan(
        program=program,
        config=config,
        bindings=bindings,
        launch=launch,
        layout=layout,
        route=route,
        kernel=kernel,
        function=function,
        barrier=barrier,
        gate=gate,
        input_specs=input_specs,
        output_specs=output_specs,
        barrier_ceiling=barrier_ceiling(program.phases, route.grid_blocks, route.kind),
        mirror=mirror,
        device_block=device_block,
        staging_block=staging_block,
        audit_offset=audit_offset,
        arg_count=arg_count,
        graph=graph,
        graph_reason=graph_reason,
        graph_trial=graph_trial,
        module=module,
    )
