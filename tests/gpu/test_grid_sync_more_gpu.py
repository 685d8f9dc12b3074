"""Grid-sync programs on the GPU, beyond the scan: a BFS relaxation that needs fixpoint iterations,
the residency boundary (preflight and router agree at R and R + 1 blocks), forced cooperative
launches over residency, concurrent dispatches of one module, and route parity of every entry point.

Run with ``-s`` (or read scripts/gpu-check's log): lines starting ``[grid-sync]`` report the
measured resident limits and the cooperative vs split launch counters.
"""

import threading
from dataclasses import dataclass

import numpy as np
import pytest
from helpers.bfs import INF, bfs_program, make_graph

from vyre_cuda import CooperativeResidencyExceeded, DispatchConfig, Program
from vyre_cuda import builtin_programs as bp

SCAN_BLOCK = 256

# counters that move when anything is enqueued (or a plan is cached)
ENQUEUE_COUNTERS = (
    "dispatches",
    "launches",
    "cooperative_launches",
    "split_launches",
    "h2d_ops",
    "d2h_ops",
    "memset_ops",
    "param_upload_bytes",
    "transient_alloc_bytes",
    "failed_dispatches",
    "device_pool_hits",
    "device_pool_misses",
    "pinned_pool_hits",
    "pinned_pool_misses",
    "prepared_plans",
)


def _report(capsys, line):
    with capsys.disabled():
        print(f"\n[grid-sync] {line}", flush=True)


def _delta(before, after, *names):
    return {k: after[k] - before[k] for k in names}


# ----------------------------------------------------------------------------- cases
@dataclass
class Case:
    """A grid-sync program, its inputs, its expected outputs and its launch shape."""

    name: str
    prog: Program
    inputs: list
    expected: list
    phases: int
    iterations: int = 1

    def config(self, **kw):
        if self.iterations > 1:
            kw["fixpoint_iterations"] = self.iterations
        return DispatchConfig(**kw)

    def check(self, outs, what=""):
        assert len(outs) == len(self.expected), what
        for k, (got, want) in enumerate(zip(outs, self.expected)):
            assert got.dtype == want.dtype, f"{what} output {k}"
            np.testing.assert_array_equal(got, want, err_msg=f"{self.name} {what} output {k}")


_SCAN_PROG = None


def _scan_prog():
    global _SCAN_PROG
    if _SCAN_PROG is None:
        _SCAN_PROG = bp.inclusive_scan_u32(SCAN_BLOCK)
    return _SCAN_PROG


def scan_expected(x):
    """[y, tile_sums]: the scan and the scanned tile totals (zero past the last tile)."""
    n = len(x)
    y = np.cumsum(x, dtype=np.uint32)
    tiles = (n + SCAN_BLOCK - 1) // SCAN_BLOCK
    tile_sums = np.zeros(n, dtype=np.uint32)
    ends = np.minimum((np.arange(tiles) + 1) * SCAN_BLOCK, n) - 1
    tile_sums[:tiles] = y[ends]
    return [y, tile_sums]


def make_case(kind, rng):
    if kind == "scan":
        x = rng.integers(0, 1000, 1_000_003, dtype=np.uint32)
        return Case("scan", _scan_prog(), [x], scan_expected(x), phases=3)
    g = make_graph(rng, n=4000, tail=40, unreachable=4)
    k = g.depth + 1
    return Case("bfs", bfs_program(g.n), g.inputs, g.expected(k), phases=2, iterations=k)


def _resident_limit(backend, case):
    info = backend.plan_info(case.prog, case.inputs, case.config())
    limit = info.route.resident_limit
    assert limit > 0, info.route
    return limit


