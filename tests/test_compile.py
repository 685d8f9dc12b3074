"""NVRTC compilation and the kernel caches, with the real NVRTC (it needs no GPU)."""

from __future__ import annotations

import logging
import os
import pathlib
import pickle
import re
import subprocess
import sys
import threading

import fakecuda
import pytest

import vyre_cuda
from vyre_cuda.compile import (
    CompiledKernel,
    cache_dir,
    cache_info,
    clear_cache,
    compile_kernel,
    explain_load_failure,
    include_dir,
    nvrtc_version,
    ptx_entries,
)
from vyre_cuda.compile import cache as cache_mod
from vyre_cuda.compile import headers as headers_mod
from vyre_cuda.compile import nvrtc as nvrtc_mod
from vyre_cuda.errors import KernelCompileFailed, ValidationError
from vyre_cuda.program import Kernel


def suggested_headers(fix: str) -> list:
    """The headers a Fix line tells to include, in order (``<cuda/std/cstdint>`` gives ``cuda/std/cstdint``)."""
    return re.findall(r"<([\w./]+)>", fix)


# the folder holding the vyre_cuda under test, for child interpreters
_PACKAGE_ROOT = str(pathlib.Path(vyre_cuda.__file__).resolve().parents[1])

SOURCE = """#include "vyre_cuda.cuh"
VYRE_KERNEL vyre_main(unsigned int* out, const vyre_u32* params) {
  const vyre_u64 i = vyre_global_id();
  if (i < vyre_count(params)) out[i] = (unsigned int)i * 2u;
}
"""


