"""The tight floor's rows: the fewest driver calls a vecadd round trip can take, issued and as a
graph replay, with each of the three waits.

Series (keys): ``floor.tight.<wait>`` and ``floor.tight_graph.<wait>``
(:meth:`~vyre_cuda.profile._floor.Floor.tight`) for each wait of :data:`WAITS`. After the rounds,
:func:`add_fastest` gives each family its fastest wait's summary under the family's own key
(``floor.tight``...): the floor is the fastest wait of its kind.
"""

from __future__ import annotations

import numpy as np

from .engine import Runner

__all__ = ["FAMILIES", "TIGHT", "TIGHT_GRAPH", "WAITS", "add_fastest", "fastest_wait", "tight_runners", "wait_key"]

WAITS = ("spin", "event", "stream")  # as vyre_cuda.profile._floor.WAITS (importing it needs the build)
TIGHT = "floor.tight"
TIGHT_GRAPH = "floor.tight_graph"
FAMILIES = (TIGHT, TIGHT_GRAPH)
# the names under which a failed row is skipped
TIGHT_GROUP = "floor tight"
TIGHT_GRAPH_GROUP = "floor tight graph"


def wait_key(family: str, wait: str) -> str:
    """The series key of one wait of a family: ``floor.tight.spin``."""
    return f"{family}.{wait}"


def tight_runners(floor, a, b, expected) -> list:
    """One runner per wait, issued and as a graph replay, on ``floor``'s buffers. A failure drops
    the issued rows (group ``floor tight``) or the graph rows (``floor tight graph``, e.g. a driver
    that cannot capture copies) with the reason, not the run."""
    rows = []
    for graph, family, group in ((False, TIGHT, TIGHT_GROUP), (True, TIGHT_GRAPH, TIGHT_GRAPH_GROUP)):
        for wait in WAITS:
            out = np.zeros(floor.n, dtype=np.float32)

            def run(count, wait=wait, graph=graph, family=family, out=out):
                out[:] = 0
                return {wait_key(family, wait): floor.tight(a, b, out, count, wait=wait, graph=graph)}

            def ok(out=out):
                return np.array_equal(out, expected)

            rows.append(Runner(f"{group}, {wait} wait", run, ok, group=group))
    return rows


def fastest_wait(size, family: str) -> str | None:
    """The wait whose median is the lowest in ``family`` of a
    :class:`~vyre_cuda.profile.SizeResult`; None when none was measured."""
    medians = {wait: size.median(wait_key(family, wait)) for wait in WAITS}
    return min((w for w in WAITS if medians[w] is not None), key=medians.__getitem__, default=None)


def add_fastest(size, families=FAMILIES):
    """Give each family measured its fastest wait's summary under the family's key."""
    for family in families:
        wait = fastest_wait(size, family)
        if wait is not None:
            size.systems[family] = size.systems[wait_key(family, wait)]
    return size
