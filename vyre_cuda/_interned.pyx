# cython: language_level=3
"""Immutable values built again from the same arguments: the value built the first time.

A program built inside a function (each call) builds its Kernel, its BufferDecls and the Program
again from the same arguments. Their checks and normalisation are a pure function of the
arguments, and the values are immutable, so the second call returns the first call's value: one
dict lookup instead of the checks, and the plan cache then finds the very same object.

Only calls whose every argument is a plain value are remembered: a str, bytes, int, bool, float or
None, a value of a registered type (DType, BufferAccess, and the interned classes themselves), or
a tuple or list of those. Each argument (and each element of a tuple or list) is matched with
its exact type, so 1, True and 1.0, equal as dict keys, stay apart: a refused argument is refused
every time. Values of registered types are keyed by identity, and the remembered entry holds them
(so no other object takes their address while it lives): no Python ``__hash__`` runs, and an
equal value that is another object is only a miss, built as usual.

A call that finds its value builds no key: it is first compared item by item with the two
entries found or stored last (a function building its program repeats its calls in order), then
the arguments are hashed in C (a str's or an int's own hash, a registered value's address, each
mixed with its exact type) and the entry under that hash is compared with them item by item.
An entry whose arguments differ under the same hash (a 64-bit collision) is left as it is and the
call builds a new value. A call that raises is not remembered. Past its class's
``_interned_limit`` values (``LIMIT`` unless the class says), calls build new ones. The GIL guards
the tables (two threads building one new value may both build it; both return the one stored
first).
"""

from cpython.object cimport PyObject, PyObject_Hash, PyObject_RichCompareBool, Py_EQ
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cython.operator cimport dereference as deref
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector
from cpython.ref cimport Py_INCREF, Py_DECREF

cdef extern from "Python.h":
    ctypedef size_t Py_uhash_t
    PyObject* Py_TYPE(object o)
    ctypedef PyObject* (*vectorcallfunc)(PyObject* callable, PyObject* const* args, size_t nargsf, PyObject* kw)
    ctypedef struct PyTypeObject:
        Py_ssize_t tp_vectorcall_offset
        unsigned long tp_flags
        vectorcallfunc tp_vectorcall
        PyObject* (*tp_call)(PyObject*, PyObject*, PyObject*)
    unsigned long Py_TPFLAGS_HAVE_VECTORCALL
    Py_ssize_t PyVectorcall_NARGS(size_t nargsf)
    void PyType_Modified(PyTypeObject* t)
    PyTypeObject PyType_Type

cdef extern from *:
    object _type_call "PyType_Type.tp_call"(object cls, object args, object kw)  # type.__call__

__all__ = ["Interned", "register_plain", "remembered_constructor", "LIMIT"]

LIMIT = 4096
# arguments keyed by identity: immutable values of registered types (the first few also in a C
# array, compared by address before the set is asked: a few types are registered, and every
# remembered call checks each argument's type)
cdef set _BY_ID = set()
cdef enum:
    FAST_TYPES = 16
cdef PyObject* _fast_types[FAST_TYPES]
cdef int _n_fast = 0


cdef int _register(object cls) except -1:
    global _n_fast
    if cls in _BY_ID:
        return 0
    _BY_ID.add(cls)  # (the set holds the reference the array's pointer relies on)
    if _n_fast < FAST_TYPES:
        _fast_types[_n_fast] = <PyObject*>cls
        _n_fast += 1
    return 0


cdef inline bint _registered(object t) except -1:
    cdef int i
    for i in range(_n_fast):
        if _fast_types[i] == <PyObject*>t:
            return True
    return _n_fast == FAST_TYPES and t in _BY_ID

# kinds of argument (a plain value's kind is fixed by its exact type)
cdef enum:
    NOT_PLAIN = 0
    BY_VALUE = 1   # str, int, bool, float, None, bytes: compared with ==, hashed by value
    BY_ID = 2      # a registered type: compared and hashed by identity
    SEQUENCE = 3   # a tuple or list of the two kinds above


def register_plain(cls):
    """Let values of ``cls`` (immutable) appear in remembered calls, keyed by identity."""
    _register(cls)


