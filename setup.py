"""Build the Cython core. Everything else lives in pyproject.toml.

Every ``vyre_cuda/**/*.pyx`` becomes one C++ extension; ``build_ext`` compiles them in parallel
(one job per core unless ``-j N`` says otherwise).

Environment toggles: VYRE_CUDA_ANNOTATE=1 writes Cython HTML annotations; VYRE_CUDA_LINETRACE=1
enables line tracing (coverage, profilers; slows the hot path); VYRE_CUDA_INCLUDE names the one
folder holding cuda.h and cudaProfiler.h (otherwise: the nvidia-cuda-runtime and
nvidia-cuda-profiler-api wheels, conda, CUDA_HOME/CUDA_PATH, /usr/local/cuda).
NVTX (ranges of traced dispatches) is compiled in when <nvtx3/nvToolsExt.h> is found there, in
VYRE_CUDA_NVTX_INCLUDE or in /usr/local/cuda/include; VYRE_CUDA_NVTX=0 leaves it out. Without it
the build still works and traced dispatches only count their ranges.
"""

import contextlib
import hashlib
import os
import re
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError

LINETRACE = os.environ.get("VYRE_CUDA_LINETRACE") == "1"


def fail(message, fix):
    sys.exit(f"vyre_cuda build: {message}\nFix: {fix}")


def header_version(folder):
    """CUDA_VERSION from folder/cuda.h, e.g. 13030 for CUDA 13.3 (0 when unreadable)."""
    match = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", (folder / "cuda.h").read_text(errors="replace"))
    return int(match.group(1)) if match else 0


