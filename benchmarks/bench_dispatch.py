"""The dispatch benchmark suite of issue 4, built on the profiling harness.

Every ``bench_*`` function measures vyre_cuda against the C driver floor (``vyre_cuda._floor``)
in the same run and returns a :class:`vyre_cuda.profile.ProfileReport`. ``main`` runs the whole
suite as ONE harness run (ratios compare only within a run), prints the table, writes the JSON
result, and with ``--readme`` regenerates the results section of ``benchmarks/README.md``.

On a GPU machine, after building the extensions (``pip install -e .`` or ``python setup.py
build_ext --inplace``)::

    python benchmarks/bench_dispatch.py --readme            # full suite, JSON + README
    python benchmarks/bench_dispatch.py --iterations 500    # quicker
    python benchmarks/bench_dispatch.py --only small        # one benchmark
"""

from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(HERE.parent))

from vyre_cuda import profile  # noqa: E402
from vyre_cuda.errors import BackendError  # noqa: E402

DEFAULT_OUT = HERE / "results" / "latest.json"
README = HERE / "README.md"
SMALL = 4 * 1024
LARGE = 4 * 1024 * 1024


def bench_small_dispatch(loops=None, backend=None, progress=None) -> profile.ProfileReport:
    """vecadd of 3 x 4 KiB from numpy to numpy: vyre_cuda, the floor and the peers."""
    return profile.run_profile(sizes=(SMALL,), iterations=loops, peers=True, threads=False,
                               backend=backend, progress=progress)


def bench_large_dispatch(loops=None, backend=None, progress=None) -> profile.ProfileReport:
    """vecadd of 3 x 4 MiB: vyre_cuda against the floor's pinned and pageable paths."""
    return profile.run_profile(sizes=(LARGE,), iterations=loops, peers=True, threads=False,
                               backend=backend, progress=progress)


def bench_two_threads(loops=None, backend=None, progress=None) -> profile.ProfileReport:
    """Throughput from 1 and 2 Python threads, vyre_cuda against the floor (4 KiB)."""
    return profile.run_profile(sizes=(SMALL,), iterations=loops, peers=False, threads=True,
                               backend=backend, progress=progress)


def bench_suite(loops=None, sizes=(SMALL, LARGE), warmup=None, device=0, peers=True,
                threads=True, progress=None) -> profile.ProfileReport:
    """Everything above in one harness run: the figures quoted in README.md."""
    return profile.run_profile(sizes=sizes, iterations=loops, warmup=warmup, peers=peers,
                               threads=threads, device=device, progress=progress)


BENCHES = {
    "small": bench_small_dispatch,
    "large": bench_large_dispatch,
    "threads": bench_two_threads,
}


def _load_write_readme():
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.spec_from_file_location("write_readme", HERE / "write_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench_dispatch.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help=f"JSON result file (default {DEFAULT_OUT.relative_to(HERE.parent)})")
    parser.add_argument("--sizes", type=profile._sizes_arg, default=(SMALL, LARGE),
                        help="bytes per buffer (default 4KiB,4MiB)")
    parser.add_argument("--iterations", type=int, default=None,
                        help="timed dispatches per system and size (default: the harness's)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--no-threads", action="store_true")
    parser.add_argument("--only", choices=sorted(BENCHES),
                        help="run one benchmark instead of the suite (not written to README)")
    parser.add_argument("--plot", type=pathlib.Path, default=None, help="also save a PNG plot")
    parser.add_argument("--readme", action="store_true",
                        help="regenerate the results section of benchmarks/README.md")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 3 when a target of issue 4 is missed")
    args = parser.parse_args(argv)
    if args.only and args.readme:
        parser.error("--readme quotes the whole suite; drop --only")
    progress = profile._ProgressLine()
    try:
        if args.only:
            report = BENCHES[args.only](args.iterations, progress=progress)
        else:
            report = bench_suite(args.iterations, args.sizes, args.warmup, args.device,
                                 not args.no_peers, not args.no_threads, progress)
    except BackendError as exc:
        progress.done()
        print(f"bench_dispatch: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    progress.done()
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
