"""DeviceGroup stress on one GPU: groups of 1, 2 and 4 threads on device 0, two groups in one
process driven at once, ``map``, ``imap_unordered`` and ``dispatch_split`` (streamed), and a
``close()`` while work is queued. Every output is checked against numpy on fresh random data; a
wrong output or a crash fails, and work cut short by ``close()`` must end in a typed error, never
in wrong data. (The two-GPU run of the same is separate: it needs a machine with two devices.)

``VYRE_CUDA_GROUP_STRESS_ITEMS`` sets the item count per configuration (default 1,200).
"""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp

ITEMS = int(os.environ.get("VYRE_CUDA_GROUP_STRESS_ITEMS", "1200"))
PROG = bp.vecadd("f32")
STREAMED = dataclasses.replace(PROG, elementwise=True, name="vecadd_f32_elementwise")  # rows independent


def _batches(rng, count, low=64, high=16_384):
    return [
        (rng.standard_normal(int(n)).astype(np.float32), rng.standard_normal(int(n)).astype(np.float32))
        for n in rng.integers(low, high, count)
    ]


def _check(batches, outs):
    wrong = 0
    for (a, b), (out,) in zip(batches, outs):
        wrong += not np.array_equal(out, a + b)
    return wrong


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_group_map_and_imap_on_one_device(rng, threads):
    with vc.DeviceGroup([0], threads_per_device=threads) as group:
        batches = _batches(rng, ITEMS)
        assert _check(batches, group.map(PROG, batches)) == 0
        batches = _batches(rng, ITEMS)
        seen, wrong = set(), 0
        for index, (out,) in group.imap_unordered(PROG, iter(batches), window=4 * threads):
            a, b = batches[index]
            wrong += not np.array_equal(out, a + b)
            seen.add(index)
        assert wrong == 0 and seen == set(range(ITEMS))
        # a few large items through the same threads (the ring, then the streamed route)
        large = _batches(rng, 3, 8 << 20, (8 << 20) + 4096)
        assert _check(large, group.map(PROG, large)) == 0
        per = group.telemetry.per_device()[0]
        assert per["group_failed_items"] == 0 and not per["lost"]


def test_dispatch_split_streamed_on_one_device(rng):
    n = 64 << 20  # 256 MiB per buffer: chunks of the elementwise twin large enough to stream
    a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    with vc.DeviceGroup([0], threads_per_device=2) as group:
        (out,) = group.dispatch_split(STREAMED, [a, b], split=["a", "b"])
        np.testing.assert_array_equal(out, a + b)
        assert group.telemetry.snapshot()["streamed_dispatches"] >= 1


def test_two_groups_in_one_process_at_once(rng):
    seeds = rng.integers(0, 2**31, 2)
    wrong, errors = [0, 0], []

    def drive(k):
        local = np.random.default_rng(int(seeds[k]))
        try:
            with vc.DeviceGroup([0], threads_per_device=2) as group:
                for _ in range(2):
                    batches = _batches(local, ITEMS // 2)
                    wrong[k] += _check(batches, group.map(PROG, batches))
        except BaseException as exc:  # noqa: BLE001 (reported below, with the thread)
            errors.append(f"group {k}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=drive, args=(k,)) for k in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
    assert not any(w.is_alive() for w in workers), "a group did not finish"
    assert errors == [] and wrong == [0, 0], (errors, wrong)


def test_close_during_work_gives_right_outputs_or_a_typed_error(rng):
    group = vc.DeviceGroup([0], threads_per_device=4)
    batches = _batches(rng, ITEMS, 4096, 1 << 18)
    handle = group.map_async(PROG, batches)
    group.close()  # while the items are queued: finishes what was queued, then closes
    try:
        outs = handle.result(timeout=120)
    except vc.BackendError:
        outs = None  # cut short: a typed error, nothing wrong returned
    if outs is not None:
        assert _check(batches, outs) == 0
    with pytest.raises(vc.BackendError):
        group.map(PROG, batches[:1])
    assert group.closed
