"""The CuPy peer: ``RawKernel`` on the floor's source, ``cp.asarray`` in and ``.get()`` out.

Imported only when the peer is measured; it imports CuPy itself when started.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from vyre_cuda.profile.engine import LAUNCH_BATCH
from vyre_cuda.program import BindingRole

__all__ = ["CupyPeer", "start"]


class CupyPeer:
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
        self.streams = []
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

    def vyre_device(self, backend, program, series="vyre.device"):
        """vyre_cuda on the same CuPy arrays: ``dispatch_into`` with device inputs and output
        (used in place and written device-to-device: no host memory touched)."""
        d_out = self.cp.zeros(self.d_a.shape[0], self.cp.float32)
        ins, outs = [self.d_a, self.d_b], [d_out]
        into = backend.dispatch_into
        state = {}

        def run(count):
            pc = time.perf_counter_ns
            walls = []
            for _ in range(count):
                t0 = pc()
                into(program, ins, outs)
                walls.append(pc() - t0)
            state["out"] = d_out.get()
            return {series: walls}

        def verify():
            out = state.get("out")  # None: run() failed before its readback
            return out is not None and np.array_equal(out, self.expected)

        return run, verify

    def vyre_device_zeroed(self, backend, program):
        """The same with the program's outputs declared zeroed (``BufferDecl.output``'s default):
        a clearing memset of the output before the launch, which CuPy's kernel does not make.
        Shows what that pass costs (the built-in vecadd writes every element: ``zeroed=False``)."""
        return self.vyre_device(backend, zeroed(program), "vyre.device.zeroed")

    def vyre_device_out(self, backend, program):
        """vyre_cuda ``dispatch`` on the same CuPy inputs with ``DispatchConfig(outputs="device")``:
        a new vyre_cuda DeviceArray per dispatch, dropped inside the timed loop (its allocation
        and free are part of the sample)."""
        import vyre_cuda

        config = vyre_cuda.DispatchConfig(outputs="device")
        ins = [self.d_a, self.d_b]
        dispatch = backend.dispatch
        state = {}

        def run(count):
            pc = time.perf_counter_ns
            walls = []
            for _ in range(count):
                t0 = pc()
                dispatch(program, ins, config)  # the DeviceArray it returns is freed here, in the sample
                walls.append(pc() - t0)
            # the result is read from one more dispatch, outside the timing
            state["out"] = dispatch(program, ins, config)[0].copy_to_host()
            return {"vyre.device.out": walls}

        def verify():
            out = state.get("out")
            return out is not None and np.array_equal(out, self.expected)

        return run, verify

    def vyre_enqueue(self, backend, program):
        """vyre_cuda ``dispatch_async`` of the same CuPy inputs on a caller's CuPy stream, writing
        a CuPy output it names (``outputs=[...]``, as cuda.core's ``launch`` writes its buffer),
        inside ``with stream:`` as a pipeline of CuPy and vyre_cuda steps on one stream runs:
        the arrays are exported on the dispatch's own stream, so there is no producer stream to
        order after (as cuda.core's ``launch`` orders none). The host time of the enqueue alone,
        per dispatch over batches of LAUNCH_BATCH; each batch is completed with ``.result()``
        outside the timing."""
        return self._enqueue(backend, program, "vyre.device.enqueue", on_stream=True)

    def vyre_enqueue_foreign(self, backend, program):
        """The same enqueue with CuPy's current stream left at its default: the arrays are
        exported on another stream than the dispatch's, so each dispatch also asks that producer
        stream whether its work is done (``cuStreamQuery``) before it launches."""
        return self._enqueue(backend, program, "vyre.device.enqueue.foreign", on_stream=False)

    def vyre_enqueue_devarray(self, backend, program):
        """The same enqueue on vyre_cuda's own DeviceArrays (made once, before the timing), on the
        same kind of caller's stream: no CuPy protocol to read, as cuda.core's ``launch`` takes
        its buffers' pointers. Its difference from ``vyre.device.enqueue`` is what reading three
        CuPy arrays and CuPy's current stream costs per dispatch."""
        import vyre_cuda

        made = vyre_cuda.DispatchConfig(outputs="device")
        zeros = np.zeros_like(self.a)
        # (program is the floor's vecadd: a + 0 is a, bit for bit)
        d_a = backend.dispatch(program, [self.a, zeros], made)[0]
        d_b = backend.dispatch(program, [self.b, zeros], made)[0]
        d_out = backend.dispatch(program, [zeros, zeros], made)[0]
        return self._enqueue(
            backend,
            program,
            "vyre.device.enqueue.devarray",
            on_stream=False,
            arrays=([d_a, d_b], [d_out], d_out.copy_to_host),
        )

    def _enqueue(self, backend, program, series, on_stream, arrays=None):
        import contextlib

        import vyre_cuda

        cp = self.cp
        self.device.use()
        stream = cp.cuda.Stream(non_blocking=True)
        self.streams.append(stream)
        if arrays is None:
            d_out = cp.zeros(self.d_a.shape[0], cp.float32)
            cp.cuda.Device().synchronize()  # the inputs were written on CuPy's current stream
            ins, outs, read_out = [self.d_a, self.d_b], [d_out], d_out.get
        else:
            ins, outs, read_out = arrays
        config = vyre_cuda.DispatchConfig(stream=stream.ptr)
        dispatch_async = backend.dispatch_async
        state = {}

        def run(batches):
            pc = time.perf_counter_ns
            per = []
            with stream if on_stream else contextlib.nullcontext():
                for _ in range(batches):
                    pending: list = []
                    append = pending.append
                    t0 = pc()
                    for _ in range(LAUNCH_BATCH):
                        append(dispatch_async(program, ins, config, outputs=outs))
                    t1 = pc()
                    for p in pending:
                        p.result()
                    per.append((t1 - t0) / LAUNCH_BATCH)
                    del pending
            state["out"] = read_out()
            return {series: per}

        def verify():
            out = state.get("out")
            return out is not None and np.array_equal(out, self.expected)

        return run, verify

    def close(self):
        self.cp.cuda.get_current_stream().synchronize()
        for stream in self.streams:  # (the enqueue rows' caller streams)
            stream.synchronize()
        self.streams.clear()
        self.d_a = self.d_b = self.d_out = None


def start(backend, image, entry, source, a, b, expected):
    """The peer compiling the floor's ``source`` on ``backend``'s device."""
    return CupyPeer(backend.device, source, entry, a, b, expected)


def zeroed(program):
    """``program`` with every pure output declared zeroed (cleared before the launch)."""
    buffers = tuple(dataclasses.replace(b, zeroed=True) if b.role is BindingRole.OUTPUT else b for b in program.buffers)
    return dataclasses.replace(program, buffers=buffers)
