"""The README and the documentation pages against the code: their examples compile and every
vyre_cuda name they use exists.

No GPU: the examples are compiled here, never run (tests/test_docs.py runs the ones that need no
GPU, tests/gpu/test_docs_gpu.py the others). What is checked is what drifts when the code
changes: module attributes (``vc.X``, ``vyre_cuda.X.Y``, ``vd.X``), names imported from
vyre_cuda, keyword arguments of vyre_cuda calls (in code blocks and in inline code, in the README
and in every page of docs/; dotted names in the API reference's pages too), and the test command
that CI runs.

Whichever extras are installed: without dask, ``vyre_cuda.dask`` (which refuses to import there)
is checked against its source, so its names and keywords are checked in every environment.
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import importlib
import importlib.util
import inspect
import os
import pathlib
import re
import subprocess
import symtable
import sys
import types

import pytest
from docs_blocks import README, ROOT, pages, python_blocks, reference_pages

import vyre_cuda

pytestmark = pytest.mark.skipif(not README.is_file(), reason="README.md is not beside the tests (installed tests)")

# short names the README binds to modules
ALIASES = {"vc": "vyre_cuda", "vyre_cuda": "vyre_cuda", "vd": "vyre_cuda.dask"}
# dotted names in prose that are files, not attributes
NOT_ATTRIBUTES = {"vyre_cuda.cuh"}
# what vyre_cuda.dask imports from the dask extra
DASK_EXTRA = ("cloudpickle", "dask.array", "distributed")


def readme_text() -> str:
    return README.read_text()


def documents() -> list[tuple[str, str]]:
    """(name, text) of the README and of every Markdown page of docs/ (where the examples are)."""
    return [("README.md", readme_text())] + [(str(p.relative_to(ROOT)), p.read_text()) for p in pages()]


def all_blocks() -> list[tuple[str, int, str]]:
    return [(name, start, source) for name, text in documents() for start, source in python_blocks(text)]


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


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of every section; a ``#`` line inside a fenced block is not a heading."""
    out, heading, body, fenced = [], "", [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append((heading, "\n".join(body) + "\n"))
            heading, body = line.lstrip("#").strip(), []
            continue
        body.append(line)
    out.append((heading, "\n".join(body) + "\n"))
    return out


def _has_dask_extra() -> bool:
    try:
        for name in DASK_EXTRA:
            importlib.import_module(name)
    except ImportError:
        return False
    return True


def module(name: str):
    if name == "vyre_cuda.dask" and not _has_dask_extra():
        return dask_surface()
    return importlib.import_module(name)


@functools.cache
def dask_surface() -> types.ModuleType:
    """vyre_cuda.dask as its source declares it, for an environment without the dask extra: its
    top-level names, functions and classes' methods as stubs with the same parameters."""
    origin = importlib.util.find_spec("vyre_cuda.dask").origin  # (imports vyre_cuda, not the module)
    tree = ast.parse(pathlib.Path(origin).read_text(), origin)
    surface = types.ModuleType("vyre_cuda.dask")
    surface.__dict__.update(_declared(tree.body, origin))
    return surface


def _declared(body: list, origin: str) -> dict:
    names: dict = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = _stub(node, origin)
        elif isinstance(node, ast.ClassDef):
            names[node.name] = type(node.name, (), _declared(node.body, origin))
        elif isinstance(node, ast.Assign):
            names.update((t.id, None) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
    return names


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef, origin: str):
    """A function with the parameters of ``node`` (names, kinds, which have defaults), nothing else."""
    fn = copy.deepcopy(node)
    fn.decorator_list, fn.returns, fn.body = [], None, [ast.Pass()]
    a = fn.args
    for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
        if arg is not None:
            arg.annotation = None
    a.defaults = [ast.Constant(None) for _ in a.defaults]
    a.kw_defaults = [None if d is None else ast.Constant(None) for d in a.kw_defaults]
    scope: dict = {}
    exec(compile(ast.fix_missing_locations(ast.Module([fn], [])), origin, "exec"), scope)
    return scope[node.name]


def resolve(root: str, parts: list[str]):
    """getattr along ``parts`` from module ``root``, importing submodules on the way."""
    obj = module(root)
    for part in parts:
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, types.ModuleType):
            obj = module(f"{obj.__name__}.{part}")
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
    blocks = all_blocks()
    assert python_blocks(readme_text()), "the README lost its quickstart"
    assert len(blocks) >= 15, "the documentation lost its examples"
    for name, start, source in blocks:
        try:
            compile(source, f"{name} (block at line {start})", "exec")
        except SyntaxError as exc:
            pytest.fail(f"{name} block at line {start}: {exc}")


