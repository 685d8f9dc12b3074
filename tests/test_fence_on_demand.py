"""Completion events recorded on demand (``Knobs.fence_on_demand``) on the fake driver: a chain of
``dispatch_async`` calls on a caller's stream object records no event at enqueue; the first
completion asked for records one, which covers every earlier dispatch of that stream; work
enqueued after it is never taken as covered; is_ready(), await, dropped handles, several threads
on one handle and a raw stream handle (which keeps the event per dispatch) all stay right. In lazy
mode the fake runs stream work only when the host waits for it, so a completion taken early gives
wrong data here instead of passing by luck."""

import pytest
from helpers import scenarios

CHILD = r"""
import asyncio, ctypes, gc, json, sys, threading
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, array_at, vecadd_emulation
from vyre_cuda import builtin_programs as bp
from vyre_cuda._knobs import DEFAULT

sys.setswitchinterval(1e-6)
fake = FakeDriver()
lazy = sys.argv[2] == "lazy"
rng = np.random.default_rng(int(sys.argv[1]))
prog = bp.vecadd_f32()
N = 512
dev = vc.DispatchConfig(outputs="device")
errors = []


class Stream:  # a caller's stream object (cuda.core's protocol), as CuPy's or torch's would be
    def __init__(self):
        h = ctypes.c_void_p()
        assert fake.lib.cuStreamCreate(ctypes.byref(h), 1) == 0
        self.handle = h.value

    def __cuda_stream__(self):
        return (0, self.handle)

    def destroy(self):
        assert fake.lib.cuStreamDestroy(ctypes.c_void_p(self.handle)) == 0


def records():
    return fake.stats()["event_records"]


def host(arr):
    # the fake's device memory read in place: a copy to the host would run every stream first
    return array_at(arr.__cuda_array_interface__["data"][0], np.float32, N).copy()


def check(what, got, want):
    if not np.array_equal(got, want):
        errors.append(what)


def sums(start, y, n):
    # start + y, start + y + y, ...: added one step at a time in float32, as the chain adds
    out, cur = [], start
    for _ in range(n):
        cur = cur + y
        out.append(cur)
    return out


def chain(g, cfg, x, y, n):
    # x + y + y + ...: each step writes a new device array (named at dispatch_async)
    outs = [g.dispatch(prog, [np.zeros(N, np.float32), np.zeros(N, np.float32)], dev)[0] for _ in range(n)]
    cur, pending = x, []
    for nxt in outs:
        pending.append(g.dispatch_async(prog, [cur, y], cfg, outputs=[nxt]))
        cur = nxt
    return outs, pending


res = {}
for on in (False, True):
    g = vc.CudaBackend(0)
    g._use_knobs(DEFAULT.replace(fence_on_demand=on))
    a0 = rng.standard_normal(N).astype(np.float32)
    fake.emulate(g, prog, [a0, a0], vecadd_emulation(np.float32))
    if lazy:
        fake.set_lazy(True)
    s = Stream()
    cfg = vc.DispatchConfig(stream=s)
    xa, ya = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    (x,) = g.dispatch(prog, [xa, np.zeros(N, np.float32)], dev)
    (y,) = g.dispatch(prog, [ya, np.zeros(N, np.float32)], dev)
    row = {}

    # 1. a chain of 40, handles kept: records at enqueue, then the results from the last back
    r0 = records()
    outs, pending = chain(g, cfg, x, y, 40)
    row["enqueue_records"] = records() - r0
    r0 = records()
    (last,) = pending[-1].result()
    row["first_result_records"] = records() - r0
    want = sums(xa, ya, 46)
    check("chain: last step", host(last), want[39])
    r0 = records()
    for k in range(38, -1, -1):
        (got,) = pending[k].result()
        if got is not outs[k]:
            errors.append(f"chain: result {k} is not the named array")
        check(f"chain: step {k}", host(got), want[k])
    row["other_results_records"] = records() - r0

    # 2. work enqueued after a fence seen complete is not covered by it
    outs2, later = chain(g, cfg, outs[-1], y, 5)
    r0 = records()
    (got,) = later[0].result()
    row["after_fence_records"] = records() - r0
    check("after the fence: step 0", host(got), want[40])
    for k, p in enumerate(later[1:], 1):
        check(f"after the fence: step {k}", host(p.result()[0]), want[40 + k])

    # 3. is_ready() while the GPU is held, then after
    outs3, held = chain(g, cfg, x, y, 3)
    fake.lib.fake_cuda_hold(1)
    row["ready_while_held"] = held[-1].is_ready()
    fake.lib.fake_cuda_hold(0)
    row["ready_after"] = held[-1].is_ready()
    check("is_ready: last", host(held[-1].result()[0]), want[2])
    check("is_ready: first", host(held[0].result()[0]), want[0])

    # 4. dropped handles: the deferred list waits for them; the chain's end is still right
    outs4, dropped = chain(g, cfg, x, y, 20)
    del dropped
    gc.collect()
    (tail,) = g.dispatch_async(prog, [outs4[-1], y], cfg, outputs=[outs[0]]).result()
    check("dropped: tail", host(tail), want[20])

    # 5. several threads on one handle (result and is_ready at once)
    outs5, shared = chain(g, cfg, x, y, 6)
    got5 = []
    def take(p):
        got5.append(p.result()[0])
    def poll(p):
        while not p.is_ready():
            pass
    ts = [threading.Thread(target=take, args=(shared[-1],)) for _ in range(3)]
    ts += [threading.Thread(target=poll, args=(shared[2],)) for _ in range(2)]
    if not lazy:  # (lazy mode serves one driver-calling thread: see the fake's header)
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if len(got5) != 3 or any(o is not outs5[-1] for o in got5):
            errors.append("threads: not every taker got the named array")
    check("threads: last", host(shared[-1].result()[0]), want[5])
    check("threads: third", host(shared[2].result()[0]), want[2])

    # 6. await
    outs6, awaited = chain(g, cfg, x, y, 4)
    async def main():
        return await awaited[-1]
    check("await: last", host(asyncio.run(main())[0]), want[3])
    check("await: first", host(awaited[0].result()[0]), want[0])

    # 7. a raw stream handle: the config does not keep the stream alive, so every dispatch keeps
    # its own event, recorded at enqueue
    raw = vc.DispatchConfig(stream=s.handle)
    r0 = records()
    outs7, rawp = chain(g, raw, x, y, 10)
    row["raw_enqueue_records"] = records() - r0
    check("raw handle: last", host(rawp[-1].result()[0]), want[9])
    del pending, later, held, shared, awaited, rawp
    gc.collect()
    g.trim()  # (gives back what the handles dropped untaken left on the deferred list)
    snap = g.telemetry.snapshot()
    row["events_live"] = snap["events_live"]
    g.close()
    if lazy:
        fake.set_lazy(False)
    s.destroy()
    row["violations"] = fake.stats()["violations"]
    row["driver_events"] = fake.stats()["events"]
    res["on" if on else "off"] = row
res["errors"] = errors
print(json.dumps(res))
"""


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_completion_events_recorded_on_demand(fake_libcuda, tmp_path_factory, mode):
    seed = scenarios.seed()
    res = scenarios.run_child(["-c", CHILD, seed, mode], fake_libcuda, tmp_path_factory)
    assert res["errors"] == [], (seed, res)
    off, on = res["off"], res["on"]
    # off: one record per dispatch at enqueue, each result queries its own
    assert off["enqueue_records"] >= 40 and off["first_result_records"] == 0, (seed, res)
    # on: none at enqueue; the first result records one, which covers the other 39
    assert on["enqueue_records"] == 0, (seed, res)
    assert on["first_result_records"] == 1 and on["other_results_records"] == 0, (seed, res)
    # a dispatch enqueued after that fence records its own
    assert on["after_fence_records"] == 1, (seed, res)
    # a raw handle keeps the record at enqueue, knob or not
    assert on["raw_enqueue_records"] >= 10 and off["raw_enqueue_records"] >= 10, (seed, res)
    for row in (off, on):
        assert row["ready_while_held"] is False and row["ready_after"] is True, (seed, res)
        assert row["events_live"] == 0 and row["driver_events"] == 0 and row["violations"] == 0, (seed, row)
