"""The `rng` fixture's seed is printed when a test fails, and VYRE_CUDA_TEST_SEED replays it."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

FAILING = """
def test_draws(rng):
    value = int(rng.integers(0, 2**62))
    print("VALUE", value)
    assert value < 0, rng
"""


def _run(folder, seed=None):
    # (the child runs all of its own tests: no seed, and no shard of scripts/gpu-check's run)
    env = {k: v for k, v in os.environ.items() if k not in ("VYRE_CUDA_TEST_SEED", "VYRE_CUDA_TEST_SHARD")}
    if seed is not None:
        env["VYRE_CUDA_TEST_SEED"] = seed
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_draws.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_failure_report_names_the_seed_and_the_seed_replays(tmp_path):
    shutil.copy(pathlib.Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_draws.py").write_text(FAILING)
    first = _run(tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    seeds = set(re.findall(r"replay with VYRE_CUDA_TEST_SEED=(\d+)", first.stdout))
    assert len(seeds) == 1, first.stdout  # in the report section and in the assertion's repr
    (seed,) = seeds
    assert f"rng seed {seed}" in first.stdout and f"SeededGenerator(seed={seed}" in first.stdout
    value = re.search(r"VALUE (\d+)", first.stdout).group(1)
    again = _run(tmp_path, seed)
    assert again.returncode == 1 and f"VALUE {value}" in again.stdout, again.stdout
