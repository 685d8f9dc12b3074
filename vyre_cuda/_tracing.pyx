# cython: language_level=3
"""Tracing of dispatches: stage marks and durations, NVTX ranges, the per-dispatch log line.

``dispatch_profiled`` and traced dispatches pass an array of stage marks through the hot path;
untraced dispatches pass NULL, so tracing costs them one pointer test per mark. NVTX ranges (see
_nvtx.hpp: why the C header, what each range covers) are opened and closed only here.
"""

from libc.string cimport memset

from ._driver cimport now_ns
from ._prepared cimport Prepared
from ._dispatch cimport Core
from ._waits cimport PendingDispatch
from ._counters cimport (
    T_DISPATCHES, T_H2D_BYTES, T_H2D_OPS, T_TRANSIENT_ALLOC_BYTES, T_PARAM_UPLOAD_BYTES, T_LAUNCHES,
    T_COOPERATIVE_LAUNCHES, T_SPLIT_LAUNCHES, T_MEMSET_OPS, T_STAGED_H2D_BYTES, T_DIRECT_H2D_BYTES, T_RING_CHUNKS,
    T_GRAPH_REPLAYS, T_GRAPH_CAPTURES, T_GRAPH_UPDATES, T_GRAPH_FALLBACKS, T_STREAMED_DISPATCHES,
    T_STREAMED_CHUNKS, T_IN_PLACE_OUTPUTS,
)
from ._prepared cimport ROUTE_COOPERATIVE, ROUTE_SPLIT
from ._windows cimport SRC_INPUT
from ._launch cimport G_REPLAY, G_CAPTURE, G_UPDATE, G_FALLBACK


cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    void tel_add "vyre::count"(unsigned long long* p, unsigned long long v)
from .config import DispatchConfig
from .program import Program

cdef extern from "_nvtx.hpp" nogil:
    enum:
        VYRE_NVTX_STAGES
        VYRE_NVTX_SLOTS
    int vyre_nvtx_available() noexcept
    int vyre_nvtx_stage_open() noexcept
    void vyre_nvtx_push(const char* message, int slot) noexcept
    void vyre_nvtx_pop() noexcept
    void vyre_nvtx_stage(int stage) noexcept
    unsigned long long vyre_nvtx_start(const char* message) noexcept
    void vyre_nvtx_end(unsigned long long id) noexcept
    unsigned long long vyre_nvtx_counter(int slot) noexcept
    void vyre_nvtx_reset() noexcept

STAGES = (
    "plan_lookup", "staging_memcpy", "h2d_enqueue", "clears", "params_upload", "launch",
    "readback_enqueue", "event_record", "wait", "copy_out", "release",
)

NVTX_STAGES = (
    "plan_lookup", "upload", "launch", "readback_enqueue", "event_record", "wait", "copy_out",
    "release", "enqueue", "result",
)

# STAGES position of each mark after M_START, in the order the path passes them
cdef int _STAGE_OF_MARK[N_MARKS]
_STAGE_OF_MARK[:] = [-1, 0, 1, 4, 2, 3, 5, 6, 7, 8, 9, 10]

# the NVTX stage range each stage mark opens (-1: none); the upload range opens after the lookup
cdef int _NVTX_AFTER_MARK[N_MARKS]
_NVTX_AFTER_MARK[:] = [-1, -1, -1, -1, -1, S_LAUNCH, S_READBACK, S_EVENT, S_WAIT, S_COPYOUT, S_RELEASE, -1]


cdef bint nvtx_stage_open() noexcept nogil:
    return vyre_nvtx_stage_open() != 0


cdef void nvtx_stage(int stage) noexcept nogil:
    vyre_nvtx_stage(stage)


cdef void nvtx_push(const char* message, int slot) noexcept nogil:
    vyre_nvtx_push(message, slot)


cdef void nvtx_pop() noexcept nogil:
    vyre_nvtx_pop()


cdef void nvtx_end(unsigned long long rid) noexcept nogil:
    vyre_nvtx_end(rid)


