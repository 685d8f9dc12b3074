"""Child of tests/test_streamed.py: the streamed route of a real CudaBackend on the fake driver.

Every scenario checks outputs against numpy on fresh random data (outputs poisoned first where the
caller provides them). Run with the argument ``lazy`` the fake driver defers every stream operation
until something waits for it, so a missing event wait, a staging slot refilled before its DMA ran,
or a side stream not joined gives wrong data here (tests/fakecuda/fake_libcuda.c, lazy mode).
Prints one JSON object: scenario name -> record (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import sys
import threading

import numpy as np
from helpers.scenarios import Scenarios, live, raises

import vyre_cuda as vc
from benchmarks.harness import hooks
from fakecuda import FakeDriver, array_at, vecadd_emulation
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda.planning.stream import StreamTuning

SCENARIOS = Scenarios()
scenario = SCENARIOS.register
RNG = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
LAZY = "lazy" in sys.argv[2:]
STREAMED = DispatchConfig(streamed=True)

_SRC = '#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const {t}* a, const {t}* b, {t}* out, const vyre_u32* p) {{}}\n'


def vecadd(dtype="f32", **kw) -> Program:
    return Program(
        Kernel.cuda(_SRC.format(t={"f32": "float"}.get(dtype, "unsigned char")) + f"// {dtype}\n"),
        [BufferDecl.read("a", 0, dtype), BufferDecl.read("b", 1, dtype), BufferDecl.output("out", 2, dtype)],
        name=f"vecadd_{dtype}",
        elementwise=True,
        **kw,
    )


def backend_with(fake, program, inputs, emulation, rows_per_chunk=None, streams=3, min_chunk_bytes=None):
    """A backend whose streamed chunks hold ``rows_per_chunk`` rows of ``inputs[0]``'s dtype (and
    under a budget move at least ``min_chunk_bytes``: None, the planner's default)."""
    backend = vc.CudaBackend(0)
    if rows_per_chunk is not None:
        itemsize = np.asarray(inputs[0]).dtype.itemsize
        floor = {} if min_chunk_bytes is None else {"min_chunk_bytes": min_chunk_bytes}
        hooks.set_stream_tuning(
            backend, StreamTuning(chunk_bytes=rows_per_chunk * itemsize, streams=streams, min_waves=0, **floor)
        )
    fake.emulate(backend, program, inputs, emulation, STREAMED)
    return backend


