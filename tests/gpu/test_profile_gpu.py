"""The profiling harness and the driver floor on the GPU."""

import argparse
import importlib.util
import json
import threading
import time

import numpy as np
import pytest

from vyre_cuda import profile as P
from vyre_cuda.errors import DispatchFailed, ValidationError

pytestmark = pytest.mark.gpu


class _LazyFloor:
    # Imported at first use, after the GPU probe: collection never needs the built extension.
    def __getattr__(self, name):
        from vyre_cuda import _floor as module

        return getattr(module, name)


_floor = _LazyFloor()


@pytest.fixture(scope="module")
def floor_kernel(backend):
    kernel, _image = P._load_floor_kernel(backend)
    yield kernel
    kernel.close()


def _inputs(rng, n):
    return (rng.standard_normal(n).astype(np.float32),
            rng.standard_normal(n).astype(np.float32))


def test_floor_clock_is_perf_counter_clock():
    before = time.perf_counter_ns()
    now = _floor.monotonic_ns()
    after = time.perf_counter_ns()
    assert before <= now <= after


@pytest.mark.parametrize("n", [1, 1000, 1024, 257 * 1024 + 3, 1 << 20])
def test_floor_variants_compute_a_plus_b(floor_kernel, rng, n):
    with _floor.Floor(floor_kernel, n) as floor:
        assert floor.n == n and floor.nbytes == 4 * n
        for _ in range(2):  # fresh data each time: the staging must be refilled per iteration
            a, b = _inputs(rng, n)
            out = np.zeros(n, np.float32)
            total, enqueue = floor.full_pinned(a, b, out, 5, warmup=1)
            np.testing.assert_array_equal(out, a + b)
            assert total.dtype == np.int64 and total.shape == (5,) and enqueue.shape == (5,)
            assert (total > 0).all() and (enqueue > 0).all() and (enqueue <= total).all()
            a, b = _inputs(rng, n)
            out = np.zeros(n, np.float32)
            total, enqueue = floor.full_pageable(a, b, out, 5, warmup=0)
            np.testing.assert_array_equal(out, a + b)
            assert (total > 0).all() and (enqueue <= total).all()
        per_launch = floor.launch_only(4, 32, 1)
        assert per_launch.dtype == np.int64 and per_launch.shape == (4,)
        assert (per_launch > 0).all()
        a, b = _inputs(rng, n)
        out = np.zeros(n, np.float32)
        start, end = floor.run_fixed(a, b, out, 3)
        assert end > start
        np.testing.assert_array_equal(out, a + b)
        empty_total, empty_enqueue = floor.full_pinned(a, b, out, 0)
        assert empty_total.shape == (0,) and empty_enqueue.shape == (0,)
    assert floor.closed
    floor.close()  # twice is fine


def test_floor_releases_the_gil_for_its_loop(floor_kernel, rng):
    n = 1024
    a, b = _inputs(rng, n)
    out = np.zeros(n, np.float32)
    with _floor.Floor(floor_kernel, n) as floor:
        floor.run_fixed(a, b, out, 10)
        spans = []
        worker = threading.Thread(target=lambda: spans.append(floor.run_fixed(a, b, out, 5000)))
        spins = 0
        worker.start()
        while worker.is_alive():
            spins += 1  # only runs while the worker does not hold the GIL
        worker.join()
    elapsed_ms = (spans[0][1] - spans[0][0]) / 1e6
    assert elapsed_ms > 5
    assert spins > 1000, f"main thread ran {spins} steps during a {elapsed_ms:.1f} ms floor loop"
    np.testing.assert_array_equal(out, a + b)


def test_floor_threaded(floor_kernel):
    one = _floor.floor_threaded(floor_kernel, 1024, 1, 300, 20)
    two = _floor.floor_threaded(floor_kernel, 1024, 2, 300, 20)
    for result, threads in ((one, 1), (two, 2)):
        assert result["threads"] == threads and result["iterations"] == 300
        assert result["outputs_ok"] is True
        assert result["elapsed_ns"] > 0 and result["dispatches_per_s"] > 0
        assert len(result["start_ns"]) == threads
    s, e = two["start_ns"], two["end_ns"]
    assert s[0] < e[1] and s[1] < e[0], "the two floor loops did not overlap in time"
    assert two["dispatches_per_s"] == pytest.approx(
        600 * 1e9 / (max(e) - min(s)), rel=1e-9)


def test_floor_errors_are_typed(backend, floor_kernel, rng):
    with pytest.raises(ValidationError):
        _floor.Floor(floor_kernel, 0)
    with _floor.Floor(floor_kernel, 64) as floor:
        a, b = _inputs(rng, 64)
        with pytest.raises(ValidationError):
            floor.full_pinned(a.astype(np.float64), b, np.zeros(64, np.float32), 1)
        with pytest.raises(ValidationError):
            floor.full_pinned(a[:10], b, np.zeros(64, np.float32), 1)
        ro = np.zeros(64, np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValidationError):
            floor.full_pageable(a, b, ro, 1)
        with pytest.raises(ValidationError):
            floor.launch_only(1, 0)
    with pytest.raises(ValidationError):
        floor.full_pinned(a, b, np.zeros(64, np.float32), 1)  # closed
    with pytest.raises(DispatchFailed) as err:
        _floor.FloorKernel(backend.context_handle, b"this is not a module image")
    assert err.value.call == "cuModuleLoadData"
    assert err.value.status.startswith("CUDA_ERROR_")
    assert str(err.value).splitlines()[-1].startswith("Fix: ")
    _kernel, image = P._load_floor_kernel(backend)
    _kernel.close()
    with pytest.raises(DispatchFailed) as err:
        _floor.FloorKernel(backend.context_handle, image, "no_such_kernel")
    assert err.value.call == "cuModuleGetFunction"
    assert err.value.status == "CUDA_ERROR_NOT_FOUND"
    closed = _floor.FloorKernel(backend.context_handle, image)
    closed.close()
    with pytest.raises(ValidationError):
        _floor.Floor(closed, 16)


