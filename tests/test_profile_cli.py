"""``vyre-cuda profile``'s arguments and main, the progress line, and the benchmark scripts, on
a fake backend and a fake floor (no GPU)."""

import argparse
import io
import json
import pathlib
import re

import profile_fakes
import pytest

import benchmarks.harness as H
import vyre_cuda
from vyre_cuda import profile as P
from vyre_cuda.errors import BackendError, ValidationError
from vyre_cuda.profile import cli as profile_cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
KIB, MIB, GIB = 1024, 1 << 20, 1 << 30


def _fix_line(exc):
    return str(exc).splitlines()[-1]


@pytest.fixture
def fake_device(monkeypatch):
    return profile_fakes.install(monkeypatch)


# -- progress --------------------------------------------------------------------------------
class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_progress_line_quiet_on_short_runs_then_shown():
    stream = _Stream(tty=True)
    line = profile_cli.ProgressLine(stream, delay=3600)
    line("4 KiB: floor", 0.5)
    line.done()
    assert stream.getvalue() == ""
    stream = _Stream(tty=True)
    line = profile_cli.ProgressLine(stream, delay=0)
    line("4 KiB: floor", 0.5)
    line.done()
    assert stream.getvalue().startswith("\r[vyre-cuda profile]  50%, 0s left: 4 KiB: floor")
    assert stream.getvalue().endswith("\r")
    stream = _Stream(tty=False)
    line = profile_cli.ProgressLine(stream, delay=0, interval=3600)
    line("a", 0.1)
    line("b", 0.2)  # rate-limited when not a terminal
    assert stream.getvalue().count("\n") == 1 and "\r" not in stream.getvalue()


def test_format_eta():
    assert [profile_cli.format_eta(t) for t in (0, 0.4, 59.6, 60, 185.4, 3599, 3600, 7440)] == [
        "0s",
        "0s",
        "1m00s",
        "1m00s",
        "3m05s",
        "59m59s",
        "1h00m",
        "2h04m",
    ]
    assert profile_cli.eta_seconds(10.0, 0.25) == 30.0  # 1 step of 4 in 10 s: 3 more of 10 s
    assert profile_cli.eta_seconds(10.0, 1.0) == 0.0
    assert profile_cli.eta_seconds(10.0, 0.0) is None


class _Clock:
    """A clock that advances ``step`` seconds each time it is read: every progress step lasts
    ``step`` seconds."""

    def __init__(self, step):
        self.now = 1000.0
        self.step = step

    def __call__(self):
        self.now += self.step
        return self.now


_LINE = re.compile(r"\[vyre-cuda profile\] +(\d+)%, (\S+) left: (.*)")


def _eta_lines(text):
    return [_LINE.fullmatch(line).groups() for line in text.splitlines()]


def test_progress_eta_is_the_steps_left_times_the_time_per_step(fake_device):
    """One size on the fake backend: its warm-ups and rounds are equal steps, so the time left
    after step k of n, at 2 s a step, is exactly 2 (n - k) s."""
    stream = _Stream(tty=False)
    line = profile_cli.ProgressLine(stream, delay=0, interval=0, clock=_Clock(2.0))
    H.run_bench(
        sizes=["4KiB"], iterations=10, warmup=1, peers=False, threads=False, progress=line, rounds=3, patterns=False
    )
    rows = _eta_lines(stream.getvalue())
    n = len(rows)
    assert n >= 8  # a warm-up and 3 rounds of each runner
    for k, (percent, left, label) in enumerate(rows, start=1):
        assert left == profile_cli.format_eta(2.0 * (n - k)), (k, n, rows)
        assert int(percent) == round(100 * k / n) and label.startswith("4 KiB: ")
    assert rows[-1][:2] == ("100", "0s")


