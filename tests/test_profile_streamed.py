"""The streamed route in the profile's report without a GPU: its series, targets (met, missed with
the measured reason, and "serial kept"), table, plot and README section, on synthetic results."""

import re

import numpy as np
import pytest
from profile_fakes import STAGES

import benchmarks.harness as H
from benchmarks.harness import streamed, targets
from vyre_cuda import profile as P
from vyre_cuda.profile import systems

KIB, MIB, GIB = 1024, 1 << 20, 1 << 30


def _summary(median):
    return P.Summary(100, float(median), median * 0.9, median * 1.1)


def _size(nbytes, ns, planner=None):
    s = P.SizeResult(nbytes, nbytes // 4, 100)
    s.systems = {k: _summary(v) for k, v in ns.items()}
    s.moved = {"floor": (2 * nbytes, nbytes), "vyre": (2 * nbytes, nbytes)}
    s.planner = dict(planner or {})
    return s


# 256 MiB as measured on the H200 (rounded): duplex 10.1 ms; streamed page-locked within 1.1x,
# numpy 1.5x (missed); the heavy kernel overlapped to 1.05x of the longer of compute and transfer
BIG = {
    "floor.pinned": 30_000_000,
    "ceiling.dma_h2d": 9_760_000,
    "ceiling.dma_d2h": 4_880_000,
    "ceiling.dma_both": 10_100_000,
    "ceiling.copy_in.1": 57_000_000,
    "ceiling.copy_in.16": 10_000_000,
    "ceiling.copy_out.1": 26_300_000,
    "ceiling.copy_out.16": 6_000_000,
    "vyre.dispatch_into": 16_000_000,
    "vyre.streamed": 15_150_000,
    "vyre.streamed_pinned": 10_500_000,
    "vyre.heavy": 11_000_000,
    "vyre.heavy_compute": 6_400_000,
    "vyre.heavy_transfer": 10_500_000,
}


def _sizes(big=None, four_route="streamed", four=None):
    small = _size(4 * KIB, {"floor.pinned": 17_000, "vyre.dispatch": 18_000, "vyre.streamed": 40_000})
    four_mib = _size(
        4 * MIB,
        four
        or {
            "floor.pinned": 1_350_000,
            "ceiling.dma_both": 170_000,
            "vyre.dispatch_into": 600_000,
            "vyre.streamed": 420_000,
        },
        {"route": four_route, "reason": "fewer than 2 chunks of 8 MiB" if four_route == "regular" else "2 chunks"},
    )
    return [small, four_mib, _size(256 * MIB, big or BIG, {"route": "streamed", "reason": "2 or more chunks"})]


def _by_key(sizes):
    return {(t.key, t.size_bytes): t for t in targets.evaluate_targets(sizes, None)}


def test_streamed_series_labels_traffic_order_and_references():
    assert systems.label("ceiling.dma_both") == "DMA ceiling: both directions at once"
    assert systems.label("vyre.streamed_pinned") == "vyre_cuda streamed, page-locked"
    for key in ("ceiling.dma_both", "vyre.streamed", "vyre.streamed_pinned", "vyre.heavy", "vyre.heavy_transfer"):
        assert systems.traffic_kind(key) == systems.FULL, key
    assert systems.traffic_kind("vyre.heavy_compute") is None  # device-resident: moves nothing
    assert systems.reference("vyre.streamed") == "floor.pinned"
    assert systems.reference("vyre.heavy") is None  # another kernel than the floor's
    keys = ["vyre.streamed", "ceiling.copy_in.1", "ceiling.dma_both", "vyre.pinned", "ceiling.dma_d2h", "floor.pinned"]
    assert sorted(keys, key=systems.order) == [
        "floor.pinned",
        "ceiling.dma_d2h",
        "ceiling.dma_both",
        "ceiling.copy_in.1",
        "vyre.pinned",
        "vyre.streamed",
    ]
    s = _sizes()[2]
    assert s.gbps("ceiling.dma_both") == pytest.approx(3 * 256 * MIB / 10_100_000)


def test_duplex_targets_met_and_missed_with_the_host_copy_reason():
    t = _by_key(_sizes())
    pinned = t[("streamed_pinned_vs_duplex", 256 * MIB)]
    assert pinned.value == pytest.approx(10.5 / 10.1) and pinned.limit == 1.1 and pinned.met is True
    assert pinned.note == ""
    numpy_row = t[("streamed_numpy_vs_duplex", 256 * MIB)]
    assert numpy_row.value == pytest.approx(15.15 / 10.1) and numpy_row.limit == 1.3 and numpy_row.met is False
    # the reason: the N-thread host memcpy ceilings of the same run, one after the other
    assert "host copies alone need 16.00 ms on 16 threads" in numpy_row.note
    assert "inputs into pinned memory 10.00 ms, the output out of it 6.00 ms" in numpy_row.note
    assert f"{16 / 10.1:.2f}x the 10.10 ms of the DMA of both directions" in numpy_row.note
    assert "out of reach" in numpy_row.note  # 1.58x > 1.3: the host alone misses it
    # below BANDWIDTH_MIN no duplex target
    assert ("streamed_pinned_vs_duplex", 4 * MIB) not in t


def test_pinned_duplex_miss_names_the_dma_time():
    big = dict(BIG, **{"vyre.streamed_pinned": 12_120_000})
    target = _by_key(_sizes(big))[("streamed_pinned_vs_duplex", 256 * MIB)]
    assert target.met is False
    assert "the DMA engines need 10.10 ms" in target.note and "2.02 ms more" in target.note
    assert f"{(9.76 + 4.88) / 10.1:.2f}x that one direction after the other" in target.note


def test_numpy_duplex_miss_within_the_host_rate_does_not_blame_the_host():
    big = dict(BIG, **{"ceiling.copy_in.16": 5_000_000, "ceiling.copy_out.16": 3_000_000})
    target = _by_key(_sizes(big))[("streamed_numpy_vs_duplex", 256 * MIB)]
    assert target.met is False and "8.00 ms on 16 threads" in target.note
    assert "out of reach" not in target.note


def test_overlap_target_met_and_missed_with_the_times_it_needs():
    t = _by_key(_sizes())
    overlap = t[("overlap_vs_max", 256 * MIB)]
    assert overlap.value == pytest.approx(11.0 / 10.5) and overlap.limit == 1.15 and overlap.met is True
    serial = dict(BIG, **{"vyre.heavy": 16_000_000})
    overlap = _by_key(_sizes(serial))[("overlap_vs_max", 256 * MIB)]
    assert overlap.met is False and overlap.value == pytest.approx(16 / 10.5)
    assert "compute alone 6.40 ms, transfers alone 10.50 ms" in overlap.note
    assert "one after the other 16.90 ms" in overlap.note
    assert f"hiding {(16.9 - 16) / 6.4:.0%} of the shorter" in overlap.note
    # not measured: no target (the heavy rows run at one size)
    assert ("overlap_vs_max", 4 * MIB) not in t


def test_four_mib_target_streamed_met_missed_and_serial_kept():
    t = _by_key(_sizes())
    four = t[("streamed_4mib_vs_serial", 4 * MIB)]
    assert four.value == pytest.approx(420 / 600) and four.limit == 0.8 and four.met is True and four.kept == ""
    slow = {
        "floor.pinned": 1_350_000,
        "ceiling.dma_both": 540_000,
        "vyre.dispatch_into": 600_000,
        "vyre.streamed": 590_000,
    }
    four = _by_key(_sizes(four=slow))[("streamed_4mib_vs_serial", 4 * MIB)]
    assert four.met is False and "0.90x the serial 0.60 ms" in four.note
    four = _by_key(_sizes(four=slow, four_route="regular"))[("streamed_4mib_vs_serial", 4 * MIB)]
    assert four.met is True and four.kept == "serial kept" and four.value == pytest.approx(590 / 600)
    assert "keeps the serial route (regular)" in four.note and "fewer than 2 chunks" in four.note
    assert "(unforced: regular)" in four.description


def test_streamed_targets_read_n_a_when_not_measured():
    bare = _size(256 * MIB, {"floor.pinned": 30_000_000})
    t = _by_key([bare, _size(4 * MIB, {"floor.pinned": 1})])
    assert t[("streamed_pinned_vs_duplex", 256 * MIB)].met is None
    assert t[("streamed_4mib_vs_serial", 4 * MIB)].met is None


def test_target_note_and_kept_survive_json():
    report = H.BenchReport({"device_name": "X"}, _sizes(four_route="regular"), STAGES)
    report.targets = targets.evaluate_targets(report.sizes, None)
    back = H.BenchReport.from_json(report.to_json())
    assert back.to_dict() == report.to_dict()
    kept = next(t for t in back.targets if t.key == "streamed_4mib_vs_serial")
    assert kept.kept == "serial kept" and kept.met is True and back.sizes[1].planner["route"] == "regular"


def test_table_lists_streamed_rows_reasons_and_routes():
    sizes = _sizes(four_route="regular")
    report = H.BenchReport({"device_name": "X"}, sizes, STAGES, targets=targets.evaluate_targets(sizes, None))
    text = report.format_table()
    lines = text.splitlines()
    for label in (
        "DMA ceiling: both directions at once",
        "vyre_cuda streamed, numpy",
        "vyre_cuda streamed, page-locked",
        "heavy kernel streamed, page-locked",
        "heavy kernel on device arrays (compute)",
    ):
        assert any(line.strip().startswith(label) for line in lines), label
    block = lines[lines.index(next(x for x in lines if x.startswith("256 MiB per buffer"))) :]
    both = next(line for line in block if line.strip().startswith("DMA ceiling: both directions at once"))
    assert both.split()[-1] == f"{3 * 256 * MIB / 10.1e6:.2f}"
    assert "route of an unforced dispatch of the elementwise vecadd: regular (fewer than 2 chunks of 8 MiB)" in text
    missed = next(i for i, line in enumerate(lines) if "[MISSED]" in line and "streamed, numpy" in line)
    assert lines[missed + 1].strip().startswith("why: the host copies alone need")
    kept = next(i for i, line in enumerate(lines) if "streamed, numpy / serial dispatch_into" in line)
    assert "[ met  ]" in lines[kept] and lines[kept].endswith("; serial kept")
    assert lines[kept + 1].strip().startswith("how: the planner keeps the serial route")


def test_plot_draws_the_streamed_rows_and_the_duplex_ceiling(tmp_path):
    pytest.importorskip("matplotlib")
    from vyre_cuda.profile.plot import plot_report

    report = H.BenchReport({"device_name": "X"}, _sizes(), STAGES)
    fig = plot_report(report, tmp_path / "s.png")
    (bandwidth,) = (ax for ax in fig.get_axes() if ax.get_label() == "bandwidth")
    lines = {line.get_label(): line for line in bandwidth.get_lines()}
    for label in ("vyre_cuda streamed, numpy", "vyre_cuda streamed, page-locked", "DMA ceiling, both ways at once"):
        assert label in lines, label
    xs, ys = lines["DMA ceiling, both ways at once"].get_data()
    assert list(xs) == [4 * MIB, 256 * MIB]
    assert ys[1] == pytest.approx(3 * 256 * MIB / 10_100_000)
    assert lines["DMA ceiling, both ways at once"].get_linestyle() == "-"
    xs, _ = lines["vyre_cuda streamed, numpy"].get_data()
    assert list(xs) == [4 * KIB, 4 * MIB, 256 * MIB]


def test_readme_section_has_the_streamed_columns_heavy_table_reasons_and_routes():
    from helpers.scripts import load_benchmark

    wr = load_benchmark("write_readme")
    sizes = _sizes(four_route="regular")
    report = H.BenchReport({"device_name": "X"}, sizes, STAGES, targets=targets.evaluate_targets(sizes, None))
    text = wr.render_results(report)
    assert "| vyre_cuda streamed, numpy | vyre_cuda streamed, page-locked | DMA both directions at once |" in text
    assert re.search(r"\| 256 MiB \| .*\| 10\.5 ms \([0-9.]+ GB/s\) \| 10\.1 ms", text), text
    assert "| 256 MiB | its compute alone (device-resident arrays) | 6.40 ms |" in text
    assert "**missed**: the host copies alone need 16.00 ms" in text
    assert "met (serial kept: the planner keeps the serial route" in text
    assert "unforced dispatch of the elementwise vecadd: 4 MiB: regular, 256 MiB: streamed." in text


def test_heavy_reference_and_sample_rows(rng):
    a, b = streamed.heavy_inputs(rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32))
    assert a.dtype == np.float32 and a.min() >= 0.5 and b.max() < -1.0
    x = streamed.heavy_reference(a, b, 3)
    np.testing.assert_allclose(x, np.sin(np.sin(np.sin(a) + b) + b) + b, rtol=1e-6)
    assert streamed.heavy_reference(a, b, 0).tolist() == a.tolist()
    n = 3 * (MIB // 4) + 5
    rows = streamed.sample_rows(n, rng)
    assert rows[0] == 0 and rows[-1] == n - 1 and np.all(np.diff(rows) > 0)
    for edge in (MIB // 4, 2 * (MIB // 4), 3 * (MIB // 4)):  # both sides of every 1 MiB boundary
        assert {edge - 1, edge} <= set(rows.tolist())
    assert streamed.sample_rows(3, rng).tolist() == [0, 1, 2]
    assert "STEPS" not in streamed.heavy_program(7).kernel.source and "k < 7" in streamed.heavy_program(7).kernel.source


def test_constants_of_the_streamed_targets():
    assert targets.STREAMED_PINNED_VS_DUPLEX == 1.1 and targets.STREAMED_NUMPY_VS_DUPLEX == 1.3
    assert targets.OVERLAP_VS_MAX == 1.15 and targets.STREAMED_VS_SERIAL == 0.8
    assert targets.STREAMED_VS_SERIAL_SIZE == 4 * MIB and streamed.HEAVY_SIZE == 256 * MIB
    assert streamed.HEAVY_SIZE in P.DEFAULT_SIZES and streamed.HEAVY_STEPS == 400