cdef void mark_stage(unsigned long long* marks, int k) noexcept nogil:
    marks[k] = now_ns()
    if vyre_nvtx_stage_open():  # an NVTX-traced blocking dispatch: the next stage's range
        vyre_nvtx_stage(_NVTX_AFTER_MARK[k])


cdef tuple stage_durations(unsigned long long* m):
    """Durations between consecutive marks; a mark never reached counts 0 for its stage."""
    cdef unsigned long long prev = m[M_START]
    cdef unsigned long long d[11]
    cdef int k
    memset(d, 0, sizeof(d))
    for k in range(1, N_MARKS):
        if m[k] != 0:
            d[_STAGE_OF_MARK[k]] = m[k] - prev
            prev = m[k]
    return (d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10])


cdef void trace_line(logger, Prepared p, unsigned long long* marks) noexcept:
    # VYRE_CUDA_TRACE=1: one log line per dispatch with each stage's microseconds
    try:
        stages = stage_durations(marks)
        body = " ".join(f"{name}={ns / 1000:.1f}us" for name, ns in zip(STAGES, stages) if ns)
        path = "ring" if p.ring else "mirror"
        logger.info("dispatch %s route=%s (%s) %s %s", p.label or "", p.route_name, p.route_reason, path, body)
    except Exception:
        pass


cdef bytes _nvtx_label(program, config):
    # the dispatch range's name: DispatchConfig.label, else the program's name, else its entry
    # (a refused dispatch may carry neither a Program nor a DispatchConfig: then "dispatch")
    label = None
    if type(config) is DispatchConfig:
        label = (<object>config).label
    if not label and type(program) is Program:
        label = (<object>program).name or (<object>program).kernel.entry
    return str(label or "dispatch").encode("utf-8", "replace")


cdef object nvtx_blocking(Core core, PendingDispatch d, program, config, list into, unsigned long long* marks):
    """A blocking dispatch (its plan already looked up) inside one NVTX range named by its
    label, with one nested range per stage; every range is closed on every path (error,
    timeout, Ctrl-C)."""
    cdef bytes label = _nvtx_label(program, config)
    vyre_nvtx_push(label, VYRE_NVTX_STAGES)
    vyre_nvtx_stage(S_LOOKUP)
    try:
        return core._run_blocking(d, config, into, marks)
    finally:
        vyre_nvtx_stage(-1)
        vyre_nvtx_pop()


cdef PendingDispatch nvtx_async(Core core, PendingDispatch d, program, config, bint timed,
                                unsigned long long t0, list into):
    """An async dispatch (its plan already looked up): a start/end range from here until its
    result is taken (or it fails or is dropped; it may end on another thread), with an
    "enqueue" range nested here."""
    cdef bytes label = _nvtx_label(program, config)
    cdef unsigned long long rid = vyre_nvtx_start(label)
    vyre_nvtx_push(b"enqueue", S_ENQUEUE)
    try:
        d = core._run_async(d, config, timed, t0, into)
    except BaseException:
        vyre_nvtx_end(rid)
        raise
    finally:
        vyre_nvtx_pop()
    d.traced = True
    if not d.f.active:  # cannot happen today (enqueue failures raise); keep the range balanced anyway
        vyre_nvtx_end(rid)
    else:
        d.nvtx_range = rid
        d.nvtx_started = True
    return d


cdef void nvtx_refused(program, config, bint blocking) noexcept:
    """The ranges of a traced dispatch refused before it ran (planning or its input checks
    raised): the lookup precedes the ranges (a plan miss returns to the backend to plan), so
    the refusal shows as its ranges opened and closed at once, as a refused dispatch's were."""
    cdef bytes label
    cdef unsigned long long rid
    try:
        label = _nvtx_label(program, config)
    except Exception:
        label = b"dispatch"
    if blocking:
        vyre_nvtx_push(label, VYRE_NVTX_STAGES)
        vyre_nvtx_stage(S_LOOKUP)
        vyre_nvtx_stage(-1)
        vyre_nvtx_pop()
    else:
        rid = vyre_nvtx_start(label)
        vyre_nvtx_push(b"enqueue", S_ENQUEUE)
        vyre_nvtx_pop()
        vyre_nvtx_end(rid)


