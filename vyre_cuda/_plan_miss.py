"""PlanMiss: the core's answer to a dispatch it holds no prepared plan for (the backend plans it)."""

from __future__ import annotations

__all__ = ["PlanMiss"]


class PlanMiss(Exception):
    """No prepared plan is cached for this dispatch: the backend plans it, hands the plan to
    :meth:`Core.insert` and calls the entry point again with that plan. Raised before anything is acquired for
    the dispatch (its input views are released) and before any trace range opens, so the core
    never calls back into planning. ``key`` is the cache key, ``lengths`` the input byte lengths,
    ``config`` the config to plan with (a caller's stream by its handle), ``device_inputs`` the
    indices of the inputs in device memory, ``inputs`` and (``dispatch_into``) ``outputs`` the
    lists the core read, for the retry (an iterator passed by the caller is used up)."""

    def __init__(self, key: tuple, lengths: tuple, config, device_inputs: frozenset, inputs) -> None:
        super().__init__("no prepared plan")
        self.key, self.lengths, self.config, self.device_inputs = key, lengths, config, device_inputs
        self.inputs = inputs
        self.outputs: list | None = None
