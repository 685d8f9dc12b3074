"""Generated kernels (tests/fuzz_programs.py) compiled as C++ for the CPU and run as one thread.

The CUDA source the GPU fuzzer compiles with NVRTC is compiled here, unchanged, against host
stand-ins of ``vyre_cuda.cuh`` and ``cuda_fp16.h`` (tests/fakecuda/kernel_shim), and called once
per launch with the params block the backend would upload. Comparing the result with the numpy
reference checks, without a GPU, that the kernel text and the model agree: the GPU run then
tests vyre_cuda, not the fuzzer.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess

import fuzz_programs as fp
import numpy as np

SHIM = pathlib.Path(__file__).parent / "fakecuda" / "kernel_shim"


def compiler() -> str | None:
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def host_wrapper(desc: fp.ProgramDesc) -> str:
    casts = [
        f"({'const ' if b.kind in ('read', 'uniform') else ''}{fp.CTYPE[b.dtype]}*)args[{k}]"
        for k, b in enumerate(desc.args)
    ]
    return (
        'extern "C" void vyre_host_run(void** args, const vyre_u32* params) '
        f"{{ vyre_main({', '.join(casts + ['params'])}); }}\n"
    )


def build(desc: fp.ProgramDesc, folder: pathlib.Path):
    """Compile the kernel of ``desc`` for the host; return the loaded library."""
    source = fp.cuda_source(desc) + host_wrapper(desc)
    digest = hashlib.sha256(source.encode() + SHIM.joinpath("vyre_cuda.cuh").read_bytes()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    lib_path = folder / f"kernel-{digest}.so"
    if not lib_path.is_file():
        src = folder / f"kernel-{digest}.cpp"
        src.write_text(source)
        cmd = [
            compiler(),
            "-O1",
            "-std=c++17",
            "-fno-strict-aliasing",
            "-ffp-contract=off",
            "-shared",
            "-fPIC",
            f"-I{SHIM}",
            f"-DVYRE_PHASE_WORD={desc.max_binding + 2}",
            str(src),
            "-o",
            str(lib_path),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"host compile of program seed {desc.seed} failed:\n{proc.stderr[-4000:]}")
    lib = ctypes.CDLL(str(lib_path))
    lib.vyre_host_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    lib.vyre_host_run.restype = None
    return lib


def run(desc: fp.ProgramDesc, lib, inputs: list, runtime: int, config=None, route: str = "cooperative") -> list:
    """Outputs of one dispatch (declaration order, byte ranges applied), launch by launch as the
    backend issues them: one launch per phase when ``route`` is "split"."""
    counts = fp.element_counts(desc, runtime)
    given = dict(zip((b.binding for b in desc.inputs), inputs, strict=True))
    arrays = {}
    for b in desc.args:
        dtype = fp.numpy_dtype(b.dtype)
        arrays[b.binding] = np.array(given[b.binding]).view(dtype) if b.is_input else np.zeros(counts[b.binding], dtype)
    spare = np.zeros(16, np.uint8)  # a valid pointer for empty buffers (never dereferenced)
    argv = (ctypes.c_void_p * len(desc.args))(
        *((arrays[b.binding] if arrays[b.binding].size else spare).ctypes.data for b in desc.args)
    )
    if desc.grid_sync:
        ranges = [(p, p + 1) for p in range(desc.phases)] if route == "split" else [(0, desc.phases)]
    else:
        ranges = [None]
    iterations = (config.fixpoint_iterations or 1) if config is not None else 1
    for _ in range(iterations):
        for r in ranges:
            words = np.array(fp.expected_words(desc, runtime, config, r), dtype=np.uint32)
            lib.vyre_host_run(argv, words.ctypes.data)
    outs = []
    for b in desc.outputs:
        arr = arrays[b.binding]
        if b.byte_range is not None:
            arr = arr[b.byte_range[0] // arr.dtype.itemsize : b.byte_range[1] // arr.dtype.itemsize]
        outs.append(arr.copy())
    return outs
