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
res = {"errors": [], "stream_creates": [], "live_mid": []}
for rnd in range(3):
    before = fake.stats()["stream_creates"]
    inputs = [(rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32))
              for _ in range(IN_FLIGHT)]
    pending = [g.dispatch_async(prog, [a, b]) for a, b in inputs]
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
    # four shared streams for the 120 in flight, one more for the timed dispatch (and the
    # blocking plan's own, at most); later rounds create none
    first, *later = res["stream_creates"]
    assert 5 <= first <= 7, res
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
