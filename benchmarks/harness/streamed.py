"""The streamed route's rows: the elementwise vecadd streamed, and the compute-heavy kernel.

``vyre.streamed`` and ``vyre.streamed_pinned`` run the built-in vecadd declared elementwise
(``Program(..., elementwise=True)``) through ``dispatch_into`` with
``DispatchConfig(streamed=True)``, from numpy and from page-locked arrays; the serial rows keep
the plain vecadd, so they stay comparable with stored results. At :data:`HEAVY_SIZE` only, a
compute-heavy elementwise kernel (:data:`HEAVY_STEPS` ``__sinf`` steps per element) measures the
overlap of transfers and compute: its streamed host round trip (``vyre.heavy``), its compute alone
on device-resident arrays (``vyre.heavy_compute``) and the same bytes through the elementwise
vecadd (``vyre.heavy_transfer``), all page-locked.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from vyre_cuda.profile.engine import Runner
from vyre_cuda.profile.specs import MIB

__all__ = [
    "HEAVY_SIZE",
    "HEAVY_SRC",
    "HEAVY_STEPS",
    "elementwise_twin",
    "heavy_inputs",
    "heavy_program",
    "heavy_reference",
    "heavy_runners",
    "planner_route",
    "sample_rows",
    "streamed_runners",
]

HEAVY_SIZE = 256 * MIB  # bytes per buffer of the heavy rows (the harness's size list has it)
HEAVY_STEPS = 400
HEAVY_SRC = r"""
#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(const float* a, const float* b, float* out, const vyre_u32* p) {
    vyre_u32 i = vyre_global_id();
    if (i >= p[0]) return;
    float x = a[i], y = b[i];
    for (int k = 0; k < STEPS; ++k) x = __sinf(x) + y;
    out[i] = x;
}
"""
# __sinf is an approximation; with b in [-2, -1) the steps contract, so the error stays near one
# step's (about 1e-6), far inside these.
HEAVY_RTOL = 1e-4
HEAVY_ATOL = 1e-4
# Rows of the heavy output compared with numpy (numpy's 400 steps over every row of 256 MiB would
# take a minute): evenly spread, both ends, and both sides of every 1 MiB boundary of the buffer,
# where chunks of any power-of-two size from 1 MiB up meet.
_CHECK_ROWS = 1 << 15
_BOUNDARY_ROWS = MIB // 4


def elementwise_twin(program):
    """``program`` declared elementwise (the same kernel and buffers), for the streamed route."""
    return dataclasses.replace(program, name=f"{program.name or 'program'}_elementwise", elementwise=True)


def heavy_program(steps: int = HEAVY_STEPS):
    """The compute-heavy elementwise kernel: ``out = x`` after ``x = __sinf(x) + b``, ``steps``
    times from ``x = a``."""
    from vyre_cuda.program import BufferDecl, Kernel, Program

    decls = (BufferDecl.read("a", 0, "f32"), BufferDecl.read("b", 1, "f32"), BufferDecl.output("out", 2, "f32"))
    source = HEAVY_SRC.replace("STEPS", str(int(steps)))
    return Program(Kernel.cuda(source), decls, name="heavy", elementwise=True)


def heavy_reference(a, b, steps: int = HEAVY_STEPS):
    """numpy's result of the heavy kernel (float32, ``np.sin``)."""
    x = np.array(a, dtype=np.float32, copy=True)
    b = np.asarray(b, dtype=np.float32)
    for _ in range(steps):
        x = np.sin(x) + b
    return x


def heavy_inputs(a, b):
    """The heavy kernel's inputs from a size's random ``a`` and ``b`` in [0, 1): ``a + 0.5`` and
    ``b - 2``, where the steps contract (see :data:`HEAVY_RTOL`)."""
    return (a + np.float32(0.5)).astype(np.float32), (b - np.float32(2.0)).astype(np.float32)


