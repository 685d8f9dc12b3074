from typing import Any

import numpy as np
from typing_extensions import disjoint_base

__all__ = ["DeviceArray", "pointer_device", "dlpack_info", "KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST", "KDL_CUDA_MANAGED"]

KDL_CPU: int
KDL_CUDA: int
KDL_CUDA_HOST: int
KDL_CUDA_MANAGED: int
DLPACK_MAJOR: int
DLPACK_MINOR: int
FLAG_READ_ONLY: int

def pointer_device(ptr: int) -> tuple[int, int]: ...
def dlpack_info(
    capsule: object,
) -> tuple[int, tuple[int, ...], tuple[int, ...] | None, tuple[int, int, int], tuple[int, int], bool]: ...

@disjoint_base
class DeviceArray:
    ptr: int
    nbytes: int
    dtype: np.dtype[Any]
    size: int
    device: int
    def __init__(self, *args: object, **kwargs: object) -> None: ...
    @staticmethod
    def _empty(count: int, dtype: Any, device: int) -> DeviceArray: ...
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
    def copy_to_host(self) -> np.ndarray[Any, Any]: ...
    def numpy(self) -> np.ndarray[Any, Any]: ...
    def __len__(self) -> int: ...
