"""Per-dispatch options."""

from __future__ import annotations

import math
import mmap
import operator
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from ._validate import check_flag, is_flag, is_int
from .errors import ValidationError
from .kernel import Interned

__all__ = [
    "DispatchConfig",
    "AutoRegister",
    "as_config",
    "stream_handle",
    "MAX_FIXPOINT_ITERATIONS",
    "MAX_TIMEOUT_S",
]


def _dims(name, value):
    if value is None:
        return None
    if is_int(value):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not 1 <= len(value) <= 3 or not all(is_int(v) for v in value):
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


# A dispatch's launches are enqueued at once and cannot be interrupted: at ~5 us a launch this
# caps one dispatch at seconds, not hours.
MAX_FIXPOINT_ITERATIONS = 1_000_000
MAX_TIMEOUT_S = 1e9  # the longest finite timeout (about 31.7 years)
U32_MAX = 0xFFFFFFFF
U64_MAX = (1 << 64) - 1


def stream_handle(stream) -> int:
    """The CUstream handle (an int) of ``stream``: an object with ``__cuda_stream__`` (cuda.core's
    protocol: ``(version, handle)``), a CuPy stream (``.ptr``), a torch stream (``.cuda_stream``)
    or an int handle."""
    handle = None
    what = type(stream).__name__
    if is_int(stream):
        handle = int(stream)
    elif hasattr(stream, "__cuda_stream__"):
        proto = stream.__cuda_stream__
        proto = proto() if callable(proto) else proto
        if isinstance(proto, tuple) and len(proto) == 2 and is_int(proto[1]):
            handle = int(proto[1])
        else:
            raise ValidationError(
                f"stream {what}.__cuda_stream__ gave {proto!r}, not a (version, handle) pair",
                "pass a stream object following cuda.core's __cuda_stream__ protocol, or the CUstream as an int",
            )
    else:
        for attr in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, numba / cuda-python wrappers
            value = getattr(stream, attr, None)
            if value is not None and not is_int(value):
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    value = None
            if value is not None:
                handle = int(value)
                break
    if handle is None:
        raise ValidationError(
            f"stream must be a CUDA stream (got {what} {_show(stream)})",
            "pass an object with __cuda_stream__ (cuda.core), a CuPy or torch stream, or the CUstream "
            "handle as an int; pass stream=None to use the backend's own streams",
        )
    if not 0 <= handle <= U64_MAX:
        raise ValidationError(
            f"stream handle {_show(handle)} is not a CUstream (an unsigned 64-bit value)",
            "pass the stream object itself, or its handle as a non-negative int",
        )
    return handle


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:12]}... ({len(text)} digits)"


# the True/False/None fields and their fixes
_FLAG_OR_NONE_FIXES = {
    "graph": "pass graph=True to always replay a CUDA graph, False to never, None to let vyre_cuda decide by the "
    "number of launches",
    "streamed": "pass streamed=None to let vyre_cuda decide, True to force the streamed route of an elementwise "
    "program, False to forbid it",
}


def _check_flag_or_none(config, name: str) -> None:
    """A True/False/None field of ``config``, stored as a bool when set."""
    value = getattr(config, name)
    if value is not None:
        if not is_flag(value):
            raise ValidationError(
                f"{name} must be True, False or None (got {type(value).__name__} {value!r})", _FLAG_OR_NONE_FIXES[name]
            )
        object.__setattr__(config, name, bool(value))


def _timeout(t):
    if t is None:
        return None
    if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)):
        raise ValidationError(
            f"timeout must be a number of seconds or None (got {type(t).__name__} {t!r})",
            "pass timeout=None to wait without bound, or seconds > 0",
        )
    try:
        seconds = float(t)
    except OverflowError:  # an int beyond the float range: refused below as too long (or negative)
        seconds = 2 * MAX_TIMEOUT_S if t > 0 else -1.0
    if math.isnan(seconds) or not seconds > 0:
        raise ValidationError(
            f"timeout must be a positive number of seconds or None (got {_show(t)})",
            "pass timeout=None to wait without bound, or seconds > 0",
        )
    if math.isinf(seconds):
        return None  # no bound
    if seconds > MAX_TIMEOUT_S:
        raise ValidationError(
            f"timeout {_show(t)} s exceeds the longest finite timeout, {MAX_TIMEOUT_S:g} s",
            "pass timeout=None (or float('inf')) to wait without bound",
        )
    return seconds


