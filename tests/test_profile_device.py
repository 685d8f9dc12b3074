"""The device-resident and launch-floor rows of the profile without a GPU: their series, targets
(met, missed with the measured reason, absent without both series), the peers that measure them
on faked libraries, and the issued floor and the rebuilt-Program row on the fake CUDA driver."""

import importlib.util
import json

import numpy as np
import profile_fakes
import pytest
from profile_fakes import FakeBackend

import benchmarks.harness as H
from benchmarks.harness import peers, targets
from benchmarks.harness.peers import cuda_core_peer, cupy_peer, torch_peer
from vyre_cuda import builtin_programs as bp
from vyre_cuda import profile as P
from vyre_cuda.profile import engine, systems

KIB, MIB = 1024, 1 << 20
NEW_DEVICE_KEYS = (
    "vyre.device.zeroed",
    "vyre.device.out",
    "vyre.device.torch",
    "vyre.device.enqueue",
    "vyre.device.enqueue.foreign",
    "vyre.device.enqueue.devarray",
    "peer.cuda_core.device",
    "peer.cuda_core.enqueue",
)
DEVICE_TARGETS = {
    "device_vs_cupy",
    "device_vs_cuda_core",
    "device_torch_vs_torch",
    "device_out_vs_into",
    "enqueue_vs_cuda_core",
    "rebuilt_vs_same",
    "small_vs_floor_issued",
}


@pytest.fixture
def fake_device(monkeypatch):
    return profile_fakes.install(monkeypatch)


def _summary(median):
    return P.Summary(100, float(median), median * 0.9, median * 1.1)


