"""The profiling harness without a GPU: statistics, parsing, report formats, CLI, and the run's
orchestration on a fake backend and a fake floor."""

import argparse
import io
import json
import re
import sys
import threading
import time
import types

import numpy as np
import pytest

import vyre_cuda
from vyre_cuda import profile as P
from vyre_cuda.errors import BackendError, UnsupportedFeature, ValidationError
from vyre_cuda.program import BindingRole, BufferDecl


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


def test_ratio_gain_throughput():
    assert P.ratio(115.0, 100.0) == pytest.approx(1.15)
    assert P.ratio(None, 1.0) is None
    assert P.ratio(1.0, None) is None
    assert P.ratio(1.0, 0.0) is None
    assert P.gain(1000.0, 1800.0) == pytest.approx(1.8)
    assert P.gain(None, 1800.0) is None
    assert P.throughput(2000, 1_000_000_000) == pytest.approx(2000.0)
    assert P.throughput(1, 20_000) == pytest.approx(50_000.0)
    with pytest.raises(ValueError):
        P.throughput(1, 0)


# -- sizes -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("4096", 4096), ("4K", 4096), ("4k", 4096), ("4KiB", 4096), ("4kib", 4096),
        ("4M", 4 << 20), ("4MiB", 4 << 20), ("1G", 1 << 30), ("12B", 12), (" 8 KiB ", 8192),
        (4096, 4096), (np.int64(64), 64),
    ],
)
def test_parse_size(text, expected):
    assert P.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "4KB", "4 MB", "-4K", "4.5K", "0", "0K", "four", "4T"])
def test_parse_size_errors_have_fix(text):
    with pytest.raises(ValidationError) as err:
        P.parse_size(text)
    assert _fix_line(err.value).startswith("Fix: ")


def test_parse_sizes_list_dedup_order():
    assert P.parse_sizes("4KiB,4MiB") == (4096, 4 << 20)
    assert P.parse_sizes("4MiB, 4K ,4096,") == (4 << 20, 4096)
    assert P.parse_sizes([4096, "8K"]) == (4096, 8192)
    with pytest.raises(ValidationError):
        P.parse_sizes(" , ")
    with pytest.raises(ValidationError):
        P.parse_sizes("4K,x")


def test_format_size():
    assert P.format_size(4096) == "4 KiB"
    assert P.format_size(4 << 20) == "4 MiB"
    assert P.format_size(6144) == "6 KiB"
    assert P.format_size(1000) == "1000 B"
    assert P.format_size(1536 * 1024 + 4) == f"{1536 * 1024 + 4} B"


