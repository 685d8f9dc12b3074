from typing import Any

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

from ._pools import ArrayPool

__all__ = [
    "DeviceArray",
    "pointer_device",
    "dlpack_info",
    "array_pool_stats",
    "trim_array_pool",
    "KDL_CPU",
    "KDL_CUDA",
    "KDL_CUDA_HOST",
    "KDL_CUDA_MANAGED",
]

KDL_CPU: int
KDL_CUDA: int
KDL_CUDA_HOST: int
KDL_CUDA_MANAGED: int
DLPACK_MAJOR: int
DLPACK_MINOR: int
FLAG_READ_ONLY: int
ARRAY_POOL_CACHE_BYTES: int

def _block_size(nbytes: int) -> int: ...
def _new_array_pool(device: int) -> ArrayPool: ...
def array_pool_stats(device: int = 0) -> dict[str, int]: ...
def trim_array_pool(device: int = 0) -> None: ...
def pointer_device(ptr: int) -> tuple[int, int]: ...
def dlpack_info(
    capsule: object,
) -> tuple[int, tuple[int, ...], tuple[int, ...] | None, tuple[int, int, int], tuple[int, int], bool]: ...

@disjoint_base
class DeviceArray:
    @property
    def ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def size(self) -> int: ...
    @property
    def device(self) -> int: ...
    def __init__(self, *args: object, **kwargs: object) -> None: ...
    @staticmethod
    def _empty(count: int, dtype: npt.DTypeLike, device: int, may_wait: bool = True) -> DeviceArray: ...
    @property
    def shape(self) -> tuple[int]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = ...,
        max_version: tuple[int, int] | None = ...,
        dl_device: Any = ...,
        copy: bool | None = ...,
    ) -> object: ...
    def copy_to_host(self) -> npt.NDArray[Any]: ...
    def numpy(self) -> npt.NDArray[Any]: ...
    def __len__(self) -> int: ...
