"""The command line, called in-process through ``vyre_cuda.cli.main``."""

from __future__ import annotations

import pytest

import vyre_cuda
from vyre_cuda import builtin_programs, cli
from vyre_cuda import compile as vc_compile
from vyre_cuda.backend import driver_status
from vyre_cuda.errors import ValidationError

def without_gpu(monkeypatch):
    """The CLI as on a machine with no usable GPU (the real probe is tested in test_no_driver)."""
    from vyre_cuda import backend

    reason = "no CUDA device (simulated for this CLI test)"
    if driver_status()[0]:
        monkeypatch.setattr(backend, "driver_status", lambda: (False, reason))
        return reason
    return driver_status()[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private kernel cache folder, empty in memory too."""
    folder = tmp_path / "cli-cache"
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(folder))
    vc_compile.clear_cache(memory=True, disk=False)
    yield folder
    vc_compile.clear_cache(memory=True, disk=False)


def run(capsys, *argv):
    """(exit code, stdout lines, stderr lines) of ``vyre-cuda argv...``."""
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.splitlines()


def cache_fields(lines) -> dict:
    return dict(line.split(": ", 1) for line in lines)


def test_selftest_compiles_and_plans_then_fails(capsys, cache, monkeypatch):
    without_gpu(monkeypatch)
    rc, out, err = run(capsys, "selftest")
    assert rc != 0
    for name in builtin_programs.SELFTEST:
        (line,) = [line for line in out if line.split()[:1] == [name]]
        assert line.endswith(": ok") and "compiled (" in line
    assert err[-1].startswith("Fix: ")
    assert any(line.startswith("DriverUnavailable: ") for line in err)
    # the kernels really went through NVRTC into the cache
    assert int(cache_fields(run(capsys, "cache", "info")[1])["disk_entries"]) == len(builtin_programs.SELFTEST)


def test_info_without_a_driver(capsys, cache, monkeypatch):
    reason = without_gpu(monkeypatch)
    rc, out, _ = run(capsys, "info")
    assert rc != 0
    assert f"vyre_cuda {vyre_cuda.__version__}" in out
    assert f"driver: {reason}" in out and reason
    assert f"kernel cache: {cache}" in out


def test_cache_info_and_clear(capsys, cache):
    rc, out, _ = run(capsys, "cache")
    assert rc == 0
    fields = cache_fields(out)
    assert fields["dir"] == str(cache) and fields["disk_entries"] == "0"
    vc_compile.compile_kernel(builtin_programs.vecadd("u32").kernel, arch=None)
    assert cache_fields(run(capsys, "cache", "info")[1])["disk_entries"] == "1"
    rc, out, _ = run(capsys, "cache", "clear")
    assert rc == 0 and out == [f"removed 1 cached kernel(s) from {cache}"]
    assert cache_fields(run(capsys, "cache", "info")[1])["disk_entries"] == "0"


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"vyre_cuda {vyre_cuda.__version__}"


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["cache", "wipe"], ["info", "--device", "x"]])
def test_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "usage: vyre-cuda" in capsys.readouterr().err


def test_backend_errors_become_exit_code_2(capsys, monkeypatch):
    def fail():
        raise ValidationError("the cache is unhappy (got 3)", "make it happy")

    monkeypatch.setattr(vc_compile, "cache_info", fail)
    rc, out, err = run(capsys, "cache", "info")
    assert rc == 2 and out == []
    assert err == ["ValidationError: the cache is unhappy (got 3)", "Fix: make it happy"]


def test_selftest_cases_reference_outputs(rng):
    cases = cli.selftest_cases(rng)
    assert [name for name, *_ in cases] == list(builtin_programs.SELFTEST)
    for _, program, inputs, refs in cases:
        assert len(inputs) == len(program.inputs) and len(refs) == len(program.outputs)
