# cython: language_level=3
"""Immutable values built again from the same arguments: the value built the first time.

A program built inside a function (each call) builds its Kernel, its BufferDecls and the Program
again from the same arguments. Their checks and normalisation are a pure function of the
arguments, and the values are immutable, so the second call returns the first call's value: one
dict lookup instead of the checks, and the plan cache then finds the very same object.

Only calls whose every argument is a plain value are remembered: a str, bytes, int, bool, float or
None, a value of a registered type (DType, BufferAccess, and the interned classes themselves), or
a tuple or list of those. The key tags each argument (and each element of a tuple or list) with
its exact type, so 1, True and 1.0, equal as dict keys, stay apart: a refused argument is refused
every time. Values of registered types are keyed by identity, and the remembered entry holds them
(so no other object takes their address while it lives): no Python ``__hash__`` runs, and an
equal value that is another object is only a miss, built as usual. A call that raises is not
remembered. Past its class's ``_interned_limit`` values (``LIMIT`` unless the class says), calls
build new ones. The GIL guards the tables (two threads building one new value may both build it;
both return the one stored first).
"""

from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.long cimport PyLong_FromVoidPtr
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM

__all__ = ["Interned", "register_plain", "LIMIT"]

LIMIT = 4096
# arguments keyed by identity: immutable values of registered types
cdef set _BY_ID = set()


def register_plain(cls):
    """Let values of ``cls`` (immutable) appear in remembered calls, keyed by identity."""
    _BY_ID.add(cls)


cdef inline bint _put(tuple key, Py_ssize_t i, object v, list keep) except -1:
    """``key[i]``: ``v``'s exact type, ``key[i + 1]``: ``v`` itself or, for a registered type, its
    address (``keep`` holds ``v``, so no other object takes the address while the entry lives).
    False when ``v`` is not plain. A tuple or list is keyed by its items, flat, in a tuple."""
    cdef object t = type(v), k
    cdef Py_ssize_t j = 0
    # by value: == and hash are the value's, and none equals a value of another of these types
    # but the numbers, which the type tags keep apart
    if t is str or t is int or t is bool or t is float or v is None or t is bytes:
        k = v
    elif t is tuple or t is list:
        k = PyTuple_New(2 * len(v))
        for e in v:
            if type(e) is tuple or type(e) is list or not _put(<tuple>k, j, e, keep):
                return False  # (one level of nesting only)
            j += 2
    elif t in _BY_ID:
        keep.append(v)
        k = PyLong_FromVoidPtr(<void*>v)
    else:
        return False
    Py_INCREF(t)
    PyTuple_SET_ITEM(key, i, t)
    Py_INCREF(k)
    PyTuple_SET_ITEM(key, i + 1, k)
    return True


cdef tuple _key(tuple args, dict kw, list keep):
    """(keyword names, then each argument's type and key, flat), or None when one is not
    plain. A tuple left partly filled (None) holds NULL items, which its deallocation skips."""
    cdef Py_ssize_t n = len(args), m = len(kw) if kw else 0, i, pos = 0
    cdef PyObject* name
    cdef PyObject* value
    cdef tuple key = PyTuple_New(1 + 2 * (n + m))
    cdef tuple names
    for i in range(n):
        if not _put(key, 1 + 2 * i, args[i], keep):
            return None
    if m:
        names = PyTuple_New(m)
        i = 0
        while PyDict_Next(kw, &pos, &name, &value):
            Py_INCREF(<object>name)
            PyTuple_SET_ITEM(names, i, <object>name)
            if not _put(key, 1 + 2 * (n + i), <object>value, keep):
                return None
            i += 1
        Py_INCREF(names)
        PyTuple_SET_ITEM(key, 0, names)
    else:
        Py_INCREF(None)
        PyTuple_SET_ITEM(key, 0, None)
    return key


class Interned(type):
    """Metaclass of an immutable value class: a call with the same plain arguments as an earlier
    one returns the earlier call's value (see the module's docstring). Subclasses of such a class
    are built as usual."""

    def __init__(cls, name, bases, namespace, **kw):
        super().__init__(name, bases, namespace, **kw)
        # a subclass may add state, or compare equal to its base's values: built as usual
        root = not any(isinstance(b, Interned) for b in bases)
        cls._interned_class = cls if root else None
        if root:
            cls._interned_values = {}
            _BY_ID.add(cls)

    def __call__(cls, *args, **kw):
        if cls._interned_class is not cls:
            return type.__call__(cls, *args, **kw)
        cdef list keep = []
        key = _key(args, kw, keep)
        if key is None:
            return type.__call__(cls, *args, **kw)
        cdef dict values = cls._interned_values
        cdef PyObject* known = PyDict_GetItem(values, key)  # (hashes ints, strs and types only)
        if known != NULL:
            return (<object>known)[0]
        value = type.__call__(cls, *args, **kw)
        if len(values) >= getattr(cls, "_interned_limit", LIMIT):
            return value
        # (two threads may have built it: the first stored is every call's; the key holds only
        # strs, numbers, types and tuples, so setdefault runs no Python code and is atomic)
        return values.setdefault(key, (value, keep))[0]
