"""The work of dropped handles, kept until it has finished, then recycled."""

from typing_extensions import disjoint_base

@disjoint_base
class DeferredWork:
    @property
    def pending(self) -> int: ...
