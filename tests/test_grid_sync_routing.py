"""Grid-sync routing on the CPU: refusal on devices without cooperative launch (capability flags
faked with hand-built DeviceCaps, never the driver), the resident-limit arithmetic, the R / R + 1
boundary, and the params blocks of the cooperative and split layouts.

The last group plans through the real CudaBackend with the same fake caps; where planning would
load a module or ask the occupancy calculator, a stand-in for those two driver calls answers.
"""

from __future__ import annotations

import struct
import threading
import types

import numpy as np
import pytest
from helpers.bfs import bfs_program
from hypothesis import given, settings
from hypothesis import strategies as st

from vyre_cuda import (
    CooperativeResidencyExceeded,
    DispatchConfig,
    InvalidProgram,
    UnsupportedFeature,
)
from vyre_cuda import builtin_programs as bp
from vyre_cuda.compile import compile_kernel
from vyre_cuda.planning.binding import plan_bindings
from vyre_cuda.planning.caps import DeviceCaps, check_capabilities, missing_capabilities
from vyre_cuda.planning.launch import params_words, plan_launch, resident_limit, route_grid_sync
from vyre_cuda.planning.layout import COPY_ALIGN, plan_layout

H200 = DeviceCaps(name="fake H200", cc=(9, 0), sm_count=132, max_threads_per_sm=2048, max_blocks_per_sm=32)
# devices that must refuse grid sync: too old, no flag, or both
NO_COOP = [
    DeviceCaps(name="fake Maxwell", cc=(5, 2), sm_count=24, cooperative_launch=False),
    DeviceCaps(name="fake Maxwell, flag set", cc=(5, 2), sm_count=24, cooperative_launch=True),
    DeviceCaps(name="fake Hopper, flag clear", cc=(9, 0), sm_count=132, cooperative_launch=False),
]
NO_COOP_IDS = ["cc5.2-no-flag", "cc5.2-flag", "cc9.0-no-flag"]


def scan():
    return bp.inclusive_scan_u32(256)


def plain():
    return bp.vecadd("u32")


def bfs(n=1000):
    return bfs_program(n)  # one thread per node; col_idx (runtime-sized) holds more elements


def _lengths(program, n=100_000):
    """Byte lengths of inputs for ``program``: n elements each, or the declared counts."""
    if program.name == "bfs_relax":
        nodes = program.buffers[2].count
        return ((nodes + 1) * 4, 5 * nodes * 4, nodes * 4)
    return tuple(n * d.dtype.itemsize for d in program.inputs)


def _plan(program, caps, config=None):
    config = config or DispatchConfig()
    bplan = plan_bindings(program, _lengths(program))
    return bplan, plan_launch(program, bplan, config, caps)


def _assert_names_caps(message, caps):
    # the contract: the refusal names the compute capability and the support flag
    assert "compute capability" in message
    assert f"{caps.cc[0]}.{caps.cc[1]}" in message
    assert f"cooperative_launch={caps.cooperative_launch}" in message


# ----------------------------------------------------------------------------- refusal
@pytest.mark.parametrize("caps", NO_COOP, ids=NO_COOP_IDS)
@pytest.mark.parametrize("make", [scan, bfs], ids=["scan", "bfs"])
def test_grid_sync_program_refused_by_capability_check(caps, make):
    program = make()
    assert not caps.supports("cooperative")
    assert missing_capabilities(program, caps)
    with pytest.raises(UnsupportedFeature) as exc_info:
        check_capabilities(program, caps)
    _assert_names_caps(exc_info.value.message, caps)
    assert str(exc_info.value).splitlines()[-1].startswith("Fix: ")


@pytest.mark.parametrize("caps", NO_COOP, ids=NO_COOP_IDS)
@pytest.mark.parametrize("make", [scan, bfs], ids=["scan", "bfs"])
def test_grid_sync_program_refused_by_router(caps, make):
    program = make()
    _, launch = _plan(program, caps)
    # whatever the occupancy and grid, no route may fall back to a split silently
    for occupancy in (0, 1, 64):
        for cfg in (DispatchConfig(), DispatchConfig(grid_override=(1,)), DispatchConfig(grid_override=(10**6,))):
            _, launch = _plan(program, caps, cfg)
            with pytest.raises(UnsupportedFeature) as exc_info:
                route_grid_sync(program, cfg, launch, caps, occupancy)
            _assert_names_caps(exc_info.value.message, caps)
            assert "grid_sync=True" in exc_info.value.message
    assert resident_limit(caps, launch.threads_per_block, 64) == 0


