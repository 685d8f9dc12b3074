"""Child of tests/test_registered_host.py: numpy memory registered in place (vyre_cuda._hostreg) on
a real CudaBackend over the fake driver, which refuses overlapping registrations as the real one
does and counts the async copies whose host side lies in a registered range.

Every scenario checks results against numpy on fresh random data, and that the driver's registered
ranges are back to what they were at its end. Prints one JSON object (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time

import numpy as np
from helpers.scenarios import Scenarios, raises

import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import _hostreg, _windows
from vyre_cuda import builtin_programs as bp

VECADD = bp.vecadd_f32()
N = 1 << 18  # 1 MiB per float32 buffer: crosses the staging ring
SCENARIOS = Scenarios()
scenario = SCENARIOS.register
RNG = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
PAGE = _hostreg.PAGE
# registers inside the dispatch that first sees a buffer (the lifetime scenarios below are about
# what happens once a range is in the table; those of the worker thread come after them)
AT_ONCE = vc.AutoRegister(min_bytes=64 << 10, after=1, background=False)
THIRD = vc.AutoRegister(min_bytes=64 << 10, after=3, background=False)
# the default rule (a buffer seen again, registered on the worker thread), from 64 KiB
WORKER = vc.AutoRegister(min_bytes=64 << 10)


def backend_on(fake, **kw):
    backend = vc.CudaBackend(0, **kw)
    a, b = pair()
    fake.emulate(backend, VECADD, [a, b], vecadd_emulation(np.float32))
    return backend


def pair(n=N):
    return RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)


def aligned(n=N):
    """Random float32 values whose memory starts and ends on page boundaries: no other array
    shares their pages (heap neighbours that share an edge page overlap each other's span, and
    the second to register falls back; see the scenario on overlaps)."""
    root = np.empty(n * 4 + 2 * PAGE, np.uint8)
    offset = -root.__array_interface__["data"][0] % PAGE
    x = root[offset : offset + n * 4].view(np.float32)
    x[:] = RNG.standard_normal(n)
    return x


def aligned_pair(n=N):
    return aligned(n), aligned(n)


def span(x) -> int:
    address = x.__array_interface__["data"][0]
    return ((address + x.nbytes + PAGE - 1) & ~(PAGE - 1)) - (address & ~(PAGE - 1))


def check(backend, a, b, into=None):
    if into is None:
        (out,) = backend.dispatch(VECADD, [a, b])
    else:
        (out,) = backend.dispatch_into(VECADD, [a, b], [into])
    assert np.array_equal(out, a + b), "vecadd gave a wrong result"
    return out


def settled(fake, before):
    """Nothing registered is left, in the driver and in the registry."""
    gc.collect()
    stats = fake.stats()
    assert stats["registered"] == before["registered"], (stats["registered"], before["registered"])
    assert stats["registered_bytes"] == before["registered_bytes"], stats["registered_bytes"]
    assert vc.registered_stats()["registered_ranges"] == 0, vc.registered_stats()


def counts():
    s = vc.registered_stats()
    return {k: s[k] for k in ("registrations", "unregistrations", "hits", "fallbacks")}


def delta(before):
    now = counts()
    return {k: now[k] - before[k] for k in now}


# ------------------------------------------------------------------ explicit registration
@scenario
def the_registry_calls_the_driver_in_a_context_it_retains(fake):
    """The registry serves every backend, on whatever thread releases or trims, so it never makes
    a backend's context current: that backend may close meanwhile, and once the last retain of the
    primary context is released the handle is gone (the fake flags making it current again; an
    H100 stress run faulted in cuCtxSynchronize on one). It retains the primary context for each
    call, and makes none where none exists."""
    from vyre_cuda import _driver

    gc.collect()
    base = fake.stats()
    backend = backend_on(fake)
    a, b = aligned_pair()
    busy = _hostreg.REGISTRY.holder(0, lambda: True)  # a holder with work in flight, always
    with backend.register(a, b):
        check(backend, a, b)
    # the release synchronized device 0 for the busy holder, through a retain it gave back
    assert not vc.is_page_locked(a)
    assert fake.stats()["context_refs"] == base["context_refs"] + 1  # the backend's own
    backend.close()
    # (the first scenario: no backend of another one is open) device 0's primary context is gone
    assert base["context_refs"] == 0 and fake.stats()["context_refs"] == 0, base["context_refs"]
    _driver.device_synchronize(0)  # no context: no work to wait for, and none is made
    assert _driver.host_unregister(0, a.__array_interface__["data"][0]) == 0
    assert fake.stats()["context_refs"] == 0
    assert fake.stats()["violations"] == base["violations"], fake.last_violation()
    del busy
    settled(fake, base)


@scenario
def register_pages_the_span_and_the_dispatch_dmas_directly(fake):
    backend = backend_on(fake)
    before, c0 = fake.stats(), counts()
    a, b = aligned_pair()
    out = aligned()
    fake.reset_counters()
    check(backend, a, b, out)
    assert fake.stats()["htod_registered"] == 0  # staged: nothing registered yet
    with backend.register(a, b, out) as held:
        assert held == (a, b, out)
        assert all(vc.is_page_locked(x) for x in (a, b, out))
        want = sum(span(x) for x in (a, b, out))
        assert fake.stats()["registered_bytes"] - before["registered_bytes"] == want
        for _ in range(3):
            a[:], b[:] = pair()
            check(backend, a, b, out)
        stats = fake.stats()
        assert stats["htod_registered"] >= 6 and stats["dtoh_registered"] >= 3, stats
    assert not any(vc.is_page_locked(x) for x in (a, b, out))
    assert delta(c0) == {"registrations": 3, "unregistrations": 3, "hits": 0, "fallbacks": 0}, delta(c0)
    check(backend, a, b, out)  # staged again, still right
    backend.close()
    settled(fake, before)


@scenario
def a_registered_array_can_be_neither_resized_nor_its_bytearray_grown(fake):
    backend = backend_on(fake)
    before = fake.stats()
    a, b = aligned_pair()
    raw = bytearray(b.tobytes())
    view = np.frombuffer(raw, np.float32)  # memory numpy does not own
    with backend.register(a, view):
        check(backend, a, view)
        assert "cannot resize" in str(raises(ValueError, a.resize, (2 * N,)))
        raises(BufferError, raw.extend, b"\0" * PAGE)
    del view
    raw.extend(b"\0" * PAGE)  # free to grow once the block is over
    backend.close()
    settled(fake, before)


@scenario
def views_and_nested_blocks_share_their_owners_range(fake):
    backend = backend_on(fake)
    before, c0 = fake.stats(), counts()
    big = aligned(2 * N)
    b = RNG.standard_normal(N).astype(np.float32)
    with backend.register(big):
        with backend.register(big[N:]) as tail:  # inside the owner's range: a hit, no new range
            check(backend, tail, b)
            assert delta(c0) == {"registrations": 1, "unregistrations": 0, "hits": 1, "fallbacks": 0}, delta(c0)
        assert vc.is_page_locked(big), "the inner block's end unregistered the outer one's range"
        check(backend, big[:N], b)
    assert not vc.is_page_locked(big) and delta(c0)["unregistrations"] == 1
    backend.close()
    settled(fake, before)


@scenario
def two_backends_share_one_counted_range(fake):
    one, two = backend_on(fake), backend_on(fake)
    before, c0 = fake.stats(), counts()
    a, b = aligned_pair()
    with one.register(a):
        with two.register(a):
            check(one, a, b)
            check(two, a, b)
        assert vc.is_page_locked(a), "the second backend's block ended the first's registration"
    assert not vc.is_page_locked(a)
    assert delta(c0) == {"registrations": 1, "unregistrations": 1, "hits": 1, "fallbacks": 0}, delta(c0)
    # a close ends the blocks still open: their exits then do nothing
    block = one.register(a)
    block.__enter__()
    one.close()
    assert not vc.is_page_locked(a)
    block.__exit__(None, None, None)
    check(two, a, b)
    two.close()
    settled(fake, before)


@scenario
def an_unregister_waits_for_direct_copies_and_dispatches_stage_meanwhile(fake):
    """The direct gate (vyre_cuda._windows): a dispatch that may DMA straight from registered
    memory holds it until its copies are enqueued (a blocking one, through its readbacks); an
    unregister closes it and waits for those holders; a dispatch that finds it closing stages."""
    one, two = backend_on(fake), backend_on(fake)
    before = fake.stats()
    a, b = aligned_pair()
    out = aligned()
    waited = threading.Event()
    with one.register(a, b, out):
        fake.lib.fake_cuda_hold(1)  # the GPU is busy: the blocking dispatch waits, holding the gate
        try:
            failed: list[BaseException] = []

            def run():
                try:
                    check(two, a, b, out)
                except BaseException as exc:  # noqa: BLE001 (reported below)
                    failed.append(exc)

            worker = threading.Thread(target=run)
            worker.start()
            deadline = time.monotonic() + 10
            while _windows.direct_gate_state()[0] == 0:
                assert time.monotonic() < deadline, "the dispatch never took the gate"
                time.sleep(0.001)
            closer = threading.Thread(target=lambda: _windows.close_direct_gate() and waited.set())
            closer.start()
            while _windows.direct_gate_state()[1] == 0:
                time.sleep(0.001)
            time.sleep(0.05)
            assert not waited.is_set(), "the gate closed under a dispatch that held it"
        finally:
            fake.lib.fake_cuda_hold(0)
        worker.join()
        closer.join()
        assert not failed, failed
        assert waited.is_set()
        # closed (no holder now): a dispatch stages, even from memory the caller registered
        fake.reset_counters()
        late = one.dispatch_async(VECADD, [a, b])
        stats = fake.stats()
        assert stats["htod_registered"] == 0 and stats["htod_copies"] > 0, stats
        assert np.array_equal(late.result()[0], a + b)
        _windows.open_direct_gate()
        assert _windows.direct_gate_state() == (0, 0)
        fake.reset_counters()
        check(one, a, b, out)  # open again: straight from the registered arrays
        assert fake.stats()["htod_registered"] >= 2, fake.stats()
        one.telemetry.reset()
        assert np.array_equal(one.dispatch_async(VECADD, [a, b]).result()[0], a + b)
        snap = one.telemetry.snapshot()  # an async dispatch's direct bytes are counted as direct
        assert snap["direct_h2d_bytes"] == a.nbytes + b.nbytes, snap
    one.close()
    two.close()
    assert fake.stats()["violations"] == before["violations"], fake.last_violation()
    settled(fake, before)


@scenario
def page_locked_arrays_are_used_as_they_are(fake):
    backend = backend_on(fake)
    before, c0 = fake.stats(), counts()
    a = vc.pinned_empty(N, np.float32)  # (a pinned block: nothing to register)
    a[:] = RNG.standard_normal(N)
    _, b = pair()
    with backend.register(a):
        check(backend, a, b)
    assert delta(c0) == {"registrations": 0, "unregistrations": 0, "hits": 0, "fallbacks": 0}, delta(c0)
    assert vc.is_page_locked(a)
    del a
    backend.close()
    settled(fake, before)


# ------------------------------------------------------------------ refusals fall back to staging
@scenario
def arrays_that_share_a_page_register_the_first_and_stage_the_second(fake):
    backend = backend_on(fake)
    before, c0 = fake.stats(), counts()
    root = aligned(2 * N + PAGE)
    a, b = root[: N + 100], root[N + 100 : 2 * N + 100]  # one page holds the end of a and the start of b
    with backend.register(a, b):
        assert vc.is_page_locked(a) and not vc.is_page_locked(b)
        check(backend, a[:N], b[:N])
    reasons = vc.registered_stats()["fallback_reasons"]
    assert delta(c0)["fallbacks"] == 1 and reasons.get("overlaps a registered range", 0) >= 1, reasons
    backend.close()
    settled(fake, before)


@scenario
def a_span_overlapping_a_range_still_being_unregistered_is_refused(fake):
    """A released range leaves the table before its unregister runs (outside the lock, after the
    gate and the GPU): until then the driver still has it registered, so a span overlapping it is
    refused as overlapping, as one overlapping a range in the table is, not registered beside it."""
    backend = backend_on(fake)
    before, c0 = fake.stats(), counts()
    root = aligned(2 * N + PAGE)
    a, b = root[: N + 100], root[N + 100 : 2 * N + 100]  # one page holds the end of a and the start of b
    reg = _hostreg.REGISTRY
    with backend.register(a):
        start, end = _hostreg.page_span(a.__array_interface__["data"][0], a.nbytes)
        with reg._lock:
            r = reg._containing(start, end)
            leave = reg._detach(r)  # as a release does: out of the table, unregistered later
        assert r is not None and leave is not None and vc.is_page_locked(a)
        b_start, b_end = _hostreg.page_span(b.__array_interface__["data"][0], b.nbytes)
        with reg._lock:
            admitted = reg._admit(b_start, b_end, b.__array_interface__["data"][0], b.nbytes, root, auto=True)
        assert not admitted, "a span overlapping a leaving (still registered) range was admitted"
        assert vc.registered_stats()["fallback_reasons"].get("overlaps a registered range", 0) >= 1
        reg._unregister_live([(r, leave)])  # the release's unregister, as it runs after the gate
        assert not vc.is_page_locked(a)
    assert delta(c0)["registrations"] == delta(c0)["unregistrations"] == 1, delta(c0)
    backend.close()
    settled(fake, before)


@scenario
def a_budget_too_small_leaves_the_buffer_to_staging(fake):
    backend = backend_on(fake)
    before, c0 = fake.stats(), counts()
    budget = vc.registered_stats()["budget_bytes"]
    vc.set_registered_budget(span(pair()[0]) - PAGE)
    try:
        a, b = pair()
        with backend.register(a):
            assert not vc.is_page_locked(a)
            check(backend, a, b)
    finally:
        vc.set_registered_budget(budget)
    assert delta(c0)["fallbacks"] == 1 and vc.registered_stats()["fallback_reasons"].get("budget", 0) >= 1
    err = raises(vc.ValidationError, vc.set_registered_budget, -1)
    assert "-1" in err.message and err.fix, err
    backend.close()
    settled(fake, before)


@scenario
def a_driver_refusal_leaves_the_buffer_to_staging(fake):
    backend = backend_on(fake)
    before, c0 = fake.stats(), counts()
    a, b = pair()
    fake.fail("cuMemHostRegister", "CUDA_ERROR_OUT_OF_MEMORY")
    with backend.register(a):
        assert not vc.is_page_locked(a)
        check(backend, a, b)
    assert delta(c0)["fallbacks"] == 1
    assert vc.registered_stats()["fallback_reasons"].get("CUDA_ERROR_OUT_OF_MEMORY", 0) >= 1
    # memory the caller registered itself, overlapping in part: the driver refuses, staged
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
    start = a.__array_interface__["data"][0] & ~(PAGE - 1)
    assert lib.cuMemHostRegister(start + 8 * PAGE, PAGE, 0) == 0
    try:
        with backend.register(a):
            check(backend, a, b)
        assert vc.registered_stats()["fallback_reasons"].get("already registered", 0) >= 1
    finally:
        assert lib.cuMemHostUnregister(start + 8 * PAGE) == 0
    err = raises(vc.ValidationError, backend.register(object()).__enter__)
    assert "register()" in err.message and err.fix, err
    err = raises(vc.ValidationError, backend.register().__enter__)
    assert err.fix, err
    backend.close()
    settled(fake, before)


# ------------------------------------------------------------------ the automatic policy
@scenario
def the_policy_registers_once_it_pays_and_unregisters_before_numpy_frees(fake):
    backend = backend_on(fake, auto_register=THIRD)
    before, c0 = fake.stats(), counts()
    a, b = aligned_pair()
    out = aligned()
    for k in range(2):  # two sightings: not paid yet
        check(backend, a, b, out)
        assert not vc.is_page_locked(a), k
    check(backend, a, b, out)  # the third pays: registered, then moved directly
    assert all(vc.is_page_locked(x) for x in (a, b, out)), counts()
    assert delta(c0)["registrations"] == 3
    fake.reset_counters()
    a[:], b[:] = pair()
    check(backend, a, b, out)
    assert fake.stats()["htod_registered"] >= 2 and fake.stats()["dtoh_registered"] >= 1, fake.stats()
    assert "cannot resize" in str(raises(ValueError, a.resize, (2 * N,)))  # weakly referenced
    held = fake.stats()["registered"]
    del a  # the owner dies: unregistered before numpy frees its memory
    assert fake.stats()["registered"] == held - 1 and delta(c0)["unregistrations"] == 1
    # new memory, maybe at the same address: counted afresh, and right
    a, _ = pair()
    check(backend, a, b, out)
    assert not vc.is_page_locked(a)
    del a, b, out
    backend.close()
    settled(fake, before)


@scenario
def the_policy_leaves_memory_numpy_does_not_own_and_small_buffers(fake):
    backend = backend_on(fake, auto_register=AT_ONCE)
    before, c0 = fake.stats(), counts()
    a, b = pair()
    raw = bytearray(a.tobytes())
    view = np.frombuffer(raw, np.float32)
    for _ in range(3):
        check(backend, view, b)
    assert not vc.is_page_locked(view)
    assert vc.registered_stats()["fallback_reasons"].get("not owned by numpy", 0) >= 3
    small_a, small_b = pair(1000)
    fake.emulate(backend, VECADD, [small_a, small_b], vecadd_emulation(np.float32))
    regs = counts()["registrations"]
    for _ in range(3):
        check(backend, small_a, small_b)
    assert counts()["registrations"] == regs and not vc.is_page_locked(small_a)
    del b
    err = raises(vc.ValidationError, vc.CudaBackend, 0, auto_register="yes")
    assert "auto_register" in err.message and err.fix, err
    err = raises(vc.ValidationError, vc.AutoRegister, min_bytes=1)
    assert "min_bytes" in err.message and err.fix, err
    backend.close()
    assert delta(c0)["registrations"] == counts()["registrations"] - c0["registrations"]
    settled(fake, before)


def copied_before_return(fake, backend, a, b):
    """A dispatch_async of a and b, which are reused at once (the promise a pageable input has),
    with the copies run as late as CUDA allows (a late DMA would read the new values): it must
    give the old sum, and nothing may have moved by DMA from a registered range."""
    was = fake.set_lazy(True)
    try:
        fake.reset_counters()
        want = a + b
        pending = backend.dispatch_async(VECADD, [a, b])
        a[:], b[:] = pair()
        assert np.array_equal(pending.result()[0], want), "the async dispatch read the reused input"
        assert fake.stats()["htod_registered"] == 0, fake.stats()
    finally:
        fake.set_lazy(was)


@scenario
def an_async_dispatch_still_copies_what_only_the_policy_registered(fake):
    # dispatch_async lets the caller reuse a pageable input at once: a buffer the policy
    # registered behind the caller's back keeps that promise (copied before the call returns),
    # while a blocking dispatch, and memory the caller registered, move by direct DMA
    backend = backend_on(fake, auto_register=AT_ONCE)
    before = fake.stats()
    a, b = aligned_pair()
    check(backend, a, b)
    assert vc.is_page_locked(a) and vc.is_page_locked(b), vc.registered_stats()
    copied_before_return(fake, backend, a, b)
    was = fake.set_lazy(True)
    try:
        with backend.register(a, b):  # asked for: DMA'd while it runs
            pending = backend.dispatch_async(VECADD, [a, b])
            assert np.array_equal(pending.result()[0], a + b)
            assert fake.stats()["htod_registered"] >= 2, fake.stats()
    finally:
        fake.set_lazy(was)
    backend.close()
    settled(fake, before)


@scenario
def the_policy_never_keeps_what_only_a_block_keeps_alive(fake):
    # memory numpy does not own, registered by a register() block and dispatched on by a backend
    # with the policy: the block's end unregisters it (a policy hold would outlive the memory)
    backend = backend_on(fake, auto_register=AT_ONCE)
    before, c0 = fake.stats(), counts()
    a, b = aligned_pair()
    raw = bytearray(a.tobytes())
    view = np.frombuffer(raw, np.float32)
    with backend.register(view):
        for _ in range(2):
            check(backend, view, b)
        assert vc.is_page_locked(view)
    assert not vc.is_page_locked(view), vc.registered_stats()
    del view
    raw.extend(b"\0" * PAGE)  # its memory may move now
    # page-locked arrays are neither registered nor counted as fallbacks
    pinned = vc.pinned_empty(N, np.float32)
    pinned[:] = a
    c1 = counts()
    for _ in range(2):
        check(backend, pinned, b)
    assert counts()["fallbacks"] == c1["fallbacks"] and counts()["registrations"] == c1["registrations"]
    del pinned
    backend.close()
    assert delta(c0)["registrations"] - delta(c0)["unregistrations"] == 0, delta(c0)
    settled(fake, before)


@scenario
def trim_and_close_unregister_what_the_policy_holds(fake):
    backend = backend_on(fake, auto_register=AT_ONCE)
    before = fake.stats()
    a, b = aligned_pair()
    check(backend, a, b)
    assert vc.is_page_locked(a) and vc.is_page_locked(b), vc.registered_stats()
    pending = backend.dispatch_async(VECADD, [a, b])  # in flight while trim unregisters
    backend.trim()
    assert not vc.is_page_locked(a)
    assert np.array_equal(pending.result()[0], a + b)
    check(backend, a, b)  # registered again
    assert vc.is_page_locked(a)
    backend.close()
    assert not vc.is_page_locked(a)
    settled(fake, before)


@scenario
def an_owner_that_dies_while_a_trim_waits_is_unregistered_before_numpy_frees(fake):
    """A trim takes the policy's ranges out of the table, then waits for the direct gate (a
    dispatch on another backend holds it); the owning array dies meanwhile. Its range must be
    unregistered before the owner's death returns (numpy unmaps the memory next, and a range the
    driver still counts as registered catches the next allocation at that address: a copy into
    it fails or lands in the old pages), and not a second time when the trim goes on."""
    one, two = backend_on(fake, auto_register=AT_ONCE), backend_on(fake)
    before, c0 = fake.stats(), counts()
    a, b = aligned_pair()
    check(one, a, b)  # registered at the first sighting
    assert vc.is_page_locked(a) and vc.is_page_locked(b), vc.registered_stats()
    x, y = aligned_pair()
    held = fake.stats()["registered"]
    failed: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failed.append(exc)

    with two.register(x, y):
        fake.lib.fake_cuda_hold(1)  # the GPU is busy: the dispatch waits, holding the gate
        try:
            worker = threading.Thread(target=run, args=(lambda: check(two, x, y),))
            worker.start()
            deadline = time.monotonic() + 10
            while _windows.direct_gate_state()[0] == 0:
                assert time.monotonic() < deadline, "the dispatch never took the gate"
                time.sleep(0.001)
            trimmer = threading.Thread(target=run, args=(one.trim,))
            trimmer.start()
            while _windows.direct_gate_state()[1] == 0:  # the trim waits for the gate
                assert time.monotonic() < deadline, "the trim never closed the gate"
                time.sleep(0.001)
            assert vc.registered_stats()["registered_ranges"] == 2, vc.registered_stats()  # x and y
            del a  # the owner dies while its range is out of the table, not yet unregistered
            assert fake.stats()["registered"] == held + 2 - 1, (fake.stats()["registered"], held)
            assert delta(c0)["unregistrations"] == 1, delta(c0)
        finally:
            fake.lib.fake_cuda_hold(0)
        worker.join()
        trimmer.join()
    assert not failed, failed
    assert delta(c0)["unregistrations"] == delta(c0)["registrations"] == 4, delta(c0)  # a, b, x, y: once each
    assert not vc.is_page_locked(b)
    check(one, b, b)  # registered again
    del b
    one.close()
    two.close()
    assert fake.stats()["violations"] == before["violations"], fake.last_violation()
    settled(fake, before)


@scenario
def a_register_block_takes_back_a_range_a_trim_is_about_to_unregister(fake):
    """A trim takes the policy's range out of the table and waits for the direct gate; a
    ``register()`` block of the same array meanwhile takes the range back: the array stays
    registered for the block (not registered twice, not unregistered by the trim), and the
    block's end unregisters it."""
    one, two = backend_on(fake, auto_register=AT_ONCE), backend_on(fake)
    before, c0 = fake.stats(), counts()
    a, b = aligned_pair()
    check(one, a, b)  # the policy registers a and b
    x, y = aligned_pair()
    failed: list[BaseException] = []

    def run(fn):
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 (reported below)
            failed.append(exc)

    with two.register(x, y):
        fake.lib.fake_cuda_hold(1)  # the GPU is busy: the dispatch waits, holding the gate
        try:
            worker = threading.Thread(target=run, args=(lambda: check(two, x, y),))
            worker.start()
            deadline = time.monotonic() + 10
            while _windows.direct_gate_state()[0] == 0:
                assert time.monotonic() < deadline, "the dispatch never took the gate"
                time.sleep(0.001)
            trimmer = threading.Thread(target=run, args=(one.trim,))
            trimmer.start()
            while _windows.direct_gate_state()[1] == 0:
                assert time.monotonic() < deadline, "the trim never closed the gate"
                time.sleep(0.001)
            with two.register(a):  # taken back: a hit, no new registration
                assert vc.is_page_locked(a) and delta(c0)["registrations"] == 4, delta(c0)
                fake.lib.fake_cuda_hold(0)
                worker.join()
                trimmer.join()
                assert not failed, failed
                # the trim unregistered b only; a stays registered for the block
                assert vc.is_page_locked(a) and not vc.is_page_locked(b), delta(c0)
                assert delta(c0)["unregistrations"] == 1, delta(c0)
                fake.reset_counters()
                check(two, a, b)  # the gate is open again: a moves directly (b is staged)
                assert fake.stats()["htod_registered"] >= 1, fake.stats()
            assert not vc.is_page_locked(a)
            assert delta(c0)["unregistrations"] == 2, delta(c0)
        finally:
            fake.lib.fake_cuda_hold(0)
    del a, b
    one.close()
    two.close()
    assert delta(c0)["registrations"] == delta(c0)["unregistrations"], delta(c0)
    assert fake.stats()["violations"] == before["violations"], fake.last_violation()
    settled(fake, before)