def kernel(source=SOURCE, **kw) -> Kernel:
    return Kernel.cuda(source, **kw)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A private disk cache folder and an empty memory cache for every test."""
    folder = tmp_path / "kernel-cache"
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(folder))
    monkeypatch.delenv("VYRE_CUDA_DISK_CACHE", raising=False)
    clear_cache(memory=True, disk=False)
    yield folder
    clear_cache(memory=True, disk=False)


def files_under(folder: pathlib.Path) -> list:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def forbid_compiling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("NVRTC compiled although the kernel was cached")

    monkeypatch.setattr(nvrtc_mod, "compile_source", refuse)


# Compilation ----------------------------------------------------------------------------------
def test_arch_gives_cubin_for_that_arch_and_keeps_ptx():
    compiled = compile_kernel(kernel(), arch=(9, 0))
    assert isinstance(compiled, CompiledKernel)
    assert compiled.kind == "cubin"
    assert compiled.image.startswith(b"\x7fELF")
    assert compiled.arch == (9, 0)
    assert compiled.entry == "vyre_main"
    assert ".target sm_90" in compiled.ptx
    assert ptx_entries(compiled.ptx) == ["vyre_main"]
    assert compiled.nvrtc_version == nvrtc_version()
    assert compiled.nvrtc_version >= (13, 0)
    assert len(compiled.key) == 64 and int(compiled.key, 16) >= 0


def test_compiling_leaves_the_interpreters_shared_objects_alone(tmp_path):
    # NVRTC writes its answers into the buffer it is given. A clean compile's log is one byte (its
    # NUL): were that buffer CPython's shared one-byte ``b" "``, every ``b" "`` of the process would
    # read ``b"\x00"`` from then on (seen as torch failing to import after a dispatch). Checked in a
    # child process, so a regression cannot poison this one.
    child = (
        "from vyre_cuda.compile import compile_kernel\n"
        "from vyre_cuda.program import Kernel\n"
        f"compile_kernel(Kernel.cuda({SOURCE!r}), arch=(9, 0))\n"
        f"compile_kernel(Kernel.cuda({SOURCE!r}))\n"
        "print(bytes([32]).hex(), b' '.decode().encode().hex(), ' '.join('ab'))\n"
    )
    env = {**os.environ, "VYRE_CUDA_DISK_CACHE": "0", "PYTHONPATH": _PACKAGE_ROOT}
    # (from tmp_path: `python -c` puts its folder first on sys.path, and the source tree's unbuilt
    # vyre_cuda would shadow the package under test)
    proc = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["20", "20", "a", "b"]


def test_no_arch_gives_nul_terminated_generic_ptx():
    compiled = compile_kernel(kernel())
    assert compiled.kind == "ptx"
    assert compiled.arch is None
    assert compiled.image.endswith(b"\0") and not compiled.image.endswith(b"\0\0")
    assert compiled.image[:-1].decode() == compiled.ptx
    assert ".target sm_75" in compiled.ptx
    assert ".entry vyre_main(" in compiled.ptx


def test_arch_newer_than_nvrtc_gives_ptx_for_the_newest_arch_it_knows():
    compiled = compile_kernel(kernel(), arch=(99, 0))
    assert compiled.kind == "ptx"
    assert compiled.arch is not None and compiled.arch < (99, 0)
    assert f".target sm_{compiled.arch[0]}{compiled.arch[1]}" in compiled.ptx


def test_arch_older_than_nvrtc_supports_is_refused():
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(kernel(), arch=(5, 0))
    assert "sm_50" in info.value.message
    assert str(info.value).splitlines()[-1].startswith("Fix: ")


@pytest.mark.parametrize("arch", [(9,), "sm_90", (0, 0), (9, 12)])
def test_malformed_arch_is_a_validation_error(arch):
    with pytest.raises(ValidationError):
        compile_kernel(kernel(), arch=arch)


def test_defines_reach_the_source():
    source = SOURCE + "#if VYRE_PHASE_WORD != 3\n#error phase word not passed\n#endif\n"
    compiled = compile_kernel(kernel(source), arch=(9, 0), defines={"VYRE_PHASE_WORD": "3"})
    assert compiled.kind == "cubin"
    for defines in (None, {"VYRE_PHASE_WORD": "4"}):
        with pytest.raises(KernelCompileFailed) as info:
            compile_kernel(kernel(source), arch=(9, 0), defines=defines)
        assert "phase word not passed" in info.value.log


def test_define_without_value_and_bad_define_name():
    source = SOURCE + "#ifndef VYRE_FLAG\n#error flag missing\n#endif\n"
    assert compile_kernel(kernel(source), defines={"VYRE_FLAG": None}).kind == "ptx"
    with pytest.raises(ValidationError):
        compile_kernel(kernel(), defines={"BAD NAME": 1})


def test_kernel_options_reach_nvrtc():
    source = SOURCE + "#if !defined(FROM_OPTIONS)\n#error options not passed\n#endif\n"
    assert compile_kernel(kernel(source, options=("-DFROM_OPTIONS",))).kind == "ptx"
    with pytest.raises(KernelCompileFailed):
        compile_kernel(kernel(source))


def test_compile_error_carries_the_log_and_a_fix():
    bad = SOURCE + "VYRE_KERNEL broken(unsigned int* out) { out[0] = no_such_symbol; }\n"
    before = cache_info()["compiles"]
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(kernel(bad), arch=(9, 0))
    error = info.value
    assert "no_such_symbol" in error.log
    assert "out[0] = no_such_symbol;" in error.log
    assert "vyre_main" in error.message and "error" in error.message
    assert str(error).splitlines()[-1].startswith("Fix: ")
    assert ".log" in error.fix
    assert pickle.loads(pickle.dumps(error)).log == error.log
    assert cache_info()["compiles"] == before
    assert cache_info()["memory_entries"] == 0
    assert files_under(cache_dir()) == []


def test_invalid_option_is_a_compile_failure():
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(kernel(options=("--no-such-option",)))
    assert "--no-such-option" in info.value.log


def test_missing_entry_lists_the_entries_present():
    source = SOURCE + "VYRE_KERNEL helper(unsigned int* out) { out[0] = 7u; }\n"
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(kernel(source, entry="absent"), arch=(9, 0))
    message = info.value.message
    assert "'absent'" in message
    assert "vyre_main" in message and "helper" in message
    assert str(info.value).splitlines()[-1].startswith("Fix: ")


def test_mangled_entry_is_reported_as_missing():
    source = "__global__ void vyre_main(int* p) { p[0] = 1; }\n"
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(kernel(source))
    assert "_Z9vyre_mainPi" in info.value.message
    assert "extern" in info.value.fix


def test_missing_nvrtc_is_a_compile_failure_with_an_install_fix(monkeypatch):
    def missing():
        raise ImportError("libnvrtc.so.13: cannot open shared object file")

    monkeypatch.setattr(nvrtc_mod, "_import_nvrtc", missing)
    assert nvrtc_version() is None
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(kernel(), arch=(9, 0))
    assert "pip install 'nvidia-cuda-nvrtc>=13,<14'" in info.value.fix
    assert "libnvrtc.so.13" in info.value.message


def test_nvrtc_library_not_found_is_a_compile_failure(monkeypatch):
    def not_found():
        raise RuntimeError("Failure finding libnvrtc.so")

    monkeypatch.setattr(nvrtc_mod, "_import_nvrtc", not_found)
    with pytest.raises(KernelCompileFailed):
        compile_kernel(kernel())


_PRELOAD_CHILD = """
import sys, threading, vyre_cuda
from vyre_cuda.compile import nvrtc as n
calls = []
real = n._preload
n._preload = lambda: (calls.append(1), real())
assert "cuda.bindings.nvrtc" not in sys.modules, "loaded before any backend"
backends = [vyre_cuda.CudaBackend(0), vyre_cuda.CudaBackend(0)]
for t in threading.enumerate():
    if t.name == "vyre_cuda-nvrtc-preload":
        t.join(60)
