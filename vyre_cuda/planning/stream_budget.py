"""The streamed route's device bytes (pure): where the shared region and each slot lie
(:class:`Geometry`), the chunk size and stream count that fit a limit, and the errors when none does."""

from __future__ import annotations

from .._accounting import align_up, checked_add, checked_mul
from ..errors import DeviceOutOfMemory, ValidationError
from ..program import BindingRole
from .layout import COPY_ALIGN, REGION_ALIGN

__all__ = ["Geometry", "fit", "smallest_budget", "padded", "budget_too_small", "no_chunk_fits"]


class Geometry:
    """The byte layout of the shared region and of one slot for a given chunk size."""

    def __init__(self, bindings, widths, params_bytes):
        self.cut = [s for s in bindings.slots if s.decl.name in widths]
        self.whole = [s for s in bindings.slots if s.decl.name not in widths]
        self.widths = widths
        offset = 0
        self.whole_offsets = {}
        for slot in self.whole:
            offset = align_up(offset, _alignment(slot), "streamed shared region")
            self.whole_offsets[slot.decl.name] = offset
            offset = checked_add(offset, padded(slot.byte_len), "streamed shared region")
        self.params_offsets = []
        for _ in range(2):  # a full chunk's params block and the last chunk's
            offset = align_up(offset, REGION_ALIGN, "streamed params offset")
            self.params_offsets.append(offset)
            offset = checked_add(offset, params_bytes, "streamed params offset")
        self.shared_bytes = align_up(offset, REGION_ALIGN, "streamed shared region")
        # one row's DMA bytes: each cut binding up, back or both
        self.moved_per_row = max(1, sum(widths[s.decl.name] * s.decl.dtype.itemsize * _ways(s.role) for s in self.cut))

    def slot(self, rows: int) -> tuple:
        """(slot bytes, {name: region offset}, {name: region bytes}) for chunks of ``rows``."""
        offset, offsets, sizes = 0, {}, {}
        for slot in self.cut:
            nbytes = checked_mul(rows * self.widths[slot.decl.name], slot.decl.dtype.itemsize, "streamed chunk")
            offset = align_up(offset, _alignment(slot), "streamed slot")
            offsets[slot.decl.name], sizes[slot.decl.name] = offset, padded(nbytes)
            offset = checked_add(offset, sizes[slot.decl.name], "streamed slot")
        return align_up(offset, REGION_ALIGN, "streamed slot"), offsets, sizes

    def held(self, rows: int, streams: int) -> int:
        return checked_add(self.shared_bytes, checked_mul(streams, self.slot(rows)[0], "streamed slots"), "held")


def _ways(role) -> int:
    return 2 if role is BindingRole.INPUT_OUTPUT else 1


def _alignment(slot) -> int:
    return max(REGION_ALIGN, slot.decl.alignment or 1, slot.decl.dtype.itemsize)


def padded(nbytes: int) -> int:
    """The bytes a region of ``nbytes`` takes: whole copy units (COPY_ALIGN)."""
    return align_up(max(nbytes, 1), COPY_ALIGN, "streamed region")  # a zero-byte buffer still gets 16


def fit(geometry, target: int, align: int, streams: int, limit, rows: int, floor: int | None = None) -> tuple:
    """``(chunk rows, streams)``: the target when it fits ``limit``, else keeping streams first,
    the largest multiple of ``align`` that fits; ``(0, 0)`` when nothing does. With ``floor`` (the
    budget's smallest efficient chunk) no smaller chunk is taken, nor fewer streams unless every
    chunk is then in flight at once."""
    if limit is None or geometry.held(target, streams) <= limit:
        return target, streams
    for s in range(streams, 0, -1):
        if geometry.held(target, s) <= limit:
            chunk = target
        elif target < align:  # all rows, fewer than align: one chunk or none
            chunk = 0
        else:
            lo, hi = 0, target // align  # the largest k with held(k * align, s) <= limit
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if geometry.held(mid * align, s) <= limit:
                    lo = mid
                else:
                    hi = mid - 1
            chunk = lo * align
        if floor is None:
            if chunk:
                return chunk, s
        elif chunk and chunk >= floor and (s == streams or -(-rows // chunk) <= s):
            return chunk, s
    return 0, 0


def smallest_budget(geometry, target: int, align: int, streams: int, rows: int, floor: int) -> int:
    """The least limit for which ``fit(..., floor)`` finds a chunk."""
    best = geometry.held(floor, streams)
    for s in range(1, streams):
        chunk = min(rows, -(-max(floor, -(-rows // s)) // align) * align)
        if chunk <= target:
            best = min(best, geometry.held(chunk, s))
    return best


def budget_too_small(geometry, target, align, streams, rows, floor, budget, tuning) -> ValidationError:
    """The error for a budget cutting the rows into chunks that move under ``tuning.min_chunk_bytes``."""
    per_row = geometry.moved_per_row
    chunk, s = fit(geometry, target, align, streams, budget, rows)  # what the budget alone gives
    if chunk:
        count = -(-rows // chunk)
        gives = (
            f"it cuts the {rows:,} rows into {count:,} chunks of {chunk:,} row(s) on {min(s, count)} stream(s), "
            f"each moving {chunk * per_row:,} bytes"
        )
    else:
        gives = f"it holds no chunk of {min(align, rows):,} row(s) ({geometry.held(min(align, rows), 1):,} bytes)"
    smallest = smallest_budget(geometry, target, align, streams, rows, floor)
    least_rows, least_streams = fit(geometry, target, align, streams, smallest, rows, floor)  # what it gives
    if floor < rows:
        rule = f"a chunk must move at least {min(tuning.min_chunk_bytes, floor * per_row):,} bytes"
    else:
        rule = f"a dispatch moving fewer than {tuning.min_chunk_bytes:,} bytes in all must go in one chunk"
    count = -(-rows // least_rows)
    return ValidationError(
        f"DispatchConfig(device_memory_budget={budget:,}) is too small to stream this dispatch: {gives}, "
        f"and {rule} (each chunk costs some 40 us beyond its copies, so smaller chunks stream at under half "
        f"the unbudgeted rate). The smallest budget that works for this dispatch is "
        f"{smallest:,} bytes: {count:,} chunk(s) of {least_rows:,} row(s) on {min(least_streams, count)} stream(s), "
        f"each moving {least_rows * per_row:,} bytes",
        f"pass device_memory_budget >= {smallest:,}, or None",
    )


def no_chunk_fits(geometry, rows: int, limit: int, budget) -> Exception:
    """The error for a limit below the smallest chunk on one stream."""
    needed = geometry.held(rows, 1)
    what = (
        f"{needed:,} device bytes are needed to stream even one chunk of {rows} row(s) "
        f"({geometry.shared_bytes:,} for the inputs that are not cut and the params blocks, "
        f"{geometry.slot(rows)[0]:,} for the chunk)"
    )
    smaller = ", or a smaller align" if rows > 1 else ""
    if budget is not None and budget == limit:
        return ValidationError(
            f"DispatchConfig(device_memory_budget={budget:,}) is too small: {what}",
            f"pass device_memory_budget >= {needed:,}{smaller}",
        )
    return DeviceOutOfMemory(
        f"free device memory ({limit:,} bytes) is too small: {what}",
        f"free device memory (other processes, CudaBackend.trim()), or pass smaller inputs that are not cut{smaller}",
        status="budget",
        call="plan",
    )
