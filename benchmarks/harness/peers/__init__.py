"""The peers: the same vecadd round trip written as a user of each library would write it.

Each peer is an optional plugin: one module here per library (``cuda_bindings_peer``,
``cupy_peer``, ``torch_peer``, ``cuda_core_peer``) with a
``start(backend, image, entry, source, a, b, expected)``
that imports its library when called. Nothing here imports a peer's library, or a peer module,
before a run measures that peer: a peer whose library is not installed is skipped with the reason
(:func:`missing_reason`), one that fails to start or gives a wrong result is skipped by the run.
Every peer moves numpy arrays in and out (pageable host memory), as vyre_cuda's numpy row does.

A started peer has ``verify()`` and ``close()``, and the series it measures: ``full(count)`` (the
round trip from numpy), ``launch_only(batches)`` (host time per launch, synchronized between
batches), ``device_resident(count)`` (data already on the device). vyre_cuda's rows on the
peer's own device arrays come from the hooks of :data:`VYRE_HOOKS`: each returns ``(run,
verify)`` for one runner, ``run(count)`` returning ``{series key: samples}``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from dataclasses import dataclass

__all__ = [
    "PEERS",
    "PEER_MODULES",
    "REGISTRY",
    "VYRE_HOOKS",
    "Peer",
    "missing_reason",
    "open_peer",
    "peer_available",
    "peer_version",
]


@dataclass(frozen=True)
class Peer:
    """One peer plugin: its ``name`` in reports (``peer.<name>`` series), the ``library`` it
    needs (a module name) and the ``module`` of this package that implements it."""

    name: str
    library: str
    module: str


REGISTRY = {
    p.name: p
    for p in (
        Peer("cuda_bindings", "cuda.bindings", "cuda_bindings_peer"),
        Peer("cupy", "cupy", "cupy_peer"),
        Peer("torch", "torch", "torch_peer"),
        Peer("cuda_core", "cuda.core", "cuda_core_peer"),
    )
}
PEERS = tuple(REGISTRY)  # the order of the rows in a run
PEER_MODULES = {name: p.library for name, p in REGISTRY.items()}
# A peer's optional hooks that measure vyre_cuda on that peer's device arrays: the hook's name,
# what the runner is called, and whether it counts launch batches (runs only where the launch-only
# series run, in batches of LAUNCH_BATCH) instead of dispatches.
VYRE_HOOKS = (
    ("vyre_device", "vyre_cuda device-resident ({name} arrays)", False),
    ("vyre_device_zeroed", "vyre_cuda device-resident, output declared zeroed ({name} arrays)", False),
    ("vyre_device_out", "vyre_cuda outputs='device' ({name} arrays)", False),
    ("vyre_enqueue", "vyre_cuda dispatch_async enqueue ({name} stream)", True),
    ("vyre_enqueue_foreign", "vyre_cuda dispatch_async enqueue, arrays of another stream ({name})", True),
    ("vyre_enqueue_devarray", "vyre_cuda dispatch_async enqueue, vyre_cuda DeviceArrays ({name} stream)", True),
)


def peer_available(name):
    """Whether the peer's library is importable (without importing it)."""
    try:
        return importlib.util.find_spec(REGISTRY[name].library) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken spec
        return False


def missing_reason(name):
    """Why a run skips peer ``name`` when its library is not importable."""
    return f"{REGISTRY[name].library} is not installed"


def open_peer(name, backend, compiled_image, entry, source, a, b, expected):
    """Start peer ``name`` on the arrays ``a`` and ``b``; ``verify()`` compares its output with
    ``expected``. The peer's warnings are silenced."""
    module = importlib.import_module(f"{__name__}.{REGISTRY[name].module}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return module.start(backend, compiled_image, entry, source, a, b, expected)


def peer_version(name):
    """The peer library's version, when it was imported."""
    mod = sys.modules.get(REGISTRY[name].library)
    return getattr(mod, "__version__", None) if mod is not None else None
