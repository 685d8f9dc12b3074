"""A fake backend that computes with numpy: DeviceGroup and vyre_cuda.dask without a GPU.

It implements the backend contract the group and the Dask plugin use (dispatch, dispatch_into,
telemetry, lost, close) for the programs below, keyed by program name. Special first elements
of the first input trigger failures, so a test decides which ITEM fails, whatever device runs it:
BAD raises ValidationError, FAULT raises DeviceLost (and the backend stays lost), DIE ends the
process once (a Dask worker dying mid-task), STALL raises the timeout DispatchFailed whose
``.pending`` cannot be pickled (as the real PendingDispatch).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from helpers.contracts import GroupBackend

from vyre_cuda import BufferDecl, Kernel, Program
from vyre_cuda.errors import DeviceLost, DispatchFailed, ValidationError

BAD = -1111.0
FAULT = -2222.0
DIE = -3333.0
STALL = -4444.0


class FakePending:
    """Stands in for a PendingDispatch: owns something that cannot leave the process."""

    def __init__(self):
        self.lock = threading.Lock()


_SRC = '#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const float* x, float* out, const vyre_u32* p) {}\n'


def scale_program() -> Program:
    """out = 2 * x (f32, runtime-sized)."""
    return Program(
        Kernel.cuda(_SRC), [BufferDecl.read("x", 0, "f32"), BufferDecl.output("out", 1, "f32")], name="scale2"
    )


def axpb_program() -> Program:
    """out = coef[0] * x + y with a static 1-element coef (broadcast to every chunk)."""
    return Program(
        Kernel.cuda(_SRC + "// axpb\n"),
        [
            BufferDecl.read("x", 0, "f32"),
            BufferDecl.read("y", 1, "f32"),
            BufferDecl.read("coef", 2, "f32", 1),
            BufferDecl.output("out", 3, "f32"),
        ],
        name="axpb",
    )


def twice_and_sum_program() -> Program:
    """Two outputs: ``twice`` = 2 * x (runtime-sized) and ``total`` = sum(x) (static: one f64)."""
    return Program(
        Kernel.cuda(_SRC + "// twice_and_sum\n"),
        [BufferDecl.read("x", 0, "f32"), BufferDecl.output("twice", 1, "f32"), BufferDecl.output("total", 2, "f64", 1)],
        name="twice_and_sum",
    )


def inplace_program() -> Program:
    """x += 1 in place (a read-write input, read back)."""
    return Program(Kernel.cuda(_SRC + "// inplace\n"), [BufferDecl.read_write("x", 0, "f32")], name="inplace")


def built_anew(value):
    """An object equal to ``value`` (a Program, BufferDecl, Kernel or DispatchConfig) that is not ``value``: its
    constructor run on its fields past the interning of equal builds, as a build with non-plain
    arguments (numpy integers, say) or past the interning limit gives one."""
    if isinstance(value, Kernel):
        return type.__call__(Kernel, value.kind, value.source, value.entry, value.options)
    return type.__call__(type(value), *(getattr(value, f.name) for f in dataclasses.fields(value)))


def launch_elems_program(launch="x", **kw) -> Program:
    """n[0] = the element count the launch covers: two u8 inputs of any lengths, ``launch`` (a
    binding name or a callable) says which one sizes the launch. Programs differing only in
    ``launch`` answer differently for inputs of different lengths."""
    return Program(
        Kernel.cuda(_SRC + "// launch_elems\n"),
        [BufferDecl.read("x", 0, "u8"), BufferDecl.read("y", 1, "u8"), BufferDecl.output("n", 2, "u32", 1)],
        name="launch_elems",
        launch=launch,
        **kw,
    )


def launch_by_y(sizes) -> int:
    """A module-level launch callable (it pickles by reference)."""
    return sizes["y"]


def _launch_elems(program, x, y) -> list:
    launch = program.launch
    sizes = {"x": x.size, "y": y.size}
    n = launch(sizes) if callable(launch) else sizes[launch or "x"]  # (None: equal lengths)
    return [np.array([n], np.uint32)]


def field_variants() -> list:
    """``(field, a, b)``: for every Program field, two valid programs that differ only in it."""
    base = launch_elems_program()
    cooperative = dataclasses.replace(base, grid_sync=True)
    other = dataclasses.replace
    return [
        ("kernel", base, other(base, kernel=Kernel.cuda(_SRC + "// launch_elems, another\n"))),
        ("kernel", base, other(base, kernel=Kernel.cuda(_SRC + "// launch_elems\n", options=("-DX=1",)))),
        ("buffers", base, other(base, buffers=(*base.buffers[:2], BufferDecl.output("n", 2, "u32", 2)))),
        ("buffers", base, other(base, buffers=(*base.buffers[:2], BufferDecl.output("n", 2, "u64", 1)))),
        ("workgroup_size", base, other(base, workgroup_size=128)),
        ("grid_sync", base, cooperative),
        ("phases", cooperative, other(cooperative, phases=2)),
        ("requires", base, other(base, requires=("f16",))),
        ("name", base, other(base, name="launch_elems_2")),
        ("launch", base, other(base, launch="y")),
        ("launch", base, other(base, launch=None)),
        ("launch", base, other(base, launch=launch_by_y)),
        ("launch", other(base, launch=lambda s: s["x"]), other(base, launch=lambda s: s["y"])),
        ("elementwise", scale_program(), other(scale_program(), elementwise=True)),
        ("elementwise", other(scale_program(), elementwise=True), other(scale_program(), elementwise=["x"])),
        ("align", other(scale_program(), elementwise=True), other(scale_program(), elementwise=True, align=4)),
    ]


PROGRAM_IMPLS = {"launch_elems": _launch_elems}  # the ones that read the program (its launch)

IMPLS: dict[str, Callable[..., list]] = {
    "scale2": lambda x: [x * np.float32(2)],
    "axpb": lambda x, y, coef: [coef[0] * x + y],
    "twice_and_sum": lambda x: [x * np.float32(2), np.array([x.astype(np.float64).sum()])],
    "inplace": lambda x: [x + np.float32(1)],
    "vecadd_f32": lambda a, b: [a + b],
    "bench_compute": lambda x: [x + np.float32(1)],  # benchmarks/bench_multi_gpu.py, smoke run
    "bench_scale": lambda x: [x * np.float32(2)],
}


class _Telemetry:
    def __init__(self, backend):
        self._b = backend

    def snapshot(self) -> dict:
        b = self._b
        return {
            "dispatches": b.dispatches,
            "h2d_bytes": b.h2d_bytes,
            "d2h_bytes": b.d2h_bytes,
            "prepared_plans": len(b.programs_seen),
        }

    def reset(self) -> None:
        self._b.dispatches = self._b.h2d_bytes = self._b.d2h_bytes = 0


class FakeBackend(GroupBackend):
    """Computes each program with numpy; ``delay`` seconds per dispatch (GIL released)."""

    def __init__(self, device: int, delay: float = 0.0, log_dir=None):
        self.device = device
        self.delay = delay
        self.log_dir = pathlib.Path(log_dir) if log_dir else None
        self.dispatches = self.h2d_bytes = self.d2h_bytes = 0
        self.programs_seen: dict = {}  # program -> itself: one plan per distinct (equal) program, as the core
        self.threads: set = set()
        self._lost: str | None = None
        self.closed = False
        self.telemetry = _Telemetry(self)
        self._lock = threading.Lock()
        self._log("open")

    def _log(self, what: str) -> None:
        if self.log_dir is not None:
            (self.log_dir / f"{what}-{os.getpid()}-{self.device}").write_text(str(time.time()))

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def _compute(self, program, inputs, config=None) -> list:
        if self.closed:
            raise ValidationError("this CudaBackend is closed", "create a new backend")
        if self._lost is not None:
            raise DeviceLost(
                "the backend's CUDA context was lost earlier (fake)",
                "restart",
                status="CUDA_ERROR_ILLEGAL_ADDRESS",
                call="fake",
            )
        decls = program.inputs
        if len(inputs) != len(decls):
            raise ValidationError(
                f"program takes {len(decls)} input(s) but {len(inputs)} were passed",
                f"pass exactly {len(decls)} buffer(s)",
            )
        arrays = [np.frombuffer(memoryview(x).cast("B"), d.dtype.numpy) for d, x in zip(decls, inputs)]
        for d, a in zip(decls, arrays):
            if d.count and a.size != d.count:
                raise ValidationError(
                    f"input {d.name!r} holds {a.size} elements, declared {d.count}", f"pass exactly {d.count} elements"
                )
        with self._lock:
            self.programs_seen.setdefault(program, program)
            self.threads.add(threading.get_ident())
        first = float(arrays[0][0]) if arrays and arrays[0].size else 0.0
        if first == BAD:
            raise ValidationError("input 0 holds the BAD marker (fake)", "do not pass BAD")
        if first == FAULT:
            self._lost = "fault"
            raise DeviceLost(
                "CUDA_ERROR_ILLEGAL_ADDRESS: a kernel accessed memory outside any "
                "allocation; the context is lost (fake)",
                "restart the process",
                status="CUDA_ERROR_ILLEGAL_ADDRESS",
                call="cuStreamSynchronize",
            )
        if first == STALL:
            err = DispatchFailed(
                "the dispatch did not complete within its timeout of 0.5 s (fake)",
                "raise DispatchConfig(timeout=...), or wait on the PendingDispatch in .pending",
                status="timeout",
                call="wait",
            )
            err.pending = FakePending()
            raise err
        if first == DIE and self.log_dir is not None:
            marker = self.log_dir / "died"
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os._exit(17)
        if self.delay:
            time.sleep(self.delay)
        impl = PROGRAM_IMPLS.get(program.name)
        outs = impl(program, *arrays) if impl is not None else IMPLS[program.name](*arrays)
        with self._lock:
            self.dispatches += 1
            self.h2d_bytes += sum(a.nbytes for a in arrays)
            self.d2h_bytes += sum(o.nbytes for o in outs)
        if self.log_dir is not None and arrays and arrays[0].size and float(arrays[0][0]) == DIE:
            (self.log_dir / f"ran-die-{os.getpid()}").write_text("1")
        return outs

    def dispatch(self, program, inputs, config=None) -> list:
        return [np.ascontiguousarray(o) for o in self._compute(program, inputs, config)]

    def dispatch_into(self, program, inputs, outputs, config=None) -> list:
        outs = self._compute(program, inputs, config)
        if len(outputs) != len(outs):
            raise ValidationError(f"{len(outputs)} outputs passed, program has {len(outs)}", "pass all")
        for dst, src in zip(outputs, outs):
            dst = np.asarray(dst)
            if dst.size != src.size or dst.dtype != src.dtype:
                raise ValidationError(
                    f"output of {dst.size} {dst.dtype}, needs {src.size} {src.dtype}", "pass the right size"
                )
            dst[...] = src.reshape(dst.shape)
        return list(outputs)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._log("close")


class FakeFactory:
    """``FakeFactory(...)(ordinal)`` -> FakeBackend; per-device delays as ``{ordinal: seconds}``."""

    def __init__(self, delay=0.0, log_dir=None, fail_devices=()):
        self.delay = delay
        self.log_dir = str(log_dir) if log_dir else None
        self.fail_devices = tuple(fail_devices)
        self.made: list = []

    def __getstate__(self):
        return {**self.__dict__, "made": []}  # backends stay in their process

    def __call__(self, ordinal: int) -> FakeBackend:
        if ordinal in self.fail_devices:
            raise DeviceLost(
                f"cannot create a context on device {ordinal} (fake)",
                "use another device",
                status="CUDA_ERROR_INVALID_DEVICE",
                call="cuDevicePrimaryCtxRetain",
            )
        delay = self.delay.get(ordinal, 0.0) if isinstance(self.delay, dict) else self.delay
        backend = FakeBackend(ordinal, delay, self.log_dir)
        self.made.append(backend)
        return backend


if TYPE_CHECKING:  # mypy (scripts/lint): the fake implements every member of its contract
    _implements: type[GroupBackend] = FakeBackend
