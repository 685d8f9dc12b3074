"""DeviceGroup without a GPU: planning, ordering, work stealing, errors, lost devices, lifecycle.

The backends are fakes computing with numpy (tests/fakes.py); the queue, the threads and the
split planning are the real ones.
"""

from __future__ import annotations

import dataclasses
import gc
import pickle
import threading
import time

import fakes
import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import DeviceLost, DispatchConfig, ValidationError
from vyre_cuda import builtin_programs as bp
from vyre_cuda.group import DeviceGroup
from vyre_cuda.planning.split import plan_split


def _group(devices=(0, 1), **kw):
    factory = fakes.FakeFactory(**{k: kw.pop(k) for k in ("delay", "log_dir", "fail_devices") if k in kw})
    return DeviceGroup(list(devices), backend_factory=factory, **kw), factory


def _batches(rng, n, size=(1, 300)):
    return [[rng.random(int(rng.integers(*size)), dtype=np.float32)] for _ in range(n)]


def test_lazy_export():
    assert vc.DeviceGroup is DeviceGroup
    assert "DeviceGroup" in vc.__all__


# ---------------------------------------------------------------------------------- map
def test_map_returns_results_in_input_order(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 60)
    group, factory = _group(delay={0: 0.002, 1: 0.0003})
    with group:
        outs = group.map(prog, batches)
        assert len(outs) == 60
        for (x,), (out,) in zip(batches, outs):
            np.testing.assert_array_equal(out, x * 2)
        per = group.telemetry.per_device()
        # work stealing: the faster device took more items; every item ran once
        assert per[1]["group_items"] > per[0]["group_items"] >= 1
        total = group.telemetry.snapshot()
        assert total["group_items"] == 60 == total["dispatches"]
        assert total["devices"] == 2 and total["lost_devices"] == 0
        assert total["h2d_bytes"] == sum(b[0].nbytes for b in batches)


def test_map_of_nothing_and_one_device(rng):
    prog = fakes.scale_program()
    group, factory = _group(devices=[3])
    with group:
        assert group.map(prog, []) == []
        batches = _batches(rng, 5)
        outs = group.map(prog, batches)
        assert [o[0].tolist() for o in outs] == [(b[0] * 2).tolist() for b in batches]
        assert group.devices == (3,) and factory.made[0].device == 3


def test_threads_per_device_drive_one_backend_from_several_threads(rng):
    prog = fakes.scale_program()
    group, factory = _group(devices=[0], delay=0.003, threads_per_device=3)
    with group:
        group.map(prog, _batches(rng, 30))
        assert len(factory.made) == 1  # one backend per device, whatever the thread count
        assert len(factory.made[0].threads) == 3


def test_map_async_handle(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 20)
    group, _ = _group(delay=0.001)
    with group:
        handle = group.map_async(prog, batches)
        assert len(handle) == 20
        assert handle.wait(timeout=30) and handle.done()
        outs = handle.result()
        np.testing.assert_array_equal(outs[7][0], batches[7][0] * 2)
        assert handle.exceptions() == {}
        assert "20 items, done" in repr(handle)


def test_map_async_cancel_skips_items_not_started(rng):
    prog = fakes.scale_program()
    group, factory = _group(delay=0.02)
    with group:
        handle = group.map_async(prog, _batches(rng, 40))
        handle.cancel()
        handle.wait()
        with pytest.raises(ValidationError, match="cancelled") as info:
            handle.result()
        assert str(info.value).splitlines()[-1].startswith("Fix: ")
        ran = sum(b.dispatches for b in factory.made)
        assert ran < 40 and len(handle.exceptions()) == 40 - ran


def test_result_timeout_is_typed(rng):
    prog = fakes.scale_program()
    group, _ = _group(devices=[0], delay=0.05)
    with group:
        handle = group.map_async(prog, _batches(rng, 4))
        with pytest.raises(vc.DispatchFailed, match="still running") as info:
            handle.result(timeout=0.01)
        assert info.value.status == "timeout"
        assert len(handle.result()) == 4


