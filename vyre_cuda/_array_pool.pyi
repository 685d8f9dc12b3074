"""Type stub of the DeviceArray pool (vyre_cuda/_array_pool.pyx)."""

from typing_extensions import disjoint_base

from ._pools import BlockPool

@disjoint_base
class ArrayPool(BlockPool):
    @property
    def device(self) -> int: ...
    def __init__(self, cap_bytes: int = ..., ctx: int = ..., device: int = ...) -> None: ...
