"""No silent wrong results, through the real CudaBackend planner on a faked driver (no device).

Every case here used to be accepted and give wrong data (or an untyped error) on a GPU; each
must now be refused (typed, with a Fix line) or planned as documented before anything reaches a
device. The driver entry points planning touches are fakes answering like an H200; a dispatch
that got past planning would fail on the missing device, so a refusal is what these tests see.

Tests marked ``xfail(strict=True)`` need a change in the dispatch core or backend (named in the
reason); once it lands they pass, and the strict marker makes that visible so it gets removed.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from planning_fakes import stub_backend

from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp
from vyre_cuda.errors import InvalidProgram, ValidationError
from vyre_cuda.planning.caps import DeviceCaps
from vyre_cuda.program import LaunchSizeWarning

H200 = DeviceCaps(
    name="faked H200",
    cc=(9, 0),
    sm_count=132,
    max_grid_dim=(2**31 - 1, 65535, 65535),
    total_memory=150_754_820_096,
    driver_version=13000,
)

HIST_SRC = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const unsigned char* x, vyre_u32* h, const vyre_u32* params) {
  for (vyre_u64 i = vyre_global_id(); i < vyre_count(params); i += vyre_global_threads())
    if (vyre_in_bounds(params, 0, i)) atomicAdd(&h[x[i]], 1u);
}
"""


def histogram(**kw) -> Program:
    return Program(
        Kernel.cuda(HIST_SRC),
        [BufferDecl.read("x", 0, "u8"), BufferDecl.output("h", 1, "u32", 256)],
        name="histogram",
        **kw,
    )


def assert_fix(err: BaseException) -> None:
    last = str(err).splitlines()[-1]
    assert last.startswith("Fix: ") and last[5:].strip(), str(err)


@pytest.fixture
def backend(monkeypatch):
    """A CudaBackend on fakes of the driver calls planning makes (module load, occupancy)."""
    b = stub_backend(
        monkeypatch, H200, load_module=lambda image, entry, want_barrier: (0, 0, 0x1000 if want_barrier else 0, 4)
    )
    yield b
    b.close()


def pool_counts(backend) -> dict:
    snap = backend.telemetry.snapshot()
    return {k: v for k, v in snap.items() if "pool" in k or "stream" in k or "event" in k or k == "dispatches"}


def refused(backend, exc_type, call):
    """Run ``call``; it must raise ``exc_type`` with a Fix line and move no pool or counter."""
    before = pool_counts(backend)
    with pytest.raises(exc_type) as info:
        call()
    assert_fix(info.value)
    assert pool_counts(backend) == before
    return info.value


# ------------------------------------------------------------------------------ input lengths
def test_ragged_vecadd_is_refused_before_any_device_work(backend, rng):
    # vecadd with a of 1000 and b of 10 elements used to launch over 1000 and read b[10..999]
    a = rng.standard_normal(1000).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    prog = bp.vecadd_f32()
    for entry in (
        lambda: backend.dispatch(prog, [a, b]),
        lambda: backend.dispatch_async(prog, [a, b]),
        lambda: backend.dispatch_into(prog, [a, b], [np.empty(1000, np.float32)]),
        lambda: backend.plan_info(prog, [a, b]),
    ):
        err = refused(backend, ValidationError, entry)
        assert "'a' (1000 elements)" in err.message and "'b' (10 elements)" in err.message


def test_a_declared_launch_binding_plans_ragged_inputs(backend, rng):
    prog = Program(bp.vecadd_f32().kernel, bp.vecadd_f32().buffers, launch="a")
    a = rng.standard_normal(1000).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    info = backend.plan_info(prog, [a, b])
    assert info.launch.element_count == 1000 and info.launch.sized_by == "launch='a'"
    words = np.frombuffer(info.layout.params_blob, np.uint32)
    assert list(words[:4]) == [1000, 1000, 10, 1000]  # word 0, then each binding's own count


# ------------------------------------------------------------------------------ launch sizing
def test_histogram_plans_over_its_whole_input(backend, rng):
    x = rng.integers(0, 256, 100_000, dtype=np.uint8)
    info = backend.plan_info(histogram(launch="x"), [x])
    assert info.launch.element_count == 100_000 and info.launch.grid == (391, 1, 1)
    info = backend.plan_info(histogram(), [x], DispatchConfig(elements=50_000))
    assert info.launch.element_count == 50_000 and info.launch.grid == (196, 1, 1)


def test_histogram_by_the_default_rule_warns_through_the_backend(backend, rng):
    x = rng.integers(0, 256, 100_000, dtype=np.uint8)
    prog = histogram()
    with pytest.warns(LaunchSizeWarning, match="launch='x'") as record:
        info = backend.plan_info(prog, [x])
    assert info.launch.element_count == 256  # the documented default: the largest output
    assert record[0].filename == __file__
    info = backend.plan_info(prog, [x[:5000]])  # warned once per program: no second warning
    assert info.launch.element_count == 256


