"""Slab layout: every buffer and params block of one dispatch in one device allocation.

The slab and the pinned staging buffer share the layout. Inputs, in-out buffers and params come
first and go up in ONE copy; pure outputs follow, cleared by ONE memset (small ones zeroed in
staging and uploaded instead); adjacent readbacks merge. A read-only device input has no region
(the kernel reads the caller's memory); a read-write one gets a private copy past the outputs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .._accounting import U64_MAX, align_up, bucket_size, checked_add
from ..errors import InvalidProgram
from ..program import BindingRole
from .launch import params_words

__all__ = ["SlabLayout", "plan_layout", "REGION_ALIGN", "COPY_ALIGN", "MERGE_GAP"]

REGION_ALIGN = 256  # every region starts where cudaMalloc would put a fresh allocation
COPY_ALIGN = 16  # async copy lengths are padded to this
MERGE_GAP = 64 * 1024  # copying a gap this small costs less than another driver call
HOST_CLEAR_MAX = 64 * 1024  # outputs up to this size are zeroed in staging and uploaded


@dataclass(frozen=True)
class SlabLayout:
    slab_bytes: int  # bytes of the device slab and of the staging buffer
    upload_end: int  # [0, upload_end) goes host -> device in one copy
    clear: tuple  # (begin, end) cleared on the device with a memset, or (0, 0)
    host_clear: tuple  # (begin, end) zeroed in staging and uploaded with the inputs, or (0, 0)
    arg_offsets: tuple  # slab offset of each buffer argument, binding order
    params_offsets: tuple  # slab offset of each params block (one per launch kind / phase)
    params_blob: bytes  # all params blocks, laid out from params_offsets[0]
    inputs: tuple  # (input index, slab offset, byte_len, zero_end): copy, then zero [off+len, zero_end)
    readbacks: tuple  # (slab offset, copy bytes): merged device -> host copies into staging
    outputs: tuple  # (slab offset, byte_len) per output, declaration order
    h2d_bytes: int  # logical bytes uploaded (inputs + params)
    d2h_bytes: int  # logical bytes read back
    bucket_bytes: int  # pool bucket of the slab
    # (argument position, input index, slab offset or -1 when used in place, byte_len) per device input
    device_args: tuple = ()
    # every input on the device and read-only, every output whole and non-empty: a dispatch
    # writing all its outputs in place needs only [0, params_only_bytes) (0: none can)
    params_only_bytes: int = 0


def _merge(segments):
    merged: list[tuple[int, int]] = []
    for off, length in sorted(segments):
        if merged and off <= merged[-1][0] + merged[-1][1] + MERGE_GAP:
            start = merged[-1][0]
            merged[-1] = (start, max(merged[-1][1], off + length - start))
        else:
            merged.append((off, length))
    return tuple(merged)


def plan_layout(bplan, launch, phase_ranges=(None,), device_inputs=frozenset()) -> SlabLayout:
    """Lay out one dispatch: one params block per ``phase_ranges`` entry (None: no phase words)."""
    offset = 0
    arg_offset = {}
    inputs = []
    h2d = 0

    def place(slot):
        nonlocal offset
        what = f"buffer {slot.decl.name!r} slab offset"
        start = align_up(offset, max(REGION_ALIGN, slot.decl.alignment or 1, slot.decl.dtype.itemsize), what)
        # a zero-byte buffer still gets a non-null, 16-byte region
        offset = checked_add(start, align_up(max(slot.byte_len, 1), COPY_ALIGN, what), what)
        return start

    uploads = [
        s
        for s in bplan.slots
        if s.role in (BindingRole.INPUT, BindingRole.INPUT_OUTPUT) and s.input_index not in device_inputs
    ]
    on_device = [s for s in bplan.slots if s.input_index in device_inputs and s.input_index >= 0]
    for slot in on_device:
        if slot.role is BindingRole.INPUT:
            arg_offset[slot.binding] = 0  # the caller's pointer replaces it per dispatch
    # outputs that start at zero first, so one clear covers them; those the kernel writes in full
    # (zeroed=False) after them, never cleared
    outputs_ = [s for s in bplan.slots if s.role is BindingRole.OUTPUT]
    cleared = [s for s in outputs_ if s.decl.zeroed] + [s for s in outputs_ if not s.decl.zeroed]
    for slot in uploads:
        arg_offset[slot.binding] = start = place(slot)
        inputs.append((slot.input_index, start, slot.byte_len, offset))
        h2d = checked_add(h2d, slot.byte_len, "uploaded bytes")

    blocks = [params_words(bplan, launch, pr) for pr in phase_ranges]
    for words in blocks:
        if any(w > 0xFFFFFFFF for w in words):
            raise InvalidProgram(f"a params word exceeds u32 ({max(words)})", "split the dispatch into bounded chunks")
    block_bytes = align_up(4 * len(blocks[0]), COPY_ALIGN, "params block")
    params_offsets = []
    params_start = align_up(offset, REGION_ALIGN, "params offset")
    offset = params_start
    blob = bytearray()
    for words in blocks:
        params_offsets.append(offset)
        raw = struct.pack(f"<{len(words)}I", *words)
        blob += raw + bytes(block_bytes - len(raw))
        offset = checked_add(offset, block_bytes, "params offset")
        h2d = checked_add(h2d, 4 * len(words), "uploaded bytes")
    upload_end = params_end = offset
    # zero each input's tail up to the next region, so every uploaded byte is defined
    starts = [start for _, start, _, _ in inputs] + [params_start]
    inputs = [(i, start, n, starts[k + 1]) for k, (i, start, n, _) in enumerate(inputs)]

    clear_begin: int | None = None
    clear_end = 0
    for slot in cleared:
        arg_offset[slot.binding] = start = place(slot)
        if slot.decl.zeroed:
            if clear_begin is None:
                clear_begin = start
            clear_end = offset
    clear = (clear_begin, clear_end) if clear_begin is not None else (0, 0)
    host_clear = (0, 0)
    if clear[1] > clear[0] and clear[1] - upload_end <= HOST_CLEAR_MAX:
        # small outputs: zero them in staging and extend the one upload over them
        host_clear, clear = clear, (0, 0)
        upload_end = host_clear[1]
    device_regions = {}
    for slot in on_device:
        if slot.role is not BindingRole.INPUT:  # read-write: a private copy, filled device-to-device
            arg_offset[slot.binding] = device_regions[slot.binding] = place(slot)
    slab_bytes = align_up(offset, REGION_ALIGN, "slab size")

    outputs = []
    segments = []
    d2h = 0
    for slot in bplan.outputs:
        start, end = slot.decl.output_byte_range or (0, slot.byte_len)
        if end > slot.byte_len:
            raise InvalidProgram(
                f"output {slot.decl.name!r}: output_byte_range ({start}, {end}) lies outside its "
                f"{slot.byte_len}-byte buffer",
                f"use a range with end <= {slot.byte_len}",
            )
        length = end - start
        dev = checked_add(arg_offset[slot.binding], start, "readback offset")
        outputs.append((dev, length))
        d2h = checked_add(d2h, length, "read-back bytes")
        if length:
            padded = align_up(length, COPY_ALIGN, "readback length")
            # the padded length is copied only when the slab holds it
            copy = padded if checked_add(dev, padded, "readback end") <= slab_bytes else length
            segments.append((dev, copy))
    bucket = bucket_size(slab_bytes)
    assert slab_bytes <= U64_MAX
    position = {s.binding: k for k, s in enumerate(bplan.slots)}
    device_args = tuple(
        (position[s.binding], s.input_index, device_regions.get(s.binding, -1), s.byte_len) for s in on_device
    )
    return SlabLayout(
        slab_bytes=slab_bytes,
        upload_end=upload_end,
        clear=clear,
        host_clear=host_clear,
        arg_offsets=tuple(arg_offset[s.binding] for s in bplan.slots),
        params_offsets=tuple(params_offsets),
        params_blob=bytes(blob),
        inputs=tuple(inputs),
        readbacks=_merge(segments),
        outputs=tuple(outputs),
        h2d_bytes=h2d,
        d2h_bytes=d2h,
        bucket_bytes=bucket,
        device_args=device_args,
        params_only_bytes=_params_only_bytes(bplan, uploads, device_regions, params_start, params_end),
    )


def _params_only_bytes(bplan, uploads, device_regions, params_start, params_end) -> int:
    # with nothing uploaded the params blocks start the slab
    if uploads or device_regions or not bplan.outputs or params_start != 0:
        return 0
    for slot in bplan.outputs:
        if slot.role is not BindingRole.OUTPUT or slot.decl.output_byte_range is not None or slot.byte_len == 0:
            return 0
    return params_end
