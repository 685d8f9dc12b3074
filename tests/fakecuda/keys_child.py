"""Child of tests/test_program_keys.py: structural program keys on a real CudaBackend over the fake
driver. A program rebuilt per call (a new object equal to the first) finds the first one's
prepared plan and loaded module; a program differing in one field gets its own plan; every result
is checked against numpy. Prints one JSON object (tests/helpers/scenarios.py).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
from fakes import built_anew
from helpers.scenarios import Scenarios

import vyre_cuda as vc
from fakecuda import FakeDriver, vecadd_emulation
from vyre_cuda import BufferDecl
from vyre_cuda import builtin_programs as bp

SCENARIOS = Scenarios()
scenario = SCENARIOS.register
RNG = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
N = 1024


def pair(n=N):
    return RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)


def plans(backend) -> int:
    return backend.telemetry.snapshot()["prepared_plans"]


def vecadd_by_a(sizes) -> int:
    """A module-level launch rule: the length of ``a``."""
    return sizes["a"]


def variants() -> list:
    """``(field, program)``: vecadd changed in one field each, every one dispatchable on the fake
    (grid_sync, phases and align are compared without a device in test_program_keys.py)."""
    base = bp.vecadd_f32()
    other = dataclasses.replace
    a, b, out = base.buffers
    return [
        ("kernel", other(base, kernel=vc.Kernel.cuda(base.kernel.source, options=("-DVYRE_KEYS=1",)))),
        ("buffers", other(base, buffers=(a, b, BufferDecl.output("c", out.binding, "f32")))),
        ("buffers", other(base, buffers=(a, b, dataclasses.replace(out, alignment=256)))),
        ("workgroup_size", other(base, workgroup_size=(128, 1, 1))),
        ("name", other(base, name="vecadd_again")),
        ("launch", other(base, launch="a")),
        ("launch", other(base, launch=vecadd_by_a)),
        ("elementwise", other(base, elementwise=True)),
    ]


@scenario
def a_rebuilt_equal_program_hits_the_plan_and_module_caches(fake):
    backend = vc.CudaBackend(0)
    a, b = pair()
    first = bp.vecadd_f32()
    fake.emulate(backend, first, [a, b], vecadd_emulation(np.float32))
    (out,) = backend.dispatch(first, [a, b])
    assert np.array_equal(out, a + b)
    held, modules, launches = plans(backend), len(backend._modules), fake.stats()["launches"]
    for _ in range(20):
        again = bp.vecadd_f32()  # built again: the first build's object
        assert again is first
        anew = built_anew(first)  # an equal object (as non-plain arguments build): found by value
        assert anew is not first and anew == first and hash(anew) == hash(first)
        (out,) = backend.dispatch(anew, [a, b])
        assert np.array_equal(out, a + b), "an equal program gave a wrong result"
        a, b = pair()
        (out,) = backend.dispatch(again, [a, b])
        assert np.array_equal(out, a + b), "a rebuilt program gave a wrong result"
        (out,) = backend.dispatch_async(again, [a, b]).result()
        assert np.array_equal(out, a + b)
    assert plans(backend) == held, f"{plans(backend)} plans after rebuilt dispatches, {held} before"
    assert len(backend._modules) == modules
    assert fake.stats()["launches"] == launches + 60
    backend.close()


@scenario
def programs_differing_in_one_field_do_not_share_a_plan(fake):
    backend = vc.CudaBackend(0)
    a, b = pair()
    base = bp.vecadd_f32()
    fake.emulate(backend, base, [a, b], vecadd_emulation(np.float32))
    backend.dispatch(base, [a, b])
    seen = [base]
    for field, program in variants():
        assert program != base and hash(program) != hash(base), field
        before = plans(backend)
        fake.emulate(backend, program, [a, b], vecadd_emulation(np.float32))  # (plan_info caches nothing)
        a, b = pair()
        (out,) = backend.dispatch(program, [a, b])
        assert np.array_equal(out, a + b), field
        assert plans(backend) == before + 1, (field, plans(backend), before)
        # and a rebuilt copy of the variant shares the variant's plan, no one else's
        copy = built_anew(program)
        assert copy is not program and copy == program, field
        (out,) = backend.dispatch(copy, [a, b])
        assert np.array_equal(out, a + b), field
        assert plans(backend) == before + 1, (field, "a rebuilt variant planned again")
        seen.append(program)
    assert plans(backend) == len(seen)
    backend.close()


@scenario
def a_rebuilt_program_with_other_lengths_plans_once_per_length(fake):
    backend = vc.CudaBackend(0)
    fake.emulate(backend, bp.vecadd_f32(), list(pair()), vecadd_emulation(np.float32))
    held = plans(backend)
    for n in (100, 200, 300):
        for _ in range(3):
            a, b = pair(n)
            (out,) = backend.dispatch(bp.vecadd_f32(), [a, b])
            assert np.array_equal(out, a + b), n
    assert plans(backend) == held + 3, (plans(backend), held)
    backend.close()


@scenario
def the_last_plan_found_is_forgotten_when_plans_are_cleared(fake):
    # a dispatch finding the plan of the dispatch before it (same program and config objects,
    # same lengths) skips the dict; clearing the plans (what a module eviction does) must make
    # the next one plan again, never reuse the cleared plan
    backend = vc.CudaBackend(0)
    program = bp.vecadd_f32()
    fake.emulate(backend, program, list(pair()), vecadd_emulation(np.float32))
    config = vc.DispatchConfig(label="again")
    for i, clear in enumerate((False, True, True, False)):
        if clear:
            backend._core.clear_prepared()
            assert plans(backend) == 0
        for k, cfg in enumerate((None, None, config, config, None)):
            a, b = pair()
            (out,) = backend.dispatch(program, [a, b], cfg)
            assert np.array_equal(out, a + b), (clear, cfg)
            # one plan per config; after a clear, the first dispatch plans again (not the
            # cleared plan of the dispatch before it)
            expect = 2 if (i and not clear) or k >= 2 else 1
            assert plans(backend) == expect, (i, k, plans(backend))
    # interleaved programs, configs and lengths: each dispatch its own plan's result
    other = dataclasses.replace(program, workgroup_size=(128, 1, 1))
    fake.emulate(backend, other, list(pair()), vecadd_emulation(np.float32))
    planned = {(program, None, N), (program, config, N)}
    assert plans(backend) == len(planned)
    for i in range(24):
        p, cfg, n = (program, other)[i % 2], (None, config, config)[i % 3], (N, 100, 3000, N)[i % 4]
        a, b = pair(n)
        (out,) = backend.dispatch(p, [a, b], cfg)
        assert out.shape == (n,) and np.array_equal(out, a + b), (i, n)
        planned.add((p, cfg, n))
        assert plans(backend) == len(planned), (i, plans(backend), len(planned))  # each key planned once
    backend.close()


if __name__ == "__main__":
    SCENARIOS.main(FakeDriver())