# -- buffer specs ----------------------------------------------------------------------------
def test_parse_buffer_spec_roles_and_bindings():
    decls = P.parse_buffer_spec("a:f32:in, b:float32:in ,acc:i32:inout,out:f32:out")
    assert [d.name for d in decls] == ["a", "b", "acc", "out"]
    assert [d.binding for d in decls] == [0, 1, 2, 3]
    assert [d.role for d in decls] == [
        BindingRole.INPUT, BindingRole.INPUT, BindingRole.INPUT_OUTPUT, BindingRole.OUTPUT,
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
    ptx.write_text(
        ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry main() { ret; }\n"
    )
    assert P.load_user_program(ptx, None, "o:u32:out").kernel.kind == "ptx"


def test_load_user_program_errors(tmp_path):
    with pytest.raises(ValidationError) as err:
        P.load_user_program(tmp_path / "missing.cu", "k", "a:f32:out")
    assert _fix_line(err.value).startswith("Fix: ")
    (tmp_path / "k.cu").write_text("// nothing")
    with pytest.raises(ValidationError):
        P.load_user_program(tmp_path / "k.cu", "k", None)


# -- engine pieces ---------------------------------------------------------------------------
STAGES = P.STAGE_NAMES


def test_assemble_stages_unattributed_and_coverage():
    walls = [100, 110, 120, 130]
    stage_rows = []
    for _ in walls:
        row = [0] * len(STAGES)
        row[0], row[-1] = 40, 50  # 90 attributed per dispatch
        stage_rows.append(tuple(row))
    samples = {
        "vyre.dispatch_profiled": walls,
        "_stages": stage_rows,
        "floor.pinned": [80, 80, 80],
    }
    r = P._assemble(4096, 1024, 4, samples, STAGES, {"cupy": "not installed"})
    assert set(r.systems) == {"vyre.dispatch_profiled", "floor.pinned"}  # "_" keys are raw data
    assert r.stages[STAGES[0]].median == 40
    assert r.stages[STAGES[-1]].median == 50
    assert r.stages[STAGES[1]].median == 0
    assert r.stages[P.UNATTRIBUTED].median == pytest.approx(25.0)  # 10, 20, 30, 40
    assert r.attributed.median == 90
    assert r.wall == pytest.approx(115.0)
    assert r.coverage == pytest.approx(90 / 115)
    assert r.skipped == {"cupy": "not installed"}
    # The sum of stage medians plus the unattributed median equals the wall median here.
    total = sum(r.stages[n].median for n in list(STAGES) + [P.UNATTRIBUTED])
    assert total == pytest.approx(r.wall)


def test_assemble_rejects_misaligned_stage_data():
    with pytest.raises(ValueError):
        P._assemble(4096, 1024, 2, {"vyre.dispatch_profiled": [1, 2], "_stages": [(0,) * 11]},
                    STAGES, {})
    with pytest.raises(ValueError):
        P._assemble(4096, 1024, 1, {"vyre.dispatch_profiled": [1], "_stages": [(0, 0)]},
                    STAGES, {})


class _Recorder:
    def __init__(self, name, log, key, value=1, unit_scale=1, fail_at=None, ok=True, group=None):
        self.calls = []
        self.log = log
        self.key = key
        self.value = value
        self.fail_at = fail_at
        self.runner = P._Runner(name, self, (lambda: ok), unit_scale, group)

    def __call__(self, count):
        self.calls.append(count)
        self.log.append(self.runner.name)
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise RuntimeError("peer broke")
        return {self.key: [self.value] * count}


def test_run_rounds_interleaves_and_splits_counts():
    log = []
    a = _Recorder("A", log, "a", 1)
    b = _Recorder("B", log, "b", 2)
    c = _Recorder("C", log, "c", 3, unit_scale=10)
    seen = []
    samples = P._run_rounds([a.runner, b.runner, c.runner], 23, 5, 4,
                            progress=lambda label, f: seen.append(f))
    assert log == ["A", "B", "C"] + ["A", "B", "C"] * 4  # warm-up, then rounds in turn
    assert a.calls == [5, 6, 6, 6, 5] and sum(a.calls[1:]) == 23
    assert len(samples["a"]) == 23 and len(samples["b"]) == 23
    assert c.calls[0] == 1 and all(n == 1 for n in c.calls[1:])  # ceil(6 / 10) batches
    assert set(samples) == {"a", "b", "c"}
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)


def test_run_rounds_always_verifies_once_even_without_warmup():
    log = []
    a = _Recorder("A", log, "a")
    P._run_rounds([a.runner], 3, 0, 3)
    assert a.calls == [1, 1, 1, 1]


def test_run_rounds_wrong_result_raises_for_vyre_and_floor():
    bad = _Recorder("vyre", [], "v", ok=False)
    with pytest.raises(P.WrongResult):
        P._run_rounds([bad.runner], 4, 1, 2)


