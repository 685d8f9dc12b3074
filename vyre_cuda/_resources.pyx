# cython: language_level=3
"""One owner of a backend's pooled resources: acquire and release per dispatch, close, trim,
stats and counter resets, so the backend and the core never reach into a pool themselves.

It owns the device pool, the pinned mirrors, the output cache, the stream and event pool and the
transfer engine (each pool has its own lock; this owner adds none). Page-locked host memory comes
in three kinds: per-backend pinned mirrors of small slabs (``ppool``), the fixed staging ring of
large transfers (``xfer``), and the process-wide array pool of :mod:`vyre_cuda.hostmem` (not owned
here).
"""

cimport cython
from libc.stdint cimport uintptr_t
from cuda.bindings cimport cydriver

from ._driver cimport bind_context

cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    long long a_add "vyre::add"(long long* p, long long v)
    long long a_loadll "vyre::loadll"(const long long* p)
from ._pools cimport DevicePool, PinnedPool, HostPool
from ._streams cimport StreamPool
from ._transfer cimport TransferEngine
from ._resource_stats import BackendPoolStats, BlockPoolStats, StreamPoolStats, TransferStats


# Streams cached for reuse: one per dispatch in flight, so the same bound as the completion events
# (1,000 handles in flight with 128 cached cost 78 us per enqueue, not 14: notes/enqueue-chain.md §2)
cdef unsigned int STREAM_CACHE = 1024
# Caller streams whose newest complete fence is remembered; past this many the table starts over
# (forgetting only costs a record later: a handle then records its own event)
cdef size_t FENCE_STREAMS = 256


