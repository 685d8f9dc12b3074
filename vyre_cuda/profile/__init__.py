"""``vyre-cuda profile``: where each microsecond and each byte of a dispatch goes, beside the C
driver floor and the physical ceilings.

One :func:`run_profile` call measures, in the same process and interleaved round by round, at each
size (bytes per buffer; vecadd moves two inputs in and one output out):

* **vyre_cuda**: ``dispatch`` from numpy arrays; the same with the core's stage clocks on, split
  into stages plus the *unattributed* remainder; ``dispatch_into`` numpy and page-locked arrays;
  ``dispatch_async`` enqueue and with ``.result()``; the allocations per dispatch.
* **the floors** (``vyre_cuda.profile._floor``): the same driver calls from a minimal C loop, one
  copy per buffer through pinned staging (and its enqueue part), the driver's pageable path, from
  page-locked arrays, one ``cuLaunchKernel``; the tight floor (:mod:`.tight`), issued and replayed.
* **the ceilings** (``vyre_cuda.profile._ceilings``, on the floor's buffers): DMA each direction
  and both at once; host memcpy on 1 and N threads.

Every time is a median with p10 and p90, beside its GB/s (:mod:`.report`) and its ratio to the
floor of the same run. Peers, thread scaling, taught patterns and targets are the benchmark
record's (``benchmarks/`` in the source repository), built on this package.

>>> from vyre_cuda.profile import run_profile
>>> report = run_profile(sizes=("4KiB", "64MiB"))            # doctest: +SKIP
>>> print(report.format_table())                             # doctest: +SKIP
>>> report.plot("profile.png")                               # doctest: +SKIP

The floor and ceiling extensions are imported only by a run, never by ``import vyre_cuda`` or this
package.
"""

from .cli import add_arguments, main
from .engine import WrongResult
from .report import SCHEMA, ProfileReport, SizeResult
from .run import DEFAULT_SIZES, run_profile
from .specs import format_size, load_user_program, parse_buffer_spec, parse_size, parse_sizes
from .stats import Summary, gbps, median, percentile, ratio, summarize
from .systems import STAGE_NAMES, UNATTRIBUTED

__all__ = [
    "DEFAULT_SIZES",
    "SCHEMA",
    "STAGE_NAMES",
    "UNATTRIBUTED",
    "ProfileReport",
    "SizeResult",
    "Summary",
    "WrongResult",
    "add_arguments",
    "format_size",
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
]
