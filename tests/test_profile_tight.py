"""The tight floor without a GPU: its series, the fastest wait, its targets (met, missed with the
measured reason, not measured with the reason), the thread rates, the real Floor.tight on the fake
CUDA driver, and the standalone C process built and run on the fake driver."""

import json
import pathlib

import profile_fakes
import pytest

import benchmarks.harness as H
from benchmarks.harness import records, standalone, targets
from vyre_cuda import profile as P
from vyre_cuda.errors import BackendError, UnsupportedFeature
from vyre_cuda.profile import engine, systems, tight

KIB = 1024
WAITS = ("spin", "event", "stream")
FAMILIES = ("floor.tight", "floor.tight_graph", "floor.standalone", "floor.standalone_graph")


@pytest.fixture
def fake_device(monkeypatch):
    return profile_fakes.install(monkeypatch)


def _summary(median):
    return P.Summary(100, float(median), median * 0.9, median * 1.1)


def _size(ns, nbytes=4 * KIB, skipped=None, stages=None, telemetry=None):
    s = P.SizeResult(nbytes, nbytes // 4, 100, skipped=dict(skipped or {}))
    s.systems = {k: _summary(v) for k, v in ns.items()}
    s.stages = {k: _summary(v) for k, v in (stages or {}).items()}
    s.moved = {"floor": (2 * nbytes, nbytes), "vyre": (2 * nbytes, nbytes)}
    s.telemetry = dict(telemetry or {})
    return s


# vyre 16 us; tight floor 14.56 us (spin), graph 11.87 us (event), standalone 14.5 / 11.8 us
MEASURED = {
    "vyre.dispatch": 16_000,
    "floor.pinned": 23_500,
    "floor.tight": 14_560,
    "floor.tight.spin": 14_560,
    "floor.tight.event": 15_000,
    "floor.tight.stream": 16_000,
    "floor.tight_graph": 11_870,
    "floor.tight_graph.spin": 12_000,
    "floor.tight_graph.event": 11_870,
    "floor.tight_graph.stream": 13_000,
    "floor.standalone": 14_500,
    "floor.standalone.spin": 14_500,
    "floor.standalone_graph": 11_800,
    "floor.standalone_graph.spin": 11_800,
}


def _by_key(found):
    return {t.key: t for t in found if t.size_bytes == 4 * KIB}


# -- series -------------------------------------------------------------------------------------
def test_every_tight_series_has_a_label_full_traffic_and_a_place_after_the_per_buffer_floor():
    keys = [f"{f}{w}" for f in FAMILIES for w in ("", ".spin", ".event", ".stream")]
    for key in keys:
        assert systems.label(key) != key, key
        assert systems.traffic_kind(key) == systems.FULL and systems.reference(key) == "floor.pinned", key
    assert len({systems.label(k) for k in keys}) == len(keys)  # each its own label
    order = sorted(["floor.launch_only", "floor.standalone", "floor.tight", "floor.pinned_direct"], key=systems.order)
    assert order == ["floor.pinned_direct", "floor.tight", "floor.standalone", "floor.launch_only"]
    assert systems.label("floor.pinned").startswith("per-buffer floor")
    assert systems.label("floor.pinned_direct").startswith("per-buffer issued floor")


def test_add_fastest_takes_the_wait_with_the_lowest_median_per_family():
    samples = {
        "floor.tight.spin": [5, 6, 100],  # median 6
        "floor.tight.event": [7, 7, 1],  # median 7, though its minimum is lower
        "floor.tight.stream": [9, 9, 9],
        "floor.standalone_graph.stream": [3, 4],
        "floor.tight_graph.spin": [],  # nothing measured: not a candidate
    }
    s = engine.assemble(4 * KIB, KIB, 3, samples, (), {})
    tight.add_fastest(s)
    assert s.systems["floor.tight"] == s.systems["floor.tight.spin"] and s.median("floor.tight") == 6
    assert "floor.standalone_graph" not in s.systems  # the profile's own families only
    tight.add_fastest(s, standalone.SERIES_FAMILIES)  # the benchmark's
    assert s.systems["floor.standalone_graph"] == s.systems["floor.standalone_graph.stream"]
    assert "floor.tight_graph" not in s.systems and "floor.standalone" not in s.systems
    assert tight.fastest_wait(s, "floor.tight") == "spin"
    assert tight.fastest_wait(_size(MEASURED), "floor.tight_graph") == "event"
    assert tight.fastest_wait(_size(MEASURED), "floor.standalone.spin") is None


# -- targets ------------------------------------------------------------------------------------
def test_tight_targets_met_with_their_values_and_limits():
    t = _by_key(targets.evaluate_targets([_size(MEASURED)], None))
    expect = {
        "vyre_vs_tight_floor": (16_000 / 14_560, 1.15, True),
        "small_vs_graph_floor": (16_000 / 11_870, 1.05, False),
        "floor_vs_standalone": (14_560 / 14_500, 1.05, True),
    }
    for key, (value, limit, met) in expect.items():
        assert t[key].value == pytest.approx(value) and t[key].limit == limit and t[key].met is met, key
    assert t["floor_vs_standalone"].low == 0.95
    graph = t["floor_graph_vs_standalone"]
    assert graph.op == "report" and graph.value == pytest.approx(11_870 / 11_800)
    # the headline comes first among the small-size targets, before the per-buffer ones
    keys = [x.key for x in targets.evaluate_targets([_size(MEASURED)], None)]
    assert keys.index("vyre_vs_tight_floor") < keys.index("vyre_vs_floor")
    assert t["vyre_vs_floor"].description == "4 KiB: vyre_cuda dispatch / per-buffer floor (pinned staging)"
    assert not any(
        x.key.startswith(("vyre_vs_tight", "small_vs_graph", "floor_vs"))
        for x in targets.evaluate_targets([_size(MEASURED, nbytes=1 << 20)], None)
    )  # small sizes only


def test_tight_targets_missed_say_what_was_measured():
    stages = {"staging_memcpy": 1_500, "copy_out": 700}
    slow = dict(MEASURED, **{"vyre.dispatch": 20_000, "floor.standalone": 12_000, "floor.standalone.spin": 12_000})
    t = _by_key(
        targets.evaluate_targets([_size(slow, stages=stages, telemetry={"dispatches": 500, "graph_replays": 0})], None)
    )
    headline = t["vyre_vs_tight_floor"]
    assert headline.met is False
    assert headline.note == (
        "the tight floor takes 14.56 us (spin wait), vyre_cuda 20.00 us, 5.44 us more; vyre_cuda's host copies, "
        "which the floor does not make: staging_memcpy 1.50 us, copy_out 0.70 us"
    )
    graph = t["small_vs_graph_floor"].note
    assert graph.startswith(
        "the graph floor takes 11.87 us (event wait) (issued: 14.56 us (spin wait)), vyre_cuda 20.00 us"
    )
    assert graph.endswith("; 0 of the 500 timed vyre_cuda dispatches replayed a graph")
    matched = t["floor_vs_standalone"]
    assert matched.value == pytest.approx(14_560 / 12_000) and matched.met is False
    assert matched.note == (
        "the tight floor took 14.56 us (spin wait) in this process and 12.00 us (spin wait) in the standalone "
        "process; as a graph replay 11.87 us (event wait) and 11.80 us (spin wait)"
    )
    # the band's lower side misses too: a standalone process much slower than this one's floor
    fast = dict(MEASURED, **{"floor.standalone": 16_000, "floor.standalone.spin": 16_000})
    low = _by_key(targets.evaluate_targets([_size(fast)], None))["floor_vs_standalone"]
    assert low.value == pytest.approx(14_560 / 16_000) and low.value < 0.95 and low.met is False and low.note


def test_tight_targets_not_measured_give_the_reason():
    missing = {k: v for k, v in MEASURED.items() if not k.startswith(("floor.standalone", "floor.tight_graph"))}
    skipped = {
        "standalone floor": "no C compiler (cc, gcc or clang, or $CC) on the PATH to build it",
        "floor tight graph": "failed: DispatchFailed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: ...",
    }
    t = _by_key(targets.evaluate_targets([_size(missing, skipped=skipped)], None))
    matched = t["floor_vs_standalone"]
    assert matched.value is None and matched.met is None and records.target_status(matched) == "n/a"
    assert matched.description.endswith(f"(not measured: {skipped['standalone floor']})")
    assert t["small_vs_graph_floor"].description.endswith(f"(not measured: {skipped['floor tight graph']})")
    assert "floor_graph_vs_standalone" not in t
    assert "not measured" not in t["vyre_vs_tight_floor"].description and t["vyre_vs_tight_floor"].met
    bare = _by_key(targets.evaluate_targets([_size({"vyre.dispatch": 1.0})], None))
    assert bare["vyre_vs_tight_floor"].description.endswith("(not measured: no such series in this run)")


def test_a_band_target_reads_as_a_band_and_round_trips():
    band = records.Target("floor_vs_standalone", "x", 1.2, 1.05, "<=", 4096, "x", low=0.95)
    assert band.met is False
    for value, met in ((0.94, False), (0.95, True), (1.0, True), (1.05, True), (1.06, False)):
        band.value = value
        assert band.met is met, value
    assert records.Target.from_dict(json.loads(json.dumps(band.to_dict()))) == band
    report = H.BenchReport({}, [], targets=[band])
    assert "(target 0.95 to 1.05)" in report.format_table()
    assert records.Target.from_dict({k: v for k, v in band.to_dict().items() if k != "low"}).low is None  # older JSON


# -- a run on the fake floor: the standalone process not available -----------------------------
def test_a_run_without_the_standalone_process_reports_why(fake_device):
    profile_fakes.FakeStandalone.fail = "no CUDA driver library found for the standalone floor process"
    report = H.run_bench(
        sizes=(4096, 128 * KIB),
        iterations=6,
        warmup=1,
        peers=False,
        threads=False,
        rounds=2,
        host_threads=1,
        patterns=False,
    )
    s = report.size(4096)
    assert s.skipped["standalone floor"] == profile_fakes.FakeStandalone.fail
    assert "floor.standalone" not in s.systems and s.median("floor.tight") == 14_000
    t = {(x.key, x.size_bytes): x for x in report.targets}
    assert t[("floor_vs_standalone", 4096)].description.endswith(f"(not measured: {profile_fakes.FakeStandalone.fail})")
    assert t[("vyre_vs_tight_floor", 4096)].value == pytest.approx(s.median("vyre.dispatch") / 14_000)
    assert "standalone floor" not in report.size(128 * KIB).skipped  # above the small sizes: not started
    assert "skipped standalone floor: no CUDA driver library" in report.format_table()


def test_a_standalone_process_that_cannot_capture_keeps_its_issued_series(fake_device):
    profile_fakes.FakeStandalone.no_capture = "capture failed: cuMemcpyHtoDAsync returned CUDA_ERROR_NOT_SUPPORTED"
    report = H.run_bench(
        sizes=(4096,), iterations=4, warmup=1, peers=False, threads=False, rounds=2, host_threads=1, patterns=False
    )
    s = report.size(4096)
    assert s.skipped["standalone floor graph"] == profile_fakes.FakeStandalone.no_capture
    assert "floor.standalone_graph" not in s.systems and s.median("floor.standalone") == 14_400
    keys = {x.key for x in report.targets}
    assert "floor_vs_standalone" in keys and "floor_graph_vs_standalone" not in keys


def test_a_failing_standalone_process_is_dropped_with_its_reason(fake_device, monkeypatch):
    def broken(self, count, warmup=0):
        raise BackendError("the standalone floor process failed: wrong result", "report it")

    monkeypatch.setattr(profile_fakes.FakeStandalone, "run", broken)
    report = H.run_bench(
        sizes=(4096,), iterations=4, warmup=1, peers=False, threads=False, rounds=2, host_threads=1, patterns=False
    )
    s = report.size(4096)
    assert s.skipped["standalone floor"].startswith("failed: BackendError: the standalone floor process failed")
    assert "floor.standalone" not in s.systems and all(p.closed for p in profile_fakes.FakeStandalone.started)


# -- the standalone program's harness, without a driver ----------------------------------------
def test_no_compiler_or_no_driver_library_is_unsupported_with_a_fix(monkeypatch):
    monkeypatch.setattr(standalone, "compiler", lambda: None)
    with pytest.raises(UnsupportedFeature) as err:
        standalone.build()
    assert "no C compiler" in str(err.value) and "\nFix: " in str(err.value)
    monkeypatch.setattr(standalone, "find_libcuda", lambda: None)
    with pytest.raises(UnsupportedFeature) as err:
        standalone.StandaloneFloor(b"image", 4096)
    assert "no CUDA driver library found" in str(err.value) and "\nFix: " in str(err.value)
    skipped = {}
    assert standalone.open_standalone(b"image", 4096, 0, skipped) is None
    assert skipped == {"standalone floor": err.value.message}


def test_the_program_builds_into_the_cache_folder_once(tmp_path):
    if standalone.compiler() is None:
        pytest.skip("no C compiler on PATH")
    first = standalone.build(tmp_path)
    assert first.parent == tmp_path and first.name.startswith("standalone_floor-") and first.stat().st_mode & 0o111
    mtime = first.stat().st_mtime_ns
    assert standalone.build(tmp_path) == first and first.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left


def test_a_failing_build_carries_the_compiler_output(tmp_path, monkeypatch):
    if standalone.compiler() is None:
        pytest.skip("no C compiler on PATH")
    bad = tmp_path / "broken.c"
    bad.write_text("int main(void) { return not_declared; }\n")
    monkeypatch.setattr(standalone, "SOURCE", bad)
    with pytest.raises(BackendError) as err:
        standalone.build(tmp_path / "out")
    assert "not_declared" in str(err.value) and "\nFix: " in str(err.value)
    assert not list((tmp_path / "out").iterdir())


# -- on the fake CUDA driver: the real floor and the real standalone process -------------------
CHILD = r"""
import ctypes, json, os, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, array_at
from vyre_cuda.errors import BackendError, ValidationError
from vyre_cuda.profile import engine, run, tight
from benchmarks.harness import standalone, threads

res = {}
fake = FakeDriver()
rng = np.random.default_rng(int(sys.argv[1]))
mode = {"wrong": False}

def floor_vecadd(launch):
    n = ctypes.c_uint32.from_address(launch._params[3]).value
    a, b, out = (array_at(launch.arg(k), np.float32, n) for k in range(3))
    out[:] = (a - b) if mode["wrong"] else (a + b)

class Fallback(dict):
    def get(self, key, default=None):
        return super().get(key, floor_vecadd)

fake.emulators = Fallback()
backend = vc.CudaBackend(0)
kernel, image = run.load_floor_kernel(backend)
n = 1000
a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
expected = a + b
floor = run.import_floor().Floor(kernel, n)
res["waits"] = list(run.import_floor().WAITS)
res["calls"] = {}
for wait in tight.WAITS:
    out = np.zeros(n, np.float32)
    before = fake.stats()
    ns = floor.tight(a, b, out, 4, warmup=1, wait=wait)
    after = fake.stats()
    res["calls"][wait] = {k: after[k] - before[k] for k in ("htod_copies", "dtoh_copies", "launches", "syncs")}
    res["calls"][wait]["n"] = len(ns)
    res["calls"][wait]["positive"] = bool(ns.min() > 0)
    res["calls"][wait]["ok"] = bool(np.array_equal(out, expected))
try:
    floor.tight(a, b, out, 1, wait="poll")
except ValidationError as exc:
    res["bad_wait"] = str(exc)
try:
    floor.tight(a, b, out, 2, wait="spin", graph=True)
    res["graph"] = "ran"
except BackendError as exc:
    res["graph"] = str(exc).splitlines()[0]
out = np.zeros(n, np.float32)
floor.tight(a, b, out, 2, wait="event")  # the stream left capture mode
res["after_capture_ok"] = bool(np.array_equal(out, expected))

failed = {}
rows = tight.tight_runners(floor, a, b, expected)
samples = engine.run_rounds(rows, 6, 1, 2, failed=failed)
s = tight.add_fastest(engine.assemble(4 * n, n, 6, samples, (), failed))
res["series"] = sorted(k for k, v in s.systems.items() if v.n == 6)
res["failed"] = failed
mode["wrong"] = True
failed = {}
engine.run_rounds(tight.tight_runners(floor, a, b, expected)[:3], 2, 0, 1, failed=failed)
res["wrong"] = failed
mode["wrong"] = False
floor.close()

threaded = threads.floor_threaded(run.import_floor(), kernel, n, 2, 5, 1, wait="spin")
res["threaded"] = [threaded["outputs_ok"], threaded["threads"], threaded["dispatches_per_s"] > 0]

# the standalone process, on the fake driver too (the libcuda this process loaded)
res["libcuda"] = standalone.find_libcuda()
skipped = {}
without_hook = standalone.open_standalone(image, 4096, 0, skipped)
try:
    without_hook.run(3)
    res["unhooked"] = "ran"
except BackendError as exc:
    res["unhooked"] = str(exc).splitlines()[0]
without_hook.close()
os.environ["LD_PRELOAD"] = sys.argv[2]
process = standalone.open_standalone(image, 4096, 0, skipped)
got = process.run(5, 1)
res["standalone"] = {k: [len(v), min(v) > 0] for k, v in got.items()}
res["standalone_again"] = sorted(process.run(2))
res["standalone_skipped"] = dict(skipped)
process.close()
os.environ["FLOOR_HOOK_WRONG"] = "1"
wrong = standalone.open_standalone(image, 4096, 0, skipped)
try:
    wrong.run(2)
    res["standalone_wrong"] = "ran"
except BackendError as exc:
    res["standalone_wrong"] = str(exc).splitlines()[0]
wrong.close()
res["bad_image"] = standalone.open_standalone(b"not a module", 4096, 0, skipped) is None and skipped["standalone floor"]
kernel.close()
backend.close()
res["hook_errors"] = fake.hook_errors
print(json.dumps(res))
"""


def test_tight_floor_and_standalone_process_on_the_fake_driver(fake_libcuda, rng, tmp_path):
    import fakecuda

    if standalone.compiler() is None:
        pytest.skip("no C compiler on PATH to build the standalone floor")
    source = pathlib.Path(fakecuda.__file__).with_name("floor_hook.c")
    hook_dir = fakecuda._compile_once(tmp_path, "hook-", [source], "floor_hook.so", ([], ["-ldl"]), "the floor hook")
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed), str(hook_dir / "floor_hook.so")], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["hook_errors"] == []
    assert res["waits"] == list(tight.WAITS)
    # one H2D of both inputs, one launch, one D2H per round trip (5: 1 warm-up + 4 timed); only the
    # stream wait synchronizes the stream
    for wait in tight.WAITS:
        calls = res["calls"][wait]
        assert calls["n"] == 4 and calls["positive"] and calls["ok"], wait
        assert (calls["htod_copies"], calls["dtoh_copies"], calls["launches"]) == (5, 5, 5), wait
        assert calls["syncs"] == (5 if wait == "stream" else 0), wait
    assert "the tight floor's wait must be one of spin, event, stream (got 'poll')" in res["bad_wait"]
    assert "\nFix: " in res["bad_wait"]
    # the fake driver cannot capture a copy: the graph replay fails with the call's name, and the
    # stream keeps working
    assert res["graph"].startswith("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED") and "cuMemcpyHtoDAsync" in res["graph"]
    assert res["after_capture_ok"]
    assert res["series"] == sorted(["floor.tight", *(f"floor.tight.{w}" for w in tight.WAITS)])
    assert list(res["failed"]) == ["floor tight graph"] and "cuMemcpyHtoDAsync" in res["failed"]["floor tight graph"]
    assert res["wrong"] == {
        "floor tight": "failed: WrongResult: floor tight, spin wait produced a wrong result during warm-up"
    }
    assert res["threaded"] == [True, 2, True]
    # the standalone process loads the driver this process loaded: here the fake
    assert res["libcuda"].startswith(str(fake_libcuda))
    assert res["unhooked"].startswith("the standalone floor process failed: wrong result: series spin: out[0] = ")
    assert res["standalone"] == {f"floor.standalone.{w}": [5, True] for w in tight.WAITS}
    assert res["standalone_again"] == sorted(f"floor.standalone.{w}" for w in tight.WAITS)
    assert res["standalone_skipped"] == {
        "standalone floor graph": "capture failed: cuMemcpyHtoDAsync returned CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    }
    assert res["standalone_wrong"].startswith("the standalone floor process failed: wrong result: series spin")
    assert res["bad_image"].startswith(
        "the standalone floor process did not start: driver call failed: cuModuleLoadData"
    )