def test_imap_unordered_yields_every_item_once_within_the_window(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 25)
    pulled = []

    def gen():
        for i, b in enumerate(batches):
            pulled.append(i)
            yield b

    group, _ = _group(delay={0: 0.002, 1: 0.0005})
    with group:
        seen = {}
        for index, (out,) in group.imap_unordered(prog, gen(), window=3):
            # never more than `window` batches queued, running or waiting to be yielded
            assert len(pulled) - len(seen) <= 3
            seen[index] = out
        assert sorted(seen) == list(range(25))
        for i, (x,) in enumerate(batches):
            np.testing.assert_array_equal(seen[i], x * 2)


def test_imap_unordered_early_exit_skips_the_rest(rng):
    prog = fakes.scale_program()
    group, factory = _group(delay=0.01)
    with group:
        it = group.imap_unordered(prog, _batches(rng, 50), window=4)
        next(it)
        it.close()  # cancels what no device started, waits for what runs
        ran = sum(b.dispatches for b in factory.made)
        time.sleep(0.05)
        assert sum(b.dispatches for b in factory.made) == ran < 50


# ---------------------------------------------------------------------------------- errors
def test_errors_carry_the_device_ordinal_and_item(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 12)
    batches[5][0][0] = fakes.BAD
    group, _ = _group(devices=[2, 5])
    with group:
        with pytest.raises(ValidationError) as info:
            group.map(prog, batches)
        err = info.value
        assert err.device in (2, 5) and err.item == 5
        assert str(err).startswith(f"device {err.device}, item 5: ")
        assert str(err).splitlines()[-1].startswith("Fix: ")
        assert isinstance(err.__cause__, ValidationError)  # the backend's own error
        clone = pickle.loads(pickle.dumps(err))  # errors travel (Dask) with the ordinal
        assert (type(clone), clone.device, clone.item, str(clone)) == (type(err), err.device, 5, str(err))

        results = group.map(prog, batches, return_exceptions=True)
        assert isinstance(results[5], ValidationError) and results[5].item == 5
        for i, (x,) in enumerate(batches):
            if i != 5:
                np.testing.assert_array_equal(results[i][0], x * 2)


def test_an_annotated_timeout_pickles_without_its_pending_dispatch(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 8)
    k = int(rng.integers(0, 8))
    batches[k][0][0] = fakes.STALL
    group, _ = _group(devices=[1, 4])
    with group, pytest.raises(vc.DispatchFailed) as info:
        group.map(prog, batches)
    err = info.value
    assert isinstance(err.pending, fakes.FakePending) and err.item == k  # still here, in-process
    clone = pickle.loads(pickle.dumps(err))  # as Dask sends it to the client
    assert type(clone) is vc.DispatchFailed and clone.pending is None
    assert (clone.device, clone.item, clone.status, clone.call, str(clone)) == (
        err.device,
        k,
        "timeout",
        "wait",
        str(err),
    )


def test_a_failed_item_skips_the_items_not_started(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 40)
    batches[0][0][0] = fakes.BAD
    group, factory = _group(devices=[0], delay=0.005)
    with group:
        with pytest.raises(ValidationError, match="BAD") as info:
            group.map(prog, batches)
        assert info.value.item == 0
        assert sum(b.dispatches for b in factory.made) < 39  # the rest was cancelled


def test_non_backend_errors_are_annotated(rng):
    class Broken(fakes.FakeBackend):
        def dispatch(self, program, inputs, config=None):
            raise RuntimeError("bug in a custom backend")

    group = DeviceGroup([4], backend_factory=lambda d: Broken(d))
    with group:
        with pytest.raises(RuntimeError) as info:
            group.map(fakes.scale_program(), _batches(rng, 2))
        assert info.value.device == 4
        assert any("device 4" in note for note in getattr(info.value, "__notes__", ["device 4"]))


