"""The transfer engine: the staging ring's window planning, property-tested on the CPU, then the
engine's real code (ring windows, copy threads, pipelined upload and readback) on the fake CUDA
driver.

Large transfers stream through a fixed ring of page-locked chunks; how an upload region (inputs,
zero tails, params) and a readback (output pieces) are cut into windows is pure C
(``next_upload_window`` / ``next_readback_window``), exposed for these tests. Every staged byte
must land exactly once, at the right device offset, from the right source byte; direct
(page-locked) buffers must never pass through the ring; no window may exceed the ring's chunk.
On the fake driver, large dispatches at window and ring boundaries, from several threads, must
give exactly numpy's answer. The GPU suite (tests/gpu/test_transfer_gpu.py) repeats this on a
device; this runs in CI."""

from __future__ import annotations

import json

import fakecuda
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vyre_cuda import _windows

# -- window planning ------------------------------------------------------------------------------
KIB, MIB = 1 << 10, 1 << 20
INPUT_BASE = 1 << 40  # input i's byte k is addressed (i + 1) << 40 + k by the test planner
PARAMS_BASE = 1 << 60


@st.composite
def upload_regions(draw):
    """Sorted runs covering [0, end) as the planner lays them out: per input a copy run and a
    zero tail, then the params blob, sometimes a zeroed small-output run."""
    n_inputs = draw(st.integers(0, 5))
    runs = []
    offset = 0
    for i in range(n_inputs):
        n = draw(
            st.one_of(
                st.integers(0, 64),
                st.integers(0, 5 * MIB),
                st.sampled_from([MIB - 1, MIB, MIB + 1, 2 * MIB, 4 * MIB - 16, 8 * MIB, 8 * MIB + 1]),
            )
        )
        runs.append((offset, n, 1, i, 0))
        tail = draw(st.integers(0, 255))
        runs.append((offset + n, tail, 0, -1, 0))
        offset += n + tail
    params = draw(st.integers(4, 4 * KIB))
    runs.append((offset, params, 2, -1, 0))
    offset += params
    if draw(st.booleans()):
        clear = draw(st.integers(1, 64 * KIB))
        runs.append((offset, clear, 0, -1, 0))
        offset += clear
    direct = [draw(st.booleans()) for _ in range(n_inputs)]
    return runs, direct


