class DevicePool:
    cap_bytes: int
    cached_bytes: int
    live_bytes: int
    hits: int
    misses: int
    allocated_bytes: int
    closed: bool
    def __init__(self, cap_bytes: int = ...) -> None: ...
    def trim(self) -> None: ...
    def close(self) -> None: ...
    def cached_blocks(self) -> int: ...

class PinnedPool:
    cap_bytes: int
    cached_bytes: int
    live_bytes: int
    hits: int
    misses: int
    closed: bool
    def __init__(self, cap_bytes: int = ...) -> None: ...
    def trim(self) -> None: ...
    def close(self) -> None: ...
    def cached_blocks(self) -> int: ...

class StreamPool:
    live_streams: int
    live_events: int
    created_streams: int
    created_events: int
    cap: int
    closed: bool
    def __init__(self, cap: int = ...) -> None: ...
    def close(self) -> None: ...
