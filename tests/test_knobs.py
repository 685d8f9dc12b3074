"""Measurement settings (``vyre_cuda._knobs.Knobs``) are one backend's, never the process's.

The defaults are the core's own (a backend that was given none runs exactly as before); given
to one backend they reach its core's C fields and its planning and nothing else. On the fake
CUDA driver, three backends of one process, with different window minimums, mirror boundaries
and wait modes, dispatch at the same time from their own threads: each one's ring windows,
route and waits follow its own knobs (counted by its own telemetry, and by the fake driver's
counters where one backend runs alone), and every result matches numpy on random data. With a
process-wide setting the last backend configured would impose its windows on the others.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import fakecuda
import pytest

from vyre_cuda import _windows
from vyre_cuda._dispatch import Core
from vyre_cuda._knobs import DEFAULT, Knobs
from vyre_cuda.errors import ValidationError
from vyre_cuda.planning.dispatch import MIRROR_MAX, staging_for


def test_the_defaults_are_the_cores_own():
    # a backend given no knobs runs with the core's C defaults: Knobs() must name the same values
    core = Core(0, 1 << 20, 1 << 20)
    xfer = core.resources.xfer
    assert (
        core.wait_mode,
        xfer.streamed_copy_mode,
        xfer.min_window,
        xfer.min_readback_window,
        xfer.stream_upload_max,
        xfer.stream_readback_max,
    ) == (
        DEFAULT.wait_mode,
        DEFAULT.streamed_copy_mode,
        DEFAULT.min_window,
        DEFAULT.min_readback_window,
        DEFAULT.stream_upload_max,
        DEFAULT.stream_readback_max,
    )
    assert Knobs() == DEFAULT and DEFAULT.mirror_max == MIRROR_MAX and DEFAULT.stream_tuning is None
    # the pure window views default to the engine's minimums
    assert _windows.plan_upload_windows([(0, 100, 1, 0, 0)], [False], 100, 8 << 20)[0] == DEFAULT.min_window
    assert _windows.plan_readback_windows([(0, 0, 100)], [False], 8 << 20)[0] == DEFAULT.min_readback_window
    assert _windows.plan_upload_windows([(0, 100, 1, 0, 0)], [False], 100, 8 << 20, 64 << 10)[0] == 64 << 10


def test_set_knobs_writes_one_core():
    a, b = Core(0, 1 << 20, 1 << 20), Core(0, 1 << 20, 1 << 20)
    a.set_knobs(
        Knobs(
            wait_mode=2,
            streamed_copy_mode=0,
            min_window=64 << 10,
            min_readback_window=128 << 10,
            stream_upload_max=0,
            stream_readback_max=1 << 40,
        )
    )
    xa, xb = a.resources.xfer, b.resources.xfer
    assert (a.wait_mode, xa.streamed_copy_mode, xa.min_window, xa.min_readback_window) == (2, 0, 64 << 10, 128 << 10)
    assert (xa.stream_upload_max, xa.stream_readback_max) == (0, 1 << 40)
    assert (b.wait_mode, xb.streamed_copy_mode, xb.min_window, xb.min_readback_window) == (0, 1, 512 << 10, 1 << 20)


@pytest.mark.parametrize(
    "bad",
    [
        {"wait_mode": 3},
        {"streamed_copy_mode": -1},
        {"min_window": 0},
        {"min_readback_window": 0},
        {"mirror_max": -1},
        {"stream_upload_max": 1 << 64},
        {"wait_mode": True},
        {"min_window": 1.5},
    ],
)
def test_knobs_refuse_what_the_core_cannot_hold(bad):
    with pytest.raises(ValidationError):
        Knobs(**bad)


def test_mirror_max_is_a_planning_argument():
    layout = SimpleNamespace(slab_bytes=300 << 10, bucket_bytes=512 << 10)  # (all staging_for reads)
    assert staging_for(layout, False)[0] is True  # the module's boundary by default
    assert staging_for(layout, False, 256 << 10)[0] is False
    assert staging_for(layout, False, 1 << 40)[0] is True


# -- two (three) backends at once on the fake driver --------------------------------------------
CHILD = r"""
import json, sys, threading
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp
from vyre_cuda.planning.stream import StreamTuning
from benchmarks.harness import hooks

KIB, MIB = 1 << 10, 1 << 20
CHUNK = 4 * MIB
fake = FakeDriver()
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
errors = []