def nvtx_available():
    """True when this build calls NVTX (the header was found); else ranges are only counted."""
    return bool(vyre_nvtx_available())


def nvtx_counts():
    """NVTX calls made by traced dispatches in this process: pushes per stage range name, and
    ``dispatch`` (label ranges of blocking dispatches), ``pops``, ``starts`` and ``ends``."""
    counts = {name: vyre_nvtx_counter(k) for k, name in enumerate(NVTX_STAGES)}
    counts["dispatch"] = vyre_nvtx_counter(VYRE_NVTX_STAGES)
    counts["pops"] = vyre_nvtx_counter(VYRE_NVTX_STAGES + 1)
    counts["starts"] = vyre_nvtx_counter(VYRE_NVTX_STAGES + 2)
    counts["ends"] = vyre_nvtx_counter(VYRE_NVTX_STAGES + 3)
    return counts


def nvtx_reset():
    """Zero the counts of :func:`nvtx_counts` (tests)."""
    vyre_nvtx_reset()


cdef void count_enqueued(unsigned long long* tel, PendingDispatch d) noexcept:
    """A dispatch's work is enqueued: its share of the backend's telemetry (``tel``, added to
    atomically), from its plan's per-dispatch figures and what this dispatch did."""
    cdef Prepared p = d.prep
    cdef size_t i
    cdef unsigned long long direct = 0
    cdef size_t h2d = 0 if d.resident else p.tel_h2d_bytes
    tel_add(&tel[T_DISPATCHES], 1)
    tel_add(&tel[T_H2D_BYTES], h2d)
    tel_add(&tel[T_TRANSIENT_ALLOC_BYTES], d.f.bucket)
    tel_add(&tel[T_PARAM_UPLOAD_BYTES], 0 if d.resident else p.tel_param_bytes)
    tel_add(&tel[T_LAUNCHES], p.tel_launches)
    if p.route == ROUTE_COOPERATIVE:
        tel_add(&tel[T_COOPERATIVE_LAUNCHES], p.tel_launches)
    elif p.route == ROUTE_SPLIT:
        tel_add(&tel[T_SPLIT_LAUNCHES], p.tel_launches)
    for i in range(d.out_inplace.size()):
        tel_add(&tel[T_MEMSET_OPS], d.out_inplace[i].zero)
    tel_add(&tel[T_MEMSET_OPS], 0 if d.compact else p.tel_memsets)
    tel_add(&tel[T_IN_PLACE_OUTPUTS], d.out_inplace.size())
    if d.graph_events:
        tel_add(&tel[T_GRAPH_REPLAYS], (d.graph_events & G_REPLAY) != 0)
        tel_add(&tel[T_GRAPH_CAPTURES], (d.graph_events & G_CAPTURE) != 0)
        tel_add(&tel[T_GRAPH_UPDATES], (d.graph_events & G_UPDATE) != 0)
        tel_add(&tel[T_GRAPH_FALLBACKS], (d.graph_events & G_FALLBACK) != 0)
        d.graph_events = 0
    if p.ring:
        # (a params-only dispatch sends its params in one copy outside the ring, or none)
        tel_add(&tel[T_H2D_OPS], d.ops[0] + (d.compact and not d.resident))
        tel_add(&tel[T_RING_CHUNKS], d.ops[1])
        if d.any_direct:
            for i in range(p.sources.size()):
                if p.sources[i].kind == SRC_INPUT and d.direct[p.sources[i].index]:
                    direct += p.sources[i].n
        if p.streamed:
            direct += d.s_direct_h2d
            tel_add(&tel[T_STREAMED_DISPATCHES], 1)
            tel_add(&tel[T_STREAMED_CHUNKS], p.s_chunks)
    else:
        tel_add(&tel[T_H2D_OPS], 0 if d.resident else p.tel_h2d_ops)
    tel_add(&tel[T_DIRECT_H2D_BYTES], direct)
    tel_add(&tel[T_STAGED_H2D_BYTES], h2d - direct)
    d.ops[0] = d.ops[1] = 0