def test_run_rounds_drops_a_failing_peer_group_only():
    log = []
    floor = _Recorder("floor", log, "floor.pinned")
    full = _Recorder("peer cupy", log, "peer.cupy", fail_at=3, group="cupy")
    launch = _Recorder("peer cupy launch", log, "peer.cupy.launch_only", group="cupy")
    wrong = _Recorder("peer torch", log, "peer.torch", ok=False, group="torch")
    failed = {}
    samples = P._run_rounds([floor.runner, full.runner, launch.runner, wrong.runner], 9, 1, 3,
                            failed=failed)
    assert set(samples) == {"floor.pinned"}
    assert len(samples["floor.pinned"]) == 9
    assert failed["cupy"].startswith("failed: RuntimeError: peer broke")
    assert failed["torch"].startswith("failed: WrongResult")
    assert len(launch.calls) == 2  # warm-up and round 1, then dropped with its group


def test_run_rounds_non_peer_failure_propagates():
    broken = _Recorder("floor", [], "f", fail_at=2)
    with pytest.raises(RuntimeError):
        P._run_rounds([broken.runner], 4, 1, 2)


# -- report formats --------------------------------------------------------------------------
def _summary(median, spread=0.1, n=1000):
    return P.Summary(n, float(median), median * (1 - spread), median * (1 + spread))


def _synthetic_report():
    small = P.SizeResult(4096, 1024, 2000, skipped={"torch": "torch is not installed"})
    small.systems = {
        "floor.pinned": _summary(17_100),
        "floor.pinned_enqueue": _summary(9_700),
        "floor.pageable": _summary(20_700),
        "floor.launch_only": _summary(3_500),
        "vyre.dispatch": _summary(18_000),
        "vyre.dispatch_profiled": _summary(18_500),
        "vyre.async_enqueue": _summary(10_000),
        "vyre.async_total": _summary(18_200),
        "peer.cupy": _summary(54_300),
        "peer.cuda_bindings": _summary(24_000),
    }
    per = 18_000 / len(STAGES)
    small.stages = {name: _summary(per) for name in STAGES}
    small.stages[P.UNATTRIBUTED] = _summary(500)
    small.attributed = _summary(18_000)
    large = P.SizeResult(4 << 20, 1 << 20, 476)
    large.systems = {
        "floor.pinned": _summary(1_350_000),
        "floor.pinned_enqueue": _summary(700_000),
        "floor.pageable": _summary(1_000_000),
        "vyre.dispatch": _summary(1_300_000),
        "vyre.dispatch_profiled": _summary(1_300_000),
        "vyre.async_enqueue": _summary(900_000),
    }
    threads = P.ThreadScaling(4096, 2, 2000, vyre={1: 50_000.0, 2: 75_000.0},
                              floor={1: 58_000.0, 2: 100_000.0})
    meta = {
        "date": "2026-11-30T12:00:00+00:00", "device": 0, "device_name": "NVIDIA H200",
        "cc": [9, 0], "driver_version": 13000, "driver_release": "580.159.04",
        "vyre_cuda_version": "0.1.0", "commit": "abc123def456", "python": "3.12.3",
        "rounds": 5, "program": "vecadd_f32 (built-in)",
    }
    sizes = [small, large]
    return P.ProfileReport(meta, sizes, threads, P.evaluate_targets(sizes, threads), STAGES)


def test_evaluate_targets():
    report = _synthetic_report()
    t = {(x.key, x.size_bytes): x for x in report.targets}
    small = t[("vyre_vs_floor", 4096)]
    assert small.value == pytest.approx(18_000 / 17_100) and small.limit == 1.15 and small.met
    cupy = t[("cupy_vs_vyre", 4096)]
    assert cupy.value == pytest.approx(54_300 / 18_000) and cupy.met
    assert ("torch_vs_vyre", 4096) not in t  # not measured, no target
    assert t[("async_enqueue_vs_floor_enqueue", 4096)].met  # 10.0 / 9.7
    large = t[("vyre_vs_floor", 4 << 20)]
    assert large.value == pytest.approx(1_300_000 / 1_350_000) and large.met
    async_large = t[("async_enqueue_vs_floor_enqueue", 4 << 20)]
    assert async_large.value == pytest.approx(900 / 700) and async_large.met is False
    pageable = t[("vyre_vs_floor_pageable", 4 << 20)]
    assert pageable.op == "report" and pageable.met is None
    assert pageable.value == pytest.approx(1.3)
    thread = t[("thread_gain_ratio", 4096)]
    assert thread.value == pytest.approx((75 / 50) / (100 / 58)) and thread.met is False
    assert P.evaluate_targets(report.sizes, report.threads, builtin=False) == []


