"""Tracing: the trace option's parsing, and the NVTX ranges of traced dispatches on the fake driver.

NVTX has no query API without an attached tool, so the core counts every NVTX call it makes
(``vyre_cuda.tracing.nvtx_counts``); the counts are the same whether or not the NVTX header was
compiled in. Every dispatch kind must open exactly its ranges and close each one, also when the
dispatch fails, times out or is dropped. The GPU suite repeats the counts on a device
(tests/gpu/test_tracing_gpu.py).
"""

from __future__ import annotations

import json

import fakecuda
import pytest

from vyre_cuda import tracing
from vyre_cuda.errors import ValidationError

STAGES = dict.fromkeys(tracing.BLOCKING_STAGES + tracing.ASYNC_STAGES, 0)


@pytest.mark.parametrize(
    ("value", "flags"),
    [
        (True, 3),
        (False, 0),
        ("nvtx", 2),
        ("log", 1),
        ("all", 3),
        ("log,nvtx", 3),
        ("NVTX", 2),
        ("0", 0),
        ("on", 3),
    ],
)
def test_trace_values(value, flags):
    assert tracing.trace_flags(value) == flags


@pytest.mark.parametrize("value", ["nvtxx", 1, 2.0, ["nvtx"], "log,gpu"])
def test_bad_trace_values_are_refused_with_a_fix(value):
    with pytest.raises(ValidationError) as info:
        tracing.trace_flags(value)
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize(("env", "flags"), [("", 0), ("0", 0), ("1", 3), ("nvtx", 2), ("log", 1), ("yes please", 3)])
def test_trace_environment_variable(monkeypatch, env, flags):
    monkeypatch.setenv("VYRE_CUDA_TRACE", env)
    assert tracing.trace_flags(None) == flags


