"""Type stub of the driver floor (vyre_cuda/profile/_floor.pyx)."""

from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from typing_extensions import Self, disjoint_base

from ._ceilings import Ceilings

__all__ = ["BLOCK_SIZE", "FLOOR_ENTRY", "FLOOR_SOURCE", "WAITS", "Floor", "FloorKernel"]

BLOCK_SIZE: int
FLOOR_ENTRY: str
FLOOR_SOURCE: str
WAITS: tuple[str, ...]

_F32: TypeAlias = npt.NDArray[np.float32]
_I64: TypeAlias = npt.NDArray[np.int64]

@disjoint_base
class FloorKernel:
    entry: str
    def __init__(self, context_handle: int, image: bytes, entry: str = ...) -> None: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...

@disjoint_base
class Floor(Ceilings):
    def __init__(self, kernel: FloorKernel, n: int) -> None: ...
    def full_pinned(self, a: _F32, b: _F32, out: _F32, iterations: int, warmup: int = 0) -> tuple[_I64, _I64]: ...
    def full_pageable(self, a: _F32, b: _F32, out: _F32, iterations: int, warmup: int = 0) -> tuple[_I64, _I64]: ...
    def full_pinned_direct(
        self, a: _F32, b: _F32, out: _F32, iterations: int, warmup: int = 0
    ) -> tuple[_I64, _I64]: ...
    def launch_only(self, batches: int, batch_size: int = 256, warmup_batches: int = 1) -> _I64: ...
    def tight(
        self, a: _F32, b: _F32, out: _F32, iterations: int, warmup: int = 0, wait: str = "spin", graph: bool = False
    ) -> _I64: ...
