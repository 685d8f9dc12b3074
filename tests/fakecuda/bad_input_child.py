"""Child of tests/test_bad_input.py: every dispatch case on a CudaBackend over the fake driver.

The backend is real (pools, streams, events, enqueue), and it has dispatched before the cases
run, so its pools hold cached allocations and its counters are non-zero: a refusal that touched
a pool, a stream or an event would show. After each case a good dispatch must be correct and
must move the counters (proving they can move). Prints one JSON object: case id -> record.
"""

from __future__ import annotations

import base64
import json
import pickle
import sys

import numpy as np
import test_bad_input as cases

import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation

# fake-driver counters a refusal must leave as they were (module loads may happen while planning)
FAKE_KEYS = (
    "device_allocs",
    "device_bytes",
    "host_allocs",
    "host_bytes",
    "streams",
    "events",
    "launches",
    "cooperative_launches",
    "htod_copies",
    "dtoh_copies",
    "memsets",
    "device_alloc_calls",
    "host_alloc_calls",
    "stream_creates",
    "event_creates",
    "violations",
)


def pick(d, keys):
    return {k: d[k] for k in keys}


def encode_error(err):
    if err is None:
        return None
    try:
        blob = base64.b64encode(pickle.dumps(err)).decode()
    except Exception:  # noqa: BLE001 (reported as text instead)
        blob = None
    return {"pickle": blob, "type": type(err).__name__, "text": str(err)}


def main(seed: int) -> None:
    fake = FakeDriver()
    rng = np.random.default_rng(seed)
    backend = vc.CudaBackend(0)
    a, b = cases.standard_inputs(rng)
    fake.emulate(backend, cases.VECADD, [a, b], vecadd_emulation(np.float32))

    def good_dispatch():
        x, y = cases.standard_inputs(rng)
        (out,) = backend.dispatch(cases.VECADD, [x, y])
        return bool(np.array_equal(out, x + y))

    warm = good_dispatch() and good_dispatch()
    snap = backend.telemetry.snapshot()
    records = {
        "_warm": {
            "ok": warm,
            "pool": pick(snap, cases.POOL_KEYS),
            "fake": fake.stats(),
        }
    }
    for case in cases.DISPATCH_CASES:
        before = pick(backend.telemetry.snapshot(), cases.POOL_KEYS)
        fake_before = pick(fake.stats(), FAKE_KEYS)
        refs = (sys.getrefcount(a), sys.getrefcount(b))
        err = cases.raised(case.call, backend, a, b)
        after = pick(backend.telemetry.snapshot(), cases.POOL_KEYS)
        fake_after = pick(fake.stats(), FAKE_KEYS)
        refs_after = (sys.getrefcount(a), sys.getrefcount(b))
        lost = backend.lost
        dispatches = backend.telemetry.snapshot()["dispatches"]
        ok = good_dispatch() if not lost else False
        good = backend.telemetry.snapshot()
        records[case.id] = {
            "error": encode_error(err),
            "pool_before": before,
            "pool_after": after,
            "fake_before": fake_before,
            "fake_after": fake_after,
            "refs": [list(refs), list(refs_after)],
            "lost": lost,
            "next_ok": ok,
            "next_dispatches": good["dispatches"] - dispatches,
            "next_pool_hits": good["device_pool_hits"] - snap["device_pool_hits"],
            "violation": fake.last_violation(),
        }
        snap = good
    records["_hook_errors"] = fake.hook_errors
    backend.close()
    records["_closed"] = fake.stats()
    print(json.dumps(records))


if __name__ == "__main__":
    main(int(sys.argv[1]))
