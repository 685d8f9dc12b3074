"""The program model: Program, its structural checks and its key (buffer declarations, access kinds and
binding roles: ``_buffer_decl``; dtypes: ``_dtypes``; all re-exported here)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._buffer_decl import BindingRole, BufferAccess, BufferDecl, buffer_fields
from ._dtypes import DTYPES, DType, dtype_of
from ._interned import Interned
from ._validate import is_flag, is_int
from .errors import InvalidProgram, ValidationError
from .kernel import Kernel

__all__ = [
    "DType",
    "DTYPES",
    "BufferAccess",
    "BindingRole",
    "BufferDecl",
    "Kernel",
    "LaunchSizeWarning",
    "Program",
    "dtype_of",
    "KNOWN_REQUIREMENTS",
]

# Requirements a Program may name in `requires` (DeviceCaps.supports says what a device offers).
KNOWN_REQUIREMENTS = ("f16", "bf16", "subgroup", "trap", "cooperative", "indirect_dispatch", "collectives")


class LaunchSizeWarning(UserWarning):
    """The implicit launch size covers fewer elements than a runtime-sized input holds (once per program).

    A kernel that walks every input element (a histogram, a reduction into a small output) then
    sees only part of it; ``Program(..., launch="x")`` names the binding that sizes the launch.
    """


@dataclass(frozen=True, eq=False, init=False)
class Program(metaclass=Interned):
    """A kernel plus its buffer declarations and launch shape.

    ``launch`` says what sizes the launch (word 0 of the params block and the grid): None for
    the default rule (the largest output; the largest binding when the program has workgroup
    buffers or no outputs), the name of a binding (its element count), or a callable taking
    ``{binding name: element count}`` and returning the element count. Naming it also lets the
    runtime-sized inputs differ in length; by default they must be equal. See the README's
    "How the launch is sized".

    ``elementwise`` declares that row ``i`` of every output depends only on row ``i`` of the
    runtime-sized inputs, so a dispatch may be cut into chunks of rows that compute independently:
    True cuts every runtime-sized binding, a list names the inputs to cut (outputs are always cut;
    see :mod:`vyre_cuda.planning.elementwise`). ``align=k`` keeps every chunk but the last a
    multiple of ``k`` rows. Grid-sync programs, statically sized outputs and output byte ranges
    cannot be elementwise (refused here with InvalidProgram).

    Programs equal in every field (the kernel by its digest, a callable ``launch`` by object) are
    equal, so a program rebuilt per call finds the plans and modules of an equal one. A program
    pickles when its ``launch`` does (a name, or a module-level function).

    Examples
    --------
    >>> hist = Program(
    ...     Kernel.cuda("VYRE_KERNEL vyre_main() {}"),
    ...     [BufferDecl.read("x", 0, "u8"), BufferDecl.output("h", 1, "u32", 256)],
    ...     launch="x",
    ... )
    >>> hist.launch
    'x'
    """

    kernel: Kernel
    buffers: Sequence[BufferDecl]  # stored as a tuple
    workgroup_size: tuple = (256, 1, 1)
    grid_sync: bool = False
    phases: int = 1
    requires: Sequence[str] = ()  # stored as a tuple
    name: str = ""
    launch: str | Callable[[Mapping[str, int]], int] | None = None
    elementwise: bool | Sequence[str] = False  # stored as False, True or a tuple of names
    align: int = 1

    def __init__(
        self,
        kernel: Kernel,
        buffers: Sequence[BufferDecl],
        workgroup_size: tuple = (256, 1, 1),
        grid_sync: bool = False,
        phases: int = 1,
        requires: Sequence[str] = (),
        name: str = "",
        launch: str | Callable[[Mapping[str, int]], int] | None = None,
        elementwise: bool | Sequence[str] = False,
        align: int = 1,
    ) -> None:
        values = (kernel, buffers, workgroup_size, grid_sync, phases, requires, name, launch, elementwise, align)
        for name_, value in zip(_PROGRAM_FIELDS, values):
            object.__setattr__(self, name_, value)
        self._derive()

    def _derive(self) -> None:
        for attr in ("buffers", "requires"):
            value = getattr(self, attr)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise InvalidProgram(
                    f"Program.{attr} must be a sequence (got {type(value).__name__})",
                    f"pass {attr} as a list or tuple",
                )
            object.__setattr__(self, attr, tuple(value))
        ws: Any = self.workgroup_size  # an int or a sequence of ints until normalised here
        if is_int(ws):
            ws = (int(ws),)
        if not isinstance(ws, (tuple, list)) or not all(is_int(v) for v in ws):
            raise InvalidProgram(
                f"workgroup_size must be an int or 1 to 3 ints (got {self.workgroup_size!r})",
                "pass workgroup_size=(256, 1, 1) or another positive shape",
            )
        if 1 <= len(ws) <= 3:
            ws = tuple(int(v) for v in ws) + (1,) * (3 - len(ws))
        object.__setattr__(self, "workgroup_size", tuple(ws))
        if is_flag(self.grid_sync):
            object.__setattr__(self, "grid_sync", bool(self.grid_sync))
        _validate_program(self)
        # derived once (the buffers are immutable): device-array dispatches read them per input
        ins, outs = (BindingRole.INPUT, BindingRole.INPUT_OUTPUT), (BindingRole.OUTPUT, BindingRole.INPUT_OUTPUT)
        object.__setattr__(self, "_inputs", tuple(b for b in self.buffers if b.role in ins))
        object.__setattr__(self, "_outputs", tuple(b for b in self.buffers if b.role in outs))
        from .planning.elementwise import normalize_elementwise  # noqa: PLC0415 (cycle)

        # (reads the inputs and outputs above)
        declared, align, cut = normalize_elementwise(self)
        object.__setattr__(self, "elementwise", declared)
        object.__setattr__(self, "align", align)
        object.__setattr__(self, "_elementwise_bindings", cut)
        # once: the dispatch hot path hashes the program on every call (its plan-cache key)
        key = _structural_key(self)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def _identity(self) -> tuple:
        """``(field name, value)`` of every field in order, the kernel by its digest: what the program
        computes. ``==``, ``hash`` (through :func:`_structural_key`) and ``vyre_cuda.dask.program_key``
        are built on it, so a field added to Program is part of every key by being a field."""
        return tuple(
            (name, self.kernel.digest if name == "kernel" else getattr(self, name)) for name in _PROGRAM_FIELDS
        )

    def __eq__(self, other):
        if self is other:
            return True
        if not isinstance(other, Program):
            return NotImplemented
        return self._hash == other._hash and self._key == other._key  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __reduce__(self):
        # rebuilt from its fields: the cached hash is per process (str hashes are salted)
        return (Program, tuple(getattr(self, f.name) for f in dataclasses.fields(self)))

    @property
    def inputs(self) -> tuple:
        """Declarations that take a caller's input, in declaration order."""
        return self._inputs  # type: ignore[attr-defined]

    @property
    def elementwise_bindings(self) -> tuple:
        """Names of the bindings an elementwise dispatch cuts into rows (empty when not elementwise)."""
        return self._elementwise_bindings  # type: ignore[attr-defined]

    @property
    def outputs(self) -> tuple:
        """Declarations read back, in declaration order."""
        return self._outputs  # type: ignore[attr-defined]