@scenario
def a_copy_to_host_into_memory_that_starts_in_a_registered_page_is_cut_there(fake):
    """Registration is page-granular: a heap neighbour can start in a registered array's last page
    and run past it, and the driver refuses one copy whose host side does that. copy_to_host cuts
    its copy where the page-locked range ends (the fake refuses such a copy, as the driver does,
    and counts it as a violation). Bad ``out`` arguments are refused with a typed error."""
    backend = backend_on(fake)
    before = fake.stats()
    root = np.empty(8 * PAGE, np.uint8)
    base = -root.__array_interface__["data"][0] % PAGE
    mine = root[base : base + 2 * PAGE - 96].view(np.float32)  # ends 96 bytes before a page end
    neighbour = root[base + 2 * PAGE - 64 : base + 5 * PAGE - 64].view(np.float32)  # starts in that page
    x, y = pair(neighbour.size)
    (dev,) = backend.dispatch(VECADD, [x, y], vc.DispatchConfig(outputs="device"))
    with backend.register(mine):
        assert vc.is_page_locked(mine) and not vc.is_page_locked(neighbour)
        got = dev.copy_to_host(out=neighbour)
        assert got is neighbour and np.array_equal(neighbour, x + y)
        assert np.array_equal(dev.copy_to_host(), x + y)
    assert fake.stats()["violations"] == before["violations"], fake.last_violation()
    bad = {
        "a list": [0.0] * neighbour.size,
        "the wrong dtype": np.empty(neighbour.size, np.float64),
        "the wrong size": np.empty(neighbour.size + 1, np.float32),
        "a strided view": np.empty(2 * neighbour.size, np.float32)[::2],
        "a read-only array": np.frombuffer(bytes(neighbour.nbytes), np.float32),
    }
    for what, out in bad.items():
        err = raises(vc.ValidationError, dev.copy_to_host, out=out)
        assert "Fix: " in str(err) and str(neighbour.size) in str(err), (what, str(err))
    assert np.array_equal(dev.copy_to_host(), x + y)  # nothing broken
    del dev
    backend.close()
    settled(fake, before)


