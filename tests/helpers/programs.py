"""Program variants the tests share."""

from __future__ import annotations

import dataclasses

from vyre_cuda.program import BindingRole


def cleared(program):
    """``program`` with every pure output declared zeroed (cleared before each launch): what an
    emulation that accumulates into its output (``out += ...``) needs, since the built-in vecadd
    declares its output ``zeroed=False``."""
    buffers = tuple(dataclasses.replace(b, zeroed=True) if b.role is BindingRole.OUTPUT else b for b in program.buffers)
    return dataclasses.replace(program, buffers=buffers)
