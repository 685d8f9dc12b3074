"""Static validation of a Program (structure only; sizes are checked when planning a dispatch)."""

from __future__ import annotations

from ..errors import InvalidProgram
from .caps import KNOWN_REQUIREMENTS

__all__ = ["validate_program"]


def validate_program(program) -> None:
    """Raise InvalidProgram for anything structurally wrong with ``program``."""
    from ..program import BufferDecl, Kernel  # noqa: PLC0415 (cycle)

    if not isinstance(program.kernel, Kernel):
        raise InvalidProgram(
            f"Program.kernel must be a Kernel (got {type(program.kernel).__name__})",
            "build it with Kernel.cuda(source) or Kernel.ptx(text)",
        )
    if not program.buffers:
        raise InvalidProgram("Program has no buffers", "declare at least one BufferDecl")
    bindings: dict[int, str] = {}
    names: set[str] = set()
    for i, decl in enumerate(program.buffers):
        if not isinstance(decl, BufferDecl):
            raise InvalidProgram(
                f"Program.buffers[{i}] must be a BufferDecl (got {type(decl).__name__})",
                "pass BufferDecl objects, e.g. BufferDecl.read('a', 0, 'f32')",
            )
        if decl.binding in bindings:
            raise InvalidProgram(
                f"buffers {bindings[decl.binding]!r} and {decl.name!r} share binding {decl.binding}",
                "give every buffer its own binding number",
            )
        if decl.name in names:
            raise InvalidProgram(f"two buffers are named {decl.name!r}", "give every buffer a unique name")
        bindings[decl.binding] = decl.name
        names.add(decl.name)
        if decl.binding > 65535:
            raise InvalidProgram(
                f"buffer {decl.name!r} has binding {decl.binding}; the params block holds at most 65536 bindings",
                "number bindings densely from 0",
            )
    ws = program.workgroup_size
    if len(ws) != 3 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in ws):
        raise InvalidProgram(
            f"workgroup_size must be 1 to 3 positive ints (got {program.workgroup_size!r})",
            "pass workgroup_size=(256, 1, 1) or another positive shape",
        )
    ph = program.phases
    if isinstance(ph, bool) or not isinstance(ph, int) or ph < 1 or ph > 65535:
        raise InvalidProgram(
            f"phases must be an int in 1..65535 (got {ph!r})",
            "pass phases=1, or the phase count of a grid_sync program",
        )
    if ph > 1 and not program.grid_sync:
        raise InvalidProgram(
            f"phases={ph} needs grid_sync=True (phases are separated by grid barriers)",
            "pass grid_sync=True, or phases=1",
        )
    if not isinstance(program.grid_sync, bool):
        raise InvalidProgram(
            f"grid_sync must be True or False (got {program.grid_sync!r})",
            "pass grid_sync=True for a program with grid barriers, else leave it False",
        )
    if not isinstance(program.name, str):
        raise InvalidProgram(
            f"Program.name must be a str (got {type(program.name).__name__})", "pass name='my_program'"
        )
    _validate_launch(program)
    for req in program.requires:
        if req not in KNOWN_REQUIREMENTS:
            raise InvalidProgram(
                f"unknown requirement {req!r} in Program.requires",
                f"use only {', '.join(KNOWN_REQUIREMENTS)}",
            )


def _validate_launch(program) -> None:
    from ..program import BufferAccess  # noqa: PLC0415 (cycle)

    launch = program.launch
    if launch is None or (callable(launch) and not isinstance(launch, str)):
        return
    sized = [d.name for d in program.buffers if d.access is not BufferAccess.WORKGROUP]
    if not isinstance(launch, str):
        raise InvalidProgram(
            f"Program.launch must be a binding name, a callable or None (got {type(launch).__name__})",
            f"pass launch='<name>' with one of {', '.join(map(repr, sized))}, or a callable "
            "taking {name: element count} and returning the element count",
        )
    if launch not in sized:
        workgroup = any(d.name == launch for d in program.buffers)
        why = (
            "is a workgroup buffer (shared memory has no element count per dispatch)"
            if workgroup
            else ("names no buffer of the program")
        )
        raise InvalidProgram(
            f"Program.launch={launch!r} {why}",
            f"name one of {', '.join(map(repr, sized))}",
        )
