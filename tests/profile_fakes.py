"""A fake backend, a fake floor and the fixture that installs them: the profile's whole run
without a GPU (used by test_profile_run.py and test_profile_cli.py through their
``fake_device`` fixture)."""

import sys
import threading
import time
import types
from typing import TYPE_CHECKING, Any

import numpy as np
from helpers.contracts import ProfiledBackend

import vyre_cuda
from benchmarks.harness import patterns, standalone, streamed
from vyre_cuda import profile as P
from vyre_cuda.errors import ValidationError
from vyre_cuda.profile import engine, session
from vyre_cuda.program import BufferDecl, Kernel, Program

STAGES = P.STAGE_NAMES
# the patterns' measurements at a size a CPU test runs in a second
PATTERNS_SMALL = patterns.Settings(
    steps=10,
    repeats=4,
    awaits=20,
    gather=4,
    gathers=4,
    spin_s=0.02,
    budget_bytes=1 << 20,
    budget_start=512 << 10,
    budget_repeats=2,
)


class _FakePending:
    """A dispatch in flight: done ``delay`` seconds after it was made; awaitable through the real
    asyncio waiter (vyre_cuda._aio), as a PendingDispatch is."""

    def __init__(self, outs, delay=0.0):
        self._outs = outs
        self._ready_at = time.perf_counter() + delay

    def is_ready(self):
        return time.perf_counter() >= self._ready_at

    def result(self):
        left = self._ready_at - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return self._outs

    def __await__(self):
        from vyre_cuda import _aio

        return _aio.awaitable(self, 0).__await__()


def _fake_add(inputs):
    return [inputs[0] + inputs[1] if len(inputs) > 1 else inputs[0] * 2]


def _fake_run(program, inputs):
    """What the fake device computes: the heavy kernel and the patterns' spin kernel by their
    names, else vecadd."""
    name = getattr(program, "name", None)
    if name == "heavy":
        return [streamed.heavy_reference(np.asarray(inputs[0]), np.asarray(inputs[1]), streamed.HEAVY_STEPS)]
    if name == patterns.SPIN_NAME:
        return [np.ones(patterns.SPIN_OUTPUTS, np.uint32)]
    return _fake_add([np.asarray(x) for x in inputs])


def _fake_seconds(program, inputs):
    """How long a dispatch runs on the fake device: the spin kernel its ``ns`` input, else 0."""
    if getattr(program, "name", None) == patterns.SPIN_NAME:
        return int(np.asarray(inputs[0])[0]) / 1e9
    return 0.0


class FakeDeviceArray(np.ndarray):
    """A device output stand-in (``outputs="device"``): copied back with ``copy_to_host``."""

    def copy_to_host(self):
        return np.array(self, copy=True)


# the planner's rule for an unforced dispatch of an elementwise program: at least 2 chunks of 8 MiB
STREAM_FROM = 16 << 20


class _FakeTelemetry:
    def __init__(self, backend, with_allocations):
        self.backend = backend
        self.with_allocations = with_allocations

    def snapshot(self):
        b = self.backend
        snap = {"dispatches": b.dispatches, "pinned_pool_misses": b.pinned_allocs, "device_pool_misses": 0}
        if self.with_allocations:
            snap.update(
                pinned_alloc_calls=b.pinned_allocs,
                device_alloc_calls=0,
                ring_bytes=32 << 20,
                ring_chunks=3 * b.dispatches,
                copy_threads_live=4,
            )
        return snap


