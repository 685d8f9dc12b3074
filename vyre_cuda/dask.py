"""Dask integration: one CudaBackend per worker, programs applied chunk by chunk to dask arrays::

    from distributed import Client, LocalCluster
    import vyre_cuda.dask as vd

    client = Client(LocalCluster(n_workers=2))   # one worker per GPU (or dask-cuda's LocalCUDACluster)
    vd.register(client)                          # one backend per worker, on the worker's GPU
    (out,) = vd.map_blocks(prog, x, y)           # dask arrays in, dask arrays out
    out.compute()

Programs travel to the workers by value (pickled with each task); each worker keeps one copy per
program digest, so it plans and compiles a program once however many tasks use it.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Sequence
from functools import partial
from operator import getitem
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import cloudpickle
    import dask.array as da
    import distributed
    from dask.base import tokenize
    from dask.core import flatten
    from dask.highlevelgraph import HighLevelGraph
except ImportError as exc:  # pragma: no cover (exercised where dask is missing)
    raise ImportError(
        f"vyre_cuda.dask needs dask[array] and distributed, which are not installed ({exc})\n"
        "Fix: pip install 'vyre-cuda[dask]'"
    ) from exc

from ._validate import is_int
from .config import as_config
from .errors import BackendError, ValidationError
from .program import Program, require_program

if TYPE_CHECKING:
    from .typing import ConfigLike, InputBuffer

__all__ = [
    "PLUGIN_NAME",
    "VyreCudaPlugin",
    "register",
    "map_blocks",
    "submit",
    "program_key",
    "worker_backend",
    "worker_info",
]

PLUGIN_NAME = "vyre-cuda"


def program_key(program: Program) -> str:
    """A digest of every field of the program (``Program._identity``): programs that differ in any
    field get different keys, equal programs built in different processes the same key. A callable
    ``launch`` enters by its cloudpickle bytes (by reference for a module-level function, by value
    for a lambda or a local function).
    """
    h = hashlib.sha256()
    for name, value in program._identity():
        for raw in (name.encode(), _key_bytes(name, value)):
            h.update(len(raw).to_bytes(8, "little"))  # length-prefixed: no two part lists collide
            h.update(raw)
    return h.hexdigest()


def _key_bytes(name: str, value) -> bytes:
    if not callable(value):
        return repr(value).encode()
    try:
        return b"callable " + cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 (cloudpickle raises what the object's reduction raises)
        raise ValidationError(
            f"Program.{name} {value!r} cannot be pickled ({type(exc).__name__}: {exc}), so the "
            "program cannot travel to the Dask workers",
            f"pass {name} as a binding name or a module-level function",
        ) from None


def _worker_device(device, worker) -> int:
    if callable(device):
        return int(device(worker))
    if device is not None:
        return int(device)
    if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
        # dask-cuda (and anyone pinning a worker to a GPU) lists the worker's GPU first
        return 0
    name = worker.name
    if isinstance(name, (int, np.integer)) or (isinstance(name, str) and name.isdigit()):
        # LocalCluster names its workers 0, 1, ...: spread them over the visible devices
        ordinal = int(name)
        try:
            from . import _driver  # noqa: PLC0415

            return ordinal % _driver.device_count()
        except (BackendError, ImportError):
            return ordinal  # no driver here: a custom backend_factory decides what it means
    return 0


class VyreCudaPlugin(distributed.WorkerPlugin):
    """A Dask worker plugin holding one backend per worker; closed when the worker closes.

    Parameters
    ----------
    device : int, callable or None
        The worker's device ordinal, or ``device(worker) -> int``. None (default): device 0 when
        ``CUDA_VISIBLE_DEVICES`` is set in the worker (dask-cuda lists the worker's own GPU
        first), else the worker's integer name modulo the device count (``LocalCluster`` names
        them 0, 1, ...), else 0.
    backend_factory : callable, optional
        ``backend_factory(ordinal)`` makes the backend (default ``CudaBackend``).
    backend_options : dict, optional
        Keyword arguments of the default ``CudaBackend``.
    """

    name = PLUGIN_NAME

    def __init__(
        self,
        device: int | Callable[[Any], int] | None = None,
        backend_factory: Callable[[int], Any] | None = None,
        backend_options: dict[str, Any] | None = None,
    ) -> None:
        if device is not None and not callable(device) and (not is_int(device) or device < 0):
            raise ValidationError(
                f"device must be None, a non-negative int or a callable (got {device!r})",
                "pass device=None to use each worker's GPU, or an ordinal",
            )
        if backend_factory is not None and backend_options:
            raise ValidationError(
                "backend_options apply to the default CudaBackend; a backend_factory makes its own",
                "pass the options to your backend_factory instead",
            )
        # callables travel by value (cloudpickle): a lambda or a test double defined anywhere works
        self.device = cloudpickle.dumps(device) if callable(device) else device
        self._factory = cloudpickle.dumps(backend_factory) if backend_factory is not None else None
        self.backend_options = dict(backend_options or {})
        self.backend: Any = None  # set by setup, None before it and after teardown
        self.ordinal: int | None = None
        self.programs: dict = {}

    def setup(self, worker: Any) -> None:
        """Create this worker's backend on its device (when registered, or when a worker joins)."""
        device = cloudpickle.loads(self.device) if isinstance(self.device, bytes) else self.device
        self.ordinal = _worker_device(device, worker)
        if self._factory is not None:
            self.backend = cloudpickle.loads(self._factory)(self.ordinal)
        else:
            from .backend import CudaBackend  # noqa: PLC0415

            self.backend = CudaBackend(self.ordinal, **self.backend_options)
        self.programs = {}

    def teardown(self, worker: Any) -> None:
        """Close this worker's backend and forget its programs (worker closed, plugin removed)."""
        backend, self.backend = self.backend, None
        self.programs = {}
        if backend is not None:
            backend.close()

    def program(self, key: str, program: Program) -> Program:
        """This worker's copy of the program with ``key``: the first seen is kept, so later tasks
        hit the plan cache (a callable ``launch`` arrives as a new object with every task, and
        programs compare it by object)."""
        return self.programs.setdefault(key, program)


