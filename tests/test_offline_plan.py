"""vyre_cuda.plan (planning without a GPU) against CudaBackend.plan_info on the same caps.

The backend side plans through the real CudaBackend over tests/planning_fakes' faked driver (an
H200's caps, a settable occupancy answer); the offline side compiles the same kernel with NVRTC
and must reach the same plan, field for field, except the addresses of a loaded module.
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
from planning_fakes import ENTRY_POINTS, H200, planning_backends, stub_backend

import vyre_cuda as vc
from vyre_cuda import _driver
from vyre_cuda.offline import ArraySpec, occupancy_bound
from vyre_cuda.planning.presets import PRESETS, preset

BP = vc.builtin_programs


def _backend_plan(planners, program, inputs, config=None, occupancy=8):
    made, mp = planners
    backend, driver = made[H200.name]
    for name in ENTRY_POINTS:
        mp.setattr(_driver, name, getattr(driver, name))
    driver.occupancy = occupancy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vc.LaunchSizeWarning)
        return backend.plan_info(program, inputs, config)


def _unloaded(plan):
    return dataclasses.replace(plan, function=0, barrier=0, gate=None)


@pytest.fixture
def planners():
    with planning_backends([H200]) as made:
        yield made


CASES = [
    ("vecadd", BP.vecadd_f32, lambda rng, n: [rng.random(n, np.float32), rng.random(n, np.float32)], None),
    ("vecadd_big", BP.vecadd_f32, lambda rng, n: [np.zeros(300_000, np.float32)] * 2, None),
    ("vecadd_iter", BP.vecadd_f32, lambda rng, n: [np.zeros(n, np.float32)] * 2, {"fixpoint_iterations": 7}),
    ("vecadd_wg", BP.vecadd_f32, lambda rng, n: [np.zeros(n, np.float32)] * 2, {"workgroup_override": (128, 1, 1)}),
    ("scan_coop", BP.inclusive_scan_u32, lambda rng, n: [rng.integers(0, 9, n, dtype=np.uint32)], None),
    ("scan_split", BP.inclusive_scan_u32, lambda rng, n: [np.zeros(5_000_000, np.uint32)], None),
    ("block_sum", lambda: BP.block_sum_u32(64), lambda rng, n: [rng.integers(0, 9, 64 * 256, dtype=np.uint32)], None),
]


@pytest.mark.parametrize("name, make, inputs, config", CASES, ids=[c[0] for c in CASES])
def test_plan_equals_plan_info_on_the_same_caps(planners, rng, name, make, inputs, config):
    program = make()
    n = int(rng.integers(1, 20_000))
    arrays = inputs(rng, n)
    info = _backend_plan(planners, program, arrays, config, occupancy=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vc.LaunchSizeWarning)
        offline = vc.plan(program, arrays, config, device=H200, occupancy=4)
        # only the byte lengths matter: the same plan from descriptions of the arrays
        specs = [ArraySpec(a.shape, a.dtype) for a in arrays]
        described = vc.plan(program, specs, config, device=H200, occupancy=4)
    assert offline == _unloaded(info)
    assert described == offline
    assert offline.function == 0 and offline.barrier == 0 and offline.gate is None
    assert offline.kernel.kind == "cubin"  # compiled for the caps' architecture (sm_90)


def test_grid_sync_route_follows_the_occupancy(planners):
    scan = BP.inclusive_scan_u32()
    x = np.zeros(132 * 5 * 256, np.uint32)  # 660 blocks of 256: 5 per SM
    blocks = -(-x.size // 256)
    fits = -(-blocks // H200.sm_count)  # blocks per SM that make the grid co-resident
    assert vc.plan(scan, [x], device=H200, occupancy=fits).route.kind == "cooperative"
    assert vc.plan(scan, [x], device=H200, occupancy=fits - 1).route.kind == "split"
    with pytest.raises(vc.CooperativeResidencyExceeded) as err:
        vc.plan(scan, [x], {"cooperative": True}, device=H200, occupancy=fits - 1)
    assert "Fix:" in str(err.value)
    # without occupancy=, the caps' bound (no registers counted): 2048 threads / 256 = 8 per SM
    assert occupancy_bound(H200, 256, 0) == 8
    default = vc.plan(scan, [np.zeros(132 * 8 * 256, np.uint32)], device=H200)
    assert default.route.kind == "cooperative"
    assert vc.plan(scan, [np.zeros(132 * 8 * 256 + 1, np.uint32)], device=H200).route.kind == "split"


def test_device_arrays_are_planned_in_place(planners):
    prog = BP.vecadd_f32()
    host = vc.plan(prog, [ArraySpec(4096, "f4")] * 2)
    device = vc.plan(prog, [ArraySpec(4096, "f4", device=True)] * 2)
    assert host.layout.slab_bytes > device.layout.slab_bytes  # device inputs are not uploaded

    class CaiOnly:  # what Numba/CuPy expose; only shape and typestr are read
        __cuda_array_interface__ = {"shape": (4096,), "typestr": "<f4", "data": (0, False), "version": 3}

    assert vc.plan(prog, [CaiOnly(), CaiOnly()]) == device


def test_presets_hold_the_published_figures():
    h200 = PRESETS["H200"]
    # the figures the planning fake's H200 reports (read from a real one)
    for field in ("cc", "sm_count", "max_shared_per_block_optin", "max_threads_per_sm", "max_blocks_per_sm"):
        assert getattr(h200, field) == getattr(H200, field), field
    assert h200.total_memory == H200.total_memory
    assert (PRESETS["A100"].cc, PRESETS["A100"].sm_count, PRESETS["L4"].cc, PRESETS["L4"].sm_count) == (
        (8, 0),
        108,
        (8, 9),
        58,
    )
    assert preset("h100") is PRESETS["H100"] and preset(H200) is H200
    # an L4 has 1536 threads per SM: a 1024-thread block fits once
    assert occupancy_bound(PRESETS["L4"], 1024, 0) == 1


def test_plans_differ_by_device():
    prog = BP.inclusive_scan_u32()
    x = [ArraySpec(58 * 6 * 256, "u4")]  # co-resident on an L4 at 6 blocks/SM, not at 5
    assert vc.plan(prog, x, device="L4").route.kind == "cooperative"
    assert vc.plan(prog, x, device="L4", occupancy=5).route.kind == "split"
    with pytest.raises(vc.DeviceOutOfMemory) as err:  # 3 x 8 GiB over an L4's budget (90% of 22.5 GiB)
        vc.plan(BP.vecadd_f32(), [ArraySpec(1 << 31, "f4")] * 2, device="L4")
    assert "Fix:" in str(err.value)
    vc.plan(BP.vecadd_f32(), [ArraySpec(1 << 31, "f4")] * 2, device="H200")  # fits 140 GiB


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda p: vc.plan(p, [np.zeros(4, np.float32)] * 2, device="H300"), vc.ValidationError),
        (lambda p: vc.plan(p, [np.zeros(4, np.float32)] * 2, device=90), vc.ValidationError),
        (lambda p: vc.plan(p, [np.zeros(4, np.float32)]), vc.ValidationError),
        (lambda p: vc.plan(p, [np.zeros(4, np.float32), None]), vc.ValidationError),
        (lambda p: vc.plan(p, "ab"), vc.ValidationError),
        (lambda p: vc.plan(p, [np.zeros(4, np.float32)] * 2, {"nope": 1}), vc.ValidationError),
        (lambda p: vc.plan(p, [np.zeros(4, np.float32)] * 2, occupancy=-1), vc.ValidationError),
        (lambda p: vc.plan("prog", [np.zeros(4, np.float32)] * 2), vc.ValidationError),
        (lambda p: ArraySpec((4, -1), "f4"), vc.ValidationError),
        (lambda p: ArraySpec(4, "not a dtype"), vc.ValidationError),
        (lambda p: vc.plan(p, [np.zeros(4, np.int32)] * 2, {"workgroup_override": (4096, 1, 1)}), vc.BackendError),
    ],
)
def test_plan_errors_are_typed_with_a_fix(call, error):
    with pytest.raises(error) as err:
        call(BP.vecadd_f32())
    assert str(err.value).splitlines()[-1].startswith("Fix: ")


def test_compile_errors_show_without_a_gpu():
    bad = vc.Program(
        vc.Kernel.cuda('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(float* a) { a[0] = undefined_name; }'),
        [vc.BufferDecl.output("a", 0, "f32", 4)],
    )
    with pytest.raises(vc.KernelCompileFailed) as err:
        vc.plan(bad, [])
    assert "undefined_name" in err.value.log
    assert str(err.value).splitlines()[-1].startswith("Fix: ")


def test_autotune_plans_the_declared_width():
    prog = BP.vecadd_f32()
    plan = vc.plan(prog, [ArraySpec(1 << 16, "f4")] * 2, {"autotune": True})
    assert plan.launch.block == (256, 1, 1) and plan.tuned_block is None
    assert "offline" in plan.tuning


def test_profile_reports_a_kernel_compile_error_without_a_gpu(tmp_path):
    """`vyre-cuda profile --kernel` on a machine without a driver: the compile error, exit 1."""
    bad = tmp_path / "bad.cu"
    bad.write_text('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const float* a, float* o) { o[0] = nope; }')
    good = tmp_path / "good.cu"
    good.write_text('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const float* a, float* o) { o[0] = a[0]; }')
    env = {"LD_LIBRARY_PATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    # (a child whose driver cannot be found: the test process may have a real one loaded)
    code = (
        "import sys, vyre_cuda._driver as d\n"
        "from vyre_cuda.errors import DriverUnavailable\n"
        "def gone(*a, **k): raise DriverUnavailable('no CUDA driver (test)', 'install one')\n"
        "d.init_driver = gone\n"
        "from vyre_cuda.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )

    def run(path):
        argv = [sys.executable, "-c", code, "profile", "--kernel", str(path), "--buffers", "a:f32:in,o:f32:out"]
        argv += ["--sizes", "4KiB"]
        # cwd and PYTHONPATH: the vyre_cuda under test (an installed one, not an unbuilt checkout)
        package_root = str(pathlib.Path(vc.__file__).resolve().parents[1])
        child_env = {**env, "HOME": str(tmp_path), "PYTHONPATH": package_root}
        return subprocess.run(argv, capture_output=True, text=True, env=child_env, cwd=tmp_path, timeout=120)

    failed = run(bad)
    assert failed.returncode == 1, failed.stderr
    assert "KernelCompileFailed" in failed.stderr and "nope" in failed.stderr
    fine = run(good)
    assert fine.returncode == 3, fine.stderr  # compiles: the missing driver is the error
    assert "DriverUnavailable" in fine.stderr


# ------------------------------------------------------------------ the dispatch's input checks
# plan() refuses what a dispatch of the same inputs refuses, with the same error: a buffer whose
# element type is not the declared one (float64, int32 or float16 for f32...), big-endian data,
# a length that is no whole number of elements. A uint8 view or bytes (raw bytes, on purpose)
# and inputs of the declared kind plan.
_U8_SRC = '#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const unsigned char* x, unsigned int* h) {}\n'
_BYTES_IN = vc.Program(
    vc.Kernel.cuda(_U8_SRC), [vc.BufferDecl.read("x", 0, "u8"), vc.BufferDecl.output("h", 1, "u32", 256)]
)
_F32 = np.float32


def _big_endian(n):
    return np.zeros(n, ">f4")


INPUT_CASES = [
    # (id, program, inputs as arrays, refused by the dispatch?)
    ("float64_for_f32", BP.vecadd_f32, lambda: [np.zeros(10, np.float64), np.zeros(20, _F32)], True),
    ("float64_second", BP.vecadd_f32, lambda: [np.zeros(20, _F32), np.zeros(10, np.float64)], True),
    ("int32_for_f32", BP.vecadd_f32, lambda: [np.zeros(20, np.int32), np.zeros(20, _F32)], True),
    ("float16_for_f32", BP.vecadd_f32, lambda: [np.zeros(10, np.float16), np.zeros(5, _F32)], True),
    ("big_endian_f32", BP.vecadd_f32, lambda: [_big_endian(20), np.zeros(20, _F32)], True),
    ("int32_for_u32", lambda: BP.block_sum_u32(64), lambda: [np.zeros(64 * 256, np.int32)], True),
    ("half_an_element", BP.vecadd_f32, lambda: [np.zeros(6, np.uint8), np.zeros(6, np.uint8)], True),
    ("lengths_differ_first", BP.vecadd_f32, lambda: [np.zeros(10, np.float64), np.zeros(10, _F32)], True),
    ("float32", BP.vecadd_f32, lambda: [np.zeros(20, _F32), np.zeros(20, _F32)], False),
    ("uint8_view", BP.vecadd_f32, lambda: [np.zeros(20, _F32).view(np.uint8), np.zeros(20, _F32)], False),
    ("bytes", BP.vecadd_f32, lambda: [bytes(80), bytearray(80)], False),
    ("uint32", lambda: BP.block_sum_u32(64), lambda: [np.zeros(64 * 256, np.uint32)], False),
    ("u8_declared", lambda: _BYTES_IN, lambda: [np.zeros(100, np.uint8)], False),
    ("int8_for_u8", lambda: _BYTES_IN, lambda: [np.zeros(100, np.int8)], False),
]


def _refusal(call):
    """(type, message) of the ValidationError ``call`` raises; None when the input checks pass."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vc.LaunchSizeWarning)
        try:
            call()
        except vc.ValidationError as exc:
            return type(exc), str(exc)
        except (RuntimeError, vc.DispatchFailed, vc.DriverUnavailable):
            return None  # a stub backend's first call into a device: past the checks
    return None