def window(total, minimum):
    # _windows.window_bytes: an eighth of the transfer, at least the minimum, 64 KiB aligned, at most a chunk
    w = max(total // 8, minimum)
    w = -(-w // (64 * KIB)) * (64 * KIB)
    return min(w, CHUNK)

def ring_windows(knobs, upload_end, rb):
    # the upload's windows cut the slab's whole upload range, alignment gaps included (zeroed in
    # staging): more than the staged bytes the telemetry counts
    return -(-upload_end // window(upload_end, knobs.min_window)) + -(-rb // window(rb, knobs.min_readback_window))

def backend():
    return vc.CudaBackend(0, staging_chunk_bytes=CHUNK, staging_chunks=2, copy_threads=2)

# small windows everywhere, the ring even for tiny dispatches, cuStreamSynchronize waits
small = backend()
hooks.set_knobs(small, min_window=64 * KIB, min_readback_window=64 * KIB, mirror_max=0, wait_mode=2)
# windows of a whole chunk, the default mirror boundary, polled waits, its own stream tuning
large = backend()
hooks.set_knobs(large, min_window=CHUNK, min_readback_window=CHUNK, stream_upload_max=1 << 40)
hooks.set_stream_tuning(large, StreamTuning(chunk_bytes=64 * KIB, min_waves=0))
# given nothing: the defaults, whatever the others were given (and given after it was made)
plain = backend()
backends = {"small": small, "large": large, "plain": plain}
for g in backends.values():
    fake.emulate(g, prog, [np.zeros(4, np.float32)] * 2, vecadd_emulation(np.float32))
knobs = {name: g._knobs for name, g in backends.items()}
out = {"knobs": {name: [k.min_window, k.min_readback_window, k.mirror_max, k.wait_mode] for name, k in knobs.items()}}

def dispatch_checked(name, g, n, seed):
    r = np.random.default_rng(seed)
    a = r.standard_normal(n).astype(np.float32)
    b = r.standard_normal(n).astype(np.float32)
    before = g.telemetry.snapshot()
    (res,) = g.dispatch(prog, [a, b])
    after = g.telemetry.snapshot()
    if not np.array_equal(res, a + b):
        errors.append(f"{name} n={n}: wrong result")
    up = after["staged_h2d_bytes"] - before["staged_h2d_bytes"]
    rb = after["staged_d2h_bytes"] - before["staged_d2h_bytes"]
    chunks = after["ring_chunks"] - before["ring_chunks"]
    return up, rb, chunks

# 1. one at a time: the route and the waits (the fake driver's counters are process-wide)
tiny = 1000  # 4 KB per buffer: the mirror by default
for name, g in backends.items():
    a = rng.standard_normal(tiny).astype(np.float32)
    syncs = fake.stats()["syncs"]
    up, rb, chunks = dispatch_checked(name, g, tiny, int(rng.integers(1 << 30)))
    out[name + "_tiny"] = {
        "mirror": bool(g.plan_info(prog, [a, a]).mirror),
        "ring_chunks": chunks,
        "syncs": fake.stats()["syncs"] - syncs,
    }
SOURCE = (
    '#include "vyre_cuda.cuh"\n'
    "VYRE_KERNEL vyre_main(const float* a, const float* b, float* out, const vyre_u32* p) {}\n"
)
elementwise = vc.Program(
    vc.Kernel.cuda(SOURCE),
    [vc.BufferDecl.read("a", 0, "f32"), vc.BufferDecl.read("b", 1, "f32"), vc.BufferDecl.output("out", 2, "f32")],
    elementwise=True,
)
rows = [np.zeros(4 * MIB, np.float32)] * 2
out["stream_chunk_rows"] = {
    name: g.plan_info(elementwise, rows, vc.DispatchConfig(streamed=True)).stream.chunk_rows
    for name, g in backends.items()
}

# 2. at the same time: each backend dispatches from its own thread, interleaved with the others
counts = {name: [] for name in backends}
start = threading.Barrier(len(backends))

def worker(name, g, seed):
    r = np.random.default_rng(seed)
    try:
        start.wait()
        for _ in range(6):
            n = int(r.integers(MIB // 8, 3 * MIB // 4))  # 0.5-3 MiB per buffer, odd sizes too
            seed = int(r.integers(1 << 30))
            upload_end = g.plan_info(prog, [np.empty(n, np.float32)] * 2).layout.upload_end
            up, rb, chunks = dispatch_checked(name, g, n, seed)
            counts[name].append([n, up, rb, chunks, ring_windows(knobs[name], upload_end, rb)])
    except Exception as exc:
        errors.append(f"{name}: {exc!r}")

threads = [threading.Thread(target=worker, args=(name, g, int(rng.integers(1 << 30)))) for name, g in backends.items()]
for t in threads: t.start()
for t in threads: t.join()
out["counts"] = counts
out["errors"] = errors
out["hook_errors"] = fake.hook_errors
for g in backends.values():
    g.close()
print(json.dumps(out))
"""


def test_backends_with_different_knobs_run_at_once_on_the_fake_driver(fake_libcuda, rng):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [] and res["hook_errors"] == [], res
    assert res["knobs"] == {
        "small": [64 << 10, 64 << 10, 0, 2],
        "large": [4 << 20, 4 << 20, MIRROR_MAX, 0],
        "plain": [512 << 10, 1 << 20, MIRROR_MAX, 0],
    }
    # the route (planning's mirror boundary) and the wait (the core's wait mode), per backend
    assert res["small_tiny"] == {"mirror": False, "ring_chunks": 2, "syncs": 1}, res
    assert res["large_tiny"] == {"mirror": True, "ring_chunks": 0, "syncs": 0}, res
    assert res["plain_tiny"] == {"mirror": True, "ring_chunks": 0, "syncs": 0}, res
    # the stream tuning: only the backend given one plans with it
    rows = res["stream_chunk_rows"]
    assert rows["large"] == (64 << 10) // 4 and rows["small"] == rows["plain"] > rows["large"], rows
    # the ring windows each backend cut while the others ran: its own minimums' count, every time
    for name, runs in res["counts"].items():
        assert len(runs) == 6, (name, runs)
        for n, up, rb, chunks, expected in runs:
            assert up >= 8 * n and rb == 4 * n, (name, n, up, rb)
            assert chunks == expected, (name, n, up, rb, chunks, expected)
    # ... and they differ: 64 KiB minimums cut each transfer into about eight windows, whole-chunk
    # ones into one or two, the defaults (512 KiB, 1 MiB) in between
    for (_, _, _, small, _), (_, _, _, large, _) in zip(res["counts"]["small"], res["counts"]["large"]):
        assert small > large, res["counts"]
    assert all(run[3] >= 2 for run in res["counts"]["plain"])
