"""The profiling harness without a GPU: statistics, sizes, series, the report, its targets, its
table, its JSON and its plot. (The run itself, on fakes, and the CLI: test_profile_run.py.)"""

import json
import pathlib
import re

import numpy as np
import pytest

import benchmarks.harness as H
from benchmarks.harness import records, targets
from vyre_cuda import profile as P
from vyre_cuda.errors import UnsupportedFeature, ValidationError
from vyre_cuda.profile import engine, systems, table
from vyre_cuda.profile.specs import format_size
from vyre_cuda.program import BindingRole

KIB, MIB, GIB = 1024, 1 << 20, 1 << 30
STAGES = P.STAGE_NAMES
ROOT = pathlib.Path(__file__).resolve().parent.parent


def _fix_line(exc):
    return str(exc).splitlines()[-1]


# -- statistics ------------------------------------------------------------------------------
def test_median_odd_even_and_unsorted():
    assert P.median([5]) == 5.0
    assert P.median([3, 1, 2]) == 2.0
    assert P.median([4, 1, 3, 2]) == 2.5
    assert P.median([10, 1, 7, 3, 1000, 2]) == 5.0
    assert P.median(np.array([9, 8, 7], dtype=np.int64)) == 8.0


def test_median_and_percentile_refuse_empty_and_nan():
    for fn in (P.median, lambda v: P.percentile(v, 50), P.summarize):
        with pytest.raises(ValueError):
            fn([])
        with pytest.raises(ValueError):
            fn([1.0, float("nan")])
    with pytest.raises(ValueError):
        P.percentile([1, 2], 101)
    with pytest.raises(ValueError):
        P.percentile([1, 2], -1)


@pytest.mark.parametrize("count", [1, 2, 7, 10, 101, 1000])
def test_percentile_matches_numpy_linear(rng, count):
    values = rng.integers(1_000, 50_000, count)
    for q in (0, 10, 25, 50, 90, 99, 100):
        assert P.percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12)
    assert P.median(values) == pytest.approx(np.median(values), rel=1e-12)


def test_percentile_exact_values():
    xs = [10, 20, 30, 40, 50]
    assert P.percentile(xs, 10) == pytest.approx(14.0)
    assert P.percentile(xs, 90) == pytest.approx(46.0)
    assert P.percentile(xs, 0) == 10
    assert P.percentile(xs, 100) == 50
    assert P.percentile([7, 1], 50) == 4.0


def test_summarize():
    s = P.summarize(list(range(1, 12)))  # 1..11
    assert s == P.Summary(11, 6.0, 2.0, 10.0)
    assert P.Summary.from_dict(s.to_dict()) == s


def test_ratio_gain_throughput_gbps():
    assert P.ratio(115.0, 100.0) == pytest.approx(1.15)
    assert P.ratio(None, 1.0) is None
    assert P.ratio(1.0, None) is None
    assert P.ratio(1.0, 0.0) is None
    assert records.gain(1000.0, 1800.0) == pytest.approx(1.8)
    assert records.gain(None, 1800.0) is None
    assert records.throughput(2000, 1_000_000_000) == pytest.approx(2000.0)
    assert records.throughput(1, 20_000) == pytest.approx(50_000.0)
    with pytest.raises(ValueError):
        records.throughput(1, 0)
    # 256 MiB in 4.88 ms is 55 GB/s (10**9 bytes per second)
    assert P.gbps(256 * MIB, 4_880_000) == pytest.approx(268_435_456 / 4_880_000)
    assert P.gbps(1_000_000_000, 1_000_000_000) == pytest.approx(1.0)
    assert P.gbps(None, 10) is None and P.gbps(10, None) is None and P.gbps(10, 0) is None


# -- sizes -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("4096", 4096),
        ("4K", 4096),
        ("4k", 4096),
        ("4KiB", 4096),
        ("4kib", 4096),
        ("4M", 4 << 20),
        ("4MiB", 4 << 20),
        ("1G", GIB),
        ("1GiB", GIB),
        ("2gib", 2 * GIB),
        ("12B", 12),
        (" 8 KiB ", 8192),
        (4096, 4096),
        (np.int64(64), 64),
    ],
)
def test_parse_size(text, expected):
    assert P.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "4KB", "4 MB", "-4K", "4.5K", "0", "0K", "four", "4T", "1GB", True])
def test_parse_size_errors_have_fix(text):
    with pytest.raises(ValidationError) as err:
        P.parse_size(text)
    assert _fix_line(err.value).startswith("Fix: ")


def test_parse_sizes_list_dedup_order():
    assert P.parse_sizes("4KiB,4MiB") == (4096, 4 << 20)
    assert P.parse_sizes("4MiB, 4K ,4096,") == (4 << 20, 4096)
    assert P.parse_sizes([4096, "8K", "1GiB"]) == (4096, 8192, GIB)
    with pytest.raises(ValidationError):
        P.parse_sizes(" , ")
    with pytest.raises(ValidationError):
        P.parse_sizes("4K,x")


def test_format_size():
    assert P.format_size(4096) == "4 KiB"
    assert P.format_size(4 << 20) == "4 MiB"
    assert P.format_size(256 << 20) == "256 MiB"
    assert P.format_size(GIB) == "1 GiB"
    assert P.format_size(1536 * MIB) == "1536 MiB"
    assert P.format_size(6144) == "6 KiB"
    assert P.format_size(1000) == "1000 B"
    assert P.format_size(1536 * 1024 + 4) == f"{1536 * 1024 + 4} B"


