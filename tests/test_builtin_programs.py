"""The built-in programs: every dtype compiles, bad dtypes are typed errors, and every kernel
bound-checks each buffer it touches with that buffer's own count (no launch reads past one)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from vyre_cuda import builtin_programs as bp
from vyre_cuda.compile import compile_kernel, cuda_include_dirs
from vyre_cuda.config import DispatchConfig
from vyre_cuda.errors import InvalidProgram
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.caps import DeviceCaps
from vyre_cuda.planning.launch import plan_launch
from vyre_cuda.program import DTYPES


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        ("f32", "f32"),
        ("float32", "f32"),
        ("float", "f32"),
        (np.float32, "f32"),
        (np.dtype("int64"), "i64"),
        ("half", "f16"),
        ("bfloat16", "bf16"),
        ("bf16", "bf16"),
        ("uint8", "u8"),
        ("double", "f64"),
    ],
)
def test_vecadd_accepts_names_aliases_and_numpy_dtypes(dtype, name):
    # vecadd("bf16") and vecadd("float32") used to raise KeyError
    prog = bp.vecadd(dtype)
    assert prog.name == f"vecadd_{name}" and all(d.dtype is DTYPES[name] for d in prog.buffers)


@pytest.mark.parametrize("dtype", ["f128", "", "complex64", None, 3, np.complex64, "F32"])
def test_vecadd_refuses_other_dtypes_with_the_valid_names(dtype):
    with pytest.raises(InvalidProgram) as info:
        bp.vecadd(dtype)
    err = info.value
    assert repr(dtype) in err.message
    assert str(err).splitlines()[-1].startswith("Fix: ")
    assert all(name in err.fix for name in DTYPES) and "float32" in err.fix


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_vecadd_compiles_for_every_dtype(dtype):
    if dtype in ("f16", "bf16") and not cuda_include_dirs():
        pytest.skip("no CUDA runtime headers installed (nvidia-cuda-runtime)")
    compiled = compile_kernel(bp.vecadd(dtype).kernel, arch=(9, 0), defines={"VYRE_PHASE_WORD": "4"})
    assert compiled.kind == "cubin"


# The bindings each built-in kernel reads or writes (params_echo never touches `a`).
TOUCHED = {
    "vecadd_f32": (bp.vecadd_f32(), {0, 1, 2}),
    "block_sum_u32": (bp.block_sum_u32(4), {0, 1}),
    "inclusive_scan_u32": (bp.inclusive_scan_u32(), {0, 1, 2}),
    "params_echo": (bp.params_echo(), {5}),
}


@pytest.mark.parametrize("name", sorted(TOUCHED))
def test_every_builtin_checks_each_buffer_with_its_own_count(name):
    # vecadd used to check only the launch count, so a shorter b was read past its end
    prog, touched = TOUCHED[name]
    src = prog.kernel.source
    checked = {int(b) for b in re.findall(r"vyre_(?:in_bounds|binding_count)\(params, (\d+)", src)}
    # words 1-3 of vyre_params_head's uint4 (.y .z .w) are the counts of bindings 0-2
    for head in re.findall(r"uint4 (\w+) = vyre_params_head\(params\)", src):
        checked |= {"yzw".index(c) for c in re.findall(rf"\b{head}\.([yzw])\b", src)}
    assert touched <= checked, f"{name} does not bound-check bindings {sorted(touched - checked)}"


def test_builtin_launch_rules():
    caps = DeviceCaps()
    # params_echo and block_sum name what sizes their launch: no warning, documented word 0
    for prog, lengths, count in (
        (bp.params_echo(words=7), (4 * 123,), 7),
        (bp.block_sum_u32(8, workgroup=128), (4 * 1024,), 1024),
    ):
        bplan = plan_bindings(prog, lengths)
        assert plan_launch(prog, bplan, DispatchConfig(), caps).element_count == count
