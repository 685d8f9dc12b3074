"""benchmarks/streamed_prototype.py on the CPU: chunk cutting, the checker, the ratios, a fake-driver run."""

from __future__ import annotations

import json
import pathlib

import fakecuda
import numpy as np
import pytest
from helpers.scripts import load_benchmark

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "streamed_prototype.py"


SP = load_benchmark("streamed_prototype")


def spans_problem(spans, rows: int, chunk_rows: int) -> str:
    """What is wrong with ``spans`` as the cut of ``rows`` into chunks of ``chunk_rows`` ("" if nothing)."""
    expect = 0
    for k, (begin, end) in enumerate(spans):
        if begin != expect:
            return f"chunk {k} starts at {begin}, not {expect}"
        last = k == len(spans) - 1
        if (end - begin) != (min(chunk_rows, rows - begin) if last else chunk_rows):
            return f"chunk {k} is [{begin}, {end}), {end - begin} rows"
        expect = end
    return "" if expect == rows else f"the chunks end at {expect}, not {rows}"


class NumpyBackend:
    """dispatch_async / result_into of vecadd in numpy: checks what run_chunked passes."""

    def __init__(self):
        self.in_flight = 0
        self.most_in_flight = 0

    def dispatch_async(self, program, inputs):
        a, b = inputs
        assert a.flags.c_contiguous and b.flags.c_contiguous and a.shape == b.shape
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return _Pending(self, a + b)


class _Pending:
    def __init__(self, backend, value):
        self.backend, self.value = backend, value

    def result_into(self, outputs):
        (out,) = outputs
        assert out.flags.c_contiguous and out.shape == self.value.shape, (out.shape, self.value.shape)
        out[:] = self.value
        self.backend.in_flight -= 1
        return outputs


def _data(rng, rows):
    a = rng.random(rows, dtype=np.float32) + np.float32(0.5)
    b = rng.random(rows, dtype=np.float32) - np.float32(2.0)
    return a, b, a + b


