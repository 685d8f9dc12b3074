"""Immutable values built again from the same arguments: the value built the first time."""

from typing import Any, TypeVar

__all__ = ["Interned", "register_plain", "LIMIT"]

_T = TypeVar("_T")

LIMIT: int

def register_plain(cls: type) -> None: ...

class Interned(type):
    _interned_values: dict[int, Any] | None
    _interned_limit: int
    def __init__(cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kw: Any) -> None: ...
    def __call__(cls: type[_T], *args: Any, **kw: Any) -> _T: ...
