"""The concurrency stress (tests/stress.py) on a real GPU: several backends on one device times
several threads, with close(), trim(), page-locked array churn and clear_prepared() running
alongside, every output checked against numpy, nothing left behind. Each configuration runs in a
child process, so a crash is counted as one; the failure then shows the child's Python stacks
(faulthandler) and its faulting thread's C stack (tests/helpers/segv_trace.c).

VYRE_CUDA_STRESS_DISPATCHES sets the dispatches over all configurations (default 1,200;
scripts/gpu-check runs the long profile: at least 20,000). The fifth configuration shares each
backend's pool streams once four are lent (``Knobs.stream_share_after``, off by default); the
sixth records caller-stream completion events on demand (``Knobs.fence_on_demand``, off by
default).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from helpers.crash_trace import preload_env
from helpers.stress_matrix import IDS, MATRIX, child_args

import vyre_cuda

ROOT = pathlib.Path(vyre_cuda.__file__).resolve().parents[1]  # the package under test, for the child
TOTAL = int(os.environ.get("VYRE_CUDA_STRESS_DISPATCHES", "1200"))


def _seed() -> int:
    fixed = os.environ.get("VYRE_CUDA_TEST_SEED", "").strip()
    return int(fixed, 0) if fixed else int.from_bytes(os.urandom(4), "little")


@pytest.mark.parametrize(("backends", "threads", "share", "fence"), MATRIX, ids=IDS)
def test_stress_on_the_gpu(backends, threads, share, fence, tmp_path_factory):
    seed = _seed()
    per_thread = -(-TOTAL // (len(MATRIX) * backends * threads))  # (rounded up: at least TOTAL in all)
    # (faulthandler: a crash prints every thread's Python stack to the stderr shown below)
    args = [sys.executable, "-X", "faulthandler", *child_args(seed, backends, threads, per_thread, share, fence)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env = preload_env(tmp_path_factory.getbasetemp() / "crash-trace", env)  # a crash's C stack too
    proc = subprocess.run(args, capture_output=True, text=True, timeout=1800, check=False, env=env, cwd="/")
    # stdout says whether the child got as far as its result line (a crash after it is one at exit)
    assert proc.returncode == 0, (
        f"seed {seed}: the stress child exited with {proc.returncode}:\n"
        f"stdout: {proc.stdout[-2000:]!r}\nstderr:\n{proc.stderr[-8000:]}"
    )
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    log = os.environ.get("VYRE_CUDA_STRESS_LOG")  # scripts/gpu-check collects one line per configuration
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(dict(res, seed=seed, share_streams=share, fence_on_demand=fence)) + "\n")
    where = f"seed {seed}: {res}"
    assert res["wrong"] == 0 and res["errors"] == 0, where
    assert res["leaks"] == {}, where
    assert res["dispatches"] == per_thread * backends * threads, where
    assert res["closes"] and res["trims"], where