def undefined_names(source: str, filename: str = "<block>") -> set[str]:
    """Names ``source`` loads that it neither defines nor imports, and that are not builtins:
    what a reader who copies the block alone into a file would meet as a NameError."""
    top = symtable.symtable(source, filename, "exec")
    defined = {sym.get_name() for sym in top.get_symbols() if sym.is_assigned() or sym.is_imported()}
    missing, tables = set(), [top]
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for sym in table.get_symbols():
            name = sym.get_name()
            # module level: every name; nested scopes: those that resolve to the module (globals)
            unresolved = table is top or sym.is_global()
            if unresolved and sym.is_referenced() and name not in defined and not hasattr(builtins, name):
                missing.add(name)
    return missing


def test_undefined_names_finds_what_a_block_lacks():
    assert undefined_names("import numpy as np\nx = np.ones(3)\nprint(len(x))\n") == set()
    assert undefined_names("def f(a):\n    return [b for b in a if vc.ok(b)]\n") == {"vc"}
    assert undefined_names("with vc.CudaBackend() as gpu:\n    gpu.dispatch(prog, [a])\n") == {"vc", "prog", "a"}
    assert undefined_names("from x import y as z\nclass C:\n    w = z\n    def m(self):\n        return w\n") == {"w"}


def test_python_blocks_are_self_contained():
    """Each ```python block runs on its own (given a GPU and its imports' packages): every name it
    loads is defined or imported in that block, or a builtin."""
    problems = []
    for name, start, source in all_blocks():
        missing = undefined_names(source, f"{name} (block at line {start})")
        if missing:
            problems.append(f"{name} block at line {start} uses {sorted(missing)} without defining or importing them")
    assert not problems, "\n".join(problems)


def test_dask_block_guards_its_cluster():
    """The Dask guide says to create the cluster under ``if __name__ == "__main__":``: its own
    example does (the workers of a LocalCluster import the script)."""
    ((_, body),) = [(h, b) for h, b in sections((ROOT / "docs" / "guides" / "dask.md").read_text()) if h == "Dask"]
    (source,) = [s for _, s in python_blocks(body) if "Client(" in s]
    tree = ast.parse(source)
    guards = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'
    ]
    assert len(guards) == 1, 'the Dask example creates its cluster outside an `if __name__ == "__main__":` guard'
    calls = {ast.unparse(n.func) for n in ast.walk(guards[0]) if isinstance(n, ast.Call)}
    assert {"Client", "LocalCluster"} <= calls, calls
    outside = [n for n in tree.body if n is not guards[0]]
    assert all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in outside), "only imports outside the guard"


def test_module_attributes_exist():
    chains = set()
    texts = [text for _, text in documents()] + [p.read_text() for p in reference_pages()]
    for text in texts[: len(documents())]:
        for _, source in python_blocks(text):
            chains |= attribute_chains(ast.parse(source))
        for snippet in inline_snippets(text):
            chains |= attribute_chains(ast.parse(snippet))
    # dotted names in prose, e.g. vyre_cuda.compile.cache_info (and the API reference's pages)
    for text in texts:
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
    assert not missing, "README or docs names that do not exist:\n" + "\n".join(missing)


def test_imported_names_exist():
    seen = 0
    for name, start, source in all_blocks():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vyre_cuda"):
                mod = module(node.module)
                for alias in node.names:
                    seen += 1
                    assert hasattr(mod, alias.name), f"{name} line {start}: {node.module} has no {alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("vyre_cuda"):
                        module(alias.name)
    assert seen >= 4


def _callables() -> tuple[dict, dict]:
    """(vyre_cuda's calls by name, vyre_cuda.dask's): the README's ``register`` is either."""
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
    vd = module("vyre_cuda.dask")
    dask = {name: [getattr(vd, name)] for name in ("register", "map_blocks", "submit", "VyreCudaPlugin")}
    return table, dask


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return getattr(node, "id", "")


def _targets(func: ast.AST, table: dict, dask: dict, in_dask_section: bool):
    """What a call's ``func`` names: ``vd.register`` is vyre_cuda.dask's, a bare ``register``
    in the Dask section too; ``gpu.register`` or a bare one elsewhere is CudaBackend's."""
    if isinstance(func, ast.Attribute):
        receiver = _dotted(func.value)
        return (dask if ALIASES.get(receiver, receiver) == "vyre_cuda.dask" else table).get(func.attr)
    name = getattr(func, "id", None)
    return dask[name] if in_dask_section and name in dask else table.get(name)


