"""The crash tracer of the stress children (tests/helpers/crash_trace.py): a child dying on a
fatal signal prints faulthandler's Python stacks, then its faulting thread's C stack, and still
dies of that signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import fakecuda
import pytest
from helpers.crash_trace import preload_env


def test_a_crashing_child_prints_its_c_stack_and_still_dies_of_the_signal(tmp_path):
    if fakecuda.compiler() is None:
        pytest.skip("no C compiler on PATH to build the crash tracer")
    env = preload_env(tmp_path, dict(os.environ))
    assert "libsegv_trace.so" in env["LD_PRELOAD"]
    crash = "import ctypes\ndef deep_in_python():\n    ctypes.string_at(0)\ndeep_in_python()\n"
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", crash], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == -signal.SIGSEGV, proc
    python_stack, _, c_stack = proc.stderr.partition("C stack of the faulting thread (segv_trace):")
    assert "deep_in_python" in python_stack, proc.stderr  # faulthandler ran first
    frames = c_stack.strip().splitlines()
    assert len(frames) >= 3 and any("libc" in f or "ctypes" in f for f in frames), proc.stderr


def test_a_child_that_exits_normally_prints_nothing(tmp_path):
    if fakecuda.compiler() is None:
        pytest.skip("no C compiler on PATH to build the crash tracer")
    env = preload_env(tmp_path, dict(os.environ))
    proc = subprocess.run([sys.executable, "-c", "print(6 * 7)"], env=env, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "42", "")