def test_default_sizes_cover_4kib_to_1gib():
    assert P.DEFAULT_SIZES == (4 * KIB, 4 * MIB, 64 * MIB, 256 * MIB, GIB)


# -- buffer specs ----------------------------------------------------------------------------
def test_parse_buffer_spec_roles_and_bindings():
    decls = P.parse_buffer_spec("a:f32:in, b:float32:in ,acc:i32:inout,out:f32:out")
    assert [d.name for d in decls] == ["a", "b", "acc", "out"]
    assert [d.binding for d in decls] == [0, 1, 2, 3]
    assert [d.role for d in decls] == [
        BindingRole.INPUT,
        BindingRole.INPUT,
        BindingRole.INPUT_OUTPUT,
        BindingRole.OUTPUT,
    ]
    assert [d.dtype.name for d in decls] == ["f32", "f32", "i32", "f32"]
    assert all(d.count == 0 for d in decls)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "   ",
        "a:f32",
        "a:f32:in:4,out:f32:out",
        "a:f99:in,out:f32:out",
        "a:f32:input,out:f32:out",
        "1a:f32:in,out:f32:out",
        ":f32:in,out:f32:out",
        "a:f32:in,a:f32:out",
        "a:f32:in,b:f32:in",
        "a:f32:in,,out:f32:out",
    ],
)
def test_parse_buffer_spec_errors(spec):
    with pytest.raises(ValidationError) as err:
        P.parse_buffer_spec(spec)
    assert _fix_line(err.value).startswith("Fix: ")


