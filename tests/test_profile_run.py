"""The profiling harness without a GPU: the engine, the host copies (for real), and the whole
run on a fake backend and a fake floor. (The CLI and the benchmark scripts: test_profile_cli.py.)"""

import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import profile_fakes
import pytest
from profile_fakes import STAGES, FakeBackend, Locked

import benchmarks.harness as H
import vyre_cuda
from benchmarks.harness import streamed
from vyre_cuda import profile as P
from vyre_cuda.errors import ValidationError
from vyre_cuda.profile import engine, run
from vyre_cuda.program import BufferDecl

ROOT = pathlib.Path(__file__).resolve().parent.parent
KIB, MIB, GIB = 1024, 1 << 20, 1 << 30


def _fix_line(exc):
    return str(exc).splitlines()[-1]


@pytest.fixture
def fake_device(monkeypatch):
    return profile_fakes.install(monkeypatch)


# -- iteration counts ------------------------------------------------------------------------
def test_iterations_scale_with_the_size():
    assert engine.auto_iterations(4 * KIB) == 2000
    assert engine.auto_iterations(4 * MIB) == 512
    assert engine.auto_iterations(64 * MIB) == 32
    assert engine.auto_iterations(256 * MIB) == 8
    assert engine.auto_iterations(GIB) == 5
    assert engine.auto_warmup(2000) == 200 and engine.auto_warmup(512) == 51
    assert engine.auto_warmup(5) == 0  # run_rounds still runs one untimed pass


# -- the engine ------------------------------------------------------------------------------
class _Recorder:
    def __init__(self, name, log, key, value=1, unit_scale=1, fail_at=None, ok=True, group=None):
        self.calls = []
        self.log = log
        self.key = key
        self.value = value
        self.fail_at = fail_at
        self.runner = engine.Runner(name, self, (lambda: ok), unit_scale, group)

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
    marks = []
    samples = engine.run_rounds(
        [a.runner, b.runner, c.runner],
        23,
        5,
        4,
        progress=lambda label, f: seen.append(f),
        before_timed=lambda: marks.append(list(log)),
    )
    assert log == ["A", "B", "C"] + ["A", "B", "C"] * 4  # warm-up, then rounds in turn
    assert marks == [["A", "B", "C"]]  # called once, between the warm-up and the rounds
    assert a.calls == [5, 6, 6, 6, 5] and sum(a.calls[1:]) == 23
    assert len(samples["a"]) == 23 and len(samples["b"]) == 23
    assert c.calls[0] == 1 and all(n == 1 for n in c.calls[1:])  # ceil(6 / 10) batches
    assert set(samples) == {"a", "b", "c"}
    assert seen == sorted(seen) and seen[-1] == pytest.approx(1.0)


def test_run_rounds_always_verifies_once_even_without_warmup():
    log = []
    a = _Recorder("A", log, "a")
    engine.run_rounds([a.runner], 3, 0, 3)
    assert a.calls == [1, 1, 1, 1]


def test_run_rounds_wrong_result_raises_for_vyre_and_floor():
    bad = _Recorder("vyre", [], "v", ok=False)
    with pytest.raises(P.WrongResult):
        engine.run_rounds([bad.runner], 4, 1, 2)


def test_run_rounds_drops_a_failing_group_only():
    log = []
    floor = _Recorder("floor", log, "floor.pinned")
    full = _Recorder("peer cupy", log, "peer.cupy", fail_at=3, group="cupy")
    launch = _Recorder("peer cupy launch", log, "peer.cupy.launch_only", group="cupy")
    wrong = _Recorder("peer torch", log, "peer.torch", ok=False, group="torch")
    failed = {}
    samples = engine.run_rounds([floor.runner, full.runner, launch.runner, wrong.runner], 9, 1, 3, failed=failed)
    assert set(samples) == {"floor.pinned"}
    assert len(samples["floor.pinned"]) == 9
    assert failed["cupy"].startswith("failed: RuntimeError: peer broke")
    assert failed["torch"].startswith("failed: WrongResult")
    assert len(launch.calls) == 2  # warm-up and round 1, then dropped with its group


def test_run_rounds_non_group_failure_propagates():
    broken = _Recorder("floor", [], "f", fail_at=2)
    with pytest.raises(RuntimeError):
        engine.run_rounds([broken.runner], 4, 1, 2)