@pytest.fixture
def dispatcher(monkeypatch):
    """A real CudaBackend over stub driver entry points: a dispatch runs its checks, then fails at
    its first call into a device."""
    backend = stub_backend(monkeypatch, H200)
    yield backend
    backend.close()


@pytest.mark.parametrize("name, make, inputs, refused", INPUT_CASES, ids=[c[0] for c in INPUT_CASES])
def test_plan_refuses_the_inputs_a_dispatch_refuses_with_its_error(dispatcher, name, make, inputs, refused):
    program = make()
    by_dispatch = _refusal(lambda: dispatcher.dispatch(program, inputs()))
    assert (by_dispatch is not None) == refused, by_dispatch
    assert _refusal(lambda: vc.plan(program, inputs(), device=H200)) == by_dispatch
    described = [ArraySpec(x.shape, x.dtype) for x in inputs() if isinstance(x, np.ndarray)]
    if len(described) == len(inputs()):  # the same inputs described: the same answer
        assert _refusal(lambda: vc.plan(program, described, device=H200)) == by_dispatch
    if refused:
        assert by_dispatch[1].splitlines()[-1].startswith("Fix: ")


_DTYPES = ["f2", "f4", "f8", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "?", "c8", ">f4", ">u4", "V4", "S4"]


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("declared", ["f32", "u32"])
def test_plan_and_dispatch_agree_on_every_element_type(dispatcher, declared, dtype):
    # the core's check is C (_formats.pxd); plan's is its Python twin (_io_checks.kind_ok)
    program = BP.vecadd_f32() if declared == "f32" else BP.block_sum_u32(64)
    nbytes = 4 * 64 * 256
    first = np.zeros(nbytes // np.dtype(dtype).itemsize, dtype)
    rest = [np.zeros(64 * 256, _F32)] if declared == "f32" else []
    by_dispatch = _refusal(lambda: dispatcher.dispatch(program, [first, *rest]))
    assert _refusal(lambda: vc.plan(program, [first, *rest], device=H200)) == by_dispatch


def test_the_reported_case_float64_for_f32_is_refused_not_planned_twice_as_long():
    # 10 float64 values for an f32 buffer once planned runtime_count 20
    prog = BP.vecadd_f32()
    for a in (np.zeros(10, np.float64), ArraySpec((10,), np.float64)):
        with pytest.raises(vc.ValidationError) as err:
            vc.plan(prog, [a, ArraySpec(20, np.float32)])
        assert "float64" in err.value.message and "f32" in err.value.message
        assert "astype(numpy.float32)" in err.value.fix


class _Cai:
    """A device array as Numba/CuPy describe it (only the description is read offline)."""

    def __init__(self, n, typestr):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr, "data": (0x7F00_0000, False), "version": 3}


@pytest.mark.parametrize(
    "typestr, n, refused",
    [
        ("<f8", 10, True),
        ("<i4", 20, True),
        ("<f2", 40, True),
        (">f4", 20, True),
        ("<f4", 20, False),
        ("|u1", 80, False),
    ],
)
def test_plan_refuses_the_device_arrays_a_dispatch_refuses_with_its_error(typestr, n, refused):
    from vyre_cuda._devview import device_input

    prog = BP.vecadd_f32()
    # the dispatch's reader, on an empty array of the same type (its element-type refusals do not
    # depend on the length, and an empty one needs no driver to say where its memory lives)
    by_dispatch = _refusal(lambda: device_input(prog, 0, _Cai(0, typestr), 0, None))
    assert (by_dispatch is not None) == refused
    others = [_Cai(20, "<f4")]
    assert _refusal(lambda: vc.plan(prog, [_Cai(n, typestr), *others])) == by_dispatch
    spec = ArraySpec(n, np.dtype(typestr), device=True)
    if typestr[0] != ">":  # (a description has no typestr to quote)
        assert _refusal(lambda: vc.plan(prog, [spec, ArraySpec(20, "f4", device=True)])) == by_dispatch
