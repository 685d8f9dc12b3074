"""Dispatch tracing: a log line with stage times, and NVTX ranges for Nsight Systems.

``CudaBackend(trace=...)`` (or ``VYRE_CUDA_TRACE``) picks what a traced dispatch emits:

- ``"log"``: one ``vyre_cuda`` log line (INFO) per blocking dispatch with each stage's microseconds;
- ``"nvtx"``: NVTX ranges in the ``vyre_cuda`` domain: one per dispatch, named by
  ``DispatchConfig.label`` (else the program's name, else its kernel entry), with one nested range per
  stage (:data:`BLOCKING_STAGES` for ``dispatch`` / ``dispatch_into``; ``enqueue`` then ``result`` for
  ``dispatch_async`` and ``dispatch_timed``);
- ``True`` / ``"1"`` / ``"all"``: both. ``False`` / ``None`` with no variable set: neither, and an
  untraced dispatch pays one C flag test.

The NVTX calls come from the NVTX C header compiled into the core (no Python per range, the stage
ranges are opened in the GIL-free enqueue routine); they do nothing unless a tool such as
``nsys profile`` is attached. :func:`nvtx_counts` counts the calls either way.
"""

from __future__ import annotations

import logging
import os

from .errors import ValidationError

__all__ = [
    "BLOCKING_STAGES",
    "ASYNC_STAGES",
    "TRACE_LOG",
    "TRACE_NVTX",
    "nvtx_available",
    "nvtx_counts",
    "nvtx_reset",
    "trace_flags",
]

TRACE_LOG = 1
TRACE_NVTX = 2

# the nested NVTX ranges of one traced dispatch, in order (the core's names)
BLOCKING_STAGES = (
    "plan_lookup",
    "upload",
    "launch",
    "readback_enqueue",
    "event_record",
    "wait",
    "copy_out",
    "release",
)
ASYNC_STAGES = ("enqueue", "result")

_WORDS = {"log": TRACE_LOG, "nvtx": TRACE_NVTX, "all": TRACE_LOG | TRACE_NVTX}
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
_log = logging.getLogger("vyre_cuda")
_warned = False


def _parse(text: str):
    text = text.strip().lower()
    if text in _OFF:
        return 0
    if text in _ON:
        return TRACE_LOG | TRACE_NVTX
    flags = 0
    for word in text.replace("+", ",").split(","):
        if word.strip() not in _WORDS:
            return None
        flags |= _WORDS[word.strip()]
    return flags


def trace_flags(trace=None) -> int:
    """The core's trace bits for ``CudaBackend(trace=...)``.

    ``None`` reads ``VYRE_CUDA_TRACE`` (unset: off; an unknown value: everything, as before the
    value was parsed). ``True``/``False``, ``"log"``, ``"nvtx"``, ``"all"`` or ``"log,nvtx"``.

    Examples
    --------
    >>> trace_flags("nvtx"), trace_flags(True), trace_flags(False)
    (2, 3, 0)
    """
    if trace is None:
        env = os.environ.get("VYRE_CUDA_TRACE", "")
        flags = _parse(env)
        flags = TRACE_LOG | TRACE_NVTX if flags is None else flags
    elif isinstance(trace, bool):
        flags = TRACE_LOG | TRACE_NVTX if trace else 0
    elif isinstance(trace, str) and _parse(trace) is not None:
        flags = _parse(trace)
    else:
        raise ValidationError(
            f"trace must be True, False, None, 'log', 'nvtx' or 'all' (got {trace!r})",
            "pass trace='nvtx' for Nsight Systems ranges, trace='log' for a log line per dispatch, "
            "or trace=True for both",
        )
    if flags & TRACE_NVTX:
        _warn_if_unavailable()
    return flags


def _warn_if_unavailable() -> None:
    global _warned
    if _warned or nvtx_available():
        return
    _warned = True
    _log.warning(
        "NVTX tracing requested but this vyre_cuda build has no NVTX (nvtx3/nvToolsExt.h was not found "
        "when it was built): ranges are counted (vyre_cuda.tracing.nvtx_counts()) but not emitted. "
        "Fix: rebuild with VYRE_CUDA_NVTX_INCLUDE pointing at a CUDA toolkit's include folder"
    )


def nvtx_available() -> bool:
    """True when the core was built with the NVTX header (its ranges reach an attached tool)."""
    from ._tracing import nvtx_available as available  # noqa: PLC0415 (the compiled core loads lazily)

    return bool(available())


def nvtx_counts() -> dict:
    """NVTX calls of traced dispatches in this process: pushes per stage name, ``dispatch``
    (blocking dispatches' label ranges), ``pops``, ``starts`` and ``ends`` (async label ranges).
    Pushes and pops balance, as do starts and ends, once every dispatch has settled."""
    from ._tracing import nvtx_counts as counts  # noqa: PLC0415

    return dict(counts())


def nvtx_reset() -> None:
    """Zero :func:`nvtx_counts` (for tests and measurements)."""
    from ._tracing import nvtx_reset as reset  # noqa: PLC0415

    reset()
