"""Launch-width autotune on a GPU: tune a built-in program in a fresh cache folder, check every
candidate width against numpy, the cached winner in plan_info and in autotune dispatches, a
second tune that measures nothing, a program whose output depends on the width keeping its
own, and ``autotune=True`` with an empty cache measuring on the dispatch's own data (kernels
that assume their width agree at every width on zeros)."""

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
from vyre_cuda import tuning


@pytest.fixture
def tune_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VYRE_CUDA_DISK_CACHE", raising=False)
    tuning.forget_memory()
    yield tmp_path
    tuning.forget_memory()


def test_tune_vecadd_caches_the_winner_and_planning_uses_it(tune_cache, fresh_backend, rng):
    backend = fresh_backend
    prog = bp.vecadd_f32()
    n = (1 << 22) + 3
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    for width in tuning.CANDIDATES:  # every candidate is correct
        (out,) = backend.dispatch(prog, [a, b], {"workgroup_override": width})
        np.testing.assert_array_equal(out, a + b)
    before = tuning.stats()
    result = backend.tune(prog, [a, b])
    assert not result.cached and result.baseline == 256
    assert sorted(result.timings_ns) == list(tuning.CANDIDATES) and result.rejected == {}
    assert result.block in tuning.CANDIDATES and all(ns > 0 for ns in result.timings_ns.values())
    assert result.timings_ns[result.block] == min(result.timings_ns.values())
    assert (tune_cache / "tuning" / f"{result.key}.json").is_file()
    after = tuning.stats()
    assert after["tunes_measured"] == before["tunes_measured"] + 1
    again = backend.tune(prog, [a, b])
    assert again.cached and again.block == result.block
    assert tuning.stats()["tunes_measured"] == after["tunes_measured"]  # nothing measured
    assert tuning.stats()["timed_dispatches"] == after["timed_dispatches"]
    info = backend.plan_info(prog, [a, b], {"autotune": True})
    assert info.tuned_block == (result.block, 1, 1) and info.launch.block == (result.block, 1, 1)
    assert "tuning cache" in info.tuning
    assert backend.plan_info(prog, [a, b]).tuned_block is None
    (out,) = backend.dispatch(prog, [a, b], {"autotune": True})
    np.testing.assert_array_equal(out, a + b)


def test_autotune_measures_a_new_size_class_at_plan_time(tune_cache, fresh_backend, rng):
    prog = bp.vecadd("i64")
    n = 300_001
    a = rng.integers(-(2**40), 2**40, n, dtype=np.int64)
    b = rng.integers(-(2**40), 2**40, n, dtype=np.int64)
    before = tuning.stats()["tunes_measured"]
    (out,) = fresh_backend.dispatch(prog, [a, b], {"autotune": True})
    np.testing.assert_array_equal(out, a + b)
    assert tuning.stats()["tunes_measured"] == before + 1
    info = fresh_backend.plan_info(prog, [a, b], {"autotune": True})
    assert info.tuned_block[0] in tuning.CANDIDATES


def test_a_width_dependent_program_keeps_its_declared_width(tune_cache, fresh_backend, rng):
    blocks = 300
    prog = bp.block_sum_u32(blocks)
    x = rng.integers(0, 1000, blocks * 256, dtype=np.uint32)
    result = fresh_backend.tune(prog, [x])
    assert result.block == 256
    assert set(result.rejected) == {64, 128, 512, 1024}
    # outputs differ at every other width (1024 could instead exceed the kernel's own limit)
    assert all("differ" in why for width, why in result.rejected.items() if width != 1024)
    (out,) = fresh_backend.dispatch(prog, [x], {"autotune": True})
    np.testing.assert_array_equal(out, x.reshape(blocks, 256).sum(axis=1, dtype=np.uint32))


