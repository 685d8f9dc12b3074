"""The hot path's entry points, the plan lookup and the one owner of a dispatch's life (compiled module)."""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, final

import numpy as np

from ._knobs import Knobs
from ._plan_miss import PlanMiss
from ._prepared import Prepared, ResidentBlocks
from ._resources import Resources
from ._transfer import TransferEngine
from ._waits import PendingDispatch
from .telemetry import TimedDispatchResult

_T = TypeVar("_T")

@final
class Core:
    resident_blocks: ResidentBlocks
    lost: tuple[str, str] | None
    on_settled: Any
    trace: int
    device: int
    auto_hook: Callable[[Any, int | None, int | None], None] | None
    wait_mode: int
    fence_on_demand: int
    def __init__(
        self,
        ctx: int,
        device_cap: int,
        pinned_cap: int,
        trace: int = ...,
        device: int = ...,
        chunk_bytes: int = ...,
        n_chunks: int = ...,
        copy_threads: int = ...,
        output_cache: int = ...,
    ) -> None: ...
    @property
    def resources(self) -> Resources: ...
    @property
    def xfer(self) -> TransferEngine: ...
    def counters(self) -> list[int]: ...
    def reset_counters(self) -> None: ...
    def pool_stats(self) -> dict[str, int]: ...
    def trim(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def busy(self) -> int: ...
    @property
    def outstanding(self) -> int: ...
    @property
    def deferred(self) -> int: ...
    def refuse_new(self) -> None: ...
    def reclaim_deferred(self, wait: bool = False) -> int: ...
    def counted(self, fn: Callable[[], _T]) -> _T: ...
    def clear_prepared(self) -> None: ...
    def set_knobs(self, knobs: Knobs) -> None: ...
    def when_settled(self, callback: Callable[[], object]) -> None: ...
    def forget_context(self) -> None: ...
    def prepared_for(self, key: Any) -> Prepared | None: ...
    def insert(self, miss: PlanMiss, prep: Prepared) -> None: ...
    def trace_refused(self, program: Any, config: Any, blocking: bool = ...) -> None: ...
    def dispatch(
        self, program: Any, inputs: Sequence[Any], config: Any = ..., prep: Prepared | None = ...
    ) -> list[Any]: ...
    def dispatch_into(
        self,
        program: Any,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        config: Any = ...,
        prep: Prepared | None = ...,
    ) -> list[Any]: ...
    def dispatch_profiled(
        self,
        program: Any,
        inputs: Sequence[Any],
        config: Any = ...,
        start_ns: int = ...,
        prep: Prepared | None = ...,
    ) -> tuple[list[np.ndarray], tuple[int, ...]]: ...
    def dispatch_async(
        self,
        program: Any,
        inputs: Sequence[Any],
        config: Any = ...,
        timed: bool = ...,
        prep: Prepared | None = ...,
        outputs: Sequence[Any] | None = ...,
    ) -> PendingDispatch: ...
    def dispatch_timed(
        self, program: Any, inputs: Sequence[Any], config: Any = ..., prep: Prepared | None = ...
    ) -> TimedDispatchResult: ...
    @property
    def context_handle(self) -> int: ...
