"""Type stub of the driver floor (vyre_cuda/_floor.pyx)."""

from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

__all__ = ["BLOCK_SIZE", "FLOOR_ENTRY", "FLOOR_SOURCE", "Floor", "FloorKernel", "floor_threaded", "monotonic_ns"]

BLOCK_SIZE: int
FLOOR_ENTRY: str
FLOOR_SOURCE: str

def monotonic_ns() -> int: ...

@disjoint_base
class FloorKernel:
    entry: str
    def __init__(self, context_handle: int, image: bytes, entry: str = ...) -> None: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> FloorKernel: ...
    def __exit__(self, *exc: Any) -> None: ...

@disjoint_base
class Floor:
    n: int
    def __init__(self, kernel: FloorKernel, n: int) -> None: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def full_pinned(
        self,
        a: npt.NDArray[np.float32],
        b: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        iterations: int,
        warmup: int = 0,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def full_pageable(
        self,
        a: npt.NDArray[np.float32],
        b: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        iterations: int,
        warmup: int = 0,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]: ...
    def launch_only(
        self, batches: int, batch_size: int = 256, warmup_batches: int = 1
    ) -> npt.NDArray[np.int64]: ...
    def run_fixed(
        self,
        a: npt.NDArray[np.float32],
        b: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        iterations: int,
    ) -> tuple[int, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Floor: ...
    def __exit__(self, *exc: Any) -> None: ...

class FloorThreadsResult(TypedDict):
    threads: int
    iterations: int
    start_ns: list[int]
    end_ns: list[int]
    elapsed_ns: int
    dispatches_per_s: float
    outputs_ok: bool

def floor_threaded(
    kernel: FloorKernel,
    n: int,
    threads: int,
    iterations: int,
    warmup: int = 0,
    seed: int = 0,
) -> FloorThreadsResult: ...
