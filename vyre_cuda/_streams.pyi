from typing_extensions import Self, disjoint_base

@disjoint_base
class StreamPool:
    live_streams: int
    live_events: int
    created_streams: int
    created_events: int
    cap: int
    event_cap: int
    closed: bool
    def __new__(cls, cap: int = ..., ctx: int = ..., event_cap: int = ...) -> Self: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def forget_context(self) -> None: ...
