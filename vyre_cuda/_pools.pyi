from typing_extensions import Self, disjoint_base

@disjoint_base
class BlockPool:
    cap_bytes: int
    cached_bytes: int
    live_bytes: int
    allocated_bytes: int
    hits: int
    misses: int
    alloc_calls: int
    closed: bool
    forgotten: bool
    def __new__(cls, cap_bytes: int = ..., ctx: int = ..., *args: object, **kwargs: object) -> Self: ...
    def trim(self) -> None: ...
    def close(self) -> None: ...
    def forget_context(self) -> None: ...
    def cached_blocks(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def reset_counters(self) -> None: ...

@disjoint_base
class DevicePool(BlockPool):
    stream_ordered: bool
    async_live_bytes: int
    async_high_water: int
    async_allocs: int
    def __init__(self, cap_bytes: int = ..., ctx: int = ..., device: int = ...) -> None: ...
    def reserved_bytes(self) -> int: ...

class PinnedPool(BlockPool):
    def __init__(self, cap_bytes: int = ..., ctx: int = ...) -> None: ...

class HostPool(BlockPool):
    def __init__(self, cap_bytes: int = ..., ctx: int = ...) -> None: ...

@disjoint_base
class ArrayPool(BlockPool):
    @property
    def device(self) -> int: ...
    quarantined_bytes: int
    flushes: int
    refused_flushes: int
    def __init__(self, cap_bytes: int = ..., ctx: int = ..., device: int = ...) -> None: ...

@disjoint_base
class LentBlock:
    @property
    def address(self) -> int: ...

def lend_pinned(pool: PinnedPool, nbytes: int) -> LentBlock: ...
