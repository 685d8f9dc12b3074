"""Which dispatches may take the streamed route: the serial blockers and the shared-row rule."""

from __future__ import annotations

from ..errors import DeviceOutOfMemory

__all__ = ["check_serial_budget", "serial_blocker", "shared_rows"]


def serial_blocker(program, config, device_inputs) -> tuple:
    """``(why, fix)`` when this dispatch cannot stream, else ``("", "")``."""
    if not program.elementwise:
        label = program.name or program.kernel.entry
        return (
            f"program {label!r} is not declared elementwise",
            "declare Program(..., elementwise=True) (or the names of the inputs to cut) when row i of "
            "every output depends only on row i of the inputs, or pass streamed=None",
        )
    checks = (
        (config.cooperative, "cooperative=True synchronises the whole grid", "drop cooperative=True"),
        (
            config.grid_override is not None,
            f"grid_override={config.grid_override} fixes the grid of the whole dispatch",
            "drop grid_override (each chunk's grid follows its rows)",
        ),
        (
            config.elements is not None,
            f"elements={config.elements} fixes word 0 of the whole dispatch",
            "drop elements (each chunk's word 0 is its own element count)",
        ),
        (
            config.outputs == "device",
            "outputs='device' keeps every output on the device, so nothing streams back",
            "pass outputs='host'",
        ),
        (config.graph is True, "graph=True replays the launches as one CUDA graph", "drop graph=True"),
        (
            bool(device_inputs),
            f"input(s) {sorted(device_inputs)} are device memory, so there is nothing to upload in chunks",
            "pass host arrays",
        ),
    )
    for hit, why, fix in checks:
        if hit:
            return f"DispatchConfig: {why}", f"{fix}, or pass streamed=None"
    return "", ""


def shared_rows(program, bindings) -> tuple:
    """``(rows, {cut name: elements per row}, why not)``: a row is an element of the smallest cut
    binding; every cut binding holds a whole number of elements per row."""
    counts = {s.decl.name: s.count for s in bindings.slots if s.decl.name in program.elementwise_bindings}
    rows = min(counts.values())
    if rows == 0:
        empty = [n for n, c in counts.items() if c == 0]
        return 0, {}, f"elementwise binding(s) {empty} are empty"
    ragged = {n: c for n, c in counts.items() if c % rows}
    if ragged:
        return (
            0,
            {},
            (
                f"the elementwise bindings' element counts {counts} are not whole multiples of the "
                f"smallest ({rows}), so they share no row"
            ),
        )
    return rows, {n: c // rows for n, c in counts.items()}, ""


def check_serial_budget(config, slab_bytes: int) -> None:
    """Refuse a serial dispatch whose device slab exceeds ``DispatchConfig(device_memory_budget)``."""
    budget = config.device_memory_budget
    if budget is not None and slab_bytes > budget:
        raise DeviceOutOfMemory(
            f"the dispatch needs {slab_bytes:,} bytes of device memory but "
            f"DispatchConfig(device_memory_budget={budget:,}) allows {budget:,}",
            f"raise device_memory_budget to at least {slab_bytes:,}, or split the dispatch into bounded chunks",
            status="budget",
            call="plan",
        )
