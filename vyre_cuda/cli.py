"""Command line: ``vyre-cuda info | selftest | profile | cache | tune``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from typing import Any

import numpy as np

from . import __version__
from .errors import NO_DRIVER_FIX, BackendError, DriverUnavailable

__all__ = [
    "EXIT_FAILURE",
    "EXIT_NO_GPU",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_USAGE",
    "exit_status_epilog",
    "main",
    "selftest_cases",
]

# Exit statuses, the same for every command (README, Command line; `vyre-cuda --help`).
EXIT_OK = 0
EXIT_FAILURE = 1  # the command ran and failed: a self-test mismatch, a vyre_cuda error
EXIT_USAGE = 2  # bad arguments (argparse's own status)
EXIT_NO_GPU = 3  # no usable CUDA driver or device

DESCRIPTION = "vyre-cuda: inspect the CUDA driver and device, self-test, profile, tune and manage the kernel cache."

# What each status means for each command, in its `--help` (only the statuses it can end with);
# None: the shared meanings, in `vyre-cuda --help`.
EXIT_STATUSES: dict[str | None, tuple[tuple[int, str], ...]] = {
    None: (
        (EXIT_OK, "success"),
        (EXIT_FAILURE, "the command failed (a self-test mismatch, a vyre_cuda error)"),
        (EXIT_USAGE, "usage error (unknown command or option)"),
        (EXIT_NO_GPU, "no usable CUDA driver or device (info and selftest still print what they can)"),
    ),
    "info": (
        (EXIT_OK, "success: the driver and device were described"),
        (EXIT_FAILURE, "the device could not be opened (a vyre_cuda error, e.g. --device names no device)"),
        (EXIT_USAGE, "usage error (unknown option, --device not an integer)"),
        (EXIT_NO_GPU, "no usable CUDA driver or device (what can be found is still printed; --json still prints JSON)"),
    ),
    "selftest": (
        (EXIT_OK, "success: every built-in program matched numpy"),
        (EXIT_FAILURE, "the command failed: a program's output differed from numpy, or a vyre_cuda error"),
        (EXIT_USAGE, "usage error (unknown option)"),
        (EXIT_NO_GPU, "no usable CUDA driver or device (the programs were only compiled and planned)"),
    ),
    "cache": (
        (EXIT_OK, "success: the cache was shown or cleared"),
        (EXIT_FAILURE, "the command failed (a vyre_cuda error)"),
        (EXIT_USAGE, "usage error (an action other than info or clear, unknown option)"),
    ),
    "tune": (
        (EXIT_OK, "success: measured, or read from the tuning cache"),
        (EXIT_FAILURE, "the command failed (a vyre_cuda error)"),
        (EXIT_USAGE, "usage error (unknown program or option, bad --candidates, --elements or --repeats)"),
        (EXIT_NO_GPU, "no usable CUDA driver or device"),
    ),
    "profile": (
        (EXIT_OK, "success: measured, or a stored result (--from) shown"),
        (EXIT_FAILURE, "the command failed (a vyre_cuda error: a wrong result, --plot without matplotlib)"),
        (
            EXIT_USAGE,
            "usage error or invalid value (unknown option, a bad --kernel/--buffers, a --baseline "
            "or --from file that is not a profile result)",
        ),
        (EXIT_NO_GPU, "no usable CUDA driver or device (never with --from)"),
    ),
}


def exit_status_epilog(command: str | None = None) -> str:
    """The ``exit status:`` section of ``vyre-cuda [command] --help``."""
    lines = [
        textwrap.fill(text, 88, initial_indent=f"  {code}  ", subsequent_indent=" " * 5)
        for code, text in EXIT_STATUSES[command]
    ]
    return "exit status:\n" + "\n".join(lines)


def _exit_code(exc: BackendError) -> int:
    return EXIT_NO_GPU if isinstance(exc, DriverUnavailable) else EXIT_FAILURE


def _probe(device: int):
    """(report, DeviceCaps or None, exit status) for ``info``; never raises a BackendError."""
    from . import compile as vc_compile
    from .backend import CudaBackend, driver_status

    ok, status = driver_status()
    nv = vc_compile.nvrtc_version()
    info: dict[str, Any] = {
        "vyre_cuda": __version__,
        "nvrtc": ".".join(map(str, nv)) if nv else None,
        "kernel_cache": str(vc_compile.cache_dir()),
        "driver_ok": ok,
        "driver": status,  # the driver and device count, or why there is none
        "device": None,
    }
    if not ok:
        info["fix"] = NO_DRIVER_FIX
        return info, None, EXIT_NO_GPU
    try:
        with CudaBackend(device) as backend:
            caps = backend.caps
    except BackendError as exc:  # e.g. --device names no device
        info["error"] = f"{type(exc).__name__}: {exc.message}"
        info["fix"] = exc.fix
        return info, None, _exit_code(exc)
    info["device"] = caps.as_dict()
    info["devices"] = _device_list(caps)
    return info, caps, EXIT_OK


def _cmd_info(args) -> int:
    info, caps, rc = _probe(args.device)
    if args.json:  # always JSON on stdout, also without a GPU
        print(json.dumps(info, indent=2))
        return rc
    print(f"vyre_cuda {info['vyre_cuda']}")
    print(f"NVRTC: {info['nvrtc'] or 'not found'}")
    print(f"kernel cache: {info['kernel_cache']}")
    print(f"driver: {info['driver']}")
    if caps is None:
        if "error" in info:
            print(info["error"], file=sys.stderr)
        print(f"Fix: {info['fix']}", file=sys.stderr)
        return rc
    v = caps.driver_version
    print(f"device {caps.ordinal}: {caps.name} (sm_{caps.cc[0]}{caps.cc[1]}, PCI {caps.pci_bus_id})")
    print(f"  driver CUDA version     {v // 1000}.{v % 1000 // 10}")
    print(f"  multiprocessors         {caps.sm_count}")
    print(f"  global memory           {caps.total_memory:,} bytes")
    print(f"  threads per block       {caps.max_threads_per_block} (block dims {caps.max_block_dim})")
    print(f"  grid dims               {caps.max_grid_dim}")
    print(f"  shared memory per block {caps.max_shared_per_block:,} B ({caps.max_shared_per_block_optin:,} B opt-in)")
    print(f"  threads / blocks per SM {caps.max_threads_per_sm} / {caps.max_blocks_per_sm}")
    print(f"  cooperative launch      {caps.cooperative_launch}")
    print(f"  copy engines            {caps.copy_engines}")
    caps_list = [r for r in ("f16", "bf16", "subgroup", "trap", "cooperative") if caps.supports(r)]
    print(f"  capabilities            {', '.join(caps_list)}")
    print(f"visible devices: {info['devices']}")
    return EXIT_OK


def _device_list(caps) -> str:
    """Every visible device's ordinal, name, compute capability, memory (else the probed one's)."""
    from . import _driver

    def entry(k, name, cc, total):
        return f"{k} {name} (sm_{cc[0]}{cc[1]}, {total / 2**30:.0f} GiB)"

    try:
        described = [_driver.device_caps(k) for k in range(_driver.device_count())]
    except (BackendError, RuntimeError):
        return entry(caps.ordinal, caps.name, caps.cc, caps.total_memory)
    return "; ".join(entry(k, c["name"], c["cc"], c["total_memory"]) for k, c in enumerate(described))


def selftest_cases(rng):
    """(name, program, inputs, reference outputs) for the self-test, on fresh random data."""
    from . import builtin_programs as bp

    n = 100_003
    a = rng.random(n, dtype=np.float32)
    b = rng.random(n, dtype=np.float32)
    ai = rng.integers(-(2**40), 2**40, n, dtype=np.int64)
    bi = rng.integers(-(2**40), 2**40, n, dtype=np.int64)
    blocks = 37
    x = rng.integers(0, 1000, blocks * 256, dtype=np.uint32)
    s = rng.integers(0, 100, 70_001, dtype=np.uint32)
    return [
        ("vecadd_f32", bp.vecadd("f32"), [a, b], [a + b]),
        ("vecadd_i64", bp.vecadd("i64"), [ai, bi], [ai + bi]),
        ("block_sum_u32", bp.block_sum_u32(blocks), [x], [x.reshape(blocks, 256).sum(axis=1, dtype=np.uint32)]),
        ("inclusive_scan_u32", bp.inclusive_scan_u32(), [s], [np.cumsum(s, dtype=np.uint32), None]),
    ]


def _plan_offline(program, inputs):
    """Compile and plan without a device, to show the install works."""
    from .compile import compile_kernel
    from .config import DispatchConfig
    from .planning.binding import plan_bindings
    from .planning.caps import DeviceCaps
    from .planning.launch import plan_launch
    from .planning.layout import plan_layout

    caps = DeviceCaps()
    bplan = plan_bindings(program, [memoryview(x).nbytes for x in inputs])
    launch = plan_launch(program, bplan, DispatchConfig(), caps)
    compiled = compile_kernel(program.kernel, arch=None, defines={"VYRE_PHASE_WORD": str(bplan.max_binding + 2)})
    ranges = [(0, program.phases)] if program.grid_sync else [None]
    layout = plan_layout(bplan, launch, ranges)
    return compiled, launch, layout


def _cmd_selftest(args) -> int:
    from .backend import driver_status

    rng = np.random.default_rng()
    cases = selftest_cases(rng)
    ok, status = driver_status()
    if not ok:
        print("no usable GPU: compiling and planning the built-in programs only")
        for name, program, inputs, _ in cases:
            compiled, launch, layout = _plan_offline(program, inputs)
            print(
                f"  {name:20s} compiled ({len(compiled.ptx or '')} chars of PTX), grid {launch.grid} "
                f"block {launch.block}, slab {layout.slab_bytes:,} B: ok"
            )
        err = DriverUnavailable(status, NO_DRIVER_FIX)
        print(f"\nDriverUnavailable: {err}", file=sys.stderr)
        return EXIT_NO_GPU
    from .backend import CudaBackend

    failures = 0
    with CudaBackend(args.device) as backend:
        print(f"device {backend.device}: {backend.caps.name}")
        for name, program, inputs, refs in cases:
            outs = backend.dispatch(program, inputs)
            good = all(ref is None or np.array_equal(out, ref) for out, ref in zip(outs, refs, strict=True))
            route = backend.plan_info(program, inputs).route.kind
            print(f"  {name:20s} {'ok' if good else 'MISMATCH'} ({route})")
            failures += not good
    print("selftest passed" if not failures else f"selftest FAILED: {failures} mismatch(es)")
    return EXIT_OK if not failures else EXIT_FAILURE


# cache_info()'s keys about the folder; the others count events of the asking process (0 here)
_DISK_KEYS = ("dir", "disk_enabled", "disk_entries", "disk_bytes")


def _cmd_cache(args) -> int:
    from . import compile as vc_compile

    if args.action == "clear":
        removed = vc_compile.clear_cache()
        print(f"removed {removed} cached kernel(s) from {vc_compile.cache_dir()}")
        return EXIT_OK
    info = vc_compile.cache_info()
    for key in _DISK_KEYS:
        if key in info:
            print(f"{key}: {info.pop(key)}")
    print(
        "per process (counts of this command's own process, so 0 here; a program reads its own "
        "with vyre_cuda.compile.cache_info()):"
    )
    for key, value in info.items():
        print(f"  {key}: {value}")
    return EXIT_OK


def tune_cases(n: int, rng) -> dict:
    """Built-in programs ``vyre-cuda tune`` measures: name -> (program, inputs of about n elements)."""
    from . import builtin_programs as bp

    blocks = max(1, n // 256)
    return {
        "vecadd_f32": lambda: (bp.vecadd("f32"), [rng.random(n, dtype=np.float32) for _ in range(2)]),
        "vecadd_f16": lambda: (
            bp.vecadd("f16"),
            [rng.random(n, dtype=np.float32).astype(np.float16) for _ in range(2)],
        ),
        "vecadd_i64": lambda: (bp.vecadd("i64"), [rng.integers(-(2**40), 2**40, n, dtype=np.int64) for _ in range(2)]),
        # its per-block sums depend on the width: every other width is rejected, the declared one stays
        "block_sum_u32": lambda: (bp.block_sum_u32(blocks), [rng.integers(0, 1000, blocks * 256, dtype=np.uint32)]),
    }


def _widths(text: str) -> tuple:
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated block widths such as 64,128,256 (got {text!r})"
        ) from None
    if not widths or any(w <= 0 for w in widths):
        raise argparse.ArgumentTypeError(f"expected positive block widths (got {text!r})")
    return widths


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer (got {text!r})")
    return value


def _cmd_tune(args) -> int:
    from .backend import CudaBackend, driver_status
    from .tuning import tune_dir

    ok, status = driver_status()
    if not ok:
        err = DriverUnavailable(status, NO_DRIVER_FIX)
        print(f"DriverUnavailable: {err}", file=sys.stderr)
        return EXIT_NO_GPU
    program, inputs = tune_cases(args.elements, np.random.default_rng())[args.program]()
    with CudaBackend(args.device) as backend:
        result = backend.tune(program, inputs, candidates=args.candidates, repeats=args.repeats, force=args.force)
        device = backend.caps.name
    if args.json:
        print(json.dumps({"program": args.program, "device": device, **dataclasses.asdict(result)}, default=str))
        return EXIT_OK
    how = "from the tuning cache (--force measures again)" if result.cached else "measured"
    print(f"{args.program} on {device}, size class {result.size_class:,} elements: {how}")
    for width in sorted({*result.timings_ns, *result.rejected}):
        if width in result.timings_ns:
            mark = "  <- fastest" if width == result.block else ""
            base = "  (declared)" if width == result.baseline else ""
            print(f"  block {width:5d}  {result.timings_ns[width] / 1000:10.1f} us{base}{mark}")
        else:
            print(f"  block {width:5d}  skipped: {result.rejected[width]}")
    print(
        f"winner: block {result.block} ({result.speedup:.2f}x the declared {result.baseline}); cached in {tune_dir()}"
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="vyre-cuda", description=DESCRIPTION, epilog=exit_status_epilog(), formatter_class=raw
    )
    parser.add_argument("--version", action="version", version=f"vyre_cuda {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, summary: str, func) -> argparse.ArgumentParser:
        # the summary heads the command's own --help too; its exit statuses close it
        description = summary[0].upper() + summary[1:] + "."
        p = sub.add_parser(
            name, help=summary, description=description, epilog=exit_status_epilog(name), formatter_class=raw
        )
        p.set_defaults(func=func, command_parser=p)  # (main shows its usage for an unknown option)
        return p

    def device_options(p: argparse.ArgumentParser, json_help: str = "") -> None:
        # the GPU commands' last options: --device, and --json where they print JSON
        p.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default: 0)")
        if json_help:
            p.add_argument("--json", action="store_true", help=json_help)

    p = command("info", "driver, device, limits and capabilities", _cmd_info)
    device_options(p, "print one JSON object (also without a GPU)")
    device_options(command("selftest", "run the built-in programs and check them against numpy", _cmd_selftest))
    summary = "show (info) or clear the kernel cache; counters other than disk_* are per process"
    p = command("cache", summary, _cmd_cache)
    p.add_argument("action", choices=["info", "clear"], nargs="?", default="info")
    summary = "measure a built-in program's block widths and cache the fastest (DispatchConfig(autotune=True))"
    p = command("tune", summary, _cmd_tune)
    p.add_argument("program", nargs="?", default="vecadd_f32", choices=sorted(tune_cases(1, None)))
    p.add_argument("--elements", type=_positive, default=1 << 22, help="input elements (default: 4194304)")
    p.add_argument(
        "--candidates",
        type=_widths,
        default=(64, 128, 256, 512, 1024),
        help="block widths (default: 64,128,256,512,1024)",
    )
    p.add_argument("--repeats", type=_positive, default=5, help="timed runs per width (default: 5)")
    p.add_argument("--force", action="store_true", help="measure again even when a cached winner exists")
    device_options(p, "print the result as one JSON object")
    from . import profile  # needs no compiled core: a run loads the floor

    summary = "per-dispatch host-cost profile against the driver floor, or a stored one (--from)"
    profile.add_arguments(command("profile", summary, profile.main))
    return parser


def main(argv=None) -> int:
    """Run ``vyre-cuda argv...`` and return its exit status (see ``EXIT_STATUSES``)."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)  # exits with EXIT_USAGE on bad arguments
    if unknown:
        # an unknown option after the command is the command's: its usage lists the right options
        given = sys.argv[1:] if argv is None else list(argv)
        before = given[: given.index(args.command)] if args.command in given else given
        owner = parser if unknown[0] in before else args.command_parser
        owner.error(f"unrecognized arguments: {' '.join(unknown)}")  # exits with EXIT_USAGE
    try:
        return args.func(args)
    except BackendError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return _exit_code(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
