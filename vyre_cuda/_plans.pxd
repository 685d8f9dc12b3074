# One backend's prepared plans: the dict keyed on (program, config, input length codes), the memo
# of the last plan found, and the plans holding graph execs. One owner, one lock.

from libcpp.mutex cimport mutex
from cuda.bindings cimport cydriver

from ._prepared cimport Prepared


cdef class PlanTable:
    cdef mutex mu  # guards every field below; no Python code runs while it is held
    cdef dict plans  # published whole: never changed once other threads may read it
    cdef list graphed  # plans that may hold graph execs (released with the plans)
    cdef int stream_plans  # plans keyed on a caller's stream
    cdef object last_hit  # the last plan found (a _LastHit); None once the plans are cleared
    cdef unsigned long long cleared  # how many times the plans were cleared (last_hit's guard)
    cdef Prepared find(self, program, config, const long long* lens, Py_ssize_t n)


cdef tuple lookup_key(program, config, const long long* lens, Py_ssize_t n)