def test_a_lost_device_fails_its_item_and_the_others_finish(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 40, size=(50, 60))
    batches[6][0][0] = fakes.FAULT
    group, factory = _group(delay=0.002)
    with group:
        results = group.map(prog, batches, return_exceptions=True)
        failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
        assert failed == [6]  # one thread per device: only the running item is lost
        err = results[6]
        assert isinstance(err, DeviceLost) and err.device in (0, 1)
        assert f"device {err.device}, item 6" in str(err)
        for i, (x,) in enumerate(batches):
            if i != 6:
                np.testing.assert_array_equal(results[i][0], x * 2)
        survivor = 1 - err.device
        assert group.lost_devices == (err.device,) and group.live_devices == (survivor,)
        per = group.telemetry.per_device()
        assert per[err.device]["lost"] and per[err.device]["group_failed_items"] == 1
        assert per[survivor]["group_items"] + per[err.device]["group_items"] == 39
        assert group.telemetry.snapshot()["lost_devices"] == 1
        assert "lost" in repr(group)

        # the group goes on with the device that is left
        outs = group.map(prog, batches[:6])
        assert all(np.array_equal(o[0], b[0] * 2) for o, b in zip(outs, batches))
        assert per[survivor]["group_items"] < group.telemetry.per_device()[survivor]["group_items"]

        # the last device lost: the queued items fail, then nothing more is accepted
        more = _batches(rng, 10, size=(50, 60))
        more[2][0][0] = fakes.FAULT
        results = group.map(prog, more, return_exceptions=True)
        assert isinstance(results[2], DeviceLost) and results[2].device == survivor
        rest = list(results[3:])
        assert all(isinstance(r, DeviceLost) and r.status == "group_lost" for r in rest)
        assert all(np.array_equal(results[i][0], more[i][0] * 2) for i in (0, 1))
        with pytest.raises(DeviceLost, match="every device of the group is lost") as info:
            group.map(prog, more[:1])
        assert str(info.value).splitlines()[-1].startswith("Fix: ")


def test_map_without_return_exceptions_raises_device_lost(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 8)
    batches[3][0][0] = fakes.FAULT
    group, _ = _group(devices=[0])
    with group:
        with pytest.raises(DeviceLost) as info:
            group.map(prog, batches)
        assert info.value.device == 0 and info.value.item == 3


# ---------------------------------------------------------------------------------- split
def test_dispatch_split_joins_the_chunks(rng):
    prog = bp.vecadd("f32")
    a = rng.random(1_000_003, dtype=np.float32)
    b = rng.random(1_000_003, dtype=np.float32)
    group, factory = _group(delay=0.001)
    with group:
        (out,) = group.dispatch_split(prog, [a, b], split=True, chunks=6)
        np.testing.assert_array_equal(out, a + b)
        assert sum(x.dispatches for x in factory.made) == 6
        assert all(x.dispatches >= 1 for x in factory.made)


def test_dispatch_split_broadcasts_static_inputs_and_writes_into_outputs(rng):
    prog = fakes.axpb_program()
    x = rng.random(5000, dtype=np.float32)
    y = rng.random(5000, dtype=np.float32)
    coef = np.array([3.5], np.float32)
    dst = np.zeros(5000, np.float32)
    group, _ = _group()
    with group:
        outs = group.dispatch_split(prog, [x, y, coef], split=["x", "y"], chunks=4, outputs=[dst])
        assert outs[0] is dst
        np.testing.assert_allclose(dst, 3.5 * x + y, rtol=1e-6)
        with pytest.raises(ValidationError, match="writeable C-contiguous float32 array of 5000"):
            group.dispatch_split(prog, [x, y, coef], split=True, outputs=[np.zeros(4999, np.float32)])


def test_dispatch_split_read_write_input_and_rows(rng):
    group, _ = _group()
    with group:
        x = rng.random((999, 3), dtype=np.float32)
        (out,) = group.dispatch_split(fakes.inplace_program(), [x], split="x", chunks=5)
        np.testing.assert_array_equal(out, (x + 1).reshape(-1))
        # bytes-like inputs are cut in whole elements of their declared dtype
        a = rng.random(4097, dtype=np.float32)
        (out,) = group.dispatch_split(bp.vecadd("f32"), [a.tobytes(), bytearray(a.tobytes())], split=True, chunks=3)
        np.testing.assert_array_equal(out, a + a)


