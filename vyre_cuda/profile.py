"""Per-dispatch host-cost profiling: where each microsecond of a dispatch goes, beside the floor.

One :func:`run_profile` call measures, in the same process and interleaved round by round:

* **vyre_cuda**: ``CudaBackend.dispatch`` wall time per dispatch; the same dispatch with the
  core's stage clocks on (``_dispatch_profiled``), split into the core's stages plus the
  *unattributed* remainder (wall minus the sum of stages); ``dispatch_async`` enqueue time (until
  the pending handle returns) and its total with ``.result()``.
* **the floor** (:mod:`vyre_cuda._floor`): the same driver calls from a minimal C loop: full
  dispatch through pinned staging and its enqueue part, the driver's pageable path, and the host
  time of one ``cuLaunchKernel``.
* **peers**, when importable: cuda.bindings Python driver calls, CuPy ``RawKernel``
  (``cp.asarray``, ``.get()``) and PyTorch eager add (``.cuda()``, ``.cpu()``); a missing peer is
  skipped by name.
* **2-thread scaling**: throughput from 1 and 2 Python threads, vyre_cuda on one backend and the
  floor (GIL released for its whole loop); the gains and the ratio of the gains.

Every figure is a median with p10 and p90 over many dispatches after warm-up, and every
vyre_cuda figure is also given as a ratio to the floor of the same run.

>>> from vyre_cuda.profile import run_profile
>>> report = run_profile(sizes=(4096,), iterations=500)     # doctest: +SKIP
>>> print(report.format_table())                             # doctest: +SKIP
>>> report.plot("profile.png")                               # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import pathlib
import platform
import re
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from .errors import BackendError, UnsupportedFeature, ValidationError

__all__ = [
    "DEFAULT_SIZES",
    "STAGE_NAMES",
    "UNATTRIBUTED",
    "ProfileReport",
    "SizeResult",
    "Summary",
    "Target",
    "ThreadScaling",
    "add_arguments",
    "format_size",
    "gain",
    "load_user_program",
    "main",
    "median",
    "parse_buffer_spec",
    "parse_size",
    "parse_sizes",
    "percentile",
    "ratio",
    "run_profile",
    "summarize",
    "throughput",
]

SCHEMA = "vyre_cuda.profile/1"
KIB = 1024
MIB = 1024 * 1024
DEFAULT_SIZES = (4 * KIB, 4 * MIB)
# The core's stage order (vyre_cuda._dispatch.STAGES); a report carries the names it measured,
# so formatting a stored report never needs the compiled core.
STAGE_NAMES = (
    "plan_lookup",
    "staging_memcpy",
    "h2d_enqueue",
    "clears",
    "params_upload",
    "launch",
    "readback_enqueue",
    "event_record",
    "wait",
    "copy_out",
    "release",
)
UNATTRIBUTED = "unattributed"
# Sizes up to this are "small" (the 3 x 4 KiB), from LARGE_MIN on "large" (3 x 4 MiB).
SMALL_MAX = 64 * KIB
LARGE_MIN = 1 * MIB
LAUNCH_BATCH = 256
STAGE_TOLERANCE = 0.10

# key, label, key of the figure it is divided by for the "x floor" column
SYSTEMS = (
    ("floor.pinned", "floor: pinned staging, full", "floor.pinned"),
    ("floor.pinned_enqueue", "floor: pinned, enqueue part", "floor.pinned_enqueue"),
    ("floor.pageable", "floor: pageable direct, full", "floor.pinned"),
    ("floor.pageable_enqueue", "floor: pageable, enqueue part", "floor.pinned_enqueue"),
    ("floor.launch_only", "floor: launch only, per launch", "floor.launch_only"),
    ("vyre.dispatch", "vyre_cuda dispatch", "floor.pinned"),
    ("vyre.dispatch_profiled", "vyre_cuda dispatch, stage clocks on", "floor.pinned"),
    ("vyre.async_enqueue", "vyre_cuda dispatch_async enqueue", "floor.pinned_enqueue"),
    ("vyre.async_total", "vyre_cuda dispatch_async + result()", "floor.pinned"),
    ("peer.cuda_bindings", "cuda.bindings Python calls, full", "floor.pinned"),
    ("peer.cuda_bindings.launch_only", "cuda.bindings launch only", "floor.launch_only"),
    ("peer.cupy", "CuPy RawKernel, full", "floor.pinned"),
    ("peer.cupy.launch_only", "CuPy RawKernel launch only", "floor.launch_only"),
    ("peer.torch", "PyTorch eager add, full", "floor.pinned"),
    ("peer.torch.launch_only", "PyTorch add launch only", "floor.launch_only"),
)
_LABELS = {key: label for key, label, _ in SYSTEMS}
_REFERENCE = {key: ref for key, _, ref in SYSTEMS}
PEERS = ("cuda_bindings", "cupy", "torch")
_PEER_MODULES = {"cuda_bindings": "cuda.bindings", "cupy": "cupy", "torch": "torch"}


# -- statistics ------------------------------------------------------------------------------
def _sorted_floats(values) -> list:
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("statistics of an empty sample")
    if any(math.isnan(x) for x in xs):
        raise ValueError("statistics of a sample containing NaN")
    return xs


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in 0..100 (got {q})")
    xs = _sorted_floats(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values) -> float:
    """The median: the middle value, or the mean of the two middle values of an even count."""
    xs = _sorted_floats(values)
    mid = len(xs) // 2
    if len(xs) % 2:
        return xs[mid]
    return (xs[mid - 1] + xs[mid]) / 2.0


@dataclass(frozen=True)
class Summary:
    """Median, p10 and p90 of ``n`` samples, in nanoseconds."""

    n: int
    median: float
    p10: float
    p90: float

    def to_dict(self) -> dict:
        return {"n": self.n, "median_ns": self.median, "p10_ns": self.p10, "p90_ns": self.p90}

    @classmethod
    def from_dict(cls, d: dict) -> "Summary":
        return cls(int(d["n"]), float(d["median_ns"]), float(d["p10_ns"]), float(d["p90_ns"]))


def summarize(values) -> Summary:
    """:class:`Summary` of a sample of durations (ns)."""
    xs = _sorted_floats(values)
    return Summary(len(xs), median(xs), percentile(xs, 10), percentile(xs, 90))


def ratio(value, reference):
    """``value / reference``, or None when either is missing or the reference is not > 0."""
    if value is None or reference is None or not reference > 0:
        return None
    return float(value) / float(reference)


def throughput(dispatches: int, elapsed_ns: int) -> float:
    """Dispatches per second."""
    if elapsed_ns <= 0:
        raise ValueError(f"elapsed time must be > 0 ns (got {elapsed_ns})")
    return dispatches * 1e9 / elapsed_ns


def gain(one_thread, two_threads):
    """Throughput gain from 1 to 2 threads (2.0 is perfect scaling); None if unmeasured."""
    return ratio(two_threads, one_thread)


# -- sizes and buffer specs ------------------------------------------------------------------
_SIZE_RE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*\Z")
_SUFFIXES = {"": 1, "b": 1, "k": KIB, "kib": KIB, "m": MIB, "mib": MIB, "g": 1024 * MIB,
             "gib": 1024 * MIB}


def parse_size(text) -> int:
    """Bytes from ``4096``, ``4K``, ``4KiB``, ``4M``, ``4MiB`` (binary multiples, any case)."""
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        value = int(text)
    else:
        m = _SIZE_RE.match(str(text))
        suffix = m.group(2).lower() if m else None
        if m is None or suffix not in _SUFFIXES:
            raise ValidationError(
                f"cannot read {text!r} as a size in bytes",
                "write sizes as an integer with an optional K, KiB, M, MiB, G or GiB suffix "
                "(binary multiples), e.g. --sizes 4KiB,4MiB",
            )
        value = int(m.group(1)) * _SUFFIXES[suffix]
    if value <= 0:
        raise ValidationError(
            f"a buffer size must be at least 1 byte (got {value})", "pass a positive size"
        )
    return value


def parse_sizes(text) -> tuple:
    """A comma-separated list of sizes (or an iterable of them), duplicates dropped, in order."""
    items = text.split(",") if isinstance(text, str) else list(text)
    sizes = []
    for item in items:
        if isinstance(item, str) and not item.strip():
            continue
        size = parse_size(item)
        if size not in sizes:
            sizes.append(size)
    if not sizes:
        raise ValidationError(
            f"no sizes given (got {text!r})", "pass sizes like --sizes 4KiB,4MiB"
        )
    return tuple(sizes)


def format_size(nbytes: int) -> str:
    """``4 KiB``, ``4 MiB``, or ``1000 B`` when not a whole number of KiB."""
    if nbytes >= MIB and nbytes % MIB == 0:
        return f"{nbytes // MIB} MiB"
    if nbytes >= KIB and nbytes % KIB == 0:
        return f"{nbytes // KIB} KiB"
    return f"{nbytes} B"


_ROLES = ("in", "out", "inout")
_SPEC_FIX = (
    "write --buffers as comma-separated name:dtype:role entries in binding order, role one of "
    "in, out, inout, e.g. 'a:f32:in,b:f32:in,out:f32:out'"
)


def parse_buffer_spec(spec: str) -> tuple:
    """Buffer declarations from ``"a:f32:in,b:f32:in,out:f32:out"``.

    Bindings follow the order of the entries. ``in`` is a read-only input, ``out`` an output
    (cleared, then read back), ``inout`` an input read back after the kernel. Every buffer is
    runtime-sized (its element count comes from the profiled size).
    """
    from .program import DTYPES, BufferDecl, dtype_of  # noqa: PLC0415

    if not isinstance(spec, str) or not spec.strip():
        raise ValidationError(f"the buffer spec is empty (got {spec!r})", _SPEC_FIX)
    decls = []
    seen = set()
    roles = []
    for binding, entry in enumerate(spec.split(",")):
        fields = [f.strip() for f in entry.split(":")]
        if len(fields) != 3:
            raise ValidationError(
                f"buffer spec entry {entry.strip()!r} must be name:dtype:role "
                f"(got {len(fields)} field{'s' if len(fields) != 1 else ''})",
                _SPEC_FIX,
            )
        name, dtype, role = fields
        if not name.isidentifier():
            raise ValidationError(
                f"buffer name {name!r} in {entry.strip()!r} is not an identifier", _SPEC_FIX
            )
        if name in seen:
            raise ValidationError(f"buffer name {name!r} appears twice in the spec", _SPEC_FIX)
        seen.add(name)
        try:
            dt = dtype_of(dtype)
        except BackendError:
            raise ValidationError(
                f"buffer {name!r} has an unknown dtype (got {dtype!r})",
                f"use one of {', '.join(DTYPES)}",
            ) from None
        if role not in _ROLES:
            raise ValidationError(
                f"buffer {name!r} has an unknown role (got {role!r})", _SPEC_FIX
            )
        roles.append(role)
        if role == "in":
            decls.append(BufferDecl.read(name, binding, dt))
        elif role == "out":
            decls.append(BufferDecl.output(name, binding, dt))
        else:
            decls.append(BufferDecl.read_write(name, binding, dt))
    if "out" not in roles and "inout" not in roles:
        raise ValidationError(
            f"the buffer spec {spec!r} declares no output", _SPEC_FIX + "; mark results out"
        )
    return tuple(decls)


def load_user_program(path, entry=None, buffers=None, workgroup_size=256):
    """A :class:`~vyre_cuda.Program` from a CUDA (``.cu``, ...) or PTX (``.ptx``) file and a
    buffer spec (see :func:`parse_buffer_spec`). ``entry`` defaults to the kernel kind's."""
    from .program import Kernel, Program  # noqa: PLC0415

    if buffers is None:
        raise ValidationError(
            "a user kernel needs a buffer spec", "pass --buffers, e.g. 'a:f32:in,out:f32:out'"
        )
    decls = parse_buffer_spec(buffers)
    p = pathlib.Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValidationError(
            f"cannot read kernel file {str(p)!r}: {exc.strerror or exc}",
            "pass --kernel with the path of a readable .cu or .ptx file",
        ) from None
    if p.suffix.lower() == ".ptx":
        kernel = Kernel.ptx(text, entry) if entry else Kernel.ptx(text)
    else:
        kernel = Kernel.cuda(text, entry) if entry else Kernel.cuda(text)
    return Program(kernel, decls, workgroup_size=workgroup_size, name=p.stem)


