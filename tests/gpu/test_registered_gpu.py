"""numpy memory registered in place on a real GPU: results against numpy when registered arrays
are freed, reallocated at the same address, viewed and (refused) resized; the automatic policy;
several threads and two backends sharing registrations; async dispatches on memory only the
policy registered. The fake-driver scenarios (tests/test_registered_host.py) cover the refusals."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import _hostreg
from vyre_cuda import builtin_programs as bp

MIB = 1 << 20
N = 8 * MIB // 4  # 8 MiB per float32 buffer: through the staging ring when pageable
VECADD = bp.vecadd_f32()
STREAMED = vc.DispatchConfig(streamed=True)
AT_ONCE = vc.AutoRegister(min_bytes=MIB, after=1, background=False)


def fresh(rng, n=N):
    """Random float32 values in memory of their own pages. A plain array may share its edge pages
    with a heap neighbour (once glibc's malloc has raised its mmap threshold, 8 MiB arrays come
    from the heap), and the second of two neighbours to register falls back to staging."""
    page = _hostreg.PAGE
    root = np.empty(n * 4 + 2 * page, np.uint8)
    offset = -root.ctypes.data % page
    x = root[offset : offset + n * 4].view(np.float32)
    x[:] = rng.standard_normal(n)
    return x


def elementwise():
    import dataclasses

    return dataclasses.replace(VECADD, name="vecadd_elementwise", elementwise=True)


def test_registered_arrays_move_directly_and_stay_right(rng):
    with vc.CudaBackend(0) as gpu:
        a, b, out = fresh(rng), fresh(rng), fresh(rng)
        with gpu.register(a, b, out):
            assert all(vc.is_page_locked(x) for x in (a, b, out)), vc.registered_stats()
            gpu.telemetry.reset()
            for _ in range(3):
                a[:], b[:] = fresh(rng), fresh(rng)
                gpu.dispatch_into(VECADD, [a, b], [out])
                np.testing.assert_array_equal(out, a + b)
            snap = gpu.telemetry.snapshot()
            assert snap["direct_h2d_bytes"] == 3 * (a.nbytes + b.nbytes), snap
            # only the params block (a few bytes per dispatch: 48 over these 3 on an H100) is staged
            assert snap["staged_h2d_bytes"] < 3 * 1024, snap
            assert snap["direct_d2h_bytes"] == 3 * out.nbytes, snap
            with pytest.raises(ValueError, match="resize"):
                a.resize(2 * N)
            view = a[N // 2 :]
            with gpu.register(view):  # a view: inside a's registration
                (got,) = gpu.dispatch(VECADD, [view, b[N // 2 :]])
                np.testing.assert_array_equal(got, view + b[N // 2 :])
            assert vc.is_page_locked(a)
        assert not any(vc.is_page_locked(x) for x in (a, b, out))
        gpu.dispatch_into(VECADD, [a, b], [out])  # staged again
        np.testing.assert_array_equal(out, a + b)


def test_the_policy_survives_freed_and_reallocated_arrays(rng):
    before = vc.registered_stats()
    with vc.CudaBackend(0, auto_register=AT_ONCE) as gpu:
        for round_ in range(6):
            # a new array each round: often at the address the last one had
            a, b = fresh(rng), fresh(rng)
            for _ in range(3):
                (out,) = gpu.dispatch(VECADD, [a, b])
                np.testing.assert_array_equal(out, a + b, err_msg=f"round {round_}")
            assert vc.is_page_locked(a), vc.registered_stats()
            address = a.ctypes.data
            del a, out
            gc.collect()
            assert vc.registered_stats()["registered_ranges"] <= 1  # (b's, if it registered)
            again = fresh(rng)  # maybe at the same address: pageable, unregistered
            if again.ctypes.data == address:
                assert not vc.is_page_locked(again)
            (out,) = gpu.dispatch(VECADD, [again, b])
            np.testing.assert_array_equal(out, again + b)
            del again, b, out
            gc.collect()
    after = vc.registered_stats()
    assert after["registered_ranges"] == 0
    assert after["registrations"] - before["registrations"] >= 6
    assert after["unregistrations"] - before["unregistrations"] == after["registrations"] - before["registrations"]


def test_the_default_policy_registers_on_a_worker_and_survives_owners_dying_meanwhile(rng):
    # the default rule: a buffer seen again is registered on the worker thread; the dispatches
    # stay right while it runs, move the buffers directly once it is done, and an array freed
    # while its registration runs is unregistered before numpy frees it
    before = vc.registered_stats()
    with vc.CudaBackend(0, auto_register=True) as gpu:
        a, b = fresh(rng, 16 * N), fresh(rng, 16 * N)  # 128 MiB each: a register call of some ms
        for _ in range(2):
            (out,) = gpu.dispatch(VECADD, [a, b])
            np.testing.assert_array_equal(out, a + b)
        del a, out  # freed while its registration may still run on the worker
        gc.collect()
        for _ in range(8):
            c = fresh(rng, 16 * N)  # maybe at a's address
            (out,) = gpu.dispatch(VECADD, [c, b])
            np.testing.assert_array_equal(out, c + b)
            del c, out
        _hostreg.REGISTRY._settle(lambda p: True)
        assert vc.is_page_locked(b), vc.registered_stats()
        gpu.telemetry.reset()
        c = fresh(rng, 16 * N)
        (out,) = gpu.dispatch(VECADD, [c, b])
        np.testing.assert_array_equal(out, c + b)
        assert gpu.telemetry.snapshot()["direct_h2d_bytes"] >= b.nbytes, gpu.telemetry.snapshot()
        del b, c, out
    gc.collect()
    after = vc.registered_stats()
    assert after["registered_ranges"] == 0 and after["registering"] == 0, after
    assert after["unregistrations"] - before["unregistrations"] == after["registrations"] - before["registrations"]


def test_async_dispatches_copy_what_only_the_policy_registered(rng):
    with vc.CudaBackend(0, auto_register=AT_ONCE) as gpu:
        a, b = fresh(rng), fresh(rng)
        gpu.dispatch(VECADD, [a, b])
        assert vc.is_page_locked(a)
        for _ in range(20):
            want = a + b
            pending = gpu.dispatch_async(VECADD, [a, b])
            a[:] = fresh(rng)  # reused at once, as a pageable input may be
            np.testing.assert_array_equal(pending.result()[0], want)


def test_threads_and_two_backends_share_registrations(rng):
    twin = elementwise()
    backends = [vc.CudaBackend(0, auto_register=AT_ONCE), vc.CudaBackend(0, auto_register=AT_ONCE), vc.CudaBackend(0)]
    shared = [(fresh(rng), fresh(rng))]
    errors: list[str] = []
    stop = threading.Event()
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(k):
        local = np.random.default_rng(k)
        try:
            for i in range(30):
                gpu = backends[(k + i) % 3]
                a, b = shared[0] if i % 2 else (fresh(local), fresh(local))
                if i % 5 == 0:
                    with gpu.register(a, b):
                        (out,) = gpu.dispatch(VECADD, [a, b])
                elif i % 3 == 0:
                    out = np.empty_like(a)
                    gpu.dispatch_into(twin, [a, b], [out], STREAMED)
                elif i % 7 == 0:
                    gpu.dispatch_async(VECADD, [a, b])  # dropped
                    continue
                else:
                    (out,) = gpu.dispatch_async(VECADD, [a, b]).result()
                if not np.array_equal(out, a + b):
                    errors.append(f"thread {k} step {i}: wrong result")
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(f"thread {k}: {exc!r}")

    def trimmer():
        while not stop.is_set():
            for gpu in backends[:2]:
                gpu.trim()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    side = threading.Thread(target=trimmer)
    try:
        side.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        side.join()
        sys.setswitchinterval(old)
        for gpu in backends:
            gpu.close()
    assert not errors, errors[:5]
    shared.clear()
    gc.collect()
    assert vc.registered_stats()["registered_ranges"] == 0, vc.registered_stats()


def test_copy_to_host_into_memory_that_starts_in_a_registered_page(rng):
    # registration is page-granular: memory that starts in a registered array's last page and runs
    # past it is refused by one driver copy (CUDA_ERROR_INVALID_VALUE); copy_to_host cuts its copy
    page = _hostreg.PAGE
    root = np.empty(8 * page, np.uint8)
    base = -root.ctypes.data % page
    mine = root[base : base + 2 * page - 96].view(np.float32)
    neighbour = root[base + 2 * page - 64 : base + 5 * page - 64].view(np.float32)
    x, y = fresh(rng, neighbour.size), fresh(rng, neighbour.size)
    with vc.CudaBackend(0) as gpu:
        (dev,) = gpu.dispatch(VECADD, [x, y], vc.DispatchConfig(outputs="device"))
        with gpu.register(mine):
            assert vc.is_page_locked(mine) and not vc.is_page_locked(neighbour)
            assert dev.copy_to_host(out=neighbour) is neighbour
            np.testing.assert_array_equal(neighbour, x + y)
