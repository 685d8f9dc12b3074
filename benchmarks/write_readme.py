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

from vyre_cuda.profile import ProfileReport, _driver_text  # noqa: E402

README = HERE / "README.md"
BEGIN = (
    "<!-- results:begin (written by benchmarks/write_readme.py from a result JSON; do not edit) -->"
)
END = "<!-- results:end -->"


def _status(target) -> str:
    met = target.met
    if met is None:
        return "reported"
    return "met" if met else "**missed**"


def render_results(report: ProfileReport, source=None) -> str:
    """The Markdown of the results section: where and when, the targets, the harness table."""
    m = report.meta
    cc = m.get("cc") or ["?", "?"]
    release = f" ({m['driver_release']})" if m.get("driver_release") else ""
    lines = [
        f"Measured {m.get('date', '?')} on **{m.get('device_name', '?')}** (cc {cc[0]}.{cc[1]}), "
        f"CUDA driver {_driver_text(m.get('driver_version'))}{release}, commit "
        f"`{m.get('commit') or 'unknown'}`, vyre_cuda {m.get('vyre_cuda_version', '?')}, "
        f"Python {m.get('python', '?')}, numpy {m.get('numpy', '?')}, cuda-bindings "
        f"{m.get('cuda_bindings', '?')}.",
    ]
    peers = {k: v for k, v in (m.get("peers") or {}).items() if v}
    if peers:
        lines[0] += " Peers: " + ", ".join(f"{k} {v}" for k, v in sorted(peers.items())) + "."
    if source is not None:
        lines.append(f"Source: `{_relative(source)}`.")
    if report.targets:
        lines += ["", "| target | value | limit | status |", "|---|---|---|---|"]
        for t in report.targets:
            value = "-" if t.value is None else f"{t.value:.2f}"
            limit = "-" if t.op == "report" else f"{t.op} {t.limit}"
            lines.append(f"| {t.description} | {value} | {limit} | {_status(t)} |")
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
            "the README has no results markers; restore the two lines\n"
            f"{BEGIN}\n{END}\nwhere the results go"
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
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when the README differs from the result")
    args = parser.parse_args(argv)
    report = ProfileReport.from_json(args.result.read_text())
    if args.check:
        current = args.readme.read_text()
        return 0 if replace_section(current, render_results(report, args.result)) == current else 1
    changed = update_readme(args.readme, report, source=args.result)
    print(f"{args.readme}: {'updated' if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
