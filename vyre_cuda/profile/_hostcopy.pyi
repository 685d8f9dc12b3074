"""Type stub of the timed host copies (vyre_cuda/profile/_hostcopy.pyx)."""

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_COPY_THREADS", "host_copy"]

MAX_COPY_THREADS: int

def host_copy(dst: Any, src: Any, threads: int = 1, iterations: int = 1, warmup: int = 0) -> npt.NDArray[np.int64]: ...
