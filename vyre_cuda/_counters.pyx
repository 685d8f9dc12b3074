# cython: language_level=3
"""Telemetry counter slots as Python ints (the list itself is _counters.pxd, cimported by the core)."""


def counter_names():
    """The counter names in slot order: each ``T_*`` slot without its prefix, lower case."""
    slots = sorted((value, name) for name, value in globals().items() if name.startswith("T_"))
    if [value for value, _ in slots] != list(range(N_COUNTERS)):
        raise RuntimeError(f"counter slots are not 0..{N_COUNTERS - 1} without gaps: {slots}")
    return tuple(name[2:].lower() for _, name in slots)
