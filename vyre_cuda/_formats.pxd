# An input buffer's format against its declared element kind: the hot path's dtype check, inline
# (cimported by _dispatch; no module of its own).


cdef inline char format_kind(const char* fmt) noexcept:
    # struct-module format of a buffer: skip byte-order prefixes, classify the type code
    cdef char c
    if fmt == NULL:
        return b'u'
    if fmt[0] in b'>!':
        return b'x'  # big-endian: the kernel would see swapped bytes
    while fmt[0] in b'@=<':
        fmt += 1
    c = fmt[0]
    if c in b'efdE':
        return b'f'
    if c in b'bhilqn':
        return b'i'
    if c in b'BHILQNc?':
        return b'u'
    return 0


cdef inline bint kind_ok(char want, Py_ssize_t want_size, const char* fmt, Py_ssize_t itemsize) noexcept:
    # want: 'f', 'i' or 'u' (bf16 is declared 'u': its raw bits as uint16), 0 for any
    if want == 0 or itemsize == 1:
        return True  # untyped declaration, or raw bytes reinterpreted on purpose
    return itemsize == want_size and format_kind(fmt) == want
