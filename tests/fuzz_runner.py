"""Dispatch generated programs (tests/fuzz_programs.py) and check every output element, the
caller's inputs and the telemetry against the numpy reference.

Shared by the GPU fuzzer (tests/gpu/test_fuzz_gpu.py) and the CPU profile, which runs the same
loop on the fake driver with the kernel emulated by the reference model (tests/test_fuzz.py).
"""

from __future__ import annotations

import collections
import time
import warnings

import fuzz_programs as fp
import numpy as np

import vyre_cuda
from vyre_cuda import Program, ValidationError

# where the package has it: warned (once per program) when the implicit launch covers fewer
# elements than a runtime-sized input; the fuzzer checks exactly when it comes
LaunchSizeWarning = getattr(vyre_cuda, "LaunchSizeWarning", None)

POISON = 0xA5  # dispatch_into outputs start as this byte pattern: unwritten elements show
SCRAMBLE = 0x5A  # async inputs are overwritten with this right after the enqueue returns


def supports_launch_option() -> bool:
    return "launch" in getattr(Program, "__dataclass_fields__", {})


def output_shapes(desc: fp.ProgramDesc, runtime: int) -> list:
    """(numpy dtype, elements) of each output a dispatch returns."""
    shapes = []
    for b in desc.outputs:
        dtype = fp.numpy_dtype("u32" if b.kind == "echo" else b.dtype)
        n = b.count or runtime
        if b.byte_range is not None:
            n = (b.byte_range[1] - b.byte_range[0]) // dtype.itemsize
        shapes.append((dtype, n))
    return shapes


def poisoned(shapes) -> list:
    outs = []
    for dtype, n in shapes:
        arr = np.empty(n, dtype)
        arr.view(np.uint8)[:] = POISON
        outs.append(arr)
    return outs


def emulation(desc: fp.ProgramDesc):
    """The kernel of ``desc`` as a fake-driver launch hook: counts and phases from the params block."""
    from fakecuda import array_at  # only the fake-driver child needs it

    args = desc.args
    phase_word = desc.max_binding + 2

    def run(launch):
        words = np.array(launch.words(launch.arg(len(args)), desc.words))
        counts = {b.binding: int(words[b.binding + 1]) for b in args}
        arrays = {
            b.binding: array_at(launch.arg(k), fp.numpy_dtype(b.dtype), counts[b.binding]) for k, b in enumerate(args)
        }
        phases = (int(words[phase_word]), int(words[phase_word + 1])) if desc.grid_sync else None
        fp.apply_launch(desc, arrays, counts, words, phases)

    return run


