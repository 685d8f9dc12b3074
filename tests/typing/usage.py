"""Typed use of vyre_cuda's public API: `mypy --strict --warn-unused-ignores` must pass on it.

Never run: scripts/lint type-checks it. Each ``assert_type`` is a type the API promises; each
``# type: ignore[code]`` marks a misuse the annotations must catch (with --warn-unused-ignores,
an ignore that stops being needed is itself an error).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from typing_extensions import assert_type

import vyre_cuda as vc
from vyre_cuda.planning.dispatch import DispatchPlan
from vyre_cuda.typing import DispatchOutput, InputBuffer


def backend_use(prog: vc.Program, a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> None:
    assert_type(vc.CudaBackend(0), vc.CudaBackend)
    with vc.CudaBackend() as gpu:
        assert_type(gpu, vc.CudaBackend)
        assert_type(gpu.caps, vc.DeviceCaps)
        assert_type(gpu.dispatch(prog, [a, b]), list[npt.NDArray[Any]])
        # with a config an output may be a DeviceArray (outputs="device"): the value decides
        assert_type(gpu.dispatch(prog, [a, b], vc.DispatchConfig(label="x")), list[Any])
        (d,) = gpu.dispatch(prog, [a, b], {"outputs": "device"})
        either: DispatchOutput = d
        if isinstance(either, vc.DeviceArray):
            assert_type(either.copy_to_host(), npt.NDArray[Any])
        out = np.empty_like(a)
        assert_type(gpu.dispatch_into(prog, [a, b], [out]), list[npt.NDArray[np.float32]])
        pending = gpu.dispatch_async(prog, [a, b])
        assert_type(pending, vc.PendingDispatch)
        assert_type(pending.is_ready(), bool)
        assert_type(pending.result(), list[Any])
        assert_type(gpu.dispatch_timed(prog, [a, b]), vc.TimedDispatchResult)
        assert_type(gpu.dispatch_timed(prog, [a, b]).wall_ns, int)
        assert_type(gpu.plan_info(prog, [a, b]), DispatchPlan)
        assert_type(gpu.cooperative_grid_sync_fits(prog, [a, b]), bool)
        assert_type(gpu.telemetry.snapshot(), dict[str, int])
        assert_type(gpu.telemetry["launches"], int)
        # bytes, memoryviews and device arrays are inputs too
        inputs: list[InputBuffer] = [b"\0" * 16, memoryview(bytearray(16)), vc.DeviceArray._empty(4, "f4", 0)]
        gpu.dispatch(prog, inputs)

        gpu.dispatch(prog, "notalist", 5)  # type: ignore[call-overload]
        gpu.dispatch(prog, [a, 3])  # type: ignore[list-item]
        gpu.dispatch([a, b], prog)  # type: ignore[call-overload]
        gpu.dispatch_async(prog, [a], config=1.5)  # type: ignore[arg-type]
        vc.CudaBackend("0")  # type: ignore[arg-type]


def planning(prog: vc.Program, a: npt.NDArray[np.float32]) -> None:
    plan = vc.plan(prog, [a, vc.ArraySpec(1000, np.float32)], device="L4")
    assert_type(plan, DispatchPlan)
    assert_type(vc.plan(prog, [a, a], device=vc.DeviceCaps()), DispatchPlan)
    vc.plan(prog, [a, a], device=90)  # type: ignore[arg-type]
    vc.plan(prog, [a, 3])  # type: ignore[list-item]


def programs() -> vc.Program:
    assert_type(vc.builtin_programs.vecadd_f32(), vc.Program)
    kernel = vc.Kernel.cuda('#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main() {}')
    assert_type(kernel, vc.Kernel)
    decls = [vc.BufferDecl.read("a", 0, "f32"), vc.BufferDecl.output("out", 1, "f32")]
    assert_type(decls[1], vc.BufferDecl)
    cfg = vc.DispatchConfig(fixpoint_iterations=3, label="step")
    assert_type(cfg, vc.DispatchConfig)
    vc.DispatchConfig(label=3)  # type: ignore[arg-type]
    vc.DispatchConfig(outputs="gpu")  # type: ignore[arg-type]
    return vc.Program(kernel, decls, workgroup_size=(128, 1, 1))


def host_memory() -> None:
    assert_type(vc.pinned_empty(10, np.float32), npt.NDArray[Any])
    assert_type(vc.pinned_zeros((2, 3)), npt.NDArray[Any])
    assert_type(vc.is_page_locked(np.zeros(3)), bool)
    assert_type(vc.pinned_like(np.zeros(3)), npt.NDArray[Any])
    vc.pinned_empty(10, device="0")  # type: ignore[arg-type]


def device_arrays(x: vc.DeviceArray) -> None:
    assert_type(x.copy_to_host(), npt.NDArray[Any])
    assert_type(x.shape, tuple[int])
    assert_type(x.nbytes, int)
    x.ptr = 0  # type: ignore[misc]


def groups(prog: vc.Program, batches: list[list[npt.NDArray[np.float32]]]) -> None:
    with vc.DeviceGroup([0, 1]) as group:
        assert_type(group, vc.DeviceGroup)
        assert_type(group.devices, tuple[int, ...])
        assert_type(group.map(prog, batches), list[list[npt.NDArray[Any]]])
        assert_type(group.map(prog, batches, {"label": "x"}), list[list[Any]])
        assert_type(group.map(prog, batches, outputs=[[np.empty(4, np.float32)]]), list[list[Any]])
        flag = bool(len(batches))
        assert_type(group.map(prog, batches, return_exceptions=flag), list[list[Any] | BaseException])
        for _, (out,) in group.imap_unordered(prog, batches):
            assert_type(out, Any)
        group.map(prog, 5)  # type: ignore[call-overload]


def dask_use(client: Any, prog: vc.Program, a: npt.NDArray[np.float32]) -> None:
    import vyre_cuda.dask as vd

    vd.register(client)
    vd.submit(client, prog, [a, a])
    vd.map_blocks(prog, a, a, config={"label": "chunk"})
    vd.submit(client, prog, [a, a], config=7)  # type: ignore[arg-type]
    vd.map_blocks("prog", a)  # type: ignore[arg-type]


def errors(exc: vc.BackendError) -> str:
    assert_type(exc.fix, str)
    return exc.message