# ----------------------------------------------------------------------------- BFS
def test_bfs_needs_fixpoint_iterations_on_both_routes(backend, rng, capsys):
    g = make_graph(rng)
    prog = bfs_program(g.n)
    assert g.depth >= 300, g.depth  # the path makes the graph deep
    assert np.count_nonzero(g.ref == INF) >= 6  # and some nodes unreachable
    dist0_before = g.dist0.copy()
    R = _resident_limit(backend, Case("bfs", prog, g.inputs, [], 2))
    coop_grid = min(R, 37)  # 37 x 256 threads < 20,000 nodes: the grid-stride loops matter
    routes = {"cooperative": coop_grid, "split": R + 1}

    results = {}
    for k in (g.depth + 1, g.depth, g.depth - 1, 3):
        want = g.expected(k)
        per_route = {}
        for kind, grid in routes.items():
            cfg = DispatchConfig(grid_override=(grid,), fixpoint_iterations=k)
            assert backend.plan_info(prog, g.inputs, cfg).route.kind == kind
            assert backend.cooperative_grid_sync_fits(prog, g.inputs, cfg) is (kind == "cooperative")
            before = backend.telemetry.snapshot()
            outs = backend.dispatch(prog, g.inputs, cfg)
            d = _delta(before, backend.telemetry.snapshot(), "cooperative_launches", "split_launches", "launches")
            if kind == "cooperative":
                assert d == {"cooperative_launches": k, "split_launches": 0, "launches": k}
            else:
                assert d == {"cooperative_launches": 0, "split_launches": 2 * k, "launches": 2 * k}
            for j, (got, exp) in enumerate(zip(outs, want)):
                np.testing.assert_array_equal(got, exp, err_msg=f"{kind} route, {k} iterations, output {j}")
            per_route[kind] = outs
        for a, b in zip(per_route["cooperative"], per_route["split"]):
            np.testing.assert_array_equal(a, b)
        results[k] = per_route["cooperative"]

    dist_full, _, state_full = results[g.depth + 1]
    np.testing.assert_array_equal(dist_full, g.ref)
    assert state_full[1] == 0  # the last iteration changed nothing: converged
    np.testing.assert_array_equal(results[g.depth][0], g.ref)
    assert results[g.depth][2][1] == 1  # correct, but convergence not yet observed
    for short in (g.depth - 1, 3):  # too few iterations: not converged, the far nodes still INF
        assert not np.array_equal(results[short][0], g.ref)
        assert results[short][2][1] == 1
        assert np.all(results[short][0][g.ref > short] == INF)

    # the natural grid, whatever its route, converges as well
    cfg = DispatchConfig(fixpoint_iterations=g.depth + 1)
    (dist, _, state) = backend.dispatch(prog, g.inputs, cfg)
    np.testing.assert_array_equal(dist, g.ref)
    assert list(state) == [g.depth + 1, 0, int(np.count_nonzero((g.ref >= 1) & (g.ref != INF)))]
    np.testing.assert_array_equal(g.dist0, dist0_before)  # the borrowed input is never written
    _report(
        capsys,
        f"bfs: {g.n} nodes, {len(g.col_idx)} directed edges, depth {g.depth}, "
        f"resident limit {R}, cooperative grid {coop_grid}, split grid {R + 1}",
    )


def test_bfs_matches_python_bfs_on_random_small_graphs(backend, rng):
    for n, tail in ((600, 0), (1500, 25), (3000, 70)):
        g = make_graph(rng, n=n, degree=2, tail=tail, unreachable=3)
        prog = bfs_program(g.n)
        R = _resident_limit(backend, Case("bfs", prog, g.inputs, [], 2))
        for grid in (1, min(R, 5), R, R + 1):
            cfg = DispatchConfig(grid_override=(grid,), fixpoint_iterations=g.depth + 1)
            (dist, nxt, state) = backend.dispatch(prog, g.inputs, cfg)
            np.testing.assert_array_equal(dist, g.ref, err_msg=f"n={n} grid={grid}")
            np.testing.assert_array_equal(nxt, g.ref)
            assert state[0] == g.depth + 1 and state[1] == 0


