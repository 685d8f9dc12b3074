"""Immutable values built again from the same arguments: the value built the first time."""

from typing import Any, TypeVar

from typing_extensions import disjoint_base

__all__ = ["Interned", "register_plain", "remembered_constructor", "LIMIT"]

_T = TypeVar("_T")

LIMIT: int

@disjoint_base
class _Table:
    """The remembered calls of one class or constructor: the arguments' hash -> its entry."""
    def __len__(self) -> int: ...
    def items(self) -> list[tuple[int, Any]]: ...
    def __getitem__(self, h: int, /) -> Any: ...
    def __setitem__(self, h: int, e: Any, /) -> None: ...
    def clear(self) -> None: ...

def register_plain(cls: type) -> None: ...
def remembered_constructor(fn: Any, home: type, instance_attr: str | None = None) -> Any: ...

@disjoint_base
class Interned(type):
    _interned_values: _Table | None
    _interned_limit: int
    def __init__(self, name: str, bases: tuple[type, ...], namespace: dict[str, Any], /, **kw: Any) -> None: ...
    def __call__(self: type[_T], /, *args: Any, **kw: Any) -> _T: ...
