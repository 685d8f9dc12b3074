"""The code blocks of the README and the documentation pages (docs/), for the tests that check them.

A ```python block whose first line is ``# needs a GPU`` runs only on a GPU machine
(tests/gpu/test_docs_gpu.py, which scripts/gpu-check runs); every other block runs on any machine
(tests/test_docs.py executes it).
"""

from __future__ import annotations

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
GPU_MARK = "# needs a GPU"


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


def pages() -> list[pathlib.Path]:
    """The documentation's Markdown pages (the ones that hold examples), in a stable order."""
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)


def reference_pages() -> list[pathlib.Path]:
    """The documentation's reStructuredText pages (the API reference)."""
    skip = {"_build", "generated", "_templates"}
    return sorted(p for p in DOCS.rglob("*.rst") if not skip & set(p.relative_to(DOCS).parts))


def needs_gpu(source: str) -> bool:
    lines = [line.strip() for line in source.splitlines() if line.strip()]
    return bool(lines) and lines[0] == GPU_MARK


def doc_blocks() -> list[tuple[str, int, str]]:
    """(page relative to the root, first line, source) of every python block of docs/."""
    return [
        (str(page.relative_to(ROOT)), start, source)
        for page in pages()
        for start, source in python_blocks(page.read_text())
    ]


def gpu_blocks() -> list[tuple[str, int, str]]:
    """The blocks scripts/gpu-check runs: every docs block marked ``# needs a GPU``."""
    return [block for block in doc_blocks() if needs_gpu(block[2])]


def cpu_blocks() -> list[tuple[str, int, str]]:
    """The blocks that run without a GPU, in CI: every docs block not marked."""
    return [block for block in doc_blocks() if not needs_gpu(block[2])]


def without_mark(source: str) -> str:
    """``source`` without its ``# needs a GPU`` line (how the README shows the same example)."""
    lines = source.splitlines(keepends=True)
    return "".join(line for line in lines if line.strip() != GPU_MARK)


def imported_modules(source: str) -> set[str]:
    """Top-level package names ``source`` imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def block_id(block: tuple[str, int, str]) -> str:
    return f"{block[0]}:{block[1]}"


if __name__ == "__main__":  # list the GPU blocks: python tests/docs_blocks.py
    for block in gpu_blocks():
        print(block_id(block), file=sys.stdout)