print("preloads", len(calls), "cuda.bindings.nvrtc" in sys.modules)
for b in backends:
    b.close()
"""


def test_the_first_backend_preloads_nvrtc_once(fake_libcuda):
    proc = fakecuda.run_python(["-c", _PRELOAD_CHILD], fake_libcuda, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-3:] == ["preloads", "1", "True"], proc.stdout


def test_a_failing_preload_is_silent_and_the_load_still_reports(monkeypatch):
    def broken(name):
        raise ImportError(f"{name}: libnvrtc.so.13: cannot open shared object file")

    monkeypatch.setattr(nvrtc_mod, "importlib", type("M", (), {"import_module": staticmethod(broken)}))
    nvrtc_mod._preload()  # raises nothing: the dispatch that needs NVRTC says what is wrong

    def missing():
        raise ImportError("libnvrtc.so.13: cannot open shared object file")

    monkeypatch.setattr(nvrtc_mod, "_import_nvrtc", missing)
    with pytest.raises(KernelCompileFailed, match="libnvrtc.so.13"):
        compile_kernel(kernel(), arch=(9, 0))


def test_include_dir_holds_the_header():
    folder = pathlib.Path(include_dir())
    assert folder.is_absolute()
    assert (folder / "vyre_cuda.cuh").read_text().count("VYRE_KERNEL") >= 1


# PTX kernels ----------------------------------------------------------------------------------
PTX = """.version 8.0
.target sm_75
.address_size 64

