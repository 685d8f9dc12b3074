"""Launch geometry, dynamic shared memory, params words and the grid-sync route."""

from __future__ import annotations

import os
import sys
import threading
import types
import warnings
import weakref
from dataclasses import dataclass

from .._accounting import align_up, checked_add, checked_mul
from .._validate import is_int
from ..errors import BackendError, CooperativeResidencyExceeded, InvalidProgram, UnsupportedFeature, ValidationError
from ..program import LaunchSizeWarning
from .caps import DeviceCaps

__all__ = [
    "LaunchPlan",
    "plan_launch",
    "params_words",
    "Route",
    "resident_limit",
    "route_grid_sync",
    "DEFAULT_SHARED_LIMIT",
    "barrier_ceiling",
]

U32_MAX = 0xFFFFFFFF
DEFAULT_SHARED_LIMIT = 48 * 1024  # above this a kernel must opt in (cuFuncSetAttribute)


@dataclass(frozen=True)
class LaunchPlan:
    block: tuple
    grid: tuple
    element_count: int
    shared_bytes: int
    shared_offsets: tuple  # (name, byte offset, bytes) per workgroup buffer
    sized_by: str = ""  # what set element_count, for traces and messages

    @property
    def threads_per_block(self) -> int:
        """Threads of one block (the product of ``block``)."""
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def grid_blocks(self) -> int:
        """Blocks of the grid (the product of ``grid``)."""
        return self.grid[0] * self.grid[1] * self.grid[2]


def _default_count(bplan) -> tuple:
    """``(elements, description, sizing binding name)``: the largest output; with workgroup
    buffers (or no outputs) the largest binding, since threads then also stage data they do not write."""
    if bplan.outputs and not bplan.workgroup:
        slot = max(bplan.outputs, key=lambda s: s.count)
        return slot.count, f"the largest output, {slot.decl.name!r}", slot.decl.name
    if not bplan.slots:
        return 0, "no buffer", ""
    slot = max(bplan.slots, key=lambda s: s.count)
    why = "workgroup buffers" if bplan.workgroup else "no outputs"
    return slot.count, f"the largest binding, {slot.decl.name!r} (the program has {why})", slot.decl.name


def _declared_count(program, bplan) -> tuple:
    """Element count from ``Program.launch`` (a binding name or a callable)."""
    rule = program.launch
    counts = {s.decl.name: s.count for s in bplan.slots}
    if isinstance(rule, str):
        return counts[rule], f"launch={rule!r}"
    try:
        value = rule(dict(counts))
    except BackendError:
        raise
    except Exception as exc:
        raise InvalidProgram(
            f"Program.launch callable {_name(rule)} raised {type(exc).__name__}: {exc} (called with {counts})",
            "make the callable return the launch element count for every input length",
        ) from exc
    if not is_int(value) or value < 0:
        raise InvalidProgram(
            f"Program.launch callable {_name(rule)} returned {value!r} for {counts}; it must return a non-negative int",
            "return the number of elements the launch covers, e.g. lambda n: n['x']",
        )
    return int(value), f"launch={_name(rule)}"


def _name(rule) -> str:
    return getattr(rule, "__qualname__", None) or repr(rule)


