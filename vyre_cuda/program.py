"""The program model: kernels, buffer declarations, access kinds, binding roles and dtypes."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field

import numpy as np

from .errors import InvalidProgram

__all__ = [
    "DType",
    "DTYPES",
    "BufferAccess",
    "BindingRole",
    "BufferDecl",
    "Kernel",
    "Program",
    "dtype_of",
]


@dataclass(frozen=True)
class DType:
    """An element type a buffer may hold. ``min_cc`` is the compute capability it needs."""

    name: str
    itemsize: int
    numpy: np.dtype
    capability: str = ""
    min_cc: tuple = (0, 0)

    def __repr__(self) -> str:
        return f"DType({self.name})"


def _bf16_numpy() -> np.dtype:
    # numpy has no bfloat16; the bits travel as uint16 unless ml_dtypes is installed.
    try:
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return np.dtype(np.uint16)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("u8", 1, np.dtype(np.uint8)),
        DType("i8", 1, np.dtype(np.int8)),
        DType("u16", 2, np.dtype(np.uint16)),
        DType("i16", 2, np.dtype(np.int16)),
        DType("f16", 2, np.dtype(np.float16), "f16", (5, 3)),
        DType("bf16", 2, _bf16_numpy(), "bf16", (8, 0)),
        DType("u32", 4, np.dtype(np.uint32)),
        DType("i32", 4, np.dtype(np.int32)),
        DType("f32", 4, np.dtype(np.float32)),
        DType("u64", 8, np.dtype(np.uint64)),
        DType("i64", 8, np.dtype(np.int64)),
        DType("f64", 8, np.dtype(np.float64)),
    )
}

_ALIASES = {
    "uint8": "u8", "int8": "i8", "uint16": "u16", "int16": "i16", "float16": "f16",
    "half": "f16", "bfloat16": "bf16", "uint32": "u32", "int32": "i32", "float32": "f32",
    "float": "f32", "uint64": "u64", "int64": "i64", "float64": "f64", "double": "f64",
}


def dtype_of(value) -> DType:
    """Resolve a dtype given as a :class:`DType`, a name ('f32', 'float32') or a numpy dtype."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        key = _ALIASES.get(value, value)
        if key in DTYPES:
            return DTYPES[key]
    elif value is not None:  # np.dtype(None) would be float64
        try:
            npd = np.dtype(value)
        except (TypeError, ValueError):
            npd = None
        if npd is not None:
            for d in DTYPES.values():
                if d.numpy == npd and d.name != "bf16":
                    return d
            if npd.name == "bfloat16":
                return DTYPES["bf16"]
    raise InvalidProgram(
        f"unknown element dtype {value!r}",
        f"use one of {', '.join(DTYPES)} (or the matching numpy dtype)",
    )


class BufferAccess(enum.Enum):
    READ_ONLY = "read_only"
    READ_WRITE = "read_write"
    WRITE_ONLY = "write_only"
    UNIFORM = "uniform"
    WORKGROUP = "workgroup"


class BindingRole(enum.Enum):
    INPUT = "input"
    OUTPUT = "output"
    INPUT_OUTPUT = "input_output"
    SHARED = "shared"
    PERSISTENT = "persistent"


