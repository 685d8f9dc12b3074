"""The capture gate (``_driver``) on the fake driver: no context synchronize of vyre_cuda's runs
while one of its stream captures is open on another thread.

On an H100 the driver crashed (SIGSEGV inside ``cuCtxSynchronize``) when a synchronize ran on one
thread while another captured a stream in thread-local mode, the mode of every vyre_cuda capture
(``benchmarks/probe_ctx_sync_race.py`` shows it without vyre_cuda). The driver refuses such a
synchronize only beside a capture in global mode, so the library must keep them apart itself. The
fake counts every ``cuCtxSynchronize`` made while a capture in thread-local or relaxed mode is
open (``unsafe_syncs``). Here one thread dispatches with forced graph replay over ever new pointer
sets (a capture per dispatch, held open for a millisecond by the fake's launch delay) while others
call the three synchronizes the library makes: ``trim()`` (the DeviceArray pool's flush), the host
registry's device synchronize, and ``close()``'s context synchronize."""

from helpers import scenarios

CHILD = r"""
import json, sys, threading, time
import numpy as np
import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import _driver
from vyre_cuda import builtin_programs as bp

sys.setswitchinterval(1e-6)
fake = FakeDriver()
rng = np.random.default_rng(int(sys.argv[1]))
prog = bp.vecadd_f32()
N = 256
dev = vc.DispatchConfig(outputs="device")
graph = vc.DispatchConfig(outputs="device", graph=True)
g = vc.CudaBackend(0)
fake.emulate(g, prog, [np.zeros(N, np.float32)] * 2, vecadd_emulation(np.float32), dev)
fake.emulate(g, prog, [np.zeros(N, np.float32)] * 2, vecadd_emulation(np.float32), graph)
hosts = [rng.standard_normal(N).astype(np.float32) for _ in range(24)]
arrays = [g.dispatch(prog, [h, np.zeros(N, np.float32)], dev)[0] for h in hosts]
fake.set_launch_delays(launch_us=1000)  # each capture stays open for a millisecond or more
before = fake.stats()
done = threading.Event()
res = {"wrong": 0, "dispatches": 0, "syncs": {"trim": 0, "device": 0, "context": 0}, "errors": []}


def dispatcher():
    try:
        for i in range(150):
            j, k = rng.integers(len(arrays), size=2)
            (z,) = g.dispatch(prog, [arrays[j], arrays[k]], graph)
            if not np.array_equal(z.copy_to_host(), hosts[j] + hosts[k]):
                res["wrong"] += 1
            del z  # (dropped: the DeviceArray pool's quarantine fills, so trim() synchronizes)
            res["dispatches"] += 1
    except BaseException as exc:
        res["errors"].append(f"dispatcher: {type(exc).__name__}: {exc}")
    finally:
        done.set()


def syncer(kind):
    other = vc.CudaBackend(0) if kind == "context" else None
    try:
        while not done.is_set():
            if kind == "trim":
                g.trim()
            elif kind == "device":
                _driver.device_synchronize(0, 5.0)
            else:
                other.dispatch_async(prog, [hosts[0], hosts[1]])  # a handle held: close() synchronizes
                other.close()
                other = vc.CudaBackend(0)
            res["syncs"][kind] += 1
            time.sleep(0.002)  # (back to back, synchronizes would turn every capture away)
    except BaseException as exc:
        res["errors"].append(f"{kind}: {type(exc).__name__}: {exc}")
    finally:
        if other is not None:
            other.close()


threads = [threading.Thread(target=dispatcher)] + [threading.Thread(target=syncer, args=(k,)) for k in res["syncs"]]
for t in threads:
    t.start()
for t in threads:
    t.join()
after = fake.stats()
fake.set_launch_delays(0)
res["unsafe_syncs"] = after["unsafe_syncs"] - before["unsafe_syncs"]
res["captures"] = after["captured_nodes"] - before["captured_nodes"]
res["replays"] = after["graph_launches"] - before["graph_launches"]
del arrays
g.close()
print(json.dumps(res))
"""


def test_no_context_synchronize_beside_a_capture(fake_libcuda, tmp_path_factory):
    seed = scenarios.seed()
    res = scenarios.run_child(["-c", CHILD, seed], fake_libcuda, tmp_path_factory)
    assert res["unsafe_syncs"] == 0, (seed, res)
    assert res["errors"] == [] and res["wrong"] == 0 and res["dispatches"] == 150, (seed, res)
    # the three synchronizes ran throughout, beside captures that each stayed open a millisecond
    # (a synchronize that broke a capture would have turned the plan's graphs off: none after it;
    # a dispatch that met a synchronize waiting or running issued instead: not every one replays)
    shown = (seed, res["syncs"], res["captures"], res["replays"])
    assert min(res["syncs"].values()) >= 3 and res["captures"] >= 30 and res["replays"] >= 30, shown


WAITS = r"""
import json, threading, time
import numpy as np
import vyre_cuda as vc
from vyre_cuda import _driver
from vyre_cuda.errors import BackendError

g = vc.CudaBackend(0)
g.dispatch(vc.builtin_programs.vecadd_f32(), [np.ones(8, np.float32)] * 2)  # (its context made current here)
res = {}
# a synchronize waits while a capture is open, and runs once it has closed
_driver._count_capture_for_tests(1)
done = {}


def sync():
    _driver.make_current(g._core.context_handle)  # (a new thread has no context current)
    _driver.context_synchronize(5.0)
    done["t"] = time.perf_counter()


t = threading.Thread(target=sync)
t.start()
time.sleep(0.2)
res["waited_while_open"] = "t" not in done
closed_at = time.perf_counter()
_driver._count_capture_for_tests(-1)
t.join(5)
res["ran_after_close"] = done.get("t", 0) >= closed_at
# past its limit it raises the capture refusal, naming the call
_driver._count_capture_for_tests(1)
try:
    _driver.context_synchronize(0.05)
    res["refused"] = None
except BackendError as exc:
    res["refused"] = exc.message
_driver._count_capture_for_tests(-1)
_driver.context_synchronize(0.0)  # (nothing open: runs at once)
g.close()
print(json.dumps(res))
"""


def test_a_synchronize_waits_for_an_open_capture(fake_libcuda, tmp_path_factory):
    res = scenarios.run_child(["-c", WAITS], fake_libcuda, tmp_path_factory)
    assert res["waited_while_open"] is True and res["ran_after_close"] is True, res
    assert res["refused"] is not None and "cuCtxSynchronize" in res["refused"], res
    assert "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in res["refused"], res