def random(n, dtype=np.float32):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return RNG.standard_normal(n).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(info.min // 2, info.max // 2, n, dtype=dtype, endpoint=True)


def streamed_plan(backend, program, inputs, config=STREAMED):
    info = backend.plan_info(program, inputs, config)
    assert info.route.kind == "streamed", info.route
    return info.stream


# ------------------------------------------------------------------ chunk geometry
@scenario
def chunk_boundaries_match_numpy(fake):
    c = 1000
    program = vecadd()
    backend = backend_with(fake, program, [random(c), random(c)], vecadd_emulation(np.float32), c)
    before = backend.telemetry.snapshot()
    chunks = 0
    for n in (c + 1, 2 * c - 1, 2 * c, 2 * c + 1, 3 * c, 3 * c + 1, 7 * c - 1, 10 * c):
        a, b = random(n), random(n)
        plan = streamed_plan(backend, program, [a, b])
        assert plan.chunk_rows == c and plan.chunk_count == -(-n // c), plan
        (out,) = backend.dispatch(program, [a, b], STREAMED)
        np.testing.assert_array_equal(out, a + b, err_msg=f"n={n}")
        into = np.full(n, np.nan, np.float32)
        backend.dispatch_into(program, [a, b], [into], STREAMED)
        np.testing.assert_array_equal(into, a + b, err_msg=f"dispatch_into n={n}")
        chunks += 2 * plan.chunk_count
    after = backend.telemetry.snapshot()
    assert after["streamed_dispatches"] - before["streamed_dispatches"] == 16, after
    assert after["streamed_chunks"] - before["streamed_chunks"] == chunks, after
    backend.close()


@scenario
def one_row_chunks_and_one_stream(fake):
    program = vecadd()
    for streams in (1, 2, 3):
        a, b = random(37), random(37)
        backend = backend_with(fake, program, [a, b], vecadd_emulation(np.float32), 1, streams)
        plan = streamed_plan(backend, program, [a, b])
        assert (plan.chunk_rows, plan.chunk_count, plan.streams) == (1, 37, streams), plan
        (out,) = backend.dispatch(program, [a, b], STREAMED)
        np.testing.assert_array_equal(out, a + b)
        backend.close()


@scenario
def align_keeps_chunks_whole_multiples(fake):
    program = vecadd(align=7)
    a, b = random(7 * 50 + 3), random(7 * 50 + 3)
    backend = backend_with(fake, program, [a, b], vecadd_emulation(np.float32), 30)
    plan = streamed_plan(backend, program, [a, b])
    assert plan.chunk_rows == 28 and plan.chunk_count == -(-a.size // 28), plan
    (out,) = backend.dispatch(program, [a, b], STREAMED)
    np.testing.assert_array_equal(out, a + b)
    backend.close()


@scenario
def every_dtype_matches_numpy(fake):
    for name, dtype in (
        ("f32", np.float32),
        ("f64", np.float64),
        ("i32", np.int32),
        ("u8", np.uint8),
        ("i16", np.int16),
        ("u64", np.uint64),
        ("f16", np.float16),
        ("i64", np.int64),
    ):
        program = vecadd(name)
        n = 5003
        a, b = random(n, dtype), random(n, dtype)
        backend = backend_with(fake, program, [a, b], vecadd_emulation(dtype), 999)
        assert streamed_plan(backend, program, [a, b]).chunk_count == 6
        (out,) = backend.dispatch(program, [a, b], STREAMED)
        assert out.dtype == dtype, (name, out.dtype)
        np.testing.assert_array_equal(out, (a + b).astype(dtype), err_msg=name)
        backend.close()


# ------------------------------------------------------------------ bindings
def axpb_program():
    return Program(
        Kernel.cuda(_SRC.format(t="float") + "// axpb\n"),
        [
            BufferDecl.read("x", 0, "f32"),
            BufferDecl.read("y", 1, "f32"),
            BufferDecl.read("coef", 2, "f32", 2),
            BufferDecl.output("out", 3, "f32"),
        ],
        name="axpb",
        elementwise=["x", "y"],
    )


def axpb_emulation(launch):
    n = int(launch.words(launch.arg(4), 1)[0])
    x, y, out = (array_at(launch.arg(k), np.float32, n) for k in (0, 1, 3))
    coef = array_at(launch.arg(2), np.float32, 2)
    out[:] = coef[0] * x + y + coef[1]


@scenario
def static_inputs_go_whole_to_every_chunk(fake):
    program = axpb_program()
    x, y, coef = random(4321), random(4321), random(2)
    backend = backend_with(fake, program, [x, y, coef], axpb_emulation, 500)
    plan = streamed_plan(backend, program, [x, y, coef])
    assert [b.cut for b in plan.bindings] == [True, True, False, True], plan.bindings
    (out,) = backend.dispatch(program, [x, y, coef], STREAMED)
    np.testing.assert_allclose(out, coef[0] * x + y + coef[1], rtol=1e-6)
    backend.close()


def inplace_program():
    return Program(
        Kernel.cuda(_SRC.format(t="int") + "// inplace\n"),
        [BufferDecl.read_write("x", 0, "i32"), BufferDecl.read("t", 1, "i32", 3)],
        name="inplace",
        elementwise=True,
    )


def inplace_emulation(launch):
    n = int(launch.words(launch.arg(2), 1)[0])
    x = array_at(launch.arg(0), np.int32, n)
    t = array_at(launch.arg(1), np.int32, 3)
    x += t.sum(dtype=np.int32)


@scenario
def read_write_bindings_upload_and_read_back_each_chunk(fake):
    program = inplace_program()
    x, t = random(3001, np.int32), random(3, np.int32) // 4
    backend = backend_with(fake, program, [x, t], inplace_emulation, 400)
    assert streamed_plan(backend, program, [x, t]).chunk_count == 8
    (out,) = backend.dispatch(program, [x, t], STREAMED)
    np.testing.assert_array_equal(out, x + t.sum(dtype=np.int32))
    backend.close()


@scenario
def mixed_page_locked_and_pageable_buffers(fake):
    program = vecadd()
    n = 6000
    backend = backend_with(fake, program, [random(n), random(n)], vecadd_emulation(np.float32), 700)
    for pinned_a, pinned_b, pinned_out in ((1, 0, 0), (0, 1, 1), (1, 1, 1), (1, 1, 0), (0, 0, 1)):
        a = vc.pinned_empty(n, np.float32) if pinned_a else np.empty(n, np.float32)
        b = vc.pinned_empty(n, np.float32) if pinned_b else np.empty(n, np.float32)
        out = vc.pinned_empty(n, np.float32) if pinned_out else np.empty(n, np.float32)
        a[:], b[:], out[:] = random(n), random(n), np.nan
        before = backend.telemetry.snapshot()
        backend.dispatch_into(program, [a, b], [out], STREAMED)
        np.testing.assert_array_equal(out, a + b, err_msg=f"pinned {pinned_a, pinned_b, pinned_out}")
        after = backend.telemetry.snapshot()
        direct_in = after["direct_h2d_bytes"] - before["direct_h2d_bytes"]
        direct_out = after["direct_d2h_bytes"] - before["direct_d2h_bytes"]
        assert direct_in == 4 * n * (pinned_a + pinned_b), (direct_in, pinned_a, pinned_b)
        assert direct_out == 4 * n * pinned_out, (direct_out, pinned_out)
    backend.close()


@scenario
def device_outputs_are_filled_chunk_by_chunk(fake):
    program = vecadd()
    n = 5000
    a, b = random(n), random(n)
    backend = backend_with(fake, program, [a, b], vecadd_emulation(np.float32), 999)
    out = vc.DeviceArray._empty(n, np.dtype(np.float32), 0)
    array_at(out.__cuda_array_interface__["data"][0], np.float32, n)[:] = np.nan  # device memory is host here
    backend.dispatch_into(program, [a, b], [out], STREAMED)
    np.testing.assert_array_equal(out.copy_to_host(), a + b)
    backend.close()


# ------------------------------------------------------------------ async, threads, lifetimes
@scenario
def dispatch_async_consumes_inputs_before_it_returns(fake):
    program = vecadd()
    n = 9000
    backend = backend_with(fake, program, [random(n), random(n)], vecadd_emulation(np.float32), 1000)
    pending, want = [], []
    for _ in range(4):
        a, b = random(n), random(n)
        pending.append(backend.dispatch_async(program, [a, b], STREAMED))
        want.append(a + b)
        a[:] = np.nan  # clobbered after return: the dispatch took its bytes already
        b[:] = np.nan
    if LAZY:
        assert fake.lazy_pending() > 0, "lazy mode ran the last chunks before anything waited"
    np.testing.assert_array_equal(pending[0].result()[0], want[0])
    into = np.full(n, np.nan, np.float32)
    assert pending[1].result_into([into])[0] is into
    np.testing.assert_array_equal(into, want[1])
    a, b = random(n), random(n)
    timed = backend.dispatch_timed(program, [a, b], STREAMED)
    np.testing.assert_array_equal(timed.outputs[0], a + b)
    del pending[2]  # dropped un-awaited: waits, then recycles
    np.testing.assert_array_equal(pending[-1].result()[0], want[3])
    backend.close()


@scenario
def sixteen_in_flight_allocate_nothing_after_warm_up(fake):
    program = vecadd()
    n = 8000
    backend = backend_with(fake, program, [random(n), random(n)], vecadd_emulation(np.float32), 1000)

    def round_of_16():
        inputs = [(random(n), random(n)) for _ in range(16)]
        pending = [backend.dispatch_async(program, list(x), STREAMED) for x in inputs]
        for p, (a, b) in zip(pending, inputs):
            np.testing.assert_array_equal(p.result()[0], a + b)

    round_of_16()
    before = fake.stats()
    round_of_16()
    after = fake.stats()
    for k in ("device_alloc_calls", "host_alloc_calls", "stream_creates", "event_creates"):
        assert after[k] == before[k], (k, before[k], after[k])
    backend.close()


@scenario
def eight_threads_stream_correctly(fake):
    program = vecadd()
    n = 7000
    backend = backend_with(fake, program, [random(n), random(n)], vecadd_emulation(np.float32), 900)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(6):
                a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
                (out,) = backend.dispatch(program, [a, b], STREAMED)
                if not np.array_equal(out, a + b):
                    errors.append("wrong result")
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(int(RNG.integers(1 << 30)),)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    backend.close()


# ------------------------------------------------------------------ failures and budgets
@scenario
def a_fault_in_the_middle_of_the_stream_is_typed_and_leaves_the_backend_usable(fake):
    program = vecadd()
    n = 10_000
    backend = backend_with(fake, program, [random(n), random(n)], vecadd_emulation(np.float32), 1000)
    (out,) = backend.dispatch(program, [random(n), random(n)], STREAMED)  # warm: pools filled
    baseline = live(backend)
    for call in ("cuLaunchKernel", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuEventSynchronize"):
        fake.fail(call, "CUDA_ERROR_INVALID_VALUE", countdown=5)
        raises(vc.BackendError, backend.dispatch, program, [random(n), random(n)], STREAMED)
        fake.clear_failures()
        assert live(backend) == baseline, (call, live(backend), baseline)
        a, b = random(n), random(n)
        (out,) = backend.dispatch(program, [a, b], STREAMED)
        np.testing.assert_array_equal(out, a + b, err_msg=f"after a failed {call}")
    fake.fail("cuLaunchKernel", "CUDA_ERROR_ILLEGAL_ADDRESS", countdown=4, sticky=True)
    raises(vc.DeviceLost, backend.dispatch, program, [random(n), random(n)], STREAMED)
    fake.clear_failures()
    raises(vc.DeviceLost, backend.dispatch, program, [random(n), random(n)], STREAMED)
    backend.close()


@scenario
def a_budget_below_one_chunk_names_the_bytes_needed(fake):
    # (no chunk floor: a budget may cut the chunks down to one row)
    program = vecadd()
    n = 20_000
    a, b = random(n), random(n)
    backend = backend_with(fake, program, [a, b], vecadd_emulation(np.float32), 2000, min_chunk_bytes=0)
    err = raises(
        vc.ValidationError, backend.dispatch, program, [a, b], DispatchConfig(streamed=True, device_memory_budget=100)
    )
    assert "device_memory_budget=100" in err.message and "bytes are needed" in err.message, err.message
    budget = 40_000
    cfg = DispatchConfig(device_memory_budget=budget)  # streamed by the budget, not forced
    info = backend.plan_info(program, [a, b], cfg)
    assert info.route.kind == "streamed" and info.stream.device_bytes <= budget, info.stream
    assert info.stream.chunk_rows < 2000, info.stream  # cut below the tuning's chunks
    (out,) = backend.dispatch(program, [a, b], cfg)
    np.testing.assert_array_equal(out, a + b)
    backend.close()


def _smallest_budget(err) -> int:
    return int(err.fix.split(">= ")[1].removesuffix(", or None").replace(",", ""))


@scenario
def a_budget_below_the_chunk_floor_is_refused_with_the_budget_that_works(fake):
    program = vecadd()
    n = 20_000  # 240,000 bytes moved; chunks of 2000 rows move 24,000
    a, b = random(n), random(n)
    backend = backend_with(fake, program, [a, b], vecadd_emulation(np.float32), 2000, min_chunk_bytes=20_000)
    before = backend.telemetry.snapshot()
    err = raises(vc.ValidationError, backend.dispatch, program, [a, b], DispatchConfig(device_memory_budget=40_000))
    smallest = _smallest_budget(err)
    assert "device_memory_budget=40,000" in err.message and f"is {smallest:,} bytes" in err.message, err.message
    assert smallest > 40_000, err.message
    raises(vc.ValidationError, backend.dispatch, program, [a, b], DispatchConfig(device_memory_budget=smallest - 1))
    after = backend.telemetry.snapshot()
    assert after["streamed_dispatches"] == before["streamed_dispatches"], after  # refused before running
    cfg = DispatchConfig(device_memory_budget=smallest)
    info = backend.plan_info(program, [a, b], cfg)
    assert info.route.kind == "streamed" and info.stream.device_bytes <= smallest, info.stream
    assert info.stream.chunk_rows * 12 >= 20_000 and info.stream.streams == 3, info.stream
    a, b = random(n), random(n)
    (out,) = backend.dispatch(program, [a, b], cfg)
    np.testing.assert_array_equal(out, a + b)
    backend.close()
    # the planner's own floor (4 MiB, over this dispatch's bytes: one chunk), in a dispatch and
    # planned without a device: the same refusal
    cfg = DispatchConfig(device_memory_budget=40_000)
    with vc.CudaBackend(0) as plain:
        online = raises(vc.ValidationError, plain.dispatch, program, [a, b], cfg)
    offline = raises(vc.ValidationError, vc.plan, program, [a, b], cfg, device="H200")
    assert str(online) == str(offline) and "in one chunk" in online.message, (str(online), str(offline))
    assert _smallest_budget(online) > smallest


if __name__ == "__main__":
    fake = FakeDriver()
    if LAZY:
        fake.set_lazy(True)  # stream work runs only when something waits for it
    SCENARIOS.main(fake)