# taken once: dataclasses.fields() per program built would cost more than the rest of its key
_PROGRAM_FIELDS = tuple(f.name for f in dataclasses.fields(Program))


class _ByObject:
    """A callable ``launch`` inside a program's key: equal only to the same object (its own ``==``
    may be missing, unhashable or not return a bool)."""

    __slots__ = ("fn",)

    def __init__(self, fn) -> None:
        self.fn = fn

    def __eq__(self, other) -> bool:
        return isinstance(other, _ByObject) and other.fn is self.fn

    def __hash__(self) -> int:
        return id(self.fn)


def _structural_key(program) -> tuple:
    """What ``Program.__eq__`` and ``__hash__`` compare: :meth:`Program._identity`'s values, each
    buffer as the tuple of its fields (compared in C) and a callable ``launch`` by object; an
    unhashable value is refused, named."""
    values = []
    for name, value in program._identity():
        if name == "buffers":
            value = tuple(map(buffer_fields, value))
        elif name == "launch" and value is not None and not isinstance(value, str):
            value = _ByObject(value)
        values.append(value)
    key = tuple(values)
    try:
        hash(key)
    except TypeError:
        for name, value in zip(_PROGRAM_FIELDS, key):
            try:
                hash(value)
            except TypeError:
                raise InvalidProgram(
                    f"Program.{name} holds an unhashable value ({type(value).__name__} {value!r})",
                    f"pass {name} as the documented type (str, int, bool or a tuple of them)",
                ) from None
        raise
    return key


def _validate_program(program) -> None:
    """Raise InvalidProgram for anything structurally wrong (sizes are checked at planning)."""
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
    if len(ws) != 3 or any(not is_int(v, numpy=False) or v <= 0 for v in ws):
        raise InvalidProgram(
            f"workgroup_size must be 1 to 3 positive ints (got {program.workgroup_size!r})",
            "pass workgroup_size=(256, 1, 1) or another positive shape",
        )
    ph = program.phases
    if not is_int(ph, numpy=False) or ph < 1 or ph > 65535:
        raise InvalidProgram(
            f"phases must be an int in 1..65535 (got {ph!r})",
            "pass phases=1, or the phase count of a grid_sync program",
        )
    if ph > 1 and not program.grid_sync:
        raise InvalidProgram(
            f"phases={ph} needs grid_sync=True (phases are separated by grid barriers)",
            "pass grid_sync=True, or phases=1",
        )
    if not is_flag(program.grid_sync):  # (np.bool_ was made a bool in __post_init__)
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
        why = "is a workgroup buffer (shared memory has no element count per dispatch)"
        raise InvalidProgram(
            f"Program.launch={launch!r} {why if workgroup else 'names no buffer of the program'}",
            f"name one of {', '.join(map(repr, sized))}",
        )


def require_program(value, where: str, *, verb: str = "needs") -> None:
    """ValidationError "{where} {verb} a vyre_cuda.Program (got {type})" unless ``value`` is one."""
    if not isinstance(value, Program):
        raise ValidationError(
            f"{where} {verb} a vyre_cuda.Program (got {type(value).__name__})",
            "build one with Program(Kernel.cuda(src), [BufferDecl...])",
        )
