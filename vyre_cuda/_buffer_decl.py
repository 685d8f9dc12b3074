"""Buffer declarations: BufferDecl, its access kinds and binding roles (re-exported by vyre_cuda.program).

Each declaration is checked and its role derived when built; a program checks only how they fit together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import operator
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, overload

from ._dtypes import DType, dtype_of
from ._interned import Interned, register_plain, remembered_constructor
from ._validate import is_flag, is_int
from .errors import InvalidProgram
from .kernel import remember_constructors

__all__ = ["BufferAccess", "BindingRole", "BufferDecl", "buffer_fields"]


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


def _constructor(access: BufferAccess, doc: str, *flags: bool) -> classmethod[BufferDecl, ..., BufferDecl]:
    """A convenience constructor of ``access`` buffers (``flags``: the output flag of ``output``)."""

    def build(cls, name, binding, dtype, count=0, **kw) -> BufferDecl:
        # (a call with no keywords builds no empty dict: programs built per call go through these
        # constructors, notes/plan-miss.md)
        if kw:
            return cls(name, binding, access, dtype, count, *flags, **kw)
        return cls(name, binding, access, dtype, count, *flags)

    build.__doc__ = doc
    return classmethod(build)


_OUTPUT = _constructor(
    BufferAccess.READ_WRITE, "An output with no input: cleared to zero before the launch, read back after.", True
)


class _OutputAttribute:
    """``BufferDecl.output(...)`` builds an output declaration; ``decl.output`` reads its flag (the
    field ``is_output``), each with its own type."""

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
                bound = self._bound[owner] = types.MethodType(_OUTPUT.__func__, owner)
            return bound
        return obj.is_output


@dataclass(frozen=True, init=False)
class BufferDecl(metaclass=Interned):
    """One buffer of a program.

    ``name`` is unique (``Program(launch=)`` and error messages refer to it); ``binding`` is the
    argument position and word ``binding + 1`` of the params block; ``access`` a
    :class:`BufferAccess` or its value; ``dtype`` a DType, name or numpy dtype; ``count`` the
    element count (0: runtime-sized, from the input's length). ``output`` marks a buffer the
    dispatch returns with no input (the field is ``is_output``); ``output_byte_range`` the
    ``(start, end)`` bytes of an output to read back (multiples of the element size);
    ``alignment`` the device allocation's byte alignment (a power of two up to 4096);
    ``persistent`` a resident buffer (refused by the borrowed-buffer dispatch). ``zeroed=False``
    skips a pure output's zeroing when the kernel writes all of it (an unwritten element then holds
    whatever the memory held, as with ``cupy.empty``).

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
        # derived once (planning asks many times per plan); not fields: not compared, not in repr
        object.__setattr__(self, "_role", self._derive_role())
        object.__setattr__(self, "_hash", hash(buffer_fields(self)))

    def __eq__(self, other):
        # a program's cache keys compare and hash its declarations on every build: the hash first
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return hash(self) == hash(other) and buffer_fields(self) == buffer_fields(other)

    def __hash__(self) -> int:
        try:
            return self._hash  # type: ignore[attr-defined]
        except AttributeError:  # unpickled from a release that did not store it
            return hash(buffer_fields(self))

    def __reduce__(self):
        # rebuilt through the constructor: the cached hash is per process (str hashes are salted)
        return (BufferDecl, buffer_fields(self))  # the constructor takes the fields in order

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
        role = self._derive_role()
        if self.output_byte_range is not None:
            self._validate_byte_range(role)
        if not self.zeroed and role is not BindingRole.OUTPUT:
            raise InvalidProgram(
                f"buffer {self.name!r} ({self.access.value}, role {role.value}) is "
                "declared zeroed=False, but only a pure output is zeroed before the launch",
                "drop zeroed=False, or declare the buffer as an output (BufferDecl.output / write_only)",
            )
        if self.access is BufferAccess.WORKGROUP and self.count == 0:
            raise InvalidProgram(
                f"workgroup buffer {self.name!r} has count 0; shared memory is sized at plan time",
                "give workgroup buffers a static element count",
            )

    def _validate_byte_range(self, role: BindingRole) -> None:
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
    read = _constructor(BufferAccess.READ_ONLY, "An input the kernel only reads.")
    uniform = _constructor(BufferAccess.UNIFORM, "A small read-only input (vyre's uniform); treated as an input.")
    read_write = _constructor(
        BufferAccess.READ_WRITE, "An input the kernel updates in place; it is read back as an output."
    )
    write_only = _constructor(
        BufferAccess.WRITE_ONLY, "An output the kernel only writes; cleared to zero before the launch."
    )

    @classmethod
    def workgroup(cls, name, binding, dtype, count, **kw) -> BufferDecl:
        """Per-block shared memory; not an argument, sized into dynamic shared memory."""
        if kw:
            return cls(name, binding, BufferAccess.WORKGROUP, dtype, count, **kw)
        return cls(name, binding, BufferAccess.WORKGROUP, dtype, count)


remember_constructors(BufferDecl, ("read", "uniform", "read_write", "write_only", "workgroup"))
# (remembered as the others; on an instance `output` stays the flag, as _OutputAttribute types it)
setattr(BufferDecl, "output", remembered_constructor(_OUTPUT.__func__, BufferDecl, "is_output"))  # noqa: B010

# taken once: dataclasses.fields() per declaration built would cost more than the rest of its key
_BUFFER_FIELDS = tuple(f.name for f in dataclasses.fields(BufferDecl))
buffer_fields = operator.attrgetter(*_BUFFER_FIELDS)  # a declaration as the tuple of its fields

# immutable, compared by value: a declaration or program built again with them is the first (_interned)
register_plain(DType)
register_plain(BufferAccess)
