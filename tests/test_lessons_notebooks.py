"""Every lesson, executed as a Jupyter notebook (jupytext + nbclient, small sizes), shows each
figure it makes as a PNG output of the cell that makes it.

With ``REFBRAID_LESSON_NOTEBOOKS_OUT=DIR`` (set by ``.ci/run``) each notebook that passes is
also written to ``DIR/NN_name.ipynb``: the documentation build shows those, so CI executes
every lesson once.

The kernel runs from a kernelspec in a temporary folder (no user kernelspec needed) with this
process's environment: one thread, the CUDA simulator, ``REFBRAID_LESSON_SMALL=1``,
``PYTHONPATH`` leading to this checkout, and ``REFBRAID_LESSON_FIGURES`` set, so that
:func:`refbraid.lessons.show` both displays each figure and saves it: the saved files are the
figures the lesson makes, and each must appear, by name, in the cell that calls ``show``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from refbraid.lessons import notebooks

IN_CI = bool(os.environ.get("CI"))  # CI installs the `lessons` extra: nothing may skip there
if notebooks.missing_modules() and not IN_CI:
    pytest.skip('the optional extra `lessons`: pip install -e ".[lessons]"',
                allow_module_level=True)

from refbraid.lessons.figures import METADATA_KEY

LESSONS = notebooks.find_lessons()
SHOW_CALL = re.compile(r"(?<![\w.])show\(")
NEW_FIGURE = re.compile(r"^(\w+) = Figure\(", re.MULTILINE)
KEEP_ENV = "REFBRAID_LESSON_NOTEBOOKS_OUT"  # where passing notebooks are kept (CI: for the docs)


def _param(lesson):
    marks = [pytest.mark.slow]
    if lesson.number == "06":
        marks.append(pytest.mark.mpi)  # the lesson launches mpiexec itself
    missing = notebooks.missing_modules([lesson])
    if missing and not IN_CI:  # in CI the lesson runs, and fails naming the extra
        marks.append(pytest.mark.skip(reason=f"the `lessons` extra is incomplete here "
                                             f"(missing {', '.join(missing)})"))
    return pytest.param(lesson, id=lesson.stem, marks=marks)


def _images(cell) -> list[str]:
    """Names of the PNG images a code cell displayed ("" for one without refbraid's name)."""
    return [out.get("metadata", {}).get(METADATA_KEY, "") for out in cell.get("outputs", [])
            if out.get("output_type") in ("display_data", "execute_result")
            and "image/png" in out.get("data", {})]


@pytest.mark.parametrize("lesson", [_param(lesson) for lesson in LESSONS])
def test_lesson_runs_as_a_notebook_with_every_figure_in_its_cell(lesson, tmp_path):
    figures = tmp_path / "figures"
    nb = notebooks.read_notebook(lesson.path)
    env = notebooks.kernel_environment(small=True, figures=figures)
    notebooks.execute(nb, tmp_path, env, timeout=300)  # raises on a failing cell

    code = [c for c in nb.cells if c.cell_type == "code"]
    shown = {}
    for index, cell in enumerate(code):
        names = _images(cell)
        calls = len(SHOW_CALL.findall(cell.source))
        assert len(names) == calls, (
            f"{lesson.stem}, code cell {index}: {calls} show() call(s) but {len(names)} "
            f"image output(s)")
        shown.update({name: index for name in names})
        for fig in NEW_FIGURE.findall(cell.source):  # built here, so shown here
            assert re.search(rf"(?<![\w.])show\({fig}\b", cell.source), (
                f"{lesson.stem}, code cell {index} builds `{fig}` but does not show() it")
    saved = sorted(p.stem for p in figures.glob("*.png")) if figures.is_dir() else []
    assert sorted(shown) == saved, f"{lesson.stem}: displayed {sorted(shown)}, saved {saved}"
    assert saved, f"{lesson.stem} made no figure"
    keep = os.environ.get(KEEP_ENV)
    if keep:  # for the documentation build (docs/conf.py reads this folder)
        import nbformat

        Path(keep).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, Path(keep) / f"{lesson.stem}.ipynb")


def test_lessons_list_and_the_kernel_environment(tmp_path, monkeypatch):
    numbers = [lesson.number for lesson in LESSONS]
    assert numbers == sorted(numbers) and {"01", "09"} <= set(numbers)
    assert all(lesson.title.startswith("Lesson") for lesson in LESSONS)
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    env = notebooks.kernel_environment(small=False)
    assert env["REFBRAID_LESSON_SMALL"] == "0" and "REFBRAID_LESSON_FIGURES" not in env
    assert env["PYTHONPATH"].split(":")[0] == str(notebooks.default_lessons_folder().parent)
