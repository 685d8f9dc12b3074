"""The terminal table of a :class:`~vyre_cuda.profile.ProfileReport`."""

from __future__ import annotations

from .._validate import is_int
from . import systems
from .specs import MIB, format_size
from .stats import ratio

__all__ = ["STAGE_TOLERANCE", "driver_text", "format_report", "header_lines", "size_lines"]

# The stage clocks must account for the measured wall time within this fraction (medians).
STAGE_TOLERANCE = 0.10
_LABEL_WIDTH = 48
LEGEND = (
    "GB/s: 10^9 bytes per second. A full dispatch's GB/s is effective: (input + output bytes) / "
    "median wall;\na ceiling's is the bytes it moves / its median. x floor: median over the "
    "floor's (full, enqueue part\nor launch only, as fits); x pageable: over the driver's "
    "pageable path; x vyre: a peer's median over\nvyre_cuda dispatch's (a benchmark record's peers)."
)


def driver_text(version) -> str:
    """``13.0`` from the driver's integer version (13000), or the value as text."""
    if is_int(version, numpy=False) and version > 0:
        return f"{version // 1000}.{version % 1000 // 10}"
    if isinstance(version, (tuple, list)):
        return ".".join(str(v) for v in version)
    return "?" if version in (None, "") else str(version)


def _x(value) -> str:
    return "" if value is None else f"{value:.2f}x"


def _gb(value) -> str:
    return "" if value is None else f"{value:.2f}"


class _Unit:
    """Times in us, or in ms where a size's slowest median reaches 10 ms."""

    def __init__(self, medians):
        big = max((m for m in medians if m is not None), default=0.0) >= 10_000_000
        self.name, self.scale = ("ms", 1e6) if big else ("us", 1e3)

    def __call__(self, ns) -> str:
        return "-" if ns is None else f"{ns / self.scale:,.2f}"

    def head(self, title) -> str:
        """A table's first columns: ``title``, then median, p10 and p90 in this unit."""
        return f"  {title:<{_LABEL_WIDTH}}{'median ' + self.name:>12}{'p10 ' + self.name:>11}{'p90 ' + self.name:>11}"

    def row(self, label, summary) -> str:
        """A row's first columns: ``label``, then the summary's median, p10 and p90."""
        return f"  {label:<{_LABEL_WIDTH}}{self(summary.median):>12}{self(summary.p10):>11}{self(summary.p90):>11}"


def header_lines(report) -> list:
    m = report.meta
    cc = m.get("cc")
    cc_text = f", cc {cc[0]}.{cc[1]}" if cc else ""
    release = f" ({m['driver_release']})" if m.get("driver_release") else ""
    device = f"{m.get('device_name', '?')} (device {m.get('device', '?')}{cc_text})"
    lines = [
        f"vyre_cuda profile: {device}, CUDA driver {driver_text(m.get('driver_version'))}{release}",
        f"{m.get('date', '?')}, commit {m.get('commit') or 'unknown'}, vyre_cuda {m.get('vyre_cuda_version', '?')}"
        + f", Python {m.get('python', '?')}",
        f"program: {m.get('program', '?')}; floor: {m.get('floor', 'vecadd C loop')}, same run; "
        + f"{m.get('rounds', '?')} interleaved rounds",
    ]
    if m.get("host_threads"):
        threads = " and ".join(map(str, m["host_threads"]))
        lines.append(f"host memcpy ceilings on {threads} thread(s); {m.get('cpu_count', '?')} CPUs")
    options = m.get("backend_options") or {}
    if options:
        lines.append("backend: " + ", ".join(f"{k}={v}" for k, v in sorted(options.items())))
    base = m.get("baseline")
    if base:
        lines.append(f"baseline: {base.get('path', '?')} (commit {base.get('commit') or '?'}, {base.get('date', '?')})")
    return lines


