"""A fake CUDA driver for CPU tests: build it, run a child interpreter on it, control it.

``fake_libcuda.c`` is a small libcuda.so.1 whose device memory is host memory and whose stream
operations run synchronously, or, in lazy mode (:func:`set_lazy`), as late as CUDA allows. A
child interpreter started by :func:`run_python` loads it in place of the real driver
(``LD_LIBRARY_PATH``), so the real :class:`vyre_cuda.CudaBackend`, its real
pools and its real enqueue path run with no GPU: pool, stream and event counters move, copies
are bounds-checked against live allocations, and a launch calls a Python emulation of the kernel
when one is registered. Inside the child, :class:`FakeDriver` reads the fake's counters and
injects driver errors.

It never runs in the test process itself: that process may have the real driver loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import numpy as np

SOURCE = pathlib.Path(__file__).with_name("fake_libcuda.c")
FREE_CHECK = pathlib.Path(__file__).with_name("free_check.c")
TESTS_DIR = pathlib.Path(__file__).resolve().parents[1]

# fake_cuda_stats() slots, in the C enum's order
STATS = (
    "device_allocs",
    "device_bytes",
    "host_allocs",
    "host_bytes",
    "streams",
    "events",
    "modules",
    "launches",
    "cooperative_launches",
    "htod_copies",
    "dtoh_copies",
    "memsets",
    "context_refs",
    "violations",
    "device_alloc_calls",
    "host_alloc_calls",
    "stream_creates",
    "event_creates",
    "syncs",
    "no_context",
    "registered",
    "mempools",
    "dtod_copies",
    "graphs",  # live captured graphs
    "graph_execs",  # live instantiated execs
    "graph_launches",
    "captured_nodes",
    "exec_updates",
    "stream_waits",  # successful cuStreamWaitEvent calls
    "registered_bytes",  # bytes in live cuMemHostRegister ranges
    "htod_registered",  # async H2D copies whose source lies in a registered range
    "dtoh_registered",  # async D2H copies whose destination lies in a registered range
    "event_records",  # successful cuEventRecord calls
    "bad_handles",  # calls given a handle that is not live (a use after destroy)
    "unsafe_syncs",  # cuCtxSynchronize calls while a capture in thread-local or relaxed mode was open
)
STATUS = {
    "CUDA_ERROR_INVALID_VALUE": 1,
    "CUDA_ERROR_OUT_OF_MEMORY": 2,
    "CUDA_ERROR_INVALID_CONTEXT": 201,
    "CUDA_ERROR_INVALID_HANDLE": 400,
    "CUDA_ERROR_NOT_READY": 600,
    "CUDA_ERROR_ILLEGAL_ADDRESS": 700,
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": 701,
    "CUDA_ERROR_LAUNCH_FAILED": 719,
    "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED": 712,
    "CUDA_ERROR_NOT_SUPPORTED": 801,
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": 900,
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": 901,
    "CUDA_ERROR_UNKNOWN": 999,
}


def compiler() -> str | None:
    for name in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _compile_once(folder: pathlib.Path, tag: str, sources: list, name: str, flags: tuple, what: str) -> pathlib.Path:
    """Compile ``sources[0]`` into ``folder/<tag><hash of sources>/<name>`` once (the other
    sources are headers it includes: they count in the hash); return that folder. Raises
    RuntimeError with the compiler's output when there is no compiler or it fails."""
    digest = hashlib.sha256(b"".join(pathlib.Path(p).read_bytes() for p in sources)).hexdigest()[:16]
    out_dir = pathlib.Path(folder) / f"{tag}{digest}"
    target = out_dir / name
    if target.is_file():
        return out_dir
    cc = compiler()
    if cc is None:
        raise RuntimeError(f"no C compiler (cc, gcc or clang) on PATH to build {what}")
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"{name}.{os.getpid()}"  # renamed into place: parallel sessions never see half a file
    cmd = [cc, "-O1", "-Wall", "-Werror", "-shared", "-fPIC", *flags[0], "-o", str(tmp), str(sources[0]), *flags[1]]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building {what} failed: {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")
    os.replace(tmp, target)
    return out_dir


def build(folder: pathlib.Path) -> pathlib.Path:
    """Compile the fake into ``folder/<source hash>/libcuda.so.1`` (once); return that folder.

    Raises RuntimeError with the compiler's output when there is no compiler or it fails.
    """
    flags = (["-Wl,-soname,libcuda.so.1"], ["-lpthread"])
    return _compile_once(folder, "", [SOURCE], "libcuda.so.1", flags, "the fake CUDA driver")


def build_free_check(folder: pathlib.Path) -> pathlib.Path:
    """Compile free_check.c once (an LD_PRELOAD beside the fake: host memory given back to the
    allocator while a registration still covers a whole page of it is a violation); return the
    library's path."""
    flags: tuple[list[str], list[str]] = ([], ["-ldl"])
    built = _compile_once(folder, "free-check-", [FREE_CHECK], "libfree_check.so", flags, "the free checker")
    return built / "libfree_check.so"


def build_exchange(folder: pathlib.Path) -> pathlib.Path:
    """Compile the test producer of DLPack's C exchange API (fake_exchange.c, a Python extension
    module) into ``folder/exchange-<source hash>/`` (once); return that folder, to put on ``sys.path``."""
    sources = [SOURCE.parent / "fake_exchange.c", SOURCE.parents[2] / "vyre_cuda" / "_dlpack.h"]
    name = f"fake_exchange{sysconfig.get_config_var('EXT_SUFFIX')}"
    flags: tuple[list[str], list[str]] = ([f"-I{sysconfig.get_paths()['include']}"], [])
    return _compile_once(folder, "exchange-", sources, name, flags, "the fake exchange producer")


def child_env(libdir: pathlib.Path, **extra) -> dict:
    """The environment of a child that loads the fake driver and imports the vyre_cuda under test."""
    import vyre_cuda

    root = pathlib.Path(vyre_cuda.__file__).resolve().parents[1]
    # the graph-or-issued trial of one-launch plans would send every other early dispatch through
    # a graph: scenarios that inject failures into cuLaunchKernel turn it off (the graph tests
    # turn it on where they test it)
    env = dict(os.environ, PYTHONUNBUFFERED="1", FAKE_CUDA_DEVICES="1", VYRE_CUDA_GRAPH_TRIAL="0")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libdir), env.get("LD_LIBRARY_PATH")]))
    # the checkout (for benchmarks/harness, not in the wheel) comes after the package under test,
    # so that its unbuilt vyre_cuda/ never shadows an installed one
    path = [str(root), str(TESTS_DIR), str(TESTS_DIR.parent), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, path))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_python(args, libdir: pathlib.Path, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    """Run ``python args...`` on the fake driver, from a folder that cannot shadow the package."""
    import vyre_cuda

    cwd = pathlib.Path(vyre_cuda.__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=child_env(libdir, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# ---------------------------------------------------------------------------- inside the child
_HOOK = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.c_uint,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_int,
)


class Launch:
    """One kernel launch as the emulation sees it: geometry and the argument values."""

    def __init__(self, function, grid, block, shared, params, cooperative):
        self.function = function
        self.grid = grid
        self.block = block
        self.shared = shared
        self._params = params
        self.cooperative = bool(cooperative)

    def arg(self, k: int) -> int:
        """Argument ``k`` (a u64 device pointer: buffers in binding order, then the params block)."""
        return ctypes.c_uint64.from_address(self._params[k]).value

    def words(self, address: int, n: int) -> np.ndarray:
        return array_at(address, np.uint32, n)


def set_lazy(lib, on: bool = True) -> bool:
    """Turn the fake driver's lazy mode on or off; return the previous setting.

    ``lib`` is the loaded fake (``FakeDriver().lib`` or ``ctypes.CDLL("libcuda.so.1")`` in a child
    of :func:`run_python`). In lazy mode every stream operation waits in its stream's queue until
    a synchronize, a query or a wait forces it (``fake_libcuda.c`` lists what does), so work that
    the caller does not order correctly gives wrong data. Launches need the function's argument
    count (:meth:`FakeDriver.emulate` sets it). Turning it off runs every queued op first."""
    lib.fake_cuda_set_lazy.restype = ctypes.c_int
    lib.fake_cuda_set_lazy.argtypes = [ctypes.c_int]
    return bool(lib.fake_cuda_set_lazy(int(bool(on))))


def lazy_pending(lib) -> int:
    """How many stream operations wait in the lazy queues of the fake ``lib`` now."""
    lib.fake_cuda_lazy_pending.restype = ctypes.c_longlong
    return int(lib.fake_cuda_lazy_pending())


def array_at(address: int, dtype, count: int) -> np.ndarray:
    """A writable numpy view of ``count`` elements of fake device memory at ``address``."""
    dtype = np.dtype(dtype)
    if count == 0:
        return np.empty(0, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(address)
    return np.frombuffer(raw, dtype=dtype)


class FakeDriver:
    """Control of the fake driver loaded in this process (a child started by run_python)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        if not hasattr(self.lib, "fake_cuda_stats"):
            raise RuntimeError("the libcuda.so.1 loaded in this process is not the fake driver")
        self.lib.fake_cuda_last_violation.restype = ctypes.c_char_p
        self.emulators = {}  # CUfunction handle -> callable(Launch)
        self.hook_errors = []
        self._hook = _HOOK(self._on_launch)
        self.lib.fake_cuda_set_launch_hook(self._hook)

    def stats(self) -> dict:
        values = (ctypes.c_longlong * len(STATS))()
        self.lib.fake_cuda_stats(values, len(STATS))
        return dict(zip(STATS, values, strict=True))

    def last_violation(self) -> str:
        return self.lib.fake_cuda_last_violation().decode()

    def reset_counters(self) -> None:
        self.lib.fake_cuda_reset_counters()

    def fail(self, call: str, status: str = "CUDA_ERROR_LAUNCH_FAILED", countdown: int = 1, sticky: bool = False):
        """Make the ``countdown``-th next call of ``call`` return ``status`` (every later one too if sticky)."""
        if self.lib.fake_cuda_fail(call.encode(), countdown, STATUS[status], int(sticky)) != 0:
            raise RuntimeError("the fake driver holds at most 8 pending failures")

    def clear_failures(self) -> None:
        self.lib.fake_cuda_clear_failures()

    def set_lazy(self, on: bool = True) -> bool:
        """Lazy mode on or off (:func:`set_lazy`); returns the previous setting."""
        return set_lazy(self.lib, on)

    def lazy_pending(self) -> int:
        """Stream operations queued in lazy mode and not run yet."""
        return lazy_pending(self.lib)

    def set_occupancy(self, blocks_per_sm: int) -> None:
        """Answer every occupancy query with ``blocks_per_sm`` (-1: compute it)."""
        self.lib.fake_cuda_set_occupancy(blocks_per_sm)

    def set_launch_delays(self, launch_us: int = 0, graph_launch_us: int = 0):
        """Make every cuLaunchKernel / cuGraphLaunch take this much longer (host time)."""
        self.lib.fake_cuda_set_launch_delays(int(launch_us), int(graph_launch_us))

    def set_kernel_max_threads(self, n: int) -> None:
        """What cuFuncGetAttribute(MAX_THREADS_PER_BLOCK) answers for every kernel."""
        self.lib.fake_cuda_set_kernel_max_threads(n)

    def set_block_time(self, block: int, ms: float) -> None:
        """Make the timed interval around a launch of ``block`` threads (x) read ``ms``."""
        if self.lib.fake_cuda_set_block_time(block, ctypes.c_float(ms)) != 0:
            raise RuntimeError("the fake driver holds at most 16 block times")

    def emulate(self, backend, program, inputs, fn, config=None) -> None:
        """Run ``fn(Launch)`` for every launch of ``program``'s kernel on ``backend``."""
        info = backend.plan_info(program, inputs, config)
        self.emulators[info.function] = fn
        # stream capture copies the kernel's arguments by value; the fake learns their count here
        self.lib.fake_cuda_set_arg_count(ctypes.c_void_p(info.function), info.arg_count)

    def _on_launch(self, function, gx, gy, gz, bx, by, bz, shared, params, cooperative):
        fn = self.emulators.get(function)
        if fn is None:
            return 0
        try:
            fn(Launch(function, (gx, gy, gz), (bx, by, bz), shared, params, cooperative))
        except BaseException as exc:  # noqa: BLE001 (a ctypes callback must not raise)
            self.hook_errors.append(f"{type(exc).__name__}: {exc}")
            return STATUS["CUDA_ERROR_LAUNCH_FAILED"]
        return 0


def vecadd_emulation(dtype):
    """The built-in vecadd kernel (``out[i] = a[i] + b[i]`` for i < word 0) as an emulation."""

    def run(launch: Launch):
        n = int(launch.words(launch.arg(3), 1)[0])
        a, b, out = (array_at(launch.arg(k), dtype, n) for k in range(3))
        out[:] = a + b

    return run
