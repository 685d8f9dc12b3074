"""Planning without a GPU: :func:`plan` decides a dispatch for a named device or given caps.

The plan is the :class:`~vyre_cuda.planning.dispatch.DispatchPlan` that
:meth:`CudaBackend.plan_info <vyre_cuda.CudaBackend.plan_info>` returns, made by the same planning
code. Since nothing is loaded into a device, the kernel is compiled by NVRTC for the device's
architecture (a compile error shows up here, with its log) but not loaded (``function`` and
``barrier`` are 0, ``gate`` None), and a grid-sync route's blocks per SM (the driver's answer
from the function's registers) is :func:`occupancy_bound`'s upper bound unless ``occupancy=``
gives a measured figure.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from ._io_checks import check_host_inputs, host_format
from ._validate import check_int
from .compile import CompiledKernel, compile_kernel, nvrtc_version, program_defines
from .config import as_config
from .errors import KernelCompileFailed, ValidationError
from .planning.caps import DeviceCaps
from .planning.dispatch import DispatchPlan, plan_dispatch
from .planning.presets import preset
from .program import Program, require_program
from .typing import ConfigLike, InputBuffer

__all__ = ["ArraySpec", "OfflineModules", "occupancy_bound", "compile_program", "offline_compile_error", "plan"]


@dataclass(frozen=True)
class ArraySpec:
    """An input described by its shape (element counts per dimension of a C-contiguous buffer) and
    dtype instead of its memory; ``device=True`` for device memory at dispatch (used in place).

    >>> ArraySpec((1000, 3), "f4").nbytes
    12000
    """

    shape: int | tuple[int, ...]
    dtype: npt.DTypeLike
    device: bool = False

    def __post_init__(self) -> None:
        dims = (self.shape,) if isinstance(self.shape, int) else self.shape
        if not isinstance(dims, tuple) or not all(isinstance(d, int) and d >= 0 for d in dims):
            raise ValidationError(
                f"ArraySpec shape must be a non-negative int or a tuple of them (got {self.shape!r})",
                "pass shape=1000 or shape=(1000, 3)",
            )
        try:
            dtype = np.dtype(self.dtype)
        except TypeError:
            raise ValidationError(
                f"ArraySpec dtype {self.dtype!r} is not a numpy dtype",
                'pass a numpy dtype such as np.float32 or "u4"',
            ) from None
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", dtype)

    @property
    def nbytes(self) -> int:
        """The buffer's size in bytes."""
        return int(np.prod(self.shape, dtype=object)) * np.dtype(self.dtype).itemsize


PlanInput: TypeAlias = InputBuffer | ArraySpec
"""One input of :func:`plan`: a buffer (as for a dispatch) or an :class:`ArraySpec`."""


