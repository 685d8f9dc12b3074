# cython: language_level=3
"""Immutable values built again from the same arguments: the value built the first time.

A program built inside a function rebuilds its Kernel, BufferDecls and Program from the same
arguments on every call; the values are immutable and their checks pure, so the second call returns
the first call's value (one lookup, and the plan cache finds the very same object).

Only calls whose every argument is plain are remembered: str, bytes, int, bool, float, None, a
registered type's value (keyed by identity, and held by the entry), or a tuple or list of those,
each matched with its exact type (1, True and 1.0 stay apart). No Python ``__hash__`` runs. Calls
arrive through ``tp_call`` only (a metaclass, or a constructor object): no CPython slot is patched.

A call is compared first with the two entries used last, then hashed in C and compared with the
entry under its hash; a 64-bit collision just builds a new value. Calls that raise are not
remembered; past ``_interned_limit`` values a class builds new ones. Each table has one mutex,
never held while Python code runs; two threads building one value both return the first stored.
"""

from cpython.object cimport PyObject, PyObject_Hash, PyObject_RichCompareBool, Py_EQ
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.dict cimport PyDict_Next
from libcpp.mutex cimport mutex

cdef extern from "Python.h":
    ctypedef size_t Py_uhash_t
    PyObject* Py_TYPE(object o)

cdef extern from "_atomic.hpp" namespace "vyre" nogil:
    int a_load "vyre::load"(const int* p)
    void a_store "vyre::store"(int* p, int v)

__all__ = ["Interned", "register_plain", "remembered_constructor", "LIMIT"]

LIMIT = 4096


cdef inline void _lock(mutex& m) noexcept:
    # (called with the GIL held: never wait for the mutex while holding it, its holder may be
    # waiting for the GIL)
    if not m.try_lock():
        with nogil:
            m.lock()


# Registered types (keyed by identity); the first FAST_TYPES also in a C array scanned by address.
# A slot is written before the atomic count that publishes it, so readers see whole entries only.
cdef mutex _register_mu
cdef set _BY_ID = set()
cdef enum:
    FAST_TYPES = 16
cdef PyObject* _fast_types[FAST_TYPES]
cdef int _n_fast = 0


cdef int _register(object cls) except -1:
    cdef int n
    _lock(_register_mu)
    try:
        if cls not in _BY_ID:
            _BY_ID.add(cls)
            n = a_load(&_n_fast)
            if n < FAST_TYPES:
                _fast_types[n] = <PyObject*>cls
                a_store(&_n_fast, n + 1)
    finally:
        _register_mu.unlock()
    return 0


cdef inline bint _registered(object t) except -1:
    cdef int i, n = a_load(&_n_fast)
    for i in range(n):
        if _fast_types[i] == <PyObject*>t:
            return True
    if n < FAST_TYPES:
        return False
    _lock(_register_mu)  # (more than FAST_TYPES registered: the set, under its lock)
    found = t in _BY_ID
    _register_mu.unlock()
    return found

# kinds of argument (a plain value's kind is fixed by its exact type)
cdef enum:
    NOT_PLAIN = 0
    BY_VALUE = 1   # str, int, bool, float, None, bytes: compared with ==, hashed by value
    BY_ID = 2      # a registered type: compared and hashed by identity
    SEQUENCE = 3   # a tuple or list of the two kinds above


def register_plain(cls):
    """Let values of ``cls`` (immutable) appear in remembered calls, keyed by identity."""
    _register(cls)


cdef inline int _kind(object v) except -1:
    cdef object t = type(v)
    if t is str or t is int or t is bool or t is float or v is None or t is bytes:
        return BY_VALUE
    if t is tuple or t is list:
        return SEQUENCE
    if _registered(t):
        return BY_ID
    return NOT_PLAIN


cdef inline Py_uhash_t _mix(Py_uhash_t h, Py_uhash_t v) noexcept:
    # (xxHash's round, as CPython's tuple hash uses)
    h += v * <Py_uhash_t>14029467366897019727ULL
    h = (h << 31) | (h >> 33)
    return h * <Py_uhash_t>11400714785074694791ULL


