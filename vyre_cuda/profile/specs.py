"""What a profile run is asked to measure: sizes per buffer, and a user kernel with its buffers."""

from __future__ import annotations

import pathlib
import re

from .._validate import is_int
from ..errors import BackendError, ValidationError
from ..program import DTYPES, BufferDecl, Kernel, Program, dtype_of

__all__ = ["GIB", "KIB", "MIB", "format_size", "load_user_program", "parse_buffer_spec", "parse_size", "parse_sizes"]

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
_SIZE_RE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*\Z")
_SUFFIXES = {"": 1, "b": 1, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB, "g": GIB, "gib": GIB}


def parse_size(text) -> int:
    """Bytes from ``4096``, ``4K``, ``4KiB``, ``4M``, ``4MiB``, ``1G``, ``1GiB`` (binary multiples,
    any case)."""
    if is_int(text):
        value = int(text)
    else:
        m = _SIZE_RE.match(str(text))
        suffix = m.group(2).lower() if m else None
        if m is None or suffix not in _SUFFIXES:
            raise ValidationError(
                f"cannot read {text!r} as a size in bytes",
                "write sizes as an integer with an optional K, KiB, M, MiB, G or GiB suffix "
                "(binary multiples), e.g. --sizes 4KiB,4MiB,1GiB",
            )
        value = int(m.group(1)) * _SUFFIXES[suffix]
    if value <= 0:
        raise ValidationError(f"a buffer size must be at least 1 byte (got {value})", "pass a positive size")
    return value


def parse_sizes(text) -> tuple:
    """A comma-separated list of sizes (or an iterable of them), duplicates dropped, in order."""
    items = text.split(",") if isinstance(text, str) else list(text)
    sizes = tuple(dict.fromkeys(parse_size(x) for x in items if not isinstance(x, str) or x.strip()))
    if not sizes:
        raise ValidationError(f"no sizes given (got {text!r})", "pass sizes like --sizes 4KiB,4MiB")
    return sizes


def format_size(nbytes: int) -> str:
    """``4 KiB``, ``4 MiB``, ``1 GiB``, or ``1000 B`` when not a whole number of KiB."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


_ROLES = {"in": BufferDecl.read, "out": BufferDecl.output, "inout": BufferDecl.read_write}
_SPEC_FIX = (
    "write --buffers as comma-separated name:dtype:role entries in binding order, role one of "
    "in, out, inout, e.g. 'a:f32:in,b:f32:in,out:f32:out'"
)


def parse_buffer_spec(spec: str) -> tuple:
    """Buffer declarations from ``"a:f32:in,b:f32:in,out:f32:out"``.

    Bindings follow the order of the entries. ``in`` is a read-only input, ``out`` an output
    (cleared, then read back), ``inout`` an input read back after the kernel. Every buffer is
    runtime-sized (its element count comes from the profiled size).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValidationError(f"the buffer spec is empty (got {spec!r})", _SPEC_FIX)
    decls = []
    seen = set()
    roles = set()
    for binding, entry in enumerate(spec.split(",")):
        fields = [f.strip() for f in entry.split(":")]
        if len(fields) != 3:
            raise ValidationError(
                f"buffer spec entry {entry.strip()!r} must be name:dtype:role "
                f"(got {len(fields)} field{'s' if len(fields) != 1 else ''})",
                _SPEC_FIX,
            )
        name, dtype, role = fields
        if not name.isidentifier():
            raise ValidationError(f"buffer name {name!r} in {entry.strip()!r} is not an identifier", _SPEC_FIX)
        if name in seen:
            raise ValidationError(f"buffer name {name!r} appears twice in the spec", _SPEC_FIX)
        seen.add(name)
        try:
            dt = dtype_of(dtype)
        except BackendError:
            raise ValidationError(
                f"buffer {name!r} has an unknown dtype (got {dtype!r})", f"use one of {', '.join(DTYPES)}"
            ) from None
        if role not in _ROLES:
            raise ValidationError(f"buffer {name!r} has an unknown role (got {role!r})", _SPEC_FIX)
        roles.add(role)
        decls.append(_ROLES[role](name, binding, dt))
    if roles == {"in"}:
        raise ValidationError(f"the buffer spec {spec!r} declares no output", _SPEC_FIX + "; mark results out")
    return tuple(decls)


def load_user_program(path, entry=None, buffers=None, workgroup_size=256):
    """A :class:`~vyre_cuda.Program` from a CUDA (``.cu``, ...) or PTX (``.ptx``) file and a
    buffer spec (see :func:`parse_buffer_spec`). ``entry`` defaults to the kernel kind's."""
    if buffers is None:
        raise ValidationError("a user kernel needs a buffer spec", "pass --buffers, e.g. 'a:f32:in,out:f32:out'")
    decls = parse_buffer_spec(buffers)
    p = pathlib.Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValidationError(
            f"cannot read kernel file {str(p)!r}: {exc.strerror or exc}",
            "pass --kernel with the path of a readable .cu or .ptx file",
        ) from None
    make = Kernel.ptx if p.suffix.lower() == ".ptx" else Kernel.cuda
    kernel = make(text, entry) if entry else make(text)
    return Program(kernel, decls, workgroup_size=workgroup_size, name=p.stem)
