"""The patterns users are taught (benchmarks/harness/patterns.py) without a GPU: every row end to end on
the fake backend and the faked peers' libraries, each output checked against numpy, the targets
under their keys, a peer not installed giving no row and no target, the budget sweep's stops, the
report, the table, ``vyre-cuda profile --patterns-only / --no-patterns`` and bench_dispatch.py."""

import json
import pathlib
import sys
import types

import numpy as np
import profile_fakes
import pytest
from profile_fakes import FakeBackend

import benchmarks.harness as H
import vyre_cuda
from benchmarks.harness import patterns, records, targets
from benchmarks.harness.records import PatternResult
from vyre_cuda import profile as P
from vyre_cuda.errors import BackendError

ROOT = pathlib.Path(__file__).resolve().parent.parent
KIB, MIB = 1024, 1 << 20
SMALL = profile_fakes.PATTERNS_SMALL
SYNCHRONIZE = patterns.context_synchronize  # (the fixture swaps it for a recorder)
CHAIN_KEYS = {
    "pattern.chain.kept",
    "pattern.chain.taken",
    "pattern.chain.taken.fence",
    "pattern.chain.cupy_alloc",
    "pattern.chain.dropped",
    "pattern.chain.cuda_core",
    "pattern.chain.cupy",
    "pattern.chain.torch",
}
ALL_KEYS = CHAIN_KEYS | {
    "pattern.enqueue.single",
    "pattern.dropped.host",
    "pattern.dropped.host_drained",
    "pattern.dropped.device",
    "pattern.dropped.host.shared",
    "pattern.inflight",
    "pattern.inflight.shared",
    "pattern.await",
    "pattern.blocking",
    "pattern.gather",
}
TARGET_KEYS = {
    "chain_vs_cuda_core",
    "dropped_vs_enqueue",
    "await_vs_blocking",
    "await_idle_cpu",
    "inflight_1000_vs_single",
    "budget_min_rate",
}
# the fake backend refuses budgets below FakeBackend.min_budget (100,000), naming it: from 512 KiB
# halving, 512, 256 and 128 KiB are accepted, 64 KiB refused, then the named 100,000 measured
SWEPT = [None, 512 * KIB, 256 * KIB, 128 * KIB, 100_000]


@pytest.fixture
def fake_device(monkeypatch):
    return profile_fakes.install(monkeypatch)


@pytest.fixture
def with_peers(fake_device, monkeypatch):
    core = profile_fakes.install_peer_libraries(monkeypatch)
    monkeypatch.setattr(patterns, "peer_available", lambda name: True)
    return core


def _measure(backend=None, settings=None, **kwargs):
    backend = backend if backend is not None else FakeBackend()
    return patterns.measure_patterns(
        backend, "// fake", "vecadd", rounds=2, rng=np.random.default_rng(7), settings=settings, **kwargs
    )


def _keys(result):
    return {t.key for t in targets.evaluate_pattern_targets(result)}