cdef inline bint _hash_item(object v, Py_uhash_t* h, bint nested) except -1:
    """Mix ``v``'s exact type and value into ``h``; False when ``v`` is not plain."""
    cdef int kind = _kind(v)
    cdef Py_ssize_t i, n
    cdef PyObject* t = <PyObject*>Py_TYPE(v)
    h[0] = _mix(h[0], <Py_uhash_t>t)
    if kind == BY_VALUE:
        h[0] = _mix(h[0], <Py_uhash_t>PyObject_Hash(v))  # (cached for str and bytes)
    elif kind == BY_ID:
        h[0] = _mix(h[0], <Py_uhash_t><void*>v)
    elif kind == SEQUENCE and not nested:
        n = len(v)
        h[0] = _mix(h[0], <Py_uhash_t>n)
        for i in range(n):
            e = <object>PyTuple_GET_ITEM(v, i) if type(v) is tuple else <object>PyList_GET_ITEM(v, i)
            if not _hash_item(e, h, True):
                return False  # (one level of nesting only)
    else:
        return False
    return True


cdef inline bint _same_item(object stored, object v) except -1:
    """Whether ``v`` is the argument remembered as ``stored`` (a sequence is remembered as a
    tuple of its items). Runs no Python code: == only between equal exact types of BY_VALUE."""
    cdef object t = type(v)
    cdef Py_ssize_t i, n
    if t is list or t is tuple:
        if type(stored) is not _Items:
            return False
        items = (<_Items>stored).items
        n = PyTuple_GET_SIZE(items)
        if (PyList_GET_SIZE(v) if t is list else PyTuple_GET_SIZE(v)) != n or (<_Items>stored).kind is not t:
            return False
        for i in range(n):
            e = <object>PyList_GET_ITEM(v, i) if t is list else <object>PyTuple_GET_ITEM(v, i)
            if not _same_item(<object>PyTuple_GET_ITEM(items, i), e):
                return False
        return True
    if stored is v:
        return True
    if type(stored) is not t or _registered(t):
        return False  # (a registered value is its own key: another object is a miss)
    return PyObject_RichCompareBool(stored, v, Py_EQ)


cdef class _Items:
    """A remembered tuple or list argument: its type and a copy of its items."""
    cdef readonly object kind
    cdef readonly tuple items

    def __cinit__(self, kind, items):
        self.kind = kind
        self.items = tuple(items)


cdef class _Entry:
    """One remembered call: its positional arguments, its keywords (names and values, in call
    order) and its value. It holds every value keyed by identity."""
    cdef readonly tuple args
    cdef readonly tuple names  # keyword names in call order, or None
    cdef readonly tuple kwvalues
    cdef readonly object value

    cdef bint same_objects(self, tuple args, dict kw) noexcept:
        """Whether the call passes the very objects remembered, keywords in the same order (a
        sequence is remembered as a copy: left to ``matches``)."""
        cdef Py_ssize_t i, n = PyTuple_GET_SIZE(args)
        cdef Py_ssize_t m = PyTuple_GET_SIZE(self.names) if self.names is not None else 0
        if n != PyTuple_GET_SIZE(self.args) or (len(kw) if kw else 0) != m:
            return False
        for i in range(n):
            if PyTuple_GET_ITEM(self.args, i) != PyTuple_GET_ITEM(args, i):
                return False
        cdef Py_ssize_t pos = 0
        cdef PyObject* name
        cdef PyObject* value
        i = 0
        while m and PyDict_Next(kw, &pos, &name, &value):  # (call order; no Python code)
            if name != PyTuple_GET_ITEM(self.names, i) or value != PyTuple_GET_ITEM(self.kwvalues, i):
                return False
            i += 1
        return True

    cdef bint matches(self, tuple args, dict kw) except -1:
        """Whether the call ``(args, kw)`` is this one, item by item, keywords in call order."""
        cdef Py_ssize_t i, n = PyTuple_GET_SIZE(args)
        cdef Py_ssize_t m = PyTuple_GET_SIZE(self.names) if self.names is not None else 0
        if n != PyTuple_GET_SIZE(self.args) or (len(kw) if kw else 0) != m:
            return False
        for i in range(n):
            if not _same_item(<object>PyTuple_GET_ITEM(self.args, i), <object>PyTuple_GET_ITEM(args, i)):
                return False
        cdef Py_ssize_t pos = 0
        cdef PyObject* name
        cdef PyObject* value
        i = 0
        while m and PyDict_Next(kw, &pos, &name, &value):
            stored = <object>PyTuple_GET_ITEM(self.names, i)
            if stored is not <object>name and stored != <object>name:  # (str == str)
                return False
            if not _same_item(<object>PyTuple_GET_ITEM(self.kwvalues, i), <object>value):
                return False
            i += 1
        return True