def test_load_user_program(tmp_path):
    src = tmp_path / "scale.cu"
    src.write_text(
        '#include "vyre_cuda.cuh"\n'
        "VYRE_KERNEL scale(const float* x, float* y, const unsigned* p) {\n"
        "  unsigned i = vyre_global_id(); if (i < vyre_count(p)) y[i] = 2.0f * x[i];\n}\n"
    )
    prog = P.load_user_program(src, "scale", "x:f32:in,y:f32:out")
    assert prog.kernel.kind == "cuda" and prog.kernel.entry == "scale"
    assert [d.name for d in prog.inputs] == ["x"]
    assert [d.name for d in prog.outputs] == ["y"]
    assert prog.name == "scale"
    ptx = tmp_path / "k.ptx"
    ptx.write_text(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry main() { ret; }\n")
    assert P.load_user_program(ptx, None, "o:u32:out").kernel.kind == "ptx"


def test_load_user_program_errors(tmp_path):
    with pytest.raises(ValidationError) as err:
        P.load_user_program(tmp_path / "missing.cu", "k", "a:f32:out")
    assert _fix_line(err.value).startswith("Fix: ")
    (tmp_path / "k.cu").write_text("// nothing")
    with pytest.raises(ValidationError):
        P.load_user_program(tmp_path / "k.cu", "k", None)


# -- series ----------------------------------------------------------------------------------
def test_series_labels_traffic_and_order():
    assert systems.label("ceiling.copy_in.1") == "memcpy ceiling: pageable -> pinned, 1 thread"
    assert systems.label("ceiling.copy_out.16") == ("memcpy ceiling: pinned -> pageable, 16 threads")
    assert systems.label("vyre.pinned") == "vyre_cuda dispatch_into, page-locked"
    assert systems.label("something.new") == "something.new"
    assert systems.copy_key("in", 8) == "ceiling.copy_in.8"
    kinds = {
        k: systems.traffic_kind(k)
        for k in (
            "vyre.dispatch",
            "floor.pageable",
            "ceiling.dma_h2d",
            "ceiling.dma_d2h",
            "ceiling.copy_in.4",
            "ceiling.copy_out.4",
            "vyre.async_enqueue",
            "floor.launch_only",
            "unknown",
        )
    }
    assert kinds == {
        "vyre.dispatch": "full",
        "floor.pageable": "full",
        "ceiling.dma_h2d": "in",
        "ceiling.dma_d2h": "out",
        "ceiling.copy_in.4": "in",
        "ceiling.copy_out.4": "out",
        "vyre.async_enqueue": None,
        "floor.launch_only": None,
        "unknown": None,
    }
    keys = [
        "peer.cupy",
        "vyre.dispatch",
        "ceiling.copy_out.8",
        "zzz",
        "ceiling.copy_in.8",
        "ceiling.copy_in.1",
        "floor.pinned",
        "ceiling.dma_h2d",
    ]
    assert sorted(keys, key=systems.order) == [
        "floor.pinned",
        "ceiling.dma_h2d",
        "ceiling.copy_in.1",
        "ceiling.copy_in.8",
        "ceiling.copy_out.8",
        "vyre.dispatch",
        "peer.cupy",
        "zzz",
    ]
    assert systems.reference("vyre.async_enqueue") == "floor.pinned_enqueue"
    assert systems.reference("ceiling.dma_h2d") is None


# -- a synthetic run -------------------------------------------------------------------------
def _summary(median, spread=0.1, n=1000):
    return P.Summary(n, float(median), median * (1 - spread), median * (1 + spread))


def _size(nbytes, systems_ns, stages_per=None, upload=None, readback=None, telemetry=None, skipped=None):
    s = P.SizeResult(nbytes, nbytes // 4, 100, skipped=dict(skipped or {}))
    s.systems = {k: _summary(v) for k, v in systems_ns.items()}
    if stages_per is not None:
        s.stages = {name: _summary(stages_per) for name in STAGES}
        s.stages[P.UNATTRIBUTED] = _summary(stages_per / 20)
        s.attributed = _summary(stages_per * len(STAGES))
    if upload is not None:
        s.directions = {"h2d": _summary(upload), "d2h": _summary(readback)}
    s.moved = {"floor": (2 * nbytes, nbytes), "vyre": (2 * nbytes, nbytes)}
    s.telemetry = dict(telemetry or {})
    return s


def _synthetic_sizes():
    small = _size(
        4 * KIB,
        {
            "floor.pinned": 17_100,
            "floor.pinned_enqueue": 9_700,
            "floor.pageable": 20_700,
            "floor.launch_only": 3_500,
            "ceiling.dma_h2d": 6_000,
            "ceiling.dma_d2h": 4_000,
            "ceiling.copy_in.1": 800,
            "ceiling.copy_in.16": 9_000,
            "ceiling.copy_out.1": 400,
            "vyre.dispatch": 18_000,
            "vyre.dispatch_profiled": 18_500,
            "vyre.dispatch_into": 17_500,
            "vyre.pinned": 16_000,
            "vyre.async_enqueue": 10_000,
            "vyre.async_total": 18_200,
            "peer.cupy": 54_300,
            "peer.cuda_bindings": 24_000,
        },
        stages_per=18_000 / len(STAGES),
        upload=4_000,
        readback=1_000,
        telemetry={"dispatches": 500, "pinned_alloc_calls": 0, "device_alloc_calls": 0},
        skipped={"torch": "torch is not installed"},
    )
    four = _size(
        4 * MIB,
        {
            "floor.pinned": 1_350_000,
            "floor.pinned_enqueue": 700_000,
            "floor.pageable": 1_000_000,
            "vyre.dispatch": 450_000,
            "vyre.async_enqueue": 900_000,
        },
        telemetry={"dispatches": 400, "pinned_pool_misses": 4, "device_pool_misses": 0},
    )
    sixty_four = _size(
        64 * MIB,
        {
            "floor.pinned": 30_000_000,
            "floor.pinned_enqueue": 20_000_000,
            "floor.pageable": 23_300_000,
            "vyre.dispatch": 9_000_000,
            "vyre.async_enqueue": 6_000_000,
        },
    )
    big = _size(
        256 * MIB,
        {
            "floor.pinned": 120_000_000,
            "floor.pinned_enqueue": 60_000_000,
            "floor.pageable": 95_000_000,
            "ceiling.dma_h2d": 9_760_000,
            "ceiling.dma_d2h": 4_880_000,
            "ceiling.copy_in.1": 57_000_000,
            "ceiling.copy_in.16": 15_300_000,
            "ceiling.copy_out.1": 26_300_000,
            "ceiling.copy_out.16": 5_800_000,
            "vyre.dispatch": 36_000_000,
            "vyre.dispatch_profiled": 36_000_000,
            "vyre.pinned": 16_000_000,
            "vyre.async_enqueue": 20_000_000,
        },
        stages_per=36_000_000 / len(STAGES),
        upload=20_000_000,
        readback=12_000_000,
        telemetry={
            "dispatches": 40,
            "pinned_alloc_calls": 0,
            "device_alloc_calls": 0,
            "ring_bytes": 64 * MIB,
            "ring_chunks": 120,
            "copy_threads_live": 4,
            "staged_h2d_bytes": 40 * 512 * MIB,
            "direct_h2d_bytes": 512 * MIB,
            "staged_d2h_bytes": 40 * 256 * MIB,
            "direct_d2h_bytes": 0,
        },
    )
    return [small, four, sixty_four, big]


META = {
    "date": "2026-11-30T12:00:00+00:00",
    "device": 0,
    "device_name": "NVIDIA H200",
    "cc": [9, 0],
    "driver_version": 13000,
    "driver_release": "580.159.04",
    "vyre_cuda_version": "0.1.0",
    "commit": "abc123def456",
    "python": "3.12.3",
    "rounds": 5,
    "program": "vecadd_f32 (built-in)",
    "host_threads": [1, 16],
    "cpu_count": 16,
}


def _synthetic_report(baseline=None):
    sizes = _synthetic_sizes()
    threads = H.ThreadScaling(
        4096,
        4,
        2000,
        vyre={1: 50_000.0, 2: 75_000.0, 4: 120_000.0},
        floor={1: 58_000.0, 2: 100_000.0, 4: 150_000.0},
        tight={1: 70_000.0, 2: 120_000.0, 4: 125_000.0},
    )
    return H.BenchReport(
        dict(META), sizes, STAGES, targets=targets.evaluate_targets(sizes, threads, baseline=baseline), threads=threads
    )


def _baseline(vyre_small=17_000.0, floor_small=17_000.0):
    small = _size(4 * KIB, {"vyre.dispatch": vyre_small, "floor.pinned": floor_small})
    return H.BenchReport(dict(META, commit="old0"), [small])


def test_size_result_gbps_per_kind():
    big = _synthetic_sizes()[3]
    n = 256 * MIB
    assert big.traffic("vyre.dispatch") == 3 * n
    assert big.traffic("ceiling.dma_h2d") == 2 * n and big.traffic("ceiling.dma_d2h") == n
    assert big.traffic("ceiling.copy_in.16") == 2 * n and big.traffic("ceiling.copy_out.1") == n
    assert big.traffic("vyre.async_enqueue") is None
    assert big.gbps("vyre.dispatch") == pytest.approx(3 * n / 36_000_000)
    assert big.gbps("ceiling.dma_h2d") == pytest.approx(2 * n / 9_760_000)  # ~55 GB/s
    assert big.gbps("ceiling.copy_out.16") == pytest.approx(n / 5_800_000)
    assert big.gbps("vyre.async_enqueue") is None and big.gbps("peer.torch") is None
    assert big.direction_gbps("h2d") == pytest.approx(2 * n / 20_000_000)
    assert big.direction_gbps("d2h") == pytest.approx(n / 12_000_000)
    assert _synthetic_sizes()[1].direction_gbps("h2d") is None  # no stage attribution


def test_size_result_traffic_of_a_user_program_and_of_old_results():
    s = _size(4 * KIB, {"vyre.dispatch": 1_000, "floor.pinned": 1_000})
    s.moved = {"floor": (8192, 4096), "vyre": (4096, 4096)}  # one input, one output
    assert s.traffic("vyre.dispatch") == 8192 and s.traffic("floor.pinned") == 12288
    s.moved = {}  # results written before bytes were recorded: vecadd's
    assert s.traffic("vyre.dispatch") == 3 * 4096


def test_allocations_per_dispatch():
    small, four, sixty_four, _ = _synthetic_sizes()
    assert small.allocations_per_dispatch("pinned") == 0.0
    assert four.allocations_per_dispatch("pinned") == pytest.approx(0.01)  # pool misses
    assert four.allocations_per_dispatch("device") == 0.0
    assert sixty_four.allocations_per_dispatch("pinned") is None  # no telemetry


def _stage_row(**ns):
    return tuple(ns.get(name, 0) for name in STAGES)


def test_assemble_stages_unattributed_coverage_and_directions():
    walls = [100, 110, 120, 130]
    stage_rows = [
        _stage_row(plan_lookup=40, staging_memcpy=k, h2d_enqueue=2 * k, readback_enqueue=3, copy_out=4 + k, release=50)
        for k in range(4)
    ]
    samples = {"vyre.dispatch_profiled": walls, "_stages": stage_rows, "floor.pinned": [80] * 3}
    r = engine.assemble(4096, 1024, 4, samples, STAGES, {"cupy": "not installed"})
    assert set(r.systems) == {"vyre.dispatch_profiled", "floor.pinned"}  # "_" keys are raw
    assert r.stages["plan_lookup"].median == 40
    assert r.stages["release"].median == 50
    assert r.stages["clears"].median == 0
    sums = [97 + 4 * k for k in range(4)]  # 40 + 3k + 3 + 4 + k + 50
    assert r.attributed.median == P.median(sums)
    assert r.stages[P.UNATTRIBUTED].median == P.median([w - t for w, t in zip(walls, sums)])
    assert r.wall == pytest.approx(115.0)
    assert r.coverage == pytest.approx(P.median(sums) / 115)
    # upload = staging_memcpy + h2d_enqueue, readback = readback_enqueue + copy_out, per
    # dispatch, then the median
    assert r.directions["h2d"].median == P.median([3 * k for k in range(4)])
    assert r.directions["d2h"].median == P.median([7 + k for k in range(4)])
    assert r.skipped == {"cupy": "not installed"}


def test_assemble_rejects_misaligned_stage_data():
    with pytest.raises(ValueError):
        engine.assemble(4096, 1024, 2, {"vyre.dispatch_profiled": [1, 2], "_stages": [(0,) * 11]}, STAGES, {})
    with pytest.raises(ValueError):
        engine.assemble(4096, 1024, 1, {"vyre.dispatch_profiled": [1], "_stages": [(0, 0)]}, STAGES, {})


def test_assemble_without_the_direction_stages_skips_directions():
    names = ("plan_lookup", "wait")
    r = engine.assemble(4096, 1024, 1, {"vyre.dispatch_profiled": [10], "_stages": [(4, 5)]}, names, {})
    assert r.directions == {} and r.attributed.median == 9


# -- targets ---------------------------------------------------------------------------------
def _targets(report):
    return {(t.key, t.size_bytes): t for t in report.targets}


def test_targets_small_sizes():
    t = _targets(_synthetic_report(_baseline(17_000.0, 17_000.0)))
    small = t[("vyre_vs_floor", 4 * KIB)]
    assert small.value == pytest.approx(18_000 / 17_100) and small.limit == 1.15 and small.met
    # no regression: (18000 / 17100) now over (17000 / 17000) then = 1.053 > 1.05
    reg = t[("no_regression", 4 * KIB)]
    assert reg.value == pytest.approx((18_000 / 17_100) / 1.0) and reg.met is False
    # the miss names both runs' medians, so a reader can tell a slower host from a slower build
    assert (
        "1.053 in this run (18.00 us over 17.10 us) against 1.000 in the baseline's (17.00 us over 17.00 us)"
        in reg.note
    )
    cupy = t[("cupy_vs_vyre", 4 * KIB)]
    assert cupy.value == pytest.approx(54_300 / 18_000) and cupy.met
    assert ("torch_vs_vyre", 4 * KIB) not in t  # not measured, no target
    assert ("no_regression", 4 * MIB) not in t  # small sizes only
    ok = _targets(_synthetic_report(_baseline(18_000.0, 17_000.0)))[("no_regression", 4 * KIB)]
    assert ok.value == pytest.approx((18_000 / 17_100) / (18_000 / 17_000)) and ok.met and ok.note == ""


def test_no_regression_without_a_baseline_or_without_the_size():
    t = _targets(_synthetic_report())[("no_regression", 4 * KIB)]
    assert t.op == "report" and t.value is None and t.met is None
    assert "--baseline" in t.description
    other = H.BenchReport(dict(META), [_size(8 * KIB, {"vyre.dispatch": 1.0, "floor.pinned": 1.0})])
    t = _targets(_synthetic_report(other))[("no_regression", 4 * KIB)]
    assert t.value is None and t.met is None and "has no such size" in t.description
    assert records.target_status(t) == "n/a"


def test_targets_against_the_drivers_pageable_path():
    t = _targets(_synthetic_report())
    four = t[("vyre_vs_pageable", 4 * MIB)]
    assert four.value == pytest.approx(0.45) and four.limit == 0.5 and four.met
    sixty_four = t[("vyre_vs_pageable", 64 * MIB)]
    assert sixty_four.value == pytest.approx(9.0 / 23.3) and sixty_four.limit == 0.35
    assert sixty_four.met is False
    big = t[("vyre_vs_pageable", 256 * MIB)]
    assert big.op == "report" and big.met is None
    assert t[("vyre_vs_floor", 4 * MIB)].value == pytest.approx(450 / 1350)


def test_targets_bandwidth_per_direction_and_page_locked():
    t = _targets(_synthetic_report())
    n = 256 * MIB
    h2d = t[("numpy_h2d_gbps", n)]
    assert h2d.value == pytest.approx(2 * n / 20_000_000) and h2d.limit == 25 and h2d.met
    d2h = t[("numpy_d2h_gbps", n)]
    assert d2h.value == pytest.approx(n / 12_000_000) and d2h.met is False  # 22.4 GB/s
    eff = t[("numpy_effective_gbps", n)]
    assert eff.op == "report" and eff.value == pytest.approx(3 * n / 36_000_000)
    locked = t[("page_locked_gbps", n)]
    assert locked.value == pytest.approx(3 * n / 16_000_000) and locked.limit == 45
    assert locked.met is True and locked.unit == "GB/s"
    assert not any(k == "numpy_h2d_gbps" and size < n for k, size in t)


def test_targets_async_enqueue_allocations_and_threads():
    t = _targets(_synthetic_report())
    assert t[("async_enqueue_vs_floor_enqueue", 4 * KIB)].met  # 10.0 / 9.7
    late = t[("async_enqueue_vs_floor_enqueue", 4 * MIB)]
    assert late.value == pytest.approx(900 / 700) and late.met is False
    assert t[("pinned_allocations_per_dispatch", 4 * KIB)].met is True
    assert t[("pinned_allocations_per_dispatch", 4 * MIB)].met is False  # 4 misses / 400
    assert t[("device_allocations_per_dispatch", 256 * MIB)].value == 0.0
    assert ("pinned_allocations_per_dispatch", 64 * MIB) not in t  # no telemetry
    assert ("thread_gain_ratio", 4096) not in t  # replaced by the rates against the tight floor


def test_thread_rates_against_the_tight_floor_one_target_per_count():
    report = _synthetic_report()
    two, four = [x for x in report.targets if x.key == "threads_rate_vs_floor"]
    assert two.description == "2 threads, 4 KiB: vyre_cuda dispatches/s / tight floor's from 2 C threads"
    assert two.value == pytest.approx(75 / 120) and two.limit == 0.9 and two.op == ">=" and two.met is False
    # the miss names the rates it divides, the per-buffer floor's and the 1-thread ones
    assert two.note == (
        "from 2 threads: vyre_cuda 75,000/s, the tight floor 120,000/s, the per-buffer floor 100,000/s; "
        "from 1 thread: vyre_cuda 50,000/s, the tight floor 70,000/s (0.71x)"
    )
    assert four.description.startswith("4 threads, 4 KiB:") and four.value == pytest.approx(120 / 125)
    assert four.met is True and four.note == ""
    assert report.threads.rate_ratio(1) == pytest.approx(50 / 70)
    # a run without the tight floor's rates (a stored result of an older harness) says so
    old = H.ThreadScaling(4096, 2, 2000, vyre={1: 5.0, 2: 9.0}, floor={1: 6.0, 2: 10.0})
    (only,) = [x for x in targets.evaluate_targets([], old) if x.key == "threads_rate_vs_floor"]
    assert only.value is None and only.met is None and "not measured" in only.description


def test_targets_only_for_the_builtin_vecadd():
    report = _synthetic_report()
    assert targets.evaluate_targets(report.sizes, report.threads, builtin=False) == []


def test_targets_say_nothing_about_issue_numbers():
    report = _synthetic_report(_baseline())
    text = report.format_table()
    assert not re.search(r"\bissues?\b", text, re.IGNORECASE)
    assert not any(re.search(r"\bissues?\b", t.description, re.IGNORECASE) for t in report.targets)


def test_page_locked_target_not_measured_reads_n_a():
    sizes = _synthetic_sizes()
    del sizes[3].systems["vyre.pinned"]
    t = {(x.key, x.size_bytes): x for x in targets.evaluate_targets(sizes, None)}
    locked = t[("page_locked_gbps", 256 * MIB)]
    assert locked.value is None and locked.met is None
    assert records.target_status(locked) == "n/a"


# -- the table -------------------------------------------------------------------------------
def _line(lines, start):
    return next(line for line in lines if line.strip().startswith(start))


def test_format_table_header_and_small_size():
    text = _synthetic_report().format_table()
    lines = text.splitlines()
    assert "NVIDIA H200" in lines[0] and "cc 9.0" in lines[0]
    assert "CUDA driver 13.0 (580.159.04)" in lines[0]
    assert "commit abc123def456" in lines[1]
    assert "host memcpy ceilings on 1 and 16 thread(s)" in text
    assert "4 KiB per buffer (1,024 float32 elements for the floor, 8 KiB in + 4 KiB out" in text
    row = _line(lines, "vyre_cuda dispatch, numpy")
    # median, p10, p90, GB/s, x floor, x pageable
    assert row.split()[-6:] == [
        "18.00",
        "16.20",
        "19.80",
        f"{3 * 4096 / 18_000:.2f}",
        f"{18_000 / 17_100:.2f}x",
        f"{18_000 / 20_700:.2f}x",
    ]
    cupy = _line(lines, "CuPy RawKernel, full")
    assert cupy.split()[-3:] == [f"{54_300 / 17_100:.2f}x", f"{54_300 / 20_700:.2f}x", f"{54_300 / 18_000:.2f}x"]
    dma = _line(lines, "DMA ceiling: pinned -> device")
    assert dma.split()[-1] == f"{8192 / 6_000:.2f}"  # GB/s, no ratio columns
    assert any("skipped torch: torch is not installed" in line for line in lines)
    unattributed = _line(lines, "unattributed")
    assert unattributed.split()[-4] == f"{18_000 / len(STAGES) / 20 / 1000:.2f}"
    assert "within 10%: yes" in text
    threads = lines[lines.index(next(x for x in lines if x.startswith("up to 4 Python threads"))) :]
    assert threads[1].split() == ["dispatches", "per", "second", "1", "thread", "2", "threads", "4", "threads"]
    assert _line(threads, "per-buffer floor").split()[-3:] == ["58,000", "100,000", "150,000"]
    assert _line(threads, "tight floor").split()[-3:] == ["70,000", "120,000", "125,000"]
    assert _line(threads, "vyre_cuda").split()[-3:] == ["50,000", "75,000", "120,000"]
    assert _line(threads, "vyre_cuda / tight floor").split()[-3:] == ["0.71x", "0.62x", "0.96x"]
    assert (
        "allocations in 500 timed vyre_cuda dispatches: pinned 0 (0 per dispatch), device 0 (0 per dispatch)"
    ) in text
    assert str(_synthetic_report()) == text


def test_format_table_large_sizes_in_ms_with_gbps():
    text = _synthetic_report().format_table()
    lines = text.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("256 MiB per buffer")))
    block = lines[start : start + 40]
    assert "median ms" in block[1]
    row = _line(block, "vyre_cuda dispatch, numpy")
    assert row.split()[-6:-3] == ["36.00", "32.40", "39.60"]
    assert row.split()[-3] == f"{3 * 256 * MIB / 36e6:.2f}"
    copy = _line(block, "memcpy ceiling: pinned -> pageable, 16 threads")
    assert copy.split()[-1] == f"{256 * MIB / 5.8e6:.2f}"
    per_dir = _line(block, "per direction:")
    assert f"= H2D {2 * 256 * MIB / 20e6:.2f} GB/s" in per_dir
    assert f"= D2H {256 * MIB / 12e6:.2f} GB/s" in per_dir
    assert ("staging ring: 64.0 MiB pinned, 120 windows through it in the timed dispatches; 4 copy threads") in text
    assert (
        "H2D staged 20,480.0 MiB, direct 512.0 MiB; D2H staged 10,240.0 MiB, direct 0.0 MiB (all timed dispatches)"
    ) in text
    four = lines[lines.index(next(x for x in lines if x.startswith("4 MiB per buffer"))) :]
    assert "median us" in four[1] and "1,350.00" in four[2]
    assert (
        "allocations in 400 timed vyre_cuda dispatches: pinned 4 (0.01 per dispatch), "
        "device 0 (0 per dispatch) (pool misses: the core does not count allocations)"
    ) in text