def test_grid_override_keeps_the_declared_element_count(backend, rng):
    x = rng.integers(0, 256, 100_000, dtype=np.uint8)
    info = backend.plan_info(histogram(launch="x"), [x], DispatchConfig(grid_override=64))
    assert info.launch.grid == (64, 1, 1) and info.launch.element_count == 100_000
    assert np.frombuffer(info.layout.params_blob, np.uint32)[0] == 100_000
    info = backend.plan_info(histogram(launch="x"), [x], {"grid_override": 64, "elements": 10})
    assert np.frombuffer(info.layout.params_blob, np.uint32)[0] == 10


# ------------------------------------------------------------------------------ flags and bounds
def test_cooperative_must_be_a_real_bool(backend, rng):
    # cooperative="no" made a cooperative launch of a plain vecadd on the H200
    a = rng.standard_normal(100).astype(np.float32)
    for cfg in ({"cooperative": "no"}, {"cooperative": 0}):
        err = refused(backend, ValidationError, lambda cfg=cfg: backend.dispatch(bp.vecadd_f32(), [a, a], cfg))
        assert "cooperative" in err.message
    assert backend.plan_info(bp.vecadd_f32(), [a, a], {"cooperative": False}).route.kind == "regular"


@pytest.mark.parametrize("cfg", [{"timeout": 10**400}, {"timeout": float("nan")}, {"fixpoint_iterations": 2**31 - 1}])
def test_unbounded_waits_and_loops_are_refused_before_enqueue(backend, rng, cfg):
    a = rng.standard_normal(100).astype(np.float32)
    refused(backend, ValidationError, lambda: backend.dispatch(bp.vecadd_f32(), [a, a], cfg))


def test_infinite_timeout_means_no_bound(backend, rng):
    a = rng.standard_normal(100).astype(np.float32)
    assert backend.plan_info(bp.vecadd_f32(), [a, a], {"timeout": float("inf")}).config.timeout is None


# ------------------------------------------------------------------------------ byte ranges
def test_byte_ranges_cutting_elements_never_reach_a_dispatch():
    # (2, 10) on f32 came back from the H200 as [0.0, 2.3e-41]: two floats from three elements
    with pytest.raises(InvalidProgram) as info:
        BufferDecl.output("out", 2, "f32", output_byte_range=(2, 10))
    assert_fix(info.value)
    with pytest.raises(InvalidProgram):
        BufferDecl.read("a", 0, "f32", output_byte_range=(0, 8))  # an input is never read back


def test_whole_element_range_plans_the_elements(backend, rng):
    decls = [
        BufferDecl.read("a", 0, "f32"),
        BufferDecl.read("b", 1, "f32"),
        BufferDecl.output("out", 2, "f32", output_byte_range=(8, 40)),
    ]
    a = rng.standard_normal(100).astype(np.float32)
    info = backend.plan_info(Program(bp.vecadd_f32().kernel, decls), [a, a])
    assert info.layout.outputs[0][1] == 32 and info.layout.d2h_bytes == 32


# ------------------------------------------------------------------------------ needs the lead
def test_barrier_ceiling_of_a_huge_split_grid(backend, rng):
    # (phases - 1) * grid_blocks was converted to u64 unchecked: OverflowError for this grid
    prog = Program(
        bp.inclusive_scan_u32().kernel,
        bp.inclusive_scan_u32().buffers,
        workgroup_size=(1, 1, 1),
        grid_sync=True,
        phases=4,
    )
    x = rng.integers(0, 100, 1000, dtype=np.uint32)
    cfg = DispatchConfig(grid_override=(2**31 - 1, 65535, 65535))
    lengths = (x.nbytes,)
    prepared = backend._plan(prog, lengths, cfg)
    assert prepared.route_kind == "split"  # far over residency: host-split, no device barrier
    info = backend.plan_info(prog, [x], cfg)
    assert info.route.kind == "split" and info.route.grid_blocks == (2**31 - 1) * 65535 * 65535


@pytest.mark.parametrize("dtype", [np.int16, np.float16, ">u2"], ids=["int16", "float16", "big-endian-uint16"])
def test_bf16_inputs_are_checked(backend, rng, dtype):
    # '>f2' and int16 arrays were accepted as bf16 and computed on as if they were its bits
    x = rng.integers(0, 2**15, 64).astype(dtype)
    err = refused(backend, ValidationError, lambda: backend.dispatch(bp.vecadd("bf16"), [x, x]))
    assert "'a'" in err.message and ("bf16" in err.message or "big-endian" in err.message)


def test_programs_with_launch_rules_are_keys_and_pickle(backend, rng):
    prog = histogram(launch="x")
    x = rng.integers(0, 256, 1000, dtype=np.uint8)
    assert backend.plan_info(prog, [x]) is not None
    again = pickle.loads(pickle.dumps(prog))
    assert again.launch == "x" and again.kernel == prog.kernel
    assert backend.plan_info(again, [x]).launch.element_count == 1000