cdef inline int _kind(object v):
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
    """A remembered tuple or list argument: its type and its items (a list is copied, so a
    caller changing it later does not change the entry)."""
    cdef readonly object kind
    cdef readonly tuple items

    def __cinit__(self, kind, items):
        self.kind = kind
        self.items = tuple(items)


cdef class _Entry:
    """One remembered call: its arguments (holding every value keyed by identity) and its value."""
    cdef readonly tuple args
    cdef readonly tuple names  # keyword names in call order, or None
    cdef readonly tuple kwvalues
    cdef readonly object value

    cdef bint same_objects(self, PyObject** args, Py_ssize_t n, tuple kwnames) noexcept:
        """Whether the call passes the very objects remembered (and the same keyword names
        tuple): a hit with no comparison. A sequence is remembered as a copy, so a call with
        one is left to ``matches``."""
        cdef Py_ssize_t i, m = PyTuple_GET_SIZE(self.kwvalues) if self.kwvalues is not None else 0
        if n != PyTuple_GET_SIZE(self.args) or <PyObject*>kwnames != <PyObject*>self.names:
            return False
        for i in range(n):
            if PyTuple_GET_ITEM(self.args, i) != args[i]:
                return False
        for i in range(m):
            if PyTuple_GET_ITEM(self.kwvalues, i) != args[n + i]:
                return False
        return True

    cdef bint matches(self, PyObject** args, Py_ssize_t n, tuple kwnames) except -1:
        """Whether the call ``args[:n]``, keywords ``kwnames`` (their values follow) is this one."""
        cdef Py_ssize_t m = PyTuple_GET_SIZE(kwnames) if kwnames is not None else 0, i
        if n != PyTuple_GET_SIZE(self.args):
            return False
        if m != (PyTuple_GET_SIZE(self.names) if self.names is not None else 0):
            return False
        for i in range(n):
            if not _same_item(<object>PyTuple_GET_ITEM(self.args, i), <object>args[i]):
                return False
        for i in range(m):
            stored = <object>PyTuple_GET_ITEM(self.names, i)
            name = <object>PyTuple_GET_ITEM(kwnames, i)
            if stored is not name and stored != name:  # (str == str)
                return False
            if not _same_item(<object>PyTuple_GET_ITEM(self.kwvalues, i), <object>args[n + i]):
                return False
        return True


