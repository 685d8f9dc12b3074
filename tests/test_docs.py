"""The documentation pages (docs/) against the code: their examples run, the API reference lists
every public name, and every name it lists has a docstring.

Every ```python block of docs/ that is not marked ``# needs a GPU`` runs here, in a fresh
interpreter of its own (it must work when copied alone into a file). The marked ones run on a GPU
machine (tests/gpu/test_docs_gpu.py, through scripts/gpu-check); tests/test_readme.py compiles all
of them and checks the names they use.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest
from docs_blocks import (
    DOCS,
    GPU_MARK,
    README,
    ROOT,
    block_id,
    cpu_blocks,
    doc_blocks,
    gpu_blocks,
    python_blocks,
    reference_pages,
    without_mark,
)

import vyre_cuda

pytestmark = pytest.mark.skipif(not (DOCS / "index.md").is_file(), reason="docs/ is not beside the tests")

# The modules whose public names (their __all__) the API reference lists.
REFERENCED_MODULES = (
    "vyre_cuda",
    "vyre_cuda.dask",
    "vyre_cuda.config",
    "vyre_cuda.telemetry",
    "vyre_cuda.errors",
    "vyre_cuda.hostmem",
    "vyre_cuda.typing",
    "vyre_cuda.offline",
    "vyre_cuda.planning.presets",
    "vyre_cuda.builtin_programs",
    "vyre_cuda.tracing",
    "vyre_cuda.tuning",
    "vyre_cuda.compile",
)

# Public members that still have no docstring, in modules these docs do not edit (each is shown
# in the reference without a description). Remove an entry when its docstring lands.
KNOWN_UNDOCUMENTED = {
    "vyre_cuda.CudaBackend.limits": "vyre_cuda/backend.py",
    "vyre_cuda.CudaBackend.lost": "vyre_cuda/backend.py",
    "vyre_cuda.DeviceGroup.closed": "vyre_cuda/group.py",
    "vyre_cuda.DeviceGroup.live_devices": "vyre_cuda/group.py",
    "vyre_cuda.PendingDispatch.route": "vyre_cuda/_waits.pyx",
    "vyre_cuda.DeviceArray.device": "vyre_cuda/_devarray.pyx",
    "vyre_cuda.DeviceArray.dtype": "vyre_cuda/_devarray.pyx",
    "vyre_cuda.DeviceArray.nbytes": "vyre_cuda/_devarray.pyx",
    "vyre_cuda.DeviceArray.ndim": "vyre_cuda/_devarray.pyx",
    "vyre_cuda.DeviceArray.ptr": "vyre_cuda/_devarray.pyx",
    "vyre_cuda.DeviceArray.shape": "vyre_cuda/_devarray.pyx",
    "vyre_cuda.DeviceArray.size": "vyre_cuda/_devarray.pyx",
}


def _run(source: str, tmp_path, timeout: float = 180):
    """``source`` as a script of its own, in a fresh interpreter on the vyre_cuda under test (in
    place or installed), from an empty folder that cannot shadow it."""
    script = tmp_path / "example.py"
    script.write_text(source)
    package_root = str(pathlib.Path(vyre_cuda.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_pages_have_examples_of_both_kinds():
    assert len(cpu_blocks()) >= 5, [block_id(b) for b in cpu_blocks()]
    assert len(gpu_blocks()) >= 10, [block_id(b) for b in gpu_blocks()]


@pytest.mark.parametrize("block", cpu_blocks(), ids=block_id)
def test_example_runs_without_a_gpu(block, tmp_path):
    page, start, source = block
    out = _run(source, tmp_path)
    assert out.returncode == 0, f"{page} block at line {start} failed:\n{out.stdout[-2000:]}{out.stderr[-4000:]}"


def test_gpu_mark_is_the_first_line_only():
    """A misplaced mark would run a GPU example in CI (and fail there) or hide one from gpu-check."""
    for page, start, source in doc_blocks():
        lines = source.splitlines()
        assert GPU_MARK not in lines[1:], f"{page} block at line {start}: {GPU_MARK!r} must be its first line"


def test_readme_examples_are_docs_examples():
    """Each README example is also a docs example, so the docs runs check it (on a GPU if marked)."""
    docs = {without_mark(source) for _, _, source in doc_blocks()}
    for start, source in python_blocks(README.read_text()):
        assert source in docs, f"README block at line {start} is in no page of docs/ (quickstart.md shows it)"


def _documented_names() -> set[str]:
    """Fully qualified names listed by the reference's autosummary tables and auto* directives."""
    names = set()
    for page in reference_pages():
        current, in_table = "", False
        for line in page.read_text().splitlines():
            if m := re.match(r"\.\. currentmodule:: (\S+)", line):
                current = m.group(1)
            elif m := re.match(r"\.\. auto(?:data|function|class|module|exception):: (\S+)", line):
                name = m.group(1)
                names.add(name if name.startswith("vyre_cuda") else f"{current}.{name}")
            if line.startswith(".. autosummary::"):
                in_table = True
            elif in_table and line.strip() and not line.startswith("   "):
                in_table = False
            elif in_table and line.strip() and not line.strip().startswith(":"):
                names.add(f"{current}.{line.strip().lstrip('~')}")
    return names


