"""The telemetry counters are listed once (_counters.pxd): the core's slots and telemetry's names
cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from vyre_cuda import _counters, telemetry

# the source tree (checkout or unpacked sdist): an installed wheel carries no .pxd files
PACKAGE = Path(__file__).resolve().parents[1] / "vyre_cuda"
SLOT = re.compile(r"^    (T_[A-Z0-9_]+|N_COUNTERS)\b", re.M)


def pxd_slots() -> list[str]:
    return SLOT.findall((PACKAGE / "_counters.pxd").read_text())


def test_telemetry_names_are_the_pxd_slots_in_order():
    slots = pxd_slots()
    assert slots[-1] == "N_COUNTERS", "N_COUNTERS must be the last member (the array size)"
    expected = tuple(s[2:].lower() for s in slots[:-1])
    assert expected == telemetry.COUNTERS
    assert len(expected) == len(set(expected)) == _counters.N_COUNTERS
    # the compiled module's values are the slot positions the core indexes with
    assert [getattr(_counters, s) for s in slots] == list(range(len(slots)))


def test_no_other_module_defines_counter_slots():
    # a second list (the old T_* enum beside a telemetry tuple) is what drifted before
    offenders = []
    for path in sorted(PACKAGE.rglob("*.p[yx][xd]")):
        if path.name == "_counters.pxd":
            continue
        text = path.read_text()
        if re.search(r"^\s+T_[A-Z0-9_]+\s*(=|$|#)", text, re.M) or "N_COUNTERS =" in text:
            offenders.append(path.name)
    assert offenders == []