def _accepts(fn, keyword: str) -> bool:
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return keyword in params and params[keyword].kind is not inspect.Parameter.POSITIONAL_ONLY


def test_keyword_arguments_exist():
    table, dask = _callables()
    sources = [
        ("dask" in heading.lower() or "dask" in name, source)
        for name, text in documents()
        for heading, body in sections(text)
        for source in [s for _, s in python_blocks(body)] + inline_snippets(body)
    ]
    checked, wrong, dask_checked = 0, [], 0
    for in_dask_section, source in sources:
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call):
                continue
            targets = _targets(node.func, table, dask, in_dask_section)
            if targets is None:
                continue
            for kw in node.keywords:
                if kw.arg is None:
                    continue
                checked += 1
                dask_checked += any(targets is fns for fns in dask.values())
                if not any(_accepts(fn, kw.arg) for fn in targets):
                    name = _dotted(node.func)
                    wrong.append(f"{name}({kw.arg}=...) in {source.strip()[:60]!r}")
    assert checked >= 20 and dask_checked >= 2, (checked, dask_checked)
    assert not wrong, "README or docs keyword arguments the code does not take:\n" + "\n".join(wrong)


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
    # ... in a venv of its own, as a newcomer's holds neither build nor the lint tools
    at = lines.index("pytest -q")
    fresh = [ln for ln in lines[at - 4 : at] if ln.startswith(". ") and ln.endswith('/bin/activate"')]
    assert fresh and "/venv/bin/activate" not in fresh[-1], fresh


def _bash_lines(body: str) -> list[str]:
    """The command lines (not comments) of the ```bash blocks of ``body``."""
    blocks = re.findall(r"```bash\n(.*?)```", body, re.S)
    return [
        ln.strip() for block in blocks for ln in block.splitlines() if ln.strip() and not ln.strip().startswith("#")
    ]


def test_docs_command_works_on_a_fresh_venv_and_is_what_ci_runs():
    """The README's docs command installs the package first (Sphinx imports it), asks nothing of
    pip that the pip of a fresh venv lacks (``--group`` needs pip 25.1), names the Python the docs
    need, and CI runs it as written, in a venv of its own."""
    ((_, body),) = [(h, b) for h, b in sections(readme_text()) if h == "Documentation"]
    (command,) = [ln for ln in _bash_lines(body) if "sphinx" in ln]
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    assert command.startswith(venv), command
    steps = command.removeprefix(venv).split(" && ")
    assert steps[0] == "pip install '.[docs]'", steps  # the package and the docs extra, one step
    assert steps[1].startswith("python -m sphinx -W "), steps
    assert "--group" not in command, command
    assert "Python 3.11" in body, "the README does not say which Python the docs need"
    ci = ROOT / ".ci" / "run"
    if not ci.is_file():
        pytest.skip(".ci/run is not in this tree")
    lines = [line.strip() for line in ci.read_text().splitlines()]
    run = command.removeprefix(venv)
    assert run in lines, f"CI does not run the README's docs command {run!r}"
    at = lines.index(run)
    setup = lines[at - 5 : at]
    fresh = [ln for ln in setup if ln.startswith(". ") and ln.endswith('/bin/activate"')]
    assert fresh and "/venv/bin/activate" not in fresh[-1], setup
    upgrades = [ln for ln in setup if re.match(r"(python -m )?pip install", ln)]
    assert not upgrades, f"CI changes the fresh venv's pip before the command: {upgrades}"


BLOCK_DASK = """
import sys


class NoDask:  # as if the dask extra were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dask", "distributed"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NoDask())
import pytest

sys.exit(pytest.main([sys.argv[1], "-q", "-rs", "-p", "no:cacheprovider", "-k", "not without_the_dask_extra"]))
"""


