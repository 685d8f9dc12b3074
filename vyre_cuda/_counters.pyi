"""Telemetry counter slots; the T_* ints themselves are listed once, in _counters.pxd."""

N_COUNTERS: int

def counter_names() -> tuple[str, ...]: ...
