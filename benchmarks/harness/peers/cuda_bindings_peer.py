"""The cuda.bindings peer: the floor's driver calls issued from Python (``cuda.bindings.driver``).

Imported only when the peer is measured; it imports cuda.bindings itself when started.
"""

from __future__ import annotations

import time

import numpy as np

from vyre_cuda.errors import driver_error
from vyre_cuda.profile.engine import LAUNCH_BATCH

__all__ = ["CudaBindingsPeer", "start"]


class CudaBindingsPeer:
    """The floor's calls from Python through ``cuda.bindings.driver`` (pageable direct, as a
    Python user would write them), on pre-packed kernel arguments."""

    name = "cuda_bindings"

    def __init__(self, context_handle, image, entry, a, b, expected):
        from cuda.bindings import driver as cu

        self.cu = cu
        self.ok = cu.CUresult.CUDA_SUCCESS
        self.ctx = cu.CUcontext(context_handle)
        self.module = self.stream = self.event = None
        self.mem = []
        self.n = a.shape[0]
        self.nbytes = a.nbytes
        self.a, self.b = a, b
        self.out = np.zeros(self.n, np.float32)
        self.expected = expected
        self.grid = (self.n + LAUNCH_BATCH - 1) // LAUNCH_BATCH
        try:
            self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            self.module = self._check(cu.cuModuleLoadData(image), "cuModuleLoadData")
            self.func = self._check(cu.cuModuleGetFunction(self.module, entry.encode()), "cuModuleGetFunction")
            for _ in range(3):
                self.mem.append(self._check(cu.cuMemAlloc(self.nbytes), "cuMemAlloc"))
            self.stream = self._check(
                cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate"
            )
            self.event = self._check(cu.cuEventCreate(int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)), "cuEventCreate")
        except BaseException:
            self.close()
            raise
        self.d_a, self.d_b, self.d_out = self.mem
        # The fast way with cuda.bindings: a void** built once, passed as an int.
        self.argv = [np.array([int(d)], np.uint64) for d in self.mem]
        self.argv.append(np.array([self.n], np.uint32))
        self.params = np.array([x.ctypes.data for x in self.argv], np.uint64)
        self.params_addr = int(self.params.ctypes.data)

    def _check(self, result, call):
        if result[0] != self.ok:
            status = result[0]
            raise driver_error(getattr(status, "name", str(status)), call, int(status), "cuda.bindings peer")
        return result[1] if len(result) > 1 else None

    def full(self, count):
        cu = self.cu
        h2d, memset, launch = cu.cuMemcpyHtoDAsync, cu.cuMemsetD8Async, cu.cuLaunchKernel
        d2h, record, sync = cu.cuMemcpyDtoHAsync, cu.cuEventRecord, cu.cuEventSynchronize
        d_a, d_b, d_out, stream, event = self.d_a, self.d_b, self.d_out, self.stream, self.event
        a_p, b_p, o_p = self.a.ctypes.data, self.b.ctypes.data, self.out.ctypes.data
        nbytes, grid, params, ok, func = (self.nbytes, self.grid, self.params_addr, self.ok, self.func)
        pc = time.perf_counter_ns
        self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        walls = []
        for _ in range(count):
            t0 = pc()
            r = (
                h2d(d_a, a_p, nbytes, stream),
                h2d(d_b, b_p, nbytes, stream),
                memset(d_out, 0, nbytes, stream),
                launch(func, grid, 1, 1, LAUNCH_BATCH, 1, 1, 0, stream, params, 0),
                d2h(o_p, d_out, nbytes, stream),
                record(event, stream),
                sync(event),
            )
            t1 = pc()
            walls.append(t1 - t0)
            # Checked outside the timing: the peer is measured at its best.
            for item, call in zip(
                r,
                (
                    "cuMemcpyHtoDAsync",
                    "cuMemcpyHtoDAsync",
                    "cuMemsetD8Async",
                    "cuLaunchKernel",
                    "cuMemcpyDtoHAsync",
                    "cuEventRecord",
                    "cuEventSynchronize",
                ),
            ):
                if item[0] != ok:
                    self._check(item, call)
        return {"peer.cuda_bindings": walls}

    def launch_only(self, batches):
        cu = self.cu
        launch, func, grid, stream, params = (cu.cuLaunchKernel, self.func, self.grid, self.stream, self.params_addr)
        pc = time.perf_counter_ns
        self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        per = []
        for _ in range(batches):
            t0 = pc()
            for _ in range(LAUNCH_BATCH):
                launch(func, grid, 1, 1, LAUNCH_BATCH, 1, 1, 0, stream, params, 0)
            t1 = pc()
            self._check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
            per.append((t1 - t0) / LAUNCH_BATCH)
        return {"peer.cuda_bindings.launch_only": per}

    def verify(self):
        return np.array_equal(self.out, self.expected)

    def close(self):
        cu = self.cu
        cu.cuCtxSetCurrent(self.ctx)
        if self.stream is not None:
            cu.cuStreamSynchronize(self.stream)
        if self.event is not None:
            cu.cuEventDestroy(self.event)
            self.event = None
        if self.stream is not None:
            cu.cuStreamDestroy(self.stream)
            self.stream = None
        for d in self.mem:
            cu.cuMemFree(d)
        self.mem = []
        if self.module is not None:
            cu.cuModuleUnload(self.module)
            self.module = None


def start(backend, image, entry, source, a, b, expected):
    """The peer on the floor's compiled ``image``, in ``backend``'s context."""
    return CudaBindingsPeer(backend.context_handle, image, entry, a, b, expected)
