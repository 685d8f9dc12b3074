"""``vyre-cuda profile``: its options and its main."""

from __future__ import annotations

import argparse
import contextlib
import math
import pathlib
import sys
import time

from ..errors import BackendError, DriverUnavailable, ValidationError
from .plot import require_matplotlib
from .run import DEFAULT_SIZES, run_profile
from .specs import load_user_program, parse_size, parse_sizes

__all__ = [
    "ProgressLine",
    "add_arguments",
    "backend_options",
    "count_arg",
    "eta_seconds",
    "format_eta",
    "main",
    "size_arg",
    "sizes_arg",
]


def format_eta(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h04m``: a time left, to the second below an hour.

    >>> format_eta(185.4), format_eta(7440)
    ('3m05s', '2h04m')
    """
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def eta_seconds(elapsed: float, fraction: float) -> float | None:
    """The time left when ``fraction`` of the run took ``elapsed`` seconds: the steps left times
    the time per step so far (the run's steps are its warm-ups and rounds, a share of each size);
    None before the first step has finished."""
    if not 0.0 < fraction <= 1.0:
        return None
    return elapsed * (1.0 - fraction) / fraction


class ProgressLine:
    """A one-line progress display on stderr, shown only once a run has lasted a second: the
    share done, the estimated time left and the step running."""

    def __init__(self, stream=None, delay=1.0, interval=5.0, clock=time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock, self.start, self.delay, self.interval = clock, clock(), delay, interval
        self.last, self.shown = -math.inf, False

    def __call__(self, label, fraction):
        now = self.clock()
        if now - self.start < self.delay or (not self.tty and now - self.last < self.interval):
            return
        self.last = now
        eta = eta_seconds(now - self.start, fraction)
        left = "" if eta is None else f", {format_eta(eta)} left"
        text = f"[vyre-cuda profile] {fraction:4.0%}{left}: {label}"
        self.stream.write("\r" + text[:110].ljust(110) if self.tty else text + "\n")
        self.stream.flush()
        self.shown = True

    def done(self):
        if self.shown and self.tty:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


def _arg_type(parse, doc):
    """An argparse type: ``parse(text)``, its ValidationError an argparse error."""

    def arg(text):
        try:
            return parse(text)
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    arg.__doc__ = doc
    return arg


sizes_arg = _arg_type(parse_sizes, "argparse type: a comma-separated list of sizes.")
size_arg = _arg_type(parse_size, "argparse type: one size in bytes (``8MiB``).")


def count_arg(minimum):
    """argparse type: an integer >= ``minimum``."""

    def parse(text):
        with contextlib.suppress(ValueError):
            if int(text) >= minimum:
                return int(text)
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum} (got {text!r})\nFix: pass a whole number")

    return parse


_BACKEND_OPTIONS = ("staging_chunk_bytes", "staging_chunks", "copy_threads")


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``vyre-cuda profile`` options to ``parser``."""

    def count(flag, minimum, text):
        parser.add_argument(flag, type=count_arg(minimum), metavar="N", help=text)

    parser.add_argument(
        "--sizes",
        type=sizes_arg,
        default=DEFAULT_SIZES,
        metavar="LIST",
        help="bytes per buffer, comma-separated, with K/KiB/M/MiB/G/GiB suffixes (default 4KiB,4MiB,64MiB,256MiB,1GiB)",
    )
    count(
        "--iterations",
        1,
        "timed samples per system and size (default: 2000 at 4 KiB, fewer as the size grows, 5 at 1 GiB)",
    )
    count("--warmup", 0, "untimed samples per system first (default: a tenth of --iterations, at most 200)")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write the result as JSON to FILE, or to stdout (instead of the table) without FILE",
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="save a figure: each system's time over vyre_cuda's by size, vyre_cuda's stage shares, and GB/s "
        "against the DMA and memcpy ceilings (needs matplotlib)",
    )
    parser.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE.json",
        help="show a stored result (written by --json, or a benchmark record) instead of measuring: its "
        "table, or with --plot its figure, or with --json its JSON (only what they ask for); needs no GPU",
    )
    count("--host-threads", 1, "threads of the N-thread host memcpy ceiling (default: the CPUs, at most 16)")
    parser.add_argument(
        "--kernel", metavar="FILE", help="profile a user kernel (.cu CUDA C++ or .ptx) instead of vecadd"
    )
    parser.add_argument(
        "--entry", metavar="NAME", help="the user kernel's entry point (default vyre_main, or main for PTX)"
    )
    parser.add_argument(
        "--buffers", metavar="SPEC", help="the user kernel's buffers, e.g. 'a:f32:in,b:f32:in,out:f32:out'"
    )
    parser.add_argument("--device", type=count_arg(0), default=0, metavar="N", help="CUDA device ordinal (default 0)")
    group = parser.add_argument_group("backend options (passed to CudaBackend when given)")
    group.add_argument(
        "--staging-chunk-bytes",
        type=size_arg,
        metavar="SIZE",
        help="bytes per chunk of the pinned staging ring, e.g. 8MiB",
    )
    group.add_argument("--staging-chunks", type=count_arg(1), metavar="N", help="chunks in the pinned staging ring")
    group.add_argument("--copy-threads", type=count_arg(1), metavar="N", help="the backend's host copy threads")
    return parser