# ------------------------------------------------------------------ the worker thread
def settle():
    """Wait until the worker has finished every registration handed to it."""
    _hostreg.REGISTRY._settle(lambda p: True)


class HeldRegister:
    """``_driver.host_register`` as the worker calls it, held at a gate: ``before`` holds it
    before the driver's call, else after it (the driver calls the memory page-locked then, and
    the range is not in the table yet). Counts the calls that reached the driver."""

    def __init__(self, before: bool):
        self.real = _hostreg._driver.host_register
        self.before = before
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    def __call__(self, ctx, address, nbytes):
        self.entered.set()
        if self.before:
            self.gate.wait(10)
        self.calls += 1
        status = self.real(ctx, address, nbytes)
        if not self.before:
            self.gate.wait(10)
        return status

    def __enter__(self):
        _hostreg._driver.host_register = self
        return self

    def __exit__(self, *exc):
        self.gate.set()
        _hostreg._driver.host_register = self.real


@scenario
def the_policy_registers_a_buffer_seen_again_on_the_worker_then_dmas_it_directly(fake):
    backend = backend_on(fake, auto_register=WORKER)
    before, c0 = fake.stats(), counts()
    a, b = aligned_pair()
    out = aligned()
    check(backend, a, b, out)  # first sighting: staged, nothing registered
    settle()
    assert delta(c0)["registrations"] == 0 and not vc.is_page_locked(a)
    fake.reset_counters()
    check(backend, a, b, out)  # seen again: handed to the worker; this dispatch stages
    settle()
    assert delta(c0)["registrations"] == 3 and all(vc.is_page_locked(x) for x in (a, b, out)), counts()
    assert vc.registered_stats()["registering"] == 0
    fake.reset_counters()
    a[:], b[:] = pair()
    check(backend, a, b, out)  # now directly
    assert fake.stats()["htod_registered"] >= 2 and fake.stats()["dtoh_registered"] >= 1, fake.stats()
    held = fake.stats()["registered"]
    del a  # the owner dies: unregistered before numpy frees its memory
    assert fake.stats()["registered"] == held - 1 and delta(c0)["unregistrations"] == 1
    del b, out
    backend.close()
    assert delta(c0)["registrations"] == delta(c0)["unregistrations"] == 3, delta(c0)
    settled(fake, before)


