"""The contracts the test fakes implement, written once as Protocols that mypy checks.

* :class:`GroupBackend`: what ``DeviceGroup`` and ``vyre_cuda.dask`` call on each device's backend
  (the numpy fake, tests/fakes.py).
* :class:`ProfiledBackend`: what the profiling harness calls (tests/profile_fakes.py).
* :class:`PlanningDriver`: the entry points of ``vyre_cuda._driver`` that planning calls
  (tests/planning_fakes.py swaps them for an H200's answers).

Each fake subclasses its Protocol, so mypy checks its signatures against it; the real
``CudaBackend`` and the ``_driver`` module are checked against the same Protocols at the end of
this file, so a fake cannot drift from what it stands in for without scripts/lint saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

__all__ = ["Backend", "GroupBackend", "PlanningDriver", "ProfiledBackend"]


class Backend(Protocol):
    """One device's backend: the blocking entry points and ``close``."""

    device: int

    def dispatch(self, program: Any, inputs: Any, config: Any = None) -> list: ...

    def dispatch_into(self, program: Any, inputs: Any, outputs: Any, config: Any = None) -> list: ...

    def close(self) -> None: ...


class GroupBackend(Backend, Protocol):
    """What a ``DeviceGroup`` worker and the Dask plugin use: telemetry (read when present) and
    whether the device was lost."""

    telemetry: Any

    @property
    def lost(self) -> bool: ...


class ProfiledBackend(Backend, Protocol):
    """What ``vyre_cuda.profile`` uses: the context and caps (for the floor), telemetry, the
    async entry point and the stage-clocked dispatch (through ``vyre_cuda.profile.session``)."""

    telemetry: Any  # snapshot() -> dict of counters

    @property
    def context_handle(self) -> int: ...

    @property
    def caps(self) -> Any: ...

    def dispatch_async(self, program: Any, inputs: Any, config: Any = None) -> Any: ...

    def _dispatch_profiled(self, program: Any, inputs: Any, config: Any = None, start_ns: int = 0) -> tuple: ...


class PlanningDriver(Protocol):
    """The Python-level driver calls a CudaBackend makes while it opens and plans."""

    def init_driver(self) -> None: ...

    def device_caps(self, ordinal: int, /) -> dict: ...

    def retain_primary_context(self, ordinal: int, /) -> int: ...

    def release_primary_context(self, ordinal: int, /) -> None: ...

    def make_current(self, ctx: int, /) -> None: ...

    def context_synchronize(self, capture_wait_s: float = ...) -> None: ...

    def load_module(self, image: bytes, entry: str, want_barrier: bool, /) -> tuple[int, int, int, int]: ...

    def unload_module(self, module: int, /) -> None: ...

    def set_max_dynamic_shared(self, function: int, nbytes: int, /) -> None: ...

    def occupancy_blocks_per_sm(self, function: int, threads: int, shared: int, /) -> int: ...


if TYPE_CHECKING:  # the real things meet the same contracts (checked by mypy, never run)
    from vyre_cuda import _driver
    from vyre_cuda.backend import CudaBackend

    def _real_backend(b: CudaBackend) -> tuple[GroupBackend, ProfiledBackend]:
        return b, b

    _real_driver: PlanningDriver = _driver
