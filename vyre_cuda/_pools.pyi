from typing_extensions import Self, disjoint_base

@disjoint_base
class DevicePool:
    cap_bytes: int
    cached_bytes: int
    live_bytes: int
    hits: int
    misses: int
    allocated_bytes: int
    closed: bool
    def __new__(cls, cap_bytes: int = ...) -> Self: ...
    def trim(self) -> None: ...
    def close(self) -> None: ...
    def cached_blocks(self) -> int: ...

@disjoint_base
class PinnedPool:
    cap_bytes: int
    cached_bytes: int
    live_bytes: int
    hits: int
    misses: int
    closed: bool
    def __new__(cls, cap_bytes: int = ...) -> Self: ...
    def trim(self) -> None: ...
    def close(self) -> None: ...
    def cached_blocks(self) -> int: ...

@disjoint_base
class StreamPool:
    live_streams: int
    live_events: int
    created_streams: int
    created_events: int
    cap: int
    closed: bool
    def __new__(cls, cap: int = ...) -> Self: ...
    def close(self) -> None: ...