cdef object _remembered(object v):
    return _Items(type(v), v) if type(v) is tuple or type(v) is list else v


cdef _Entry _entry(tuple args, dict kw, object value):
    cdef _Entry e = _Entry.__new__(_Entry)
    e.args = tuple([_remembered(v) for v in args])
    e.names = tuple(kw) if kw else None
    e.kwvalues = tuple([_remembered(v) for v in kw.values()]) if kw else None
    e.value = value
    return e


cdef bint _call_hash(tuple args, dict kw, Py_uhash_t* out) except -1:
    """The arguments' hash (keyword names and order included) into ``out``; False when one is
    not plain."""
    cdef Py_uhash_t h = <Py_uhash_t>PyTuple_GET_SIZE(args)
    for v in args:
        if not _hash_item(v, &h, False):
            return False
    if kw:
        for name, v in kw.items():
            h = _mix(h, <Py_uhash_t>PyObject_Hash(name))
            if not _hash_item(v, &h, False):
                return False
    out[0] = h
    return True


cdef class _Table:
    """The remembered calls of one class or constructor: 64-bit hash -> entry, under one mutex;
    a mapping to Python for tests (``len``, ``items``, ``[hash]``, ``clear``). The two entries
    used last are compared first, so a function repeating its calls hashes nothing."""

    cdef mutex mu  # guards every field below; held only while no Python code runs
    cdef dict entries
    cdef _Entry last0, last1  # (the last entry found or stored, and the one before it)

    def __cinit__(self):
        self.entries = {}

    cdef object find(self, tuple args, dict kw, Py_uhash_t* h, bint* storable):
        """The value remembered for this call, or None; then ``storable``: whether the value
        built may be stored under ``h``."""
        cdef _Entry e0, e1, known
        storable[0] = False
        _lock(self.mu)
        try:
            e0, e1 = self.last0, self.last1
            # the same objects first (a call site passes its constants again), then by value
            if e0 is not None and e0.same_objects(args, kw):
                return e0.value
            if e1 is not None and e1.same_objects(args, kw):
                self._touch(e1)
                return e1.value
            if e0 is not None and e0.matches(args, kw):
                return e0.value
            if e1 is not None and e1.matches(args, kw):
                self._touch(e1)
                return e1.value
            if not _call_hash(args, kw, h):
                return None  # (not plain: built as usual)
            known = self.entries.get(<size_t>h[0])
            if known is None:
                storable[0] = True
                return None
            if not known.matches(args, kw):
                return None  # another call under the same hash: built, not kept
            self._touch(known)
            return known.value
        finally:
            self.mu.unlock()

    cdef inline void _touch(self, _Entry e) noexcept:
        if e is not self.last0:
            self.last1 = self.last0
            self.last0 = e

    cdef object store(self, Py_ssize_t limit, Py_uhash_t h, tuple args, dict kw, object value):
        """``value`` remembered under ``h`` (below ``limit`` entries); returns the first stored."""
        cdef _Entry e = _entry(args, kw, value)  # (made before the lock: it allocates)
        cdef _Entry known
        _lock(self.mu)
        try:
            known = self.entries.get(<size_t>h)
            if known is not None:
                e = known
            elif len(self.entries) >= limit:
                return value
            else:
                self.entries[<size_t>h] = e
            self._touch(e)
            return e.value
        finally:
            self.mu.unlock()

    def __len__(self):
        _lock(self.mu)
        n = len(self.entries)
        self.mu.unlock()
        return n

    def items(self):
        _lock(self.mu)
        out = list(self.entries.items())
        self.mu.unlock()
        return out

    def __getitem__(self, h):
        _lock(self.mu)
        e = self.entries.get(h)
        self.mu.unlock()
        if e is None:
            raise KeyError(h)
        return e

    def __setitem__(self, h, _Entry e not None):
        _lock(self.mu)
        self.entries[h] = e
        self.last0 = self.last1 = None  # (the table changed: every call is looked up again)
        self.mu.unlock()

    def clear(self):
        """Forget every remembered call (values already returned stay valid)."""
        _lock(self.mu)
        entries, self.entries = self.entries, {}
        self.last0 = self.last1 = None
        self.mu.unlock()
        entries.clear()  # (outside the lock: dropping values may run Python code)


