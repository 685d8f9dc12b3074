"""The shared argument checks: ints, flags and byte sizes (``require_program`` is in program.py).

The checks raise the caller's error type naming the argument and the value, with the caller's
``Fix:``. A bool is never an int here (``True`` would pass as 1), and a flag is a real bool
(``cooperative="no"`` must not become True by truthiness).
"""

from __future__ import annotations

import numpy as np

from .errors import BackendError, ValidationError

__all__ = ["is_int", "is_flag", "check_int", "check_flag", "check_size", "SIZE_MAX"]

# The largest byte count accepted: sizes are summed in u64, and 2**63 - 1 leaves room for any two.
SIZE_MAX = (1 << 63) - 1


def is_int(value, *, numpy: bool = True) -> bool:
    """Whether ``value`` is an integer (a numpy integer too, unless ``numpy=False``), never a bool."""
    kinds = (int, np.integer) if numpy else int
    return isinstance(value, kinds) and not isinstance(value, bool)


def is_flag(value) -> bool:
    """Whether ``value`` is a real bool (Python's or numpy's)."""
    return isinstance(value, (bool, np.bool_))


def check_int(
    name: str,
    value,
    *,
    fix: str,
    minimum: int | None = None,
    maximum: int | None = None,
    expected: str | None = None,
    numpy: bool = True,
    error: type[BackendError] = ValidationError,
) -> int:
    """``value`` as an int, or ``error("{name} must be {expected} (got {value!r})", fix)``; ``expected``
    defaults to the bounds ("an int in 1..64", "an int >= 1", "an int").

    >>> check_int("window", 3, minimum=1, fix="pass a count")
    3
    >>> check_int("window", 0, minimum=1, fix="pass a count")
    Traceback (most recent call last):
    ...
    vyre_cuda.errors.ValidationError: window must be an int >= 1 (got 0)
    Fix: pass a count
    """
    if (
        not is_int(value, numpy=numpy)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
    ):
        if expected is None:
            if minimum is not None and maximum is not None:
                expected = f"an int in {minimum}..{maximum}"
            elif minimum is not None:
                expected = f"an int >= {minimum}"
            elif maximum is not None:
                expected = f"an int <= {maximum}"
            else:
                expected = "an int"
        raise error(f"{name} must be {expected} (got {value!r})", fix)
    return int(value)


def check_size(name: str, value, *, fix: str) -> int:
    """A byte count: an int in 0..:data:`SIZE_MAX`, else ValidationError."""
    return check_int(name, value, minimum=0, maximum=SIZE_MAX, expected="a non-negative int", fix=fix)


def check_flag(name: str, value, *, fix: str) -> bool:
    """``value`` as a bool, or ValidationError "{name} must be True or False (got {type} {value!r})"."""
    if not is_flag(value):
        raise ValidationError(f"{name} must be True or False (got {type(value).__name__} {value!r})", fix)
    return bool(value)
