"""The program model: kernels, buffer declarations, access kinds, binding roles (dtypes: ``_dtypes``)."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import operator
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from ._dtypes import DTYPES, DType, dtype_of
from ._interned import Interned, register_plain, remembered_constructor
from ._validate import is_flag, is_int
from .errors import InvalidProgram, ValidationError
from .kernel import Kernel, remember_constructors

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
    """The implicit launch size covers fewer elements than a runtime-sized input holds.

    Issued once per program. A kernel that walks every input element (a histogram, a reduction
    into a small output) then sees only part of its input; name the binding that sizes the launch
    with ``Program(..., launch="x")`` (which also silences this warning).
    """


class BufferAccess(enum.Enum):
    """How a kernel uses a buffer; :class:`BufferDecl` takes a member or its value (``"read_only"``).

    Examples
    --------
    >>> BufferAccess("uniform")
    <BufferAccess.UNIFORM: 'uniform'>
    """

    #: Read only; takes an input (``BufferDecl.read``).
    READ_ONLY = "read_only"
    #: Read and written; takes an input and gives it back updated (``BufferDecl.read_write``),
    #: or with ``output=True`` an output that starts zeroed (``BufferDecl.output``).
    READ_WRITE = "read_write"
    #: Written only; an output that starts zeroed (``BufferDecl.write_only``).
    WRITE_ONLY = "write_only"
    #: A small read-only input (vyre's uniform buffer), treated as ``READ_ONLY``.
    UNIFORM = "uniform"
    #: Per-block shared memory, not an argument; its bytes form the launch's dynamic shared memory.
    WORKGROUP = "workgroup"


class BindingRole(enum.Enum):
    """What a buffer is to a dispatch, derived from its access and flags (:attr:`BufferDecl.role`).

    Examples
    --------
    >>> BufferDecl.read_write("y", 0, "f32").role
    <BindingRole.INPUT_OUTPUT: 'input_output'>
    """

    #: Takes an input, gives no output.
    INPUT = "input"
    #: Gives an output, takes no input (zeroed before the launch).
    OUTPUT = "output"
    #: Takes an input and gives it back as an output.
    INPUT_OUTPUT = "input_output"
    #: Workgroup (shared) memory, neither an input nor an output.
    SHARED = "shared"
    #: A resident buffer; refused, since every dispatch borrows its buffers.
    PERSISTENT = "persistent"


# the members as module globals: the constructors below name them on every call, and a global
# costs less than an attribute of the enum class
_READ_ONLY, _UNIFORM, _READ_WRITE, _WRITE_ONLY, _WORKGROUP = (
    BufferAccess.READ_ONLY,
    BufferAccess.UNIFORM,
    BufferAccess.READ_WRITE,
    BufferAccess.WRITE_ONLY,
    BufferAccess.WORKGROUP,
)


def _output_decl(cls, name, binding, dtype, count=0, **kw) -> BufferDecl:
    """An output with no input: cleared to zero before the launch, read back after."""
    # (True: output; a call with no keywords skips building an empty dict: programs built per
    # call go through these constructors, see notes/plan-miss.md)
    if kw:
        return cls(name, binding, _READ_WRITE, dtype, count, True, **kw)
    return cls(name, binding, _READ_WRITE, dtype, count, True)


class _OutputAttribute:
    """``BufferDecl.output(...)`` builds an output declaration; ``decl.output`` reads its flag.

    The flag itself is the field ``is_output``; this descriptor keeps both spellings working
    with distinct types (a constructor on the class, a bool on an instance).
    """

    def __init__(self) -> None:
        self._bound: dict = {}  # owner class -> its bound constructor (made once, not per call)

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[..., BufferDecl]: ...

    @overload
    def __get__(self, obj: BufferDecl, owner: type) -> bool: ...

    def __get__(self, obj, owner):
        if obj is None:
            bound = self._bound.get(owner)
            if bound is None:
                bound = self._bound[owner] = types.MethodType(_output_decl, owner)
            return bound
        return obj.is_output


@dataclass(frozen=True, init=False)
class BufferDecl(metaclass=Interned):
    """One buffer of a program.

    Parameters
    ----------
    name : str
        Unique name; :class:`Program` ``launch=`` and error messages refer to it.
    binding : int
        Binding number: the argument position, and word ``binding + 1`` of the params block.
    access : BufferAccess or str
    dtype : DType, str or numpy dtype
    count : int
        Element count; 0 means runtime-sized (taken from the input's length).
    output : bool
        Marks a buffer the dispatch returns with no input (the field is ``is_output``).
    output_byte_range : (int, int), optional
        ``(start, end)`` bytes of an output to read back; both multiples of the element size.
    alignment : int, optional
        Preferred byte alignment of the device allocation (a power of two up to 4096).
    persistent : bool
        Declares a resident buffer (refused by the borrowed-buffer dispatch).
    zeroed : bool
        Whether an output starts at zero (the default, for every output). Pass ``zeroed=False``
        for an output the kernel writes in full: the dispatch then skips its zeroing (a memset,
        or zeros in the upload), and an element the kernel does not write holds whatever the
        memory held (as with ``cupy.empty``). Only pure outputs take it.

    Examples
    --------
    >>> BufferDecl.output("out", 2, "f32").role
    <BindingRole.OUTPUT: 'output'>
    >>> BufferDecl("out", 2, "read_write", "f32", output=True).is_output
    True
    """

    name: str
    binding: int
    access: BufferAccess
    dtype: DType
    count: int = 0
    is_output: bool = False
    output_byte_range: tuple | None = None
    alignment: int | None = None
    persistent: bool = False
    zeroed: bool = True

    output = _OutputAttribute()

    def __init__(
        self,
        name: str,
        binding: int,
        access: BufferAccess | str,
        dtype: Any,
        count: int = 0,
        output: bool | None = None,  # None: False
        output_byte_range: tuple | None = None,
        alignment: int | None = None,
        persistent: bool = False,
        zeroed: bool = True,
        *,
        is_output: bool | None = None,  # the field's own name, so dataclasses.replace works
    ) -> None:
        if output is not None and is_output is not None and output != is_output:
            raise InvalidProgram(
                f"buffer {name!r}: output={output!r} and is_output={is_output!r} disagree",
                "pass one of them (dataclasses.replace takes is_output=)",
            )
        output = is_output if is_output is not None else (False if output is None else output)
        values = (name, binding, access, dtype, count, output, output_byte_range, alignment, persistent, zeroed)
        for name_, value in zip(_BUFFER_FIELDS, values):
            object.__setattr__(self, name_, value)
        self._validate()
        # derived once (planning asks it many times per plan); not fields: not compared, not in repr
        object.__setattr__(self, "_role", self._derive_role())
        object.__setattr__(self, "_hash", hash(_buffer_fields(self)))

    def __eq__(self, other):
        # (a program's cache keys compare its declarations on every build: the hash first)
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return hash(self) == hash(other) and _buffer_fields(self) == _buffer_fields(other)

    def __hash__(self) -> int:
        # computed once (a program's cache keys hash its declarations on every build)
        try:
            return self._hash  # type: ignore[attr-defined]
        except AttributeError:  # unpickled from a release that did not store it
            return hash(_buffer_fields(self))

    def __reduce__(self):
        # rebuilt through the constructor: the cached hash is per process (str hashes are salted)
        return (BufferDecl, _buffer_fields(self))  # (the constructor takes the fields in order)

    def _validate(self) -> None:
        object.__setattr__(self, "dtype", dtype_of(self.dtype))
        if isinstance(self.access, str):
            with contextlib.suppress(ValueError):  # an unknown name is refused just below
                object.__setattr__(self, "access", BufferAccess(self.access))
        if not isinstance(self.access, BufferAccess):
            raise InvalidProgram(
                f"buffer {self.name!r}: unknown access {self.access!r}",
                f"use a BufferAccess or one of {', '.join(a.value for a in BufferAccess)}",
            )
        if not isinstance(self.name, str) or not self.name:
            raise InvalidProgram(
                f"buffer name must be a non-empty string (got {self.name!r})",
                "give every buffer a unique name",
            )
        for attr in ("binding", "count"):
            v = getattr(self, attr)
            if not is_int(v) or v < 0:
                raise InvalidProgram(
                    f"buffer {self.name!r}: {attr} must be a non-negative integer (got {v!r})",
                    f"pass {attr} as an int >= 0",
                )
            object.__setattr__(self, attr, int(v))
        for attr, kwarg in (("is_output", "output"), ("persistent", "persistent"), ("zeroed", "zeroed")):
            v = getattr(self, attr)
            if not is_flag(v):
                raise InvalidProgram(
                    f"buffer {self.name!r}: {kwarg} must be True or False (got {v!r})",
                    f"pass {kwarg}=True or {kwarg}=False",
                )
            object.__setattr__(self, attr, bool(v))
        if self.alignment is not None:
            a = self.alignment
            if not is_int(a) or a <= 0 or (a & (a - 1)) != 0 or a > 4096:
                raise InvalidProgram(
                    f"buffer {self.name!r}: alignment must be a power of two in 1..4096 (got {a!r})",
                    "pass alignment=None or a power of two such as 16, 128 or 256",
                )
            object.__setattr__(self, "alignment", int(a))
        if self.output_byte_range is not None:
            self._validate_byte_range()
        if not self.zeroed and self._derive_role() is not BindingRole.OUTPUT:
            raise InvalidProgram(
                f"buffer {self.name!r} ({self.access.value}, role {self._derive_role().value}) is "
                "declared zeroed=False, but only a pure output is zeroed before the launch",
                "drop zeroed=False, or declare the buffer as an output (BufferDecl.output / write_only)",
            )
        if self.access is BufferAccess.WORKGROUP and self.count == 0:
            raise InvalidProgram(
                f"workgroup buffer {self.name!r} has count 0; shared memory is sized at plan time",
                "give workgroup buffers a static element count",
            )

    def _validate_byte_range(self) -> None:
        r: Any = self.output_byte_range
        ok = isinstance(r, (tuple, list)) and len(r) == 2 and all(is_int(x) for x in r)
        if not ok or r[0] < 0 or r[1] < r[0]:
            raise InvalidProgram(
                f"buffer {self.name!r}: output_byte_range must be (start, end) with 0 <= start <= end (got {r!r})",
                "pass output_byte_range=(start, end) in bytes, or None for the whole buffer",
            )
        start, end = int(r[0]), int(r[1])
        size = self.dtype.itemsize
        if start % size or end % size:
            # a range cutting elements would come back as values built from two elements' bytes
            raise InvalidProgram(
                f"buffer {self.name!r}: output_byte_range ({start}, {end}) cuts {self.dtype.name} "
                f"elements; both ends must be multiples of the {size}-byte element",
                f"pass ({start - start % size}, {end + (-end) % size}) (whole elements), or declare "
                "the buffer as u8 to read raw bytes",
            )
        role = self._derive_role()  # (validation runs before the role is stored)
        if role not in (BindingRole.OUTPUT, BindingRole.INPUT_OUTPUT):
            raise InvalidProgram(
                f"buffer {self.name!r} ({self.access.value}, role {role.value}) has an "
                f"output_byte_range but is never read back",
                "drop output_byte_range, or declare the buffer as an output "
                "(BufferDecl.output / read_write / write_only)",
            )
        object.__setattr__(self, "output_byte_range", (start, end))

    @property
    def role(self) -> BindingRole:
        """The binding role, first match wins (vyre's role table)."""
        try:
            return self._role  # type: ignore[attr-defined]
        except AttributeError:  # unpickled from a release that did not store it
            return self._derive_role()

    def _derive_role(self) -> BindingRole:
        if self.access is BufferAccess.WORKGROUP:
            return BindingRole.SHARED
        if self.persistent:
            return BindingRole.PERSISTENT
        if self.is_output:
            return BindingRole.OUTPUT
        if self.access is BufferAccess.READ_ONLY or self.access is BufferAccess.UNIFORM:
            return BindingRole.INPUT
        if self.access is BufferAccess.READ_WRITE:
            return BindingRole.INPUT_OUTPUT
        return BindingRole.OUTPUT

    @property
    def static_byte_len(self) -> int | None:
        """Bytes of a statically sized buffer; None when runtime-sized."""
        return self.count * self.dtype.itemsize if self.count else None

    # Convenience constructors (and ``output`` above) ---------------------------------------
    @classmethod
    def read(cls, name, binding, dtype, count=0, **kw) -> BufferDecl:
        """An input the kernel only reads."""
        if kw:
            return cls(name, binding, _READ_ONLY, dtype, count, **kw)
        return cls(name, binding, _READ_ONLY, dtype, count)

    @classmethod
    def uniform(cls, name, binding, dtype, count=0, **kw) -> BufferDecl:
        """A small read-only input (vyre's uniform); treated as an input."""
        if kw:
            return cls(name, binding, _UNIFORM, dtype, count, **kw)
        return cls(name, binding, _UNIFORM, dtype, count)

    @classmethod
    def read_write(cls, name, binding, dtype, count=0, **kw) -> BufferDecl:
        """An input the kernel updates in place; it is read back as an output."""
        if kw:
            return cls(name, binding, _READ_WRITE, dtype, count, **kw)
        return cls(name, binding, _READ_WRITE, dtype, count)

    @classmethod
    def write_only(cls, name, binding, dtype, count=0, **kw) -> BufferDecl:
        """An output the kernel only writes; cleared to zero before the launch."""
        if kw:
            return cls(name, binding, _WRITE_ONLY, dtype, count, **kw)
        return cls(name, binding, _WRITE_ONLY, dtype, count)

    @classmethod
    def workgroup(cls, name, binding, dtype, count, **kw) -> BufferDecl:
        """Per-block shared memory; not an argument, sized into dynamic shared memory."""
        if kw:
            return cls(name, binding, _WORKGROUP, dtype, count, **kw)
        return cls(name, binding, _WORKGROUP, dtype, count)


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

    Programs compare and hash by what they compute: two programs equal in every field (the kernel
    by its digest, a callable ``launch`` by the callable object) are equal, so a program rebuilt
    per call finds the plans and modules of an equal one. The hash is computed once, when the
    program is built. A program pickles when its ``launch`` does (a name, or a module-level
    function).

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
    name: str = field(default="")
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
        object.__setattr__(
            self,
            "_inputs",
            tuple(b for b in self.buffers if b.role in (BindingRole.INPUT, BindingRole.INPUT_OUTPUT)),
        )
        object.__setattr__(
            self,
            "_outputs",
            tuple(b for b in self.buffers if b.role in (BindingRole.OUTPUT, BindingRole.INPUT_OUTPUT)),
        )
        # the rows an elementwise dispatch cuts (needs inputs and outputs above)
        from .planning.elementwise import normalize_elementwise  # noqa: PLC0415 (cycle)

        declared, align, cut = normalize_elementwise(self)
        object.__setattr__(self, "elementwise", declared)
        object.__setattr__(self, "align", align)
        object.__setattr__(self, "_elementwise_bindings", cut)
        # once: the dispatch hot path hashes the program on every call (its plan-cache key)
        key = _structural_key(self)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def _identity(self) -> tuple:
        """Everything that defines what this program computes: ``(field name, value)`` for every
        dataclass field, in field order; the kernel by its digest, ``launch`` as given (a name,
        None or a callable). Programs with equal identities are equal (``==`` and ``hash``
        compare :func:`_structural_key`, this with a callable ``launch`` taken by object), so the
        backend's plan cache, the module cache and the tuning cache serve a rebuilt program as
        the first; ``vyre_cuda.dask.program_key`` digests this, so a field added to Program is
        part of every key by being a field."""
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
        """Names of the bindings an elementwise dispatch cuts into rows, binding order (empty when
        the program is not elementwise)."""
        return self._elementwise_bindings  # type: ignore[attr-defined]

    @property
    def outputs(self) -> tuple:
        """Declarations read back, in declaration order."""
        return self._outputs  # type: ignore[attr-defined]


remember_constructors(BufferDecl, ("read", "uniform", "read_write", "write_only", "workgroup"))
# (remembered as the others; on an instance `output` stays the flag, as _OutputAttribute types it)
setattr(BufferDecl, "output", remembered_constructor(_output_decl, BufferDecl, "is_output"))  # noqa: B010

# field names, in order, taken once (dataclasses.fields() per program built would cost more than
# the rest of its key)
_BUFFER_FIELDS = tuple(f.name for f in dataclasses.fields(BufferDecl))
_PROGRAM_FIELDS = tuple(f.name for f in dataclasses.fields(Program))
_buffer_fields = operator.attrgetter(*_BUFFER_FIELDS)  # a declaration as the tuple of its fields

# DTypes and access kinds are immutable and compare by value: a declaration or program built
# again with them is the one built first (_interned)
register_plain(DType)
register_plain(BufferAccess)


class _ByObject:
    """A callable ``launch`` inside a program's key: equal only to the same callable object.

    Its own ``==`` is not asked (a callable may define none, an unhashable one, or one that is not
    a bool); a plan made with one callable is never used with another."""

    __slots__ = ("fn",)

    def __init__(self, fn) -> None:
        self.fn = fn

    def __eq__(self, other) -> bool:
        return isinstance(other, _ByObject) and other.fn is self.fn

    def __hash__(self) -> int:
        return id(self.fn)


def _structural_key(program) -> tuple:
    """What ``Program.__eq__`` and ``__hash__`` compare: :meth:`Program._identity`'s values with
    each buffer as the tuple of its fields (compared in C, no Python ``__eq__`` per buffer) and a
    callable ``launch`` by object. Every field is a str, int, bool, enum, None, a tuple of those,
    or a frozen DType once the program is validated; anything unhashable is refused, named."""
    values = []
    for name, value in program._identity():
        if name == "buffers":
            value = tuple(map(_buffer_fields, value))
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
    """Raise InvalidProgram for anything structurally wrong with ``program`` (structure only; sizes
    are checked when a dispatch is planned)."""
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
        why = (
            "is a workgroup buffer (shared memory has no element count per dispatch)"
            if workgroup
            else ("names no buffer of the program")
        )
        raise InvalidProgram(
            f"Program.launch={launch!r} {why}",
            f"name one of {', '.join(map(repr, sized))}",
        )


def require_program(value, where: str, *, verb: str = "needs") -> None:
    """ValidationError "{where} {verb} a vyre_cuda.Program (got {type})" unless ``value`` is one."""
    if not isinstance(value, Program):
        raise ValidationError(
            f"{where} {verb} a vyre_cuda.Program (got {type(value).__name__})",
            "build one with Program(Kernel.cuda(src), [BufferDecl...])",
        )