# Per-block sums through a fixed 256-slot shared array and a 256-slot tree: they assume the
# declared width. Memory-safe at any width (threads past 256 drop their element, slots past
# blockDim.x stay zero), but at another width each block sums blockDim.x elements, not 256.
_FIXED_BLOCK_SUM = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const vyre_u32* x, vyre_u32* sums, const vyre_u32* params) {
  __shared__ vyre_u32 s[256];
  const vyre_u64 i = (vyre_u64)blockIdx.x * blockDim.x + threadIdx.x;
  for (unsigned k = threadIdx.x; k < 256u; k += blockDim.x) s[k] = 0u;
  __syncthreads();
  if (threadIdx.x < 256u && vyre_in_bounds(params, 0, i)) s[threadIdx.x] = x[i];
  __syncthreads();
  for (unsigned w = 128u; w > 0u; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0u && vyre_in_bounds(params, 1, blockIdx.x)) sums[blockIdx.x] = s[0];
}
"""

# One 256-element tile per block (widths up to 256 loop over it); the grid follows the width, so
# a block wider than 256 leaves the last tiles unsummed: right at 64, 128, 256 only.
_TILE_SUM = r"""
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
"""


@pytest.mark.parametrize(
    ("source", "correct_widths"), [(_FIXED_BLOCK_SUM, {256}), (_TILE_SUM, {64, 128, 256})], ids=["fixed", "tiles"]
)
def test_autotune_with_an_empty_cache_measures_on_the_dispatch_data(
    tune_cache, fresh_backend, rng, source, correct_widths
):
    blocks = 300
    prog = vc.Program(
        vc.Kernel.cuda(source),
        [vc.BufferDecl.read("x", 0, "u32"), vc.BufferDecl.output("sums", 1, "u32", blocks)],
        launch="x",
        name="width_assuming_sums",
    )
    x = rng.integers(1, 1000, blocks * 256, dtype=np.uint32)
    want = x.reshape(blocks, 256).sum(axis=1, dtype=np.uint32)
    before = tuning.stats()["tunes_measured"]
    (out,) = fresh_backend.dispatch(prog, [x], {"autotune": True})
    np.testing.assert_array_equal(out, want)
    assert tuning.stats()["tunes_measured"] == before + 1
    info = fresh_backend.plan_info(prog, [x], {"autotune": True})
    assert "tuning cache" in info.tuning and info.tuned_block[0] in correct_widths
    entry = tuning.load(tuning.tune_key(prog, fresh_backend.caps, tuning.size_class(blocks * 256)))
    assert entry["block"] == info.tuned_block[0] and str(entry["block"]) in entry["timings_ns"]
    # every width that gives other sums was rejected (1024 may instead exceed the kernel's limit)
    assert {int(w) for w in entry["timings_ns"]} <= correct_widths
    assert {int(w) for w in entry["rejected"]} >= set(tuning.CANDIDATES) - correct_widths - {1024}
    (again,) = fresh_backend.dispatch(prog, [x], {"autotune": True})
    np.testing.assert_array_equal(again, want)


def test_grid_sync_programs_are_not_tuned(tune_cache, fresh_backend, rng):
    prog = bp.inclusive_scan_u32()
    s = rng.integers(0, 100, 10_001, dtype=np.uint32)
    with pytest.raises(vc.ValidationError, match="grid-sync"):
        fresh_backend.tune(prog, [s])
    info = fresh_backend.plan_info(prog, [s], {"autotune": True})
    assert info.tuned_block is None and "grid-sync" in info.tuning
    outs = fresh_backend.dispatch(prog, [s], {"autotune": True})
    np.testing.assert_array_equal(outs[0], np.cumsum(s, dtype=np.uint32))


def test_cli_tune_runs_and_then_reads_the_cache(tune_cache, capsys):
    from vyre_cuda.cli import main

    assert main(["tune", "vecadd_f32", "--elements", "100000", "--repeats", "2"]) == 0
    first = capsys.readouterr().out
    assert "winner: block" in first and "measured" in first
    assert main(["tune", "vecadd_f32", "--elements", "100000"]) == 0
    assert "from the tuning cache" in capsys.readouterr().out
