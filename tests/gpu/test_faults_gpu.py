"""Kernel faults and runaway kernels: typed errors naming the fault, a lost backend that says how
to recover, a documented recovery, and no hang.

A fault (illegal address, trap) poisons the process's primary context, which every other test
shares, so each fault runs in its own interpreter (bounded by a timeout) that reports JSON.
A kernel that merely runs too long for the caller's ``timeout`` is harmless and runs in-process.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program
from vyre_cuda import builtin_programs as bp

PACKAGE_ROOT = pathlib.Path(vc.__file__).resolve().parents[1]
LIVE_KEYS = ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")

# The child: warm dispatch, the fault, later calls on the lost backend, then the recovery
# (close, reset_device, a new backend). It prints one JSON line; nothing in it may hang.
FAULT_SCRIPT = r'''
import json, sys
import numpy as np
import vyre_cuda as vc
from vyre_cuda import BufferDecl, Kernel, Program
from vyre_cuda import builtin_programs as bp

fault, mode = sys.argv[1], sys.argv[2]
HEAD = '#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main(const float* a, float* out, const vyre_u32* p) {\n'
SOURCES = {
    # a wild pointer: nothing is mapped at address 0x10
    "illegal_address": HEAD + """
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(p)) {
    volatile float* wild = reinterpret_cast<volatile float*>(0x10ull + 4ull * i);
    *wild = a[i];
    out[i] = a[i];
  }
}
""",
    "trap": HEAD + """
  const vyre_u64 i = vyre_global_id();
  if (i == 0) __trap();
  if (i < vyre_count(p)) out[i] = a[i];
}
""",
}
KEYS = ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live",
        "failed_dispatches", "leaked_allocations")


def describe(exc):
    return {
        "type": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "status": getattr(exc, "status", None),
        "call": getattr(exc, "call", None),
        "message": str(exc),
        "last_line": str(exc).splitlines()[-1],
    }


def attempt(fn):
    try:
        fn()
    except Exception as exc:
        return describe(exc)
    return None


rng = np.random.default_rng(7)
x = rng.standard_normal(4096).astype(np.float32)
y = rng.standard_normal(4096).astype(np.float32)
vecadd = bp.vecadd_f32()
result = {"fault": fault, "mode": mode}

backend = vc.CudaBackend(0)
(out,) = backend.dispatch(vecadd, [x, y])
result["warm_ok"] = bool(np.array_equal(out, x + y))
prog = Program(Kernel.cuda(SOURCES[fault]), [BufferDecl.read("a", 0, "f32"), BufferDecl.output("out", 1, "f32")])
if mode == "dispatch":
    result["error"] = attempt(lambda: backend.dispatch(prog, [x]))
else:
    result["error"] = attempt(lambda: backend.dispatch_async(prog, [x]).result())
result["lost"] = backend.lost
snap = backend.telemetry.snapshot()
result["after_fault"] = {k: snap[k] for k in KEYS}
result["later"] = {
    "dispatch": attempt(lambda: backend.dispatch(vecadd, [x, y])),
    "dispatch_async": attempt(lambda: backend.dispatch_async(vecadd, [x, y]).result()),
    "dispatch_into": attempt(lambda: backend.dispatch_into(vecadd, [x, y], [np.empty_like(x)])),
    "dispatch_timed": attempt(lambda: backend.dispatch_timed(vecadd, [x, y])),
}
result["close"] = attempt(backend.close)
result["after_close"] = attempt(lambda: backend.dispatch(vecadd, [x, y]))

# the documented recovery
result["reset"] = attempt(lambda: vc.reset_device(0))


def recover():
    with vc.CudaBackend(0) as fresh:
        (out,) = fresh.dispatch(vecadd, [x, y])
        ok = bool(np.array_equal(out, x + y))
        block_sum = bp.block_sum_u32(8, workgroup=128)
        v = rng.integers(0, 1000, 8 * 128, dtype=np.uint32)
        (sums,) = fresh.dispatch(block_sum, [v])
        ok = ok and bool(np.array_equal(sums, v.reshape(8, 128).sum(axis=1, dtype=np.uint32)))
        result["recovered"] = ok
        result["recovered_lost"] = fresh.lost


if result["reset"] is None:
    result["recovery_error"] = attempt(recover)
print("VYRE_RESULT " + json.dumps(result), flush=True)
'''

RESTART_SCRIPT = r"""
import numpy as np
import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
a = np.random.default_rng().standard_normal(5000).astype(np.float32)
with vc.CudaBackend(0) as backend:
    (out,) = backend.dispatch(bp.vecadd_f32(), [a, a])