def test_plan_split_chunks():
    prog = bp.vecadd("f32")
    big = np.zeros(10_000_000, np.float32)
    plan = plan_split(prog, [big, big], True, devices=2)
    assert len(plan.bounds) == 4  # two per device
    assert plan.bounds[0] == (0, 2_500_000) and plan.bounds[-1][1] == 10_000_000
    small = np.zeros(1000, np.float32)
    assert len(plan_split(prog, [small, small], True, devices=2).bounds) == 1  # below 1 MiB: one piece
    assert len(plan_split(prog, [big, big], True, devices=1).bounds) == 1
    plan = plan_split(prog, [big, big], True, devices=2, chunks=7, align=256)
    assert all(lo % 256 == 0 for lo, _ in plan.bounds)
    assert plan.bounds[-1][1] == 10_000_000
    covered = [i for lo, hi in plan.bounds for i in (lo, hi)]
    assert covered == sorted(covered)  # contiguous, in order, no overlap
    rows = np.zeros((1000, 4), np.float32)
    plan = plan_split(prog, [rows, rows], True, devices=2, chunks=3)
    assert plan.rows == 1000 and plan.outputs[0][2] == 4  # four output elements per row


def _declared(program, **kw):
    """``program`` with an elementwise declaration (same name: the fakes compute by name)."""
    return dataclasses.replace(program, **kw)


def test_dispatch_split_defaults_to_the_programs_declaration(rng):
    prog = _declared(fakes.axpb_program(), elementwise=["x", "y"], align=256)
    x = rng.random(10_000, dtype=np.float32)
    y = rng.random(10_000, dtype=np.float32)
    coef = np.array([-1.25], np.float32)
    group, factory = _group()
    with group:
        (out,) = group.dispatch_split(prog, [x, y, coef], chunks=7)  # no split=, no align=
        np.testing.assert_allclose(out, -1.25 * x + y, rtol=1e-6)
        assert sum(b.dispatches for b in factory.made) == 7
    plan = plan_split(prog, [x, y, coef], chunks=7)
    assert [kind for kind, _ in plan.inputs] == ["split", "split", "whole"]
    assert all(lo % 256 == 0 for lo, _ in plan.bounds) and plan.bounds[1][0] == 1536  # ceil(10000/7) up to 256
    assert plan.bounds[-1][1] == 10_000


def test_a_per_call_split_or_align_wins_over_the_declaration(rng):
    declared = _declared(bp.vecadd("f32"), elementwise=True, align=256)
    a = rng.random(10_000, dtype=np.float32)
    b = rng.random(10_000, dtype=np.float32)
    by_call = plan_split(declared, [a, b], chunks=7, align=100)
    assert by_call.bounds[1][0] == 1500 and all(lo % 100 == 0 for lo, _ in by_call.bounds)
    plain = plan_split(bp.vecadd("f32"), [a, b], True, chunks=7)  # the per-call declaration alone
    assert plain.bounds[1][0] == 1429
    group, _ = _group()
    with group:
        (out,) = group.dispatch_split(declared, [a, b], split=True, align=1, chunks=7)
        np.testing.assert_array_equal(out, a + b)
        refusals = ((False, r"not declared elementwise \(split=False\)"), (["a"], "input 'b' is not in split"))
        for split, match in refusals:
            with pytest.raises(ValidationError, match=match) as info:
                group.dispatch_split(declared, [a, b], split=split)
            assert str(info.value).splitlines()[-1].startswith("Fix: ")


def test_an_undeclared_program_is_refused_naming_both_declarations():
    f = np.zeros(64, np.float32)
    with pytest.raises(ValidationError, match="not declared elementwise") as info:
        plan_split(bp.vecadd("f32"), [f, f])
    assert "split=True" in info.value.fix and "Program(..., elementwise=True)" in info.value.fix
    with pytest.raises(ValidationError, match="split must be True, False or binding names") as info:
        plan_split(bp.vecadd("f32"), [f, f], 3)
    assert str(info.value).splitlines()[-1].startswith("Fix: pass split=True")


