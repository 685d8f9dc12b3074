"""compute-sanitizer's leak check over a script that closes its backend and one that does not:
nothing of vyre_cuda's may be left allocated at exit (page-locked arrays still alive at exit
included: their blocks are freed once the interpreter has finalized)."""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import site
import subprocess
import sys

import pytest

CHILD = pathlib.Path(__file__).with_name("exit_leak_child.py")


def _sanitizer() -> str | None:
    found = os.environ.get("COMPUTE_SANITIZER") or shutil.which("compute-sanitizer")
    if found:
        return found
    patterns = ["/usr/local/cuda/bin/compute-sanitizer", "/usr/local/cuda-*/bin/compute-sanitizer"]
    patterns += [f"{r}/nvidia/**/compute-sanitizer" for r in site.getsitepackages()]
    for pattern in patterns:
        for c in glob.glob(pattern, recursive=True):
            if os.path.isfile(c) and os.access(c, os.X_OK):
                return c
    return None


@pytest.mark.parametrize("shape", ["closed", "open"])
def test_no_leaks_at_exit_under_compute_sanitizer(shape, tmp_path):
    cs = _sanitizer()
    if cs is None:
        pytest.skip("compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)")
    root = pathlib.Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    cmd = [
        cs,
        "--tool",
        "memcheck",
        "--leak-check",
        "full",
        "--show-backtrace",
        "no",
        "--target-processes",
        "application-only",
        sys.executable,
        str(CHILD),
        shape,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path, env=env)
    text = proc.stdout + proc.stderr
    assert "done" in proc.stdout, text[-4000:]
    leaks = [line for line in text.splitlines() if "Leaked" in line]
    assert not leaks, "\n".join(leaks[:20])
    assert "ERROR SUMMARY: 0 errors" in text, text[-4000:]
