"""Where a lesson's figures go: inline in a notebook, into a folder otherwise.

A lesson builds ``matplotlib.figure.Figure`` objects (never pyplot: no global state, no
window) and hands each one to :func:`show` with a name, in the cell that builds it:

* inside a Jupyter kernel (JupyterLab, classic notebook, VS Code interactive window,
  ``refbraid lessons build``) the figure is rendered to PNG and displayed as the output of
  that cell; it is also saved when ``REFBRAID_LESSON_FIGURES`` is set;
* anywhere else (``python lessons/01_....py``, a terminal IPython, the tests) it is saved as
  ``<folder>/<name>.png``, where ``<folder>`` is ``REFBRAID_LESSON_FIGURES`` when set and
  ``lesson_figures/NN/`` (``NN``: the name's lesson number, relative to the working folder)
  otherwise, and the path is printed.

:func:`small` reads ``REFBRAID_LESSON_SMALL`` (quick runs: tests, ``lessons build --small``).
"""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

FIGURES_ENV = "REFBRAID_LESSON_FIGURES"  # save figures here (also inside a notebook)
SMALL_ENV = "REFBRAID_LESSON_SMALL"  # "1": small sizes, a quick run
DEFAULT_FOLDER = "lesson_figures"  # + "/NN/" below the working folder, outside a notebook
DPI = 120  # the resolution of every lesson figure, inline and on disk
METADATA_KEY = "refbraid_figure"  # display metadata naming the figure (the notebook test)

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def small() -> bool:
    """True when ``REFBRAID_LESSON_SMALL`` asks for a quick run ("1", "true", "yes", "on")."""
    value = os.environ.get(SMALL_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{SMALL_ENV} must be 1 (small, quick run) or 0/unset (full size), "
                     f"got {os.environ[SMALL_ENV]!r}.")


def in_notebook() -> bool:
    """True inside a Jupyter kernel: IPython is running and has a kernel attached.

    Never imports IPython itself: a plain script, where IPython is not loaded, is not a
    notebook; a terminal IPython has a shell but no kernel, so its figures go to a folder.
    """
    ipython = sys.modules.get("IPython")
    if ipython is None or not hasattr(ipython, "get_ipython"):
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def figure_folder(name: str) -> Path:
    """The folder :func:`show` saves ``name`` into: ``$REFBRAID_LESSON_FIGURES`` or
    ``lesson_figures/NN/`` with ``NN`` the leading digits of ``name`` (``lesson_figures/``
    when it has none)."""
    _check_name(name)
    chosen = os.environ.get(FIGURES_ENV)
    if chosen:
        return Path(chosen)
    number = re.match(r"\d+", name)
    return Path(DEFAULT_FOLDER) / number.group() if number else Path(DEFAULT_FOLDER)


def show(fig, name: str) -> Path | None:
    """Show ``fig`` where the student is: inline in a notebook, else saved as ``name.png``.

    ``fig`` is a matplotlib Figure, or the path of a PNG file that a command wrote (e.g.
    ``refbraid compare``'s ``compare.png``), shown and copied as it is. Returns the path
    written, or None when the figure was only displayed. ``name`` is the file name without
    ``.png`` (letters, digits, ``_ . -``), by convention the lesson's file name plus a suffix
    when it makes several figures: ``"04_multilevel_mgrit_and_theory"``, ``"04_residuals"``.
    """
    png = _png_file(fig) if isinstance(fig, (str, os.PathLike)) else None
    if png is None and not hasattr(fig, "savefig"):
        raise TypeError(f"`fig` must be a matplotlib Figure or the path of a PNG file, got "
                        f"{type(fig).__name__}.")
    _check_name(name)
    displayed = in_notebook() and _display_inline(png if png is not None else _render(fig), name)
    if displayed and not os.environ.get(FIGURES_ENV):
        return None
    folder = figure_folder(name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    if png is not None:
        path.write_bytes(png)
    else:
        fig.savefig(path, dpi=DPI)
    print(f"figure saved: {path}")
    return path


def _png_file(path) -> bytes:
    """The bytes of the PNG file at ``path`` (ValueError naming ``fig`` otherwise)."""
    path = Path(path)
    data = path.read_bytes() if path.is_file() else b""
    if not data.startswith(b"\x89PNG"):
        raise ValueError(f"`fig` must be a matplotlib Figure or an existing PNG file, got "
                         f"{str(path)!r}.")
    return data


def _render(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"`name` must be a file name without folder or extension (letters, "
                         f"digits, '_', '.', '-'), got {name!r}.")


def _display_inline(png: bytes, name: str) -> bool:
    """Display ``png`` as an output of the running cell (False if IPython cannot)."""
    try:
        from IPython.display import Image, display
    except ImportError:  # pragma: no cover - a kernel always has IPython
        return False
    display(Image(data=png, format="png"), metadata={METADATA_KEY: name})
    return True
