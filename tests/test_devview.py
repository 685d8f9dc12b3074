"""The C reader of device arrays (vyre_cuda._devview) on the fake CUDA driver.

Every producer shape it takes (vyre_cuda's DeviceArray, CUDA Array Interface v3 mappings, a
producer of DLPack's C exchange API built from tests/fakecuda/fake_exchange.c) must give the same
pointer, size, element type, read-only flag and stream as the Python reader; everything it
leaves alone (strides, masks, big-endian types, stream 0, a failing export, another device,
memory the driver does not know) must go to the Python reader, which accepts it or refuses it
with its typed error, exactly as before. Dispatches on each producer are checked against numpy,
and the telemetry says which reader took each array.
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
from vyre_cuda._devview import device_view, fallback_reason, protocol_of
from vyre_cuda._device_io import device_input
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


def compare(what, obj, stream=None):
    # the C reader's view against the Python reader's
    c = device_view(obj, 0, stream)
    if c is None:
        fail(f"{what}: left to the Python reader ({fallback_reason(obj, 0, stream)})")
        return None
    p = device_input(None, 0, obj, 0, stream)
    got = (c.ptr, c.nbytes, c.readonly, c.wait, c.kind, c.itemsize)
    want = (p.ptr, p.nbytes, p.readonly, p.wait, p.kind, p.itemsize)
    res["checked"] += 1
    if got != want:
        fail(f"{what}: C reader {got} != Python reader {want}")
    return c


def left_alone(what, obj, words, stream=None):
    res["checked"] += 1
    if device_view(obj, 0, stream) is not None:
        fail(f"{what}: the C reader took it")
    elif words not in fallback_reason(obj, 0, stream):
        fail(f"{what}: reason {fallback_reason(obj, 0, stream)!r} lacks {words!r}")


n = 777
a = rng.standard_normal(n).astype(np.float32)
b = rng.standard_normal(n).astype(np.float32)
fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
(x,) = g.dispatch(prog, [a, np.zeros_like(a)], DEV)  # x == a, on the device
(y,) = g.dispatch(prog, [b, np.zeros_like(b)], DEV)

# -- DeviceArray
if protocol_of(x) != "DeviceArray":
    fail(f"DeviceArray protocol {protocol_of(x)}")
compare("DeviceArray", x)

# -- CUDA Array Interface v3
for ts in ("<f4", "<i4", "<u2", "|u1", "|b1", "<f8", "|V4"):
    compare(f"CAI {ts}", cai_of(x, typestr=ts, shape=(x.nbytes // np.dtype(ts).itemsize,)))
compare("CAI 2-D, contiguous strides", cai_of(x, shape=(7, 111), strides=(444, 4)))
compare("CAI read-only", cai_of(x, data=(x.ptr, True)))
compare("CAI 0-size", cai_of(x, shape=(0,), data=(0, False)))
compare("CAI 0-size, strided", cai_of(x, shape=(0, 3), strides=(4, 8), data=(0, False)))
compare("CAI stream 7", cai_of(x, stream=7))
c = compare("CAI on the caller's own stream", cai_of(x, stream=7), stream=7)
if c is not None and c.wait is not None:
    fail(f"a producer on the dispatch's own stream is waited on ({c.wait})")
left_alone("CAI strided", cai_of(x, shape=(388,), strides=(8,)), "contiguous")
left_alone("CAI masked", cai_of(x, mask=cai_of(x)), "mask")
left_alone("CAI big-endian", cai_of(x, typestr=">f4"), "big-endian")
left_alone("CAI complex", cai_of(x, typestr="<c8", shape=(n // 2,)), "big-endian or unknown")
left_alone("CAI stream 0", cai_of(x, stream=0), "stream")
left_alone("CAI stream True", cai_of(x, stream=True), "stream")
left_alone("CAI pointer as float", cai_of(x, data=(float(x.ptr), False)), "pointer")
left_alone("CAI host pointer", cai_of(x, data=(a.ctypes.data, False)), "does not know")
left_alone("CAI shape as list", cai_of(x, shape=[n]), "tuple")
v2 = cai_of(x, version=2)
left_alone("CAI v2", v2, "not a CUDA Array Interface v3")

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
    first = compare(f"CuPy first array, stream {stream}, own {own}", ndarray(x), stream=own)
    for what, arr in (("f32", ndarray(y)), ("i32", ndarray(y, np.int32)), ("u8", ndarray(x, np.uint8)),
                      ("bool", ndarray(x, np.bool_)), ("2-D", ndarray(x, shape=(7, 111))),
                      ("0-size", ndarray(x, shape=(0,)))):
        reads = cupy_state["cai_reads"]
        c = device_view(arr, 0, own, after=first)
        if cupy_state["cai_reads"] != reads:
            fail(f"CuPy {what} after the dispatch's first: the C reader read its CAI")
        p = device_input(None, 0, arr, 0, own)
        res["checked"] += 1
        if c is None:
            fail(f"CuPy {what} after the first: left alone ({fallback_reason(arr, 0, own)})")
            continue
        got = (c.ptr, c.nbytes, c.readonly, c.wait, c.kind, c.itemsize)
        want = (p.ptr, p.nbytes, p.readonly, p.wait, p.kind, p.itemsize)
        if got != want:
            fail(f"CuPy {what} after the first, stream {stream}: fields {got} != Python reader {want}")
cupy_state["stream"] = 1
first = device_view(ndarray(x), 0, None)
for what, arr, words in (("strided", ndarray(x, shape=(388,), contiguous=False), "contiguous"),
                         ("device 3", ndarray(x, device_id=3), "another device"),
                         ("big-endian", ndarray(x, ">f4"), "big-endian"),
                         ("complex", ndarray(x, np.complex64), "big-endian or unknown")):
    res["checked"] += 1
    if device_view(arr, 0, None, after=first) is not None:
        fail(f"CuPy {what}: the C reader took it")
    if words not in fallback_reason(arr, 0, None):
        fail(f"CuPy {what} (first array): reason {fallback_reason(arr, 0, None)!r} lacks {words!r}")

# -- the per-type cache follows the type's changes
class Versioned:
    version = 2
    def __init__(self, base):
        self.base = base
    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.base.size,), "typestr": "<f4", "data": (self.base.ptr, False),
                "version": type(self).version}
if protocol_of(Versioned(x)) != "python":
    fail(f"a CAI v2 type read as {protocol_of(Versioned(x))}")
Versioned.version = 3  # a type left to the Python reader is asked again at its next array
if protocol_of(Versioned(x)) != "cai":
    fail(f"after the type changed to v3: {protocol_of(Versioned(x))} (a stale cache entry)")
res["checked"] += 1
Versioned.version = 2  # a kept type whose next array is refused is forgotten, then decided again
if device_view(Versioned(x), 0, None) is not None:
    fail("a CAI v2 array of a type kept as v3 was read in C")
if protocol_of(Versioned(x)) != "python":
    fail(f"after the type changed back to v2: {protocol_of(Versioned(x))} (a stale cache entry)")
res["checked"] += 1

# -- DLPack's C exchange API
t = fx.Tensor(x.ptr, (n,))
if protocol_of(t) != "dlpack-exchange":
    fail(f"exchange producer protocol {protocol_of(t)}")
for handle, want in ((0, 1), (9, 9)):  # NULL: the producer's legacy default stream
    fx.set_stream(handle)
    v = device_view(t, 0, None)
    res["checked"] += 1
    if v is None or (v.ptr, v.nbytes, v.readonly, v.wait, v.kind, v.itemsize) != (x.ptr, x.nbytes, False, want, "f", 4):
        fail(f"exchange view with stream {handle}: {v!r} ({fallback_reason(t)})")
    del v
fx.set_stream(9)
v = device_view(t, 0, 9)
if v is None or v.wait is not None:
    fail(f"an exchange producer on the dispatch's own stream: {v!r}")
del v
v = device_view(fx.Tensor(x.ptr, (n,), flags=1), 0, None)
if v is None or not v.readonly:
    fail(f"the read-only flag of an exchange tensor was lost: {v!r}")
del v
v = device_view(fx.Tensor(x.ptr, (3, 259), strides=(259, 1), code=0, bits=32), 0, None)
if v is None or (v.nbytes, v.kind) != (x.nbytes, "i"):
    fail(f"a 2-D int32 exchange tensor: {v!r}")
del v
fx.set_stream(0)
left_alone("exchange strided", fx.Tensor(x.ptr, (388,), strides=(2,)), "contiguous")
left_alone("exchange device 3", fx.Tensor(x.ptr, (n,), device_id=3), "this CUDA device")
left_alone("exchange CPU", fx.Tensor(a.ctypes.data, (n,), device_type=1), "this CUDA device")
left_alone("exchange vector lanes", fx.Tensor(x.ptr, (n // 2,), lanes=2), "element type")
left_alone("exchange complex", fx.Tensor(x.ptr, (n // 2,), code=5, bits=64), "element type")
left_alone("exchange export fails", fx.Tensor(x.ptr, (n,), fail=True), "refused")
fx.set_stream(0, fail=True)
left_alone("exchange stream fails", fx.Tensor(x.ptr, (n,)), "stream")
fx.set_stream(0)
if fx.live() != 0:
    fail(f"{fx.live()} exchange tensors were never given back (deleter not run)")

# -- dispatches through each producer, against numpy; the counters say which reader took them
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
(out,) = g.dispatch(prog, [v2, y])  # CAI v2: the Python reader
same("CAI v2 input", out, a + b)
res["python_after_v2"] = g.telemetry.snapshot()["device_arrays_read_in_python"] - after["device_arrays_read_in_python"]

# -- refusals: the Python reader's typed errors, and nothing held afterwards
def refusal(fn):
    return str(raises(vc.ValidationError, fn))


res["refusals"] = {
    "dtype": refusal(lambda: g.dispatch(prog, [cai_of(x, typestr="<i4"), a])),
    "exchange dtype": refusal(lambda: g.dispatch(prog, [fx.Tensor(x.ptr, (n,), code=0), a])),
    "exchange strided": refusal(lambda: g.dispatch(prog, [fx.Tensor(x.ptr, (388,), strides=(2,)), a[:388]])),
    "exchange export fails": refusal(lambda: g.dispatch(prog, [fx.Tensor(x.ptr, (n,), fail=True), a])),
    "read-only output": refusal(lambda: g.dispatch_into(prog, [a, b], [fx.Tensor(z.ptr, (n,), flags=1)])),
    "short output": refusal(lambda: g.dispatch_into(prog, [a, b], [cai_of(z, shape=(n - 1,))])),
}
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


def test_device_arrays_read_in_c_match_the_python_reader(fake_libcuda, exchange_dir, rng):
    seed = int(rng.integers(0, 2**31))
    proc = fakecuda.run_python(["-c", CHILD, str(seed), str(exchange_dir)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, f"child (seed {seed}) failed:\n{proc.stderr[-4000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["errors"] == [], res["errors"]
    assert res["checked"] >= 40
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
    refusals = res["refusals"]
    assert all("Fix:" in text for text in refusals.values()), refusals
    assert "float32" in refusals["dtype"] and "int32" in refusals["dtype"], refusals
    assert "int32" in refusals["exchange dtype"], refusals
    assert "strided" in refusals["exchange strided"], refusals
    assert "refuses export" in refusals["exchange export fails"], refusals
    assert "read-only" in refusals["read-only output"], refusals
    assert "bytes" in refusals["short output"], refusals
    assert res["exchange_live"] == 0
    assert set(res["live"].values()) == {0}, res["live"]