def _public_names(modname: str) -> list[str]:
    if modname == "vyre_cuda.dask":  # read from the source: importing it needs the dask extra
        tree = ast.parse((ROOT / "vyre_cuda" / "dask.py").read_text())
        (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__all__"]
        return list(ast.literal_eval(value))
    return list(importlib.import_module(modname).__all__)


def test_reference_lists_every_public_name():
    documented = _documented_names()
    missing = []
    for modname in REFERENCED_MODULES:
        for name in _public_names(modname):
            # a name vyre_cuda re-exports is documented once, under its top-level name
            top = modname not in ("vyre_cuda", "vyre_cuda.dask") and name in vyre_cuda.__all__
            same = top and getattr(importlib.import_module(modname), name) is getattr(vyre_cuda, name)
            listed = {f"{modname}.{name}"} | ({f"vyre_cuda.{name}"} if same else set())
            if name != "__version__" and not listed & documented:
                missing.append(f"{modname}.{name}")
    assert not missing, "public names the API reference (docs/api/*.rst) does not list:\n" + "\n".join(missing)


def _resolve(qualname: str):
    parts = qualname.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(qualname)


def _doc(obj, name: str = "") -> str:
    """The docstring's text, without the signature line Cython embeds (``name(self, ...)``)."""
    doc = (obj if isinstance(obj, str) else getattr(obj, "__doc__", None)) or ""
    lines = doc.strip().splitlines()
    if lines and name and re.match(rf"{re.escape(name)}\(.*\)", lines[0].strip()):
        lines = lines[1:]
    return "\n".join(lines).strip()


def _member_doc(cls, name: str, member) -> str | None:
    """The docstring of a public member defined by ``cls``, or None for a plain value (an enum
    member, a constant, a dataclass field's default: the class docstring covers those)."""
    if isinstance(member, (classmethod, staticmethod)):
        return _doc(member.__func__, name)
    if isinstance(cls.__dict__.get("__slots__"), dict) and name in cls.__slots__:
        return _doc(cls.__slots__[name])
    kind = type(member).__name__
    if isinstance(member, property) or kind in ("getset_descriptor", "member_descriptor"):
        return _doc(member, name)
    if inspect.isfunction(member) or kind in ("method_descriptor", "cython_function_or_method"):
        return _doc(member, name)
    return None


def test_every_listed_name_has_a_docstring():
    pytest.importorskip("distributed")  # the dask page lists vyre_cuda.dask, which needs the extra
    undocumented = []
    for qualname in sorted(_documented_names()):
        obj = _resolve(qualname)
        documentable = inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj)
        if documentable and not _doc(obj, qualname.rsplit(".", 1)[-1]):
            undocumented.append(qualname)
        # members of vyre_cuda's own classes (a type alias such as ``npt.NDArray[Any]`` passes
        # isclass on Python 3.10, and numpy's members are numpy's to document)
        own = inspect.isclass(obj) and getattr(obj, "__module__", "").startswith("vyre_cuda")
        if own and not issubclass(obj, BaseException):
            for name, member in vars(obj).items():
                if not name.startswith("_") and _member_doc(obj, name, member) == "":
                    undocumented.append(f"{qualname}.{name}")
    new = sorted(set(undocumented) - set(KNOWN_UNDOCUMENTED))
    assert not new, "public names without a docstring (the reference shows them bare):\n" + "\n".join(new)


