from typing import Any

import numpy.typing as npt

from ._devproto import DevView

__all__ = ["device_view", "device_input", "device_output", "host_view", "protocol_of"]

def protocol_of(obj: object) -> str: ...
def device_view(
    obj: object, device: int = 0, stream: int | None = None, after: DevView | None = None
) -> DevView | None: ...
def host_view(obj: object) -> npt.NDArray[Any] | None: ...
def device_input(
    program: Any, i: int, obj: object, device: int, stream: int | None
) -> DevView | npt.NDArray[Any] | None: ...
def device_output(plan: Any, k: int, obj: object, device: int, stream: int | None) -> DevView | None: ...
