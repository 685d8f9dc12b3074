"""Where each microsecond and each byte of a dispatch goes, beside the floor and the ceilings.

One :func:`run_profile` call measures, in the same process and interleaved round by round, at
each size (bytes per buffer; vecadd moves two inputs in and one output out):

* **vyre_cuda**: ``CudaBackend.dispatch`` from numpy arrays; the same with the core's stage
  clocks on, split into stages plus the *unattributed* remainder; ``dispatch_into`` into numpy
  arrays; ``dispatch_into`` with page-locked inputs and outputs (``vyre_cuda.pinned_empty``);
  ``dispatch_async`` until the pending handle returns, and with ``.result()``. The backend's
  allocation counters give the allocations per dispatch.
* **the streamed route** (:mod:`vyre_cuda.profile.streamed`): the vecadd declared elementwise,
  ``dispatch_into`` with ``DispatchConfig(streamed=True)`` from numpy and page-locked arrays, and
  the route the planner picks unforced; at 256 MiB a compute-heavy kernel's streamed round trip,
  its compute alone and its transfers alone.
* **the floor** (``vyre_cuda.profile._floor``): the same driver calls from a minimal C loop,
  one copy per buffer (the per-buffer floor) through pinned staging (and its enqueue part), the
  driver's own pageable path, issued straight from and into page-locked arrays with no host copy,
  and the host time of one ``cuLaunchKernel``; and the tight floor (:mod:`vyre_cuda.profile.tight`):
  both inputs in one copy, the launch, one copy back and the fastest of three waits, issued and as
  a graph replay, in this process and in a standalone C process (small sizes).
* **the ceilings**: DMA from and to pinned memory, each direction alone and both at once, and
  host memcpy pageable -> pinned and pinned -> pageable on 1 and N threads, of the same bytes.
* **peers**, when importable: cuda.bindings Python driver calls, CuPy ``RawKernel``, PyTorch
  eager add and cuda.core ``launch``; a missing peer is skipped by name.
* **data already on the device**: vyre_cuda on the peers' own arrays (``dispatch_into`` on CuPy
  arrays and torch tensors, ``outputs="device"``, the ``dispatch_async`` enqueue on a caller's
  stream) beside each peer's kernel and synchronize; and the numpy round trip with a new, equal
  Program built for every dispatch.
* **thread scaling**: throughput from 1, 2 and 4 Python threads, vyre_cuda against the floors.
* **the patterns users are taught** (:mod:`vyre_cuda.profile.patterns`, ``patterns=True``; a
  :class:`PatternResult` in ``report.patterns``): the README's enqueue chain beside cuda.core,
  CuPy and PyTorch chains, dropped and kept ``dispatch_async``, 1,000 in flight, ``await``
  against the blocking dispatch, the CPU used while a long kernel is awaited, and a
  ``device_memory_budget`` sweep of the streamed route.

Every time is a median with p10 and p90, given beside its GB/s (see
:mod:`vyre_cuda.profile.report` for the definitions) and as a ratio to the floor of the same
run; the targets are ratios within the run (:mod:`vyre_cuda.profile.targets`).

>>> from vyre_cuda.profile import run_profile
>>> report = run_profile(sizes=("4KiB", "64MiB"))            # doctest: +SKIP
>>> print(report.format_table())                             # doctest: +SKIP
>>> report.plot("profile.png")                               # doctest: +SKIP

The floor extension is imported only by a run, never by ``import vyre_cuda`` or this package.
"""

from .cli import add_arguments, main
from .engine import WrongResult
from .report import SCHEMA, PatternResult, ProfileReport, SizeResult, Target, ThreadScaling
from .run import DEFAULT_SIZES, run_profile
from .specs import (
    format_size,
    load_user_program,
    parse_buffer_spec,
    parse_size,
    parse_sizes,
)
from .stats import Summary, gain, gbps, median, percentile, ratio, summarize, throughput
from .systems import PEERS, STAGE_NAMES, UNATTRIBUTED
from .targets import evaluate_targets

__all__ = [
    "DEFAULT_SIZES",
    "PEERS",
    "SCHEMA",
    "STAGE_NAMES",
    "UNATTRIBUTED",
    "PatternResult",
    "ProfileReport",
    "SizeResult",
    "Summary",
    "Target",
    "ThreadScaling",
    "WrongResult",
    "add_arguments",
    "evaluate_targets",
    "format_size",
    "gain",
    "gbps",
    "load_user_program",
    "main",
    "median",
    "parse_buffer_spec",
    "parse_size",
    "parse_sizes",
    "percentile",
    "ratio",
    "run_profile",
    "summarize",
    "throughput",
]
