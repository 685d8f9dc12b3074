"""The figure of a :class:`~vyre_cuda.profile.ProfileReport` (needs matplotlib).

Three panels (four with a benchmark's device rows), each with at most six series and its legend
beside it:

* **numpy arrays in and out**: each system's time per dispatch over vyre_cuda's (the driver
  floor, the driver's pageable path, and the systems a caller adds), by size, log-log; above 1x
  the system is slower than vyre_cuda.
* **data already on the GPU** (only with ``device_rows``): the same ratio for systems on their own
  device arrays, against vyre_cuda on the same arrays (same y axis).
* **where vyre_cuda's time goes**: the stage clocks in five groups, as shares of each size's
  dispatch, the median time above each bar.
* **bandwidth against the ceilings**: vyre_cuda's effective GB/s (numpy, and streamed rows when
  the result has them) against the DMA ceilings (one way, both ways) and the N-thread host memcpy
  ceiling of the same run; a ceiling above the axis is marked with its value.
"""

from __future__ import annotations

from ..errors import UnsupportedFeature
from . import systems
from .specs import format_size

__all__ = ["VYRE_COLOR", "plot_report", "require_matplotlib", "size_ticks"]

VYRE_COLOR = "#d62728"  # vyre_cuda's series, in every panel
_FLOORS = (  # key, label, colour, marker (dashed: the harness's own driver-API loops)
    ("floor.pinned", "per-buffer floor (pinned staging)", "0.1", "s"),
    ("floor.pageable", "driver, pageable copies", "0.55", "v"),
)
# label, colour, stages (a stage not named here counts as "other"); the host copies in oranges,
# no colour a system has in the other panels
_STAGE_GROUPS = (
    ("upload (staging memcpy, H2D)", "#fd8d3c", systems.UPLOAD_STAGES),
    ("launch (clears, parameters, event)", "#bcbd22", ("clears", "params_upload", "launch", "event_record")),
    ("wait for the GPU", "#9e9ac8", ("wait",)),
    ("readback (D2H, copy out)", "#fdd0a2", systems.READBACK_STAGES),
    ("other (plan lookup, release, unattributed)", "#d9d9d9", ()),
)
_BANDWIDTH_VYRE = (  # key, label, colour (vyre_cuda's, lighter or darker), marker
    ("vyre.dispatch", "vyre_cuda, numpy", VYRE_COLOR, "o"),
    ("vyre.streamed", "vyre_cuda streamed, numpy", "#ff9896", "s"),
    ("vyre.streamed_pinned", "vyre_cuda streamed, page-locked", "#7f0000", "D"),
)
_MOST = 6  # series per panel
# a value above the axis: written just under its top
_OFF_AXIS = {"xytext": (0, -3), "textcoords": "offset points", "ha": "center", "va": "top", "fontsize": 7}
_LEGEND = {"fontsize": 8, "loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0, "frameon": False}

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


def _size_axis(ax, sizes, most=_MOST_TICKS):
    """A log-2 size axis labelled in KiB, MiB and GiB at whole powers of two (at most ``most``)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    major, minor = size_ticks(sizes, most)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(major))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: format_size(round(value))))
    ax.xaxis.set_minor_locator(FixedLocator(minor))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlim(major[0] / 2**0.5, major[-1] * 2**0.5)  # the labels bracket every size
    ax.set_xlabel("bytes per buffer", fontsize=9)


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


def _empty(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, color="0.4", transform=ax.transAxes)
    ax.set_axis_off()


def _ratio_series(sizes, rows):
    """``rows``: (style, key, vyre_cuda's keys, the first measured is used); each row's time over
    vyre_cuda's per size, a row with no point left out."""
    out = []
    for style, key, vyre_keys in rows:
        vyre = [next((s.median(k) for k in vyre_keys if s.median(k)), None) for s in sizes]
        points = [(s.nbytes, s.median(key) / v) for s, v in zip(sizes, vyre) if v and s.median(key)]
        if points:
            out.append((style, points))
    return out[: _MOST - 1]  # and vyre_cuda's own line at 1x


def _ratio_panel(ax, sizes, series, title, empty, most=_MOST_TICKS):
    ax.set_title(title, fontsize=10, loc="left")
    if not series:
        return _empty(ax, empty)
    ax.set_yscale("log")
    vyre = ax.axhline(1.0, color=VYRE_COLOR, linewidth=2.5, label="vyre_cuda (= 1x)", zorder=3)
    ends = {vyre: (sizes[-1].nbytes, 1.0)}  # line -> its last point
    for style, points in series:
        (line,) = ax.plot(*zip(*points), linewidth=1.6, markersize=6, **style)
        ends[line] = points[-1]
    _size_axis(ax, [s.nbytes for s in sizes], most)
    ax.set_ylabel("time per dispatch / vyre_cuda's\n(above 1x: vyre_cuda is faster)", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    # the legend lists the lines top to bottom as they end (the largest size first)
    order = sorted(ends, key=lambda line: (-ends[line][0], -ends[line][1]))
    ax.legend(order, [line.get_label() for line in order], **_LEGEND)


def _ratio_axis(axes, series):
    """One log y range for the ratio panels, ticked at 1, 2, 5 x 10^k (more in a short range)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    values = [1.0] + [y for _style, points in series for _x, y in points]
    lo, hi = min(values) / 1.4, max(values) * 1.4
    subs = (1.0, 2.0, 5.0) if hi / lo > 30 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)  # 4 labels at least
    for ax in axes:
        if ax.get_lines():
            ax.set_ylim(lo, hi)
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}x"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.tick_params(axis="y", labelsize=8)


def _format_ns(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def _stage_panel(ax, sizes):
    ax.set_title("where vyre_cuda's dispatch time goes (numpy arrays)", fontsize=10, loc="left")
    sizes = [s for s in sizes if s.stages]
    if not sizes:
        return _empty(ax, "no stage clocks in this result")
    named = {stage for _label, _color, stages in _STAGE_GROUPS for stage in stages}
    bottoms = [0.0] * len(sizes)
    for label, color, stages in _STAGE_GROUPS:
        shares = []
        for s in sizes:
            total = sum(max(m.median, 0.0) for m in s.stages.values()) or 1.0
            mine = [m for k, m in s.stages.items() if (k in stages if stages else k not in named)]
            shares.append(100.0 * sum(max(m.median, 0.0) for m in mine) / total)
        if any(shares):
            ax.bar(range(len(sizes)), shares, bottom=bottoms, color=color, width=0.65, label=label)
            bottoms = [b + h for b, h in zip(bottoms, shares)]
    for i, s in enumerate(sizes):
        ax.text(i, 101.5, _format_ns(s.wall or sum(m.median for m in s.stages.values())), ha="center", fontsize=8)
    ax.set_xticks(range(len(sizes)), [format_size(s.nbytes) for s in sizes], fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_yticks([0, 25, 50, 75, 100], ["0", "25%", "50%", "75%", "100%"], fontsize=8)
    ax.set_ylabel("share of the dispatch (median per stage)", fontsize=9)
    ax.set_xlabel("bytes per buffer (median dispatch time above each bar)", fontsize=9)
    ax.legend(**_LEGEND)


def _ceilings(sizes):
    """(key, label, style) of the ceilings drawn: DMA one way and both ways, host memcpy into
    pinned memory with the most threads measured."""
    found = {k for s in sizes for k in s.systems}
    one_way = next((k for k in ("ceiling.dma_h2d", "ceiling.dma_d2h") if k in found), None)
    copies = sorted((int(k.rsplit(".", 1)[1]), k) for k in found if k.startswith("ceiling.copy_in."))
    rows = [
        (one_way, "DMA ceiling, one way", {"color": "0.45", "linestyle": "--"}),
        ("ceiling.dma_both", "DMA ceiling, both ways at once", {"color": "0.0", "linestyle": "-"}),
    ]
    if copies:
        n, key = copies[-1]
        rows.append((key, f"host memcpy ceiling, {n} thread{'s' * (n != 1)}", {"color": "#17becf", "linestyle": ":"}))
    return [(k, label, style) for k, label, style in rows if k in found]


def _bandwidth_panel(ax, sizes):
    ax.set_title("vyre_cuda's bandwidth against the ceilings (same run)", fontsize=10, loc="left")
    points = {k: [(s.nbytes, s.gbps(k)) for s in sizes if s.gbps(k)] for k in {k for s in sizes for k in s.systems}}
    vyre = [(label, color, marker, points[k]) for k, label, color, marker in _BANDWIDTH_VYRE if points.get(k)]
    ceilings = [(k, label, style, points[k]) for k, label, style in _ceilings(sizes) if points[k]]
    if not vyre and not ceilings:
        return _empty(ax, "no bandwidth rows in this result")
    for label, color, marker, line in vyre:
        ax.plot(*zip(*line), color=color, marker=marker, linewidth=2.0, label=label, zorder=3)
    # the axis ends a little above vyre_cuda and the DMA ceilings: a host memcpy peak (many
    # threads at a size that fits the caches) would squeeze them, so it is marked, not drawn
    shown = [y for *_row, line in vyre for _x, y in line]
    shown += [y for k, *_row, line in ceilings if k.startswith("ceiling.dma") for _x, y in line]
    top = 1.25 * max(shown or [y for *_row, line in ceilings for _x, y in line])
    for _key, label, style, line in ceilings:
        one = {"marker": "_", "markersize": 16} if len(line) == 1 else {}  # a point, not a line
        ax.plot(*zip(*line), linewidth=1.6, label=label, **style, **one)
        for x, y in line:
            if y > top:
                ax.annotate(f"{y:.0f} GB/s", (x, top), color=style["color"], **_OFF_AXIS)
    _size_axis(ax, [s.nbytes for s in sizes])
    ax.set_ylim(0, top)
    ax.set_ylabel("GB/s (1e9 B/s), effective", fontsize=9)
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(**_LEGEND)


def plot_report(report, path, host_rows=(), device_rows=None):
    """Save the figure of ``report`` to ``path`` (PNG, SVG, PDF: by the suffix); returns the
    matplotlib ``Figure``. ``host_rows`` are more ``(style, key)`` systems for the numpy panel and
    ``device_rows`` (a list, then that panel is drawn) ``(style, key, vyre_cuda's keys)`` systems
    on data already on the GPU (a benchmark's peers). Its axes are labelled
    (``Axes.get_label()``) ``headline``, ``device`` (with ``device_rows``), ``stages``, ``bandwidth``."""
    Figure = require_matplotlib()
    fig = Figure(figsize=(16, 9.5), layout="constrained")
    rows = fig.add_gridspec(2, 1)
    panel = device_rows is not None
    top = rows[0].subgridspec(1, 2, width_ratios=(1.5, 1.0)) if panel else [rows[0]]
    bottom = rows[1].subgridspec(1, 2, width_ratios=(1.0, 1.5))
    names = ("headline", "device", "stages", "bandwidth") if panel else ("headline", "stages", "bandwidth")
    axes = {name: fig.add_subplot(cell, label=name) for name, cell in zip(names, (*top, *bottom))}
    sizes = sorted(report.sizes, key=lambda s: s.nbytes)
    floors = [(dict(label=lab, color=c, marker=mk, linestyle="--"), key) for key, lab, c, mk in _FLOORS]
    host = _ratio_series(sizes, [(style, key, ("vyre.dispatch",)) for style, key in (*floors, *host_rows)])
    title = "numpy arrays in and out: time per dispatch over vyre_cuda's"
    _ratio_panel(axes["headline"], sizes, host, title, "no vyre_cuda or floor rows in this result")
    device = _ratio_series(sizes, device_rows or ())
    if panel:
        title = "data already on the GPU: peers over vyre_cuda on the same arrays"
        empty = "no device-resident rows (they need CuPy, PyTorch or cuda.core)"
        _ratio_panel(axes["device"], sizes, device, title, empty, most=5)
    _ratio_axis([axes[k] for k in ("headline", "device") if k in axes], host + device)
    _stage_panel(axes["stages"], sizes)
    _bandwidth_panel(axes["bandwidth"], sizes)
    m = report.meta
    fig.suptitle(
        f"vyre_cuda against the driver floor and the ceilings: {m.get('device_name', '?')}, "
        f"{str(m.get('date', ''))[:10]}, commit {m.get('commit') or 'unknown'}",
        fontsize=11,
    )
    fig.savefig(str(path), dpi=110)
    return fig
