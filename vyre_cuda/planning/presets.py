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

# name: (the driver's name, cc, SMs, opt-in shared memory KiB, threads and blocks per SM, total MiB)
_CARDS = {
    "H200": ("NVIDIA H200", (9, 0), 132, 227, 2048, 32, 143_771),
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0), 132, 227, 2048, 32, 81_559),
    "A100": ("NVIDIA A100-SXM4-80GB", (8, 0), 108, 163, 2048, 32, 81_920),
    "L4": ("NVIDIA L4", (8, 9), 58, 99, 1536, 24, 23_034),
}
PRESETS = MappingProxyType(
    {
        key: DeviceCaps(
            name=f"{name} (preset)",
            cc=cc,
            sm_count=sms,
            max_shared_per_block_optin=kib * 1024,
            max_threads_per_sm=threads,
            max_blocks_per_sm=blocks,
            total_memory=mib << 20,
        )
        for key, (name, cc, sms, kib, threads, blocks, mib) in _CARDS.items()
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
