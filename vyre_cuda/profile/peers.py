"""The peers: the same vecadd round trip written as a user of each library would write it.

Each peer is optional and measured only when importable; a missing or failing peer is skipped
by name. Every peer moves numpy arrays in and out (pageable host memory), as vyre_cuda's numpy
row does.
"""

from __future__ import annotations

import importlib.util
import sys
import time
import warnings

import numpy as np

from ..errors import driver_error
from .engine import LAUNCH_BATCH
from .systems import PEER_MODULES

__all__ = ["open_peer", "peer_available", "peer_version"]


class _CudaBindingsPeer:
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


class _CupyPeer:
    """CuPy ``RawKernel`` on the floor's source: ``cp.asarray`` in, ``cp.zeros`` out, ``.get()``."""

    name = "cupy"

    def __init__(self, device, source, entry, a, b, expected):
        import cupy as cp

        self.cp = cp
        self.device = cp.cuda.Device(device)
        self.device.use()
        self.kernel = cp.RawKernel(source, entry)
        self.a, self.b = a, b
        self.n = np.uint32(a.shape[0])
        self.grid = ((a.shape[0] + LAUNCH_BATCH - 1) // LAUNCH_BATCH,)
        self.block = (LAUNCH_BATCH,)
        self.expected = expected
        self.out = None
        self.d_a, self.d_b = cp.asarray(a), cp.asarray(b)
        self.d_out = cp.zeros(a.shape[0], cp.float32)

    def full(self, count):
        cp, kernel, a, b, n, grid, block = (self.cp, self.kernel, self.a, self.b, self.n, self.grid, self.block)
        self.device.use()
        pc = time.perf_counter_ns
        walls = []
        out = None
        for _ in range(count):
            t0 = pc()
            d_a = cp.asarray(a)
            d_b = cp.asarray(b)
            d_out = cp.zeros(a.shape[0], cp.float32)
            kernel(grid, block, (d_a, d_b, d_out, n))
            out = d_out.get()
            t1 = pc()
            walls.append(t1 - t0)
        self.out = out
        return {"peer.cupy": walls}

    def launch_only(self, batches):
        kernel, grid, block = self.kernel, self.grid, self.block
        args = (self.d_a, self.d_b, self.d_out, self.n)
        self.device.use()
        stream = self.cp.cuda.get_current_stream()
        pc = time.perf_counter_ns
        per = []
        for _ in range(batches):
            t0 = pc()
            for _ in range(LAUNCH_BATCH):
                kernel(grid, block, args)
            t1 = pc()
            stream.synchronize()
            per.append((t1 - t0) / LAUNCH_BATCH)
        return {"peer.cupy.launch_only": per}

    def verify(self):
        return self.out is not None and np.array_equal(self.out, self.expected)

    def device_resident(self, count):
        """Data already on the device: the kernel and a stream synchronize, no transfers."""
        kernel, grid, block = self.kernel, self.grid, self.block
        args = (self.d_a, self.d_b, self.d_out, self.n)
        self.device.use()
        stream = self.cp.cuda.get_current_stream()
        pc = time.perf_counter_ns
        walls = []
        for _ in range(count):
            t0 = pc()
            kernel(grid, block, args)
            stream.synchronize()
            walls.append(pc() - t0)
        self.out = self.d_out.get()
        return {"peer.cupy.device": walls}

    def vyre_device(self, backend, program):
        """vyre_cuda on the same CuPy arrays: ``dispatch_into`` with device inputs and output
        (used in place and written device-to-device: no host memory touched)."""
        d_out = self.cp.zeros(self.d_a.shape[0], self.cp.float32)
        ins, outs = [self.d_a, self.d_b], [d_out]
        into = backend.dispatch_into

        def run(count):
            pc = time.perf_counter_ns
            walls = []
            for _ in range(count):
                t0 = pc()
                into(program, ins, outs)
                walls.append(pc() - t0)
            self.vyre_out = d_out.get()
            return {"vyre.device": walls}

        def verify():
            out = getattr(self, "vyre_out", None)  # None: run() failed before its readback
            return out is not None and np.array_equal(out, self.expected)

        return run, verify

    def close(self):
        self.cp.cuda.get_current_stream().synchronize()
        self.d_a = self.d_b = self.d_out = None


class _TorchPeer:
    """PyTorch eager: ``(a.cuda() + b.cuda()).cpu()`` from numpy-backed CPU tensors."""

    name = "torch"

    def __init__(self, device, a, b, expected):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        self.torch = torch
        self.dev = torch.device("cuda", device)
        self.ta, self.tb = torch.from_numpy(a), torch.from_numpy(b)
        self.expected = expected
        self.out = None
        self.d_a, self.d_b = self.ta.to(self.dev), self.tb.to(self.dev)
        self.d_out = torch.empty_like(self.d_a)

    def full(self, count):
        ta, tb, dev = self.ta, self.tb, self.dev
        pc = time.perf_counter_ns
        walls = []
        out = None
        for _ in range(count):
            t0 = pc()
            out = (ta.cuda(dev) + tb.cuda(dev)).cpu().numpy()
            t1 = pc()
            walls.append(t1 - t0)
        self.out = out
        return {"peer.torch": walls}

    def launch_only(self, batches):
        add, d_a, d_b, d_out = self.torch.add, self.d_a, self.d_b, self.d_out
        sync = self.torch.cuda.synchronize
        pc = time.perf_counter_ns
        per = []
        for _ in range(batches):
            t0 = pc()
            for _ in range(LAUNCH_BATCH):
                add(d_a, d_b, out=d_out)
            t1 = pc()
            sync(self.dev)
            per.append((t1 - t0) / LAUNCH_BATCH)
        return {"peer.torch.launch_only": per}

    def verify(self):
        return self.out is not None and np.array_equal(self.out, self.expected)

    def device_resident(self, count):
        """Data already on the device: the add and a synchronize, no transfers."""
        add, d_a, d_b, d_out = self.torch.add, self.d_a, self.d_b, self.d_out
        sync, dev = self.torch.cuda.synchronize, self.dev
        pc = time.perf_counter_ns
        walls = []
        for _ in range(count):
            t0 = pc()
            add(d_a, d_b, out=d_out)
            sync(dev)
            walls.append(pc() - t0)
        self.out = d_out.cpu().numpy()
        return {"peer.torch.device": walls}

    def close(self):
        self.torch.cuda.synchronize(self.dev)
        self.d_a = self.d_b = self.d_out = None


def peer_available(name):
    """Whether the peer's library is importable (without importing it)."""
    module = PEER_MODULES[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return found


def open_peer(name, backend, compiled_image, entry, source, a, b, expected):
    """Start peer ``name`` on the arrays ``a`` and ``b``; ``verify()`` compares its output with
    ``expected``. The peer's warnings are silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "cuda_bindings":
            return _CudaBindingsPeer(backend.context_handle, compiled_image, entry, a, b, expected)
        if name == "cupy":
            return _CupyPeer(backend.device, source, entry, a, b, expected)
        return _TorchPeer(backend.device, a, b, expected)


def peer_version(name):
    """The peer library's version, when it was imported."""
    mod = sys.modules.get(PEER_MODULES[name])
    return getattr(mod, "__version__", None) if mod is not None else None