def size_lines(report, s) -> list:
    n_in, n_out = s.bytes_of("floor")
    keys = sorted(s.systems, key=systems.order)
    unit = _Unit([s.systems[k].median for k in keys])
    lines = [
        f"{format_size(s.nbytes)} per buffer ({s.elements:,} float32 elements for the floor, "
        + f"{format_size(n_in)} in + {format_size(n_out)} out; {s.iterations:,} samples per system)",
        unit.head("system") + f"{'GB/s':>8}{'x floor':>9}{'x pageable':>11}{'x vyre':>8}",
    ]
    vyre = s.median("vyre.dispatch")
    for key in keys:
        sm = s.systems[key]
        full = systems.traffic_kind(key) == systems.FULL
        vs_vyre = _x(ratio(sm.median, vyre)) if key.startswith("peer.") and full else ""
        vs_pageable = _x(s.ratio(key, "floor.pageable")) if full else ""
        ratios = f"{_gb(s.gbps(key)):>8}{_x(s.ratio(key)):>9}{vs_pageable:>11}{vs_vyre:>8}"
        lines.append(unit.row(systems.label(key), sm) + ratios)
    for name, reason in sorted(s.skipped.items()):
        lines.append(f"  skipped {name}: {reason}")
    if s.planner:
        why = f" ({s.planner['reason']})" if s.planner.get("reason") else ""
        lines.append(f"  route of an unforced dispatch of the elementwise vecadd: {s.planner.get('route') or '?'}{why}")
    if s.stages:
        lines += [""] + _stage_lines(report, s, unit)
    lines += _telemetry_lines(s)
    return lines


def _stage_lines(report, s, unit) -> list:
    wall = s.wall
    u = unit.name
    lines = [unit.head("stages of a vyre_cuda dispatch") + f"{'share':>8}"]
    for name in list(report.stage_names) + [systems.UNATTRIBUTED]:
        sm = s.stages.get(name)
        if sm is None:
            continue
        share = ratio(sm.median, wall)
        label = "unattributed (wall - stages)" if name == systems.UNATTRIBUTED else name
        lines.append(unit.row(label, sm) + f"{'' if share is None else f'{share:.1%}':>8}")
    cov = s.coverage
    if cov is not None:
        ok = abs(cov - 1.0) <= STAGE_TOLERANCE
        lines.append(
            f"  sum of stages {unit(s.attributed.median)} {u} / wall {unit(wall)} {u} = "
            f"{cov:.3f} (medians; within {STAGE_TOLERANCE:.0%}: {'yes' if ok else 'NO'})"
        )
    up, down = s.directions.get("h2d"), s.directions.get("d2h")
    if up is not None and down is not None:
        lines.append(
            f"  per direction: upload ({' + '.join(systems.UPLOAD_STAGES)}) {unit(up.median)} "
            f"{u} = H2D {_gb(s.direction_gbps('h2d')) or '-'} GB/s; readback "
            f"({' + '.join(systems.READBACK_STAGES)}) {unit(down.median)} {u} = D2H "
            f"{_gb(s.direction_gbps('d2h')) or '-'} GB/s"
        )
    return lines


def _telemetry_lines(s) -> list:
    t = s.telemetry
    if not t.get("dispatches"):
        return []
    counted = "pinned_alloc_calls" in t
    parts = []
    for kind in ("pinned", "device"):
        calls = t.get(f"{kind}_alloc_calls", t.get(f"{kind}_pool_misses"))
        if calls is not None:
            parts.append(f"{kind} {calls:,} ({s.allocations_per_dispatch(kind):.3g} per dispatch)")
    text = (
        f"  allocations in {t['dispatches']:,} timed vyre_cuda dispatches: "
        + (", ".join(parts) or "not counted by this core")
        + ("" if counted or not parts else " (pool misses: the core does not count allocations)")
    )
    lines = [text]
    moved = [t.get(k) for k in ("staged_h2d_bytes", "direct_h2d_bytes", "staged_d2h_bytes", "direct_d2h_bytes")]
    if None not in moved:
        h2d, h2d_direct, d2h, d2h_direct = (f"{v / MIB:,.1f} MiB" for v in moved)
        text = f"  H2D staged {h2d}, direct {h2d_direct}; D2H staged {d2h}, direct {d2h_direct}"
        lines.append(text + " (all timed dispatches)")
    if t.get("ring_bytes") is not None:
        text = f"  staging ring: {t['ring_bytes'] / MIB:,.1f} MiB pinned"
        if t.get("ring_chunks") is not None:
            text += f", {t['ring_chunks']:,} windows through it in the timed dispatches"
        if t.get("copy_threads_live") is not None:
            text += f"; {t['copy_threads_live']} copy threads"
        lines.append(text)
    return lines


def format_report(report, blocks=()) -> str:
    """The whole table: header, one block per size, then ``blocks`` (lists of lines a benchmark
    adds)."""
    parts = [header_lines(report) + [LEGEND]] + [size_lines(report, s) for s in report.sizes]
    parts += [b for b in blocks if b]
    return "\n\n".join("\n".join(line.rstrip() for line in b) for b in parts) + "\n"