def _staged_bytes(runs, direct):
    return sum(n for _, n, kind, index, _ in runs if not (kind == 1 and direct[index]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(region=upload_regions(), chunk=st.sampled_from([MIB, 2 * MIB, 8 * MIB, 16 * MIB]))
def test_upload_windows_cover_every_staged_byte_once(region, chunk):
    runs, direct = region
    staged = _staged_bytes(runs, direct)
    window, windows = _windows.plan_upload_windows(runs, direct, staged, chunk)
    assert MIB // 2 <= window <= chunk and window % (64 * KIB) == 0
    # where each device byte must come from: (source address or None for zero)
    expected = []
    for offset, n, kind, index, _ in runs:
        if n == 0 or (kind == 1 and direct[index]):
            continue
        base = None if kind == 0 else ((index + 1) << 40 if kind == 1 else PARAMS_BASE)
        expected.append((offset, n, base))
    got = []  # (device offset, n, source address or None) reconstructed from pieces and tasks
    total = 0
    for k, (pieces, tasks) in enumerate(windows):
        used = sum(n for *_, n in tasks)
        assert used == sum(n for *_, n in pieces) <= window
        if k < len(windows) - 1:
            assert used == window  # every window but the last is full
        # tasks fill the slot contiguously from 0
        slot = 0
        for dst, _, n in tasks:
            assert dst == slot and n > 0
            slot += n
        # pieces are disjoint slot ranges in order, each one contiguous on the device
        slot = 0
        for dev, off, n in pieces:
            assert off == slot and n > 0
            slot += n
            # map each piece back through the tasks covering its slot range
            for dst, src, tn in tasks:
                lo, hi = max(dst, off), min(dst + tn, off + n)
                if hi > lo:
                    got.append((dev + (lo - off), hi - lo, None if src is None else src + (lo - dst)))
        total += used
    assert total == staged

    def bytes_of(segments):
        # normalise to per-run (device offset, n, source) with contiguous merging
        out = []
        for dev, n, src in sorted(segments, key=lambda s: s[0]):
            if out:
                pdev, pn, psrc = out[-1]
                if pdev + pn == dev and (
                    (psrc is None and src is None) or (psrc is not None and src is not None and psrc + pn == src)
                ):
                    out[-1] = (pdev, pn + n, psrc)
                    continue
            out.append((dev, n, src))
        return out

    assert bytes_of(got) == bytes_of(expected)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(
        st.one_of(
            st.integers(0, 100), st.integers(0, 6 * MIB), st.sampled_from([MIB - 1, MIB, MIB + 1, 3 * MIB, 8 * MIB + 3])
        ),
        min_size=1,
        max_size=6,
    ),
    chunk=st.sampled_from([MIB, 4 * MIB, 8 * MIB]),
    data=st.data(),
)
def test_readback_windows_deliver_every_byte_once(sizes, chunk, data):
    direct = [data.draw(st.booleans()) for _ in sizes]
    pieces, dev = [], 0
    for k, n in enumerate(sizes):
        pieces.append((dev, (k + 1) << 40, n))
        dev += ((n + 255) // 256) * 256 + 256
    window, windows = _windows.plan_readback_windows(pieces, direct, chunk)
    assert MIB // 2 <= window <= chunk
    delivered = {}
    for k, (dmas, tasks) in enumerate(windows):
        used = sum(n for *_, n in dmas)
        assert 0 < used <= window and used == sum(n for *_, n in tasks)
        if k < len(windows) - 1:
            assert used == window
        slot = 0
        for (d_dev, d_slot, n), (host, t_slot, tn) in zip(dmas, tasks):
            assert d_slot == t_slot == slot and n == tn
            slot += n
            # host address encodes (piece index + 1) << 40 + byte offset; device offset must match
            index, offset = (host >> 40) - 1, host & ((1 << 40) - 1)
            assert not direct[index]
            assert d_dev == pieces[index][0] + offset
            delivered.setdefault(index, []).append((offset, n))
    for index, (_, _, n) in enumerate(pieces):
        if direct[index] or n == 0:
            assert index not in delivered
            continue
        runs = sorted(delivered[index])
        pos = 0
        for offset, m in runs:
            assert offset == pos
            pos += m
        assert pos == n


def test_window_is_an_eighth_of_the_transfer_within_bounds():
    window, w = _windows.plan_upload_windows([(0, 128 * MIB, 1, 0, 0)], [False], 128 * MIB, 8 * MIB)
    assert window == 8 * MIB and len(w) == 16  # capped at the ring's chunk
    window, w = _windows.plan_upload_windows([(0, 8 * MIB, 1, 0, 0)], [False], 8 * MIB, 8 * MIB)
    assert window == MIB and len(w) == 8  # a 4 MiB vecadd's upload pipelines in 8 windows
    window, w = _windows.plan_upload_windows([(0, 100, 1, 0, 0)], [False], 100, 8 * MIB)
    assert window == MIB // 2 and len(w) == 1


def test_direct_inputs_never_touch_the_ring():
    runs = [(0, 3 * MIB, 1, 0, 0), (3 * MIB, 0, 0, -1, 0), (3 * MIB, 5 * MIB, 1, 1, 0), (8 * MIB, 16, 2, -1, 0)]
    _, windows = _windows.plan_upload_windows(runs, [True, False], 5 * MIB + 16, 8 * MIB)
    sources = [src for _, tasks in windows for _, src, _ in tasks if src is not None]
    assert all(src >> 40 != 1 for src in sources)  # input 0 is page-locked: DMA'd directly
    assert sum(n for _, tasks in windows for *_, n in tasks) == 5 * MIB + 16
    # the piece after the skipped input starts a new device run
    assert windows[0][0][0][0] == 3 * MIB


def test_fuzzed_windows_reassemble_real_bytes():
    """Replay the planner's copies on real numpy bytes, as the engine would, and compare."""
    rng = np.random.default_rng(12345)
    for _ in range(50):
        sizes = rng.integers(0, 3 * MIB, size=rng.integers(1, 4))
        direct = [bool(x) for x in rng.integers(0, 2, size=len(sizes))]
        inputs = [rng.integers(0, 256, size=int(n), dtype=np.uint8) for n in sizes]
        params = rng.integers(0, 256, size=64, dtype=np.uint8)
        runs, offset = [], 0
        for i, n in enumerate(sizes):
            runs.append((offset, int(n), 1, i, 0))
            runs.append((offset + int(n), 17, 0, -1, 0))
            offset += int(n) + 17
        runs.append((offset, 64, 2, -1, 0))
        total = offset + 64
        device = np.full(total, 0xEE, np.uint8)
        expected = np.zeros(total, np.uint8)
        for off, n, _, index, _ in (r for r in runs if r[2] == 1):
            expected[off : off + n] = inputs[index]
            if direct[index]:
                device[off : off + n] = inputs[index]  # the direct DMA
        expected[offset : offset + 64] = params
        staged = _staged_bytes(runs, direct)
        window, windows = _windows.plan_upload_windows(runs, direct, staged, MIB)
        for pieces, tasks in windows:
            slot = np.zeros(window, np.uint8)
            for dst, src, n in tasks:
                if src is None:
                    slot[dst : dst + n] = 0
                elif src >= PARAMS_BASE:
                    k = src - PARAMS_BASE
                    slot[dst : dst + n] = params[k : k + n]
                else:
                    index, k = (src >> 40) - 1, src & ((1 << 40) - 1)
                    slot[dst : dst + n] = inputs[index][k : k + n]
            for dev, off, n in pieces:
                device[dev : dev + n] = slot[off : off + n]
        np.testing.assert_array_equal(device, expected)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 20000),
    dst_off=st.integers(0, 130),
    src_off=st.integers(0, 130),
    zero=st.booleans(),
)
def test_streaming_copy_writes_exactly_its_range(n, dst_off, src_off, zero):
    # non-temporal copies align the destination to a cache line, stream whole lines, then copy
    # the tail: every byte of the range is written, none outside it
    rng = np.random.default_rng(n * 131 + dst_off)
    src = rng.integers(0, 256, n + src_off, dtype=np.uint8)
    dst = rng.integers(0, 256, n + dst_off + 64, dtype=np.uint8)
    before = dst.copy()
    _windows._stream_copy(dst, None if zero else src, dst_off, src_off, n)
    want = before.copy()
    want[dst_off : dst_off + n] = 0 if zero else src[src_off : src_off + n]
    np.testing.assert_array_equal(dst, want)