def sample_rows(n: int, rng) -> np.ndarray:
    """Sorted distinct row indices of an ``n``-row output to compare with numpy."""
    spread = np.linspace(0, n - 1, min(n, _CHECK_ROWS)).astype(np.int64)
    edges = np.arange(_BOUNDARY_ROWS, n, _BOUNDARY_ROWS, dtype=np.int64)
    drawn = rng.integers(0, n, min(n, _CHECK_ROWS // 4))
    return np.unique(np.concatenate([spread, edges - 1, edges, drawn, [0, n - 1]]))


def planner_route(backend, twin, inputs) -> dict:
    """The route the planner picks for an unforced ``dispatch_into`` of ``twin`` on ``inputs``:
    ``{"route": "streamed" | "serial" | ..., "reason": text}`` (``route`` None where
    ``plan_info`` fails)."""
    try:
        route = backend.plan_info(twin, inputs).route
    except Exception as exc:  # noqa: BLE001 (a figure of the report, not a reason to stop the run)
        return {"route": None, "reason": f"plan_info failed: {type(exc).__name__}: {exc}".splitlines()[0]}
    return {"route": str(route.kind), "reason": str(getattr(route, "reason", "") or "")}


def _streamed_config():
    from vyre_cuda.config import DispatchConfig

    return DispatchConfig(streamed=True)


def _into_runner(backend, program, config, key, ins, outs, last):
    pc = time.perf_counter_ns
    dispatch_into = backend.dispatch_into

    def run(count):
        for o in outs:
            o[...] = 0  # a stale right answer must not pass the check
        walls = []
        for _ in range(count):
            t0 = pc()
            dispatch_into(program, ins, outs, config)
            t1 = pc()
            walls.append(t1 - t0)
        last[key] = outs
        return {key: walls}

    return run


def streamed_runners(backend, twin, inputs, check, into, pinned):
    """``vyre.streamed`` (``inputs`` into the numpy ``into``) and, with ``pinned = (inputs,
    outputs)`` page-locked, ``vyre.streamed_pinned``; ``check(outputs)`` as for the serial rows.
    The output arrays are the serial rows' own: each row clears them before its samples."""
    config = _streamed_config()
    last: dict = {}

    def verifier(key):
        return None if check is None else (lambda: check(last[key]))

    runners = [
        Runner(
            "vyre_cuda streamed",
            _into_runner(backend, twin, config, "vyre.streamed", inputs, into, last),
            verifier("vyre.streamed"),
        )
    ]
    if pinned is not None:
        runners.append(
            Runner(
                "vyre_cuda streamed page-locked",
                _into_runner(backend, twin, config, "vyre.streamed_pinned", pinned[0], pinned[1], last),
                verifier("vyre.streamed_pinned"),
            )
        )
    return runners


def heavy_runners(backend, plain, twin, a, b, rng, locked, steps: int = HEAVY_STEPS):
    """The heavy rows on inputs made from ``a`` and ``b`` (:func:`heavy_inputs`):
    ``locked(arrays)`` makes page-locked copies. ``plain`` (the serial vecadd) uploads the
    device-resident inputs of ``vyre.heavy_compute`` as ``x + 0`` with ``outputs="device"``."""
    from vyre_cuda.config import DispatchConfig

    heavy = heavy_program(steps)
    ha, hb = heavy_inputs(a, b)
    n = ha.size
    rows = sample_rows(n, rng)
    expected_rows = heavy_reference(ha[rows], hb[rows], steps)
    sums = ha + hb
    pa, pb, pout = locked([ha, hb, np.empty(n, np.float32)])
    zeros = np.zeros(n, np.float32)
    on_device = DispatchConfig(outputs="device")
    da, db, dout = (backend.dispatch(plain, [x, zeros], on_device)[0] for x in (ha, hb, zeros))
    del zeros
    config = _streamed_config()
    last: dict = {}

    def heavy_ok(out):
        got = _host(out)
        return bool(np.isfinite(got).all() and np.allclose(got[rows], expected_rows, rtol=HEAVY_RTOL, atol=HEAVY_ATOL))

    def compute(count):
        pc = time.perf_counter_ns
        walls = []
        for _ in range(count):
            t0 = pc()
            backend.dispatch_into(heavy, [da, db], [dout])
            t1 = pc()
            walls.append(t1 - t0)
        return {"vyre.heavy_compute": walls}

    return [
        Runner(
            "heavy kernel streamed, page-locked",
            _into_runner(backend, heavy, config, "vyre.heavy", [pa, pb], [pout], last),
            lambda: heavy_ok(last["vyre.heavy"][0]),
        ),
        Runner(
            "heavy kernel's bytes through vecadd, streamed",
            _into_runner(backend, twin, config, "vyre.heavy_transfer", [pa, pb], [pout], last),
            lambda: bool(np.array_equal(last["vyre.heavy_transfer"][0], sums)),
        ),
        # dout holds zeros until the warm-up's first dispatch, so its check sees that dispatch
        Runner("heavy kernel on device arrays", compute, lambda: heavy_ok(dout)),
    ]


def _host(x) -> np.ndarray:
    """A host view or copy of an output (a DeviceArray is copied back)."""
    copy = getattr(x, "copy_to_host", None)
    return np.asarray(copy() if copy is not None else x)
