"""Packaging: the sdist holds every source a build needs, the wheel every module and data file.

CI builds the sdist, then a wheel from it, and passes both through VYRE_CUDA_SDIST and
VYRE_CUDA_WHEEL; without them the sdist is built here and the wheel check is skipped.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest

import vyre_cuda

ROOT = pathlib.Path(__file__).resolve().parents[1]  # the source tree these tests came with
SOURCE_SUFFIXES = (".py", ".pyx", ".pxd", ".pyi", ".h", ".hpp", ".cuh")
TOP_LEVEL = ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "setup.py", "MANIFEST.in")
BUILD_OUTPUTS = (".so", ".cpp", ".c", ".pyc", ".html")


def source_files() -> set[str]:
    """Every file of the source tree a build or a test run needs, relative to the root."""
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        # only what is really there: a copy of a tree may carry a git index older than its files
        files = {f for f in listed.split() if (ROOT / f).is_file()}
    except (OSError, subprocess.CalledProcessError):  # an unpacked sdist: no git
        files = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()}
    package = {
        f for f in files if f.startswith("vyre_cuda/") and (f.endswith(SOURCE_SUFFIXES) or f.endswith("py.typed"))
    }
    tests = {f for f in files if f.startswith("tests/") and f.endswith((".py", ".cu"))}
    return package | tests | set(TOP_LEVEL)


def cython_modules() -> list[str]:
    """Module names of the Cython sources: vyre_cuda/profile/_floor.pyx -> vyre_cuda.profile._floor."""
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "vyre_cuda").rglob("*.pyx"))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> pathlib.Path:
    given = os.environ.get("VYRE_CUDA_SDIST")
    if given:
        return pathlib.Path(given)
    pytest.importorskip("build", reason="set VYRE_CUDA_SDIST, or install `build` to make the sdist here")
    out = tmp_path_factory.mktemp("sdist")
    proc = subprocess.run(
        # an sdist needs none of the build requirements (they are pinned for building the wheel)
        [
            sys.executable,
            "-m",
            "build",
            "--sdist",
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("*.tar.gz")
    return path


def test_sdist_holds_every_source(sdist):
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    missing = source_files() - names
    assert not missing, f"{sdist.name} lacks {sorted(missing)}"
    assert not [n for n in names if n.endswith(BUILD_OUTPUTS)], "build outputs in the sdist"
    assert {m.replace(".", "/") + ".pyx" for m in cython_modules()} <= names


def test_wheel_holds_every_module():
    given = os.environ.get("VYRE_CUDA_WHEEL")
    if not given:
        pytest.skip("set VYRE_CUDA_WHEEL to a built wheel to check it (CI does)")
    names = set(zipfile.ZipFile(given).namelist())
    for module in cython_modules():
        path = module.replace(".", "/")
        assert any(n.startswith(path + ".") and n.endswith(".so") for n in names), f"no compiled {module}"
    wanted = {f for f in source_files() if f.startswith("vyre_cuda/") and not f.endswith(".pyx")}
    assert not wanted - names, f"wheel lacks {sorted(wanted - names)}"
    assert not [n for n in names if n.endswith((".pyx", ".cpp", ".c"))], "sources in the wheel"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_package_under_test_is_complete():
    """The vyre_cuda the tests import (installed, or built in place) has every compiled module,
    stub and header."""
    package = pathlib.Path(vyre_cuda.__file__).resolve().parent
    for module in cython_modules():
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), module
    for rel in source_files():
        if rel.startswith("vyre_cuda/") and rel.endswith((".pyi", ".pxd", ".cuh", ".h", "py.typed")):
            assert (package.parent / rel).is_file(), f"{rel} is not installed"
