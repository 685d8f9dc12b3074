# cython: language_level=3
"""The work of dropped handles, kept until it has finished, then recycled.

A handle dropped with its work still running (fire and forget) never makes the host wait: what
it holds moves here with no driver call, and the next dispatch, ``trim()`` or ``close()`` gives
back what has finished (``reclaim``). Past DEFER_MAX_COUNT entries or DEFER_MAX_BYTES, the next
reclaim waits for the oldest until the list is under both (counted in deferred_cap_waits), so a
loop of dropped handles cannot hold unbounded memory. The list is taken out under its lock,
queried without the lock and the GIL, and what still runs goes back in front, in order.
"""

from cpython.ref cimport Py_XDECREF

from ._counters cimport T_DEFERRED_CAP_WAITS, T_DEFERRED_RECYCLES, T_LEAKED_ALLOCATIONS
from ._driver cimport bind_context
from ._inputs cimport release_views
from ._pools cimport lock_with_gil


cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    long long a_add "vyre::add"(long long* p, long long v)
    void tel_add "vyre::count"(unsigned long long* p, unsigned long long v)


cdef class DeferredWork:
    """One backend's dropped work, oldest first (see the module's docstring)."""

    @property
    def pending(self):
        """Entries not yet reclaimed."""
        lock_with_gil(self.mu)
        n = self.entries.size()
        self.mu.unlock()
        return n

    cdef void push(self, Deferred e) noexcept:
        """Take ``e`` (its resources, views and references are the list's now)."""
        lock_with_gil(self.mu)
        self.entries.push_back(e)
        self.nbytes += e.nbytes
        self.mu.unlock()
        a_add(&self.count, 1)

    cdef size_t reclaim(self, cydriver.CUcontext ctx, Resources res, unsigned long long* tel, bint every,
                        bint wait) noexcept:
        """Give back to ``res`` what has finished, oldest first, stopping at the first still running
        (``every``: query all; ``wait``: wait for each; ``ctx`` NULL: write everything off).
        Returns how many were given back."""
        cdef deque[Deferred] batch
        cdef vector[cydriver.CUresult] status
        cdef size_t i, n, held_bytes = 0, done = 0
        cdef long long left
        cdef bint over
        cdef cydriver.CUresult st
        cdef Deferred* e
        lock_with_gil(self.mu)
        batch.swap(self.entries)
        held_bytes = self.nbytes
        self.nbytes = 0
        self.mu.unlock()
        n = batch.size()
        if n == 0:
            return 0
        left = <long long>n
        status.assign(n, cydriver.CUDA_ERROR_NOT_READY)
        with nogil:
            if ctx != NULL:
                bind_context(ctx)
            for i in range(n):
                e = &batch[i]
                over = (left > DEFER_MAX_COUNT or held_bytes > DEFER_MAX_BYTES)
                if ctx == NULL:
                    st = cydriver.CUDA_ERROR_CONTEXT_IS_DESTROYED  # released after a fault: written off
                elif wait or over:
                    st = (cydriver.cuEventSynchronize(e.f.done) if e.f.has_done
                          else cydriver.cuStreamSynchronize(e.f.stream))
                    if over and not wait:
                        tel_add(&tel[T_DEFERRED_CAP_WAITS], 1)
                else:
                    st = cydriver.cuEventQuery(e.f.done) if e.f.has_done else cydriver.cuStreamQuery(e.f.stream)
                status[i] = st
                if st == cydriver.CUDA_ERROR_NOT_READY:
                    if not every:
                        break
                    continue
                left -= 1
                held_bytes -= e.nbytes
        for i in range(n):
            if status[i] == cydriver.CUDA_ERROR_NOT_READY:
                continue
            e = &batch[i]
            if status[i] == cydriver.CUDA_SUCCESS:
                res.recycle(&e.f)
            elif res.leak(&e.f):
                tel_add(&tel[T_LEAKED_ALLOCATIONS], 1)
            release_views(e.views[0], e.views.size())
            del e.views
            Py_XDECREF(e.held)
            done += 1
            tel_add(&tel[T_DEFERRED_RECYCLES], 1)
        a_add(&self.count, -<long long>done)
        if done < n:  # what still runs goes back in front of anything dropped meanwhile, in order
            lock_with_gil(self.mu)
            i = n
            while i > 0:
                i -= 1
                if status[i] == cydriver.CUDA_ERROR_NOT_READY:
                    self.entries.push_front(batch[i])
                    self.nbytes += batch[i].nbytes
            self.mu.unlock()
        return done
