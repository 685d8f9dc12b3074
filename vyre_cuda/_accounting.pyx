# cython: language_level=3
"""Checked byte arithmetic of the planner (every byte count the hot path reads was computed here).

Every size, offset and total of a dispatch goes through these functions: u64 arithmetic with
overflow detection (never saturating), raising InvalidProgram that names the operands. Only
planning calls them (on a plan miss), never a dispatch that hits its plan, so the operand check
is the shared rule of ``_validate`` (an exact ``int`` is checked in C, anything else by one
Python call).
"""

from libc.stdint cimport uint64_t

from ._validate import is_int
from .errors import InvalidProgram

_FIX = "split the dispatch into bounded chunks"

cdef extern from *:
    """
    static inline int vyre_add_overflow_u64(unsigned long long a, unsigned long long b, unsigned long long* r) {
        return __builtin_add_overflow(a, b, r);
    }
    static inline int vyre_mul_overflow_u64(unsigned long long a, unsigned long long b, unsigned long long* r) {
        return __builtin_mul_overflow(a, b, r);
    }
    """
    bint vyre_add_overflow_u64(unsigned long long a, unsigned long long b, unsigned long long* r) noexcept nogil
    bint vyre_mul_overflow_u64(unsigned long long a, unsigned long long b, unsigned long long* r) noexcept nogil

U64_MAX = 0xFFFFFFFFFFFFFFFF


cdef inline uint64_t _u64(object value, str what) except? 0xFFFFFFFFFFFFFFFF:
    # an exact int (nearly every operand) needs no Python call; is_int answers for the rest
    if type(value) is not int and not is_int(value):
        raise InvalidProgram(f"{what}: operand {value!r} is not an integer", "pass whole byte counts")
    if value < 0 or value > 0xFFFFFFFFFFFFFFFF:
        raise InvalidProgram(f"{what}: operand {value} does not fit unsigned 64-bit byte arithmetic", _FIX)
    return <uint64_t>value


cpdef object checked_add(object a, object b, str what="byte total"):
    """``a + b`` in u64, raising InvalidProgram naming both operands on overflow."""
    cdef unsigned long long r
    if vyre_add_overflow_u64(_u64(a, what), _u64(b, what), &r):
        raise InvalidProgram(f"{what}: {a} + {b} overflows 64-bit byte arithmetic", _FIX)
    return r


cpdef object checked_mul(object a, object b, str what="byte size"):
    """``a * b`` in u64, raising InvalidProgram naming both operands on overflow."""
    cdef unsigned long long r
    if vyre_mul_overflow_u64(_u64(a, what), _u64(b, what), &r):
        raise InvalidProgram(f"{what}: {a} * {b} overflows 64-bit byte arithmetic", _FIX)
    return r


cpdef object align_up(object value, object alignment, str what="aligned size"):
    """Round ``value`` up to a power-of-two ``alignment``, checked."""
    cdef unsigned long long a = _u64(alignment, what)
    cdef unsigned long long r
    if a == 0 or (a & (a - 1)) != 0:
        raise InvalidProgram(f"{what}: alignment {alignment} is not a power of two", "use a power-of-two alignment")
    if vyre_add_overflow_u64(_u64(value, what), a - 1, &r):
        raise InvalidProgram(f"{what}: {value} rounded up to {alignment} overflows 64-bit byte arithmetic", _FIX)
    return r & ~(a - 1)


cpdef object bucket_size(object nbytes, str what="pool bucket"):
    """The pool bucket holding ``nbytes``: a power of two (at least 256) up to 1 GiB, above that
    the next multiple of 64 MiB (a power of two would waste up to half of a huge allocation)."""
    cdef unsigned long long n = _u64(nbytes, what)
    cdef unsigned long long b = 256
    if n > (1ULL << 62):
        raise InvalidProgram(f"{what}: no pool bucket holds {nbytes} bytes", _FIX)
    if n > (1ULL << 30):
        return align_up(n, 1 << 26, what)
    while b < n:
        b <<= 1
    return b


cpdef object checked_sum(object values, str what="byte total"):
    """Checked sum of an iterable of non-negative ints."""
    total = 0
    for v in values:
        total = checked_add(total, v, what)
    return total
