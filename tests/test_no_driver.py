"""Without a CUDA driver: the import works, and first use fails with DriverUnavailable and a Fix."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

import vyre_cuda
from vyre_cuda.errors import DriverUnavailable, ValidationError

# the folder holding the vyre_cuda under test: the checkout when built in place, site-packages
# when installed (a checkout without built extensions must not shadow the installed package)
PACKAGE_ROOT = pathlib.Path(vyre_cuda.__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    vyre_cuda.driver_status()[0], reason="a CUDA driver is present; these test the no-driver path"
)


def assert_fix(err: BaseException) -> None:
    last = str(err).splitlines()[-1]
    assert last.startswith("Fix: ") and last[5:].strip(), str(err)


def python(*args, timeout=120) -> subprocess.CompletedProcess:
    """Run a fresh interpreter on the vyre_cuda under test, from a neutral folder."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, *args], cwd=PACKAGE_ROOT.parent, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_import_is_light_and_needs_no_driver():
    code = (
        "import sys, vyre_cuda\n"
        "assert not any(m in sys.modules for m in ('vyre_cuda._driver', 'vyre_cuda._dispatch')), sorted(sys.modules)\n"
        "for name in vyre_cuda.__all__: getattr(vyre_cuda, name)\n"
        "print('imported', vyre_cuda.__version__)\n"
    )
    proc = python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"imported {vyre_cuda.__version__}"


def test_driver_status():
    ok, reason = vyre_cuda.driver_status()
    assert ok is False and isinstance(reason, str) and reason.strip()


@pytest.mark.parametrize("device", [0, 1])
def test_backend_raises_driver_unavailable(device):
    with pytest.raises(DriverUnavailable) as info:
        vyre_cuda.CudaBackend(device)
    assert_fix(info.value)
    assert info.value.message  # says what is missing


def test_backend_argument_errors_come_first():
    with pytest.raises(ValidationError) as info:
        vyre_cuda.CudaBackend("0")
    assert_fix(info.value)


def test_console_entry_selftest():
    proc = python("-m", "vyre_cuda", "selftest")
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.splitlines()
    assert any(line.startswith("DriverUnavailable: ") for line in err), proc.stderr
    assert err[-1].startswith("Fix: ")
    assert sum(line.rstrip().endswith(": ok") for line in proc.stdout.splitlines()) == 4, proc.stdout


def test_console_entry_info():
    proc = python("-m", "vyre_cuda", "info")
    assert proc.returncode != 0
    assert f"driver: {vyre_cuda.driver_status()[1]}" in proc.stdout.splitlines()
