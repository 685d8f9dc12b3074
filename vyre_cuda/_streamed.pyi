"""The streamed route's executor (its entry points are cdef: the core calls them)."""
