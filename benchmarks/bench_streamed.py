"""Streamed dispatch against the DMA ceilings, measured in one run on one GPU.

Per size (bytes per buffer, vecadd f32 declared elementwise: 2 inputs up, 1 output down):

- the ceilings, pinned, through ``cuda.bindings.driver`` in the backend's context with the
  dispatch's byte counts: H2D alone, D2H alone, and **both directions at once** on two streams
  (``ceiling.dma_both``, the reference of every ``vs duplex`` ratio);
- ``dispatch_into`` on the serial route (``streamed=False``) and on the streamed route
  (``streamed=True``), from numpy arrays and from page-locked ones (``vyre.serial``,
  ``vyre.streamed``, ``vyre.serial_pinned``, ``vyre.streamed_pinned``);
- with ``--heavy``: a compute-heavy elementwise kernel (``--heavy-steps`` ``__sinf`` steps per
  element) at one size, page-locked: its streamed host round trip (``vyre.heavy``), its compute
  alone on device-resident arrays (``vyre.heavy_compute``) and the transfer-only round trip of the
  same bytes through a copy kernel (``vyre.heavy_transfer``);
- with ``--budget SIZE:BUDGET``: a dispatch of SIZE per buffer under
  ``device_memory_budget=BUDGET`` against the unbudgeted streamed dispatch, from numpy;
- with ``--registered SIZE``: numpy arrays registered in place (``CudaBackend.register``),
  streamed, against the duplex DMA time and the staged numpy route; what registering and
  unregistering cost, and after how many dispatches it has paid; and 20 dispatches of new arrays
  under ``auto_register=True`` against 20 staged ones, each on a fresh backend.

Every configuration is checked against numpy (``a + b`` on random data, outputs poisoned with NaN)
on its first run and at sampled rows after every timed run; a wrong result exits 1. Medians of
interleaved rounds after warm-ups, wall clock. ``--tune`` sweeps chunk bytes x streams at each
size instead (page-locked and numpy), for setting ``planning.stream``'s constants.
Prints tables and, with ``--out``, writes JSON with the targets: ``streamed_pinned_vs_duplex``,
``streamed_numpy_vs_duplex``, ``streamed_4mib_vs_serial``, ``overlap_vs_max``, ``budget_vs_unbudgeted``,
``registered_numpy_vs_duplex``, ``registration_breakeven``, ``auto_register_vs_staged``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import streamed_prototype as proto  # noqa: E402 (the ceilings, checks and row bookkeeping)

MIB = 1 << 20
HEAVY_SRC = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* a, const float* b, float* out, const vyre_u32* p) {
    vyre_u32 i = vyre_global_id();
    if (i >= p[0]) return;
    float x = a[i], y = b[i];
    for (int k = 0; k < STEPS; ++k) x = __sinf(x) + y;
    out[i] = x;
}
"""
COPY_SRC = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* a, const float* b, float* out, const vyre_u32* p) {
    vyre_u32 i = vyre_global_id();
    if (i < p[0]) out[i] = a[i] + b[i];
}
"""


def programs(vc, steps: int):
    from vyre_cuda import BufferDecl, Kernel, Program, builtin_programs

    plain = builtin_programs.vecadd_f32()
    vecadd = Program(plain.kernel, plain.buffers, name="vecadd_elementwise", elementwise=True)
    decls = [BufferDecl.read("a", 0, "f32"), BufferDecl.read("b", 1, "f32"), BufferDecl.output("out", 2, "f32")]
    heavy = Program(Kernel.cuda(HEAVY_SRC.replace("STEPS", str(steps))), decls, name="heavy", elementwise=True)
    return vecadd, heavy


def heavy_reference(a, b, steps):
    x = a.copy()
    for _ in range(steps):
        x = np.sin(x) + b
    return x


def inputs(vc, rng, rows):
    a = (rng.random(rows, dtype=np.float32) + np.float32(0.5)).astype(np.float32)
    b = (rng.random(rows, dtype=np.float32) - np.float32(2.0)).astype(np.float32)
    pa, pb, pout = (vc.pinned_empty(rows, np.float32) for _ in range(3))
    pa[:], pb[:] = a, b
    return {"numpy": (a, b, np.empty(rows, np.float32)), "pinned": (pa, pb, pout)}


def dispatch_config(backend, program, cfg, a, b, out, expected, name, kind, label, nbytes, **extra):
    run = lambda: backend.dispatch_into(program, [a, b], [out], cfg)[0]  # noqa: E731
    idx = proto.sample_indices(a.size, [(0, a.size)])
    return proto.Config(name, kind, label, run, out, 3 * nbytes, idx, expected, **extra)


def measure(configs, rounds, warmup):
    for c in configs:
        c.first()
        for _ in range(warmup - 1):
            c.timed(record=False)
    for r in range(rounds):
        k = r % len(configs)
        for c in configs[k:] + configs[:k]:
            c.timed(record=True)
    return [c.row() for c in configs]


def median(rows, name, kind):
    for r in rows:
        if r["name"] == name and r["kind"] == kind:
            return r["median_ms"]
    return None


def measure_size(vc, backend, program, nbytes, args, rng) -> dict:
    from vyre_cuda import DispatchConfig

    rows = nbytes // 4
    hosts = inputs(vc, rng, rows)
    expected = hosts["numpy"][0] + hosts["numpy"][1]
    pa, pb, pout = hosts["pinned"]
    ceilings = proto.DmaCeilings(backend.context_handle, pa, pb, pout)
    try:
        ceilings.verify("dma ceiling copies")
        configs = [
            proto.Config("ceiling.dma_h2d", "pinned", "dma H2D alone (2N)", ceilings.h2d, None, 2 * nbytes, None, None),
            proto.Config("ceiling.dma_d2h", "pinned", "dma D2H alone (N)", ceilings.d2h, None, nbytes, None, None),
            proto.Config(
                "ceiling.dma_both", "pinned", "dma both directions", ceilings.duplex, None, 3 * nbytes, None, None
            ),
        ]
        for kind, (a, b, out) in hosts.items():
            suffix = "_pinned" if kind == "pinned" else ""
            for streamed in (False, True):
                cfg = DispatchConfig(streamed=streamed)
                name = f"vyre.{'streamed' if streamed else 'serial'}{suffix}"
                configs.append(dispatch_config(backend, program, cfg, a, b, out, expected, name, kind, name, nbytes))
        rows_out = measure(configs, args.rounds, args.warmup)
    finally:
        ceilings.close()
    duplex = median(rows_out, "ceiling.dma_both", "pinned")
    for r in rows_out:
        r["vs_duplex"] = r["median_ms"] / duplex
        serial = median(rows_out, "vyre.serial" + ("_pinned" if r["kind"] == "pinned" else ""), r["kind"])
        r["vs_serial"] = r["median_ms"] / serial if r["name"].startswith("vyre.") else None
        r["gb_s"] = r["bytes_moved"] / (r["median_ms"] * 1e6)
    info = backend.plan_info(program, [hosts["numpy"][0], hosts["numpy"][1]])
    print_table(nbytes, rows_out, f"planner's own choice: {info.route.kind} ({info.route.reason})")
    return {
        "bytes_per_buffer": nbytes,
        "rows": rows_out,
        "planner_route": info.route.kind,
        "planner_reason": info.route.reason,
    }


def print_table(nbytes, rows, note=""):
    print(f"\n== {nbytes / MIB:g} MiB per buffer ==  {note}")
    print(f"{'row':28} {'kind':7} {'median ms':>10} {'GB/s':>7} {'vs duplex':>9} {'vs serial':>9}")
    for r in rows:
        vs = "" if r.get("vs_serial") is None else f"{r['vs_serial']:.3f}"
        print(f"{r['name']:28} {r['kind']:7} {r['median_ms']:10.3f} {r['gb_s']:7.1f} {r['vs_duplex']:9.3f} {vs:>9}")


def tune(vc, backend, program, nbytes, args, rng) -> dict:
    from benchmarks.harness import hooks  # (main put the checkout on sys.path)
    from vyre_cuda import DispatchConfig
    from vyre_cuda.planning.stream import StreamTuning

    rows = nbytes // 4
    hosts = inputs(vc, rng, rows)
    expected = hosts["numpy"][0] + hosts["numpy"][1]
    pa, pb, pout = hosts["pinned"]
    ceilings = proto.DmaCeilings(backend.context_handle, pa, pb, pout)
    results = []
    try:
        duplex = measure(
            [proto.Config("ceiling.dma_both", "pinned", "dma both", ceilings.duplex, None, 3 * nbytes, None, None)],
            args.rounds,
            args.warmup,
        )[0]["median_ms"]
        for chunk in args.tune_chunks:
            for streams in args.tune_streams:
                hooks.set_stream_tuning(backend, StreamTuning(chunk_bytes=chunk, streams=streams))
                configs = [
                    dispatch_config(
                        backend,
                        program,
                        DispatchConfig(streamed=True),
                        a,
                        b,
                        out,
                        expected,
                        "vyre.streamed",
                        kind,
                        f"{chunk // MIB}M x{streams}",
                        nbytes,
                        chunk=chunk,
                        streams=streams,
                    )
                    for kind, (a, b, out) in hosts.items()
                ]
                for r in measure(configs, args.rounds, args.warmup):
                    r["vs_duplex"] = r["median_ms"] / duplex
                    results.append(r)
                    print(
                        f"{nbytes / MIB:6g} MiB  chunk {chunk / MIB:5g} MiB  streams {streams}  {r['kind']:6} "
                        f"{r['median_ms']:8.3f} ms  {r['vs_duplex']:.3f}x duplex",
                        flush=True,
                    )
    finally:
        hooks.set_stream_tuning(backend, None)
        ceilings.close()
    return {"bytes_per_buffer": nbytes, "duplex_ms": duplex, "rows": results}


def heavy_rows(vc, backend, heavy, nbytes, args, rng) -> dict:
    """The compute-heavy kernel, page-locked: streamed round trip, compute alone, transfer alone."""
    from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program

    rows = nbytes // 4
    hosts = inputs(vc, rng, rows)
    pa, pb, pout = hosts["pinned"]
    expected = heavy_reference(hosts["numpy"][0], hosts["numpy"][1], args.heavy_steps)
    decls = [BufferDecl.read("a", 0, "f32"), BufferDecl.read("b", 1, "f32"), BufferDecl.output("out", 2, "f32")]
    copy = Program(Kernel.cuda(COPY_SRC), decls, name="transfer_only", elementwise=True)
    configs = []
    for name, prog in (("vyre.heavy", heavy), ("vyre.heavy_transfer", copy)):
        exp = expected if prog is heavy else hosts["numpy"][0] + hosts["numpy"][1]
        c = dispatch_config(
            backend, prog, DispatchConfig(streamed=True), pa, pb, pout, exp, name, "pinned", name, nbytes
        )
        if prog is heavy:
            c.check_rtol = 1e-4
        configs.append(c)
    try:
        import cupy as cp
    except ImportError:
        cp = None
    if cp is not None:
        with cp.cuda.Device(backend.device):
            da, db, dout = cp.asarray(hosts["numpy"][0]), cp.asarray(hosts["numpy"][1]), cp.empty(rows, cp.float32)

        def compute():
            backend.dispatch_into(heavy, [da, db], [dout])
            return None

        configs.append(
            proto.Config("vyre.heavy_compute", "device", "compute alone (device arrays)", compute, None, 0, None, None)
        )
    rows_out = measure_loose(configs, args, expected)
    for r in rows_out:
        r["gb_s"] = 3 * nbytes / (r["median_ms"] * 1e6)
    t = {r["name"]: r["median_ms"] for r in rows_out}
    limit = max(t.get("vyre.heavy_compute", 0.0), t["vyre.heavy_transfer"])
    out = {
        "bytes_per_buffer": nbytes,
        "steps": args.heavy_steps,
        "rows": rows_out,
        "overlap_vs_max": t["vyre.heavy"] / limit if limit else None,
    }
    print(f"\n== heavy kernel, {nbytes / MIB:g} MiB per buffer, {args.heavy_steps} steps ==")
    for r in rows_out:
        print(f"{r['name']:24} {r['median_ms']:9.3f} ms")
    print(f"overlap_vs_max = {out['overlap_vs_max']}")
    return out


def measure_loose(configs, args, expected):
    """measure() for rows whose result is checked with a tolerance (transcendentals differ from numpy)."""
    for c in configs:
        rtol = getattr(c, "check_rtol", None)
        if rtol is not None:
            got = c.run()
            np.testing.assert_allclose(got, c.expected, rtol=rtol, atol=1e-4)
            c.expected = None  # timed rounds below: the first check stands
    return measure(configs, args.rounds, args.warmup)


def budget_rows(vc, backend, program, spec, args, rng) -> dict:
    from vyre_cuda import DispatchConfig

    size, budget = spec
    rows = size // 4
    block = (rng.random(1 << 24, dtype=np.float32) + np.float32(0.5)).astype(np.float32)
    a = np.resize(block, rows)
    b = np.resize(block[::-1].copy(), rows) - np.float32(2.0)
    out = np.empty(rows, np.float32)
    idx = proto.sample_indices(rows, [(0, rows)])
    exp_idx = a[idx] + b[idx]
    results = {}
    for name, cfg in (
        ("budgeted", DispatchConfig(device_memory_budget=budget)),
        ("unbudgeted", DispatchConfig(streamed=True)),
    ):
        info = backend.plan_info(program, [a, b], cfg)
        assert info.route.kind == "streamed" and (name != "budgeted" or info.stream.device_bytes <= budget)
        samples = []
        for r in range(max(2, args.rounds // 3) + 1):
            out[idx] = np.nan
            t0 = time.perf_counter()
            backend.dispatch_into(program, [a, b], [out], cfg)
            dt = time.perf_counter() - t0
            if not np.array_equal(out[idx], exp_idx):
                raise proto.WrongResult(f"{name} dispatch of {size} bytes per buffer")
            if r:
                samples.append(dt)
        if name == "budgeted":
            np.testing.assert_array_equal(out, a + b)  # every row once
        results[name] = {
            "median_ms": 1e3 * float(np.median(samples)),
            "device_bytes": info.stream.device_bytes,
            "chunks": info.stream.chunk_count,
        }
    ratio = results["unbudgeted"]["median_ms"] / results["budgeted"]["median_ms"]
    print(
        f"\n== {size / (1 << 30):g} GiB per buffer, budget {budget / (1 << 30):g} GiB ==  {results}  "
        f"throughput ratio {ratio:.3f}"
    )
    return {"bytes_per_buffer": size, "budget": budget, **results, "budget_vs_unbudgeted": ratio}


def _numpy_triple(rng, rows):
    a = (rng.random(rows, dtype=np.float32) + np.float32(0.5)).astype(np.float32)
    b = (rng.random(rows, dtype=np.float32) - np.float32(2.0)).astype(np.float32)
    out = np.empty(rows, np.float32)
    out[:] = 0  # touched: every page mapped, as a reused buffer's would be
    return a, b, out


def registered_rows(vc, backend, program, nbytes, args, rng, dispatches=20) -> dict:
    """Registered numpy against the duplex DMA and the staged route; registration's cost and
    break-even; the automatic policy over ``dispatches`` dispatches against staging only."""
    from vyre_cuda import DispatchConfig

    rows = nbytes // 4
    cfg = DispatchConfig(streamed=True)
    hosts = inputs(vc, rng, rows)
    staged = hosts["numpy"]
    expected = staged[0] + staged[1]
    reg = tuple(x.copy() for x in staged)  # its own arrays: the staged row stays pageable
    pa, pb, pout = hosts["pinned"]
    ceilings = proto.DmaCeilings(backend.context_handle, pa, pb, pout)
    try:
        duplex_cfg = proto.Config(
            "ceiling.dma_both", "pinned", "dma both directions", ceilings.duplex, None, 3 * nbytes, None, None
        )
        with backend.register(*reg):
            configs = [
                duplex_cfg,
                dispatch_config(backend, program, cfg, *staged, expected, "vyre.streamed", "numpy", "staged", nbytes),
                dispatch_config(
                    backend, program, cfg, *reg, expected, "vyre.streamed_registered", "numpy", "registered", nbytes
                ),
            ]
            rows_out = measure(configs, args.rounds, args.warmup)
    finally:
        ceilings.close()
    t = {r["name"]: r["median_ms"] for r in rows_out}
    # registering and unregistering three buffers of new memory (touched), median of rounds
    costs: dict[str, list[float]] = {"register_ms": [], "unregister_ms": []}
    for _ in range(max(3, args.rounds // 3)):
        fresh = _numpy_triple(rng, rows)
        block = backend.register(*fresh)
        t0 = time.perf_counter()
        block.__enter__()
        t1 = time.perf_counter()
        block.__exit__(None, None, None)
        t2 = time.perf_counter()
        costs["register_ms"].append(1e3 * (t1 - t0))
        costs["unregister_ms"].append(1e3 * (t2 - t1))
        del fresh
    cost = {k: float(np.median(v)) for k, v in costs.items()}
    saving = t["vyre.streamed"] - t["vyre.streamed_registered"]
    breakeven = (cost["register_ms"] + cost["unregister_ms"]) / saving if saving > 0 else None
    # the policy on a fresh backend against staging on another: the same number of dispatches of
    # new arrays each (planned and loaded first on other arrays of the size)
    totals = {}
    for name, policy in (("staged", False), ("auto", True)):
        with vc.CudaBackend(backend.device, auto_register=policy) as fresh_backend:
            warm = _numpy_triple(rng, rows)
            fresh_backend.dispatch_into(program, list(warm[:2]), [warm[2]], cfg)
            del warm
            a, b, out = _numpy_triple(rng, rows)
            t0 = time.perf_counter()
            for _ in range(dispatches):
                fresh_backend.dispatch_into(program, [a, b], [out], cfg)
            totals[name] = 1e3 * (time.perf_counter() - t0)
            if not np.array_equal(out, a + b):
                raise proto.WrongResult(f"auto_register={policy} dispatch of {nbytes} bytes per buffer")
            t0 = time.perf_counter()
            del a, b, out  # the policy's ranges go with the arrays
            totals[f"{name}_release_ms"] = 1e3 * (time.perf_counter() - t0)
    out = {
        "bytes_per_buffer": nbytes,
        "rows": rows_out,
        **cost,
        "registered_numpy_vs_duplex": t["vyre.streamed_registered"] / t["ceiling.dma_both"],
        "staged_numpy_vs_duplex": t["vyre.streamed"] / t["ceiling.dma_both"],
        "registration_breakeven": breakeven,
        "auto_register_vs_staged": totals["auto"] / totals["staged"],
        "auto_totals_ms": totals,
        "dispatches": dispatches,
        "registered_stats": vc.registered_stats(),
    }
    print(f"\n== registered numpy, {nbytes / MIB:g} MiB per buffer ==")
    for r in rows_out:
        print(f"{r['name']:28} {r['median_ms']:10.3f} ms  {r['median_ms'] / t['ceiling.dma_both']:.3f}x duplex")
    print(
        f"register {cost['register_ms']:.2f} ms, unregister {cost['unregister_ms']:.2f} ms (three buffers); "
        f"break-even after {breakeven if breakeven is None else round(breakeven, 1)} dispatches; "
        f"auto over {dispatches}: {out['auto_register_vs_staged']:.3f}x staged ({totals})"
    )
    return out


def targets(report) -> dict:
    out = {}
    by_size = {s["bytes_per_buffer"]: s for s in report.get("sizes", [])}
    for key, kind in (("streamed_pinned_vs_duplex", "pinned"), ("streamed_numpy_vs_duplex", "numpy")):
        name = "vyre.streamed_pinned" if kind == "pinned" else "vyre.streamed"
        out[key] = {
            f"{n // MIB}MiB": next(r["vs_duplex"] for r in s["rows"] if r["name"] == name)
            for n, s in by_size.items()
            if n >= 256 * MIB
        }
    if 4 * MIB in by_size:
        s = by_size[4 * MIB]
        out["streamed_4mib_vs_serial"] = {
            "numpy": next(r["vs_serial"] for r in s["rows"] if r["name"] == "vyre.streamed"),
            "pinned": next(r["vs_serial"] for r in s["rows"] if r["name"] == "vyre.streamed_pinned"),
            "planner_route": s["planner_route"],
        }
    if report.get("heavy"):
        out["overlap_vs_max"] = report["heavy"]["overlap_vs_max"]
    if report.get("budget"):
        out["budget_vs_unbudgeted"] = report["budget"]["budget_vs_unbudgeted"]
    if report.get("registered"):
        for key in ("registered_numpy_vs_duplex", "registration_breakeven", "auto_register_vs_staged"):
            out[key] = report["registered"][key]
    return out


def parse_budget(text):
    size, budget = text.split(":")
    return proto.parse_size(size), proto.parse_size(budget)


def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=proto.parse_list, default=proto.parse_list("4M,16M,64M,256M,1G"))
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--copy-threads", type=int, default=None)
    ap.add_argument(
        "--copy-mode",
        type=int,
        default=None,
        help="the streamed copy jobs' stores: 0 the engine's rule, 1 plain (default), 2 non-temporal",
    )
    ap.add_argument("--tune", action="store_true", help="sweep chunk bytes x streams instead")
    ap.add_argument("--tune-chunks", type=proto.parse_list, default=proto.parse_list("2M,4M,8M,16M,32M"))
    ap.add_argument("--tune-streams", type=lambda s: proto.parse_list(s, int), default=[2, 3, 4])
    ap.add_argument("--heavy", type=proto.parse_size, default=None, help="bytes per buffer of the heavy rows")
    ap.add_argument("--heavy-steps", type=int, default=400)
    ap.add_argument("--budget", type=parse_budget, default=None, help="SIZE:BUDGET, e.g. 8G:1G")
    ap.add_argument("--registered", type=proto.parse_size, default=None, help="bytes per buffer, e.g. 256M")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", default=None)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import vyre_cuda as vc

    if str(HERE.parent) not in sys.path:  # the harness's hooks (benchmarks/harness), from a checkout
        sys.path.insert(0, str(HERE.parent))
    from benchmarks.harness import hooks

    rng = np.random.default_rng(args.seed)
    backend = vc.CudaBackend(0, copy_threads=args.copy_threads)
    if args.copy_mode is not None:
        hooks.set_knobs(backend, streamed_copy_mode=args.copy_mode)
    vecadd, heavy = programs(vc, args.heavy_steps)
    report = {
        "meta": {
            "device": backend.caps.name,
            "copy_engines": backend.caps.copy_engines,
            "copy_threads": args.copy_threads,
            "copy_mode": args.copy_mode,
            "rounds": args.rounds,
            "warmup": args.warmup,
        }
    }
    t0 = time.perf_counter()
    status = 0
    try:
        if args.tune:
            report["tune"] = [tune(vc, backend, vecadd, n, args, rng) for n in args.sizes]
        else:
            report["sizes"] = [measure_size(vc, backend, vecadd, n, args, rng) for n in args.sizes]
            if args.heavy:
                report["heavy"] = heavy_rows(vc, backend, heavy, args.heavy, args, rng)
            if args.budget:
                report["budget"] = budget_rows(vc, backend, vecadd, args.budget, args, rng)
            if args.registered:
                report["registered"] = registered_rows(vc, backend, vecadd, args.registered, args, rng)
            report["targets"] = targets(report)
            print("\ntargets:", json.dumps(report["targets"], indent=1))
    except proto.WrongResult as exc:
        print(f"WRONG RESULT: {exc}", file=sys.stderr)
        report["wrong_result"] = str(exc)
        status = 1
    finally:
        backend.close()
    report["seconds"] = time.perf_counter() - t0
    print(f"total {report['seconds']:.1f} s")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
