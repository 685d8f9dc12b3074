"""Launch-width autotune: candidates, keys, the tuning cache (round trip, corruption, disabled
disk), the CLI's arguments, and the real tune / plan path on the fake driver (which reports a
chosen device time per block width and a chosen kernel thread limit). The GPU suite tunes a
built-in program on a device (tests/gpu/test_tuning_gpu.py)."""

from __future__ import annotations

import json
import logging

import fakecuda
import pytest

from vyre_cuda import DispatchConfig, builtin_programs, tuning
from vyre_cuda.cli import main
from vyre_cuda.errors import ValidationError
from vyre_cuda.planning.caps import DeviceCaps


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VYRE_CUDA_DISK_CACHE", raising=False)
    tuning.forget_memory()
    yield tmp_path
    tuning.forget_memory()


def entry(block=512):
    return {
        "block": block,
        "baseline": 256,
        "size_class": 1024,
        "timings_ns": {"256": 2000, "512": 1000},
        "rejected": {},
    }


def test_size_classes_are_powers_of_two():
    assert [tuning.size_class(n) for n in (1, 2, 3, 1000, 1024, 1025, 1 << 30)] == [1, 2, 4, 1024, 1024, 2048, 1 << 30]


def test_untunable_dispatches_say_why():
    prog = builtin_programs.vecadd_f32()
    assert tuning.untunable(prog, DispatchConfig()) is None
    assert "workgroup_override" in tuning.untunable(prog, DispatchConfig(workgroup_override=128))
    assert "grid_override" in tuning.untunable(prog, DispatchConfig(grid_override=4))
    assert "cooperative" in tuning.untunable(prog, DispatchConfig(cooperative=True))
    assert "grid-sync" in tuning.untunable(builtin_programs.inclusive_scan_u32(), DispatchConfig())


def test_candidates_are_filtered_by_device_kernel_and_warp():
    caps = DeviceCaps(max_threads_per_block=1024, max_block_dim=(512, 1024, 64))
    widths, rejected = tuning.candidate_widths((64, 96, 100, 256, 512, 1024, 2048), caps, kernel_max=384, baseline=256)
    assert widths == (64, 96, 256)
    assert set(rejected) == {100, 512, 1024, 2048}
    assert "warp" in rejected[100] and "kernel" in rejected[512]
    assert "device" in rejected[2048] and "kernel" in rejected[2048]
    # the declared width is always measured: it is the reference
    assert tuning.candidate_widths((64,), caps, 1024, 128)[0] == (64, 128)


@pytest.mark.parametrize("bad", [(), 256, (0, 64), (64, True), (64.0,), "64"])
def test_bad_candidates_are_refused(bad):
    with pytest.raises(ValidationError, match="Fix:"):
        tuning.candidate_widths(bad, DeviceCaps(), 1024, 256)


def test_keys_cover_device_size_and_program():
    prog = builtin_programs.vecadd_f32()
    h200, a100 = DeviceCaps(name="H200", cc=(9, 0)), DeviceCaps(name="A100", cc=(8, 0))
    key = tuning.tune_key(prog, h200, 1024)
    assert key == tuning.tune_key(builtin_programs.vecadd_f32(), h200, 1024)  # a rebuilt program
    others = {
        tuning.tune_key(prog, a100, 1024),
        tuning.tune_key(prog, h200, 2048),
        tuning.tune_key(builtin_programs.vecadd("f64"), h200, 1024),
        tuning.tune_key(builtin_programs.vecadd("f32", workgroup=128), h200, 1024),
    }
    assert key not in others and len(others) == 4


def test_cache_round_trip(cache_folder):
    key = "ab" * 32
    assert tuning.load(key) is None
    tuning.store(key, entry())
    tuning.forget_memory()  # read from disk this time
    got = tuning.load(key)
    assert got["block"] == 512 and got["key"] == key and got["timings_ns"] == {"256": 2000, "512": 1000}
    assert (cache_folder / "tuning" / f"{key}.json").is_file()


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b"",
        json.dumps({"format": 1, "key": "cd" * 32, "block": 512, "timings_ns": {}, "rejected": {}}).encode(),
        json.dumps({"format": 1, "key": "ab" * 32, "block": -3, "timings_ns": {}, "rejected": {}}).encode(),
        json.dumps({"format": 99, "key": "ab" * 32, "block": 512, "timings_ns": {}, "rejected": {}}).encode(),
        json.dumps({"format": 1, "key": "ab" * 32, "block": 512}).encode(),
        b"\xff\xfe\x00",
    ],
)
def test_a_corrupt_entry_is_ignored_with_a_warning(cache_folder, caplog, content):
    key = "ab" * 32
    (cache_folder / "tuning").mkdir()
    (cache_folder / "tuning" / f"{key}.json").write_bytes(content)
    before = tuning.stats()["corrupt_entries"]
    with caplog.at_level(logging.WARNING, logger="vyre_cuda"):
        assert tuning.load(key) is None
    assert tuning.stats()["corrupt_entries"] == before + 1
    assert any("tuning cache: ignoring" in r.getMessage() for r in caplog.records)
    tuning.store(key, entry(128))  # the next tune rewrites it
    tuning.forget_memory()
    assert tuning.load(key)["block"] == 128


