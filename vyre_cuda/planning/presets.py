"""Named device capability presets (H200, H100, A100, L4) for planning without a GPU.

Each preset is the :class:`~vyre_cuda.planning.caps.DeviceCaps` the driver reports for that card,
so :func:`vyre_cuda.plan` decides what a dispatch would do there. Compute capability and SM count
come from NVIDIA's datasheets, the block and SM limits from the CUDA C++ Programming Guide
("Compute Capabilities"), total memory from ``nvidia-smi`` (MiB). ``driver_version`` is 0 and
``pci_bus_id`` empty: no driver was asked.

>>> PRESETS["H100"].cc, PRESETS["H100"].sm_count
((9, 0), 132)
>>> sorted(PRESETS)
['A100', 'H100', 'H200', 'L4']
"""

from __future__ import annotations

from types import MappingProxyType

from ..errors import ValidationError
from .caps import DeviceCaps

__all__ = ["PRESETS", "preset"]

_KIB = 1024
_MIB = 1 << 20


def _hopper(name: str, total_memory: int) -> DeviceCaps:
    return DeviceCaps(
        name=name,
        cc=(9, 0),
        sm_count=132,
        max_shared_per_block_optin=227 * _KIB,
        max_threads_per_sm=2048,
        max_blocks_per_sm=32,
        total_memory=total_memory,
    )


PRESETS = MappingProxyType(
    {
        "H200": _hopper("NVIDIA H200 (preset)", 143_771 * _MIB),
        "H100": _hopper("NVIDIA H100 80GB HBM3 (preset)", 81_559 * _MIB),
        "A100": DeviceCaps(
            name="NVIDIA A100-SXM4-80GB (preset)",
            cc=(8, 0),
            sm_count=108,
            max_shared_per_block_optin=163 * _KIB,
            max_threads_per_sm=2048,
            max_blocks_per_sm=32,
            total_memory=81_920 * _MIB,
        ),
        "L4": DeviceCaps(
            name="NVIDIA L4 (preset)",
            cc=(8, 9),
            sm_count=58,
            max_shared_per_block_optin=99 * _KIB,
            max_threads_per_sm=1536,
            max_blocks_per_sm=24,
            total_memory=23_034 * _MIB,
        ),
    }
)
"""Preset name -> :class:`DeviceCaps` (read-only)."""


def preset(device: str | DeviceCaps) -> DeviceCaps:
    """The caps ``device`` names: a preset name (any case) or a :class:`DeviceCaps` itself.

    Raises
    ------
    ValidationError
        ``device`` is neither a preset name nor a DeviceCaps.

    Examples
    --------
    >>> preset("l4").sm_count
    58
    """
    if isinstance(device, DeviceCaps):
        return device
    if isinstance(device, str):
        caps = PRESETS.get(device.upper())
        if caps is not None:
            return caps
    raise ValidationError(
        f"device must be a preset name {sorted(PRESETS)} or a DeviceCaps (got {device!r})",
        'pass device="H200" (or another preset), or DeviceCaps(...) with the figures of your card',
    )