cdef class _Table:
    """The remembered calls of one class or constructor: the arguments' 64-bit hash -> its
    entry, in C (a lookup makes no int object and compares no keys). A mapping to Python (tests
    and diagnostics: ``len``, ``items``, ``[hash]``). It holds its entries' references, which the
    GC does not see (so it never collects them): it belongs to a module-level class that lives as
    long as the process.

    The two entries found or stored last are compared with a call first, item by item as a hash
    hit is: a function building its program calls each constructor with the arguments of its
    previous call (or of the one before: ``read("a", ...)``, ``read("b", ...)``), and then
    nothing is hashed."""

    cdef unordered_map[size_t, PyObject*] entries
    cdef _Entry last0, last1  # (the last entry found or stored, and the one before it)

    cdef _Entry remembered(self, PyObject** args, Py_ssize_t n, tuple kwnames, Py_uhash_t* h,
                           bint* storable):
        """The entry this call is (a recent one, else the one under its hash), or None; then
        ``storable`` says whether the value built for it may be stored under ``h`` (its
        arguments are plain and no other call holds that hash). Runs no Python code."""
        storable[0] = False
        cdef _Entry e0 = self.last0, e1 = self.last1
        # the same objects first (a call site passes its constants again), so a function
        # alternating between two calls (``read("a", ...)``, ``read("b", ...)``) compares no
        # value of the other call; then by value
        if e0 is not None and e0.same_objects(args, n, kwnames):
            return e0
        if e1 is not None and e1.same_objects(args, n, kwnames):
            return e1
        if e0 is not None and e0.matches(args, n, kwnames):
            return e0
        if e1 is not None and e1.matches(args, n, kwnames):
            return e1
        if not _call_hash(args, n, kwnames, h):
            return None  # (not plain: built as usual)
        cdef PyObject* known = self.find(h[0])
        if known == NULL:
            storable[0] = True
            return None
        if not (<_Entry>known).matches(args, n, kwnames):
            return None  # another call under the same hash: built, not kept
        self.touch(<_Entry>known)
        return <_Entry>known

    cdef inline void touch(self, _Entry e) noexcept:
        if e is not self.last0:
            self.last1 = self.last0
            self.last0 = e

    def __dealloc__(self):
        for item in self.entries:
            Py_DECREF(<object>item.second)
        self.entries.clear()

    cdef inline PyObject* find(self, Py_uhash_t h) noexcept:
        cdef unordered_map[size_t, PyObject*].iterator it = self.entries.find(h)
        if it == self.entries.end():
            return NULL
        return deref(it).second

    cdef object setdefault(self, Py_uhash_t h, _Entry e):
        """The entry under ``h``: ``e`` stored there if none was (the GIL is held throughout: no
        Python code runs between the find and the store)."""
        cdef PyObject* known = self.find(h)
        if known != NULL:
            e = <_Entry>known
        else:
            Py_INCREF(e)
            self.entries[h] = <PyObject*>e
        self.touch(e)
        return e

    def __len__(self):
        return self.entries.size()

    def items(self):
        return [(<Py_ssize_t>item.first, <object>item.second) for item in self.entries]

    def __getitem__(self, Py_ssize_t h):
        cdef PyObject* known = self.find(<Py_uhash_t>h)
        if known == NULL:
            raise KeyError(h)
        return <object>known

    def __setitem__(self, Py_ssize_t h, _Entry e not None):
        cdef PyObject* old = self.find(<Py_uhash_t>h)
        self.last0 = self.last1 = None  # (the table changed: every call is looked up again)
        Py_INCREF(e)
        self.entries[<Py_uhash_t>h] = <PyObject*>e
        if old != NULL:
            Py_DECREF(<object>old)


cdef object _remembered(object v):
    return _Items(type(v), v) if type(v) is tuple or type(v) is list else v


cdef _Entry _entry(PyObject** args, Py_ssize_t n, tuple kwnames, object value):
    cdef _Entry e = _Entry.__new__(_Entry)
    cdef Py_ssize_t i, m = PyTuple_GET_SIZE(kwnames) if kwnames is not None else 0
    e.args = tuple([_remembered(<object>args[i]) for i in range(n)])
    e.names = kwnames if m else None
    e.kwvalues = tuple([_remembered(<object>args[n + i]) for i in range(m)]) if m else None
    e.value = value
    return e


cdef bint _call_hash(PyObject** args, Py_ssize_t n, tuple kwnames, Py_uhash_t* out) except -1:
    """The arguments' hash (keyword names and order included) into ``out``; False when one is
    not plain."""
    cdef Py_uhash_t h = <Py_uhash_t>n
    cdef Py_ssize_t i, m = PyTuple_GET_SIZE(kwnames) if kwnames is not None else 0
    for i in range(n):
        if not _hash_item(<object>args[i], &h, False):
            return False
    for i in range(m):
        h = _mix(h, <Py_uhash_t>PyObject_Hash(<object>PyTuple_GET_ITEM(kwnames, i)))
        if not _hash_item(<object>args[n + i], &h, False):
            return False
    out[0] = h
    return True


cdef class Interned(type)  # (below)


# A call arrives as CPython's vectorcall passes it: the positional arguments, then the keyword
# values, in one array, and the keyword names as a tuple (or NULL). Both the class's call and a
# remembered constructor's are vectorcalls (set up below), so a remembered call builds no argument
# tuple and no keyword dict; only a call that builds its value makes them.

cdef tuple _positional(PyObject** args, Py_ssize_t n):
    return tuple([<object>args[i] for i in range(n)])


cdef dict _keywords(PyObject** args, Py_ssize_t n, tuple kwnames):
    cdef Py_ssize_t i
    if kwnames is None:
        return {}
    return {<object>PyTuple_GET_ITEM(kwnames, i): <object>args[n + i] for i in range(PyTuple_GET_SIZE(kwnames))}


