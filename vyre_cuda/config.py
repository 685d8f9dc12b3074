"""Per-dispatch options."""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .errors import ValidationError

__all__ = ["DispatchConfig", "as_config"]


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _dims(name, value):
    if value is None:
        return None
    if _is_int(value):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not 1 <= len(value) <= 3 or not all(_is_int(v) for v in value):
        raise ValidationError(
            f"{name} must be an int or a tuple of 1 to 3 ints (got {value!r})",
            f"pass {name}=(x, y, z) with positive integers",
        )
    dims = tuple(int(v) for v in value) + (1,) * (3 - len(value))
    if any(d <= 0 for d in dims):
        raise ValidationError(
            f"{name} dimensions must all be positive (got {dims})",
            f"pass {name} with every dimension >= 1",
        )
    return dims


@dataclass(frozen=True)
class DispatchConfig:
    """Options of one dispatch.

    ``workgroup_override``/``grid_override`` replace the program's block and the derived grid;
    ``fixpoint_iterations`` repeats the launch (or the phase sequence) that many times;
    ``cooperative`` forces a cooperative launch; ``label`` names the dispatch in traces;
    ``timeout`` (seconds) bounds how long a blocking wait may take before
    :class:`~vyre_cuda.DispatchFailed` is raised (the work is left in flight, owned by the handle).
    """

    workgroup_override: tuple | None = None
    grid_override: tuple | None = None
    fixpoint_iterations: int | None = None
    cooperative: bool = False
    label: str | None = None
    timeout: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "workgroup_override", _dims("workgroup_override", self.workgroup_override))
        object.__setattr__(self, "grid_override", _dims("grid_override", self.grid_override))
        it = self.fixpoint_iterations
        if it is not None:
            if isinstance(it, bool) or not isinstance(it, (int, np.integer)) or it < 1 or it > 2**31 - 1:
                raise ValidationError(
                    f"fixpoint_iterations must be an int in 1..2147483647 or None (got {it!r})",
                    "pass fixpoint_iterations=None for one launch, or a positive count",
                )
            object.__setattr__(self, "fixpoint_iterations", int(it))
        if self.timeout is not None:
            t = self.timeout
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
                raise ValidationError(
                    f"timeout must be a positive number of seconds or None (got {t!r})",
                    "pass timeout=None to wait without bound, or seconds > 0",
                )
        if self.label is not None and not isinstance(self.label, str):
            raise ValidationError(
                f"label must be a str or None (got {type(self.label).__name__})",
                "pass label='name-for-traces'",
            )
        object.__setattr__(self, "cooperative", bool(self.cooperative))

    @property
    def iterations(self) -> int:
        return self.fixpoint_iterations or 1


_DEFAULT = DispatchConfig()


def as_config(config) -> DispatchConfig:
    """Accept None, a dict of DispatchConfig fields, or a DispatchConfig."""
    if config is None:
        return _DEFAULT
    if isinstance(config, DispatchConfig):
        return config
    if isinstance(config, dict):
        names = {f.name for f in fields(DispatchConfig)}
        unknown = sorted(set(config) - names)
        if unknown:
            raise ValidationError(
                f"unknown DispatchConfig option(s) {unknown}",
                f"use only {sorted(names)}",
            )
        return DispatchConfig(**config)
    raise ValidationError(
        f"config must be None, a dict or a DispatchConfig (got {type(config).__name__})",
        "pass config=DispatchConfig(...) or a dict of its fields",
    )
