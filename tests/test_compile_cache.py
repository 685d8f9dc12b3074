"""The kernel caches under stress and misuse: single-flight compiles (threads and processes),
corrupt or hostile disk entries, clear_cache touching only its own files, and the headers a
kernel compiles against (found with cuda.pathfinder; a missing one names its package)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest

import vyre_cuda
from vyre_cuda.compile import cache as cache_mod
from vyre_cuda.compile import cache_info, clear_cache, compile_kernel, cuda_include_dirs
from vyre_cuda.compile import headers as headers_mod
from vyre_cuda.compile import nvrtc as nvrtc_mod
from vyre_cuda.errors import KernelCompileFailed
from vyre_cuda.program import Kernel

PACKAGE_ROOT = pathlib.Path(vyre_cuda.__file__).resolve().parents[1]
SOURCE = """#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(unsigned int* out, const vyre_u32* params) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(params)) out[i] = (unsigned int)i * 3u;
}
"""


def variant(i: int) -> Kernel:
    return Kernel.cuda(SOURCE + f"// variant {i}\n")


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "kernel-cache"
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(folder))
    monkeypatch.delenv("VYRE_CUDA_DISK_CACHE", raising=False)
    clear_cache(memory=True, disk=False)
    yield folder
    clear_cache(memory=True, disk=False)


def run_threads(n, work):
    errors = []
    start = threading.Barrier(n)

    def body(k):
        try:
            start.wait()
            work(k)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ------------------------------------------------------------------------------ single flight
@pytest.mark.parametrize("disk", ["1", "0"])
def test_threads_compile_each_kernel_once(monkeypatch, disk):
    # 16 threads on one kernel used to compile it up to 16 times (NVRTC releases the GIL)
    monkeypatch.setenv("VYRE_CUDA_DISK_CACHE", disk)
    calls = []
    real = nvrtc_mod.compile_source

    def counting(*args, **kwargs):
        calls.append(args[2].digest)
        return real(*args, **kwargs)

    monkeypatch.setattr(nvrtc_mod, "compile_source", counting)
    kernels = [variant(i) for i in range(4)]
    results = [[] for _ in kernels]
    before = cache_info()["compiles"]

    def work(k):
        for i in (k % 4, (k + 1) % 4, (k + 2) % 4, (k + 3) % 4):
            results[i].append(compile_kernel(kernels[i], arch=(9, 0)))

    run_threads(16, work)
    assert sorted(calls) == sorted(k.digest for k in kernels)  # each exactly once
    assert cache_info()["compiles"] == before + 4
    for got in results:
        assert len(got) == 16 and len({id(r) for r in got}) == 1


def test_a_failing_compile_fails_every_waiter_without_caching(monkeypatch):
    broken = Kernel.cuda(SOURCE + "VYRE_KERNEL other() { no_such_thing; }\n")
    failures = []

    def work(k):
        try:
            compile_kernel(broken, arch=(9, 0))
        except KernelCompileFailed as exc:
            failures.append(exc)

    run_threads(6, work)
    assert len(failures) == 6 and all("no_such_thing" in f.log for f in failures)
    assert cache_info()["memory_entries"] == 0
    assert cache_mod._key_locks == {}  # no lock outlives its compile


_CHILD = r"""
import json, os, pathlib, sys, threading, time
from vyre_cuda.compile import cache_info, compile_kernel
from vyre_cuda.program import Kernel
source, kernels, ready = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
index, total = sys.argv[4], int(sys.argv[5])
(ready / index).touch()
deadline = time.monotonic() + 60
while len(list(ready.iterdir())) < total and time.monotonic() < deadline:
    time.sleep(0.002)  # start together: every process races for every kernel