def _plugin(worker=None) -> VyreCudaPlugin:
    if worker is None:
        try:
            worker = distributed.get_worker()
        except ValueError:
            raise ValidationError(
                "vyre_cuda.dask tasks run on Dask workers, but this code is not running in one",
                "compute through a distributed Client (vyre_cuda.dask.register(client) first)",
            ) from None
    plugin = worker.plugins.get(PLUGIN_NAME)
    if plugin is None or getattr(plugin, "backend", None) is None:
        raise ValidationError(
            f"Dask worker {worker.address} has no vyre_cuda backend: the {PLUGIN_NAME!r} worker "
            "plugin is not registered (or was removed)",
            "call vyre_cuda.dask.register(client) once after creating the client",
        )
    return plugin


def worker_backend() -> Any:
    """The calling Dask worker's backend, inside a task of your own. Raises ValidationError outside
    a worker, or on a worker without the plugin."""
    return _plugin().backend


def worker_info(dask_worker: Any = None) -> dict[str, Any]:
    """What the plugin set up on a worker: ``client.run(vyre_cuda.dask.worker_info)``."""
    worker = dask_worker if dask_worker is not None else distributed.get_worker()
    plugin = worker.plugins.get(PLUGIN_NAME)
    backend = getattr(plugin, "backend", None)
    telemetry = getattr(backend, "telemetry", None)
    return {
        "pid": os.getpid(),
        "name": worker.name,
        "device": getattr(plugin, "ordinal", None),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "backend": repr(backend) if backend is not None else None,
        "programs": len(getattr(plugin, "programs", {}) or {}),
        "telemetry": dict(telemetry.snapshot()) if telemetry is not None else {},
    }


def register(
    client: distributed.Client,
    device: int | Callable[[Any], int] | None = None,
    backend_factory: Callable[[int], Any] | None = None,
    backend_options: dict[str, Any] | None = None,
) -> Any:
    """Register :class:`VyreCudaPlugin` (these are its arguments) on every worker of ``client``,
    now and as workers join. Returns ``client.register_plugin``'s result; raises a worker's error
    if its backend cannot be created."""
    return client.register_plugin(
        VyreCudaPlugin(device=device, backend_factory=backend_factory, backend_options=backend_options)
    )