# -- every pattern, end to end ----------------------------------------------------------------
def test_every_pattern_runs_beside_its_peers(with_peers, fake_device):
    backend = FakeBackend()
    seen = []
    result = _measure(backend, progress=lambda label, f: seen.append(f))
    assert result.skipped == {}
    assert set(result.systems) == ALL_KEYS
    # the batch rows: repetitions of `steps` calls; the awaits and blocking dispatches one by one
    for key in ALL_KEYS - {"pattern.await", "pattern.blocking", "pattern.gather"}:
        assert result.systems[key].n == SMALL.repeats, key
    assert result.systems["pattern.await"].n == result.systems["pattern.blocking"].n == SMALL.awaits
    assert result.systems["pattern.gather"].n == SMALL.gathers
    assert all(s.median > 0 for s in result.systems.values())
    # the README's chain: the CuPy Stream object in the config, inside `with stream:` (the fake
    # CuPy's current stream is the chain's at each of those dispatches), outputs named
    chained = [i for i, (kind, _, cfg) in enumerate(backend.calls) if kind == "dispatch_async" and cfg is not None]
    chained = [i for i in chained if backend.calls[i][2].stream is not None]
    asyncs = [i for i, c in enumerate(backend.calls) if c[0] == "dispatch_async"]
    at = {call: n for n, call in enumerate(asyncs)}
    assert chained and all(backend.calls[i][2].stream == 0x5000 for i in chained)
    assert all(backend.async_current[at[i]] == 0x5000 and backend.async_outputs[at[i]] for i in chained)
    # the events-on-demand chain: its knob set for its rounds and put back after each
    used = backend.knobs_used
    fence = [i for i, k in enumerate(used) if k.fence_on_demand]
    assert fence and all(i + 1 < len(used) and not used[i + 1].fence_on_demand for i in fence), used
    assert not backend._knobs.fence_on_demand
    # the shared-streams rows: the knob set for their rounds and put back after each
    toggled = set(fence) | {i + 1 for i in fence}
    shares = [k.stream_share_after for i, k in enumerate(used) if i not in toggled]
    assert shares and shares == [patterns.SHARE_STREAMS_AFTER, 0] * (len(shares) // 2), shares
    assert backend._knobs.stream_share_after == 0
    # the peers' chains: cuda.core launched with a new buffer per step
    assert len(with_peers.launches) >= SMALL.steps * SMALL.repeats
    # the dropped rows drained the backend's context after each repetition, outside the timing
    assert fake_device.drains and all(b is backend for b in fake_device.drains)
    assert len(fake_device.drains) >= 2 * SMALL.repeats
    # the long kernel: compiled and checked once, then awaited and waited for
    spins = [c for c in backend.calls if c[1] == patterns.SPIN_NAME]
    assert [c[0] for c in spins] == ["dispatch"] + ["dispatch_async"] * 2 * SMALL.spin_repeats
    v = result.values
    assert v["await_idle_cpu"] >= 0 and v["blocking_idle_cpu"] >= 0 and v["spin_wall_s"] > 0
    # the budget sweep: unbudgeted, then halving from the start, then the refusal's smallest
    assert [b["budget"] for b in result.budgets] == SWEPT
    for b in result.budgets:
        assert b["n"] == SMALL.budget_repeats and b["bytes_moved"] == 3 * SMALL.budget_bytes
        assert b["gbps"] == pytest.approx(b["bytes_moved"] / b["median_ns"]) and b["chunks"] >= 1
    assert result.budget_stop["reason"] == "refused" and result.budget_stop["budget"] == 64 * KIB
    assert result.budget_stop["smallest"] == 100_000 and "100,000" in result.budget_stop["fix"]
    swept = {cfg.device_memory_budget for kind, name, cfg in backend.calls if name == "vecadd_f32_elementwise"}
    assert swept == set(SWEPT)  # (the refused 64 KiB ran nothing)
    assert all(cfg.streamed is True for kind, name, cfg in backend.calls if name == "vecadd_f32_elementwise"), (
        "every budget's dispatch is forced onto the streamed route"
    )
    assert _keys(result) == TARGET_KEYS
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)


def test_the_targets_are_the_ratios_of_their_rows(with_peers):
    result = _measure()
    t = {x.key: x for x in targets.evaluate_pattern_targets(result)}
    ratio = result.ratio
    assert t["chain_vs_cuda_core"].value == ratio("pattern.chain.kept", "pattern.chain.cuda_core")
    assert t["chain_vs_cuda_core"].limit == 1.2 and t["chain_vs_cuda_core"].op == "<="
    assert t["dropped_vs_enqueue"].value == ratio("pattern.dropped.host", "pattern.enqueue.single")
    assert t["dropped_vs_enqueue"].limit == 1.15
    assert t["await_vs_blocking"].value == ratio("pattern.await", "pattern.blocking")
    assert t["await_vs_blocking"].limit == 1.3
    assert t["inflight_1000_vs_single"].value == ratio("pattern.inflight", "pattern.enqueue.single")
    assert t["inflight_1000_vs_single"].limit == 1.3
    assert t["await_idle_cpu"].value == result.values["await_idle_cpu"] and t["await_idle_cpu"].limit == 0.02
    unbudgeted = result.budget(None)["gbps"]
    slowest = min(b["gbps"] for b in result.budgets if b["budget"] is not None)
    assert t["budget_min_rate"].value == pytest.approx(slowest / unbudgeted)
    assert t["budget_min_rate"].op == ">=" and t["budget_min_rate"].limit == 0.5


