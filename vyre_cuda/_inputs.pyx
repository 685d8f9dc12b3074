# cython: language_level=3
"""A dispatch's arrays as the hot path sees them.

Each input is acquired as a C-contiguous buffer view (numpy and any buffer exporter) or, where
the buffer protocol fails or refuses, read as a device array by the one reader (_devview), which
also words every refusal of one. An input's length code (its bytes; a device input's as
-1 - bytes) is part of the plan lookup's key. Every function here releases what it acquired when
it raises: the caller owns only what it returns.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyObject_CheckBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport uintptr_t
from libc.string cimport memset

cimport numpy as cnp
from cuda.bindings cimport cydriver

from ._counters cimport T_DEVICE_ARRAYS_READ_IN_C, T_DEVICE_ARRAYS_READ_IN_PYTHON
from ._driver cimport bind_context
from ._devproto cimport DevView, who
from ._devview cimport read_device, device_type
from ._formats cimport kind_ok
from ._prepared cimport InputCheck, OutCheck
from ._waits cimport DevInput
from ._windows cimport auto_registered, page_locked, direct_enter
from .errors import ValidationError
from ._io_checks import dtype_error, input_error, raw_bits
from ._devview import device_input, host_view

cnp.import_array()


cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    void tel_add "vyre::count"(unsigned long long* p, unsigned long long v)


cdef object _UNREAD = object()  # (read_inputs: the config's stream not read yet)


cdef void release_views(vector[Py_buffer]& views, Py_ssize_t n) noexcept:
    """Release the first ``n`` views (the ones acquired so far) and forget all: the owner must not
    release them again."""
    cdef Py_ssize_t i
    for i in range(n):
        PyBuffer_Release(&views[i])
    views.clear()


cdef int _hold_device(PendingDispatch d, Py_ssize_t i, Py_ssize_t n, Py_buffer* view, cydriver.CUdeviceptr ptr,
                      keep, wait) except -1:
    """Input ``i`` of ``n`` is device memory at ``ptr``: the kernel reads it in place, ``keep``
    stays referenced until the dispatch completes, and the dispatch stream waits on ``wait``
    (a producer's stream, or None) first."""
    # an empty placeholder view keeps the release loops uniform (releasing a view of no
    # object does nothing)
    memset(view, 0, sizeof(Py_buffer))
    cdef DevInput zero
    if d.dev_in.size() == 0:
        memset(&zero, 0, sizeof(DevInput))
        d.dev_in.assign(n, zero)
        d.keep = []
    d.dev_in[i].ptr = ptr
    d.keep.append(keep)
    if wait is not None:
        if d.waits is None:
            d.waits = []
        d.waits.append(wait)
    return 0


cdef long long _device_input(cydriver.CUcontext ctx, int device, unsigned long long* tel, program, obj,
                             Py_ssize_t i, Py_ssize_t n, own, Py_buffer* view, PendingDispatch d) except -2:
    """Input ``i`` read as a device array (_devview): its bytes, or -1 when it is none; a refusal
    raises. ``own``: the config's stream (None: the backend's own streams)."""
    bind_context(ctx)  # the pointer queries want our context (a producer's code may move it)
    cdef DevView dv = read_device(obj, device, own, d.cupy_stream, who(program, i, False))
    if dv is None:
        d.cupy_stream = None  # the reader may have run the producer's code
        return -1
    d.cupy_stream = dv.memo
    _hold_device(d, i, n, view, dv.ptr, dv.keep, dv.wait)
    tel_add(&tel[T_DEVICE_ARRAYS_READ_IN_PYTHON if dv.by_python else T_DEVICE_ARRAYS_READ_IN_C], 1)
    d.dev_in[i].kind = dv.kind_code
    d.dev_in[i].size = dv.itemsize
    return <long long>dv.nbytes


cdef Py_ssize_t _cold_input(program, obj, Py_ssize_t i, Py_buffer* view, exc) except -1:
    """An input the buffer protocol refused that is no device array: the raw bits of a
    format-less dtype, or a CPU DLPack tensor's numpy view. Returns its length; raises a typed error."""
    bits = raw_bits(obj)  # bfloat16 & co. export no format: take their raw bits
    if bits is None:
        bits = host_view(obj)
    if bits is None:
        raise input_error(program, i, obj, exc) from None
    try:
        PyObject_GetBuffer(bits, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    except Exception:
        raise input_error(program, i, obj, exc) from None
    return view.len


cdef int read_inputs(cydriver.CUcontext ctx, int device, unsigned long long* tel, program, inputs,
                     config, vector[Py_buffer]& views, long long* lens, PendingDispatch d) except -1:
    """Acquire each input into ``views[i]`` and its length code into ``lens[i]``; a device input
    is held by ``d``. On failure every view acquired so far is released."""
    cdef Py_ssize_t i, n = len(inputs)
    cdef long long nbytes
    cdef Py_buffer* view
    own = _UNREAD  # the caller's stream, read at the first device input (one attribute read)
    for i in range(n):
        view = &views[i]
        obj = inputs[i]
        try:
            # not numpy: a device array (no buffer protocol, or a refusing one, as CuPy's), read
            # in C when its producer allows
            nbytes = -1
            if type(obj) is not cnp.ndarray and (not PyObject_CheckBuffer(obj) or device_type(obj)):
                if own is _UNREAD:
                    own = None if config is None else config.stream
                nbytes = _device_input(ctx, device, tel, program, obj, i, n, own, view, d)
            if nbytes >= 0:
                lens[i] = -1 - nbytes
                continue
            if type(obj) is not cnp.ndarray:
                d.cupy_stream = None  # a buffer exporter may run Python code (__buffer__)
            try:
                PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                lens[i] = view.len
            except Exception as exc:
                if type(obj) is not cnp.ndarray and PyObject_CheckBuffer(obj):
                    if own is _UNREAD:
                        own = None if config is None else config.stream
                    nbytes = _device_input(ctx, device, tel, program, obj, i, n, own, view, d)  # (and learns its type)
                lens[i] = -1 - nbytes if nbytes >= 0 else _cold_input(program, obj, i, view, exc)
        except BaseException:
            release_views(views, i)
            raise
    return 0


cdef int check_inputs(int device, program, inputs, config, Prepared p, vector[Py_buffer]& views,
                      PendingDispatch d) except -1:
    """Each input's element type against its declaration: host views by their buffer format,
    device inputs by what the reader saw. A mismatch releases every view and raises the typed error."""
    cdef InputCheck* ic
    cdef Py_buffer* view
    cdef size_t k
    cdef char got
    for k in range(p.dev_checks.size() if d.dev_in.size() else 0):
        ic = &p.dev_checks[k]
        got = d.dev_in[ic.index].kind
        if ic.kind == 0 or d.dev_in[ic.index].size == 1:
            continue  # untyped, or raw bytes reinterpreted on purpose
        if d.dev_in[ic.index].size != ic.itemsize or got != ic.kind:
            release_views(views, views.size())
            device_input(program, ic.index, inputs[ic.index], device,
                         None if config is None else config.stream)  # raises the typed error
            raise ValidationError(  # (its producer changed it between the two reads)
                f"input {ic.index} changed while read: it no longer holds {ic.itemsize}-byte items of kind "
                f"{chr(ic.kind)!r}", "pass a device array of the declared dtype, unchanged during the call")
    for k in range(p.checks.size()):
        ic = &p.checks[k]
        view = &views[ic.index]
        if not kind_ok(ic.kind, ic.itemsize, view.format, view.itemsize):
            fmt = view.format.decode() if view.format != NULL else "B"
            release_views(views, views.size())
            raise dtype_error(program, ic.index, fmt, view.itemsize, inputs[ic.index])
    return 0


cdef tuple device_outputs(cydriver.CUcontext ctx, int device, Prepared p, list into, PendingDispatch d):
    """The views of ``into`` when every output is a device array right for its slot (dtype, exact
    size, writable); else None, and the cold checks run (and word any refusal)."""
    cdef Py_ssize_t k, n = len(into)
    cdef DevView dv
    cdef OutCheck* oc
    if n != <Py_ssize_t>p.out_checks.size():
        return None
    bind_context(ctx)
    # a tuple, not a list: holding only DevViews (which the GC does not track), the GC stops
    # tracking it at its first pass, so a dispatch kept in flight adds one object fewer to the
    # older generations (whose growth sets how often the GC walks the whole heap)
    cdef tuple views = PyTuple_New(n)
    for k in range(n):
        obj = into[k]
        if type(obj) is cnp.ndarray:
            return None  # a host output: the Python checks take them all
        dv = read_device(obj, device, <uintptr_t>p.ext_stream if p.ext else None, d.cupy_stream, who(p.plan, k, True))
        if dv is None:
            d.cupy_stream = None
            return None
        d.cupy_stream = dv.memo
        oc = &p.out_checks[k]
        if dv.read_only or dv.nbytes != oc.nbytes or dv.itemsize != oc.itemsize or dv.kind_code != oc.kind:
            return None
        Py_INCREF(dv)
        PyTuple_SET_ITEM(views, k, dv)
    return views


cdef void input_pointers(PendingDispatch d) noexcept:
    """Each input's bytes as the enqueue reads them; none yet read in place (mark_direct)."""
    cdef size_t i, n = d.views.size()
    d.input_ptrs.resize(n)
    d.direct.assign(n, 0)
    for i in range(n):
        d.input_ptrs[i] = <const char*>d.views[i].buf


cdef int sight_buffers(hook, PendingDispatch d, list into) except -1:
    """The automatic registration policy sees this dispatch's host buffers (a buffer it
    registers, or holds registered, moves by direct DMA: see _hostreg)."""
    cdef size_t i
    for i in range(d.views.size()):
        # (a device input's slot holds no buffer: its obj is NULL, not None)
        if <void*>d.views[i].obj != NULL and d.views[i].len:
            hook(d.views[i].obj, <uintptr_t>d.views[i].buf, <size_t>d.views[i].len)
    if into is not None:
        for k in range(len(into)):
            if d.out_checked is None or d.out_checked[k] is None:  # a host output
                hook(into[k], None, None)
    return 0


cdef void mark_direct(PendingDispatch d, bint want_done) noexcept nogil:
    """Which inputs the GPU reads in place (page-locked), under the direct gate (_windows). An
    async dispatch still stages what only the automatic policy page-locked."""
    cdef size_t i
    d.gate = direct_enter()  # held until the direct copies are enqueued (_waits.leave_gate)
    if not d.gate:
        return  # (the direct gate is closing: every input, and every output, stages)
    for i in range(d.views.size()):
        if page_locked(d.views[i].buf, d.views[i].len) and not (
                want_done and auto_registered(d.views[i].buf, d.views[i].len)):
            d.direct[i] = 1
            d.any_direct = True