.visible .entry main(
\t.param .u64 main_param_0
)
{
\tret;
}
"""


def test_ptx_kernel_passes_through_nul_terminated():
    compiled = compile_kernel(Kernel.ptx(PTX))
    assert compiled.kind == "ptx"
    assert compiled.image == PTX.encode() + b"\0"
    assert compiled.ptx == PTX
    assert compiled.entry == "main"
    assert compiled.nvrtc_version is None and compiled.arch is None
    assert compile_kernel(Kernel.ptx(PTX + "\0")).image == compiled.image
    assert compile_kernel(Kernel.ptx(PTX)).key == compiled.key
    assert compile_kernel(Kernel.ptx(PTX + "// other\n")).key != compiled.key


def test_ptx_kernel_with_missing_entry_lists_the_entries():
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(Kernel.ptx(PTX, entry="other"))
    assert "'other'" in info.value.message and "main" in info.value.message
    assert str(info.value).splitlines()[-1].startswith("Fix: ")


def test_ptx_kernel_needs_no_nvrtc(monkeypatch):
    def missing():
        raise ImportError("no NVRTC")

    monkeypatch.setattr(nvrtc_mod, "_import_nvrtc", missing)
    assert compile_kernel(Kernel.ptx(PTX)).kind == "ptx"


def test_nvrtc_ptx_loads_as_a_ptx_kernel():
    ptx = compile_kernel(kernel()).ptx
    assert compile_kernel(Kernel.ptx(ptx, entry="vyre_main")).image == ptx.encode() + b"\0"


def test_ptx_entries_parses_entry_directives():
    text = (
        "// .globl commented\n"
        ".visible .entry first(\n.param .u64 a)\n{ ret; }\n"
        ".entry second()\n{ ret; }\n"
        ".weak .entry $third\n{ ret; }\n"
        ".visible .func not_an_entry(.param .u64 b)\n{ ret; }\n"
    )
    assert ptx_entries(text) == ["first", "second", "$third"]
    assert ptx_entries(".version 8.0\n") == []


# Memory cache ---------------------------------------------------------------------------------
def test_memory_cache_hit_does_not_compile_or_touch_nvrtc(monkeypatch):
    first = compile_kernel(kernel(), arch=(9, 0))
    before = cache_info()
    forbid_compiling(monkeypatch)
    monkeypatch.setattr(nvrtc_mod, "_import_nvrtc", lambda: pytest.fail("NVRTC was loaded"))
    again = compile_kernel(kernel(), arch=(9, 0))
    after = cache_info()
    assert again is first
    assert after["compiles"] == before["compiles"]
    assert after["memory_hits"] == before["memory_hits"] + 1
    assert after["memory_entries"] == 1


def test_memory_cache_separates_arch_and_defines():
    start = cache_info()["compiles"]
    a = compile_kernel(kernel(), arch=(9, 0))
    b = compile_kernel(kernel(), arch=(8, 0))
    c = compile_kernel(kernel(), arch=(9, 0), defines={"VYRE_PHASE_WORD": "3"})
    assert cache_info()["compiles"] == start + 3
    assert len({a.key, b.key, c.key}) == 3
    assert compile_kernel(kernel(), arch=(8, 0)) is b


def test_memory_cache_is_bounded_lru(monkeypatch):
    monkeypatch.setenv("VYRE_CUDA_DISK_CACHE", "0")
    monkeypatch.setattr(cache_mod, "MEMORY_CAP", 2)
    kernels = [kernel(SOURCE + f"// variant {i}\n") for i in range(3)]
    compile_kernel(kernels[0])
    compile_kernel(kernels[1])
    compile_kernel(kernels[0])  # most recently used now; kernels[1] is the eldest
    compile_kernel(kernels[2])
    assert cache_info()["memory_entries"] == 2
    before = cache_info()["compiles"]
    compile_kernel(kernels[0])
    compile_kernel(kernels[2])
    assert cache_info()["compiles"] == before
    compile_kernel(kernels[1])
    assert cache_info()["compiles"] == before + 1


def test_concurrent_compiles_agree():
    results, errors = [], []

    def work():
        try:
            results.append(compile_kernel(kernel(), arch=(9, 0)))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 8
    assert len({(r.key, r.image) for r in results}) == 1
    assert cache_info()["memory_entries"] == 1


# Disk cache -----------------------------------------------------------------------------------
def test_disk_cache_hit_in_a_fresh_memory_cache(cache, monkeypatch):
    first = compile_kernel(kernel(), arch=(9, 0))
    folder = cache / first.key[:2]
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{first.key}{s}" for s in (".cubin", ".json", ".ptx"))
    clear_cache(memory=True, disk=False)
    before = cache_info()
    forbid_compiling(monkeypatch)
    again = compile_kernel(kernel(), arch=(9, 0))
    after = cache_info()
    assert again == first
    assert after["disk_hits"] == before["disk_hits"] + 1
    assert after["compiles"] == before["compiles"]
    assert after["disk_entries"] == 1 and after["disk_bytes"] > len(first.image)
    assert after["dir"] == str(cache)


def test_disk_cache_hit_for_generic_ptx(monkeypatch):
    first = compile_kernel(kernel())
    clear_cache(memory=True, disk=False)
    forbid_compiling(monkeypatch)
    assert compile_kernel(kernel()) == first


def test_disk_cache_can_be_disabled(cache, monkeypatch):
    monkeypatch.setenv("VYRE_CUDA_DISK_CACHE", "0")
    compile_kernel(kernel(), arch=(9, 0))
    assert files_under(cache) == []
    assert cache_info()["disk_enabled"] is False
    clear_cache(memory=True, disk=False)
    before = cache_info()["compiles"]
    compile_kernel(kernel(), arch=(9, 0))
    assert cache_info()["compiles"] == before + 1


def test_key_covers_options_arch_defines_and_source(monkeypatch):
    monkeypatch.setenv("VYRE_CUDA_DISK_CACHE", "0")
    base = compile_kernel(kernel(), arch=(9, 0)).key
    variants = [
        compile_kernel(kernel(options=("-DEXTRA=1",)), arch=(9, 0)).key,
        compile_kernel(kernel(), arch=(8, 0)).key,
        compile_kernel(kernel(), arch=None).key,
        compile_kernel(kernel(), arch=(9, 0), defines={"VYRE_PHASE_WORD": "2"}).key,
        compile_kernel(kernel(), arch=(9, 0), defines={"VYRE_PHASE_WORD": "3"}).key,
        compile_kernel(kernel(SOURCE + "\n"), arch=(9, 0)).key,
    ]
    assert len({base, *variants}) == len(variants) + 1
    clear_cache(memory=True, disk=False)
    assert compile_kernel(kernel(), arch=(9, 0)).key == base


def test_key_covers_package_nvrtc_and_header_versions(monkeypatch):
    options = ("-std=c++17", "-arch=sm_90")
    k = kernel()
    base = cache_mod.cache_key((13, 3), options, k)
    assert cache_mod.cache_key((13, 3), options, k) == base
    keys = {base, cache_mod.cache_key((13, 0), options, k)}
    monkeypatch.setattr(cache_mod, "_package_version", lambda: "999.0")
    keys.add(cache_mod.cache_key((13, 3), options, k))
    monkeypatch.setattr(cache_mod, "header_digest", lambda: "0" * 64)
    keys.add(cache_mod.cache_key((13, 3), options, k))
    assert len(keys) == 4


def test_failed_cache_write_leaves_no_file_and_compiles(cache, monkeypatch, caplog):
    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with caplog.at_level(logging.WARNING, logger="vyre_cuda"):
        compiled = compile_kernel(kernel(), arch=(9, 0))
    assert compiled.kind == "cubin" and compiled.image.startswith(b"\x7fELF")
    assert files_under(cache) == []
    assert any("No space left" in r.getMessage() for r in caplog.records)


def test_failed_json_write_removes_the_entrys_blobs(cache, monkeypatch):
    real_replace = os.replace

    def refuse_json(src, dst):
        if str(dst).endswith(".json"):
            raise PermissionError(13, "Permission denied")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", refuse_json)
    compile_kernel(kernel(), arch=(9, 0))
    assert files_under(cache) == []


def test_unwritable_cache_dir_does_not_fail_the_compile(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(blocker))
    assert compile_kernel(kernel(), arch=(9, 0)).kind == "cubin"
    assert cache_info()["disk_entries"] == 0


@pytest.mark.parametrize(
    "suffix, damage",
    [
        (".cubin", b"\x7fELF garbage"),
        (".ptx", b""),
        (".json", b"{not json"),
        (".json", b'{"format": 1}'),
    ],
)
def test_corrupt_cache_entry_is_recompiled_and_rewritten(cache, suffix, damage):
    first = compile_kernel(kernel(), arch=(9, 0))
    path = cache / first.key[:2] / f"{first.key}{suffix}"
    good = path.read_bytes()
    path.write_bytes(damage)
    clear_cache(memory=True, disk=False)
    before = cache_info()
    again = compile_kernel(kernel(), arch=(9, 0))
    assert cache_info()["compiles"] == before["compiles"] + 1
    assert cache_info()["disk_hits"] == before["disk_hits"]
    assert again.image == first.image and again.key == first.key
    assert path.read_bytes() == good


def test_missing_blob_is_recompiled(cache):
    first = compile_kernel(kernel(), arch=(9, 0))
    (cache / first.key[:2] / f"{first.key}.cubin").unlink()
    clear_cache(memory=True, disk=False)
    before = cache_info()["compiles"]
    assert compile_kernel(kernel(), arch=(9, 0)).image == first.image
    assert cache_info()["compiles"] == before + 1


def test_clear_cache_removes_only_cache_entries(cache):
    compile_kernel(kernel(), arch=(9, 0))
    compile_kernel(kernel())
    keep = cache / "notes.txt"
    keep.write_text("not ours")
    assert cache_info()["disk_entries"] == 2
    assert clear_cache() == 2
    info = cache_info()
    assert info["disk_entries"] == 0 and info["disk_bytes"] == 0
    assert info["memory_entries"] == 0
    assert files_under(cache) == [keep]
    assert clear_cache() == 0


def test_clear_memory_only_keeps_disk(cache):
    compile_kernel(kernel(), arch=(9, 0))
    assert clear_cache(memory=True, disk=False) == 0
    assert cache_info()["memory_entries"] == 0
    assert cache_info()["disk_entries"] == 1


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VYRE_CUDA_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("VYRE_CUDA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "vyre_cuda"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "vyre_cuda"


# Load failures --------------------------------------------------------------------------------
def test_explain_unsupported_ptx_same_major_suggests_matching_nvrtc():
    message, fix = explain_load_failure("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "ptx", (13, 3), 13000)
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in message
    assert "13.0" in message and "13.3" in message
    assert "pip install 'nvidia-cuda-nvrtc==13.0.*'" in fix
    assert "driver" in fix


def test_explain_unsupported_ptx_older_driver_major_suggests_driver_update():
    message, fix = explain_load_failure("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "ptx", (13, 3), 12080)
    assert "12.8" in message and "13.3" in message
    assert "update the NVIDIA driver" in fix and "13.3" in fix
    assert "==12.8" not in fix


def test_explain_user_ptx_names_the_ptx_version():
    message, fix = explain_load_failure("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "ptx", None, 12040)
    assert "12.4" in message and "PTX given" in message
    assert ".version" in fix


@pytest.mark.parametrize(
    "status, expected",
    [
        ("CUDA_ERROR_NO_BINARY_FOR_GPU", "arch"),
        ("CUDA_ERROR_INVALID_IMAGE", "clear_cache"),
        ("CUDA_ERROR_INVALID_PTX", "nvidia-cuda-nvrtc==13.0.*"),
        ("CUDA_ERROR_NOT_SUPPORTED", "driver"),
    ],
)
def test_explain_other_load_failures(status, expected):
    message, fix = explain_load_failure(status, "cubin", (13, 3), 13000)
    assert message.startswith(status)
    assert "13.0" in message and "13.3" in message
    assert expected in fix
    error = KernelCompileFailed(message, fix)
    assert str(error).splitlines()[-1] == f"Fix: {fix}"


# Header fixes: every header a fix names exists and compiles; following a fix never loops --------
# The standard headers a newcomer's kernel reaches for, and the wrong spellings an older fix led to.
STANDARD_HEADERS = sorted(
    {
        *headers_mod._C_TO_CXX,
        *headers_mod._C_TO_CXX.values(),
        *headers_mod._INSTEAD,
        *("array", "atomic", "functional", "limits", "memory", "tuple", "type_traits", "utility"),
        *("cuda/std/stdint", "cuda/std/math", "cuda/std/vector", "cuda/std/string", "cuda/std/no_such"),
    }
)
_PIP = re.compile(r"pip install (?:-U )?'([\w-]+)")


def including(header: str, body: str = "") -> Kernel:
    return Kernel.cuda(f'#include <{header}>\n#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main() {{ {body} }}\n')


def cccl_found(dirs=None) -> bool:
    dirs = headers_mod.cuda_include_dirs() if dirs is None else dirs
    return any(os.path.isfile(os.path.join(d, "cuda", "std", "version")) for d in dirs)


def need_cccl():
    if not cccl_found():
        pytest.skip("no CCCL headers found (nvidia-cuda-cccl or a CUDA toolkit)")


def fix_for(header: str) -> str:
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(including(header), arch=(9, 0))
    assert str(info.value).splitlines()[-1] == f"Fix: {info.value.fix}"
    return info.value.fix


def without_cccl(monkeypatch):
    """The CUDA header folders found, less CCCL's: a machine where nvidia-cuda-cccl is not installed."""
    dirs = tuple(d for d in headers_mod.cuda_include_dirs() if not cccl_found((d,)))
    monkeypatch.setattr(headers_mod, "cuda_include_dirs", lambda: dirs)
    monkeypatch.setattr(nvrtc_mod, "cuda_include_dirs", lambda: dirs)
    clear_cache(memory=True, disk=True)


