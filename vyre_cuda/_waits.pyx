# cython: language_level=3
"""Waits and PendingDispatch's face: result(), result_into(), timed_result(), is_ready(), await.

Every dispatch is one :class:`PendingDispatch` once it holds resources; its life is the state
machine of :mod:`vyre_cuda._dispatch`. This module waits and copies the outputs out for the one
caller that takes them. Waits spin briefly, then sleep-poll so a timeout or Ctrl-C can end them.
"""

cimport cython
from cpython.buffer cimport PyBuffer_Release
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport uintptr_t, uint32_t
from libc.string cimport memcpy
from posix.time cimport nanosleep, timespec

from cuda.bindings cimport cydriver

from ._counters cimport (
    T_SYNC_POINTS, T_INTERRUPTED_WAITS, T_D2H_OPS, T_D2H_BYTES, T_RING_CHUNKS, T_DIRECT_D2H_BYTES,
    T_STAGED_D2H_BYTES, T_FAILED_DISPATCHES, T_TIMED_DISPATCHES, T_TIMED_WALL_NS, T_TIMED_DEVICE_NS,
    T_TIMED_ENQUEUE_NS, T_TIMED_WAIT_NS,
)
from ._driver cimport check_cu, bind_context, now_ns
from ._transfer cimport TransferEngine
from ._prepared cimport Prepared
from ._dispatch cimport (
    Core, D_TAKING, a_load, release_resources, tel_add, take, poll_ready, drop, is_taken, mark_completed, arm_done,
    TAKE_RESULT, TAKE_INTO, TAKE_TIMED,
)
from ._launch cimport collect, late_device_outputs, late_readbacks
from ._tracing cimport nvtx_push, nvtx_pop, nvtx_end, S_RESULT
from .config import _timeout as _check_timeout
from .errors import DispatchFailed, ValidationError
from .telemetry import TimedDispatchResult
from ._io_checks import as_output_list, check_outputs
from ._outputs cimport new_outputs, find_targets, mark_out_direct, copy_streamed
from ._windows cimport direct_enter, direct_leave
from ._pools cimport lock_with_gil


cdef enum:
    # waits: spin this long (as cuStreamSynchronize would), then sleep-poll so Ctrl-C and timeouts work
    SPIN_NS = 2000000
    SIGNAL_CHECK_NS = 20000000


class _Timeout(Exception):
    pass


cdef unsigned long long timeout_ns(timeout) except? 0:
    # the config bounds timeouts; anything beyond ~292 years means "no bound"
    t = float(timeout) * 1e9
    if t >= 9.2e18:
        return 0xFFFFFFFFFFFFFFFF // 2
    return <unsigned long long>t if t > 1 else 1


def _timeout_error(timeout, pending):
    err = DispatchFailed(
        f"the dispatch did not complete within its timeout of {timeout} s",
        "raise DispatchConfig(timeout=...) (or result(timeout=...)), or wait on the PendingDispatch "
        "in this error's .pending attribute (its result() waits without bound by default); its "
        "resources stay owned by it until it completes",
        status="timeout", call="wait",
    )
    err.pending = pending
    return err


cdef int _check_signals(PendingDispatch d) noexcept with gil:
    # Ctrl-C while waiting: keep the KeyboardInterrupt (or whatever a handler raised) on the owner
    try:
        PyErr_CheckSignals()
    except BaseException as exc:
        d.interrupt = exc
        return 1
    return 0


cdef void leave_gate(PendingDispatch d, bint keep_direct) noexcept nogil:
    """Let go of the direct gate once every direct copy marked so far is enqueued (unless
    ``keep_direct``, the marks are cleared: a later copy stages or takes the gate again)."""
    cdef size_t i
    if not d.gate:
        return
    if not keep_direct:
        for i in range(d.direct.size()):
            d.direct[i] = 0
        for i in range(d.out_direct.size()):
            d.out_direct[i] = 0
    d.gate = False
    direct_leave()


cdef int wait_for_taker(PendingDispatch d, unsigned long long deadline, limit) except -1:
    """Wait without the GIL until the caller that claimed ``d`` publishes or gives it back (spin,
    then naps up to 200 us; Ctrl-C every 20 ms); past ``deadline`` (0: none), a timeout error."""
    cdef timespec nap
    cdef long interval = 2000
    cdef unsigned long long t, next_signals = now_ns() + 20000000
    with nogil:
        while a_load(&d.state) == D_TAKING:
            t = now_ns()
            if deadline and t >= deadline:
                with gil:
                    raise _timeout_error(limit, d)
            if t >= next_signals:
                with gil:
                    PyErr_CheckSignals()
                next_signals = t + 20000000
            nap.tv_sec = 0
            nap.tv_nsec = interval
            nanosleep(&nap, NULL)
            if interval < 200000:
                interval *= 2
    return 0


