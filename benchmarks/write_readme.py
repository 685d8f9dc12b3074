"""Regenerate the results section of benchmarks/README.md from a benchmark result (JSON).

    python benchmarks/write_readme.py benchmarks/results/latest.json
    python benchmarks/write_readme.py benchmarks/results/latest.json --check   # exit 1 if stale

Only the text between the two result markers is replaced; everything else in the README is
written by hand. The figures are never edited by hand.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(HERE.parent))

from benchmarks.harness import BenchReport as ProfileReport  # noqa: E402 (its series labels too)
from benchmarks.harness.records import target_status, target_value  # noqa: E402
from vyre_cuda.profile import format_size  # noqa: E402
from vyre_cuda.profile.systems import label, order  # noqa: E402
from vyre_cuda.profile.table import driver_text  # noqa: E402

README = HERE / "README.md"
BEGIN = "<!-- results:begin (written by benchmarks/write_readme.py from a result JSON; do not edit) -->"
END = "<!-- results:end -->"

# columns of the round-trip table: key, heading
_ROUND_TRIP = (
    ("vyre.dispatch", "vyre_cuda, numpy"),
    ("vyre.dispatch_into", "vyre_cuda `dispatch_into`, numpy"),
    ("vyre.pinned", "vyre_cuda, page-locked"),
    ("vyre.streamed", "vyre_cuda streamed, numpy"),
    ("vyre.streamed_pinned", "vyre_cuda streamed, page-locked"),
    ("ceiling.dma_both", "DMA both directions at once"),
    ("floor.pinned", "floor, pinned staging"),
    ("floor.pageable", "driver's pageable path"),
    ("peer.cuda_bindings", "cuda.bindings"),
    ("peer.cupy", "CuPy"),
    ("peer.torch", "PyTorch"),
)


# rows of the heavy kernel's table: key, what it measures
_HEAVY = (
    ("vyre.heavy", "streamed host round trip, page-locked"),
    ("vyre.heavy_compute", "its compute alone (device-resident arrays)"),
    ("vyre.heavy_transfer", "its bytes alone (through the elementwise vecadd, streamed, page-locked)"),
)


def _status(target) -> str:
    status = target_status(target)
    text = "**missed**" if status == "MISSED" else status
    if target.kept:
        text += f" ({target.kept}: {target.note})" if target.note else f" ({target.kept})"
    elif status == "MISSED" and target.note:
        text += f": {target.note}"
    return text


def _time(ns) -> str:
    if ns is None:
        return "-"
    if ns >= 100_000_000:
        return f"{ns / 1e6:,.0f} ms"
    if ns >= 10_000_000:
        return f"{ns / 1e6:,.1f} ms"
    if ns >= 1_000_000:
        return f"{ns / 1e6:,.2f} ms"
    return f"{ns / 1e3:,.1f} us"


def _cell(s, key) -> str:
    ns = s.median(key)
    if ns is None:
        return "-"
    gb = s.gbps(key)
    return _time(ns) if gb is None else f"{_time(ns)} ({gb:.1f} GB/s)"


def _gb(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _round_trip_table(report) -> list:
    cols = [(k, h) for k, h in _ROUND_TRIP if any(k in s.systems for s in report.sizes)]
    lines = [
        (
            "Median time of one round trip (vecadd: 2 inputs in, 1 output out, per buffer size), "
            "with its effective GB/s = (input + output bytes) / time:"
        ),
        "",
        "| per buffer | " + " | ".join(h for _, h in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for s in report.sizes:
        lines.append(f"| {format_size(s.nbytes)} | " + " | ".join(_cell(s, k) for k, _ in cols) + " |")
    return lines


def _ceiling_table(report) -> list:
    keys = sorted({k for s in report.sizes for k in s.systems if k.startswith("ceiling.")}, key=order)
    if not keys:
        return []
    lines = [
        (
            "GB/s per direction: vyre_cuda from numpy arrays (stage clocks: inputs / upload, output "
            "/ readback) against the ceilings measured in the same run (the DMA of both directions at "
            "once: all the bytes / its time):"
        ),
        "",
        "| per buffer | vyre_cuda H2D | vyre_cuda D2H | "
        + " | ".join(label(k).replace(" ceiling", "") for k in keys)
        + " |",
        "|---" * (len(keys) + 3) + "|",
    ]
    for s in report.sizes:
        lines.append(
            f"| {format_size(s.nbytes)} | {_gb(s.direction_gbps('h2d'))} | "
            f"{_gb(s.direction_gbps('d2h'))} | " + " | ".join(_gb(s.gbps(k)) for k in keys) + " |"
        )
    return lines


def _heavy_table(report) -> list:
    sizes = [s for s in report.sizes if "vyre.heavy" in s.systems]
    if not sizes:
        return []
    lines = [
        (
            "The compute-heavy elementwise kernel (400 `__sinf` steps per element; the streamed route "
            "overlaps its transfers with its compute):"
        ),
        "",
        "| per buffer | row | median |",
        "|---|---|---|",
    ]
    for s in sizes:
        for key, what in _HEAVY:
            lines.append(f"| {format_size(s.nbytes)} | {what} | {_cell(s, key)} |")
    return lines


def _routes(report) -> list:
    sizes = [s for s in report.sizes if s.planner]
    if not sizes:
        return []
    cells = ", ".join(f"{format_size(s.nbytes)}: {s.planner.get('route') or '?'}" for s in sizes)
    return [f"Route the planner picks for an unforced dispatch of the elementwise vecadd: {cells}."]


def render_results(report: ProfileReport, source=None) -> str:
    """The Markdown of the results section: where and when, the targets, the summary tables
    and the harness table."""
    m = report.meta
    cc = m.get("cc") or ["?", "?"]
    release = f" ({m['driver_release']})" if m.get("driver_release") else ""
    lines = [
        (
            f"Measured {m.get('date', '?')} on **{m.get('device_name', '?')}** (cc {cc[0]}.{cc[1]}), "
            f"CUDA driver {driver_text(m.get('driver_version'))}{release}, commit "
            f"`{m.get('commit') or 'unknown'}`, vyre_cuda {m.get('vyre_cuda_version', '?')}, "
            f"Python {m.get('python', '?')}, numpy {m.get('numpy', '?')}, cuda-bindings "
            f"{m.get('cuda_bindings', '?')}."
        ),
    ]
    peers = {k: v for k, v in (m.get("peers") or {}).items() if v}
    if peers:
        lines[0] += " Peers: " + ", ".join(f"{k} {v}" for k, v in sorted(peers.items())) + "."
    base = m.get("baseline")
    if base:
        lines[0] += (
            f" Baseline for the no-regression target: commit `{base.get('commit') or '?'}` ({base.get('date', '?')})."
        )
    if source is not None:
        lines.append(f"Source: `{_relative(source)}`.")
    if report.targets:
        lines += ["", "| target | value | limit | status |", "|---|---|---|---|"]
        for t in report.targets:
            limit = "-" if t.op == "report" else f"{t.op} {t.limit:g}"
            if t.op != "report" and t.low is not None:  # a band
                limit = f"{t.low:g} to {t.limit:g}"
            lines.append(f"| {t.description} | {target_value(t)} | {limit} | {_status(t)} |")
    if report.sizes:
        lines += [""] + _round_trip_table(report)
        ceilings = _ceiling_table(report)
        if ceilings:
            lines += [""] + ceilings
        for block in (_heavy_table(report), _routes(report)):
            if block:
                lines += [""] + block
    lines += ["", "```text", report.format_table().rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


def _relative(path) -> str:
    p = pathlib.Path(path).resolve()
    try:
        return str(p.relative_to(HERE.parent))
    except ValueError:
        return str(path)


def replace_section(text: str, body: str) -> str:
    """``text`` with the part between the markers replaced by ``body``."""
    start = text.find(BEGIN)
    end = text.find(END)
    if start < 0 or end < 0 or end < start:
        raise ValueError(
            f"the README has no results markers; restore the two lines\n{BEGIN}\n{END}\nwhere the results go"
        )
    return text[: start + len(BEGIN)] + "\n" + body + text[end:]


def update_readme(readme, report: ProfileReport, source=None) -> bool:
    """Rewrite the README's results section; True when its text changed."""
    path = pathlib.Path(readme)
    old = path.read_text()
    new = replace_section(old, render_results(report, source))
    if new != old:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(new)
        tmp.replace(path)
    return new != old


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="write_readme.py", description=__doc__.split("\n")[0])
    parser.add_argument("result", type=pathlib.Path, help="a JSON file from bench_dispatch.py")
    parser.add_argument("--readme", type=pathlib.Path, default=README)
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 when the README differs from the result"
    )
    args = parser.parse_args(argv)
    report = ProfileReport.load(args.result)
    if args.check:
        current = args.readme.read_text()
        return 0 if replace_section(current, render_results(report, args.result)) == current else 1
    changed = update_readme(args.readme, report, source=args.result)
    print(f"{args.readme}: {'updated' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
