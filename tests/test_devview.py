"""The one reader of device arrays (vyre_cuda._devview) on the fake CUDA driver.

Every producer shape (vyre_cuda's DeviceArray, CUDA Array Interface mappings, CuPy's fields, a
producer of DLPack's C exchange API built from tests/fakecuda/fake_exchange.c, ``__dlpack__``)
must give the pointer, size, element type, read-only flag and stream it describes; every user
error (another device, strides, masks, big-endian types, a bad stream, a failing export, memory
the driver does not know, a malformed interface, the wrong dtype, size or writability of an
output) is the reader's typed error with its Fix, and the next dispatch runs as if it had not
happened. Dispatches on each producer are checked against numpy, and the telemetry says which
arrays were of a type the reader keeps.
"""

from __future__ import annotations

import json

import fakecuda
import pytest

CHILD = r"""
import array, json, sys
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from helpers.scenarios import live, raises
from vyre_cuda import builtin_programs as bp
from vyre_cuda._devview import device_view, host_view, protocol_of
sys.path.insert(0, sys.argv[2])
import fake_exchange as fx

fake = FakeDriver()
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
g = vc.CudaBackend(0)
DEV = vc.DispatchConfig(outputs="device")
res = {"errors": [], "checked": 0}


def fail(msg):
    res["errors"].append(msg)


def same(what, got, want):
    res["checked"] += 1
    if not np.array_equal(np.asarray(got), want):
        fail(f"{what}: wrong result")


class CAI:
    def __init__(self, **d):
        self.d = d

    @property
    def __cuda_array_interface__(self):
        return dict(self.d)


def cai_of(x, **over):
    d = {"shape": (x.size,), "typestr": x.dtype.str, "data": (x.ptr, False), "version": 3, "strides": None,
         "stream": None}
    d.update(over)
    return CAI(**d)


def fields(v):
    return (v.ptr, v.nbytes, v.readonly, v.wait, v.kind, v.itemsize)


def expect(what, obj, want, stream=None, device=0):
    # the reader's view against what the producer describes
    res["checked"] += 1
    try:
        v = device_view(obj, device, stream)
    except vc.ValidationError as exc:
        fail(f"{what}: refused ({exc})")
        return None
    if v is None or fields(v) != want:
        fail(f"{what}: {None if v is None else fields(v)} != {want}")
    return v


def refused(what, obj, words, stream=None, device=0):
    # a user error: the reader's typed error, naming the array, with its Fix
    res["checked"] += 1
    try:
        v = device_view(obj, device, stream)
    except vc.ValidationError as exc:
        text = str(exc)
        if words not in text or "input 0 ((extra))" not in text or not text.splitlines()[-1].startswith("Fix: "):
            fail(f"{what}: {text!r} lacks {words!r}, the array's name or a Fix line")
        return
    fail(f"{what}: read as {v!r}")


n = 777
a = rng.standard_normal(n).astype(np.float32)
b = rng.standard_normal(n).astype(np.float32)
fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
(x,) = g.dispatch(prog, [a, np.zeros_like(a)], DEV)  # x == a, on the device
(y,) = g.dispatch(prog, [b, np.zeros_like(b)], DEV)

# -- DeviceArray
if protocol_of(x) != "DeviceArray":
    fail(f"DeviceArray protocol {protocol_of(x)}")
expect("DeviceArray", x, (x.ptr, x.nbytes, False, None, "f", 4))
refused("DeviceArray for device 1", x, "lives on CUDA device 0, but this backend runs on device 1", device=1)

# -- CUDA Array Interface
for ts, kind in (("<f4", "f"), ("<i4", "i"), ("<u2", "u"), ("|u1", "u"), ("|b1", "u"), ("<f8", "f"), ("|V4", "u"),
                 ("<c8", "")):
    size = np.dtype(ts).itemsize
    count = x.nbytes // size
    expect(f"CAI {ts}", cai_of(x, typestr=ts, shape=(count,)), (x.ptr, count * size, False, None, kind, size))
whole = (x.ptr, x.nbytes, False, None, "f", 4)
expect("CAI 2-D, contiguous strides", cai_of(x, shape=(7, 111), strides=(444, 4)), whole)
expect("CAI read-only", cai_of(x, data=(x.ptr, True)), (x.ptr, x.nbytes, True, None, "f", 4))
expect("CAI 0-size", cai_of(x, shape=(0,), data=(0, False)), (0, 0, False, None, "f", 4))
expect("CAI 0-size, strided", cai_of(x, shape=(0, 3), strides=(4, 8), data=(0, False)), (0, 0, False, None, "f", 4))
expect("CAI stream 7", cai_of(x, stream=7), (x.ptr, x.nbytes, False, 7, "f", 4))
expect("CAI on the caller's own stream", cai_of(x, stream=7), whole, stream=7)
expect("CAI legacy stream, caller's legacy stream", cai_of(x, stream=1), whole, stream=0)
expect("CAI shape as a list", cai_of(x, shape=[n]), whole)
v2 = cai_of(x, version=2, stream=7)  # (an interface before v3 names no stream)
expect("CAI v2", v2, whole)
if protocol_of(v2) != "cai-before-v3":
    fail(f"CAI v2 protocol {protocol_of(v2)}")
refused("CAI strided", cai_of(x, shape=(388,), strides=(8,)), "strided device array (shape (388,), strides (8,) bytes")
refused("CAI masked", cai_of(x, mask=cai_of(x)), "masked device array")
refused("CAI big-endian", cai_of(x, typestr=">f4"), "big-endian (typestr '>f4'); the GPU reads little-endian")
refused("CAI stream 0", cai_of(x, stream=0), "names stream 0; version 3 forbids 0")
refused("CAI stream True", cai_of(x, stream=True), "names stream True")
refused("CAI host pointer", cai_of(x, data=(a.ctypes.data, False)), "is not memory the CUDA driver knows")
refused("CAI no typestr", CAI(shape=(n,), data=(x.ptr, False), version=3), "malformed __cuda_array_interface__")
refused("CAI negative extent", cai_of(x, shape=(-1,)), "malformed __cuda_array_interface__")
refused("CAI for device 1", cai_of(x), "lives on CUDA device 0, but this backend runs on device 1", device=1)

# -- CuPy's ndarray: its fields, and the CAI of a dispatch's first CuPy array for the stream
class MemoryPointer:
    __module__ = "cupy.cuda.memory"

    def __init__(self, ptr, device_id=0):
        self.ptr, self.device_id = ptr, device_id


cupy_state = {"cai_reads": 0, "stream": None}  # (not class attributes: setting one modifies the type)


class _ndarray_base:
    __module__ = "cupy._core.core"

    def __init__(self, base, dtype=np.float32, shape=None, contiguous=True, device_id=0):
        self._dtype = np.dtype(dtype)
        self._shape = (base.nbytes // self._dtype.itemsize,) if shape is None else shape
        self._data = MemoryPointer(base.ptr, device_id)
        self._contiguous = contiguous

    data = property(lambda self: self._data)
    dtype = property(lambda self: self._dtype)
    size = property(lambda self: int(np.prod(self._shape)))
    _c_contiguous = property(lambda self: self._contiguous)

    @property
    def __cuda_array_interface__(self):
        cupy_state["cai_reads"] += 1
        strides = None if self._contiguous else tuple(2 * self._dtype.itemsize for _ in self._shape)
        d = {"shape": self._shape, "typestr": self._dtype.str, "data": (self._data.ptr if self.size else 0, False),
             "version": 3, "strides": strides}
        if cupy_state["stream"] is not None:  # what CuPy's CAI names: its current stream
            d["stream"] = cupy_state["stream"]
        return d


class ndarray(_ndarray_base):  # as cupy.ndarray: a subclass overriding none of the fields
    __module__ = "cupy"


class Described(ndarray):  # a subclass describing its memory itself: a plain CAI producer
    __cuda_array_interface__ = property(lambda self: {"shape": self._shape, "typestr": self._dtype.str,
                                                     "data": (self._data.ptr, False), "version": 3})


if protocol_of(ndarray(x)) != "cupy" or protocol_of(Described(x)) != "cai":
    fail(f"CuPy protocols: {protocol_of(ndarray(x))}, {protocol_of(Described(x))}")
for stream, own in ((None, None), (7, None), (7, 7), (1, None)):
    cupy_state["stream"] = stream
    wait = None if stream is None or stream == own else stream
    first = expect(f"CuPy first array, stream {stream}, own {own}", ndarray(x), (x.ptr, x.nbytes, False, wait, "f", 4),
                   stream=own)
    for what, arr, kind, size in (("f32", ndarray(y), "f", 4), ("i32", ndarray(y, np.int32), "i", 4),
                                  ("u8", ndarray(x, np.uint8), "u", 1), ("bool", ndarray(x, np.bool_), "u", 1),
                                  ("2-D", ndarray(x, shape=(7, 111)), "f", 4),
                                  ("0-size", ndarray(x, shape=(0,)), "f", 4)):
        reads = cupy_state["cai_reads"]
        c = device_view(arr, 0, own, after=first)
        if cupy_state["cai_reads"] != reads:
            fail(f"CuPy {what} after the dispatch's first: the reader read its CAI")
        res["checked"] += 1
        want = (arr.data.ptr if arr.size else 0, arr.size * size, False, wait, kind, size)
        if c is None or fields(c) != want:
            fail(f"CuPy {what} after the first, stream {stream}: {None if c is None else fields(c)} != {want}")
cupy_state["stream"] = 1
expect("CuPy complex (its interface)", ndarray(x, np.complex64), (x.ptr, n // 2 * 8, False, 1, "", 8))
for what, arr, words in (("strided", ndarray(x, shape=(388,), contiguous=False), "strided device array"),
                         ("device 3", ndarray(x, device_id=3), "lives on CUDA device 3"),
                         ("big-endian", ndarray(x, ">f4"), "big-endian (typestr '>f4')")):
    refused(f"CuPy {what}", arr, words)
    if protocol_of(arr) != "cupy":
        fail(f"CuPy {what}: the type was forgotten after a user error ({protocol_of(arr)})")

# -- the per-type table follows the type's changes
class Versioned:  # speaks DLPack too: read through it unless its interface is v3
    version = 2

    def __init__(self, base):
        self.base = base

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.base.size,), "typestr": "<f4", "data": (self.base.ptr, False),
                "version": type(self).version}

    def __dlpack__(self, stream=None):
        return self.base.__dlpack__(stream=stream, max_version=(1, 0))

    def __dlpack_device__(self):
        return self.base.__dlpack_device__()


if protocol_of(Versioned(x)) != "dlpack":
    fail(f"a CAI v2 type with DLPack read as {protocol_of(Versioned(x))}")
expect("DLPack, pooled stream", Versioned(x), (x.ptr, x.nbytes, False, 1, "f", 4))
expect("DLPack, the caller's stream", Versioned(x), whole, stream=9)
Versioned.version = 3  # a type read through Python calls is decided again at its next array
if protocol_of(Versioned(x)) != "cai":
    fail(f"after the type changed to v3: {protocol_of(Versioned(x))} (a stale table entry)")
Versioned.version = 2  # a kept type whose next array is no longer v3 is forgotten, then read as it is
expect("a type kept as CAI v3, now v2 with DLPack", Versioned(x), (x.ptr, x.nbytes, False, 1, "f", 4))
if protocol_of(Versioned(x)) != "dlpack":
    fail(f"after the type changed back to v2: {protocol_of(Versioned(x))} (a stale table entry)")
res["checked"] += 2
if protocol_of(b"host bytes") != "none" or device_view(b"host bytes") is not None:
    fail("host bytes read as a device array")

# -- DLPack's C exchange API
t = fx.Tensor(x.ptr, (n,))
if protocol_of(t) != "dlpack-exchange":
    fail(f"exchange producer protocol {protocol_of(t)}")
for handle, want in ((0, 1), (9, 9)):  # NULL: the producer's legacy default stream
    fx.set_stream(handle)
    expect(f"exchange view with stream {handle}", t, (x.ptr, x.nbytes, False, want, "f", 4))
fx.set_stream(9)
expect("an exchange producer on the dispatch's own stream", t, whole, stream=9)
expect("the read-only flag of an exchange tensor", fx.Tensor(x.ptr, (n,), flags=1), (x.ptr, x.nbytes, True, 9, "f", 4))
expect("a 2-D int32 exchange tensor", fx.Tensor(x.ptr, (3, 259), strides=(259, 1), code=0, bits=32),
       (x.ptr, x.nbytes, False, 9, "i", 4))
expect("exchange vector lanes", fx.Tensor(x.ptr, (n // 2,), lanes=2), (x.ptr, n // 2 * 8, False, 9, "", 8))
expect("exchange complex", fx.Tensor(x.ptr, (n // 2,), code=5, bits=64), (x.ptr, n // 2 * 8, False, 9, "", 8))
fx.set_stream(0)
refused("exchange strided", fx.Tensor(x.ptr, (388,), strides=(2,)), "strided device array (shape (388,), strides (8,)")
refused("exchange device 3", fx.Tensor(x.ptr, (n,), device_id=3), "lives on CUDA device 3")
refused("exchange device type 10", fx.Tensor(x.ptr, (n,), device_type=10), "device type 10 (not CUDA)")
refused("exchange export fails", fx.Tensor(x.ptr, (n,), fail=True),
        "(RuntimeError: fake_exchange: this tensor refuses export)")
cpu = fx.Tensor(a.ctypes.data, (n,), device_type=1)
if device_view(cpu) is not None:
    fail("a CPU exchange tensor was read as device memory")
if np.lib.NumpyVersion(np.__version__) >= "2.1.0":
    same("a CPU exchange tensor as numpy", host_view(cpu), a)
elif host_view(cpu) is not None:  # (older numpy reads no versioned DLPack capsule: the host path refuses it)
    fail("a CPU exchange tensor viewed by a numpy that reads no versioned capsule")
fx.set_stream(0, fail=True)  # no current stream: its __dlpack__(stream=1) orders it instead
expect("exchange stream fails", fx.Tensor(x.ptr, (n,)), (x.ptr, x.nbytes, False, 1, "f", 4))
fx.set_stream(0)
del cpu
if fx.live() != 0:
    fail(f"{fx.live()} exchange tensors were never given back (deleter not run)")

# -- dispatches through each producer, against numpy; the counters say which were of a kept type
before = g.telemetry.snapshot()
(out,) = g.dispatch(prog, [x, y])
same("DeviceArray inputs", out, a + b)
(out,) = g.dispatch(prog, [cai_of(x, stream=1), fx.Tensor(y.ptr, (n,))])
same("CAI + exchange inputs", out, a + b)
(z,) = g.dispatch(prog, [a, b], DEV)
g.dispatch_into(prog, [fx.Tensor(y.ptr, (n,)), cai_of(x)], [fx.Tensor(z.ptr, (n,))])
same("exchange output", z.copy_to_host(), a + b)
g.dispatch_into(prog, [x, x], [cai_of(z)])
same("CAI output", z.copy_to_host(), a + a)
pending = g.dispatch_async(prog, [fx.Tensor(x.ptr, (n,)), y])
if fx.live() != 1:
    fail(f"an exchange input in flight is not held ({fx.live()} live)")
same("async exchange input", pending.result()[0], a + b)
del pending
if fx.live() != 0:
    fail(f"exchange tensors still held after the dispatches: {fx.live()}")
# CuPy arrays: one CAI read per dispatch, a second after a read that may run Python (a foreign
# producer's CAI, a buffer exporter other than numpy's)
cupy_state["stream"] = 1
for mix, want in ((lambda: ([ndarray(x), ndarray(y)], [ndarray(z)]), 1),
                  (lambda: ([ndarray(x), cai_of(y)], [ndarray(z)]), 2),
                  (lambda: ([x, ndarray(y)], [ndarray(z)]), 1),
                  (lambda: ([ndarray(x), array.array("f", b.tobytes())], [ndarray(z)]), 2)):
    ins, outs = mix()
    g.dispatch_into(prog, ins, outs)  # plans a new shape (a plan miss reads the inputs twice)
    z_before = cupy_state["cai_reads"]
    g.dispatch_into(prog, ins, outs)
    same(f"CuPy dispatch ({want} CAI)", z.copy_to_host(), a + b)
    res.setdefault("cupy_cai_reads", []).append([cupy_state["cai_reads"] - z_before, want])
    g.dispatch(prog, [a, np.zeros_like(a)], DEV)  # z is overwritten below; keep the arrays apart
    g.dispatch_into(prog, [a, -a], [z])  # zero z again, so the next check sees a fresh write
# CuPy's stream read as its CAI computes it (its current stream; 0 names the default stream):
# no CAI read per dispatch once a first real CAI agreed; any disagreement or other export
# version reads the CAI as above
import types
from vyre_cuda._devview import _forget_cupy_api


class _CupyStreamObj:
    def __init__(self, ptr):
        self.ptr = ptr


def _current_stream():
    cupy_state["current_reads"] += 1
    if cupy_state.get("current_override") is not None:
        return _CupyStreamObj(cupy_state["current_override"])
    return _CupyStreamObj(0 if cupy_state["stream"] == 1 else cupy_state["stream"])


cupy_state["current_reads"] = 0
fake_util = types.ModuleType("cupy._util")
fake_util.CUDA_ARRAY_INTERFACE_EXPORT_VERSION = 3
fake_cuda = types.ModuleType("cupy.cuda")
fake_cuda.get_current_stream = _current_stream
fake_backend = types.ModuleType("cupy_backends.cuda.stream")
fake_backend.get_default_stream_ptr = lambda: 1
sys.modules.update({"cupy._util": fake_util, "cupy.cuda": fake_cuda, "cupy_backends.cuda.stream": fake_backend})
MIXES = ((lambda: ([ndarray(x), ndarray(y)], [ndarray(z)]), 1),
         (lambda: ([ndarray(x), cai_of(y)], [ndarray(z)]), 2),
         (lambda: ([x, ndarray(y)], [ndarray(z)]), 1),
         (lambda: ([ndarray(x), array.array("f", b.tobytes())], [ndarray(z)]), 2))


def cupy_reads(label, cai_per_dispatch):
    for mix, want in MIXES:
        ins, outs = mix()
        g.dispatch_into(prog, ins, outs)  # (the first CuPy array of the process checks a real CAI)
        cur, cai = cupy_state["current_reads"], cupy_state["cai_reads"]
        g.dispatch(prog, [a, np.zeros_like(a)], DEV)
        g.dispatch_into(prog, [a, -a], [z])
        g.dispatch_into(prog, ins, outs)
        same(f"CuPy dispatch, {label}", z.copy_to_host(), a + b)
        got = [cupy_state["current_reads"] - cur, cupy_state["cai_reads"] - cai]
        expected = [0, want] if cai_per_dispatch else [want, 0]
        res.setdefault("cupy_stream_reads", []).append([label, got, expected])


cupy_state["stream"] = 1
_forget_cupy_api()
cupy_reads("current stream", False)
for stream in (7, 1):  # the view names the stream the CAI would (7: a stream of the caller's)
    cupy_state["stream"] = stream
    v = device_view(ndarray(x), 0, None)
    res["checked"] += 1
    if v is None or v.wait != stream:
        fail(f"CuPy stream {stream} read from the current stream: {v!r}")
    del v
fake_util.CUDA_ARRAY_INTERFACE_EXPORT_VERSION = 2  # CuPy exports no stream then: only its CAI says so
cupy_reads("export version 2", True)
fake_util.CUDA_ARRAY_INTERFACE_EXPORT_VERSION = 3
cupy_state["current_override"] = 9  # disagrees with the CAI's 1 at the first check: never used
_forget_cupy_api()
cupy_reads("disagreeing current stream", True)
cupy_state["current_override"] = None
for name in ("cupy._util", "cupy.cuda", "cupy_backends.cuda.stream"):
    del sys.modules[name]
_forget_cupy_api()
after = g.telemetry.snapshot()
res["read_in_c"] = after["device_arrays_read_in_c"] - before["device_arrays_read_in_c"]
res["read_in_python"] = after["device_arrays_read_in_python"] - before["device_arrays_read_in_python"]
(out,) = g.dispatch(prog, [v2, y])  # CAI v2: a type read through Python calls, never kept
same("CAI v2 input", out, a + b)
res["python_after_v2"] = g.telemetry.snapshot()["device_arrays_read_in_python"] - after["device_arrays_read_in_python"]

# -- every user error from the one reader, typed, with its Fix; the next dispatch runs as before
class GradTensor(fx.Tensor):  # as a torch leaf tensor: requires grad
    requires_grad = True


g.dispatch(prog, [cai_of(x), a])  # (plans the key the cached-plan case below hits)
REFUSALS = (
    ("input dtype, plan cached", lambda: g.dispatch(prog, [cai_of(x, typestr="<i4"), a]),
     "input 0 ('a') holds int32 but the buffer is declared f32"),
    ("input dtype, exchange", lambda: g.dispatch(prog, [b, fx.Tensor(x.ptr, (n,), code=0)]),
     "input 1 ('b') holds int32 but the buffer is declared f32"),
    ("input dtype, exchange lanes", lambda: g.dispatch(prog, [fx.Tensor(x.ptr, (n // 2,), lanes=2), a[: n // 2 * 2]]),
     "holds float32x2"),
    ("input dtype, CuPy complex", lambda: g.dispatch(prog, [ndarray(x, np.complex64), a[: n // 2 * 2]]),
     "holds complex64"),
    ("input strided, exchange", lambda: g.dispatch(prog, [fx.Tensor(x.ptr, (388,), strides=(2,)), a[:388]]),
     "input 0 ('a') is a strided device array"),
    ("input strided, CAI", lambda: g.dispatch(prog, [cai_of(x, shape=(388,), strides=(8,)), a[:388]]), "strided"),
    ("input strided, CuPy", lambda: g.dispatch(prog, [ndarray(x, shape=(388,), contiguous=False), a[:388]]),
     "strided"),
    ("input on device 3", lambda: g.dispatch(prog, [fx.Tensor(x.ptr, (n,), device_id=3), a]),
     "lives on CUDA device 3, but this backend runs on device 0"),
    ("input on DLPack device type 10", lambda: g.dispatch(prog, [fx.Tensor(x.ptr, (n,), device_type=10), a]),
     "device type 10 (not CUDA)"),
    ("input export fails", lambda: g.dispatch(prog, [fx.Tensor(x.ptr, (n,), fail=True), a]), "refuses export"),
    ("input masked", lambda: g.dispatch(prog, [cai_of(x, mask=cai_of(x)), a]), "masked"),
    ("input big-endian", lambda: g.dispatch(prog, [cai_of(x, typestr=">f4"), a]), "the GPU reads little-endian"),
    ("input malformed", lambda: g.dispatch(prog, [CAI(shape=(n,), data=(x.ptr, False), version=3), a]), "malformed"),
    ("input stream 0", lambda: g.dispatch(prog, [cai_of(x, stream=0), a]), "names stream 0"),
    ("input unknown pointer", lambda: g.dispatch(prog, [cai_of(x, data=(a.ctypes.data, False)), a]),
     "is not memory the CUDA driver knows"),
    ("output dtype", lambda: g.dispatch_into(prog, [a, b], [cai_of(z, typestr="<i4")]),
     "output 0 ('out') holds int32 but the buffer is float32"),
    ("output read-only, exchange", lambda: g.dispatch_into(prog, [a, b], [fx.Tensor(z.ptr, (n,), flags=1)]),
     "read-only device array"),
    ("output read-only, CAI", lambda: g.dispatch_into(prog, [x, y], [cai_of(z, data=(z.ptr, True))]), "read-only"),
    ("output short", lambda: g.dispatch_into(prog, [a, b], [cai_of(z, shape=(n - 1,))]),
     f"holds {4 * (n - 1)} bytes; the dispatch reads back {4 * n}"),
    ("output requires grad", lambda: g.dispatch_into(prog, [x, y], [GradTensor(z.ptr, (n,))]), "requires grad"),
    ("output requires grad, result_into",
     lambda: g.dispatch_async(prog, [a, b]).result_into([GradTensor(z.ptr, (n,))]), "requires grad"),
    ("output big-endian", lambda: g.dispatch_into(prog, [a, b], [cai_of(z, typestr=">f4")]),
     "the GPU writes little-endian"),
    ("output strided", lambda: g.dispatch_into(prog, [a, b], [cai_of(z, strides=(8,))]),
     "output 0 ('out') is a strided"),
)
res["refusals"] = len(REFUSALS)
for what, call, words in REFUSALS:
    try:
        call()
    except vc.ValidationError as exc:
        text = str(exc)
        if words not in text or not text.splitlines()[-1].startswith("Fix: "):
            fail(f"{what}: {text!r} lacks {words!r} or a Fix line")
    else:
        fail(f"{what}: not refused")
    (out,) = g.dispatch(prog, [x, y])
    same(f"a dispatch after the refusal {what}", out, a + b)
    g.dispatch_into(prog, [x, b], [z])
    same(f"a dispatch_into after the refusal {what}", z.copy_to_host(), a + b)
(out,) = g.dispatch(prog, [x, y])
same("after the refusals", out, a + b)
res["exchange_live"] = fx.live()
res["live"] = live(g)
del x, y, z, t
g.close()
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def exchange_dir(tmp_path_factory):
    if fakecuda.compiler() is None:
        pytest.skip("no C compiler on PATH to build the fake exchange producer")
    return fakecuda.build_exchange(tmp_path_factory.getbasetemp() / "fake_exchange")


def test_one_reader_reads_every_producer_and_refuses_every_user_error(fake_libcuda, exchange_dir, rng):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed), str(exchange_dir)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [], res["errors"]
    assert res["checked"] >= 100
    # 2 + 2 inputs, 2 inputs and 1 output twice, 1 async input: 11 arrays (a dispatch whose plan
    # was not cached yet reads its inputs again once planned)
    assert res["read_in_python"] == 0 and res["read_in_c"] >= 11, res
    # a dispatch of CuPy arrays reads one CAI (its stream), and one more after a foreign CAI
    assert [got for got, _ in res["cupy_cai_reads"]] == [want for _, want in res["cupy_cai_reads"]], res
    # with CuPy's stream functions: the stream read once per dispatch (again after a foreign read)
    # and no CAI; with another export version or functions that disagreed, the CAI as above
    assert [label for label, _, _ in res["cupy_stream_reads"]].count("current stream") == 4, res
    assert all(got == want for _, got, want in res["cupy_stream_reads"]), res["cupy_stream_reads"]
    assert res["python_after_v2"] == 1, res
    assert res["refusals"] >= 20, res
    assert res["exchange_live"] == 0
    assert set(res["live"].values()) == {0}, res["live"]
