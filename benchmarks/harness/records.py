"""The benchmark record's own parts: targets, thread scaling, the taught patterns, their series
labels and table blocks, and :class:`BenchReport` (a :class:`~vyre_cuda.profile.ProfileReport`
carrying them, same JSON schema)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vyre_cuda.profile import systems
from vyre_cuda.profile.report import ProfileReport
from vyre_cuda.profile.specs import format_size
from vyre_cuda.profile.stats import Summary, ratio
from vyre_cuda.profile.table import _gb, _Unit, _x, format_report

__all__ = [
    "PATTERN_LABELS",
    "BenchReport",
    "PatternResult",
    "Target",
    "ThreadScaling",
    "budget_name",
    "gain",
    "pattern_label",
    "target_lines",
    "target_status",
    "target_value",
    "throughput",
]

FULL = systems.FULL
# the benchmark's series, registered into the profile's table (key, label, reference, traffic)
systems.register(
    (
        ("floor.standalone", "standalone C process: tight floor, fastest", "floor.pinned", FULL),
        ("floor.standalone.spin", "standalone C process: tight, spin", "floor.pinned", FULL),
        ("floor.standalone.event", "standalone C process: tight, event sync", "floor.pinned", FULL),
        ("floor.standalone.stream", "standalone C process: tight, stream sync", "floor.pinned", FULL),
        ("floor.standalone_graph", "standalone C process: graph replay, fastest", "floor.pinned", FULL),
        ("floor.standalone_graph.spin", "standalone C process: graph, spin", "floor.pinned", FULL),
        ("floor.standalone_graph.event", "standalone C process: graph, event sync", "floor.pinned", FULL),
        ("floor.standalone_graph.stream", "standalone C process: graph, stream sync", "floor.pinned", FULL),
    ),
    after="floor.tight_graph.stream",
)
systems.register(
    (
        # a new (equal) Program object built for every dispatch: what a plan lookup by value costs
        ("vyre.rebuilt", "vyre_cuda dispatch, Program rebuilt per call", "floor.pinned", FULL),
    ),
    after="vyre.dispatch",
)
systems.register(
    (
        # the elementwise vecadd on the streamed route (DispatchConfig(streamed=True)), dispatch_into
        ("vyre.streamed", "vyre_cuda streamed, numpy", "floor.pinned", FULL),
        ("vyre.streamed_pinned", "vyre_cuda streamed, page-locked", "floor.pinned", FULL),
        # the compute-heavy elementwise kernel (its own kernel: no floor of this harness runs it)
        ("vyre.heavy", "heavy kernel streamed, page-locked", None, FULL),
        ("vyre.heavy_transfer", "heavy's bytes through vecadd, streamed", None, FULL),
        ("vyre.heavy_compute", "heavy kernel on device arrays (compute)", None, None),
        ("peer.cuda_bindings", "cuda.bindings Python calls, full", "floor.pinned", FULL),
        ("peer.cuda_bindings.launch_only", "cuda.bindings launch only", "floor.launch_only", None),
        ("peer.cupy", "CuPy RawKernel, full", "floor.pinned", FULL),
        ("peer.cupy.launch_only", "CuPy RawKernel launch only", "floor.launch_only", None),
        ("peer.torch", "PyTorch eager add, full", "floor.pinned", FULL),
        ("peer.torch.launch_only", "PyTorch add launch only", "floor.launch_only", None),
        # data already on the device: no transfers, so no floor of this harness to divide by
        ("vyre.device", "vyre_cuda dispatch_into, CuPy device arrays", None, None),
        ("vyre.device.zeroed", "vyre_cuda dispatch_into, CuPy arrays, output declared zeroed", None, None),
        ("vyre.device.out", "vyre_cuda dispatch, outputs='device' (CuPy in)", None, None),
        ("vyre.device.torch", "vyre_cuda dispatch_into, torch CUDA tensors", None, None),
        ("vyre.device.enqueue", "vyre_cuda dispatch_async enqueue, caller stream", "floor.launch_only", None),
        (
            "vyre.device.enqueue.foreign",
            "vyre_cuda dispatch_async enqueue, arrays of another stream",
            "floor.launch_only",
            None,
        ),
        (
            "vyre.device.enqueue.devarray",
            "vyre_cuda dispatch_async enqueue, vyre_cuda DeviceArrays",
            "floor.launch_only",
            None,
        ),
        ("peer.cupy.device", "CuPy RawKernel on device arrays + sync", None, None),
        ("peer.torch.device", "PyTorch add on device tensors + sync", None, None),
        ("peer.cuda_core.device", "cuda.core launch on device buffers + sync", None, None),
        ("peer.cuda_core.enqueue", "cuda.core launch enqueue, per launch", "floor.launch_only", None),
    )
)


@dataclass
class Target:
    """One target: ``value op limit`` (``op`` is ``<=``, ``>=``, or ``report`` for a figure
    stated without a limit), and ``value >= low`` too where ``low`` is set (a band); ``unit`` is
    how the value reads (``x``, ``GB/s``...).

    ``note`` says what the run measured that explains a miss (the physical limit), or how a
    ``kept`` target holds; ``kept`` names a condition measured in the run under which the target
    holds whatever its value (``serial kept``: the planner does not stream that size).
    """

    key: str
    description: str
    value: float | None
    limit: float | None
    op: str
    size_bytes: int | None = None
    unit: str = ""
    note: str = ""
    kept: str = ""
    low: float | None = None

    @property
    def met(self):
        if self.op == "report":
            return None
        if self.kept:
            return True
        if self.value is None or self.limit is None:
            return None
        if self.low is not None and self.value < self.low:
            return False
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "description": self.description,
            "value": self.value,
            "limit": self.limit,
            "op": self.op,
            "size_bytes": self.size_bytes,
            "unit": self.unit,
            "met": self.met,
            "note": self.note,
            "kept": self.kept,
            "low": self.low,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Target:
        return cls(
            d["key"],
            d["description"],
            d["value"],
            d["limit"],
            d["op"],
            d.get("size_bytes"),
            d.get("unit", ""),
            d.get("note", ""),
            d.get("kept", ""),
            d.get("low"),
        )


def throughput(dispatches: int, elapsed_ns: int) -> float:
    """Dispatches per second."""
    if elapsed_ns <= 0:
        raise ValueError(f"elapsed time must be > 0 ns (got {elapsed_ns})")
    return dispatches * 1e9 / elapsed_ns


def gain(one_thread, two_threads):
    """Throughput gain from 1 to 2 threads (2.0 is perfect scaling); None if unmeasured."""
    return ratio(two_threads, one_thread)


@dataclass
class ThreadScaling:
    """Dispatches per second from 1 up to ``threads`` Python threads: vyre_cuda, the per-buffer
    floor and the tight floor (its fastest wait), each thread with its own stream and buffers."""

    nbytes: int
    threads: int
    iterations: int
    vyre: dict  # thread count -> dispatches per second
    floor: dict
    tight: dict = field(default_factory=dict)

    def rate_ratio(self, count: int):
        """vyre_cuda's dispatches per second from ``count`` threads over the tight floor's."""
        return ratio(self.vyre.get(count), self.tight.get(count))

    @property
    def vyre_gain(self):
        return gain(self.vyre.get(1), self.vyre.get(self.threads))

    @property
    def floor_gain(self):
        return gain(self.floor.get(1), self.floor.get(self.threads))

    @property
    def gain_ratio(self):
        """vyre_cuda's gain over the floor's gain."""
        return ratio(self.vyre_gain, self.floor_gain)

    def to_dict(self) -> dict:
        return {
            "bytes": self.nbytes,
            "threads": self.threads,
            "iterations": self.iterations,
            "vyre_per_s": {str(k): v for k, v in self.vyre.items()},
            "floor_per_s": {str(k): v for k, v in self.floor.items()},
            "tight_per_s": {str(k): v for k, v in self.tight.items()},
            "vyre_gain": self.vyre_gain,
            "floor_gain": self.floor_gain,
            "gain_ratio": self.gain_ratio,
        }

    @classmethod
    def from_dict(cls, d: dict) -> ThreadScaling:
        return cls(
            int(d["bytes"]),
            int(d["threads"]),
            int(d["iterations"]),
            {int(k): float(v) for k, v in d["vyre_per_s"].items()},
            {int(k): float(v) for k, v in d["floor_per_s"].items()},
            {int(k): float(v) for k, v in d.get("tight_per_s", {}).items()},
        )


@dataclass
class PatternResult:
    """The patterns users are taught, measured beside their peers in the same run
    (benchmarks/harness/patterns.py).

    ``systems`` holds a :class:`Summary` (ns) per series: per chain step, per call, per await or
    per dispatch of a gather (labels: ``systems.pattern_label``). ``values`` holds the other
    figures: the process CPU time over the wall time while one long kernel is awaited or waited
    for (``await_idle_cpu``, ``blocking_idle_cpu``, ``spin_wall_s``) and the counters of
    vyre_cuda's awaits that moved (dicts: ``await_counts_per_await``, ``idle_await_counts_per_s``).
    ``budgets`` has one dict per
    ``device_memory_budget`` of the sweep (``budget`` bytes, None unbudgeted; ``median_ns``,
    ``p10_ns``, ``p90_ns``, ``n``; ``gbps``; the plan's ``chunks``, ``chunk_bytes``, ``streams``),
    ``budget_stop`` why the sweep stopped; ``skipped`` names what was not measured and why;
    ``settings`` the steps, bytes and counts of the run.
    """

    systems: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    budgets: list = field(default_factory=list)
    budget_stop: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def median(self, key):
        s = self.systems.get(key)
        return None if s is None else s.median

    def ratio(self, key, reference):
        """Median of ``key`` over the median of ``reference`` (None when either is missing)."""
        return ratio(self.median(key), self.median(reference))

    def budget(self, nbytes):
        """The sweep's entry of ``budget`` bytes (None: the unbudgeted one), or None."""
        for entry in self.budgets:
            if entry.get("budget") == nbytes:
                return entry
        return None

    def to_dict(self) -> dict:
        return {
            "systems": {k: v.to_dict() for k, v in self.systems.items()},
            "values": dict(self.values),
            "budgets": [dict(b) for b in self.budgets],
            "budget_stop": dict(self.budget_stop),
            "skipped": dict(self.skipped),
            "settings": dict(self.settings),
        }

    @classmethod
    def from_dict(cls, d: dict) -> PatternResult:
        return cls(
            systems={k: Summary.from_dict(v) for k, v in d.get("systems", {}).items()},
            values=dict(d.get("values", {})),
            budgets=[dict(b) for b in d.get("budgets", [])],
            budget_stop=dict(d.get("budget_stop", {})),
            skipped=dict(d.get("skipped", {})),
            settings=dict(d.get("settings", {})),
        )


PATTERN_LABELS = {
    "pattern.chain.kept": "README chain: dispatch_async, new CuPy output, handles kept",
    "pattern.chain.dropped": "README chain: dispatch_async, new CuPy output, handles dropped",
    "pattern.chain.taken": "README chain, handles kept, timed up to the last result() taken",
    "pattern.chain.taken.fence": "README chain, results taken, completion events recorded on demand",
    "pattern.chain.cuda_core": "cuda.core launch chain, new output buffer per step",
    "pattern.chain.cupy": "CuPy RawKernel chain, new output per step",
    "pattern.chain.torch": "PyTorch add chain, new output per step",
    "pattern.chain.cupy_alloc": "CuPy empty_like alone per step, kept (the README chain's new output)",
    "pattern.enqueue.single": "dispatch_async enqueue, numpy, one in flight",
    "pattern.dropped.host": "dispatch_async dropped, numpy, per call",
    "pattern.dropped.host_drained": "dispatch_async dropped, numpy, per call + drain",
    "pattern.dropped.device": "dispatch_async dropped, device arrays, per call",
    "pattern.dropped.host.shared": "dispatch_async dropped, numpy, per call, pool streams shared after 16",
    "pattern.inflight": "dispatch_async enqueue, 1,000 kept in flight",
    "pattern.inflight.shared": "dispatch_async enqueue, 1,000 kept in flight, pool streams shared after 16",
    "pattern.await": "await dispatch_async, numpy",
    "pattern.blocking": "dispatch, numpy (blocking)",
    "pattern.gather": "asyncio.gather of 64 dispatch_async, per dispatch",
}


def pattern_label(key: str) -> str:
    """The human label of a pattern series key (the key itself when unknown)."""
    return PATTERN_LABELS.get(key, key)


def budget_name(nbytes) -> str:
    """A device_memory_budget as the patterns' table names it: ``64 MiB``, ``12,584,960 bytes``
    (not a whole number of KiB), ``unbudgeted`` (None)."""
    if nbytes is None:
        return "unbudgeted"
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit} {name}"
    return f"{nbytes:,} bytes"