class FakeBackend(ProfiledBackend):
    device = 0
    context_handle = 0x1234
    caps = types.SimpleNamespace(cc=(9, 0), name="Fake GPU", driver_version=13000)
    # DispatchConfig(device_memory_budget=...) below this is refused, naming it as the smallest
    min_budget = 100_000
    budget_seconds: Any = None  # budget -> extra seconds a budgeted dispatch_into takes
    async_delay = 0.0  # seconds a dispatch_async runs (0: done when it returns)

    def __init__(self, device=0, with_allocations=True, allocate_every=0, **options):
        self.closed = False
        self.options = options
        self.dispatches = 0
        self.pinned_allocs = 0
        self.allocate_every = allocate_every
        self.threads_seen = set()
        self.into_inputs = []
        self.calls = []  # (entry point, program name, config) of every dispatch
        self.async_outputs: list = []  # the outputs= of every dispatch_async (None: its own)
        self.async_current: list = []  # the fake CuPy's current stream's ptr at each dispatch_async
        self.plans = []  # (program name, input bytes) of every plan_info call
        self.lock = threading.Lock()
        self.telemetry = _FakeTelemetry(self, with_allocations)
        from vyre_cuda._knobs import DEFAULT

        self._knobs = DEFAULT
        self.knobs_used: list = []

    def _use_knobs(self, knobs):
        # (benchmarks/harness/hooks.set_knobs: the shared-streams row sets one and puts it back)
        self.knobs_used.append(knobs)
        self._knobs = knobs

    def _count(self):
        with self.lock:
            self.dispatches += 1
            if self.allocate_every and self.dispatches % self.allocate_every == 0:
                self.pinned_allocs += 1
            self.threads_seen.add(threading.get_ident())

    def dispatch(self, program, inputs, config=None):
        self._count()
        self.calls.append(("dispatch", getattr(program, "name", None), config))
        outs = _fake_run(program, inputs)
        if getattr(config, "outputs", "host") == "device":
            return [np.array(o, copy=True).view(FakeDeviceArray) for o in outs]
        return outs

    def dispatch_into(self, program, inputs, outputs, config=None):
        budget = getattr(config, "device_memory_budget", None)
        if budget is not None and budget < self.min_budget:
            raise ValidationError(
                f"DispatchConfig(device_memory_budget={budget:,}) is too small: chunks would move too few bytes",
                f"pass device_memory_budget >= {self.min_budget:,}",
            )
        self._count()
        self.calls.append(("dispatch_into", getattr(program, "name", None), config))
        if budget is not None and self.budget_seconds is not None:
            time.sleep(self.budget_seconds(budget))
        self.into_inputs.append(type(inputs[0]))
        for out, res in zip(outputs, _fake_run(program, inputs)):
            out[...] = res
        return outputs

    def plan_info(self, program, inputs, config=None):
        nbytes = max(np.asarray(x).nbytes for x in inputs)
        self.plans.append((getattr(program, "name", None), nbytes))
        if getattr(program, "elementwise", False) and nbytes >= STREAM_FROM:
            route = types.SimpleNamespace(kind="streamed", reason="2 or more chunks of 8 MiB")
        else:
            route = types.SimpleNamespace(kind="regular", reason="fewer than 2 chunks of 8 MiB")
        stream = None
        if getattr(config, "streamed", None):  # chunks of at most a third of the budget (8 MiB)
            chunk = min(nbytes, (getattr(config, "device_memory_budget", None) or 24 << 20) // 3)
            stream = types.SimpleNamespace(chunk_count=-(-nbytes // chunk), chunk_rows=chunk // 4, streams=3)
        return types.SimpleNamespace(route=route, stream=stream)

    def _dispatch_profiled(self, program, inputs, config=None, start_ns=0):
        self._count()
        t0 = time.perf_counter_ns()
        outs = _fake_add(inputs)
        spent = time.perf_counter_ns() - t0
        return outs, tuple([spent // len(STAGES)] * len(STAGES))

    def dispatch_async(self, program, inputs, config=None, *, outputs=None):
        self._count()
        self.calls.append(("dispatch_async", getattr(program, "name", None), config))
        self.async_outputs.append(outputs)
        cp: Any = sys.modules.get("cupy")
        self.async_current.append(cp.cuda.get_current_stream().ptr if hasattr(cp, "cuda") else None)
        outs = _fake_run(program, inputs)
        if outputs is not None:
            for out, res in zip(outputs, outs):
                out[...] = res
            outs = list(outputs)
        elif getattr(config, "outputs", "host") == "device":
            outs = [np.array(o, copy=True).view(FakeDeviceArray) for o in outs]
        return _FakePending(outs, _fake_seconds(program, inputs) or self.async_delay)

    def close(self):
        self.closed = True


class Locked(np.ndarray):
    """A page-locked array stand-in: a numpy subclass the fake backend can recognise."""


def _fake_floor_module():
    mod: Any = types.ModuleType("vyre_cuda.profile._floor")  # Any: the fake's attributes are set here
    mod.FLOOR_ENTRY = "vecadd"
    mod.FLOOR_SOURCE = "// fake"
    mod.WAITS = ("spin", "event", "stream")
    mod.opened = []
    mod.calls = []

    class FloorKernel:
        def __init__(self, ctx, image, entry):
            assert ctx == FakeBackend.context_handle and image == b"fake\0" and entry == "vecadd"
            self.closed = False

        def close(self):
            self.closed = True

    class Floor:
        def __init__(self, kernel, n):
            self.n = n
            self.closed = False
            mod.opened.append(self)

        def _run(self, a, b, out, count, total, enqueue):
            np.add(a, b, out=out)
            return np.full(count, total, np.int64), np.full(count, enqueue, np.int64)

        def full_pinned(self, a, b, out, count):
            return self._run(a, b, out, count, 20_000, 10_000)

        def full_pageable(self, a, b, out, count):
            return self._run(a, b, out, count, 24_000, 14_000)

        def full_pinned_direct(self, a, b, out, count):
            assert all(isinstance(x, Locked) for x in (a, b, out))  # page-locked arrays only
            mod.calls.append("full_pinned_direct")
            return self._run(a, b, out, count, 16_000, 9_000)

        def launch_only(self, batches, batch_size, warmup_batches):
            assert batch_size == engine.LAUNCH_BATCH
            return np.full(batches, 3_500, np.int64)

        def tight(self, a, b, out, count, wait="spin", graph=False):
            mod.calls.append(("tight", wait, graph))
            np.add(a, b, out=out)
            return np.full(count, TIGHT_NS[graph, wait], np.int64)

        def dma_h2d(self, count):
            mod.calls.append("dma_h2d")
            return np.full(count, 1_000, np.int64)

        def dma_d2h(self, count):
            return np.full(count, 500, np.int64)

        def dma_both(self, count):
            mod.calls.append("dma_both")
            return np.full(count, 1_200, np.int64)

        def copy_in(self, a, b, threads, count):
            mod.calls.append(("copy_in", threads))
            assert a.shape == (self.n,) and b.shape == (self.n,)
            return np.full(count, 4_000 // threads, np.int64)

        def copy_out(self, out, threads, count):
            assert out.shape == (self.n,) and out.flags.writeable
            return np.full(count, 2_000 // threads, np.int64)

        def close(self):
            self.closed = True

    mod.FloorKernel = FloorKernel
    mod.Floor = Floor
    return mod


# the fake floor's tight round trips, (graph, wait) -> ns: the spin wait is the fastest issued, the
# event wait the fastest replay
TIGHT_NS = {
    (False, "spin"): 14_000,
    (False, "event"): 14_500,
    (False, "stream"): 15_000,
    (True, "spin"): 12_000,
    (True, "event"): 11_000,
    (True, "stream"): 12_500,
}
STANDALONE_NS = {
    "floor.standalone.spin": 14_400,
    "floor.standalone.event": 15_000,
    "floor.standalone.stream": 15_500,
    "floor.standalone_graph.spin": 11_500,
    "floor.standalone_graph.event": 11_100,
    "floor.standalone_graph.stream": 12_000,
}


class FakeStandalone:
    """The standalone floor process, faked: fixed samples per series. ``fail`` makes it refuse to
    start with that reason; ``no_capture`` drops its graph replay with that reason, as the real one
    reports a failed capture."""

    started: list = []
    fail: str | None = None
    no_capture: str | None = None

    def __init__(self, image, nbytes, device=0, libcuda=None, skipped=None):
        if FakeStandalone.fail:
            raise vyre_cuda.errors.UnsupportedFeature(FakeStandalone.fail, "install one")
        self.nbytes, self.skipped, self.closed = nbytes, skipped, False
        FakeStandalone.started.append(self)

    def run(self, count, warmup=0):
        if FakeStandalone.no_capture:
            self.skipped["standalone floor graph"] = FakeStandalone.no_capture
        keep = {k: v for k, v in STANDALONE_NS.items() if "_graph" not in k or not FakeStandalone.no_capture}
        return {k: [ns] * count for k, ns in keep.items()}

    def close(self):
        self.closed = True


def install(monkeypatch):
    """Install the fakes (the floor, the core's stage names, vecadd, CudaBackend, pinned_empty,
    compile_kernel) for one test; returns ``namespace(floor=module, created=[backends])``."""
    floor = _fake_floor_module()
    builtins: Any = types.ModuleType("vyre_cuda.builtin_programs")
    decls = (BufferDecl.read("a", 0, "f32"), BufferDecl.read("b", 1, "f32"), BufferDecl.output("out", 2, "f32"))
    builtins.vecadd_f32 = lambda: Program(Kernel.cuda("// fake vecadd"), decls, name="vecadd_f32")
    monkeypatch.setitem(sys.modules, "vyre_cuda.profile._floor", floor)
    monkeypatch.setattr(session, "stage_names", lambda: STAGES)
    monkeypatch.setattr(P, "_floor", floor, raising=False)
    monkeypatch.setattr(vyre_cuda, "builtin_programs", builtins, raising=False)
    created = []

    def backend_factory(device=0, **options):
        b = FakeBackend(device, **options)
        created.append(b)
        return b

    def pinned_empty(shape, dtype=np.float32, *, device=0):
        assert device == 0
        return np.empty(shape, dtype).view(Locked)

    monkeypatch.setattr(vyre_cuda, "CudaBackend", backend_factory, raising=False)
    monkeypatch.setattr(FakeStandalone, "started", [])
    monkeypatch.setattr(FakeStandalone, "fail", None)
    monkeypatch.setattr(FakeStandalone, "no_capture", None)
    monkeypatch.setattr(standalone, "StandaloneFloor", FakeStandalone)
    monkeypatch.setattr(vyre_cuda, "pinned_empty", pinned_empty, raising=False)
    # the patterns, scaled down (a 20 ms kernel, 1 MiB budgets), and no driver call to drain
    monkeypatch.setattr(patterns, "DEFAULTS", PATTERNS_SMALL)
    drains: list = []
    monkeypatch.setattr(patterns, "context_synchronize", drains.append)
    import vyre_cuda.compile as compile_module

    monkeypatch.setattr(
        compile_module, "compile_kernel", lambda kernel, arch=None: types.SimpleNamespace(image=b"fake\0", kind="cubin")
    )
    return types.SimpleNamespace(floor=floor, created=created, drains=drains)


if TYPE_CHECKING:  # mypy (scripts/lint): the fake implements every member of its contract
    _implements: type[ProfiledBackend] = FakeBackend


# -- the peers' libraries, faked: CuPy, PyTorch and cuda.core on host memory ------------------
class FakeCupyArray(np.ndarray):
    """A CuPy array stand-in: ``.get()`` copies it to a numpy array."""

    def get(self):
        return np.array(self, copy=True)


class FakeTensor(np.ndarray):
    """A torch tensor stand-in: ``.to``/``.cuda``/``.cpu`` copy, ``.numpy()`` views."""

    def to(self, device):
        return np.array(self, copy=True).view(FakeTensor)

    def cuda(self, device=None):
        return self.to(device)

    def cpu(self):
        return self.to("cpu")

    def numpy(self):
        return np.asarray(self)


class _FakeStream:
    def __init__(self, ptr=0x5000, current=None):
        self.ptr = ptr
        self.syncs = 0
        self.current = current  # CuPy's current-stream stack, which ``with stream:`` pushes on

    def synchronize(self):
        self.syncs += 1

    def __enter__(self):
        self.current.append(self)
        return self

    def __exit__(self, *exc):
        assert self.current.pop() is self


def fake_cupy() -> Any:
    """A ``cupy`` module stand-in: RawKernel runs vecadd with numpy."""
    cp: Any = types.ModuleType("cupy")
    cp.float32 = np.float32
    cp.asarray = lambda x: np.array(x, copy=True).view(FakeCupyArray)
    cp.zeros = lambda n, dtype: np.zeros(n, dtype).view(FakeCupyArray)
    cp.empty_like = lambda x: np.empty_like(x).view(FakeCupyArray)
    current = [_FakeStream(0)]
    cp.streams = []

    def new_stream(non_blocking=False):
        cp.streams.append(_FakeStream(0x5000, current))
        return cp.streams[-1]

    class Device:
        def __init__(self, ordinal=0):
            self.ordinal = ordinal

        def use(self):
            pass

        def synchronize(self):
            pass

    class RawKernel:
        def __init__(self, source, entry):
            self.source, self.entry = source, entry

        def __call__(self, grid, block, args):
            a, b, out, n = args
            np.add(a[:n], b[:n], out=out[:n])

    cp.RawKernel = RawKernel
    cp.cuda = types.SimpleNamespace(Device=Device, Stream=new_stream, get_current_stream=lambda: current[-1])
    return cp


def fake_torch() -> Any:
    """A ``torch`` module stand-in: tensors are FakeTensor (numpy) arrays."""
    torch: Any = types.ModuleType("torch")
    torch.device = lambda kind, index=0: (kind, index)
    torch.from_numpy = lambda a: a.view(FakeTensor)
    torch.empty_like = lambda t: np.empty_like(t).view(FakeTensor)
    torch.zeros_like = lambda t: np.zeros_like(t).view(FakeTensor)
    torch.add = lambda a, b, out=None: np.add(a, b, out=out).view(FakeTensor)
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda device=None: None)
    return torch


def fake_cuda_core(stream_first=True) -> tuple[Any, Any]:
    """``(cuda.core, cuda.bindings.driver)`` stand-ins: device buffers are host memory, ``launch``
    runs the floor's vecadd (three pointers and the count) with numpy. ``stream_first=False``:
    the older ``launch(kernel, config, *args)`` with the stream in the LaunchConfig."""
    import ctypes

    def at(address, n):
        return np.frombuffer((ctypes.c_char * (4 * n)).from_address(address), np.float32)

    core: Any = types.ModuleType("cuda.core")
    core.launches = []

    class Buffer:
        def __init__(self, nbytes):
            self.memory = np.zeros(nbytes, np.uint8)
            self.handle = self.memory.ctypes.data
            self.closed = False

        def close(self, stream=None):
            self.closed = True

    class Stream:
        def __init__(self):
            self.syncs = 0
            self.closed = False

        def sync(self):
            self.syncs += 1

        def close(self):
            self.closed = True

    class Device:
        compute_capability = (9, 0)

        def __init__(self, ordinal=0):
            self.buffers = []

        def set_current(self):
            pass

        def create_stream(self):
            return Stream()

        def allocate(self, nbytes, stream=None):
            self.buffers.append(Buffer(nbytes))
            return self.buffers[-1]

    class Program:
        def __init__(self, source, code_type, options=None):
            assert code_type == "c++" and options.arch == "sm_90"
            self.source = source

        def compile(self, target):
            assert target == "cubin"
            return types.SimpleNamespace(get_kernel=lambda entry: ("kernel", entry))

    def run(kernel, args):
        a, b, out, n = args
        assert isinstance(n, np.uint32)
        n = int(n)
        core.launches.append(kernel)
        np.add(at(a, n), at(b, n), out=at(out, n))

    def launch(stream, config, kernel, *args):  # cuda.core 0.2 and later
        assert isinstance(stream, Stream)
        run(kernel, args)

    def launch_in_config(kernel, config, *args):  # older: the stream in the LaunchConfig
        assert isinstance(config.stream, Stream)
        run(kernel, args)

    core.Device = Device
    core.Program = Program
    core.ProgramOptions = lambda arch: types.SimpleNamespace(arch=arch)
    if stream_first:
        core.LaunchConfig = lambda grid, block: types.SimpleNamespace(grid=grid, block=block)
        core.launch = launch
    else:
        core.LaunchConfig = lambda grid, block, stream: types.SimpleNamespace(grid=grid, block=block, stream=stream)
        core.launch = launch_in_config

    def copy(dst, src, nbytes):
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def memset(ptr, value, nbytes):
        ctypes.memset(ptr, value, nbytes)
        return (0,)

    cu = types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0), cuMemcpyHtoD=copy, cuMemcpyDtoH=copy, cuMemsetD8=memset
    )
    return core, cu


def install_peer_libraries(monkeypatch, stream_first=True):
    """Install the fake CuPy, torch and cuda.core (and the cuda.bindings driver the cuda.core peer
    copies with) for one test; returns the fake cuda.core module."""
    import cuda.bindings

    core, cu = fake_cuda_core(stream_first)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    monkeypatch.setitem(sys.modules, "cuda.core", core)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", cu)
    monkeypatch.setattr(cuda.bindings, "driver", cu, raising=False)
    return core