@cython.final
cdef class Resources:
    """The pools of one backend (see the module docstring)."""

    def __init__(self, uintptr_t ctx, int device, size_t device_cap, size_t pinned_cap, size_t output_cache,
                 size_t chunk_bytes, int n_chunks, int copy_threads):
        self.ctx = <cydriver.CUcontext>ctx
        self.dpool = DevicePool(device_cap, ctx, device)
        self.ppool = PinnedPool(pinned_cap, ctx)
        self.opool = HostPool(output_cache)
        self.spool = StreamPool(STREAM_CACHE, ctx)
        self.xfer = TransferEngine(ctx, chunk_bytes, n_chunks, copy_threads)

    # ---------------------------------------------------------------- per dispatch (GIL held)
    cdef int acquire(self, InFlight* f, size_t bucket, size_t staging_block, bint ring, bint ext,
                     cydriver.CUstream ext_stream, bint want_done, bint timed, int side_streams=0,
                     int side_events=0) except -1:
        """Stream, slab, staging and events of one dispatch (and a streamed dispatch's side
        streams and events); on failure nothing stays taken."""
        cdef uintptr_t block = 0
        f.active = False
        f.n_side = 0
        f.n_side_events = 0
        f.enqueued = False
        f.has_done = False
        f.lazy_done = False
        f.fence_armed = False
        f.fence_seq = 0
        f.timed = False
        f.async_slab = ring and self.dpool.stream_ordered
        f.bucket = bucket
        # any thread may dispatch: make the backend's context current before the first driver
        # call (GIL kept: this is cheaper than a GIL release and re-acquire)
        bind_context(self.ctx)
        f.ext_stream = ext
        # a stream is shared only by dispatches that wait on their own completion event: a timed
        # one keeps it to itself (no other work between its timing events), and so does a blocking
        # one (it waits on the stream, which others' work would keep busy)
        f.shared_stream = not ext and not timed and want_done and self.spool.share_after != 0
        if ext:
            f.stream = ext_stream
        else:
            self.spool.acquire_stream(&f.stream, f.shared_stream)
        try:
            if bucket == 0:
                f.slab = 0  # (the caller lends the dispatch a block of its own: a resident one)
            elif f.async_slab:
                self.dpool.acquire_async(bucket, f.stream, &f.slab)
            else:
                self.dpool.acquire(bucket, &block)
                f.slab = <cydriver.CUdeviceptr>block
        except BaseException:
            self.release_stream(f)
            raise
        f.staging = NULL
        f.staging_bytes = staging_block
        try:
            if staging_block:
                self.ppool.acquire(staging_block, &block)
                f.staging = <char*>block
        except BaseException:
            self.release_slab(f, bucket)
            self.release_stream(f)
            raise
        try:
            if want_done:
                self.spool.acquire_event(False, &f.done)
                f.has_done = True
            if timed:
                self.spool.acquire_event(True, &f.t0)
                try:
                    self.spool.acquire_event(True, &f.t1)
                except BaseException:
                    self.spool.release_event(f.t0, True)
                    raise
                f.timed = True
            self._acquire_side(f, side_streams, side_events)
        except BaseException:
            if f.timed:
                self.spool.release_event(f.t0, True)
                self.spool.release_event(f.t1, True)
                f.timed = False
            if f.has_done:
                self.spool.release_event(f.done, False)
            if f.staging != NULL:
                self.ppool.release(<uintptr_t>f.staging, staging_block)
            self.release_slab(f, bucket)
            self.release_stream(f)
            raise
        f.active = True
        return 0

    cdef int _acquire_side(self, InFlight* f, int streams, int events) except -1:
        # all or nothing: what was taken goes back before the error propagates
        if streams > MAX_SIDE_STREAMS or events > MAX_SIDE_EVENTS:
            raise ValueError(f"a dispatch holds at most {MAX_SIDE_STREAMS} side streams and "
                             f"{MAX_SIDE_EVENTS} side events (asked {streams}, {events})")
        try:
            while f.n_side < streams:
                self.spool.acquire_stream(&f.side[f.n_side], False)  # (the chunks' own order)
                f.n_side += 1
            while f.n_side_events < events:
                self.spool.acquire_event(False, &f.side_events[f.n_side_events])
                f.n_side_events += 1
        except BaseException:
            self._release_side(f)
            raise
        return 0

    cdef void _release_side(self, InFlight* f) noexcept:
        cdef int k
        for k in range(f.n_side):
            self.spool.release_stream(f.side[k])
        for k in range(f.n_side_events):
            self.spool.release_event(f.side_events[k], False)
        f.n_side = 0
        f.n_side_events = 0

    cdef void release_stream(self, InFlight* f) noexcept:
        # a caller's stream (DispatchConfig(stream=...)) is theirs: never returned to the pool
        if not f.ext_stream:
            self.spool.release_stream(f.stream)

    cdef void release_slab(self, InFlight* f, size_t bucket) noexcept:
        if bucket == 0:
            return  # none was taken from the pools
        if f.async_slab:
            self.dpool.release_async(f.slab, bucket, f.stream)
        else:
            self.dpool.release(<uintptr_t>f.slab, bucket)

    cdef void recycle(self, InFlight* f) noexcept:
        if not f.active:
            return
        f.active = False
        self.release_slab(f, f.bucket)
        if f.staging != NULL:
            self.ppool.release(<uintptr_t>f.staging, f.staging_bytes)
        self.release_stream(f)
        if f.has_done or f.lazy_done:
            self.spool.release_event(f.done, False)
        if f.timed:
            self.spool.release_event(f.t0, True)
            self.spool.release_event(f.t1, True)
        self._release_side(f)

    cdef bint leak(self, InFlight* f) noexcept:
        # The stream could not be synchronised: the GPU may still use these. Never recycle them.
        # Returns whether anything was written off.
        if not f.active:
            return False
        f.active = False
        if f.bucket == 0:
            pass
        elif f.async_slab:
            self.dpool.forget_async(f.bucket)
        else:
            self.dpool.forget(f.bucket)
        if f.staging != NULL:
            self.ppool.forget(f.staging_bytes)
        if not f.ext_stream:
            self.spool.forget_stream(f.stream)
        self.spool.forget(f.n_side,
                          (1 if f.has_done or f.lazy_done else 0) + (2 if f.timed else 0) + f.n_side_events)
        f.n_side = 0
        f.n_side_events = 0
        return True

    # ---------------------------------------------------------------- completion on demand
    # A dispatch on a caller's stream object may leave its ``done`` event unrecorded at enqueue
    # (``lazy_done``, Knobs.fence_on_demand): one record made when a completion is first needed
    # covers every such dispatch numbered on that stream before it (notes/enqueue-chain.md).
    cdef void fence_number(self, InFlight* f) noexcept nogil:
        """Number a dispatch whose event waits, once its work is on the stream: a record made
        after the counter reached this number comes after that work."""
        f.fence_seq = a_add(&self.fence_count, 1)

    cdef cydriver.CUresult arm_done(self, InFlight* f, bint* covered) noexcept nogil:
        """Make ``f``'s completion knowable (its handle's lock held): ``covered`` when a fence
        seen complete on its stream already covers it (no driver call), else its event recorded
        now (then ``has_done``). A failed record leaves it waiting on the stream itself."""
        cdef long long seen = 0, upto
        cdef cydriver.CUresult st
        covered[0] = False
        if not f.lazy_done:
            return cydriver.CUDA_SUCCESS
        self.fence_mu.lock()
        if self.fences.count(<uintptr_t>f.stream):
            seen = self.fences[<uintptr_t>f.stream]
        self.fence_mu.unlock()
        if f.fence_seq and seen >= f.fence_seq:  # (0: not numbered yet, never covered)
            covered[0] = True
            return cydriver.CUDA_SUCCESS
        upto = a_loadll(&self.fence_count)  # (read before the record: every number up to it is enqueued)
        st = cydriver.cuEventRecord(f.done, f.stream)
        if st == cydriver.CUDA_SUCCESS:
            f.lazy_done = False
            f.has_done = True
            f.fence_armed = True
            f.fence_seq = upto
        return st

    cdef void fence_seen(self, InFlight* f) noexcept nogil:
        """A wait saw ``f``'s on-demand event complete: so is every dispatch its record covered."""
        cdef uintptr_t key = <uintptr_t>f.stream
        if not f.fence_armed:
            return
        self.fence_mu.lock()
        if self.fences.size() >= FENCE_STREAMS and not self.fences.count(key):
            self.fences.clear()
        if self.fences[key] < f.fence_seq:
            self.fences[key] = f.fence_seq
        self.fence_mu.unlock()

    # ---------------------------------------------------------------- lifecycle
    def trim(self):
        """Free every cached device block, pinned mirror, output-cache block, stream and event,
        and give the stream-ordered pool's unused memory back (the staging ring stays). Safe at
        any time."""
        self.dpool.trim()
        self.ppool.trim()
        self.opool.trim()
        self.spool.trim()

    def close(self):
        """Free every pool and the staging ring (the backend waited for its work; its context is
        current). Memory still lent to a dispatch in flight is freed when it comes back."""
        self.dpool.close()
        self.ppool.close()
        self.opool.close()
        self.spool.close()
        self.xfer.close()

    def close_late(self):
        """After the last dispatch handle settled: free what it gave back (the stream-ordered pool)."""
        self.dpool.close()

    def stop_threads(self):
        """Join the copy threads (idempotent; never needs the driver, so also for a lost context)."""
        self.xfer.stop_threads()

    def forget_context(self):
        """The context was released after a fault: every pool drops its handles without a driver
        call (they died with the context)."""
        self.dpool.forget_context()
        self.ppool.forget_context()
        self.spool.forget_context()
        self.xfer.forget_context()
        self.ctx = NULL

    def reset_counters(self):
        self.dpool.reset_counters()
        self.ppool.reset_counters()
        self.opool.reset_counters()
        self.xfer.reset_pinned_alloc_calls()

    def stats(self):
        """A :class:`~vyre_cuda._resource_stats.BackendPoolStats`; each pool's counters are read
        together under its own lock."""
        return BackendPoolStats(
            device=BlockPoolStats(**self.dpool.stats()),
            device_stream_ordered_live_bytes=self.dpool.async_stats()["live_bytes"],
            pinned=BlockPoolStats(**self.ppool.stats()),
            output_cache=BlockPoolStats(**self.opool.stats()),
            streams=StreamPoolStats(**self.spool.stats()),
            transfer=TransferStats(
                ring_bytes=self.xfer.ring_bytes,
                pinned_alloc_calls=self.xfer.pinned_alloc_calls,
                copy_threads_live=self.xfer.live_threads,
            ),
        )
