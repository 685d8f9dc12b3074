"""The telemetry's copy counts each way are the copies the driver saw.

A blocking dispatch issues, waits and copies out in one GIL release; its upload's counts must not
take in the readback's copies (they once did: a blocking ring dispatch showed every copy as an
upload and no readback at all). Each route and each way of taking the result is checked against
the fake driver's own count of H2D and D2H copies, on fresh random data.
"""

from __future__ import annotations

from helpers import scenarios

CHILD = r"""
import json, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import builtin_programs as bp

fake = FakeDriver()
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
backend = vc.CudaBackend(0)
fake.emulate(backend, prog, [np.zeros(4, np.float32)] * 2, vecadd_emulation(np.float32))
rows = []
for n in (1000, 196_608, 1_500_000):  # the mirror, the staging ring, several ring windows
    for mode in ("blocking", "async", "timed"):
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        backend.dispatch(prog, [a, b])  # (the first one plans and uploads the params)
        t0, f0 = backend.telemetry.snapshot(), fake.stats()
        if mode == "blocking":
            (out,) = backend.dispatch(prog, [a, b])
        elif mode == "async":
            (out,) = backend.dispatch_async(prog, [a, b]).result()
        else:
            out = backend.dispatch_timed(prog, [a, b]).outputs[0]
        t1, f1 = backend.telemetry.snapshot(), fake.stats()
        rows.append({
            "n": n, "mode": mode, "right": bool(np.array_equal(out, a + b)),
            "h2d_ops": t1["h2d_ops"] - t0["h2d_ops"], "d2h_ops": t1["d2h_ops"] - t0["d2h_ops"],
            "htod_copies": f1["htod_copies"] - f0["htod_copies"],
            "dtoh_copies": f1["dtoh_copies"] - f0["dtoh_copies"],
        })
backend.close()
print(json.dumps(rows))
"""


def test_copy_counts_each_way_are_the_drivers(fake_libcuda, tmp_path_factory):
    rows = scenarios.run_child(["-c", CHILD, scenarios.seed()], fake_libcuda, tmp_path_factory, timeout=300)
    assert len(rows) == 9
    for row in rows:
        assert row["right"], row
        assert row["d2h_ops"] >= 1 and row["h2d_ops"] >= 1, row
        assert row["h2d_ops"] == row["htod_copies"], row
        assert row["d2h_ops"] == row["dtoh_copies"], row