# ----------------------------------------------------------------------------- boundary
@pytest.mark.parametrize("kind", ["scan", "bfs"])
def test_residency_boundary_preflight_and_route_agree(backend, rng, capsys, kind):
    case = make_case(kind, rng)
    R = _resident_limit(backend, case)
    it, ph = case.iterations, case.phases
    tel = backend.telemetry
    counts = {}

    # R blocks: fits, cooperative, one cooperative launch per iteration, barrier reset each time
    at = case.config(grid_override=(R,))
    assert backend.cooperative_grid_sync_fits(case.prog, case.inputs, at) is True
    info = backend.plan_info(case.prog, case.inputs, at)
    assert info.route.kind == "cooperative" and info.route.grid_blocks == R and info.route.resident_limit == R
    # outputs are cleared by one device memset, unless small enough to ride the upload as zeros
    clears = 1 if info.layout.clear[1] > info.layout.clear[0] else 0
    before = tel.snapshot()
    case.check(backend.dispatch(case.prog, case.inputs, at), f"grid {R} (cooperative)")
    d = _delta(before, tel.snapshot(), "cooperative_launches", "split_launches", "launches", "memset_ops", "dispatches")
    assert d == {
        "cooperative_launches": it,
        "split_launches": 0,
        "launches": it,
        "memset_ops": clears + it,
        "dispatches": 1,
    }
    counts["R"] = d

    # R + 1 blocks: does not fit, host split, each phase its own launch, no barrier resets
    over = case.config(grid_override=(R + 1,))
    assert backend.cooperative_grid_sync_fits(case.prog, case.inputs, over) is False
    info = backend.plan_info(case.prog, case.inputs, over)
    assert info.route.kind == "split" and info.route.grid_blocks == R + 1 and info.route.resident_limit == R
    before = tel.snapshot()
    case.check(backend.dispatch(case.prog, case.inputs, over), f"grid {R + 1} (split)")
    d = _delta(before, tel.snapshot(), "cooperative_launches", "split_launches", "launches", "memset_ops", "dispatches")
    assert d == {
        "cooperative_launches": 0,
        "split_launches": ph * it,
        "launches": ph * it,
        "memset_ops": clears,
        "dispatches": 1,
    }
    counts["R+1"] = d

    # forced cooperative at R runs; at R + 1 it is refused before anything is enqueued
    forced = case.config(grid_override=(R,), cooperative=True)
    assert backend.plan_info(case.prog, case.inputs, forced).route.kind == "cooperative"
    case.check(backend.dispatch(case.prog, case.inputs, forced), "cooperative=True at R")
    forced_over = case.config(grid_override=(R + 1,), cooperative=True)
    before = tel.snapshot()
    calls = {
        "dispatch": lambda: backend.dispatch(case.prog, case.inputs, forced_over),
        "dispatch_async": lambda: backend.dispatch_async(case.prog, case.inputs, forced_over),
        "dispatch_into": lambda: backend.dispatch_into(
            case.prog, case.inputs, [np.empty_like(e) for e in case.expected], forced_over
        ),
        "dispatch_timed": lambda: backend.dispatch_timed(case.prog, case.inputs, forced_over),
        "plan_info": lambda: backend.plan_info(case.prog, case.inputs, forced_over),
    }
    for name, call in calls.items():
        with pytest.raises(CooperativeResidencyExceeded) as exc_info:
            call()
        err = exc_info.value
        assert (err.grid_blocks, err.resident_limit) == (R + 1, R), name
        assert "Fix:" in str(err)
    after = tel.snapshot()
    assert {k: after[k] for k in ENQUEUE_COUNTERS} == {k: before[k] for k in ENQUEUE_COUNTERS}

    caps = backend.caps
    _report(
        capsys,
        f"{kind}: resident limit R={R} blocks of {info.launch.threads_per_block} threads "
        f"({R // caps.sm_count} blocks/SM x {caps.sm_count} SMs, {caps.name}); "
        f"grid R -> {counts['R']}; grid R+1 -> {counts['R+1']}",
    )