@scenario
def an_owner_that_dies_while_the_worker_registers_it_is_unregistered_before_numpy_frees(fake):
    """a's register call is held at the gate (before the driver's call, in the second case
    after it); b's waits behind it in the worker's queue. b's death costs nothing and b never
    reaches the driver; a's death waits for its register call, then unregisters it."""
    for before_call in (True, False):
        backend = backend_on(fake, auto_register=WORKER)
        before, c0 = fake.stats(), counts()
        a, b = aligned_pair()
        with HeldRegister(before=before_call) as held:
            check(backend, a, b)
            check(backend, a, b)  # a and b handed to the worker, a first
            assert held.entered.wait(10)
            assert vc.registered_stats()["registering"] == 2
            del b  # still queued: the worker drops it
            assert vc.registered_stats()["registering"] == 1
            threading.Timer(0.05, held.gate.set).start()
            del a  # waits for a's register call to return, then unregisters it
            assert fake.stats()["registered"] == before["registered"], fake.stats()
            settle()
            assert held.calls == 1, held.calls  # b never reached the driver
        assert vc.registered_stats()["registering"] == 0
        d = delta(c0)
        assert d["registrations"] == d["unregistrations"] == 1, d  # a's, the worker's call under way
        # new memory, maybe at a's address: not page-locked, and right
        c, e = aligned_pair()
        assert not vc.is_page_locked(c)
        check(backend, c, e)
        del c, e
        backend.close()
        settled(fake, before)


