"""NVTX tracing on a GPU: a traced backend opens exactly the expected ranges (counted by the core)
for blocking, ring-staged, async and timed dispatches, with correct outputs; when Nsight Systems
(`nsys`) is installed, a profiled child process shows the named ranges in its report."""

import contextlib
import os
import pathlib
import shutil
import sqlite3
import subprocess
import sys

import numpy as np

import vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
from vyre_cuda import tracing

ZERO = dict.fromkeys((*tracing.BLOCKING_STAGES, *tracing.ASYNC_STAGES, "dispatch", "pops", "starts", "ends"), 0)


def _blocking(n=1):
    return ZERO | dict.fromkeys(tracing.BLOCKING_STAGES, n) | {"dispatch": n, "pops": 9 * n}


def _async(n=1):
    return ZERO | {"enqueue": n, "result": n, "pops": 2 * n, "starts": n, "ends": n}


def test_traced_dispatches_open_and_close_their_ranges(rng):
    prog = bp.vecadd_f32()
    with vc.CudaBackend(0, trace="nvtx") as backend:
        for n in (1000, 3 * (1 << 20) + 5):  # the pinned mirror, then the staging ring
            a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
            backend.dispatch(prog, [a, b])  # plans outside the counted calls
            tracing.nvtx_reset()
            (out,) = backend.dispatch(prog, [a, b], {"label": "traced"})
            np.testing.assert_array_equal(out, a + b)
            assert tracing.nvtx_counts() == _blocking()
            tracing.nvtx_reset()
            (out,) = backend.dispatch_async(prog, [a, b]).result()
            np.testing.assert_array_equal(out, a + b)
            timed = backend.dispatch_timed(prog, [a, b])
            np.testing.assert_array_equal(timed.outputs[0], a + b)
            assert timed.device_ns > 0
            assert tracing.nvtx_counts() == _async(2)


def test_an_untraced_backend_makes_no_nvtx_call(rng):
    prog = bp.vecadd_f32()
    a, b = rng.standard_normal(4096).astype(np.float32), rng.standard_normal(4096).astype(np.float32)
    with vc.CudaBackend(0, trace=False) as backend:  # explicit: VYRE_CUDA_TRACE may be set
        tracing.nvtx_reset()
        (out,) = backend.dispatch(prog, [a, b])
        backend.dispatch_timed(prog, [a, b])
        np.testing.assert_array_equal(out, a + b)
        assert tracing.nvtx_counts() == ZERO


NSYS_CHILD = """
import numpy as np, vyre_cuda as vc
from vyre_cuda import builtin_programs as bp
a = np.arange(100_000, dtype=np.float32)
with vc.CudaBackend(0, trace="nvtx") as g:
    for _ in range(3):
        (out,) = g.dispatch(bp.vecadd_f32(), [a, a], {"label": "nsys-probe"})
        assert np.array_equal(out, a + a)
    g.dispatch_timed(bp.vecadd_f32(), [a, a])
"""


def test_nsight_systems_sees_the_ranges_when_installed(tmp_path, run_python):
    """Conditional, not skipped: without nsys on PATH this checks only that tracing works in a
    child process; with it, the exported report must hold the label and the stage names."""
    nsys = shutil.which("nsys")
    if nsys is None:
        proc = run_python(["-c", NSYS_CHILD], timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return
    assert tracing.nvtx_available(), "nsys is installed but this build has no NVTX header"
    report = tmp_path / "trace"
    profile = [nsys, "profile", "--trace=nvtx,cuda", "--force-overwrite=true", "-o", str(report)]
    root = pathlib.Path(vc.__file__).resolve().parents[1]  # the vyre_cuda under test, as run_python does
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [*profile, sys.executable, "-c", NSYS_CHILD], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    db = tmp_path / "trace.sqlite"
    subprocess.run(
        [nsys, "export", "--type=sqlite", "--force-overwrite=true", "-o", str(db), str(report) + ".nsys-rep"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    # range names are inline (NVTX_EVENTS.text) or interned (StringIds) depending on the nsys release
    texts = set()
    with sqlite3.connect(db) as con:
        for query in ("SELECT text FROM NVTX_EVENTS WHERE text IS NOT NULL", "SELECT value FROM StringIds"):
            with contextlib.suppress(sqlite3.OperationalError):  # a table or column this release lacks
                texts |= {row[0] for row in con.execute(query)}
    assert texts, "the nsys report holds no NVTX text at all"
    for name in ("nsys-probe", "vecadd_f32", *tracing.BLOCKING_STAGES, *tracing.ASYNC_STAGES):
        assert name in texts, f"{name!r} is not among the NVTX texts of the nsys report"