@pytest.mark.parametrize("caps", NO_COOP, ids=NO_COOP_IDS)
def test_cooperative_config_refused_on_device_without_cooperative_launch(caps):
    program = plain()
    check_capabilities(program, caps)  # a plain program needs nothing special
    cfg = DispatchConfig(cooperative=True, grid_override=(4,))
    _, launch = _plan(program, caps, cfg)
    with pytest.raises(UnsupportedFeature) as exc_info:
        route_grid_sync(program, cfg, launch, caps, 8)
    _assert_names_caps(exc_info.value.message, caps)
    assert "cooperative=True" in exc_info.value.message
    # without cooperative=True the same program routes as a regular launch
    route = route_grid_sync(program, DispatchConfig(grid_override=(4,)), launch, caps, 8)
    assert route.kind == "regular" and route.resident_limit == 0


@pytest.mark.parametrize("cc", [(6, 0), (7, 0), (8, 0), (9, 0), (12, 0)])
def test_supported_devices_do_not_refuse(cc):
    caps = DeviceCaps(cc=cc, cooperative_launch=True)
    for program in (scan(), bfs()):
        check_capabilities(program, caps)
        _, launch = _plan(program, caps)
        assert route_grid_sync(program, DispatchConfig(), launch, caps, 8).kind in ("cooperative", "split")


# ----------------------------------------------------------------------------- resident limit
@pytest.mark.parametrize(
    "threads, occupancy, expected",
    [
        (256, 8, 8 * 132),  # occupancy binds (and equals the thread bound)
        (256, 16, 8 * 132),  # the thread bound 2048 // 256 binds
        (32, 64, 32 * 132),  # the block bound (32 per SM) binds
        (1024, 2, 2 * 132),
        (1024, 1, 132),
        (128, 3, 3 * 132),  # low occupancy (registers or shared memory) binds
        (256, 0, 0),  # the kernel cannot run at that shape at all
        (2048 + 32, 8, 0),  # more threads than an SM holds
    ],
)
def test_resident_limit_examples(threads, occupancy, expected):
    assert resident_limit(H200, threads, occupancy) == expected


