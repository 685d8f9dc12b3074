"""The cuda.core peer: the floor's vecadd compiled by ``cuda.core.Program`` and started with ``launch``.

It measures the device-resident bar only (the data already on the device): ``launch`` on a
stream then ``stream.sync()`` per iteration (``peer.cuda_core.device``), and the host time of
``launch`` alone, synchronized between batches (``peer.cuda_core.enqueue``). Its device buffers
are its own (``Device.allocate``), filled and read back with cuda.bindings driver copies outside
the timed loops.

Imported only when the peer is measured; it imports cuda.core itself when started (newer
versions export the names from ``cuda.core``, older ones from ``cuda.core.experimental``).
"""

from __future__ import annotations

import importlib
import inspect
import time
from typing import Any

import numpy as np

from vyre_cuda.errors import driver_error
from vyre_cuda.profile.engine import LAUNCH_BATCH

__all__ = ["CudaCorePeer", "import_cuda_core", "start"]


def import_cuda_core():
    """The module that exports ``Device``, ``LaunchConfig``, ``Program``, ``ProgramOptions`` and
    ``launch``: ``cuda.core`` itself, or ``cuda.core.experimental`` in older versions."""
    # import_module reads sys.modules: `import cuda.core as core` would take the `cuda` package's
    # attribute instead, which cuda.core 0.4+ points at its cu12/cu13 build
    core = importlib.import_module("cuda.core")
    if all(hasattr(core, n) for n in ("Device", "LaunchConfig", "Program", "ProgramOptions", "launch")):
        return core
    return importlib.import_module("cuda.core.experimental")


def _stream_first(launch) -> bool:
    """Whether ``launch`` takes ``(stream, config, kernel, *args)`` (cuda.core 0.2 and later)
    rather than ``(kernel, config, *args)`` with the stream in the LaunchConfig."""
    try:
        first = next(iter(inspect.signature(launch).parameters))
    except (TypeError, ValueError, StopIteration):  # a compiled function without a signature
        return True
    return first == "stream"


class CudaCorePeer:
    """cuda.core on the floor's source: ``Program(...).compile("cubin")``, a stream from
    ``Device.create_stream()``, ``launch(stream, LaunchConfig(grid, block), kernel, a, b, out, n)``."""

    name = "cuda_core"

    def __init__(self, device, source, entry, a, b, expected):
        from cuda.bindings import driver as cu

        core = import_cuda_core()
        self.cu = cu
        self.dev = core.Device(device)
        self.dev.set_current()
        self.stream: Any = None
        self.buffers: list = []
        self.n = a.shape[0]
        self.nbytes = a.nbytes
        self.expected = expected
        self.out = None
        grid = (self.n + LAUNCH_BATCH - 1) // LAUNCH_BATCH
        arch = "sm_" + "".join(str(v) for v in self.dev.compute_capability)
        program = core.Program(source, code_type="c++", options=core.ProgramOptions(arch=arch))
        self.kernel = program.compile("cubin").get_kernel(entry)
        self.stream = self.dev.create_stream()
        try:
            for _ in range(3):
                self.buffers.append(self.dev.allocate(self.nbytes, stream=self.stream))
            self.stream.sync()
            self.ptrs = [int(buf.handle) for buf in self.buffers]
            self._copy(cu.cuMemcpyHtoD(self.ptrs[0], a.ctypes.data, self.nbytes), "cuMemcpyHtoD")
            self._copy(cu.cuMemcpyHtoD(self.ptrs[1], b.ctypes.data, self.nbytes), "cuMemcpyHtoD")
        except BaseException:
            self.close()
            raise
        # pointers as ints and the count as a numpy scalar: what cuda.core's examples pass
        self.args = (*self.ptrs, np.uint32(self.n))
        if _stream_first(core.launch):
            config = core.LaunchConfig(grid=grid, block=LAUNCH_BATCH)
            kernel, stream, launch = self.kernel, self.stream, core.launch
            self.enqueue = lambda args: launch(stream, config, kernel, *args)
        else:
            config = core.LaunchConfig(grid=grid, block=LAUNCH_BATCH, stream=self.stream)
            kernel, launch = self.kernel, core.launch
            self.enqueue = lambda args: launch(kernel, config, *args)

    def _copy(self, result, call):
        status = result[0]
        if status != self.cu.CUresult.CUDA_SUCCESS:
            raise driver_error(getattr(status, "name", str(status)), call, int(status), "cuda.core peer")

    def _read_out(self):
        out = np.empty(self.n, np.float32)
        self._copy(self.cu.cuMemcpyDtoH(out.ctypes.data, self.ptrs[2], self.nbytes), "cuMemcpyDtoH")
        return out

    def _clear_out(self):
        self._copy(self.cu.cuMemsetD8(self.ptrs[2], 0, self.nbytes), "cuMemsetD8")  # no stale right answer

    def device_resident(self, count):
        """The launch and ``stream.sync()`` per iteration, no transfers."""
        enqueue, args, sync = self.enqueue, self.args, self.stream.sync
        self.dev.set_current()
        self._clear_out()
        pc = time.perf_counter_ns
        walls = []
        for _ in range(count):
            t0 = pc()
            enqueue(args)
            sync()
            walls.append(pc() - t0)
        self.out = self._read_out()
        return {"peer.cuda_core.device": walls}

    def launch_only(self, batches):
        """Host time per ``launch``: batches of LAUNCH_BATCH, the stream synchronized between
        batches outside the timing."""
        enqueue, args, sync = self.enqueue, self.args, self.stream.sync
        self.dev.set_current()
        self._clear_out()
        pc = time.perf_counter_ns
        per = []
        for _ in range(batches):
            t0 = pc()
            for _ in range(LAUNCH_BATCH):
                enqueue(args)
            t1 = pc()
            sync()
            per.append((t1 - t0) / LAUNCH_BATCH)
        self.out = self._read_out()
        return {"peer.cuda_core.enqueue": per}

    def verify(self):
        return self.out is not None and np.array_equal(self.out, self.expected)

    def close(self):
        if self.stream is None:
            return
        self.dev.set_current()
        self.stream.sync()
        for buf in self.buffers:
            buf.close(self.stream)
        self.stream.sync()
        self.buffers = []
        self.stream.close()
        self.stream = None


def start(backend, image, entry, source, a, b, expected):
    """The peer compiling the floor's ``source`` on ``backend``'s device."""
    return CudaCorePeer(backend.device, source, entry, a, b, expected)