def test_format_table_targets_block():
    text = _synthetic_report(_baseline()).format_table()
    lines = text.splitlines()
    assert "targets (ratios within this run)" in lines
    assert any(x.strip().startswith("[MISSED]") and "thread" in x for x in lines)
    assert any(x.strip().startswith("[ met  ]") and "CuPy" in x for x in lines)
    locked = _line(lines, "[ met  ] 256 MiB: vyre_cuda page-locked")
    assert locked.endswith(f"{3 * 256 * MIB / 16e6:.2f} GB/s (target >= 45)")
    assert _line(lines, "[MISSED] 64 MiB: vyre_cuda dispatch / the driver's pageable path").endswith("(target <= 0.35)")


def test_format_table_flags_poor_stage_coverage():
    report = _synthetic_report()
    report.sizes[0].attributed = _summary(12_000)
    assert "within 10%: NO" in report.format_table()


def test_driver_text():
    assert table.driver_text(13000) == "13.0"
    assert table.driver_text(12040) == "12.4"
    assert table.driver_text([13, 0]) == "13.0"
    assert table.driver_text(None) == "?"
    assert table.driver_text("r580") == "r580"


# -- JSON ------------------------------------------------------------------------------------
def test_json_round_trip():
    report = _synthetic_report(_baseline())
    data = json.loads(report.to_json())
    assert data["schema"] == P.SCHEMA
    small = data["sizes"][0]
    assert small["systems"]["vyre.dispatch"]["median_ns"] == 18_000
    assert small["ratios"]["vyre.dispatch"] == pytest.approx(18_000 / 17_100)
    assert small["coverage"] == pytest.approx(18_000 / 18_500)
    assert small["gbps"]["vyre.dispatch"] == pytest.approx(3 * 4096 / 18_000)
    assert "vyre.async_enqueue" not in small["gbps"]
    assert small["moved"] == {"floor": [8192, 4096], "vyre": [8192, 4096]}
    assert small["directions"]["h2d"]["median_ns"] == 4_000
    assert small["telemetry"]["dispatches"] == 500
    assert data["threads"]["tight_per_s"] == {"1": 70_000.0, "2": 120_000.0, "4": 125_000.0}
    assert [t["met"] for t in data["targets"] if t["key"] == "threads_rate_vs_floor"] == [False, True]
    assert any(t["unit"] == "GB/s" for t in data["targets"])
    again = H.BenchReport.from_json(report.to_json())
    assert again.to_dict() == report.to_dict()
    assert again.format_table() == report.format_table()


