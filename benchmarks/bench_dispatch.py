"""The dispatch benchmark suite: ``vyre_cuda.profile`` with the record's harness (``benchmarks/harness``).

Every ``bench_*`` function measures vyre_cuda against the C driver floor, the transfer ceilings and
the peers in the same run and returns a :class:`harness.BenchReport`. ``main`` runs
the whole suite as ONE harness run (ratios compare only within a run), prints the table, writes
the JSON result, and with ``--readme`` regenerates the results section of
``benchmarks/README.md``. The small sizes are compared with a stored baseline result
(``benchmarks/results/latest.json`` by default) for the no-regression target.

On a GPU machine, after building the extensions (``pip install -e .`` or ``python setup.py
build_ext --inplace``)::

    python benchmarks/bench_dispatch.py --readme            # full suite, JSON + README
    python benchmarks/bench_dispatch.py --sizes 4KiB,64MiB  # some sizes
    python benchmarks/bench_dispatch.py --only bandwidth    # one benchmark
    python benchmarks/bench_dispatch.py --only streamed     # the streamed route's rows and targets
    python benchmarks/bench_dispatch.py --only device       # data already on the device, the launch floor
    python benchmarks/bench_dispatch.py --only patterns     # the patterns users are taught (about a minute)

The device-resident rows (vyre_cuda on CuPy arrays and torch tensors, against CuPy, PyTorch and
cuda.core on the same arrays) run in every benchmark that measures peers, for the peers that are
importable. The patterns users are taught (``benchmarks/harness/patterns.py``) run in the suite (skip
them with ``--no-patterns``) and alone with ``--only patterns``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(HERE.parent))

from benchmarks import harness  # noqa: E402
from vyre_cuda import profile  # noqa: E402
from vyre_cuda.errors import BackendError  # noqa: E402
from vyre_cuda.profile import cli as profile_cli  # noqa: E402
from vyre_cuda.profile.plot import require_matplotlib  # noqa: E402

DEFAULT_OUT = HERE / "results" / "latest.json"
DEFAULT_BASELINE = DEFAULT_OUT
README = HERE / "README.md"
KIB, MIB, GIB = 1024, 1024 * 1024, 1024 * 1024 * 1024


def bench_small_dispatch(loops=None, backend=None, progress=None, baseline=None):
    """vecadd of 3 x 4 KiB from numpy to numpy: vyre_cuda, the floor and the peers."""
    return harness.run_bench(
        sizes=(4 * KIB,),
        iterations=loops,
        threads=False,
        backend=backend,
        progress=progress,
        baseline=baseline,
        patterns=False,
    )


def bench_large_dispatch(loops=None, backend=None, progress=None, baseline=None):
    """vecadd of 3 x 4 MiB and 3 x 64 MiB: vyre_cuda against the driver's pageable path."""
    return harness.run_bench(
        sizes=(4 * MIB, 64 * MIB),
        iterations=loops,
        threads=False,
        backend=backend,
        progress=progress,
        baseline=baseline,
        patterns=False,
    )


def bench_bandwidth(loops=None, backend=None, progress=None, baseline=None):
    """vecadd of 3 x 256 MiB and 3 x 1 GiB: GB/s per direction against the DMA and host
    memcpy ceilings, numpy and page-locked arrays."""
    return harness.run_bench(
        sizes=(256 * MIB, 1 * GIB),
        iterations=loops,
        threads=False,
        backend=backend,
        progress=progress,
        baseline=baseline,
        patterns=False,
    )


def bench_streamed(loops=None, backend=None, progress=None, baseline=None):
    """The streamed route at 4 MiB, 256 MiB and 1 GiB: the elementwise vecadd streamed from numpy
    and page-locked arrays against the DMA of both directions at once and the serial
    ``dispatch_into``, and the heavy kernel's overlap at 256 MiB."""
    return harness.run_bench(
        sizes=(4 * MIB, 256 * MIB, 1 * GIB),
        iterations=loops,
        threads=False,
        peers=False,
        backend=backend,
        progress=progress,
        baseline=baseline,
        patterns=False,
    )


def bench_device_resident(loops=None, backend=None, progress=None, baseline=None):
    """Data already on the device at 4 KiB and 64 MiB: vyre_cuda ``dispatch_into`` on CuPy arrays
    and torch tensors, ``outputs="device"``, and the ``dispatch_async`` enqueue on a caller's
    stream, against CuPy, PyTorch and cuda.core on the same arrays and the launch floor; with the
    issued floor from page-locked arrays and the rebuilt-Program row at 4 KiB."""
    return harness.run_bench(
        sizes=(4 * KIB, 64 * MIB),
        iterations=loops,
        threads=False,
        backend=backend,
        progress=progress,
        baseline=baseline,
        patterns=False,
    )


def bench_two_threads(loops=None, backend=None, progress=None, baseline=None):
    """Throughput from 1 and 2 Python threads, vyre_cuda against the floor (4 KiB)."""
    return harness.run_bench(
        sizes=(4 * KIB,),
        iterations=loops,
        peers=False,
        threads=True,
        backend=backend,
        progress=progress,
        baseline=baseline,
        patterns=False,
    )


def bench_patterns(loops=None, backend=None, progress=None, baseline=None):
    """The patterns users are taught, beside their peers (no sizes): the README's enqueue chain
    against cuda.core, CuPy and PyTorch chains, dropped and awaited ``dispatch_async``, 1,000 in
    flight, the idle CPU of a long await and the ``device_memory_budget`` sweep
    (``harness.patterns``; ``loops`` and ``baseline`` do not apply)."""
    from benchmarks.harness.patterns import run_patterns

    return run_patterns(backend=backend, progress=progress)


