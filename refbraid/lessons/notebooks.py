"""Lessons → executed Jupyter notebooks, with outputs and figures.

A lesson is a percent-format script (``# %%`` cells, prose in ``# %% [markdown]``); jupytext
reads it as a notebook, nbclient runs it in a fresh IPython kernel (so :func:`~refbraid.
lessons.show` displays every figure in its cell) and nbformat writes the ``.ipynb``. These
are the optional extra ``lessons`` (``pip install -e ".[lessons]"``); nothing here is
hand-written conversion.

The kernel is started from a kernelspec written to a temporary folder that points at this
interpreter (no user-wide kernelspec is needed or changed); its environment is this
process's, plus ``REFBRAID_LESSON_SMALL``, ``PYTHONPATH`` leading to this refbraid, and
``REFBRAID_LESSON_FIGURES`` only when a figure folder is asked for.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .figures import FIGURES_ENV, SMALL_ENV

EXTRA = "lessons"
EXTRA_MODULES = ("jupytext", "nbclient", "ipykernel", "nbformat")  # build the notebooks
LESSON_MODULES = ("torch",)  # what a lesson may import beyond refbraid's own dependencies
KERNEL_NAME = "refbraid-lessons"  # the temporary kernelspec's name
CELL_TIMEOUT = 1800  # seconds one cell may run (full-size training cells take minutes)
NOTEBOOK_KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
_LESSON_FILE = re.compile(r"(\d\d)_[A-Za-z0-9_]+\.py")


@dataclass(frozen=True)
class Lesson:
    """One lesson script: its number ("01"), title (its first heading) and path."""

    number: str
    title: str
    path: Path

    @property
    def stem(self) -> str:
        return self.path.stem


def default_lessons_folder() -> Path:
    """``lessons/`` next to the ``refbraid`` package (a source checkout or editable install)."""
    return Path(__file__).resolve().parents[2] / "lessons"


def find_lessons(folder: Path | str | None = None) -> list[Lesson]:
    """Every ``NN_name.py`` in ``folder`` (default: :func:`default_lessons_folder`), by number."""
    folder = Path(folder) if folder is not None else default_lessons_folder()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"no lessons folder at {folder}: the lessons ship with the source (git clone, then "
            f"pip install -e \".[{EXTRA}]\"); or pass `--lessons DIR`.")
    lessons = [Lesson(p.name[:2], _title(p), p) for p in sorted(folder.glob("*.py"))
               if _LESSON_FILE.fullmatch(p.name)]
    if not lessons:
        raise FileNotFoundError(f"no lessons (files NN_name.py) in {folder}.")
    return lessons


def select(lessons: list[Lesson], numbers: Sequence[str]) -> list[Lesson]:
    """The lessons whose numbers are in ``numbers`` ("1" and "01" both mean lesson 01)."""
    if not numbers:
        return lessons
    known = {lesson.number: lesson for lesson in lessons}
    wanted = []
    for n in numbers:
        key = n.zfill(2) if n.isdigit() else n
        if key not in known:
            raise ValueError(f"`LESSON` {n!r} is not a lesson number; expected one of "
                             f"{', '.join(known)}.")
        wanted.append(known[key])
    return wanted


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# # "):
            return line[4:].strip()
    return path.stem


def missing_modules(lessons: Sequence[Lesson] = ()) -> list[str]:
    """The modules of the ``lessons`` extra that do not import here: the notebook builders
    always, and those of :data:`LESSON_MODULES` that one of ``lessons`` imports."""
    wanted = list(EXTRA_MODULES)
    for lesson in lessons:
        wanted += [m for m in _imports(lesson) if m not in wanted]
    missing = []
    for name in wanted:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def _imports(lesson: Lesson) -> list[str]:
    """The modules of :data:`LESSON_MODULES` that ``lesson`` imports (plainly or by
    :func:`need`)."""
    source = lesson.path.read_text(encoding="utf-8")
    return [m for m in LESSON_MODULES if re.search(
        rf"^(import|from) {m}\b|need\([\"']{m}[\"']\)", source, re.MULTILINE)]


def require_extra(lessons: Sequence[Lesson] = ()) -> None:
    """Raise an ImportError, one line naming the ``lessons`` extra, when a module it brings
    is missing: the notebook builders, or a module one of ``lessons`` imports (torch)."""
    missing = missing_modules(lessons)
    if missing:
        users = [lesson.number for lesson in lessons if set(_imports(lesson)) & set(missing)]
        what = f"lesson(s) {', '.join(users)} need" if users else "building notebooks needs"
        raise ImportError(
            f"{what} the optional extra `{EXTRA}`; missing: {', '.join(missing)}. Install it "
            f"with: pip install -e \".[{EXTRA}]\" (from the refbraid checkout).")


def need(module: str):
    """``import module`` for a lesson, or stop with one line naming the ``lessons`` extra
    (a script exits with it; a notebook cell shows it) instead of a traceback."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise SystemExit(f"this lesson needs `{module}`, part of the optional extra `{EXTRA}`: "
                         f"pip install -e \".[{EXTRA}]\" (from the refbraid checkout).") from None


