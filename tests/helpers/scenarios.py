"""Child-process scenarios on the fake CUDA driver: the registry and runner a child script uses,
and the parent side that runs the child and reads the scenario list from the child's source.

A child script (tests/fakecuda/*_child.py) registers its scenarios with a decorator and ends with
``main``::

    SCENARIOS = Scenarios()
    scenario = SCENARIOS.register

    @scenario
    def close_frees_everything(fake): ...

    if __name__ == "__main__":
        SCENARIOS.main(FakeDriver())

and prints one JSON object: scenario name -> :func:`record` (``ok``, ``error``, ``skipped``), plus
``_hook_errors`` (the fake's emulation errors). The test module that spawns it lists the scenarios
with :func:`declared`, which reads the decorated function names from the child's source without
importing it (importing a child loads the fake driver), so the list is written once: in the child.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import traceback
from collections.abc import Callable
from typing import Any

__all__ = [
    "LIVE",
    "Scenarios",
    "Skip",
    "check",
    "declared",
    "live",
    "raises",
    "record",
    "run_child",
    "run_scenarios",
    "seed",
]

FAKECUDA = pathlib.Path(__file__).resolve().parents[1] / "fakecuda"


class Skip(Exception):
    """Raised by a scenario that cannot run here; its record says why."""


# the telemetry keys of what a backend holds now (all 0 once its work is done and recycled)
LIVE = ("device_pool_live_bytes", "pinned_pool_live_bytes", "streams_live", "events_live")


def live(backend) -> dict:
    """``backend``'s :data:`LIVE` telemetry."""
    snap = backend.telemetry.snapshot()
    return {k: snap[k] for k in LIVE}


def raises(exc_type, fn, *args, **kw):
    """The ``exc_type`` exception ``fn(*args, **kw)`` raises; AssertionError when it raises none."""
    try:
        fn(*args, **kw)
    except exc_type as exc:
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type.__name__}")


def record(ok: bool, error: str = "", skipped: str | None = None) -> dict:
    """One scenario's result as the parent reads it."""
    return {"ok": ok, "error": error, "skipped": skipped}


# ---------------------------------------------------------------------------- in the child
class Scenarios:
    """The scenarios of one child script, in the order they are registered."""

    def __init__(self) -> None:
        self.cases: dict[str, Callable[..., Any]] = {}

    def register(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: add ``fn`` under its name."""
        self.cases[fn.__name__] = fn
        return fn

    def run(self, name: str, *args: Any) -> dict:
        """Run scenario ``name`` with ``args``: its :func:`record`, never an exception."""
        try:
            self.cases[name](*args)
        except Skip as why:
            return record(True, skipped=str(why))
        except BaseException as exc:  # noqa: BLE001 (reported to the parent)
            return record(False, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-3000:])
        return record(True)

    def main(self, fake) -> None:
        """Run every scenario with ``fake`` (its injected failures cleared before each) and print
        the records and the fake's emulation errors as one JSON line."""
        results = {}
        for name in self.cases:
            fake.clear_failures()
            results[name] = self.run(name, fake)
        results["_hook_errors"] = fake.hook_errors
        print(json.dumps(results))

    def main_one(self, name: str, fake) -> None:
        """Run scenario ``name`` (no arguments) and print its record; emulation errors of ``fake``
        fail it."""
        result = self.run(name)
        if fake.hook_errors:
            result = record(False, f"emulation errors: {fake.hook_errors[:3]}")
        print(json.dumps(result))


# ---------------------------------------------------------------------------- in the parent
def check(result: dict) -> None:
    """A scenario's :func:`record` as the parent's test outcome: skipped, passed or failed."""
    import pytest

    if result["skipped"]:
        pytest.skip(result["skipped"])
    assert result["ok"], result["error"]


def declared(child: pathlib.Path, decorator: str = "scenario") -> list[str]:
    """The names of the functions in ``child``'s source decorated with ``@decorator``, in source
    order (read with ``ast``: the child is not imported)."""
    tree = ast.parse(pathlib.Path(child).read_text(), str(child))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(isinstance(d, ast.Name) and d.id == decorator for d in node.decorator_list)
    ]


def seed() -> int:
    """A fresh child seed, or ``VYRE_CUDA_TEST_SEED`` to replay one."""
    fixed = os.environ.get("VYRE_CUDA_TEST_SEED", "").strip()
    return int(fixed, 0) if fixed else int.from_bytes(os.urandom(4), "little")


def run_child(args, fake_libcuda, tmp_path_factory, timeout: float = 600, env: dict | None = None) -> Any:
    """Run ``python args...`` on the fake driver (with the session's kernel cache and the extra
    environment ``env``) and return the last line it printed, parsed as JSON; a crash (a signal: a
    negative return code) or an exception fails the calling test."""
    import fakecuda

    args = [str(a) for a in args]
    proc = fakecuda.run_python(
        args,
        fake_libcuda,
        timeout=timeout,
        VYRE_CUDA_CACHE_DIR=tmp_path_factory.getbasetemp() / "kernel-cache",
        **(env or {}),
    )
    assert proc.returncode == 0, f"child {args} exited with {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_scenarios(
    child: pathlib.Path, fake_libcuda, tmp_path_factory, timeout: float = 600, env: dict | None = None
) -> dict:
    """Run every scenario of ``child`` (:meth:`Scenarios.main`) in one process with a fresh seed
    (:func:`seed`) and the extra environment ``env`` (``{"FAKE_CUDA_LAZY": "1"}``: the fake's lazy
    mode from the start): the records by name, after checking that the fake driver's emulation
    raised nothing and that the child ran exactly the scenarios it declares (:func:`declared`)."""
    child_seed = seed()
    results = run_child([child, child_seed], fake_libcuda, tmp_path_factory, timeout, env)
    assert results.pop("_hook_errors") == []
    ran_all = sorted(results) == sorted(declared(child))
    assert ran_all, f"the child (seed {child_seed}) ran other scenarios than it declares"
    return results