CHILD = r"""
import json, sys
import numpy as np
import vyre_cuda as vc
from vyre_cuda import tracing, builtin_programs as bp
from fakecuda import FakeDriver, vecadd_emulation

fake = FakeDriver()
prog = bp.vecadd_f32()
rng = np.random.default_rng(int(sys.argv[1]))
res = {"errors": []}

def inputs(n):
    return [rng.standard_normal(n).astype(np.float32) for _ in range(2)]

def check(got, a, b, what):
    if not np.array_equal(got, a + b):
        res["errors"].append(f"{what}: wrong result")

def counted(name, fn):
    tracing.nvtx_reset()
    try:
        fn()
    except vc.BackendError as exc:
        res[name + "_error"] = type(exc).__name__
    res[name] = tracing.nvtx_counts()

g = vc.CudaBackend(0, trace="nvtx", staging_chunk_bytes=1 << 20, staging_chunks=2)
small = inputs(1000)
large = inputs(300_000)  # a ring-staged dispatch
for a, b in (small, large):
    fake.emulate(g, prog, [a, b], vecadd_emulation(np.float32))
a, b = small
counted("blocking", lambda: check(g.dispatch(prog, [a, b])[0], a, b, "dispatch"))
counted("labelled", lambda: check(g.dispatch(prog, [a, b], {"label": "mine"})[0], a, b, "labelled"))
counted("ring", lambda: check(g.dispatch(prog, large)[0], *large, "ring"))
out = np.empty_like(a)
counted("into", lambda: check(g.dispatch_into(prog, [a, b], [out])[0], a, b, "into"))

def pending_then_result():
    p = g.dispatch_async(prog, [a, b])
    res["async_in_flight"] = tracing.nvtx_counts()
    check(p.result()[0], a, b, "async")
counted("async", pending_then_result)
counted("result_into", lambda: check(g.dispatch_async(prog, [a, b]).result_into([out])[0], a, b, "result_into"))
counted("timed", lambda: check(g.dispatch_timed(prog, [a, b]).outputs[0], a, b, "timed"))

def dropped():
    p = g.dispatch_async(prog, [a, b])
    del p
counted("dropped", dropped)

fake.fail("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE")
counted("blocking_failure", lambda: g.dispatch(prog, [a, b]))
fake.fail("cuLaunchKernel", "CUDA_ERROR_INVALID_VALUE")
counted("async_failure", lambda: g.dispatch_async(prog, [a, b]))

# a timeout: the work never completes until the failures are cleared
fake.fail("cuStreamQuery", "CUDA_ERROR_NOT_READY", sticky=True)
fake.fail("cuEventQuery", "CUDA_ERROR_NOT_READY", sticky=True)
held = []
def timed_out():
    try:
        g.dispatch(prog, [a, b], {"timeout": 0.05})
    except vc.DispatchFailed as exc:
        held.append(exc.pending)
        raise
counted("blocking_timeout", timed_out)
fake.clear_failures()
tracing.nvtx_reset()
check(held.pop().result()[0], a, b, "after timeout")  # an untraced handle: no ranges
res["timeout_handle_result"] = tracing.nvtx_counts()

fake.fail("cuEventQuery", "CUDA_ERROR_NOT_READY", sticky=True)
def async_timeout():
    p = g.dispatch_async(prog, [a, b], {"timeout": 0.05})
    try:
        p.result()
    except vc.DispatchFailed:
        res["async_timeout_open"] = tracing.nvtx_counts()
        fake.clear_failures()
        check(p.result()[0], a, b, "async after timeout")
counted("async_timeout", async_timeout)
fake.clear_failures()
# a bad input: refused before anything runs
counted("refused", lambda: g.dispatch(prog, [a]))
g.close()

h = vc.CudaBackend(0, trace=False)
fake.emulate(h, prog, [a, b], vecadd_emulation(np.float32))
def untraced():
    h.dispatch(prog, [a, b])
    h.dispatch_timed(prog, [a, b])
    h.dispatch_async(prog, [a, b]).result()
counted("untraced", untraced)
h.close()
res["hook_errors"] = fake.hook_errors
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def traced(fake_libcuda, tmp_path_factory):
    proc = fakecuda.run_python(
        ["-c", CHILD, "7"],
        fake_libcuda,
        timeout=300,
        VYRE_CUDA_CACHE_DIR=tmp_path_factory.getbasetemp() / "kernel-cache",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res.pop("errors") == [] and res.pop("hook_errors") == []
    return res


def blocking(**extra):
    return {
        **STAGES,
        **dict.fromkeys(tracing.BLOCKING_STAGES, 1),
        "dispatch": 1,
        "pops": 9,
        "starts": 0,
        "ends": 0,
        **extra,
    }


def asynchronous(**extra):
    return {**STAGES, "enqueue": 1, "result": 1, "dispatch": 0, "pops": 2, "starts": 1, "ends": 1, **extra}


@pytest.mark.parametrize("name", ["blocking", "labelled", "ring", "into"])
def test_a_blocking_dispatch_has_one_range_and_one_per_stage(traced, name):
    assert traced[name] == blocking()


def test_an_async_dispatch_is_open_until_its_result_is_taken(traced):
    assert traced["async_in_flight"] == asynchronous(result=0, pops=1, ends=0)
    assert traced["async"] == asynchronous()
    assert traced["result_into"] == asynchronous()


def test_a_timed_dispatch_has_enqueue_and_result_ranges(traced):
    assert traced["timed"] == asynchronous()


def test_a_dropped_handle_ends_its_range(traced):
    assert traced["dropped"] == asynchronous(result=0, pops=1)


def test_failures_close_every_range(traced):
    failed = traced["blocking_failure"]
    assert traced["blocking_failure_error"] == "DispatchFailed"
    assert failed["dispatch"] == 1 and failed["plan_lookup"] == failed["upload"] == failed["launch"] == 1
    assert failed["wait"] == 0  # the launch failed: no later stage opened
    assert failed["pops"] == sum(v for k, v in failed.items() if k not in ("pops", "starts", "ends"))
    assert traced["async_failure_error"] == "DispatchFailed"
    assert traced["async_failure"] == asynchronous(result=0, pops=1)


def test_timeouts_close_every_range(traced):
    assert traced["blocking_timeout_error"] == "DispatchFailed"
    counts = traced["blocking_timeout"]
    assert counts["wait"] == 1 and counts["dispatch"] == 1
    assert counts["pops"] == sum(v for k, v in counts.items() if k not in ("pops", "starts", "ends"))
    assert traced["timeout_handle_result"] == STAGES | {"dispatch": 0, "pops": 0, "starts": 0, "ends": 0}
    # the async dispatch stays open while in flight, through a timed-out result(), until taken
    assert traced["async_timeout_open"] == asynchronous(result=1, pops=2, ends=0)
    assert traced["async_timeout"] == asynchronous(result=2, pops=3)


def test_a_refused_dispatch_closes_its_ranges(traced):
    assert traced["refused_error"] == "ValidationError"
    assert traced["refused"] == blocking(**dict.fromkeys(tracing.BLOCKING_STAGES[1:], 0), pops=2)


def test_untraced_dispatches_make_no_nvtx_call(traced):
    assert traced["untraced"] == STAGES | {"dispatch": 0, "pops": 0, "starts": 0, "ends": 0}


TOOL_CHILD = r"""
import numpy as np
import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
from fakecuda import FakeDriver, vecadd_emulation