cdef int wait_nogil(PendingDispatch d, cydriver.CUresult* status) noexcept nogil:
    """Wait for the dispatch's GPU work: spin, then sleep between polls so a timeout or Ctrl-C can
    end it (``Core.wait_mode``). Returns W_DONE (``status`` says how it went), W_TIMEOUT or
    W_INTERRUPTED."""
    cdef InFlight* f = &d.f
    cdef int mode = d.core.wait_mode
    cdef cydriver.CUresult st
    cdef unsigned long long t0 = now_ns(), t, next_signals = 0
    cdef timespec nap
    cdef long interval = 10000
    cdef int _spin
    if mode == WAIT_SYNC and not d.deadline:
        status[0] = cydriver.cuEventSynchronize(f.done) if f.has_done else cydriver.cuStreamSynchronize(f.stream)
        return W_DONE
    while True:
        if f.has_done:
            st = cydriver.cuEventQuery(f.done)
        else:
            st = cydriver.cuStreamQuery(f.stream)
        if st != cydriver.CUDA_ERROR_NOT_READY:
            status[0] = st
            return W_DONE
        t = now_ns()
        if d.deadline and t >= d.deadline:
            return W_TIMEOUT
        if t - t0 < SPIN_NS:
            if mode == WAIT_POLL:
                for _spin in range(8):
                    _relax()
            continue
        if t >= next_signals:
            if _check_signals(d):
                return W_INTERRUPTED
            next_signals = t + SIGNAL_CHECK_NS
        nap.tv_sec = 0
        nap.tv_nsec = interval
        nanosleep(&nap, NULL)
        if interval < 200000:
            interval *= 2


cdef extern from "_relax.h":
    void _relax "vyre_cpu_relax"() noexcept nogil  # the core's one spin pause


