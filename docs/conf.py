"""Sphinx configuration: the refbraid documentation site, built offline.

One command builds it, with every warning an error (broken internal links, missing pages,
docstrings that do not parse, pages outside the table of contents)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Why Sphinx (with MyST-NB) rather than MkDocs: it is what the scientific-Python projects
this one learns from use (NumPy, SciPy, matplotlib, PyMGRIT); the docstrings are already
reStructuredText (double-backquoted literals, ``:class:`` roles, simple tables), which
autodoc renders as written, where mkdocstrings expects Markdown or Google-style docstrings;
``-W`` turns every
warning (a broken link, a page outside the table of contents) into an error; and MyST-NB
shows notebooks that were executed elsewhere without running them again.

Sources: the Markdown pages in ``docs/`` (MyST), the API reference from the docstrings
(autodoc + autosummary), the lessons as notebooks that were **already executed** (MyST-NB
renders them with ``nb_execution_mode = "off"``; nothing runs them a second time), and
``python_api.md``, a MyST-NB text notebook that this build executes.

The lesson notebooks come from ``$REFBRAID_DOCS_NOTEBOOKS`` (CI points it at the folder that
the test suite's notebook test filled) or ``lesson_notebooks/`` (``refbraid lessons build
--small``); when neither holds them, this build makes them once with
:func:`refbraid.lessons.notebooks.build` (small sizes, a few minutes). They are copied to
``docs/course/`` (ignored by git) so that Sphinx sees them as pages.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # this checkout's refbraid, for autodoc and the notebooks

NOTEBOOKS_ENV = "REFBRAID_DOCS_NOTEBOOKS"
COURSE = DOCS / "course"  # where the executed lessons become pages (generated, git-ignored)


def _lesson_notebooks() -> None:
    """Fill ``docs/course/`` with one executed notebook per lesson (building them if needed)."""
    from refbraid.lessons import notebooks

    lessons = notebooks.find_lessons()
    source = Path(os.environ.get(NOTEBOOKS_ENV) or ROOT / "lesson_notebooks")
    missing = [ls for ls in lessons if not (source / f"{ls.stem}.ipynb").is_file()]
    if missing:
        print(f"docs: {len(missing)} lesson notebook(s) missing in {source}; building them "
              f"(small sizes)", flush=True)
        built = notebooks.build(source, small=True, lessons=missing)
        failed = [b.lesson.stem for b in built if b.error]
        if failed:
            raise RuntimeError(f"lesson notebooks failed to build: {', '.join(failed)}")
    if COURSE.exists():
        shutil.rmtree(COURSE)
    COURSE.mkdir()
    for lesson in lessons:
        shutil.copy2(source / f"{lesson.stem}.ipynb", COURSE / f"{lesson.stem}.ipynb")


_lesson_notebooks()

project = "refbraid"
author = "the refbraid authors"
copyright = "2026, the refbraid authors"  # noqa: A001 (Sphinx's name)
release = version = "0.1.0"

extensions = [
    "myst_nb",  # Markdown (MyST) pages and notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "**.ipynb_checkpoints", "jupyter_execute"]

# -- MyST and notebooks ----------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked like page links
nb_execution_mode = "off"  # the lessons arrive executed; python_api.md asks for "force" itself
nb_execution_timeout = 600
nb_execution_raise_on_error = True  # a failing cell in an executed page fails the build
nb_merge_streams = True

# -- API reference ---------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["mpi4py", "cupy", "torch"]  # optional extras: documented, not needed
napoleon_google_docstring = False
napoleon_numpy_docstring = True

#: A row of the aligned ``name    meaning`` tables that docstrings use for fields and arguments
#: (readable in ``help()``): a name (or names joined by commas), two or more spaces, text.
_TABLE_ROW = re.compile(r"^[A-Za-z_][\w.]*(, [A-Za-z_][\w.]*)*\s{2,}\S")


def _aligned_tables_as_text(app, what, name, obj, options, lines: list[str]) -> None:
    """Show a docstring's aligned ``name    meaning`` table as it is written (preformatted).

    reST would read such a table as a paragraph with stray indentation; the docstrings stay
    written for ``help()``, and the site shows the table exactly as ``help()`` does.
    """
    out, i = [], 0
    while i < len(lines):
        starts_block = _TABLE_ROW.match(lines[i]) and (i == 0 or not lines[i - 1].strip())
        j = i + 1
        while starts_block and j < len(lines) and lines[j].strip():  # to the blank line
            j += 1
        if starts_block and sum(bool(_TABLE_ROW.match(line)) for line in lines[i:j]) >= 2:
            out += ["::", ""] + ["    " + line for line in lines[i:j]] + [""]
            i = j
        else:
            out.append(lines[i])
            i += 1
    lines[:] = out


def setup(app) -> None:
    app.connect("autodoc-process-docstring", _aligned_tables_as_text)


# -- HTML ------------------------------------------------------------------------------------
html_theme = "furo"
html_title = "refbraid"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
