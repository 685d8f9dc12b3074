"""Bad input without a GPU: every refusal is typed, says what was wrong and ends with a Fix line.

Two tables of cases, each case data rather than code:

* ``STATIC_CASES``: constructors (Program, BufferDecl, Kernel, DispatchConfig), the planning
  functions on a hand-built :class:`DeviceCaps`, checked byte arithmetic and NVRTC compilation.
* ``DISPATCH_CASES``: calls through the public :class:`CudaBackend` API. Here they run in a child
  interpreter on a real backend over the fake CUDA driver (tests/fakecuda): its pools, streams and
  events are real and have been used before the cases run, so a refusal that allocated, created
  or copied anything would move the backend's counters or the fake driver's. The test checks that
  none moved, that the caller's buffers are not left exported, and that the next dispatch is
  correct and does move the counters. tests/gpu/test_bad_input_gpu.py runs the same table on a
  real device.

A case with ``bug`` set documents a known defect: it is ``xfail(strict=True)`` here and asserts
the correct behaviour on the GPU.
"""

from __future__ import annotations

import base64
import json
import math
import os
import pathlib
import pickle
from collections.abc import Callable
from dataclasses import dataclass, replace

import fakecuda
import numpy as np
import pytest
from planning_fakes import stub_backend

import vyre_cuda as vc
from vyre_cuda import BufferAccess, BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp
from vyre_cuda._accounting import align_up, bucket_size, checked_add, checked_mul
from vyre_cuda.compile import compile_kernel
from vyre_cuda.config import as_config
from vyre_cuda.errors import (
    BackendError,
    CooperativeResidencyExceeded,
    DeviceOutOfMemory,
    InvalidProgram,
    KernelCompileFailed,
    UnsupportedFeature,
    ValidationError,
)
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.caps import DeviceCaps, check_capabilities
from vyre_cuda.planning.launch import plan_launch, route_grid_sync
from vyre_cuda.planning.layout import plan_layout

N = 1000  # elements of the standard f32 inputs `a` and `b` every dispatch case receives

# An H200 as the driver reports it (total memory from cuDeviceTotalMem).
CAPS = DeviceCaps(
    ordinal=0,
    name="hand-built H200",
    cc=(9, 0),
    sm_count=132,
    max_shared_per_block=48 * 1024,
    max_shared_per_block_optin=232_448,
    total_memory=150_754_820_096,
    driver_version=13000,
)

# Pool, stream and event counters that a refused call must leave exactly as they were.
POOL_KEYS = (
    "device_pool_live_bytes",
    "pinned_pool_live_bytes",
    "streams_live",
    "events_live",
    "streams_created",
    "events_created",
    "device_pool_allocated_bytes",
    "device_pool_misses",
    "pinned_pool_misses",
    "leaked_allocations",
)


# ------------------------------------------------------------------------------ the case model
@dataclass(frozen=True)
class Case:
    """One bad call and the refusal it must get.

    ``call`` takes no argument (static cases) or ``(backend, a, b)`` (dispatch cases, with ``a``
    and ``b`` the standard f32 inputs). ``names`` are values the message must mention (the
    message is the contract: it states the numbers involved). ``check`` is an extra assertion
    on the error. ``offline=False`` marks a refusal that needs a device (GPU table only).
    """

    id: str
    call: Callable
    exc: type
    names: tuple = ()
    check: Callable | None = None
    bug: str = ""
    offline: bool = True


def raised(fn, *args):
    """Call ``fn(*args)``; return the exception it raised (None if it returned).

    The tracebacks (also of chained exceptions) are dropped: their frames hold the arguments,
    and the tests compare the inputs' reference counts after the call.
    """
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 (the caller asserts the type)
        seen = exc
        while seen is not None:
            seen.__traceback__ = None
            seen = seen.__cause__ or seen.__context__
        return exc
    return None


def assert_refusal(err, case: Case) -> None:
    """The error is ``case.exc``, its message names the values, and it ends with a Fix line."""
    assert err is not None, f"{case.id}: no error was raised"
    assert isinstance(err, case.exc), f"{case.id}: expected {case.exc.__name__}, got {type(err).__name__}: {err}"
    assert isinstance(err, BackendError)
    lines = str(err).splitlines()
    assert len(lines) >= 2 and lines[0].strip(), f"{case.id}: message is empty: {err}"
    assert lines[-1].startswith("Fix: ") and len(lines[-1][5:].strip()) > 8, f"{case.id}: no Fix line: {err}"
    for name in case.names:
        assert name in err.message, f"{case.id}: message does not mention {name!r}: {err.message}"
    if case.check is not None:
        case.check(err)


def params(cases, *, offline_only: bool):
    """pytest params of a case table: known bugs xfail(strict), device-only cases left out."""
    out = []
    for case in cases:
        if offline_only and not case.offline:
            continue
        marks = [pytest.mark.xfail(strict=True, reason=f"BUG: {case.bug}")] if case.bug else []
        out.append(pytest.param(case, id=case.id, marks=marks))
    return out


# ------------------------------------------------------------------------------ programs
VECADD = bp.vecadd_f32()
VECADD_F64 = bp.vecadd("f64")
VECADD_I64 = bp.vecadd("i64")
BLOCK_SUM = bp.block_sum_u32(2, workgroup=32)  # x: 64 u32 (static), sums: 2 u32, scratch: 32 u32

