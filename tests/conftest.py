import collections
import importlib.machinery
import os
import pathlib
import sys
import zlib

import numpy as np
import pytest

# `python -m pytest` puts the current folder first on sys.path. In a checkout whose compiled core
# is not built in place (setup.py build_ext --inplace), that folder's vyre_cuda cannot run: drop
# it so the tests import the installed package, as plain `pytest` does.
_ROOT = pathlib.Path(__file__).resolve().parents[1]
_BUILT = tuple(importlib.machinery.EXTENSION_SUFFIXES)
if not any(f.name.endswith(_BUILT) for f in (_ROOT / "vyre_cuda").glob("_*")):
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or os.curdir).resolve() != _ROOT]
# The benchmark record's harness (benchmarks/harness, not shipped in the wheel) for the tests that
# cover it: the checkout goes last on sys.path, so that an installed vyre_cuda still comes first.
if not any(pathlib.Path(p or os.curdir).resolve() == _ROOT for p in sys.path):
    sys.path.append(str(_ROOT))

# VYRE_CUDA_TEST_SEED=<int> replays a failure: every `rng` fixture of the run starts from that seed.
SEED_ENV = "VYRE_CUDA_TEST_SEED"


class SeededGenerator(np.random.Generator):
    """A numpy Generator that remembers its seed and shows it in its repr (and so in assertion
    rewrites and tracebacks that print it)."""

    def __init__(self, seed: int):
        super().__init__(np.random.PCG64(seed))
        self.seed = seed

    def __repr__(self) -> str:
        return f"SeededGenerator(seed={self.seed}; replay with {SEED_ENV}={self.seed})"

    __str__ = __repr__


def _seed() -> int:
    fixed = os.environ.get(SEED_ENV, "").strip()
    if fixed:
        return int(fixed, 0)
    return int.from_bytes(os.urandom(4), "little")


@pytest.fixture
def rng(request):
    # fresh random data every run; the seed goes into the test report, and a failure prints it
    # (pytest_runtest_makereport below) so the run can be replayed exactly
    gen = SeededGenerator(_seed())
    request.node.user_properties.append(("rng_seed", gen.seed))
    return gen


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        seeds = [value for name, value in item.user_properties if name == "rng_seed"]
        if seeds:
            text = ", ".join(str(s) for s in seeds)
            replay = f"replay with {SEED_ENV}={seeds[-1]} pytest '{item.nodeid}'"
            report.sections.append(("rng seed", f"rng seed {text}: {replay}"))
    return report


@pytest.fixture(autouse=True)
def _isolated_kernel_cache(tmp_path_factory, monkeypatch):
    # every test session compiles into its own cache folder, never the user's
    folder = tmp_path_factory.getbasetemp() / "kernel-cache"
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(folder))


@pytest.fixture(scope="session")
def fake_libcuda(tmp_path_factory):
    """The folder holding the fake CUDA driver (tests/fakecuda), built once per session."""
    import fakecuda

    if fakecuda.compiler() is None:
        pytest.skip("no C compiler on PATH to build the fake CUDA driver (tests/fakecuda)")
    return fakecuda.build(tmp_path_factory.getbasetemp() / "fakecuda")


def pytest_collection_modifyitems(config, items):
    """VYRE_CUDA_TEST_SHARD=K/N keeps about 1/N of the tests: those whose node id hashes to K - 1.

    scripts/sanitize uses it to split the GPU suite over several bounded runs; the split is
    stable (a hash of the id, not its position), so the N shards together run every test once.
    """
    shard = os.environ.get("VYRE_CUDA_TEST_SHARD", "").strip()
    if not shard:
        return
    k, n = (int(x) for x in shard.split("/"))
    if not 1 <= k <= n:
        raise pytest.UsageError(f"VYRE_CUDA_TEST_SHARD={shard!r}: K must be in 1..N")
    keep, drop = [], []
    for item in items:
        (keep if zlib.crc32(item.nodeid.encode()) % n == k - 1 else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_SKIP_PREFIX = "Skipped: "  # what pytest.skip() puts before its message


def skip_reason(report) -> str:
    """The reason a skipped test report gives (its first line), without pytest's ``Skipped:``."""
    longrepr = report.longrepr
    text = str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr or "")
    text = text.strip().splitlines()[0] if text.strip() else "no reason given"
    return text.removeprefix(_SKIP_PREFIX)


def skip_summary(reports) -> list[str]:
    """``skipped N: reason`` lines, the most frequent reason first (ties by reason)."""
    counts = collections.Counter(skip_reason(r) for r in reports)
    return [f"skipped {n}: {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # -rs lists each skip with its file and line; this gives the reasons at a glance, also under -q
    # (scripts/gpu-check greps both: "^SKIPPED" and "^skipped N: ")
    lines = skip_summary(terminalreporter.stats.get("skipped", []))
    if lines:
        terminalreporter.write_sep("-", "skips by reason")
        for line in lines:
            terminalreporter.write_line(line)
