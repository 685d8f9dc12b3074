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

# a size class never tuned: autotune=True measures at plan time, on the dispatch's inputs
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


# Autotune on the dispatch's own data, and tuning-cache entries no tune could have written. The
# block times make the widest widths the fastest, so a tune that accepts a width without checking
# its outputs on real data (on zeros every width of these kernels agrees) picks a wrong one.
REAL_DATA_CHILD = r"""
import json, logging, sys
import numpy as np
import vyre_cuda as vc
from vyre_cuda import tuning, builtin_programs as bp
from fakecuda import FakeDriver, vecadd_emulation, array_at

fake = FakeDriver()
rng = np.random.default_rng(int(sys.argv[1]))
res = {"errors": []}
warned = []


class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warned.append(record.getMessage())


logging.getLogger("vyre_cuda").addHandler(Keep())
g = vc.CudaBackend(0)
AUTO = vc.DispatchConfig(autotune=True)
for width, ms in ((64, 0.009), (128, 0.003), (256, 0.005), (512, 0.002), (1024, 0.001)):
    fake.set_block_time(width, ms)
seen = []  # (block, whether the launch's input held any non-zero value)


def moved(before, name):
    return tuning.stats().get(name, 0) - before.get(name, 0)


# one 256-element tile per block through a fixed shared array: widths up to 256 loop over the
# tile; the grid follows the width (ceil(n / blockDim.x)), so wider blocks leave the last tiles
# unsummed
TILES = r'''
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const vyre_u32* x, vyre_u32* sums, const vyre_u32* params) {
  __shared__ vyre_u32 s[256];
  const vyre_u64 base = (vyre_u64)blockIdx.x * 256u;
  if (threadIdx.x < 256u) {
    vyre_u32 acc = 0u;
    for (vyre_u32 t = threadIdx.x; t < 256u; t += blockDim.x)
      if (vyre_in_bounds(params, 0, base + t)) acc += x[base + t];
    s[threadIdx.x] = acc;
  }
  __syncthreads();
  if (threadIdx.x == 0u && vyre_in_bounds(params, 1, blockIdx.x)) {
    vyre_u32 total = 0u;
    for (vyre_u32 t = 0u; t < min(blockDim.x, 256u); t++) total += s[t];
    sums[blockIdx.x] = total;
  }
}
'''


def tile_sums(launch):
    words = launch.words(launch.arg(2), 3)  # launch count, x's and sums' element counts
    x = array_at(launch.arg(0), np.uint32, int(words[1]))
    sums = array_at(launch.arg(1), np.uint32, int(words[2]))
    k = min(launch.grid[0], sums.size)
    sums[:k] = x[: k * 256].reshape(k, 256).sum(axis=1, dtype=np.uint32)
    seen.append((launch.block[0], bool(x.any())))


def block_sums(launch):
    # per-block sums of blockDim.x elements through a 256-slot shared array (the GPU test's kernel)
    words = launch.words(launch.arg(2), 3)
    x = array_at(launch.arg(0), np.uint32, int(words[1]))
    sums = array_at(launch.arg(1), np.uint32, int(words[2]))
    width = launch.block[0]
    for b in range(min(launch.grid[0], sums.size)):
        sums[b] = x[b * width : b * width + min(width, 256)].sum(dtype=np.uint32)
    seen.append((width, bool(x.any())))


def sums_program(name, n_tiles):
    # a kernel of its own per name (its digest keys the tuning entry; one emulation per kernel)
    return vc.Program(
        vc.Kernel.cuda(f"{TILES}// {name}\n"),
        [vc.BufferDecl.read("x", 0, "u32"), vc.BufferDecl.output("sums", 1, "u32", n_tiles)],
        launch="x",
        name=name,
    )


def entry_of(prog, inputs):
    n = g.plan_info(prog, inputs).launch.element_count
    return tuning.load(tuning.tune_key(prog, g.caps, tuning.size_class(n)))


for name, emulation in (("tiles", tile_sums), ("blocks", block_sums)):
    n_tiles = 300
    prog = sums_program(name, n_tiles)
    x = rng.integers(1, 1000, n_tiles * 256, dtype=np.uint32)
    want = x.reshape(n_tiles, 256).sum(axis=1, dtype=np.uint32)
    fake.emulate(g, prog, [x], emulation)
    seen.clear()
    before = tuning.stats()
    (out,) = g.dispatch(prog, [x], AUTO)
    entry = entry_of(prog, [x]) or {}
    res[name] = {
        "correct": bool(np.array_equal(out, want)),
        "measured": moved(before, "tunes_measured"),
        "block": entry.get("block"),
        "timed": sorted(int(w) for w in entry.get("timings_ns", {})),
        "rejected": entry.get("rejected", {}),
        "real_data": bool(seen) and all(nonzero for _, nonzero in seen),
        "plan": g.plan_info(prog, [x], AUTO).tuning,
    }
    (again,) = g.dispatch(prog, [x], AUTO)
    res[name]["again_correct"] = bool(np.array_equal(again, want))
    t = g.tune(prog, [x])  # tune() on the same data agrees with what the plan-time measurement cached
    res[name]["tune"] = [t.cached, t.block]

# a plan made without the inputs measures nothing and keeps the declared width
prog = sums_program("no_inputs", 40)
x = rng.integers(1, 1000, 40 * 256, dtype=np.uint32)
fake.emulate(g, prog, [x], tile_sums)
base = g.plan_info(prog, [x])
before = tuning.stats()
block, reason = tuning.planned_width(g, prog, (x.nbytes,), vc.DispatchConfig(), base, None)
res["no_inputs"] = {"block": block, "reason": reason, "measured": moved(before, "tunes_measured"),
                    "entry": entry_of(prog, [x])}

# read-write inputs, host and device: the tune's runs never modify the caller's array
src = r'''
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(float* x, const vyre_u32* params) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(params)) x[i] *= 2.0f;
}
'''
twice = vc.Program(vc.Kernel.cuda(src), [vc.BufferDecl.read_write("x", 0, "f32")], name="twice")


def double(launch):
    n = int(launch.words(launch.arg(1), 1)[0])
    x = array_at(launch.arg(0), np.float32, n)
    seen.append((launch.block[0], bool(x.any())))
    x *= 2


a = (rng.standard_normal(3000) + 8).astype(np.float32)  # no zeros
kept = a.copy()
fake.emulate(g, twice, [a], double)
seen.clear()
before = tuning.stats()
(out,) = g.dispatch(twice, [a], AUTO)
res["rw_host"] = {"correct": bool(np.array_equal(out, kept * 2)), "unchanged": bool(np.array_equal(a, kept)),
                  "measured": moved(before, "tunes_measured"), "real_data": bool(seen) and all(z for _, z in seen)}
b = (rng.standard_normal(20_000) + 8).astype(np.float32)
(dx,) = g.dispatch(twice, [b], vc.DispatchConfig(outputs="device"))  # a device array of 2b
seen.clear()
before = tuning.stats()
try:
    (dout,) = g.dispatch(twice, [dx], vc.DispatchConfig(autotune=True, outputs="device"))
    res["rw_device"] = {"correct": bool(np.array_equal(dout.numpy(), b * 4)),
                        "unchanged": bool(np.array_equal(dx.numpy(), b * 2)),
                        "measured": moved(before, "tunes_measured"),
                        "real_data": bool(seen) and all(z for _, z in seen)}
    del dout
except Exception as exc:
    res["rw_device"] = {"error": f"{type(exc).__name__}: {exc}"}
del dx

# entries no tune on this device could have written: ignored, counted, logged, measured again
vec = bp.vecadd_f32()


def vecadd_seen(launch):
    n = int(launch.words(launch.arg(3), 1)[0])
    seen.append((launch.block[0], bool(array_at(launch.arg(0), np.float32, n).any())))
    vecadd_emulation(np.float32)(launch)


fake.emulate(g, vec, [np.ones(10, np.float32)] * 2, vecadd_seen)


def write_entry(prog, n, block):
    key = tuning.tune_key(prog, g.caps, tuning.size_class(n))
    body = {"format": tuning.FORMAT, "key": key, "block": block, "baseline": 256,
            "size_class": tuning.size_class(n), "timings_ns": {}, "rejected": {}}
    tuning.tune_dir().mkdir(parents=True, exist_ok=True)
    (tuning.tune_dir() / f"{key}.json").write_text(json.dumps(body))
    return key


def bad_entry_case(block, n, kernel_max=1024, how="dispatch"):
    fake.set_kernel_max_threads(kernel_max)
    a, b = ((rng.standard_normal(n) + 8).astype(np.float32) for _ in range(2))
    key = write_entry(vec, n, block)
    seen.clear()
    warned.clear()
    before = tuning.stats()
    case = {"error": None}
    try:
        if how == "dispatch":
            (out,) = g.dispatch(vec, [a, b], AUTO)
            case["correct"] = bool(np.array_equal(out, a + b))
        elif how == "tune":
            t = g.tune(vec, [a, b])
            case["tune"] = [t.cached, t.block]
        else:
            base = g.plan_info(vec, [a, b])
            case["planned"] = list(tuning.planned_width(g, vec, (a.nbytes, b.nbytes), vc.DispatchConfig(), base))
    except Exception as exc:
        case["error"] = f"{type(exc).__name__}: {exc}"
    stored = tuning.load(key)
    case.update(
        launched=sorted({w for w, _ in seen}),
        real_data=all(z for _, z in seen),
        stored=None if stored is None else stored["block"],
        invalid=moved(before, "invalid_entries"),
        corrupt=moved(before, "corrupt_entries"),
        measured=moved(before, "tunes_measured"),
        warned=any(key in w for w in warned),
    )
    fake.set_kernel_max_threads(1024)
    return case


res["bad"] = {
    "2048": bad_entry_case(2048, 1000),
    "100": bad_entry_case(100, 3000),
    "1": bad_entry_case(1, 12_000),
    "'512'": bad_entry_case("512", 50_000),
    "1024 over a kernel limit of 512": bad_entry_case(1024, 200_000, kernel_max=512),
}
res["bad_tune"] = bad_entry_case(2048, 800_000, how="tune")
res["bad_no_inputs"] = bad_entry_case(2048, 3_000_000, how="planned_width")
g.close()
res["hook_errors"] = fake.hook_errors
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def real_data(fake_libcuda, tmp_path_factory):
    proc = fakecuda.run_python(
        ["-W", "error", "-c", REAL_DATA_CHILD, "23"],
        fake_libcuda,
        timeout=300,
        VYRE_CUDA_CACHE_DIR=tmp_path_factory.mktemp("tune-real-data"),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res.pop("errors") == [] and res.pop("hook_errors") == []
    return res


def test_autotune_without_an_entry_measures_on_the_dispatch_inputs(real_data):
    # the tile kernel is right at widths up to 256 only: on zeros every width agreed, and the
    # fastest (1024) was cached and gave wrong sums
    tiles = real_data["tiles"]
    assert tiles["correct"] and tiles["again_correct"]
    assert tiles["measured"] == 1 and tiles["real_data"]
    assert tiles["block"] == 128 and tiles["timed"] == [64, 128, 256]  # the fastest whose outputs matched
    assert sorted(tiles["rejected"], key=int) == ["512", "1024"]
    assert all("differ" in why for why in tiles["rejected"].values())
    assert "from the tuning cache" in tiles["plan"]
    assert tiles["tune"] == [True, 128]


def test_autotune_keeps_the_declared_width_of_a_kernel_that_assumes_it(real_data):
    blocks = real_data["blocks"]
    assert blocks["correct"] and blocks["again_correct"] and blocks["measured"] == 1 and blocks["real_data"]
    assert blocks["block"] == 256 and blocks["timed"] == [256]
    assert sorted(blocks["rejected"], key=int) == ["64", "128", "512", "1024"]
    assert blocks["tune"] == [True, 256]


def test_a_plan_without_inputs_keeps_the_declared_width(real_data):
    case = real_data["no_inputs"]
    assert case["block"] is None and case["measured"] == 0 and case["entry"] is None
    assert "no inputs to measure on" in case["reason"]


@pytest.mark.parametrize("where", ["rw_host", "rw_device"])
def test_autotune_on_read_write_inputs_leaves_them_unchanged(real_data, where):
    assert real_data[where] == {"correct": True, "unchanged": True, "measured": 1, "real_data": True}


@pytest.mark.parametrize("bad", ["2048", "100", "1", "'512'", "1024 over a kernel limit of 512"])
def test_an_entry_no_tune_could_write_is_ignored_and_measured_again(real_data, bad):
    case = real_data["bad"][bad]
    assert case["error"] is None and case["correct"]
    allowed = [64, 128, 256, 512] if "kernel" in bad else list(tuning.CANDIDATES)
    assert case["launched"] and set(case["launched"]) <= set(allowed) and case["real_data"]
    assert case["stored"] == allowed[-1]  # measured again: the fastest valid width replaced the entry
    assert case["measured"] == 1 and case["warned"]
    # a block that is not an int is a corrupt entry; a width this device or kernel rejects, an invalid one
    assert (case["corrupt"], case["invalid"]) == ((1, 0) if bad == "'512'" else (0, 1))


def test_tune_ignores_an_invalid_cached_entry(real_data):
    case = real_data["bad_tune"]
    assert case["error"] is None and case["tune"] == [False, 1024] and case["stored"] == 1024
    assert case["invalid"] == 1 and case["warned"] and case["measured"] == 1


def test_an_invalid_entry_without_inputs_falls_back_to_the_declared_width(real_data):
    case = real_data["bad_no_inputs"]
    block, reason = case["planned"]
    assert case["error"] is None and block is None and case["measured"] == 0 and case["launched"] == []
    assert case["invalid"] == 1 and case["warned"] and "ignored" in reason and "no inputs" in reason