def _size(nbytes, ns, telemetry=None):
    s = P.SizeResult(nbytes, nbytes // 4, 100)
    s.systems = {k: _summary(v) for k, v in ns.items()}
    s.moved = {"floor": (2 * nbytes, nbytes), "vyre": (2 * nbytes, nbytes)}
    s.telemetry = dict(telemetry or {})
    return s


# 4 KiB: every device target missed (ratios 1.125, 1.2, 1.2, 1.33, 1.4, 1.0625 met, 1.067)
SMALL = {
    "vyre.dispatch": 16_000,
    "floor.pinned": 17_000,
    "floor.pinned_direct": 15_000,
    "floor.launch_only": 2_000,
    "vyre.device": 9_000,
    "vyre.device.zeroed": 10_500,
    "vyre.device.out": 12_000,
    "vyre.device.torch": 12_000,
    "vyre.device.enqueue": 3_500,
    "vyre.device.enqueue.foreign": 4_700,
    "vyre.device.enqueue.devarray": 3_000,
    "vyre.rebuilt": 17_000,
    "peer.cupy.device": 8_000,
    "peer.cupy.launch_only": 3_000,
    "peer.cuda_core.device": 7_500,
    "peer.cuda_core.enqueue": 2_500,
    "peer.torch.device": 10_000,
    "peer.torch.launch_only": 4_000,
}


def _by_key(found):
    return {(t.key, t.size_bytes): t for t in found}


def test_new_series_labels_traffic_and_references():
    assert systems.label("floor.pinned_direct") == "per-buffer issued floor: pinned arrays"
    assert systems.traffic_kind("floor.pinned_direct") == systems.FULL
    assert systems.reference("floor.pinned_direct") == "floor.pinned"
    assert systems.traffic_kind("vyre.rebuilt") == systems.FULL and systems.reference("vyre.rebuilt") == "floor.pinned"
    for key in NEW_DEVICE_KEYS:
        assert systems.label(key) != key, key  # a label of its own
        assert systems.traffic_kind(key) is None, key  # device-resident: moves nothing host-side
    assert (
        systems.reference("vyre.device.enqueue") == systems.reference("peer.cuda_core.enqueue") == "floor.launch_only"
    )
    assert systems.reference("vyre.device.out") is None
    # table order: floor and vyre rows before the device-resident ones, which follow the peers
    order = sorted(["peer.cuda_core.device", "vyre.rebuilt", "floor.pinned_direct", "vyre.dispatch"], key=systems.order)
    assert order == ["floor.pinned_direct", "vyre.dispatch", "vyre.rebuilt", "peer.cuda_core.device"]


def test_device_targets_values_and_miss_notes():
    t = _by_key(targets.evaluate_targets([_size(4 * KIB, SMALL)], None))
    assert {k for k, _ in t} >= DEVICE_TARGETS
    expect = {
        "device_vs_cupy": (9_000 / 8_000, 1.1),
        "device_vs_cuda_core": (9_000 / 7_500, 1.15),
        "device_torch_vs_torch": (12_000 / 10_000, 1.1),
        "device_out_vs_into": (12_000 / 9_000, 1.2),
        "enqueue_vs_cuda_core": (3_500 / 2_500, 1.2),
        "rebuilt_vs_same": (17_000 / 16_000, 1.1),
        "small_vs_floor_issued": (16_000 / 15_000, 0.9),
    }
    for key, (value, limit) in expect.items():
        target = t[(key, 4 * KIB)]
        assert target.value == pytest.approx(value) and target.limit == limit and target.op == "<=", key
        assert target.met is (value <= limit), key
        assert bool(target.note) is (value > limit), key  # a note on a miss only
    cupy = t[("device_vs_cupy", 4 * KIB)].note
    assert "2.00 us (floor.launch_only)" in cupy and "3.00 us (peer.cupy.launch_only)" in cupy
    assert "vyre_cuda's host cost above CuPy's is 1.00 us" in cupy
    # what a clearing pass would add, from the same dispatch with its output declared zeroed
    assert "declared zeroed (a clearing pass before the kernel) vyre_cuda took 10.50 us, 1.31x, 1.50 us more" in cupy
    assert "zeroed" not in t[("device_torch_vs_torch", 4 * KIB)].note  # no zeroed torch row
    core = t[("device_vs_cuda_core", 4 * KIB)].note
    assert "2.50 us (peer.cuda_core.enqueue)" in core and "above cuda.core's is 1.50 us" in core
    assert "4.00 us (peer.torch.launch_only)" in t[("device_torch_vs_torch", 4 * KIB)].note
    assert "costs 3.00 us above dispatch_into's 9.00 us" in t[("device_out_vs_into", 4 * KIB)].note
    enqueue = t[("enqueue_vs_cuda_core", 4 * KIB)].note
    assert "one cuLaunchKernel from C costs 2.00 us" in enqueue and "3.50 us, 1.00 us more" in enqueue
    assert "with the arrays exported on another stream it takes 4.70 us" in enqueue
    # the same enqueue on vyre_cuda's own DeviceArrays: what reading the CuPy arrays costs
    assert "DeviceArrays (no CuPy protocol to read) it takes 3.00 us, 1.20x cuda.core's launch" in enqueue
    assert "CuPy's current stream costs 0.50 us" in enqueue
    without = {k: v for k, v in SMALL.items() if k != "vyre.device.enqueue.devarray"}
    plain = _by_key(targets.evaluate_targets([_size(4 * KIB, without)], None))
    assert "DeviceArrays" not in plain[("enqueue_vs_cuda_core", 4 * KIB)].note  # not measured: not named
    issued = t[("small_vs_floor_issued", 4 * KIB)].note
    assert "takes 15.00 us, vyre_cuda 16.00 us" in issued
    assert "no timed dispatch replayed a graph and one cuLaunchKernel from C costs 2.00 us" in issued


def test_rebuilt_miss_note_and_issued_note_with_graph_replays():
    ns = dict(SMALL, **{"vyre.rebuilt": 20_000})
    s = _size(4 * KIB, ns, telemetry={"dispatches": 800, "graph_replays": 600})
    t = _by_key(targets.evaluate_targets([s], None))
    rebuilt = t[("rebuilt_vs_same", 4 * KIB)]
    assert rebuilt.met is False and "4.00 us per dispatch above the 16.00 us" in rebuilt.note
    assert "600 of the 800 timed vyre_cuda dispatches replayed a graph" in t[("small_vs_floor_issued", 4 * KIB)].note


def test_device_targets_met_carry_no_note():
    met = dict(SMALL)
    met.update({"vyre.device": 7_000, "vyre.device.torch": 10_000, "vyre.device.out": 8_000})
    met.update({"vyre.device.enqueue": 2_600, "vyre.dispatch": 13_000, "vyre.rebuilt": 13_500})
    t = _by_key(targets.evaluate_targets([_size(4 * KIB, met)], None))
    for key in DEVICE_TARGETS:
        assert t[(key, 4 * KIB)].met is True and t[(key, 4 * KIB)].note == "", key


def test_a_device_target_needs_both_of_its_series():
    for missing, gone in (
        (("peer.cuda_core.device", "peer.cuda_core.enqueue"), {"device_vs_cuda_core", "enqueue_vs_cuda_core"}),
        (("peer.torch.device",), {"device_torch_vs_torch"}),
        (("vyre.device",), {"device_vs_cupy", "device_vs_cuda_core", "device_out_vs_into"}),
        (("floor.pinned_direct",), {"small_vs_floor_issued"}),
        (("vyre.rebuilt",), {"rebuilt_vs_same"}),
        (("vyre.device.enqueue",), {"enqueue_vs_cuda_core"}),
    ):
        ns = {k: v for k, v in SMALL.items() if k not in missing}
        keys = {t.key for t in targets.evaluate_targets([_size(4 * KIB, ns)], None)}
        assert not gone & keys, missing
        assert DEVICE_TARGETS - gone <= keys, missing
    assert not DEVICE_TARGETS & {t.key for t in targets.evaluate_targets([_size(4 * KIB, SMALL)], None, False)}


def test_device_targets_by_size():
    large = {"vyre.device": 1_300_000, "peer.cupy.device": 1_000_000, "floor.pinned": 30_000_000}
    sizes = [_size(4 * MIB, SMALL), _size(64 * MIB, large), _size(256 * MIB, dict(large, **{"vyre.device": 1e6}))]
    t = _by_key(targets.evaluate_targets(sizes, None))
    assert not any(k in DEVICE_TARGETS for k, n in t if n == 4 * MIB)  # small targets: up to 64 KiB only
    assert ("device_large_vs_cupy", 4 * MIB) not in t
    big = t[("device_large_vs_cupy", 64 * MIB)]
    assert big.value == pytest.approx(1.3) and big.met is False
    assert "CuPy took 1.00 ms and vyre_cuda 1.30 ms, 0.30 ms more" in big.note
    assert "zeroed" not in big.note  # no zeroed row at this size
    with_zeroed = dict(large, **{"vyre.device.zeroed": 1_380_000})
    by_key = _by_key(targets.evaluate_targets([_size(64 * MIB, with_zeroed)], None))
    note = by_key[("device_large_vs_cupy", 64 * MIB)].note
    assert "declared zeroed (a clearing pass before the kernel) vyre_cuda took 1.38 ms, 1.38x CuPy's time" in note
    assert t[("device_large_vs_cupy", 256 * MIB)].met is True and t[("device_large_vs_cupy", 256 * MIB)].note == ""
    assert not any(k in DEVICE_TARGETS for k, n in t if n >= 64 * MIB)


def test_table_and_json_carry_the_new_rows_and_targets():
    s = _size(4 * KIB, SMALL)
    report = H.BenchReport(meta={"device_name": "Fake GPU"}, sizes=[s])
    report.targets = targets.evaluate_targets(report.sizes, None)
    text = report.format_table()
    for key in (*NEW_DEVICE_KEYS, "floor.pinned_direct", "vyre.rebuilt"):
        assert systems.label(key) in text, key
    assert "CuPy device arrays / cuda.core launch on device buffers + sync: 1.20x (target <= 1.15)" in text
    assert "why: the launch floor alone is 2.00 us (floor.launch_only) and 2.50 us (peer.cuda_core.enqueue)" in text
    back = H.BenchReport.from_json(report.to_json())
    assert back.to_dict() == report.to_dict()
    data = json.loads(report.to_json())
    assert set(SMALL) <= set(data["sizes"][0]["systems"])
    stored = {t["key"]: t for t in data["targets"]}
    assert set(stored) >= DEVICE_TARGETS
    assert stored["device_vs_cupy"]["met"] is False and "host cost above CuPy's" in stored["device_vs_cupy"]["note"]


# -- the peers on faked libraries ----------------------------------------------------------
def test_the_new_peers_are_registered_and_skipped_by_name_when_missing(fake_device, monkeypatch):
    assert peers.PEERS[-1] == "cuda_core" and peers.PEER_MODULES["cuda_core"] == "cuda.core"
    if importlib.util.find_spec("cuda.core") is None:  # (this machine has no cuda.core)
        assert peers.peer_available("cuda_core") is False
    monkeypatch.setattr(H, "peer_available", lambda name: False)
    report = H.run_bench(sizes=(4096,), iterations=4, warmup=1, peers=True, threads=False, rounds=2)
    s = report.size(4096)
    assert s.skipped["cuda_core"] == "cuda.core is not installed" and s.skipped["torch"] == "torch is not installed"
    assert not {k for k in s.systems if k.startswith(("peer.", "vyre.device"))}
    keys = {t.key for t in report.targets}
    assert {"rebuilt_vs_same", "small_vs_floor_issued"} <= keys  # measured without any peer
    assert not keys & (DEVICE_TARGETS - {"rebuilt_vs_same", "small_vs_floor_issued"})


@pytest.mark.parametrize("stream_first", [True, False])
def test_every_device_row_runs_on_faked_peers(fake_device, monkeypatch, stream_first):
    core = profile_fakes.install_peer_libraries(monkeypatch, stream_first)
    monkeypatch.setattr(H, "peer_available", lambda name: name != "cuda_bindings")
    backend = FakeBackend()
    # (no patterns: their dispatch_async calls would count among the enqueue rows')
    report = H.run_bench(
        sizes=(4096,), iterations=8, warmup=1, peers=True, threads=False, backend=backend, rounds=2, patterns=False
    )
    s = report.size(4096)
    assert not {k for k in s.skipped if k != "cuda_bindings"}, s.skipped
    for key in (*NEW_DEVICE_KEYS, "vyre.device", "peer.cupy.device", "peer.torch.device"):
        assert s.median(key) is not None, key
    assert s.systems["vyre.device.out"].n == 8 and s.systems["peer.cuda_core.device"].n == 8
    # enqueue rows count launch batches; each batch is LAUNCH_BATCH launches or dispatches
    assert s.systems["vyre.device.enqueue"].n == s.systems["peer.cuda_core.enqueue"].n >= 2
    assert "peer.cuda_core" not in s.systems and "peer.cuda_core.launch_only" not in s.systems  # no such series
    keys = {t.key for t in report.targets}
    assert keys >= DEVICE_TARGETS
    # outputs="device" from CuPy inputs; the enqueue row on the caller's CuPy stream (its handle),
    # writing a CuPy output it names
    device_out = [
        cfg for kind, _, cfg in backend.calls if kind == "dispatch" and getattr(cfg, "outputs", "") == "device"
    ]
    assert device_out and all(cfg.stream is None for cfg in device_out)
    enqueued = [cfg for kind, _, cfg in backend.calls if kind == "dispatch_async" and cfg is not None]
    assert enqueued and all(cfg.stream == 0x5000 and cfg.outputs == "host" for cfg in enqueued)
    named = [outs for outs in backend.async_outputs if outs is not None]
    assert len(named) == len(enqueued) and all(len(outs) == 1 for outs in named)  # one CuPy output, named
    assert len(enqueued) % engine.LAUNCH_BATCH == 0
    # the target's row enqueues inside ``with stream:`` (its arrays exported on the dispatch's own
    # stream, as in a pipeline); the foreign row with CuPy's default stream current, and the
    # DeviceArray row (vyre_cuda's own arrays, no CuPy array to export): as many each
    asyncs = [cfg for kind, _, cfg in backend.calls if kind == "dispatch_async"]
    current = [ptr for cfg, ptr in zip(asyncs, backend.async_current, strict=True) if cfg is not None]
    assert 3 * current.count(0x5000) == len(enqueued) and current.count(0) == 2 * current.count(0x5000)
    own = [outs for outs in named if isinstance(outs[0], profile_fakes.FakeDeviceArray)]
    assert 3 * len(own) == len(enqueued)
    assert core.launches and all(k == ("kernel", "vecadd") for k in core.launches)  # the floor's entry


def test_a_failing_vyre_hook_is_skipped_alone(fake_device, monkeypatch):
    profile_fakes.install_peer_libraries(monkeypatch)
    monkeypatch.setattr(H, "peer_available", lambda name: name == "cupy")

    def refuse(self, backend, program):
        raise ValueError("no caller streams here\nsecond line")

    monkeypatch.setattr(cupy_peer.CupyPeer, "vyre_enqueue", refuse)
    report = H.run_bench(sizes=(4096,), iterations=4, warmup=1, peers=True, threads=False, rounds=2)
    s = report.size(4096)
    assert s.skipped["cupy vyre_enqueue"] == "failed to start: ValueError: no caller streams here"
    assert "vyre.device.enqueue" not in s.systems
    assert s.median("peer.cupy.device") is not None and s.median("vyre.device.out") is not None  # the rest stays


def test_vyre_hooks_verify_against_the_expected_sum(monkeypatch):
    profile_fakes.install_peer_libraries(monkeypatch)
    rng = np.random.default_rng(3)
    a, b = rng.random(256, dtype=np.float32), rng.random(256, dtype=np.float32)
    backend, program = FakeBackend(), bp.vecadd_f32()
    cp = cupy_peer.start(backend, b"", "vecadd", "// src", a, b, a + b)
    hooks = (
        "vyre_device",
        "vyre_device_zeroed",
        "vyre_device_out",
        "vyre_enqueue",
        "vyre_enqueue_foreign",
        "vyre_enqueue_devarray",
    )
    for hook in hooks:
        run_fn, verify = getattr(cp, hook)(backend, program)
        assert verify() is False  # nothing measured yet
        run_fn(2)
        assert verify() is True, hook
    torch = torch_peer.start(backend, b"", "vecadd", "// src", a, b, a + b)
    run_fn, verify = torch.vyre_device(backend, program)
    assert len(run_fn(3)["vyre.device.torch"]) == 3 and verify() is True
    wrong = torch_peer.start(backend, b"", "vecadd", "// src", a, b, a - b)  # another expected result
    run_fn, verify = wrong.vyre_device(backend, program)
    run_fn(1)
    assert verify() is False


def test_cuda_core_peer_measures_and_verifies_on_a_fake_cuda_core(monkeypatch):
    core = profile_fakes.install_peer_libraries(monkeypatch)
    rng = np.random.default_rng(5)
    a, b = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    peer = cuda_core_peer.start(FakeBackend(), b"", "vecadd", "// src", a, b, a + b)
    assert peer.verify() is False
    assert len(peer.device_resident(3)["peer.cuda_core.device"]) == 3 and peer.verify() is True
    assert peer.stream.syncs >= 3  # one sync per sample
    before = len(core.launches)
    assert len(peer.launch_only(2)["peer.cuda_core.enqueue"]) == 2
    assert len(core.launches) - before == 2 * engine.LAUNCH_BATCH and peer.verify() is True
    wrong = cuda_core_peer.start(FakeBackend(), b"", "vecadd", "// src", a, b, a * b)
    wrong.device_resident(1)
    assert wrong.verify() is False
    buffers, stream = peer.buffers, peer.stream
    peer.close()
    assert all(buf.closed for buf in buffers) and stream.closed
    peer.close()  # twice is fine


def test_cuda_core_import_falls_back_to_experimental(monkeypatch):
    import sys
    import types

    core, _ = profile_fakes.fake_cuda_core()
    bare = types.ModuleType("cuda.core")
    bare.experimental = core
    monkeypatch.setitem(sys.modules, "cuda.core", bare)
    monkeypatch.setitem(sys.modules, "cuda.core.experimental", core)
    assert cuda_core_peer.import_cuda_core() is core
    monkeypatch.setitem(sys.modules, "cuda.core", core)
    assert cuda_core_peer.import_cuda_core() is core


# -- on the fake CUDA driver: the real floor extension and the real backend ----------------
CHILD = r"""
import ctypes, json, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, array_at, vecadd_emulation
from vyre_cuda import builtin_programs
from vyre_cuda.errors import ValidationError
from vyre_cuda.profile import engine, run, runners
import benchmarks.harness as H

res = {}
fake = FakeDriver()
rng = np.random.default_rng(int(sys.argv[1]))
mode = {"wrong": False}

def floor_vecadd(launch):
    # the floor's signature: three pointers, then the element count by value
    n = ctypes.c_uint32.from_address(launch._params[3]).value
    a, b, out = (array_at(launch.arg(k), np.float32, n) for k in range(3))
    out[:] = (a - b) if mode["wrong"] else (a + b)

class Fallback(dict):  # the floor's function is not known by handle: every other launch is its
    def get(self, key, default=None):
        return super().get(key, floor_vecadd)

fake.emulators = Fallback()
backend = vc.CudaBackend(0)
kernel, image = run.load_floor_kernel(backend)
n = 1000
a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
expected = a + b
floor = run.import_floor().Floor(kernel, n)
locked = runners.page_locked_copies([a, b, np.zeros_like(a)])
before = fake.stats()
(direct,) = [r for r in runners.floor_runners(floor, a, b, expected, None, locked) if r.name == "floor pinned arrays"]
samples = direct(5)
after = fake.stats()
res["direct_n"] = len(samples["floor.pinned_direct"])
res["direct_positive"] = bool(min(samples["floor.pinned_direct"]) > 0)
res["direct_ok"] = bool(direct.verify())
res["direct_calls"] = {k: after[k] - before[k] for k in ("htod_copies", "dtoh_copies", "launches", "memsets", "syncs")}
mode["wrong"] = True
direct(1)
res["wrong_verify"] = bool(direct.verify())
failed = {}
engine.run_rounds([direct], 2, 0, 1, failed=failed)
res["wrong_skipped"] = failed
mode["wrong"] = False
try:
    floor.full_pinned_direct(a, b, locked[2], 1)
    res["pageable_refused"] = ""
except ValidationError as exc:
    res["pageable_refused"] = str(exc)
floor.close()
kernel.close()

built = []

def factory():
    built.append(builtin_programs.vecadd_f32())
    return built[-1]

program = builtin_programs.vecadd_f32()
fake.emulate(backend, program, [a, b], vecadd_emulation(np.float32))
(first,) = backend.dispatch(program, [a, b])
snap0 = backend.telemetry.snapshot()
check = lambda outs: len(outs) == 1 and np.array_equal(outs[0], expected)
rebuilt = H.rebuilt_runner(backend, factory, [a, b], check)
samples = rebuilt(6)
snap1 = backend.telemetry.snapshot()
res["rebuilt_n"] = len(samples["vyre.rebuilt"])
res["rebuilt_ok"] = bool(rebuilt.verify()) and bool(np.array_equal(first, expected))
res["rebuilt_same"] = all(p is built[0] for p in built)  # built again from its parts: the first build
res["rebuilt_equal"] = all(p == program for p in built)
res["prepared_plans"] = [snap0["prepared_plans"], snap1["prepared_plans"]]
res["dispatches"] = snap1["dispatches"] - snap0["dispatches"]
other = vc.Program(program.kernel, program.buffers, name="vecadd_other", workgroup_size=(128, 1, 1))
fake.emulate(backend, other, [a, b], vecadd_emulation(np.float32))
backend.dispatch(other, [a, b])
res["other_plans"] = backend.telemetry.snapshot()["prepared_plans"]
backend.close()
res["hook_errors"] = fake.hook_errors
print(json.dumps(res))
"""


def test_issued_floor_and_rebuilt_program_on_the_fake_driver(fake_libcuda, rng):
    import fakecuda

    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["hook_errors"] == []
    # floor.pinned_direct: 2 H2D + 1 launch + 1 D2H + 1 sync per sample, no memset, right output
    assert res["direct_n"] == 5 and res["direct_positive"] and res["direct_ok"]
    assert res["direct_calls"] == {"htod_copies": 10, "dtoh_copies": 5, "launches": 5, "memsets": 0, "syncs": 5}
    assert res["wrong_verify"] is False
    assert res["wrong_skipped"] == {
        "floor pinned arrays": "failed: WrongResult: floor pinned arrays produced a wrong result during warm-up"
    }
    assert "floor buffer 'a' is not page-locked memory (4,000 bytes" in res["pageable_refused"]
    assert "Fix: pass arrays from vyre_cuda.pinned_empty" in res["pageable_refused"]
    # vyre.rebuilt: the Program built from its parts per dispatch (the first build's object), no new plan
    assert res["rebuilt_n"] == 6 and res["rebuilt_ok"]
    assert res["rebuilt_same"] and res["rebuilt_equal"]
    assert res["prepared_plans"] == [1, 1] and res["dispatches"] == 6
    assert res["other_plans"] == 2  # a Program that differs does plan again (the count is live)


def test_bench_json_carries_the_new_series_and_targets(fake_device, monkeypatch, tmp_path):
    profile_fakes.install_peer_libraries(monkeypatch)
    monkeypatch.setattr(H, "peer_available", lambda name: name != "cuda_bindings")
    out = tmp_path / "out.json"
    out.write_text(H.run_bench(sizes=(4096,), iterations=6, threads=False, patterns=False).to_json())
    data = json.loads(out.read_text())
    series = set(data["sizes"][0]["systems"])
    assert {*NEW_DEVICE_KEYS, "floor.pinned_direct", "vyre.rebuilt", "vyre.device"} <= series
    assert {t["key"] for t in data["targets"]} >= DEVICE_TARGETS
    assert H.BenchReport.load(out).size(4096).median("floor.pinned_direct") == 16_000  # the fake floor's figure


def test_the_zeroed_row_runs_the_program_with_its_output_zeroed():
    prog = bp.vecadd_f32()
    assert [b.zeroed for b in prog.buffers] == [True, True, False]  # the kernel writes every element
    variant = cupy_peer.zeroed(prog)
    assert [b.zeroed for b in variant.buffers] == [True, True, True]
    assert variant != prog and variant.kernel == prog.kernel
