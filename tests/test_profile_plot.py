"""The benchmark record's figure (the profile's, with the peers), read back from matplotlib: four
panels (the headline ratios, the device-resident ratios, the stage shares, the bandwidth against
the ceilings), at most six series each in distinct styles, vyre_cuda in one colour, log axes on
the ratios, no text drawn over other text; on the stored result of record and on results that
lack rows."""

import pathlib

import profile_fakes
import pytest

import benchmarks.harness as H
from vyre_cuda import profile as P

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.image import imread  # noqa: E402

from benchmarks.harness.plot import plot_bench  # noqa: E402
from vyre_cuda.profile.plot import VYRE_COLOR  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
LATEST = ROOT / "benchmarks" / "results" / "latest.json"
KIB, MIB, GIB = 1024, 1 << 20, 1 << 30
PANELS = ("headline", "device", "stages", "bandwidth")


def _summary(median):
    return P.Summary(100, float(median), median * 0.9, median * 1.1)


def _size(nbytes, ns):
    s = P.SizeResult(nbytes, nbytes // 4, 100)
    s.systems = {k: _summary(v) for k, v in ns.items()}
    s.moved = {"floor": (2 * nbytes, nbytes), "vyre": (2 * nbytes, nbytes)}
    return s


def _report(sizes, **meta):
    return H.BenchReport(dict({"device_name": "X", "date": "2026-12-01"}, **meta), sizes, P.STAGE_NAMES)


def _without(report, drop):
    """``report`` without the series whose keys ``drop(key)`` is true for."""
    for s in report.sizes:
        s.systems = {k: v for k, v in s.systems.items() if not drop(k)}
    return report


def _no_cupy(key):  # vyre_cuda's device-resident rows on CuPy arrays go with CuPy
    return key.startswith("peer.cupy") or (key.startswith("vyre.device") and key != "vyre.device.torch")


def _latest():
    return H.BenchReport.load(LATEST)


def _draw(report, tmp_path):
    """The figure as saved, laid out and drawn, with the renderer that measured its text."""
    fig = plot_bench(report, tmp_path / "p.png")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return fig, canvas.get_renderer()


def _axes(fig):
    return {ax.get_label(): ax for ax in fig.get_axes()}


def _series(ax):
    """(label, colour, marker, line style) of every series: labelled lines and bar groups."""
    rows = [
        (line.get_label(), to_hex(line.get_color()), line.get_marker(), line.get_linestyle())
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    ]
    for bars in ax.containers:
        rows.append((bars.get_label(), to_hex(bars.patches[0].get_facecolor()), None, None))
    return rows


def _tick_labels(axis):
    """The tick labels drawn: non-empty, at a tick inside the axis's view."""
    if not axis.axes.axison:
        return []
    lo, hi = sorted(axis.get_view_interval())
    pairs = zip(axis.get_majorticklocs(), axis.get_majorticklabels())
    return [label for loc, label in pairs if lo <= loc <= hi and label.get_visible() and label.get_text()]


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def _fake_cpu_report(monkeypatch):
    """A run on the fake backend and floor (no GPU, no peers)."""
    profile_fakes.install(monkeypatch)
    return H.run_bench(sizes=(4 * KIB, 64 * KIB), iterations=4, warmup=1, peers=False, threads=False)


REPORTS = {
    "latest": _latest,
    "latest, no CuPy": lambda: _without(_latest(), _no_cupy),
    "latest, no peers": lambda: _without(_latest(), lambda key: key.startswith(("peer.", "vyre.device"))),
    "latest, 4 KiB only": lambda: _report(_latest().sizes[:1]),
    "vyre_cuda only": lambda: _report([_size(4 * KIB, {"vyre.dispatch": 15_000})]),
    "no sizes": lambda: _report([]),
}


@pytest.fixture(params=list(REPORTS))
def report(request):
    return REPORTS[request.param]()


# -- structure -------------------------------------------------------------------------------
def test_four_panels_each_with_at_most_six_series_in_distinct_styles(report, tmp_path):
    fig, _renderer = _draw(report, tmp_path)
    axes = _axes(fig)
    assert list(axes) == list(PANELS)
    for name, ax in axes.items():
        rows = _series(ax)
        assert len(rows) <= 6, (name, rows)
        assert len({label for label, *_ in rows}) == len(rows), name
        assert len({color for _label, color, *_ in rows}) == len(rows), (name, rows)  # no colour twice
        markers = [marker for _label, _color, marker, _style in rows if marker not in (None, "None", "", "_")]
        assert len(set(markers)) == len(markers), (name, rows)


def test_vyre_cuda_is_drawn_in_its_colour_and_nothing_else_is(report, tmp_path):
    fig, _renderer = _draw(report, tmp_path)
    for ax in fig.get_axes():
        name = ax.get_label()
        for label, color, *_ in _series(ax):
            if label in ("vyre_cuda (= 1x)", "vyre_cuda, numpy"):
                assert color == VYRE_COLOR, (name, label)
            else:
                assert color != VYRE_COLOR, (name, label)


def test_text_does_not_overlap_and_legends_sit_beside_their_panels(report, tmp_path):
    fig, renderer = _draw(report, tmp_path)
    page = fig.bbox
    legends = []
    for ax in fig.get_axes():
        name = ax.get_label()
        for ticks in (_tick_labels(ax.xaxis), _tick_labels(ax.yaxis)):
            boxes = [t.get_window_extent(renderer) for t in ticks]
            for i, a in enumerate(boxes):
                assert not any(a.overlaps(b) for b in boxes[i + 1 :]), (name, [t.get_text() for t in ticks])
                assert page.contains(a.x0, a.y0) and page.contains(a.x1, a.y1), name
        notes = [t.get_window_extent(renderer) for t in ax.texts]
        for i, a in enumerate(notes):
            assert not any(a.overlaps(b) for b in notes[i + 1 :]), name
        legend = ax.get_legend()
        if legend is not None:
            box, frame = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert 0 <= box.x0 - frame.x1 <= 0.05 * frame.width and box.y1 <= frame.y1 + 1, name  # just right
            assert page.contains(box.x1, box.y0), name
            legends.append(box)
    for legend in legends:
        assert not any(legend.overlaps(ax.get_window_extent(renderer)) for ax in fig.get_axes())
    titles = [t.get_window_extent(renderer) for t in [ax.title for ax in fig.get_axes()] + fig.texts]
    for i, a in enumerate(titles):
        assert not any(a.overlaps(b) for b in titles[i + 1 :])


# -- the headline: vyre_cuda against the floor and the peers -------------------------------
def test_headline_is_each_system_over_vyre_cuda_on_log_axes(tmp_path):
    report = _latest()
    fig, _renderer = _draw(report, tmp_path)
    head = _axes(fig)["headline"]
    assert head.get_xscale() == "log" and head.get_yscale() == "log"
    lines = _lines(head)
    assert set(lines) == {
        "vyre_cuda (= 1x)",
        "per-buffer floor (pinned staging)",
        "driver, pageable copies",
        "cuda.bindings",
        "CuPy",
        "PyTorch",
    }
    assert list(lines["vyre_cuda (= 1x)"].get_ydata()) == [1.0, 1.0]
    big = report.size(GIB)
    xs, ys = lines["CuPy"].get_data()
    assert list(xs) == [s.nbytes for s in report.sizes]
    assert ys[-1] == pytest.approx(big.median("peer.cupy") / big.median("vyre.dispatch"))
    xs, ys = lines["per-buffer floor (pinned staging)"].get_data()
    assert ys[0] == pytest.approx(report.sizes[0].median("floor.pinned") / report.sizes[0].median("vyre.dispatch"))
    # the legend lists the lines as they end at 1 GiB, top to bottom
    ends = [lines[t.get_text()].get_ydata()[-1] for t in head.get_legend().get_texts()]
    assert ends == sorted(ends, reverse=True)
    assert head.get_ylim()[0] < 1.0 < max(ends) < head.get_ylim()[1]
    assert [t.get_text() for t in _tick_labels(head.yaxis)] == ["1x", "2x", "5x", "10x", "20x"]


def test_device_panel_compares_each_peer_with_vyre_cuda_on_its_arrays(tmp_path):
    report = _latest()
    fig, _renderer = _draw(report, tmp_path)
    axes = _axes(fig)
    device = axes["device"]
    lines = _lines(device)
    assert set(lines) == {"vyre_cuda (= 1x)", "CuPy", "PyTorch", "cuda.core"}
    s = report.size(256 * MIB)
    i = [x.nbytes for x in report.sizes].index(256 * MIB)
    assert lines["PyTorch"].get_ydata()[i] == pytest.approx(
        s.median("peer.torch.device") / s.median("vyre.device.torch")
    )
    assert lines["cuda.core"].get_ydata()[i] == pytest.approx(
        s.median("peer.cuda_core.device") / s.median("vyre.device")
    )
    assert device.get_yscale() == "log" and device.get_ylim() == axes["headline"].get_ylim()
    # a peer keeps its colour and marker from panel to panel
    head = _lines(axes["headline"])
    for peer in ("CuPy", "PyTorch"):
        assert (head[peer].get_color(), head[peer].get_marker()) == (lines[peer].get_color(), lines[peer].get_marker())


# -- the stages and the bandwidth ------------------------------------------------------------
def test_stage_panel_stacks_five_groups_to_the_whole_dispatch(tmp_path):
    report = _latest()
    fig, _renderer = _draw(report, tmp_path)
    stages = _axes(fig)["stages"]
    groups = {bars.get_label(): [p.get_height() for p in bars.patches] for bars in stages.containers}
    assert len(groups) == 5 and "wait for the GPU" in groups
    for i in range(len(report.sizes)):
        assert sum(heights[i] for heights in groups.values()) == pytest.approx(100.0)
    small = report.sizes[0]
    total = sum(m.median for m in small.stages.values())
    assert groups["wait for the GPU"][0] == pytest.approx(100 * small.stages["wait"].median / total)
    assert [t.get_text() for t in stages.get_xticklabels()] == ["4 KiB", "4 MiB", "64 MiB", "256 MiB", "1 GiB"]
    assert "61 ms" in [t.get_text() for t in stages.texts]  # the median dispatch at 1 GiB


def test_bandwidth_panel_keeps_the_memcpy_peak_off_the_axis_and_marks_it(tmp_path):
    report = _latest()
    fig, _renderer = _draw(report, tmp_path)
    bandwidth = _axes(fig)["bandwidth"]
    lines = _lines(bandwidth)
    assert {
        "vyre_cuda, numpy",
        "vyre_cuda streamed, page-locked",
        "DMA ceiling, one way",
        "DMA ceiling, both ways at once",
        "host memcpy ceiling, 16 threads",
    } <= set(lines)
    big = report.size(GIB)
    assert lines["DMA ceiling, both ways at once"].get_ydata()[-1] == pytest.approx(big.gbps("ceiling.dma_both"))
    assert lines["vyre_cuda, numpy"].get_ydata()[-1] == pytest.approx(big.gbps("vyre.dispatch"))
    peak = max(lines["host memcpy ceiling, 16 threads"].get_ydata())
    top = bandwidth.get_ylim()[1]
    assert top < peak and top > max(lines["DMA ceiling, both ways at once"].get_ydata())
    assert f"{peak:.0f} GB/s" in [t.get_text() for t in bandwidth.texts]


# -- results that lack rows ------------------------------------------------------------------
def test_a_run_on_the_fakes_draws_every_panel_it_has_rows_for(monkeypatch, tmp_path):
    fig, _renderer = _draw(_fake_cpu_report(monkeypatch), tmp_path)
    axes = _axes(fig)
    assert set(_lines(axes["headline"])) == {
        "vyre_cuda (= 1x)",
        "per-buffer floor (pinned staging)",
        "driver, pageable copies",
    }
    assert not axes["device"].axison and "no device-resident rows" in axes["device"].texts[0].get_text()
    assert len(axes["stages"].containers) >= 3
    # (the fake run measures memcpy with as many threads as this machine has cores)
    assert any(label.startswith("host memcpy ceiling, ") for label in _lines(axes["bandwidth"]))


def test_sizes_out_of_order_draw_left_to_right(tmp_path):
    sizes = [_size(n, {"vyre.dispatch": n, "floor.pinned": 2 * n}) for n in (64 * MIB, 4 * KIB, MIB)]
    fig, _renderer = _draw(_report(sizes), tmp_path)
    xs, ys = _lines(_axes(fig)["headline"])["per-buffer floor (pinned staging)"].get_data()
    assert list(xs) == [4 * KIB, MIB, 64 * MIB] and list(ys) == [2.0, 2.0, 2.0]


def test_a_peer_without_a_known_style_keeps_one_style_in_both_panels(tmp_path):
    ns = {"vyre.dispatch": 10, "vyre.device": 5, "peer.jax": 30, "peer.jax.device": 6, "peer.cupy": 20}
    fig, _renderer = _draw(_report([_size(4 * KIB, ns), _size(MIB, ns)]), tmp_path)
    head, device = (_lines(_axes(fig)[name]) for name in ("headline", "device"))
    assert head["jax"].get_color() == device["jax"].get_color() != head["CuPy"].get_color()
    assert list(device["jax"].get_ydata()) == [pytest.approx(1.2)] * 2


def test_empty_panels_say_what_is_missing(tmp_path):
    fig, _renderer = _draw(_report([]), tmp_path)
    assert list(_axes(fig)) == list(PANELS)
    for ax in fig.get_axes():
        assert not ax.axison and ax.texts and ax.get_title(loc="left")


def test_the_stored_picture_is_the_stored_result_drawn(tmp_path):
    """benchmarks/results/latest.png is regenerated with latest.json (same size in pixels)."""
    _draw(_latest(), tmp_path)
    stored, drawn = imread(ROOT / "benchmarks" / "results" / "latest.png"), imread(tmp_path / "p.png")
    assert stored.shape == drawn.shape