# ----------------------------------------------------------------------------- concurrency
def test_concurrent_cooperative_dispatches_of_one_module(backend, rng, capsys):
    prog = _scan_prog()
    threads_n, per_thread = 4, 20
    sizes = [50_000 + 1237 * t for t in range(threads_n)]
    R = backend.plan_info(prog, [np.zeros(sizes[0], np.uint32)]).route.resident_limit
    natural_fits = (sizes[-1] + SCAN_BLOCK - 1) // SCAN_BLOCK <= R
    # four plans (natural and overridden grids) of one module: the gate is per module, not per plan
    configs = [
        None if natural_fits else DispatchConfig(grid_override=(R,)),
        DispatchConfig(grid_override=(min(48, R),)),
        DispatchConfig(grid_override=(R,)),
        DispatchConfig(grid_override=(min(17, R),)),
    ]
    keys = set()
    for n, cfg in zip(sizes, configs):
        info = backend.plan_info(prog, [np.zeros(n, np.uint32)], cfg)
        assert info.route.kind == "cooperative", info.route
        keys.add(info.kernel.key)
    assert len(keys) == 1  # one module, one barrier counter, shared by every thread
    seeds = rng.integers(0, 2**32, threads_n)
    errors = []
    done = [0] * threads_n
    start = threading.Barrier(threads_n)

    def worker(t):
        try:
            r = np.random.default_rng(int(seeds[t]))
            n, cfg = sizes[t], configs[t]
            start.wait(timeout=60)
            for i in range(per_thread):
                x = r.integers(0, 1000, n, dtype=np.uint32)
                want = scan_expected(x)
                entry = (t + i) % 4
                if entry == 0:
                    outs = backend.dispatch(prog, [x], cfg)
                elif entry == 1:
                    pending = backend.dispatch_async(prog, [x], cfg)
                    assert pending.route == "cooperative"
                    outs = pending.result()
                elif entry == 2:
                    outs = backend.dispatch_into(prog, [x], [np.empty(n, np.uint32), np.empty(n, np.uint32)], cfg)
                else:
                    outs = backend.dispatch_timed(prog, [x], cfg).outputs
                for k in range(2):
                    if not np.array_equal(outs[k], want[k]):
                        bad = int(np.flatnonzero(outs[k] != want[k])[0])
                        errors.append(f"thread {t} dispatch {i} output {k}: first mismatch at {bad}")
                        return
                done[t] += 1
        except BaseException as exc:  # noqa: BLE001 (reported below, the thread must not die silently)
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    before = backend.telemetry.snapshot()
    workers = [threading.Thread(target=worker, args=(t,), daemon=True, name=f"coop-{t}") for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    alive = [w.name for w in workers if w.is_alive()]
    assert not alive, f"threads still running after 120 s (hang?): {alive}; done={done}"
    assert not errors, errors
    assert done == [per_thread] * threads_n
    total = threads_n * per_thread
    d = _delta(
        before,
        backend.telemetry.snapshot(),
        "dispatches",
        "cooperative_launches",
        "split_launches",
        "failed_dispatches",
    )
    assert d == {"dispatches": total, "cooperative_launches": total, "split_launches": 0, "failed_dispatches": 0}
    _report(capsys, f"concurrency: {threads_n} threads x {per_thread} cooperative scans of one module -> {d}")


# ----------------------------------------------------------------------------- entry-point parity
def _entry_points(backend, case, cfg, route):
    """(name, call) for every way to run a dispatch and get its outputs."""
    prog, inputs = case.prog, case.inputs

    def via_async():
        pending = backend.dispatch_async(prog, inputs, cfg)
        assert pending.route == route
        return pending.result()

    def via_async_timed():
        pending = backend.dispatch_async(prog, inputs, cfg, timed=True)
        assert pending.route == route
        res = pending.timed_result()
        assert res.device_ns > 0
        return res.outputs

    def via_async_into():
        pending = backend.dispatch_async(prog, inputs, cfg)
        assert pending.route == route
        return pending.result_into([np.empty_like(e) for e in case.expected])

    def via_into():
        outs = [np.empty_like(e) for e in case.expected]
        got = backend.dispatch_into(prog, inputs, outs, cfg)
        assert all(a is b for a, b in zip(got, outs))
        return outs

    def via_timed():
        res = backend.dispatch_timed(prog, inputs, cfg)
        assert res.device_ns > 0 and res.wall_ns >= res.enqueue_ns
        return res.outputs

    return [
        ("dispatch", lambda: backend.dispatch(prog, inputs, cfg)),
        ("dispatch_async().result()", via_async),
        ("dispatch_async(timed=True).timed_result()", via_async_timed),
        ("dispatch_async().result_into()", via_async_into),
        ("dispatch_into", via_into),
        ("dispatch_timed", via_timed),
    ]


@pytest.mark.parametrize("kind", ["scan", "bfs"])
def test_every_entry_point_routes_the_same(backend, rng, kind):
    case = make_case(kind, rng)
    R = _resident_limit(backend, case)
    it, ph = case.iterations, case.phases
    by_route = {}
    for route, grid in (("cooperative", max(1, R // 2)), ("split", R + 1)):
        cfg = case.config(grid_override=(grid,))
        assert backend.plan_info(case.prog, case.inputs, cfg).route.kind == route
        want = {"cooperative": (it, 0), "split": (0, ph * it)}[route]
        results = []
        for name, call in _entry_points(backend, case, cfg, route):
            before = backend.telemetry.snapshot()
            outs = call()
            d = _delta(before, backend.telemetry.snapshot(), "cooperative_launches", "split_launches")
            assert (d["cooperative_launches"], d["split_launches"]) == want, f"{name} on {route}"
            case.check(outs, f"{name} on {route}")
            results.append(outs)
        for outs in results[1:]:
            for a, b in zip(results[0], outs):
                np.testing.assert_array_equal(a, b)
        by_route[route] = results[0]
    for a, b in zip(by_route["cooperative"], by_route["split"]):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- report
def test_report_scan_resident_limit_and_route_counters(backend, rng, capsys):
    prog = _scan_prog()
    x = rng.integers(0, 1000, 10_000_000, dtype=np.uint32)
    info = backend.plan_info(prog, [x])
    R = info.route.resident_limit
    ref = np.cumsum(x, dtype=np.uint32)
    (y, _) = backend.dispatch(prog, [x])  # natural grid: far over residency, host split
    np.testing.assert_array_equal(y, ref)
    (y, _) = backend.dispatch(prog, [x], DispatchConfig(grid_override=(R,)))  # cooperative
    np.testing.assert_array_equal(y, ref)
    snap = backend.telemetry.snapshot()
    assert snap["cooperative_launches"] > 0 and snap["split_launches"] > 0
    assert snap["failed_dispatches"] == 0
    _report(
        capsys,
        f"inclusive_scan_u32 (block {info.launch.threads_per_block}): resident limit {R} blocks on "
        f"{backend.caps.name} ({backend.caps.sm_count} SMs); 10^7 elements -> grid {info.route.grid_blocks}, "
        f"route {info.route.kind}",
    )
    _report(
        capsys,
        "session telemetry so far: cooperative_launches={cooperative_launches} split_launches={split_launches} "
        "launches={launches} dispatches={dispatches} memset_ops={memset_ops}".format(**snap),
    )