@dataclass(frozen=True, init=False)
class DispatchConfig(metaclass=Interned):
    """Options of one dispatch.

    Parameters
    ----------
    workgroup_override, grid_override : int or tuple of 1 to 3 ints, optional
        Replace the program's block and the derived grid. Under ``grid_override`` word 0 of the
        params block is ``grid[0] * block[0]``, unless ``Program(launch=...)`` or ``elements``
        gives the element count.
    fixpoint_iterations : int, optional
        Repeat the launch (or the phase sequence) that many times, 1 to
        ``MAX_FIXPOINT_ITERATIONS`` (1,000,000).
    cooperative : bool
        Force a cooperative launch (a real bool; ``"no"`` is refused, not truthy).
    label : str, optional
        Names the dispatch in traces.
    timeout : float, optional
        Seconds a blocking wait may take before :class:`~vyre_cuda.DispatchFailed` (the work stays
        in flight, owned by the handle). None or ``float('inf')``: no bound; at most
        ``MAX_TIMEOUT_S`` (1e9 s) otherwise.
    elements : int, optional
        The launch element count of this dispatch (word 0), overriding the program's rule.
    autotune : bool
        Launch with the block width measured fastest for this program, device and size class
        (:meth:`CudaBackend.tune`), measured once on the dispatch's own inputs when not cached.
        Never applied with an override, a multi-dimensional block or a cooperative launch.
    stream : optional
        Run on the caller's CUDA stream: an object with ``__cuda_stream__`` (cuda.core), a CuPy
        or torch stream, or a raw CUstream int (0: the legacy default stream), ordered after the
        work already on it. Stored as the int handle (the object stays referenced); None uses the
        backend's own streams.
    outputs : str
        ``"host"`` (default): numpy arrays; ``"device"``: :class:`vyre_cuda.DeviceArray` objects
        (CuPy and torch wrap them without a copy).
    graph : bool, optional
        Replay the launches as one CUDA graph: True always, False never, None (default) from
        ``planning.dispatch.GRAPH_MIN_LAUNCHES`` launches on.
    streamed : bool, optional
        The streamed route of an elementwise program: chunks of rows pipelined over a few streams
        (uploads, kernels and readbacks overlap; a dispatch may exceed device memory). None
        (default): the planner decides; True: always (refused unless elementwise); False: never.
    device_memory_budget : int, optional
        The most device bytes one dispatch may hold. A dispatch over it streams when its program
        is elementwise and is refused otherwise; None: bounded by free device memory. A budget
        that cuts the streamed route into chunks moving under
        ``planning.stream.STREAM_MIN_CHUNK_BYTES`` (4 MiB) is refused at planning with the
        smallest budget that works (12,584,960 bytes for three float32 buffers of 16 MiB and
        up); a dispatch whose serial route fits the budget runs serially instead.

    A config is immutable. Built again from the same plain values (no stream object), it is the
    config built the first time, so one built in every call costs a lookup.

    Examples
    --------
    >>> DispatchConfig(grid_override=8, timeout=float("inf")).grid_override
    (8, 1, 1)
    """

    # an int or 1 to 3 ints on input; stored as (x, y, z)
    workgroup_override: int | tuple[int, ...] | None = None
    grid_override: int | tuple[int, ...] | None = None
    fixpoint_iterations: int | None = None
    cooperative: bool = False
    label: str | None = None
    timeout: float | None = None
    elements: int | None = None
    autotune: bool = False
    stream: object = None
    outputs: Literal["host", "device"] = "host"
    graph: bool | None = None
    streamed: bool | None = None
    device_memory_budget: int | None = None

    def __init__(
        self,
        workgroup_override: int | tuple[int, ...] | None = None,
        grid_override: int | tuple[int, ...] | None = None,
        fixpoint_iterations: int | None = None,
        cooperative: bool = False,
        label: str | None = None,
        timeout: float | None = None,
        elements: int | None = None,
        autotune: bool = False,
        stream: object = None,
        outputs: Literal["host", "device"] = "host",
        graph: bool | None = None,
        streamed: bool | None = None,
        device_memory_budget: int | None = None,
    ) -> None:
        # one dict update, not a frozen __init__'s object.__setattr__ per field: a config built per
        # dispatch is on the hot path
        self.__dict__.update(
            workgroup_override=workgroup_override,
            grid_override=grid_override,
            fixpoint_iterations=fixpoint_iterations,
            cooperative=cooperative,
            label=label,
            timeout=timeout,
            elements=elements,
            autotune=autotune,
            stream=stream,
            outputs=outputs,
            graph=graph,
            streamed=streamed,
            device_memory_budget=device_memory_budget,
        )
        self.__post_init__()

    def __post_init__(self):
        # only given values are checked: a config built per dispatch stays cheap
        if self.workgroup_override is not None:
            object.__setattr__(self, "workgroup_override", _dims("workgroup_override", self.workgroup_override))
        if self.grid_override is not None:
            object.__setattr__(self, "grid_override", _dims("grid_override", self.grid_override))
        it = self.fixpoint_iterations
        if it is not None:
            if not is_int(it) or not 1 <= it <= MAX_FIXPOINT_ITERATIONS:
                raise ValidationError(
                    f"fixpoint_iterations must be an int in 1..{MAX_FIXPOINT_ITERATIONS:,} or None (got {_show(it)})",
                    "pass fixpoint_iterations=None for one launch, or a positive count; for more "
                    "repetitions, dispatch in a loop (each dispatch can then be interrupted)",
                )
            object.__setattr__(self, "fixpoint_iterations", int(it))
        if self.timeout is not None:
            object.__setattr__(self, "timeout", _timeout(self.timeout))
        if self.label is not None and not isinstance(self.label, str):
            raise ValidationError(
                f"label must be a str or None (got {type(self.label).__name__})",
                "pass label='name-for-traces'",
            )
        for name, what in (
            ("cooperative", "force a cooperative launch"),
            ("autotune", "launch with the measured fastest block width"),
        ):
            if getattr(self, name) is not False:
                flag = check_flag(name, getattr(self, name), fix=f"pass {name}=True to {what}, else leave it False")
                object.__setattr__(self, name, flag)
        _check_flag_or_none(self, "graph")
        n = self.elements
        if n is not None:
            if not is_int(n) or not 1 <= n <= U32_MAX:
                raise ValidationError(
                    f"elements must be an int in 1..{U32_MAX} or None (got {_show(n)})",
                    "pass elements=None for the program's launch rule, or the element count "
                    "the launch covers (word 0 of the params block is a u32)",
                )
            object.__setattr__(self, "elements", int(n))
        if self.stream is not None:
            # equality and hash go by the handle; a stream object is kept referenced (alive)
            if not is_int(self.stream):
                object.__setattr__(self, "_stream_source", self.stream)
            object.__setattr__(self, "stream", stream_handle(self.stream))
        if self.outputs not in ("host", "device"):
            raise ValidationError(
                f"outputs must be 'host' or 'device' (got {self.outputs!r})",
                "pass outputs='device' to keep the outputs in device memory, else leave it 'host'",
            )
        _check_flag_or_none(self, "streamed")
        budget = self.device_memory_budget
        if budget is not None:
            if not is_int(budget) or not 1 <= budget <= U64_MAX:
                raise ValidationError(
                    "device_memory_budget must be a positive int of bytes or None "
                    f"(got {type(budget).__name__} {budget!r})",
                    "pass device_memory_budget=None to be bounded by free device memory only, or a byte "
                    "count such as 4 << 30",
                )
            object.__setattr__(self, "device_memory_budget", int(budget))
        # every dispatch hashes its config for the plan lookup: once here, not 13 fields each time
        try:
            hashed = hash(_config_fields(self))
        except TypeError:
            hashed = None  # an unhashable field: __hash__ raises it where the dispatch looks up
        object.__setattr__(self, "_hash", hashed)

    def __eq__(self, other):
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._hash == other._hash and _config_fields(self) == _config_fields(other)  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        hashed = self._hash  # type: ignore[attr-defined]
        return hash(_config_fields(self)) if hashed is None else hashed

    def __reduce__(self):
        # rebuilt from its fields: the cached hash is per process (salted str hashes)
        return (type(self), _config_fields(self))

    @property
    def iterations(self) -> int:
        """Launches (or phase sequences) per dispatch: ``fixpoint_iterations``, else 1."""
        return self.fixpoint_iterations or 1

    def _without_stream_object(self) -> DispatchConfig:
        """An equal config not keeping the caller's stream object alive (for the plan cache)."""
        if "_stream_source" not in self.__dict__:
            return self
        keyed = object.__new__(type(self))
        keyed.__dict__.update(self.__dict__)
        del keyed.__dict__["_stream_source"]
        return keyed