def _run_block(key, program, config, shape_from, *inputs):
    # the chunk of runtime-sized input ``shape_from`` shapes the runtime-sized (count 0) outputs
    plugin = _plugin()
    shape = np.shape(inputs[shape_from])
    counts = [decl.count for decl in program.outputs]
    if math.prod(shape) == 0:
        # an empty chunk runs nothing: runtime outputs are empty, static ones cleared like a dispatch
        outs = [np.zeros(count, decl.dtype.numpy) for decl, count in zip(program.outputs, counts)]
    else:
        args = [np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x for x in inputs]
        outs = plugin.backend.dispatch(plugin.program(key, program), args, config)
    return tuple(
        out.reshape(shape) if count == 0 else out.reshape((1,) * len(shape) + (count,))
        for out, count in zip(outs, counts)
    )


def _run_dispatch(key, program, config, inputs):
    plugin = _plugin()
    return plugin.backend.dispatch(plugin.program(key, program), inputs, config)


def submit(
    client: distributed.Client,
    program: Program,
    inputs: Sequence[InputBuffer],
    config: ConfigLike = None,
    **kwargs: Any,
) -> distributed.Future:
    """One dispatch on some worker of ``client`` (see :func:`register`): a ``distributed.Future`` of
    the list of outputs (numpy arrays). ``inputs`` travel with the task; ``kwargs`` go to
    ``client.submit`` (``workers=``, ``retries=``, ...). Tasks are not pure by default: hashing
    large inputs to deduplicate them costs more than it saves.
    """
    require_program(program, "vyre_cuda.dask")
    cfg = None if config is None else as_config(config)
    kwargs.setdefault("pure", False)
    return client.submit(_run_dispatch, program_key(program), program, cfg, list(inputs), **kwargs)


