"""What a program rebuilt per call costs against the same object, and what a genuine plan miss costs.

Three ways to dispatch the built-in ``vecadd_f32`` on 3 x 4 KiB (1,024 float32 per buffer), each
the median of many blocking dispatches, alternated in rounds so drift hits all alike:

* ``same``: the same Program object every time (one dict lookup, then C);
* ``rebuilt``: a different but equal Program object every time (built beforehand, past the
  interning of equal builds, as a build from non-plain arguments such as numpy integers gives
  one), which must hit the plan the first one made: the key compares equal programs by their
  fields;
* ``rebuild_and_dispatch``: the Program built inside the timed call from its parts, as a function
  that builds its program per call does (equal builds from plain arguments return the first
  build's object, so this pays for the build and no by-value comparison);
* ``miss``: a genuine plan miss every time (a new input length per dispatch, 1,024 + k elements),
  so the planning, preparing and inserting run each time (the kernel is compiled once).

Prints one JSON line: the medians in microseconds, ``rebuilt_vs_same`` (target: about 1.0, within
the noise) and ``miss_vs_same``, and the prepared-plan counts that prove the rebuilt dispatches
planned nothing. On a GPU machine, after building the extensions::

    python benchmarks/bench_plan_miss.py
    python benchmarks/bench_plan_miss.py --rounds 40 --per-round 100

It also runs on the fake driver of the tests (``LD_LIBRARY_PATH`` at its build folder), where the
host costs of planning are measured without a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(HERE.parent))

import numpy as np  # noqa: E402

import vyre_cuda as vc  # noqa: E402
from vyre_cuda import builtin_programs as bp  # noqa: E402

N = 1024  # float32 per buffer: 4 KiB


def _timed(fn) -> int:
    t0 = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t0


def measure(backend, rounds: int, per_round: int, misses: int) -> dict:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    same = bp.vecadd_f32()
    (out,) = backend.dispatch(same, [a, b])  # plans, compiles, warms the pools
    checked = bool(np.array_equal(out, a + b))
    plans_before = backend.telemetry.snapshot()["prepared_plans"]
    # distinct objects, all equal to `same`: the constructor run on its fields past the interning
    fields = [getattr(same, f.name) for f in dataclasses.fields(same)]
    equal = [type.__call__(vc.Program, *fields) for _ in range(per_round)]
    assert all(p == same and p is not same for p in equal)
    times: dict = {"same": [], "rebuilt": [], "rebuild_and_dispatch": []}
    cases = {
        "same": lambda _k: backend.dispatch(same, [a, b]),
        "rebuilt": lambda k: backend.dispatch(equal[k], [a, b]),
        "rebuild_and_dispatch": lambda _k: backend.dispatch(bp.vecadd_f32(), [a, b]),
    }
    order = list(cases)
    for r in range(rounds + 1):
        for name in order if r % 2 else order[::-1]:
            fn = cases[name]
            samples = [_timed(lambda k=k: fn(k)) for k in range(per_round)]
            if r:  # round 0 warms up
                times[name] += samples
    plans_after = backend.telemetry.snapshot()["prepared_plans"]
    # genuine misses: a new length each time (the core's plan table is bounded at 4,096 entries)
    miss = []
    for k in range(1, misses + 1):
        x, y = a[: N - k], b[: N - k]
        miss.append(_timed(lambda x=x, y=y: backend.dispatch(same, [x, y])))
    medians = {name: statistics.median(v) / 1e3 for name, v in times.items()}
    medians["miss"] = statistics.median(miss) / 1e3
    return {
        "bench": "plan_miss",
        "device": backend.caps.name if hasattr(backend, "caps") else "",
        "bytes_per_buffer": N * 4,
        "median_us": {k: round(v, 3) for k, v in medians.items()},
        "rebuilt_vs_same": round(medians["rebuilt"] / medians["same"], 3),
        "rebuild_and_dispatch_vs_same": round(medians["rebuild_and_dispatch"] / medians["same"], 3),
        "miss_vs_same": round(medians["miss"] / medians["same"], 3),
        "samples": {"per_case": rounds * per_round, "misses": misses},
        "prepared_plans_before_after_rebuilt": [plans_before, plans_after],
        "output_checked": checked,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--misses", type=int, default=500, help="genuine misses measured (< 1,024)")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    with vc.CudaBackend(args.device) as backend:
        result = measure(backend, args.rounds, args.per_round, min(args.misses, N - 1))
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
