"""The profile's one door into the core's private parts: the stage clocks (the benchmarks'
per-backend knobs, the streamed route's tuning among them: ``benchmarks/harness/hooks.py``).
No other file of the profile imports a private core module, so when the core's modules move only
this file follows. Measuring aids, not API; nothing here is imported before it is called."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["profiled_dispatch", "stage_names"]


def stage_names() -> tuple[str, ...]:
    """The core's dispatch stages, in the order of the ``stage_ns`` that
    :func:`profiled_dispatch` returns (``plan_lookup``, ``staging_memcpy``, ...)."""
    from .. import _tracing

    return tuple(_tracing.STAGES)


def profiled_dispatch(backend) -> Callable[..., tuple[list, tuple[int, ...]]]:
    """``backend``'s dispatch with the stage clocks on: a callable
    ``(program, inputs, config=None, start_ns=0) -> (outputs, stage_ns)``, one nanosecond count
    per :func:`stage_names` entry, measured from ``start_ns`` (a ``time.perf_counter_ns()``
    taken by the caller just before the call). Bound once, so a timed loop pays no lookup."""
    return backend._dispatch_profiled
