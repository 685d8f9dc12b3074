"""The README against the code: its examples compile and every vyre_cuda name they use exists.

No GPU: the examples are compiled, never run. What is checked is what drifts when the code
changes: module attributes (``vc.X``, ``vyre_cuda.X.Y``, ``vd.X``), names imported from
vyre_cuda, keyword arguments of vyre_cuda calls (in code blocks and in inline code), and the
test command that CI runs.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import re
import types

import pytest

import vyre_cuda

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(not README.is_file(), reason="README.md is not beside the tests (installed tests)")

# short names the README binds to modules
ALIASES = {"vc": "vyre_cuda", "vyre_cuda": "vyre_cuda", "vd": "vyre_cuda.dask"}
# dotted names in prose that are files, not attributes
NOT_ATTRIBUTES = {"vyre_cuda.cuh"}


def readme_text() -> str:
    return README.read_text()


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line number, source) of every ```python block."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        if current is None and line.strip() == "```python":
            current, start = [], number + 1
        elif current is not None and line.strip().startswith("```"):
            blocks.append((start, "\n".join(current) + "\n"))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, "a ```python block is not closed"
    return blocks


def inline_snippets(text: str) -> list[str]:
    """Inline `code` spans outside fenced blocks that parse as Python."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for span in re.findall(r"`([^`\n]+)`", prose):
        try:
            ast.parse(span)
        except SyntaxError:
            continue
        out.append(span)
    return out


def module(name: str):
    if name == "vyre_cuda.dask":
        pytest.importorskip("distributed", reason="vyre_cuda.dask needs the dask extra")
    return importlib.import_module(name)


def resolve(root: str, parts: list[str]):
    """getattr along ``parts`` from module ``root``, importing submodules on the way."""
    obj = module(root)
    for part in parts:
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, types.ModuleType):
            obj = importlib.import_module(f"{obj.__name__}.{part}")
        else:
            raise AttributeError(f"{obj!r} has no attribute {part!r}")
    return obj


def attribute_chains(tree: ast.AST) -> set[tuple[str, ...]]:
    """Every maximal ``alias.a.b`` chain rooted at a module alias."""
    chains = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        parts = []
        cur: ast.AST = node
        while isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        chain = (cur.id, *reversed(parts)) if isinstance(cur, ast.Name) else ()
        if chain and chain[0] in ALIASES and ".".join(chain) not in NOT_ATTRIBUTES:
            chains.add(chain)
    return chains


def test_python_blocks_compile():
    blocks = python_blocks(readme_text())
    assert len(blocks) >= 5, "the README lost its examples"
    for start, source in blocks:
        try:
            compile(source, f"README.md (block at line {start})", "exec")
        except SyntaxError as exc:
            pytest.fail(f"README block at line {start}: {exc}")


def test_module_attributes_exist():
    text = readme_text()
    chains = set()
    for _, source in python_blocks(text):
        chains |= attribute_chains(ast.parse(source))
    for snippet in inline_snippets(text):
        chains |= attribute_chains(ast.parse(snippet))
    # dotted names in prose, e.g. vyre_cuda.compile.cache_info
    for match in re.finditer(r"(?<![\w./])(vyre_cuda|vc|vd)((?:\.[A-Za-z_]\w*)+)", text):
        if match.group(0) not in NOT_ATTRIBUTES:
            chains.add((match.group(1), *match.group(2)[1:].split(".")))
    assert len(chains) >= 20, sorted(chains)
    missing = []
    for alias, *parts in sorted(chains):
        try:
            resolve(ALIASES[alias], parts)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{alias}.{'.'.join(parts)}: {exc}")
    assert not missing, "README names that do not exist:\n" + "\n".join(missing)


def test_imported_names_exist():
    seen = 0
    for start, source in python_blocks(readme_text()):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vyre_cuda"):
                mod = module(node.module)
                for alias in node.names:
                    seen += 1
                    assert hasattr(mod, alias.name), f"README line {start}: {node.module} has no {alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("vyre_cuda"):
                        module(alias.name)
    assert seen >= 4


def _callables() -> dict:
    from vyre_cuda import CudaBackend, DeviceGroup, DispatchConfig, Kernel, Program

    table = {
        "CudaBackend": [CudaBackend],
        "DispatchConfig": [DispatchConfig],
        "Program": [Program],
        "DeviceGroup": [DeviceGroup],
        "cuda": [Kernel.cuda],
        "ptx": [Kernel.ptx],
        "pinned_empty": [vyre_cuda.pinned_empty],
        "pinned_zeros": [vyre_cuda.pinned_zeros],
        "pinned_like": [vyre_cuda.pinned_like],
        "dispatch": [CudaBackend.dispatch],
        "dispatch_async": [CudaBackend.dispatch_async],
        "dispatch_into": [CudaBackend.dispatch_into],
        "dispatch_timed": [CudaBackend.dispatch_timed],
        "map": [DeviceGroup.map],
        "map_async": [DeviceGroup.map_async],
        "imap_unordered": [DeviceGroup.imap_unordered],
        "dispatch_split": [DeviceGroup.dispatch_split],
        "register": [CudaBackend.register],
    }
    try:
        vd = module("vyre_cuda.dask")
    except pytest.skip.Exception:
        return table
    table["register"].append(vd.register)
    table["map_blocks"] = [vd.map_blocks]
    table["submit"] = [vd.submit]
    return table


def _accepts(fn, keyword: str) -> bool:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return keyword in params and params[keyword].kind is not inspect.Parameter.POSITIONAL_ONLY


def test_keyword_arguments_exist():
    text = readme_text()
    table = _callables()
    sources = [source for _, source in python_blocks(text)] + inline_snippets(text)
    checked, wrong = 0, []
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name not in table:
                continue
            for kw in node.keywords:
                if kw.arg is None:
                    continue
                checked += 1
                if not any(_accepts(fn, kw.arg) for fn in table[name]):
                    wrong.append(f"{name}({kw.arg}=...) in {source.strip()[:60]!r}")
    assert checked >= 20, checked
    assert not wrong, "README keyword arguments the code does not take:\n" + "\n".join(wrong)


def test_first_two_commands_are_what_ci_runs():
    text = readme_text()
    assert "pip install . && vyre-cuda selftest" in text
    assert "pip install '.[test]' && pytest -q" in text
    ci = ROOT / ".ci" / "run"
    if not ci.is_file():
        pytest.skip(".ci/run is not in this tree")
    lines = [line.strip() for line in ci.read_text().splitlines()]
    assert any(line.startswith("python -m pip install") and "'.[test]'" in line for line in lines)
    assert "pytest -q" in lines