# -- the engine on the fake driver ----------------------------------------------------------------
CHILD = r"""
import json, sys, threading
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp
from vyre_cuda._knobs import Knobs

MIB = 1 << 20
fake = FakeDriver()
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
results = {"checked": 0, "errors": []}
# a small ring (1 MiB chunks, 2 of them) so every size below crosses windows and reuses slots
g = vc.CudaBackend(0, staging_chunk_bytes=MIB, staging_chunks=2, copy_threads=3)
# both copy kinds: plain memcpy, and non-temporal stores (odd sizes exercise their head and tail)
nt = (1 << 40) if sys.argv[2] == "1" else 0
g._use_knobs(Knobs(stream_upload_max=nt, stream_readback_max=nt))
sizes = [MIB // 4 - 1, MIB // 4, MIB // 4 + 1, 2 * MIB // 4 + 7, 3 * MIB // 4 - 5, 5 * MIB // 4 + 3]
for n in sizes:
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
    assert not g.plan_info(prog, [a, b]).mirror, n
    (out,) = g.dispatch(prog, [a, b])
    dst = np.full(n, np.nan, np.float32)
    g.dispatch_into(prog, [a, b], [dst])
    (late,) = g.dispatch_async(prog, [b, a]).result()
    for got in (out, dst, late):
        if not np.array_equal(got, a + b):
            results["errors"].append(f"n={n}: wrong result")
    results["checked"] += 3

def worker(seed):
    r = np.random.default_rng(seed)
    try:
        for _ in range(6):
            n = int(r.choice(sizes))
            a = r.standard_normal(n).astype(np.float32)
            b = r.standard_normal(n).astype(np.float32)
            (out,) = g.dispatch(prog, [a, b])
            if not np.array_equal(out, a + b):
                results["errors"].append(f"thread n={n}: wrong result")
    except Exception as exc:
        results["errors"].append(repr(exc))

threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
snap = g.telemetry.snapshot()
results["ring_chunks"] = snap["ring_chunks"]
results["live"] = [snap[k] for k in ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")]
results["free_slots"] = g._core.xfer.free_slots()
results["parallel_jobs"] = g._core.xfer.parallel_jobs
results["hook_errors"] = fake.hook_errors
g.close()
print(json.dumps(results))
"""


@pytest.mark.parametrize("streaming", [False, True], ids=["memcpy", "streaming-stores"])
def test_ring_transfers_are_exact_on_the_fake_driver(fake_libcuda, rng, streaming):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed), "1" if streaming else "0"], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [] and res["hook_errors"] == [], res
    assert res["checked"] == 18
    assert res["ring_chunks"] > 50  # every dispatch streamed through the ring, both ways
    assert res["live"] == [0, 0, 0, 0] and res["free_slots"] == 2
    assert res["parallel_jobs"] > 0  # the copy threads took part