def pattern_order(key: str) -> tuple:
    """A sort key that lists pattern series in :data:`PATTERN_LABELS` order, unknown ones last."""
    keys = list(PATTERN_LABELS)
    return (keys.index(key) if key in keys else len(keys), key)


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
    """The patterns users are taught (benchmarks/harness/patterns.py): their series, the idle
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
        keys = sorted(p.systems, key=pattern_order)
        unit = _Unit([p.systems[k].median for k in keys])
        u = unit.name
        lines.append(f"  {'system':<{_PATTERN_WIDTH}}{'median ' + u:>12}{'p10 ' + u:>11}{'p90 ' + u:>11}{'n':>7}")
        for key in keys:
            sm = p.systems[key]
            lines.append(
                f"  {pattern_label(key):<{_PATTERN_WIDTH}}{unit(sm.median):>12}{unit(sm.p10):>11}"
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
        name = budget_name(b.get("budget"))
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


@dataclass
class BenchReport(ProfileReport):
    """A :class:`~vyre_cuda.profile.ProfileReport` with the benchmark's :class:`Target` list,
    :class:`ThreadScaling` and :class:`PatternResult` (or None), written to the same JSON sections."""

    targets: list = field(default_factory=list)
    threads: ThreadScaling | None = None
    patterns: PatternResult | None = None

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["targets"] = [t.to_dict() for t in self.targets]
        d["threads"] = None if self.threads is None else self.threads.to_dict()
        d["patterns"] = None if self.patterns is None else self.patterns.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> BenchReport:
        base = ProfileReport.from_dict(d)
        threads, patterns = base.sections.get("threads"), base.sections.get("patterns")
        return cls(
            meta=base.meta,
            sizes=base.sizes,
            stage_names=base.stage_names,
            targets=[Target.from_dict(t) for t in base.sections.get("targets", [])],
            threads=None if threads is None else ThreadScaling.from_dict(threads),
            patterns=None if patterns is None else PatternResult.from_dict(patterns),
        )

    def format_table(self) -> str:
        blocks = (thread_lines(self), pattern_lines(self), target_lines(self))
        text = format_report(self, blocks)
        if self.meta.get("device_scaling"):
            from .devices import format_device_scaling

            text += format_device_scaling(self.meta["device_scaling"])
        return text

    def plot(self, path) -> None:
        """Save the record's figure (:func:`.plot.plot_bench`: the peers too) to ``path``."""
        from .plot import plot_bench

        plot_bench(self, path)
