"""The PyTorch peer: eager ``(a.cuda() + b.cuda()).cpu()`` from numpy-backed CPU tensors.

Imported only when the peer is measured; it imports torch itself when started.
"""

from __future__ import annotations

import time

import numpy as np

from vyre_cuda.profile.engine import LAUNCH_BATCH

__all__ = ["TorchPeer", "start"]


class TorchPeer:
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

    def vyre_device(self, backend, program):
        """vyre_cuda on the same torch CUDA tensors: ``dispatch_into`` with the device tensors
        as inputs and a device tensor as the output (no host memory touched)."""
        d_out = self.torch.zeros_like(self.d_a)
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
            state["out"] = d_out.cpu().numpy()
            return {"vyre.device.torch": walls}

        def verify():
            out = state.get("out")  # None: run() failed before its readback
            return out is not None and np.array_equal(out, self.expected)

        return run, verify

    def close(self):
        self.torch.cuda.synchronize(self.dev)
        self.d_a = self.d_b = self.d_out = None


def start(backend, image, entry, source, a, b, expected):
    """The peer on ``backend``'s device (it runs its own add, not the floor's kernel)."""
    return TorchPeer(backend.device, a, b, expected)
