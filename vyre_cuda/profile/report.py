"""The result of a profile run: per-size summaries and their JSON form.

GB/s (10**9 bytes per second) is derived, never stored: a full dispatch's is effective, (input +
output bytes) / median wall time; vyre_cuda's H2D and D2H GB/s divide the bytes of one direction by
its stage clocks' median (upload: ``staging_memcpy + h2d_enqueue``, readback: ``readback_enqueue +
copy_out``; a DMA completing behind the enqueue counts in ``wait``); a ceiling's divides the bytes it
moves by its median time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import ValidationError
from . import systems
from .stats import Summary, gbps, ratio

__all__ = ["SCHEMA", "SECTIONS", "ProfileReport", "SizeResult"]

SCHEMA = "vyre_cuda.profile/2"
_READABLE = ("vyre_cuda.profile/1", SCHEMA)
# the sections a benchmark record adds (benchmarks/harness): kept as they were read, written back
SECTIONS = ("targets", "threads", "patterns")


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
class ProfileReport:
    """The result of :func:`~vyre_cuda.profile.run_profile`: ``meta`` (device, driver, date,
    package versions, settings; a benchmark adds the source ``commit``), one :class:`SizeResult`
    per size, and ``sections``: the parts a stored benchmark record adds (:data:`SECTIONS`: its
    targets, thread scaling and patterns), kept as read and written back."""

    meta: dict
    sizes: list
    stage_names: tuple = systems.STAGE_NAMES
    sections: dict = field(default_factory=dict)

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
            **{name: self.sections.get(name, [] if name == "targets" else None) for name in SECTIONS},
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
                stage_names=tuple(d.get("stage_names", systems.STAGE_NAMES)),
                sections={name: d[name] for name in SECTIONS if d.get(name)},
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
        """Save the figure (:func:`~vyre_cuda.profile.plot.plot_report`) to ``path`` (needs matplotlib)."""
        from .plot import plot_report

        plot_report(self, path)