# -- nothing of the harness at import of the runtime API --------------------------------------
def _fresh_python(code):
    """Run ``code`` in a fresh interpreter on this vyre_cuda, with no device visible."""
    env = {
        # the package under test first, then the checkout for benchmarks/harness (not in the wheel)
        "PYTHONPATH": os.pathsep.join([str(pathlib.Path(vyre_cuda.__file__).resolve().parents[1]), str(ROOT)]),
        "CUDA_VISIBLE_DEVICES": "",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(ROOT.parent),
        check=False,
    )


def test_runtime_api_never_imports_the_floor():
    code = (
        "import sys, vyre_cuda, vyre_cuda.backend, vyre_cuda.cli, vyre_cuda.profile\n"
        "vyre_cuda.cli.build_parser()\n"
        "loaded = [m for m in sys.modules if m.endswith('_floor')]\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    proc = _fresh_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_harness_imports_no_peer_and_no_core_until_a_run():
    # the profile (the installed command) imports nothing of benchmarks/; the benchmark harness's
    # peers are plugins: neither their libraries nor their modules load with it; and the compiled
    # core loads only when a run asks for it (the shared checks in _validate, planning's checked
    # byte arithmetic, _accounting, the dtype table, _dtypes, the buffer declarations, _buffer_decl,
    # and the interning of equal program values, _interned, need no driver)
    code = (
        "import sys, vyre_cuda.cli, vyre_cuda.profile\n"
        "vyre_cuda.cli.build_parser()\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'benchmarks']\n"
        "import benchmarks.harness\n"
        "from benchmarks.harness import peers\n"
        "assert peers.PEERS == ('cuda_bindings', 'cupy', 'torch', 'cuda_core')\n"
        "wanted = ('cupy', 'torch', 'cuda', 'benchmarks.harness.peers.', 'vyre_cuda._')\n"
        "shared = ('vyre_cuda._validate', 'vyre_cuda._accounting', 'vyre_cuda._dtypes', 'vyre_cuda._buffer_decl',"
        " 'vyre_cuda._interned')\n"
        "loaded = [m for m in sys.modules if (m.split('.')[0] in wanted[:3] or m.startswith(wanted[3:]))"
        " and m not in shared]\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    proc = _fresh_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_missing_peer_library_is_skipped_with_its_name(monkeypatch):
    from benchmarks.harness import peers

    monkeypatch.setitem(peers.REGISTRY, "cupy", peers.Peer("cupy", "no_such_library_for_vyre", "cupy_peer"))
    assert peers.peer_available("cupy") is False
    assert peers.missing_reason("cupy") == "no_such_library_for_vyre is not installed"
    assert peers.peer_available("cuda_bindings") is True  # installed with vyre_cuda


def test_run_profile_validates_before_touching_the_device():
    for kwargs in (
        {"sizes": (4098,)},
        {"sizes": (4096,), "iterations": 0},
        {"sizes": (4096,), "warmup": -1},
        {"sizes": (4096,), "iterations": True},
        {"sizes": (4096,), "host_threads": 0},
        {"sizes": (4096,), "rounds": 0},
        {"sizes": (4096,), "thread_count": 1},
    ):
        for run_fn in (P.run_profile, H.run_bench):  # the profile's run, and the benchmark record's
            if run_fn is P.run_profile and "thread_count" in kwargs:
                continue
            with pytest.raises(ValidationError):
                run_fn(**kwargs)
    for run_fn in (P.run_profile, H.run_bench):
        with pytest.raises(ValidationError) as err:
            run_fn(sizes=(4096,), backend=object(), backend_options={"copy_threads": 2})
        assert "copy_threads" in str(err.value)


# -- the whole run on a fake backend and a fake floor ----------------------------------------
VYRE_KEYS = {
    "vyre.dispatch",
    "vyre.dispatch_profiled",
    "vyre.async_enqueue",
    "vyre.async_total",
    "vyre.dispatch_into",
    "vyre.pinned",
    "vyre.streamed",
    "vyre.streamed_pinned",
    "vyre.rebuilt",  # sizes up to 64 KiB
}
FLOOR_KEYS = {"floor.pinned", "floor.pinned_enqueue", "floor.pageable", "floor.pageable_enqueue", "floor.pinned_direct"}
# the tight floor, issued and replayed, per wait and its fastest; the same in the standalone process
# (small sizes)
WAIT_SUFFIXES = ("", ".spin", ".event", ".stream")
TIGHT_KEYS = {f"{f}{w}" for f in ("floor.tight", "floor.tight_graph") for w in WAIT_SUFFIXES}
STANDALONE_KEYS = {f"{f}{w}" for f in ("floor.standalone", "floor.standalone_graph") for w in WAIT_SUFFIXES}


def test_run_profile_end_to_end_on_fakes(fake_device, monkeypatch):
    monkeypatch.setattr(engine, "LAUNCH_ONLY_MAX", 4 * KIB)
    backend = FakeBackend(allocate_every=40)
    progress = []
    report = H.run_bench(
        sizes="4KiB,8KiB",
        iterations=40,
        warmup=3,
        peers=False,
        threads=True,
        progress=lambda label, f: progress.append((label, f)),
        backend=backend,
        rounds=4,
        thread_iterations=10,
        thread_repeats=1,
        host_threads=3,
        patterns=False,  # (test_profile_patterns.py: their calls would count among these rows')
    )
    assert not backend.closed  # a caller's backend stays open
    assert all(f.closed for f in fake_device.floor.opened)
    assert [s.nbytes for s in report.sizes] == [4096, 8192]
    small, larger = report.sizes
    assert small.elements == 1024 and small.iterations == 40
    ceilings = {
        "ceiling.dma_h2d",
        "ceiling.dma_d2h",
        "ceiling.dma_both",
        "ceiling.copy_in.1",
        "ceiling.copy_in.3",
        "ceiling.copy_out.1",
        "ceiling.copy_out.3",
    }
    floors = FLOOR_KEYS | TIGHT_KEYS | STANDALONE_KEYS
    assert set(small.systems) == VYRE_KEYS | floors | ceilings | {"floor.launch_only"}
    assert set(larger.systems) == VYRE_KEYS | floors | ceilings  # launch only: small sizes
    for key in (
        "vyre.dispatch",
        "vyre.pinned",
        "vyre.dispatch_into",
        "floor.pinned",
        "ceiling.copy_in.3",
        "ceiling.dma_d2h",
        "ceiling.dma_both",
        "vyre.streamed",
        "vyre.streamed_pinned",
    ):
        assert small.systems[key].n == 40, key
    assert small.gbps("ceiling.dma_both") == pytest.approx(3 * 4096 / 1_200)  # 2 inputs up, 1 output down
    assert ("copy_in", 1) in fake_device.floor.calls and ("copy_in", 3) in fake_device.floor.calls
    assert small.median("floor.pinned") == 20_000
    assert small.gbps("ceiling.dma_h2d") == pytest.approx(8192 / 1_000)
    assert small.gbps("ceiling.copy_out.3") == pytest.approx(4096 / 666)
    assert small.median("floor.launch_only") == 3_500
    # every wait measured, issued and replayed; each family's key holds its fastest wait's samples
    for graph, family in ((False, "floor.tight"), (True, "floor.tight_graph")):
        for wait in ("spin", "event", "stream"):
            assert ("tight", wait, graph) in fake_device.floor.calls
            assert small.systems[f"{family}.{wait}"].n == 40
            assert small.median(f"{family}.{wait}") == profile_fakes.TIGHT_NS[graph, wait]
    assert small.median("floor.tight") == 14_000 and small.systems["floor.tight"].n == 40  # spin
    assert small.median("floor.tight_graph") == 11_000  # event
    assert small.median("floor.standalone") == 14_400 and small.median("floor.standalone.stream") == 15_500
    assert small.median("floor.standalone_graph") == 11_100 and small.systems["floor.standalone"].n == 40
    assert [p.nbytes for p in profile_fakes.FakeStandalone.started] == [4096, 8192]
    assert all(p.closed for p in profile_fakes.FakeStandalone.started)
    assert set(small.stages) == set(STAGES) | {P.UNATTRIBUTED}
    assert set(small.directions) == {"h2d", "d2h"}
    assert 0 < small.coverage <= 1.0
    assert small.moved == {"floor": (8192, 4096), "vyre": (8192, 4096)}
    # the page-locked row really got page-locked inputs; the numpy row ordinary ones
    assert Locked in backend.into_inputs and np.ndarray in backend.into_inputs
    # the streamed rows: the vecadd declared elementwise, dispatch_into forced onto the streamed
    # route; the serial rows keep the plain vecadd (comparable with stored results)
    streamed_calls = [c for c in backend.calls if c[1] == "vecadd_f32_elementwise"]
    assert streamed_calls and all(kind == "dispatch_into" and cfg.streamed is True for kind, _, cfg in streamed_calls)
    serial_calls = [c for c in backend.calls if c[1] == "vecadd_f32"]
    assert serial_calls and all(cfg is None for _, _, cfg in serial_calls)
    # the planner's own route for an unforced dispatch at each size (both below 2 chunks here)
    assert small.planner == {"route": "regular", "reason": "fewer than 2 chunks of 8 MiB"}
    assert ("vecadd_f32_elementwise", 4096) in backend.plans and ("vecadd_f32_elementwise", 8192) in backend.plans
    assert "route of an unforced dispatch of the elementwise vecadd: regular" in report.format_table()
    # telemetry over the timed dispatches only: 8 vyre rows x 40 samples (the async row's
    # enqueue and total come from the same dispatches)
    assert small.telemetry["dispatches"] == 8 * 40
    assert small.telemetry["pinned_alloc_calls"] == 8  # one in every 40 dispatches
    assert small.telemetry["ring_bytes"] == 32 << 20 and small.telemetry["copy_threads_live"] == 4
    assert small.telemetry["ring_chunks"] == 3 * 8 * 40  # a counter: its change
    assert small.allocations_per_dispatch("pinned") == pytest.approx(8 / 320)
    t = {(x.key, x.size_bytes): x for x in report.targets}
    assert t[("pinned_allocations_per_dispatch", 4096)].met is False
    assert t[("device_allocations_per_dispatch", 4096)].met is True
    assert t[("no_regression", 4096)].op == "report"
    assert report.threads.floor[1] > 0 and report.threads.vyre[2] > 0
    assert sorted(report.threads.vyre) == sorted(report.threads.tight) == [1, 2, 4]
    assert all(report.threads.tight[c] > 0 for c in (1, 2, 4))
    assert {("tight", w, False) for w in ("spin", "event", "stream")} <= set(fake_device.floor.calls)
    assert len(backend.threads_seen) >= 4  # the 4-thread run really used 4 threads
    rates = [x for x in report.targets if x.key == "threads_rate_vs_floor"]
    assert [x.description.split(" ")[0] for x in rates] == ["2", "4"]
    assert all(x.value == pytest.approx(report.threads.rate_ratio(int(x.description[0]))) for x in rates)
    for key in ("vyre_vs_tight_floor", "small_vs_graph_floor", "floor_vs_standalone"):
        assert t[(key, 4096)].value > 0, key
    assert t[("floor_vs_standalone", 4096)].value == pytest.approx(14_000 / 14_400)
    assert report.meta["device_name"] == "Fake GPU" and report.meta["program"].startswith("vecadd")
    assert report.meta["host_threads"] == [1, 3]
    assert report.stage_names == STAGES
    assert progress and progress[-1][1] == pytest.approx(1.0)
    assert [f for _, f in progress] == sorted(f for _, f in progress)
    assert H.BenchReport.from_json(report.to_json()).to_dict() == report.to_dict()


def test_run_profile_without_page_locked_arrays_or_telemetry(fake_device, monkeypatch):
    monkeypatch.setattr(vyre_cuda, "pinned_empty", None)  # a core without page-locked arrays
    backend = FakeBackend()
    del backend.telemetry
    report = H.run_bench(
        sizes=(4096,), iterations=6, warmup=1, peers=False, threads=False, backend=backend, rounds=2, host_threads=1
    )
    s = report.size(4096)
    assert "vyre.pinned" not in s.systems and "vyre.dispatch_into" in s.systems
    assert "vyre.streamed_pinned" not in s.systems and "vyre.streamed" in s.systems
    assert "pinned_empty" in s.skipped["page-locked"]
    assert s.skipped["streamed page-locked"] == s.skipped["page-locked"]
    assert s.telemetry == {}
    assert not any("allocations" in t.key for t in report.targets)
    assert {k for k in s.systems if k.startswith("ceiling.copy")} == {"ceiling.copy_in.1", "ceiling.copy_out.1"}
    assert "skipped page-locked" in report.format_table()


class _FakePeer:
    def __init__(self, name, a, b, expected, wrong=False):
        self.name, self.a, self.b, self.expected = name, a, b, expected
        self.out = None
        self.wrong = wrong
        self.closed = False

    def full(self, count):
        self.out = self.a + self.b + (1 if self.wrong else 0)
        return {f"peer.{self.name}": [60_000] * count}

    def launch_only(self, batches):
        return {f"peer.{self.name}.launch_only": [8_000] * batches}

    def verify(self):
        return np.array_equal(self.out, self.expected)

    def close(self):
        self.closed = True


def test_run_profile_peers_measured_or_skipped_by_name(fake_device, monkeypatch):
    opened = []

    def open_peer(name, backend, image, entry, source, a, b, expected):
        if name == "cuda_bindings":
            raise RuntimeError("cannot start\nsecond line")
        peer = _FakePeer(name, a, b, expected, wrong=(name == "torch"))
        opened.append(peer)
        return peer

    monkeypatch.setattr(H, "peer_available", lambda name: True)
    monkeypatch.setattr(H, "open_peer", open_peer)
    report = H.run_bench(
        sizes=(4096,), iterations=4, warmup=1, peers=True, threads=False, backend=FakeBackend(), rounds=2
    )
    s = report.size(4096)
    assert s.skipped["cuda_bindings"] == "failed to start: RuntimeError: cannot start"
    assert s.skipped["torch"].startswith("failed: WrongResult")  # its output was checked
    assert s.median("peer.cupy") == 60_000 and s.median("peer.cupy.launch_only") == 8_000
    assert "peer.torch" not in s.systems
    assert all(p.closed for p in opened)
    t = {(x.key, x.size_bytes): x for x in report.targets}
    assert ("cupy_vs_vyre", 4096) in t and ("torch_vs_vyre", 4096) not in t
    monkeypatch.setattr(H, "peer_available", lambda name: False)
    report = H.run_bench(
        sizes=(4096,), iterations=2, warmup=0, peers=True, threads=False, backend=FakeBackend(), rounds=1
    )
    assert report.size(4096).skipped == {
        "cuda_bindings": "cuda.bindings is not installed",
        "cupy": "cupy is not installed",
        "torch": "torch is not installed",
        "cuda_core": "cuda.core is not installed",
    }


def test_run_profile_user_program_skips_peers_and_targets(fake_device):
    program = types.SimpleNamespace(
        name="scale",
        kernel=types.SimpleNamespace(kind="cuda", entry="scale"),
        inputs=(BufferDecl.read("x", 0, "f64"),),
    )
    backend = FakeBackend()
    report = H.run_bench(
        sizes=(4096,), iterations=8, warmup=1, program=program, peers=True, threads=False, backend=backend, rounds=2
    )
    s = report.size(4096)
    assert {"cuda_bindings", "cupy", "torch"} <= set(s.skipped)
    assert "built-in vecadd" in s.skipped["streamed"] and "vyre.streamed" not in s.systems
    assert s.planner == {}
    assert report.targets == [] and report.threads is None
    assert "scale" in report.meta["program"]
    assert s.moved["vyre"] == (4096, 4096)  # one f64 input, one f64 output
    assert s.traffic("vyre.dispatch") == 8192 and s.traffic("floor.pinned") == 3 * 4096


def test_run_profile_passes_backend_options_and_compares_with_a_baseline(fake_device, tmp_path):
    base = H.run_bench(sizes=(4096,), iterations=4, warmup=1, peers=False, threads=False)
    path = tmp_path / "base.json"
    path.write_text(base.to_json())
    report = H.run_bench(
        sizes=(4096,),
        iterations=4,
        warmup=1,
        peers=False,
        threads=False,
        backend_options={"copy_threads": 4},
        baseline=str(path),
    )
    assert fake_device.created[-1].options == {"copy_threads": 4}
    assert all(b.closed for b in fake_device.created)
    assert report.meta["backend_options"] == {"copy_threads": 4}
    # a stored report names its baseline relative to the working folder, else by file name only
    assert report.meta["baseline"]["path"] == (
        os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path.name
    )
    t = {(x.key, x.size_bytes): x for x in report.targets}
    assert t[("no_regression", 4096)].value is not None and t[("no_regression", 4096)].op == "<="


def test_run_profile_refuses_options_the_backend_does_not_take(fake_device, monkeypatch):
    def old_backend(device=0):
        return FakeBackend(device)

    monkeypatch.setattr(vyre_cuda, "CudaBackend", old_backend)
    with pytest.raises(ValidationError) as err:
        H.run_bench(sizes=(4096,), iterations=2, peers=False, threads=False, backend_options={"staging_chunks": 4})
    assert "staging_chunks" in str(err.value) and _fix_line(err.value).startswith("Fix: ")


def test_a_missing_floor_extension_says_how_to_build_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vyre_cuda.profile._floor", None)
    monkeypatch.delattr(P, "_floor", raising=False)
    with pytest.raises(vyre_cuda.UnsupportedFeature) as err:
        run.import_floor()
    assert "build_ext" in _fix_line(err.value)


# -- the streamed route's rows ---------------------------------------------------------------
def _heavy_run(backend, monkeypatch, **extra):
    monkeypatch.setattr(streamed, "HEAVY_SIZE", 8 * KIB)  # the heavy rows' size, small for the fakes
    options = dict(iterations=6, warmup=1, peers=False, threads=False, backend=backend, rounds=2, host_threads=1)
    # (no patterns: their device arrays would count among the heavy rows' uploads)
    return H.run_bench(sizes="4KiB,8KiB", **{**options, "patterns": False, **extra})


def test_heavy_rows_run_at_their_size_only_and_check_the_kernel(fake_device, monkeypatch):
    backend = FakeBackend()
    report = _heavy_run(backend, monkeypatch)
    small, heavy_size = report.sizes
    heavy_keys = {"vyre.heavy", "vyre.heavy_compute", "vyre.heavy_transfer"}
    assert not heavy_keys & set(small.systems)
    assert heavy_keys <= set(heavy_size.systems)
    assert all(heavy_size.systems[k].n == 6 for k in heavy_keys)
    by_program = {}
    for kind, name, cfg in backend.calls:
        by_program.setdefault(name, []).append((kind, cfg))
    # the heavy round trip: streamed from page-locked arrays; its compute: device-resident
    # arrays (uploaded with outputs="device"), unforced
    heavy = by_program["heavy"]
    assert {cfg.streamed for _, cfg in heavy if cfg is not None} == {True}
    assert sum(cfg is None for _, cfg in heavy) == 6 + 1  # vyre.heavy_compute: timed + warm-up
    uploads = [cfg for kind, cfg in by_program["vecadd_f32"] if kind == "dispatch" and cfg is not None]
    assert len(uploads) == 3 and all(cfg.outputs == "device" for cfg in uploads)
    assert profile_fakes.FakeDeviceArray in backend.into_inputs and Locked in backend.into_inputs
    assert heavy_size.gbps("vyre.heavy") is not None and heavy_size.gbps("vyre.heavy_compute") is None
    t = {(x.key, x.size_bytes): x for x in report.targets}
    overlap = t[("overlap_vs_max", 8 * KIB)]
    want = heavy_size.median("vyre.heavy") / max(
        heavy_size.median("vyre.heavy_compute"), heavy_size.median("vyre.heavy_transfer")
    )
    assert overlap.value == pytest.approx(want) and overlap.limit == 1.15
    assert ("overlap_vs_max", 4 * KIB) not in t
    assert "heavy kernel streamed, page-locked" in report.format_table()


def test_heavy_rows_check_against_numpy(fake_device, monkeypatch):
    real = profile_fakes._fake_run

    def off_by_a_little(program, inputs):
        outs = real(program, inputs)
        if program.name == "heavy":
            outs[0][len(outs[0]) // 2] += np.float32(1e-3)  # one row, past the tolerance
        return outs

    monkeypatch.setattr(profile_fakes, "_fake_run", off_by_a_little)
    with pytest.raises(P.WrongResult, match="heavy kernel streamed"):
        _heavy_run(FakeBackend(), monkeypatch)


def test_heavy_rows_skipped_without_page_locked_arrays(fake_device, monkeypatch):
    monkeypatch.setattr(vyre_cuda, "pinned_empty", None)
    report = _heavy_run(FakeBackend(), monkeypatch)
    s = report.size(8 * KIB)
    assert "vyre.heavy" not in s.systems and "pinned_empty" in s.skipped["heavy"]
    assert not any(t.key == "overlap_vs_max" for t in report.targets)


def test_a_wrong_streamed_result_stops_the_run(fake_device, monkeypatch):
    backend = FakeBackend()
    into = backend.dispatch_into

    def wrong_when_streamed(program, inputs, outputs, config=None):
        into(program, inputs, outputs, config)
        if getattr(config, "streamed", None):
            outputs[0][-1] += 1  # the last row of the last chunk
        return outputs

    backend.dispatch_into = wrong_when_streamed
    with pytest.raises(P.WrongResult, match="vyre_cuda streamed produced a wrong result"):
        H.run_bench(sizes=(4096,), iterations=4, warmup=1, peers=False, threads=False, backend=backend)