@settings(max_examples=300, deadline=None)
@given(
    sm_count=st.integers(1, 256),
    max_threads_per_sm=st.sampled_from([1024, 1536, 2048]),
    max_blocks_per_sm=st.sampled_from([16, 24, 32]),
    threads=st.integers(1, 1024),
    occupancy=st.integers(0, 64),
    cc=st.sampled_from([(5, 2), (6, 0), (7, 5), (9, 0)]),
    flag=st.booleans(),
)
def test_resident_limit_arithmetic(sm_count, max_threads_per_sm, max_blocks_per_sm, threads, occupancy, cc, flag):
    caps = DeviceCaps(
        cc=cc,
        sm_count=sm_count,
        max_threads_per_sm=max_threads_per_sm,
        max_blocks_per_sm=max_blocks_per_sm,
        cooperative_launch=flag,
    )
    got = resident_limit(caps, threads, occupancy)
    if flag and cc >= (6, 0):
        assert got == min(occupancy, max_threads_per_sm // threads, max_blocks_per_sm) * sm_count
    else:
        assert got == 0


# ----------------------------------------------------------------------------- boundary
@pytest.mark.parametrize("make", [scan, bfs], ids=["scan", "bfs"])
@pytest.mark.parametrize("occupancy", [1, 3, 8])
def test_boundary_routes_cooperative_at_r_split_at_r_plus_1(make, occupancy):
    program = make()
    R = resident_limit(H200, 256, occupancy)
    assert occupancy * 132 == R
    for grid, kind in (
        ((R,), "cooperative"),
        ((R + 1,), "split"),
        ((1,), "cooperative"),
        ((4 * R,), "split"),
        ((R // 2, 2), "cooperative"),
        ((R // 2 + 1, 2), "split"),
        ((1, 1, R), "cooperative"),
    ):
        cfg = DispatchConfig(grid_override=grid)
        _, launch = _plan(program, H200, cfg)
        route = route_grid_sync(program, cfg, launch, H200, occupancy)
        assert (route.kind, route.grid_blocks, route.resident_limit) == (kind, launch.grid_blocks, R), grid
        assert str(R) in route.reason and str(launch.grid_blocks) in route.reason
    # forced cooperative: runs at R, refused at R + 1 with both numbers on the error
    cfg = DispatchConfig(grid_override=(R,), cooperative=True)
    _, launch = _plan(program, H200, cfg)
    assert route_grid_sync(program, cfg, launch, H200, occupancy).kind == "cooperative"
    cfg = DispatchConfig(grid_override=(R + 1,), cooperative=True)
    _, launch = _plan(program, H200, cfg)
    with pytest.raises(CooperativeResidencyExceeded) as exc_info:
        route_grid_sync(program, cfg, launch, H200, occupancy)
    assert (exc_info.value.grid_blocks, exc_info.value.resident_limit) == (R + 1, R)


@settings(max_examples=200, deadline=None)
@given(blocks=st.integers(1, 20_000), occupancy=st.integers(0, 16), forced=st.booleans())
def test_route_is_cooperative_exactly_when_the_grid_fits(blocks, occupancy, forced):
    program = scan()
    cfg = DispatchConfig(grid_override=(blocks,), cooperative=forced)
    _, launch = _plan(program, H200, cfg)
    R = resident_limit(H200, 256, occupancy)
    if blocks <= R:
        assert route_grid_sync(program, cfg, launch, H200, occupancy).kind == "cooperative"
    elif forced:
        with pytest.raises(CooperativeResidencyExceeded) as exc_info:
            route_grid_sync(program, cfg, launch, H200, occupancy)
        assert (exc_info.value.grid_blocks, exc_info.value.resident_limit) == (blocks, R)
    else:
        assert route_grid_sync(program, cfg, launch, H200, occupancy).kind == "split"


def test_plain_program_routes_regular_whatever_the_grid():
    program = plain()
    for blocks in (1, 10**6):
        cfg = DispatchConfig(grid_override=(blocks,))
        _, launch = _plan(program, H200, cfg)
        route = route_grid_sync(program, cfg, launch, H200, 0)
        assert (route.kind, route.resident_limit) == ("regular", 0)


# ----------------------------------------------------------------------------- params blocks
def _blocks(layout, bplan):
    """Decode the params blob into one list of u32 words per params block."""
    base = bplan.max_binding + 2
    step = layout.params_offsets[1] - layout.params_offsets[0] if len(layout.params_offsets) > 1 else None
    blob = layout.params_blob
    n_blocks = len(layout.params_offsets)
    size = len(blob) // n_blocks
    assert size * n_blocks == len(blob) and size % COPY_ALIGN == 0
    if step is not None:
        assert step == size
    words = []
    for k in range(n_blocks):
        raw = blob[k * size : (k + 1) * size]
        words.append(list(struct.unpack(f"<{size // 4}I", raw)))
    return base, words


@pytest.mark.parametrize("make, phases", [(scan, 3), (bfs, 2)], ids=["scan", "bfs"])
def test_split_layout_has_one_params_block_per_phase(make, phases):
    program = make()
    bplan, launch = _plan(program, H200, DispatchConfig(grid_override=(5000,)))
    plain_words = params_words(bplan, launch)
    phase_word = len(plain_words)  # the VYRE_PHASE_WORD the backend defines: max binding + 2
    assert phase_word == bplan.max_binding + 2

    split = plan_layout(bplan, launch, [(k, k + 1) for k in range(phases)])
    assert len(split.params_offsets) == phases
    base, words = _blocks(split, bplan)
    assert base == phase_word
    for k, block in enumerate(words):
        assert block[:phase_word] == plain_words, k
        assert block[phase_word : phase_word + 2] == [k, k + 1], k
        assert not any(block[phase_word + 2 :])  # padding
    assert all(off % COPY_ALIGN == 0 for off in split.params_offsets)
    assert split.params_offsets[-1] + len(split.params_blob) // phases <= split.upload_end

    coop = plan_layout(bplan, launch, [(0, phases)])
    assert len(coop.params_offsets) == 1
    _, (block,) = _blocks(coop, bplan)
    assert block[:phase_word] == plain_words
    assert block[phase_word : phase_word + 2] == [0, phases]

    regular = plan_layout(bplan, launch, [None])
    _, (block,) = _blocks(regular, bplan)
    assert block[:phase_word] == plain_words and not any(block[phase_word:])

    # everything but the params region is laid out the same on both routes
    for field in ("arg_offsets", "inputs", "outputs", "readbacks"):
        assert getattr(split, field) == getattr(coop, field), field
    assert split.h2d_bytes - coop.h2d_bytes == 4 * (phase_word + 2) * (phases - 1)


def test_scan_and_bfs_compile_with_the_phase_word_define():
    # NVRTC needs no GPU: the kernels the GPU tests run compile for sm_90 with the ABI define
    for program in (scan(), bfs()):
        bplan, _ = _plan(program, H200)
        compiled = compile_kernel(program.kernel, arch=(9, 0), defines={"VYRE_PHASE_WORD": str(bplan.max_binding + 2)})
        assert compiled.entry == "vyre_main"
        assert b"_vyre_grid_barrier" in compiled.image


# ----------------------------------------------------------------------------- through CudaBackend
class _NoDriver(types.ModuleType):
    """Stands in for vyre_cuda._driver where no driver call may happen at all."""

    def __getattr__(self, name):
        raise AssertionError(f"planning called the driver ({name}) before refusing")


def _fake_driver(occupancy, barrier=0xB000):
    calls = []

    def load_module(image, entry, want_barrier):
        calls.append("load_module")
        return (0x1000, 0x2000, barrier if want_barrier else 0, 4 if barrier else 0)

    def occupancy_blocks_per_sm(function, threads, shared):
        calls.append(("occupancy", threads, shared))
        return occupancy

    def set_max_dynamic_shared(function, nbytes):
        calls.append(("set_max_dynamic_shared", nbytes))

    ns = types.SimpleNamespace(
        load_module=load_module,
        occupancy_blocks_per_sm=occupancy_blocks_per_sm,
        set_max_dynamic_shared=set_max_dynamic_shared,
        make_current=lambda ctx: None,
    )
    return ns, calls


def _backend(caps):
    """A CudaBackend planning for ``caps``, with a core that never reaches the driver unless asked."""
    from vyre_cuda._dispatch import Core
    from vyre_cuda.backend import CudaBackend
    from vyre_cuda.compile.modules import ModuleCache
    from vyre_cuda.telemetry import Telemetry

    b = CudaBackend.__new__(CudaBackend)
    b.device = 0
    b._caps = caps
    b._ctx = 0
    b._plan_lock = threading.RLock()
    b._core = Core(0, 1 << 20, 1 << 20, False)
    b._modules = ModuleCache(0, caps.cc, caps.driver_version, on_evict=b._core.clear_prepared)
    b.telemetry = Telemetry(b._core)
    b._closed = False  # never closed: it holds no driver resources
    return b


def _entry_points(b, program, inputs, config):
    outs = [np.empty(len(inputs[0]), np.uint32) for _ in program.outputs]
    return {
        "dispatch": lambda: b.dispatch(program, inputs, config),
        "dispatch_async": lambda: b.dispatch_async(program, inputs, config),
        "dispatch_into": lambda: b.dispatch_into(program, inputs, outs, config),
        "dispatch_timed": lambda: b.dispatch_timed(program, inputs, config),
        "plan_info": lambda: b.plan_info(program, inputs, config),
        "cooperative_grid_sync_fits": lambda: b.cooperative_grid_sync_fits(program, inputs, config),
    }


@pytest.mark.parametrize("caps", NO_COOP, ids=NO_COOP_IDS)
def test_backend_refuses_grid_sync_before_touching_the_driver(monkeypatch, caps):
    from vyre_cuda import _backend_plans as plans_mod
    from vyre_cuda import backend as backend_mod
    from vyre_cuda.compile import modules as modules_mod

    monkeypatch.setattr(backend_mod, "_driver", _NoDriver("no_driver"))

    monkeypatch.setattr(modules_mod, "_driver", backend_mod._driver)  # the module cache asks the same driver
    monkeypatch.setattr(plans_mod, "_driver", backend_mod._driver)  # and the backend's planning steps
    b = _backend(caps)
    program = scan()
    x = np.arange(10_000, dtype=np.uint32)
    for cfg in (None, DispatchConfig(grid_override=(10**5,))):
        for call in _entry_points(b, program, [x], cfg).values():
            with pytest.raises(UnsupportedFeature) as exc_info:
                call()
            _assert_names_caps(exc_info.value.message, caps)
    assert not any(b.telemetry.snapshot().values()), b.telemetry.snapshot()


# CudaBackend._plan_route compiles the kernel before route_grid_sync refuses cooperative=True, and
NO_COOP_BACKEND = [pytest.param(caps, id=i) for caps, i in zip(NO_COOP, NO_COOP_IDS)]


@pytest.mark.parametrize("caps", NO_COOP_BACKEND)
def test_backend_refuses_cooperative_config(monkeypatch, caps):
    from vyre_cuda import _backend_plans as plans_mod
    from vyre_cuda import backend as backend_mod
    from vyre_cuda.compile import modules as modules_mod

    fake, _ = _fake_driver(occupancy=8)
    monkeypatch.setattr(backend_mod, "_driver", fake)
    monkeypatch.setattr(modules_mod, "_driver", backend_mod._driver)  # the module cache asks the same driver
    monkeypatch.setattr(plans_mod, "_driver", backend_mod._driver)  # and the backend's planning steps
    b = _backend(caps)
    program = plain()
    x = np.arange(1000, dtype=np.uint32)
    for name, call in _entry_points(b, program, [x, x], DispatchConfig(cooperative=True)).items():
        with pytest.raises(UnsupportedFeature) as exc_info:
            call()
        _assert_names_caps(exc_info.value.message, caps)
        assert "cooperative=True" in exc_info.value.message, name
    if caps.cc >= (7, 5):  # NVRTC 13 cannot compile for older devices at all
        assert b.plan_info(program, [x, x]).route.kind == "regular"
    assert not any(b.telemetry.snapshot().values())


@pytest.mark.parametrize("occupancy", [1, 8])
def test_backend_preflight_and_plan_agree_at_the_boundary(monkeypatch, occupancy):
    from vyre_cuda import _backend_plans as plans_mod
    from vyre_cuda import backend as backend_mod
    from vyre_cuda.compile import modules as modules_mod

    fake, calls = _fake_driver(occupancy)
    monkeypatch.setattr(backend_mod, "_driver", fake)
    monkeypatch.setattr(modules_mod, "_driver", backend_mod._driver)  # the module cache asks the same driver
    monkeypatch.setattr(plans_mod, "_driver", backend_mod._driver)  # and the backend's planning steps
    b = _backend(H200)
    program = scan()
    x = np.arange(300_000, dtype=np.uint32)
    R = occupancy * 132
    info = b.plan_info(program, [x])
    assert info.route.resident_limit == R
    assert ("occupancy", 256, 0) in calls

    at = DispatchConfig(grid_override=(R,))
    assert b.cooperative_grid_sync_fits(program, [x], at) is True
    info = b.plan_info(program, [x], at)
    assert (info.route.kind, info.route.grid_blocks) == ("cooperative", R)
    assert len(info.layout.params_offsets) == 1
    phase_word = info.bindings.max_binding + 2
    _, (block,) = _blocks(info.layout, info.bindings)
    assert block[phase_word : phase_word + 2] == [0, 3]

    over = DispatchConfig(grid_override=(R + 1,))
    assert b.cooperative_grid_sync_fits(program, [x], over) is False
    info = b.plan_info(program, [x], over)
    assert (info.route.kind, info.route.grid_blocks) == ("split", R + 1)
    _, words = _blocks(info.layout, info.bindings)
    assert [w[phase_word : phase_word + 2] for w in words] == [[0, 1], [1, 2], [2, 3]]

    # fixpoint iterations do not change the layout: the phase blocks are replayed per iteration
    again = b.plan_info(program, [x], DispatchConfig(grid_override=(R + 1,), fixpoint_iterations=7))
    assert again.layout.params_blob == info.layout.params_blob

    forced = DispatchConfig(grid_override=(R + 1,), cooperative=True)
    for name, call in _entry_points(b, program, [x], forced).items():
        if name == "cooperative_grid_sync_fits":
            continue  # see the report: the preflight raises here rather than answering
        with pytest.raises(CooperativeResidencyExceeded) as exc_info:
            call()
        assert (exc_info.value.grid_blocks, exc_info.value.resident_limit) == (R + 1, R), name
    assert not any(b.telemetry.snapshot().values())  # nothing was enqueued, nothing cached


def test_backend_refuses_cooperative_grid_sync_without_barrier_global(monkeypatch):
    from vyre_cuda import _backend_plans as plans_mod
    from vyre_cuda import backend as backend_mod
    from vyre_cuda.compile import modules as modules_mod

    fake, _ = _fake_driver(occupancy=8, barrier=0)
    monkeypatch.setattr(backend_mod, "_driver", fake)
    monkeypatch.setattr(modules_mod, "_driver", backend_mod._driver)  # the module cache asks the same driver
    monkeypatch.setattr(plans_mod, "_driver", backend_mod._driver)  # and the backend's planning steps
    b = _backend(H200)
    program = scan()
    x = np.arange(10_000, dtype=np.uint32)
    with pytest.raises(InvalidProgram):
        b.plan_info(program, [x])  # cooperative: the barrier counter is needed
    # host split never touches the barrier, so it plans
    assert b.plan_info(program, [x], DispatchConfig(grid_override=(8 * 132 + 1,))).route.kind == "split"