def bench_suite(
    loops=None,
    sizes=profile.DEFAULT_SIZES,
    warmup=None,
    device=0,
    peers=True,
    threads=True,
    progress=None,
    baseline=None,
    host_threads=None,
    backend_options=None,
    patterns=True,
) -> harness.BenchReport:
    """Everything above in one harness run: the figures quoted in README.md."""
    return harness.run_bench(
        sizes=sizes,
        iterations=loops,
        warmup=warmup,
        peers=peers,
        threads=threads,
        device=device,
        progress=progress,
        baseline=baseline,
        host_threads=host_threads,
        backend_options=backend_options,
        patterns=patterns,
    )


BENCHES = {
    "small": bench_small_dispatch,
    "large": bench_large_dispatch,
    "bandwidth": bench_bandwidth,
    "streamed": bench_streamed,
    "device": bench_device_resident,
    "threads": bench_two_threads,
    "patterns": bench_patterns,
}


def git_commit(root=HERE.parent):
    """The checkout's commit (12 hex digits, ``-dirty`` when tracked files changed), or None
    outside a git checkout. The harness records the package version; the script adds this.
    ``VYRE_CUDA_BENCH_COMMIT`` names it instead, for a tree copied to the GPU machine with a
    ``.git`` that is not its own (git would name that one's HEAD)."""
    named = os.environ.get("VYRE_CUDA_BENCH_COMMIT")
    if named:
        return named

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if head and dirty else (head or None)


def _load_write_readme():
    import importlib.util

    spec = importlib.util.spec_from_file_location("write_readme", HERE / "write_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _devices_arg(text):
    from benchmarks.harness.devices import parse_devices
    from vyre_cuda.errors import ValidationError

    try:
        return parse_devices(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser():
    parser = argparse.ArgumentParser(prog="bench_dispatch.py", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=DEFAULT_OUT,
        help=f"JSON result file (default {DEFAULT_OUT.relative_to(HERE.parent)})",
    )
    parser.add_argument(
        "--sizes",
        type=profile_cli.sizes_arg,
        default=profile.DEFAULT_SIZES,
        help="bytes per buffer (default 4KiB,4MiB,64MiB,256MiB,1GiB)",
    )
    parser.add_argument(
        "--iterations",
        type=profile_cli.count_arg(1),
        default=None,
        help="timed samples per system and size (default: scaled with the size)",
    )
    parser.add_argument("--warmup", type=profile_cli.count_arg(0), default=None)
    parser.add_argument("--device", type=profile_cli.count_arg(0), default=0)
    parser.add_argument(
        "--host-threads",
        type=profile_cli.count_arg(1),
        default=None,
        help="threads of the N-thread host memcpy ceiling",
    )
    parser.add_argument(
        "--baseline",
        type=pathlib.Path,
        default=None,
        help="stored result for the no-regression target (default "
        f"{DEFAULT_BASELINE.relative_to(HERE.parent)} when it exists)",
    )
    parser.add_argument("--no-baseline", action="store_true", help="compare with no stored result")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--no-threads", action="store_true")
    parser.add_argument("--no-patterns", action="store_true", help="skip the patterns users are taught")
    parser.add_argument(
        "--devices",
        type=_devices_arg,
        default=None,
        metavar="LIST",
        help="also measure multi-GPU scaling: DeviceGroup.map over these device ordinals (e.g. 0,1) "
        "against the first of them alone",
    )
    parser.add_argument(
        "--only", choices=sorted(BENCHES), help="run one benchmark instead of the suite (not written to README)"
    )
    parser.add_argument("--plot", type=pathlib.Path, default=None, help="also save a PNG plot")
    parser.add_argument("--readme", action="store_true", help="regenerate the results section of benchmarks/README.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 3 when a target is missed")
    parser.add_argument(
        "--commit",
        default=None,
        metavar="REV",
        help="the source commit recorded in the result (default: this checkout's, read with git)",
    )
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.only and args.readme:
        parser.error("--readme quotes the whole suite; drop --only")
    baseline = None
    if not args.no_baseline:
        baseline = args.baseline
        if baseline is None and DEFAULT_BASELINE.is_file():
            baseline = DEFAULT_BASELINE
    progress = profile_cli.ProgressLine()
    try:
        if args.plot is not None:
            require_matplotlib()  # fail before a long run, not after it
        if args.only:
            report = BENCHES[args.only](args.iterations, progress=progress, baseline=baseline)
        else:
            report = bench_suite(
                args.iterations,
                args.sizes,
                args.warmup,
                args.device,
                not args.no_peers,
                not args.no_threads,
                progress,
                baseline,
                args.host_threads,
                patterns=not args.no_patterns,
            )
        if args.devices:
            from benchmarks.harness.devices import measure_device_scaling

            report.meta["device_scaling"] = measure_device_scaling(args.devices)
    except BackendError as exc:
        progress.done()
        print(f"bench_dispatch: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    progress.done()
    report.meta["commit"] = args.commit or git_commit()
    sys.stdout.write(report.format_table())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(report.to_json() + "\n")
    tmp.replace(args.out)
    print(f"results written to {args.out}", file=sys.stderr)
    if args.plot is not None:
        report.plot(args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.readme:
        writer = _load_write_readme()
        writer.update_readme(README, report, source=args.out)
        print(f"{README} updated", file=sys.stderr)
    if args.strict and any(t.met is False for t in report.targets):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
