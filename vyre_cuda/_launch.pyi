"""Launch: the enqueue routine, launches, graph replay; the cooperative-launch gate (compiled module)."""

from typing import final

@final
class CoopGate:
    def __init__(self, ctx: int = ...) -> None: ...
    def close(self) -> None: ...
