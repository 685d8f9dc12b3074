"""Build the Cython core. Everything else lives in pyproject.toml.

Environment toggles: VYRE_CUDA_ANNOTATE=1 writes Cython HTML annotations; VYRE_CUDA_LINETRACE=1
enables line tracing (coverage, profilers; slows the hot path); VYRE_CUDA_INCLUDE names the folder
holding cuda.h when neither the nvidia-cuda-runtime wheel nor a CUDA toolkit provides it.
"""

import os
import sys
from pathlib import Path

import numpy
from Cython.Build import cythonize
from Cython.Compiler import Options
from setuptools import Extension, setup


def cuda_include_dirs():
    # cydriver.pxd includes <cuda.h> and <cudaProfiler.h>; cuda.h must be no older than the
    # cuda-bindings we compile against. Prefer one folder holding both (a toolkit, or the
    # nvidia-cuda-runtime + nvidia-cuda-profiler-api wheels), else combine two.
    candidates = []
    if os.environ.get("VYRE_CUDA_INCLUDE"):
        candidates.append(Path(os.environ["VYRE_CUDA_INCLUDE"]))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    for entry in sys.path:
        candidates.append(Path(entry) / "nvidia" / "cu13" / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    with_cuda = [c for c in candidates if (c / "cuda.h").is_file()]
    with_profiler = [c for c in candidates if (c / "cudaProfiler.h").is_file()]
    for folder in with_cuda:
        if folder in with_profiler:
            return [str(folder)]
    if with_cuda and with_profiler:
        return [str(with_cuda[0]), str(with_profiler[0])]
    sys.exit(
        "vyre_cuda: cuda.h and cudaProfiler.h not found. Fix: pip install 'nvidia-cuda-runtime==13.*' "
        "'nvidia-cuda-profiler-api==13.*' (they ship the headers), or set VYRE_CUDA_INCLUDE to a "
        "CUDA toolkit's include folder."
    )


linetrace = os.environ.get("VYRE_CUDA_LINETRACE") == "1"
include_dirs = cuda_include_dirs() + [numpy.get_include()]
macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
if linetrace:
    macros.append(("CYTHON_TRACE_NOGIL", "1"))


def ext(name):
    source = Path("vyre_cuda", *name.split(".")).with_suffix(".pyx")
    return Extension(
        f"vyre_cuda.{name}",
        [str(source)],
        include_dirs=[str(source.parent)] + include_dirs,  # headers beside the .pyx
        define_macros=macros,
        language="c++",  # cydriver.pxd pulls in <type_traits>
        extra_compile_args=["-O3", "-std=c++17", "-pthread"],
        extra_link_args=["-pthread"],
    )


MODULES = ["_accounting", "_driver", "_pools", "_dispatch"]
if Path("vyre_cuda/profile/_floor.pyx").is_file():
    MODULES += ["profile._hostcopy", "profile._floor"]

setup(
    ext_modules=cythonize(
        [ext(m) for m in MODULES],
        build_dir="build/cython",
        annotate=os.environ.get("VYRE_CUDA_ANNOTATE") == "1",
        compiler_directives={
            "language_level": 3,
            "embedsignature": True,
            "linetrace": linetrace,
            # Cython's own defaults (boundscheck, wraparound) stay on: the hot loops are cdef
            # code over C vectors, where those checks do not apply.
        },
    ),
)
