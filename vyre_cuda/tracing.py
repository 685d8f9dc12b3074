"""Dispatch tracing: a log line with stage times, and NVTX ranges for Nsight Systems.

``CudaBackend(trace=...)`` (or ``VYRE_CUDA_TRACE``) picks what a traced dispatch emits: ``"log"``,
one ``vyre_cuda`` INFO line per blocking dispatch with each stage's microseconds; ``"nvtx"``, a
range per dispatch in the ``vyre_cuda`` domain named by ``DispatchConfig.label`` (else the
program's name, else its kernel entry) with a nested range per stage (:data:`BLOCKING_STAGES`, or
:data:`ASYNC_STAGES` for ``dispatch_async`` / ``dispatch_timed``); ``True`` / ``"all"``: both.
Untraced, a dispatch pays one C flag test. The NVTX calls are compiled into the core (no Python
per range) and do nothing unless a tool such as ``nsys profile`` is attached.
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
BLOCKING_STAGES = ("plan_lookup", "upload", "launch", "readback_enqueue", "event_record", "wait", "copy_out", "release")
ASYNC_STAGES = ("enqueue", "result")

_WORDS = {"log": TRACE_LOG, "nvtx": TRACE_NVTX, "all": TRACE_LOG | TRACE_NVTX}
_log = logging.getLogger("vyre_cuda")
_warned = False


def _parse(text: str):
    text = text.strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return 0
    if text in ("1", "true", "yes", "on"):
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
    global _warned
    if trace is None:
        flags = _parse(os.environ.get("VYRE_CUDA_TRACE", ""))
        flags = TRACE_LOG | TRACE_NVTX if flags is None else flags
    elif isinstance(trace, bool):
        flags = TRACE_LOG | TRACE_NVTX if trace else 0
    else:
        flags = _parse(trace) if isinstance(trace, str) else None
    if flags is None:
        raise ValidationError(
            f"trace must be True, False, None, 'log', 'nvtx' or 'all' (got {trace!r})",
            "pass trace='nvtx' for Nsight Systems ranges, trace='log' for a log line per dispatch, "
            "or trace=True for both",
        )
    if flags & TRACE_NVTX and not _warned and not nvtx_available():
        _warned = True
        _log.warning(
            "NVTX tracing requested but this vyre_cuda build has no NVTX (nvtx3/nvToolsExt.h was not found "
            "when it was built): ranges are counted (vyre_cuda.tracing.nvtx_counts()) but not emitted. "
            "Fix: rebuild with VYRE_CUDA_NVTX_INCLUDE pointing at a CUDA toolkit's include folder"
        )
    return flags


def nvtx_available() -> bool:
    """True when the core was built with the NVTX header (its ranges reach an attached tool)."""
    from ._tracing import nvtx_available as available  # noqa: PLC0415 (the compiled core loads lazily)

    return bool(available())


def nvtx_counts() -> dict:
    """NVTX calls of traced dispatches in this process (counted with or without NVTX): pushes per
    stage name, ``dispatch`` (blocking label ranges), ``pops``, ``starts`` and ``ends`` (async
    label ranges); they balance once every dispatch has settled."""
    from ._tracing import nvtx_counts as counts  # noqa: PLC0415

    return dict(counts())


def nvtx_reset() -> None:
    """Zero :func:`nvtx_counts` (for tests and measurements)."""
    from ._tracing import nvtx_reset as reset  # noqa: PLC0415

    reset()