def test_a_disabled_disk_cache_keeps_winners_in_memory_only(cache_folder, monkeypatch):
    monkeypatch.setenv("VYRE_CUDA_DISK_CACHE", "0")
    key = "ef" * 32
    tuning.store(key, entry())
    assert tuning.load(key)["block"] == 512
    assert not (cache_folder / "tuning").exists()


def test_store_refuses_a_malformed_entry(cache_folder):
    with pytest.raises(ValueError):
        tuning.store("ab" * 32, {"block": 0, "timings_ns": {}, "rejected": {}})


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_autotune_must_be_a_bool(value):
    with pytest.raises(ValidationError, match="Fix:"):
        DispatchConfig(autotune=value)


def test_autotune_is_off_by_default():
    assert DispatchConfig().autotune is False and DispatchConfig(autotune=True).autotune is True


@pytest.mark.parametrize(
    "argv",
    [
        ["tune", "no_such_program"],
        ["tune", "--candidates", "64,x"],
        ["tune", "--candidates", "0"],
        ["tune", "--repeats", "0"],
        ["tune", "--elements", "-5"],
    ],
)
def test_tune_cli_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "vyre-cuda tune: error" in capsys.readouterr().err


CHILD = r"""
import json, sys
import numpy as np
import vyre_cuda as vc
from vyre_cuda import tuning, builtin_programs as bp
from fakecuda import FakeDriver, vecadd_emulation, array_at

fake = FakeDriver()
rng = np.random.default_rng(int(sys.argv[1]))
res = {"errors": []}
prog = bp.vecadd_f32()
a, b = (rng.standard_normal(5000).astype(np.float32) for _ in range(2))
g = vc.CudaBackend(0)
blocks = []
def emulation(launch):
    blocks.append(launch.block[0])
    vecadd_emulation(np.float32)(launch)
fake.emulate(g, prog, [a, b], emulation)
for width, ms in ((64, 0.009), (128, 0.004), (256, 0.005), (512, 0.002), (1024, 0.001)):
    fake.set_block_time(width, ms)
fake.set_kernel_max_threads(512)  # the kernel cannot launch 1024 threads

first = g.tune(prog, [a, b])
res["first"] = {"block": first.block, "cached": first.cached, "widths": sorted(first.timings_ns),
                "rejected": {str(k): v for k, v in first.rejected.items()}, "baseline": first.baseline,
                "speedup": first.speedup}
res["widths_launched"] = sorted(set(blocks))
res["stats_after_first"] = tuning.stats()
second = g.tune(prog, [a, b])
res["second"] = {"block": second.block, "cached": second.cached}
res["stats_after_second"] = tuning.stats()

plain = g.plan_info(prog, [a, b])
tuned = g.plan_info(prog, [a, b], vc.DispatchConfig(autotune=True))
res["plain"] = [plain.launch.block[0], plain.tuned_block, plain.tuning]
res["tuned"] = [tuned.launch.block[0], tuned.tuned_block, tuned.tuning, tuned.config.autotune,
                tuned.launch.grid[0]]
blocks.clear()
(out,) = g.dispatch(prog, [a, b], vc.DispatchConfig(autotune=True, label="t"))
res["tuned_dispatch_blocks"] = blocks[:]
if not np.array_equal(out, a + b):
    res["errors"].append("tuned dispatch: wrong result")
blocks.clear()
(out,) = g.dispatch(prog, [a, b])
res["plain_dispatch_blocks"] = blocks[:]
if not np.array_equal(out, a + b):
    res["errors"].append("plain dispatch: wrong result")
explicit = g.plan_info(prog, [a, b], vc.DispatchConfig(autotune=True, workgroup_override=128))
res["explicit"] = [explicit.launch.block[0], explicit.tuned_block, explicit.tuning]

# a size class never tuned: autotune=True measures at plan time, on zero-filled inputs
c, d = (rng.standard_normal(70_000).astype(np.float32) for _ in range(2))
before = tuning.stats()["tunes_measured"]
(out,) = g.dispatch(prog, [c, d], vc.DispatchConfig(autotune=True))
res["measured_at_plan"] = tuning.stats()["tunes_measured"] - before
res["plan_time_tuning"] = g.plan_info(prog, [c, d], vc.DispatchConfig(autotune=True)).tuning
if not np.array_equal(out, c + d):
    res["errors"].append("plan-time tuned dispatch: wrong result")

# a width whose outputs differ is rejected, never cached
prog2 = bp.vecadd_f32()
def wrong_at_128(launch):
    vecadd_emulation(np.float32)(launch)
    if launch.block[0] == 128:
        n = int(launch.words(launch.arg(3), 1)[0])
        array_at(launch.arg(2), np.float32, n)[0] += 1
fake.emulate(g, prog2, [a, b], wrong_at_128)
r = g.tune(prog2, [a, b], force=True)
res["wrong"] = {"block": r.block, "rejected": {str(k): v for k, v in r.rejected.items()}}
g.close()

# a new process reads the disk entry: nothing is measured
tuning.forget_memory()
h = vc.CudaBackend(0)
fake.emulate(h, prog, [a, b], vecadd_emulation(np.float32))
before = tuning.stats()["tunes_measured"]
res["fresh"] = [h.tune(prog, [a, b]).cached, h.plan_info(prog, [a, b], {"autotune": True}).tuned_block,
                tuning.stats()["tunes_measured"] - before]
h.close()
res["hook_errors"] = fake.hook_errors
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def tuned(fake_libcuda, tmp_path_factory):
    proc = fakecuda.run_python(
        ["-c", CHILD, "11"],
        fake_libcuda,
        timeout=300,
        VYRE_CUDA_CACHE_DIR=tmp_path_factory.mktemp("tune-cache"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res.pop("errors") == [] and res.pop("hook_errors") == []
    return res


def test_tune_picks_the_fastest_width_the_kernel_allows(tuned):
    first = tuned["first"]
    assert first["block"] == 512 and not first["cached"] and first["baseline"] == 256
    assert first["widths"] == [64, 128, 256, 512]
    assert list(first["rejected"]) == ["1024"] and "kernel" in first["rejected"]["1024"]
    assert first["speedup"] == pytest.approx(2.5, rel=1e-3)  # float32 event times
    assert tuned["widths_launched"] == [64, 128, 256, 512]


def test_a_second_tune_reads_the_cache_and_measures_nothing(tuned):
    assert tuned["second"] == {"block": 512, "cached": True}
    after1, after2 = tuned["stats_after_first"], tuned["stats_after_second"]
    assert after1["tunes_measured"] == 1 and after1["timed_dispatches"] == 4 * 6
    assert after2["tunes_measured"] == 1 and after2["timed_dispatches"] == after1["timed_dispatches"]
    assert after2["cache_hits"] == after1["cache_hits"] + 1


def test_planning_uses_the_winner_only_with_autotune(tuned):
    assert tuned["plain"] == [256, None, ""]
    block, tuned_block, reason, flag, grid = tuned["tuned"]
    assert block == 512 and tuned_block == [512, 1, 1] and "from the tuning cache" in reason and flag
    assert grid == -(-5000 // 512)
    assert tuned["tuned_dispatch_blocks"] == [512]
    assert tuned["plain_dispatch_blocks"] == [256]


def test_an_explicit_width_is_never_retuned(tuned):
    block, tuned_block, reason = tuned["explicit"]
    assert block == 128 and tuned_block is None and "workgroup_override" in reason


def test_autotune_measures_an_untuned_size_class_at_plan_time(tuned):
    assert tuned["measured_at_plan"] == 1
    assert "from the tuning cache" in tuned["plan_time_tuning"]  # planned again: now cached


def test_a_width_with_different_outputs_is_rejected(tuned):
    assert tuned["wrong"]["block"] == 512
    assert "differ" in tuned["wrong"]["rejected"]["128"]


def test_a_new_process_reads_the_disk_entry(tuned):
    assert tuned["fresh"] == [True, [512, 1, 1], 0]
