"""vyre_cuda.dask without a GPU: programs travel by value, the worker plugin's lifecycle, map_blocks
graphs and results, submit, and a worker that dies mid-task, on a LocalCluster of processes whose
workers run the numpy fake backend (tests/fakes.py, shipped to them by value)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import types

import fakes
import numpy as np
import pytest

import vyre_cuda as vc
from vyre_cuda import BufferDecl, DispatchConfig, Kernel, Program, ValidationError
from vyre_cuda import builtin_programs as bp

TIMEOUT = 60


# ---------------------------------------------------------------------------------- pickling
def _programs():
    return [
        bp.vecadd("f32"),
        bp.vecadd("f16"),
        bp.inclusive_scan_u32(),
        bp.block_sum_u32(4, scratch_elems=512),
        fakes.axpb_program(),
        Program(
            Kernel.cuda('/* k */ extern "C" __global__ void k() {}', entry="k", options=("-DX=1",)),
            [
                BufferDecl.uniform("u", 0, "u32", 4),
                BufferDecl("o", 3, "write_only", "f64", 0, alignment=256),
                BufferDecl.read("r", 1, "bf16"),
            ],
            workgroup_size=128,
            name="custom",
        ),
        Program(
            Kernel.ptx(".version 8.0\n.target sm_90\n", entry="main"),
            [BufferDecl.read("a", 0, "u8"), BufferDecl.output("b", 1, "u8", 16, output_byte_range=(0, 8))],
        ),
    ]


@pytest.mark.parametrize("program", _programs(), ids=lambda p: p.name or p.kernel.entry)
def test_programs_pickle_by_value(program):
    clone = pickle.loads(pickle.dumps(program))
    assert clone is not program
    assert clone.kernel.digest == program.kernel.digest
    assert (clone.kernel.kind, clone.kernel.entry, clone.kernel.options, clone.kernel.source) == (
        program.kernel.kind,
        program.kernel.entry,
        program.kernel.options,
        program.kernel.source,
    )
    assert clone.buffers == program.buffers
    assert [b.role for b in clone.buffers] == [b.role for b in program.buffers]
    assert (clone.workgroup_size, clone.grid_sync, clone.phases, clone.requires, clone.name) == (
        program.workgroup_size,
        program.grid_sync,
        program.phases,
        program.requires,
        program.name,
    )
    assert [d.name for d in clone.inputs] == [d.name for d in program.inputs]


def test_a_pickled_program_computes_the_same(rng):
    prog = fakes.axpb_program()
    clone = pickle.loads(pickle.dumps(prog))
    backend = fakes.FakeBackend(0)
    x, y = rng.random(100, dtype=np.float32), rng.random(100, dtype=np.float32)
    coef = np.array([1.5], np.float32)
    np.testing.assert_array_equal(backend.dispatch(clone, [x, y, coef])[0], backend.dispatch(prog, [x, y, coef])[0])


def test_configs_pickle():
    cfg = DispatchConfig(
        workgroup_override=64, grid_override=(8, 2), fixpoint_iterations=3, cooperative=True, label="x", timeout=2.5
    )
    clone = pickle.loads(pickle.dumps(cfg))
    assert clone == cfg and clone.iterations == 3 and clone.grid_override == (8, 2, 1)


# ---------------------------------------------------------------------------------- cluster
@pytest.fixture(scope="module")
def dask_mods():
    pytest.importorskip("dask.array")
    pytest.importorskip("distributed")
    import cloudpickle

    import vyre_cuda.dask as vd

    # workers are other processes: ship the fake by value instead of importing tests/ there
    cloudpickle.register_pickle_by_value(fakes)
    return types.SimpleNamespace(vd=vd, da=pytest.importorskip("dask.array"))


@pytest.fixture(scope="module")
def client(dask_mods):
    from distributed import Client, LocalCluster

    # dashboard_address=":0": a free port (None still binds the scheduler's HTTP routes to 8787,
    # which a second cluster on the machine would find taken)
    cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0", memory_limit=0)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def logs(tmp_path):
    return tmp_path


def _files(folder, prefix):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(prefix))


def _compute(client, *arrays):
    return (
        client.gather(client.compute(list(arrays)), direct=False)
        if len(arrays) > 1
        else client.compute(arrays[0]).result(timeout=TIMEOUT)
    )


def test_import_needs_no_dask():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('dask', 'distributed'): raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import vyre_cuda\n"
        "vyre_cuda.DeviceGroup\n"
        "try:\n"
        "    import vyre_cuda.dask\n"
        "except ImportError as e:\n"
        "    print('IMPORT-ERROR', str(e).splitlines()[-1])\n"
    )
    root = os.path.dirname(os.path.dirname(vc.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/", env=env)
    assert out.returncode == 0, out.stderr
    assert "IMPORT-ERROR Fix: pip install 'vyre-cuda[dask]'" in out.stdout


def test_program_key_is_stable_across_processes(dask_mods):
    vd = dask_mods.vd
    prog = fakes.axpb_program()
    assert vd.program_key(prog) == vd.program_key(pickle.loads(pickle.dumps(prog)))
    assert vd.program_key(prog) == vd.program_key(fakes.axpb_program())
    assert vd.program_key(prog) != vd.program_key(fakes.scale_program())
    assert vd.program_key(bp.vecadd("f32")) != vd.program_key(bp.vecadd("f32", workgroup=128))


def test_program_key_covers_every_field(dask_mods):
    vd = dask_mods.vd
    variants = fakes.field_variants()
    assert {f for f, _, _ in variants} == {f.name for f in dataclasses.fields(Program)}
    for field, a, b in variants:
        assert vd.program_key(a) != vd.program_key(b), field
    # programs built twice (every field equal) share a key; a lambda launch keys on its code and
    # closure, so two made alike share one too
    for (_, a, b), (_, a2, b2) in zip(variants, fakes.field_variants()):
        assert (vd.program_key(a), vd.program_key(b)) == (vd.program_key(a2), vd.program_key(b2))
    sized = [fakes.launch_elems_program(lambda s, k=k: s["x"] + k) for k in range(3)]
    assert len({vd.program_key(p) for p in sized}) == 3


def test_an_unpicklable_launch_is_refused_by_name(dask_mods):
    class Launch:
        def __call__(self, sizes):
            return sizes["x"]

        def __reduce__(self):
            raise TypeError("no pickling")

    with pytest.raises(ValidationError, match=r"Program.launch .* cannot be pickled[\s\S]*\nFix: "):
        dask_mods.vd.program_key(fakes.launch_elems_program(Launch()))


def test_programs_differing_only_in_launch_run_apart(dask_mods, client, rng, logs):
    # once a worker kept one program per key: the second of these ran as the first
    vd, da = dask_mods.vd, dask_mods.da
    vd.register(client, backend_factory=fakes.FakeFactory(log_dir=logs))
    worker = sorted(client.scheduler_info()["workers"])[0]
    nx = int(rng.integers(1, 1000))
    ny = nx + int(rng.integers(1, 1000))
    x, y = rng.integers(0, 256, nx, dtype=np.uint8), rng.integers(0, 256, ny, dtype=np.uint8)
    programs = [fakes.launch_elems_program(launch) for launch in ("x", "y", fakes.launch_by_y, None)]
    wants = [nx, ny, ny, nx]
    for prog, want in zip(programs[:3], wants):
        (n,) = vd.submit(client, prog, [x, y], workers=[worker]).result(timeout=TIMEOUT)
        assert int(n[0]) == want
    chunk = int(rng.integers(1, nx + 1))
    dx, dy = da.from_array(x, chunks=chunk), da.from_array(y[:nx], chunks=chunk)
    outs = [vd.map_blocks(prog, dx, dy)[0] for prog in programs]
    assert len({o.name for o in outs}) == len(programs)  # distinct graphs: dask reuses none
    sizes = list(dx.chunks[0])
    for got in _compute(client, *outs):
        np.testing.assert_array_equal(got[:, 0], sizes)


def test_worker_device_choice(dask_mods, monkeypatch):
    from vyre_cuda.dask import _worker_device

    worker = types.SimpleNamespace(name=3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _worker_device(5, worker) == 5
    assert _worker_device(lambda w: w.name + 1, worker) == 4
    named = types.SimpleNamespace(name="tcp-worker")
    assert _worker_device(None, named) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")  # dask-cuda: the worker's own GPU first
    assert _worker_device(None, worker) == 0
    with pytest.raises(ValidationError, match="device must be"):
        dask_mods.vd.VyreCudaPlugin(device=-1)
    with pytest.raises(ValidationError, match="backend_options"):
        dask_mods.vd.VyreCudaPlugin(backend_factory=fakes.FakeFactory(), backend_options={"x": 1})


def test_plugin_lifecycle(dask_mods, client, logs):
    vd = dask_mods.vd
    vd.register(client, backend_factory=fakes.FakeFactory(log_dir=logs))
    info = client.run(vd.worker_info)
    # LocalCluster names its workers 0 and 1: spread over the visible devices (as named without a driver)
    assert sorted(i["device"] for i in info.values()) == sorted(k % _visible_devices() for k in (0, 1))
    assert all(i["backend"] for i in info.values())
    pids = sorted(str(i["pid"]) for i in info.values())
    assert sorted(n.split("-")[1] for n in _files(logs, "open-")) == pids
    assert _files(logs, "close-") == []

    client.unregister_worker_plugin(vd.PLUGIN_NAME)
    assert sorted(n.split("-")[1] for n in _files(logs, "close-")) == pids  # teardown closed them
    assert all(i["backend"] is None for i in client.run(vd.worker_info).values())
    x = dask_mods.da.ones(10, chunks=5, dtype=np.float32)
    (out,) = vd.map_blocks(fakes.scale_program(), x)
    with pytest.raises(ValidationError, match="has no vyre_cuda backend") as info:
        _compute(client, out)
    assert "Fix: call vyre_cuda.dask.register(client)" in str(info.value)


def test_a_device_chooser_travels_by_value(dask_mods, client):
    vd = dask_mods.vd
    vd.register(client, device=lambda worker: 7 + int(worker.name), backend_factory=fakes.FakeFactory())
    assert sorted(i["device"] for i in client.run(vd.worker_info).values()) == [7, 8]


def test_a_worker_that_cannot_create_its_backend_fails_registration(dask_mods, client):
    with pytest.raises(vc.DeviceLost, match="cannot create a context on device 1"):
        dask_mods.vd.register(
            client, device=lambda worker: int(worker.name), backend_factory=fakes.FakeFactory(fail_devices=(1,))
        )


def _visible_devices() -> int:
    """How many devices the default rule spreads over: the driver's count, or the worker names
    themselves where no driver is found (then any count above 1 gives the same answer)."""
    from vyre_cuda import _driver

    try:
        return _driver.device_count()
    except vc.BackendError:
        return 2


def test_map_blocks_matches_numpy_and_compiles_once_per_worker(dask_mods, client, rng, logs):
    vd, da = dask_mods.vd, dask_mods.da
    vd.register(client, backend_factory=fakes.FakeFactory(log_dir=logs))
    x_np = rng.random((90, 70), dtype=np.float32)
    y_np = rng.random((90, 70), dtype=np.float32)
    x = da.from_array(x_np, chunks=(25, 30))  # uneven edge chunks
    y = da.from_array(y_np, chunks=(40, 70))  # other chunks: aligned by map_blocks
    coef = np.array([0.5], np.float32)
    prog = fakes.axpb_program()
    (out,) = vd.map_blocks(prog, x, y, coef)
    assert out.shape == (90, 70) and out.dtype == np.float32
    assert out.numblocks == (6, 3)  # the common refinement of both chunkings: 25,40,50,75,80,90
    np.testing.assert_allclose(_compute(client, out), 0.5 * x_np + y_np, rtol=1e-6)
    info = client.run(vd.worker_info)
    assert sum(i["telemetry"]["dispatches"] for i in info.values()) == 18
    for i in info.values():  # every task of a worker used ONE program object: planned once
        assert i["programs"] == 1 and i["telemetry"]["prepared_plans"] == 1

    (again,) = vd.map_blocks(prog, x, y, coef)
    assert again.name == out.name  # deterministic keys: dask can reuse results
    (other,) = vd.map_blocks(prog, x, y, np.array([2.0], np.float32))
    assert other.name != out.name


def test_map_blocks_static_inputs_and_outputs(dask_mods, client, rng, logs):
    vd, da = dask_mods.vd, dask_mods.da
    vd.register(client, backend_factory=fakes.FakeFactory(log_dir=logs))
    x_np = rng.random(1000, dtype=np.float32)
    x = da.from_array(x_np, chunks=300)
    twice, total = vd.map_blocks(fakes.twice_and_sum_program(), x)
    assert total.shape == (4, 1) and total.chunks == ((1, 1, 1, 1), (1,)) and total.dtype == np.float64
    t, s = _compute(client, twice, total)
    np.testing.assert_array_equal(t, x_np * 2)
    sums = [x_np[i : i + 300].astype(np.float64).sum() for i in range(0, 1000, 300)]
    np.testing.assert_allclose(s[:, 0], sums)
    assert float(_compute(client, total.sum())) == pytest.approx(x_np.astype(np.float64).sum())

    # a static input given as a dask array reaches every task whole; numpy runtime inputs are chunked
    coef = da.from_array(np.array([3.0], np.float32), chunks=1)
    (out,) = vd.map_blocks(fakes.axpb_program(), x, x_np, coef)
    np.testing.assert_allclose(_compute(client, out), 3 * x_np + x_np, rtol=1e-6)


def test_map_blocks_refusals(dask_mods):
    vd, da = dask_mods.vd, dask_mods.da
    x = da.ones(100, chunks=10, dtype=np.float32)
    prog = fakes.axpb_program()
    coef = np.ones(1, np.float32)
    cases = [
        ((prog, x, x), "takes 3 input"),
        ((prog, x, x.astype(np.float64), coef), "declared f32"),
        ((prog, x, da.ones(99, chunks=10, dtype=np.float32), coef), "must be a dask array of shape"),
        ((prog, np.ones(100, np.float32), np.ones(100, np.float32), coef), "no runtime-sized input is one"),
        ((prog, x, x, np.ones(2, np.float32)), "count=1"),
        ((prog, x, x, object()), "buffer protocol"),
        ((bp.block_sum_u32(1), da.ones(256, chunks=256, dtype=np.uint32)), "no runtime-sized input"),
        ((bp.params_echo(0, 8), da.ones(4, chunks=2, dtype=np.uint32)), None),  # fine: static output
        (
            (
                Program(
                    Kernel.cuda("x"),
                    [BufferDecl.read("a", 0, "u8"), BufferDecl.output("b", 1, "u8", output_byte_range=(0, 4))],
                ),
                da.ones(8, chunks=4, dtype=np.uint8),
            ),
            "byte range",
        ),
        (("prog", x), "Program"),
    ]
    for args, match in cases:
        if match is None:
            vd.map_blocks(*args)
            continue
        with pytest.raises(ValidationError, match=match) as info:
            vd.map_blocks(*args)
        assert str(info.value).splitlines()[-1].startswith("Fix: ")


def test_submit(dask_mods, client, rng, logs):
    vd = dask_mods.vd
    vd.register(client, backend_factory=fakes.FakeFactory(log_dir=logs))
    a = rng.random(500, dtype=np.float32)
    future = vd.submit(client, bp.vecadd("f32"), [a, a])
    (out,) = future.result(timeout=TIMEOUT)
    np.testing.assert_array_equal(out, a + a)
    bad = a.copy()
    bad[0] = fakes.BAD
    with pytest.raises(ValidationError, match="BAD"):
        vd.submit(client, bp.vecadd("f32"), [bad, a]).result(timeout=TIMEOUT)


def test_a_timeout_reaches_the_client_as_dispatch_failed(dask_mods, client, rng, logs):
    # its .pending (a PendingDispatch) cannot be pickled; the client once got builtins.Exception
    vd = dask_mods.vd
    vd.register(client, backend_factory=fakes.FakeFactory(log_dir=logs))
    a = rng.random(int(rng.integers(1, 500)), dtype=np.float32)
    a[0] = fakes.STALL
    with pytest.raises(vc.DispatchFailed) as info:
        vd.submit(client, bp.vecadd("f32"), [a, a]).result(timeout=TIMEOUT)
    err = info.value
    assert (type(err), err.status, err.call, err.pending) == (vc.DispatchFailed, "timeout", "wait", None)
    assert str(err).splitlines()[-1].startswith("Fix: raise DispatchConfig(timeout=...)")


def test_a_worker_that_dies_mid_task_is_replaced_and_the_task_retried(dask_mods, client, rng, logs):
    vd, da = dask_mods.vd, dask_mods.da
    vd.register(client, backend_factory=fakes.FakeFactory(log_dir=logs))
    x_np = rng.random(4000, dtype=np.float32)
    x_np[2000] = fakes.DIE  # the first element of chunk 4 ends the process running it, once
    x = da.from_array(x_np, chunks=500)
    (out,) = vd.map_blocks(fakes.scale_program(), x)
    np.testing.assert_array_equal(_compute(client, out), x_np * 2)
    died = (logs / "died").read_text()
    ran = [n.split("-")[2] for n in _files(logs, "ran-die-")]
    assert ran and died not in ran  # the chunk was computed by another process
    client.wait_for_workers(2, timeout=TIMEOUT)
    info = client.run(vd.worker_info)
    assert len(info) == 2 and all(i["backend"] for i in info.values())  # the plugin set up the new one


def test_the_multi_gpu_benchmark_runs_end_to_end_on_fakes(dask_mods, tmp_path, monkeypatch):
    """A smoke run of benchmarks/bench_multi_gpu.py (every section, tiny sizes) on the numpy fake:
    the harness, its JSON and its target rows, not a measurement."""
    import json

    from helpers.scripts import load_benchmark

    bench = load_benchmark("bench_multi_gpu")
    out = tmp_path / "multi.json"
    rc = bench.main(
        ["--quick", "--reps", "1", "--item-mib", "0.25", "--dask-gib", "0.002", "--out", str(out)],
        backend_factory=fakes.FakeFactory(),
        device_count=2,
    )
    assert rc == 0
    result = json.loads(out.read_text())
    assert {"host_memcpy", "compute", "transfer", "small", "dask", "targets"} <= set(result)
    assert result["compute"]["results_match_one_gpu"] and result["transfer"]["correct"]
    assert result["dask"]["correct"] and result["dask"]["worker_devices"] == [0, 1]
    names = [t["name"] for t in result["targets"]]
    assert len(names) == 6 and any("Dask map_blocks" in n for n in names)