def test_progress_eta_over_sizes_and_threads_falls_to_zero(fake_device):
    stream = _Stream(tty=False)
    line = profile_cli.ProgressLine(stream, delay=0, interval=0, clock=_Clock(1.0))
    H.run_bench(
        sizes=["4KiB", "64KiB"], iterations=6, warmup=1, peers=False, threads=True, progress=line, patterns=False
    )
    rows = _eta_lines(stream.getvalue())
    percents = [int(p) for p, _, _ in rows]
    assert percents == sorted(percents) and percents[-1] == 100
    assert any(label.startswith("64 KiB: ") for _, _, label in rows)
    assert rows[-1][1] == "0s"
    # the first line's estimate: its share of the run took 1 s a step, so the rest takes
    # (steps left) s, which the half-run lines must not exceed either
    steps = len(rows)
    assert _seconds(rows[0][1]) >= steps / 2
    middle = rows[steps // 2]
    assert abs(_seconds(middle[1]) - (steps // 2 + 1) * (100 - int(middle[0])) / int(middle[0])) <= steps / 4


def _seconds(text):
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    h, mnt, s = (int(x or 0) for x in m.groups())
    return 3600 * h + 60 * mnt + s


# -- CLI arguments ---------------------------------------------------------------------------
def _parser():
    parser = argparse.ArgumentParser(prog="vyre-cuda profile")
    assert P.add_arguments(parser) is parser
    return parser


def test_cli_defaults():
    args = _parser().parse_args([])
    assert args.sizes == (4 * KIB, 4 * MIB, 64 * MIB, 256 * MIB, GIB)
    assert args.iterations is None and args.warmup is None
    assert args.json is None and args.plot is None and args.from_file is None
    for gone in (
        "baseline",
        "no_peers",
        "no_threads",
        "patterns_only",
        "devices",
    ):  # the benchmark record's (benchmarks/)
        assert not hasattr(args, gone)
    assert args.kernel is None and args.entry is None and args.buffers is None
    assert args.device == 0 and args.host_threads is None
    assert profile_cli.backend_options(args) == {}


def test_cli_options():
    args = _parser().parse_args(
        [
            "--sizes",
            "8KiB,1M,1GiB",
            "--iterations",
            "50",
            "--warmup",
            "0",
            "--json",
            "--plot",
            "x.png",
            "--kernel",
            "k.cu",
            "--entry",
            "k",
            "--buffers",
            "a:f32:in,o:f32:out",
            "--device",
            "1",
            "--host-threads",
            "8",
            "--staging-chunk-bytes",
            "8MiB",
            "--staging-chunks",
            "6",
            "--copy-threads",
            "4",
        ]
    )
    assert args.sizes == (8192, 1 << 20, GIB)
    assert (args.iterations, args.warmup, args.json, args.plot) == (50, 0, "-", "x.png")
    assert (args.kernel, args.entry, args.buffers, args.device) == ("k.cu", "k", "a:f32:in,o:f32:out", 1)
    assert args.host_threads == 8
    assert profile_cli.backend_options(args) == {"staging_chunk_bytes": 8 << 20, "staging_chunks": 6, "copy_threads": 4}
    assert _parser().parse_args(["--json", "out.json"]).json == "out.json"


@pytest.mark.parametrize(
    "argv",
    [
        ["--sizes", "4KB"],
        ["--sizes", ""],
        ["--iterations", "0"],
        ["--iterations", "x"],
        ["--warmup", "-1"],
        ["--device", "-1"],
        ["--host-threads", "0"],
        ["--copy-threads", "0"],
        ["--staging-chunks", "0"],
        ["--staging-chunk-bytes", "8MB"],
        ["--bogus"],
    ],
)
def test_cli_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as err:
        _parser().parse_args(argv)
    assert err.value.code == 2
    if argv[0] in ("--sizes", "--staging-chunk-bytes") and argv[1]:
        assert "Fix:" in capsys.readouterr().err


def test_cli_main_validation_errors(capsys, tmp_path):
    parser = _parser()
    assert P.main(parser.parse_args(["--buffers", "a:f32:in,o:f32:out"])) == 2
    assert "no --kernel was given" in capsys.readouterr().err
    assert P.main(parser.parse_args(["--kernel", str(tmp_path / "none.cu"), "--buffers", "a:f32:in,o:f32:out"])) == 2
    err = capsys.readouterr().err
    assert "ValidationError" in err and "Fix:" in err
    (tmp_path / "k.cu").write_text("// k")
    assert P.main(parser.parse_args(["--kernel", str(tmp_path / "k.cu"), "--buffers", "a:f32:in"])) == 2
    assert "declares no output" in capsys.readouterr().err


@pytest.mark.parametrize("content", [None, "{not json", '{"schema": "other"}'])
def test_bench_bad_baseline_fails_before_the_run(fake_device, tmp_path, content):
    path = tmp_path / "base.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValidationError) as err:
        H.run_bench(sizes=(4096,), baseline=path)
    assert "Fix:" in str(err.value)
    assert fake_device.created == []  # no backend was opened


def test_cli_main_end_to_end_on_fakes(fake_device, tmp_path, capsys):
    out = tmp_path / "r.json"
    args = _parser().parse_args(
        [
            "--sizes",
            "4KiB",
            "--iterations",
            "6",
            "--warmup",
            "1",
            "--json",
            str(out),
            "--copy-threads",
            "2",
            "--host-threads",
            "2",
        ]
    )
    assert P.main(args) == 0
    printed = capsys.readouterr().out
    assert "4 KiB per buffer" in printed and "Fake GPU" in printed
    assert "memcpy ceiling: pageable -> pinned, 2 threads" in printed
    data = json.loads(out.read_text())
    assert data["sizes"][0]["bytes"] == 4096
    assert fake_device.created[0].options == {"copy_threads": 2}
    assert fake_device.created[0].closed  # the CLI's backend is closed
    args = _parser().parse_args(["--sizes", "4KiB", "--iterations", "4", "--json"])
    assert P.main(args) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == P.SCHEMA


def test_backend_errors_become_exit_status(fake_device, monkeypatch, capsys):
    def broken(device=0, **options):
        raise vyre_cuda.DriverUnavailable("no CUDA driver was found", "install the NVIDIA driver")

    monkeypatch.setattr(vyre_cuda, "CudaBackend", broken)
    args = _parser().parse_args([])
    assert P.main(args) == 3  # no usable driver: the status every vyre-cuda command exits with
    assert "DriverUnavailable: no CUDA driver was found\nFix: install the NVIDIA driver" in capsys.readouterr().err
    assert issubclass(P.WrongResult, BackendError)


def test_vyre_cuda_cli_exposes_profile(fake_device, capsys):
    from vyre_cuda import cli

    args = cli.build_parser().parse_args(["profile", "--sizes", "4KiB"])
    assert args.func is P.main and args.sizes == (4096,)
    assert cli.main(["profile", "--sizes", "4KiB", "--iterations", "4"]) == 0
    assert "4 KiB per buffer" in capsys.readouterr().out


# -- benchmarks/ -----------------------------------------------------------------------------
def _load_bench(name):
    from helpers.scripts import load_benchmark

    return load_benchmark(name)


def _stored_report():
    return H.BenchReport.load(ROOT / "benchmarks" / "results" / "latest.json")


def test_write_readme_replaces_only_the_results_section(tmp_path, fake_device):
    wr = _load_bench("write_readme")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nhand-written\n\n{wr.BEGIN}\nold figures\n{wr.END}\n\nfooter\n")
    stored = _stored_report()
    report = H.run_bench(
        sizes=(4096, 8192),
        iterations=4,
        warmup=1,
        peers=False,
        threads=True,
        thread_iterations=4,
        thread_repeats=1,
        baseline=stored,
    )
    assert wr.update_readme(readme, report, source=tmp_path / "r.json") is True
    text = readme.read_text()
    assert text.startswith("# Title\n\nhand-written\n\n" + wr.BEGIN + "\n")
    assert text.endswith(wr.END + "\n\nfooter\n")
    assert "old figures" not in text
    assert "**Fake GPU** (cc 9.0)" in text and "CUDA driver 13.0" in text
    assert f"Baseline for the no-regression target: commit `{stored.meta['commit']}`" in text
    for count in (2, 4):
        rate = rf"{count} threads, 4 KiB: vyre_cuda dispatches/s / tight floor's from {count} C threads"
        assert re.search(rf"\| {rate} \| [0-9.]+x \| >= ?0\.9 \|", text), text
    band = r"4 KiB: tight floor in this process / the same calls in a standalone C process"
    assert re.search(rf"\| {band} \| [0-9.]+x \| 0\.95 to 1\.05 \|", text), text
    assert "| per buffer | vyre_cuda, numpy | vyre_cuda `dispatch_into`, numpy |" in text
    assert re.search(r"\| 4 KiB \| [0-9.]+ us \([0-9.]+ GB/s\) \|", text), text
    assert "| per buffer | vyre_cuda H2D | vyre_cuda D2H | DMA: pinned -> device (inputs) |" in text
    assert "```text\n" + report.format_table().rstrip("\n") + "\n```" in text
    assert wr.update_readme(readme, report, source=tmp_path / "r.json") is False  # idempotent
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError):
        wr.update_readme(readme, report)


def test_write_readme_main_and_check(tmp_path):
    wr = _load_bench("write_readme")
    result = tmp_path / "r.json"
    result.write_text(_stored_report().to_json())
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{wr.BEGIN}\n{wr.END}\n")
    assert wr.main([str(result), "--readme", str(readme), "--check"]) == 1
    assert wr.main([str(result), "--readme", str(readme)]) == 0
    assert wr.main([str(result), "--readme", str(readme), "--check"]) == 0
    assert "| 4 MiB |" in readme.read_text()


def test_repository_readme_has_the_markers_definitions_and_targets():
    wr = _load_bench("write_readme")
    text = (ROOT / "benchmarks" / "README.md").read_text()
    assert text.count(wr.BEGIN) == 1 and text.count(wr.END) == 1
    for phrase in (
        "25 GB/s",
        "45 GB/s",
        "0.35x",
        "0.5x",
        "1.2x",
        "1.05x",
        "1.15x",
        "2.5x",
        "0.9x",
        "(input + output bytes) / wall",
        "--baseline",
    ):
        assert phrase in text, phrase
    assert not re.search(r"\bissues?\b", text, re.IGNORECASE)


def test_bench_dispatch_writes_json_and_compares_with_its_stored_result(fake_device, tmp_path, capsys):
    bench = _load_bench("bench_dispatch")
    out = tmp_path / "results" / "latest.json"
    assert (
        bench.main(
            [
                "--out",
                str(out),
                "--iterations",
                "4",
                "--warmup",
                "1",
                "--no-peers",  # (the fake device's context is no real one: a peer would use it)
                "--no-threads",
                "--sizes",
                "4KiB",
                "--host-threads",
                "2",
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())
    assert data["schema"] == P.SCHEMA and data["sizes"][0]["bytes"] == 4096
    # the stored result is the baseline by default
    assert data["meta"]["baseline"]["commit"] == _stored_report().meta["commit"]
    assert "4 KiB per buffer" in capsys.readouterr().out
    assert (
        bench.main(
            ["--out", str(out), "--iterations", "4", "--no-peers", "--no-threads", "--sizes", "4KiB", "--no-baseline"]
        )
        == 0
    )
    assert "baseline" not in json.loads(out.read_text())["meta"]
    assert set(bench.BENCHES) == {"small", "large", "bandwidth", "streamed", "device", "threads", "patterns"}
    assert bench.main(["--out", str(out), "--sizes", "4KiB", "--baseline", str(tmp_path / "none.json")]) == 1


def test_devices_option_parses_ordinals():
    from benchmarks.harness.devices import format_device_scaling, parse_devices

    assert parse_devices("0,1") == (0, 1) and parse_devices("3") == (3,)
    for bad in ("", "0,0", "-1", "a,b"):
        with pytest.raises(vyre_cuda.errors.ValidationError, match="--devices"):
            parse_devices(bad)
    row = dict(
        devices=[0, 1],
        bytes_per_buffer=64 << 20,
        items=32,
        passes=3,
        scaling=1.9,
        first_device=dict(seconds=0.4, dispatches_per_s=80.0, gbps=16.0),
        all_devices=dict(seconds=0.21, dispatches_per_s=152.0, gbps=30.4),
    )
    text = format_device_scaling(row)
    assert "scaling 1.90x" in text and "64 MiB per buffer" in text and "device 0 alone" in text


# -- --from: a stored run shown again, without a GPU ---------------------------------------------
def _stored_json(tmp_path):
    """A result as `vyre-cuda profile --json FILE` writes it, from a run on the fakes."""
    path = tmp_path / "run.json"
    args = _parser().parse_args(
        [
            "--sizes",
            "4KiB,64KiB",
            "--iterations",
            "6",
            "--warmup",
            "1",
            "--json",
            str(path),
        ]
    )
    assert P.main(args) == 0
    return path


def test_from_shows_the_stored_table_and_json_without_a_backend(fake_device, tmp_path, capsys):
    path = _stored_json(tmp_path)
    table = capsys.readouterr().out
    created = len(fake_device.created)
    assert P.main(_parser().parse_args(["--from", str(path)])) == 0
    assert capsys.readouterr().out == table  # the same table as the run printed
    assert P.main(_parser().parse_args(["--from", str(path), "--json"])) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(path.read_text())
    again = tmp_path / "again.json"
    assert P.main(_parser().parse_args(["--from", str(path), "--json", str(again)])) == 0
    assert json.loads(again.read_text()) == json.loads(path.read_text())
    assert len(fake_device.created) == created  # no backend was opened to show it


def test_from_reads_the_stored_benchmark_result(capsys):
    from vyre_cuda import cli

    stored = ROOT / "benchmarks" / "results" / "latest.json"
    assert cli.main(["profile", "--from", str(stored)]) == 0
    out = capsys.readouterr().out
    assert _stored_report().meta["device_name"] in out and "1 GiB per buffer" in out


def test_from_plot_replots_a_stored_run(fake_device, tmp_path, capsys, monkeypatch):
    path = _stored_json(tmp_path)
    drawn = []
    monkeypatch.setattr(P.ProfileReport, "plot", lambda self, out: drawn.append((self, out)))
    monkeypatch.setattr(profile_cli, "require_matplotlib", lambda: None)
    assert P.main(_parser().parse_args(["--from", str(path), "--plot", str(tmp_path / "p.png")])) == 0
    ((report, out),) = drawn
    assert out == str(tmp_path / "p.png")
    assert [s.nbytes for s in report.sizes] == [4 * KIB, 64 * KIB]
    assert report.to_dict() == P.ProfileReport.load(path).to_dict()
    assert "plot written to" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "stdout"),
    [
        ((), "table"),
        (("--plot", "P"), ""),  # its figure: no 357-line table above the figure's path
        (("--json",), "json"),
        (("--json", "J"), ""),
        (("--plot", "P", "--json"), "json"),
        (("--plot", "P", "--json", "J"), ""),
    ],
)
def test_from_shows_its_table_or_only_what_plot_and_json_ask_for(
    fake_device, tmp_path, capsys, monkeypatch, extra, stdout
):
    # --help: "its table, or with --plot its figure, or with --json its JSON"
    path = _stored_json(tmp_path)
    table = capsys.readouterr().out
    drawn = []
    monkeypatch.setattr(P.ProfileReport, "plot", lambda self, out: drawn.append(out))
    monkeypatch.setattr(profile_cli, "require_matplotlib", lambda: None)
    extra = tuple(str(tmp_path / a) if a in ("P", "J") else a for a in extra)
    assert P.main(_parser().parse_args(["--from", str(path), *extra])) == 0
    out, err = capsys.readouterr()
    expected = {"table": table, "json": path.read_text(), "": ""}[stdout]
    assert out == expected
    if "--plot" in extra:
        assert drawn == [str(tmp_path / "P")]
        assert f"plot written to {tmp_path / 'P'}" in err
    if str(tmp_path / "J") in extra:
        assert json.loads((tmp_path / "J").read_text()) == json.loads(path.read_text())
        assert f"JSON written to {tmp_path / 'J'}" in err
    help_text = _parser().format_help()
    assert "--plot" in help_text and "its figure" in " ".join(help_text.split())


def test_from_plot_writes_a_png(fake_device, tmp_path):
    pytest.importorskip("matplotlib")
    path = _stored_json(tmp_path)
    png = tmp_path / "p.png"
    assert P.main(_parser().parse_args(["--from", str(path), "--plot", str(png)])) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read the profile result"),
        ("{not json", "not valid JSON"),
        ('{"schema": "other"}', "not a vyre_cuda profile result"),
        ("[1, 2]", "not a vyre_cuda profile result"),
        ('{"schema": "vyre_cuda.profile/2", "meta": {}}', "incomplete or damaged"),
        ('{"schema": "vyre_cuda.profile/2", "meta": {}, "sizes": [{"bytes": 4}]}', "incomplete or damaged"),
    ],
)
def test_from_refuses_what_is_not_a_stored_result(tmp_path, capsys, content, expected):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    assert P.main(_parser().parse_args(["--from", str(path)])) == 2
    err = capsys.readouterr().err
    assert "ValidationError" in err and expected in err
    assert err.rstrip().splitlines()[-1].startswith("Fix: ")


