"""Lessons 01, 02, 05 and 09 run end to end in small mode (their own assertions are the checks) and
save their figures: to REFBRAID_LESSON_FIGURES when set, else to lesson_figures/NN/. Lessons 03+
have their own runners (coordinated by file name); tests/test_lessons_notebooks.py runs every
lesson as a notebook."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
MINE = sorted([*LESSONS.glob("01_*.py"), *LESSONS.glob("02_*.py"), *LESSONS.glob("05_*.py"),
               *LESSONS.glob("09_*.py")])


def test_lessons_01_02_05_09_exist():
    assert [p.name[:3] for p in MINE] == ["01_", "02_", "05_", "09_"]


@pytest.mark.lesson_script
@pytest.mark.parametrize("path", MINE, ids=lambda p: p.stem)
def test_lesson_runs_in_small_mode_and_saves_its_figure(path, tmp_path, monkeypatch):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    runpy.run_path(str(path), run_name="__main__")  # the lesson's own asserts must pass
    assert (tmp_path / f"{path.stem}.png").is_file()


def test_a_lesson_run_as_a_script_saves_its_figure_in_lesson_figures(tmp_path, monkeypatch,
                                                                     capsys):
    """Without REFBRAID_LESSON_FIGURES a script saves to lesson_figures/NN/ and says where."""
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.delenv("REFBRAID_LESSON_FIGURES", raising=False)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(MINE[0]), run_name="__main__")
    saved = tmp_path / "lesson_figures" / "01" / f"{MINE[0].stem}.png"
    assert sorted(tmp_path.rglob("*.*")) == [saved]
    assert f"figure saved: {saved.relative_to(tmp_path)}" in capsys.readouterr().out
