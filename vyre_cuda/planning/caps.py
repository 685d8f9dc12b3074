"""Device capabilities and the capability check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedFeature
from ..program import KNOWN_REQUIREMENTS

__all__ = ["DeviceCaps", "KNOWN_REQUIREMENTS", "missing_capabilities", "check_capabilities"]


@dataclass(frozen=True)
class DeviceCaps:
    """What one device offers: from the driver (``CudaBackend.caps``), a preset of
    :mod:`vyre_cuda.planning.presets`, or built by hand for :func:`vyre_cuda.plan`. (Free memory
    changes, so it is read when needed, not stored here.)

    Attributes
    ----------
    ordinal, name, pci_bus_id
        Which device (ordinal, the driver's name, its PCI bus id).
    cc : (int, int)
        Compute capability.
    sm_count, warp_size
        Streaming multiprocessors and threads per warp.
    max_threads_per_block, max_block_dim, max_grid_dim
        Launch limits.
    max_shared_per_block, max_shared_per_block_optin
        Dynamic shared memory per block without and with the opt-in (bytes).
    max_threads_per_sm, max_blocks_per_sm
        Residency limits of one SM (they bound a cooperative grid).
    cooperative_launch : bool
        Whether the device and driver offer cooperative launches (grid sync).
    copy_engines : int
        ``CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT``: 2 lets an upload and a readback run at once.
    total_memory : int
        Device memory in bytes (planning budgets 90% of it; 0: no budget check).
    driver_version : int
        The CUDA driver's version (e.g. 13000), 0 when unknown.

    Examples
    --------
    >>> caps = DeviceCaps(cc=(8, 0), sm_count=108)
    >>> caps.arch, caps.supports("bf16"), caps.supports("collectives")
    ('sm_80', True, False)
    """

    ordinal: int = 0
    name: str = "unknown"
    cc: tuple[int, int] = (9, 0)
    sm_count: int = 132
    warp_size: int = 32
    max_threads_per_block: int = 1024
    max_block_dim: tuple[int, int, int] = (1024, 1024, 64)
    max_grid_dim: tuple[int, int, int] = (2147483647, 65535, 65535)
    max_shared_per_block: int = 48 * 1024
    max_shared_per_block_optin: int = 227 * 1024
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    cooperative_launch: bool = True
    copy_engines: int = 2
    total_memory: int = 0
    driver_version: int = 0
    pci_bus_id: str = ""

    @property
    def arch(self) -> str:
        """The compute capability as NVRTC's architecture name, e.g. ``sm_90``."""
        return f"sm_{self.cc[0]}{self.cc[1]}"

    def supports(self, requirement: str) -> bool:
        """Whether the device offers ``requirement`` (``f16``, ``bf16``, ``subgroup``, ``trap``,
        ``cooperative``); other names are not offered by this backend."""
        if requirement == "f16":
            return self.cc >= (5, 3)
        if requirement == "bf16":
            return self.cc >= (8, 0)
        if requirement == "subgroup":
            return self.warp_size > 0
        if requirement == "trap":
            return True
        if requirement == "cooperative":
            return self.cooperative_launch and self.cc >= (6, 0)
        return False  # indirect_dispatch, collectives: not offered by this backend

    def as_dict(self) -> dict[str, Any]:
        """Every field by name (``DeviceCaps(**caps.as_dict())`` rebuilds it)."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def missing_capabilities(program, caps: DeviceCaps) -> list[str]:
    """Every capability the program needs and the device lacks, each with the reason."""
    needed: dict[str, str] = {}
    for decl in program.buffers:
        if decl.dtype.capability:
            needed.setdefault(decl.dtype.capability, f"buffer {decl.name!r} holds {decl.dtype.name}")
    for req in program.requires:
        needed.setdefault(req, "listed in Program.requires")
    if program.grid_sync:
        needed.setdefault("cooperative", "grid_sync=True needs cooperative launch")
    missing = []
    for req, why in needed.items():
        if caps.supports(req):
            continue
        if req == "f16":
            detail = f"f16 needs compute capability 5.3, device has {caps.cc[0]}.{caps.cc[1]}"
        elif req == "bf16":
            detail = f"bf16 needs compute capability 8.0, device has {caps.cc[0]}.{caps.cc[1]}"
        elif req == "cooperative":
            detail = (
                f"cooperative launch needs compute capability 6.0 and driver support "
                f"(device {caps.cc[0]}.{caps.cc[1]}, cooperative_launch={caps.cooperative_launch})"
            )
        else:
            detail = f"{req} is not supported by the CUDA backend"
        missing.append(f"{detail} ({why})")
    return missing


def check_capabilities(program, caps: DeviceCaps) -> None:
    """Raise UnsupportedFeature listing every missing capability in one message."""
    missing = missing_capabilities(program, caps)
    if missing:
        raise UnsupportedFeature(
            f"device {caps.ordinal} ({caps.name}) lacks {len(missing)} capabilit"
            f"{'y' if len(missing) == 1 else 'ies'} this program needs: " + "; ".join(missing),
            "run on a device that offers them, or change the program (buffer dtypes, requires, grid_sync)",
        )