@scenario
def an_async_dispatch_copies_what_the_worker_has_registered_but_not_yet_tabled(fake):
    # the driver calls a page-locked as soon as its register call returns, before the range is
    # in the table: the policy's promise (an async dispatch's inputs are copied before it
    # returns) must hold in that window too
    backend = backend_on(fake, auto_register=vc.AutoRegister(min_bytes=64 << 10, after=1))
    before = fake.stats()
    a, b = aligned_pair()
    with HeldRegister(before=False) as held:
        check(backend, a, b)  # handed to the worker, which registers a and holds there
        assert held.entered.wait(10)
        deadline = time.monotonic() + 10
        while not vc.is_page_locked(a) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert vc.is_page_locked(a) and vc.registered_stats()["registered_ranges"] == 0
        copied_before_return(fake, backend, a, b)
    settle()
    del a, b
    backend.close()
    settled(fake, before)


@scenario
def trim_close_and_register_blocks_wait_for_the_worker(fake):
    backend = backend_on(fake, auto_register=vc.AutoRegister(min_bytes=64 << 10, after=1))
    before, c0 = fake.stats(), counts()
    a, b = aligned_pair()
    with HeldRegister(before=True) as held:
        check(backend, a, b)
        assert held.entered.wait(10)
        threading.Timer(0.05, held.gate.set).start()
        backend.trim()  # waits for both registrations, then unregisters them
    assert not vc.is_page_locked(a) and not vc.is_page_locked(b), vc.registered_stats()
    assert delta(c0)["registrations"] == delta(c0)["unregistrations"] == 2, delta(c0)
    with HeldRegister(before=True) as held:
        check(backend, a, b)
        assert held.entered.wait(10)
        threading.Timer(0.05, held.gate.set).start()
        c1 = counts()
        with backend.register(a):  # finds the policy's registration once it is in: a hit
            assert vc.is_page_locked(a) and delta(c1)["hits"] == 1 and delta(c1)["fallbacks"] == 0, delta(c1)
        assert vc.is_page_locked(a)  # the policy still holds it
    with HeldRegister(before=True) as held:
        c, e = aligned_pair()
        check(backend, c, e)
        assert held.entered.wait(10)
        threading.Timer(0.05, held.gate.set).start()
        backend.close()  # waits, then unregisters everything the policy held
    assert not any(vc.is_page_locked(x) for x in (a, b, c, e)), vc.registered_stats()
    assert vc.registered_stats()["registering"] == 0
    d = delta(c0)
    assert d["registrations"] == d["unregistrations"] == 6, d
    del a, b, c, e
    settled(fake, before)