def test_run_profile_end_to_end_both_sizes(backend, tmp_path, run_python):
    from vyre_cuda._dispatch import STAGES

    iterations = 300
    # The real CLI in a plain interpreter: PyTorch's import is not robust under pytest's plugins.
    out = tmp_path / "profile.json"
    proc = run_python(
        ["-m", "vyre_cuda", "profile", "--sizes", "4KiB,4MiB", "--iterations", str(iterations),
         "--warmup", "30", "--json", str(out)],
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = P.ProfileReport.from_json(out.read_text())
    assert report.stage_names == tuple(STAGES)
    assert [s.nbytes for s in report.sizes] == [4096, 4 << 20]
    for s in report.sizes:
        for key in ("vyre.dispatch", "vyre.dispatch_profiled", "vyre.async_enqueue",
                    "vyre.async_total", "floor.pinned", "floor.pinned_enqueue",
                    "floor.pageable", "floor.pageable_enqueue"):
            assert s.systems[key].n == iterations, key
            assert s.systems[key].median > 0, key
        assert s.systems["floor.launch_only"].median > 0
        assert s.median("floor.pinned_enqueue") < s.median("floor.pinned")
        assert set(s.stages) == set(STAGES) | {P.UNATTRIBUTED}
        # The acceptance check: the core's stage clocks account for the measured wall time.
        wall = s.wall
        attributed = s.attributed.median
        assert abs(attributed - wall) <= P.STAGE_TOLERANCE * wall, (
            f"{P.format_size(s.nbytes)}: stages sum to {attributed / 1e3:.2f} us of a "
            f"{wall / 1e3:.2f} us dispatch (medians)\n{report.format_table()}")
        for peer in P.PEERS:
            if importlib.util.find_spec(P._PEER_MODULES[peer]) is None:
                assert "not installed" in s.skipped[peer]
            elif peer == "torch" and "failed to start" in s.skipped.get(peer, ""):
                # torch 2.11's import fails in a child of pytest on the H200 (a schema parse in
                # torch.utils._debug_mode, then "partially initialized"); the same CLI run from a
                # shell measures it, and the interop test imports it fine
                pass
            else:
                assert peer not in s.skipped, f"{peer}: {s.skipped.get(peer)}"
                assert s.systems[f"peer.{peer}"].n == iterations
                assert s.systems[f"peer.{peer}.launch_only"].median > 0
    t = report.threads
    assert t is not None and t.nbytes == 4096
    assert t.vyre[1] > 0 and t.vyre[2] > 0 and t.floor[1] > 0 and t.floor[2] > 0
    assert t.gain_ratio is not None
    keys = {(x.key, x.size_bytes) for x in report.targets}
    assert ("vyre_vs_floor", 4096) in keys and ("vyre_vs_floor", 4 << 20) in keys
    assert ("thread_gain_ratio", 4096) in keys
    assert report.meta["device_name"] and report.meta["cc"] == list(backend.caps.cc)
    assert P.ProfileReport.from_json(report.to_json()).to_dict() == report.to_dict()
    text = report.format_table()
    assert "4 KiB per buffer" in text and "4 MiB per buffer" in text
    print(text)  # shown with -s: the figures of this run


def test_profile_cli_on_a_user_kernel(tmp_path, capsys):
    src = tmp_path / "scale2.cu"
    src.write_text(
        '#include "vyre_cuda.cuh"\n'
        "VYRE_KERNEL scale2(const float* x, float* y, const vyre_u32* p) {\n"
        "  vyre_u64 i = vyre_global_id();\n"
        "  if (i < vyre_count(p)) y[i] = 2.0f * x[i];\n"
        "}\n"
    )
    out = tmp_path / "profile.json"
    parser = P.add_arguments(argparse.ArgumentParser())
    args = parser.parse_args([
        "--kernel", str(src), "--entry", "scale2", "--buffers", "x:f32:in,y:f32:out",
        "--sizes", "4KiB", "--iterations", "100", "--warmup", "10", "--no-threads",
        "--json", str(out),
    ])
    assert P.main(args) == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    size = data["sizes"][0]
    assert "scale2" in data["meta"]["program"]
    assert size["systems"]["vyre.dispatch"]["n"] == 100
    assert size["systems"]["floor.pinned"]["n"] == 100
    assert set(size["skipped"]) == set(P.PEERS)  # peers run vecadd only
    assert data["targets"] == []
    assert "4 KiB per buffer" in capsys.readouterr().out
