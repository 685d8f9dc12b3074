"""The differential fuzzer's CPU profile; the long profile runs on a GPU (tests/gpu/test_fuzz_gpu.py).

1. The generator (tests/fuzz_programs.py) is a pure function of its seed and covers what the
   fuzzer promises: every dtype and access kind, sizes 0/1/odd/large, byte ranges, grid sync with
   1 to 4 phases, workgroup buffers past the 48 KiB opt-in, the params echo.
2. Generated programs plan on the real planner (``CudaBackend._plan`` over the faked H200 driver of
   tests/planning_fakes.py) for several dispatches each; their kernels compile with NVRTC (a cubin
   for sm_90 while planning, and PTX); the params blocks are word for word what the reference model
   says the kernel reads, and the shared-memory offsets are the ones the kernel source assumes.
3. The generated CUDA source itself, compiled as C++ for the CPU against host stand-ins of the
   device headers (tests/host_kernel.py) and run as one thread, gives the reference's results:
   the kernel text and the numpy model agree before any GPU time is spent.
4. Generated programs run end to end on the fake driver (tests/fakecuda) in a child process, each
   launch emulated by the reference model reading its counts and phases from the params block:
   every output element, the caller's inputs and the telemetry are checked (tests/fuzz_runner.py).

Hypothesis draws the program seeds with ``derandomize=True`` (the same programs every run);
``VYRE_CUDA_FUZZ_SEED=<int>`` explores others, and every failure names the program seed.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import struct

import fakecuda
import fuzz_programs as fp
import numpy as np
import pytest
from fuzz_runner import supports_launch_option
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from planning_fakes import H200, plan, planning_backends

from vyre_cuda import DispatchConfig, ValidationError
from vyre_cuda.compile import compile_kernel
from vyre_cuda.planning.layout import COPY_ALIGN

FUZZ_SEED = os.environ.get("VYRE_CUDA_FUZZ_SEED", "").strip()
CPU_PROGRAMS = int(os.environ.get("VYRE_CUDA_FUZZ_CPU_PROGRAMS", "20"))
HOST_PROGRAMS = int(os.environ.get("VYRE_CUDA_FUZZ_HOST_PROGRAMS", "40"))


def fuzz_settings(examples):
    """Derandomized by default; seeded from VYRE_CUDA_FUZZ_SEED when set."""
    config = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=not FUZZ_SEED,
        suppress_health_check=[HealthCheck.too_slow],
    )

    def wrap(fn):
        fn = config(fn)
        return hypothesis_seed(int(FUZZ_SEED, 0))(fn) if FUZZ_SEED else fn

    return wrap


# ------------------------------------------------------------------ 1. the generator
def test_generator_is_a_pure_function_of_the_seed():
    for seed in (0, 1, 12345, 2**32 - 1):
        assert fp.generate(seed) == fp.generate(seed)
        assert fp.cuda_source(fp.generate(seed)) == fp.cuda_source(fp.generate(seed))
    assert len({fp.cuda_source(fp.generate(s)) for s in range(50)}) == 50


def test_generator_covers_the_space():
    seen = collections.Counter()
    for seed in range(400):
        desc = fp.generate(seed)
        seen[f"buffers {len([b for b in desc.buffers if b.kind != 'echo'])}"] += 1
        seen["grid sync" if desc.grid_sync else "no grid sync"] += 1
        if desc.grid_sync:
            seen[f"phases {desc.phases}"] += 1
        seen[f"block {desc.block}"] += 1
        seen["min runtime"] += desc.min_runtime > 0
        shared = sum(b.count * fp.itemsize(b.dtype) for b in desc.tables)
        seen["shared over 48 KiB"] += shared > 48 * 1024
        for b in desc.buffers:
            seen[b.kind] += 1
            if b.kind not in ("echo", "workgroup"):
                seen[b.dtype] += 1
                seen[
                    "runtime-sized"
                    if b.count == 0
                    else "count 1"
                    if b.count == 1
                    else "odd count"
                    if b.count % 2
                    else "even count"
                ] += 1
                seen["large count"] += b.count > 4096
            if b.byte_range is not None:
                seen["byte range on a runtime-sized buffer" if b.count == 0 else "byte range"] += 1
                assert b.byte_range[0] % fp.itemsize(b.dtype) == 0 and b.byte_range[1] % fp.itemsize(b.dtype) == 0
    for key in (
        "read",
        "uniform",
        "read_write",
        "write_only",
        "output",
        "workgroup",
        "echo",
        *fp.DTYPE_NAMES,
        "grid sync",
        "no grid sync",
        "phases 1",
        "phases 2",
        "phases 3",
        "phases 4",
        "runtime-sized",
        "count 1",
        "odd count",
        "large count",
        "byte range",
        "byte range on a runtime-sized buffer",
        "min runtime",
        "shared over 48 KiB",
        "block 1",
        "block 1024",
        *(f"buffers {n}" for n in range(1, 7)),
    ):
        assert seen[key] >= 3, (key, seen)


def test_dispatch_plans_cover_sizes_configs_and_entry_points():
    seen = collections.Counter()
    rng = np.random.default_rng(7)
    for seed in range(60):
        desc = fp.generate(seed)
        for _ in range(20):
            p = fp.plan_dispatch(desc, rng)
            seen[p.entry] += 1
            seen["runtime 0"] += p.runtime == 0
            seen["runtime 1"] += p.runtime == 1
            seen["runtime odd"] += p.runtime % 2 == 1
            seen["runtime large"] += p.runtime > 20_000
            seen["grid"] += p.grid is not None
            seen["block"] += p.block is not None
            seen["iterations"] += p.iterations is not None
            seen["cooperative"] += p.cooperative
            assert p.runtime >= desc.min_runtime
    for key in (
        *fp.ENTRIES,
        "runtime 0",
        "runtime 1",
        "runtime odd",
        "runtime large",
        "grid",
        "block",
        "iterations",
        "cooperative",
    ):
        assert seen[key] >= 5, (key, seen)


def test_reference_model_is_the_same_whole_or_launch_by_launch():
    # the whole-dispatch reference equals applying the launches one by one as the split route
    # runs them (each phase its own launch), which is what the fake-driver emulation does
    rng = np.random.default_rng(11)
    checked = 0
    for seed in range(200):
        desc = fp.generate(seed)
        if not desc.grid_sync:
            continue
        runtime = max(desc.min_runtime, 37)
        inputs = fp.make_inputs(desc, rng, runtime)
        cfg = DispatchConfig(fixpoint_iterations=3)
        whole = fp.reference(desc, inputs, runtime, cfg, "split")
        counts = fp.element_counts(desc, runtime)
        given = dict(zip((b.binding for b in desc.inputs), inputs, strict=True))  # in declaration order
        arrays = {}
        for b in desc.args:
            dtype = fp.numpy_dtype(b.dtype)
            if b.is_input:
                arrays[b.binding] = np.array(given[b.binding]).view(dtype)
            else:
                arrays[b.binding] = np.zeros(counts[b.binding], dtype)
        for _ in range(3):
            for p in range(desc.phases):
                words = fp.expected_words(desc, runtime, cfg, (p, p + 1))
                fp.apply_launch(desc, arrays, counts, np.array(words, np.uint32), (p, p + 1))
        stepwise = []
        for b in desc.outputs:
            arr = arrays[b.binding]
            if b.byte_range:
                arr = arr[b.byte_range[0] // arr.dtype.itemsize : b.byte_range[1] // arr.dtype.itemsize]
            stepwise.append(arr)
        assert fp.compare(desc, stepwise, whole) == [], desc.summary()
        checked += 1
    assert checked >= 20


def test_compare_catches_a_single_wrong_element():
    desc = fp.generate(3)
    rng = np.random.default_rng(3)
    runtime = max(desc.min_runtime, 50)
    want = fp.reference(desc, fp.make_inputs(desc, rng, runtime), runtime)
    for k, w in enumerate(want):
        if w.size == 0:
            continue
        got = [x.copy() for x in want]
        got[k].view(fp.UNSIGNED_NP[w.dtype.itemsize])[-1] ^= 1 << (8 * w.dtype.itemsize - 2)
        assert fp.compare(desc, got, want), (k, desc.summary())


# ------------------------------------------------------------------ 2. plan and compile
@pytest.fixture(scope="module")
def h200_planner():
    with planning_backends([H200]) as made:
        yield made


def _decoded_blocks(layout):
    blob, n = layout.params_blob, len(layout.params_offsets)
    size = len(blob) // n
    assert size * n == len(blob) and size % COPY_ALIGN == 0
    return [list(struct.unpack(f"<{size // 4}I", blob[k * size : (k + 1) * size])) for k in range(n)]


def test_generated_programs_plan_compile_and_match_the_model(h200_planner):
    seen = collections.Counter()

    @fuzz_settings(CPU_PROGRAMS)
    @given(seed=st.integers(0, 2**32 - 1))
    def run(seed):
        desc = fp.generate(seed, supports_launch=supports_launch_option())
        program = fp.build_program(desc)
        tag = f"program seed {seed}: {desc.summary()}"
        rng = np.random.default_rng(seed)
        # the kernel compiles to PTX too (generic target; the planner below builds the sm_90 cubin)
        ptx = compile_kernel(program.kernel, defines={"VYRE_PHASE_WORD": str(desc.max_binding + 2)})
        assert ptx.kind == "ptx" and ".entry vyre_main" in ptx.ptx, tag
        for _ in range(4):
            dplan = fp.plan_dispatch(desc, rng)
            cfg = dplan.config()
            lengths = [(b.count or dplan.runtime) * fp.itemsize(b.dtype) for b in desc.inputs]
            occupancy = int(rng.integers(1, 9))
            if fp.launch_count(desc, dplan.runtime, cfg) == 0:
                with pytest.raises(ValidationError):
                    plan(h200_planner, H200, program, lengths, cfg, occupancy)
                seen["refused"] += 1
                continue
            prepared, _ = plan(h200_planner, H200, program, lengths, cfg, occupancy)
            info = prepared.plan
            assert info.kernel.kind == "cubin" and info.kernel.arch == (9, 0), tag
            route = info.route.kind
            if desc.grid_sync:
                assert route in ("cooperative", "split"), tag
                ranges = [(k, k + 1) for k in range(desc.phases)] if route == "split" else [(0, desc.phases)]
            else:
                assert route == ("cooperative" if dplan.cooperative else "regular"), tag
                ranges = [None]
            # word for word what the kernel reads (and the echo buffer returns)
            words = [fp.expected_words(desc, dplan.runtime, cfg, r) for r in ranges]
            blocks = _decoded_blocks(info.layout)
            assert [b[: len(w)] for b, w in zip(blocks, words, strict=False)] == words, tag
            assert len(blocks) == len(words), tag
            # the shared-memory offsets the kernel source hard-codes are the planner's
            offsets = desc.shared_offsets()
            assert [(o, n) for _, o, n in info.launch.shared_offsets] == [
                (offsets[b.binding], b.count * fp.itemsize(b.dtype)) for b in desc.tables
            ], tag
            seen[f"route {route}"] += 1
        seen["programs"] += 1

    run()
    assert seen["programs"] == CPU_PROGRAMS and seen["route regular"] and seen["route cooperative"], seen


# ------------------------------------------------------------------ 3. the kernel text on the host
def test_generated_kernels_compiled_for_the_host_match_the_model(tmp_path_factory):
    import host_kernel

    if host_kernel.compiler() is None:
        pytest.skip("no C++ compiler on PATH to build generated kernels for the host")
    folder = tmp_path_factory.getbasetemp() / "host-kernels"
    seen = collections.Counter()

    @fuzz_settings(HOST_PROGRAMS)
    @given(seed=st.integers(0, 2**32 - 1))
    def run(seed):
        desc = fp.generate(seed)
        lib = host_kernel.build(desc, folder)
        rng = np.random.default_rng(seed)
        for j in range(4):
            dplan = fp.plan_dispatch(desc, rng, max_runtime=20_000)
            cfg = dplan.config()
            if fp.launch_count(desc, dplan.runtime, cfg) == 0:
                continue
            inputs = fp.make_inputs(desc, rng, dplan.runtime)
            route = "split" if desc.grid_sync and j % 2 else "cooperative"
            got = host_kernel.run(desc, lib, inputs, dplan.runtime, cfg, route)
            problems = fp.compare(desc, got, fp.reference(desc, inputs, dplan.runtime, cfg, route))
            assert not problems, f"program seed {seed} {dplan} [{desc.summary()}]: {problems}"
            seen["dispatches"] += 1
            seen["float targets"] += any(b.dtype in fp.FLOATS for b in desc.targets)
            seen["grid sync"] += desc.grid_sync
            seen["tables"] += bool(desc.tables)

    run()
    assert seen["dispatches"] >= 2 * HOST_PROGRAMS, seen
    assert seen["float targets"] and seen["grid sync"] and seen["tables"], seen


# ------------------------------------------------------------------ 4. end to end on the fake driver
E2E_PROGRAMS, E2E_PER_PROGRAM, E2E_MAX_RUNTIME = 40, 25, 20_000


def test_generated_programs_run_end_to_end_on_the_fake_driver(fake_libcuda, tmp_path_factory):
    base = int(FUZZ_SEED, 0) if FUZZ_SEED else int.from_bytes(os.urandom(4), "little")
    child = pathlib.Path(fakecuda.__file__).with_name("fuzz_child.py")
    proc = fakecuda.run_python(
        [str(child), str(base), str(E2E_PROGRAMS), str(E2E_PER_PROGRAM), str(E2E_MAX_RUNTIME)],
        fake_libcuda,
        timeout=600,
        VYRE_CUDA_CACHE_DIR=tmp_path_factory.getbasetemp() / "kernel-cache",
        PYTHONWARNINGS="error",
    )
    replay = f"replay with VYRE_CUDA_FUZZ_SEED={base}"
    assert proc.returncode == 0, f"fuzz child failed ({replay}):\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    print(res["summary"])
    assert res["mismatches"] == 0, f"{res['summary']} ({replay})\n" + "\n".join(res["details"])
    assert res["programs"] == E2E_PROGRAMS and res["dispatches"] == E2E_PROGRAMS * E2E_PER_PROGRAM, res["summary"]
    assert res["hook_errors"] == [], res["hook_errors"]
    assert set(res["entries"]) == set(fp.ENTRIES), res["entries"]
    assert res["routes"].get("regular") and res["routes"].get("cooperative"), res["routes"]
    assert res["telemetry"]["failed_dispatches"] == 0 and res["telemetry"]["leaked_allocations"] == 0
    closed = res["closed"]
    for key in (
        "device_allocs",
        "host_allocs",
        "streams",
        "events",
        "modules",
        "context_refs",
        "violations",
        "no_context",
    ):
        assert closed[key] == 0, (key, closed)
