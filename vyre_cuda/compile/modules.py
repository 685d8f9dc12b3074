"""Loaded kernel modules of one backend: the third cache (beside compile's and the core's plans).

A :class:`ModuleCache` owns each module loaded into the backend's context with its function and
grid-barrier addresses, shared-memory opt-in and cooperative gate. It is bounded (like vyre's,
2,048 modules) and evicts the least recently planned module past that.

An evicted module is unloaded only once nothing can launch from it: every plan made from it holds
it (``DispatchPlan.module``) and every dispatch holds its plan until its GPU work is done. So no
context synchronize is needed (which would break a graph capture elsewhere on the device).
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections import OrderedDict

from .. import _driver
from ..errors import KernelCompileFailed, ValidationError
from ..planning.launch import DEFAULT_SHARED_LIMIT
from . import compile_kernel, program_defines
from .loading import explain_load_failure
from .nvrtc import nvrtc_version

__all__ = ["LoadedModule", "ModuleCache", "CAPACITY"]

CAPACITY = 2048


_log = logging.getLogger("vyre_cuda")

# a module's life: in the cache; evicted, unloaded when its last holder goes; unloaded or forgotten
_CACHED, _EVICTED, _GONE = 0, 1, 2
_state_lock = threading.Lock()  # guards the transitions (the unload itself runs outside it)


class LoadedModule:
    """One module in the backend's context: function, barrier global, shared opt-in, gate."""

    __slots__ = (
        "module",
        "function",
        "barrier",
        "barrier_size",
        "shared_optin",
        "gate",
        "ctx",
        "_state",
        "__weakref__",
    )

    def __init__(self, module, function, barrier, barrier_size, ctx: int = 0):
        from .._launch import CoopGate  # noqa: PLC0415 (the compiled core loads at first use)

        self.module = module
        self.function = function
        self.barrier = barrier
        self.barrier_size = barrier_size
        self.shared_optin = DEFAULT_SHARED_LIMIT
        # cooperative launches of one module share its barrier counter: ordered on the GPU
        self.gate = CoopGate() if barrier else None
        self.ctx = ctx
        self._state = _CACHED

    def _leave(self, *states) -> bool:
        """Move to _GONE if the module is in one of ``states``; True for the one caller that did."""
        with _state_lock:
            if self._state not in states:
                return False
            self._state = _GONE
            return True

    def __del__(self):
        # the last holder of an evicted module went: nothing can launch from it any more (not at
        # interpreter exit: the driver library may already be gone)
        if sys.is_finalizing() or not self._leave(_EVICTED):
            return
        try:
            _driver.make_current(self.ctx)
            self.unload()
        except Exception as exc:  # noqa: BLE001 (a finalizer must not raise)
            _log.warning("unloading an evicted kernel module failed: %s", exc)

    def ensure_shared(self, nbytes: int) -> None:
        """Opt the function into ``nbytes`` of dynamic shared memory (above the 48 KiB default)."""
        if nbytes > self.shared_optin:
            _driver.set_max_dynamic_shared(self.function, nbytes)
            self.shared_optin = nbytes

    def occupancy(self, threads_per_block: int, shared_bytes: int) -> int:
        return _driver.occupancy_blocks_per_sm(self.function, threads_per_block, shared_bytes)

    def unload(self) -> None:
        if self.gate is not None:
            self.gate.close()
        _driver.unload_module(self.module)


class ModuleCache:
    """The modules a backend has loaded, keyed by compiled-kernel key, least recently used first.

    ``on_evict`` runs when a module is evicted (the backend drops its cached plans, which hold
    their modules)."""

    def __init__(self, ctx: int, arch, driver_version: int, capacity: int = CAPACITY, on_evict=None):
        self._ctx = ctx
        self._arch = arch
        self._driver_version = driver_version
        self._capacity = capacity
        self._on_evict = on_evict
        self._modules: OrderedDict = OrderedDict()
        self._evicted: weakref.WeakSet = weakref.WeakSet()  # evicted, still held by plans
        self._lock = threading.RLock()
        # set by close()/clear(): a thread still planning when the backend closed must not load a
        # module nobody would unload (it gets the closed error its next dispatch would get)
        self._closed = False

    def __len__(self) -> int:
        return len(self._modules)

    def load(self, program, bindings):
        """(compiled kernel, :class:`LoadedModule`) for ``program``, compiled and loaded once."""
        compiled = compile_kernel(program.kernel, arch=self._arch, defines=program_defines(program))
        with self._lock:
            if self._closed:
                raise ValidationError(
                    "this CudaBackend is closed",
                    "create a new CudaBackend() (or dispatch inside its `with` block)",
                )
            _driver.make_current(self._ctx)  # planning may run on any thread
            module = self._modules.get(compiled.key)
            if module is not None:
                self._modules.move_to_end(compiled.key)
                return compiled, module
            try:
                handles = _driver.load_module(compiled.image, compiled.entry, True)
            except KernelCompileFailed as exc:
                status = getattr(exc, "status", "")
                if status:
                    message, fix = explain_load_failure(status, compiled.kind, nvrtc_version(), self._driver_version)
                    raise KernelCompileFailed(f"{exc.message}; {message}", fix, log=exc.log) from None
                raise
            module = LoadedModule(*handles, ctx=self._ctx)
            self._modules[compiled.key] = module
            while len(self._modules) > self._capacity:
                self._evict()
            return compiled, module

    def _evict(self) -> None:
        _, module = self._modules.popitem(last=False)
        if self._on_evict is not None:
            self._on_evict()  # the backend drops its cached plans: only dispatches still hold some
        self._evicted.add(module)  # unloaded when its last holder goes (LoadedModule.__del__)
        with _state_lock:
            module._state = _EVICTED
        del module

    @property
    def evicted_held(self) -> int:
        """Evicted modules not unloaded yet: plans of dispatches in flight still hold them."""
        return len(self._evicted)

    def close(self) -> None:
        """Unload every module, evicted ones still held too (the backend has waited for its work)."""
        with self._lock:
            self._closed = True
            while self._modules:
                _, module = self._modules.popitem(last=False)
                if module._leave(_CACHED):
                    module.unload()
            for module in list(self._evicted):
                if module._leave(_EVICTED):
                    module.unload()

    def clear(self) -> None:
        """Forget every module without unloading (their context is gone)."""
        with self._lock:
            self._closed = True
            for module in [*self._modules.values(), *self._evicted]:
                module._leave(_CACHED, _EVICTED)
            self._modules.clear()