def read_notebook(path: Path):
    """The lesson at ``path`` as an (unexecuted) nbformat notebook, read by jupytext."""
    import jupytext

    nb = jupytext.read(path, fmt="py:percent")
    nb.metadata.pop("jupytext", None)  # a plain notebook, not paired with the script
    nb.metadata["kernelspec"] = dict(NOTEBOOK_KERNELSPEC)
    return nb


def kernel_environment(small: bool, figures: Path | None = None) -> dict[str, str]:
    """This process's environment for the kernel, with small mode, PYTHONPATH and figures."""
    env = dict(os.environ)
    env[SMALL_ENV] = "1" if small else "0"
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this `refbraid`
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env.pop(FIGURES_ENV, None)
    if figures is not None:
        env[FIGURES_ENV] = str(figures)
    return env


def write_kernelspec(folder: Path) -> Path:
    """A kernelspec for this interpreter in ``folder/kernels/`` (returns that kernels folder)."""
    kernels = Path(folder) / "kernels"
    spec = kernels / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps(
        {"argv": argv, "display_name": "refbraid lessons", "language": "python"}))
    return kernels


def execute(nb, workdir: Path, env: dict[str, str], timeout: int = CELL_TIMEOUT):
    """Run every cell of ``nb`` in a fresh kernel started in ``workdir`` with ``env``.

    Returns the executed notebook; on a failing cell raises nbclient's CellExecutionError
    (the notebook keeps the outputs up to and including the failing cell).
    """
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory(prefix="refbraid-kernel-") as tmp:
        specs = KernelSpecManager(kernel_dirs=[str(write_kernelspec(Path(tmp)))])
        sockets = {} if os.name == "nt" else {  # local sockets where the OS has them
            "transport": "ipc", "ip": str(Path(tmp) / "ipc")}
        km = KernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs, **sockets)
        client = NotebookClient(nb, km=km, timeout=timeout, kernel_name=KERNEL_NAME,
                                resources={"metadata": {"path": str(workdir)}})
        try:
            client.execute(env=env)
        finally:
            nb.metadata["kernelspec"] = dict(NOTEBOOK_KERNELSPEC)
            if km.has_kernel:  # nbclient leaves a kernel it did not start to its owner
                km.shutdown_kernel(now=False)
    return nb


@dataclass(frozen=True)
class Built:
    """One built notebook: where, how long, and the error of its failing cell ("" if none)."""

    lesson: Lesson
    path: Path
    seconds: float
    error: str = ""


def build(out: Path | str, small: bool = False, lessons: Sequence[Lesson] | None = None,
          figures: Path | None = None, timeout: int = CELL_TIMEOUT,
          report: Callable[[str], None] = print) -> list[Built]:
    """Execute each lesson as a notebook and write ``out/NN_name.ipynb`` (outputs included).

    A lesson whose cell fails is still written (with the error in that cell's output) and
    listed with its error; the others are built regardless.
    """
    import nbformat
    from nbclient.exceptions import CellExecutionError

    lessons = list(lessons if lessons is not None else find_lessons())
    require_extra(lessons)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = kernel_environment(small, figures)
    built = []
    for lesson in lessons:
        nb, target, start, error = read_notebook(lesson.path), out / f"{lesson.stem}.ipynb", \
            time.perf_counter(), ""
        try:
            execute(nb, out, env, timeout)
        except CellExecutionError as err:
            error = _last_line(str(err))
        nbformat.write(nb, target)
        built.append(Built(lesson, target, time.perf_counter() - start, error))
        status = f"FAILED: {error}" if error else "ok"
        report(f"{lesson.number}  {target}  ({built[-1].seconds:.1f} s)  {status}")
    return built


def _last_line(text: str) -> str:
    """The last non-empty line of a cell error, without the terminal colour codes."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "cell failed"
