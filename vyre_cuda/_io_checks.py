"""Cold checks of the dispatch core on host memory: what is wrong with a caller's input or output
buffers and argument lists, as typed errors with a Fix (only ``check_outputs`` runs on a dispatch
that succeeds; its device arrays go to the device-array reader, :mod:`vyre_cuda._devview`).
``host_format`` and ``check_host_inputs`` let :func:`vyre_cuda.plan` refuse what a dispatch would,
with the dispatch's own errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ._dtypes import byte_order_error
from .errors import ValidationError

if TYPE_CHECKING:
    from ._devproto import DevView

__all__ = [
    "input_error",
    "dtype_error",
    "as_input_list",
    "as_output_list",
    "check_outputs",
    "raw_bits",
    "format_kind",
    "kind_ok",
    "host_format",
    "check_host_inputs",
]


def raw_bits(obj):
    """A numpy array of a dtype with no buffer export (bfloat16, float8...) viewed as unsigned
    integers of its item size (its raw bits); else None."""
    if not isinstance(obj, np.ndarray):
        return None
    dtype = obj.dtype
    if dtype.kind == "V" and not dtype.fields and dtype.itemsize in (1, 2, 4, 8):
        return obj.view(np.dtype(f"u{dtype.itemsize}"))
    return None


def _is_buffer(obj) -> bool:
    try:
        memoryview(obj).release()
        return True
    except (TypeError, ValueError, BufferError):
        return False


def input_error(program, i, obj, exc):
    names = [d.name for d in getattr(program, "inputs", ())]
    name = repr(names[i]) if i < len(names) else "(extra)"
    if not _is_buffer(obj):
        return ValidationError(
            f"input {i} ({name}) is a {type(obj).__name__}, which does not expose the buffer protocol",
            "pass a numpy array, bytes, bytearray, memoryview or another C-contiguous buffer",
        )
    return ValidationError(
        f"input {i} ({name}) is not C-contiguous ({exc})",
        "pass numpy.ascontiguousarray(x) (a strided view must be copied before upload)",
    )


def dtype_error(program, i, fmt, itemsize, obj):
    decl = program.inputs[i]
    if fmt[:1] in (">", "!"):
        return byte_order_error(f"input {i} ({decl.name!r})", f"format {fmt!r}")
    got = getattr(getattr(obj, "dtype", None), "name", f"format {fmt!r}, {itemsize}-byte items")
    if decl.dtype.name == "bf16":
        return ValidationError(
            f"input {i} ({decl.name!r}) holds {got} but the buffer is declared bf16, which travels as "
            "its raw bits in a uint16 array",
            "pass the raw bits, x.view(numpy.uint16) for a bfloat16 array (astype would convert the values)",
        )
    return ValidationError(
        f"input {i} ({decl.name!r}) holds {got} but the buffer is declared {decl.dtype.name}",
        f"convert it, e.g. x.astype(numpy.{decl.dtype.numpy.name}), or pass raw bytes (a uint8 view) "
        "to reinterpret deliberately",
    )


def format_kind(fmt: str) -> str:
    """The element class of a struct-module format: ``"f"``, ``"i"``, ``"u"``, ``"x"`` for
    big-endian, ``""`` for any other (the core's ``format_kind``, in Python).

    >>> format_kind("<f"), format_kind("q"), format_kind("B"), format_kind(">I"), format_kind("Zf")
    ('f', 'i', 'u', 'x', '')
    """
    if not fmt:
        return "u"
    if fmt[0] in ">!":
        return "x"  # the kernel would see swapped bytes
    code = fmt.lstrip("@=<")[:1]
    if not code:
        return ""
    if code in "efdE":
        return "f"
    if code in "bhilqn":
        return "i"
    if code in "BHILQNc?":
        return "u"
    return ""


def kind_ok(want: str, want_size: int, fmt: str, itemsize: int) -> bool:
    """Whether a buffer of ``fmt`` and ``itemsize`` may feed an input declared ``(want_size,
    want)``: the core's check. Raw bytes (1-byte items) always may.

    >>> kind_ok("f", 4, "f", 4), kind_ok("f", 4, "d", 8), kind_ok("f", 4, "B", 1)
    (True, False, True)
    """
    if not want or itemsize == 1:
        return True
    return itemsize == want_size and format_kind(fmt) == want


def host_format(obj):
    """``(format, itemsize, nbytes)`` of a host input as a dispatch exports it (its buffer, else
    its raw bits), or None when it is no host buffer."""
    try:
        with memoryview(obj) as view:
            return view.format, view.itemsize, view.nbytes
    except (TypeError, ValueError, BufferError):
        pass
    bits = raw_bits(obj)
    if bits is None:
        return None
    with memoryview(bits) as view:
        return view.format, view.itemsize, view.nbytes


def check_host_inputs(plan, described):
    """Refuse the first host input whose element type is not its declaration's, as a dispatch
    does. ``described[i]``: ``(format, itemsize, obj)`` for host input ``i``, None for a device one."""
    for (index, _, _, _), (itemsize, kind) in zip(plan.layout.inputs, plan.input_specs):
        host = described[index]
        if host is not None and not kind_ok(kind, itemsize, host[0], host[1]):
            raise dtype_error(plan.program, index, host[0], host[1], host[2])


def as_input_list(inputs):
    if _is_buffer(inputs) or inputs is None or isinstance(inputs, (str, dict)):
        raise ValidationError(
            f"inputs must be a list or tuple of buffers (got a single {type(inputs).__name__}"
            f"{' with shape ' + str(inputs.shape) if hasattr(inputs, 'shape') else ''})",
            "pass inputs as [array_a, array_b, ...], one buffer per input, even for one input",
        )
    try:
        return list(inputs)
    except TypeError:
        raise ValidationError(
            f"inputs must be a list or tuple of buffers (got {type(inputs).__name__})",
            "pass inputs as [array_a, array_b, ...]",
        ) from None


def as_output_list(outputs):
    if isinstance(outputs, list):
        return outputs
    if _is_buffer(outputs) or outputs is None or isinstance(outputs, (str, dict)):
        raise ValidationError(
            f"outputs must be a list or tuple of arrays (got {type(outputs).__name__})",
            "pass outputs as [out_array, ...], one writable array per output",
        )
    try:
        return list(outputs)
    except TypeError:
        raise ValidationError(
            f"outputs must be a list or tuple of arrays (got {type(outputs).__name__})",
            "pass outputs as [out_array, ...]",
        ) from None


def check_outputs(plan, outs, device=0, stream=None):
    """Refuse caller outputs of the wrong count, dtype, size, contiguity or writability before
    anything runs (device arrays on ``device`` too). Returns per output the checked device view
    (None for a host output), so the dispatch does not export it again."""
    specs = plan.output_specs
    if len(outs) != len(specs):
        raise ValidationError(
            f"dispatch_into got {len(outs)} output buffer(s); the program returns {len(specs)}",
            f"pass exactly {len(specs)} output arrays, in declaration order",
        )
    views: list[DevView | None] = [None] * len(outs)
    for k, (out, (want, _), slot, (_, need)) in enumerate(zip(outs, specs, plan.bindings.outputs, plan.layout.outputs)):
        name = slot.decl.name
        if not isinstance(out, np.ndarray) and not _is_buffer(out):
            from ._devview import device_output  # noqa: PLC0415 (compiled; device arrays only)

            views[k] = device_output(plan, k, out, device, stream)
            if views[k] is not None:
                continue
        got_dtype = getattr(out, "dtype", None)
        if got_dtype is not None and got_dtype != want:
            raise ValidationError(
                f"output {k} ({name!r}) has dtype {got_dtype} but the buffer is {want}",
                f"pass numpy.empty({need // want.itemsize}, dtype=numpy.{want.name})",
            )
        strides: tuple[int, ...] | None  # (a memoryview's may be None)
        if isinstance(out, np.ndarray):  # (some dtypes, e.g. bfloat16, export no buffer format)
            readonly, contiguous, size, strides = (
                not out.flags.writeable,
                out.flags.c_contiguous,
                out.nbytes,
                out.strides,
            )
        else:
            try:
                view = memoryview(out)
            except TypeError:
                raise ValidationError(
                    f"output {k} ({name!r}) is a {type(out).__name__}, not a buffer",
                    "pass a writable numpy array",
                ) from None
            with view:
                readonly, contiguous, size, strides = view.readonly, view.c_contiguous, view.nbytes, view.strides
        if readonly:
            raise ValidationError(
                f"output {k} ({name!r}) is read-only",
                "pass a writable array (numpy.empty(...), or set arr.flags.writeable = True on an owner)",
            )
        if not contiguous:
            raise ValidationError(
                f"output {k} ({name!r}) is not C-contiguous (strides {strides})",
                "pass a C-contiguous array (numpy.empty(...) or numpy.ascontiguousarray)",
            )
        if size != need:
            raise ValidationError(
                f"output {k} ({name!r}) holds {size} bytes; the dispatch reads back {need}",
                f"pass an output of exactly {need} bytes ({need // want.itemsize} {want.name} elements)",
            )
    return views
