"""The types of vyre_cuda's inputs, outputs and configs, for annotating code that calls it.

Like :mod:`numpy.typing`, this module only names types; nothing here converts or checks a value
(the backend does that, at dispatch). Importing it costs nothing and needs no GPU.

>>> import numpy as np
>>> from vyre_cuda.typing import InputBuffer
>>> def total_bytes(inputs: list[InputBuffer]) -> int:
...     return sum(memoryview(x).nbytes for x in inputs if isinstance(x, np.ndarray))
>>> total_bytes([np.zeros(4, np.float32)])
16
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar, runtime_checkable

import numpy.typing as npt

from ._devarray import DeviceArray
from .config import DispatchConfig

if TYPE_CHECKING:
    from typing_extensions import Buffer
elif sys.version_info >= (3, 12):
    from collections.abc import Buffer
else:
    # (3.10, 3.11 have no Buffer ABC; the aliases below are read by type checkers only)
    Buffer = memoryview

__all__ = [
    "CudaArrayInterface",
    "DLPackArray",
    "DeviceBufferLike",
    "HostBuffer",
    "InputBuffer",
    "OutputBuffer",
    "HostOutput",
    "DispatchOutput",
    "ConfigLike",
    "OutputT",
]


@runtime_checkable
class DLPackArray(Protocol):
    """A device array that exports itself through DLPack (CuPy, PyTorch, JAX, :class:`DeviceArray`).

    Only the two DLPack methods are required; their keyword arguments differ between libraries
    and versions, so any signature is accepted.
    """

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        """A DLPack capsule of the array (the producer's own keyword arguments)."""
        ...

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device type, device ordinal)``: 2 is CUDA memory, 1 the CPU."""
        ...


@runtime_checkable
class CudaArrayInterface(Protocol):
    """A device array that describes itself with ``__cuda_array_interface__`` (Numba, CuPy, ...)."""

    @property
    def __cuda_array_interface__(self) -> Mapping[str, Any]:
        """The CUDA Array Interface mapping: ``data``, ``shape``, ``typestr``, ``strides``, ..."""
        ...


HostBuffer: TypeAlias = npt.NDArray[Any] | Buffer
"""Host memory a dispatch reads or writes: a numpy array (page-locked or not), ``bytes``,
``bytearray``, ``memoryview`` or any other C-contiguous object with the buffer protocol."""

DeviceBufferLike: TypeAlias = DLPackArray | CudaArrayInterface
"""Device memory used in place: anything with ``__dlpack__`` or ``__cuda_array_interface__``."""

InputBuffer: TypeAlias = HostBuffer | DeviceBufferLike
"""One input of a dispatch: host memory (copied to the device) or device memory (read in place)."""

OutputBuffer: TypeAlias = HostBuffer | DeviceBufferLike
"""One caller-owned output of ``dispatch_into``/``result_into``: writable, C-contiguous, of the
declared dtype and at least the output's size."""

HostOutput: TypeAlias = npt.NDArray[Any]
"""One output of a dispatch without a config (``list[HostOutput]``): a new numpy array of the
declared dtype."""

DispatchOutput: TypeAlias = npt.NDArray[Any] | DeviceArray
"""What one output of a dispatch with a config is: a numpy array, or a
:class:`~vyre_cuda.DeviceArray` under ``DispatchConfig(outputs="device")``. ``dispatch`` with a
config is typed ``list[Any]`` (the config's value decides, which a type checker cannot see);
annotate with this alias where the code handles both."""

ConfigLike: TypeAlias = DispatchConfig | dict[str, Any] | None
"""What every ``config=`` parameter takes: a :class:`~vyre_cuda.DispatchConfig`, a dict of its
fields (``{"label": "step"}``) or None (the defaults)."""

OutputT = TypeVar("OutputT", bound=OutputBuffer)
"""The caller's output type, handed back unchanged by ``dispatch_into``/``result_into``."""
