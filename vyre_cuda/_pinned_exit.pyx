# cython: language_level=3
"""Every page-locked block this process holds, freed once the interpreter has finalized.

An array still alive at exit (a global, a cycle the last collection left, an object a C library
keeps) never gives its block back, and compute-sanitizer's leak check, which users run over their
own programs, would list it. A Py_AtExit function runs after every Python object is past use (no
Python code runs any more) and before the driver's own exit handlers, so freeing there is safe.
Not in a forked child: the parent's blocks are not the child's to free. (PinnedPool's blocks are
the only ones: it reports each one born and gone.)
"""

from libc.stdint cimport uintptr_t
from libcpp.mutex cimport mutex
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cuda.bindings cimport cydriver

cdef extern from "<unistd.h>" nogil:
    int getpid()

cdef extern from "Python.h":
    int Py_AtExit(void (*func)() noexcept)

cdef mutex _pinned_mu
cdef unordered_map[uintptr_t, uintptr_t] _pinned_live  # block -> its context
cdef int _pinned_pid = 0
cdef bint _pinned_hooked = False  # (under _pinned_mu; a forked child inherits the hook)


cdef void _free_pinned_at_exit() noexcept nogil:
    cdef cydriver.CUcontext prev
    _pinned_mu.lock()
    if _pinned_pid == getpid():
        for entry in _pinned_live:
            if cydriver.cuCtxPushCurrent(<cydriver.CUcontext>entry.second) == cydriver.CUDA_SUCCESS:
                cydriver.cuMemFreeHost(<void*>entry.first)
                cydriver.cuCtxPopCurrent(&prev)
    _pinned_live.clear()
    _pinned_mu.unlock()


cdef void pinned_born(uintptr_t ptr, cydriver.CUcontext ctx) noexcept:
    # (called with the GIL held: Py_AtExit needs it)
    global _pinned_pid, _pinned_hooked
    _pinned_mu.lock()  # (its holders never wait for the GIL: taken with it held, no deadlock)
    if not _pinned_hooked:
        _pinned_hooked = Py_AtExit(_free_pinned_at_exit) == 0
    if _pinned_pid != getpid():  # the first block of this process (or of a forked child)
        _pinned_pid = getpid()
        _pinned_live.clear()
    _pinned_live[ptr] = <uintptr_t>ctx
    _pinned_mu.unlock()


cdef void pinned_gone(uintptr_t ptr) noexcept nogil:
    _pinned_mu.lock()
    _pinned_live.erase(ptr)
    _pinned_mu.unlock()


cdef void pinned_forget_context(cydriver.CUcontext ctx) noexcept nogil:
    # the context died with its blocks: none of them may be freed at exit
    cdef vector[uintptr_t] dead
    _pinned_mu.lock()
    for entry in _pinned_live:
        if entry.second == <uintptr_t>ctx:
            dead.push_back(entry.first)
    for ptr in dead:
        _pinned_live.erase(ptr)
    _pinned_mu.unlock()
