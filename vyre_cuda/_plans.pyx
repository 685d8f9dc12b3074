# cython: language_level=3
"""One backend's prepared plans, under one lock.

A dispatch finds its plan by (program, config, each input's length code); the last plan found
is remembered with what found it (``_LastHit``), so a loop of the same dispatch compares a few
words in C and runs no Python ``__hash__``/``__eq__``. The dict is published whole and never
changed once published: a reader takes its reference under the lock and looks up without it
(a config's ``__hash__`` is Python code, which must not run under a lock), and a writer inserts
into a copy and publishes it, retrying when another writer published first. Plans are misses
of the hot path: the copy (at most MAX_PLANS entries, no hashing) is paid only where a dispatch
is planned. Bounded: past MAX_PLANS plans, or MAX_STREAM_PLANS plans for callers' streams (each
new stream is a new key), the table is cleared.
"""

cimport cython
from cpython.ref cimport Py_INCREF, PyObject
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.weakref cimport PyWeakref_GetObject, PyWeakref_NewRef
from libc.stdint cimport uintptr_t
from libc.string cimport memcmp
from libcpp.vector cimport vector

from ._driver cimport bind_context
from ._pools cimport lock_with_gil


cdef enum:
    MAX_PLANS = 4096  # distinct lengths must not grow memory forever
    MAX_STREAM_PLANS = 64  # plans made for callers' streams


@cython.final
cdef class _LastHit:
    """The last plan found and its program, config and input length codes; immutable, so a
    thread reads one reference and compares in C. A config holding the caller's stream is kept by
    weak reference (``config_ref``): the memo must not keep that stream alive."""
    cdef object program
    cdef object config
    cdef object config_ref
    cdef Prepared prep
    cdef vector[long long] lens


cdef inline bint _is_last_hit(_LastHit hit, program, config, const long long* lens, Py_ssize_t n) noexcept:
    """Whether the plan dict would find ``hit``'s plan for this lookup, with no Python
    ``__hash__``/``__eq__`` of the program or config run (two Python frames per dispatch)."""
    # (a weak reference is compared by address only: when it names ``config``, the caller holds
    # that object alive; when its object died it names None)
    return (hit.program is program
            and (hit.config is config
                 or (hit.config_ref is not None and PyWeakref_GetObject(hit.config_ref) == <PyObject*>config))
            and <Py_ssize_t>hit.lens.size() == n
            and memcmp(hit.lens.data(), lens, n * sizeof(long long)) == 0)


cdef tuple lookup_key(program, config, const long long* lens, Py_ssize_t n):
    """The plan dict's key: (program, config, each input's byte length or ("device", bytes))."""
    cdef Py_ssize_t i
    cdef object entry  # an object: PyTuple_SET_ITEM steals this reference
    key = PyTuple_New(n + 2)
    Py_INCREF(program)
    PyTuple_SET_ITEM(key, 0, program)
    Py_INCREF(config)
    PyTuple_SET_ITEM(key, 1, config)
    for i in range(n):
        entry = lens[i] if lens[i] >= 0 else ("device", -1 - lens[i])
        Py_INCREF(entry)
        PyTuple_SET_ITEM(key, i + 2, entry)
    return key


@cython.final
cdef class PlanTable:
    """One backend's prepared plans (see the module's docstring)."""

    def __cinit__(self):
        self.plans = {}
        self.graphed = []

    cdef Prepared find(self, program, config, const long long* lens, Py_ssize_t n):
        """The plan of this lookup, or None (a miss: the backend plans and inserts). Raises what
        the config's ``__hash__`` raises (an unhashable field)."""
        cdef _LastHit new
        lock_with_gil(self.mu)  # (references read while another thread may swap them)
        hit = self.last_hit
        plans = self.plans
        cdef unsigned long long cleared = self.cleared
        self.mu.unlock()
        if hit is not None and _is_last_hit(<_LastHit>hit, program, config, lens, n):
            return (<_LastHit>hit).prep
        prep = (<dict>plans).get(lookup_key(program, config, lens, n))  # (Python code may run)
        if prep is None:
            return None
        new = _LastHit.__new__(_LastHit)
        new.program = program
        if config is None or config._without_stream_object() is config:
            new.config = config
        else:  # (a config holding the caller's stream object: see _LastHit)
            new.config_ref = PyWeakref_NewRef(config, None)
        new.prep = <Prepared>prep
        new.lens.assign(lens, lens + n)
        lock_with_gil(self.mu)
        if self.cleared == cleared:  # (not cleared since the lookup began: safe to remember)
            hit, self.last_hit = self.last_hit, new
        self.mu.unlock()
        hit = None  # (the one replaced, dropped outside the lock)
        return <Prepared>prep

    def get(self, key):
        """The plan cached under ``key``, or None."""
        lock_with_gil(self.mu)
        plans = self.plans
        self.mu.unlock()
        return plans.get(key)

    def insert(self, key, Prepared prep not None, bint caller_stream, uintptr_t ctx):
        """Cache ``prep`` under ``key`` (``caller_stream``: its config names a caller's stream).
        Past a bound the table is cleared first (``ctx``: the context its graphs are released in,
        0 when it is gone)."""
        cdef bint published = False
        cdef unsigned long long cleared
        while not published:
            lock_with_gil(self.mu)
            plans = self.plans
            cleared = self.cleared
            over = (len(plans) >= MAX_PLANS
                    or (caller_stream and self.stream_plans + 1 > MAX_STREAM_PLANS))
            self.mu.unlock()
            if over:
                self.clear(ctx)
                continue
            new = dict(plans)  # (a copy: what was published is never changed)
            new[key] = prep  # (the key's __hash__ may run Python code: no lock is held)
            lock_with_gil(self.mu)
            if self.plans is plans and self.cleared == cleared:
                self.plans = new
                self.stream_plans += caller_stream
                if prep.graphs != NULL:
                    self.graphed.append(prep)  # its graphs are released with the plans
                published = True
            self.mu.unlock()
            new = plans = None  # (the loser's copy, or the old dict, dropped outside the lock)

    def clear(self, uintptr_t ctx):
        """Drop every plan and the memo; release the plans' graph execs in ``ctx`` (0: the
        context is gone, so they are only forgotten). A plan still used by a dispatch in flight
        then issues its launches without a graph."""
        empty, fresh = {}, []
        lock_with_gil(self.mu)
        hit, self.last_hit = self.last_hit, None
        plans, self.plans = self.plans, empty
        graphed, self.graphed = self.graphed, fresh
        self.stream_plans = 0
        self.cleared += 1  # (a lookup that found a plan before this does not remember it)
        self.mu.unlock()
        if graphed and ctx:
            bind_context(<cydriver.CUcontext>ctx)
        for p in graphed:
            (<Prepared>p).release_graphs(ctx != 0)
        hit = plans = graphed = None  # (released outside the lock: a plan's release may run code)

    def stats(self):
        """(plans cached, graph execs alive in them), read together."""
        lock_with_gil(self.mu)
        plans, graphed = self.plans, self.graphed
        self.mu.unlock()
        return len(plans), sum((<Prepared>p).graph_execs for p in list(graphed))