def test_the_docstring_check_finds_a_bare_member():
    class Bare:
        """A class."""

        def documented(self):
            """Yes."""

        def bare(self):
            pass

        @property
        def bare_property(self):
            return 1

    found = [n for n, m in vars(Bare).items() if not n.startswith("_") and _member_doc(Bare, n, m) == ""]
    assert found == ["bare", "bare_property"]
    assert _doc("route(self)\n", "route") == "" and _doc("route(self)\nThe route.", "route") == "The route."


def _conf_values() -> dict:
    """The literal settings of docs/conf.py, read without running it (it edits sys.path)."""
    tree = ast.parse((DOCS / "conf.py").read_text())
    values = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    with contextlib.suppress(ValueError):  # (not a literal: a computed setting)
                        values[target.id] = ast.literal_eval(node.value)
    return values


def _css_rules(text: str) -> list[tuple[str, dict[str, str]]]:
    """(selector, {property: value}) of every rule of a stylesheet, at any @media depth."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    rules = []
    for selector, body in re.findall(r"([^{}@]+)\{([^{}]*)\}", text):
        props = {k.strip(): v.strip() for k, _, v in (d.partition(":") for d in body.split(";")) if k.strip()}
        rules.append((" ".join(selector.split()), props))
    return rules


def test_code_blocks_wrap_and_pages_link_previous_and_next():
    """The theme's fixed 940 px column clipped most code blocks (a scroll bar, the line's end out
    of sight): the docs' stylesheet lets the column take the window and wraps a line longer than
    its box, and every page links the previous and the next one."""
    conf = _conf_values()
    options = conf.get("html_theme_options", {})
    assert options.get("show_relbars") is True or options.get("show_relbar_bottom") is True, options
    assert str(options.get("body_max_width", "")).lower() == "none", "the text column keeps its 800 px cap"
    assert conf.get("html_css_files") and conf.get("html_static_path"), conf
    sheets = [DOCS / folder / name for folder in conf["html_static_path"] for name in conf["html_css_files"]]
    rules = [rule for sheet in sheets if sheet.is_file() for rule in _css_rules(sheet.read_text())]
    assert rules, f"none of {sheets} is there"
    wrapping = [sel for sel, props in rules if re.search(r"\bpre\b", sel) and props.get("white-space") == "pre-wrap"]
    assert wrapping, "no stylesheet rule wraps code blocks (pre { white-space: pre-wrap })"
    widths = {props.get("width") for sel, props in rules if "div.document" in sel}
    assert "auto" in widths, "div.document keeps the theme's fixed width"


def test_the_css_reader_reads_media_rules():
    rules = _css_rules("/* c */ @media screen and (min-width: 941px) { div.a, div.b { width: auto; } }\npre { x: y }")
    assert rules == [("div.a, div.b", {"width": "auto"}), ("pre", {"x": "y"})]


def _printed_expectations(source: str) -> list[str]:
    """What each ``print(...)  # shown`` line of an example says it prints (the comment up to a
    colon, which starts an explanation)."""
    out = []
    for line in source.splitlines():
        code, _, comment = line.partition("  # ")
        if code.strip().startswith("print(") and comment.strip():
            out.append(comment.split(":")[0].strip())
    return out


def test_readme_has_an_example_that_runs_on_any_machine(tmp_path):
    """The README shows one example a newcomer can run without a GPU: it builds a program, plans
    it for a named device and compiles it with NVRTC. It runs here (on the CPU), and prints what
    its comments say."""
    cpu = {source for _, _, source in cpu_blocks()}
    blocks = [(start, source) for start, source in python_blocks(README.read_text()) if source in cpu]
    runnable = [(start, s) for start, s in blocks if "vc.plan(" in s and "compile" in s and "Program(" in s]
    assert runnable, "no README example that builds, plans and compiles a program without a GPU"
    for start, source in runnable:
        out = _run(source, tmp_path)
        assert out.returncode == 0, f"README block at line {start}:\n{out.stdout[-2000:]}{out.stderr[-4000:]}"
        printed = out.stdout.splitlines()
        expected = _printed_expectations(source)
        assert len(printed) == len(expected), (printed, expected)
        for got, want in zip(printed, expected):
            assert got.startswith(want), f"README block at line {start} prints {got!r}, its comment says {want!r}"