@pytest.mark.parametrize("header", STANDARD_HEADERS)
def test_each_header_a_standard_header_fix_names_compiles(header):
    need_cccl()
    fix = fix_for(header)
    assert "pip install" not in fix  # CCCL is found: nothing to install
    suggested = suggested_headers(fix)
    assert header not in suggested
    if header in headers_mod._C_TO_CXX or header in headers_mod._C_TO_CXX.values():
        assert suggested and suggested[0].startswith("cuda/std/")
    for name in suggested:
        compile_kernel(including(name), arch=(9, 0))  # raises if the header does not exist


@pytest.mark.parametrize("header", ["stdint.h", "math.h", "vector", "cstdio", "cub/cub.cuh", "thrust/device_vector.h"])
def test_following_a_header_fix_never_loops(header):
    # `#include <stdint.h>` once said "include <cuda/std/stdint> (pip install nvidia-cuda-cccl)",
    # and that include said "pip install nvidia-cuda-cccl" although CCCL was installed and found
    need_cccl()
    seen, todo = {header}, [header]
    while todo:
        fix = fix_for(todo.pop())
        assert not _PIP.findall(fix), fix  # CCCL and the runtime are found: never an install
        for name in suggested_headers(fix):
            assert name not in seen, f"{fix!r} leads back to <{name}>"
            seen.add(name)
            try:
                compile_kernel(including(name), arch=(9, 0))
            except KernelCompileFailed:
                todo.append(name)  # followed in turn, until a header compiles or the fix repeats
    assert len(seen) > 1 or header == "cstdio"  # a fix named a header, except "printf is built in"