class FuzzRunner:
    """Runs programs on one backend and keeps the tally."""

    KEYS = (
        "dispatches",
        "failed_dispatches",
        "h2d_bytes",
        "d2h_bytes",
        "launches",
        "cooperative_launches",
        "split_launches",
    )

    def __init__(self, backend, *, fake=None, max_runtime: int = 300_000, detail_limit: int = 20):
        self.backend = backend
        self.fake = fake
        self.max_runtime = max_runtime
        self.detail_limit = detail_limit
        self.supports_launch = supports_launch_option()
        self.programs = 0
        self.dispatches = 0
        self.refusals = 0
        self.mismatches = 0
        self.details = []
        self.routes = collections.Counter()
        self.entries = collections.Counter()
        self.compile_s = 0.0
        self.elements = 0
        self.launch_warnings = 0
        self.started = time.perf_counter()

    # ------------------------------------------------------------------ bookkeeping
    def _fail(self, tag: str, problems) -> None:
        self.mismatches += 1
        if len(self.details) < self.detail_limit:
            self.details.append(f"{tag}: " + "; ".join(problems))

    def _snap(self) -> dict:
        snap = self.backend.telemetry.snapshot()
        return {k: snap[k] for k in self.KEYS}

    def summary(self) -> str:
        elapsed = time.perf_counter() - self.started
        routes = ", ".join(f"{k} {v}" for k, v in sorted(self.routes.items()))
        entries = ", ".join(f"{k} {v}" for k, v in sorted(self.entries.items()))
        return (
            f"fuzz: {self.programs} programs, {self.dispatches} dispatches, {self.mismatches} mismatches "
            f"({self.refusals} zero-size dispatches refused as expected; {self.elements:,} output elements "
            f"checked; {self.launch_warnings} launch-size warnings as expected; routes: {routes}; "
            f"entries: {entries}; {elapsed:.1f} s, compile {self.compile_s:.1f} s)"
        )

    # ------------------------------------------------------------------ one program
    def run_program(self, seed: int, dispatches: int) -> fp.ProgramDesc:
        desc = fp.generate(seed, supports_launch=self.supports_launch)
        program = fp.build_program(desc)
        rng = np.random.default_rng([seed, 0xD15EA5E])
        self.programs += 1
        # compile and load once, on a dispatch that launches something
        warm_runtime = max(1, desc.min_runtime)
        warm = fp.make_inputs(desc, rng, warm_runtime)
        self.warned, self.warn_expected = 0, self.undersized(desc, warm_runtime, None)
        t0 = time.perf_counter()
        try:
            with self.watching_warnings():
                self.backend.plan_info(program, warm)
        except Exception as exc:  # noqa: BLE001 (a generated program must plan: report it)
            self._fail(f"program seed {seed} ({desc.summary()})", [f"planning raised {type(exc).__name__}: {exc}"])
            return desc
        self.compile_s += time.perf_counter() - t0
        if self.fake is not None:
            self.fake.emulate(self.backend, program, warm, emulation(desc))
        for k in range(dispatches):
            if self.backend.lost:
                self._fail(f"program seed {seed}", ["the backend is lost; stopping"])
                break
            self.dispatch_once(desc, program, rng, k)
        if self.fake is not None and self.fake.stats()["violations"]:
            self._fail(f"program seed {seed}", [f"fake driver: {self.fake.last_violation()}"])
        if LaunchSizeWarning is not None and self.warned != (1 if self.warn_expected else 0):
            self._fail(
                f"program seed {seed} ({desc.summary()})",
                [
                    f"{self.warned} LaunchSizeWarning(s); expected {1 if self.warn_expected else 0} "
                    "(once per program, when the implicit launch covers less than a runtime-sized input)"
                ],
            )
        self.launch_warnings += self.warned
        return desc

    # ------------------------------------------------------------------ the launch-size warning
    @staticmethod
    def undersized(desc: fp.ProgramDesc, runtime: int, cfg) -> bool:
        """Whether the implicit launch (no launch=, no grid_override) covers fewer elements than
        the runtime-sized inputs hold: the case LaunchSizeWarning is for."""
        if desc.launch or (cfg is not None and (cfg.grid_override or getattr(cfg, "elements", None) is not None)):
            return False
        if not any(b.count == 0 for b in desc.inputs):
            return False
        return fp.launch_count(desc, runtime, None) < runtime

    class _Watch:
        def __init__(self, runner):
            self.runner = runner

        def __enter__(self):
            self.cm = warnings.catch_warnings(record=True)
            self.caught = self.cm.__enter__()
            warnings.simplefilter("always")
            return self

        def __exit__(self, *exc):
            self.cm.__exit__(*exc)
            for w in self.caught:
                if LaunchSizeWarning is not None and issubclass(w.category, LaunchSizeWarning):
                    self.runner.warned += 1
                else:
                    self.runner._fail("warning", [f"unexpected {w.category.__name__}: {w.message}"])
            return False

    def watching_warnings(self):
        return self._Watch(self)

    # ------------------------------------------------------------------ one dispatch
    def _run(self, entry, program, inputs, cfg, shapes):
        """(outputs, outputs the caller passed or None) of one dispatch through ``entry``."""
        be = self.backend
        if entry == "dispatch":
            return be.dispatch(program, inputs, cfg), None
        if entry == "dispatch_into":
            dst = poisoned(shapes)
            return be.dispatch_into(program, inputs, dst, cfg), dst
        if entry == "timed":
            timed = be.dispatch_timed(program, inputs, cfg)
            assert timed.wall_ns > 0 and timed.device_ns >= 0, timed
            return timed.outputs, None
        pending = be.dispatch_async(program, inputs, cfg, timed=entry == "async_timed")
        for x in inputs:  # the inputs may be reused as soon as dispatch_async returns
            x.view(np.uint8)[:] = SCRAMBLE
        if entry == "async_result":
            return pending.result(), None
        if entry == "async_result_into":
            dst = poisoned(shapes)
            return pending.result_into(dst), dst
        return pending.timed_result().outputs, None

    def dispatch_once(self, desc: fp.ProgramDesc, program, rng, k: int) -> None:
        plan = fp.plan_dispatch(desc, rng, max_runtime=self.max_runtime)
        cfg = plan.config()
        inputs = fp.make_inputs(desc, rng, plan.runtime)
        originals = [x.copy() for x in inputs]
        shapes = output_shapes(desc, plan.runtime)
        tag = f"program seed {desc.seed} dispatch {k} {plan} [{desc.summary()}]"
        self.dispatches += 1
        self.entries[plan.entry] += 1
        before = self._snap()
        self.warn_expected |= self.undersized(desc, plan.runtime, cfg)
        with self.watching_warnings():
            self._dispatch_checked(desc, program, plan, cfg, inputs, originals, shapes, tag, before)

    def _dispatch_checked(self, desc, program, plan, cfg, inputs, originals, shapes, tag, before) -> None:
        if fp.launch_count(desc, plan.runtime, cfg) == 0 and not (cfg is not None and cfg.grid_override):
            # nothing to launch (a grid_override still launches, with word 0 = 0)
            try:
                self._run(plan.entry, program, inputs, cfg, shapes)
            except ValidationError:
                self.refusals += 1
                if self._snap() != before:
                    self._fail(tag, ["a refused dispatch moved the telemetry"])
                return
            except Exception as exc:  # noqa: BLE001
                self._fail(tag, [f"a dispatch launching 0 elements raised {type(exc).__name__}: {exc}"])
                return
            self._fail(tag, ["a dispatch launching 0 elements was not refused"])
            return
        try:
            outs, dst = self._run(plan.entry, program, inputs, cfg, shapes)
        except Exception as exc:  # noqa: BLE001 (reported as a mismatch with the program)
            self._fail(tag, [f"raised {type(exc).__name__}: {exc}"])
            return
        after = self._snap()
        delta = {key: after[key] - before[key] for key in self.KEYS}
        route = "cooperative" if delta["cooperative_launches"] else "split" if delta["split_launches"] else "regular"
        self.routes[route] += 1
        problems = []
        if desc.grid_sync:
            if route == "regular":
                problems.append("a grid-sync program ran as a regular launch")
        elif route != ("cooperative" if plan.cooperative else "regular"):
            problems.append(f"route {route} for cooperative={plan.cooperative}")
        want = fp.reference(desc, originals, plan.runtime, cfg, route)
        problems += fp.compare(desc, outs, want)
        if dst is not None and any(o is not d for o, d in zip(outs, dst, strict=True)):
            problems.append("dispatch_into / result_into did not return the caller's arrays")
        if not plan.entry.startswith("async"):
            for x, y in zip(inputs, originals, strict=True):
                if not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
                    problems.append("an input array was modified")
        # telemetry: exactly one dispatch, its bytes and its launches
        blocks = desc.phases if route == "split" else 1
        words = desc.max_binding + 2 + (2 if desc.grid_sync else 0)
        expect = {
            "dispatches": 1,
            "failed_dispatches": 0,
            "h2d_bytes": sum(x.nbytes for x in originals) + 4 * words * blocks,
            "d2h_bytes": sum(w.nbytes for w in want),
            "launches": (plan.iterations or 1) * blocks,
        }
        for key, value in expect.items():
            if delta[key] != value:
                problems.append(f"telemetry {key} grew by {delta[key]}, expected {value}")
        self.elements += sum(w.size for w in want)
        if problems:
            self._fail(tag, problems)