fake = FakeDriver()
prog = bp.vecadd_f32()
a = np.arange(1000, dtype=np.float32)
g = vc.CudaBackend(0, trace="nvtx")
fake.emulate(g, prog, [a, a], vecadd_emulation(np.float32))
(out,) = g.dispatch(prog, [a, a], {"label": "blocking-one"})
assert np.array_equal(out, a + a)
(out,) = g.dispatch_async(prog, [a, a]).result()
assert np.array_equal(out, a + a)
g.close()
"""


def _nvtx_headers():
    import os
    import pathlib

    for folder in (os.environ.get("VYRE_CUDA_NVTX_INCLUDE"), "/usr/local/cuda/include"):
        if folder and pathlib.Path(folder, "nvtx3", "nvToolsExt.h").is_file():
            return folder
    return None


def test_an_attached_nvtx_tool_sees_the_named_nested_ranges(fake_libcuda, tmp_path):
    """The ranges reach a real NVTX tool (loaded as Nsight Systems loads its own) with their names."""
    import subprocess

    headers = _nvtx_headers()
    if not tracing.nvtx_available() or headers is None or fakecuda.compiler() is None:
        pytest.skip("this build has no NVTX header (or no compiler for the test tool): ranges are only counted")
    tool = tmp_path / "libfake_nvtx_tool.so"
    source = fakecuda.SOURCE.with_name("fake_nvtx_tool.c")
    cmd = [fakecuda.compiler(), "-O1", "-shared", "-fPIC", f"-I{headers}", str(source), "-o", str(tool), "-lpthread"]
    subprocess.run(cmd, check=True, capture_output=True)
    log = tmp_path / "nvtx.log"
    proc = fakecuda.run_python(
        ["-c", TOOL_CHILD],
        fake_libcuda,
        timeout=120,
        NVTX_INJECTION64_PATH=str(tool),
        VYRE_FAKE_NVTX_LOG=str(log),
        VYRE_CUDA_CACHE_DIR=tmp_path / "kernel-cache",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line.rstrip() for line in log.read_text().splitlines()]
    assert lines[0] == "domain vyre_cuda"
    blocking = ["push blocking-one"]
    for stage in tracing.BLOCKING_STAGES:
        blocking += [f"push {stage}", "pop"]
    blocking.append("pop")
    assert lines[1 : 1 + len(blocking)] == blocking
    rest = lines[1 + len(blocking) :]
    # the dispatch's start/end range ends when it settles, inside result() (start/end ranges are
    # not stacked: Nsight draws them on their own row)
    assert rest == ["start 1 vecadd_f32", "push enqueue", "pop", "push result", "end 1", "pop"]