def test_the_readme_checks_pass_without_the_dask_extra():
    # the suite passes whichever extras are installed, and checks vyre_cuda.dask's names either way
    out = subprocess.run(
        [sys.executable, "-c", BLOCK_DASK, __file__],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "dask" not in "".join(line for line in out.stdout.splitlines() if "SKIPPED" in line), out.stdout


def _versions(first: str, last: str) -> list[str]:
    """["3.10", ..., last] from ``first`` to ``last``."""
    (major, lo), (_, hi) = (tuple(int(x) for x in v.split(".")) for v in (first, last))
    return [f"{major}.{minor}" for minor in range(lo, hi + 1)]


def test_python_versions_claimed_agree():
    """The CPython versions the README and the install page claim are the classifiers of
    pyproject.toml and the versions scripts/build-wheels builds by default (no version that
    nothing builds or tests, as 3.14 was), and the GPU suite's version is one of them."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    classified = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', pyproject)
    (floor,) = re.findall(r'^requires-python = ">=(3\.\d+)"', pyproject, re.M)
    pages = {"README.md": readme_text(), "docs/install.md": (ROOT / "docs" / "install.md").read_text()}
    for name, text in pages.items():
        (claim,) = re.findall(r"^- Linux, CPython (3\.\d+) to (3\.\d+)", text, re.M)
        assert _versions(*claim) == classified, (name, claim, classified)
        (gpu,) = re.findall(r"GPU test suite runs on (3\.\d+)", " ".join(text.split()))
        assert gpu in classified, (name, gpu)
        (built,) = re.findall(r"^scripts/build-wheels +# CPython (3\.\d+)-(3\.\d+) ", text, re.M)
        assert _versions(*built) == classified, (name, built, classified)
    assert classified[0] == floor, (classified, floor)
    script = ROOT / "scripts" / "build-wheels"
    if script.is_file():
        (default,) = re.findall(r"^\[ \$# -gt 0 \] \|\| set -- ([\d. ]+)$", script.read_text(), re.M)
        assert default.split() == classified, (default, classified)


def _toctree(page: pathlib.Path, caption: str) -> list[str]:
    """The entries of the toctree of ``page`` with that caption."""
    for block in re.findall(r"```\{toctree\}\n(.*?)```", page.read_text(), re.S):
        lines = block.splitlines()
        if f":caption: {caption}" in lines:
            return [ln.strip() for ln in lines if ln.strip() and not ln.startswith(":")]
    raise AssertionError(f"{page} has no toctree captioned {caption!r}")


def test_readme_lists_every_guide():
    """The README's list of the documentation's pages names every user guide, by its title."""
    bullet = re.search(r"^- \*\*User guides\*\*: (.*?)(?=^- )", readme_text(), re.S | re.M)
    assert bullet, "the README's Documentation section lost its list of user guides"
    listed = " ".join(bullet.group(1).split()).lower()
    docs = ROOT / "docs"
    titles = [
        (docs / f"{entry}.md").read_text().splitlines()[0].lstrip("# ").strip()
        for entry in _toctree(docs / "index.md", "User guides")
    ]
    assert len(titles) >= 10, titles
    missing = [t for t in titles if t.lower() not in listed]
    assert not missing, f"user guides the README's list leaves out: {missing}"


def test_rebuilt_program_cost_is_the_measured_one_everywhere():
    """The README and the quickstart page give one cost for a program built again from the same
    arguments, the benchmark of record's (benchmarks/README.md: rebuilt inside the timed call,
    against the same Program object)."""
    bench = ROOT / "benchmarks" / "README.md"
    (ratio,) = re.findall(
        r"^\| the Program built from its parts inside the timed call \| [\d.]+ us \| ([\d.]+x) \|",
        bench.read_text(),
        re.M,
    )
    texts = {"README.md": readme_text()} | {
        str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs").rglob("*.md")
    }
    stated = {}
    for name, text in texts.items():
        flat = " ".join(text.split())
        assert "few microseconds" not in flat, f"{name} still says a rebuild costs a few microseconds"
        for cost, figure in re.findall(r"costs? (about a microsecond|[^.]*?microseconds?) of Python \(([^)]*)\)", flat):
            stated[name] = (cost, figure)
    assert set(stated) >= {"README.md", "docs/quickstart.md"}, stated
    for name, (cost, figure) in stated.items():
        assert cost == "about a microsecond", (name, cost)
        assert f"about {ratio} one of the same object" in figure, (name, figure, ratio)


def test_wheel_sizes_are_the_measured_ones_and_alike():
    """The wheel sizes the README and the install page give: the same figures in both, the measured
    ones (CPython 3.13: scripts/build-wheels' stripped manylinux wheel 3.5 MB, `pip wheel .` 9.1
    MB; they said 1 MB and 12 MB)."""
    pattern = (
        r"strips it \(a wheel of about ([\d.]+ MB), against about ([\d.]+ MB) unstripped, as `pip wheel \.` makes it\)"
    )
    readme = re.findall(pattern, " ".join(readme_text().split()))
    install = re.findall(pattern, " ".join((ROOT / "docs" / "install.md").read_text().split()))
    assert readme == install == [("3.5 MB", "9.1 MB")], (readme, install)