@dataclass(frozen=True)
class BufferDecl:
    """One buffer of a program.

    ``count`` is the element count; 0 means runtime-sized (taken from the input's length).
    ``output`` marks a buffer the dispatch returns with no input. ``output_byte_range`` is a
    ``(start, end)`` byte range of the buffer to read back. ``alignment`` is a preferred byte
    alignment of the device allocation. ``persistent`` declares a resident buffer (refused).
    """

    name: str
    binding: int
    access: BufferAccess
    dtype: DType
    count: int = 0
    output: bool = False
    output_byte_range: tuple | None = None
    alignment: int | None = None
    persistent: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtype_of(self.dtype))
        if isinstance(self.access, str):
            try:
                object.__setattr__(self, "access", BufferAccess(self.access))
            except ValueError:
                pass
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
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise InvalidProgram(
                    f"buffer {self.name!r}: {attr} must be a non-negative integer (got {v!r})",
                    f"pass {attr} as an int >= 0",
                )
            object.__setattr__(self, attr, int(v))
        if self.alignment is not None:
            a = self.alignment
            if (isinstance(a, bool) or not isinstance(a, (int, np.integer)) or a <= 0
                    or (a & (a - 1)) != 0 or a > 4096):
                raise InvalidProgram(
                    f"buffer {self.name!r}: alignment must be a power of two in 1..4096 (got {a!r})",
                    "pass alignment=None or a power of two such as 16, 128 or 256",
                )
            object.__setattr__(self, "alignment", int(a))
        if self.output_byte_range is not None:
            r = self.output_byte_range
            ok = (
                isinstance(r, (tuple, list))
                and len(r) == 2
                and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in r)
            )
            if not ok or r[0] < 0 or r[1] < r[0]:
                raise InvalidProgram(
                    f"buffer {self.name!r}: output_byte_range must be (start, end) with "
                    f"0 <= start <= end (got {r!r})",
                    "pass output_byte_range=(start, end) in bytes, or None for the whole buffer",
                )
            object.__setattr__(self, "output_byte_range", (int(r[0]), int(r[1])))
        if self.access is BufferAccess.WORKGROUP and self.count == 0:
            raise InvalidProgram(
                f"workgroup buffer {self.name!r} has count 0; shared memory is sized at plan time",
                "give workgroup buffers a static element count",
            )

    @property
    def role(self) -> BindingRole:
        """The binding role, first match wins (vyre's role table)."""
        if self.access is BufferAccess.WORKGROUP:
            return BindingRole.SHARED
        if self.persistent:
            return BindingRole.PERSISTENT
        if self.output:
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

    # Convenience constructors -------------------------------------------------------------
    @classmethod
    def read(cls, name, binding, dtype, count=0, **kw) -> "BufferDecl":
        """An input the kernel only reads."""
        return cls(name, binding, BufferAccess.READ_ONLY, dtype, count, **kw)

    @classmethod
    def uniform(cls, name, binding, dtype, count=0, **kw) -> "BufferDecl":
        """A small read-only input (vyre's uniform); treated as an input."""
        return cls(name, binding, BufferAccess.UNIFORM, dtype, count, **kw)

    @classmethod
    def read_write(cls, name, binding, dtype, count=0, **kw) -> "BufferDecl":
        """An input the kernel updates in place; it is read back as an output."""
        return cls(name, binding, BufferAccess.READ_WRITE, dtype, count, **kw)

    @classmethod
    def write_only(cls, name, binding, dtype, count=0, **kw) -> "BufferDecl":
        return cls(name, binding, BufferAccess.WRITE_ONLY, dtype, count, **kw)

    @classmethod
    def workgroup(cls, name, binding, dtype, count, **kw) -> "BufferDecl":
        """Per-block shared memory; not an argument, sized into dynamic shared memory."""
        return cls(name, binding, BufferAccess.WORKGROUP, dtype, count, **kw)


def _output_decl(cls, name, binding, dtype, count=0, **kw) -> BufferDecl:
    """An output with no input: cleared to zero before the launch, read back after."""
    return cls(name, binding, BufferAccess.READ_WRITE, dtype, count, output=True, **kw)


# `output` is both a field (the flag) and a constructor: attach the constructor after the
# dataclass took the field's default, so instances read the flag and the class offers the factory.
BufferDecl.output = classmethod(_output_decl)


