"""The differential fuzzer's long profile: generated programs on the device against numpy.

Hypothesis draws program seeds (reproducibly: ``hypothesis.seed`` from ``VYRE_CUDA_FUZZ_SEED``,
default fixed); each seed becomes a program (tests/fuzz_programs.py: kernel and numpy reference
from one description), which is compiled once and dispatched many times with fresh random data,
random runtime sizes, configs and entry points (tests/fuzz_runner.py checks every output element,
the caller's inputs and the telemetry of every dispatch). Compiling is the expensive part, so the
dispatches are spread over a few dozen programs.

Environment: ``VYRE_CUDA_FUZZ_DISPATCHES`` (default 5000 under ``VYRE_CUDA_REQUIRE_GPU=1``, else
1000), ``VYRE_CUDA_FUZZ_PROGRAMS`` (default dispatches / 100, at least 8, at most 60),
``VYRE_CUDA_FUZZ_MAX_RUNTIME`` (largest runtime-sized element count, default 300000),
``VYRE_CUDA_FUZZ_SEED``, and ``VYRE_CUDA_FUZZ_REPLAY=<program seed>[,<program seed>...]`` to rerun
only the named programs (every failure names its program seed and dispatch index). The summary
line is printed and written to ``$OUT/fuzz-summary.txt`` when ``OUT`` names a folder.
"""

from __future__ import annotations

import math
import os

import pytest
from fuzz_runner import FuzzRunner
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

REQUIRED = os.environ.get("VYRE_CUDA_REQUIRE_GPU") == "1"
DISPATCHES = int(os.environ.get("VYRE_CUDA_FUZZ_DISPATCHES", "5000" if REQUIRED else "1000"))
PROGRAMS = int(os.environ.get("VYRE_CUDA_FUZZ_PROGRAMS", str(max(8, min(60, DISPATCHES // 100)))))
MAX_RUNTIME = int(os.environ.get("VYRE_CUDA_FUZZ_MAX_RUNTIME", "300000"))
SEED = int(os.environ.get("VYRE_CUDA_FUZZ_SEED", "20250607"), 0)
REPLAY = [int(s, 0) for s in os.environ.get("VYRE_CUDA_FUZZ_REPLAY", "").replace(",", " ").split()]


def _report(line: str, capsys) -> None:
    with capsys.disabled():
        print("\n" + line)
    out = os.environ.get("OUT")
    if out and os.path.isdir(out):
        with open(os.path.join(out, "fuzz-summary.txt"), "w") as f:
            f.write(line + "\n")


def test_fuzz_generated_programs_match_numpy(fresh_backend, capsys):
    runner = FuzzRunner(fresh_backend, max_runtime=MAX_RUNTIME)
    per_program = math.ceil(DISPATCHES / PROGRAMS)
    if REPLAY:
        for program_seed in REPLAY:
            runner.run_program(program_seed, per_program)
    else:
        done = set()

        @settings(
            max_examples=PROGRAMS,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis_seed(SEED)
        @given(program_seed=st.integers(0, 2**32 - 1))
        def run(program_seed):
            assume(program_seed not in done)  # one program per seed: compiles are the expensive part
            done.add(program_seed)
            remaining = DISPATCHES - runner.dispatches
            if remaining > 0:
                runner.run_program(program_seed, min(per_program, remaining))

        run()
    line = f"{runner.summary()}; hypothesis seed {SEED}"
    _report(line, capsys)
    assert runner.mismatches == 0, line + "\n" + "\n".join(runner.details)
    if not REPLAY:
        assert runner.dispatches >= DISPATCHES, line
    if not REPLAY and DISPATCHES >= 2000:  # enough dispatches that every route comes up
        assert runner.routes["regular"] and runner.routes["cooperative"] and runner.routes["split"], line
    snap = fresh_backend.telemetry.snapshot()
    assert snap["failed_dispatches"] == 0 and snap["leaked_allocations"] == 0, snap
    assert snap["device_pool_live_bytes"] == 0 and snap["streams_live"] == 0 and snap["events_live"] == 0, snap
    assert not fresh_backend.lost


@pytest.mark.parametrize("program_seed", [1, 7, 1007, 2**32 - 1])
def test_fuzz_fixed_programs(backend, program_seed):
    # a few fixed programs, quick, for a fast signal (and a sanitizer run) before the long profile
    runner = FuzzRunner(backend, max_runtime=20_000)
    runner.run_program(program_seed, 12)
    assert runner.mismatches == 0, runner.summary() + "\n" + "\n".join(runner.details)