assert np.array_equal(out, a + a)
print("restart ok")
"""

# CUresults a trap may surface as, depending on driver and architecture (all sticky)
TRAP_STATUSES = {"CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_ASSERT"}


def run_child(*args, timeout=120) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", FAULT_SCRIPT, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=PACKAGE_ROOT.parent,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the fault scenario {args} hung for {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("VYRE_RESULT ")]
    assert proc.returncode == 0 and lines, f"child failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(lines[-1][len("VYRE_RESULT ") :])


def assert_fix_says_reset(err: dict) -> None:
    assert err["last_line"].startswith("Fix: "), err["message"]
    assert "reset_device" in err["last_line"], err["message"]


@pytest.mark.faults
@pytest.mark.parametrize("mode", ["dispatch", "async"])
@pytest.mark.parametrize("fault", ["illegal_address", "trap"])
def test_kernel_fault_is_typed_sticky_and_recoverable(fault, mode, run_python):
    res = run_child(fault, mode)
    print(json.dumps(res, indent=1))
    assert res["warm_ok"]
    err = res["error"]
    assert err is not None, "the faulting kernel's dispatch returned normally"
    assert err["type"] == "DeviceLost" and "DispatchFailed" in err["mro"], err
    if fault == "illegal_address":
        assert err["status"] == "CUDA_ERROR_ILLEGAL_ADDRESS", err
    else:
        assert err["status"] in TRAP_STATUSES, err
    assert err["status"] in err["message"] and err["call"], err
    assert_fix_says_reset(err)
    # the backend knows it is lost; in-flight resources were written off, not recycled
    assert res["lost"] is True
    after = res["after_fault"]
    assert after["failed_dispatches"] >= 1
    assert all(after[k] == 0 for k in LIVE_KEYS), after
    # every later call says the backend is lost, names the original fault and how to recover
    for name, later in res["later"].items():
        assert later is not None, f"{name} ran on a lost backend"
        assert later["type"] == "DeviceLost", (name, later)
        assert_fix_says_reset(later)
        assert err["status"] in later["message"], (name, later)
    assert res["close"] is None, res["close"]
    assert res["after_close"] is not None and res["after_close"]["type"] == "ValidationError"
    # recovery: close, vyre_cuda.reset_device(0), a new backend; where the driver keeps the
    # fault for the life of the process, reset_device says so (DeviceLost, "restart the
    # process"), and the documented recovery is a new process, which must then run correctly
    refused = res["reset"] or res.get("recovery_error")
    if refused is None:
        assert res["recovered"] is True and res["recovered_lost"] is False
    else:
        assert refused["type"] == "DeviceLost", refused
        assert refused["last_line"].startswith("Fix: ") and "restart the process" in refused["last_line"], refused
        proc = run_python(["-c", RESTART_SCRIPT], timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip().endswith("restart ok"), proc.stderr[-2000:]
    # a later error carries the original fault's CUresult and driver call
    for name, later in res["later"].items():
        assert later["status"] == err["status"] and later["call"] == err["call"], (name, later)


# ------------------------------------------------------------------ runaway kernel + timeout
SPIN_SECONDS = 2.0
_SPIN = r"""
#include "vyre_cuda.cuh"
__device__ __forceinline__ vyre_u64 test_now_ns() {
  vyre_u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
VYRE_KERNEL vyre_main(const float* a, float* out, const vyre_u32* p) {
  const vyre_u64 i = vyre_global_id();
  if (threadIdx.x == 0) {
    const vyre_u64 end = test_now_ns() + SPIN_NS;
    while (test_now_ns() < end) __nanosleep(1000);
  }
  __syncthreads();
  if (i < vyre_count(p)) out[i] = 2.0f * a[i];
}
"""
SPIN = Program(
    Kernel.cuda(f"#define SPIN_NS {int(SPIN_SECONDS * 1e9)}ull\n" + _SPIN),
    [BufferDecl.read("a", 0, "f32"), BufferDecl.output("out", 1, "f32")],
)


def _live(backend) -> dict:
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in LIVE_KEYS}


def _timeout_error(fn):
    """Run ``fn``; return the timeout DispatchFailed it raised, tracebacks dropped."""
    try:
        fn()
    except vc.DispatchFailed as exc:
        exc.__traceback__ = None
        return exc
    pytest.fail("the runaway dispatch returned before its timeout")


@pytest.mark.faults
@pytest.mark.parametrize("mode", ["dispatch", "dispatch_async", "dropped"])
def test_runaway_kernel_is_reported_not_waited_on(fresh_backend, rng, mode):
    backend = fresh_backend
    a = rng.standard_normal(2048).astype(np.float32)
    cfg = DispatchConfig(timeout=0.05)
    backend.plan_info(SPIN, [a], cfg)  # compile and load first: the timing below is the wait only
    before = _live(backend)
    t0 = time.monotonic()
    if mode == "dispatch_async":
        pending = backend.dispatch_async(SPIN, [a], cfg)
        err = _timeout_error(pending.result)
        assert err.pending is pending
    else:
        err = _timeout_error(lambda: backend.dispatch(SPIN, [a], cfg))
    waited = time.monotonic() - t0
    assert waited < SPIN_SECONDS / 2, f"the caller waited {waited:.2f} s for a 0.05 s timeout"
    assert type(err) is vc.DispatchFailed and err.status == "timeout", err
    assert str(err).splitlines()[-1].startswith("Fix: ")
    assert isinstance(err.pending, vc.PendingDispatch)
    pending = err.pending
    assert not pending.is_ready()
    assert not backend.lost
    if mode == "dropped":
        # dropping the handle never waits: what it owned is deferred, and comes back to the
        # pools (trim() takes it) only once the kernel has ended
        t_drop = time.monotonic()
        del err, pending
        gc.collect()
        assert time.monotonic() - t_drop < SPIN_SECONDS / 2, "dropping the handle waited for the kernel"
        deadline = time.monotonic() + 60
        while backend._core.deferred:
            assert time.monotonic() < deadline, "the dropped runaway kernel's resources never came back"
            backend.trim()
            time.sleep(0.005)
        assert time.monotonic() - t0 >= SPIN_SECONDS * 0.9
    else:
        # each wait is bounded by the timeout; the handle stays valid until the kernel is done
        deadline = time.monotonic() + 60
        while True:
            try:
                (out,) = pending.result()
                break
            except vc.DispatchFailed as again:
                assert again.status == "timeout" and again.pending is pending
                assert time.monotonic() < deadline, "the runaway kernel never finished"
        assert time.monotonic() - t0 >= SPIN_SECONDS * 0.9
        np.testing.assert_array_equal(out, 2.0 * a)
        assert pending.is_ready()
        del err, pending
    assert _live(backend) == before
    # the backend is healthy: the next dispatch (no timeout) is correct
    b = rng.standard_normal(4096).astype(np.float32)
    (out,) = backend.dispatch(bp.vecadd_f32(), [b, b])
    np.testing.assert_array_equal(out, b + b)