def test_missed_targets_say_what_was_measured():
    s = P.Summary
    result = PatternResult(
        systems={
            "pattern.chain.kept": s(5, 9_000, 8_000, 10_000),
            "pattern.chain.cuda_core": s(5, 6_000, 5_000, 7_000),
            "pattern.chain.cupy": s(5, 7_000, 6_000, 8_000),
            "pattern.enqueue.single": s(5, 8_000, 7_000, 9_000),
            "pattern.dropped.host": s(5, 12_000, 11_000, 13_000),
            "pattern.dropped.host_drained": s(5, 14_000, 13_000, 15_000),
            "pattern.inflight": s(5, 20_000, 19_000, 21_000),
            "pattern.await": s(5, 40_000, 39_000, 41_000),
            "pattern.blocking": s(5, 15_000, 14_000, 16_000),
        },
        values={
            "await_idle_cpu": 0.05,
            "blocking_idle_cpu": 0.01,
            "spin_wall_s": 2.0,
            "idle_await_counts_per_s": {"polls": 10_000.0},
            "await_counts_per_await": {"polls": 3.0, "spun": 1.0},
        },
        budgets=[
            {"budget": None, "median_ns": 30e6, "p10_ns": 29e6, "p90_ns": 31e6, "n": 3, "gbps": 26.8, "chunks": 32},
            {"budget": 16 * MIB, "median_ns": 90e6, "p10_ns": 89e6, "p90_ns": 91e6, "n": 3, "gbps": 8.9},
        ],
        budget_stop={"reason": "slow", "budget": 16 * MIB, "seconds": 2.5},
        settings={"nbytes": 4 * KIB, "steps": 1000, "gather": 64, "budget_bytes": 256 * MIB},
    )
    result.budgets[1].update(chunks=192, chunk_bytes=4 * MIB)
    t = {x.key: x for x in targets.evaluate_pattern_targets(result)}
    assert all(x.met is False for x in t.values())
    assert "9.00 us against cuda.core's 6.00 us" in t["chain_vs_cuda_core"].note
    assert "CuPy RawKernel 7.00 us" in t["chain_vs_cuda_core"].note
    assert "12.00 us per call against 8.00 us" in t["dropped_vs_enqueue"].note
    assert "14.00 us per call with the drain" in t["dropped_vs_enqueue"].note
    assert "40.00 us against 15.00 us" in t["await_vs_blocking"].note and "polls 3.00" in t["await_vs_blocking"].note
    assert "20.00 us against 8.00 us" in t["inflight_1000_vs_single"].note
    assert "10,000 times a second" in t["await_idle_cpu"].note and "5.0%" in t["await_idle_cpu"].note
    note = t["budget_min_rate"].note
    assert "device_memory_budget=16,777,216" in note and "8.90 GB/s" in note and "192 chunks" in note
    assert "one dispatch took 2.50 s" in note
    assert "16 MiB" in t["budget_min_rate"].description
    report = H.BenchReport({"device_name": "X"}, [], targets=list(t.values()), patterns=result)
    table = report.format_table()
    assert table.count("why: ") == 6
    assert "stopped: device_memory_budget=16,777,216 took 2.50 s (measured once)" in table
    assert "await counters of the 4 KiB awaits: polls 3.00, spun 1.00 per await" in table


# -- peers not installed, peers off, a peer that fails ----------------------------------------
def test_no_peer_installed_gives_no_chain_row_and_no_chain_target(fake_device, monkeypatch):
    monkeypatch.setattr(patterns, "peer_available", lambda name: False)
    result = _measure()
    assert not CHAIN_KEYS & set(result.systems) and set(result.systems) == ALL_KEYS - CHAIN_KEYS
    assert result.skipped == {
        "chain": "the README's chain runs on CuPy arrays and a CuPy stream: cupy is not installed",
        "cuda_core chain": "cuda.core is not installed",
        "cupy chain": "cupy is not installed",
        "torch chain": "torch is not installed",
    }
    assert _keys(result) == TARGET_KEYS - {"chain_vs_cuda_core"}


def test_without_cuda_core_the_chain_runs_without_its_target(with_peers, monkeypatch):
    monkeypatch.setattr(patterns, "peer_available", lambda name: name != "cuda_core")
    result = _measure()
    assert set(result.systems) == ALL_KEYS - {"pattern.chain.cuda_core"}
    assert result.skipped == {"cuda_core chain": "cuda.core is not installed"}
    assert "chain_vs_cuda_core" not in _keys(result)


def test_peers_off_skips_the_chain(with_peers):
    result = _measure(peers=False)
    assert not CHAIN_KEYS & set(result.systems)
    assert result.skipped == {"chain": "peers are off (the README's chain runs on CuPy arrays)"}


def test_a_peer_that_fails_to_start_is_skipped_by_name(with_peers, monkeypatch):
    def broken(name, *args):
        raise RuntimeError(f"{name} broke\nsecond line")

    monkeypatch.setattr(patterns, "open_peer", broken)
    result = _measure()
    names = ("cuda_core", "cupy", "torch")
    assert result.skipped == {f"{n} chain": f"failed to start: RuntimeError: {n} broke" for n in names}
    assert {"pattern.chain.kept", "pattern.chain.dropped"} <= set(result.systems)


