# cython: language_level=3
"""The hot path's per-backend entry points, the plan lookup, and the ONE owner of a dispatch's life.

A dispatch looks up its prepared plan (one dict lookup; on a miss it raises :class:`PlanMiss` and
the backend plans, inserts and calls again: the core never calls into planning), then runs in C:
pool acquisitions under the GIL, every driver call, copy and wait without it. Device arrays are
looked for only where the buffer protocol fails, so host buffers pay nothing for them. The rest of
the hot path is cimported through .pxd files (_prepared, _launch, _waits, _tracing, _resources).

A dispatch's life is written here only (state machine: _dispatch.pxd): one caller claims the
outputs by compare-and-swap, the others get the same outputs or error; resources go back once,
under the handle's lock (so ``is_ready()`` never queries a recycled event); a dropped handle never
makes the host wait: its resources go on the deferred list (_deferred), reclaimed by later
dispatches, ``trim()`` and ``close()``. No field relies on the GIL: counts are atomics, references
are swapped under a mutex taken with lock_with_gil, and no Python code runs while one is held.
"""

cimport cython
from cpython.ref cimport Py_INCREF, PyObject
from libc.stdint cimport uintptr_t
from libc.string cimport memset
from libcpp.vector cimport vector

from cuda.bindings cimport cydriver

from ._counters cimport N_COUNTERS, T_FAILED_DISPATCHES, T_LEAKED_ALLOCATIONS, T_DEFERRED_DROPS
from ._pools cimport lock_with_gil
from ._driver cimport now_ns, bind_context
from ._resources cimport Resources, InFlight
from ._transfer cimport TransferEngine
from ._prepared cimport Prepared, ResidentBlocks
from ._deferred cimport Deferred, DeferredWork
from ._plans cimport PlanTable, lookup_key
from ._inputs cimport release_views, read_inputs, check_inputs, input_pointers, sight_buffers, mark_direct
from ._launch cimport issue, collect, stream_waits, trial_record
from ._waits cimport PendingDispatch, wait_nogil, wait_for_taker, leave_gate, timeout_ns, W_DONE, WAIT_POLL
from ._outputs cimport new_outputs, find_targets, fits_in_place, check_into
from ._tracing cimport (
    count_enqueued, mark, nvtx_stage_open, nvtx_stage, nvtx_blocking, nvtx_async, nvtx_refused, stage_durations,
    trace_line, TRACE_LOG, TRACE_NVTX, S_UPLOAD, M_START, M_LOOKUP, M_WAIT, M_COPYOUT, M_RELEASE, N_MARKS,
)
from ._driver import status_name
from ._resource_stats import flat_pool_stats
from .config import DispatchConfig, as_config, _timeout as _check_timeout
from .program import Program
from .errors import DeviceLost, ValidationError, driver_error, STICKY_ERRORS
from .telemetry import TimedDispatchResult
from ._plan_miss import PlanMiss
from ._io_checks import as_input_list, as_output_list


