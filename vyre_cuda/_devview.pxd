# The one device-array reader: which protocol a type speaks, kept per type; the readers are _devproto's.

from ._devproto cimport CupyStream, DevView, Who


cdef DevView read_device(obj, int device, own, CupyStream memo, Who w)
cdef bint device_type(obj) noexcept