def plan_launch(program, bplan, config, caps: DeviceCaps) -> LaunchPlan:
    """Block, grid, element count and dynamic shared memory of one dispatch. The element count
    (word 0) is, first match wins: ``config.elements``, the program's ``launch`` rule,
    ``grid[0] * block[0]`` under ``grid_override``, the default rule. The grid is
    ``grid_override`` or ``ceil(elements / block[0])``."""
    block = config.workgroup_override or program.workgroup_size
    for axis, (b, limit) in enumerate(zip(block, caps.max_block_dim)):
        if b > limit:
            raise ValidationError(
                f"block dimension {'xyz'[axis]}={b} exceeds the device limit {limit} (block {block})",
                f"use a block with {'xyz'[axis]} <= {limit}",
            )
    threads = block[0] * block[1] * block[2]
    if threads > caps.max_threads_per_block:
        raise ValidationError(
            f"block {block} has {threads} threads; the device allows {caps.max_threads_per_block} per block",
            f"use at most {caps.max_threads_per_block} threads per block",
        )
    if config.elements is not None:
        element_count, sized_by = config.elements, f"DispatchConfig(elements={config.elements})"
    elif program.launch is not None:
        element_count, sized_by = _declared_count(program, bplan)
    elif config.grid_override:
        element_count = checked_mul(config.grid_override[0], block[0], "launch element count")
        sized_by = "grid_override (grid x block)"
    else:
        element_count, sized_by, sizing = _default_count(bplan)
        _warn_if_undersized(program, bplan, element_count, sized_by, sizing)
    if config.grid_override:
        grid = config.grid_override
    else:
        if block[1] != 1 or block[2] != 1:
            raise ValidationError(
                f"block {block} is not 1-D and no grid_override was given; the grid of a "
                "multi-dimensional block cannot be derived from an element count",
                "pass DispatchConfig(grid_override=(gx, gy, gz)) or use a 1-D workgroup",
            )
        if element_count == 0:
            raise ValidationError(
                f"the dispatch launches 0 elements (sized by {sized_by}, which is empty)",
                "skip the dispatch for empty inputs, or pass DispatchConfig(grid_override=...)",
            )
        grid = ((element_count + block[0] - 1) // block[0], 1, 1)
    if element_count > U32_MAX:
        raise InvalidProgram(
            f"launch element count {element_count} (sized by {sized_by}) does not fit the u32 "
            f"params word (max {U32_MAX})",
            "split the dispatch into bounded chunks",
        )
    for axis, (g, limit) in enumerate(zip(grid, caps.max_grid_dim)):
        if g > limit:
            raise ValidationError(
                f"grid dimension {'xyz'[axis]}={g} exceeds the device limit {limit} (grid {grid})",
                "use a larger block, fewer elements per dispatch, or a smaller grid_override",
            )
    offsets = []
    shared = 0
    for decl in bplan.workgroup:
        nbytes = checked_mul(decl.count, decl.dtype.itemsize, f"workgroup buffer {decl.name!r}")
        shared = align_up(shared, 16, "dynamic shared memory")
        offsets.append((decl.name, shared, nbytes))
        shared = checked_add(shared, nbytes, "dynamic shared memory")
    if shared > caps.max_shared_per_block_optin:
        listing = ", ".join(f"{n}={b} B" for n, _, b in offsets)
        raise ValidationError(
            f"workgroup buffers need {shared} bytes of shared memory per block ({listing}); "
            f"the device allows {caps.max_shared_per_block_optin} with opt-in",
            "shrink the workgroup buffers or split the work across more blocks",
        )
    return LaunchPlan(tuple(block), tuple(grid), element_count, shared, tuple(offsets), sized_by)


# programs warned about already: once per program, not per plan (a plan exists per length)
_warned: weakref.WeakSet = weakref.WeakSet()
_warned_lock = threading.Lock()


def _warn_if_undersized(program, bplan, element_count, sized_by, sizing) -> None:
    """Warn once when the implicit launch covers fewer elements than a runtime-sized input."""
    if not bplan.runtime_inputs:
        return
    name, count = max(bplan.runtime_inputs, key=lambda item: item[1])
    if count <= element_count:
        return
    with _warned_lock:
        if program in _warned:
            return
        _warned.add(program)
    warnings.warn(
        LaunchSizeWarning(
            f"program {program.name or program.kernel.entry!r} launches {element_count} elements "
            f"(sized by {sized_by}) but its runtime-sized input {name!r} holds {count}; a kernel "
            "that gives each input element a thread sees only part of it.\n"
            f"Fix: pass Program(..., launch={name!r}) if each element of {name!r} needs a thread; "
            f"if the launch is right as it is, say so with launch={sizing!r} (a declared launch "
            "is never warned about)"
        ),
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The stacklevel of the first frame outside vyre_cuda (the caller's dispatch line)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame = frame.f_back
        level += 1
    return level


def barrier_ceiling(phases: int, grid_blocks: int, route_kind: str) -> int:
    """The most arrivals the grid-barrier counter (a u32) can see in one cooperative launch: one
    per block per barrier (0 for other routes); the audit refuses a counter above it.

    Examples
    --------
    >>> barrier_ceiling(4, 264, "cooperative"), barrier_ceiling(4, 2**62, "split")
    (792, 0)
    """
    if route_kind != "cooperative":
        return 0
    ceiling = checked_mul(max(0, phases - 1), grid_blocks, "grid barrier ceiling")
    if ceiling > U32_MAX:
        raise InvalidProgram(
            f"{phases} phases x {grid_blocks} blocks need {ceiling} barrier arrivals; the device's "
            f"barrier counter is a u32 (max {U32_MAX})",
            "use fewer blocks (grid-stride loops) or fewer phases per launch",
        )
    return ceiling


def params_words(bplan, launch: LaunchPlan, phase_range=None) -> list:
    """The u32 params block of the kernel ABI: word 0 the launch element count, word
    ``binding + 1`` that binding's count; grid-sync programs append ``phase_begin, phase_end``."""
    words = [0] * (bplan.max_binding + 2)
    words[0] = launch.element_count
    for slot in bplan.slots:
        if slot.count > U32_MAX:
            raise InvalidProgram(
                f"buffer {slot.decl.name!r} holds {slot.count} elements; the params word is u32 (max {U32_MAX})",
                "split the dispatch into bounded chunks",
            )
        words[slot.binding + 1] = slot.count
    for decl in bplan.workgroup:
        words[decl.binding + 1] = decl.count
    if phase_range is not None:
        words.extend(phase_range)
    return words


@dataclass(frozen=True)
class Route:
    kind: str  # "regular", "cooperative" or "split"
    reason: str
    grid_blocks: int
    resident_limit: int


def resident_limit(caps: DeviceCaps, threads_per_block: int, occupancy_per_sm: int) -> int:
    """Blocks that can be co-resident: min(occupancy, thread bound) x SMs; 0 without cooperative launch."""
    if not caps.supports("cooperative") or threads_per_block <= 0:
        return 0
    thread_bound = min(caps.max_threads_per_sm // threads_per_block, caps.max_blocks_per_sm)
    return min(occupancy_per_sm, thread_bound) * caps.sm_count


def route_grid_sync(program, config, launch: LaunchPlan, caps: DeviceCaps, occupancy_per_sm: int) -> Route:
    """Decide how a dispatch runs (``cooperative_grid_sync_fits`` asks this too)."""
    blocks = launch.grid_blocks
    wants_coop = program.grid_sync or config.cooperative
    if not wants_coop:
        return Route("regular", "no grid sync requested", blocks, 0)
    if not caps.supports("cooperative"):
        raise UnsupportedFeature(
            f"{'grid_sync=True' if program.grid_sync else 'cooperative=True'} needs cooperative launch, "
            f"but device {caps.ordinal} ({caps.name}) has compute capability {caps.cc[0]}.{caps.cc[1]} "
            f"and cooperative_launch={caps.cooperative_launch}",
            "run on a device with compute capability >= 6.0 that supports cooperative launch; "
            "vyre_cuda never emulates grid sync silently",
        )
    limit = resident_limit(caps, launch.threads_per_block, occupancy_per_sm)
    if blocks <= limit:
        return Route(
            "cooperative",
            f"grid of {blocks} blocks fits the resident limit {limit} "
            f"({occupancy_per_sm} blocks/SM x {caps.sm_count} SMs)",
            blocks,
            limit,
        )
    if config.cooperative:
        raise CooperativeResidencyExceeded(
            f"cooperative launch of {blocks} blocks exceeds the {limit} blocks that can be co-resident "
            f"({launch.threads_per_block} threads and {launch.shared_bytes} B shared memory per block, "
            f"{occupancy_per_sm} blocks/SM x {caps.sm_count} SMs)",
            f"use a grid of at most {limit} blocks (grid-stride loops), or drop cooperative=True so a "
            "grid-sync program runs host-split",
            grid_blocks=blocks,
            resident_limit=limit,
        )
    return Route(
        "split",
        f"grid of {blocks} blocks exceeds the resident limit {limit}; each of the "
        f"{program.phases} phases runs as its own launch",
        blocks,
        limit,
    )