errors = []
def work(k):
    try:
        for i in range(kernels):
            compile_kernel(Kernel.cuda(source + f"// variant {(i + k) % kernels}\n"), arch=(9, 0))
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
info = cache_info()
print(json.dumps({"compiles": info["compiles"], "disk_hits": info["disk_hits"], "errors": errors}))
"""


def test_processes_compile_each_kernel_once(cache, tmp_path):
    # 4 processes x 16 threads used to compile one kernel 16 times; the file lock makes every
    # process but one wait and then read the entry the first one wrote
    processes, kernels = 3, 6
    ready = tmp_path / "ready"
    ready.mkdir()
    env = dict(os.environ, VYRE_CUDA_CACHE_DIR=str(cache), CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, SOURCE, str(kernels), str(ready), str(i), str(processes)],
            cwd=PACKAGE_ROOT.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    reports = []
    for child in children:
        out, err = child.communicate(timeout=240)
        assert child.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["errors"] == [] for r in reports), reports
    assert sum(r["compiles"] for r in reports) == kernels, reports
    assert sum(r["compiles"] + r["disk_hits"] for r in reports) == processes * kernels
    assert cache_info()["disk_entries"] == kernels
    assert not list(cache.rglob("*.lock")) and not list(cache.rglob("*.tmp"))


def test_file_lock_is_exclusive_and_leaves_no_file(cache):
    key = "ab" * 32
    with cache_mod.file_lock(key) as held:
        assert held and (cache / "ab" / f"{key}.lock").is_file()
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "import fcntl, os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
                "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
                "except BlockingIOError:\n    print('busy')\n",
                str(cache / "ab" / f"{key}.lock"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.stdout.strip() == "busy"
    assert not (cache / "ab" / f"{key}.lock").exists()


def test_no_lock_in_a_read_only_folder_still_compiles(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(blocker))
    with cache_mod.file_lock("cd" * 32) as held:
        assert held is False
    assert compile_kernel(variant(0), arch=(9, 0)).kind == "cubin"


# ------------------------------------------------------------------------------ hostile entries
def entry_path(cache, compiled, suffix):
    return cache / compiled.key[:2] / f"{compiled.key}{suffix}"


def recompiles(compiled, kernel) -> bool:
    clear_cache(memory=True, disk=False)
    before = cache_info()
    again = compile_kernel(kernel, arch=(9, 0))
    after = cache_info()
    assert again.image == compiled.image and again.key == compiled.key
    return after["compiles"] == before["compiles"] + 1 and after["disk_hits"] == before["disk_hits"]


@pytest.mark.parametrize(
    "document",
    [
        b"[" * 200_000,  # used to raise RecursionError on every compile, forever
        b'{"a":' * 200_000,
        b"\xff\xfe not utf-8",
        b"null",
        b"[1, 2]",
        b'"a string"',
    ],
    ids=["deep-list", "deep-object", "bad-utf8", "null", "list", "string"],
)
def test_corrupt_metadata_is_discarded_and_recompiled(cache, document):
    k = variant(1)
    first = compile_kernel(k, arch=(9, 0))
    meta = entry_path(cache, first, ".json")
    meta.write_bytes(document)
    assert recompiles(first, k)
    assert json.loads(meta.read_bytes())["key"] == first.key  # rewritten whole
    assert not recompiles(first, k)  # and used again


def test_metadata_naming_other_files_is_refused(cache, tmp_path):
    k = variant(2)
    first = compile_kernel(k, arch=(9, 0))
    meta_path = entry_path(cache, first, ".json")
    meta = json.loads(meta_path.read_text())
    secret = tmp_path / "secret.ptx"
    secret.write_text("not a kernel")
    for sums in ({"/../../../secret.ptx": "0" * 64, **meta["sha256"]}, {".ptx": 7, ".cubin": "x"}, []):
        meta_path.write_text(json.dumps(dict(meta, sha256=sums)))
        assert recompiles(first, k)
    for field, value in (("arch", "9.0"), ("nvrtc_version", [13]), ("log", None), ("kind", "fatbin")):
        meta_path.write_text(json.dumps(dict(meta, **{field: value})))
        assert recompiles(first, k), field


def test_oversized_metadata_is_not_parsed(cache, monkeypatch):
    k = variant(3)
    first = compile_kernel(k, arch=(9, 0))
    monkeypatch.setattr(cache_mod, "_META_MAX_BYTES", 64)
    assert recompiles(first, k)


# ------------------------------------------------------------------------------ clear_cache
def test_clear_cache_deletes_only_its_own_entries(cache, tmp_path):
    compiled = compile_kernel(variant(4), arch=(9, 0))
    shard = cache / compiled.key[:2]
    assert len(list(shard.iterdir())) == 3  # .json, .ptx, .cubin
    # The key hangs on the toolchain's versions, so the other folders are picked to miss its shard.
    a, c, f = [name for name in ("ab", "cd", "ff", "12") if name != shard.name][:3]
    other_key = f * 32
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"{other_key}.json").write_text("{}")
    keep = [
        cache / "notes.txt",
        cache / a / "data.json",  # a two-character folder, but not our file name
        cache / a / "model.cubin",
        cache / "zz" / f"{'a' * 62}zz.json",  # not a hex folder
        cache / a / f"{other_key}.json",  # a key that does not belong in this folder
        cache / a / f"{a * 32}.json.bak",
        shard / f"{compiled.key}.ptx.orig",
        shard / "README",
        cache / c / f"{c.upper() * 32}.json",  # upper case: not ours
        outside / f"{other_key}.json",
    ]
    for path in keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not ours")
    (cache / f).symlink_to(outside, target_is_directory=True)  # never followed
    (shard / f".{compiled.key}.json.abc123_x.tmp").write_text("a crashed write")
    assert cache_info()["disk_entries"] == 1
    assert clear_cache() == 1
    assert all(path.read_text() == "not ours" for path in keep)
    assert (outside / f"{other_key}.json").exists()
    assert sorted(p.name for p in shard.iterdir()) == sorted(["README", f"{compiled.key}.ptx.orig"])
    assert clear_cache() == 0


# ------------------------------------------------------------------------------ headers
def test_cuda_include_dirs_come_from_pathfinder():
    from cuda import pathfinder

    dirs = cuda_include_dirs()
    expected = pathfinder.find_nvidia_header_directory("cudart")
    if expected is None:
        pytest.skip("no CUDA runtime headers installed (nvidia-cuda-runtime)")
    assert os.path.abspath(expected) in dirs
    assert all(os.path.isabs(d) and os.path.isdir(d) for d in dirs)


def test_fp16_and_bf16_kernels_compile_with_the_found_headers():
    if not cuda_include_dirs():
        pytest.skip("no CUDA runtime headers installed (nvidia-cuda-runtime)")
    for header, ctype in (("cuda_fp16.h", "__half"), ("cuda_bf16.h", "__nv_bfloat16")):
        src = (
            f'#include <{header}>\n#include "vyre_cuda.cuh"\n'
            f"VYRE_KERNEL vyre_main({ctype}* p) {{ p[0] = p[0] + p[1]; }}\n"
        )
        assert compile_kernel(Kernel.cuda(src), arch=(9, 0)).kind == "cubin"


@pytest.mark.parametrize(
    ("header", "package"),
    [
        ("cuda_fp16.h", "nvidia-cuda-runtime"),
        ("cuda_bf16.h", "nvidia-cuda-runtime"),
        ("cuda/std/cstdint", "nvidia-cuda-cccl"),
        ("cstdint", "cuda/std/cstdint"),
        ("curand_kernel.h", "nvidia-curand"),
        ("my_project/helpers.cuh", "--include-path="),
    ],
)
def test_missing_header_names_the_package_that_provides_it(monkeypatch, header, package):
    # a cuda_fp16.h kernel on a machine without headers used to say "correct the CUDA source"
    monkeypatch.setattr(headers_mod, "cuda_include_dirs", lambda: ())
    monkeypatch.setattr(nvrtc_mod, "cuda_include_dirs", lambda: ())
    src = f'#include <{header}>\n#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main() {{}}\n'
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(Kernel.cuda(src), arch=(9, 0))
    err = info.value
    assert package in err.fix and header in err.fix
    assert header in err.message and header in err.log
    if package.startswith("nvidia"):
        major = nvrtc_mod.nvrtc_version()[0]
        assert f"pip install '{package}=={major}.*'" in err.fix
    assert str(err).splitlines()[-1] == f"Fix: {err.fix}"


def test_key_covers_the_cuda_headers(monkeypatch):
    options = ("-std=c++17", "-arch=sm_90")
    reads_headers = Kernel.cuda("#include <cuda_fp16.h>\n" + SOURCE)
    own_only = variant(5)
    before = [cache_mod.cache_key((13, 3), options, k) for k in (reads_headers, own_only)]
    monkeypatch.setattr(cache_mod, "headers_fingerprint", lambda: (("/somewhere/include", "cuda_runtime_api.h", 1, 2),))
    after = [cache_mod.cache_key((13, 3), options, k) for k in (reads_headers, own_only)]
    assert after[0] != before[0]
    assert after[1] == before[1]  # it reads no CUDA header: their change does not recompile it


OWN = '#include "vyre_cuda.cuh"\n'


@pytest.mark.parametrize(
    ("source", "options", "needs"),
    [
        (OWN + "VYRE_KERNEL vyre_main() {}", (), False),
        ('  #  include   "vyre_cuda.cuh"  \nVYRE_KERNEL vyre_main() {}', ("-lineinfo", "-DX=1"), False),
        ("VYRE_KERNEL vyre_main() {}", ("--use_fast_math",), False),
        ("#include <cuda_fp16.h>\n" + OWN, (), True),
        ("# include <cuda/std/cstdint>\n", (), True),
        ("%:include <mma.h>\n", (), True),
        ("#inc\\\nlude <mma.h>\n", (), True),  # a backslash-newline inside the directive name
        ("#inc\\\r\nlude <mma.h>\n", (), True),
        ('#include "helpers.cuh"\n', (), True),
        ("#if __has_include(<cuda_fp16.h>)\n#endif\n", (), True),
        (OWN.rstrip() + "  // and a comment\n", (), True),  # read as text: kept on the safe side
        ("// include nothing\n", (), True),
        (OWN, ("-I/opt/mine",), True),
        (OWN, ("--include-path=/opt/mine",), True),
        (OWN, ("--pre-include=extra.h",), True),
        (OWN, ("-include", "extra.h"), True),
    ],
)
def test_needs_cuda_headers_reads_every_way_a_source_can_include(source, options, needs):
    assert headers_mod.needs_cuda_headers(Kernel.cuda(source, options=options)) is needs


def test_vyre_cudas_own_headers_include_nothing():
    # needs_cuda_headers() takes `#include "vyre_cuda.cuh"` as reading no other file
    own = [p for p in pathlib.Path(headers_mod.include_dir()).iterdir() if p.is_file()]
    assert own and all("include" not in p.read_text() for p in own)


def test_a_kernel_reading_no_cuda_header_never_searches_for_them(monkeypatch):
    calls = []

    def searched():
        calls.append(1)
        return ()

    monkeypatch.setattr(nvrtc_mod, "cuda_include_dirs", searched)
    monkeypatch.setattr(cache_mod, "headers_fingerprint", searched)
    compiled = compile_kernel(variant(6), arch=(9, 0))
    clear_cache(memory=True, disk=False)
    assert compile_kernel(variant(6), arch=(9, 0)).key == compiled.key  # the disk hit
    assert cache_info()["disk_hits"] >= 1
    assert calls == []
    compile_kernel(Kernel.cuda("// include nothing\n" + SOURCE), arch=(9, 0))
    assert len(calls) == 2  # options and key


def test_headers_fingerprint_names_each_folder():
    marks = headers_mod.headers_fingerprint()
    assert [m[0] for m in marks] == list(cuda_include_dirs())
    assert all(m[2] > 0 for m in marks if m[1])
