"""Small-dispatch regression check: this tree against another build of vyre_cuda, same machine,
same run, interleaved (A B A B ...), each in its own interpreter. Prints medians and the ratio.

    python benchmarks/compare_small.py --other /path/to/other/checkout [--sizes 4096,65536]
    [--threads 8] (throughput of 8 threads on one backend: ns per dispatch of the whole)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
import numpy as np
import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
nbytes, iters, warmup, threads = (int(x) for x in sys.argv[1:5])
if os.environ.get("VYRE_BENCH_CPU"):
    os.sched_setaffinity(0, {int(os.environ["VYRE_BENCH_CPU"])})
n = nbytes // 4
rng = np.random.default_rng(1)
a = rng.standard_normal(n).astype(np.float32); b = rng.standard_normal(n).astype(np.float32)
prog = bp.vecadd_f32()
mode = os.environ.get("VYRE_CUDA_WAIT_MODE")  # (only for this tree's build)
with vc.CudaBackend(0) as g:
    if mode is not None:  # through this tree's benchmarks/harness/hooks.py, loaded by path
        import importlib.util
        spec = importlib.util.spec_from_file_location("bench_hooks", os.environ["VYRE_BENCH_HOOKS"])
        hooks = importlib.util.module_from_spec(spec); spec.loader.exec_module(hooks)
        hooks.set_knobs(g, wait_mode=int(mode))
    for _ in range(warmup):
        (out,) = g.dispatch(prog, [a, b])
    assert np.array_equal(out, a + b)
    pc = time.perf_counter_ns
    if threads > 1:
        # throughput of `threads` threads dispatching on one backend: ns per dispatch of the whole
        import threading
        start = threading.Barrier(threads + 1)
        def work():
            start.wait()
            for _ in range(iters):
                g.dispatch(prog, [a, b])
        ts = [threading.Thread(target=work) for _ in range(threads)]
        for t in ts:
            t.start()
        start.wait(); t0 = pc()
        for t in ts:
            t.join()
        per = (pc() - t0) // (iters * threads)
        print(json.dumps({"median_ns": per, "p10_ns": per, "file": vc.__file__}))
        sys.exit(0)
    times = []
    for _ in range(iters):
        t0 = pc(); g.dispatch(prog, [a, b]); times.append(pc() - t0)
times.sort()
print(json.dumps({"median_ns": times[len(times) // 2], "p10_ns": times[len(times) // 10], "file": vc.__file__}))
"""


def run(root: pathlib.Path, nbytes: int, iters: int, wait_mode=None, cpu=None, warmup=2000, threads=1) -> dict:
    env = dict(os.environ, PYTHONPATH=str(root))
    if cpu is not None:
        env["VYRE_BENCH_CPU"] = str(cpu)
    if wait_mode is not None:
        env["VYRE_CUDA_WAIT_MODE"] = str(wait_mode)
        env["VYRE_BENCH_HOOKS"] = str(pathlib.Path(__file__).resolve().parent / "harness" / "hooks.py")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(nbytes), str(iters), str(warmup), str(threads)],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, type=pathlib.Path)
    ap.add_argument("--sizes", default="4096")
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--cpu", type=int, default=None, help="pin every child to this CPU (same core for both builds)")
    ap.add_argument("--warmup", type=int, default=2000, help="untimed dispatches first")
    ap.add_argument("--threads", type=int, default=1, help="threads dispatching on one backend (throughput)")
    ap.add_argument("--wait-modes", default="", help="also time this tree with these wait modes (e.g. 1,2)")
    args = ap.parse_args(argv)
    here = pathlib.Path(__file__).resolve().parents[1]
    report = {}
    kw = dict(warmup=args.warmup, threads=args.threads)
    for nbytes in (int(s) for s in args.sizes.split(",")):
        mine, other = [], []
        modes = [int(x) for x in args.wait_modes.split(",") if x]
        variants = {m: [] for m in modes}
        for r in range(args.rounds):
            # alternate which build goes first, so neither always runs on a warmer machine
            first_mine = r % 2 == 0
            if first_mine:
                mine.append(run(here, nbytes, args.iterations, cpu=args.cpu, **kw)["median_ns"])
            other.append(run(args.other.resolve(), nbytes, args.iterations, cpu=args.cpu, **kw)["median_ns"])
            if not first_mine:
                mine.append(run(here, nbytes, args.iterations, cpu=args.cpu, **kw)["median_ns"])
            for mode in modes:
                variants[mode].append(run(here, nbytes, args.iterations, mode, cpu=args.cpu)["median_ns"])
        m, o = statistics.median(mine), statistics.median(other)
        paired = statistics.median(a / b for a, b in zip(mine, other))
        report[nbytes] = dict(
            this_ns=mine,
            other_ns=other,
            ratio=m / o,
            paired_ratio=paired,
            cpu=args.cpu,
            threads=args.threads,
            wait_modes=dict(variants),
        )
        for mode, values in variants.items():
            v = statistics.median(values)
            print(f"{nbytes:>9} B per buffer: wait mode {mode}: {v / 1e3:7.2f} us, ratio to other {v / o:.3f}")
        print(
            f"{nbytes:>9} B per buffer, {args.threads} thread(s): this {m / 1e3:7.2f} us, "
            f"other {o / 1e3:7.2f} us, ratio {m / o:.3f}, "
            f"median of paired rounds {paired:.3f}, cpu {args.cpu} "
            f"(rounds this {[round(x / 1e3, 2) for x in mine]}, other {[round(x / 1e3, 2) for x in other]})"
        )
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