@pytest.mark.parametrize("rows", [0, 1, 7, 8, 9, 1000, 1 << 16, (1 << 16) + 1])
@pytest.mark.parametrize("chunk_rows", [1, 3, 8, 1 << 14])
def test_chunk_spans_cut_the_rows_in_order_without_gaps_or_overlaps(rows, chunk_rows):
    spans = SP.chunk_spans(rows, chunk_rows)
    assert spans_problem(spans, rows, chunk_rows) == ""
    assert len(spans) == -(-rows // chunk_rows)


def test_the_span_check_catches_every_off_by_one_boundary():
    good = SP.chunk_spans(100, 8)
    for k in range(len(good)):
        for delta in (-1, 1):
            moved_end = list(good)
            moved_end[k] = (good[k][0], good[k][1] + delta)
            moved_begin = list(good)
            moved_begin[k] = (good[k][0] + delta, good[k][1])
            assert spans_problem(moved_end, 100, 8), moved_end
            assert spans_problem(moved_begin, 100, 8), moved_begin


def test_chunk_spans_refuses_a_chunk_of_no_rows():
    with pytest.raises(ValueError, match="chunk_rows=0"):
        SP.chunk_spans(10, 0)


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_the_chunked_prototype_is_right_and_keeps_at_most_depth_in_flight(rng, depth):
    rows, chunk_rows = 10_001, 1024
    a, b, expected = _data(rng, rows)
    out = np.full(rows, np.nan, np.float32)
    backend = NumpyBackend()
    spans = SP.chunk_spans(rows, chunk_rows)
    SP.run_chunked(backend, None, a, b, out, spans, depth)
    SP.check_output("chunked", out, expected)
    SP.check_output("chunked", out, expected, SP.sample_indices(rows, spans))
    assert backend.most_in_flight == min(depth, len(spans)) and backend.in_flight == 0


@pytest.mark.parametrize("delta", [-1, 1])
def test_the_checker_catches_a_chunk_boundary_off_by_one(rng, delta):
    # a chunk ending one row early leaves a row unwritten (still the NaN poison), one starting
    # a row late too; the sampled check looks at both sides of every boundary
    rows, chunk_rows = 4096 + 5, 512
    a, b, expected = _data(rng, rows)
    spans = SP.chunk_spans(rows, chunk_rows)
    k = 3
    for bad in (
        spans[:k] + [(spans[k][0], spans[k][1] - 1)] + spans[k + 1 :],
        spans[:k] + [(spans[k][0] + 1, spans[k][1])] + spans[k + 1 :],
    ):
        out = np.full(rows, np.nan, np.float32)
        SP.run_chunked(NumpyBackend(), None, a, b, out, bad, 2)
        with pytest.raises(SP.WrongResult, match=r"1 wrong of"):
            SP.check_output("full", out, expected)
        with pytest.raises(SP.WrongResult, match=r"first at row (1536|2047)\b"):
            SP.check_output("sampled", out, expected, SP.sample_indices(rows, spans))
    # a result written one row off (the output window shifted against the inputs' window)
    out = expected.copy()
    lo, hi = spans[k]
    out[lo:hi] = expected[lo + delta : hi + delta]
    with pytest.raises(SP.WrongResult, match=f"first at row {lo}\\b"):
        SP.check_output("sampled", out, expected, SP.sample_indices(rows, spans))


def test_the_checker_passes_only_equal_outputs(rng):
    a, b, expected = _data(rng, 1000)
    SP.check_output("ok", expected.copy(), expected)
    with pytest.raises(SP.WrongResult, match="shape"):
        SP.check_output("short", expected[:-1].copy(), expected)
    wrong = expected.copy()
    wrong[999] = np.nextafter(wrong[999], np.float32(10))
    with pytest.raises(SP.WrongResult, match="first at row 999"):
        SP.check_output("last", wrong, expected)
    assert 999 in SP.sample_indices(1000, SP.chunk_spans(1000, 100))


def test_sizes_parse_with_units_and_refuse_what_is_not_float32s():
    assert SP.parse_list("64M,256MiB,512K,1G,2") == [64 << 20, 256 << 20, 512 << 10, 1 << 30, 2 << 20]
    assert SP.format_bytes(4 << 20) == "4 MiB" and SP.format_bytes(96 << 10) == "96 KiB"
    for bad in ("", "x", "6B", "-1M", "2T"):
        with pytest.raises(ValueError, match="Fix: "):
            SP.parse_size(bad)


def test_ratios_divide_by_the_duplex_ceiling_and_the_serial_row_of_the_same_memory():
    n = 1 << 20
    rows = [
        dict(name=SP.DUPLEX, kind="pinned", label="d", bytes_moved=3 * n, median_ms=2.0),
        dict(name="dispatch_into", kind="pinned", label="s", bytes_moved=3 * n, median_ms=4.0),
        dict(name="dispatch_into", kind="numpy", label="s", bytes_moved=3 * n, median_ms=8.0),
        dict(name="chunked", kind="numpy", label="c1", bytes_moved=3 * n, median_ms=6.0, depth=2),
        dict(name="chunked", kind="numpy", label="c2", bytes_moved=3 * n, median_ms=5.0, depth=3),
    ]
    SP.add_ratios(rows)
    assert rows[0]["vs_duplex"] == 1.0 and rows[0]["vs_serial"] is None
    assert rows[0]["gbps"] == pytest.approx(3 * n / 2e-3 / 1e9)
    assert rows[3]["vs_duplex"] == 3.0 and rows[3]["vs_serial"] == 0.75
    assert SP.best_chunked(rows, "numpy")["label"] == "c2" and SP.best_chunked(rows, "pinned") is None
    table = SP.format_table(n, rows)
    assert "1 MiB per buffer" in table and "best chunked, numpy: c2 = 2.500x duplex, 0.625x serial" in table


CHILD = r"""
import importlib.util, json, sys
import numpy as np
from fakecuda import FakeDriver, vecadd_emulation

fake = FakeDriver()
spec = importlib.util.spec_from_file_location("sp", sys.argv[1])
sp = importlib.util.module_from_spec(spec)
saved = list(sys.path)
spec.loader.exec_module(sp)
sys.path[:] = saved  # the script puts the checkout first; the installed vyre_cuda is the one under test


def right(backend, program, inputs):
    fake.emulate(backend, program, inputs, vecadd_emulation(np.float32))


def off_by_one(backend, program, inputs):
    def run(launch):  # the kernel skips the last row of every launch
        n = int(launch.words(launch.arg(3), 1)[0])
        a, b, out = (sp_view(launch.arg(k), n) for k in range(3))
        out[: n - 1] = a[: n - 1] + b[: n - 1]

    fake.emulate(backend, program, inputs, run)


def sp_view(address, n):
    from fakecuda import array_at

    return array_at(address, np.float32, n)


args = ["--sizes", "256K,1M", "--chunks", "64K,96K", "--depths", "2,3", "--rounds", "5", "--warmup", "1"]
rc = sp.main(args + ["--out", sys.argv[2]], on_inputs=right)
rc_wrong = sp.main(["--sizes", "256K"] + args[2:], on_inputs=off_by_one)
res = {"rc": rc, "rc_wrong": rc_wrong, "hook_errors": fake.hook_errors}
print(json.dumps(res | {"violations": fake.stats()["violations"]}))
"""


def test_the_script_runs_on_the_fake_driver_and_fails_on_a_wrong_kernel(fake_libcuda, tmp_path):
    out = tmp_path / "streamed.json"
    proc = fakecuda.run_python(["-c", CHILD, str(SCRIPT), str(out)], fake_libcuda, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0 and res["rc_wrong"] == 1 and res["violations"] == 0, res
    assert "WRONG RESULT: serial dispatch (numpy)" in proc.stderr  # the first configuration checked
    report = json.loads(out.read_text())
    assert [s["bytes_per_buffer"] for s in report["sizes"]] == [256 << 10, 1 << 20]
    rows = report["sizes"][1]["rows"]
    # 4 ceilings; per memory kind 2 serial rows and 2 chunk sizes x 2 depths
    assert len(rows) == 4 + 2 * (2 + 2 * 2)
    chunked = [r for r in rows if r["name"] == "chunked"]
    assert {(r["chunk_bytes"], r["chunk_count"], r["depth"]) for r in chunked} == {
        (64 << 10, 16, 2),
        (64 << 10, 16, 3),
        (96 << 10, 11, 2),
        (96 << 10, 11, 3),
    }
    for r in rows:
        assert len(r["samples_ms"]) == 5 and r["median_ms"] > 0 and r["gbps"] > 0
        assert r["vs_duplex"] is not None
    assert all(r["vs_serial"] is not None for r in rows if not r["name"].startswith("dma"))
