"""Binding plan: which buffer is an argument, an input, an output, and how many bytes each holds."""

from __future__ import annotations

from dataclasses import dataclass

from .._accounting import checked_mul
from ..errors import InvalidProgram, UnsupportedFeature, ValidationError
from ..program import BindingRole, BufferDecl

__all__ = ["BindingSlot", "BindingPlan", "plan_bindings", "check_input_count", "whole_elements", "input_spec"]


@dataclass(frozen=True)
class BindingSlot:
    """One non-workgroup binding as the dispatch sees it."""

    decl: BufferDecl
    role: BindingRole
    input_index: int  # index into the caller's inputs, -1 when none
    output_index: int  # index into the returned outputs, -1 when none
    count: int  # elements
    byte_len: int  # logical bytes

    @property
    def binding(self) -> int:
        """The declaration's binding number."""
        return self.decl.binding


@dataclass(frozen=True)
class BindingPlan:
    slots: tuple  # BindingSlot, in binding-number order
    workgroup: tuple  # workgroup BufferDecls, in binding-number order
    outputs: tuple  # BindingSlot per output, in declaration order
    runtime_count: int  # elements of every runtime-sized output (see _runtime_count), 0 when none
    runtime_inputs: tuple = ()  # (name, elements) of each runtime-sized input, declaration order

    @property
    def max_binding(self) -> int:
        """The highest binding number, workgroup buffers included (it places the phase words)."""
        decls = [s.decl for s in self.slots] + list(self.workgroup)
        return max(d.binding for d in decls)


def plan_bindings(program, input_lengths) -> BindingPlan:
    """The binding plan of ``program`` for inputs of ``input_lengths`` bytes (declaration order)."""
    inputs = program.inputs
    check_input_count(inputs, len(input_lengths))
    for decl in program.buffers:
        if decl.role is BindingRole.PERSISTENT:
            raise UnsupportedFeature(
                f"buffer {decl.name!r} (binding {decl.binding}) is persistent; the borrowed-buffer "
                "dispatch path keeps no resident buffers",
                "declare it as an input (BufferDecl.read) and pass its contents with each dispatch",
            )
    counts: dict[str, int] = {}
    runtime: dict[str, int] = {}  # runtime-sized inputs, declaration order
    for i, (decl, nbytes) in enumerate(zip(inputs, input_lengths)):
        count = whole_elements(i, decl, nbytes)
        if decl.count:
            if count != decl.count:
                raise ValidationError(
                    f"input {i} ({decl.name!r}) holds {count} {decl.dtype.name} elements "
                    f"({nbytes} bytes) but the buffer is declared with count={decl.count}",
                    f"pass exactly {decl.count} elements, or declare count=0 for a runtime-sized buffer",
                )
        else:
            runtime[decl.name] = count
        counts[decl.name] = count
    runtime_count = _runtime_count(program, runtime)
    slots = []
    outputs_by_name = {}
    out_order = [d.name for d in program.outputs]
    input_index = {d.name: i for i, d in enumerate(inputs)}
    for decl in sorted(program.buffers, key=lambda d: d.binding):
        role = decl.role
        if role is BindingRole.SHARED:
            continue
        if decl.name in counts:
            count = counts[decl.name]
        elif decl.count:
            count = decl.count
        else:
            if not runtime:
                raise InvalidProgram(
                    f"output {decl.name!r} is runtime-sized (count=0) but the program has no "
                    "runtime-sized input to take its length from",
                    f"give {decl.name!r} a static count, or make an input runtime-sized",
                )
            count = runtime_count
        byte_len = checked_mul(count, decl.dtype.itemsize, f"buffer {decl.name!r} byte length")
        slot = BindingSlot(
            decl=decl,
            role=role,
            input_index=input_index.get(decl.name, -1),
            output_index=out_order.index(decl.name) if decl.name in out_order else -1,
            count=count,
            byte_len=byte_len,
        )
        slots.append(slot)
        if slot.output_index >= 0:
            outputs_by_name[decl.name] = slot
    workgroup = tuple(sorted((d for d in program.buffers if d.role is BindingRole.SHARED), key=lambda d: d.binding))
    return BindingPlan(
        slots=tuple(slots),
        workgroup=workgroup,
        outputs=tuple(outputs_by_name[n] for n in out_order),
        runtime_count=runtime_count,
        runtime_inputs=tuple(runtime.items()),
    )


def check_input_count(decls, passed: int) -> None:
    """Refuse ``passed`` buffers for the program inputs ``decls`` unless there is one per input."""
    if passed != len(decls):
        names = ", ".join(repr(d.name) for d in decls) or "none"
        raise ValidationError(
            f"program takes {len(decls)} input(s) ({names}) but {passed} were passed",
            f"pass exactly {len(decls)} buffer(s), in declaration order",
        )


def whole_elements(index: int, decl, nbytes: int) -> int:
    """The elements input ``index`` (declared ``decl``) holds in ``nbytes``; refused unless whole."""
    if nbytes % decl.dtype.itemsize:
        raise ValidationError(
            f"input {index} ({decl.name!r}) holds {nbytes} bytes, not a multiple of the "
            f"{decl.dtype.itemsize}-byte {decl.dtype.name} element",
            f"pass a buffer of whole {decl.dtype.name} elements",
        )
    return nbytes // decl.dtype.itemsize


def _runtime_count(program, runtime: dict) -> int:
    """The element count runtime-sized outputs take. Runtime-sized inputs must hold equal counts
    (one thread index would read past the shorter ones) unless ``Program(launch=...)`` says how
    they relate; outputs then take the launch binding's count, refused when nothing names one."""
    if not runtime:
        return 0
    distinct = sorted(set(runtime.values()))
    if len(distinct) == 1:
        return distinct[0]
    items = list(runtime.items())
    first = items[0]
    other = next(item for item in items if item[1] != first[1])
    listing = ", ".join(f"{n!r}: {c}" for n, c in items)
    if program.launch is None:
        raise ValidationError(
            f"runtime-sized inputs {first[0]!r} ({first[1]} elements) and {other[0]!r} "
            f"({other[1]} elements) differ in length; by default the runtime-sized inputs of one "
            f"program hold equal element counts ({listing})",
            "pass inputs of equal length; give a buffer that is not indexed per element (a "
            "uniform, a table) a static count; or declare which binding sizes the launch with "
            f"Program(..., launch={first[0]!r}) and bound-check each buffer in the kernel with "
            "vyre_in_bounds(params, binding, i)",
        )
    if isinstance(program.launch, str) and program.launch in runtime:
        return runtime[program.launch]
    runtime_outputs = [d.name for d in program.buffers if d.count == 0 and d.role is BindingRole.OUTPUT]
    if runtime_outputs:
        raise ValidationError(
            f"runtime-sized output {runtime_outputs[0]!r} cannot take its length: the runtime-sized "
            f"inputs differ ({listing}) and the launch rule {program.launch!r} does not name one "
            "of them",
            f"give {runtime_outputs[0]!r} a static count, pass inputs of equal length, or name a "
            "runtime-sized input with Program(..., launch=...)",
        )
    return distinct[-1]


def input_spec(decl) -> tuple:
    """``(itemsize, kind)`` an input of ``decl`` must have (the core checks it): ``kind`` is the
    struct-format class (bf16 travels as uint16 raw bits); a 1-byte view is always accepted."""
    return (decl.dtype.itemsize, decl.dtype.kind)
