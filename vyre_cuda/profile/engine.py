"""The measurement engine: interleaved rounds of runners, and samples summarized per size.

A runner measures one system: ``fn(count)`` runs ``count`` timed samples and returns
``{series key: samples}``. Every runner is warmed, then all runners take turns over a few
rounds, so that drift over the run (clocks, thermals, other tenants) hits every system alike.
"""

from __future__ import annotations

import contextlib
import gc
import warnings

from ..errors import BackendError
from . import systems
from .report import SizeResult
from .specs import MIB
from .stats import summarize

__all__ = [
    "LAUNCH_BATCH",
    "LAUNCH_ONLY_MAX",
    "Runner",
    "WrongResult",
    "assemble",
    "auto_iterations",
    "auto_warmup",
    "gc_paused",
    "run_rounds",
]

LAUNCH_BATCH = 256
# Launch-only series measure the host's enqueue cost, which does not depend on the size; above
# this size the kernels behind a batch of launches only make the measurement long.
LAUNCH_ONLY_MAX = 4 * MIB
# Timed samples per system: about this many bytes per buffer in all, clamped to the bounds
# (thousands at 4 KiB, a handful at 1 GiB where one pageable round trip takes ~0.5 s).
_ITERATION_BYTES = 2 * 1024 * MIB
_MIN_ITERATIONS = 5
_MAX_ITERATIONS = 2000
_MAX_WARMUP = 200


def auto_iterations(nbytes: int) -> int:
    """Default timed samples per system at ``nbytes`` per buffer."""
    return max(_MIN_ITERATIONS, min(_MAX_ITERATIONS, _ITERATION_BYTES // max(nbytes, 1)))


def auto_warmup(iterations: int) -> int:
    """Default untimed samples per system first: a tenth, at most 200 (one at least is always
    run, see :func:`run_rounds`)."""
    return min(_MAX_WARMUP, iterations // 10)


class Runner:
    """One measured system: ``fn(count)`` runs ``count`` timed samples (or launch batches) and
    returns ``{series key: samples}``; ``verify()`` checks its last output.

    ``group`` names an optional system (a peer, the page-locked row): when one of its runners
    fails, the whole group is dropped and reported as skipped instead of stopping the run.
    """

    def __init__(self, name, fn, verify=None, unit_scale=1, group=None):
        self.name, self.fn, self.verify, self.group = name, fn, verify, group
        self.unit_scale = unit_scale  # launch-only runners count batches, not dispatches

    def __call__(self, count):
        if self.group is None:
            return self.fn(count)
        with warnings.catch_warnings():  # third-party peers' warnings are not ours to raise
            warnings.simplefilter("ignore")
            return self.fn(count)


class WrongResult(BackendError):
    """A measured system's output differs from the expected result (raised by the harness)."""


def run_rounds(runners, count, warmup, rounds, progress=None, label="", failed=None, before_timed=None):
    """Warm every runner, then ``rounds`` rounds in which each runner takes its share of
    ``count``. ``before_timed()`` is called between the warm-up and the first round.

    Returns ``{series key: samples}``. A failing runner of a ``group`` drops its group and
    records ``failed[group] = reason``; any other failure propagates.
    """
    failed = {} if failed is None else failed
    samples: dict[str, list] = {}  # series key -> samples
    produced: dict[str, set[str]] = {}  # group -> series keys it produced
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
                    f"{r.name} produced a wrong result during warm-up",
                    "this is a bug in the measured system or in the harness; report it with "
                    "the output of `vyre-cuda info`",
                )
        except Exception as exc:  # noqa: BLE001 (optional systems; drop() re-raises the rest)
            drop(r, exc)
        step += 1
        if progress:
            progress(f"{label}warm-up {r.name}", step / steps)
    produced.clear()  # warm-up series are not kept
    if before_timed is not None:
        before_timed()
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


def assemble(nbytes, elements, iterations, samples, stage_names, skipped) -> SizeResult:
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
        result.stages[systems.UNATTRIBUTED] = summarize([w - t for w, t in zip(walls, sums)])
        for direction, wanted in (("h2d", systems.UPLOAD_STAGES), ("d2h", systems.READBACK_STAGES)):
            if set(wanted) <= set(stage_names):  # the sum of its stages, per dispatch
                index = [list(stage_names).index(n) for n in wanted]
                result.directions[direction] = summarize([sum(row[i] for i in index) for row in stages])
    return result


@contextlib.contextmanager
def gc_paused():
    """Collect, then keep the garbage collector off: a collection inside a timed loop would
    land on whichever system happens to run."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