def backend_options(args) -> dict:
    """The backend options given on the command line (only those given)."""
    return {name: getattr(args, name) for name in _BACKEND_OPTIONS if getattr(args, name, None) is not None}


# options that describe a measurement, and their defaults: with --from nothing is measured
_RUN_OPTIONS = {"sizes": DEFAULT_SIZES, "device": 0}
_RUN_OPTIONS.update(dict.fromkeys(("iterations", "warmup", "host_threads", "kernel", "entry", "buffers")))
_RUN_OPTIONS.update(dict.fromkeys(_BACKEND_OPTIONS))


def _show_stored(args) -> None:
    """``--from FILE``: the stored result's table, JSON or figure; no backend, no GPU."""
    from .report import ProfileReport

    given = ["--" + k.replace("_", "-") for k, default in _RUN_OPTIONS.items() if getattr(args, k, default) != default]
    if given:
        raise ValidationError(
            f"--from shows a stored result, but {', '.join(given)} "
            f"{'describes' if len(given) == 1 else 'describe'} a new measurement",
            f"drop {', '.join(given)}, or drop --from to measure",
        )
    if args.plot is not None:
        require_matplotlib()  # the same error as a measuring run's --plot, before reading the file
    # its table, or only the figure and the JSON that --plot and --json ask for
    _write_outputs(ProfileReport.load(args.from_file), args, table=args.plot is None and args.json is None)


def _write_outputs(report, args, table=True) -> None:
    """The table (or JSON) on stdout, the JSON file and the figure that ``args`` ask for;
    ``table=False`` leaves the table out (a stored result shown for its figure or JSON)."""
    if args.json == "-":
        sys.stdout.write(report.to_json() + "\n")
    else:
        if table:
            sys.stdout.write(report.format_table())
        if args.json is not None:
            pathlib.Path(args.json).write_text(report.to_json() + "\n")
            print(f"JSON written to {args.json}", file=sys.stderr)
    if args.plot is not None:
        try:
            report.plot(args.plot)
        except OSError as exc:
            raise ValidationError(
                f"cannot write the plot {args.plot!r}: {exc.strerror or exc}",
                "pass --plot a path in an existing folder you can write to",
            ) from None
        print(f"plot written to {args.plot}", file=sys.stderr)


def main(args) -> int:
    """Run ``vyre-cuda profile`` with parsed ``args``; returns the exit status of every vyre-cuda
    command (0 done, 1 a vyre_cuda error, 2 the arguments are wrong, 3 no usable driver or device)."""
    program = None
    try:
        if getattr(args, "from_file", None) is not None:
            _show_stored(args)
            return 0
        if args.kernel is not None:
            program = load_user_program(args.kernel, args.entry, args.buffers)
        elif args.buffers is not None or args.entry is not None:
            raise ValidationError(
                "--buffers and --entry describe a user kernel, but no --kernel was given",
                "pass --kernel FILE with them, or drop them to profile the built-in vecadd",
            )
        if args.plot is not None:
            require_matplotlib()  # fail before a long run, not after it
        progress = ProgressLine()
        try:
            report = run_profile(
                sizes=args.sizes,
                iterations=args.iterations,
                warmup=args.warmup,
                program=program,
                progress=progress,
                device=args.device,
                backend_options=backend_options(args),
                host_threads=args.host_threads,
            )
        finally:
            progress.done()
        _write_outputs(report, args)
    except BackendError as exc:
        if isinstance(exc, DriverUnavailable) and program is not None:
            from ..offline import offline_compile_error  # (only a run without a GPU needs it)

            exc = offline_compile_error(program) or exc  # no GPU: the kernel's compile errors still show
        print(f"vyre-cuda profile: {type(exc).__name__}: {exc}", file=sys.stderr)
        if isinstance(exc, DriverUnavailable):
            return 3
        return 2 if isinstance(exc, ValidationError) else 1
    return 0
