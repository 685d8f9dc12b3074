"""The result of a profile run: per-size summaries, thread scaling, targets, and their JSON form.

Bandwidth (GB/s, 10**9 bytes per second) is derived, never stored:

* **effective GB/s** of a full dispatch = (input bytes + output bytes) / median wall time. A
  dispatch uploads, computes, then reads back, so this is the rate each direction would need
  if the round trip were nothing but its two transfers.
* **H2D GB/s** = input bytes / median upload time, and **D2H GB/s** = output bytes / median
  readback time, where upload = ``staging_memcpy + h2d_enqueue`` and readback =
  ``readback_enqueue + copy_out`` of the core's stage clocks (per dispatch, then the median).
  These isolate a direction where the copies are synchronous (the staging path); a DMA that
  completes behind the enqueue (page-locked memory, small dispatches) is counted in ``wait``.
* a ceiling's GB/s = the bytes it moves (the inputs, or the output) / its median time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import ValidationError
from . import systems
from .stats import Summary, gain, gbps, ratio

__all__ = ["SCHEMA", "PatternResult", "ProfileReport", "SizeResult", "Target", "ThreadScaling"]

SCHEMA = "vyre_cuda.profile/2"
_READABLE = ("vyre_cuda.profile/1", SCHEMA)


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


@dataclass
class SizeResult:
    """Everything measured at one size (bytes per buffer).

    ``moved`` gives the bytes a full dispatch moves, ``{"floor": [in, out], "vyre": [in, out]}``
    (the floor and the peers run vecadd: two inputs and one output of ``nbytes``; vyre_cuda runs
    the profiled program). ``telemetry`` holds the backend's counter deltas over the timed
    dispatches and its staging ring afterwards (empty when the backend has no telemetry).
    ``planner`` is the route the planner picks for an unforced dispatch of the elementwise
    vecadd at this size, ``{"route": ..., "reason": ...}`` (empty for a user program).
    """

    nbytes: int
    elements: int
    iterations: int
    systems: dict = field(default_factory=dict)  # key -> Summary
    stages: dict = field(default_factory=dict)  # stage name (and UNATTRIBUTED) -> Summary
    attributed: Summary | None = None  # per-dispatch sum of the named stages
    directions: dict = field(default_factory=dict)  # "h2d"/"d2h" -> Summary of stage time
    skipped: dict = field(default_factory=dict)  # system -> reason
    moved: dict = field(default_factory=dict)
    telemetry: dict = field(default_factory=dict)
    planner: dict = field(default_factory=dict)

    def median(self, key):
        s = self.systems.get(key)
        return None if s is None else s.median

    def ratio(self, key, reference=None):
        """Median of ``key`` over the median of its reference (the floor by default)."""
        return ratio(self.median(key), self.median(reference or systems.reference(key)))

    @property
    def wall(self):
        """Median wall time of the profiled dispatch (the stage table's total)."""
        return self.median("vyre.dispatch_profiled")

    @property
    def coverage(self):
        """Median per-dispatch sum of the named stages over the median wall time."""
        return ratio(None if self.attributed is None else self.attributed.median, self.wall)

    def bytes_of(self, who: str) -> tuple:
        """``(input bytes, output bytes)`` of one full dispatch by ``floor`` or ``vyre``."""
        pair = self.moved.get(who)
        return (int(pair[0]), int(pair[1])) if pair else (2 * self.nbytes, self.nbytes)

    def traffic(self, key):
        """Bytes one sample of ``key`` moves, or None for a series that moves none."""
        kind = systems.traffic_kind(key)
        if kind is None:
            return None
        n_in, n_out = self.bytes_of("vyre" if key.startswith("vyre.") else "floor")
        return {systems.FULL: n_in + n_out, systems.IN: n_in, systems.OUT: n_out}[kind]

    def gbps(self, key):
        """GB/s of ``key`` at its median: effective for a full dispatch, one direction for a
        ceiling; None when not measured or moving no data."""
        return gbps(self.traffic(key), self.median(key))

    def direction_gbps(self, direction: str):
        """vyre_cuda's H2D (``"h2d"``) or D2H (``"d2h"``) GB/s from the stage attribution."""
        s = self.directions.get(direction)
        n_in, n_out = self.bytes_of("vyre")
        return gbps(n_in if direction == "h2d" else n_out, None if s is None else s.median)

    def allocations_per_dispatch(self, kind: str):
        """Driver allocations (``kind`` is ``pinned`` or ``device``) per timed vyre_cuda
        dispatch, from the telemetry; where the core does not count allocations, its pool
        misses (each miss allocates). None without telemetry."""
        t = self.telemetry
        calls = t.get(f"{kind}_alloc_calls", t.get(f"{kind}_pool_misses"))
        return ratio(calls, t.get("dispatches"))

    def to_dict(self) -> dict:
        return {
            "bytes": self.nbytes,
            "elements": self.elements,
            "iterations": self.iterations,
            "systems": {k: v.to_dict() for k, v in self.systems.items()},
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "attributed": None if self.attributed is None else self.attributed.to_dict(),
            "directions": {k: v.to_dict() for k, v in self.directions.items()},
            "coverage": self.coverage,
            "ratios": {k: self.ratio(k) for k in self.systems},
            "gbps": {k: self.gbps(k) for k in self.systems if self.traffic(k) is not None},
            "skipped": dict(self.skipped),
            "moved": {k: list(v) for k, v in self.moved.items()},
            "telemetry": dict(self.telemetry),
            "planner": dict(self.planner),
        }

    @classmethod
    def from_dict(cls, d: dict) -> SizeResult:
        return cls(
            nbytes=int(d["bytes"]),
            elements=int(d["elements"]),
            iterations=int(d["iterations"]),
            systems={k: Summary.from_dict(v) for k, v in d["systems"].items()},
            stages={k: Summary.from_dict(v) for k, v in d["stages"].items()},
            attributed=None if d.get("attributed") is None else Summary.from_dict(d["attributed"]),
            directions={k: Summary.from_dict(v) for k, v in d.get("directions", {}).items()},
            skipped=dict(d.get("skipped", {})),
            moved={k: tuple(v) for k, v in d.get("moved", {}).items()},
            telemetry=dict(d.get("telemetry", {})),
            planner=dict(d.get("planner", {})),
        )


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
    (:mod:`vyre_cuda.profile.patterns`).

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


@dataclass
class ProfileReport:
    """The result of :func:`~vyre_cuda.profile.run_profile`: ``meta`` (device, driver, date,
    package versions, settings, the baseline compared with; a benchmark script adds the source
    ``commit``), one :class:`SizeResult` per size, the
    :class:`ThreadScaling` (or None), the targets and the :class:`PatternResult` (or None)."""

    meta: dict
    sizes: list
    threads: ThreadScaling | None = None
    targets: list = field(default_factory=list)
    stage_names: tuple = systems.STAGE_NAMES
    patterns: PatternResult | None = None

    def size(self, nbytes: int) -> SizeResult:
        for s in self.sizes:
            if s.nbytes == nbytes:
                return s
        raise KeyError(f"no result for {nbytes} bytes")

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "meta": dict(self.meta),
            "stage_names": list(self.stage_names),
            "sizes": [s.to_dict() for s in self.sizes],
            "threads": None if self.threads is None else self.threads.to_dict(),
            "targets": [t.to_dict() for t in self.targets],
            "patterns": None if self.patterns is None else self.patterns.to_dict(),
        }

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict) -> ProfileReport:
        if not isinstance(d, dict) or d.get("schema") not in _READABLE:
            schema = d.get("schema") if isinstance(d, dict) else None
            raise ValidationError(
                f"not a vyre_cuda profile result (schema {schema!r}, expected {SCHEMA!r})",
                "pass a JSON file written by `vyre-cuda profile --json` or bench_dispatch.py",
            )
        try:
            return cls(
                meta=dict(d["meta"]),
                sizes=[SizeResult.from_dict(s) for s in d["sizes"]],
                threads=None if d.get("threads") is None else ThreadScaling.from_dict(d["threads"]),
                targets=[Target.from_dict(t) for t in d.get("targets", [])],
                stage_names=tuple(d.get("stage_names", systems.STAGE_NAMES)),
                patterns=None if d.get("patterns") is None else PatternResult.from_dict(d["patterns"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a truncated or edited file
            raise ValidationError(
                f"a {d['schema']} profile result is incomplete or damaged ({type(exc).__name__}: {exc})",
                "pass an unedited JSON file written by `vyre-cuda profile --json` or bench_dispatch.py",
            ) from None

    @classmethod
    def from_json(cls, text: str) -> ProfileReport:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValidationError(
                f"a profile result is not valid JSON ({exc})",
                "pass a JSON file written by `vyre-cuda profile --json` or bench_dispatch.py",
            ) from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path) -> ProfileReport:
        """Read a stored result (``--json`` output, ``benchmarks/results/*.json``)."""
        import pathlib

        try:
            text = pathlib.Path(path).read_text()
        except OSError as exc:
            raise ValidationError(
                f"cannot read the profile result {str(path)!r}: {exc.strerror or exc}",
                "pass the path of a JSON file written by `vyre-cuda profile --json`",
            ) from None
        return cls.from_json(text)

    def format_table(self) -> str:
        """The readable terminal table."""
        from .table import format_report

        return format_report(self)

    def __str__(self) -> str:
        return self.format_table()

    def plot(self, path) -> None:
        """Save the figure (each system's time over vyre_cuda's by size, the same on device
        arrays, vyre_cuda's stage shares, GB/s against the ceilings) to ``path`` (needs matplotlib)."""
        from .plot import plot_report

        plot_report(self, path)