@cython.final
cdef class Core:
    """Per-backend driver state: context, the pools' owner, prepared plans, counters."""

    def __init__(self, uintptr_t ctx, size_t device_cap, size_t pinned_cap, int trace=0,
                 int device=0, size_t chunk_bytes=8 << 20, int n_chunks=4, int copy_threads=8,
                 size_t output_cache=4294967296):
        self.ctx = <cydriver.CUcontext>ctx
        self.resources = Resources(ctx, device, device_cap, pinned_cap, output_cache, chunk_bytes, n_chunks,
                                   copy_threads)
        self.plans = PlanTable()
        self.resident_blocks = ResidentBlocks(ctx)
        self.defer = DeferredWork()
        self.lost = None
        self.trace = trace
        import logging
        self.logger = logging.getLogger("vyre_cuda")
        self.device = device
        self.auto_hook = None
        self.wait_mode = WAIT_POLL
        memset(self.tel, 0, sizeof(self.tel))

    def __dealloc__(self):
        # dropped work still listed (a backend never closed, collected at exit): wait and give its
        # blocks back, else they outlive the process (compute-sanitizer's leak check lists them)
        if self.defer is not None and self.resources is not None and a_loadll(&self.defer.count):
            self.defer.reclaim(self.ctx, self.resources, self.tel, True, True)

    # ---------------------------------------------------------------- bookkeeping
    def counters(self):
        return [tel_read(&self.tel[k]) for k in range(N_COUNTERS)]

    def reset_counters(self):
        cdef int k
        for k in range(N_COUNTERS):
            tel_clear(&self.tel[k])
        self.resources.reset_counters()

    # ---------------------------------------------------------------- calls and handles in flight
    @property
    def closed(self):
        return a_load(&self.closed_flag) != 0

    @property
    def busy(self):
        """Calls running inside the core now (dispatch, result, trim): close() waits for them."""
        return a_loadll(&self.n_busy)

    @property
    def outstanding(self):
        """Dispatches holding resources: handles not yet taken, and dropped work not yet reclaimed."""
        return a_loadll(&self.n_outstanding)

    @property
    def deferred(self):
        """Dropped dispatches whose resources wait on the deferred list."""
        return a_loadll(&self.defer.count)

    def refuse_new(self):
        """close()'s first step: every call starting from now on is refused (those before count in ``busy``)."""
        a_store(&self.closed_flag, 1)

    def reclaim_deferred(self, bint wait=False):
        """Reclaim dropped dispatches' resources: those whose work has finished (``wait``: all,
        waiting for each; close() after its synchronize). Returns how many are left."""
        self._reclaim(True, wait)
        return a_loadll(&self.defer.count)

    def pool_stats(self):
        """The pools' typed stats as telemetry's flat dict, with the prepared-plan counts."""
        stats = flat_pool_stats(self.resources.stats())
        stats["prepared_plans"], stats["graph_execs_live"] = self.plans.stats()
        return stats

    @property
    def xfer(self):
        """The transfer engine (its streaming thresholds are measurement knobs)."""
        return self.resources.xfer

    def trim(self):
        """Free what the pools cache (CudaBackend.trim); counted as running, so close() waits."""
        self._enter()
        try:
            self._reclaim(True, False)  # dropped work that has finished gives its blocks back first
            self.resources.trim()
        finally:
            self._leave()

    def counted(self, fn):
        """Run ``fn()`` counted as running, so close() waits for it (cold reads of pools/driver)."""
        self._enter()
        try:
            return fn()
        finally:
            self._leave()

    def clear_prepared(self):
        """Drop every cached plan and release their graph execs (module eviction, close)."""
        self.plans.clear(<uintptr_t>self.ctx)

    def set_knobs(self, knobs):
        """Copy a :class:`vyre_cuda._knobs.Knobs` into the C fields the hot path reads, and drop
        the cached plans (planning's knobs are baked into them). No other thread may dispatch."""
        cdef TransferEngine xfer = self.resources.xfer
        self.wait_mode = knobs.wait_mode
        xfer.streamed_copy_mode = knobs.streamed_copy_mode
        xfer.min_window = knobs.min_window
        xfer.min_readback_window = knobs.min_readback_window
        xfer.stream_upload_max = knobs.stream_upload_max
        xfer.stream_readback_max = knobs.stream_readback_max
        self.resources.spool.share_after = knobs.stream_share_after
        self.fence_on_demand = knobs.fence_on_demand
        self.clear_prepared()

    def when_settled(self, callback):
        """Call ``callback`` once no dispatch owner is left (now, or at the last _settled); held under
        ``settle_mu``, taken by whichever side sees the count at zero."""
        lock_with_gil(self.settle_mu)
        self.on_settled = callback
        self.settle_mu.unlock()
        if a_loadll(&self.n_outstanding) == 0:
            self._run_on_settled()

    cdef void _settled(self) noexcept:
        # one dispatch's resources went back (recycled, written off or reclaimed)
        if a_add(&self.n_outstanding, -1) == 0 and a_load(&self.closed_flag):
            self._run_on_settled()

    cdef void _run_on_settled(self) noexcept:
        lock_with_gil(self.settle_mu)
        callback, self.on_settled = self.on_settled, None
        self.settle_mu.unlock()
        if callback is not None:
            try:
                callback()
            except BaseException:  # (noexcept: a failed release is logged by the callback)
                pass

    cdef int _reclaim(self, bint every, bint wait) except -1:
        """Dropped work that has finished goes back to the pools (see _deferred; ``every``: query
        past the first still running, ``wait``: wait for each); each such dispatch stops counting."""
        cdef size_t done = self.defer.reclaim(self.ctx, self.resources, self.tel, every, wait)
        while done > 0:
            done -= 1
            self._settled()
        return 0

    def forget_context(self):
        """After a fault released the context: every pool drops its handles with no driver call."""
        self.plans.clear(0)  # (their graph execs died with the context: only forgotten)
        self.resident_blocks.forget()
        self.resources.forget_context()
        self.ctx = NULL  # handles still pending write their resources off instead

    def prepared_for(self, key):
        return self.plans.get(key)

    def insert(self, miss, Prepared prep not None):
        """Cache ``prep`` under the key of a :class:`PlanMiss` (the backend planned it)."""
        if self.closed:
            return  # closed while it was planned: the call that retries refuses with the reason
        config = miss.key[1]
        self.plans.insert(miss.key, prep, config is not None and config.stream is not None, <uintptr_t>self.ctx)

    def trace_refused(self, program, config, bint blocking=True):
        """A traced dispatch refused while planned: its ranges, opened and closed at once (none opened yet)."""
        if self.trace & TRACE_NVTX:
            nvtx_refused(program, config, blocking)

    @property
    def context_handle(self):
        return <uintptr_t>self.ctx

    cdef int _enter(self) except -1:
        # counted first, then `closed` read (seq-cst; close() does the reverse): either close()
        # sees this call counted and waits for it, or this call sees closed.
        a_add(&self.n_busy, 1)
        try:
            self._check_usable()
        except BaseException:
            a_add(&self.n_busy, -1)
            raise
        return 0

    cdef void _hold(self) noexcept:
        # a call on a handle: counted, never refused (the handle answers for a closed backend)
        a_add(&self.n_busy, 1)

    cdef void _leave(self) noexcept:
        a_add(&self.n_busy, -1)

    cdef int _check_usable(self) except -1:
        if a_load(&self.closed_flag):
            raise ValidationError(
                "this CudaBackend is closed",
                "create a new CudaBackend() (or dispatch inside its `with` block)",
            )
        if self.lost is not None:
            status, call = self.lost
            raise DeviceLost(
                f"the backend's CUDA context was lost earlier ({status} raised by {call}); no further "
                "dispatch can run on it",
                "close this backend, call vyre_cuda.reset_device(device), then create a new CudaBackend "
                "(or restart the process)",
                status=status, call=call,
            )
        return 0

    # ---------------------------------------------------------------- lookup
    cdef Prepared _lookup(self, program, inputs, config, vector[Py_buffer]& views, PendingDispatch d,
                          Prepared given):
        """Acquire every input buffer and find the plan (``given``: that one); on any failure,
        PlanMiss included, the buffers are released. A device input's key entry is ("device", n)."""
        cdef Py_ssize_t n
        cdef long long small[8]
        cdef vector[long long] big
        cdef long long* lens = small  # each input's length code (see _plans)
        if type(program) is not Program:
            raise ValidationError(
                f"dispatch needs a vyre_cuda.Program (got {type(program).__name__})",
                "build one with Program(Kernel.cuda(src), [BufferDecl...])",
            )
        if type(inputs) is not list and type(inputs) is not tuple:
            inputs = as_input_list(inputs)
        n = len(inputs)
        views.resize(n)
        if n > 8:
            big.resize(n)
            lens = big.data()
        read_inputs(self.ctx, self.device, self.tel, program, inputs, config, views, lens, d)
        prep = given
        if prep is None:
            try:
                prep = self.plans.find(program, config, lens, n)
            except BaseException:  # an unhashable config field
                release_views(views, n)
                raise
            if prep is None:
                release_views(views, n)
                raise self._miss(lookup_key(program, config, lens, n), config, inputs, d)
        cdef Prepared p = <Prepared>prep
        check_inputs(self.device, program, inputs, config, p, views, d)
        return p

    cdef object _miss(self, key, config, inputs, PendingDispatch d):
        """The PlanMiss of ``key``: what the backend plans with."""
        if config is not None and config.stream is not None:
            # the plan and key hold the stream's handle, never the object
            config = config._without_stream_object()
            key = (key[0], config) + key[2:]
        if d.dev_in.size():  # device inputs: their key entries are ("device", nbytes)
            lengths = tuple(x[1] if type(x) is tuple else x for x in key[2:])
            on_device = frozenset(k for k, x in enumerate(key[2:]) if type(x) is tuple)
            return PlanMiss(key, lengths, config, on_device, inputs)
        return PlanMiss(key, key[2:], config, frozenset(), inputs)

    # ---------------------------------------------------------------- one owner per dispatch
    cdef PendingDispatch _open(self, program, inputs, config, Prepared given):
        """A new owner holding the input views and the prepared plan (``config`` already a
        DispatchConfig or None); raises PlanMiss when no plan is cached."""
        cdef PendingDispatch d
        self._check_usable()
        d = PendingDispatch.__new__(PendingDispatch)
        d.core = self
        d.prep = self._lookup(program, inputs, config, d.views, d, given)
        return d

    cdef object _converted(self, program, config, bint blocking):
        """A config given as a dict (or other mapping), checked; a traced refusal shows its ranges."""
        try:
            return as_config(config)
        except BaseException:
            if self.trace & TRACE_NVTX:
                nvtx_refused(program, config, blocking)
            raise

    cdef PendingDispatch _open_traced(self, program, inputs, config, Prepared given, bint blocking):
        """_open of an NVTX-traced dispatch: a refusal other than a plan miss shows its ranges
        (opened and closed at once: the lookup precedes them)."""
        try:
            return self._open(program, inputs, config, given)
        except PlanMiss:
            raise
        except BaseException:
            nvtx_refused(program, config, blocking)
            raise

    cdef int _begin(self, PendingDispatch d, config, list into, bint want_done, bint timed,
                    unsigned long long* marks) except -1:
        """Output checks and resources of an opened owner, which holds them all and frees them on every path."""
        cdef Prepared p = d.prep
        if a_loadll(&self.defer.count):  # dropped work: what has finished goes back to the pools first
            self._reclaim(False, False)
        d.no_graph = p.graph_off or p.trial_left > 0  # undecided plans issue (the trial alternates)
        if into is not None:  # checked before it runs
            check_into(self, d, into)
        if marks != NULL:
            marks[M_LOOKUP] = now_ns()
        if p.compact_bucket:
            if into is not None:
                d.compact = d.out_checked is not None and fits_in_place(d, d.out_checked)
            else:
                # blocking outputs="device": new arrays overlap nothing (async makes them at result())
                d.compact = p.device_outputs and not want_done
        if d.compact:
            if a_load(&p.resident_state) == 0:
                self.resident_blocks.upload(p, self.resources.spool)
            d.resident = a_load(&p.resident_state) == 2
        # (a resident params block is the slab: no device block or staging taken)
        self.resources.acquire(&d.f, 0 if d.resident else (p.compact_bucket if d.compact else p.bucket),
                               0 if d.resident else (p.compact_staging if d.compact else p.staging_block),
                               p.ring and not d.compact, p.ext, p.ext_stream, want_done or p.ext, timed,
                               p.s_streams - 1 if p.streamed else 0,
                               p.s_streams + (p.s_streams > 1) if p.streamed else 0)
        if d.resident:
            d.f.slab = p.resident
        a_add(&self.n_outstanding, 1)  # (_settled takes it back when the resources return)
        if p.ext:  # the caller's stream object stays alive while its dispatch runs
            if d.keep is None:
                d.keep = []
            d.keep.append(config)
        if d.waits is not None:
            stream_waits(d, d.waits)
        if p.coop is not None:
            p.coop.ensure()
        input_pointers(d)
        if p.ring:
            self.resources.xfer.ensure_ring()
        if p.ring and not d.compact:  # (a params-only dispatch copies nothing through the ring)
            if self.auto_hook is not None:  # before they are asked whether they are page-locked
                sight_buffers(self.auto_hook, d, into)
            self.resources.xfer.wake()  # the copy threads wake while the rest is set up
            with nogil:
                mark_direct(d, want_done)  # (takes the direct gate: leave_gate lets go)
        if p.timeout is not None:
            d.deadline = now_ns() + timeout_ns(p.timeout)
            d.wait_timeout = p.timeout
        return 0

    cdef int _fail(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1:
        """Fail closed: synchronise the stream; recycle on success, leak on failure; raise."""
        cdef cydriver.CUresult sync = cydriver.CUDA_SUCCESS
        cdef InFlight* f = &d.f
        if f.active:
            with nogil:
                sync = cydriver.cuStreamSynchronize(f.stream)
                leave_gate(d, False)
            release_resources(d, sync == cydriver.CUDA_SUCCESS)
        tel_add(&self.tel[T_FAILED_DISPATCHES], 1)
        d._release_views()
        d._release_out_views()
        d._end_range()
        name = status_name(<int>status)
        err = driver_error(name, call.decode() if call != NULL else "?", code=<int>status)
        if name in STICKY_ERRORS:
            self.lost = (name, call.decode() if call != NULL else "?")
        elif sync != cydriver.CUDA_SUCCESS and status_name(<int>sync) in STICKY_ERRORS:
            self.lost = (status_name(<int>sync), "cuStreamSynchronize")
        raise err

    cdef int _after_enqueue(self, PendingDispatch d, cydriver.CUresult status, const char* call) except -1:
        if status != cydriver.CUDA_SUCCESS:
            self._fail(d, status, call)
        d.f.enqueued = True
        count_enqueued(self.tel, d)
        return 0

    # ---------------------------------------------------------------- entry points
    # Each raises PlanMiss when no plan is cached; the backend plans and calls again with the
    # plan as ``prep`` (then the dispatch runs with it, whatever the cache holds by then).
    def dispatch(self, program, inputs, config=None, Prepared prep=None):
        """Run and wait; return the outputs as new numpy arrays."""
        self._enter()
        try:
            return self._blocking(program, inputs, config, None, NULL, prep)
        finally:
            self._leave()

    def dispatch_into(self, program, inputs, outputs, config=None, Prepared prep=None):
        cdef list outs
        self._enter()
        try:
            outs = outputs if type(outputs) is list else as_output_list(outputs)
            try:
                return self._blocking(program, inputs, config, outs, NULL, prep)
            except PlanMiss as miss:
                miss.outputs = outs  # (an iterator of outputs is used up: the retry takes these)
                raise
        finally:
            self._leave()

    def dispatch_profiled(self, program, inputs, config=None, unsigned long long start_ns=0,
                          Prepared prep=None):
        """Like dispatch, also returning the stage durations (ns) aligned with STAGES.

        ``start_ns`` (CLOCK_MONOTONIC, e.g. ``time.perf_counter_ns()`` on Linux) taken by the
        caller just before the call puts the call's own overhead into ``plan_lookup``.
        """
        cdef unsigned long long marks[N_MARKS]
        memset(marks, 0, sizeof(marks))
        marks[M_START] = start_ns
        self._enter()
        try:
            outs = self._blocking(program, inputs, config, None, marks, prep)
        finally:
            self._leave()
        return outs, stage_durations(marks)

    cdef object _blocking(self, program, inputs, config, list into, unsigned long long* marks,
                          Prepared given):
        """The lookup of a blocking dispatch; then, traced or not, the run."""
        cdef PendingDispatch d
        cdef unsigned long long trace_marks[N_MARKS]
        if self.trace and marks == NULL:
            marks = trace_marks
            memset(marks, 0, sizeof(trace_marks))
        if marks != NULL and marks[M_START] == 0:
            marks[M_START] = now_ns()
        if config is not None and type(config) is not DispatchConfig:
            config = self._converted(program, config, True)
        if self.trace & TRACE_NVTX:
            d = self._open_traced(program, inputs, config, given, True)
            return nvtx_blocking(self, d, program, config, into, marks)
        d = self._open(program, inputs, config, given)
        return self._run_blocking(d, config, into, marks)

    cdef object _run_blocking(self, PendingDispatch d, config, list into, unsigned long long* marks):
        """The blocking dispatch: ONE GIL release covers the enqueue, the wait and the copy out,
        so other Python threads run meanwhile and this one re-takes the GIL once."""
        cdef Prepared p = d.prep
        cdef TransferEngine xfer
        cdef cydriver.CUresult st, wst = cydriver.CUDA_SUCCESS, cst = cydriver.CUDA_SUCCESS
        cdef const char* call = NULL
        cdef const char* ccall = NULL
        cdef int outcome = W_DONE
        cdef unsigned long long t_trial = 0
        cdef unsigned long long up_ops[2]
        cdef unsigned long long down_ops[2]
        self._begin(d, config, into, False, False, marks)
        if marks != NULL and nvtx_stage_open():
            nvtx_stage(S_UPLOAD)
        xfer = self.resources.xfer
        outs = new_outputs(self, p, True) if into is None else into
        find_targets(d, outs)
        d.s_drain = p.streamed  # a blocking streamed dispatch copies each chunk out as it lands
        if p.trial_left:
            # graph-or-issued trial: alternate the paths, time the whole round trip
            d.no_graph = (p.trial_left & 1) == 0
            t_trial = now_ns()
        with nogil:
            st = issue(d, p, xfer, marks, &call)
            # d.ops counts the copies of the phase under way: the upload's are kept apart from
            # the readback's, which collect counts into the same fields
            up_ops[0], up_ops[1] = d.ops[0], d.ops[1]
            d.ops[0] = d.ops[1] = 0
            if st == cydriver.CUDA_SUCCESS:
                outcome = wait_nogil(d, &wst)
                mark(marks, M_WAIT)
                if outcome == W_DONE and wst == cydriver.CUDA_SUCCESS:
                    cst = collect(d, p, xfer, &ccall)
                    mark(marks, M_COPYOUT)
        down_ops[0], down_ops[1] = d.ops[0], d.ops[1]
        d.ops[0], d.ops[1] = up_ops[0], up_ops[1]
        self._after_enqueue(d, st, call)  # (counts the direct bytes: before the marks may clear)
        d.ops[0], d.ops[1] = down_ops[0], down_ops[1]
        leave_gate(d, outcome == W_DONE)
        d._after_wait(outcome, wst, b"cuStreamQuery")
        d._after_collect(cst, ccall)
        d._audit()
        if p.trial_left:
            trial_record(p, d.no_graph, now_ns() - t_trial)
        d._finish()
        a_store(&d.state, D_TAKEN)  # (never shared: a blocking dispatch's handle reaches no caller)
        if marks != NULL:
            marks[M_RELEASE] = now_ns()
        if self.trace & TRACE_LOG:
            trace_line(self.logger, p, marks)
        return outs

    def dispatch_async(self, program, inputs, config=None, bint timed=False, Prepared prep=None, outputs=None):
        """Enqueue and return the PendingDispatch that owns everything the GPU still uses;
        ``outputs``: the caller's arrays it writes (checked before anything runs), else its own."""
        cdef list outs = None
        self._enter()
        try:
            if outputs is not None:
                outs = outputs if type(outputs) is list else as_output_list(outputs)
            try:
                return self._async(program, inputs, config, timed, prep, outs)
            except PlanMiss as miss:
                if outs is not None:
                    miss.outputs = outs  # (an iterator of outputs is used up: the retry takes these)
                raise
        finally:
            self._leave()

    cdef PendingDispatch _async(self, program, inputs, config, bint timed, Prepared given, list into):
        """The lookup of an async dispatch; then, traced or not, the enqueue."""
        cdef PendingDispatch d
        cdef unsigned long long t0 = now_ns()
        if config is not None and type(config) is not DispatchConfig:
            config = self._converted(program, config, False)
        if self.trace & TRACE_NVTX:
            d = self._open_traced(program, inputs, config, given, False)
            return nvtx_async(self, d, program, config, timed, t0, into)
        d = self._open(program, inputs, config, given)
        return self._run_async(d, config, timed, t0, into)

    cdef PendingDispatch _run_async(self, PendingDispatch d, config, bint timed, unsigned long long t0,
                                    list into):
        cdef Prepared p = d.prep
        cdef TransferEngine xfer = self.resources.xfer
        cdef cydriver.CUresult st
        cdef const char* call = NULL
        self._begin(d, config, into, True, timed, NULL)
        d.f.t_start = t0
        if into is not None:
            # device arrays are written in stream order, host ones when the result is taken
            d.s_outs = into
            d.named_outputs = True
            find_targets(d, into)
        elif p.streamed:
            # chunks are read back as they finish, into arrays result() returns
            d.s_outs = new_outputs(self, p, False)
            find_targets(d, d.s_outs)
        elif p.device_outputs and not p.ring:
            # result() copies device-to-device from the slab (result_into reads back late)
            d.readback_skipped = True
        if (self.fence_on_demand and p.ext and d.f.has_done and not timed and not p.streamed and not p.ring
                and "_stream_source" in config.__dict__):
            # its event is recorded when a completion is first needed (arm_done): the config holds
            # the caller's stream object, so the stream outlives the handle
            d.f.has_done = False
            d.f.lazy_done = True
        with nogil:
            st = issue(d, p, xfer, NULL, &call)
        self._after_enqueue(d, st, call)
        if d.f.lazy_done:
            self.resources.fence_number(&d.f)
        leave_gate(d, False)  # (result() takes the gate again for its readbacks)
        d.f.t_enqueued = now_ns()
        if not d.any_direct:
            d._release_views()  # every input byte is in staging or on the device: the caller may reuse them
        return d

    def dispatch_timed(self, program, inputs, config=None, Prepared prep=None):
        cdef PendingDispatch pending = self.dispatch_async(program, inputs, config, True, prep)
        return pending.timed_result(pending.prep.timeout)  # a blocking call: the config's timeout


# ---------------------------------------------------------------- a dispatch's life (see _dispatch.pxd)
cdef void release_resources(PendingDispatch d, bint recycle) noexcept:
    """The handle's stream, events, slab and staging back to the pools (``recycle``) or written
    off (the GPU may still use them), once, under the handle's lock (is_ready() queries its event
    under the same lock); then the backend stops counting it."""
    cdef Core core = d.core
    cdef bint released = False
    lock_with_gil(d.mu)
    if d.f.active:
        if recycle:
            core.resources.recycle(&d.f)
        elif core.resources.leak(&d.f):
            tel_add(&core.tel[T_LEAKED_ALLOCATIONS], 1)
        released = True
    d.mu.unlock()
    if released:
        core._settled()


cdef void mark_completed(PendingDispatch d) noexcept:
    # the taking caller's wait saw the GPU done (later waits of that caller return at once)
    d.completed = True
    d.core.resources.fence_seen(&d.f)  # (an event recorded on demand: what it covered is done too)


cdef cydriver.CUresult arm_done(PendingDispatch d) noexcept nogil:
    """A handle whose event waits (``lazy_done``): complete at once when a fence seen complete
    covers it, else its event recorded now. Called with the handle's lock held, before any wait or
    query of it."""
    cdef bint covered = False
    cdef cydriver.CUresult st
    if not d.f.lazy_done:
        return cydriver.CUDA_SUCCESS
    st = d.core.resources.arm_done(&d.f, &covered)
    if covered:
        d.completed = True
    return st


cdef bint is_taken(PendingDispatch d) noexcept:
    cdef int state = a_load(&d.state)
    return state == D_TAKEN or state == D_FAILED


cdef object take(PendingDispatch d, int form, outputs, timeout):
    """result(), result_into() or timed_result() on a shared handle. One caller claims it
    (D_ENQUEUED -> D_TAKING) and publishes the outputs or error; the others wait (each with its
    own timeout) and get that. A claim whose wait ends with the work still running goes back."""
    cdef int state
    cdef unsigned long long deadline = 0
    cdef bint have_deadline = False
    limit = timed = None
    while not a_cas(&d.state, D_ENQUEUED, D_TAKING):
        state = a_load(&d.state)
        if state == D_TAKEN or state == D_FAILED:
            return _published(d, form, outputs)
        if state == D_TAKING:
            if not have_deadline:
                limit = timeout if timeout is not None or d.timed_out else d.prep.timeout
                limit = None if limit is None else _check_timeout(limit)
                deadline = 0 if limit is None else now_ns() + timeout_ns(limit)
                have_deadline = True
            wait_for_taker(d, deadline, limit)
    try:
        if form == TAKE_RESULT and not d.f.timed:
            outs = d._result(timeout)
        elif form == TAKE_INTO:
            outs = d._result_into(outputs, timeout)
        else:
            timed = d._timed_result(timeout)
            d.timing = (timed.wall_ns, timed.device_ns, timed.enqueue_ns, timed.wait_ns)
            outs = timed.outputs
    except BaseException as exc:
        if d.f.active:
            a_store(&d.state, D_ENQUEUED)  # the work still runs, owned by the handle: claim it again
        else:
            d.error = exc
            a_store(&d.state, D_FAILED)
        raise
    d.outs = outs
    a_store(&d.state, D_TAKEN)  # (after the fields: a caller that sees D_TAKEN reads them set)
    return timed if form == TAKE_TIMED else outs  # (a timed handle's result() measured it too)


cdef object _published(PendingDispatch d, int form, outputs):
    """What a caller gets once another took the handle: the same outputs (a list of its own),
    the same figures, or the same error."""
    if a_load(&d.state) == D_FAILED:
        raise d.error
    if form == TAKE_RESULT:
        return list(d.outs)
    if form == TAKE_TIMED:
        if d.timing is None:
            raise ValidationError(
                "this PendingDispatch's outputs were taken by result() or result_into(), without its "
                "timings" if d.f.timed else "this PendingDispatch was enqueued without timing events",
                "call timed_result() first on a dispatch_async(..., timed=True) handle (every caller then "
                "gets the same timings)",
            )
        return TimedDispatchResult(list(d.outs), *d.timing)
    if outputs is d.outs:
        return outputs
    raise ValidationError(
        "this PendingDispatch's outputs were already taken by another call, so they cannot be written "
        "into a second set of arrays",
        "call result() to get the arrays every caller shares (then numpy.copyto into yours), or call "
        "result_into() once",
    )


cdef int poll_ready(PendingDispatch d) except -1:
    """is_ready(): never blocks. The event is queried under the handle's lock, so the caller
    taking the outputs on another thread cannot recycle it meanwhile."""
    cdef cydriver.CUresult status = cydriver.CUDA_SUCCESS
    cdef int state = a_load(&d.state)
    if state != D_ENQUEUED and state != D_TAKING:
        return 1
    if d.core.ctx != NULL:
        bind_context(d.core.ctx)  # (any thread may ask)
    lock_with_gil(d.mu)
    if d.f.active and not d.completed:
        with nogil:
            status = arm_done(d)
            if status == cydriver.CUDA_SUCCESS and not d.completed:
                if d.f.has_done:
                    status = cydriver.cuEventQuery(d.f.done)
                else:
                    status = cydriver.cuStreamQuery(d.f.stream)
        if status == cydriver.CUDA_SUCCESS and not d.completed:
            mark_completed(d)  # (a later drop recycles with no query)
    d.mu.unlock()
    if status == cydriver.CUDA_SUCCESS or status == cydriver.CUDA_ERROR_NOT_READY:
        return status == cydriver.CUDA_SUCCESS
    # the GPU work failed: this caller settles it (claimed, as a taker would), and every caller
    # of result() gets the same error; while another caller takes it, that one reports it
    if a_cas(&d.state, D_ENQUEUED, D_TAKING):
        try:
            d.core._fail(d, status, b"cuEventQuery")
        except BaseException as exc:
            d.error = exc
            a_store(&d.state, D_FAILED)
            raise
    return 1


cdef void drop(PendingDispatch d) noexcept:
    """The handle's last reference went. Never a host wait: seen finished, its resources are
    recycled now; else they go, with every buffer the GPU may still use, to the deferred list."""
    cdef Core core = d.core
    cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
    cdef cydriver.CUcontext prev
    cdef Deferred e
    cdef size_t i
    if not d.f.active:
        return
    if core.ctx == NULL:  # released after a fault: the resources died with the context
        release_resources(d, False)
        return
    if not d.f.enqueued or d.completed:  # nothing on the GPU, or seen finished: back at once
        release_resources(d, True)
        return
    if d.f.lazy_done:  # its event waits: recorded now, or seen covered (no other holder: no lock)
        with nogil:
            if cydriver.cuCtxPushCurrent(core.ctx) == cydriver.CUDA_SUCCESS:
                arm_done(d)  # (a failed record leaves the deferred list querying the stream)
                cydriver.cuCtxPopCurrent(&prev)
        if d.completed:
            release_resources(d, True)
            return
    # not queried: right after the enqueue it would only answer NOT_READY (notes/enqueue-chain.md §3)
    try:
        held = (d.keep, d.s_outs, d.out_checked, d.prep)
    except BaseException:  # no memory for a tuple: wait instead (the old way, never wrong)
        with nogil:
            if cydriver.cuCtxPushCurrent(core.ctx) == cydriver.CUDA_SUCCESS:
                st = cydriver.cuEventSynchronize(d.f.done) if d.f.has_done else cydriver.cuStreamSynchronize(d.f.stream)
                cydriver.cuCtxPopCurrent(&prev)
        release_resources(d, st == cydriver.CUDA_SUCCESS)
        return
    e.f = d.f
    e.nbytes = d.f.bucket + d.f.staging_bytes
    e.views = new vector[Py_buffer]()
    e.views.swap(d.views)
    for i in range(d.out_views.size()):
        e.views.push_back(d.out_views[i])
    d.out_views.clear()
    Py_INCREF(held)
    e.held = <PyObject*>held
    d.f.active = False  # (the entry owns them now; the backend still counts them as outstanding)
    a_store(&d.state, D_DROPPED)
    core.defer.push(e)
    tel_add(&core.tel[T_DEFERRED_DROPS], 1)
    if a_load(&core.closed_flag):
        # close() may have made its last reclaim before the push (it sets the flag first, the
        # push is under the list's lock): nothing else would reclaim this entry, so wait here
        try:
            core._reclaim(True, True)
        except BaseException:  # (noexcept: a failed wait was written off by _reclaim)
            pass
