"""With no usable GPU: the import works, and first use fails with DriverUnavailable and a Fix.

Every case runs in a child interpreter with ``CUDA_VISIBLE_DEVICES=""``, so it tests a real
no-GPU path on any machine: on one without a driver the library cannot be loaded; on a GPU
machine the driver loads but finds no device. Either way nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import vyre_cuda

# the folder holding the vyre_cuda under test: the checkout when built in place, site-packages
# when installed (a checkout without built extensions must not shadow the installed package)
PACKAGE_ROOT = pathlib.Path(vyre_cuda.__file__).resolve().parents[1]


def python(*args, timeout=120) -> subprocess.CompletedProcess:
    """Run a fresh interpreter on the vyre_cuda under test, from a neutral folder, with no GPU."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args], cwd=PACKAGE_ROOT.parent, env=env, capture_output=True, text=True, timeout=timeout
    )


def child_json(code: str) -> dict:
    proc = python("-c", code)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


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


def test_the_backend_module_leaves_the_streamed_planner_to_elementwise_programs():
    # the first CudaBackend() imports vyre_cuda.backend; the streamed route's planner (a dozen
    # frozen dataclasses) is imported by the first elementwise plan instead
    code = (
        "import sys, vyre_cuda.backend\n"
        "assert 'vyre_cuda.planning.stream' not in sys.modules\n"
        "import vyre_cuda.planning.dispatch\n"
        "assert 'vyre_cuda.planning.stream' not in sys.modules\n"
        "print('deferred')\n"
    )
    proc = python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "deferred"


def test_driver_status():
    res = child_json("import json, vyre_cuda\nok, why = vyre_cuda.driver_status()\nprint(json.dumps([ok, why]))")
    ok, reason = res
    assert ok is False and isinstance(reason, str) and reason.strip()


_BACKEND = r"""
import json, sys, vyre_cuda
out = {}
for arg in (0, 1, "0"):
    try:
        vyre_cuda.CudaBackend(arg)
        out[repr(arg)] = None
    except vyre_cuda.BackendError as err:
        out[repr(arg)] = [type(err).__name__, err.message, str(err).splitlines()[-1]]
print(json.dumps(out))
"""


def test_backend_raises_driver_unavailable_and_argument_errors_come_first():
    res = child_json(_BACKEND)
    for device in ("0", "1"):
        kind, message, last = res[device]
        assert kind == "DriverUnavailable" and message.strip(), res[device]
        assert last.startswith("Fix: ") and last[5:].strip()
    kind, _, last = res["'0'"]  # a bad argument is reported before any driver use
    assert kind == "ValidationError" and last.startswith("Fix: ")


def test_console_entry_selftest():
    proc = python("-m", "vyre_cuda", "selftest")
    assert proc.returncode == 3, proc.stderr  # EXIT_NO_GPU
    err = proc.stderr.splitlines()
    assert any(line.startswith("DriverUnavailable: ") for line in err), proc.stderr
    assert err[-1].startswith("Fix: ")
    assert sum(line.rstrip().endswith(": ok") for line in proc.stdout.splitlines()) == 4, proc.stdout


def test_console_entry_info():
    proc = python("-m", "vyre_cuda", "info")
    assert proc.returncode == 3, proc.stderr  # EXIT_NO_GPU
    reason = child_json("import json, vyre_cuda\nprint(json.dumps(vyre_cuda.driver_status()[1]))")
    assert f"driver: {reason}" in proc.stdout.splitlines()
    assert proc.stderr.splitlines()[-1].startswith("Fix: ")
