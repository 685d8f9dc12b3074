"""Split planning of DeviceGroup.dispatch_split: how one dispatch is cut into row chunks (pure: no driver)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validate import check_int
from ..config import as_config
from ..errors import InvalidProgram, ValidationError
from ..program import BindingRole, require_program
from .binding import check_input_count, whole_elements
from .elementwise import Terms, cut_bindings, declaration, refusal

__all__ = ["SplitPlan", "plan_split", "SPLIT_TERMS", "MIN_CHUNK_BYTES", "CHUNKS_PER_DEVICE"]

MIN_CHUNK_BYTES = 1 << 20  # smaller chunks cost more in overhead than another device saves
# more than one lets a slower device take fewer (work stealing); few keeps chunks large, plans cached
CHUNKS_PER_DEVICE = 2


@dataclass(frozen=True)
class SplitPlan:
    """How :meth:`DeviceGroup.dispatch_split` cuts one dispatch: chunk ``k`` covers rows
    ``bounds[k]``; ``inputs`` per program input ``("split", array)`` or ``("whole", buffer)``;
    ``outputs`` per output ``(name, numpy dtype, elements per row)``."""

    rows: int
    bounds: tuple
    inputs: tuple
    outputs: tuple

    def chunk_inputs(self, k: int) -> list:
        lo, hi = self.bounds[k]
        return [value[lo:hi] if kind == "split" else value for kind, value in self.inputs]

    def chunk_outputs(self, arrays, k: int) -> list:
        lo, hi = self.bounds[k]
        return [arr[lo * per_row : hi * per_row] for arr, (_, _, per_row) in zip(arrays, self.outputs)]

    def allocate(self, outputs=None) -> list:
        """New flat output arrays, or the caller's (checked: dtype, size, contiguity, writability)."""
        if outputs is None:
            return [np.empty(self.rows * per_row, dtype) for _, dtype, per_row in self.outputs]
        if (
            isinstance(outputs, np.ndarray)
            or not isinstance(outputs, (list, tuple))
            or len(outputs) != len(self.outputs)
        ):
            names = ", ".join(repr(n) for n, _, _ in self.outputs)
            raise ValidationError(
                f"outputs must be a list of {len(self.outputs)} array(s) ({names}), got "
                f"{type(outputs).__name__}" + (f" of {len(outputs)}" if isinstance(outputs, (list, tuple)) else ""),
                "pass one numpy array per program output, in declaration order, or outputs=None",
            )
        flat = []
        for (name, dtype, per_row), arr in zip(self.outputs, outputs):
            want = self.rows * per_row
            ok = (
                isinstance(arr, np.ndarray)
                and arr.dtype == dtype
                and arr.size == want
                and arr.flags.c_contiguous
                and arr.flags.writeable
            )
            if not ok:
                got = (
                    f"{arr.dtype} array of {arr.size} elements (contiguous={arr.flags.c_contiguous}, "
                    f"writeable={arr.flags.writeable})"
                    if isinstance(arr, np.ndarray)
                    else type(arr).__name__
                )
                raise ValidationError(
                    f"output {name!r} must be a writeable C-contiguous {dtype} array of {want} elements (got {got})",
                    f"pass np.empty({want}, np.{dtype}) or outputs=None",
                )
            flat.append(arr.reshape(-1))
        return flat


SPLIT_TERMS = Terms("split", "dispatch_split cannot split program {label!r}", "dispatch on one device")