# -- every output is checked ------------------------------------------------------------------
class _WrongAsync(FakeBackend):
    """Every dispatch_async result is off by one (named outputs too); dispatch stays right."""

    def dispatch_async(self, program, inputs, config=None, *, outputs=None):
        pending = super().dispatch_async(program, inputs, config, outputs=outputs)
        for out in pending._outs:
            out += 1
        return pending


def test_a_wrong_result_drops_its_row_and_its_target(with_peers):
    result = _measure(_WrongAsync())
    wrong = {
        "chain",
        "enqueue",
        "dropped host",
        "in flight",
        "await",
        "gather",
        "dropped device",
    }
    assert wrong <= set(result.skipped) and "idle CPU" in result.skipped
    assert all(result.skipped[k].startswith("failed: WrongResult") for k in wrong | {"idle CPU"})
    # the peers' own chains and the blocking dispatch are right and stay
    assert set(result.systems) == {
        "pattern.chain.cuda_core",
        "pattern.chain.cupy",
        "pattern.chain.torch",
        "pattern.blocking",
    }
    assert _keys(result) == {"budget_min_rate"}


def test_a_wrong_streamed_result_stops_the_sweep(fake_device, monkeypatch):
    original = FakeBackend.dispatch_into

    def into(self, program, inputs, outputs, config=None):
        out = original(self, program, inputs, outputs, config)
        if getattr(config, "device_memory_budget", None) == 256 * KIB:
            outputs[0][7] += 1
        return out

    monkeypatch.setattr(FakeBackend, "dispatch_into", into)
    result = _measure()
    why = "failed: WrongResult: the streamed vecadd (device_memory_budget=262,144) produced a wrong result"
    assert result.skipped["budgets"].startswith(why)
    assert result.budgets == [] and "budget_min_rate" not in _keys(result)


def test_the_chain_reference_is_numpy_in_order(rng):
    x, y = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    expected = x.copy()
    for _ in range(25):
        expected = (expected + y).astype(np.float32)
    np.testing.assert_array_equal(patterns.chain_reference(x, y, 25), expected)
    assert patterns.chain_reference(x, y, 25).dtype == np.float32


# -- the budget sweep's stops ---------------------------------------------------------------------
def test_the_sweep_stops_below_a_budget_that_takes_too_long(fake_device):
    import dataclasses

    backend = FakeBackend()
    backend.budget_seconds = lambda budget: 0.05 if budget <= 256 * KIB else 0.0
    settings = dataclasses.replace(SMALL, budget_stop_s=0.02)
    result = _measure(backend, settings)
    assert [b["budget"] for b in result.budgets] == [None, 512 * KIB, 256 * KIB]
    assert result.budget(256 * KIB)["n"] == 1 and result.budget(512 * KIB)["n"] == SMALL.budget_repeats
    assert result.budget_stop["reason"] == "slow" and result.budget_stop["budget"] == 256 * KIB
    tried = {cfg.device_memory_budget for _, name, cfg in backend.calls if name == "vecadd_f32_elementwise"}
    assert tried == {None, 512 * KIB, 256 * KIB}  # nothing smaller was tried
    table = H.BenchReport({}, [], patterns=result).format_table()
    assert "stopped: device_memory_budget=262,144 took" in table


def test_the_sweep_stops_at_its_smallest_budget(fake_device):
    import dataclasses

    backend = FakeBackend()
    backend.min_budget = 1
    result = _measure(backend, dataclasses.replace(SMALL, budget_min=128 * KIB))
    assert [b["budget"] for b in result.budgets] == [None, 512 * KIB, 256 * KIB, 128 * KIB]
    assert result.budget_stop == {"reason": "bound", "budget": 128 * KIB}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("too small\nFix: pass device_memory_budget >= 12,584,960", 12_584_960),
        ("Fix: pass device_memory_budget >= 4096, or a smaller align", 4096),
        ("free device memory is too small", None),
    ],
)
def test_the_smallest_budget_a_refusal_names(text, expected):
    assert patterns._smallest_named(ValueError(text)) == expected


# -- the drain and the long kernel --------------------------------------------------------------
def test_the_drain_synchronizes_the_backends_context_or_raises_typed(monkeypatch):
    import cuda.bindings

    calls = []
    status = {"sync": 0}
    fake = types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0),
        CUcontext=lambda handle: ("ctx", handle),
        cuCtxSetCurrent=lambda ctx: calls.append(ctx) or (0,),
        cuCtxSynchronize=lambda: calls.append("sync") or (status["sync"],),
    )
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", fake)
    monkeypatch.setattr(cuda.bindings, "driver", fake, raising=False)
    SYNCHRONIZE(FakeBackend())
    assert calls == [("ctx", FakeBackend.context_handle), "sync"]

    class Status(int):  # a CUresult: an int with its name
        name = "CUDA_ERROR_ILLEGAL_ADDRESS"

    status["sync"] = Status(700)
    with pytest.raises(BackendError) as err:
        SYNCHRONIZE(FakeBackend())
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in str(err.value) and "cuCtxSynchronize" in str(err.value)
    assert "\nFix: " in str(err.value)