_CONFIG_FIELDS = tuple(f.name for f in fields(DispatchConfig))
_config_fields = operator.attrgetter(*_CONFIG_FIELDS)  # a config as the tuple of its fields, in C
_DEFAULT = DispatchConfig()


def as_config(config: DispatchConfig | dict[str, Any] | None) -> DispatchConfig:
    """Accept None, a dict of DispatchConfig fields, or a DispatchConfig."""
    if config is None:
        return _DEFAULT
    if isinstance(config, DispatchConfig):
        return config
    if isinstance(config, dict):
        names = set(_CONFIG_FIELDS)
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


@dataclass(frozen=True)
class AutoRegister:
    """The automatic registration policy of a backend (``CudaBackend(auto_register=...)``).

    A host buffer of at least ``min_bytes`` that dispatches see ``after`` times (same page span,
    same owning numpy array) is registered, by default on a worker thread: dispatches meanwhile
    stage it, and move it by direct DMA once the driver's call returns. Registering costs about
    one staging of the same bytes (22-55 GB/s measured on H100 and H200 hosts), so inline it takes
    many dispatches to pay off; on a worker it costs them only host CPU time. Unregistering is paid
    when the array dies (or at ``trim()``/``close()``), about 7 ms per 256 MiB on an H200 host.

    Attributes
    ----------
    min_bytes : int
        Smaller buffers are left to the staging ring, where a copy costs less than a register call.
    after : int
        Sightings before a buffer is registered: 2 (seen again) by default; 1 at first sight.
    background : bool
        Register on a worker thread (default). ``False`` registers inside the dispatch that makes
        the ``after``-th sighting, which then moves it directly.
    """

    min_bytes: int = 4 << 20
    after: int = 2
    background: bool = True

    def __post_init__(self):
        if isinstance(self.min_bytes, bool) or not isinstance(self.min_bytes, int) or self.min_bytes < mmap.PAGESIZE:
            raise ValidationError(
                f"AutoRegister(min_bytes={self.min_bytes!r}) is below one page ({mmap.PAGESIZE} bytes)",
                "pass min_bytes=4 << 20 (the default) or another byte count of at least a page",
            )
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 1:
            raise ValidationError(
                f"AutoRegister(after={self.after!r}) must be a count of sightings of 1 or more",
                "pass after=2 (the default: a buffer seen again) or another whole number of at least 1",
            )
        if not isinstance(self.background, bool):
            raise ValidationError(
                f"AutoRegister(background={self.background!r}) is not a bool",
                "pass background=True (the default: register on a worker thread) or False",
            )


def auto_register_policy(value) -> AutoRegister | None:
    """``CudaBackend(auto_register=value)``'s policy (None: off)."""
    if value is False or value is None:
        return None
    if value is True:
        return AutoRegister()
    if isinstance(value, AutoRegister):
        return value
    raise ValidationError(
        f"auto_register={value!r} is not a bool or an AutoRegister",
        "pass auto_register=True, or vc.AutoRegister(min_bytes=...) to tune the policy",
    )