@cython.final
@cython.freelist(16)
cdef class PendingDispatch:
    """A dispatch in flight, and the one owner of everything it uses.

    It holds the stream, events, slab and staging (and page-locked inputs the GPU reads) until the
    outputs are taken or it is dropped. A timed-out or interrupted dispatch is the exception's
    ``.pending``.
    """

    def __init__(self):
        raise TypeError("PendingDispatch is made by CudaBackend.dispatch_async(); it has no public constructor")

    cdef void _release_views(self) noexcept:
        cdef size_t i
        for i in range(self.views.size()):
            PyBuffer_Release(&self.views[i])
        self.views.clear()

    cdef void _release_out_views(self) noexcept:
        cdef size_t i
        for i in range(self.out_views.size()):
            PyBuffer_Release(&self.out_views[i])
        self.out_views.clear()

    cdef int _check_takeable(self) except -1:
        # (called by the one caller _dispatch.take let in: no other thread touches the work now)
        if a_load(&self.core.closed_flag) and self.f.active:
            raise ValidationError(
                "this dispatch's backend was closed before its result was taken; the outputs are "
                "gone (its resources are freed when this handle is dropped)",
                "take results before CudaBackend.close() (or leave the `with` block only after them)",
            )
        if not self.f.active:
            self.core._check_usable()
            raise DispatchFailed(
                "this dispatch failed earlier; its outputs do not exist",
                "handle the error raised by the failing call and dispatch again",
                status="failed", call="result",
            )
        with nogil:
            bind_context(self.core.ctx)  # results may be taken on another thread
        return 0

    cdef int _after_wait(self, int outcome, cydriver.CUresult status, const char* call) except -1:
        """Turn a wait's outcome into completion or an exception; the work stays owned by ``d``
        when it is still running (timeout, interrupt)."""
        cdef PendingDispatch d = self
        cdef Core core = self.core
        tel_add(&core.tel[T_SYNC_POINTS], 1)
        if outcome == W_DONE:
            if status != cydriver.CUDA_SUCCESS:
                core._fail(d, status, call)
            mark_completed(d)
            return 0
        d._release_out_views()
        if not d.any_direct:
            d._release_views()
        if outcome == W_TIMEOUT:
            d.timed_out = True
            raise _timeout_error(d.wait_timeout, d)
        tel_add(&core.tel[T_INTERRUPTED_WAITS], 1)
        exc, d.interrupt = d.interrupt, None
        try:
            exc.pending = d
        except Exception:
            pass
        raise exc

    cdef int _after_collect(self, cydriver.CUresult status, const char* call) except -1:
        cdef PendingDispatch d = self
        cdef Core core = self.core
        cdef Prepared p = d.prep
        cdef size_t k
        cdef unsigned long long direct = 0
        d._release_out_views()
        if status != cydriver.CUDA_SUCCESS:
            core._fail(d, status, call)
        if p.ring:
            tel_add(&core.tel[T_D2H_OPS], p.tel_d2h_ops if p.streamed else d.ops[0])
            tel_add(&core.tel[T_RING_CHUNKS], d.ops[1])
            for k in range(d.out_direct.size()):
                if d.out_direct[k]:
                    direct += d.out_pieces[k].n
        elif not d.readback_skipped:
            tel_add(&core.tel[T_D2H_OPS], p.tel_d2h_ops)
        if p.ring or not d.readback_skipped:
            tel_add(&core.tel[T_D2H_BYTES], p.tel_d2h_bytes)
            tel_add(&core.tel[T_DIRECT_D2H_BYTES], direct)
            tel_add(&core.tel[T_STAGED_D2H_BYTES], p.tel_d2h_bytes - direct)
        d.ops[0] = d.ops[1] = 0
        return 0

    cdef int _audit(self) except -1:
        cdef PendingDispatch d = self
        cdef Core core = self.core
        cdef uint32_t counter
        cdef Prepared p = d.prep
        if p.coop is None:
            return 0
        memcpy(&counter, d.f.staging + p.audit_offset, 4)
        if counter > p.barrier_ceiling:
            tel_add(&core.tel[T_FAILED_DISPATCHES], 1)
            d._finish()
            raise DispatchFailed(
                f"grid barrier audit failed: the counter reached {counter} arrivals, more than the "
                f"{p.barrier_ceiling} that {p.grid[0] * p.grid[1] * p.grid[2]} blocks can produce "
                "through the program's phase barriers",
                "call vyre_grid_sync() only between phases (phases - 1 times per launch), never "
                "conditionally or in a loop",
                status="barrier_audit", call="vyre_grid_sync",
            )
        return 0

    cdef int _wait(self, timeout) except -1:
        cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
        cdef int outcome
        if self.f.lazy_done:  # (its event is recorded now, unless a fence seen complete covers it)
            lock_with_gil(self.mu)
            with nogil:
                st = arm_done(self)
            self.mu.unlock()
            if st != cydriver.CUDA_SUCCESS:
                self._after_wait(W_DONE, st, b"cuEventRecord")
        if self.completed:
            return 0
        if timeout is None and not self.timed_out:
            timeout = self.prep.timeout  # the dispatch's own timeout, until it has expired once
        self.wait_timeout = None if timeout is None else _check_timeout(timeout)
        self.deadline = 0 if self.wait_timeout is None else now_ns() + timeout_ns(self.wait_timeout)
        with nogil:
            outcome = wait_nogil(self, &st)
        self._after_wait(outcome, st, b"cuEventQuery")
        return 0

    cdef int _collect(self, list outs) except -1:
        cdef cydriver.CUresult st
        cdef const char* call = NULL
        cdef Prepared p = self.prep
        cdef TransferEngine xfer = self.core.resources.xfer
        if p.ring and not self.gate:
            self.gate = direct_enter()  # (its readbacks may go straight into page-locked outputs)
        try:
            if self.s_outs is None:
                find_targets(self, outs)
            elif self.gate:
                mark_out_direct(self)
            if self.readback_skipped:
                late_readbacks(self)  # (only when an output turned out to be host memory)
            if self.out_dev.size() and not self.out_dev_issued:
                late_device_outputs(self)
        except BaseException:
            leave_gate(self, False)  # (the handle may live on: it must not keep the gate)
            raise
        with nogil:
            st = collect(self, p, xfer, &call)
            leave_gate(self, True)
        self._after_collect(st, call)
        self._audit()
        if self.s_outs is not None and outs is not self.s_outs:
            copy_streamed(self, outs)
        return 0

    cdef list _new_outputs(self):
        # a streamed dispatch_async read back into arrays of its own as it ran (its device
        # outputs skip the array pool's synchronize: result() waits for this dispatch only)
        return self.s_outs if self.s_outs is not None else new_outputs(self.core, self.prep, False)

    def is_ready(self):
        """True once the GPU has finished, or the outputs were taken (never blocks). A dispatch
        that failed on the GPU reads as ready: :meth:`result` raises its error."""
        return poll_ready(self) != 0

    def result(self, timeout=None):
        """Wait, then return the outputs (declaration order): new numpy arrays, new device arrays
        (``outputs="device"``) or the arrays named in ``dispatch_async(..., outputs=...)``.

        Any number of threads and event loops may call it, as ``Future.result()``: every caller
        gets the same arrays (in a list of its own) or the dispatch's error.

        ``timeout`` (seconds) bounds this wait. None applies ``DispatchConfig(timeout=...)`` until
        that has expired once, then waits for the end. On expiry, ``DispatchFailed`` (status
        ``"timeout"``) is raised and this handle still owns the work."""
        return self._face(TAKE_RESULT, None, timeout)

    def result_into(self, outputs, timeout=None):
        """Wait, then copy the outputs into the caller's arrays (checked) and return them.
        ``timeout`` as for :meth:`result`. Once another call took the outputs, a second set of
        arrays cannot be filled: that raises ``ValidationError`` (take them with :meth:`result`)."""
        return self._face(TAKE_INTO, outputs, timeout)

    def timed_result(self, timeout=None):
        """Wait; return TimedDispatchResult(outputs, wall_ns, device_ns, enqueue_ns, wait_ns).
        ``timeout`` as for :meth:`result`; every caller gets the same figures."""
        return self._face(TAKE_TIMED, None, timeout)

    def _face(self, int form, outputs, timeout):
        cdef Core core = self.core
        core._hold()  # counted as running: close() waits for it
        try:
            if self.traced:
                nvtx_push(b"result", S_RESULT)
                try:
                    return take(self, form, outputs, timeout)
                finally:
                    nvtx_pop()
            return take(self, form, outputs, timeout)
        finally:
            core._leave()

    cdef object _result(self, timeout):
        self._check_takeable()
        self._wait(timeout)
        outs = self._new_outputs()
        self._collect(outs)
        self._finish()
        return outs

    cdef object _result_into(self, outputs, timeout):
        outputs = as_output_list(outputs)
        if self.named_outputs:
            raise ValidationError(
                "this dispatch writes the outputs named in dispatch_async(..., outputs=...); "
                "result_into cannot send them elsewhere",
                "call result() (it returns those arrays), or name the arrays you want in dispatch_async",
            )
        self._check_takeable()
        stream = <uintptr_t>self.prep.ext_stream if self.prep.ext else None
        self.out_checked = tuple(check_outputs(self.prep.plan, outputs, self.core.device, stream))
        self._wait(timeout)
        self._collect(outputs)
        self._finish()
        return outputs

    cdef object _timed_result(self, timeout):
        cdef float ms = 0
        cdef unsigned long long t_wait0
        if not self.f.timed:
            raise ValidationError(
                "this PendingDispatch was enqueued without timing events",
                "use CudaBackend.dispatch_async(program, inputs, timed=True) or dispatch_timed()",
            )
        self._check_takeable()
        t_wait0 = now_ns()
        self._wait(timeout)
        check_cu(cydriver.cuEventElapsedTime(&ms, self.f.t0, self.f.t1), b"cuEventElapsedTime")
        outs = self._new_outputs()
        self._collect(outs)
        t_end = now_ns()
        wall = t_end - self.f.t_start
        enqueue = self.f.t_enqueued - self.f.t_start
        wait = t_end - t_wait0
        device = <unsigned long long>(ms * 1e6)
        self._finish()
        cdef Core core = self.core
        tel_add(&core.tel[T_TIMED_DISPATCHES], 1)
        tel_add(&core.tel[T_TIMED_WALL_NS], wall)
        tel_add(&core.tel[T_TIMED_DEVICE_NS], device)
        tel_add(&core.tel[T_TIMED_ENQUEUE_NS], enqueue)
        tel_add(&core.tel[T_TIMED_WAIT_NS], wait)
        return TimedDispatchResult(outs, wall, device, enqueue, wait)

    cdef void _finish(self) noexcept:
        # the GPU is done: the resources go back to the pools, the caller's buffers are let go
        leave_gate(self, True)
        release_resources(self, True)
        self._release_views()
        self._release_out_views()
        self.keep = None
        self._end_range()

    cdef void _end_range(self) noexcept:
        if self.nvtx_started:  # a traced async dispatch's range ends with it (any path)
            self.nvtx_started = False
            nvtx_end(self.nvtx_range)

    def __await__(self):
        """``await pending``: the outputs (as :meth:`result`) once the GPU is done, without blocking
        the event loop; cancelling the await leaves the work owned by this handle."""
        from ._aio import awaitable
        return awaitable(self, <uintptr_t>self.core.ctx).__await__()

    def wait_async(self):
        """An awaitable that completes when the GPU is done (the outputs stay here: then
        :meth:`result`, :meth:`result_into` or :meth:`timed_result` return at once)."""
        from ._aio import ready
        return ready(self, <uintptr_t>self.core.ctx)

    @property
    def route(self):
        return self.prep.route_name

    @property
    def done(self):
        """True once the outputs were taken (or the dispatch failed)."""
        return is_taken(self)

    def __dealloc__(self):
        # dropped un-taken: never waits for the GPU (_dispatch.drop defers what it may still use)
        leave_gate(self, False)
        if self.core is not None:
            drop(self)
        self._end_range()
        self._release_views()
        self._release_out_views()