cdef object _built(object cls, PyObject** args, Py_ssize_t n, tuple kwnames):
    """``type.__call__(cls, ...)``: the value built as usual."""
    return _type_call(cls, _positional(args, n), _keywords(args, n, kwnames))


cdef object _stored(_Table values, Py_ssize_t limit, Py_uhash_t h, PyObject** args, Py_ssize_t n,
                    tuple kwnames, object value):
    """``value`` remembered under ``h`` while the table is below ``limit``; the value every
    call of these arguments returns (two threads may have built it: the first stored is every
    call's)."""
    if <Py_ssize_t>values.entries.size() >= limit:
        return value
    return (<_Entry>values.setdefault(h, _entry(args, n, kwnames, value))).value


cdef object _class_call(Interned cls, PyObject** args, Py_ssize_t n, tuple kwnames):
    cdef _Table values = cls._interned_values
    cdef Py_uhash_t h
    cdef bint storable
    if values is None:
        return _built(cls, args, n, kwnames)
    cdef _Entry e = values.remembered(args, n, kwnames, &h, &storable)
    if e is not None:
        return e.value
    value = _built(cls, args, n, kwnames)
    return _stored(values, cls._interned_limit, h, args, n, kwnames, value) if storable else value


cdef object _class_vectorcall(PyObject* cls, PyObject** args, size_t nargsf, PyObject* kwnames):
    return _class_call(<Interned>cls, args, PyVectorcall_NARGS(nargsf),
                       None if kwnames == NULL else <tuple>kwnames)


cdef tuple _flattened(tuple args, dict kw, vector[PyObject*]& flat):
    """A tp_call's ``(args, kw)`` as a vectorcall's array (into ``flat``, borrowing from them)
    and keyword names: for the calls that do not arrive as vectorcalls."""
    cdef Py_ssize_t i
    for i in range(PyTuple_GET_SIZE(args)):
        flat.push_back(PyTuple_GET_ITEM(args, i))
    for v in (kw.values() if kw else ()):
        flat.push_back(<PyObject*>v)  # (kw holds the references while the call runs)
    flat.push_back(NULL)  # (data() of an empty vector may be NULL)
    return tuple(kw) if kw else None


cdef class Interned(type):
    """Metaclass of an immutable value class: a call with the same plain arguments as an earlier
    one returns the earlier call's value (see the module's docstring). Subclasses of such a class
    are built as usual.

    A C type whose classes are called by vectorcall: a remembered call runs no Python frame and
    builds no argument tuple or keyword dict."""

    #: The remembered calls (hash -> entry); None for a subclass of an interned class.
    cdef public _Table _interned_values
    #: At most this many values remembered (a class body's ``_interned_limit``, else ``LIMIT``).
    cdef public Py_ssize_t _interned_limit

    def __init__(cls, name, bases, namespace, **kw):
        super().__init__(name, bases, namespace, **kw)
        # a subclass may add state, or compare equal to its base's values: built as usual
        root = not any(isinstance(b, Interned) for b in bases)
        cls._interned_values = _Table() if root else None
        cls._interned_limit = namespace.get("_interned_limit", LIMIT)
        if root:
            _register(cls)
            if _VECTORCALL:
                (<PyTypeObject*>cls).tp_vectorcall = <vectorcallfunc>_class_vectorcall

    def __call__(cls, *args, **kw):  # (a call that did not arrive as a vectorcall)
        cdef vector[PyObject*] flat
        kwnames = _flattened(args, kw, flat)
        return _class_call(cls, flat.data(), PyTuple_GET_SIZE(args), kwnames)


cdef bint _enable_vectorcall() except -1:
    """Let CPython call Interned's classes by vectorcall: Interned inherits type's offset of
    ``tp_vectorcall``, but not the flag, as it defines its own ``__call__``. Where the offset is
    not type's (an unexpected CPython), calls keep going through ``__call__``."""
    cdef PyTypeObject* meta = <PyTypeObject*>Interned
    if meta.tp_vectorcall_offset != PyType_Type.tp_vectorcall_offset or meta.tp_vectorcall_offset <= 0:
        return False
    meta.tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL
    PyType_Modified(meta)
    return True


