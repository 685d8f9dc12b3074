"""The figure of a :class:`~vyre_cuda.profile.ProfileReport` (needs matplotlib).

Top row: one panel per size, the vyre_cuda dispatch as stacked stage bars beside the floor,
the driver's pageable path, the streamed route and the peers (host time per dispatch). Bottom:
GB/s against the size per system (the streamed rows and, at its one size, the heavy kernel
included), with the DMA ceilings (each direction alone, both at once) and the host memcpy
ceilings measured in the same run as lines.
"""

from __future__ import annotations

from ..errors import UnsupportedFeature
from . import systems
from .specs import format_size

__all__ = ["plot_report", "require_matplotlib", "size_ticks"]

# key, legend label, marker: the systems drawn in the bandwidth panel (effective GB/s)
_BANDWIDTH_SYSTEMS = (
    ("vyre.dispatch", "vyre_cuda, numpy", "o"),
    ("vyre.dispatch_into", "vyre_cuda dispatch_into, numpy", "s"),
    ("vyre.pinned", "vyre_cuda, page-locked", "D"),
    ("vyre.streamed", "vyre_cuda streamed, numpy", "P"),
    ("vyre.streamed_pinned", "vyre_cuda streamed, page-locked", "X"),
    ("vyre.heavy", "heavy kernel streamed, page-locked", "h"),
    ("vyre.heavy_transfer", "heavy's bytes through vecadd, streamed", "8"),
    ("floor.pinned", "floor, pinned staging", "v"),
    ("floor.pageable", "driver's pageable path", "^"),
    ("floor.pinned_direct", "floor, page-locked arrays", "1"),
    ("peer.cuda_bindings", "cuda.bindings", "x"),
    ("peer.cupy", "CuPy", "+"),
    ("peer.torch", "PyTorch", "*"),
)
# bars beside the stage stack: key, tick label
_BARS = (
    ("floor.pageable", "driver\npageable"),
    ("floor.pinned_direct", "floor\npage-locked"),
    ("vyre.rebuilt", "vyre_cuda\nProgram rebuilt"),
    ("vyre.pinned", "vyre_cuda\npage-locked"),
    ("vyre.streamed", "vyre_cuda\nstreamed"),
    ("vyre.streamed_pinned", "streamed\npage-locked"),
    ("peer.cuda_bindings", "cuda.bindings"),
    ("peer.cupy", "CuPy"),
    ("peer.torch", "PyTorch"),
    # data already on the device (no transfers): vyre_cuda and the peers on the same arrays
    ("vyre.device", "vyre_cuda\ndevice (CuPy)"),
    ("vyre.device.zeroed", "vyre_cuda\noutput zeroed"),
    ("vyre.device.out", "vyre_cuda\noutputs=device"),
    ("vyre.device.torch", "vyre_cuda\ndevice (torch)"),
    ("peer.cupy.device", "CuPy\ndevice"),
    ("peer.torch.device", "PyTorch\ndevice"),
    ("peer.cuda_core.device", "cuda.core\ndevice"),
)


# exponent steps between labelled size ticks, fewest labels first that still leave enough
_TICK_STEPS = (1, 2, 4, 6, 8, 10, 20)
_MOST_TICKS = 10


