"""The elementwise declaration of a Program: which bindings are cut into rows, and what refuses it.

``Program(..., elementwise=True)`` declares that row ``i`` of every output depends only on row ``i``
of the runtime-sized inputs, so a dispatch can be cut into chunks of rows that compute
independently (the streamed route; ``DeviceGroup.dispatch_split`` takes the same declaration per
call). ``elementwise=True`` cuts every runtime-sized binding; ``elementwise=["x", ...]`` names the
inputs to cut (a ``str`` for one). Outputs are always cut: each chunk writes its rows of every
output, so every output must be runtime-sized. Runtime-sized inputs left out go whole to every
chunk, which is allowed only where they cannot size an output. ``align=k`` makes every chunk but
the last a multiple of ``k`` rows. The rules and their wording are those of ``dispatch_split``.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidProgram

__all__ = ["normalize_elementwise", "cut_bindings", "refusal"]


def _is_count(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def refusal(program, what: str, fix: str) -> InvalidProgram:
    """The error refusing an elementwise declaration (one wording for every rule)."""
    label = program.name or program.kernel.entry
    return InvalidProgram(f"Program {label!r} cannot be elementwise: {what}", fix)


def normalize_elementwise(program) -> tuple:
    """``(elementwise, align, cut names)`` of a program: the declaration as stored (False, True or
    a tuple of names), ``align`` as an int, and the names of the bindings cut into rows (inputs
    and outputs, binding order; empty when not elementwise). Raises InvalidProgram for a
    declaration the program cannot honour."""
    declared = program.elementwise
    align = program.align
    if declared is None or (isinstance(declared, (bool, np.bool_)) and not declared):
        declared = False
    elif isinstance(declared, (bool, np.bool_)):
        declared = True
    elif isinstance(declared, str):
        declared = (declared,)
    elif isinstance(declared, (list, tuple)) and all(isinstance(n, str) for n in declared):
        declared = tuple(dict.fromkeys(declared))  # (a name given twice is cut once)
    else:
        raise InvalidProgram(
            f"elementwise must be True, False or binding names (got {type(declared).__name__} {declared!r})",
            "pass elementwise=True to cut every runtime-sized binding, or elementwise=['x', ...] "
            "naming the inputs to cut",
        )
    if not _is_count(align) or align < 1:
        raise InvalidProgram(f"align must be an int >= 1 (got {align!r})", "pass align=1 or more")
    align = int(align)
    if declared is False:
        if align != 1:
            raise InvalidProgram(
                f"align={align} needs an elementwise program (rows are cut only when elementwise is declared)",
                "pass elementwise=True (or the names to cut) with align, or drop align",
            )
        return False, 1, ()
    return declared, align, cut_bindings(program, declared)


def cut_bindings(program, declared) -> tuple:
    """Names of the bindings an elementwise declaration cuts into rows (see the module doc)."""
    from ..program import BindingRole  # noqa: PLC0415 (cycle: program imports planning)

    if program.grid_sync:
        raise refusal(
            program,
            f"it synchronises the whole grid (grid_sync=True, phases={program.phases}), so its chunks are "
            "not independent",
            "drop elementwise, or drop grid_sync when no phase reads another block's results",
        )
    for decl in program.outputs:
        if decl.count:
            raise refusal(
                program,
                f"output {decl.name!r} has a static size (count={decl.count}); every chunk "
                "would write the whole buffer, which cannot be joined",
                f"declare {decl.name!r} runtime-sized (count=0), or drop elementwise",
            )
        if decl.output_byte_range is not None:
            raise refusal(
                program,
                f"output {decl.name!r} reads back a byte range {decl.output_byte_range}, "
                "which cannot be joined across chunks",
                f"drop output_byte_range from {decl.name!r}, or drop elementwise",
            )
    inputs = program.inputs
    runtime = [d for d in inputs if d.count == 0]
    if declared is True:
        chosen = {d.name for d in runtime}
    else:
        known = {d.name: d for d in program.buffers}
        for name in declared:
            if name not in known:
                raise refusal(
                    program,
                    f"elementwise names {name!r}, which is not a buffer of the program "
                    f"(inputs: {', '.join(repr(d.name) for d in inputs) or 'none'})",
                    "name runtime-sized inputs of the program, or pass elementwise=True for all of them",
                )
            if known[name].count:
                raise refusal(
                    program,
                    f"elementwise names {name!r}, which has a static size (count={known[name].count})",
                    f"leave {name!r} out of elementwise (a static input goes whole to every chunk), or "
                    "declare it runtime-sized (count=0)",
                )
        chosen = {n for n in declared if n in {d.name for d in inputs}}
    if not chosen:
        raise refusal(
            program,
            "elementwise names no runtime-sized input to cut",
            "pass elementwise=True, or name at least one runtime-sized input",
        )
    pure_outputs = [d for d in program.outputs if d.role is BindingRole.OUTPUT]
    for d in runtime:
        if d.name in chosen:
            continue
        if d.role is BindingRole.INPUT_OUTPUT:
            raise refusal(
                program,
                f"input {d.name!r} is read back (read-write) but is not in elementwise",
                f"add {d.name!r} to elementwise",
            )
        if pure_outputs:
            raise refusal(
                program,
                f"runtime-sized input {d.name!r} is not in elementwise, but it would size the "
                f"runtime-sized output(s) {', '.join(repr(o.name) for o in pure_outputs)} of every chunk",
                f"add {d.name!r} to elementwise, or declare it with a static count to pass it whole to every chunk",
            )
    cut = chosen | {d.name for d in program.outputs}
    launch = program.launch
    if isinstance(launch, str) and launch not in cut:
        raise refusal(
            program,
            f"its launch is sized by {launch!r} (launch={launch!r}), which is not cut into rows, so a "
            "chunk's launch would not cover the chunk",
            f"add {launch!r} to elementwise, or size the launch by a binding that is cut",
        )
    return tuple(d.name for d in sorted(program.buffers, key=lambda d: d.binding) if d.name in cut)
