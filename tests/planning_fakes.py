"""Planning through the real CudaBackend without a device: an H200's caps and a faked driver.

``PlanningDriver`` replaces the Python-level entry points of ``vyre_cuda._driver`` that planning
calls: it reports a device's attributes, hands out module and function handles (a barrier global
when the image defines ``_vyre_grid_barrier``), records shared-memory opt-ins and answers the
occupancy query with a value the test sets. ``planning_backends`` builds one real CudaBackend per
caps over such a driver; ``plan`` then runs ``CudaBackend._plan`` for one of them.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING

import pytest
from helpers import contracts

import vyre_cuda
from vyre_cuda.planning.caps import DeviceCaps

# Warned when the implicit launch covers less than a runtime-sized input (where the package has
# it); the generated programs meet that on purpose, and the test suite turns warnings into errors.
LaunchSizeWarning = getattr(vyre_cuda, "LaunchSizeWarning", None)

H200 = DeviceCaps(
    ordinal=0,
    name="fake H200",
    cc=(9, 0),
    sm_count=132,
    warp_size=32,
    max_threads_per_block=1024,
    max_block_dim=(1024, 1024, 64),
    max_grid_dim=(2147483647, 65535, 65535),
    max_shared_per_block=48 * 1024,
    max_shared_per_block_optin=232_448,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
    cooperative_launch=True,
    total_memory=150_754_820_096,
    driver_version=13000,
)
# a device without cooperative launch: grid-sync programs and cooperative=True must be refused
NO_COOP = DeviceCaps(
    **{**H200.as_dict(), "name": "fake Hopper without cooperative launch", "cooperative_launch": False}
)


class PlanningDriver(contracts.PlanningDriver):
    """The Python-level driver calls planning makes, answered for ``caps`` without a device."""

    def __init__(self, caps: DeviceCaps):
        self.caps = caps
        self.occupancy = 8
        self.next_handle = 0x1000
        self.functions: dict[int, bytes] = {}  # function handle -> image
        self.shared_optin: dict[int, int] = {}  # function handle -> bytes opted in
        self.occupancy_calls: list[tuple[int, int]] = []

    def _handle(self):
        self.next_handle += 0x10
        return self.next_handle

    # the entry points the backend calls
    def init_driver(self):
        pass

    def device_caps(self, ordinal):
        return self.caps.as_dict()

    def retain_primary_context(self, ordinal):
        return 0  # no context: the core then never reaches the driver on its own

    def release_primary_context(self, ordinal):
        pass

    def make_current(self, ctx):
        assert ctx == 0

    def mem_get_info(self):
        total = self.caps.total_memory
        return total - total // 8, total  # (free, total): a device with an eighth in use

    def context_synchronize(self, capture_wait_s=10.0):
        pass

    def load_module(self, image, entry, want_barrier):
        module, function = self._handle(), self._handle()
        self.functions[function] = image
        barrier = self._handle() if want_barrier and b"_vyre_grid_barrier" in image else 0
        return module, function, barrier, 4 if barrier else 0

    def unload_module(self, module):
        pass

    def set_max_dynamic_shared(self, function, nbytes):
        assert function in self.functions
        assert 0 < nbytes <= self.caps.max_shared_per_block_optin, nbytes
        self.shared_optin[function] = nbytes

    def occupancy_blocks_per_sm(self, function, threads, shared):
        assert function in self.functions
        self.occupancy_calls.append((threads, shared))
        return self.occupancy


ENTRY_POINTS = (
    "init_driver",
    "device_caps",
    "retain_primary_context",
    "release_primary_context",
    "make_current",
    "mem_get_info",
    "context_synchronize",
    "load_module",
    "unload_module",
    "set_max_dynamic_shared",
    "occupancy_blocks_per_sm",
)


@contextlib.contextmanager
def planning_backends(caps_list=None):
    """Yield ``({caps name: (backend, driver)}, monkeypatch)``: real CudaBackends over PlanningDrivers."""
    from vyre_cuda import _driver

    made = {}
    with pytest.MonkeyPatch.context() as mp:
        for caps in caps_list or (H200, NO_COOP):
            driver = PlanningDriver(caps)
            for name in ENTRY_POINTS:
                mp.setattr(_driver, name, getattr(driver, name))
            made[caps.name] = (vyre_cuda.CudaBackend(0), driver)
        # the backends keep calling the driver module's attributes: the last driver's, so each
        # planning call below re-points them at its own driver first
        yield made, mp
        for backend, _ in made.values():
            backend.close()


def plan(planners, caps, program, lengths, config, occupancy):
    """CudaBackend._plan for ``caps`` with the occupancy query answering ``occupancy``."""
    from vyre_cuda import _driver

    made, mp = planners
    backend, driver = made[caps.name]
    for name in ENTRY_POINTS:
        mp.setattr(_driver, name, getattr(driver, name))
    driver.occupancy = occupancy
    driver.occupancy_calls.clear()
    with warnings.catch_warnings():
        if LaunchSizeWarning is not None:
            warnings.simplefilter("ignore", LaunchSizeWarning)
        return backend._plan(program, tuple(lengths), config), driver


if TYPE_CHECKING:  # mypy (scripts/lint): the fake implements every member of its contract
    _implements: type[contracts.PlanningDriver] = PlanningDriver


def stub_backend(monkeypatch, caps, **overrides):
    """A real CudaBackend whose driver entry points are constant stubs for ``caps`` (no handles
    tracked, unlike PlanningDriver): planning and validation run for real, and nothing reaches a
    device. ``overrides`` replace single entry points (e.g. ``load_module=``, ``mem_get_info=``)."""
    from vyre_cuda import _driver

    stubs = {
        "init_driver": lambda: None,
        "device_caps": lambda ordinal: caps.as_dict(),
        "retain_primary_context": lambda ordinal: 0,
        "release_primary_context": lambda ordinal: None,
        "make_current": lambda ctx: None,
        "context_synchronize": lambda capture_wait_s=10.0: None,
        "load_module": lambda image, entry, want_barrier: (0, 0, 0, 0),
        "unload_module": lambda module: None,
        "set_max_dynamic_shared": lambda function, nbytes: None,
        "occupancy_blocks_per_sm": lambda function, threads, shared: 8,
        **overrides,
    }
    for name, stub in stubs.items():
        monkeypatch.setattr(_driver, name, stub)
    return vyre_cuda.CudaBackend(0)
