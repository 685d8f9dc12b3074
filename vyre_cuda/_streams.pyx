# cython: language_level=3
"""Launch resources: non-blocking streams, completion events and timing events, reused.

Split from the memory pools (``_pools``) because it shares only their lock rule
(:func:`~vyre_cuda._pools.lock_with_gil`): never the null stream, no driver call under the lock.
"""

from libc.stdint cimport uintptr_t
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

from ._driver cimport check_cu, bind_context
from ._pools cimport lock_with_gil


cdef class StreamPool:
    """Non-blocking streams, completion events (no timing) and timing events, reused.

    Thread rules as for :class:`BlockPool`. ``cap`` bounds the cached streams, ``event_cap`` each
    kind of cached event (larger: every dispatch in flight holds one)."""

    def __cinit__(self, unsigned int cap=128, uintptr_t ctx=0, unsigned int event_cap=1024):
        self.cap = cap
        self.event_cap = event_cap
        self.ctx = <cydriver.CUcontext>ctx

    cdef int acquire_stream(self, cydriver.CUstream* out, bint shareable=True) except -1:
        """A stream for one dispatch. With ``share_after`` set, once that many shareable streams
        are lent the next shareable asks get one of those, round-robin: dispatches on one stream
        run in order, and the driver's per-stream cost of a launch grows with the streams in use
        (notes/enqueue-chain.md). ``shareable=False``: a stream no other dispatch gets while held."""
        cdef cydriver.CUstream s = NULL
        cdef cydriver.CUresult st
        lock_with_gil(self.mu)
        if shareable and self.share_after and self.ring.size() >= self.share_after:
            s = self.ring[self.next_share % self.ring.size()]
            self.next_share += 1
            self.holders[s] += 1
            self.live_streams += 1
            self.mu.unlock()
            out[0] = s
            return 0
        if not self.streams.empty():
            s = self.streams.back()
            self.streams.pop_back()
            self.live_streams += 1
            self._lend(s, shareable)
        self.mu.unlock()
        if s != NULL:
            out[0] = s
            return 0
        with nogil:
            # never the null stream: non-blocking streams do not synchronise with it
            st = cydriver.cuStreamCreate(&s, cydriver.CU_STREAM_NON_BLOCKING)
        check_cu(st, b"cuStreamCreate")
        lock_with_gil(self.mu)
        self.created_streams += 1
        self.live_streams += 1
        self._lend(s, shareable)
        self.mu.unlock()
        out[0] = s
        return 0

    cdef void _lend(self, cydriver.CUstream s, bint shareable) noexcept:
        # (under the lock) a shareable stream joins the ring others may be given
        if shareable and self.share_after:
            self.ring.push_back(s)
            self.holders[s] = 1

    cdef void _unring(self, cydriver.CUstream s) noexcept:
        # (under the lock) no later ask is given ``s``
        cdef size_t i
        for i in range(self.ring.size()):
            if self.ring[i] == s:
                self.ring.erase(self.ring.begin() + i)
                return

    cdef bint _release_share(self, cydriver.CUstream s) noexcept:
        """(Under the lock.) One holder of a ring stream lets go. True: the caller must neither
        cache nor destroy it (others still hold it, or it was written off: dropped, a leak)."""
        if self.holders.count(s) == 0:
            return False
        if self.holders[s] > 1:
            self.holders[s] -= 1
            return True
        self.holders.erase(s)
        self._unring(s)
        return self.written_off.erase(s) != 0

    cdef void release_stream(self, cydriver.CUstream s) noexcept:
        cdef bint keep
        cdef cydriver.CUcontext prev
        lock_with_gil(self.mu)
        self.live_streams -= 1
        if not self.holders.empty() and self._release_share(s):
            self.mu.unlock()
            return
        keep = not self.closed and self.streams.size() < self.cap
        if keep:
            self.streams.push_back(s)
        else:
            self.created_streams -= 1
        self.mu.unlock()
        if not keep:  # (the pool's context pushed: the releasing thread may have none current)
            with nogil:
                if self.ctx != NULL and cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                    cydriver.cuStreamDestroy(s)
                    cydriver.cuCtxPopCurrent(&prev)

    cdef int acquire_event(self, bint timing, cydriver.CUevent* out) except -1:
        cdef cydriver.CUevent e = NULL
        cdef cydriver.CUresult st
        cdef unsigned int flags = cydriver.CU_EVENT_DEFAULT if timing else cydriver.CU_EVENT_DISABLE_TIMING
        cdef vector[cydriver.CUevent]* pool = &self.timing_events if timing else &self.events
        lock_with_gil(self.mu)
        if not pool.empty():
            e = pool.back()
            pool.pop_back()
            self.live_events += 1
        self.mu.unlock()
        if e != NULL:
            out[0] = e
            return 0
        with nogil:
            st = cydriver.cuEventCreate(&e, flags)
        check_cu(st, b"cuEventCreate")
        lock_with_gil(self.mu)
        self.created_events += 1
        self.live_events += 1
        self.mu.unlock()
        out[0] = e
        return 0

    cdef void release_event(self, cydriver.CUevent e, bint timing) noexcept:
        cdef vector[cydriver.CUevent]* pool = &self.timing_events if timing else &self.events
        cdef bint keep
        cdef cydriver.CUcontext prev
        lock_with_gil(self.mu)
        self.live_events -= 1
        keep = not self.closed and pool.size() < self.event_cap
        if keep:
            pool.push_back(e)
        else:
            self.created_events -= 1
        self.mu.unlock()
        if not keep:  # (the pool's context pushed: the releasing thread may have none current)
            with nogil:
                if self.ctx != NULL and cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                    cydriver.cuEventDestroy(e)
                    cydriver.cuCtxPopCurrent(&prev)

    cdef void forget(self, int streams, int events) noexcept:
        # written off with a dispatch that could not be proven finished: never reused or destroyed
        lock_with_gil(self.mu)
        self.live_streams -= streams
        self.live_events -= events
        self.mu.unlock()

    cdef void forget_stream(self, cydriver.CUstream s) noexcept:
        """A dispatch could not prove ``s`` idle: never reused or destroyed (counted as leaked,
        as :meth:`forget` counts). Shared, it is given to no one else and the last holder's
        release drops it."""
        lock_with_gil(self.mu)
        self.live_streams -= 1
        if self.holders.count(s):
            self._unring(s)
            if self.holders[s] > 1:
                self.holders[s] -= 1
                self.written_off.insert(s)
            else:  # the last holder: nothing is left to drop it later
                self.holders.erase(s)
                self.written_off.erase(s)
        self.mu.unlock()

    cdef void _destroy_cached(self) noexcept:
        cdef vector[cydriver.CUstream] streams
        cdef vector[cydriver.CUevent] events
        cdef size_t i
        lock_with_gil(self.mu)
        streams.swap(self.streams)
        events.swap(self.events)
        events.insert(events.end(), self.timing_events.begin(), self.timing_events.end())
        self.timing_events.clear()
        self.created_streams -= <int>streams.size()
        self.created_events -= <int>events.size()
        self.mu.unlock()
        with nogil:
            for i in range(streams.size()):
                cydriver.cuStreamDestroy(streams[i])
            for i in range(events.size()):
                cydriver.cuEventDestroy(events[i])

    def stats(self):
        lock_with_gil(self.mu)
        out = (self.created_streams, self.live_streams, self.created_events, self.live_events)
        self.mu.unlock()
        return dict(zip(("streams_created", "streams_live", "events_created", "events_live"), out))

    def trim(self):
        """Destroy every cached stream and event (those in use stay theirs); the next dispatches
        create what they need again. Safe at any time."""
        if self.ctx != NULL:
            with nogil:
                bind_context(self.ctx)
        self._destroy_cached()

    def close(self):
        lock_with_gil(self.mu)
        self.closed = True
        self.mu.unlock()
        if self.ctx != NULL:
            with nogil:
                bind_context(self.ctx)
        self._destroy_cached()

    def forget_context(self):
        """The context is gone: its streams and events died with it; never touch them again."""
        lock_with_gil(self.mu)
        self.streams.clear()
        self.events.clear()
        self.timing_events.clear()
        self.ring.clear()
        self.holders.clear()
        self.written_off.clear()
        self.ctx = NULL
        self.closed = True
        self.mu.unlock()

    def __dealloc__(self):
        cdef cydriver.CUcontext prev
        if self.ctx != NULL and (not self.streams.empty() or not self.events.empty()
                                 or not self.timing_events.empty()):
            if cydriver.cuCtxPushCurrent(self.ctx) == cydriver.CUDA_SUCCESS:
                self._destroy_cached()
                cydriver.cuCtxPopCurrent(&prev)