def test_from_refuses_measuring_options(tmp_path, capsys):
    path = tmp_path / "r.json"  # never read: the options are refused first
    args = _parser().parse_args(["--from", str(path), "--sizes", "4KiB", "--copy-threads", "2"])
    assert P.main(args) == 2
    err = capsys.readouterr().err
    assert "--sizes, --copy-threads describe a new measurement" in err
    assert err.rstrip().endswith("Fix: drop --sizes, --copy-threads, or drop --from to measure")


def test_from_plot_without_matplotlib_fails_like_a_run(tmp_path, capsys, monkeypatch):
    from vyre_cuda.errors import UnsupportedFeature

    def missing():
        raise UnsupportedFeature("plotting needs matplotlib, which is not installed", "pip install matplotlib")

    monkeypatch.setattr(profile_cli, "require_matplotlib", missing)
    stored = ROOT / "benchmarks" / "results" / "latest.json"
    png = tmp_path / "p.png"
    assert P.main(_parser().parse_args(["--from", str(stored), "--plot", str(png)])) == 1
    err = capsys.readouterr().err
    assert "UnsupportedFeature: plotting needs matplotlib" in err and err.rstrip().endswith(
        "Fix: pip install matplotlib"
    )
    assert not png.exists()


def test_from_plot_into_a_missing_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(profile_cli, "require_matplotlib", lambda: None)

    def unwritable(self, out):
        raise FileNotFoundError(2, "No such file or directory", out)

    monkeypatch.setattr(P.ProfileReport, "plot", unwritable)
    stored = ROOT / "benchmarks" / "results" / "latest.json"
    assert P.main(_parser().parse_args(["--from", str(stored), "--plot", str(tmp_path / "no" / "p.png")])) == 2
    err = capsys.readouterr().err
    assert "cannot write the plot" in err and "No such file or directory" in err and "\nFix: " in err