def size_ticks(sizes, most=_MOST_TICKS):
    """The labelled ticks of the size axis: powers of two from the smallest to the largest size,
    every 2**step-th of them where ``step`` is the least of 1, 2, 4... that keeps at most ``most``
    labels (4 KiB, 16 KiB ... 1 GiB, never 10^3), the first at or below the smallest size and the
    last at or above the largest (one step each side of a single size). Returns ``(major,
    minor)``, lists of byte counts; minor ticks stay unlabelled.

    >>> size_ticks([4096, 4 << 20, 1 << 30])[0][:3]
    [4096, 16384, 65536]
    """
    lo = max(1, min(sizes)).bit_length() - 1  # floor(log2)
    hi = (max(max(sizes), 1) - 1).bit_length()  # ceil(log2)
    for step in _TICK_STEPS:
        major = list(range(lo - lo % step, -(-hi // step) * step + 1, step))
        if len(major) <= most:
            break
    if len(major) < 2:  # one size, itself a label: label its neighbours too
        major = [major[0] - step, major[0], major[0] + step]
    minor = [e for e in range(min(major), max(major) + 1) if e not in major]
    return [1 << e for e in major if e >= 0], [1 << e for e in minor if e >= 0]


def _size_axis(ax, sizes):
    """A log-2 size axis labelled in KiB, MiB and GiB at whole powers of two."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    major, minor = size_ticks(sizes)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(major))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: format_size(round(value))))
    ax.xaxis.set_minor_locator(FixedLocator(minor))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlim(major[0] / 2**0.5, major[-1] * 2**0.5)  # the labels bracket every size


def require_matplotlib():
    """matplotlib's ``Figure``; UnsupportedFeature (with a Fix) when it is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise UnsupportedFeature(
            "plotting needs matplotlib, which is not installed",
            "pip install matplotlib (or vyre-cuda[plot]), or run without --plot",
        ) from None
    return Figure


def _palette(n):
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


def _time_scale(s):
    slowest = max((v.median for v in s.systems.values()), default=0.0)
    return ("ms", 1e6) if slowest >= 10_000_000 else ("us", 1e3)


def _stage_panel(ax, report, s, palette, legend):
    unit, scale = _time_scale(s)
    names = list(report.stage_names) + [systems.UNATTRIBUTED]
    labels = []
    x = 0
    if s.stages:
        bottom = 0.0
        for i, name in enumerate(names):
            sm = s.stages.get(name)
            height = 0.0 if sm is None else max(sm.median, 0.0) / scale
            bar = ax.bar(x, height, bottom=bottom, color=palette[i], width=0.7)
            legend.setdefault(name, bar)
            bottom += height
        labels.append("vyre_cuda\n(stages)")
        x += 1
    if "vyre.dispatch" in s.systems:
        ax.bar(x, s.systems["vyre.dispatch"].median / scale, color="0.35", width=0.7)
        labels.append("vyre_cuda")
        x += 1
    if "floor.pinned" in s.systems:
        total = s.systems["floor.pinned"].median / scale
        enq = s.median("floor.pinned_enqueue")
        enq = total if enq is None else enq / scale
        legend.setdefault("floor enqueue part", ax.bar(x, enq, color=palette[-2], width=0.7))
        legend.setdefault(
            "floor wait + copy-out", ax.bar(x, max(total - enq, 0.0), bottom=enq, color=palette[-1], width=0.7)
        )
        labels.append("floor\npinned")
        x += 1
    for key, label in _BARS:
        if key in s.systems:
            ax.bar(x, s.systems[key].median / scale, color="0.6", width=0.7)
            labels.append(label)
            x += 1
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=50, ha="right", fontsize=7)
    ax.set_ylabel(f"host time per dispatch, {unit} (median)", fontsize=8)
    ax.set_title(f"{format_size(s.nbytes)} per buffer", fontsize=9)


def _ceiling_series(report):
    keys: set[str] = set()
    for s in report.sizes:
        keys.update(k for k in s.systems if k.startswith("ceiling."))
    return sorted(keys, key=systems.order)


def _ceiling_style(key):
    # DMA in black (both directions at once solid: the streamed route's ceiling), host memcpy in
    # olive (into pinned) or brown (out of pinned); one thread dotted, N threads dashed.
    if key == "ceiling.dma_both":
        return {"color": "0.0", "linestyle": "-", "linewidth": 1.8}
    if key == "ceiling.dma_h2d":
        return {"color": "0.1", "linestyle": "--"}
    if key == "ceiling.dma_d2h":
        return {"color": "0.1", "linestyle": "-."}
    color = "tab:olive" if key.startswith("ceiling.copy_in.") else "tab:brown"
    return {"color": color, "linestyle": ":" if key.endswith(".1") else "--"}


def _bandwidth_panel(ax, report):
    sizes = [s.nbytes for s in report.sizes]
    for key, label, marker in _BANDWIDTH_SYSTEMS:
        points = [(s.nbytes, s.gbps(key)) for s in report.sizes if s.gbps(key) is not None]
        if points:
            ax.plot(*zip(*points), marker=marker, label=label, linewidth=1.2)
    # vyre_cuda's numpy row per direction, in the numpy row's colour
    for direction, label, marker in (
        ("h2d", "vyre_cuda numpy H2D (stages)", ">"),
        ("d2h", "vyre_cuda numpy D2H (stages)", "<"),
    ):
        points = [
            (s.nbytes, s.direction_gbps(direction)) for s in report.sizes if s.direction_gbps(direction) is not None
        ]
        if points:
            ax.plot(*zip(*points), marker=marker, linestyle=":", color="tab:blue", label=label, linewidth=1.0)
    for key in _ceiling_series(report):
        points = [(s.nbytes, s.gbps(key)) for s in report.sizes if s.gbps(key) is not None]
        if points:
            style = {"linewidth": 1.1, **_ceiling_style(key)}
            ax.plot(*zip(*points), label=systems.label(key).replace(" ceiling", ""), **style)
    _size_axis(ax, sorted(sizes))
    ax.set_xlabel("bytes per buffer (log scale)")
    ax.set_ylabel("GB/s (1 GB/s = 1e9 B/s): effective, or per direction")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title("bandwidth against the DMA and host memcpy ceilings (same run)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1)


def plot_report(report, path):
    """Save the figure of ``report`` to ``path`` (PNG, SVG, PDF: by the suffix); returns the
    matplotlib ``Figure``."""
    Figure = require_matplotlib()
    n = max(len(report.sizes), 1)
    fig = Figure(figsize=(max(4.2 * n, 11.0), 10.5))
    grid = fig.add_gridspec(2, n, height_ratios=(1.0, 1.0), hspace=0.45, wspace=0.45)
    names = list(report.stage_names) + [systems.UNATTRIBUTED]
    palette = _palette(len(names) + 2)
    legend: dict[str, object] = {}  # label -> the first artist drawn with it
    for i, s in enumerate(report.sizes):
        _stage_panel(fig.add_subplot(grid[0, i]), report, s, palette, legend)
    if legend:
        fig.legend(list(legend.values()), list(legend.keys()), loc="upper right", fontsize=7, ncol=1)
    if report.sizes:
        _bandwidth_panel(fig.add_subplot(grid[1, :]), report)
    m = report.meta
    fig.suptitle(
        f"vyre_cuda against the floor, the ceilings and peers: {m.get('device_name', '?')}, "
        f"{str(m.get('date', ''))[:10]}, commit {m.get('commit') or 'unknown'}",
        fontsize=10,
    )
    fig.subplots_adjust(left=0.06, right=0.8, bottom=0.07, top=0.92)
    fig.savefig(str(path), dpi=110)
    return fig
