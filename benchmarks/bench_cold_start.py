"""Cold start: what a fresh process pays before its dispatches run at steady-state speed.

Each figure comes from fresh interpreters (``--runs`` of them, the median reported):

* ``import_ms``: ``import vyre_cuda`` (and ``numpy_import_ms``, numpy alone, which it needs);
* ``backend_ms``: the first ``CudaBackend()`` (the compiled core, the driver, the context);
* ``first_dispatch_ms``: the first dispatch of the built-in vecadd on 3 x 4 KiB with the kernel
  already in the disk cache (one warm-up process fills a private cache folder first): planning,
  the cache lookup (NVRTC's version and the CUDA header search are part of its key), the module
  load, the pools;
* ``early_us`` / ``steady_us``: the medians of dispatches 2-36 of that plan (the graph-or-issued
  trial of a new plan runs in these) and of 300 dispatches after them, and their ratio.

Prints one JSON line. On a GPU machine, after building the extensions::

    python benchmarks/bench_cold_start.py
    python benchmarks/bench_cold_start.py --runs 9

Also runs on the fake driver of the tests (``LD_LIBRARY_PATH`` at its build folder).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]

# what each fresh process runs; it prints one JSON object
_CHILD = r"""
import json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
import vyre_cuda as vc
t2 = time.perf_counter()
out = {"numpy_import_ms": (t1 - t0) * 1e3, "import_ms": (t2 - t1) * 1e3}
if sys.argv[2] == "dispatch":
    prog = vc.builtin_programs.vecadd_f32()
    a = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    t3 = time.perf_counter()
    backend = vc.CudaBackend(0)
    t4 = time.perf_counter()
    (first,) = backend.dispatch(prog, [a, a])
    t5 = time.perf_counter()
    times = []
    for _ in range(35 + 300):
        s = time.perf_counter_ns()
        backend.dispatch(prog, [a, a])
        times.append(time.perf_counter_ns() - s)
    out.update(
        backend_ms=(t4 - t3) * 1e3,
        first_dispatch_ms=(t5 - t4) * 1e3,
        early_us=statistics.median(times[:35]) / 1e3,
        steady_us=statistics.median(times[35:]) / 1e3,
        checked=bool(np.array_equal(first, a + a)),
        compile_cache=vc.compile.cache_info() if hasattr(vc.compile, "cache_info") else {},
    )
    backend.close()
print(json.dumps(out, default=str))
"""


def _child(what: str, env: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT), what],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),  # a folder that cannot shadow the package
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child ({what}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per figure")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vyre-cold-") as cache:
        env = dict(os.environ, VYRE_CUDA_CACHE_DIR=cache)
        _child("dispatch", env)  # fills the private kernel cache: every measured run is a disk hit
        imports = [_child("import", env) for _ in range(args.runs)]
        runs = [_child("dispatch", env) for _ in range(args.runs)]

    def med(rows, key):
        return round(statistics.median(r[key] for r in rows), 3)

    result = {
        "bench": "cold_start",
        "runs": args.runs,
        "numpy_import_ms": med(imports, "numpy_import_ms"),
        "import_ms": med(imports, "import_ms"),
        "backend_ms": med(runs, "backend_ms"),
        "first_dispatch_ms": med(runs, "first_dispatch_ms"),
        "early_us": med(runs, "early_us"),
        "steady_us": med(runs, "steady_us"),
        "early_vs_steady": round(med(runs, "early_us") / med(runs, "steady_us"), 3),
        "output_checked": all(r["checked"] for r in runs),
        "compile_cache_last_run": runs[-1]["compile_cache"],
    }
    print(json.dumps(result, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
