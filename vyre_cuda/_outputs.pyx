# cython: language_level=3
"""A dispatch's outputs: new arrays for them, where each one's bytes go, and the copy of a
streamed ``dispatch_async``'s outputs into the caller's arrays.

An output's target is a host piece, a device-to-device copy from the slab, or (a device array
sharing no byte with another device buffer) the kernel argument itself.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE
from libc.stdint cimport uintptr_t

cimport numpy as cnp
from cuda.bindings cimport cydriver

from ._pools cimport lend_block
from ._transfer cimport TransferEngine
from ._windows cimport CopyTask, Piece, page_locked
from ._prepared cimport Prepared, DevCopy, InPlace
from ._counters cimport T_DEVICE_ARRAYS_READ_IN_C, T_DEVICE_ARRAYS_READ_IN_PYTHON
from ._dispatch cimport Core, tel_add
from ._inputs cimport device_outputs
from ._waits cimport PendingDispatch
from ._launch cimport stream_waits
from ._devarray cimport DeviceArray
from ._devproto cimport DevView, who
from ._devview cimport read_device
from ._io_checks import check_outputs
from numpy import frombuffer as _frombuffer

cnp.import_array()

cdef enum:
    OUTPUT_CACHE_MIN = 1 << 20  # outputs from this size up come from the recycled host pool


cdef list new_outputs(Core core, Prepared p, bint may_wait):
    """New output arrays of a dispatch: numpy (large ones in recycled host memory) or, with
    ``DispatchConfig(outputs="device")``, device arrays (``may_wait``: whether their pool may
    synchronize the device to reuse memory; not in an asynchronous enqueue)."""
    cdef list outs = []
    cdef cnp.npy_intp dim
    cdef Py_ssize_t k
    cdef size_t nbytes
    if p.device_outputs:
        for k in range(len(p.out_counts)):
            nbytes = p.outputs[k].nbytes
            outs.append(DeviceArray._empty(nbytes // (<cnp.dtype>p.out_dtypes[k]).itemsize, p.out_dtypes[k],
                                           core.device, may_wait))
        return outs
    for k in range(len(p.out_counts)):
        dim = p.out_counts[k]
        nbytes = p.outputs[k].nbytes
        if nbytes != <size_t>dim * (<cnp.dtype>p.out_dtypes[k]).itemsize:
            # an output_byte_range reads back part of the buffer: return those bytes' elements
            dim = nbytes // (<cnp.dtype>p.out_dtypes[k]).itemsize
        if p.ring and nbytes >= OUTPUT_CACHE_MIN and core.resources.opool.cap_bytes:
            # a large output: recycled host memory, already faulted in (see HostPool)
            outs.append(_frombuffer(lend_block(core.resources.opool, nbytes), dtype=p.out_dtypes[k], count=dim))
        else:
            outs.append(cnp.PyArray_EMPTY(1, &dim, p.out_typenums[k], 0))
    return outs


cdef int check_into(Core core, PendingDispatch d, list into) except -1:
    """The caller's output arrays, checked before the dispatch runs; their producers' streams are
    waited on with the inputs' (one query per stream; every export was read before that wait is
    issued, and before any GPU work of the dispatch)."""
    cdef Prepared p = d.prep
    d.out_checked = device_outputs(core.ctx, core.device, p, into, d)
    if d.out_checked is None:
        d.out_checked = tuple(check_outputs(p.plan, into, core.device,
                                            <uintptr_t>p.ext_stream if p.ext else None))
    for v in d.out_checked:
        if v is None:
            continue
        tel_add(&core.tel[T_DEVICE_ARRAYS_READ_IN_PYTHON if (<DevView>v).by_python else T_DEVICE_ARRAYS_READ_IN_C], 1)
        if (<DevView>v).wait is not None:
            if d.waits is None:
                d.waits = []
            d.waits.append((<DevView>v).wait)
    return 0


cdef int find_targets(PendingDispatch d, list outs) except -1:
    """Where each output's bytes go: numpy data pointers, or buffers held until collected."""
    cdef Core core = d.core
    cdef Prepared p = d.prep
    cdef Py_ssize_t k, n = len(outs)
    cdef Piece piece
    cdef DevCopy dc
    cdef InPlace ip
    cdef list waits = None
    cdef bint checked
    d.out_pieces.clear()
    d.out_dev.clear()
    d.out_inplace.clear()
    d.out_direct.assign(n, 0)
    if p.streamed:
        d.s_out_dev.assign(n, 0)
    for k in range(n):
        piece.dev_offset = p.outputs[k].offset
        piece.n = p.outputs[k].nbytes
        dv = None
        checked = False
        if type(outs[k]) is cnp.ndarray:
            piece.host = <char*>cnp.PyArray_DATA(<cnp.ndarray>outs[k])
        elif d.out_checked is not None and d.out_checked[k] is not None:
            dv = d.out_checked[k]  # a device array check_outputs already checked
            checked = True  # (its producer's stream was waited on with the inputs')
        elif p.device_outputs and type(outs[k]) is DeviceArray:
            dv = read_device(outs[k], core.device, None, None, who(p.plan, k, True))  # one new_outputs made
            if dv is None or (<DevView>dv).nbytes != piece.n:
                raise RuntimeError(f"vyre_cuda internal error: output {k} is not the array made for it")
        else:  # a host buffer the output checks took (every caller's output went through them)
            d.out_views.resize(d.out_views.size() + 1)
            try:
                PyObject_GetBuffer(outs[k], &d.out_views.back(), PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
            except BaseException:
                d.out_views.pop_back()
                d._release_out_views()
                raise
            piece.host = <char*>d.out_views.back().buf
        if dv is not None:  # a device array: copied device-to-device from the slab, not read back
            dc.ptr, dv_keep, dv_wait = (<DevView>dv).ptr, (<DevView>dv).keep, (<DevView>dv).wait
            dc.dev_offset, dc.n = piece.dev_offset, piece.n
            if p.streamed:
                d.s_out_dev[k] = dc.ptr  # each chunk's rows, device-to-device from its slot
            elif (not d.f.enqueued and p.out_args[k] >= 0 and piece.n
                  and not _overlaps_input(d, dc.ptr, piece.n)):
                # not yet launched, and no input shares its bytes: the kernel writes it
                ip.arg, ip.ptr, ip.n, ip.zero = <size_t>p.out_args[k], dc.ptr, piece.n, p.out_zero[k] != 0
                d.out_inplace.push_back(ip)
            elif d.compact:
                # (decided in Core._begin by _fits_in_place: the slab has no room for it)
                raise RuntimeError(f"vyre_cuda internal error: output {k} was planned in place")
            else:
                d.out_dev.push_back(dc)
            if d.keep is None:
                d.keep = []
            d.keep.append(dv_keep)
            if dv_wait is not None and not checked:
                waits = [dv_wait] if waits is None else waits + [dv_wait]
            piece.host = NULL
            piece.n = 0
        d.out_pieces.push_back(piece)
    if waits is not None:
        stream_waits(d, waits)  # before the copies into them are enqueued
    if not d.f.enqueued and not p.ring and not p.streamed:
        # every output a device array: the slab's output bytes need not come back to staging
        d.readback_skipped = True
        for k in range(n):
            if d.out_pieces[k].n:
                d.readback_skipped = False
                break
    if p.ring and d.gate:
        mark_out_direct(d)
    return 0


cdef void mark_out_direct(PendingDispatch d) noexcept:
    """Which outputs the readback writes straight into (page-locked host memory). Only while the
    dispatch holds the direct gate (_windows)."""
    cdef size_t k
    with nogil:
        for k in range(d.out_pieces.size()):
            d.out_direct[k] = d.out_pieces[k].n != 0 and page_locked(d.out_pieces[k].host, d.out_pieces[k].n)


cdef int fits_in_place(PendingDispatch d, tuple views) except -1:
    """Whether every output of ``views`` (checked device views, in order) will be written in
    place by :meth:`_targets`: the same rule, decided before the slab is taken."""
    cdef Prepared p = d.prep
    cdef size_t k, j, n, m
    cdef cydriver.CUdeviceptr ptr, other
    if len(views) != <Py_ssize_t>p.out_args.size():
        return 0
    for k in range(len(views)):
        v = views[k]
        if v is None or p.out_args[k] < 0 or p.outputs[k].nbytes == 0:
            return 0
        ptr, n = (<DevView>v).ptr, p.outputs[k].nbytes
        if _shares_device_input(d, ptr, n):
            return 0
        for j in range(k):
            other, m = (<DevView>views[j]).ptr, p.outputs[j].nbytes
            if other < ptr + n and ptr < other + m:
                return 0
    return 1


cdef bint _shares_device_input(PendingDispatch d, cydriver.CUdeviceptr ptr, size_t n) noexcept:
    cdef size_t i
    cdef cydriver.CUdeviceptr start
    cdef Prepared p = d.prep
    for i in range(p.dev_args.size()):
        start = d.dev_in[p.dev_args[i].input].ptr
        if start < ptr + n and ptr < start + p.dev_args[i].nbytes:
            return True
    return False


cdef bint _overlaps_input(PendingDispatch d, cydriver.CUdeviceptr ptr, size_t n) noexcept:
    # an output written in place must share no byte with a device input (nor with another
    # output written in place): the kernel would read what it writes
    cdef size_t i
    cdef cydriver.CUdeviceptr start
    if _shares_device_input(d, ptr, n):
        return True
    for i in range(d.out_inplace.size()):
        start = d.out_inplace[i].ptr
        if start < ptr + n and ptr < start + d.out_inplace[i].n:
            return True
    return False


cdef int copy_streamed(PendingDispatch d, list outs) except -1:
    """result_into of a streamed dispatch_async: its outputs (complete, in its own arrays)
    copied into the caller's, checked by check_outputs (host: the copy threads; device: one
    upload each, on the dispatch's stream)."""
    cdef Py_buffer view
    cdef cnp.ndarray src
    cdef size_t n
    cdef Py_ssize_t k
    cdef CopyTask task
    cdef cydriver.CUdeviceptr dst
    cdef void* data
    cdef cydriver.CUresult st = cydriver.CUDA_SUCCESS
    cdef TransferEngine xfer = d.core.resources.xfer
    for k in range(len(outs)):
        src = <cnp.ndarray>d.s_outs[k]
        n = <size_t>cnp.PyArray_NBYTES(src)
        dv = d.out_checked[k] if d.out_checked is not None else None
        if dv is not None:
            dst = <cydriver.CUdeviceptr><uintptr_t>dv.ptr
            data = cnp.PyArray_DATA(src)
            with nogil:
                st = cydriver.cuMemcpyHtoDAsync(dst, data, n, d.f.stream)
                if st == cydriver.CUDA_SUCCESS:
                    st = cydriver.cuStreamSynchronize(d.f.stream)
            if st != cydriver.CUDA_SUCCESS:
                d.core._fail(d, st, b"cuMemcpyHtoDAsync")
            continue
        PyObject_GetBuffer(outs[k], &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
        task.dst = <char*>view.buf
        task.src = <const char*>cnp.PyArray_DATA(src)
        task.n = n
        with nogil:
            xfer.pool.run(&task, 1, False)
        PyBuffer_Release(&view)
    return 0