def test_the_spin_kernel_is_a_program_of_one_input_and_32_outputs():
    program = patterns.spin_program()
    assert program.name == patterns.SPIN_NAME
    assert [b.name for b in program.buffers] == ["ns", "out"]
    assert "%%globaltimer" in program.kernel.source and "vyre_main" in program.kernel.source


# -- the report, the profile run, the CLI and the benchmark script -----------------------------
def test_run_profile_measures_the_patterns_and_stores_them(fake_device):
    seen = []
    report = H.run_bench(
        sizes=(4096,),
        iterations=4,
        warmup=1,
        peers=False,
        threads=False,
        backend=FakeBackend(),
        rounds=2,
        progress=lambda label, f: seen.append((label, f)),
    )
    assert report.patterns is not None and set(report.patterns.systems) == ALL_KEYS - CHAIN_KEYS
    keys = {t.key for t in report.targets}
    assert TARGET_KEYS - {"chain_vs_cuda_core"} <= keys
    assert [f for _, f in seen] == sorted(f for _, f in seen) and seen[-1][1] == pytest.approx(1.0)
    assert any(label.startswith("patterns: ") for label, _ in seen)
    data = json.loads(report.to_json())
    assert {t["key"] for t in data["targets"]} >= TARGET_KEYS - {"chain_vs_cuda_core"}
    assert data["patterns"]["budgets"][0]["budget"] is None
    again = H.BenchReport.from_json(report.to_json())
    assert again.to_dict() == report.to_dict() and again.format_table() == report.format_table()
    table = report.format_table()
    assert "patterns users are taught (4 KiB per buffer" in table
    assert records.pattern_label("pattern.await") in table and "device_memory_budget sweep" in table
    assert "skipped chain: peers are off" in table
    without = H.run_bench(
        sizes=(4096,), iterations=2, warmup=0, peers=False, threads=False, backend=FakeBackend(), patterns=False
    )
    assert without.patterns is None and not TARGET_KEYS & {t.key for t in without.targets}
    assert "patterns users are taught" not in without.format_table()
    assert json.loads(without.to_json())["patterns"] is None


def test_a_stored_report_without_patterns_still_loads():
    data = json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())
    data.pop("patterns", None)
    assert H.BenchReport.from_dict(data).patterns is None


def _load_bench(name):
    import importlib.util

    before = list(sys.path)
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.path[:] = before
    return module


def test_bench_dispatch_only_patterns_and_no_patterns(fake_device, tmp_path, monkeypatch, capsys):
    bench = _load_bench("bench_dispatch")
    out = tmp_path / "patterns.json"
    assert bench.main(["--out", str(out), "--only", "patterns"]) == 0
    data = json.loads(out.read_text())
    assert data["sizes"] == [] and data["patterns"]["systems"]
    assert {t["key"] for t in data["targets"]} >= TARGET_KEYS - {"chain_vs_cuda_core"}
    assert "patterns users are taught" in capsys.readouterr().out
    seen = {}
    monkeypatch.setattr(bench.harness, "run_bench", lambda **kw: seen.update(kw) or "report")
    assert bench.bench_suite(3, patterns=False) == "report" and seen["patterns"] is False
    for name in ("small", "large", "bandwidth", "streamed", "device", "threads"):
        seen.clear()
        bench.BENCHES[name](3)
        assert seen["patterns"] is False, name  # one benchmark measures its own rows only


def test_patterns_only_without_a_device_fails_with_the_reason(tmp_path, capsys, monkeypatch):
    from vyre_cuda.errors import NO_DRIVER_FIX, DriverUnavailable

    def no_driver(*args, **kwargs):
        raise DriverUnavailable("the CUDA driver found no device", NO_DRIVER_FIX)

    monkeypatch.setattr(vyre_cuda, "CudaBackend", no_driver)
    bench = _load_bench("bench_dispatch")
    assert bench.main(["--out", str(tmp_path / "p.json"), "--only", "patterns"]) == 1
    err = capsys.readouterr().err
    assert "bench_dispatch: DriverUnavailable: the CUDA driver found no device" in err and "\nFix: " in err
    assert not (tmp_path / "p.json").exists()
