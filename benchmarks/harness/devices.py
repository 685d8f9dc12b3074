"""The multi-GPU scaling row of ``benchmarks/bench_dispatch.py --devices 0,1``.

The same batch of independent vecadd dispatches runs through ``DeviceGroup.map`` on the first
listed device alone, then on every listed device; the row reports both throughputs (dispatches
and bytes per second, medians of a few passes) and their ratio, measured in the same run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from vyre_cuda import builtin_programs

__all__ = ["measure_device_scaling", "format_device_scaling", "parse_devices"]


def parse_devices(text: str) -> tuple:
    """``"0,1"`` -> ``(0, 1)``; refuses anything but distinct non-negative ordinals."""
    from vyre_cuda.errors import ValidationError

    try:
        devices = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        devices = ()
    if not devices or len(set(devices)) != len(devices) or min(devices) < 0:
        raise ValidationError(
            f"--devices wants distinct device ordinals separated by commas (got {text!r})", "pass e.g. --devices 0,1"
        )
    return devices


def measure_device_scaling(devices, nbytes: int = 64 << 20, items: int = 32, passes: int = 3, seed: int = 0) -> dict:
    """Throughput of ``items`` vecadd dispatches of ``nbytes`` per buffer: first device vs all."""
    from vyre_cuda.group import DeviceGroup

    program = builtin_programs.vecadd_f32()
    rng = np.random.default_rng(seed)
    n = max(1, nbytes // 4)
    batches = [[rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)] for _ in range(4)]
    work = [batches[k % len(batches)] for k in range(items)]
    result: dict[str, Any] = dict(devices=list(devices), bytes_per_buffer=n * 4, items=items, passes=passes)
    for label, group_devices in (("first_device", devices[:1]), ("all_devices", devices)):
        with DeviceGroup(list(group_devices)) as group:
            outs = group.map(program, work[: len(batches)])  # warm-up: plans, pools, the ring
            for (a, b), (out,) in zip(batches, outs):
                if not np.array_equal(out, a + b):
                    raise AssertionError(f"DeviceGroup{group_devices}: wrong vecadd result")
            times = []
            for _ in range(passes):
                t0 = time.perf_counter()
                group.map(program, work)
                times.append(time.perf_counter() - t0)
        seconds = statistics.median(times)
        result[label] = dict(
            seconds=seconds,
            dispatches_per_s=items / seconds,
            gbps=items * 3 * n * 4 / seconds / 1e9,  # 2 buffers in + 1 out per dispatch
        )
    result["scaling"] = result["first_device"]["seconds"] / result["all_devices"]["seconds"]
    return result


def format_device_scaling(row: dict) -> str:
    first, every = row["first_device"], row["all_devices"]
    mib = row["bytes_per_buffer"] / 2**20
    return (
        f"\n{len(row['devices'])} device(s) {row['devices']}: DeviceGroup.map of {row['items']} vecadd dispatches, "
        f"{mib:g} MiB per buffer (median of {row['passes']} passes)\n"
        f"  device {row['devices'][0]} alone   {first['seconds'] * 1e3:9.1f} ms  {first['dispatches_per_s']:8.1f} "
        f"dispatches/s  {first['gbps']:6.1f} GB/s\n"
        f"  all listed devices {every['seconds'] * 1e3:9.1f} ms  {every['dispatches_per_s']:8.1f} dispatches/s  "
        f"{every['gbps']:6.1f} GB/s\n"
        f"  scaling {row['scaling']:.2f}x\n"
    )
