"""Shared pool streams on the fake driver (``Knobs.stream_share_after``, off by default): once
that many dispatches hold pool streams, later ones share those streams, every result stays
right (also when the fake runs stream work as late as CUDA allows), timed dispatches keep a
stream of their own, and nothing is left live or undestroyed."""

import json

import fakecuda
import pytest

CHILD = r"""
import json, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp
from vyre_cuda._knobs import DEFAULT

fake = FakeDriver()
lazy = sys.argv[2] == "lazy"
share = int(sys.argv[3])
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
N, IN_FLIGHT = 256, 120
g = vc.CudaBackend(0)
g._use_knobs(DEFAULT.replace(stream_share_after=share))
a0 = rng.standard_normal(N).astype(np.float32)
fake.emulate(g, prog, [a0, a0], vecadd_emulation(np.float32))
if lazy:
    fake.set_lazy(True)
res = {"errors": [], "stream_creates": [], "live_mid": [], "blocking_creates": []}
for rnd in range(3):
    before = fake.stats()["stream_creates"]
    inputs = [(rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32))
              for _ in range(IN_FLIGHT)]
    pending = [g.dispatch_async(prog, [a, b]) for a, b in inputs]
    # a blocking dispatch waits on its stream, so it takes one of its own (others' work would keep
    # a shared one busy): the shared ones are all held, so in the first round it creates one
    made = fake.stats()["stream_creates"]
    (out,) = g.dispatch(prog, list(inputs[1]))
    res["blocking_creates"].append(fake.stats()["stream_creates"] - made)
    if not np.array_equal(out, inputs[1][0] + inputs[1][1]):
        res["errors"].append(f"round {rnd}: blocking dispatch wrong")
    timed = g.dispatch_timed(prog, list(inputs[0]))  # its own stream, shared or not
    if not np.array_equal(timed.outputs[0], inputs[0][0] + inputs[0][1]):
        res["errors"].append(f"round {rnd}: timed dispatch wrong")
    res["live_mid"].append(g.telemetry.snapshot()["streams_live"])
    # taken out of order: a later dispatch's result may not wait on an earlier one's
    for i in list(range(1, IN_FLIGHT, 2)) + list(range(0, IN_FLIGHT, 2)):
        a, b = inputs[i]
        (out,) = pending[i].result()
        if not np.array_equal(out, a + b):
            res["errors"].append(f"round {rnd}, dispatch {i}: wrong result")
    del pending
    res["stream_creates"].append(fake.stats()["stream_creates"] - before)
snap = g.telemetry.snapshot()
res["stats"] = {k: snap[k] for k in ("streams_live", "streams_created", "events_live")}
g.close()
res["streams_after_close"] = fake.stats()["streams"]
res["violations"] = fake.stats()["violations"]
print(json.dumps(res))
"""


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_dispatches_share_streams_past_the_knob(fake_libcuda, rng, mode):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed), mode, "4"], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [], res
    # four shared streams for the 120 in flight, one more for the blocking dispatch (which the
    # timed one then reuses; and the blocking plan's own, at most); later rounds create none
    first, *later = res["stream_creates"]
    assert 5 <= first <= 7, res
    assert res["blocking_creates"] == [1, 0, 0], res
    assert later == [0, 0], res
    assert res["live_mid"] == [120] * 3, res  # holders counted, not distinct streams
    assert res["stats"]["streams_live"] == 0 and res["stats"]["events_live"] == 0, res
    assert res["streams_after_close"] == 0 and res["violations"] == 0, res


def test_without_the_knob_each_dispatch_has_its_own_stream(fake_libcuda, rng):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed), "eager", "0"], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [], res
    assert res["stream_creates"][0] >= 120 and res["stream_creates"][1:] == [0, 0], res
    assert res["streams_after_close"] == 0 and res["violations"] == 0, res


THREADS_CHILD = r"""
import json, sys, threading
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp
from vyre_cuda._knobs import DEFAULT

sys.setswitchinterval(1e-6)
fake = FakeDriver()
if sys.argv[2] == "lazy":
    fake.set_lazy(True)
prog = bp.vecadd_f32()
g = vc.CudaBackend(0)
g._use_knobs(DEFAULT.replace(stream_share_after=3))
z = np.zeros(64, np.float32)
fake.emulate(g, prog, [z, z], vecadd_emulation(np.float32))
errors, checked = [], [0]

def work(seed):
    rng = np.random.default_rng(seed)
    for r in range(20):
        kept = []
        for i in range(16):
            a = rng.standard_normal(256).astype(np.float32)
            b = rng.standard_normal(256).astype(np.float32)
            h = g.dispatch_async(prog, [a, b])
            if rng.random() < 0.7:
                kept.append((h, a + b))
            del h  # (the rest are dropped: their work goes to the deferred list)
        if rng.random() < 0.2:
            g.trim()
        for h, want in kept:
            checked[0] += 1
            if not np.array_equal(h.result()[0], want):
                errors.append(f"seed {seed} round {r}: wrong result")
        (out,) = g.dispatch(prog, [a, b])
        if not np.array_equal(out, a + b):
            errors.append(f"seed {seed} round {r}: blocking dispatch wrong")

base = int(sys.argv[1])
threads = [threading.Thread(target=work, args=(base + k,)) for k in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
g.trim()
snap = g.telemetry.snapshot()
g.close()
print(json.dumps({"errors": errors[:5], "checked": checked[0], "streams_live": snap["streams_live"],
                  "events_live": snap["events_live"], "streams_after_close": fake.stats()["streams"],
                  "violations": fake.stats()["violations"]}))
"""


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_threads_share_streams_with_dropped_handles_and_trims(fake_libcuda, rng, mode):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", THREADS_CHILD, str(seed), mode], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [] and res["checked"] > 1000, res
    assert res["streams_live"] == 0 and res["events_live"] == 0, res
    assert res["streams_after_close"] == 0 and res["violations"] == 0, res
