"""Lesson 10 runs end to end in small mode (its own assertions are the checks) and saves its
figure when asked."""

import runpy
from pathlib import Path

import pytest

LESSON = Path(__file__).resolve().parent.parent / "lessons" / \
    "10_coarsening_in_space_and_depth.py"


@pytest.mark.lesson_script
def test_lesson_10_runs_in_small_mode_and_saves_its_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    runpy.run_path(str(LESSON), run_name="__main__")
    assert (tmp_path / f"{LESSON.stem}.png").is_file()
