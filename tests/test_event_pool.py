"""Completion events on the fake driver: a caller that keeps a few hundred dispatches in flight
before waiting reuses the events of the previous round instead of creating new ones, and every
result stays right."""

import json

import fakecuda

CHILD = r"""
import json, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp

fake = FakeDriver()
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
N, IN_FLIGHT = 256, 300
g = vc.CudaBackend(0)
a0 = rng.standard_normal(N).astype(np.float32)
fake.emulate(g, prog, [a0, a0], vecadd_emulation(np.float32))
res = {"errors": [], "event_creates": []}
for rnd in range(3):
    before = fake.stats()["event_creates"]
    inputs = [(rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32))
              for _ in range(IN_FLIGHT)]
    pending = [g.dispatch_async(prog, [a, b]) for a, b in inputs]
    for i, (p, (a, b)) in enumerate(zip(pending, inputs)):
        (out,) = p.result()
        if not np.array_equal(out, a + b):
            res["errors"].append(f"round {rnd}, dispatch {i}: wrong result")
    del pending
    res["event_creates"].append(fake.stats()["event_creates"] - before)
snap = g.telemetry.snapshot()
res["stats"] = {k: snap[k] for k in ("events_live", "events_created")}
g.close()
res["events_after_close"] = fake.stats()["events"]
res["violations"] = fake.stats()["violations"]
print(json.dumps(res))
"""


def test_events_of_a_round_in_flight_are_reused(fake_libcuda, rng):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [], res
    first, *later = res["event_creates"]
    # the first round creates one completion event per dispatch in flight; later rounds reuse them
    assert first >= 300, res
    assert later == [0, 0], res
    assert res["stats"]["events_live"] == 0, res
    # close destroys every cached event
    assert res["events_after_close"] == 0 and res["violations"] == 0, res
