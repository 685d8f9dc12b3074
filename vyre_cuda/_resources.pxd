# One owner of a backend's pooled resources: device pool, pinned mirrors, output cache, streams
# and events, and the transfer engine (staging ring, copy threads); close, trim, stats, reset.

from libc.stdint cimport uintptr_t
from libcpp.mutex cimport mutex
from libcpp.unordered_map cimport unordered_map
from cuda.bindings cimport cydriver

from ._pools cimport DevicePool, PinnedPool, HostPool
from ._streams cimport StreamPool
from ._transfer cimport TransferEngine


cdef enum:
    MAX_SIDE_STREAMS = 7  # a streamed dispatch's streams beside its own (planning caps its streams at 8)
    MAX_SIDE_EVENTS = 9  # a streamed dispatch's events: one per staging slot and the fork


cdef struct InFlight:
    # what one dispatch holds from the pools while it runs (its PendingDispatch owns this)
    cydriver.CUstream stream
    cydriver.CUevent done
    cydriver.CUevent t0
    cydriver.CUevent t1
    cydriver.CUdeviceptr slab
    size_t bucket  # the device block size ``slab`` came as (the plan's, or its compact one)
    char* staging
    size_t staging_bytes  # the page-locked block size ``staging`` came as
    bint has_done  # ``done`` is recorded after the dispatch's work: wait on it (else on ``stream``)
    bint lazy_done  # ``done`` is held, not recorded: recorded when a completion is first needed (arm_done)
    bint fence_armed  # ``done`` was recorded on demand, covering the dispatches numbered up to fence_seq
    long long fence_seq  # lazy_done: this dispatch's number; fence_armed: the newest its record covers
    bint timed
    bint active
    bint enqueued
    bint async_slab
    bint ext_stream  # the caller's stream: never returned to the pool
    bint shared_stream  # a pool stream other dispatches may be given too (StreamPool.share_after)
    unsigned long long t_start
    unsigned long long t_enqueued
    int n_side  # a streamed dispatch's own streams beside ``stream`` and its events (0: none)
    int n_side_events
    cydriver.CUstream side[MAX_SIDE_STREAMS]
    cydriver.CUevent side_events[MAX_SIDE_EVENTS]


cdef class Resources:
    cdef cydriver.CUcontext ctx
    cdef readonly DevicePool dpool
    cdef readonly PinnedPool ppool
    cdef readonly HostPool opool
    cdef readonly StreamPool spool
    cdef readonly TransferEngine xfer
    cdef mutex fence_mu  # guards fences
    cdef unordered_map[uintptr_t, long long] fences  # caller stream -> newest number seen complete on it
    cdef long long fence_count  # atomic: the numbers given to dispatches whose event waits (lazy_done)

    cdef int acquire(self, InFlight* f, size_t bucket, size_t staging_block, bint ring, bint ext,
                     cydriver.CUstream ext_stream, bint want_done, bint timed, int side_streams=*,
                     int side_events=*) except -1
    cdef int _acquire_side(self, InFlight* f, int streams, int events) except -1
    cdef void _release_side(self, InFlight* f) noexcept
    cdef void release_stream(self, InFlight* f) noexcept
    cdef void release_slab(self, InFlight* f, size_t bucket) noexcept
    cdef void recycle(self, InFlight* f) noexcept  # (the sizes taken are recorded in ``f``)
    cdef bint leak(self, InFlight* f) noexcept
    cdef void fence_number(self, InFlight* f) noexcept nogil
    cdef cydriver.CUresult arm_done(self, InFlight* f, bint* covered) noexcept nogil
    cdef void fence_seen(self, InFlight* f) noexcept nogil
