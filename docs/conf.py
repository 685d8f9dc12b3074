"""Sphinx configuration of the vyre_cuda documentation (built by scripts/build-docs)."""

from __future__ import annotations

import importlib.machinery
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Document the checkout when its compiled core is built in place; otherwise the installed package
# (an unbuilt checkout cannot import CudaBackend, and must not shadow the installed one).
_BUILT = tuple(importlib.machinery.EXTENSION_SUFFIXES)
if any(f.name.endswith(_BUILT) for f in (ROOT / "vyre_cuda").glob("_*")):
    sys.path.insert(0, str(ROOT))
else:
    sys.path[:] = [p for p in sys.path if pathlib.Path(p or os.curdir).resolve() != ROOT]

import vyre_cuda  # noqa: E402

project = "vyre_cuda"
author = "the vyre_cuda authors"
copyright = "the vyre_cuda authors, Apache-2.0"
release = vyre_cuda.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
templates_path = ["_templates"]

# MyST: GitHub-style tables and ```python fences as in the README; headings get anchors so
# pages can link to a section as page.md#heading
myst_heading_anchors = 3

# numpydoc-style docstrings, read by napoleon
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

autosummary_generate = True
autosummary_imported_members = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# the compiled core's classes carry their signatures in their docstrings (embedsignature)
autodoc_docstring_signature = True

html_theme = "alabaster"
html_title = f"vyre_cuda {release}"
# _static/vyre_cuda.css: a page as wide as the window (up to 1400 px), and code lines that wrap
# instead of clipping
html_static_path = ["_static"]
html_css_files = ["vyre_cuda.css"]
html_theme_options = {
    "show_relbars": True,  # previous / next links above and below every page
    "body_max_width": "none",  # the basic theme's 800 px cap on the text column
    # 13.6 px: a 119-character line (the longest of the examples) fits a 1280 px window unwrapped
    "code_font_size": "0.8em",
}