def plan_split(
    program, inputs, split=None, config=None, *, devices: int = 1, align: int | None = None, chunks: int | None = None
) -> SplitPlan:
    """Plan a :meth:`DeviceGroup.dispatch_split` (pure). ``split`` declares the program
    elementwise for this call (as ``Program(elementwise=...)``; None: the program's own, and
    ``align=None`` its align). Split inputs are cut along their first axis at multiples of
    ``align`` rows, others go whole to every chunk; the rules of :mod:`.elementwise` are refused
    here with a ValidationError."""
    require_program(program, "dispatch_split")
    cfg = as_config(config)
    declared = program.elementwise if split is None else split
    if align is None:
        align = program.align
    try:  # the elementwise rules, refused here as the caller's error
        declared = declaration(declared, SPLIT_TERMS)
        if declared is False:
            raise refusal(
                program,
                "it is not declared elementwise" + (" (split=False)" if split is not None else ""),
                "declare Program(..., elementwise=True) (or the names of the inputs to cut), or pass split=True "
                "(or split=['x', ...]) to this call, when element i of every output depends only on element i "
                "(row i) of the runtime-sized inputs; otherwise dispatch it on one device, or give map() "
                "independent inputs",
                SPLIT_TERMS,
            )
        if cfg.cooperative:
            raise refusal(
                program,
                "it synchronises the whole grid (cooperative=True), so its chunks are not independent",
                "drop cooperative=True, or dispatch it on one device (CudaBackend.dispatch)",
                SPLIT_TERMS,
            )
        cut = cut_bindings(program, declared, SPLIT_TERMS)
    except InvalidProgram as err:
        raise ValidationError(err.message, err.fix) from None
    for name, value in (("align", align), ("devices", devices)):
        check_int(name, value, minimum=1, fix=f"pass {name}=1 or more")
    if chunks is not None:
        check_int(
            "chunks",
            chunks,
            minimum=1,
            expected="an int >= 1 or None",
            fix="pass chunks=None to let the group choose, or a positive count",
        )
    decls = program.inputs
    if isinstance(inputs, (str, bytes, np.ndarray)) or not hasattr(inputs, "__len__"):
        raise ValidationError(
            f"inputs must be a list of buffers (got {type(inputs).__name__})",
            "pass a list with one buffer per program input, e.g. [x, y]",
        )
    check_input_count(decls, len(inputs))
    chosen = {d.name for d in decls if d.name in cut}

    views = []
    rows: int | None = None
    per_row: dict = {}
    for i, (decl, value) in enumerate(zip(decls, inputs)):
        if decl.name not in chosen:
            views.append(("whole", value))
            continue
        arr = _as_rows(value, decl, i)
        row_bytes = arr.nbytes // arr.shape[0] if arr.shape[0] else arr.itemsize * math.prod(arr.shape[1:])
        if row_bytes % decl.dtype.itemsize:
            raise ValidationError(
                f"input {i} ({decl.name!r}): a row of shape {arr.shape[1:]} holds {row_bytes} bytes, "
                f"not a whole number of {decl.dtype.itemsize}-byte {decl.dtype.name} elements",
                f"pass {decl.name!r} as an array of {decl.dtype.name} (numpy {decl.dtype.numpy})",
            )
        if rows is not None and arr.shape[0] != rows:
            raise ValidationError(
                f"split inputs must have the same number of rows (first dimension): input {i} "
                f"({decl.name!r}) has {arr.shape[0]}, an earlier split input has {rows}",
                "pass split inputs with the same first dimension; reshape flat buffers to "
                "(rows, elements_per_row) where a row of one input matches a row of another",
            )
        rows = arr.shape[0]
        per_row[decl.name] = row_bytes // decl.dtype.itemsize
        views.append(("split", arr))
    assert rows is not None  # chosen is not empty: at least one input was cut
    if rows == 0:
        raise ValidationError(
            "the split inputs are empty (0 rows)",
            "skip the dispatch for empty inputs",
        )
    out_specs = []
    widest = max(per_row.values())
    for decl in program.outputs:
        width = per_row[decl.name] if decl.role is BindingRole.INPUT_OUTPUT else widest
        out_specs.append((decl.name, decl.dtype.numpy, width))

    row_bytes_total = sum(views[i][1].nbytes for i in range(len(views)) if views[i][0] == "split") // rows
    row_bytes_total += sum(np.dtype(dt).itemsize * w for _, dt, w in out_specs)
    if chunks is None:
        if devices == 1:
            chunks = 1
        else:
            by_size = max(1, (rows * row_bytes_total) // MIN_CHUNK_BYTES)
            chunks = min(devices * CHUNKS_PER_DEVICE, by_size)
    size = -(-rows // int(chunks))
    size = -(-size // int(align)) * int(align)
    bounds = tuple((lo, min(lo + size, rows)) for lo in range(0, rows, size))
    return SplitPlan(rows=rows, bounds=bounds, inputs=tuple(views), outputs=tuple(out_specs))


def _as_rows(value, decl, index: int) -> np.ndarray:
    """An input as an array whose first axis is the split axis (bytes-like: 1-D of its dtype)."""
    if isinstance(value, np.ndarray):
        arr = value
    else:
        try:
            view = memoryview(value).cast("B")
        except (TypeError, ValueError, BufferError):
            raise ValidationError(
                f"input {index} ({decl.name!r}) is a {type(value).__name__}, which is not a C-contiguous buffer",
                "pass a numpy array, bytes, bytearray, memoryview or another C-contiguous buffer",
            ) from None
        whole_elements(index, decl, view.nbytes)
        arr = np.frombuffer(view, dtype=decl.dtype.numpy)
    if arr.ndim == 0:
        raise ValidationError(
            f"input {index} ({decl.name!r}) is a 0-d array; there is no axis to split",
            f"pass {decl.name!r} as a 1-D array, or leave it out of split",
        )
    if not arr.flags.c_contiguous:
        raise ValidationError(
            f"input {index} ({decl.name!r}) of shape {arr.shape} is not C-contiguous",
            "pass np.ascontiguousarray(x)",
        )
    return arr
