"""What tracing costs per dispatch, and what autotune gains, measured in one run.

    python benchmarks/bench_tracing.py [--iters 20000] [--elements 16777216]

Host cost: a 4 KiB ``vecadd_f32`` dispatch (and dispatch_async + result) on three backends of
one process, untraced, ``trace="nvtx"`` (no tool attached: the NVTX calls are no-ops) and
``trace="log"`` (the vyre_cuda logger at WARNING, so the line is formatted but not emitted),
interleaved in rounds; medians and ratios to untraced. Whether untraced dispatch regressed
against another tree is ``benchmarks/compare_small.py --other <checkout>``.

Autotune: ``CudaBackend.tune(..., force=True)`` on ``vecadd_f32`` of ``--elements`` elements and on
``vecadd_f16``; the median device time per block width and the winner's speedup over the
declared width (256). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import numpy as np

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp


def _host_cost(iters: int) -> dict:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(1024).astype(np.float32), rng.standard_normal(1024).astype(np.float32)
    prog = bp.vecadd_f32()
    logging.getLogger("vyre_cuda").setLevel(logging.WARNING)
    backends = {mode: vc.CudaBackend(0, trace=mode) for mode in (False, "nvtx", "log")}
    samples: dict = {(mode, kind): [] for mode in backends for kind in ("dispatch", "async")}
    pc = time.perf_counter_ns
    try:
        for g in backends.values():
            for _ in range(2000):
                (out,) = g.dispatch(prog, [a, b])
                g.dispatch_async(prog, [a, b]).result()
            assert np.array_equal(out, a + b)
        rounds = 20
        for _ in range(rounds):
            for mode, g in backends.items():
                d, s = samples[(mode, "dispatch")], samples[(mode, "async")]
                for _ in range(iters // rounds):
                    t0 = pc()
                    g.dispatch(prog, [a, b])
                    d.append(pc() - t0)
                for _ in range(iters // rounds // 4):
                    t0 = pc()
                    g.dispatch_async(prog, [a, b]).result()
                    s.append(pc() - t0)
    finally:
        for g in backends.values():
            g.close()
    out = {}
    for kind in ("dispatch", "async"):
        base = statistics.median(samples[(False, kind)])
        for mode in backends:
            med = statistics.median(samples[(mode, kind)])
            out[f"{kind}_{mode or 'untraced'}_median_us"] = round(med / 1000, 2)
            if mode:
                out[f"{kind}_{mode}_ratio"] = round(med / base, 3)
    return out


def _autotune(elements: int) -> dict:
    rng = np.random.default_rng(2)
    out = {}
    with vc.CudaBackend(0) as g:
        for name, prog, dtype in (
            ("vecadd_f32", bp.vecadd("f32"), np.float32),
            ("vecadd_f16", bp.vecadd("f16"), np.float16),
        ):
            a, b = (rng.standard_normal(elements).astype(dtype) for _ in range(2))
            result = g.tune(prog, [a, b], force=True, repeats=9)
            out[name] = {
                "device_us_per_width": {w: round(ns / 1000, 2) for w, ns in sorted(result.timings_ns.items())},
                "winner": result.block,
                "speedup_vs_256": round(result.speedup, 3),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--elements", type=int, default=1 << 24)
    args = parser.parse_args()
    result = {"nvtx_compiled_in": vc.tracing.nvtx_available(), **_host_cost(args.iters)}
    result["autotune"] = _autotune(args.elements)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