def test_dispatch_split_refuses_a_launch_sized_by_a_binding_it_does_not_cut():
    # the declaration's rule: a chunk's launch must cover the chunk
    prog = vc.Program(
        fakes.inplace_program().kernel,
        [vc.BufferDecl.read_write("x", 0, "f32"), vc.BufferDecl.read("y", 1, "f32")],
        launch="y",
    )
    f = np.zeros(64, np.float32)
    with pytest.raises(ValidationError, match="its launch is sized by 'y'") as info:
        plan_split(prog, [f, f], ["x"])
    assert info.value.fix == "add 'y' to split, or size the launch by a binding that is cut"
    assert [kind for kind, _ in plan_split(prog, [f, f], True).inputs] == ["split", "split"]


@pytest.mark.parametrize(
    "program, inputs, split, config, match",
    [
        (bp.vecadd("f32"), "two", None, None, "not declared elementwise"),
        (bp.vecadd("f32"), "two", False, None, "not declared elementwise"),
        (bp.inclusive_scan_u32(), "u32", True, None, "synchronises the whole grid"),
        (bp.vecadd("f32"), "two", True, DispatchConfig(cooperative=True), "synchronises the whole grid"),
        (bp.block_sum_u32(4), "u32", True, None, "has a static size"),
        (fakes.twice_and_sum_program(), "one", True, None, "'total' has a static size"),
        (bp.vecadd("f32"), "two", ["a", "nope"], None, "not a buffer of the program"),
        (fakes.axpb_program(), "axpb", ["x", "y", "coef"], None, "'coef', which has a static size"),
        (bp.vecadd("f32"), "two", ["a"], None, "input 'b' is not in split"),
        (bp.vecadd("f32"), "two", ["out"], None, "names no runtime-sized input"),
        (bp.vecadd("f32"), "ragged", True, None, "same number of rows"),
        (bp.vecadd("f32"), "empty", True, None, "0 rows"),
        (bp.vecadd("f32"), "one", True, None, "takes 2 input"),
    ],
)
def test_dispatch_split_refusals(program, inputs, split, config, match):
    f = np.zeros(64, np.float32)
    given = {
        "two": [f, f],
        "one": [f],
        "u32": [np.zeros(1024, np.uint32)],
        "axpb": [f, f, f[:1]],
        "ragged": [f, f[:63]],
        "empty": [f[:0], f[:0]],
    }[inputs]
    group, factory = _group()
    with group:
        with pytest.raises(ValidationError, match=match) as info:
            group.dispatch_split(program, given, config, split=split)
        assert str(info.value).splitlines()[-1].startswith("Fix: ")
        assert sum(b.dispatches for b in factory.made) == 0  # refused before anything ran


def test_dispatch_split_argument_checks():
    f = np.zeros(64, np.float32)
    prog = bp.vecadd("f32")
    for kw, match in ((dict(align=0), "align"), (dict(chunks=0), "chunks"), (dict(chunks=True), "chunks")):
        with pytest.raises(ValidationError, match=match):
            plan_split(prog, [f, f], True, devices=2, **kw)
    with pytest.raises(ValidationError, match="not C-contiguous"):
        plan_split(prog, [f[::2], f[::2]], True)
    with pytest.raises(ValidationError, match="0-d"):
        plan_split(prog, [np.array(1, np.float32)] * 2, True)
    with pytest.raises(ValidationError, match="not a multiple"):
        plan_split(prog, [b"abc", b"abc"], True)
    with pytest.raises(ValidationError, match="Program"):
        plan_split("vecadd", [f, f], True)


