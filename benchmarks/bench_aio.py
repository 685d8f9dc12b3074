"""What ``await pending`` costs: against a blocking dispatch, and in CPU while a long kernel runs.

Two measurements, each printed as one JSON line:

* ``await_vs_blocking``: the built-in ``vecadd_f32`` on 3 x 4 KiB (1,024 float32 per buffer),
  ``backend.dispatch(...)`` against ``await backend.dispatch_async(...)`` inside a running event
  loop (one task, awaits in sequence), each sample timed alone, alternated in rounds so drift
  hits both alike; medians in microseconds and their ratio (target: <= 1.3). Repeated for each
  ``--inline`` window (``vyre_cuda._aio.INLINE_SPIN_S``: how long a lone await queries back to back
  before it yields to the loop), and with the ``_aio`` counters that say which phase ended the awaits.
* ``await_idle_cpu``: one kernel that spins ``--seconds`` on the GPU, awaited; the process's CPU
  seconds (every thread: ours, the driver's) per wall second while it runs (target: <= 0.02),
  beside the same kernel waited for with a blocking ``result()``, and the ``_aio`` counters
  (``parked`` 1, ``notified`` 1: woken by the host function, not found by polling).

On a GPU machine, after building the extensions::

    python benchmarks/bench_aio.py
    python benchmarks/bench_aio.py --rounds 40 --per-round 200 --inline 0 10e-6 20e-6 40e-6 --seconds 2
"""

from __future__ import annotations

import argparse
import asyncio
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
from vyre_cuda import BufferDecl, Kernel, Program, _aio  # noqa: E402
from vyre_cuda import builtin_programs as bp  # noqa: E402

N = 1024  # float32 per buffer: 4 KiB

# one block that spins for cycles[0] GPU clock cycles
_SPIN = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const unsigned long long* cycles, unsigned int* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) {
    const long long start = clock64();
    while (clock64() - start < (long long)cycles[0]) {
    }
    out[i] = 1u;
  }
}
"""
SPIN = Program(Kernel.cuda(_SPIN), [BufferDecl.read("cycles", 0, "u64", 1), BufferDecl.output("out", 1, "u32", 32)])


def await_vs_blocking(backend, rounds: int, per_round: int, inline: float) -> dict:
    prog = bp.vecadd_f32()
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
    (out,) = backend.dispatch(prog, [a, b])  # plans, compiles, warms the pools
    assert np.array_equal(out, a + b)
    blocking: list[int] = []
    awaited: list[int] = []

    async def await_round():
        for _ in range(per_round):
            t0 = time.perf_counter_ns()
            (got,) = await backend.dispatch_async(prog, [a, b])
            awaited.append(time.perf_counter_ns() - t0)
        assert np.array_equal(got, a + b)

    saved = _aio.INLINE_SPIN_S
    _aio.INLINE_SPIN_S = inline
    loop = asyncio.new_event_loop()
    before = _aio.stats()
    try:
        loop.run_until_complete(await_round())  # warm-up
        awaited.clear()
        for _ in range(rounds):
            for _ in range(per_round):
                t0 = time.perf_counter_ns()
                backend.dispatch(prog, [a, b])
                blocking.append(time.perf_counter_ns() - t0)
            loop.run_until_complete(await_round())
    finally:
        loop.close()
        _aio.INLINE_SPIN_S = saved
    after = _aio.stats()
    b_us, a_us = statistics.median(blocking) / 1e3, statistics.median(awaited) / 1e3
    return {
        "measure": "await_vs_blocking",
        "inline_spin_s": inline,
        "blocking_us": round(b_us, 2),
        "await_us": round(a_us, 2),
        "await_p90_us": round(sorted(awaited)[int(0.9 * len(awaited))] / 1e3, 2),
        "ratio": round(a_us / b_us, 3),
        "target": 1.3,
        "aio": {k: after[k] - before[k] for k in ("submitted", "inline", "spun", "parked", "notified", "polls")},
    }


def _cycles(backend, seconds: float) -> np.ndarray:
    # calibrate the spin on this GPU's clock with a short run
    short = np.array([20_000_000], np.uint64)
    backend.dispatch(SPIN, [short])
    t0 = time.perf_counter()
    backend.dispatch(SPIN, [short])
    per_cycle = (time.perf_counter() - t0) / short[0]
    return np.array([int(seconds / per_cycle)], np.uint64)


def await_idle_cpu(backend, seconds: float) -> dict:
    cycles = _cycles(backend, seconds)

    def blocking_run():
        return backend.dispatch_async(SPIN, [cycles]).result()

    async def awaited_run():
        return await backend.dispatch_async(SPIN, [cycles])

    rows = {}
    for name, fn in (("blocking_result", blocking_run), ("await", lambda: asyncio.run(awaited_run()))):
        before = _aio.stats()
        w0, c0 = time.perf_counter(), time.process_time()
        (out,) = fn()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        assert np.array_equal(out, np.ones(32, np.uint32))
        after = _aio.stats()
        rows[name] = {
            "wall_s": round(wall, 3),
            "cpu_per_wall": round(cpu / wall, 4),
            "aio": {k: after[k] - before[k] for k in ("parked", "notified", "backstops", "polls")},
        }
    return {"measure": "await_idle_cpu", "target": 0.02, **rows}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=200)
    parser.add_argument("--inline", type=float, nargs="+", default=[_aio.INLINE_SPIN_S, 0.0, 40e-6])
    parser.add_argument("--seconds", type=float, default=2.0, help="the long kernel's GPU time")
    args = parser.parse_args(argv)
    with vc.CudaBackend(0) as backend:
        for inline in args.inline:
            print(json.dumps(await_vs_blocking(backend, args.rounds, args.per_round, inline)), flush=True)
        print(json.dumps(await_idle_cpu(backend, args.seconds)), flush=True)


if __name__ == "__main__":
    main()
