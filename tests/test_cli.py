"""The command line, called in-process through ``vyre_cuda.cli.main``."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re

import pytest

import vyre_cuda
from vyre_cuda import builtin_programs, cli
from vyre_cuda import compile as vc_compile
from vyre_cuda.backend import driver_status
from vyre_cuda.errors import DriverUnavailable, ValidationError
from vyre_cuda.planning.caps import DeviceCaps


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


def cache_fields(lines) -> tuple[dict, dict]:
    """``vyre-cuda cache info`` output as (folder fields, per-process counters)."""
    folder, per_process, section = {}, {}, None
    for line in lines:
        if line.startswith("per process"):
            section = per_process
            continue
        key, value = line.strip().split(": ", 1)
        (section if section is not None else folder)[key] = value
    return folder, per_process


def fake_device(monkeypatch, caps=None, error=None):
    """The CLI as on a machine with one GPU described by ``caps`` (or whose backend raises)."""
    from vyre_cuda import backend

    class FakeBackend:
        def __init__(self, device):
            if error is not None:
                raise error
            self.caps = caps

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(backend, "driver_status", lambda: (True, "1 device(s), driver CUDA 13.0"))
    monkeypatch.setattr(backend, "CudaBackend", FakeBackend)
    if caps is not None:  # the device list asks the driver module directly
        from vyre_cuda import _driver

        monkeypatch.setattr(_driver, "device_count", lambda: 1)
        monkeypatch.setattr(_driver, "device_caps", lambda ordinal: caps.as_dict())


def test_exit_codes_are_distinct_and_documented(capsys):
    codes = {cli.EXIT_OK: "success", cli.EXIT_FAILURE: "failed", cli.EXIT_USAGE: "usage", cli.EXIT_NO_GPU: "driver"}
    assert sorted(codes) == [0, 1, 2, 3]
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = capsys.readouterr().out
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    for code, word in codes.items():
        assert re.search(rf"^  {code}  .*{word}", help_text, re.M), help_text
        assert re.search(rf"`{code}`[^\n]*{word}", readme, re.I), f"README does not document exit status {code}"


def test_selftest_compiles_and_plans_then_exits_no_gpu(capsys, cache, monkeypatch):
    without_gpu(monkeypatch)
    rc, out, err = run(capsys, "selftest")
    assert rc == cli.EXIT_NO_GPU
    for name in builtin_programs.SELFTEST:
        (line,) = [line for line in out if line.split()[:1] == [name]]
        assert line.endswith(": ok") and "compiled (" in line
    assert err[-1].startswith("Fix: ")
    assert any(line.startswith("DriverUnavailable: ") for line in err)
    # the kernels really went through NVRTC into the cache
    folder, _ = cache_fields(run(capsys, "cache", "info")[1])
    assert int(folder["disk_entries"]) == len(builtin_programs.SELFTEST)


def test_info_without_a_driver(capsys, cache, monkeypatch):
    reason = without_gpu(monkeypatch)
    rc, out, err = run(capsys, "info")
    assert rc == cli.EXIT_NO_GPU
    assert f"vyre_cuda {vyre_cuda.__version__}" in out
    assert f"driver: {reason}" in out and reason
    assert f"kernel cache: {cache}" in out
    assert err[-1].startswith("Fix: ")


def test_info_json_without_a_driver_is_json(capsys, cache, monkeypatch):
    reason = without_gpu(monkeypatch)
    rc, out, err = run(capsys, "info", "--json")
    assert rc == cli.EXIT_NO_GPU and err == []
    info = json.loads("\n".join(out))
    assert info["driver_ok"] is False and info["driver"] == reason
    assert info["device"] is None and info["fix"]
    assert info["vyre_cuda"] == vyre_cuda.__version__ and info["kernel_cache"] == str(cache)
    nv = vc_compile.nvrtc_version()
    assert info["nvrtc"] == (".".join(map(str, nv)) if nv else None)


def test_info_with_a_device(capsys, cache, monkeypatch):
    caps = DeviceCaps(name="Fake H1", cc=(9, 0), sm_count=7, total_memory=3 * 2**30, driver_version=13000)
    fake_device(monkeypatch, caps)
    rc, out, err = run(capsys, "info", "--json")
    assert rc == cli.EXIT_OK and err == []
    info = json.loads("\n".join(out))
    assert info["driver_ok"] is True and "fix" not in info and "error" not in info
    assert info["device"] == json.loads(json.dumps(caps.as_dict()))
    assert "Fake H1 (sm_90, 3 GiB)" in info["devices"]
    rc, out, err = run(capsys, "info")
    assert rc == cli.EXIT_OK and err == []
    assert "device 0: Fake H1 (sm_90, PCI )" in out
    assert "  multiprocessors         7" in out and "  global memory           3,221,225,472 bytes" in out


@pytest.mark.parametrize(
    "error, code",
    [
        (ValidationError("device 7 does not exist (got 7, 1 device)", "pass --device 0"), cli.EXIT_FAILURE),
        (DriverUnavailable("the device went away", "check nvidia-smi"), cli.EXIT_NO_GPU),
    ],
)
def test_info_when_the_backend_fails(capsys, cache, monkeypatch, error, code):
    fake_device(monkeypatch, error=error)
    rc, out, err = run(capsys, "info", "--json", "--device", "7")
    assert rc == code and err == []
    info = json.loads("\n".join(out))
    assert info["driver_ok"] is True and info["device"] is None
    assert info["error"] == f"{type(error).__name__}: {error.message}" and info["fix"] == error.fix
    rc, out, err = run(capsys, "info", "--device", "7")
    assert rc == code and err == [f"{type(error).__name__}: {error.message}", f"Fix: {error.fix}"]


def test_cache_info_and_clear(capsys, cache):
    rc, out, _ = run(capsys, "cache")
    assert rc == cli.EXIT_OK
    folder, per_process = cache_fields(out)
    assert folder["dir"] == str(cache) and folder["disk_entries"] == "0"
    assert "compiles" in per_process and "compiles" not in folder
    vc_compile.compile_kernel(builtin_programs.vecadd("u32").kernel, arch=None)
    folder, per_process = cache_fields(run(capsys, "cache", "info")[1])
    # in this (test) process the counters moved; `vyre-cuda cache` in a new process shows 0
    assert folder["disk_entries"] == "1" and int(per_process["compiles"]) >= 1
    rc, out, _ = run(capsys, "cache", "clear")
    assert rc == cli.EXIT_OK and out == [f"removed 1 cached kernel(s) from {cache}"]
    assert cache_fields(run(capsys, "cache", "info")[1])[0]["disk_entries"] == "0"


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == cli.EXIT_OK
    assert capsys.readouterr().out.strip() == f"vyre_cuda {vyre_cuda.__version__}"


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["cache", "wipe"], ["info", "--device", "x"]])
def test_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == cli.EXIT_USAGE
    assert "usage: vyre-cuda" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["info", "selftest", "cache", "tune", "profile"])
def test_an_unknown_option_shows_its_commands_usage(capsys, command):
    # `vyre-cuda profile --bogus` once showed the top-level usage, which lists no profile option
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--bogus"])
    assert info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"usage: vyre-cuda {command} "), err
    assert f"vyre-cuda {command}: error: unrecognized arguments: --bogus" in err


def test_an_unknown_option_before_the_command_shows_the_top_level_usage(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--bogus", "info"])
    assert info.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: vyre-cuda [-h]"), err
    assert "vyre-cuda: error: unrecognized arguments: --bogus" in err


@pytest.mark.parametrize(
    "error, code",
    [
        (ValidationError("the cache is unhappy (got 3)", "make it happy"), cli.EXIT_FAILURE),
        (DriverUnavailable("no libcuda (got none)", "install the driver"), cli.EXIT_NO_GPU),
    ],
)
def test_backend_errors_become_exit_codes(capsys, monkeypatch, error, code):
    def fail():
        raise error

    monkeypatch.setattr(vc_compile, "cache_info", fail)
    rc, out, err = run(capsys, "cache", "info")
    assert rc == code and out == []
    assert err == [f"{type(error).__name__}: {error.message}", f"Fix: {error.fix}"]


def test_selftest_cases_reference_outputs(rng):
    cases = cli.selftest_cases(rng)
    assert [name for name, *_ in cases] == list(builtin_programs.SELFTEST)
    for _, program, inputs, refs in cases:
        assert len(inputs) == len(program.inputs) and len(refs) == len(program.outputs)


@pytest.mark.gpu
def test_info_and_selftest_on_a_gpu(capsys, cache):
    ok, why = driver_status()
    if not ok:
        if os.environ.get("VYRE_CUDA_REQUIRE_GPU") == "1":
            pytest.fail(f"VYRE_CUDA_REQUIRE_GPU=1 but no GPU is usable: {why}")
        pytest.skip(f"no CUDA driver/device: {why}")
    rc, out, err = run(capsys, "info", "--json")
    assert rc == cli.EXIT_OK and err == []
    info = json.loads("\n".join(out))
    assert info["driver_ok"] is True and info["driver"] == why
    assert info["device"]["sm_count"] > 0 and info["device"]["total_memory"] > 0 and info["device"]["name"]
    rc, out, err = run(capsys, "selftest")
    assert rc == cli.EXIT_OK, (out, err)
    assert out[-1] == "selftest passed"
    assert all(f"{name} " in "\n".join(out) for name in builtin_programs.SELFTEST)


def test_info_json_in_a_process_without_a_device():
    """The console entry in a fresh interpreter that sees no device (CUDA_VISIBLE_DEVICES=''):
    on a GPU machine the driver loads and finds none; elsewhere the library is missing."""
    import subprocess
    import sys

    root = pathlib.Path(vyre_cuda.__file__).resolve().parents[1]  # the vyre_cuda under test
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "vyre_cuda", "info", "--json"],
        cwd=root.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == cli.EXIT_NO_GPU, proc.stderr
    info = json.loads(proc.stdout)
    assert info["driver_ok"] is False and info["driver"] and info["device"] is None and info["fix"]


# The statuses each command can end with, read off cli.py: every command can fail (a vyre_cuda
# error) and be misused; all but `cache` open the driver.
CODES = {
    None: {0, 1, 2, 3},
    "info": {0, 1, 2, 3},
    "selftest": {0, 1, 2, 3},
    "cache": {0, 1, 2},
    "tune": {0, 1, 2, 3},
    "profile": {0, 1, 2, 3},
}
COMMANDS = [c for c in CODES if c]


def help_text(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main([*argv, "--help"])
    assert info.value.code == cli.EXIT_OK
    return capsys.readouterr().out


def exit_status_section(text: str) -> dict[int, str]:
    """``{code: meaning}`` from the ``exit status:`` section that ends a --help text."""
    head, sep, section = text.partition("\nexit status:\n")
    assert sep, f"no 'exit status:' section in:\n{text}"
    codes: dict[int, str] = {}
    for line in section.rstrip("\n").splitlines():
        m = re.fullmatch(r"  (\d)  (\S.*)", line)
        if m:
            codes[int(m.group(1))] = m.group(2)
        else:  # a wrapped meaning goes on, indented under its text
            assert line.startswith(" " * 5) and codes, f"not part of an exit status entry: {line!r}"
            codes[max(codes)] += " " + line.strip()
    return codes


def test_every_command_is_checked_for_its_exit_statuses():
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert sorted(sub.choices) == sorted(COMMANDS)  # a new command needs its statuses here
    assert set(cli.EXIT_STATUSES) == set(CODES)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_plain_text_and_lists_the_exit_statuses(capsys, command):
    text = help_text(capsys, *([command] if command else []))
    codes = exit_status_section(text)
    assert set(codes) == CODES[command], text
    assert all(len(meaning) > 5 for meaning in codes.values())
    assert codes[cli.EXIT_USAGE].startswith("usage error")
    if cli.EXIT_NO_GPU in codes:
        assert "no usable CUDA driver or device" in codes[cli.EXIT_NO_GPU]
    if command:
        assert text.startswith(f"usage: vyre-cuda {command}")
        assert cli.exit_status_epilog(command) in text
    # reStructuredText markup of docstrings does not belong in a terminal
    for markup in ("``", ":class:", ":func:", ":meth:", ":mod:", ".. ", "**"):
        assert markup not in text, f"{markup!r} in `vyre-cuda {command or ''} --help`:\n{text}"
    assert max(len(line) for line in text.splitlines()) <= 100, text


def test_the_statuses_commands_end_with_are_the_ones_their_help_lists(capsys, cache, monkeypatch, tmp_path):
    """Drive each command to the statuses it can reach here (no GPU) and check its --help names them."""
    listed = {c: set(exit_status_section(help_text(capsys, c))) for c in COMMANDS}
    seen: dict[str, set] = {c: set() for c in COMMANDS}

    def status(*argv):
        try:
            rc = cli.main(list(argv))
        except SystemExit as exc:  # argparse's own exit
            rc = exc.code
        capsys.readouterr()
        seen[argv[0]].add(rc)
        return rc

    for command in COMMANDS:
        assert status(command, "--bogus") == cli.EXIT_USAGE
    assert status("cache", "info") == cli.EXIT_OK
    stored = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "latest.json"
    assert status("profile", "--from", str(stored)) == cli.EXIT_OK
    assert status("profile", "--from", str(tmp_path / "missing.json")) == cli.EXIT_USAGE
    without_gpu(monkeypatch)
    for argv in (["info"], ["selftest"], ["tune", "--elements", "256"]):
        assert status(*argv) == cli.EXIT_NO_GPU
    fake_device(monkeypatch, error=ValidationError("device 7 does not exist (got 7, 1 device)", "pass --device 0"))
    assert status("info", "--device", "7") == cli.EXIT_FAILURE

    def broken():
        raise ValidationError("the cache is unhappy (got 3)", "make it happy")

    monkeypatch.setattr(vc_compile, "cache_info", broken)
    assert status("cache") == cli.EXIT_FAILURE
    for command in COMMANDS:
        assert seen[command] <= listed[command], (command, seen[command], listed[command])


def test_profile_without_a_driver_exits_no_gpu(monkeypatch, capsys):
    """`vyre-cuda profile` ends like every command when no driver or device is usable: exit 3
    and the DriverUnavailable message with its Fix."""
    import vyre_cuda.profile.cli as profile_cli

    error = DriverUnavailable("the CUDA driver found no device", vyre_cuda.errors.NO_DRIVER_FIX)

    def no_driver(**kwargs):
        raise error

    monkeypatch.setattr(profile_cli, "run_profile", no_driver)
    rc, out, err = run(capsys, "profile", "--sizes", "4KiB")
    assert rc == cli.EXIT_NO_GPU, (out, err)
    assert err[-2:] == [f"vyre-cuda profile: DriverUnavailable: {error.message}", f"Fix: {error.fix}"]


def test_profile_in_a_process_without_a_device():
    """The console entry in a fresh interpreter that sees no device, as test_info_json_... does."""
    import subprocess
    import sys

    root = pathlib.Path(vyre_cuda.__file__).resolve().parents[1]  # the vyre_cuda under test
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "vyre_cuda", "profile", "--sizes", "4KiB"],
        cwd=root.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == cli.EXIT_NO_GPU, proc.stderr
    assert "DriverUnavailable: " in proc.stderr and "\nFix: " in proc.stderr, proc.stderr
    if "could not be loaded" in proc.stderr:  # no driver library at all: the one shared Fix
        assert proc.stderr.rstrip().endswith(f"Fix: {vyre_cuda.errors.NO_DRIVER_FIX}"), proc.stderr


@pytest.mark.parametrize("argv", [["info"], ["selftest"], ["tune"]])
def test_no_driver_fix_is_one_text(capsys, cache, monkeypatch, argv):
    """Every command that finds no usable driver gives the same Fix, the one the core raises when
    the driver library does not load (errors.NO_DRIVER_FIX)."""
    without_gpu(monkeypatch)
    rc, out, err = run(capsys, *argv)
    assert rc == cli.EXIT_NO_GPU
    assert err[-1] == f"Fix: {vyre_cuda.errors.NO_DRIVER_FIX}", err