def _first_schema_result():
    # what `vyre-cuda profile --json` wrote before bytes, directions and telemetry were recorded
    summary = {"n": 100, "median_ns": 18_000.0, "p10_ns": 17_000.0, "p90_ns": 19_000.0}
    floor = dict(summary, median_ns=17_000.0)
    return {
        "schema": "vyre_cuda.profile/1",
        "meta": {"date": "2026-11-29T19:31:27+00:00", "commit": "8f72b158bb97"},
        "stage_names": list(STAGES),
        "sizes": [
            {
                "bytes": 4096,
                "elements": 1024,
                "iterations": 100,
                "systems": {"vyre.dispatch": summary, "floor.pinned": floor},
                "stages": {},
                "attributed": None,
                "coverage": None,
                "ratios": {},
                "skipped": {},
            }
        ],
        "threads": None,
        "targets": [
            {
                "key": "vyre_vs_floor",
                "description": "4 KiB: ...",
                "value": 1.06,
                "limit": 1.15,
                "op": "<=",
                "size_bytes": 4096,
                "met": True,
            }
        ],
    }


def test_reads_first_schema_results_as_baselines(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(_first_schema_result()))
    old = H.BenchReport.load(path)
    small = old.size(4096)
    assert small.moved == {} and small.telemetry == {} and small.directions == {}
    assert small.gbps("vyre.dispatch") == pytest.approx(3 * 4096 / 18_000)  # vecadd's bytes
    assert old.targets[0].unit == "" and "4 KiB per buffer" in old.format_table()
    t = _targets(_synthetic_report(old))[("no_regression", 4 * KIB)]
    assert t.value == pytest.approx((18_000 / 17_100) / (18_000 / 17_000))