def test_a_c_header_fix_names_its_libcuxx_twin():
    assert suggested_headers(headers_mod.missing_header_fix("math.h", 13)) == ["cuda/std/cmath"]


def test_the_old_wrong_spelling_leads_to_the_header_that_exists():
    need_cccl()
    fix = fix_for("cuda/std/stdint")
    assert suggested_headers(fix) == ["cuda/std/cstdint"]
    assert "pip install" not in fix
    assert "cuda/std/stdint" in fix  # it says which header is absent


@pytest.mark.parametrize("header", ["stdint.h", "math.h", "cuda/std/stdint", "vector", "algorithm", "cuda/std/cstdint"])
def test_without_cccl_the_fix_installs_it_once_and_then_compiles(monkeypatch, header):
    need_cccl()  # the suggested header is compiled with the real CCCL at the end
    without_cccl(monkeypatch)
    fix = fix_for(header)
    suggested = [n for n in suggested_headers(fix) if n != header]
    assert _PIP.findall(fix) == ["nvidia-cuda-cccl"], fix
    assert all(n.split("/")[0] in ("cuda", "cub") for n in suggested)
    for name in suggested:  # without CCCL: the same package, never another header to try
        follow = fix_for(name)
        assert _PIP.findall(follow) == ["nvidia-cuda-cccl"], follow
        assert suggested_headers(follow) == []
    monkeypatch.undo()
    clear_cache(memory=True, disk=True)
    for name in suggested:  # once installed, the header the fix named compiles
        compile_kernel(including(name), arch=(9, 0))


