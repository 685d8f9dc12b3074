"""Element types: DType, the DTYPES table, name aliases and dtype_of (re-exported by vyre_cuda.program)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .errors import InvalidProgram, ValidationError

__all__ = ["DTYPES", "DType", "dtype_of", "is_little_endian", "byte_order_error"]

_LITTLE_HOST = sys.byteorder == "little"


@dataclass(frozen=True)
class DType:
    """An element type a buffer may hold: ``min_cc`` is the compute capability it needs, ``kind`` the
    buffer-protocol kind of its inputs (``"u"``, ``"i"`` or ``"f"``; bf16 travels as uint16 bits).
    """

    name: str
    itemsize: int
    numpy: np.dtype
    capability: str = ""
    min_cc: tuple = (0, 0)
    kind: str = "u"

    def __hash__(self) -> int:
        # by name: a declaration's cache key hashes its dtype on every build (numpy's hash is slower)
        return hash(self.name)

    def __repr__(self) -> str:
        return f"DType({self.name})"

    def __reduce__(self):
        # the table's types load as the table's objects (declarations key their DType by identity)
        if DTYPES.get(self.name) == self:
            return (_named, (self.name,))
        return (DType, (self.name, self.itemsize, self.numpy, self.capability, self.min_cc, self.kind))


def _named(name: str) -> DType:
    return DTYPES[name]


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
        DType("i8", 1, np.dtype(np.int8), kind="i"),
        DType("u16", 2, np.dtype(np.uint16)),
        DType("i16", 2, np.dtype(np.int16), kind="i"),
        DType("f16", 2, np.dtype(np.float16), "f16", (5, 3), kind="f"),
        DType("bf16", 2, _bf16_numpy(), "bf16", (8, 0), kind="u"),
        DType("u32", 4, np.dtype(np.uint32)),
        DType("i32", 4, np.dtype(np.int32), kind="i"),
        DType("f32", 4, np.dtype(np.float32), kind="f"),
        DType("u64", 8, np.dtype(np.uint64)),
        DType("i64", 8, np.dtype(np.int64), kind="i"),
        DType("f64", 8, np.dtype(np.float64), kind="f"),
    )
}

# every name -> its DType (dtype_of's fast path for a str): vyre's, numpy's ("uint8", ...) and C's
_BY_NAME = {**DTYPES, **{d.numpy.name: d for d in DTYPES.values() if d.name != "bf16"}}
_BY_NAME.update(half=DTYPES["f16"], bfloat16=DTYPES["bf16"], float=DTYPES["f32"], double=DTYPES["f64"])


def dtype_of(value) -> DType:
    """Resolve a dtype given as a :class:`DType`, a name ('f32', 'float32') or a numpy dtype.

    Examples
    --------
    >>> dtype_of("float32"), dtype_of("bf16").itemsize
    (DType(f32), 2)
    """
    if isinstance(value, str):  # (the common spelling first: one dict lookup)
        found = _BY_NAME.get(value)
        if found is not None:
            return found
    elif isinstance(value, DType):
        return value
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


def is_little_endian(dtype) -> bool:
    """Whether elements of numpy ``dtype`` are little-endian (or single bytes) as the GPU reads them.
    ``isnative`` covers a structured dtype's fields on the little-endian hosts CUDA runs on."""
    return dtype.isnative if _LITTLE_HOST else dtype == dtype.newbyteorder("<")


def byte_order_error(what, described, output=False):
    """The refusal of a big-endian input or output; ``described``: the format or typestr passed."""
    if output:
        return ValidationError(
            f"{what} is big-endian ({described}); the GPU writes little-endian",
            "pass a little-endian output (dtype x.dtype.newbyteorder('<')) and convert the result "
            "afterwards if you need big-endian",
        )
    return ValidationError(
        f"{what} is big-endian ({described}); the GPU reads little-endian",
        "convert it with x.astype(x.dtype.newbyteorder('=')) before dispatch",
    )
