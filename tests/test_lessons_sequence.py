"""Lessons 07 (transformer as an ODE) and 08 (GRU parallel in the sequence) run end to end in
small mode (their own assertions are the checks) and save their figure when asked."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parent.parent / "lessons"
MINE = sorted([*LESSONS.glob("07_*.py"), *LESSONS.glob("08_*.py")])


def test_lessons_07_and_08_exist():
    assert [p.name[:3] for p in MINE] == ["07_", "08_"]


@pytest.mark.lesson_script
@pytest.mark.parametrize("path", MINE, ids=lambda p: p.stem)
def test_lesson_runs_in_small_mode_and_saves_its_figure(path, tmp_path, monkeypatch):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(path), run_name="__main__")  # the lesson's own asserts must pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{path.stem}.png"]