def test_printf_and_the_built_ins_a_fix_promises_need_no_include():
    source = (
        '#include "vyre_cuda.cuh"\n'
        "VYRE_KERNEL vyre_main(int* p) { int a[4] = {0}; a[p[0] & 3] = min(p[1], p[2]) + max(p[1], p[2]);"
        ' printf("%d\\n", a[1]); }\n'
    )
    assert compile_kernel(Kernel.cuda(source), arch=(9, 0)).kind == "cubin"
    assert "printf" in headers_mod.missing_header_fix("cstdio", 13)
    assert "min()" in headers_mod.missing_header_fix("algorithm", 13)


def test_cub_umbrella_header_names_the_block_level_headers():
    # <cub/cub.cuh> fails on a __host__ function inside CUB, not on a missing standard header
    need_cccl()
    fix = fix_for("cub/cub.cuh")
    assert "host code" in fix and "standard library" not in fix
    suggested = suggested_headers(fix)
    assert suggested and all(n.startswith("cub/") for n in suggested)
    for name in suggested:
        compile_kernel(including(name), arch=(9, 0))


def test_a_host_function_of_the_kernel_is_told_to_be_device_code():
    source = '#include "vyre_cuda.cuh"\n__host__ int twice(int x) { return 2 * x; }\nVYRE_KERNEL vyre_main() {}\n'
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(Kernel.cuda(source), arch=(9, 0))
    assert "vyre_main.cu(2)" in info.value.fix and "__device__" in info.value.fix


def test_a_standard_header_missing_from_the_users_own_header_names_that_header(tmp_path):
    (tmp_path / "mine.cuh").write_text("#pragma once\n#include <vector>\n")
    source = '#include "mine.cuh"\n#include "vyre_cuda.cuh"\nVYRE_KERNEL vyre_main() {}\n'
    with pytest.raises(KernelCompileFailed) as info:
        compile_kernel(Kernel.cuda(source, options=(f"--include-path={tmp_path}",)), arch=(9, 0))
    fix = info.value.fix
    assert fix.startswith(f"vector is included by {tmp_path / 'mine.cuh'}")
    assert "std::vector" in fix


@pytest.mark.parametrize(
    ("options", "folders"),
    [
        (("-std=c++17", "--include-path=/a", "-I/b", "-I", "/c", "-arch=sm_90"), ("/a", "/b", "/c")),
        (("-arch=sm_90",), ()),
    ],
)
def test_the_folders_a_compile_searches_come_from_its_options(options, folders):
    assert nvrtc_mod._include_paths(options) == folders
