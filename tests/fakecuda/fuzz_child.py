"""Child of tests/test_fuzz.py: generated programs dispatched on the fake driver, each kernel
emulated by the reference model, every output element checked (tests/fuzz_runner.py).

argv: base seed, programs, dispatches per program, largest runtime count. Prints one JSON object.
"""

from __future__ import annotations

import json
import sys

from fuzz_runner import FuzzRunner

import vyre_cuda as vc
from fakecuda import FakeDriver


def main(base: int, programs: int, per_program: int, max_runtime: int) -> None:
    fake = FakeDriver()
    backend = vc.CudaBackend(0)
    runner = FuzzRunner(backend, fake=fake, max_runtime=max_runtime)
    for k in range(programs):
        runner.run_program(base + k, per_program)
    snap = backend.telemetry.snapshot()
    backend.close()
    print(
        json.dumps(
            {
                "summary": runner.summary(),
                "programs": runner.programs,
                "dispatches": runner.dispatches,
                "mismatches": runner.mismatches,
                "details": runner.details,
                "routes": dict(runner.routes),
                "entries": dict(runner.entries),
                "hook_errors": fake.hook_errors,
                "telemetry": snap,
                "closed": fake.stats(),
            }
        )
    )


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