def map_blocks(program: Program, *arrays: Any, config: ConfigLike = None, name: str | None = None) -> list[da.Array]:
    """Apply ``program`` to dask arrays chunk by chunk; one dispatch per chunk, on the workers.

    ``arrays`` are the program's inputs in declaration order. Runtime-sized inputs are dask
    arrays (numpy arrays are chunked like the first dask one) of one shape and their declared
    dtypes; each task gets one chunk of each, flattened. Statically sized inputs (numpy, bytes or
    dask arrays) go whole to every task. ``name`` labels the graph's keys (default: the program's
    name, else its kernel entry).

    Returns one dask array per output: a runtime-sized one has the inputs' shape and chunks; a
    static one of ``count`` elements has shape ``numblocks + (count,)``, one row of per-block
    partials per chunk. Each chunk runs on its own, so the program must make sense per chunk.
    """
    require_program(program, "vyre_cuda.dask")
    cfg = None if config is None else as_config(config)  # None: the backend's fastest path
    decls = program.inputs
    if len(arrays) != len(decls):
        names = ", ".join(repr(d.name) for d in decls) or "none"
        raise ValidationError(
            f"program takes {len(decls)} input(s) ({names}) but map_blocks got {len(arrays)} array(s)",
            f"pass exactly {len(decls)} array(s), in declaration order",
        )
    for decl in program.outputs:
        if decl.output_byte_range is not None:
            raise ValidationError(
                f"output {decl.name!r} reads back a byte range {decl.output_byte_range}; map_blocks "
                "needs whole outputs to build the output arrays",
                f"drop output_byte_range from {decl.name!r}",
            )
    runtime = [i for i, d in enumerate(decls) if d.count == 0]
    if not runtime:
        raise ValidationError(
            "the program has no runtime-sized input (count=0) to map over chunk by chunk",
            "declare the input to map over with count=0, or call submit() for one dispatch",
        )
    reference = next((arrays[i] for i in runtime if isinstance(arrays[i], da.Array)), None)
    if reference is None:
        raise ValidationError(
            "map_blocks maps over dask arrays, but no runtime-sized input is one "
            f"(got {', '.join(type(arrays[i]).__name__ for i in runtime)})",
            "wrap the input with dask.array.from_array(x, chunks=...), or call submit() for one dispatch",
        )
    if reference.ndim == 0:
        raise ValidationError(
            "the runtime-sized inputs are 0-d; there is nothing to chunk", "pass arrays with at least one dimension"
        )
    out_ind = tuple(f"d{k}" for k in range(reference.ndim))
    arginds = []
    for i, (decl, value) in enumerate(zip(decls, arrays)):
        if decl.count == 0:
            if isinstance(value, np.ndarray):
                value = da.from_array(value, chunks=reference.chunks) if value.shape == reference.shape else value
            if not isinstance(value, da.Array) or value.shape != reference.shape:
                got = getattr(value, "shape", type(value).__name__)
                raise ValidationError(
                    f"runtime-sized input {i} ({decl.name!r}) must be a dask array of shape "
                    f"{reference.shape}, like the other runtime-sized inputs (got {got})",
                    "pass runtime-sized inputs of one shape (the kernel sees each chunk as flat "
                    "elements, so there is no broadcasting)",
                )
            # (a bf16 buffer takes any 2-byte dtype: its bits)
            if value.dtype.itemsize != 2 if decl.dtype.name == "bf16" else value.dtype != decl.dtype.numpy:
                raise ValidationError(
                    f"input {i} ({decl.name!r}) is a dask array of {value.dtype}, but the buffer is "
                    f"declared {decl.dtype.name}",
                    f"pass x.astype(np.{decl.dtype.numpy}) or declare the buffer with dtype {value.dtype}",
                )
            arginds += [value, out_ind]
        else:
            want = decl.count * decl.dtype.itemsize
            got = value.nbytes if isinstance(value, da.Array) else _nbytes(value, i, decl)
            if got != want:
                raise ValidationError(
                    f"static input {i} ({decl.name!r}) holds {got} bytes; it is declared with "
                    f"count={decl.count} {decl.dtype.name} ({want} bytes)",
                    f"pass exactly {decl.count} {decl.dtype.name} elements",
                )
            if isinstance(value, da.Array):
                # an index of its own: blockwise concatenates it, so every task gets all of it
                arginds += [value, tuple(f"s{i}_{k}" for k in range(value.ndim))]
            else:
                arginds += [value, None]
    key = program_key(program)
    label = (name or program.name or program.kernel.entry).replace("-", "_")
    token = tokenize(key, cfg, *[a.name if isinstance(a, da.Array) else a for a in arrays])
    metas = tuple(np.empty((0,) * reference.ndim, d.dtype.numpy) for d in program.outputs)
    tmp = da.blockwise(
        partial(_run_block, key, program, cfg, runtime[0]),
        out_ind,
        *arginds,
        name=f"vyre-{label}-{token}",
        concatenate=True,
        meta=metas,
        align_arrays=True,
    )
    keys = list(flatten(tmp.__dask_keys__()))
    numblocks = tuple(len(c) for c in tmp.chunks)
    results = []
    for k, decl in enumerate(program.outputs):
        leaf = f"vyre-{label}-{decl.name.replace('-', '_')}-{token}"
        if decl.count == 0:
            dsk = {(leaf,) + key_[1:]: (getitem, key_, k) for key_ in keys}
            chunks, shape = tmp.chunks, tmp.shape
        else:
            dsk = {(leaf,) + key_[1:] + (0,): (getitem, key_, k) for key_ in keys}
            chunks = tuple((1,) * n for n in numblocks) + ((decl.count,),)
            shape = numblocks + (decl.count,)
        graph = HighLevelGraph.from_collections(leaf, dsk, dependencies=[tmp])
        meta = np.empty((0,) * len(shape), decl.dtype.numpy)
        results.append(da.Array(graph, leaf, chunks=chunks, shape=shape, meta=meta))
    return results


def _nbytes(value, index, decl) -> int:
    try:
        return memoryview(value).nbytes
    except (TypeError, ValueError, BufferError):
        raise ValidationError(
            f"input {index} ({decl.name!r}) is a {type(value).__name__}, which does not expose the buffer protocol",
            "pass a numpy array, bytes or a dask array",
        ) from None