def header_candidates():
    """Folders that may hold cuda.h / cudaProfiler.h, most specific first."""
    if os.environ.get("VYRE_CUDA_INCLUDE"):  # an explicit choice is the only candidate
        return [Path(os.environ["VYRE_CUDA_INCLUDE"]).resolve()]
    found = []
    try:  # cuda.pathfinder (a cuda-bindings dependency) knows the wheel, conda and toolkit layouts
        from cuda.pathfinder import locate_nvidia_header_directory
    except ImportError:
        locate_nvidia_header_directory = None
    for lib in ("cudart", "profiler") if locate_nvidia_header_directory else ():
        # AttributeError: not found (None); RuntimeError: a release that does not know this name
        with contextlib.suppress(AttributeError, RuntimeError):
            found.append(locate_nvidia_header_directory(lib).abs_path)
    # the same places by hand, for a cuda-pathfinder that is too old or missing
    found += [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    found += [os.path.join(entry, "nvidia", "cu13", "include") for entry in sys.path if entry]
    found.append("/usr/local/cuda/include")
    return list(dict.fromkeys(Path(f).resolve() for f in found))


def cuda_include_dirs():
    # cydriver.pxd includes <cuda.h> and <cudaProfiler.h>, and names every type of the
    # cuda-bindings release: a cuda.h older than that release fails deep inside g++
    # ("CUDA_FABRIC_COPY_BATCH_OP_st does not name a type"), so check the version here.
    try:
        bindings = version("cuda-bindings")
    except PackageNotFoundError:
        fail(
            "cuda-bindings is not installed", "pip install 'cuda-bindings==13.*' (or build with plain `pip install .`)"
        )
    major, minor = (int(x) for x in bindings.split(".")[:2])
    needed = major * 1000 + minor * 10
    candidates = header_candidates()
    with_cuda = [c for c in candidates if (c / "cuda.h").is_file()]
    profiler = [c for c in candidates if (c / "cudaProfiler.h").is_file()]
    if not with_cuda or not profiler:
        missing = " and ".join(h for h, where in (("cuda.h", with_cuda), ("cudaProfiler.h", profiler)) if not where)
        fail(
            f"{missing} not found (looked in: " + ", ".join(map(str, candidates)) + ")",
            f"pip install 'nvidia-cuda-runtime=={major}.{minor}.*' 'nvidia-cuda-profiler-api=={major}.{minor}.*' "
            "(they ship the headers), or set VYRE_CUDA_INCLUDE to a CUDA toolkit's include folder",
        )
    new_enough = [c for c in with_cuda if header_version(c) >= needed]
    if not new_enough:
        # Not always fatal: cuda-bindings 13.3 builds against the CUDA 13.0 headers, 13.5 does not.
        # Say what to do if g++ then fails, and try the newest headers found.
        seen = ", ".join(f"{c} (CUDA_VERSION {header_version(c)})" for c in with_cuda)
        newest = max(header_version(c) for c in with_cuda)
        print(
            f"vyre_cuda build: warning: cuda-bindings {bindings} is newer than every cuda.h found ({seen}); "
            "if g++ then reports a CUDA type that 'does not name a type', "
            f"Fix: pip install 'nvidia-cuda-runtime=={major}.{minor}.*' 'nvidia-cuda-profiler-api=={major}.{minor}.*', "
            f"or point VYRE_CUDA_INCLUDE at a CUDA {major}.{minor}+ toolkit's include folder, or build against "
            "the cuda-bindings of those headers "
            f"(pip install 'cuda-bindings=={newest // 1000}.{newest % 1000 // 10}.*')",
            file=sys.stderr,
        )
        new_enough = sorted(with_cuda, key=header_version, reverse=True)
    cuda = new_enough[0]
    return [str(cuda)] if cuda in profiler else [str(cuda), str(profiler[0])]


def nvtx_include_dir():
    """The folder holding nvtx3/nvToolsExt.h (header-only NVTX 3), or None."""
    if os.environ.get("VYRE_CUDA_NVTX", "1") == "0":
        return None
    found = [os.environ["VYRE_CUDA_NVTX_INCLUDE"]] if os.environ.get("VYRE_CUDA_NVTX_INCLUDE") else []
    found += [str(c) for c in header_candidates()] + ["/usr/local/cuda/include"]
    for folder in found:
        if Path(folder, "nvtx3", "nvToolsExt.h").is_file():
            return str(Path(folder).resolve())
    return None


def extensions():
    # every .pyx is a module: vyre_cuda/profile/_floor.pyx -> vyre_cuda.profile._floor
    return [
        Extension(
            ".".join(pyx.with_suffix("").parts),
            [pyx.as_posix()],
            language="c++",  # cydriver.pxd pulls in <type_traits>
            # each module's own C++ header (_transfer.hpp, ...); the profile's ceilings use the core's copy pool
            include_dirs=[str(pyx.parent)] + (["vyre_cuda"] if pyx.parent.name == "profile" else []),
            extra_compile_args=["-O3", "-std=c++17", "-pthread"],  # the copy threads
            extra_link_args=["-pthread"],
        )
        for pyx in sorted(Path("vyre_cuda").rglob("*.pyx"))
    ]


class BuildExt(build_ext):
    """Check the toolchain and headers, cythonize, then compile the extensions in parallel.

    All of it happens only when extensions are built, so an sdist needs no compiler or headers.
    """

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:  # pip never passes -j; the extensions are independent
            self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        import numpy
        from Cython.Build import cythonize
        from Cython.Compiler import Options

        self.check_cxx17()
        include_dirs = cuda_include_dirs() + [numpy.get_include()]
        macros = [("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")]
        nvtx = nvtx_include_dir()
        if nvtx:
            macros.append(("VYRE_CUDA_NVTX", "1"))
            for ext in self.extensions:
                # searched after every other folder: a toolkit folder found only for nvtx3/ must not
                # shadow the cuda.h chosen above
                ext.extra_compile_args = [*ext.extra_compile_args, "-idirafter", nvtx]
                ext.libraries = [*ext.libraries, "dl"]  # NVTX dlopens the tool (glibc < 2.34: libdl)
        else:
            print(
                "vyre_cuda build: NVTX left out (VYRE_CUDA_NVTX=0, or nvtx3/nvToolsExt.h not found); traced "
                "dispatches count their ranges but emit none (set VYRE_CUDA_NVTX_INCLUDE to a CUDA include folder)",
                file=sys.stderr,
            )
        if LINETRACE:
            macros.append(("CYTHON_TRACE_NOGIL", "1"))
        # pip builds in an isolated environment whose freshly installed .pxd files look newer than
        # any earlier output, so Cython and the compiler would redo everything on every
        # `pip install .`; a key over everything that shapes the modules lets an unchanged rebuild
        # in the same build/ folder reuse them.
        stamp = Path(self.build_temp, "vyre_cuda-build-key")
        key = self.build_key(include_dirs, macros, nvtx)
        outputs = [Path(self.get_ext_fullpath(ext.name)) for ext in self.extensions]
        reusable = not self.force and not self.inplace and all(o.is_file() for o in outputs)
        if reusable and stamp.is_file():
            if stamp.read_text() == key:
                print(f"vyre_cuda build: nothing changed since the build in {self.build_lib}: reusing its modules")
                return
            self.force = True  # a change the file times may not show (a flag, a tool, a header): rebuild all
        stamp.unlink(missing_ok=True)
        Options.warning_errors = True
        # Cython's output depends on the .pxd files of Cython, numpy and cuda-bindings, and Cython
        # judges by file times: after a build against other releases, translate everything again.
        releases = Path("build/cython/releases")
        wanted = repr([f"{n}=={version(n)}" for n in ("Cython", "numpy", "cuda-bindings")])
        stale = not releases.is_file() or releases.read_text() != wanted
        translated = cythonize(
            self.extensions,
            build_dir="build/cython",
            force=stale,
            nthreads=os.cpu_count() or 1,
            annotate=os.environ.get("VYRE_CUDA_ANNOTATE") == "1",
            compiler_directives={
                "language_level": 3,
                "embedsignature": True,
                "linetrace": LINETRACE,
                # Cython's own defaults (boundscheck, wraparound) stay on: the hot loops are cdef
                # code over C vectors, where those checks do not apply.
            },
        )
        releases.parent.mkdir(parents=True, exist_ok=True)
        releases.write_text(wanted)
        cpp_sources = {done.name: done.sources for done in translated}
        for ext in self.extensions:
            ext.sources = cpp_sources[ext.name]
            ext.include_dirs += include_dirs
            ext.define_macros += macros
        super().build_extensions()
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(key)

    def build_key(self, include_dirs, macros, nvtx):
        """A digest of the sources, headers, build tools, flags and compiler the modules come from.

        The header folders enter by their files' contents, not their paths: pip's isolated build
        environment lies in a new temporary folder every time.
        """

        def installed(name):
            try:
                return version(name)
            except PackageNotFoundError:  # no metadata (a source checkout on sys.path): never reused
                return os.urandom(8).hex()

        digest = hashlib.sha256()
        tools = [f"{name}=={installed(name)}" for name in ("Cython", "cuda-bindings", "numpy", "setuptools")]
        flags = [os.environ.get(v, "") for v in ("CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED")]
        compiler = [getattr(self.compiler, a, None) for a in ("compiler_so", "compiler_cxx", "linker_so")]
        exts = [(e.name, e.sources, e.extra_compile_args, e.extra_link_args, e.libraries) for e in self.extensions]
        text = repr((sys.version, tools, flags, compiler, exts, macros, LINETRACE))
        folders = [*include_dirs, *([nvtx] if nvtx else [])]
        for number, folder in enumerate(folders):
            text = text.replace(folder, f"<include {number}>")
        digest.update(text.encode())
        sources = [p for p in sorted(Path("vyre_cuda").rglob("*")) if p.suffix in (".pyx", ".pxd", ".hpp")]
        headers = [Path(d, h) for d in folders for h in ("cuda.h", "cudaProfiler.h", "nvtx3/nvToolsExt.h")]
        for path in [Path("setup.py"), *sources, *(h for h in headers if h.is_file())]:
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        return digest.hexdigest()

    def check_cxx17(self):
        # Without this, a missing or old compiler shows up as "g++: not found" mid-build.
        with tempfile.TemporaryDirectory() as tmp:
            probe = Path(tmp, "probe.cpp")
            probe.write_text("#include <type_traits>\nint main() { if constexpr (true) return 0; }\n")
            try:
                objects = self.compiler.compile([str(probe)], output_dir=tmp, extra_postargs=["-std=c++17"])
                self.compiler.link_shared_object(objects, str(Path(tmp, "probe.so")), target_lang="c++")
            except (CompileError, LinkError) as exc:  # also raised when the executable is missing
                cxx = (getattr(self.compiler, "compiler_cxx", None) or ["(none)"])[0]
                fail(
                    f"no working C++17 compiler (tried {cxx} -std=c++17: {exc})",
                    "install one (Debian/Ubuntu: apt-get install g++; Fedora/RHEL: dnf install gcc-c++; "
                    "conda: conda install gxx), or name it with CXX=... and CC=...",
                )


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
