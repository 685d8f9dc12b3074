"""Grid-sync programs: cooperative and host-split routes of the built-in 3-phase scan."""

import numpy as np
import pytest

from vyre_cuda import DispatchConfig
from vyre_cuda import builtin_programs as bp


@pytest.mark.parametrize("n", [1, 255, 256, 257, 10_000, 200_000, 1_000_000, 10_000_000])
def test_scan_both_routes(backend, rng, n):
    prog = bp.inclusive_scan_u32()
    x = rng.integers(0, 400, n, dtype=np.uint32)
    ref = np.cumsum(x, dtype=np.uint32)
    # natural grid: cooperative when it fits residency, else split
    info = backend.plan_info(prog, [x])
    (y, _) = backend.dispatch(prog, [x])
    np.testing.assert_array_equal(y, ref)
    # cooperative with a resident grid-stride grid
    resident = info.route.resident_limit
    assert resident > 0
    coop_cfg = DispatchConfig(grid_override=(min(resident, (n + 255) // 256),))
    assert backend.plan_info(prog, [x], coop_cfg).route.kind == "cooperative"
    (y_coop, _) = backend.dispatch(prog, [x], coop_cfg)
    np.testing.assert_array_equal(y_coop, ref)
    # forced split: a grid over residency
    split_cfg = DispatchConfig(grid_override=(resident + 1,))
    assert backend.plan_info(prog, [x], split_cfg).route.kind == "split"
    (y_split, _) = backend.dispatch(prog, [x], split_cfg)
    np.testing.assert_array_equal(y_split, ref)
