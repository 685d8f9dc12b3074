"""A source folder whose compiled modules were never built: ``import vyre_cuda`` there fails at once
with an ImportError that names the folder and says how to fix it, instead of importing and then
failing at the first plan with ``No module named 'vyre_cuda._accounting'``.

The unbuilt folder is made here: the package's Python files copied without its extension modules
(as a fresh clone or an unpacked sdist holds them), imported in a child interpreter.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import vyre_cuda

PACKAGE = pathlib.Path(vyre_cuda.__file__).resolve().parent  # the vyre_cuda under test

CHILD = """
import json, sys
try:
    import vyre_cuda
except BaseException as exc:
    print(json.dumps({"type": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}))
else:
    print(json.dumps({"imported": vyre_cuda.__file__}))
"""


def _unbuilt_copy(dest: pathlib.Path) -> pathlib.Path:
    """The package's .py files (and nothing compiled) under ``dest/vyre_cuda``."""
    for src in PACKAGE.rglob("*.py"):
        target = dest / "vyre_cuda" / src.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    assert not list((dest / "vyre_cuda").rglob("*.so"))
    return dest / "vyre_cuda"


def _import_in(folder: pathlib.Path) -> dict:
    """``import vyre_cuda`` in a fresh interpreter started in ``folder`` (first on its sys.path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PYTEST_")}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_from_an_unbuilt_source_folder_fails_at_once_with_a_fix(tmp_path):
    package = _unbuilt_copy(tmp_path)
    result = _import_in(tmp_path)
    assert "imported" not in result, f"an unbuilt vyre_cuda imported: {result}"
    assert "ImportError" in result["type"], result
    message = result["message"]
    assert str(package) in message, message  # names the folder
    last = message.splitlines()[-1]
    assert last.startswith("Fix: "), message
    assert "build_ext --inplace" in last and "pip install" in last, last


def test_the_package_under_test_imports_from_a_neutral_folder(tmp_path):
    # the check never fires where the compiled core is there (installed, or built in place)
    env_root = PACKAGE.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(env_root), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"imported": vyre_cuda.__file__}, result


def test_the_probed_module_is_a_compiled_module_of_the_package():
    # a rename of that module must move the probe with it (else every import would fail)
    source = pathlib.Path(__file__).resolve().parents[1] / "vyre_cuda"
    if not (source / "__init__.py").is_file():
        return  # installed tests: the import above already found it
    assert (source / f"{vyre_cuda._COMPILED_PROBE}.pyx").is_file(), vyre_cuda._COMPILED_PROBE