def occupancy_bound(caps: DeviceCaps, threads_per_block: int, shared_bytes: int) -> int:
    """The most blocks of ``threads_per_block`` threads and ``shared_bytes`` of dynamic shared
    memory one SM of ``caps`` can hold, counting threads, blocks and shared memory (not registers).

    >>> from vyre_cuda.planning.presets import PRESETS
    >>> occupancy_bound(PRESETS["H200"], 256, 0), occupancy_bound(PRESETS["L4"], 1024, 0)
    (8, 1)
    """
    blocks = min(caps.max_blocks_per_sm, caps.max_threads_per_sm // max(1, threads_per_block))
    if shared_bytes:
        blocks = min(blocks, caps.max_shared_per_block_optin // shared_bytes)
    return blocks


def compile_program(program: Program, arch: tuple[int, int] | None = None) -> CompiledKernel:
    """Compile ``program``'s kernel as a dispatch would (its defines included), for ``arch``.

    Raises :class:`~vyre_cuda.KernelCompileFailed` with the NVRTC log when it does not compile.
    Needs NVRTC, not a GPU.
    """
    require_program(program, "compile_program()")
    return compile_kernel(program.kernel, arch=arch, defines=program_defines(program))


def offline_compile_error(program: Program, arch: tuple[int, int] = (9, 0)) -> KernelCompileFailed | None:
    """The :class:`~vyre_cuda.KernelCompileFailed` that compiling ``program``'s kernel for ``arch``
    raises, or None when it compiles (or NVRTC is missing: nothing can be said then).

    ``vyre-cuda profile --kernel`` reports it on a machine without a GPU; the default ``arch``
    is the H200's and H100's (9.0).
    """
    try:
        compile_program(program, arch)
    except KernelCompileFailed as exc:
        return None if nvrtc_version() is None else exc
    return None


class OfflineModules:
    """The ``modules`` object planning asks for kernels: compiles, never loads. Each load returns a
    copy of it as the module stand-in: nothing loaded (addresses 0), ``barrier`` nonzero when the
    image defines the grid barrier, like a loaded module's address (plan() zeroes it)."""

    function = 0
    gate = None
    barrier = 0

    def __init__(self, caps: DeviceCaps, occupancy: int | None = None):
        self._caps = caps
        self._occupancy = occupancy

    def load(self, program: Program, bindings: Any) -> tuple[CompiledKernel, OfflineModules]:
        """(compiled kernel, stand-in module) for ``program`` on this object's caps."""
        compiled = compile_program(program, self._caps.cc)
        module = copy.copy(self)
        module.barrier = 1 if b"_vyre_grid_barrier" in bytes(compiled.image) else 0
        return compiled, module

    def ensure_shared(self, nbytes: int) -> None:
        """Nothing to opt in: planning has checked ``nbytes`` against the caps."""

    def occupancy(self, threads_per_block: int, shared_bytes: int) -> int:
        """Blocks per SM of the kernel: the ``occupancy`` given, else :func:`occupancy_bound`."""
        if self._occupancy is not None:
            return self._occupancy
        return occupancy_bound(self._caps, threads_per_block, shared_bytes)


class _DeviceDescription:
    """A memoryless device array of ``typestr``: the reader checks it without a driver call."""

    def __init__(self, typestr):
        self.__cuda_array_interface__ = {"shape": (0,), "typestr": typestr, "data": (0, False), "version": 3}


def _check_device_description(program: Program, index: int, typestr: str) -> None:
    """Refuse device input ``index`` of array-interface ``typestr`` (e.g. ``"<f8"``) as the
    dispatch's device-array reader would."""
    from ._devview import device_input  # noqa: PLC0415 (compiled: loaded for device descriptions only)

    device_input(program, index, _DeviceDescription(typestr), 0, None)


def _length(program: Program, index: int, value: object) -> tuple[int, bool, tuple | None]:
    """(byte length, on the device?, host format) of one input, read from its description only.

    The host format ``(format, itemsize, described)`` is for the element-type check a dispatch makes
    once planned (:func:`~vyre_cuda._io_checks.check_host_inputs`); a device input's is checked here.
    """
    if isinstance(value, ArraySpec):
        dtype = np.dtype(value.dtype)
        if value.device:
            _check_device_description(program, index, dtype.str)
            return value.nbytes, True, None
        exported = host_format(np.empty(0, dtype))
        if exported is None:
            raise ValidationError(
                f"input {index} is described as an ArraySpec of {dtype}, a dtype numpy exports no "
                "buffer of, so a dispatch refuses such an array",
                "describe (and pass) the values in a numeric dtype, e.g. numpy.int64 for datetime64",
            )
        return value.nbytes, False, (exported[0], exported[1], value)
    cai = getattr(value, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        try:
            nbytes = ArraySpec(tuple(cai["shape"]), cai["typestr"]).nbytes
        except (KeyError, TypeError, ValidationError):
            pass  # (malformed: refused below with the buffer's message)
        else:
            _check_device_description(program, index, cai["typestr"])
            return nbytes, True, None
    exported = host_format(value)
    if exported is None:
        raise ValidationError(
            f"input {index} is a {type(value).__name__}: plan() reads host buffers, "
            "__cuda_array_interface__ arrays and ArraySpec descriptions",
            "describe it as vyre_cuda.ArraySpec(shape, dtype, device=True) (a device array) or pass "
            "a numpy array or another C-contiguous buffer",
        )
    fmt, itemsize, nbytes = exported
    return nbytes, False, (fmt, itemsize, value)


def plan(
    program: Program,
    inputs: Sequence[PlanInput],
    config: ConfigLike = None,
    *,
    device: str | DeviceCaps = "H200",
    occupancy: int | None = None,
) -> DispatchPlan:
    """Plan a dispatch of ``program`` on ``inputs`` for a device, without a GPU.

    ``inputs`` holds one entry per input binding, in declaration order: numpy arrays or other
    C-contiguous buffers, device arrays with ``__cuda_array_interface__``, or :class:`ArraySpec`
    descriptions. Only their byte lengths and whether they are device memory enter the plan, as
    for :meth:`CudaBackend.plan_info`; their element types are checked as a dispatch checks them
    (float64 values for an ``f32`` buffer are refused; a uint8 view or ``bytes`` is raw bytes).
    ``config`` is as for a dispatch; ``autotune=True`` plans the declared width (the plan's
    ``tuning`` says so). ``device`` is a preset name (``"H200"``, ``"H100"``, ``"A100"``, ``"L4"``:
    :mod:`vyre_cuda.planning.presets`) or a :class:`DeviceCaps` (``CudaBackend.caps`` of a real
    card). ``occupancy`` is the kernel's blocks per SM (grid-sync and cooperative routes use it;
    default :func:`occupancy_bound`, an upper bound).

    Returns what ``plan_info`` returns on such a device, with ``function`` and ``barrier`` 0 and
    ``gate`` None. Raises :class:`~vyre_cuda.KernelCompileFailed` when the kernel does not compile
    for the device (``.log`` has NVRTC's log), and whatever the same dispatch would raise at
    planning on that device or in its input checks (ValidationError, InvalidProgram,
    UnsupportedFeature, CooperativeResidencyExceeded, DeviceOutOfMemory).

    >>> import numpy as np, vyre_cuda as vc
    >>> prog = vc.builtin_programs.vecadd_f32()
    >>> p = vc.plan(prog, [vc.ArraySpec(1 << 20, np.float32)] * 2, device="A100")
    >>> p.route.kind, p.launch.grid, p.launch.block
    ('regular', (4096, 1, 1), (256, 1, 1))
    """
    require_program(program, "plan()")
    caps = preset(device)
    if occupancy is not None:
        occupancy = check_int("occupancy", occupancy, minimum=0, fix="pass occupancy=None or the blocks per SM, e.g. 8")
    cfg = as_config(config)
    if not isinstance(inputs, Sequence) or isinstance(inputs, (str, bytes)):
        raise ValidationError(
            f"inputs must be a list of buffers or ArraySpecs (got {type(inputs).__name__})",
            "pass a list with one buffer or ArraySpec per input binding",
        )
    # a dispatch's checks in its order: device arrays, lengths, then the host buffers' element types
    sized = [_length(program, i, x) for i, x in enumerate(inputs)]
    lengths = tuple(n for n, _, _ in sized)
    on_device = frozenset(i for i, (_, dev, _) in enumerate(sized) if dev)
    planned = plan_dispatch(program, lengths, cfg, caps, OfflineModules(caps, occupancy), on_device)
    check_host_inputs(planned, [host for _, _, host in sized])
    tuning = "offline plan: autotune measures on a device; the declared width is planned" if cfg.autotune else ""
    return dataclasses.replace(planned, function=0, barrier=0, gate=None, module=None, tuning=tuning)
