# cython: language_level=3, embedsignature=True
"""Timed host copies on 1 or N native threads: the host memcpy ceiling of the profile.

N threads are ``std::thread`` started once per measurement (``_copy_team.hpp``), never per
copy: on the H200, starting 8 threads per 8 MiB chunk ran at 17 GB/s where persistent
threads reach 33. One thread copies in the calling thread. Loops run with the GIL released and
are timed with the core's clock (``vyre_cuda._driver.now_ns``).
"""

from libc.stdint cimport int64_t

from vyre_cuda._driver cimport now_ns

import numpy as np

from vyre_cuda.errors import ValidationError

__all__ = ["MAX_COPY_THREADS", "host_copy"]


cdef extern from "_copy_team.hpp" namespace "vyre_floor" nogil:
    ctypedef unsigned long long (*Clock)() noexcept nogil
    int timed_copies(char** dst, const char** src, const size_t* length, int count, int threads,
                     long long iterations, long long warmup, int64_t* out, Clock clock)


cdef enum:
    _MAX_THREADS = 256
    _MAX_JOBS = 4

MAX_COPY_THREADS = _MAX_THREADS


cdef int check_counts(Py_ssize_t iterations, Py_ssize_t warmup) except -1:
    if iterations < 0 or warmup < 0:
        raise ValidationError(
            f"iterations and warmup must be >= 0 (got {iterations}, {warmup})",
            "pass non-negative counts",
        )
    return 0


cdef int _check_threads(int threads) except -1:
    if threads < 1 or threads > _MAX_THREADS:
        raise ValidationError(
            f"copy threads must be in 1..{_MAX_THREADS} (got {threads})",
            "pass threads=1 for one thread, or the number of cores to use",
        )
    return 0


cdef int64_t* i64_data(arr) except? NULL:
    # The loops write results through a raw pointer: no bounds check inside the timed region.
    cdef int64_t[::1] view = arr
    if view.shape[0] == 0:
        return NULL
    return &view[0]


cdef object copy_passes(char** dst, const char** src, const size_t* lengths, int count,
                        int threads, Py_ssize_t iterations, Py_ssize_t warmup):
    # warmup + iterations passes of `count` copies (dst[i] <- src[i], lengths[i] bytes);
    # returns the ns of each timed pass.
    _check_threads(threads)
    check_counts(iterations, warmup)
    if count < 1 or count > _MAX_JOBS:
        raise ValidationError(
            f"a pass copies 1..{_MAX_JOBS} buffers (got {count})", "pass fewer buffers"
        )
    times = np.empty(iterations, dtype=np.int64)
    cdef int64_t* tv = i64_data(times)
    cdef int status
    with nogil:
        status = timed_copies(dst, src, lengths, count, threads, iterations, warmup, tv, now_ns)
    if status != 0:
        raise MemoryError(f"could not start {threads} host-copy threads")
    return times


def host_copy(dst, src, int threads=1, Py_ssize_t iterations=1, Py_ssize_t warmup=0):
    """Copy ``src`` into ``dst`` ``warmup + iterations`` times with ``threads`` host threads;
    returns an int64 array of the ns of each timed pass.

    ``dst`` and ``src`` are C-contiguous buffers of equal byte size, or lists of up to 4 such
    pairs copied in one pass (split into equal byte shares across the threads, as the floor
    splits its two inputs).

    >>> out = bytearray(8)
    >>> host_copy(out, b"vyrecuda", threads=2).shape
    (1,)
    >>> bytes(out)
    b'vyrecuda'
    """
    dsts = list(dst) if isinstance(dst, (list, tuple)) else [dst]
    srcs = list(src) if isinstance(src, (list, tuple)) else [src]
    if len(dsts) != len(srcs) or not 1 <= len(dsts) <= _MAX_JOBS:
        raise ValidationError(
            f"host_copy needs 1..{_MAX_JOBS} destination and source buffers, as many of each "
            f"(got {len(dsts)} and {len(srcs)})",
            "pass one buffer each, or two lists of the same length",
        )
    views = []
    cdef char* dptr[_MAX_JOBS]
    cdef const char* sptr[_MAX_JOBS]
    cdef size_t lengths[_MAX_JOBS]
    cdef const unsigned char[::1] s
    cdef unsigned char[::1] d
    cdef int count = 0
    for i in range(len(dsts)):
        s = _byte_view(srcs[i], "src", False)
        d = _byte_view(dsts[i], "dst", True)
        if s.shape[0] != d.shape[0]:
            raise ValidationError(
                f"host_copy needs equal sizes (got dst {d.shape[0]:,} bytes, src "
                f"{s.shape[0]:,})",
                "pass buffers of the same byte size",
            )
        if s.shape[0] == 0:
            continue
        views.append((s, d))  # keeps the exports alive for the copies
        dptr[count] = <char*>&d[0]
        sptr[count] = <const char*>&s[0]
        lengths[count] = <size_t>s.shape[0]
        count += 1
    if count == 0:
        _check_threads(threads)
        check_counts(iterations, warmup)
        return np.zeros(iterations, dtype=np.int64)
    return copy_passes(dptr, sptr, lengths, count, threads, iterations, warmup)


def _byte_view(x, str name, bint writable):
    try:
        view = memoryview(x)
    except TypeError:
        raise ValidationError(
            f"{name} must support the buffer protocol (got {type(x).__name__})",
            "pass a numpy array, bytearray or other C-contiguous buffer",
        ) from None
    if not view.c_contiguous:
        raise ValidationError(f"{name} must be C-contiguous", "pass np.ascontiguousarray(x)")
    if writable and view.readonly:
        raise ValidationError(f"{name} is read-only", "pass a writable buffer")
    return view.cast("B") if view.ndim else view.cast("B", (view.nbytes,))