def test_loading_a_benchmark_leaves_sys_path_as_it_was():
    # the scripts put the checkout first on sys.path; a test run against an installed wheel that
    # kept it would hand the checkout's unbuilt vyre_cuda to the processes it spawns (Dask workers)
    import sys

    before = list(sys.path)
    _load_bench("streamed_prototype")
    assert sys.path == before


def test_bench_dispatch_streamed_runs_the_streamed_sizes(monkeypatch):
    bench = _load_bench("bench_dispatch")
    seen = {}
    monkeypatch.setattr(bench.harness, "run_bench", lambda **kw: seen.update(kw) or "report")
    assert bench.BENCHES["streamed"](3) == "report"
    assert seen["sizes"] == (4 * MIB, 256 * MIB, GIB) and seen["iterations"] == 3
    assert seen["peers"] is False and seen["threads"] is False


def test_bench_dispatch_device_runs_the_device_sizes_with_peers(monkeypatch):
    bench = _load_bench("bench_dispatch")
    seen = {}
    monkeypatch.setattr(bench.harness, "run_bench", lambda **kw: seen.update(kw) or "report")
    assert bench.BENCHES["device"](7) == "report"
    assert seen["sizes"] == (4 * KIB, 64 * MIB) and seen["iterations"] == 7
    assert seen.get("peers", True) is True and seen["threads"] is False  # the peers are the bar