class Kernel:
    """Kernel code: CUDA C++ for NVRTC (:meth:`cuda`) or PTX text (:meth:`ptx`).

    Use the factories; ``Kernel(...)`` directly is not supported.
    """

    __slots__ = ("kind", "source", "entry", "options", "_digest")

    def __init__(self, kind, source, entry, options=()):
        if kind not in ("cuda", "ptx"):
            raise InvalidProgram(
                f"Kernel kind must be 'cuda' or 'ptx' (got {kind!r})",
                "build kernels with Kernel.cuda(source) or Kernel.ptx(text)",
            )
        if isinstance(source, bytes):
            source = source.decode()
        if not isinstance(source, str) or not source.strip():
            raise InvalidProgram(
                f"{kind} kernel source must be non-empty text (got {type(source).__name__})",
                "pass the kernel source as a str",
            )
        if not isinstance(entry, str) or not entry.isidentifier():
            raise InvalidProgram(
                f"kernel entry must be an identifier (got {entry!r})",
                "pass entry='name_of_the_extern_C_global_function'",
            )
        self.kind = kind
        self.source = source
        self.entry = entry
        if isinstance(options, (str, bytes)):
            options = (options,)  # one option, not one per character
        self.options = tuple(o.decode() if isinstance(o, bytes) else str(o) for o in options)
        h = hashlib.sha256()
        for part in (kind, entry, *self.options, source):
            raw = part.encode()
            h.update(len(raw).to_bytes(8, "little"))  # length-prefixed: no two part lists collide
            h.update(raw)
        self._digest = h.hexdigest()

    @classmethod
    def cuda(cls, source: str, entry: str = "vyre_main", options=()) -> "Kernel":
        """CUDA C++ compiled by NVRTC. The entry must be ``extern "C" __global__``.

        C++ forbids a ``__global__`` function named ``main``, so the default entry of CUDA
        kernels is ``vyre_main`` (the header's ``VYRE_KERNEL`` macro declares it).
        """
        return cls("cuda", source, entry, options)

    @classmethod
    def ptx(cls, text: str, entry: str = "main") -> "Kernel":
        """PTX text loaded (and JIT-compiled) by the driver."""
        return cls("ptx", text, entry)

    @property
    def digest(self) -> str:
        """SHA-256 over kind, entry, options and source."""
        return self._digest

    def __repr__(self) -> str:
        return f"Kernel.{self.kind}(<{len(self.source)} chars>, entry={self.entry!r})"


@dataclass(frozen=True, eq=False)
class Program:
    """A kernel plus its buffer declarations and launch shape.

    Programs hash by identity: dispatch caches its prepared plan per program object, so build a
    program once and dispatch it many times.
    """

    kernel: Kernel
    buffers: tuple
    workgroup_size: tuple = (256, 1, 1)
    grid_sync: bool = False
    phases: int = 1
    requires: tuple = ()
    name: str = field(default="")

    def __post_init__(self):
        from .planning.validate import validate_program  # noqa: PLC0415 (cycle)

        for attr in ("buffers", "requires"):
            value = getattr(self, attr)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise InvalidProgram(
                    f"Program.{attr} must be a sequence (got {type(value).__name__})",
                    f"pass {attr} as a list or tuple",
                )
            object.__setattr__(self, attr, tuple(value))
        ws = self.workgroup_size
        if isinstance(ws, (int, np.integer)) and not isinstance(ws, bool):
            ws = (int(ws),)
        if not isinstance(ws, (tuple, list)) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in ws
        ):
            raise InvalidProgram(
                f"workgroup_size must be an int or 1 to 3 ints (got {self.workgroup_size!r})",
                "pass workgroup_size=(256, 1, 1) or another positive shape",
            )
        if 1 <= len(ws) <= 3:
            ws = tuple(int(v) for v in ws) + (1,) * (3 - len(ws))
        object.__setattr__(self, "workgroup_size", tuple(ws))
        validate_program(self)

    @property
    def inputs(self) -> tuple:
        """Declarations that take a caller's input, in declaration order."""
        return tuple(
            b for b in self.buffers if b.role in (BindingRole.INPUT, BindingRole.INPUT_OUTPUT)
        )

    @property
    def outputs(self) -> tuple:
        """Declarations read back, in declaration order."""
        return tuple(
            b for b in self.buffers if b.role in (BindingRole.OUTPUT, BindingRole.INPUT_OUTPUT)
        )
