"""The end-of-run summary of skips by reason (tests/conftest.py's pytest_terminal_summary), on a
tiny test folder with a copy of that conftest, run in a pytest of its own."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent

TINY = """
import pytest

NO_GPU = "needs a CUDA device (no driver)"


@pytest.mark.parametrize("k", range(3))
def test_gpu(k):
    pytest.skip(NO_GPU)


@pytest.mark.skipif(True, reason="needs 2 CUDA devices, 1 visible")
def test_two():
    pass


@pytest.fixture
def gpu():
    pytest.skip(NO_GPU)


def test_fixture_skip(gpu):
    pass


def test_import():
    pytest.importorskip("no_such_module_for_this_test")


def test_runs():
    assert True
"""


def _run(tmp_path, *args, source=TINY):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "test_tiny.py").write_text(source)
    shutil.copy(TESTS / "conftest.py", folder / "conftest.py")
    # (the child runs all of its own tests: not a shard of scripts/gpu-check's run)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "VYRE_CUDA_TEST_SHARD")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, str(folder)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_one_line_per_reason_with_its_count(tmp_path):
    out = _run(tmp_path, "-q")
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "skips by reason" in line)
    assert lines[start + 1 : start + 4] == [
        "skipped 4: needs a CUDA device (no driver)",  # 3 in the test, 1 in a fixture
        "skipped 1: could not import 'no_such_module_for_this_test': No module named 'no_such_module_for_this_test'",
        "skipped 1: needs 2 CUDA devices, 1 visible",
    ]
    assert re.search(r"^1 passed, 6 skipped", lines[start + 4]), out
    assert not any(line.startswith("SKIPPED") for line in lines)  # without -rs no per-test lines


def test_rs_still_lists_each_skip_for_scripts_gpu_check(tmp_path):
    """scripts/gpu-check greps the "^SKIPPED" lines of `pytest -q -rs`: they stay, and the summary
    lines do not match that grep."""
    out = _run(tmp_path, "-q", "-rs")
    skipped = [line for line in out.splitlines() if re.match(r"^SKIPPED", line)]
    assert len(skipped) == 4 and all("test_tiny.py:" in line for line in skipped), out  # pytest folds same-line skips
    assert "SKIPPED [3] " in out  # the parametrized test: one line, its count
    assert sum(line.startswith("skipped ") for line in out.splitlines()) == 3
    assert 'grep -aE "^SKIPPED"' in (TESTS.parent / "scripts" / "gpu-check").read_text()


def test_no_skips_no_section(tmp_path):
    out = _run(tmp_path, "-q", source="def test_ok():\n    pass\n")
    assert "1 passed" in out and "skips by reason" not in out and "skipped" not in out, out