# ---------------------------------------------------------------------------------- lifecycle
@pytest.mark.parametrize(
    "devices, match",
    [
        (1, "sequence"),
        ("01", "sequence"),
        ([], "empty"),
        ([0, 0], "more than once"),
        ([-1], "non-negative"),
        ([0.0], "non-negative int"),
        (None, "cannot count"),
        (object(), "sequence"),
    ],
)
def test_device_list_checks(devices, match):
    with pytest.raises(ValidationError, match=match):
        DeviceGroup(devices, backend_factory=fakes.FakeFactory())


def test_constructor_argument_checks():
    with pytest.raises(ValidationError, match="threads_per_device"):
        DeviceGroup([0], backend_factory=fakes.FakeFactory(), threads_per_device=0)
    with pytest.raises(ValidationError, match="backend_options"):
        DeviceGroup([0], backend_factory=fakes.FakeFactory(), backend_options={"device_pool_bytes": 0})
    with pytest.raises(ValidationError, match="callable"):
        DeviceGroup([0], backend_factory=3)


def test_a_backend_that_cannot_be_created_closes_the_others():
    factory = fakes.FakeFactory(fail_devices=(1,))
    before = threading.active_count()
    with pytest.raises(DeviceLost) as info:
        DeviceGroup([0, 1, 2], backend_factory=factory, threads_per_device=2)
    assert info.value.device == 1 and str(info.value).startswith("device 1: ")
    assert all(b.closed for b in factory.made) and len(factory.made) == 2
    assert threading.active_count() == before  # every thread joined


def test_close_finishes_queued_work_then_refuses(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 20)
    group, factory = _group(delay=0.002)
    handle = group.map_async(prog, batches)
    group.close()
    assert handle.done() and len(handle.result()) == 20
    assert all(b.closed for b in factory.made)
    group.close()  # idempotent
    assert group.closed and "closed" in repr(group)
    with pytest.raises(ValidationError, match="closed"):
        group.map(prog, batches)


def test_a_dropped_group_is_shut_down():
    factory = fakes.FakeFactory()
    before = threading.active_count()
    group = DeviceGroup([0, 1], backend_factory=factory, threads_per_device=2)
    assert threading.active_count() == before + 4
    del group
    gc.collect()
    assert all(b.closed for b in factory.made)
    assert threading.active_count() == before


def test_backend_accessor_and_program_check():
    group, factory = _group(devices=[0, 7])
    with group:
        assert group.backend(7) is factory.made[1] or group.backend(7).device == 7
        assert len(group) == 2
        with pytest.raises(ValidationError, match="not in this group"):
            group.backend(3)
        with pytest.raises(ValidationError, match="Program"):
            group.map("not a program", [])
        with pytest.raises(ValidationError, match="window"):
            group.imap_unordered(fakes.scale_program(), [], window=0)
        group.telemetry.reset()
        assert group.telemetry["group_items"] == 0


def test_map_into_the_callers_arrays(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 10)
    dsts = [[np.empty_like(b[0])] for b in batches]
    group, _ = _group()
    with group:
        outs = group.map(prog, batches, outputs=dsts)
        for (x,), (dst,), (out,) in zip(batches, dsts, outs):
            assert out is dst
            np.testing.assert_array_equal(dst, x * 2)
        with pytest.raises(ValidationError, match="1 list"):
            group.map(prog, batches, outputs=dsts[:1])


def test_sibling_threads_of_a_lost_device_retire(rng):
    prog = fakes.scale_program()
    batches = _batches(rng, 6, size=(50, 60))
    batches[0][0][0] = fakes.FAULT
    group, _ = _group(devices=[0], threads_per_device=3)
    with group:
        results = group.map(prog, batches, return_exceptions=True)
        assert isinstance(results[0], DeviceLost) and results[0].device == 0
        # the other items either ran before the loss was seen, or failed with it; none is stuck
        assert all(isinstance(r, (list, DeviceLost)) for r in results)
        deadline = time.monotonic() + 5
        while group._state.live_threads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert group._state.live_threads == 0
        with pytest.raises(DeviceLost, match="every device of the group is lost"):
            group.map(prog, batches[1:2])