def test_the_stored_benchmark_result_loads():
    stored = H.BenchReport.load(ROOT / "benchmarks" / "results" / "latest.json")
    small = stored.size(4096)
    assert small.median("vyre.dispatch") > 0 and small.ratio("vyre.dispatch") > 0
    assert "4 KiB per buffer" in stored.format_table()


def test_from_dict_and_load_refuse_other_files(tmp_path):
    for bad in ({"schema": "something else"}, ["not", "a", "dict"]):
        with pytest.raises(ValidationError) as err:
            H.BenchReport.from_dict(bad)
        assert _fix_line(err.value).startswith("Fix: ")
    with pytest.raises(ValidationError) as err:
        H.BenchReport.from_json("{not json")
    assert _fix_line(err.value).startswith("Fix: ")
    with pytest.raises(ValidationError) as err:
        H.BenchReport.load(tmp_path / "missing.json")
    assert "missing.json" in str(err.value)


# -- the plot --------------------------------------------------------------------------------
def test_plot_has_the_ratio_stage_and_bandwidth_panels(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.harness.plot import plot_bench
    from vyre_cuda.profile.plot import plot_report

    # the profile's own figure: no peers, no device panel
    report = _synthetic_report()
    fig = plot_report(P.ProfileReport(report.meta, report.sizes, STAGES), tmp_path / "own.png")
    axes = {ax.get_label(): ax for ax in fig.get_axes()}
    assert list(axes) == ["headline", "stages", "bandwidth"]
    assert {line.get_label() for line in axes["headline"].get_lines()} == {
        "vyre_cuda (= 1x)",
        "per-buffer floor (pinned staging)",
        "driver, pageable copies",
    }
    # the benchmark record's: the peers beside the floors, and the device panel
    path = tmp_path / "p.png"
    fig = plot_bench(_synthetic_report(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes = {ax.get_label(): ax for ax in fig.get_axes()}
    assert list(axes) == ["headline", "device", "stages", "bandwidth"]
    head = {line.get_label(): line for line in axes["headline"].get_lines()}
    assert set(head) == {
        "vyre_cuda (= 1x)",
        "per-buffer floor (pinned staging)",
        "driver, pageable copies",
        "CuPy",
        "cuda.bindings",
    }
    xs, ys = head["per-buffer floor (pinned staging)"].get_data()
    assert list(xs) == [4 * KIB, 4 * MIB, 64 * MIB, 256 * MIB]
    assert list(ys) == pytest.approx([17_100 / 18_000, 1_350_000 / 450_000, 30 / 9, 120 / 36])
    assert list(head["CuPy"].get_data()[0]) == [4 * KIB]  # measured at 4 KiB only
    assert not axes["device"].get_lines()  # no device-resident rows
    assert [t.get_text() for t in axes["stages"].get_xticklabels()] == ["4 KiB", "256 MiB"]  # the sizes with stages
    bandwidth = {line.get_label(): line for line in axes["bandwidth"].get_lines()}
    assert {"vyre_cuda, numpy", "DMA ceiling, one way", "host memcpy ceiling, 16 threads"} <= set(bandwidth)
    xs, ys = bandwidth["DMA ceiling, one way"].get_data()
    assert list(xs) == [4 * KIB, 256 * MIB]
    assert ys[1] == pytest.approx(2 * 256 * MIB / 9_760_000)
    xs, _ = bandwidth["vyre_cuda, numpy"].get_data()
    assert list(xs) == [4 * KIB, 4 * MIB, 64 * MIB, 256 * MIB]
    _synthetic_report().plot(tmp_path / "q.png")  # the report's own method writes the same
    assert (tmp_path / "q.png").stat().st_size > 10_000


def test_size_ticks_are_whole_powers_of_two_with_few_labels():
    from vyre_cuda.profile.plot import size_ticks

    major, minor = size_ticks([4 * KIB, 4 * MIB, 64 * MIB, 256 * MIB, GIB])
    assert major == [4 * KIB << 2 * k for k in range(10)]  # 4 KiB, 16 KiB ... 1 GiB
    assert sorted(major + minor) == [4 * KIB << k for k in range(19)]  # every power between
    assert [format_size(n) for n in major[::4]] == ["4 KiB", "1 MiB", "256 MiB"]
    major, minor = size_ticks([4 * KIB, 1 << 40])  # 29 powers: every 4th labelled, at most 10
    assert major == [4 * KIB << 4 * k for k in range(8)] and len(minor) == 21
    assert size_ticks([4 * KIB]) == ([2 * KIB, 4 * KIB, 8 * KIB], [])  # one size: its neighbours too
    assert size_ticks([3 * MIB]) == ([2 * MIB, 4 * MIB], [])
    assert size_ticks([100, 6000])[0] == [64, 128, 256, 512, KIB, 2 * KIB, 4 * KIB, 8 * KIB]
    for sizes in ([1], [4 * KIB, 8 * KIB], [5 * MIB, 7 * GIB], [12, 1 << 36]):
        major, minor = size_ticks(sizes)
        assert 2 <= len(major) <= 10 and major == sorted(major)
        assert all(n & (n - 1) == 0 for n in major + minor)
        assert major[0] <= min(sizes) and major[-1] >= max(sizes)


def test_plot_size_axis_is_log_scale_with_byte_labels(tmp_path):
    pytest.importorskip("matplotlib")
    from vyre_cuda.profile.plot import plot_report

    fig = plot_report(_synthetic_report(), tmp_path / "p.png")
    axes = {ax.get_label(): ax for ax in fig.get_axes()}
    for ax in (axes["headline"], axes["bandwidth"]):
        assert ax.get_xscale() == "log"
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB", "16 MiB", "64 MiB", "256 MiB"]
        assert not any(t.get_text() for t in ax.get_xticklabels(minor=True))  # no 2^13 or 10^3
        lo, hi = ax.get_xlim()
        assert lo < 4 * KIB and hi > 256 * MIB


def test_plot_without_matplotlib_says_how_to_fix(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    path = tmp_path / "p.png"
    with pytest.raises(UnsupportedFeature) as err:
        _synthetic_report().plot(path)
    assert "matplotlib" in _fix_line(err.value)
    assert not path.exists()


def test_constants_of_the_targets():
    assert targets.PAGEABLE_LIMITS == {4 * MIB: 0.5, 64 * MIB: 0.35}
    assert targets.BANDWIDTH_MIN == 256 * MIB
    assert (targets.NUMPY_GBPS, targets.PAGE_LOCKED_GBPS) == (25.0, 45.0)
    assert (targets.ASYNC_ENQUEUE, targets.NO_REGRESSION) == (1.2, 1.05)
