"""CudaBackend.close()'s teardown, kept in one piece because the order is the point: refuse new
calls, wait for the calls in progress and for the GPU work of the handles still held (or, when the
driver refuses that wait, leave the pools to them), release the registry's ranges before the
context, free the pools, ring, streams and modules, join the copy threads on every path (a lost
context frees nothing), and give the context back once the last handle settles."""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

from . import _driver, _hostreg
from .errors import BackendError

if TYPE_CHECKING:
    from .backend import CudaBackend

log = logging.getLogger("vyre_cuda")

# how long close(), with dispatch handles still held, waits for a graph capture elsewhere on the
# device to end (the driver refuses a context synchronize meanwhile)
CLOSE_CAPTURE_WAIT_S = 10.0


def close(backend: CudaBackend) -> None:
    """``CudaBackend.close``'s work (see its docstring)."""
    if backend._closed:
        return
    core = backend._core
    core.refuse_new()  # from here on every new call is refused with the closed error
    while core.busy:  # a short poll, GIL released: Ctrl-C interrupts it
        time.sleep(0.0002)
    if backend._closed:  # another thread's close() finished meanwhile
        return
    backend._closed = True
    core.clear_prepared()
    freed = core.lost is not None  # (a lost context frees nothing: it went with the fault)
    if not freed:
        try:
            _driver.make_current(backend._ctx)
            synchronize_for_close(core)
        except BackendError as exc:
            log.warning(
                "CudaBackend.close: %s; the pools and modules are freed once its %d dispatch "
                "handle(s) still held are dropped",
                exc.message,
                core.outstanding,
            )
        else:
            core.reclaim_deferred(wait=True)  # dropped handles' work: done now, their blocks back
            _hostreg.REGISTRY.release(backend._holder, explicit=True)  # before the context goes
            free_resources(backend)
            freed = True
    else:
        core.reclaim_deferred()  # (a lost context: written off without a driver call)
    core.resources.stop_threads()
    if freed:
        backend._modules.clear()
    if core.outstanding:  # (they free what they hold as they are dropped; the last gives the context back)
        log.info("CudaBackend.close: %d dispatch handle(s) still held", core.outstanding)
    core.when_settled(functools.partial(release_context if freed else free_and_release, backend))


def free_resources(backend: CudaBackend) -> None:
    """Free the resident params blocks, the pools, the staging ring, the streams and the modules
    (no work of this backend's runs now)."""
    core = backend._core
    try:
        core.resident_blocks.close()
        core.resources.close()
        backend._modules.close()
    except BackendError as exc:
        log.warning("CudaBackend.close: %s", exc.message)


def free_and_release(backend: CudaBackend) -> None:
    """After close() could not wait for the held handles: the last one has settled now."""
    if backend._core.lost is None:
        try:
            _driver.make_current(backend._ctx)
        except BackendError as exc:
            log.warning("CudaBackend.close: %s", exc.message)
        else:
            free_resources(backend)
    backend._modules.clear()
    release_context(backend)


def synchronize_for_close(core) -> None:
    """Wait for the GPU work of the dispatch handles still held. With none held nothing of this
    backend's can still run, so there is no wait, and a graph capture elsewhere on the device
    (which a context synchronize would break) is left alone. With handles held, the driver's
    refusal during a capture is retried for up to ``CLOSE_CAPTURE_WAIT_S``, then raised."""
    if core.outstanding == 0:  # (closed and not busy: it can only fall from here)
        return
    _driver.context_synchronize(CLOSE_CAPTURE_WAIT_S)


def release_context(backend: CudaBackend):
    core = backend._core
    if core.lost is None:
        try:  # what the last handles gave back after close(): the stream-ordered pool
            _driver.make_current(backend._ctx)
            core.resources.close_late()
        except BackendError as exc:
            log.warning("CudaBackend.close: %s", exc.message)
    core.resident_blocks.forget()  # (close() freed them; none is freed once the context goes)
    # a lost backend gives its context back too: the last release destroys a faulted context
    try:
        _driver.release_primary_context(backend.device)
    except BackendError as exc:
        log.warning("CudaBackend.close: %s", exc.message)
    if core.lost is not None:
        core.forget_context()  # what the pools still hold died with the context
