"""Lessons 03 and 04 run end to end (small sizes) and their closing assertions hold."""

import runpy
from pathlib import Path

import pytest

LESSONS = Path(__file__).resolve().parents[2] / "lessons"


@pytest.mark.lesson_script
@pytest.mark.parametrize(
    "name", ["03_parareal_is_two_level_mgrit.py", "04_multilevel_mgrit_and_theory.py"]
)
def test_lesson_runs_in_small_mode(name, monkeypatch, tmp_path):
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    runpy.run_path(str(LESSONS / name), run_name="__main__")
    assert list(tmp_path.glob(f"{name[:2]}_*.png"))  # figures saved only when asked
