"""The terminal table of a :class:`~vyre_cuda.profile.ProfileReport`."""

from __future__ import annotations

from .._validate import is_int
from . import systems
from .specs import MIB, format_size
from .stats import ratio

__all__ = ["STAGE_TOLERANCE", "driver_text", "format_report", "pattern_lines"]

# The stage clocks must account for the measured wall time within this fraction (medians).
STAGE_TOLERANCE = 0.10
_LABEL_WIDTH = 48
LEGEND = (
    "GB/s: 10^9 bytes per second. A full dispatch's GB/s is effective: (input + output bytes) / "
    "median wall;\na ceiling's is the bytes it moves / its median. x floor: median over the "
    "floor's (full, enqueue part\nor launch only, as fits); x pageable: over the driver's "
    "pageable path; x vyre: a peer's median over\nvyre_cuda dispatch's. streamed: the vecadd declared "
    "elementwise, dispatch_into with DispatchConfig(streamed=True);\nheavy: 400 __sinf steps per "
    "element, streamed, page-locked (see vyre_cuda.profile.streamed)."
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


def header_lines(report) -> list:
    m = report.meta
    cc = m.get("cc")
    cc_text = f", cc {cc[0]}.{cc[1]}" if cc else ""
    release = f" ({m['driver_release']})" if m.get("driver_release") else ""
    lines = [
        (
            f"vyre_cuda profile: {m.get('device_name', '?')} (device {m.get('device', '?')}"
            f"{cc_text}), CUDA driver {driver_text(m.get('driver_version'))}{release}"
        ),
        (
            f"{m.get('date', '?')}, commit {m.get('commit') or 'unknown'}, vyre_cuda "
            f"{m.get('vyre_cuda_version', '?')}, Python {m.get('python', '?')}"
        ),
        (
            f"program: {m.get('program', '?')}; floor: {m.get('floor', 'vecadd C loop')}, same "
            f"run; {m.get('rounds', '?')} interleaved rounds"
        ),
    ]
    if m.get("host_threads"):
        lines.append(
            f"host memcpy ceilings on {' and '.join(map(str, m['host_threads']))} "
            f"thread(s); {m.get('cpu_count', '?')} CPUs"
        )
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
    u = unit.name
    lines = [
        (
            f"{format_size(s.nbytes)} per buffer ({s.elements:,} float32 elements for the floor, "
            f"{format_size(n_in)} in + {format_size(n_out)} out; {s.iterations:,} samples per "
            "system)"
        ),
        (
            f"  {'system':<{_LABEL_WIDTH}}{'median ' + u:>12}{'p10 ' + u:>11}{'p90 ' + u:>11}"
            f"{'GB/s':>8}{'x floor':>9}{'x pageable':>11}{'x vyre':>8}"
        ),
    ]
    vyre = s.median("vyre.dispatch")
    for key in keys:
        sm = s.systems[key]
        full = systems.traffic_kind(key) == systems.FULL
        vs_vyre = ""
        if key.startswith("peer.") and full:
            vs_vyre = _x(ratio(sm.median, vyre))
        vs_pageable = _x(s.ratio(key, "floor.pageable")) if full else ""
        lines.append(
            f"  {systems.label(key):<{_LABEL_WIDTH}}{unit(sm.median):>12}{unit(sm.p10):>11}"
            f"{unit(sm.p90):>11}{_gb(s.gbps(key)):>8}{_x(s.ratio(key)):>9}{vs_pageable:>11}"
            f"{vs_vyre:>8}"
        )
    for name, reason in sorted(s.skipped.items()):
        lines.append(f"  skipped {name}: {reason}")
    if s.planner:
        why = s.planner.get("reason")
        lines.append(
            f"  route of an unforced dispatch of the elementwise vecadd: {s.planner.get('route') or '?'}"
            + (f" ({why})" if why else "")
        )
    if s.stages:
        lines += [""] + _stage_lines(report, s, unit)
    lines += _telemetry_lines(s)
    return lines


def _stage_lines(report, s, unit) -> list:
    wall = s.wall
    u = unit.name
    lines = [
        (
            f"  {'stages of a vyre_cuda dispatch':<{_LABEL_WIDTH}}{'median ' + u:>12}"
            f"{'p10 ' + u:>11}{'p90 ' + u:>11}{'share':>8}"
        )
    ]
    for name in list(report.stage_names) + [systems.UNATTRIBUTED]:
        sm = s.stages.get(name)
        if sm is None:
            continue
        share = ratio(sm.median, wall)
        label = "unattributed (wall - stages)" if name == systems.UNATTRIBUTED else name
        lines.append(
            f"  {label:<{_LABEL_WIDTH}}{unit(sm.median):>12}{unit(sm.p10):>11}"
            f"{unit(sm.p90):>11}{'' if share is None else f'{share:.1%}':>8}"
        )
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
    moved = [(k, t.get(k)) for k in ("staged_h2d_bytes", "direct_h2d_bytes", "staged_d2h_bytes", "direct_d2h_bytes")]
    if all(v is not None for _, v in moved):
        v = dict(moved)
        lines.append(
            f"  H2D staged {v['staged_h2d_bytes'] / MIB:,.1f} MiB, direct "
            f"{v['direct_h2d_bytes'] / MIB:,.1f} MiB; D2H staged "
            f"{v['staged_d2h_bytes'] / MIB:,.1f} MiB, direct {v['direct_d2h_bytes'] / MIB:,.1f} "
            "MiB (all timed dispatches)"
        )
    if t.get("ring_bytes") is not None:
        text = f"  staging ring: {t['ring_bytes'] / MIB:,.1f} MiB pinned"
        if t.get("ring_chunks") is not None:
            text += f", {t['ring_chunks']:,} windows through it in the timed dispatches"
        if t.get("copy_threads_live") is not None:
            text += f"; {t['copy_threads_live']} copy threads"
        lines.append(text)
    return lines


def thread_lines(report) -> list:
    t = report.threads
    if t is None:
        return []

    def per_s(v):
        return "-" if v is None else f"{v:,.0f}"

    counts = sorted(set(t.vyre) | set(t.floor) | set(t.tight))
    rows = [("per-buffer floor", t.floor), ("tight floor", t.tight), ("vyre_cuda", t.vyre)]
    return [
        f"up to {t.threads} Python threads, {format_size(t.nbytes)} per buffer, {t.iterations:,} dispatches per thread",
        f"  {'dispatches per second':<24}" + "".join(f"{f'{c} thread' + ('s' if c != 1 else ''):>14}" for c in counts),
        *(f"  {name:<24}" + "".join(f"{per_s(rates.get(c)):>14}" for c in counts) for name, rates in rows if rates),
        f"  {'vyre_cuda / tight floor':<24}" + "".join(f"{_x(t.rate_ratio(c)) or '-':>14}" for c in counts),
    ]


def pattern_lines(report) -> list:
    """The patterns users are taught (:mod:`vyre_cuda.profile.patterns`): their series, the idle
    CPU of a long await, the device_memory_budget sweep and what was skipped."""
    p = report.patterns
    if p is None:
        return []
    st = p.settings
    size = format_size(st["nbytes"]) if st.get("nbytes") else "?"
    steps = f"{st['steps']:,}" if st.get("steps") else "?"
    lines = [
        f"patterns users are taught ({size} per buffer; per chain step, call, await or gathered dispatch; "
        f"{steps} steps or calls per repetition)"
    ]
    if p.systems:
        keys = sorted(p.systems, key=systems.pattern_order)
        unit = _Unit([p.systems[k].median for k in keys])
        u = unit.name
        lines.append(f"  {'system':<{_PATTERN_WIDTH}}{'median ' + u:>12}{'p10 ' + u:>11}{'p90 ' + u:>11}{'n':>7}")
        for key in keys:
            sm = p.systems[key]
            lines.append(
                f"  {systems.pattern_label(key):<{_PATTERN_WIDTH}}{unit(sm.median):>12}{unit(sm.p10):>11}"
                f"{unit(sm.p90):>11}{sm.n:>7,}"
            )
    v = p.values
    if v.get("await_idle_cpu") is not None:
        text = (
            f"  process CPU / wall while one {v.get('spin_wall_s', 0.0):.2f} s kernel runs: awaited "
            f"{v['await_idle_cpu']:.2%}, blocking result() {v.get('blocking_idle_cpu', float('nan')):.2%}"
        )
        lines.append(text)
        if v.get("idle_await_counts_per_s"):
            lines.append(f"  await counters while it ran: {_counts(v['idle_await_counts_per_s'], 'a second')}")
    if v.get("await_counts_per_await"):
        lines.append(f"  await counters of the {size} awaits: {_counts(v['await_counts_per_await'], 'per await')}")
    lines += _budget_lines(p)
    for name, reason in sorted(p.skipped.items()):
        lines.append(f"  skipped {name}: {reason}")
    return lines


_PATTERN_WIDTH = 64


def _counts(counts: dict, unit: str) -> str:
    """``polls 3.10, spun 1.00 per await``: counters of vyre_cuda's awaits (``vyre_cuda._aio.stats``)."""
    return ", ".join(f"{k} {v:,.2f}" for k, v in counts.items()) + f" {unit}"


def _budget_lines(p) -> list:
    if not p.budgets:
        return []
    size = p.settings.get("budget_bytes")
    base = next((b for b in p.budgets if b.get("budget") is None), None)
    lines = [
        "  device_memory_budget sweep: the elementwise vecadd, "
        f"3 x {format_size(size) if size else '?'} from numpy, dispatch_into, DispatchConfig(streamed=True)",
        f"  {'budget':<16}{'median ms':>12}{'p10 ms':>11}{'p90 ms':>11}{'GB/s':>8}{'x unbudgeted':>14}{'chunks':>9}",
    ]
    for b in p.budgets:
        name = systems.budget_name(b.get("budget"))
        vs = "" if base is None else _x(ratio(b.get("gbps"), base.get("gbps")))
        chunks = b.get("chunks")
        lines.append(
            f"  {name:<16}{b['median_ns'] / 1e6:>12,.2f}{b['p10_ns'] / 1e6:>11,.2f}{b['p90_ns'] / 1e6:>11,.2f}"
            f"{_gb(b.get('gbps')):>8}{vs:>14}{'' if chunks is None else f'{chunks:,}':>9}"
        )
    stop = p.budget_stop
    reason = stop.get("reason")
    if reason == "refused":
        text = f"  stopped: device_memory_budget={stop['budget']:,} refused ({stop.get('message', '')})"
        named = stop.get("smallest")
        if named is not None and p.budget(named) is not None:
            text += f"; the smallest budget it names, {named:,}, is measured above"
        elif named is not None:
            text += f"; the smallest budget it names, {named:,}, was refused too ({stop.get('named_refused', '')})"
        lines.append(text)
    elif reason == "slow":
        lines.append(
            f"  stopped: device_memory_budget={stop['budget']:,} took {stop['seconds']:.2f} s (measured once); "
            "no smaller budget tried"
        )
    elif reason == "bound":
        lines.append(f"  stopped at the sweep's smallest budget, {stop['budget']:,} bytes")
    return lines


def target_status(t) -> str:
    """``met``, ``MISSED``, ``report`` (no limit) or ``n/a`` (not measured)."""
    if t.op == "report":
        return "report"
    if t.value is None:
        return "n/a"
    return "met" if t.met else "MISSED"


def target_value(t) -> str:
    if t.value is None:
        return "-"
    if t.unit == "x":
        return f"{t.value:.2f}x"
    if t.unit:
        return f"{t.value:.2f} {t.unit}"
    return f"{t.value:.3g}"


def target_lines(report) -> list:
    if not report.targets:
        return []
    lines = ["targets (ratios within this run)"]
    for t in report.targets:
        limit = "" if t.op == "report" else f" (target {t.op} {t.limit:g})"
        if t.op != "report" and t.low is not None:
            limit = f" (target {t.low:g} to {t.limit:g})"
        kept = f"; {t.kept}" if t.kept else ""
        lines.append(f"  [{target_status(t):^6}] {t.description}: {target_value(t)}{limit}{kept}")
        if t.note and (t.kept or t.met is False):
            lines.append(f"           {'how' if t.kept else 'why'}: {t.note}")
    return lines


def format_report(report) -> str:
    """The whole table: header, one block per size, threads, targets."""
    blocks = [header_lines(report) + [LEGEND]]
    blocks += [size_lines(report, s) for s in report.sizes]
    blocks += [b for b in (thread_lines(report), pattern_lines(report), target_lines(report)) if b]
    return "\n\n".join("\n".join(line.rstrip() for line in b) for b in blocks) + "\n"