def test_size_result_ratios_and_thread_gains():
    report = _synthetic_report()
    small = report.size(4096)
    assert small.ratio("vyre.dispatch") == pytest.approx(18_000 / 17_100)
    assert small.ratio("vyre.async_enqueue") == pytest.approx(10_000 / 9_700)
    assert small.ratio("floor.pageable") == pytest.approx(20_700 / 17_100)
    assert small.ratio("peer.torch") is None
    assert small.coverage == pytest.approx(18_000 / 18_500)
    th = report.threads
    assert th.vyre_gain == pytest.approx(1.5)
    assert th.floor_gain == pytest.approx(100 / 58)
    assert th.gain_ratio == pytest.approx(1.5 / (100 / 58))
    with pytest.raises(KeyError):
        report.size(8192)


def test_format_table():
    text = _synthetic_report().format_table()
    lines = text.splitlines()
    assert "NVIDIA H200" in lines[0] and "cc 9.0" in lines[0]
    assert "CUDA driver 13.0 (580.159.04)" in lines[0]
    assert "commit abc123def456" in lines[1]
    row = next(line for line in lines if line.strip().startswith("vyre_cuda dispatch  "))
    assert row.split()[-4:] == ["18.00", "16.20", "19.80", f"{18_000 / 17_100:.2f}x"]
    cupy = next(line for line in lines if "CuPy RawKernel, full" in line)
    assert cupy.split()[-2:] == [f"{54_300 / 17_100:.2f}x", f"{54_300 / 18_000:.2f}x"]
    assert any("skipped torch: torch is not installed" in line for line in lines)
    assert "4 KiB per buffer" in text and "4 MiB per buffer" in text
    assert "1,350.00" in text  # microseconds with thousands separators
    unattributed = next(line for line in lines if "unattributed" in line)
    assert unattributed.split()[-4] == "0.50"
    assert "within 10%: yes" in text
    assert "vyre_cuda gain / floor gain: 0.87" in text
    assert any(line.strip().startswith("[MISSED]") and "thread" in line for line in lines)
    assert any(line.strip().startswith("[ met  ]") and "CuPy" in line for line in lines)
    assert str(_synthetic_report()) == text


def test_format_table_flags_poor_stage_coverage():
    report = _synthetic_report()
    report.sizes[0].attributed = _summary(12_000)
    assert "within 10%: NO" in report.format_table()


def test_json_round_trip():
    report = _synthetic_report()
    data = json.loads(report.to_json())
    assert data["schema"] == P.SCHEMA
    assert data["sizes"][0]["systems"]["vyre.dispatch"]["median_ns"] == 18_000
    assert data["sizes"][0]["ratios"]["vyre.dispatch"] == pytest.approx(18_000 / 17_100)
    assert data["sizes"][0]["coverage"] == pytest.approx(18_000 / 18_500)
    assert data["threads"]["gain_ratio"] == pytest.approx(1.5 / (100 / 58))
    assert any(t["key"] == "thread_gain_ratio" and t["met"] is False for t in data["targets"])
    again = P.ProfileReport.from_json(report.to_json())
    assert again.to_dict() == report.to_dict()
    assert again.format_table() == report.format_table()


def test_from_dict_refuses_other_json():
    with pytest.raises(ValidationError) as err:
        P.ProfileReport.from_dict({"schema": "something else"})
    assert _fix_line(err.value).startswith("Fix: ")


