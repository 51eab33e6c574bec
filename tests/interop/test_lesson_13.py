"""Lesson 13 runs end to end in small mode (its own assertions are the checks)."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest

from refbraid.lessons import notebooks

LESSON = (Path(__file__).resolve().parents[2] / "lessons"
          / "13_check_your_layer_parallel_code.py")


@pytest.mark.lesson_script
def test_lesson_13_runs_and_saves_its_figure(tmp_path, monkeypatch):
    missing = notebooks.missing_modules(notebooks.select(notebooks.find_lessons(), ["13"]))
    if "torch" in missing and not os.environ.get("CI"):  # in CI torch is there or this fails
        pytest.skip("lesson 13 needs torch, part of the `lessons` extra")
    monkeypatch.setenv("REFBRAID_LESSON_SMALL", "1")
    monkeypatch.setenv("REFBRAID_LESSON_FIGURES", str(tmp_path))
    runpy.run_path(str(LESSON), run_name="__main__")
    assert (tmp_path / f"{LESSON.stem}.png").is_file()