# -- the report ------------------------------------------------------------------------------
@dataclass
class Target:
    """One target of issue 4: ``value op limit`` (``op`` is ``<=``, ``>=``, or ``report`` for a
    figure stated without a limit)."""

    key: str
    description: str
    value: float | None
    limit: float | None
    op: str
    size_bytes: int | None = None

    @property
    def met(self):
        if self.op == "report" or self.value is None or self.limit is None:
            return None
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def to_dict(self) -> dict:
        return {
            "key": self.key, "description": self.description, "value": self.value,
            "limit": self.limit, "op": self.op, "size_bytes": self.size_bytes, "met": self.met,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Target":
        return cls(d["key"], d["description"], d["value"], d["limit"], d["op"], d["size_bytes"])


@dataclass
class SizeResult:
    """Everything measured at one size (bytes per buffer)."""

    nbytes: int
    elements: int
    iterations: int
    systems: dict = field(default_factory=dict)  # key -> Summary
    stages: dict = field(default_factory=dict)  # stage name (and UNATTRIBUTED) -> Summary
    attributed: Summary | None = None  # per-dispatch sum of the named stages
    skipped: dict = field(default_factory=dict)  # peer -> reason

    def median(self, key):
        s = self.systems.get(key)
        return None if s is None else s.median

    def ratio(self, key, reference=None):
        """Median of ``key`` over the median of its reference (the floor by default)."""
        return ratio(self.median(key), self.median(reference or _REFERENCE.get(key)))

    @property
    def wall(self):
        """Median wall time of the profiled dispatch (the stage table's total)."""
        return self.median("vyre.dispatch_profiled")

    @property
    def coverage(self):
        """Median per-dispatch sum of the named stages over the median wall time."""
        return ratio(None if self.attributed is None else self.attributed.median, self.wall)

    def to_dict(self) -> dict:
        return {
            "bytes": self.nbytes,
            "elements": self.elements,
            "iterations": self.iterations,
            "systems": {k: v.to_dict() for k, v in self.systems.items()},
            "stages": {k: v.to_dict() for k, v in self.stages.items()},
            "attributed": None if self.attributed is None else self.attributed.to_dict(),
            "coverage": self.coverage,
            "ratios": {k: self.ratio(k) for k in self.systems},
            "skipped": dict(self.skipped),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "SizeResult":
        return cls(
            nbytes=int(d["bytes"]),
            elements=int(d["elements"]),
            iterations=int(d["iterations"]),
            systems={k: Summary.from_dict(v) for k, v in d["systems"].items()},
            stages={k: Summary.from_dict(v) for k, v in d["stages"].items()},
            attributed=None if d.get("attributed") is None else Summary.from_dict(d["attributed"]),
            skipped=dict(d.get("skipped", {})),
        )


@dataclass
class ThreadScaling:
    """Dispatches per second from 1 and from ``threads`` Python threads."""

    nbytes: int
    threads: int
    iterations: int
    vyre: dict  # thread count -> dispatches per second
    floor: dict

    @property
    def vyre_gain(self):
        return gain(self.vyre.get(1), self.vyre.get(self.threads))

    @property
    def floor_gain(self):
        return gain(self.floor.get(1), self.floor.get(self.threads))

    @property
    def gain_ratio(self):
        """vyre_cuda's gain over the floor's gain (the issue's target: >= 0.9)."""
        return ratio(self.vyre_gain, self.floor_gain)

    def to_dict(self) -> dict:
        return {
            "bytes": self.nbytes, "threads": self.threads, "iterations": self.iterations,
            "vyre_per_s": {str(k): v for k, v in self.vyre.items()},
            "floor_per_s": {str(k): v for k, v in self.floor.items()},
            "vyre_gain": self.vyre_gain, "floor_gain": self.floor_gain,
            "gain_ratio": self.gain_ratio,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "ThreadScaling":
        return cls(
            int(d["bytes"]), int(d["threads"]), int(d["iterations"]),
            {int(k): float(v) for k, v in d["vyre_per_s"].items()},
            {int(k): float(v) for k, v in d["floor_per_s"].items()},
        )


def evaluate_targets(sizes, threads, builtin: bool = True) -> list:
    """The targets of issue 4 over measured results (only for the built-in vecadd)."""
    if not builtin:
        return []
    out = []
    for s in sizes:
        label = format_size(s.nbytes)
        if s.nbytes <= SMALL_MAX:
            out.append(Target(
                "vyre_vs_floor", f"{label}: vyre_cuda dispatch / floor (pinned staging)",
                s.ratio("vyre.dispatch", "floor.pinned"), 1.15, "<=", s.nbytes))
            for peer, name in (("cupy", "CuPy"), ("torch", "PyTorch")):
                value = ratio(s.median(f"peer.{peer}"), s.median("vyre.dispatch"))
                if value is not None:
                    out.append(Target(
                        f"{peer}_vs_vyre", f"{label}: {name} / vyre_cuda dispatch", value, 2.5,
                        ">=", s.nbytes))
        if s.nbytes >= LARGE_MIN:
            out.append(Target(
                "vyre_vs_floor", f"{label}: vyre_cuda dispatch / floor (pinned staging)",
                s.ratio("vyre.dispatch", "floor.pinned"), 1.0, "<=", s.nbytes))
            out.append(Target(
                "vyre_vs_floor_pageable",
                f"{label}: vyre_cuda dispatch / floor (driver's pageable path)",
                s.ratio("vyre.dispatch", "floor.pageable"), None, "report", s.nbytes))
        out.append(Target(
            "async_enqueue_vs_floor_enqueue",
            f"{label}: vyre_cuda dispatch_async enqueue / floor enqueue part",
            s.ratio("vyre.async_enqueue", "floor.pinned_enqueue"), 1.2, "<=", s.nbytes))
    if threads is not None:
        out.append(Target(
            "thread_gain_ratio",
            f"{threads.threads} threads, {format_size(threads.nbytes)}: "
            "vyre_cuda gain / floor gain",
            threads.gain_ratio, 0.9, ">=", threads.nbytes))
    return out


def _us(ns) -> str:
    return "-" if ns is None else f"{ns / 1000.0:,.2f}"


def _x(value) -> str:
    return "" if value is None else f"{value:.2f}x"


@dataclass
class ProfileReport:
    """The result of :func:`run_profile`: ``meta`` (device, driver, date, commit, settings),
    one :class:`SizeResult` per size, the :class:`ThreadScaling` (or None) and the targets."""

    meta: dict
    sizes: list
    threads: ThreadScaling | None = None
    targets: list = field(default_factory=list)
    stage_names: tuple = STAGE_NAMES

    def size(self, nbytes: int) -> SizeResult:
        for s in self.sizes:
            if s.nbytes == nbytes:
                return s
        raise KeyError(f"no result for {nbytes} bytes")

    # -- machine formats -------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "meta": dict(self.meta),
            "stage_names": list(self.stage_names),
            "sizes": [s.to_dict() for s in self.sizes],
            "threads": None if self.threads is None else self.threads.to_dict(),
            "targets": [t.to_dict() for t in self.targets],
        }

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict) -> "ProfileReport":
        if d.get("schema") != SCHEMA:
            raise ValidationError(
                f"not a vyre_cuda profile result (schema {d.get('schema')!r}, expected {SCHEMA!r})",
                "pass a JSON file written by `vyre-cuda profile --json` or bench_dispatch.py",
            )
        return cls(
            meta=dict(d["meta"]),
            sizes=[SizeResult.from_dict(s) for s in d["sizes"]],
            threads=None if d.get("threads") is None else ThreadScaling.from_dict(d["threads"]),
            targets=[Target.from_dict(t) for t in d.get("targets", [])],
            stage_names=tuple(d.get("stage_names", STAGE_NAMES)),
        )

    @classmethod
    def from_json(cls, text: str) -> "ProfileReport":
        return cls.from_dict(json.loads(text))

    # -- the terminal table ----------------------------------------------------------
    def header_lines(self) -> list:
        m = self.meta
        cc = m.get("cc")
        cc_text = f", cc {cc[0]}.{cc[1]}" if cc else ""
        release = f" ({m['driver_release']})" if m.get("driver_release") else ""
        lines = [
            f"vyre_cuda profile: {m.get('device_name', '?')} (device {m.get('device', '?')}"
            f"{cc_text}), CUDA driver {_driver_text(m.get('driver_version'))}{release}",
            f"{m.get('date', '?')}, commit {m.get('commit') or 'unknown'}, vyre_cuda "
            f"{m.get('vyre_cuda_version', '?')}, Python {m.get('python', '?')}",
            f"program: {m.get('program', '?')}; floor: {m.get('floor', 'vecadd C loop')}, same "
            f"run; {m.get('rounds', '?')} interleaved rounds",
        ]
        return lines

    def size_lines(self, s: SizeResult) -> list:
        lines = [
            f"{format_size(s.nbytes)} per buffer ({s.elements:,} float32 elements for the floor,"
            f" {s.iterations:,} dispatches per system)",
            f"  {'system':<40}{'median us':>11}{'p10 us':>10}{'p90 us':>10}{'x floor':>9}"
            f"{'x vyre':>9}",
        ]
        keys = [k for k, _, _ in SYSTEMS if k in s.systems]
        keys += sorted(k for k in s.systems if k not in _LABELS)
        vyre = s.median("vyre.dispatch")
        for key in keys:
            sm = s.systems[key]
            vs_vyre = ""
            if key.startswith("peer.") and not key.endswith("launch_only"):
                vs_vyre = _x(ratio(sm.median, vyre))
            lines.append(
                f"  {_LABELS.get(key, key):<40}{_us(sm.median):>11}{_us(sm.p10):>10}"
                f"{_us(sm.p90):>10}{_x(s.ratio(key)):>9}{vs_vyre:>9}"
            )
        for peer, reason in sorted(s.skipped.items()):
            lines.append(f"  skipped {peer}: {reason}")
        if s.stages:
            wall = s.wall
            lines.append("")
            lines.append(
                f"  {'stages of a vyre_cuda dispatch':<40}{'median us':>11}{'p10 us':>10}"
                f"{'p90 us':>10}{'share':>9}"
            )
            for name in list(self.stage_names) + [UNATTRIBUTED]:
                sm = s.stages.get(name)
                if sm is None:
                    continue
                share = ratio(sm.median, wall)
                label = "unattributed (wall - stages)" if name == UNATTRIBUTED else name
                lines.append(
                    f"  {label:<40}{_us(sm.median):>11}{_us(sm.p10):>10}{_us(sm.p90):>10}"
                    f"{'' if share is None else f'{share:.1%}':>9}"
                )
            cov = s.coverage
            if cov is not None:
                ok = abs(cov - 1.0) <= STAGE_TOLERANCE
                lines.append(
                    f"  sum of stages {_us(s.attributed.median)} us / wall {_us(wall)} us = "
                    f"{cov:.3f} (medians; within {STAGE_TOLERANCE:.0%}: {'yes' if ok else 'NO'})"
                )
        return lines

    def thread_lines(self) -> list:
        t = self.threads
        if t is None:
            return []

        def per_s(v):
            return "-" if v is None else f"{v:,.0f}"

        lines = [
            f"{t.threads} Python threads, {format_size(t.nbytes)} per buffer, "
            f"{t.iterations:,} dispatches per thread",
            f"  {'':<20}{'1 thread /s':>14}{f'{t.threads} threads /s':>16}{'gain':>8}",
            f"  {'floor':<20}{per_s(t.floor.get(1)):>14}{per_s(t.floor.get(t.threads)):>16}"
            f"{_x(t.floor_gain):>8}",
            f"  {'vyre_cuda':<20}{per_s(t.vyre.get(1)):>14}{per_s(t.vyre.get(t.threads)):>16}"
            f"{_x(t.vyre_gain):>8}",
            "  vyre_cuda gain / floor gain: "
            + ("-" if t.gain_ratio is None else f"{t.gain_ratio:.2f}"),
        ]
        return lines

    def target_lines(self) -> list:
        if not self.targets:
            return []
        lines = ["targets (issue 4)"]
        for t in self.targets:
            met = t.met
            tag = "report" if met is None else ("met" if met else "MISSED")
            value = "-" if t.value is None else f"{t.value:.2f}"
            limit = "" if t.op == "report" else f" (target {t.op} {t.limit})"
            lines.append(f"  [{tag:^6}] {t.description}: {value}{limit}")
        return lines

    def format_table(self) -> str:
        """The readable terminal table."""
        blocks = [self.header_lines() + [
            "x floor: median over the floor's (full, enqueue part or launch only, as fits); "
            "x vyre: a peer's median over vyre_cuda dispatch's"
        ]]
        blocks += [self.size_lines(s) for s in self.sizes]
        blocks += [b for b in (self.thread_lines(), self.target_lines()) if b]
        return "\n\n".join("\n".join(line.rstrip() for line in b) for b in blocks) + "\n"

    def __str__(self) -> str:
        return self.format_table()

    # -- the plot --------------------------------------------------------------------
    def plot(self, path) -> None:
        """Save stacked stage bars of the vyre_cuda dispatch beside the floor and the peers, one
        panel per size (needs matplotlib)."""
        Figure = _require_matplotlib()
        n = max(len(self.sizes), 1)
        fig = Figure(figsize=(5.5 * n, 5.5))
        axes = fig.subplots(1, n, squeeze=False)[0]
        names = list(self.stage_names) + [UNATTRIBUTED]
        palette = _palette(len(names) + 2)
        legend = {}
        for ax, s in zip(axes, self.sizes):
            labels = []
            x = 0
            if s.stages:
                bottom = 0.0
                for i, name in enumerate(names):
                    sm = s.stages.get(name)
                    height = 0.0 if sm is None else max(sm.median, 0.0) / 1000.0
                    bar = ax.bar(x, height, bottom=bottom, color=palette[i], width=0.7)
                    legend.setdefault(name, bar)
                    bottom += height
                labels.append("vyre_cuda\n(stages)")
                x += 1
            for key, label in (("vyre.dispatch", "vyre_cuda"), ("floor.pinned", "floor\npinned")):
                if key not in s.systems:
                    continue
                total = s.systems[key].median / 1000.0
                if key == "floor.pinned" and "floor.pinned_enqueue" in s.systems:
                    enq = s.systems["floor.pinned_enqueue"].median / 1000.0
                    b1 = ax.bar(x, enq, color=palette[-2], width=0.7)
                    b2 = ax.bar(x, max(total - enq, 0.0), bottom=enq, color=palette[-1], width=0.7)
                    legend.setdefault("floor enqueue part", b1)
                    legend.setdefault("floor wait + copy-out", b2)
                else:
                    ax.bar(x, total, color="0.35", width=0.7)
                labels.append(label)
                x += 1
            for key, label in (
                ("floor.pageable", "floor\npageable"),
                ("peer.cuda_bindings", "cuda.bindings"),
                ("peer.cupy", "CuPy"),
                ("peer.torch", "PyTorch"),
            ):
                if key in s.systems:
                    ax.bar(x, s.systems[key].median / 1000.0, color="0.6", width=0.7)
                    labels.append(label)
                    x += 1
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel("host time per dispatch, us (median)")
            ax.set_title(f"{format_size(s.nbytes)} per buffer")
        if legend:
            fig.legend(list(legend.values()), list(legend.keys()), loc="upper right",
                       fontsize=7, ncol=1)
        m = self.meta
        fig.suptitle(
            f"vyre_cuda vs floor and peers: {m.get('device_name', '?')}, "
            f"{m.get('date', '')[:10]}, commit {m.get('commit') or 'unknown'}",
            fontsize=9,
        )
        fig.subplots_adjust(left=0.08, right=0.8, bottom=0.2, top=0.88, wspace=0.35)
        fig.savefig(str(path), dpi=120)


def _require_matplotlib():
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError:
        raise UnsupportedFeature(
            "plotting needs matplotlib, which is not installed",
            "pip install matplotlib (or vyre-cuda[plot]), or run without --plot",
        ) from None
    return Figure


def _palette(n):
    from matplotlib import colormaps  # noqa: PLC0415

    cmap = colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


def _driver_text(version) -> str:
    if isinstance(version, (int, np.integer)) and not isinstance(version, bool) and version > 0:
        return f"{int(version) // 1000}.{int(version) % 1000 // 10}"
    if isinstance(version, (tuple, list)):
        return ".".join(str(v) for v in version)
    return "?" if version in (None, "") else str(version)


# -- measurement engine ----------------------------------------------------------------------
class _Runner:
    """One measured system: ``fn(count)`` runs ``count`` timed dispatches (or launch batches)
    and returns ``{series key: samples}``; ``verify()`` checks its last output.

    ``group`` names an optional system (a peer): when one of its runners fails, the whole
    group is dropped and reported as skipped instead of stopping the run.
    """

    def __init__(self, name, fn, verify=None, unit_scale=1, group=None):
        self.name = name
        self.fn = fn
        self.verify = verify
        self.unit_scale = unit_scale  # launch-only runners count batches, not dispatches
        self.group = group

    def __call__(self, count):
        if self.group is None:
            return self.fn(count)
        with warnings.catch_warnings():  # third-party peers' warnings are not ours to raise
            warnings.simplefilter("ignore")
            return self.fn(count)


class WrongResult(BackendError):
    """A measured system's output differs from ``a + b`` (raised by the harness only)."""


def _run_rounds(runners, count, warmup, rounds, progress=None, label="", failed=None):
    """Warm every runner, then ``rounds`` rounds in which each runner takes its share of
    ``count``, so that drift over the run (clocks, thermals) hits every system alike.

    Returns ``{series key: samples}``. A failing runner of a ``group`` drops its group and
    records ``failed[group] = reason``; any other failure propagates.
    """
    failed = {} if failed is None else failed
    samples = {}
    produced = {}  # group -> series keys it produced
    active = list(runners)
    rounds = max(1, min(rounds, count)) if count > 0 else 1
    steps = len(runners) * (rounds + 1)
    step = 0

    def drop(r, exc):
        if r.group is None:
            raise exc
        failed[r.group] = f"failed: {type(exc).__name__}: {exc}".splitlines()[0]
        for other in [x for x in active if x.group == r.group]:
            active.remove(other)
        for key in produced.pop(r.group, ()):
            samples.pop(key, None)

    def call(r, n):
        result = r(n)
        if r.group is not None:
            produced.setdefault(r.group, set()).update(result)
        return result

    for r in list(active):
        if r not in active:
            continue
        try:
            # At least one untimed pass, which also produces the output that verify() checks.
            call(r, max(1, -(-warmup // r.unit_scale)))
            if r.verify is not None and not r.verify():
                raise WrongResult(
                    f"{r.name} produced a wrong result during warm-up (out != a + b)",
                    "this is a bug in the measured system or in the harness; report it with "
                    "the output of `vyre-cuda info`",
                )
        except Exception as exc:  # noqa: BLE001 (peers are optional; drop() re-raises the rest)
            drop(r, exc)
        step += 1
        if progress:
            progress(f"{label}warm-up {r.name}", step / steps)
    for r in list(active):
        produced.pop(r.group, None)  # warm-up series are not kept
    for rnd in range(rounds):
        for r in list(active):
            if r not in active:
                continue
            share = count // rounds + (1 if rnd < count % rounds else 0)
            share = max(1, -(-share // r.unit_scale))
            try:
                result = call(r, share)
            except Exception as exc:  # noqa: BLE001
                drop(r, exc)
                continue
            for key, values in result.items():
                samples.setdefault(key, []).extend(values)
            step += 1
            if progress:
                progress(f"{label}{r.name}, round {rnd + 1}/{rounds}", step / steps)
    return samples


def _assemble(nbytes, elements, iterations, samples, stage_names, skipped) -> SizeResult:
    """Summaries from raw samples; the stage rows come from ``_stages`` (per-dispatch tuples
    aligned with ``stage_names``) and ``vyre.dispatch_profiled`` (their wall times)."""
    result = SizeResult(nbytes, elements, iterations, skipped=dict(skipped))
    for key, values in samples.items():
        if key.startswith("_") or not len(values):
            continue
        result.systems[key] = summarize(values)
    stages = samples.get("_stages")
    walls = samples.get("vyre.dispatch_profiled")
    if stages and walls:
        if len(stages) != len(walls):
            raise ValueError(f"{len(stages)} stage tuples for {len(walls)} wall times")
        width = len(stage_names)
        for row in stages:
            if len(row) != width:
                raise ValueError(f"a stage tuple has {len(row)} entries, expected {width}")
        for i, name in enumerate(stage_names):
            result.stages[name] = summarize([row[i] for row in stages])
        sums = [sum(row) for row in stages]
        result.attributed = summarize(sums)
        result.stages[UNATTRIBUTED] = summarize([w - t for w, t in zip(walls, sums)])
    return result


@contextlib.contextmanager
def _gc_paused():
    # A collection inside a timed loop would land on whichever system happens to run.
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _auto_iterations(nbytes: int) -> int:
    # About 2 s of copying per system at the large size, never fewer than 200 dispatches.
    return max(200, min(2000, 2_000_000_000 // max(nbytes, 1)))


def _make_inputs(program, nbytes, rng):
    arrays = []
    for decl in program.inputs:
        itemsize = decl.dtype.itemsize
        count = decl.count or nbytes // itemsize
        if count <= 0:
            raise ValidationError(
                f"buffer {decl.name!r} ({decl.dtype.name}) holds no element at {nbytes} bytes",
                f"pass sizes of at least {itemsize} bytes",
            )
        npd = decl.dtype.numpy
        if npd.kind == "f":
            arrays.append(rng.standard_normal(count).astype(npd))
        else:
            arrays.append(rng.integers(0, 100, count).astype(npd))
    return arrays


def _vyre_runners(backend, program, inputs, check):
    pc = time.perf_counter_ns
    dispatch = backend.dispatch
    profiled = backend._dispatch_profiled
    dispatch_async = backend.dispatch_async
    last = {}

    def run_dispatch(count):
        walls = []
        for _ in range(count):
            t0 = pc()
            outs = dispatch(program, inputs)
            t1 = pc()
            walls.append(t1 - t0)
            last["dispatch"] = outs  # freed outside the timed window
        return {"vyre.dispatch": walls}

    def run_profiled(count):
        walls = []
        stages = []
        for _ in range(count):
            t0 = pc()
            outs, stage_ns = profiled(program, inputs, None, t0)
            t1 = pc()
            walls.append(t1 - t0)
            stages.append(tuple(int(v) for v in stage_ns))
            last["profiled"] = outs
        return {"vyre.dispatch_profiled": walls, "_stages": stages}

    def run_async(count):
        enqueue = []
        total = []
        for _ in range(count):
            t0 = pc()
            pending = dispatch_async(program, inputs)
            t1 = pc()
            outs = pending.result()
            t2 = pc()
            enqueue.append(t1 - t0)
            total.append(t2 - t0)
            last["async"] = outs
            del pending
        return {"vyre.async_enqueue": enqueue, "vyre.async_total": total}

    def verifier(name):
        return None if check is None else (lambda: check(last[name]))

    return [
        _Runner("vyre_cuda dispatch", run_dispatch, verifier("dispatch")),
        _Runner("vyre_cuda dispatch (stage clocks)", run_profiled, verifier("profiled")),
        _Runner("vyre_cuda dispatch_async", run_async, verifier("async")),
    ]


def _floor_runners(floor, a, b, launch_batches_scale):
    out = np.zeros(floor.n, dtype=np.float32)
    expected = a + b

    def pinned(count):
        out[:] = 0
        total, enqueue = floor.full_pinned(a, b, out, count)
        return {"floor.pinned": total, "floor.pinned_enqueue": enqueue}

    def pageable(count):
        out[:] = 0
        total, enqueue = floor.full_pageable(a, b, out, count)
        return {"floor.pageable": total, "floor.pageable_enqueue": enqueue}

    def launch(batches):
        return {"floor.launch_only": floor.launch_only(batches, LAUNCH_BATCH, 0)}

    def ok():
        return np.array_equal(out, expected)

    return [
        _Runner("floor pinned", pinned, ok),
        _Runner("floor pageable", pageable, ok),
        _Runner("floor launch only", launch, unit_scale=launch_batches_scale),
    ]


# -- peers -----------------------------------------------------------------------------------
class _CudaBindingsPeer:
    """The floor's calls from Python through ``cuda.bindings.driver`` (pageable direct, as a
    Python user would write them), on pre-packed kernel arguments."""

    name = "cuda_bindings"

    def __init__(self, context_handle, image, entry, a, b):
        from cuda.bindings import driver as cu  # noqa: PLC0415

        self.cu = cu
        self.ok = cu.CUresult.CUDA_SUCCESS
        self.ctx = cu.CUcontext(context_handle)
        self.module = self.stream = self.event = None
        self.mem = []
        self.n = a.shape[0]
        self.nbytes = a.nbytes
        self.a, self.b = a, b
        self.out = np.zeros(self.n, np.float32)
        self.expected = a + b
        self.grid = (self.n + LAUNCH_BATCH - 1) // LAUNCH_BATCH
        try:
            self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            self.module = self._check(cu.cuModuleLoadData(image), "cuModuleLoadData")
            self.func = self._check(cu.cuModuleGetFunction(self.module, entry.encode()),
                                    "cuModuleGetFunction")
            for _ in range(3):
                self.mem.append(self._check(cu.cuMemAlloc(self.nbytes), "cuMemAlloc"))
            self.stream = self._check(
                cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate")
            self.event = self._check(
                cu.cuEventCreate(int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)), "cuEventCreate")
        except BaseException:
            self.close()
            raise
        self.d_a, self.d_b, self.d_out = self.mem
        # The fast way with cuda.bindings: a void** built once, passed as an int.
        self.argv = [np.array([int(d)], np.uint64) for d in self.mem]
        self.argv.append(np.array([self.n], np.uint32))
        self.params = np.array([x.ctypes.data for x in self.argv], np.uint64)
        self.params_addr = int(self.params.ctypes.data)

    def _check(self, result, call):
        if result[0] != self.ok:
            from .errors import driver_error  # noqa: PLC0415

            status = result[0]
            raise driver_error(getattr(status, "name", str(status)), call, int(status),
                               "cuda.bindings peer")
        return result[1] if len(result) > 1 else None

    def full(self, count):
        cu = self.cu
        h2d, memset, launch = cu.cuMemcpyHtoDAsync, cu.cuMemsetD8Async, cu.cuLaunchKernel
        d2h, record, sync = cu.cuMemcpyDtoHAsync, cu.cuEventRecord, cu.cuEventSynchronize
        d_a, d_b, d_out, stream, event = self.d_a, self.d_b, self.d_out, self.stream, self.event
        a_p, b_p, o_p = self.a.ctypes.data, self.b.ctypes.data, self.out.ctypes.data
        nbytes, grid, params, ok, func = (self.nbytes, self.grid, self.params_addr, self.ok,
                                          self.func)
        pc = time.perf_counter_ns
        self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        walls = []
        for _ in range(count):
            t0 = pc()
            r = (
                h2d(d_a, a_p, nbytes, stream),
                h2d(d_b, b_p, nbytes, stream),
                memset(d_out, 0, nbytes, stream),
                launch(func, grid, 1, 1, LAUNCH_BATCH, 1, 1, 0, stream, params, 0),
                d2h(o_p, d_out, nbytes, stream),
                record(event, stream),
                sync(event),
            )
            t1 = pc()
            walls.append(t1 - t0)
            # Checked outside the timing: the peer is measured at its best.
            for item, call in zip(r, ("cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync",
                                      "cuMemsetD8Async", "cuLaunchKernel", "cuMemcpyDtoHAsync",
                                      "cuEventRecord", "cuEventSynchronize")):
                if item[0] != ok:
                    self._check(item, call)
        return {"peer.cuda_bindings": walls}

    def launch_only(self, batches):
        cu = self.cu
        launch, func, grid, stream, params = (cu.cuLaunchKernel, self.func, self.grid,
                                              self.stream, self.params_addr)
        pc = time.perf_counter_ns
        self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        per = []
        for _ in range(batches):
            t0 = pc()
            for _ in range(LAUNCH_BATCH):
                launch(func, grid, 1, 1, LAUNCH_BATCH, 1, 1, 0, stream, params, 0)
            t1 = pc()
            self._check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
            per.append((t1 - t0) / LAUNCH_BATCH)
        return {"peer.cuda_bindings.launch_only": per}

    def verify(self):
        return np.array_equal(self.out, self.expected)

    def close(self):
        cu = self.cu
        cu.cuCtxSetCurrent(self.ctx)
        if self.stream is not None:
            cu.cuStreamSynchronize(self.stream)
        if self.event is not None:
            cu.cuEventDestroy(self.event)
            self.event = None
        if self.stream is not None:
            cu.cuStreamDestroy(self.stream)
            self.stream = None
        for d in self.mem:
            cu.cuMemFree(d)
        self.mem = []
        if self.module is not None:
            cu.cuModuleUnload(self.module)
            self.module = None


class _CupyPeer:
    """CuPy ``RawKernel`` on the floor's source: ``cp.asarray`` in, ``cp.zeros`` out, ``.get()``."""

    name = "cupy"

    def __init__(self, device, source, entry, a, b):
        import cupy as cp  # noqa: PLC0415

        self.cp = cp
        self.device = cp.cuda.Device(device)
        self.device.use()
        self.kernel = cp.RawKernel(source, entry)
        self.a, self.b = a, b
        self.n = np.uint32(a.shape[0])
        self.grid = ((a.shape[0] + LAUNCH_BATCH - 1) // LAUNCH_BATCH,)
        self.block = (LAUNCH_BATCH,)
        self.expected = a + b
        self.out = None
        self.d_a, self.d_b = cp.asarray(a), cp.asarray(b)
        self.d_out = cp.zeros(a.shape[0], cp.float32)

    def full(self, count):
        cp, kernel, a, b, n, grid, block = (self.cp, self.kernel, self.a, self.b, self.n,
                                            self.grid, self.block)
        self.device.use()
        pc = time.perf_counter_ns
        walls = []
        out = None
        for _ in range(count):
            t0 = pc()
            d_a = cp.asarray(a)
            d_b = cp.asarray(b)
            d_out = cp.zeros(a.shape[0], cp.float32)
            kernel(grid, block, (d_a, d_b, d_out, n))
            out = d_out.get()
            t1 = pc()
            walls.append(t1 - t0)
        self.out = out
        return {"peer.cupy": walls}

    def launch_only(self, batches):
        kernel, grid, block = self.kernel, self.grid, self.block
        args = (self.d_a, self.d_b, self.d_out, self.n)
        self.device.use()
        stream = self.cp.cuda.get_current_stream()
        pc = time.perf_counter_ns
        per = []
        for _ in range(batches):
            t0 = pc()
            for _ in range(LAUNCH_BATCH):
                kernel(grid, block, args)
            t1 = pc()
            stream.synchronize()
            per.append((t1 - t0) / LAUNCH_BATCH)
        return {"peer.cupy.launch_only": per}

    def verify(self):
        return self.out is not None and np.array_equal(self.out, self.expected)

    def close(self):
        self.cp.cuda.get_current_stream().synchronize()
        self.d_a = self.d_b = self.d_out = None


class _TorchPeer:
    """PyTorch eager: ``(a.cuda() + b.cuda()).cpu()`` from numpy-backed CPU tensors."""

    name = "torch"

    def __init__(self, device, a, b):
        import torch  # noqa: PLC0415

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        self.torch = torch
        self.dev = torch.device("cuda", device)
        self.ta, self.tb = torch.from_numpy(a), torch.from_numpy(b)
        self.expected = a + b
        self.out = None
        self.d_a, self.d_b = self.ta.to(self.dev), self.tb.to(self.dev)
        self.d_out = torch.empty_like(self.d_a)

    def full(self, count):
        ta, tb, dev = self.ta, self.tb, self.dev
        pc = time.perf_counter_ns
        walls = []
        out = None
        for _ in range(count):
            t0 = pc()
            out = (ta.cuda(dev) + tb.cuda(dev)).cpu().numpy()
            t1 = pc()
            walls.append(t1 - t0)
        self.out = out
        return {"peer.torch": walls}

    def launch_only(self, batches):
        add, d_a, d_b, d_out = self.torch.add, self.d_a, self.d_b, self.d_out
        sync = self.torch.cuda.synchronize
        pc = time.perf_counter_ns
        per = []
        for _ in range(batches):
            t0 = pc()
            for _ in range(LAUNCH_BATCH):
                add(d_a, d_b, out=d_out)
            t1 = pc()
            sync(self.dev)
            per.append((t1 - t0) / LAUNCH_BATCH)
        return {"peer.torch.launch_only": per}

    def verify(self):
        return self.out is not None and np.array_equal(self.out, self.expected)

    def close(self):
        self.torch.cuda.synchronize(self.dev)
        self.d_a = self.d_b = self.d_out = None


def _peer_available(name):
    import importlib.util  # noqa: PLC0415

    module = _PEER_MODULES[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    return found


def _open_peer(name, backend, compiled_image, entry, source, a, b):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "cuda_bindings":
            return _CudaBindingsPeer(backend.context_handle, compiled_image, entry, a, b)
        if name == "cupy":
            return _CupyPeer(backend.device, source, entry, a, b)
        return _TorchPeer(backend.device, a, b)


def _peer_version(name):
    module = {"cuda_bindings": "cuda.bindings", "cupy": "cupy", "torch": "torch"}[name]
    mod = sys.modules.get(module)
    return getattr(mod, "__version__", None) if mod is not None else None


# -- threads ---------------------------------------------------------------------------------
def _vyre_threaded(backend, program, inputs_per_thread, iterations, warmup):
    threads = len(inputs_per_thread)
    barrier = threading.Barrier(threads)
    spans = [None] * threads
    errors = []

    def worker(index):
        inputs = inputs_per_thread[index]
        dispatch = backend.dispatch
        try:
            for _ in range(warmup):
                dispatch(program, inputs)
            barrier.wait()
            t0 = time.perf_counter_ns()
            for _ in range(iterations):
                dispatch(program, inputs)
            t1 = time.perf_counter_ns()
            spans[index] = (t0, t1)
        except threading.BrokenBarrierError:
            pass  # another thread failed; its error is reported
        except BaseException as exc:  # noqa: BLE001 (re-raised in the caller's thread)
            errors.append(exc)
            barrier.abort()

    pool = [threading.Thread(target=worker, args=(i,), name=f"vyre-profile-{i}")
            for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    elapsed = max(e for _, e in spans) - min(s for s, _ in spans)
    return throughput(threads * iterations, max(elapsed, 1))


def _measure_threads(backend, program, kernel, nbytes, threads, iterations, warmup, repeats,
                     rng, progress=None):
    from . import _floor  # noqa: PLC0415

    n = nbytes // 4
    vyre = {1: [], threads: []}
    floor = {1: [], threads: []}
    per_thread = [_make_inputs(program, nbytes, rng) for _ in range(threads)]
    steps = repeats * 4
    step = 0
    for _ in range(repeats):
        for count in (1, threads):
            result = _floor.floor_threaded(kernel, n, count, iterations, warmup)
            if not result["outputs_ok"]:
                raise WrongResult(
                    "the threaded floor produced a wrong result (out != a + b)",
                    "this is a bug in vyre_cuda._floor; report it",
                )
            floor[count].append(result["dispatches_per_s"])
            step += 1
            if progress:
                progress(f"threads: floor x{count}", step / steps)
            vyre[count].append(
                _vyre_threaded(backend, program, per_thread[:count], iterations, warmup))
            step += 1
            if progress:
                progress(f"threads: vyre_cuda x{count}", step / steps)
    return ThreadScaling(
        nbytes, threads, iterations,
        vyre={k: median(v) for k, v in vyre.items()},
        floor={k: median(v) for k, v in floor.items()},
    )


# -- run -------------------------------------------------------------------------------------
def _git_commit():
    env = os.environ.get("VYRE_CUDA_COMMIT")
    if env:
        return env
    root = pathlib.Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if head and dirty else (head or None)


def _driver_release():
    try:
        text = pathlib.Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
    return m.group(1) if m else None


def _meta(backend, program_label, builtin, iterations, warmup, rounds, started):
    from . import __version__  # noqa: PLC0415

    caps = backend.caps
    try:
        import cuda.bindings as cb  # noqa: PLC0415

        cb_version = getattr(cb, "__version__", None)
    except ImportError:
        cb_version = None
    return {
        "date": started.isoformat(timespec="seconds"),
        "device": int(backend.device),
        "device_name": str(getattr(caps, "name", "?")),
        "cc": [int(v) for v in caps.cc],
        "driver_version": getattr(caps, "driver_version", None),
        "driver_release": _driver_release(),
        "vyre_cuda_version": __version__,
        "commit": _git_commit(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cuda_bindings": cb_version,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "iterations": iterations,
        "warmup": warmup,
        "rounds": rounds,
        "program": program_label,
        "builtin_program": builtin,
        "floor": "vecadd(a, b, out, n) C loop, 256 threads per block",
    }


def _load_floor_kernel(backend):
    from . import _floor  # noqa: PLC0415
    from .compile import compile_kernel  # noqa: PLC0415
    from .program import Kernel  # noqa: PLC0415

    compiled = compile_kernel(
        Kernel.cuda(_floor.FLOOR_SOURCE, entry=_floor.FLOOR_ENTRY), arch=tuple(backend.caps.cc)
    )
    kernel = _floor.FloorKernel(backend.context_handle, compiled.image, _floor.FLOOR_ENTRY)
    return kernel, compiled.image


def _progress_scaled(progress, lo, hi, prefix=""):
    if progress is None:
        return None

    def inner(label, fraction):
        progress(prefix + label, lo + (hi - lo) * min(max(fraction, 0.0), 1.0))

    return inner


def run_profile(
    sizes=DEFAULT_SIZES,
    iterations=None,
    warmup=None,
    program=None,
    peers=True,
    threads=True,
    progress=None,
    *,
    device=0,
    backend=None,
    rounds=5,
    thread_count=2,
    thread_iterations=None,
    thread_repeats=3,
    seed=0,
) -> ProfileReport:
    """Measure vyre_cuda, the floor and the peers at each size, in one run.

    Parameters
    ----------
    sizes : iterable of int or str
        Bytes per buffer (``4096``, ``"4KiB"``, ...). Each must be a multiple of 4 (the floor
        moves float32).
    iterations : int, optional
        Timed dispatches per system and size (default: 2,000, fewer for large sizes, at least 200).
    warmup : int, optional
        Untimed dispatches per system first (default: a tenth of ``iterations``, at least 20).
    program : vyre_cuda.Program, optional
        A user program instead of the built-in vecadd; peers and targets are vecadd-only and
        are skipped, and the floor stays the vecadd loop moving the same bytes per buffer.
    peers, threads : bool
        Measure the peers, and the 2-thread scaling (at the smallest size).
    progress : callable, optional
        ``progress(label, fraction)`` with ``fraction`` in 0..1, called as the run advances.
    device : int
        The CUDA device of the backend created for the run (ignored when ``backend`` is given).
    backend : vyre_cuda.CudaBackend, optional
        Use this open backend (it stays open) instead of creating one.
    rounds : int
        The timed dispatches of each system are split into this many interleaved rounds.

    Returns
    -------
    ProfileReport
    """
    size_list = parse_sizes(sizes)
    for nbytes in size_list:
        if nbytes % 4:
            raise ValidationError(
                f"size {nbytes} bytes is not a whole number of float32 elements (4 bytes each)",
                "pass sizes that are multiples of 4 bytes, e.g. 4KiB",
            )
    for name, value in (("iterations", iterations), ("warmup", warmup)):
        if value is not None and (not isinstance(value, (int, np.integer))
                                  or isinstance(value, bool) or value < 0
                                  or (name == "iterations" and value < 1)):
            raise ValidationError(
                f"{name} must be a {'positive' if name == 'iterations' else 'non-negative'} "
                f"integer (got {value!r})",
                f"pass --{name} N with a whole number",
            )
    if rounds < 1 or thread_count < 2 or thread_repeats < 1:
        raise ValidationError(
            f"rounds and thread_repeats must be >= 1 and thread_count >= 2 (got {rounds}, "
            f"{thread_repeats}, {thread_count})",
            "keep the defaults (rounds=5, thread_count=2, thread_repeats=3)",
        )

    from ._dispatch import STAGES  # noqa: PLC0415

    builtin = program is None
    owned = backend is None
    if owned:
        from . import CudaBackend  # noqa: PLC0415

        backend = CudaBackend(device=device)
    started = datetime.datetime.now(datetime.timezone.utc)
    rng = np.random.default_rng(seed)
    report_sizes = []
    thread_result = None
    kernel = None
    try:
        if builtin:
            from . import builtin_programs  # noqa: PLC0415

            program = builtin_programs.vecadd_f32()
        label = "vecadd_f32 (built-in)" if builtin else (
            f"{program.name or 'user program'} ({program.kernel.kind}, entry "
            f"{program.kernel.entry!r})")
        kernel, image = _load_floor_kernel(backend)
        from . import _floor  # noqa: PLC0415

        weights = len(size_list) + (1 if threads else 0)
        for index, nbytes in enumerate(size_list):
            count = iterations or _auto_iterations(nbytes)
            warm = warmup if warmup is not None else max(20, count // 10)
            sub = _progress_scaled(progress, index / weights, (index + 1) / weights,
                                   f"{format_size(nbytes)}: ")
            report_sizes.append(_measure_size(
                backend, program, builtin, kernel, image, _floor, nbytes, count, warm, rounds,
                peers, STAGES, rng, sub))
        if threads:
            nbytes = min(size_list)
            count = thread_iterations or iterations or _auto_iterations(nbytes)
            warm = warmup if warmup is not None else max(20, count // 10)
            sub = _progress_scaled(progress, (weights - 1) / weights, 1.0)
            with _gc_paused():
                thread_result = _measure_threads(backend, program, kernel, nbytes, thread_count,
                                                 count, warm, thread_repeats, rng, sub)
        meta = _meta(backend, label, builtin, iterations, warmup, rounds, started)
        meta["peers"] = {name: _peer_version(name) for name in PEERS if peers and builtin}
    finally:
        try:
            if kernel is not None:
                kernel.close()
        finally:
            if owned:
                backend.close()
    return ProfileReport(
        meta=meta,
        sizes=report_sizes,
        threads=thread_result,
        targets=evaluate_targets(report_sizes, thread_result, builtin),
        stage_names=tuple(STAGES),
    )


def _measure_size(backend, program, builtin, kernel, image, _floor, nbytes, count, warm, rounds,
                  peers, stage_names, rng, progress):
    n = nbytes // 4
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    inputs = [a, b] if builtin else _make_inputs(program, nbytes, rng)
    expected = a + b

    def check(outs):
        return len(outs) == 1 and np.array_equal(np.asarray(outs[0]), expected)

    skipped = {}
    opened = []
    floor = _floor.Floor(kernel, n)
    try:
        launch_batches = max(8, count // 64)
        # Launch-only runners count batches: scale so that `count` maps to `launch_batches`.
        scale = max(1, count // launch_batches)
        runners = _vyre_runners(backend, program, inputs, check if builtin else None)
        runners += _floor_runners(floor, a, b, scale)
        if peers and builtin:
            for name in PEERS:
                if not _peer_available(name):
                    skipped[name] = f"{_PEER_MODULES[name]} is not installed"
                    continue
                try:
                    peer = _open_peer(name, backend, image, _floor.FLOOR_ENTRY,
                                      _floor.FLOOR_SOURCE, a, b)
                except Exception as exc:  # noqa: BLE001 (a broken peer must not stop the run)
                    skipped[name] = f"failed to start: {type(exc).__name__}: {exc}"
                    continue
                opened.append(peer)
                runners.append(_Runner(f"peer {name}", peer.full, peer.verify, group=name))
                runners.append(_Runner(f"peer {name} launch only", peer.launch_only,
                                       unit_scale=scale, group=name))
        elif peers:
            for name in PEERS:
                skipped[name] = "peers run the built-in vecadd only"
        with _gc_paused():
            samples = _run_rounds(runners, count, warm, rounds, progress, failed=skipped)
    finally:
        try:
            for peer in reversed(opened):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        peer.close()
                except Exception:  # noqa: BLE001, S110 (measurement is over; leak, not fail)
                    pass
        finally:
            floor.close()
    return _assemble(nbytes, n, count, samples, tuple(stage_names), skipped)


# -- CLI -------------------------------------------------------------------------------------
class _ProgressLine:
    """A one-line progress display on stderr, shown only once a run has lasted a second."""

    def __init__(self, stream=None, delay=1.0, interval=5.0):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self.delay = delay
        self.interval = interval
        self.last = -math.inf
        self.shown = False

    def __call__(self, label, fraction):
        now = time.monotonic()
        if now - self.start < self.delay:
            return
        if not self.tty and now - self.last < self.interval:
            return
        self.last = now
        text = f"[vyre-cuda profile] {fraction:4.0%} {label}"
        if self.tty:
            self.stream.write("\r" + text[:110].ljust(110))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.shown = True

    def done(self):
        if self.shown and self.tty:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


def _sizes_arg(text):
    try:
        return parse_sizes(text)
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count_arg(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum} (got {text!r})\nFix: pass a whole number")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``vyre-cuda profile`` options to ``parser``."""
    parser.add_argument(
        "--sizes", type=_sizes_arg, default=DEFAULT_SIZES, metavar="LIST",
        help="bytes per buffer, comma-separated, with K/KiB/M/MiB suffixes (default 4KiB,4MiB)")
    parser.add_argument(
        "--iterations", type=_count_arg(1), default=None, metavar="N",
        help="timed dispatches per system and size (default 2000, fewer for large sizes)")
    parser.add_argument(
        "--warmup", type=_count_arg(0), default=None, metavar="N",
        help="untimed dispatches per system first (default: a tenth of --iterations)")
    parser.add_argument(
        "--json", nargs="?", const="-", default=None, metavar="FILE",
        help="write the result as JSON to FILE, or to stdout (instead of the table) without FILE")
    parser.add_argument(
        "--plot", default=None, metavar="FILE.png",
        help="save stacked stage bars beside the floor and peers (needs matplotlib)")
    parser.add_argument("--no-peers", action="store_true",
                        help="skip cuda.bindings, CuPy and PyTorch")
    parser.add_argument("--no-threads", action="store_true",
                        help="skip the 2-thread scaling measurement")
    parser.add_argument("--kernel", default=None, metavar="FILE",
                        help="profile a user kernel (.cu CUDA C++ or .ptx) instead of vecadd")
    parser.add_argument("--entry", default=None, metavar="NAME",
                        help="the user kernel's entry point (default vyre_main, or main for PTX)")
    parser.add_argument("--buffers", default=None, metavar="SPEC",
                        help="the user kernel's buffers, e.g. 'a:f32:in,b:f32:in,out:f32:out'")
    parser.add_argument("--device", type=_count_arg(0), default=0, metavar="N",
                        help="CUDA device ordinal (default 0)")
    return parser


def main(args) -> int:
    """Run ``vyre-cuda profile`` with parsed ``args``; returns the exit status."""
    try:
        program = None
        if args.kernel is not None:
            program = load_user_program(args.kernel, args.entry, args.buffers)
        elif args.buffers is not None or args.entry is not None:
            raise ValidationError(
                "--buffers and --entry describe a user kernel, but no --kernel was given",
                "pass --kernel FILE with them, or drop them to profile the built-in vecadd",
            )
        if args.plot is not None:
            _require_matplotlib()  # fail before a long run, not after it
        progress = _ProgressLine()
        try:
            report = run_profile(
                sizes=args.sizes, iterations=args.iterations, warmup=args.warmup,
                program=program, peers=not args.no_peers, threads=not args.no_threads,
                progress=progress, device=args.device,
            )
        finally:
            progress.done()
        if args.json == "-":
            sys.stdout.write(report.to_json() + "\n")
        else:
            sys.stdout.write(report.format_table())
            if args.json is not None:
                pathlib.Path(args.json).write_text(report.to_json() + "\n")
                print(f"JSON written to {args.json}", file=sys.stderr)
        if args.plot is not None:
            report.plot(args.plot)
            print(f"plot written to {args.plot}", file=sys.stderr)
    except BackendError as exc:
        print(f"vyre-cuda profile: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValidationError) else 1
    return 0