_GOOD_SRC = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(float* o, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) o[i] = 1.0f;
}
"""
_BROKEN_SRC = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(float* o, const vyre_u32* p) {
  o[0] = undeclared_thing;
}
"""
_MANGLED_SRC = r"""
__global__ void vyre_main(float* o, const unsigned int* p) { o[0] = 1.0f; }
"""
_MISSING_HEADER_SRC = '#include "no_such_header.cuh"\n' + _GOOD_SRC
_PTX_OTHER_ENTRY = """
.version 8.0
.target sm_90
.address_size 64
.visible .entry other(.param .u64 p0)
{
  ret;
}
"""
_PTX_GARBAGE = """
this is not PTX at all
.visible .entry main(.param .u64 p0)
{
  frobnicate the registers;
}
"""
# eight static u64 outputs of 2**32 - 1 elements: 8 x 34.4 GB, more than any device holds,
# with every count inside the u32 params words
_BUDGET_SRC = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(vyre_u64* o0, vyre_u64* o1, vyre_u64* o2, vyre_u64* o3, vyre_u64* o4,
                      vyre_u64* o5, vyre_u64* o6, vyre_u64* o7, const vyre_u32* p) {}
"""
_U32_MAX = 2**32 - 1


def _vecadd_with(out: BufferDecl, **kw) -> Program:
    """vecadd's kernel with inputs a, b (f32, runtime-sized) and the given output."""
    return Program(VECADD.kernel, [BufferDecl.read("a", 0, "f32"), BufferDecl.read("b", 1, "f32"), out], **kw)


def _good_program(kernel: Kernel) -> Program:
    return Program(kernel, [BufferDecl.output("o", 0, "f32", 4)], workgroup_size=(32, 1, 1))


BUDGET = Program(
    Kernel.cuda(_BUDGET_SRC),
    [BufferDecl.output(f"o{k}", k, "u64", _U32_MAX) for k in range(8)],
)
BIG_SCRATCH = bp.block_sum_u32(2, workgroup=32, scratch_elems=60_000)  # 240,000 B of shared memory
TWO_SCRATCH = Program(
    BLOCK_SUM.kernel,
    [
        BufferDecl.read("x", 0, "u32", 64),
        BufferDecl.output("sums", 1, "u32", 2),
        BufferDecl.workgroup("scratch", 2, "u32", 30_000),
        BufferDecl.workgroup("extra", 3, "u32", 30_000),
    ],
    workgroup_size=(32, 1, 1),
)
HUGE_SCRATCH = Program(
    BLOCK_SUM.kernel,
    [
        BufferDecl.read("x", 0, "u32", 64),
        BufferDecl.output("sums", 1, "u32", 2),
        BufferDecl.workgroup("scratch", 2, "f64", 2**62),
    ],
    workgroup_size=(32, 1, 1),
)
PERSISTENT = _vecadd_with(BufferDecl("out", 2, BufferAccess.READ_WRITE, "f32", persistent=True))
COLLECTIVES = Program(VECADD.kernel, VECADD.buffers, requires=("collectives",))
INDIRECT = Program(VECADD.kernel, VECADD.buffers, requires=("indirect_dispatch",))


# ------------------------------------------------------------------------------ inputs
def _strided(x):
    """Same values as ``x``, as a view with a stride of two elements (not C-contiguous)."""
    return np.repeat(x, 2)[::2]


def _read_only(x):
    y = x.copy()
    y.flags.writeable = False
    return y


def _released(x):
    view = memoryview(x)
    view.release()
    return view


def _datetimes(n):
    return np.arange(n).astype("datetime64[s]")


def _log_has(*words):
    def check(err):
        assert err.log, "the error carries no compiler log"
        for w in words:
            assert w in err.log, f"{w!r} not in the log: {err.log}"

    return check