cdef object _lookup_or_build(_Table values, Py_ssize_t limit, build, tuple args, dict kw):
    """The value remembered for ``(args, kw)``, else ``build(*args, **kw)`` (remembered when
    its arguments are plain and the table has room)."""
    cdef Py_uhash_t h = 0
    cdef bint storable
    found = values.find(args, kw, &h, &storable)
    if found is not None:
        return found
    value = build(*args, **kw)
    return values.store(limit, h, args, kw, value) if storable else value


cdef class Interned(type):
    """Metaclass of an immutable value class: a call with the same plain arguments as an earlier
    one returns the earlier call's value (see the module's docstring). Subclasses of such a class
    are built as usual."""

    #: The remembered calls (hash -> entry); None for a subclass of an interned class.
    cdef public _Table _interned_values
    #: At most this many values remembered (a class body's ``_interned_limit``, else ``LIMIT``).
    cdef public Py_ssize_t _interned_limit
    cdef object _build  # type.__call__ bound to the class: the value built as usual

    def __init__(cls, name, bases, namespace, **kw):
        super().__init__(name, bases, namespace, **kw)
        # a subclass may add state, or compare equal to its base's values: built as usual
        root = not any(isinstance(b, Interned) for b in bases)
        cls._interned_values = _Table() if root else None
        cls._interned_limit = namespace.get("_interned_limit", LIMIT)
        cls._build = type.__call__.__get__(cls)
        if root:
            _register(cls)

    def __call__(cls, *args, **kw):
        if cls._interned_values is None:
            return cls._build(*args, **kw)
        return _lookup_or_build(cls._interned_values, cls._interned_limit, cls._build, args, kw)


cdef class _BoundConstructor  # (below: what reading a _Constructor on a class gives)


cdef class _Constructor:
    """A classmethod of an interned class (``BufferDecl.read``, ``Kernel.cuda``, ...) whose calls
    with plain arguments are remembered as the class's own are, with no Python frame on a hit.
    Calls on a subclass run it as usual. ``instance_attr``: on an instance, that attribute is read
    instead (``BufferDecl.output(...)`` builds, ``decl.output`` is the flag)."""

    cdef readonly object __func__
    cdef readonly object home  # the class it was made for
    cdef object instance_attr
    cdef readonly _Table values  # (remembered calls, as Interned's _interned_values)
    cdef tuple last  # (owner, its bound constructor): the last class it was read on

    def __cinit__(self, fn, home, instance_attr=None):
        self.__func__ = fn
        self.home = home
        self.instance_attr = instance_attr
        self.values = _Table()
        self.last = (None, None)

    def __get__(self, obj, owner):
        if obj is not None and self.instance_attr is not None:
            return getattr(obj, self.instance_attr)
        if owner is None:
            owner = type(obj)
        last = self.last  # (one tuple, replaced whole: a reader sees the old pair or the new one)
        if last[0] is owner:
            return last[1]
        cdef _BoundConstructor bound = _BoundConstructor.__new__(_BoundConstructor)
        bound.ctor = self
        bound.owner = owner
        bound.run = self.__func__.__get__(owner)  # the classmethod's function bound to the class
        bound.remember = (owner is self.home and isinstance(owner, Interned)
                          and (<Interned>owner)._interned_values is not None)
        self.last = (owner, bound)
        return bound


cdef class _BoundConstructor:
    cdef _Constructor ctor
    cdef readonly object owner
    cdef object run
    cdef bint remember

    @property
    def __func__(self):
        return self.ctor.__func__

    @property
    def __doc__(self):
        return self.ctor.__func__.__doc__

    @property
    def __wrapped__(self):  # (inspect.signature and Sphinx read the function's own)
        return self.ctor.__func__

    def __get__(self, obj, owner):
        # never read as an attribute; having __get__ makes inspect (and Sphinx) take it for the
        # method it stands for
        return self

    def __call__(self, *args, **kw):
        if not self.remember:
            return self.run(*args, **kw)
        return _lookup_or_build(self.ctor.values, (<Interned>self.owner)._interned_limit, self.run, args, kw)


def remembered_constructor(fn, home, instance_attr=None):
    """``fn(cls, *args, **kw)`` as a classmethod of the interned class ``home`` whose calls with
    plain arguments are remembered (see :class:`_Constructor`)."""
    return _Constructor(fn, home, instance_attr)
