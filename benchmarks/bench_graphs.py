"""Graph replay against issued launches, measured in the same run on the machine at hand.

Each case dispatches the same program with ``DispatchConfig(graph=True/None)`` and with
``graph=False`` (today's path: every launch issued), alternating the two in rounds so drift hits
both alike, and reports the medians of the blocking round trip (upload, launches, readback) and
their ratio:

* ``fixpoint100``: vecadd of 3 x 4 KiB with ``fixpoint_iterations=100``; target ratio <= 0.5
* ``bfs_split94``: the 2-phase BFS relaxation (tests/gpu/kernels/bfs.cu) forced host-split (grid
  one block over the resident limit), 47 iterations = 94 launches; target ratio <= 0.6
* ``single``: one vecadd launch of 3 x 4 KiB; no target: graphs help single launches only if
  this ratio is below 1 here (then set VYRE_CUDA_GRAPH_MIN_LAUNCHES=1)
* ``pipelined_updates``: fixpoint 100 with 12 dispatches in flight, more than the 8 execs a
  plan caches, so replays go through exec updates; informational (the cost of a cache miss)

On a GPU machine, after building the extensions::

    python benchmarks/bench_graphs.py --out benchmarks/results/graphs.json
    python benchmarks/bench_graphs.py --rounds 50 --only fixpoint100

Prints one line per case (medians in us, the ratio, the target and whether it is met) and writes
the same as JSON to ``--out``. Exit status 3 with ``--strict`` when a target is missed.

The physical limit, measured in the same run: each case also reports the GPU time of its launches
alone (events around them, ``dispatch_timed``), replayed and issued. Over the issued round trip,
the replayed launches' GPU time is the lowest ratio any host-side change could reach, with uploads
and readbacks free (``floor_ratio``): a target below it is out of reach for that case on the
machine at hand, and the line says so.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(HERE.parent))
if str(HERE.parent / "tests") not in sys.path:  # the BFS program of the tests (tests/helpers/bfs.py)
    sys.path.append(str(HERE.parent / "tests"))

import numpy as np  # noqa: E402
from helpers.bfs import INF, bfs_program  # noqa: E402

import vyre_cuda as vc  # noqa: E402
from benchmarks.harness import hooks as _hooks  # noqa: E402
from vyre_cuda import DispatchConfig  # noqa: E402
from vyre_cuda import builtin_programs as bp  # noqa: E402

TARGETS = {"fixpoint100": 0.5, "bfs_split94": 0.6}
COUNTERS = ("graph_replays", "graph_captures", "graph_updates", "graph_fallbacks", "launches")


def _median_pair(run_a, run_b, rounds: int, per_round: int) -> tuple:
    """Medians (ns) of run_a and run_b, alternated per round (a warm-up round first)."""
    times = {0: [], 1: []}
    for r in range(rounds + 1):
        for which, fn in ((0, run_a), (1, run_b)) if r % 2 else ((1, run_b), (0, run_a)):
            for _ in range(per_round):
                t0 = time.perf_counter_ns()
                fn()
                t = time.perf_counter_ns() - t0
                if r:  # round 0 warms plans, pools and graph execs
                    times[which].append(t)
    return statistics.median(times[0]), statistics.median(times[1])


def _counters(backend) -> dict:
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in COUNTERS}


def _case(backend, name, program, inputs, graph_cfg, issued_cfg, rounds, per_round, check=None):
    if check is not None:  # both paths must give the reference result before they are timed
        for cfg in (graph_cfg, issued_cfg):
            check(backend.dispatch(program, inputs, cfg), cfg)
    before = _counters(backend)
    graph_ns, issued_ns = _median_pair(
        lambda: backend.dispatch(program, inputs, graph_cfg),
        lambda: backend.dispatch(program, inputs, issued_cfg),
        rounds,
        per_round,
    )
    after = _counters(backend)
    ratio = graph_ns / issued_ns
    target = TARGETS.get(name)
    graph_gpu_ns = _launch_gpu_ns(backend, program, inputs, graph_cfg)
    return {
        "case": name,
        "graph_us": graph_ns / 1e3,
        "issued_us": issued_ns / 1e3,
        "ratio": ratio,
        "target": target,
        "met": None if target is None else ratio <= target,
        "graph_launch_gpu_us": graph_gpu_ns / 1e3,
        "issued_launch_gpu_us": _launch_gpu_ns(backend, program, inputs, issued_cfg) / 1e3,
        "floor_ratio": graph_gpu_ns / issued_ns,
        "plan": backend.plan_info(program, inputs, graph_cfg).graph_reason,
        "counters": {k: after[k] - before[k] for k in COUNTERS},
    }


def _launch_gpu_ns(backend, program, inputs, config, count=40) -> float:
    """Median GPU time of the dispatch's launches alone (events around them, ``dispatch_timed``):
    the part no way of issuing them can remove. Over the issued round trip it is the lowest ratio
    a graph replay (or anything else on the host side) could reach, uploads and readbacks free."""
    return statistics.median(backend.dispatch_timed(program, inputs, config).device_ns for _ in range(count))


def _bfs_graph(rng, n=20_000, degree=5, tail=120):
    """A random undirected graph with a path hanging off node n - tail - 1 (depth > 47)."""
    core = n - tail
    src = np.concatenate([rng.integers(0, core, core * degree), np.arange(core - 1, n - 1)])
    dst = np.concatenate([rng.integers(0, core, core * degree), np.arange(core, n)])
    s, d = np.concatenate([src, dst]), np.concatenate([dst, src])
    order = np.argsort(s, kind="stable")
    row_ptr = np.zeros(n + 1, np.uint32)
    row_ptr[1:] = np.cumsum(np.bincount(s, minlength=n))
    col_idx = np.ascontiguousarray(d[order], np.uint32)
    dist0 = np.full(n, INF, np.uint32)
    dist0[0] = 0
    return [row_ptr, col_idx, dist0]


def fixpoint100(backend, rng, rounds, per_round):
    prog = bp.vecadd_f32()
    a, b = (rng.standard_normal(1024).astype(np.float32) for _ in range(2))

    def check(outs, cfg):
        assert np.array_equal(outs[0], a + b), f"vecadd wrong under {cfg}"

    return _case(
        backend,
        "fixpoint100",
        prog,
        [a, b],
        DispatchConfig(fixpoint_iterations=100),  # graph=None: the planner's own choice
        DispatchConfig(fixpoint_iterations=100, graph=False),
        rounds,
        per_round,
        check,
    )


def bfs_split94(backend, rng, rounds, per_round):
    inputs = _bfs_graph(rng)
    prog = bfs_program(len(inputs[2]))
    limit = backend.plan_info(prog, inputs, DispatchConfig(fixpoint_iterations=47)).route.resident_limit
    grid = (limit + 1,)
    issued = DispatchConfig(fixpoint_iterations=47, grid_override=grid, graph=False)
    graphed = DispatchConfig(fixpoint_iterations=47, grid_override=grid)
    assert backend.plan_info(prog, inputs, graphed).route.kind == "split"
    reference = backend.dispatch(prog, inputs, issued)

    def check(outs, cfg):
        for got, want in zip(outs, reference):
            assert np.array_equal(got, want), f"BFS differs under {cfg}"

    return _case(backend, "bfs_split94", prog, inputs, graphed, issued, rounds, per_round, check)


def single(backend, rng, rounds, per_round):
    prog = bp.vecadd_f32()
    a, b = (rng.standard_normal(1024).astype(np.float32) for _ in range(2))

    def check(outs, cfg):
        assert np.array_equal(outs[0], a + b), f"vecadd wrong under {cfg}"

    return _case(
        backend,
        "single",
        prog,
        [a, b],
        DispatchConfig(graph=True),
        DispatchConfig(graph=False),
        rounds,
        per_round,
        check,
    )


def single_auto(backend, rng, rounds, per_round):
    """The default for one launch: the plan's trial (its first blocking dispatches alternate a
    replay and issued launches) keeps the faster; then timed against both forced paths."""
    prog = bp.vecadd_f32()
    a, b = (rng.standard_normal(1024).astype(np.float32) for _ in range(2))
    auto = DispatchConfig(label="single-auto")  # graph=None: a fresh plan, so a fresh trial
    key = (prog, auto, a.nbytes, b.nbytes)
    backend.dispatch(prog, [a, b], auto)
    prep = _hooks.prepared_plan(backend, key)
    while prep.graph_trial_left:
        (out,) = backend.dispatch(prog, [a, b], auto)
        assert np.array_equal(out, a + b)
    forced = {"graph": DispatchConfig(graph=True), "issued": DispatchConfig(graph=False)}
    auto_ns, graph_ns = _median_pair(
        lambda: backend.dispatch(prog, [a, b], auto),
        lambda: backend.dispatch(prog, [a, b], forced["graph"]),
        rounds,
        per_round,
    )
    auto2_ns, issued_ns = _median_pair(
        lambda: backend.dispatch(prog, [a, b], auto),
        lambda: backend.dispatch(prog, [a, b], forced["issued"]),
        rounds,
        per_round,
    )
    best = min(graph_ns, issued_ns)
    auto_med = statistics.median([auto_ns, auto2_ns])
    return {
        "case": "single_auto",
        "graph_us": auto_med / 1e3,
        "issued_us": issued_ns / 1e3,
        "forced_graph_us": graph_ns / 1e3,
        "ratio": auto_med / issued_ns,
        "ratio_to_best": auto_med / best,
        "target": TARGETS.get("single_auto"),
        "met": None if TARGETS.get("single_auto") is None else auto_med / issued_ns <= TARGETS["single_auto"],
        "plan": prep.graph_choice,
        "counters": {},
    }


def pipelined_updates(backend, rng, rounds, per_round):
    prog = bp.vecadd_f32()
    pairs = [[rng.standard_normal(1024).astype(np.float32) for _ in range(2)] for _ in range(12)]

    def run(cfg):
        pending = [backend.dispatch_async(prog, ab, cfg) for ab in pairs]
        for (a, b), p in zip(pairs, pending):
            (out,) = p.result()
            assert np.array_equal(out, a + b)

    graph_cfg = DispatchConfig(fixpoint_iterations=100, graph=True)
    issued_cfg = DispatchConfig(fixpoint_iterations=100, graph=False)
    before = _counters(backend)
    graph_ns, issued_ns = _median_pair(lambda: run(graph_cfg), lambda: run(issued_cfg), rounds, max(1, per_round // 4))
    after = _counters(backend)
    return {
        "case": "pipelined_updates",
        "graph_us": graph_ns / 1e3 / len(pairs),
        "issued_us": issued_ns / 1e3 / len(pairs),
        "ratio": graph_ns / issued_ns,
        "target": None,
        "met": None,
        "plan": "12 dispatches in flight, 8 execs cached per plan",
        "counters": {k: after[k] - before[k] for k in COUNTERS},
    }


CASES = collections.OrderedDict(
    fixpoint100=fixpoint100,
    bfs_split94=bfs_split94,
    single=single,
    single_auto=single_auto,
    pipelined_updates=pipelined_updates,
)


def _floor_text(res) -> str:
    if "floor_ratio" not in res:
        return ""
    text = (
        f"  (launches alone on the GPU: {res['graph_launch_gpu_us']:.1f} us replayed, "
        f"{res['issued_launch_gpu_us']:.1f} us issued; lowest reachable ratio {res['floor_ratio']:.3f}"
    )
    if res["target"] is not None and res["floor_ratio"] > res["target"]:
        text += ": the target is below this case's physical limit here"
    return text + ")"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench_graphs.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results" / "graphs.json")
    parser.add_argument("--rounds", type=int, default=30, help="alternating rounds per case (default 30)")
    parser.add_argument("--per-round", type=int, default=10, help="dispatches per path per round (default 10)")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=sorted(CASES), action="append", help="run these cases only")
    parser.add_argument("--strict", action="store_true", help="exit with status 3 when a target is missed")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    results = []
    with vc.CudaBackend(args.device) as backend:
        for name in args.only or CASES:
            res = CASES[name](backend, rng, args.rounds, args.per_round)
            results.append(res)
            target = (
                "" if res["target"] is None else f"  target <= {res['target']}: {'met' if res['met'] else 'MISSED'}"
            )
            print(
                f"{name:18s} graph {res['graph_us']:9.1f} us  issued {res['issued_us']:9.1f} us  "
                f"ratio {res['ratio']:.3f}{target}{_floor_text(res)}   [{res['plan']}; {res['counters']}]",
                flush=True,
            )
        device = backend.caps.name
    single_res = next((r for r in results if r["case"] == "single"), None)
    if single_res is not None:
        verdict = "faster" if single_res["ratio"] < 0.98 else "not faster (beyond 2% noise)"
        print(f"single launch: a graph is {verdict} on this machine (ratio {single_res['ratio']:.3f})")
    auto_res = next((r for r in results if r["case"] == "single_auto"), None)
    if auto_res is not None:
        ok = auto_res["ratio_to_best"] <= 1.05
        print(
            f"single launch, default: {auto_res['plan']}; its time / the faster forced path "
            f"{auto_res['ratio_to_best']:.3f} (never regress: <= 1.05: {'met' if ok else 'MISSED'})"
        )
        auto_res["never_regress_met"] = ok
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": device, "seed": args.seed, "results": results}, indent=2) + "\n")
    print(f"wrote {args.out}")
    missed = [r["case"] for r in results if r["met"] is False]
    return 3 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