cdef bint _VECTORCALL = _enable_vectorcall()


def vectorcall_active(cls):
    """Whether calls of ``cls`` (a class whose metaclass is Interned) take the vectorcall entry
    (tests: a CPython that cleared it would leave every call on the slower ``__call__``)."""
    if not isinstance(cls, Interned):
        return False
    return _VECTORCALL and (<PyTypeObject*>cls).tp_vectorcall == <vectorcallfunc>_class_vectorcall


cdef class _BoundConstructor  # (below: what reading a _Constructor on a class gives)


cdef class _Constructor:
    """A classmethod of an interned class (``BufferDecl.read``, ``Kernel.cuda``, ...) whose calls
    with plain arguments are remembered as the class's own calls are: the function is a pure
    function of its arguments returning an interned value, so a call with the arguments of an
    earlier one returns that call's value with no Python frame (a function building its program
    per call goes through several of these). Calls on a subclass run the function as usual (a
    subclass's values are not interned). ``instance_attr``: on an instance, that attribute is
    read instead (``BufferDecl.output(...)`` builds, ``decl.output`` is the flag)."""

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
        last = self.last
        if last[0] is owner:
            return last[1]
        cdef _BoundConstructor bound = _BoundConstructor.__new__(_BoundConstructor)
        bound.vectorcall = <vectorcallfunc>_bound_vectorcall
        bound.ctor = self
        bound.owner = owner
        bound.remember = (owner is self.home and isinstance(owner, Interned)
                          and (<Interned>owner)._interned_values is not None)
        self.last = (owner, bound)  # (one tuple: a reader sees the old pair or the new one)
        return bound


cdef class _BoundConstructor:
    cdef vectorcallfunc vectorcall  # (_bound_vectorcall: CPython calls it, see below)
    cdef _Constructor ctor
    cdef readonly object owner
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

    def __call__(self, *args, **kw):  # (a call that did not arrive as a vectorcall)
        cdef vector[PyObject*] flat
        kwnames = _flattened(args, kw, flat)
        return _bound_call(self, flat.data(), PyTuple_GET_SIZE(args), kwnames)


cdef object _run(_BoundConstructor b, PyObject** args, Py_ssize_t n, tuple kwnames):
    """The constructor's function run as usual: ``fn(owner, *args, **kw)``."""
    return b.ctor.__func__(b.owner, *_positional(args, n), **_keywords(args, n, kwnames))


cdef object _bound_call(_BoundConstructor b, PyObject** args, Py_ssize_t n, tuple kwnames):
    cdef _Table values = b.ctor.values
    cdef Py_uhash_t h
    cdef bint storable
    if not b.remember:
        return _run(b, args, n, kwnames)
    cdef _Entry e = values.remembered(args, n, kwnames, &h, &storable)
    if e is not None:
        return e.value
    value = _run(b, args, n, kwnames)
    # (the class's own bound)
    return _stored(values, (<Interned>b.owner)._interned_limit, h, args, n, kwnames, value) if storable else value


cdef object _bound_vectorcall(PyObject* b, PyObject** args, size_t nargsf, PyObject* kwnames):
    return _bound_call(<_BoundConstructor>b, args, PyVectorcall_NARGS(nargsf),
                       None if kwnames == NULL else <tuple>kwnames)


cdef bint _enable_bound_vectorcall() except -1:
    """Let CPython call bound constructors by vectorcall: each instance holds the function (set
    when made), at the offset its type names."""
    cdef _BoundConstructor probe = _BoundConstructor.__new__(_BoundConstructor)
    cdef PyTypeObject* t = <PyTypeObject*>_BoundConstructor
    t.tp_vectorcall_offset = <Py_ssize_t>(<char*>&probe.vectorcall - <char*><PyObject*>probe)
    t.tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL
    PyType_Modified(t)
    return True


cdef bint _BOUND_VECTORCALL = _enable_bound_vectorcall()


def remembered_constructor(fn, home, instance_attr=None):
    """``fn(cls, *args, **kw)`` as a classmethod of the interned class ``home`` whose calls with
    plain arguments are remembered (see :class:`_Constructor`)."""
    return _Constructor(fn, home, instance_attr)