def test_plot_writes_png_or_says_how_to_fix(tmp_path):
    path = tmp_path / "p.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(UnsupportedFeature) as err:
            _synthetic_report().plot(path)
        assert "matplotlib" in _fix_line(err.value)
        assert not path.exists()
    else:
        _synthetic_report().plot(path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- progress --------------------------------------------------------------------------------
class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_progress_line_quiet_on_short_runs_then_shown():
    stream = _Stream(tty=True)
    line = P._ProgressLine(stream, delay=3600)
    line("4 KiB: floor", 0.5)
    line.done()
    assert stream.getvalue() == ""
    stream = _Stream(tty=True)
    line = P._ProgressLine(stream, delay=0)
    line("4 KiB: floor", 0.5)
    line.done()
    assert stream.getvalue().startswith("\r[vyre-cuda profile]  50% 4 KiB: floor")
    assert stream.getvalue().endswith("\r")
    stream = _Stream(tty=False)
    line = P._ProgressLine(stream, delay=0, interval=3600)
    line("a", 0.1)
    line("b", 0.2)  # rate-limited when not a terminal
    assert stream.getvalue().count("\n") == 1 and "\r" not in stream.getvalue()


# -- CLI -------------------------------------------------------------------------------------
def _parser():
    parser = argparse.ArgumentParser(prog="vyre-cuda profile")
    assert P.add_arguments(parser) is parser
    return parser


def test_cli_defaults():
    args = _parser().parse_args([])
    assert args.sizes == (4096, 4 << 20)
    assert args.iterations is None and args.warmup is None
    assert args.json is None and args.plot is None
    assert not args.no_peers and not args.no_threads
    assert args.kernel is None and args.entry is None and args.buffers is None
    assert args.device == 0


def test_cli_options():
    args = _parser().parse_args([
        "--sizes", "8KiB,1M", "--iterations", "50", "--warmup", "0", "--json", "--plot", "x.png",
        "--no-peers", "--no-threads", "--kernel", "k.cu", "--entry", "k", "--buffers",
        "a:f32:in,o:f32:out", "--device", "1",
    ])
    assert args.sizes == (8192, 1 << 20)
    assert (args.iterations, args.warmup, args.json, args.plot) == (50, 0, "-", "x.png")
    assert args.no_peers and args.no_threads
    assert (args.kernel, args.entry, args.buffers, args.device) == (
        "k.cu", "k", "a:f32:in,o:f32:out", 1)
    assert _parser().parse_args(["--json", "out.json"]).json == "out.json"


@pytest.mark.parametrize(
    "argv",
    [["--sizes", "4KB"], ["--sizes", ""], ["--iterations", "0"], ["--iterations", "x"],
     ["--warmup", "-1"], ["--device", "-1"], ["--bogus"]],
)
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as err:
        _parser().parse_args(argv)
    assert err.value.code == 2
    if argv[0] == "--sizes" and argv[1]:
        assert "Fix:" in capsys.readouterr().err


def test_cli_main_validation_errors(capsys, tmp_path):
    parser = _parser()
    assert P.main(parser.parse_args(["--buffers", "a:f32:in,o:f32:out"])) == 2
    assert "no --kernel was given" in capsys.readouterr().err
    assert P.main(parser.parse_args(["--kernel", str(tmp_path / "none.cu"), "--buffers",
                                     "a:f32:in,o:f32:out"])) == 2
    err = capsys.readouterr().err
    assert "ValidationError" in err and "Fix:" in err
    (tmp_path / "k.cu").write_text("// k")
    assert P.main(parser.parse_args(["--kernel", str(tmp_path / "k.cu"), "--buffers",
                                     "a:f32:in"])) == 2
    assert "declares no output" in capsys.readouterr().err


def test_run_profile_validates_before_touching_the_device():
    with pytest.raises(ValidationError):
        P.run_profile(sizes=(4098,))
    with pytest.raises(ValidationError):
        P.run_profile(sizes=(4096,), iterations=0)
    with pytest.raises(ValidationError):
        P.run_profile(sizes=(4096,), warmup=-1)
    with pytest.raises(ValidationError):
        P.run_profile(sizes=(4096,), iterations=True)


# -- the whole run on a fake backend and a fake floor ----------------------------------------
class _FakePending:
    def __init__(self, outs):
        self._outs = outs

    def result(self):
        return self._outs


def _fake_add(inputs):
    return [inputs[0] + inputs[1] if len(inputs) > 1 else inputs[0].copy()]


class _FakeBackend:
    device = 0
    context_handle = 0x1234
    caps = types.SimpleNamespace(cc=(9, 0), name="Fake GPU", driver_version=13000)

    def __init__(self, device=0):
        self.closed = False
        self.dispatches = 0
        self.threads_seen = set()
        self.lock = threading.Lock()

    def dispatch(self, program, inputs, config=None):
        with self.lock:
            self.dispatches += 1
            self.threads_seen.add(threading.get_ident())
        return _fake_add(inputs)

    def _dispatch_profiled(self, program, inputs, config=None, start_ns=0):
        t0 = time.perf_counter_ns()
        outs = _fake_add(inputs)
        spent = time.perf_counter_ns() - t0
        stages = [spent // len(STAGES)] * len(STAGES)
        return outs, tuple(stages)

    def dispatch_async(self, program, inputs, config=None):
        return _FakePending(_fake_add(inputs))

    def close(self):
        self.closed = True


def _fake_floor_module():
    mod = types.ModuleType("vyre_cuda._floor")
    mod.FLOOR_ENTRY = "vecadd"
    mod.FLOOR_SOURCE = "// fake"
    mod.opened = []

    class FloorKernel:
        def __init__(self, ctx, image, entry):
            assert ctx == _FakeBackend.context_handle and image == b"fake\0" and entry == "vecadd"
            self.closed = False

        def close(self):
            self.closed = True

    class Floor:
        def __init__(self, kernel, n):
            self.n = n
            self.closed = False
            mod.opened.append(self)

        def _run(self, a, b, out, count, total, enqueue):
            np.add(a, b, out=out)
            return np.full(count, total, np.int64), np.full(count, enqueue, np.int64)

        def full_pinned(self, a, b, out, count):
            return self._run(a, b, out, count, 20_000, 10_000)

        def full_pageable(self, a, b, out, count):
            return self._run(a, b, out, count, 24_000, 14_000)

        def launch_only(self, batches, batch_size, warmup_batches):
            assert batch_size == P.LAUNCH_BATCH
            return np.full(batches, 3_500, np.int64)

        def close(self):
            self.closed = True

    def floor_threaded(kernel, n, threads, iterations, warmup):
        return {"threads": threads, "iterations": iterations, "dispatches_per_s": 50_000.0 * (
            1.0 if threads == 1 else 1.8), "outputs_ok": True}

    mod.FloorKernel = FloorKernel
    mod.Floor = Floor
    mod.floor_threaded = floor_threaded
    return mod


@pytest.fixture
def fake_device(monkeypatch):
    floor = _fake_floor_module()
    dispatch = types.ModuleType("vyre_cuda._dispatch")
    dispatch.STAGES = STAGES
    builtins = types.ModuleType("vyre_cuda.builtin_programs")
    builtins.vecadd_f32 = lambda: types.SimpleNamespace(
        name="vecadd_f32",
        inputs=(BufferDecl.read("a", 0, "f32"), BufferDecl.read("b", 1, "f32")),
    )
    monkeypatch.setitem(sys.modules, "vyre_cuda._floor", floor)
    monkeypatch.setitem(sys.modules, "vyre_cuda._dispatch", dispatch)
    monkeypatch.setattr(vyre_cuda, "_floor", floor, raising=False)
    monkeypatch.setattr(vyre_cuda, "builtin_programs", builtins, raising=False)
    created = []

    def backend_factory(device=0):
        b = _FakeBackend(device)
        created.append(b)
        return b

    monkeypatch.setattr(vyre_cuda, "CudaBackend", backend_factory, raising=False)
    import vyre_cuda.compile as compile_module

    monkeypatch.setattr(compile_module, "compile_kernel",
                        lambda kernel, arch=None: types.SimpleNamespace(image=b"fake\0",
                                                                         kind="cubin"))
    return types.SimpleNamespace(floor=floor, created=created)


def test_run_profile_end_to_end_on_fakes(fake_device):
    backend = _FakeBackend()
    progress = []
    report = P.run_profile(sizes="4KiB,8KiB", iterations=40, warmup=3, peers=False, threads=True,
                           progress=lambda label, f: progress.append((label, f)),
                           backend=backend, rounds=4, thread_iterations=10, thread_repeats=1)
    assert not backend.closed  # a caller's backend stays open
    assert all(f.closed for f in fake_device.floor.opened)
    assert [s.nbytes for s in report.sizes] == [4096, 8192]
    small = report.size(4096)
    assert small.elements == 1024 and small.iterations == 40
    assert set(small.systems) == {
        "vyre.dispatch", "vyre.dispatch_profiled", "vyre.async_enqueue", "vyre.async_total",
        "floor.pinned", "floor.pinned_enqueue", "floor.pageable", "floor.pageable_enqueue",
        "floor.launch_only",
    }
    for key in ("vyre.dispatch", "vyre.dispatch_profiled", "floor.pinned", "vyre.async_total"):
        assert small.systems[key].n == 40
    assert small.median("floor.pinned") == 20_000
    assert small.median("floor.launch_only") == 3_500
    assert set(small.stages) == set(STAGES) | {P.UNATTRIBUTED}
    assert 0 < small.coverage <= 1.0
    assert report.threads.floor_gain == pytest.approx(1.8)
    assert report.threads.vyre[1] > 0 and report.threads.vyre[2] > 0
    assert len(backend.threads_seen) >= 2  # the 2-thread run really used 2 threads
    keys = {t.key for t in report.targets}
    assert {"vyre_vs_floor", "async_enqueue_vs_floor_enqueue", "thread_gain_ratio"} <= keys
    assert report.meta["device_name"] == "Fake GPU" and report.meta["program"].startswith("vecadd")
    assert report.stage_names == STAGES
    assert progress and progress[-1][1] == pytest.approx(1.0)
    assert [f for _, f in progress] == sorted(f for _, f in progress)
    assert P.ProfileReport.from_json(report.to_json()).to_dict() == report.to_dict()


def test_run_profile_peers_skip_by_name_for_user_programs(fake_device):
    program = types.SimpleNamespace(
        name="scale", kernel=types.SimpleNamespace(kind="cuda", entry="scale"),
        inputs=(BufferDecl.read("x", 0, "f64"),),
    )
    backend = _FakeBackend()
    report = P.run_profile(sizes=(4096,), iterations=8, warmup=1, program=program, peers=True,
                           threads=False, backend=backend, rounds=2)
    s = report.size(4096)
    assert set(s.skipped) == {"cuda_bindings", "cupy", "torch"}
    assert report.targets == [] and report.threads is None
    assert "scale" in report.meta["program"]


def test_cli_main_end_to_end_on_fakes(fake_device, tmp_path, capsys):
    out = tmp_path / "r.json"
    args = _parser().parse_args(["--sizes", "4KiB", "--iterations", "6", "--warmup", "1",
                                 "--no-peers", "--no-threads", "--json", str(out)])
    assert P.main(args) == 0
    printed = capsys.readouterr().out
    assert "4 KiB per buffer" in printed and "Fake GPU" in printed
    data = json.loads(out.read_text())
    assert data["sizes"][0]["bytes"] == 4096
    assert fake_device.created and fake_device.created[0].closed  # the CLI's backend is closed
    args = _parser().parse_args(["--sizes", "4KiB", "--iterations", "4", "--no-peers",
                                 "--no-threads", "--json"])
    assert P.main(args) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == P.SCHEMA


def test_backend_errors_become_exit_status(fake_device, monkeypatch, capsys):
    def broken(device=0):
        raise vyre_cuda.DriverUnavailable("no CUDA driver was found", "install the NVIDIA driver")

    monkeypatch.setattr(vyre_cuda, "CudaBackend", broken)
    args = _parser().parse_args(["--no-peers", "--no-threads"])
    assert P.main(args) == 1
    assert "Fix: install the NVIDIA driver" in capsys.readouterr().err
    assert issubclass(P.WrongResult, BackendError)


def test_vyre_cuda_cli_exposes_profile(fake_device, capsys):
    from vyre_cuda import cli

    args = cli.build_parser().parse_args(["profile", "--sizes", "4KiB", "--no-peers"])
    assert args.func is P.main and args.sizes == (4096,) and args.no_peers
    assert cli.main(["profile", "--sizes", "4KiB", "--iterations", "4", "--no-peers",
                     "--no-threads"]) == 0
    assert "4 KiB per buffer" in capsys.readouterr().out


# -- benchmarks/ -----------------------------------------------------------------------------
def _load_bench(name):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_write_readme_replaces_only_the_results_section(tmp_path):
    wr = _load_bench("write_readme")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nhand-written\n\n{wr.BEGIN}\nold figures\n{wr.END}\n\nfooter\n")
    report = _synthetic_report()
    assert wr.update_readme(readme, report, source=tmp_path / "r.json") is True
    text = readme.read_text()
    assert text.startswith("# Title\n\nhand-written\n\n" + wr.BEGIN + "\n")
    assert text.endswith(wr.END + "\n\nfooter\n")
    assert "old figures" not in text
    assert "2026-11-30T12:00:00+00:00" in text and "**NVIDIA H200** (cc 9.0)" in text
    assert "CUDA driver 13.0 (580.159.04)" in text and "`abc123def456`" in text
    assert re.search(r"\| 2 threads, 4 KiB: vyre_cuda gain / floor gain \| 0\.87 \| >= ?0\.9 \| \*\*missed\*\* \|", text), text
    assert "```text\n" + report.format_table().rstrip("\n") + "\n```" in text
    assert wr.update_readme(readme, report, source=tmp_path / "r.json") is False  # idempotent
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError):
        wr.update_readme(readme, report)


def test_write_readme_main_and_check(tmp_path, capsys):
    wr = _load_bench("write_readme")
    result = tmp_path / "r.json"
    result.write_text(_synthetic_report().to_json())
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{wr.BEGIN}\n{wr.END}\n")
    assert wr.main([str(result), "--readme", str(readme), "--check"]) == 1
    assert wr.main([str(result), "--readme", str(readme)]) == 0
    assert wr.main([str(result), "--readme", str(readme), "--check"]) == 0


def test_repository_readme_has_the_markers_and_targets():
    import pathlib

    wr = _load_bench("write_readme")
    text = (pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "README.md").read_text()
    assert text.count(wr.BEGIN) == 1 and text.count(wr.END) == 1
    for target in ("1.15x", "2.5x", "1.2x", "<= 1.0x", "0.9x"):
        assert target in text


def test_bench_dispatch_writes_json_on_fakes(fake_device, tmp_path, capsys):
    bench = _load_bench("bench_dispatch")
    out = tmp_path / "results" / "latest.json"
    assert bench.main(["--out", str(out), "--iterations", "4", "--warmup", "1", "--no-peers",
                       "--no-threads", "--sizes", "4KiB"]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == P.SCHEMA and data["sizes"][0]["bytes"] == 4096
    assert "4 KiB per buffer" in capsys.readouterr().out
    assert set(bench.BENCHES) == {"small", "large", "threads"}