# ------------------------------------------------------------------------------ dispatch cases
_f32 = np.float32
D = Case  # short alias for the table
DISPATCH_CASES = [
    # input count
    D("inputs_too_few", lambda be, a, b: be.dispatch(VECADD, [a]), ValidationError, ("2", "1")),
    D("inputs_too_many", lambda be, a, b: be.dispatch(VECADD, [a, b, a]), ValidationError, ("2", "3")),
    D("inputs_empty_list", lambda be, a, b: be.dispatch(VECADD, []), ValidationError),
    D("inputs_none", lambda be, a, b: be.dispatch(VECADD, None), ValidationError),
    D("inputs_an_int", lambda be, a, b: be.dispatch(VECADD, 7), ValidationError),
    D("inputs_a_bare_array", lambda be, a, b: be.dispatch(VECADD, a), ValidationError, (str(N),)),
    # lengths
    D(
        "input_bytes_not_whole_f32",
        lambda be, a, b: be.dispatch(VECADD, [a, b.tobytes()[:10]]),
        ValidationError,
        ("10",),
    ),
    D(
        "input_u8_not_whole_f32",
        lambda be, a, b: be.dispatch(VECADD, [a, b.view(np.uint8)[:3999]]),
        ValidationError,
        ("3999",),
    ),
    D(
        "static_input_short",
        lambda be, a, b: be.dispatch(BLOCK_SUM, [np.ones(63, np.uint32)]),
        ValidationError,
        ("63", "64"),
    ),
    D(
        "static_input_long",
        lambda be, a, b: be.dispatch(BLOCK_SUM, [np.ones(65, np.uint32)]),
        ValidationError,
        ("65", "64"),
    ),
    D("inputs_zero_length", lambda be, a, b: be.dispatch(VECADD, [a[:0], b[:0]]), ValidationError, ("0",)),
    # layout and dtype of inputs
    D("input_strided_view", lambda be, a, b: be.dispatch(VECADD, [a, _strided(b)]), ValidationError),
    D(
        "input_fortran_order",
        lambda be, a, b: be.dispatch(VECADD, [np.asfortranarray(a.reshape(10, 100)), b]),
        ValidationError,
    ),
    D(
        "input_float64_for_f32",
        lambda be, a, b: be.dispatch(VECADD, [a[: N // 2].astype(np.float64), b]),
        ValidationError,
        ("float64", "f32"),
    ),
    D(
        "input_int32_for_f32",
        lambda be, a, b: be.dispatch(VECADD, [a, b.view(np.int32)]),
        ValidationError,
        ("int32", "f32"),
    ),
    D(
        "input_complex64_for_f64",
        lambda be, a, b: be.dispatch(VECADD_F64, [a.astype(np.complex64), b.astype(np.float64)]),
        ValidationError,
        ("complex64",),
    ),
    D(
        "static_input_f32_for_u32",
        lambda be, a, b: be.dispatch(BLOCK_SUM, [np.ones(64, _f32)]),
        ValidationError,
        ("float32", "u32"),
    ),
    D(
        "input_big_endian_f32",
        lambda be, a, b: be.dispatch(VECADD, [a.astype(">f4"), b]),
        ValidationError,
        ("big-endian",),
    ),
    D(
        "input_datetime64",
        lambda be, a, b: be.dispatch(VECADD_I64, [_datetimes(N), np.arange(N, dtype=np.int64)]),
        ValidationError,
    ),
    D(
        "input_released_memoryview",
        lambda be, a, b: be.dispatch(VECADD, [a, _released(b)]),
        ValidationError,
    ),
    # objects that are not buffers
    D("input_list_of_floats", lambda be, a, b: be.dispatch(VECADD, [a, b.tolist()]), ValidationError, ("list",)),
    D("input_none", lambda be, a, b: be.dispatch(VECADD, [a, None]), ValidationError, ("NoneType",)),
    D("input_str", lambda be, a, b: be.dispatch(VECADD, [a, "1.0 2.0"]), ValidationError, ("str",)),
    D("input_int", lambda be, a, b: be.dispatch(VECADD, [a, 3]), ValidationError, ("int",)),
    D("input_object", lambda be, a, b: be.dispatch(VECADD, [object(), b]), ValidationError, ("object",)),
    # the program argument
    D("program_a_str", lambda be, a, b: be.dispatch("vecadd", [a, b]), ValidationError, ("str",)),
    D("program_none", lambda be, a, b: be.dispatch(None, [a, b]), ValidationError, ("NoneType",)),
    D("program_a_kernel", lambda be, a, b: be.dispatch(VECADD.kernel, [a, b]), ValidationError, ("Kernel",)),
    D(
        "program_a_dict",
        lambda be, a, b: be.dispatch({"kernel": VECADD.kernel}, [a, b]),
        ValidationError,
    ),
    D(
        "program_a_list",
        lambda be, a, b: be.dispatch([VECADD], [a, b]),
        ValidationError,
    ),
    # the config argument
    D("config_an_int", lambda be, a, b: be.dispatch(VECADD, [a, b], 42), ValidationError, ("int",)),
    D("config_a_str", lambda be, a, b: be.dispatch(VECADD, [a, b], "fast"), ValidationError, ("str",)),
    D("config_a_list", lambda be, a, b: be.dispatch(VECADD, [a, b], [("timeout", 1.0)]), ValidationError, ("list",)),
    D(
        "config_unknown_key",
        lambda be, a, b: be.dispatch(VECADD, [a, b], {"workgroup": 64}),
        ValidationError,
        ("workgroup",),
    ),
    D(
        "config_bad_value",
        lambda be, a, b: be.dispatch(VECADD, [a, b], {"workgroup_override": (0, 1, 1)}),
        ValidationError,
    ),
    D(
        "config_unhashable_label",
        lambda be, a, b: be.dispatch(VECADD, [a, b], DispatchConfig(label=["run", 1])),
        ValidationError,
    ),
    # launch geometry
    D(
        "workgroup_2048",
        lambda be, a, b: be.dispatch(VECADD, [a, b], DispatchConfig(workgroup_override=(2048, 1, 1))),
        ValidationError,
        ("2048", "1024"),
    ),
    D(
        "workgroup_2048_threads",
        lambda be, a, b: be.dispatch(
            VECADD, [a, b], DispatchConfig(workgroup_override=(32, 32, 2), grid_override=(1, 1, 1))
        ),
        ValidationError,
        ("2048",),
    ),
    D(
        "workgroup_z_65",
        lambda be, a, b: be.dispatch(
            VECADD, [a, b], DispatchConfig(workgroup_override=(1, 1, 65), grid_override=(1, 1, 1))
        ),
        ValidationError,
        ("65", "64"),
    ),
    D(
        "workgroup_2d_without_grid",
        lambda be, a, b: be.dispatch(VECADD, [a, b], DispatchConfig(workgroup_override=(16, 16, 1))),
        ValidationError,
    ),
    D(
        "grid_y_over_limit",
        lambda be, a, b: be.dispatch(VECADD, [a, b], DispatchConfig(grid_override=(1, 65536, 1))),
        ValidationError,
        ("65536", "65535"),
    ),
    D(
        "grid_x_over_limit",
        lambda be, a, b: be.dispatch(
            VECADD, [a, b], DispatchConfig(workgroup_override=(1, 1, 1), grid_override=(2**31, 1, 1))
        ),
        ValidationError,
        (str(2**31),),
    ),
    D(
        "grid_over_u32_elements",
        lambda be, a, b: be.dispatch(VECADD, [a, b], DispatchConfig(grid_override=(2**24 + 1, 1, 1))),
        InvalidProgram,
    ),
    D(
        "cooperative_over_residency",
        lambda be, a, b: be.dispatch(VECADD, [a, b], DispatchConfig(cooperative=True, grid_override=(100_000, 1, 1))),
        CooperativeResidencyExceeded,
        ("100000",),
    ),
    # workgroup (shared) memory
    D(
        "shared_over_optin",
        lambda be, a, b: be.dispatch(BIG_SCRATCH, [np.ones(64, np.uint32)]),
        ValidationError,
        ("240000",),
    ),
    D(
        "shared_two_buffers_over_optin",
        lambda be, a, b: be.dispatch(TWO_SCRATCH, [np.ones(64, np.uint32)]),
        ValidationError,
        ("scratch=120000", "extra=120000"),
    ),
    D(
        "shared_bytes_overflow_u64",
        lambda be, a, b: be.dispatch(HUGE_SCRATCH, [np.ones(64, np.uint32)]),
        InvalidProgram,
        ("overflows",),
    ),
    # features the backend refuses
    D("persistent_buffer", lambda be, a, b: be.dispatch(PERSISTENT, [a, b]), UnsupportedFeature, ("out",)),
    D("requires_collectives", lambda be, a, b: be.dispatch(COLLECTIVES, [a, b]), UnsupportedFeature, ("collectives",)),
    D(
        "requires_indirect_dispatch",
        lambda be, a, b: be.dispatch(INDIRECT, [a, b]),
        UnsupportedFeature,
        ("indirect_dispatch",),
    ),
    # counts and ranges overflowing 64-bit byte arithmetic or the u32 params words
    D(
        "static_count_2**62_f64",
        lambda be, a, b: be.dispatch(_vecadd_with(BufferDecl.output("out", 2, "f64", 2**62)), [a, b]),
        InvalidProgram,
        ("overflows", str(2**62)),
    ),
    D(
        "static_count_2**61_f64",
        lambda be, a, b: be.dispatch(_vecadd_with(BufferDecl.output("out", 2, "f64", 2**61)), [a, b]),
        InvalidProgram,
        ("overflows",),
    ),
    D(
        "static_count_over_u32",
        lambda be, a, b: be.dispatch(_vecadd_with(BufferDecl.output("out", 2, "u8", 2**32)), [a, b]),
        InvalidProgram,
        (str(2**32),),
    ),
    # 200 GiB of u8 is refused by the u32 element-count word before the memory budget is asked
    D(
        "static_200gib_u8",
        lambda be, a, b: be.dispatch(_vecadd_with(BufferDecl.output("out", 2, "u8", 200 << 30)), [a, b]),
        InvalidProgram,
        (str(200 << 30),),
    ),
    D(
        "output_byte_range_past_end",
        lambda be, a, b: be.dispatch(
            _vecadd_with(BufferDecl.output("out", 2, "f32", output_byte_range=(0, 4 * N + 4))), [a, b]
        ),
        InvalidProgram,
        (str(4 * N + 4), str(4 * N)),
    ),
    D(
        "output_byte_range_after_end",
        lambda be, a, b: be.dispatch(
            _vecadd_with(BufferDecl.output("out", 2, "f32", output_byte_range=(4 * N + 16, 4 * N + 32))), [a, b]
        ),
        InvalidProgram,
    ),
    D(
        "output_byte_range_2**64",
        lambda be, a, b: be.dispatch(
            _vecadd_with(BufferDecl.output("out", 2, "f32", output_byte_range=(2**64, 2**65))), [a, b]
        ),
        InvalidProgram,
    ),
    # device memory budget: refused at planning, before any allocation
    D("device_memory_budget", lambda be, a, b: be.dispatch(BUDGET, []), DeviceOutOfMemory, ("bytes",)),
    # kernels that do not compile, lack their entry or do not load
    D(
        "cuda_does_not_compile",
        lambda be, a, b: be.dispatch(_good_program(Kernel.cuda(_BROKEN_SRC)), []),
        KernelCompileFailed,
        ("undeclared_thing",),
        _log_has("undeclared_thing", "error"),
    ),
    D(
        "cuda_missing_header",
        lambda be, a, b: be.dispatch(_good_program(Kernel.cuda(_MISSING_HEADER_SRC)), []),
        KernelCompileFailed,
        check=_log_has("no_such_header.cuh"),
    ),
    D(
        "cuda_entry_missing",
        lambda be, a, b: be.dispatch(_good_program(Kernel.cuda(_GOOD_SRC, entry="not_there")), []),
        KernelCompileFailed,
        ("not_there", "vyre_main"),
    ),
    D(
        "cuda_entry_mangled",
        lambda be, a, b: be.dispatch(_good_program(Kernel.cuda(_MANGLED_SRC)), []),
        KernelCompileFailed,
        ("vyre_main",),
    ),
    D(
        "cuda_unknown_option",
        lambda be, a, b: be.dispatch(_good_program(Kernel.cuda(_GOOD_SRC, options=("--no-such-option",))), []),
        KernelCompileFailed,
    ),
    D(
        "ptx_entry_missing",
        lambda be, a, b: be.dispatch(_good_program(Kernel.ptx(_PTX_OTHER_ENTRY)), []),
        KernelCompileFailed,
        ("main", "other"),
    ),
    D(
        "ptx_does_not_load",
        lambda be, a, b: be.dispatch(_good_program(Kernel.ptx(_PTX_GARBAGE)), []),
        KernelCompileFailed,
        ("CUDA_ERROR_",),
        check=lambda err: isinstance(err.log, str),
        offline=False,  # the driver's JIT decides
    ),
    # dispatch_into outputs
    D("into_no_outputs", lambda be, a, b: be.dispatch_into(VECADD, [a, b], []), ValidationError, ("0", "1")),
    D(
        "into_two_outputs",
        lambda be, a, b: be.dispatch_into(VECADD, [a, b], [np.empty(N, _f32), np.empty(N, _f32)]),
        ValidationError,
        ("2", "1"),
    ),
    D(
        "into_float64",
        lambda be, a, b: be.dispatch_into(VECADD, [a, b], [np.empty(N, np.float64)]),
        ValidationError,
        ("float64", "float32"),
    ),
    D(
        "into_int32",
        lambda be, a, b: be.dispatch_into(VECADD, [a, b], [np.empty(N, np.int32)]),
        ValidationError,
        ("int32", "float32"),
    ),
    D(
        "into_too_small",
        lambda be, a, b: be.dispatch_into(VECADD, [a, b], [np.empty(N - 1, _f32)]),
        ValidationError,
        (str(4 * N - 4), str(4 * N)),
    ),
    D(
        "into_too_large",
        lambda be, a, b: be.dispatch_into(VECADD, [a, b], [np.empty(N + 1, _f32)]),
        ValidationError,
        (str(4 * N + 4), str(4 * N)),
    ),
    D(
        "into_read_only",
        lambda be, a, b: be.dispatch_into(VECADD, [a, b], [_read_only(np.empty(N, _f32))]),
        ValidationError,
        ("read-only",),
    ),
    D("into_bytes", lambda be, a, b: be.dispatch_into(VECADD, [a, b], [bytes(4 * N)]), ValidationError, ("read-only",)),
    D("into_strided", lambda be, a, b: be.dispatch_into(VECADD, [a, b], [np.empty(2 * N, _f32)[::2]]), ValidationError),
    D("into_none", lambda be, a, b: be.dispatch_into(VECADD, [a, b], [None]), ValidationError, ("NoneType",)),
    D(
        "into_list_of_floats",
        lambda be, a, b: be.dispatch_into(VECADD, [a, b], [[0.0] * N]),
        ValidationError,
        ("list",),
    ),
    D(
        "into_bad_input_good_output",
        lambda be, a, b: be.dispatch_into(VECADD, [a, None], [np.empty(N, _f32)]),
        ValidationError,
    ),
    D(
        "into_outputs_none",
        lambda be, a, b: be.dispatch_into(VECADD, [a, b], None),
        ValidationError,
    ),
    # the other entry points
    D("async_inputs_too_few", lambda be, a, b: be.dispatch_async(VECADD, [a]), ValidationError),
    D("async_float64_for_f32", lambda be, a, b: be.dispatch_async(VECADD, [a.astype(np.float64), b]), ValidationError),
    D("async_timed_strided", lambda be, a, b: be.dispatch_async(VECADD, [a, _strided(b)], timed=True), ValidationError),
    D("timed_not_a_buffer", lambda be, a, b: be.dispatch_timed(VECADD, [a, None]), ValidationError),
    D("timed_config_unknown_key", lambda be, a, b: be.dispatch_timed(VECADD, [a, b], {"blocks": 4}), ValidationError),
    D("plan_info_not_a_buffer", lambda be, a, b: be.plan_info(VECADD, [a, None]), ValidationError),
    D("fits_not_a_buffer", lambda be, a, b: be.cooperative_grid_sync_fits(VECADD, [a, None]), ValidationError),
    D("fits_not_a_program", lambda be, a, b: be.cooperative_grid_sync_fits("scan", [a, b]), ValidationError),
    D(
        "plan_info_datetime64",
        lambda be, a, b: be.plan_info(VECADD_I64, [_datetimes(N), np.arange(N, dtype=np.int64)]),
        ValidationError,
    ),
]


# ------------------------------------------------------------------------------ static cases
def _plan(program, lengths, config=None, caps=CAPS, occupancy=8):
    """Everything the backend plans before it allocates, in the backend's order (no compile)."""
    cfg = as_config(config)
    check_capabilities(program, caps)
    bplan = plan_bindings(program, lengths)
    launch = plan_launch(program, bplan, cfg, caps)
    route = route_grid_sync(program, cfg, launch, caps, occupancy)
    if route.kind == "split":
        phases = [(k, k + 1) for k in range(program.phases)]
    else:
        phases = [(0, program.phases)] if program.grid_sync else [None]
    return plan_layout(bplan, launch, phases)


_V = VECADD.buffers
_SCAN = bp.inclusive_scan_u32()
S = Case
STATIC_CASES = [
    # DispatchConfig and as_config
    S("cfg_workgroup_zero", lambda: DispatchConfig(workgroup_override=(0, 1, 1)), ValidationError, ("0",)),
    S("cfg_workgroup_negative", lambda: DispatchConfig(workgroup_override=(-32,)), ValidationError, ("-32",)),
    S("cfg_workgroup_4d", lambda: DispatchConfig(workgroup_override=(1, 1, 1, 1)), ValidationError),
    S("cfg_workgroup_empty", lambda: DispatchConfig(workgroup_override=()), ValidationError),
    S("cfg_workgroup_float", lambda: DispatchConfig(workgroup_override=(64.5, 1, 1)), ValidationError, ("64.5",)),
    S("cfg_workgroup_str", lambda: DispatchConfig(workgroup_override="256"), ValidationError),
    S("cfg_workgroup_bool", lambda: DispatchConfig(workgroup_override=(True, 1, 1)), ValidationError),
    S("cfg_grid_zero", lambda: DispatchConfig(grid_override=(1, 0, 1)), ValidationError),
    S("cfg_iterations_zero", lambda: DispatchConfig(fixpoint_iterations=0), ValidationError, ("0",)),
    S("cfg_iterations_2**31", lambda: DispatchConfig(fixpoint_iterations=2**31), ValidationError, (str(2**31),)),
    S("cfg_iterations_bool", lambda: DispatchConfig(fixpoint_iterations=True), ValidationError),
    S("cfg_iterations_float", lambda: DispatchConfig(fixpoint_iterations=2.0), ValidationError),
    S("cfg_timeout_zero", lambda: DispatchConfig(timeout=0), ValidationError),
    S("cfg_timeout_negative", lambda: DispatchConfig(timeout=-1.5), ValidationError, ("-1.5",)),
    S("cfg_timeout_nan", lambda: DispatchConfig(timeout=math.nan), ValidationError),
    S("cfg_timeout_str", lambda: DispatchConfig(timeout="1s"), ValidationError),
    S("as_config_unknown_key", lambda: as_config({"grid": (1,)}), ValidationError, ("grid",)),
    S("as_config_a_list", lambda: as_config([]), ValidationError),
    S("as_config_bad_value", lambda: as_config({"grid_override": (0,)}), ValidationError),
    # Program, BufferDecl, Kernel
    S(
        "program_duplicate_binding",
        lambda: Program(VECADD.kernel, [_V[0], BufferDecl.read("c", 0, "f32"), _V[2]]),
        InvalidProgram,
        ("'a'", "'c'", "0"),
    ),
    S(
        "program_duplicate_name",
        lambda: Program(VECADD.kernel, [_V[0], BufferDecl.read("a", 1, "f32"), _V[2]]),
        InvalidProgram,
        ("'a'",),
    ),
    S(
        "program_workgroup_binding_clash",
        lambda: Program(VECADD.kernel, [*_V, BufferDecl.workgroup("s", 2, "f32", 8)]),
        InvalidProgram,
    ),
    S("program_no_buffers", lambda: Program(VECADD.kernel, []), InvalidProgram),
    S("program_kernel_a_str", lambda: Program("vyre_main", list(_V)), InvalidProgram, ("str",)),
    S("program_buffer_a_tuple", lambda: Program(VECADD.kernel, [("a", 0, "f32")]), InvalidProgram, ("tuple",)),
    S("program_workgroup_zero", lambda: Program(VECADD.kernel, list(_V), workgroup_size=(0, 1, 1)), InvalidProgram),
    S("program_phases_without_grid_sync", lambda: Program(VECADD.kernel, list(_V), phases=2), InvalidProgram, ("2",)),
    S("program_phases_zero", lambda: Program(VECADD.kernel, list(_V), grid_sync=True, phases=0), InvalidProgram),
    S(
        "program_unknown_requirement",
        lambda: Program(VECADD.kernel, list(_V), requires=("tensor_cores",)),
        InvalidProgram,
        ("tensor_cores",),
    ),
    S(
        "program_binding_over_65535",
        lambda: Program(VECADD.kernel, [BufferDecl.read("a", 70_000, "f32")]),
        InvalidProgram,
        ("70000",),
    ),
    S("decl_negative_count", lambda: BufferDecl.read("a", 0, "f32", -1), InvalidProgram, ("-1",)),
    S("decl_bool_binding", lambda: BufferDecl.read("a", True, "f32"), InvalidProgram),
    S("decl_str_binding", lambda: BufferDecl.read("a", "0", "f32"), InvalidProgram),
    S("decl_alignment_3", lambda: BufferDecl.read("a", 0, "f32", alignment=3), InvalidProgram, ("3",)),
    S("decl_alignment_8192", lambda: BufferDecl.read("a", 0, "f32", alignment=8192), InvalidProgram, ("8192",)),
    S(
        "decl_byte_range_reversed",
        lambda: BufferDecl.output("o", 0, "f32", 8, output_byte_range=(8, 4)),
        InvalidProgram,
    ),
    S(
        "decl_byte_range_negative",
        lambda: BufferDecl.output("o", 0, "f32", 8, output_byte_range=(-4, 4)),
        InvalidProgram,
    ),
    S("decl_byte_range_one_value", lambda: BufferDecl.output("o", 0, "f32", 8, output_byte_range=(4,)), InvalidProgram),
    S("decl_unknown_dtype", lambda: BufferDecl.read("a", 0, "f128"), InvalidProgram, ("f128",)),
    S("decl_complex_dtype", lambda: BufferDecl.read("a", 0, np.complex64), InvalidProgram),
    S("decl_unknown_access", lambda: BufferDecl("a", 0, "readonly", "f32"), InvalidProgram, ("readonly",)),
    S("decl_workgroup_count_zero", lambda: BufferDecl.workgroup("s", 0, "f32", 0), InvalidProgram),
    S("decl_empty_name", lambda: BufferDecl.read("", 0, "f32"), InvalidProgram),
    S("kernel_empty_source", lambda: Kernel.cuda("   "), InvalidProgram),
    S("kernel_entry_not_identifier", lambda: Kernel.cuda(_GOOD_SRC, entry="vyre main"), InvalidProgram),
    S("kernel_ptx_not_text", lambda: Kernel.ptx(None), InvalidProgram),
    S("kernel_unknown_kind", lambda: Kernel("sass", _GOOD_SRC, "vyre_main"), InvalidProgram, ("sass",)),
    # planning on a hand-built device
    S("plan_inputs_too_few", lambda: _plan(VECADD, (4 * N,)), ValidationError),
    S("plan_length_not_whole", lambda: _plan(VECADD, (4 * N, 4 * N + 2)), ValidationError, (str(4 * N + 2),)),
    S("plan_static_length", lambda: _plan(BLOCK_SUM, (252,)), ValidationError, ("63", "64")),
    S("plan_zero_elements", lambda: _plan(VECADD, (0, 0)), ValidationError),
    S(
        "plan_runtime_output_without_runtime_input",
        lambda: _plan(
            Program(VECADD.kernel, [BufferDecl.read("a", 0, "f32", 4), BufferDecl.output("out", 1, "f32")]), (16,)
        ),
        InvalidProgram,
        ("out",),
    ),
    S("plan_persistent", lambda: _plan(PERSISTENT, (4 * N, 4 * N)), UnsupportedFeature),
    S(
        "plan_block_2048",
        lambda: _plan(VECADD, (4 * N, 4 * N), DispatchConfig(workgroup_override=2048)),
        ValidationError,
        ("2048",),
    ),
    S(
        "plan_grid_y_65536",
        lambda: _plan(VECADD, (4 * N, 4 * N), DispatchConfig(grid_override=(1, 65536))),
        ValidationError,
        ("65536",),
    ),
    S("plan_runtime_count_over_u32", lambda: _plan(VECADD, (2**34, 2**34)), InvalidProgram, (str(2**32),)),
    S(
        "plan_params_word_over_u32",
        lambda: _plan(
            _vecadd_with(BufferDecl.output("out", 2, "u8", 2**33)), (4 * N, 4 * N), DispatchConfig(grid_override=1)
        ),
        InvalidProgram,
        (str(2**33),),
    ),
    S("plan_input_bytes_overflow_u64", lambda: _plan(VECADD, (2**64, 2**64)), InvalidProgram, ("overflows",)),
    S(
        "plan_slab_offset_overflows_u64",
        lambda: _plan(VECADD, (2**64 - 8, 2**64 - 8), DispatchConfig(grid_override=1)),
        InvalidProgram,
        ("overflows",),
    ),
    S("plan_shared_over_optin", lambda: _plan(BIG_SCRATCH, (256,)), ValidationError, ("240000", "232448")),
    S("plan_shared_overflow_u64", lambda: _plan(HUGE_SCRATCH, (256,)), InvalidProgram, ("overflows",)),
    S(
        "plan_byte_range_past_end",
        lambda: _plan(
            _vecadd_with(BufferDecl.output("out", 2, "f32", output_byte_range=(0, 4 * N + 4))), (4 * N, 4 * N)
        ),
        InvalidProgram,
    ),
    S(
        "plan_bf16_on_cc75",
        lambda: _plan(
            Program(
                VECADD.kernel,
                [BufferDecl.read("a", 0, "bf16"), BufferDecl.read("b", 1, "bf16"), BufferDecl.output("out", 2, "bf16")],
            ),
            (8, 8),
            caps=replace(CAPS, cc=(7, 5)),
        ),
        UnsupportedFeature,
        ("bf16", "7.5"),
    ),
    S(
        "plan_f16_on_cc50",
        lambda: _plan(bp.vecadd("f16"), (8, 8), caps=replace(CAPS, cc=(5, 0))),
        UnsupportedFeature,
        ("f16", "5.0"),
    ),
    S(
        "plan_grid_sync_without_cooperative",
        lambda: _plan(_SCAN, (4 * N,), caps=replace(CAPS, cooperative_launch=False)),
        UnsupportedFeature,
        ("cooperative",),
    ),
    S(
        "plan_cooperative_config_without_cooperative",
        lambda: _plan(VECADD, (4 * N, 4 * N), DispatchConfig(cooperative=True), caps=replace(CAPS, cc=(5, 2))),
        UnsupportedFeature,
    ),
    S("plan_collectives", lambda: _plan(COLLECTIVES, (4 * N, 4 * N)), UnsupportedFeature, ("collectives",)),
    S(
        "plan_cooperative_over_residency",
        lambda: _plan(VECADD, (4 * N, 4 * N), DispatchConfig(cooperative=True, grid_override=5000)),
        CooperativeResidencyExceeded,
        ("5000", "1056"),
    ),
    # checked byte arithmetic
    S("checked_add_overflow", lambda: checked_add(2**64 - 1, 1), InvalidProgram, (str(2**64 - 1),)),
    S("checked_mul_overflow", lambda: checked_mul(2**32, 2**32), InvalidProgram, (str(2**32),)),
    S("checked_mul_operand_over_u64", lambda: checked_mul(2**64, 1), InvalidProgram, (str(2**64),)),
    S("checked_add_negative", lambda: checked_add(-1, 0), InvalidProgram, ("-1",)),
    S("align_up_overflow", lambda: align_up(2**64 - 1, 16), InvalidProgram),
    S("align_up_not_power_of_two", lambda: align_up(5, 3), InvalidProgram, ("3",)),
    S("bucket_size_overflow", lambda: bucket_size(2**63 + 1), InvalidProgram),
    # NVRTC compilation (needs no device)
    S(
        "compile_syntax_error",
        lambda: compile_kernel(Kernel.cuda(_BROKEN_SRC), arch=(9, 0)),
        KernelCompileFailed,
        ("undeclared_thing",),
        _log_has("undeclared_thing", "error"),
    ),
    S(
        "compile_missing_header",
        lambda: compile_kernel(Kernel.cuda(_MISSING_HEADER_SRC), arch=(9, 0)),
        KernelCompileFailed,
        check=_log_has("no_such_header.cuh"),
    ),
    S(
        "compile_missing_entry",
        lambda: compile_kernel(Kernel.cuda(_GOOD_SRC, entry="not_there"), arch=(9, 0)),
        KernelCompileFailed,
        ("not_there", "vyre_main"),
    ),
    S(
        "compile_mangled_entry",
        lambda: compile_kernel(Kernel.cuda(_MANGLED_SRC), arch=(9, 0)),
        KernelCompileFailed,
        ("vyre_main",),
    ),
    S(
        "compile_unknown_option",
        lambda: compile_kernel(Kernel.cuda(_GOOD_SRC, options=("--no-such-option",)), arch=(9, 0)),
        KernelCompileFailed,
    ),
    S(
        "compile_ptx_missing_entry",
        lambda: compile_kernel(Kernel.ptx(_PTX_OTHER_ENTRY)),
        KernelCompileFailed,
        ("main", "other"),
    ),
    S("compile_arch_garbage", lambda: compile_kernel(Kernel.cuda(_GOOD_SRC), arch=("nine", "zero")), ValidationError),
    S(
        "compile_arch_too_old",
        lambda: compile_kernel(Kernel.cuda(_GOOD_SRC), arch=(3, 0)),
        KernelCompileFailed,
        ("3.0",),
    ),
    S(
        "compile_bad_define",
        lambda: compile_kernel(Kernel.cuda(_GOOD_SRC), arch=(9, 0), defines={"1BAD": "x"}),
        ValidationError,
        ("1BAD",),
    ),
    # backend arguments checked before the driver is touched
    S("backend_device_a_str", lambda: vc.CudaBackend("0"), ValidationError, ("'0'",)),
    S("backend_device_a_bool", lambda: vc.CudaBackend(True), ValidationError),
    S("backend_device_a_float", lambda: vc.CudaBackend(1.0), ValidationError),
]


# ------------------------------------------------------------------------------ the offline backend
@pytest.fixture
def offline_backend(monkeypatch):
    """A CudaBackend whose driver entry points are fakes: planning and validation are real, and
    anything that would reach a device (pool allocation, launch) is not expected to happen."""
    backend = stub_backend(monkeypatch, CAPS)
    yield backend
    backend.close()


def pool_counts(backend) -> dict:
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in POOL_KEYS}


def standard_inputs(rng):
    return rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)


# ------------------------------------------------------------------------------ tests
def test_case_tables_are_large_and_unique():
    ids = [c.id for c in STATIC_CASES + DISPATCH_CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 40


@pytest.mark.parametrize("case", params(STATIC_CASES, offline_only=True))
def test_static_refusal(case):
    assert_refusal(raised(case.call), case)


@pytest.fixture(scope="session")
def fake_refusals(fake_libcuda, tmp_path_factory):
    """Every dispatch case run once in a child on the fake driver (tests/fakecuda/bad_input_child.py)."""
    seed = int.from_bytes(os.urandom(4), "little")
    child = pathlib.Path(fakecuda.__file__).with_name("bad_input_child.py")
    proc = fakecuda.run_python(
        [str(child), str(seed)],
        fake_libcuda,
        timeout=600,
        VYRE_CUDA_CACHE_DIR=tmp_path_factory.getbasetemp() / "kernel-cache",
    )
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    records = json.loads(proc.stdout.strip().splitlines()[-1])
    records["_seed"] = seed
    return records


def _error(record):
    if record["error"] is None:
        return None
    blob = record["error"]["pickle"]
    if blob is None:  # not picklable: certainly not a BackendError
        return RuntimeError(f"{record['error']['type']}: {record['error']['text']}")
    return pickle.loads(base64.b64decode(blob))


def test_fake_backend_counters_can_move_and_close_frees_everything(fake_refusals):
    warm = fake_refusals["_warm"]
    assert warm["ok"], "vecadd on the fake driver gave a wrong result"
    pool, fake = warm["pool"], warm["fake"]
    # the warm-up dispatches allocated, created and copied: the counters the cases compare can move
    assert pool["device_pool_allocated_bytes"] > 0 and pool["streams_created"] > 0, pool
    assert pool["device_pool_misses"] > 0 and pool["pinned_pool_misses"] > 0, pool
    assert fake["device_allocs"] > 0 and fake["host_allocs"] > 0 and fake["streams"] > 0, fake
    assert fake["launches"] >= 2 and fake["htod_copies"] >= 2 and fake["violations"] == 0, fake
    assert fake_refusals["_hook_errors"] == []
    closed = fake_refusals["_closed"]
    for key in (
        "device_allocs",
        "host_allocs",
        "streams",
        "events",
        "modules",
        "context_refs",
        "violations",
        "no_context",
    ):
        assert closed[key] == 0, (key, closed)


@pytest.mark.parametrize("case", params(DISPATCH_CASES, offline_only=False))
def test_dispatch_refusal(fake_refusals, case):
    record = fake_refusals[case.id]
    seed = fake_refusals["_seed"]
    assert_refusal(_error(record), case)
    # nothing was allocated, created, copied or launched for the refused call
    assert record["pool_after"] == record["pool_before"], (seed, record)
    assert record["fake_after"] == record["fake_before"], (seed, record["violation"], record)
    # every buffer acquired for the call was released (a leaked export pins the array)
    assert record["refs"][0] == record["refs"][1], (seed, record["refs"])
    assert not record["lost"]
    # the backend is whole: the next dispatch is correct, and it did move the counters
    assert record["next_ok"], (seed, record)
    assert record["next_dispatches"] == 1 and record["next_pool_hits"] >= 1, (seed, record)


def test_refusals_do_not_poison_the_plan_cache(offline_backend, rng):
    # the same bad call twice gives the same refusal: nothing half-planned is cached
    a, b = standard_inputs(rng)
    for _ in range(2):
        with pytest.raises(ValidationError):
            offline_backend.dispatch(VECADD, [a, b.astype(np.float64)])
        with pytest.raises(InvalidProgram):
            offline_backend.dispatch(
                _vecadd_with(BufferDecl.output("out", 2, "f32", output_byte_range=(0, 4 * N + 4))), [a, b]
            )
    assert offline_backend.telemetry.snapshot()["dispatches"] == 0


ENTRY_POINTS = {
    "dispatch": lambda be, a, b: be.dispatch(VECADD, [a, b]),
    "dispatch_async": lambda be, a, b: be.dispatch_async(VECADD, [a, b]),
    "dispatch_into": lambda be, a, b: be.dispatch_into(VECADD, [a, b], [np.empty(N, np.float32)]),
    "dispatch_timed": lambda be, a, b: be.dispatch_timed(VECADD, [a, b]),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_use_after_close(offline_backend, rng, entry):
    a, b = standard_inputs(rng)
    offline_backend.close()
    offline_backend.close()  # idempotent
    err = raised(ENTRY_POINTS[entry], offline_backend, a, b)
    assert_refusal(err, Case("use_after_close", None, ValidationError, ("closed",)))


@pytest.mark.parametrize("entry", ["plan_info", "cooperative_grid_sync_fits"])
def test_planning_after_close(offline_backend, rng, entry):
    a, b = standard_inputs(rng)
    offline_backend.close()
    err = raised(getattr(offline_backend, entry), VECADD, [a, b])
    assert_refusal(err, Case("planning_after_close", None, ValidationError, ("closed",)))


@pytest.mark.parametrize("kw", [{"device_pool_bytes": -1}, {"pinned_pool_bytes": "big"}], ids=["negative", "a_str"])
def test_backend_pool_sizes(offline_backend, kw):
    err = raised(lambda: vc.CudaBackend(0, **kw))
    assert_refusal(err, Case("backend_pool_size", None, ValidationError))