@scenario
def threads_and_two_backends_register_share_trim_and_drop(fake):
    sys.setswitchinterval(1e-6)
    # one backend registers inside its dispatches, the other on the worker thread
    at_once_on_worker = vc.AutoRegister(min_bytes=64 << 10, after=1)
    backends = [backend_on(fake, auto_register=AT_ONCE), backend_on(fake, auto_register=at_once_on_worker)]
    plain = backend_on(fake)  # no policy: uses what the others registered
    before = fake.stats()
    shared = [aligned_pair()]  # (a list: emptied at the end, so its arrays die before the check)
    errors, stop = [], threading.Event()

    def work(k):
        try:
            rng = np.random.default_rng(int(RNG.integers(1 << 30)))
            for i in range(40):
                be = (backends + [plain])[(k + i) % 3]
                if i % 3 == 0:
                    a, b = shared[0]
                else:
                    a = rng.standard_normal(N).astype(np.float32)
                    b = rng.standard_normal(N).astype(np.float32)
                if i % 5 == 0:
                    with be.register(a):
                        out = be.dispatch(VECADD, [a, b])[0]
                elif i % 7 == 0:
                    be.dispatch_async(VECADD, [a, b])  # dropped
                    continue
                else:
                    out = be.dispatch_async(VECADD, [a, b]).result()[0]
                if not np.array_equal(out, a + b):
                    errors.append(f"thread {k} step {i}: wrong result")
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(f"thread {k}: {exc!r}")

    def trimmer():
        while not stop.is_set():
            for be in backends:
                be.trim()

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
        sys.setswitchinterval(0.005)
    assert not errors, errors[:5]
    shared.clear()
    for be in (*backends, plain):
        be.close()
    settled(fake, before)


if __name__ == "__main__":
    SCENARIOS.main(FakeDriver())
