"""The elementwise declaration of a Program: which bindings are cut into rows, and what refuses it.

``elementwise=True`` declares that row ``i`` of every output depends only on row ``i`` of the
runtime-sized inputs, so chunks of rows compute independently (the streamed route, and
``dispatch_split`` per call, worded by a :class:`Terms`). ``True`` cuts every runtime-sized input,
a name or names cut those; outputs are always cut, so all must be runtime-sized. An input left
out goes whole to every chunk, allowed only where it cannot size an output. ``align=k``: every
chunk but the last is a multiple of ``k`` rows.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .._validate import check_int
from ..errors import InvalidProgram

__all__ = ["Terms", "PROGRAM_TERMS", "normalize_elementwise", "declaration", "cut_bindings", "refusal"]


class Terms(NamedTuple):
    """How a refusal words the declaration: the argument's ``name``, every message's ``head``
    (formatted with ``label``) and ``way_out``, the fix that always applies."""

    name: str
    head: str
    way_out: str


PROGRAM_TERMS = Terms("elementwise", "Program {label!r} cannot be elementwise", "drop elementwise")


def refusal(program, what: str, fix: str, terms: Terms = PROGRAM_TERMS) -> InvalidProgram:
    """The error refusing an elementwise declaration (one wording for every rule)."""
    head = terms.head.format(label=program.name or program.kernel.entry)
    return InvalidProgram(f"{head}: {what}", fix)


def declaration(declared, terms: Terms = PROGRAM_TERMS):
    """A declaration as stored: False, True or a tuple of distinct names."""
    if declared is None or (isinstance(declared, (bool, np.bool_)) and not declared):
        return False
    if isinstance(declared, (bool, np.bool_)):
        return True
    if isinstance(declared, str):
        return (declared,)
    if isinstance(declared, (list, tuple)) and all(isinstance(n, str) for n in declared):
        return tuple(dict.fromkeys(declared))
    raise InvalidProgram(
        f"{terms.name} must be True, False or binding names (got {type(declared).__name__} {declared!r})",
        f"pass {terms.name}=True to cut every runtime-sized binding, or {terms.name}=['x', ...] "
        "naming the inputs to cut",
    )


def normalize_elementwise(program) -> tuple:
    """``(declaration as stored, align, names of the bindings cut, in binding order)``; raises
    InvalidProgram for a declaration the program cannot honour."""
    declared = declaration(program.elementwise)
    align = check_int("align", program.align, minimum=1, fix="pass align=1 or more", error=InvalidProgram)
    if declared is False:
        if align != 1:
            raise InvalidProgram(
                f"align={align} needs an elementwise program (rows are cut only when elementwise is declared)",
                "pass elementwise=True (or the names to cut) with align, or drop align",
            )
        return False, 1, ()
    return declared, align, cut_bindings(program, declared)


def cut_bindings(program, declared, terms: Terms = PROGRAM_TERMS) -> tuple:
    """Names of the bindings a stored declaration cuts into rows; InvalidProgram worded in
    ``terms`` when the program cannot honour it."""
    refuse = functools.partial(refusal, terms=terms)
    if program.grid_sync:
        raise refuse(
            program,
            f"it synchronises the whole grid (grid_sync=True, phases={program.phases}), so its chunks are "
            "not independent",
            f"{terms.way_out}, or drop grid_sync when no phase reads another block's results",
        )
    for decl in program.outputs:
        if decl.count:
            raise refuse(
                program,
                f"output {decl.name!r} has a static size (count={decl.count}); every chunk "
                "would write the whole buffer, which cannot be joined",
                f"declare {decl.name!r} runtime-sized (count=0), or {terms.way_out}",
            )
        if decl.output_byte_range is not None:
            raise refuse(
                program,
                f"output {decl.name!r} reads back a byte range {decl.output_byte_range}, "
                "which cannot be joined across chunks",
                f"drop output_byte_range from {decl.name!r}, or {terms.way_out}",
            )
    inputs = program.inputs
    runtime = [d for d in inputs if d.count == 0]
    if declared is True:
        chosen = {d.name for d in runtime}
    else:
        known = {d.name: d for d in program.buffers}
        for name in declared:
            if name not in known:
                raise refuse(
                    program,
                    f"{terms.name} names {name!r}, which is not a buffer of the program "
                    f"(inputs: {', '.join(repr(d.name) for d in inputs) or 'none'})",
                    f"name runtime-sized inputs of the program, or pass {terms.name}=True for all of them",
                )
            if known[name].count:
                raise refuse(
                    program,
                    f"{terms.name} names {name!r}, which has a static size (count={known[name].count})",
                    f"leave {name!r} out of {terms.name} (a static input goes whole to every chunk), or "
                    "declare it runtime-sized (count=0)",
                )
        chosen = {n for n in declared if n in {d.name for d in inputs}}
    if not chosen:
        raise refuse(
            program,
            f"{terms.name} names no runtime-sized input to cut",
            f"pass {terms.name}=True, or name at least one runtime-sized input",
        )
    # (roles from the program's own lists: program.py imports this module)
    read_back = {id(d) for d in program.outputs}
    taken = {id(d) for d in program.inputs}
    pure_outputs = [d for d in program.outputs if id(d) not in taken]
    for d in runtime:
        if d.name in chosen:
            continue
        if id(d) in read_back:
            raise refuse(
                program,
                f"input {d.name!r} is read back (read-write) but is not in {terms.name}",
                f"add {d.name!r} to {terms.name}",
            )
        if pure_outputs:
            raise refuse(
                program,
                f"runtime-sized input {d.name!r} is not in {terms.name}, but it would size the "
                f"runtime-sized output(s) {', '.join(repr(o.name) for o in pure_outputs)} of every chunk",
                f"add {d.name!r} to {terms.name}, or declare it with a static count to pass it whole to every chunk",
            )
    cut = chosen | {d.name for d in program.outputs}
    launch = program.launch
    if isinstance(launch, str) and launch not in cut:
        raise refuse(
            program,
            f"its launch is sized by {launch!r} (launch={launch!r}), which is not cut into rows, so a "
            "chunk's launch would not cover the chunk",
            f"add {launch!r} to {terms.name}, or size the launch by a binding that is cut",
        )
    return tuple(d.name for d in sorted(program.buffers, key=lambda d: d.binding) if d.name in cut)
